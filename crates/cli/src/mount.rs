//! `cairn mount`: a repository's snapshots as read-only files, through
//! FUSE. `DIR/NAME/N` is snapshot N of image NAME and `DIR/NAME/latest`
//! its newest (a second name of the same file, a hard link), each a
//! regular file of the image's logical size.
//!
//! The tree is made from the snapshots there are when the mount starts,
//! and listed again when a directory is looked at `--refresh` seconds
//! or more after the last listing: new snapshots appear (and `latest`
//! moves to the newest), removed ones leave their directory. Only the
//! names are listed again; a new snapshot's manifest is read once. Reads
//! go through the same read path as `cairn serve` for repository images:
//! a [`RepoView`] (its reader's session keeps `gc` from deleting packs
//! under the mount; its index is loaded once, and again, in a new view,
//! after a listing that found new snapshots), and per snapshot a
//! [`Volume`] opened from the newest view on the first `open` of its file
//! and kept, with its view, its cache of decoded groups and its
//! readahead. The kernel's requests are served by several threads, each
//! with its own `/dev/fuse` descriptor.
//!
//! fuser mounts in pure Rust: as root with `mount(2)` on `/dev/fuse`,
//! otherwise through the setuid `fusermount3` (or `fusermount`); no
//! libfuse is needed to build or run.

use crate::repo_cmd::{open_repo, RepoArg};
use anyhow::{bail, Context, Result};
use cairn_blockdev::{BlockDev, ErrorKind};
use cairn_volume::{RepoView, Volume, VolumeOptions};
use clap::Args;
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEntry, ReplyOpen, ReplyStatfs, Request, Session, SessionACL,
};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Args, Debug)]
pub(crate) struct MountArgs {
    /// The directory to mount on (it must exist).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub repo: RepoArg,
    /// Let users other than the one mounting read the files (FUSE's
    /// allow_other; a user other than root needs user_allow_other in
    /// /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// Cache of decompressed chunks per open snapshot (e.g. 256M; binary
    /// units: 256M = 256MiB).
    #[arg(long = "image-cache", value_name = "SIZE", value_parser = crate::parse_size, default_value = "256M")]
    pub cache: usize,
    /// Second cache tier per open snapshot: groups that random reads
    /// decoded, kept compressed with LZ4 chunk by chunk once evicted from
    /// --image-cache (0: off).
    #[arg(long = "image-compact-cache", value_name = "SIZE", value_parser = crate::parse_size_or_zero, default_value = "1G")]
    pub compact_cache: usize,
    /// Third tier per open snapshot: compact copies evicted from
    /// --image-compact-cache go on to an unlinked file in cairn's cache
    /// directory, sealed under a key of its own, up to this size (at
    /// most about the image's size and, for all open snapshots together,
    /// half the space free there; allocated when the first copy is
    /// spilled) (0: off).
    #[arg(long = "image-spill", value_name = "SIZE", value_parser = crate::parse_size_or_zero, default_value = "8G")]
    pub spill: usize,
    /// List the snapshots again when a directory is read this many
    /// seconds or more after the last listing, so that new backups
    /// appear and removed snapshots go (0: never; the tree of the mount's
    /// start).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub refresh: u64,
}

/// How long the kernel may keep entries and attributes: a file's bytes
/// never change, but a directory's entries and `latest` do when the
/// snapshots are listed again.
const TTL: Duration = Duration::from_secs(1);
/// With `--refresh 0` nothing changes while mounted.
const TTL_STATIC: Duration = Duration::from_secs(3600);
/// Reported as st_blksize: `cat`, `cp` and friends read this much a call.
const BLKSIZE: u32 = 1 << 20;
/// Distinct problems remembered (so as not to repeat them) at most.
const MAX_REPORTED: usize = 1024;

/// One snapshot, as a file.
struct Snap {
    /// Image name and snapshot number.
    key: (String, u64),
    /// `NAME@N`, as [`RepoView::volume`] takes it.
    spec: String,
    /// Its creation time when it was listed: a snapshot removed and its
    /// number given to a new one reads as removed, not as the new one
    /// (which the next listing shows as a new file).
    created: i64,
    /// Opened on the first `open`, then kept for the mount's life, with
    /// the view it was opened from (whose session keeps its packs).
    volume: OnceLock<(Arc<RepoView>, Arc<Volume>)>,
    /// Held while opening, so two first opens do not both open it.
    opening: Mutex<()>,
}

enum Kind {
    Dir {
        /// Children in listing order.
        entries: Vec<(OsString, u64)>,
        /// The same, by name.
        by_name: HashMap<OsString, u64>,
    },
    File {
        snap: Arc<Snap>,
        /// 2 for the newest snapshot (also `latest`), else 1.
        links: u32,
    },
}

struct Node {
    parent: u64,
    size: u64,
    time: SystemTime,
    kind: Kind,
}

/// The directories and files, as last listed. Inodes are never reused:
/// a removed snapshot's node stays (an open file of it reads on), out of
/// its directory.
struct Tree {
    /// Inode `i` is `nodes[i - 1]`; the root is inode 1.
    nodes: Vec<Node>,
    /// Each image's directory.
    images: HashMap<String, u64>,
    /// Each snapshot's file, by image name and number.
    files: HashMap<(String, u64), u64>,
    /// When the snapshots were last listed.
    listed: Instant,
}

/// The mounted filesystem.
struct RepoFs {
    /// The newest view: snapshots are opened from it.
    view: RwLock<Arc<RepoView>>,
    opts: VolumeOptions,
    tree: RwLock<Tree>,
    /// List again this long after the last listing (`None`: never).
    refresh: Option<Duration>,
    /// Held by the one thread listing again.
    listing: Mutex<()>,
    /// Snapshots whose number is another snapshot's now: listed again.
    renumbered: Mutex<Vec<(String, u64)>>,
    uid: u32,
    gid: u32,
    /// Problems reported so far: a damaged chunk that the kernel's
    /// readahead and then its page-sized retries meet is one line.
    reported: Mutex<HashSet<String>>,
}

/// A snapshot as `cairn ls` lists it: what the tree is made of.
struct Listed {
    name: String,
    snapshot: u64,
    created: i64,
    size: u64,
}

fn unix_time(secs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64)
}

fn dir(parent: u64, time: SystemTime, entries: Vec<(OsString, u64)>) -> Node {
    let by_name = entries.iter().cloned().collect();
    Node {
        parent,
        size: 0,
        time,
        kind: Kind::Dir { entries, by_name },
    }
}

impl Tree {
    fn empty() -> Tree {
        Tree {
            nodes: vec![dir(1, unix_time(0), Vec::new())],
            images: HashMap::new(),
            files: HashMap::new(),
            listed: Instant::now(),
        }
    }

    fn node(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(usize::try_from(ino).ok()?.checked_sub(1)?)
    }

    fn push(&mut self, n: Node) -> u64 {
        self.nodes.push(n);
        self.nodes.len() as u64
    }

    /// Make the tree what `now` lists (each image's snapshot numbers, by
    /// name), taking the files of snapshots it did not have from `new`
    /// (a snapshot in neither was unreadable: left out).
    fn update(&mut self, now: &[(String, Vec<u64>)], new: Vec<Listed>) {
        for l in new {
            let key = (l.name.clone(), l.snapshot);
            let snap = Snap {
                spec: format!("{}@{}", l.name, l.snapshot),
                key: key.clone(),
                created: l.created,
                volume: OnceLock::new(),
                opening: Mutex::new(()),
            };
            let ino = self.push(Node {
                parent: 0,
                size: l.size,
                time: unix_time(l.created),
                kind: Kind::File {
                    snap: Arc::new(snap),
                    links: 1,
                },
            });
            self.files.insert(key, ino);
        }
        let mut root = Vec::new();
        let mut newest = 0;
        for (name, numbers) in now {
            let files: Vec<(u64, u64)> = numbers
                .iter()
                .filter_map(|&n| Some((n, *self.files.get(&(name.clone(), n))?)))
                .collect();
            let Some(&(_, latest)) = files.last() else {
                continue;
            };
            let dir_ino = match self.images.get(name) {
                Some(&i) => i,
                None => {
                    let i = self.push(dir(1, unix_time(0), Vec::new()));
                    self.images.insert(name.clone(), i);
                    i
                }
            };
            let mut entries = Vec::new();
            let mut time = 0;
            for &(n, ino) in &files {
                let node = &mut self.nodes[ino as usize - 1];
                node.parent = dir_ino;
                if let Kind::File { snap, links } = &mut node.kind {
                    *links = if ino == latest { 2 } else { 1 };
                    time = time.max(snap.created);
                }
                entries.push((OsString::from(n.to_string()), ino));
            }
            entries.push((OsString::from("latest"), latest));
            newest = newest.max(time);
            self.nodes[dir_ino as usize - 1] = dir(1, unix_time(time), entries);
            root.push((OsString::from(name), dir_ino));
        }
        self.nodes[0] = dir(1, unix_time(newest), root);
        // A snapshot gone is forgotten: its number given to a new one
        // later is a new file (its node stays, for a file still open).
        let listed: HashSet<(&str, u64)> = now
            .iter()
            .flat_map(|(name, numbers)| numbers.iter().map(move |&n| (name.as_str(), n)))
            .collect();
        self.files
            .retain(|(name, n), _| listed.contains(&(name.as_str(), *n)));
        self.listed = Instant::now();
    }

    fn attr(&self, ino: u64, n: &Node, uid: u32, gid: u32) -> FileAttr {
        let (kind, perm, nlink) = match &n.kind {
            Kind::Dir { entries, .. } => {
                // ".", the entry in the parent, and each subdirectory's "..".
                let subdirs = entries
                    .iter()
                    .filter(|(_, i)| {
                        self.node(*i)
                            .is_some_and(|c| matches!(c.kind, Kind::Dir { .. }))
                    })
                    .count();
                (FileType::Directory, 0o555, 2 + subdirs as u32)
            }
            Kind::File { links, .. } => (FileType::RegularFile, 0o444, *links),
        };
        FileAttr {
            ino: INodeNo(ino),
            size: n.size,
            blocks: n.size.div_ceil(512),
            atime: n.time,
            mtime: n.time,
            ctime: n.time,
            crtime: n.time,
            kind,
            perm,
            nlink,
            uid,
            gid,
            rdev: 0,
            blksize: BLKSIZE,
            flags: 0,
        }
    }
}

/// Each image's snapshot numbers, sorted, by name.
fn numbers(repo: &cairn_store::Repository) -> Result<Vec<(String, Vec<u64>)>> {
    let mut now = repo.images()?;
    for (_, n) in &mut now {
        n.sort_unstable();
    }
    now.sort();
    Ok(now)
}

impl RepoFs {
    /// The tree of `snaps`, listed as `now`.
    fn new(
        view: Arc<RepoView>,
        opts: VolumeOptions,
        now: &[(String, Vec<u64>)],
        snaps: Vec<Listed>,
        refresh: Option<Duration>,
    ) -> RepoFs {
        let mut tree = Tree::empty();
        tree.update(now, snaps);
        // SAFETY: geteuid and getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        RepoFs {
            view: RwLock::new(view),
            opts,
            tree: RwLock::new(tree),
            refresh,
            listing: Mutex::new(()),
            renumbered: Mutex::new(Vec::new()),
            uid,
            gid,
            reported: Mutex::new(HashSet::new()),
        }
    }

    fn tree(&self) -> std::sync::RwLockReadGuard<'_, Tree> {
        self.tree.read().unwrap_or_else(|e| e.into_inner())
    }

    fn ttl(&self) -> &'static Duration {
        if self.refresh.is_some() {
            &TTL
        } else {
            &TTL_STATIC
        }
    }

    /// List the snapshots again if the last listing is `--refresh` old
    /// (by one thread; the others go on with the tree as it is). A
    /// listing that fails is reported and leaves the tree as it was.
    fn refresh_if_due(&self) {
        let Some(every) = self.refresh else {
            return;
        };
        if self.tree().listed.elapsed() < every {
            return;
        }
        let Ok(_one) = self.listing.try_lock() else {
            return;
        };
        if let Err(e) = self.list_again() {
            self.report(format!(
                "cannot list the snapshots again (the tree stays as it was): {}",
                crate::one_line(e.as_ref())
            ));
            // Not again before the next period.
            self.tree.write().unwrap_or_else(|e| e.into_inner()).listed = Instant::now();
        }
    }

    fn list_again(&self) -> Result<()> {
        let repo = self
            .view
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .repository()
            .clone();
        let renumbered =
            std::mem::take(&mut *self.renumbered.lock().unwrap_or_else(|e| e.into_inner()));
        let now = numbers(&repo)?;
        let mut new = Vec::new();
        {
            let tree = self.tree();
            for (name, snaps) in &now {
                for &n in snaps {
                    let key = (name.clone(), n);
                    if tree.files.contains_key(&key) && !renumbered.contains(&key) {
                        continue;
                    }
                    match repo.read_manifest_if_present(name, n) {
                        Ok(Some(m)) => new.push(Listed {
                            name: name.clone(),
                            snapshot: n,
                            created: m.created,
                            size: m.size,
                        }),
                        Ok(None) => {}
                        Err(e) => self.report(format!(
                            "left out an unreadable snapshot: {name}@{n}: {}",
                            crate::one_line(&e)
                        )),
                    }
                }
            }
        }
        if !new.is_empty() {
            // The new snapshots' chunks are in index files written before
            // their manifests: an index loaded now has them.
            let view = RepoView::open(repo.clone())
                .with_context(|| format!("cannot read the repository {}", repo.location()))?;
            *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
        }
        self.tree
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .update(&now, new);
        Ok(())
    }
    /// The snapshot's volume, opened now if this is its first use.
    /// The snapshot's volume, opened on first use; the error to give the
    /// kernel and the line to report when it cannot be opened: ENOENT for
    /// a snapshot removed (`cairn rm`, `forget`) after the mount started
    /// and before its file was first opened (one opened before stays
    /// readable: the volume holds its manifest, and the mount's session
    /// keeps gc from deleting its packs), EIO for anything else.
    fn volume(&self, snap: &Snap) -> Result<Arc<Volume>, (Errno, String)> {
        if let Some((_, v)) = snap.volume.get() {
            return Ok(v.clone());
        }
        let _guard = snap.opening.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, v)) = snap.volume.get() {
            return Ok(v.clone());
        }
        let view = self.view.read().unwrap_or_else(|e| e.into_inner()).clone();
        let removed = |why: &str| {
            (
                Errno::ENOENT,
                format!("{} was removed after the mount started{why}", snap.spec),
            )
        };
        let repo = view.repository();
        let v = view.volume(&snap.spec, &self.opts).map_err(|e| {
            let gone = matches!(
                repo.resolve(&snap.spec),
                Err(cairn_store::StoreError::NotFound(_))
            );
            if gone {
                removed("")
            } else {
                (
                    Errno::EIO,
                    format!("cannot open {}: {}", snap.spec, crate::one_line(&e)),
                )
            }
        })?;
        if v.created() != snap.created {
            self.renumbered
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(snap.key.clone());
            return Err(removed(" (its number is another snapshot's now)"));
        }
        Ok(snap.volume.get_or_init(|| (view, Arc::new(v))).1.clone())
    }

    /// The snapshot of file `ino` and its size (the tree's lock is not
    /// held while it is opened or read).
    fn file(&self, ino: INodeNo) -> Result<(Arc<Snap>, u64), Errno> {
        let tree = self.tree();
        let n = tree.node(ino.0).ok_or(Errno::ENOENT)?;
        match &n.kind {
            Kind::File { snap, .. } => Ok((snap.clone(), n.size)),
            Kind::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    /// One line on stderr, unless it was said already.
    fn report(&self, msg: String) {
        let mut seen = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= MAX_REPORTED {
            seen.clear();
        }
        if !seen.contains(&msg) {
            errln!("cairn mount: {msg}");
            seen.insert(msg);
        }
    }
}

thread_local! {
    /// Each FUSE thread's read buffer, reused (a request is at most 1 MiB).
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Filesystem for RepoFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // As much readahead as the kernel allows, and more of it in flight
        // (each readahead request is a background request).
        if let Err(max) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.refresh_if_due();
        let tree = self.tree();
        let Some(Node {
            kind: Kind::Dir { by_name, .. },
            ..
        }) = tree.node(parent.0)
        else {
            return reply.error(Errno::ENOTDIR);
        };
        match by_name
            .get(name)
            .and_then(|&ino| Some((ino, tree.node(ino)?)))
        {
            Some((ino, n)) => reply.entry(
                self.ttl(),
                &tree.attr(ino, n, self.uid, self.gid),
                Generation(0),
            ),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let tree = self.tree();
        match tree.node(ino.0) {
            Some(n) => reply.attr(self.ttl(), &tree.attr(ino.0, n, self.uid, self.gid)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let (snap, _) = match self.file(ino) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        match self.volume(&snap) {
            // The bytes never change: pages cached by an earlier open stay good.
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err((errno, msg)) => {
                self.report(msg);
                reply.error(errno)
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let (snap, file_size) = match self.file(ino) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let vol = match self.volume(&snap) {
            Ok(v) => v,
            Err((errno, msg)) => {
                self.report(msg);
                return reply.error(errno);
            }
        };
        let len = (size as u64).min(file_size.saturating_sub(offset)) as usize;
        if len == 0 {
            return reply.data(&[]);
        }
        BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            if buf.len() < len {
                buf.resize(len, 0);
            }
            match vol.read_at(&mut buf[..len], offset) {
                Ok(()) => reply.data(&buf[..len]),
                Err(e) => {
                    // The volume's own text names image, offset and chunk;
                    // the request's range would make each retry a new line.
                    self.report(match &e.kind {
                        ErrorKind::Corrupt(why) => format!("damaged data: {why}"),
                        ErrorKind::Io(io) => format!("{}: {io}", snap.spec),
                        _ => format!("{}: {e}", snap.spec),
                    });
                    reply.error(Errno::EIO)
                }
            }
        })
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Listed again only when a listing starts, not in its middle.
        if offset == 0 {
            self.refresh_if_due();
        }
        let tree = self.tree();
        let Some(n) = tree.node(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let Kind::Dir { entries, .. } = &n.kind else {
            return reply.error(Errno::ENOTDIR);
        };
        let dots = [
            (OsString::from("."), ino.0),
            (OsString::from(".."), n.parent),
        ];
        for (i, (name, child)) in dots.iter().chain(entries).enumerate().skip(offset as usize) {
            let kind = match tree.node(*child).map(|c| &c.kind) {
                Some(Kind::File { .. }) => FileType::RegularFile,
                _ => FileType::Directory,
            };
            if reply.add(INodeNo(*child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let tree = self.tree();
        let bytes: u64 = tree.nodes.iter().map(|n| n.size).sum();
        let files = tree.nodes.len() as u64;
        reply.statfs(bytes.div_ceil(4096), 0, 0, files, 0, 4096, 255, 4096);
    }
}

/// Is `tool` an executable file on PATH?
fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|d| {
            std::fs::metadata(d.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// The mount point, checked: an existing directory, as an absolute path.
fn mount_point(dir: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(dir).with_context(|| format!("mount point {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("mount point {}: not a directory", dir.display());
    }
    dir.canonicalize()
        .with_context(|| format!("mount point {}", dir.display()))
}

/// What FUSE needs on this machine: `/dev/fuse`, and for a user other
/// than root a `fusermount3` or `fusermount`.
fn check_fuse() -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        bail!("cannot mount: /dev/fuse is missing (load the module: modprobe fuse; in a container, pass the device in)");
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        return Ok(());
    }
    if !on_path("fusermount3") && !on_path("fusermount") {
        bail!("cannot mount: neither fusermount3 nor fusermount is on PATH (Debian: apt-get install fuse3)");
    }
    // SAFETY: the path is a NUL-terminated literal.
    if unsafe { libc::access(c"/dev/fuse".as_ptr(), libc::R_OK | libc::W_OK) } != 0 {
        bail!(
            "cannot mount: /dev/fuse: {} (a user other than root needs read and write access to it)",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Detach a mount point that is still busy (open files keep being served
/// until they are closed).
fn detach(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) {
        // SAFETY: `c` is a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return true;
        }
    }
    ["fusermount3", "fusermount"].iter().any(|tool| {
        std::process::Command::new(tool)
            .args(["-u", "-z", "--"])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A mount option's value without the characters that separate options.
fn option_value(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == ',' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

pub(crate) fn mount(a: &MountArgs) -> Result<()> {
    crate::serve::map_big_allocations();
    let dir = mount_point(&a.dir)?;
    check_fuse()?;
    // From here SIGINT and SIGTERM only set a flag: one that arrives
    // while the mount is being made must not leave it behind, unserved.
    let stop = crate::signals::stop_flag();
    let repo = Arc::new(open_repo(&a.repo)?);
    let now = numbers(&repo)?;
    let mut snaps = Vec::new();
    for item in cairn_store::list_snapshots(&repo)? {
        match item {
            Ok(s) => snaps.push(Listed {
                name: s.name,
                snapshot: s.snapshot,
                created: s.created,
                size: s.size,
            }),
            Err(e) => errln!("cairn mount: left out an unreadable snapshot: {e}"),
        }
    }
    let images = {
        let mut names: Vec<&str> = snaps.iter().map(|s| s.name.as_str()).collect();
        names.dedup();
        names.len()
    };
    let count = snaps.len();
    // The reader's session it registers lives as long as the mount.
    let view = Arc::new(
        RepoView::open(repo.clone())
            .with_context(|| format!("cannot read the repository {}", repo.location()))?,
    );
    let fs = RepoFs::new(
        view,
        crate::serve_repo::volume_options(a.cache, a.compact_cache, a.spill as u64, None),
        &now,
        snaps,
        (a.refresh > 0).then(|| Duration::from_secs(a.refresh)),
    );
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::DefaultPermissions,
        MountOption::FSName(option_value(repo.location())),
        MountOption::Subtype("cairn".into()),
    ];
    config.acl = if a.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    // Requests wait on decoding more than on the CPU: more threads than
    // cores keep the kernel's parallel readahead requests going.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    config.n_threads = Some((2 * cores).clamp(4, 16));
    config.clone_fd = true;
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted before mounting");
    }
    let mut session = Session::new(fs, &dir, &config).map_err(|e| {
        // fusermount's stderr may come back as the message: keep one line.
        let msg = e
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        anyhow::anyhow!("cannot mount {}: {msg}", dir.display())
    })?;
    let mut unmounter = session.unmount_callable();
    let (done_tx, done_rx) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || {
            let r = session.run();
            let _ = done_tx.send(());
            r
        })
        .context("cannot start the FUSE session")?;
    errln!(
        "cairn mount: {} ({images} image(s), {count} snapshot(s)) on {}, read-only; \
         unmount with `fusermount -u {}` or Ctrl-C",
        repo.location(),
        dir.display(),
        dir.display()
    );
    let mut detached = false;
    loop {
        match done_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if !stop.swap(false, Ordering::SeqCst) {
            continue;
        }
        if detached {
            bail!(
                "stopped while files under {} were still open (their reads now fail)",
                dir.display()
            );
        }
        if let Err(e) = unmounter.unmount() {
            if !detach(&dir) {
                bail!("cannot unmount {}: {e}", dir.display());
            }
            detached = true;
            if e.raw_os_error() == Some(libc::EBUSY) {
                errln!(
                    "cairn mount: {} is busy: detached it; the open files are served until \
                     they are closed (signal again to stop now)",
                    dir.display()
                );
            }
        }
    }
    match worker.join() {
        // fuser ends cleanly when its read says ENODEV; a worker thread
        // that reads while the connection is torn down after an unmount
        // (seen once a busy mount was detached and its last file closed)
        // gets ECONNABORTED instead. Gone from the mount table, the mount
        // ended as asked; still in it, the connection was aborted (through
        // /sys/fs/fuse/connections), which is an error.
        Ok(Err(e))
            if e.raw_os_error() == Some(libc::ECONNABORTED)
                && !std::fs::read_to_string("/proc/self/mountinfo")
                    .is_ok_and(|table| mounted_in(&table, &dir)) =>
        {
            Ok(())
        }
        Ok(r) => r.with_context(|| format!("the FUSE session on {}", dir.display())),
        Err(_) => bail!("the FUSE session on {} panicked", dir.display()),
    }
}

/// Whether `/proc/self/mountinfo` text `table` has a FUSE mount on `dir`
/// (its mount point is the fifth field, with space, tab, newline and
/// backslash written as octal escapes; the type follows the " - ").
fn mounted_in(table: &str, dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let want = dir.as_os_str().as_bytes();
    table.lines().any(|line| {
        let mut fields = line.split(' ');
        let point = fields.nth(4).map(unescape_octal);
        let kind = line.split(" - ").nth(1).and_then(|t| t.split(' ').next());
        point.as_deref() == Some(want) && kind.is_some_and(|k| k.starts_with("fuse"))
    })
}

/// `\NNN` octal escapes (as the kernel writes mount points) undone.
fn unescape_octal(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push(
                    d.iter()
                        .fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')),
                );
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
97 22 0:52 / /tmp/a\\040b rw,nosuid,nodev,relatime shared:50 - fuse.cairn /tmp/repo ro,user_id=0
98 22 0:53 / /tmp/plain rw,relatime shared:51 - tmpfs tmpfs rw
";

    #[test]
    fn a_fuse_mount_is_found_by_its_unescaped_point_and_nothing_else_is() {
        assert!(mounted_in(TABLE, Path::new("/tmp/a b")));
        // Not FUSE, not mounted, or only a prefix of a mount point.
        assert!(!mounted_in(TABLE, Path::new("/tmp/plain")));
        assert!(!mounted_in(TABLE, Path::new("/tmp/a")));
        assert!(!mounted_in(TABLE, Path::new("/tmp/a\\040b")));
        assert!(!mounted_in("", Path::new("/tmp/a b")));
    }

    #[test]
    fn octal_escapes_are_undone_and_other_backslashes_kept() {
        assert_eq!(unescape_octal("a\\040b\\011c\\012d\\134e"), b"a b\tc\nd\\e");
        assert_eq!(unescape_octal("x\\09y\\"), b"x\\09y\\");
    }
}
