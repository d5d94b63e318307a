//! A repository on disk: layout, config, targets, locks, snapshots, index
//! files, salvage of interrupted writes, and the garbage list.
//!
//! ```text
//! REPO/config                 metadata envelope (kind 1), JSON body
//! REPO/lock                   writer lock (flock), holds who has it
//! REPO/read.lock              readers hold it shared; gc deletes packs only
//!                             when it can take it exclusively, at once
//! REPO/index/<hex>.idx        index files
//! REPO/snapshots/NAME/<n>.snap manifests, n zero-padded
//! REPO/garbage                what an unfinished gc still has to delete
//! TARGET/cairn-target         marker (kind 2): repository id, target number,
//!                             home (the repository's directory) if absolute
//! TARGET/packs/<xx>/<id>.pack pack files (default TARGET: REPO/data)
//! ```

use crate::error::{IoContext, Result, StoreError};
use crate::id::{PackId, RepoId};
use crate::index::{ChunkIndex, IndexFile, Location, PackInfo, MAX_ENTRIES_PER_FILE};
use crate::manifest::Manifest;
use crate::meta::{self, Kind};
use crate::pack::{self, PACK_HEADER_LEN};
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Version of the config body (and of the repository layout).
pub const REPO_VERSION: u32 = 1;
/// Default size at which a pack is sealed and a new one started.
pub const DEFAULT_PACK_SIZE: u64 = 32 << 20;
/// Smallest pack size accepted.
pub const MIN_PACK_SIZE: u64 = 1 << 20;
/// Largest pack size accepted (record offsets are 32-bit).
pub const MAX_PACK_SIZE: u64 = 2 << 30;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Config {
    id: String,
    created: i64,
    /// Target directories; relative ones are relative to the repository.
    targets: Vec<PathBuf>,
    pack_size: u64,
}

/// Version of a target marker that names the repository's home (the
/// canonical path of the repository directory): written for targets
/// given as absolute paths, which a copy of the repository would share.
/// Markers of targets inside the repository (`data`) stay version 1,
/// since a copy of the repository copies them too.
pub const MARKER_HOME_VERSION: u32 = 2;

#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    repository: String,
    target: u16,
    /// Where the repository that owns this target lives (version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    home: Option<PathBuf>,
}

impl Marker {
    /// Read and check the marker at `path`.
    fn read(path: &Path) -> Result<Marker> {
        let (version, body) = meta::read(path, Kind::TargetMarker, MARKER_HOME_VERSION)?;
        let marker: Marker = serde_json::from_slice(&body)
            .map_err(|e| StoreError::corrupt(path, 24, format!("marker: {e}")))?;
        if (version >= MARKER_HOME_VERSION) != marker.home.is_some() {
            return Err(StoreError::corrupt(
                path,
                24,
                format!("marker: version {version} with a home of {:?}", marker.home),
            ));
        }
        Ok(marker)
    }

    /// Write it to `dir/cairn-target` (crash-safely), in the version its
    /// contents need.
    fn write(&self, dir: &Path) -> Result<PathBuf> {
        let body = serde_json::to_vec(self).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let version = if self.home.is_some() {
            MARKER_HOME_VERSION
        } else {
            REPO_VERSION
        };
        let path = dir.join("cairn-target");
        meta::write_atomic(&path, &meta::seal(Kind::TargetMarker, version, &body))?;
        Ok(path)
    }
}

/// Whether `dir` holds the config of repository `id` (or a config that
/// cannot be read, which might be it).
fn holds_repository(dir: &Path, id: &str) -> bool {
    let path = dir.join("config");
    if !path.exists() {
        return false;
    }
    meta::read(&path, Kind::Config, REPO_VERSION)
        .ok()
        .and_then(|(_, body)| serde_json::from_slice::<Config>(&body).ok())
        .is_none_or(|c| c.id == id)
}

/// The refusal of a copied repository to use the original's target.
fn copy_refused(dir: &Path, target: usize, owner: &Path, copy: &Path) -> StoreError {
    StoreError::Invalid(format!(
        "{}: target {target} belongs to the repository at {}; {} is a copy of it and may not use its targets",
        dir.display(),
        owner.display(),
        copy.display()
    ))
}

/// Whether two paths name the same directory (through bind mounts or
/// symbolic links too).
fn same_dir(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Garbage {
    pub index_files: Vec<String>,
    pub packs: Vec<(u16, String)>,
}

impl Garbage {
    pub(crate) fn is_empty(&self) -> bool {
        self.index_files.is_empty() && self.packs.is_empty()
    }

    /// The packs to delete, for lookups (the list can name thousands).
    pub(crate) fn pack_set(&self) -> std::collections::HashSet<(u16, PackId)> {
        self.packs
            .iter()
            .filter_map(|(t, id)| Some((*t, PackId::from_hex(id)?)))
            .collect()
    }
}

/// An open repository.
#[derive(Debug, Clone)]
pub struct Repository {
    root: PathBuf,
    id: RepoId,
    targets: Vec<PathBuf>,
    pack_size: u64,
    /// Targets given as absolute paths whose marker does not name this
    /// repository's directory as its home yet (written by an older cairn,
    /// or the repository was moved): the next writer claims them.
    unclaimed: Vec<u16>,
    /// The canonical path of the repository directory.
    home: PathBuf,
}

/// The writer lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct WriterLock {
    _file: File,
}

/// A reader's shared lock; gc does not delete packs while one is held.
#[derive(Debug)]
pub struct ReadLock {
    _file: File,
}

/// The index as loaded, with the files that could not be read.
#[derive(Debug, Default)]
pub struct LoadedIndex {
    /// Every readable entry.
    pub index: ChunkIndex,
    /// Index files that are damaged, with the error.
    pub damaged: Vec<StoreError>,
    /// Their paths.
    pub damaged_paths: Vec<PathBuf>,
}

/// The index as a writer sees it: complete for the packs on disk.
#[derive(Debug, Default)]
pub struct WriterIndex {
    /// Entries whose records are on disk.
    pub index: ChunkIndex,
    /// Unindexed packs taken in.
    pub salvaged: Salvaged,
    /// Damaged index files set aside (renamed `*.idx.damaged`): every pack
    /// they could name has been indexed again from its records.
    pub quarantined: Vec<PathBuf>,
    /// Packs the index names that are missing or shorter than sealed;
    /// their chunks are not used for dedup (a backup stores them again).
    pub lost_packs: Vec<String>,
}

/// A pack file found on a target.
#[derive(Debug, Clone)]
pub struct PackFile {
    /// Target number.
    pub target: u16,
    /// Pack id.
    pub id: PackId,
    /// Its path.
    pub path: PathBuf,
    /// Its length now.
    pub len: u64,
}

/// What [`Repository::salvage`] recovered.
#[derive(Debug, Default, Clone)]
pub struct Salvaged {
    /// Unindexed packs of this repository with no sound record (killed
    /// before their first record was whole): gc deletes them.
    pub empty: Vec<(u16, PackId)>,
    /// Packs taken into the index.
    pub packs: u64,
    /// Chunks in them.
    pub chunks: u64,
    /// Bytes of unindexed packs that hold no sound record (torn tails,
    /// damage, foreign headers): left in place, not indexed.
    pub skipped_bytes: u64,
}

pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Check an image name: 1 to 128 of `A-Z a-z 0-9 . _ + -`, not starting
/// with a dot.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "bad image name {name:?}: use 1 to 128 of A-Z a-z 0-9 . _ + - (not starting with a dot)"
        )))
    }
}

fn flock(file: &File, op: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock takes a file descriptor and flags; the descriptor is
    // owned by `file`, which outlives the call.
    let r = unsafe { libc::flock(file.as_raw_fd(), op) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

impl Repository {
    /// Create a repository at `root` with packs on `targets` (none: one
    /// target at `root/data`), sealing packs at `pack_size` bytes (1 MiB to
    /// 2 GiB; `None`: [`DEFAULT_PACK_SIZE`]).
    ///
    /// All or nothing: if any step fails, every file and directory init
    /// made is removed again (and nothing that was there before), so a
    /// failed init can simply be run again.
    pub fn init(root: &Path, targets: &[PathBuf], pack_size: Option<u64>) -> Result<Repository> {
        let mut made = Made::default();
        let result = Self::init_recording(root, targets, pack_size, &mut made);
        if result.is_err() {
            made.undo();
        }
        result
    }

    fn init_recording(
        root: &Path,
        targets: &[PathBuf],
        pack_size: Option<u64>,
        made: &mut Made,
    ) -> Result<Repository> {
        let pack_size = pack_size.unwrap_or(DEFAULT_PACK_SIZE);
        if !(MIN_PACK_SIZE..=MAX_PACK_SIZE).contains(&pack_size) {
            return Err(StoreError::Invalid(format!(
                "pack size {pack_size} is out of range {MIN_PACK_SIZE}..={MAX_PACK_SIZE}"
            )));
        }
        if root.exists() {
            let mut entries = fs::read_dir(root).ctx(root, "read directory")?;
            if entries.next().is_some() {
                return Err(StoreError::AlreadyExists(root.to_path_buf()));
            }
        }
        made.dir_all(root)?;
        let root = fs::canonicalize(root).ctx(root, "resolve path")?;
        for sub in ["index", "snapshots"] {
            made.dir_all(&root.join(sub))?;
        }
        let id = RepoId::random();
        let stored: Vec<PathBuf> = if targets.is_empty() {
            vec![PathBuf::from("data")]
        } else {
            let mut v = Vec::new();
            for t in targets {
                made.dir_all(t)?;
                v.push(fs::canonicalize(t).ctx(t, "resolve path")?);
            }
            v
        };
        if stored.len() > usize::from(u16::MAX) {
            return Err(StoreError::Invalid("too many targets".into()));
        }
        for (i, t) in stored.iter().enumerate() {
            let dir = root.join(t);
            if dir.join("cairn-target").exists() {
                return Err(StoreError::Invalid(format!(
                    "{}: already a target of a cairn repository",
                    dir.display()
                )));
            }
            if stored[..i].iter().any(|o| root.join(o) == dir) {
                return Err(StoreError::Invalid(format!(
                    "{}: target given twice",
                    dir.display()
                )));
            }
        }
        for (i, t) in stored.iter().enumerate() {
            let dir = root.join(t);
            let packs = dir.join("packs");
            made.dir_all(&packs)?;
            let marker = Marker {
                repository: id.to_string(),
                target: i as u16,
                home: t.is_absolute().then(|| root.clone()),
            };
            made.file(marker.write(&dir)?);
            meta::sync_dir(&packs)?;
        }
        for f in ["lock", "read.lock"] {
            let p = root.join(f);
            File::create(&p).ctx(&p, "create")?;
            made.file(p);
        }
        let config = Config {
            id: id.to_string(),
            created: now_secs(),
            targets: stored,
            pack_size,
        };
        let body =
            serde_json::to_vec_pretty(&config).map_err(|e| StoreError::Invalid(e.to_string()))?;
        // The config is written last: until it exists, this is not a repository.
        let cpath = root.join("config");
        meta::write_atomic(&cpath, &meta::seal(Kind::Config, REPO_VERSION, &body))?;
        made.file(cpath);
        Repository::open(&root)
    }

    /// Open the repository at `root` and check that every target is the
    /// right one.
    pub fn open(root: &Path) -> Result<Repository> {
        let cfg_path = root.join("config");
        if !cfg_path.is_file() {
            return Err(StoreError::NotARepository(root.to_path_buf()));
        }
        let (_, body) = meta::read(&cfg_path, Kind::Config, REPO_VERSION)?;
        let config: Config = serde_json::from_slice(&body)
            .map_err(|e| StoreError::corrupt(&cfg_path, 24, format!("config: {e}")))?;
        let id = RepoId::from_hex(&config.id)
            .ok_or_else(|| StoreError::corrupt(&cfg_path, 24, "config: bad repository id"))?;
        let home = fs::canonicalize(root).ctx(root, "resolve path")?;
        let mut targets = Vec::new();
        let mut unclaimed = Vec::new();
        for (i, t) in config.targets.iter().enumerate() {
            let dir = root.join(t);
            let mpath = dir.join("cairn-target");
            if !mpath.is_file() {
                return Err(StoreError::NotFound(format!(
                    "target {i} ({}) has no cairn-target marker: is its disk mounted?",
                    dir.display()
                )));
            }
            let marker = Marker::read(&mpath)?;
            if marker.repository != config.id || usize::from(marker.target) != i {
                return Err(StoreError::Invalid(format!(
                    "{}: belongs to repository {} as target {}, expected {} target {i}",
                    dir.display(),
                    marker.repository,
                    marker.target,
                    config.id
                )));
            }
            // A target outside the repository is shared by every copy of
            // the repository (`cp -a`, same id): it belongs to the one
            // its marker names as home. A home that no longer holds the
            // repository means it was moved: the next writer claims it.
            if t.is_absolute() {
                match &marker.home {
                    Some(h) if *h == home || same_dir(h, &home) => {}
                    Some(h) if holds_repository(h, &config.id) => {
                        return Err(copy_refused(&dir, i, h, &home));
                    }
                    _ => unclaimed.push(i as u16),
                }
            }
            targets.push(dir);
        }
        if targets.is_empty() {
            return Err(StoreError::corrupt(
                &cfg_path,
                24,
                "config lists no targets",
            ));
        }
        Ok(Repository {
            root: root.to_path_buf(),
            id,
            targets,
            pack_size: config.pack_size.clamp(MIN_PACK_SIZE, MAX_PACK_SIZE),
            unclaimed,
            home,
        })
    }

    /// Write this repository's home into the markers of targets that do
    /// not name it yet (see [`Repository::open`]); under the writer lock,
    /// so that a repository copied before markers named their home is
    /// claimed by one side only.
    fn claim_targets(&self, _lock: &WriterLock) -> Result<()> {
        for &i in &self.unclaimed {
            let Some(dir) = self.targets.get(usize::from(i)) else {
                continue;
            };
            let marker = Marker::read(&dir.join("cairn-target"))?;
            match &marker.home {
                Some(h) if *h == self.home => continue,
                // Claimed by a copy since this one was opened.
                Some(h)
                    if holds_repository(h, &self.id.to_string()) && !same_dir(h, &self.home) =>
                {
                    return Err(copy_refused(dir, usize::from(i), h, &self.home));
                }
                _ => {}
            }
            Marker {
                home: Some(self.home.clone()),
                ..marker
            }
            .write(dir)?;
        }
        Ok(())
    }

    /// The repository directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The repository id.
    pub fn id(&self) -> RepoId {
        self.id
    }

    /// Target directories, in order.
    pub fn targets(&self) -> &[PathBuf] {
        &self.targets
    }

    /// Size at which packs are sealed.
    pub fn pack_size(&self) -> u64 {
        self.pack_size
    }

    /// Take the writer lock. `what` is recorded for whoever finds it
    /// taken; with `wait`, block until it is free.
    pub fn lock_writer(&self, what: &str, wait: bool) -> Result<WriterLock> {
        let path = self.root.join("lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .ctx(&path, "open lock")?;
        let op = if wait {
            libc::LOCK_EX
        } else {
            libc::LOCK_EX | libc::LOCK_NB
        };
        if !flock(&file, op).ctx(&path, "lock")? {
            let holder = fs::read_to_string(&path).unwrap_or_default();
            return Err(StoreError::Locked {
                path: self.root.clone(),
                holder: if holder.trim().is_empty() {
                    "unknown".into()
                } else {
                    holder.trim().to_string()
                },
            });
        }
        let line = format!("pid {}, {what}, since {}", std::process::id(), now_secs());
        file.set_len(0).ctx(&path, "truncate")?;
        file.write_all(line.as_bytes()).ctx(&path, "write")?;
        let lock = WriterLock { _file: file };
        self.claim_targets(&lock)?;
        Ok(lock)
    }

    /// Take a reader's lock (shared; waits only while gc deletes packs).
    pub fn lock_read(&self) -> Result<ReadLock> {
        let path = self.root.join("read.lock");
        let file = File::open(&path).ctx(&path, "open lock")?;
        flock(&file, libc::LOCK_SH).ctx(&path, "lock")?;
        Ok(ReadLock { _file: file })
    }

    /// Run `f` only if no reader holds the repository; `Ok(None)` if one does.
    pub(crate) fn without_readers<T>(
        &self,
        _w: &WriterLock,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<Option<T>> {
        let path = self.root.join("read.lock");
        let file = File::open(&path).ctx(&path, "open lock")?;
        if !flock(&file, libc::LOCK_EX | libc::LOCK_NB).ctx(&path, "lock")? {
            return Ok(None);
        }
        f().map(Some)
    }

    // ---- snapshots ----

    fn image_dir(&self, name: &str) -> PathBuf {
        self.root.join("snapshots").join(name)
    }

    /// Path of a manifest.
    pub fn manifest_path(&self, name: &str, snapshot: u64) -> PathBuf {
        self.image_dir(name).join(format!("{snapshot:010}.snap"))
    }

    /// Every image with its snapshot numbers, sorted.
    pub fn images(&self) -> Result<Vec<(String, Vec<u64>)>> {
        let dir = self.root.join("snapshots");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir).ctx(&dir, "read directory")? {
            let e = e.ctx(&dir, "read directory")?;
            let name = e.file_name().to_string_lossy().into_owned();
            if validate_name(&name).is_err() {
                continue;
            }
            let snaps = self.snapshots(&name)?;
            if !snaps.is_empty() {
                out.push((name, snaps));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Snapshot numbers of one image, ascending (empty if none).
    pub fn snapshots(&self, name: &str) -> Result<Vec<u64>> {
        let dir = self.image_dir(name);
        let mut v = Vec::new();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(v),
            Err(e) => return Err(e).ctx(&dir, "read directory"),
        };
        for e in rd {
            let e = e.ctx(&dir, "read directory")?;
            let f = e.file_name().to_string_lossy().into_owned();
            if let Some(n) = f.strip_suffix(".snap").and_then(|s| s.parse::<u64>().ok()) {
                v.push(n);
            }
        }
        v.sort_unstable();
        Ok(v)
    }

    /// `NAME` (latest snapshot) or `NAME@N` or `NAME@latest`.
    pub fn resolve(&self, spec: &str) -> Result<(String, u64)> {
        let (name, snap) = match spec.rsplit_once('@') {
            Some((n, s)) => (n, Some(s)),
            None => (spec, None),
        };
        validate_name(name)?;
        let snaps = self.snapshots(name)?;
        let Some(&latest) = snaps.last() else {
            return Err(StoreError::NotFound(format!(
                "no image named {name:?} in {}",
                self.root.display()
            )));
        };
        match snap {
            None | Some("latest") => Ok((name.to_string(), latest)),
            Some(s) => {
                let n: u64 = s.parse().map_err(|_| {
                    StoreError::Invalid(format!(
                        "bad snapshot {s:?} in {spec:?}: use a number or latest"
                    ))
                })?;
                if snaps.contains(&n) {
                    Ok((name.to_string(), n))
                } else {
                    Err(StoreError::NotFound(format!(
                        "image {name:?} has no snapshot {n} (it has {snaps:?})"
                    )))
                }
            }
        }
    }

    /// Read one manifest.
    pub fn read_manifest(&self, name: &str, snapshot: u64) -> Result<Manifest> {
        let path = self.manifest_path(name, snapshot);
        let data = fs::read(&path).ctx(&path, "read")?;
        let m = Manifest::decode(&path, &data)?;
        if m.name != name || m.snapshot != snapshot {
            return Err(StoreError::corrupt(
                &path,
                24,
                format!(
                    "manifest names {}@{}, its file {name}@{snapshot}",
                    m.name, m.snapshot
                ),
            ));
        }
        Ok(m)
    }

    /// Read one manifest, or `None` if it was removed since the listing
    /// (an `rm` running beside a reader).
    pub fn read_manifest_if_present(&self, name: &str, snapshot: u64) -> Result<Option<Manifest>> {
        match self.read_manifest(name, snapshot) {
            Ok(m) => Ok(Some(m)),
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Commit a manifest (the commit point of a backup).
    pub fn write_manifest(&self, _lock: &WriterLock, m: &Manifest) -> Result<()> {
        let dir = self.image_dir(&m.name);
        if !dir.exists() {
            fs::create_dir_all(&dir).ctx(&dir, "create directory")?;
            meta::sync_dir(&self.root.join("snapshots"))?;
        }
        meta::write_atomic(&self.manifest_path(&m.name, m.snapshot), &m.encode())
    }

    /// Remove a snapshot (its chunks stay until `gc`).
    pub fn remove_snapshot(&self, _lock: &WriterLock, name: &str, snapshot: u64) -> Result<()> {
        let path = self.manifest_path(name, snapshot);
        fs::remove_file(&path).ctx(&path, "remove")?;
        let dir = self.image_dir(name);
        meta::sync_dir(&dir)?;
        if self.snapshots(name)?.is_empty() {
            let _ = fs::remove_dir(&dir);
            meta::sync_dir(&self.root.join("snapshots"))?;
        }
        Ok(())
    }

    // ---- index ----

    /// Every index file.
    pub fn index_files(&self) -> Result<Vec<PathBuf>> {
        let dir = self.root.join("index");
        let mut v = Vec::new();
        for e in fs::read_dir(&dir).ctx(&dir, "read directory")? {
            let p = e.ctx(&dir, "read directory")?.path();
            if p.extension().is_some_and(|x| x == "idx") {
                v.push(p);
            }
        }
        v.sort();
        Ok(v)
    }

    /// Load every index file into memory.
    pub fn load_index(&self) -> Result<LoadedIndex> {
        self.load_index_without(&Garbage::default())
    }

    /// Load the index as it will be once `garbage` is deleted: without the
    /// index files it names, and without entries in the packs it names
    /// (when a chunk is also elsewhere, the other copy is kept).
    pub(crate) fn load_index_without(&self, garbage: &Garbage) -> Result<LoadedIndex> {
        let mut out = LoadedIndex::default();
        for path in self.index_files()? {
            if path
                .file_name()
                .is_some_and(|n| garbage.index_files.iter().any(|s| n == s.as_str()))
            {
                continue;
            }
            let data = match fs::read(&path) {
                Ok(d) => d,
                // Removed by a gc since the listing; its replacement was
                // committed before, and is in the listing or will be.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    out.damaged_paths.push(path.clone());
                    out.damaged.push(StoreError::Io {
                        path,
                        what: "read",
                        source: e,
                    });
                    continue;
                }
            };
            match IndexFile::decode(&path, &data) {
                Ok(f) => out.index.add_file(&f)?,
                Err(e) => {
                    out.damaged_paths.push(path);
                    out.damaged.push(e);
                }
            }
        }
        // A chunk stored twice (again after its pack was lost, or by an
        // interrupted gc) is read from a copy that is on disk.
        let sizes = self.pack_sizes(&out.index)?;
        let doomed_set = garbage.pack_set();
        let doomed: Vec<bool> = out
            .index
            .packs()
            .iter()
            .map(|p| doomed_set.contains(&(p.target, p.id)))
            .collect();
        out.index.seal_preferring(|loc| {
            !doomed[loc.pack as usize]
                && u64::from(loc.offset) + u64::from(loc.len) <= sizes[loc.pack as usize]
        });
        if doomed.contains(&true) {
            out.index.retain(|loc| !doomed[loc.pack as usize]);
        }
        Ok(out)
    }

    /// Length on disk of each pack `index` names, by pack number (0 when
    /// the file is missing).
    pub fn pack_sizes(&self, index: &ChunkIndex) -> Result<Vec<u64>> {
        let on_disk: std::collections::HashMap<PackId, u64> = self
            .pack_files()?
            .into_iter()
            .map(|p| (p.id, p.len))
            .collect();
        Ok(index
            .packs()
            .iter()
            .map(|p| on_disk.get(&p.id).copied().unwrap_or(0))
            .collect())
    }

    /// Write index files for `file` (split so no file is too big to load
    /// cheaply); returns their paths.
    pub fn write_index(&self, _lock: &WriterLock, file: &IndexFile) -> Result<Vec<PathBuf>> {
        let mut paths = Vec::new();
        if file.entries.is_empty() && file.packs.is_empty() {
            return Ok(paths);
        }
        let parts: Vec<&[(crate::id::ChunkId, Location)]> = if file.entries.is_empty() {
            vec![&[]]
        } else {
            file.entries.chunks(MAX_ENTRIES_PER_FILE).collect()
        };
        for part in parts {
            // Each part carries the whole pack table: small, and every file
            // stays readable on its own.
            let f = IndexFile {
                packs: file.packs.clone(),
                entries: part.to_vec(),
            };
            let path = self
                .root
                .join("index")
                .join(format!("{}.idx", PackId::random()));
            meta::write_atomic(&path, &f.encode())?;
            paths.push(path);
        }
        Ok(paths)
    }

    /// Path of a pack named by the index.
    pub fn pack_path(&self, p: &PackInfo) -> Result<PathBuf> {
        let t = self.targets.get(usize::from(p.target)).ok_or_else(|| {
            StoreError::Invalid(format!(
                "pack {} names target {}, the repository has {}",
                p.id,
                p.target,
                self.targets.len()
            ))
        })?;
        Ok(pack::pack_path(t, p.id))
    }

    /// Every pack file on every target.
    pub fn pack_files(&self) -> Result<Vec<PackFile>> {
        let mut v = Vec::new();
        for (t, dir) in self.targets.iter().enumerate() {
            let packs = dir.join("packs");
            for sub in fs::read_dir(&packs).ctx(&packs, "read directory")? {
                let sub = sub.ctx(&packs, "read directory")?.path();
                if !sub.is_dir() {
                    continue;
                }
                for e in fs::read_dir(&sub).ctx(&sub, "read directory")? {
                    let e = e.ctx(&sub, "read directory")?;
                    let path = e.path();
                    let Some(id) = path
                        .file_name()
                        .and_then(|n| n.to_str())
                        .and_then(|n| n.strip_suffix(".pack"))
                        .and_then(PackId::from_hex)
                    else {
                        continue;
                    };
                    let len = e.metadata().ctx(&path, "stat")?.len();
                    v.push(PackFile {
                        target: t as u16,
                        id,
                        path,
                        len,
                    });
                }
            }
        }
        Ok(v)
    }

    // ---- interrupted writers ----

    /// Read the garbage list (empty when there is none) and check every
    /// entry: it is a list of files to delete, so a name that is not an
    /// index file of `REPO/index` or a pack of a target is refused rather
    /// than acted on.
    pub(crate) fn read_garbage(&self) -> Result<Garbage> {
        let path = self.root.join("garbage");
        if !path.exists() {
            return Ok(Garbage::default());
        }
        let (_, body) = meta::read(&path, Kind::Garbage, REPO_VERSION)?;
        let g: Garbage = serde_json::from_slice(&body)
            .map_err(|e| StoreError::corrupt(&path, 24, format!("garbage list: {e}")))?;
        for name in &g.index_files {
            if name
                .strip_suffix(".idx")
                .and_then(PackId::from_hex)
                .is_none()
            {
                return Err(StoreError::corrupt(
                    &path,
                    24,
                    format!("garbage list names {name:?}, not an index file"),
                ));
            }
        }
        for (t, id) in &g.packs {
            if usize::from(*t) >= self.targets.len() || PackId::from_hex(id).is_none() {
                return Err(StoreError::corrupt(
                    &path,
                    24,
                    format!(
                        "garbage list names pack {id:?} on target {t}, not a pack of the {} targets",
                        self.targets.len()
                    ),
                ));
            }
        }
        Ok(g)
    }

    pub(crate) fn write_garbage(&self, _lock: &WriterLock, g: &Garbage) -> Result<()> {
        let body = serde_json::to_vec(g).map_err(|e| StoreError::Invalid(e.to_string()))?;
        meta::write_atomic(
            &self.root.join("garbage"),
            &meta::seal(Kind::Garbage, REPO_VERSION, &body),
        )
    }

    /// Finish what a gc left to delete: superseded index files at once,
    /// packs when no reader is active. Returns whether everything is gone.
    pub(crate) fn collect_garbage(&self, lock: &WriterLock) -> Result<bool> {
        let g = self.read_garbage()?;
        if g.is_empty() {
            return Ok(true);
        }
        // Readers list the index directory, then read the files: deleting
        // a superseded file under a reader could hide chunks from it, so
        // index files go, like packs, only while no reader is active.
        let idx_dir = self.root.join("index");
        let done = self.without_readers(lock, || {
            for name in &g.index_files {
                remove_if_present(&idx_dir.join(name))?;
            }
            meta::sync_dir(&idx_dir)?;
            for (t, id) in &g.packs {
                // read_garbage has checked both.
                let (Some(dir), Some(id)) =
                    (self.targets.get(usize::from(*t)), PackId::from_hex(id))
                else {
                    continue;
                };
                remove_if_present(&pack::pack_path(dir, id))?;
            }
            for dir in &self.targets {
                meta::sync_dir(&dir.join("packs"))?;
            }
            remove_if_present(&self.root.join("garbage"))?;
            meta::sync_dir(&self.root)
        })?;
        Ok(done.is_some())
    }

    /// The index for a writer (backup, gc): finish an earlier gc's garbage,
    /// load the index, salvage unindexed packs, set aside damaged index
    /// files (salvage has re-indexed every pack they could name), and drop
    /// the entries of packs that are gone or cut short, so that nothing
    /// new is deduplicated against chunks that cannot be read.
    pub fn writer_index(&self, lock: &WriterLock) -> Result<WriterIndex> {
        self.collect_garbage(lock)?;
        // What a gc left for deletion (readers were active) is invisible to
        // writers: nothing new may come to depend on a doomed pack. The
        // live chunks of those index files are in the files gc wrote.
        let garbage = self.read_garbage()?;
        let mut loaded = self.load_index_without(&garbage)?;
        // A file of a newer format is no damage: refuse to write over it.
        if let Some(pos) = loaded
            .damaged
            .iter()
            .position(|e| matches!(e, StoreError::NewerVersion { .. }))
        {
            return Err(loaded.damaged.swap_remove(pos));
        }
        let salvaged = self.salvage(lock, &mut loaded.index)?;
        let mut quarantined = Vec::new();
        for path in loaded.damaged_paths {
            let aside = path.with_extension("idx.damaged");
            fs::rename(&path, &aside).ctx(&path, "set aside damaged index file")?;
            quarantined.push(aside);
        }
        if !quarantined.is_empty() {
            meta::sync_dir(&self.root.join("index"))?;
        }
        let sizes = self.pack_sizes(&loaded.index)?;
        let mut lost_packs = Vec::new();
        for (p, &size) in loaded.index.packs().iter().zip(&sizes) {
            if size < p.len {
                lost_packs.push(format!(
                    "pack {} is {}",
                    p.id,
                    if size == 0 {
                        "missing".to_string()
                    } else {
                        format!("cut to {size} of {} bytes", p.len)
                    }
                ));
            }
        }
        if !lost_packs.is_empty() {
            loaded.index.retain(|loc| {
                u64::from(loc.offset) + u64::from(loc.len) <= sizes[loc.pack as usize]
            });
        }
        Ok(WriterIndex {
            index: loaded.index,
            salvaged,
            quarantined,
            lost_packs,
        })
    }

    /// Take into the index the packs that an interrupted backup or gc
    /// wrote but did not index, so that the next backup reuses them
    /// instead of storing them again. Every sound record is taken, also
    /// past a damaged one. Packs are never cut or removed here (a pack
    /// whose index file is damaged looks the same as an interrupted one),
    /// except a file too short to hold even a pack header. Packs on the
    /// garbage list, and packs whose header is not this repository's, are
    /// left alone (verify lists them as unindexed).
    pub fn salvage(&self, lock: &WriterLock, index: &mut ChunkIndex) -> Result<Salvaged> {
        let doomed = self.read_garbage()?.pack_set();
        let mut found = IndexFile::default();
        let mut report = Salvaged::default();
        for pf in self.pack_files()? {
            if index.pack_number(&pf.id).is_some() || doomed.contains(&(pf.target, pf.id)) {
                continue;
            }
            let data = fs::read(&pf.path).ctx(&pf.path, "read")?;
            if data.len() < PACK_HEADER_LEN {
                // Created, then killed before its header was written.
                report.skipped_bytes += data.len() as u64;
                fs::remove_file(&pf.path).ctx(&pf.path, "remove")?;
                continue;
            }
            if pack::check_pack_header(&pf.path, &data, self.id).ok() != Some(pf.id) {
                report.skipped_bytes += data.len() as u64;
                continue;
            }
            let pack_no = found.packs.len() as u32;
            let mut entries = Vec::new();
            let mut covered = 0u64;
            pack::scan_records(&data, |off, r| {
                covered += r.len() as u64;
                for (id, slice, _) in r.chunks() {
                    entries.push((
                        id,
                        Location {
                            pack: pack_no,
                            offset: off as u32,
                            len: r.len() as u32,
                            slice,
                        },
                    ));
                }
                Ok(())
            })?;
            report.skipped_bytes += data.len() as u64 - PACK_HEADER_LEN as u64 - covered;
            if entries.is_empty() {
                report.empty.push((pf.target, pf.id));
                continue;
            }
            report.packs += 1;
            report.chunks += entries.len() as u64;
            found.packs.push(PackInfo {
                id: pf.id,
                target: pf.target,
                len: data.len() as u64,
            });
            found.entries.extend(entries);
        }
        if report.packs > 0 {
            self.write_index(lock, &found)?;
            index.add_file(&found)?;
            index.seal();
        }
        Ok(report)
    }
}

/// What `init` has made so far, in order, so that a failed init can
/// remove exactly that: the files it wrote and the directories it created
/// (parents included), never anything that existed before.
#[derive(Debug, Default)]
struct Made {
    /// Paths, and whether each is a directory.
    paths: Vec<(PathBuf, bool)>,
}

impl Made {
    /// Create `dir` and its missing parents, noting each one created.
    fn dir_all(&mut self, dir: &Path) -> Result<()> {
        let mut missing = Vec::new();
        let mut p = dir;
        loop {
            match fs::symlink_metadata(p) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    missing.push(p.to_path_buf());
                    match p.parent() {
                        Some(q) if !q.as_os_str().is_empty() => p = q,
                        _ => break,
                    }
                }
                Err(e) => return Err(e).ctx(p, "stat"),
            }
        }
        for d in missing.into_iter().rev() {
            match fs::create_dir(&d) {
                Ok(()) => self.paths.push((d, true)),
                // Made by someone else meanwhile: not ours to remove.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && d.is_dir() => {}
                Err(e) => return Err(e).ctx(&d, "create directory"),
            }
        }
        Ok(())
    }

    /// Note a file written.
    fn file(&mut self, path: PathBuf) {
        self.paths.push((path, false));
    }

    /// Remove what was made, newest first. A directory that is not empty
    /// (something else was put in it since) stays; failures are ignored,
    /// since the error that made init fail is the one to report.
    fn undo(self) {
        for (p, is_dir) in self.paths.into_iter().rev() {
            let _ = if is_dir {
                fs::remove_dir(&p)
            } else {
                fs::remove_file(&p)
            };
        }
    }
}

fn remove_if_present(p: &Path) -> Result<()> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).ctx(p, "remove"),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

    use super::*;

    /// Every version of the target marker decodes: version 1 (the
    /// fixture repository's `data` target) and version 2 (an absolute
    /// target, naming its repository's home). `CAIRN_BLESS=1` writes the
    /// version 2 fixture anew (only for a deliberate change, which must
    /// come with a new version).
    #[test]
    fn marker_fixtures_of_every_version_decode() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        if std::env::var("CAIRN_BLESS").as_deref() == Ok("1") {
            let dir = fixtures.join("target-marker-v2");
            fs::create_dir_all(&dir).unwrap();
            Marker {
                repository: "0123456789abcdef0123456789abcdef".into(),
                target: 1,
                home: Some(PathBuf::from("/srv/cairn/repo")),
            }
            .write(&dir)
            .unwrap();
        }
        let v1 = Marker::read(&fixtures.join("repository-v1/repo/data/cairn-target")).unwrap();
        assert_eq!((v1.target, v1.home), (0, None));
        let v2 = Marker::read(&fixtures.join("target-marker-v2/cairn-target")).unwrap();
        assert_eq!(v2.target, 1);
        assert_eq!(v2.home, Some(PathBuf::from("/srv/cairn/repo")));
        assert_eq!(v2.repository, "0123456789abcdef0123456789abcdef");
    }
}
