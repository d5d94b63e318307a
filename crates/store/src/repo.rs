//! A repository: layout, config, targets, sessions, snapshots, index
//! files, salvage of interrupted writes, and the trash lists of gc.
//!
//! Every object is reached through a backend ([`crate::backend`]): a
//! directory on a local disk, or a prefix in a bucket; the keys are the
//! same.
//!
//! ```text
//! config                      metadata envelope (kind 1), JSON body
//! sessions/<hex>              one per running writer or reader (held)
//! locks/NAME                  held while image NAME is open for writing
//! index/<hex>.idx             index files
//! snapshots/NAME/<n>.snap     manifests, n zero-padded
//! trash/<hex>                 what a gc still has to delete (kind 5)
//! garbage                     the same, as written by version 1 (read only)
//! TARGET/cairn-target         marker (kind 2): repository id, target number,
//!                             home (the repository's directory) if absolute
//! TARGET/packs/<xx>/<id>.pack pack files (default TARGET: data)
//! ```
//!
//! Writers take no global lock: each registers a session, writes packs
//! under fresh random names, then index files, then its manifest (created
//! only if no other writer took that snapshot number). gc deletes in two
//! phases (a trash list, deleted once every session that could have seen
//! the old state has ended): `docs/format/repository.md` gives the
//! protocol and why it loses nothing.

use crate::backend::{Held, Key, Liveness, LocalDir, ReadBackend, WriteBackend};
use crate::chunker::GearTable;
use crate::crypt::{ChunkerParams, Crypt, KdfParams, KeyFile, AEAD_NAME};
use crate::error::{IoContext, Result, StoreError};
use crate::id::{PackId, RepoId};
use crate::index::{ChunkIndex, IndexFile, Location, PackInfo, MAX_ENTRIES_PER_FILE};
use crate::manifest::Manifest;
use crate::meta::{self, Kind};
use crate::pack::{self, PACK_HEADER_LEN};
use crate::seen::{Removal, Seen};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Version of the config body (and of the repository layout) of a plain
/// repository.
pub const REPO_VERSION: u32 = 1;
/// Version of the config of an encrypted repository (a cairn that does
/// not know encryption must refuse it, not write plain data into it).
pub const ENCRYPTED_REPO_VERSION: u32 = 2;
/// The newest version of key files this cairn reads: 1 wraps the master
/// key, 2 the master key and a chunker secret (what
/// [`Crypt::key_file_version`] writes).
pub const KEY_VERSION: u32 = 2;
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
    /// The AEAD of an encrypted repository (`aes-256-gcm`), absent in a
    /// plain one (version 2 and 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    encryption: Option<String>,
}

/// Where the password of an encrypted repository comes from: asked only
/// when the repository turns out to be encrypted.
pub trait PasswordSource {
    /// The password (or why there is none).
    fn password(&self) -> std::result::Result<zeroize::Zeroizing<Vec<u8>>, String>;
    /// Whether one was configured (a file, a command, a variable; not a
    /// terminal to ask on). A plain repository opened with a configured
    /// password is refused: it may have been swapped for an unencrypted
    /// one, and backups would land there in the clear.
    fn given(&self) -> bool;
}

/// No password: opens plain repositories only.
#[derive(Debug, Clone, Copy)]
pub struct NoPassword;

impl PasswordSource for NoPassword {
    fn password(&self) -> std::result::Result<zeroize::Zeroizing<Vec<u8>>, String> {
        Err("none given".into())
    }
    fn given(&self) -> bool {
        false
    }
}

/// A password held in memory.
#[derive(Clone)]
pub struct Password(pub zeroize::Zeroizing<Vec<u8>>);

impl Password {
    /// From text.
    pub fn new(text: &str) -> Password {
        Password(zeroize::Zeroizing::new(text.as_bytes().to_vec()))
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(..)")
    }
}

impl PasswordSource for Password {
    fn password(&self) -> std::result::Result<zeroize::Zeroizing<Vec<u8>>, String> {
        Ok(self.0.clone())
    }
    fn given(&self) -> bool {
        true
    }
}

/// How `init` makes a repository.
#[derive(Debug, Clone, Default)]
pub struct InitOptions {
    /// Directories for packs (none: `REPO/data`); directories only.
    pub targets: Vec<PathBuf>,
    /// Seal packs at this size ([`DEFAULT_PACK_SIZE`] if `None`).
    pub pack_size: Option<u64>,
    /// Encrypt, with a first key wrapped under this password at this
    /// cost; `None`: a plain repository.
    pub encryption: Option<(Password, KdfParams)>,
    /// Bytes kept allocated in the repository's root so that `gc` can
    /// run on a full disk (0: none; see [`crate::DEFAULT_RESERVE`]).
    pub reserve: u64,
    /// Cut as another repository does ([`Repository::chunker_params`]),
    /// so that backups into either, and snapshots copied between them,
    /// dedup; `None`: a new chunker secret (encrypted) or the public
    /// table (plain). Only for an encrypted repository when keyed: a
    /// plain one has nowhere to keep a secret.
    pub chunker: Option<ChunkerParams>,
}

/// A key file's id and contents.
type NamedKey = (String, KeyFile);

/// A key file's id and why it cannot be used.
type DamagedKey = (String, StoreError);

/// The usable keys, and the ids of key files that cannot be used with
/// the reason.
pub type KeyList = (Vec<KeyInfo>, Vec<(String, String)>);

/// A key of an encrypted repository, as `cairn key list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct KeyInfo {
    /// Its id (the hex of `keys/<hex>`).
    pub id: String,
    /// Whether it is the one that opened the repository.
    pub current: bool,
    /// Its file's contents (no secret in clear).
    #[serde(flatten)]
    pub file: KeyFile,
}

/// Version of a target marker that names the repository's home (the
/// canonical path of the repository directory): written for targets
/// given as absolute paths, which a copy of the repository would share.
/// Markers of targets inside the repository (`data`) stay version 1,
/// since a copy of the repository copies them too.
pub const MARKER_HOME_VERSION: u32 = 2;

/// The marker's key in a target.
const MARKER: &str = "cairn-target";

#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    repository: String,
    target: u16,
    /// Where the repository that owns this target lives (version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    home: Option<PathBuf>,
}

impl Marker {
    /// Read and check the marker of target backend `b`.
    fn read(b: &dyn ReadBackend) -> Result<Marker> {
        let key = Key::new(MARKER);
        let path = b.locate(&key);
        let Some(data) = b.get(&key)? else {
            return Err(StoreError::NotFound(format!(
                "target {} has no cairn-target marker: is its disk mounted?",
                b.locate(&Key::new("")).display()
            )));
        };
        let (version, body) = meta::open(&path, &data, Kind::TargetMarker, MARKER_HOME_VERSION)?;
        let path = path.as_path();
        let marker: Marker = serde_json::from_slice(body)
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

    /// Its file, in the version its contents need.
    fn encode(&self) -> Result<Vec<u8>> {
        let body = serde_json::to_vec(self).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let version = if self.home.is_some() {
            MARKER_HOME_VERSION
        } else {
            REPO_VERSION
        };
        Ok(meta::seal(Kind::TargetMarker, version, &body))
    }

    /// Write it into target backend `b` (crash-safely), in place of the
    /// one there.
    fn write(&self, b: &dyn WriteBackend) -> Result<()> {
        b.put(&Key::new(MARKER), &self.encode()?)
    }

    /// Create it in target backend `b`; `false` (nothing written) where
    /// a marker already is: of inits racing for one target, one wins.
    fn create(&self, b: &dyn WriteBackend) -> Result<bool> {
        b.put_new(&Key::new(MARKER), &self.encode()?)
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

/// Version of trash lists written by this build: version 1 was the one
/// `garbage` object (no creation time, no sessions), read as a trash
/// list that waits for no session.
pub const TRASH_VERSION: u32 = 4;

/// The version a trash list is written in: 4 only when it records
/// records dropped as damaged (which a reader of version 3 would keep),
/// so that other lists stay readable by earlier builds.
fn trash_version(g: &Garbage) -> u32 {
    if g.dropped.is_empty() {
        3
    } else {
        4
    }
}

/// What a gc superseded, to delete once nothing can still need it: a
/// trash list (`trash/<hex>`, or `garbage` from version 1).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Garbage {
    /// Superseded index files (`<hex>.idx`).
    pub index_files: Vec<String>,
    /// Dead and repacked packs: (target, pack id).
    pub packs: Vec<(u16, String)>,
    /// When it was written (Unix seconds).
    #[serde(default)]
    pub created: i64,
    /// The sessions that were running when it was written: it is
    /// deleted only once all of them have ended.
    #[serde(default)]
    pub sessions: Vec<String>,
    /// Version 3: the session of the gc that wrote it, while that gc is
    /// still listing the sessions (the list's first write); absent once
    /// they are recorded. A list read in between must not be taken for
    /// one that waits for no session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recording: Option<String>,
    /// Version 4: records (pack id, offset, slice) a repair dropped from
    /// the index as damaged. Whoever works the list off keeps them out
    /// as that repair would: a list collected later by another writer
    /// (the repair's was deferred) must not index them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<(String, u32, u32)>,
}

impl Garbage {
    pub(crate) fn is_empty(&self) -> bool {
        self.index_files.is_empty() && self.packs.is_empty()
    }

    /// The records it says were dropped as damaged, parsed.
    pub(crate) fn dropped_set(&self) -> HashSet<(PackId, u32, u32)> {
        self.dropped
            .iter()
            .filter_map(|(id, offset, slice)| Some((PackId::from_hex(id)?, *offset, *slice)))
            .collect()
    }

    /// The packs it names, parsed.
    pub(crate) fn pack_set(&self) -> HashSet<(u16, PackId)> {
        self.packs
            .iter()
            .filter_map(|(t, id)| Some((*t, PackId::from_hex(id)?)))
            .collect()
    }

    /// Take in another list's entries.
    pub(crate) fn merge(&mut self, other: &Garbage) {
        for f in &other.index_files {
            if !self.index_files.contains(f) {
                self.index_files.push(f.clone());
            }
        }
        let have: HashSet<(u16, String)> = self.packs.iter().cloned().collect();
        self.packs
            .extend(other.packs.iter().filter(|p| !have.contains(*p)).cloned());
        for d in &other.dropped {
            if !self.dropped.contains(d) {
                self.dropped.push(d.clone());
            }
        }
    }
}

/// A trash list as found: its key and contents.
#[derive(Debug, Clone)]
pub(crate) struct TrashList {
    pub key: Key,
    pub garbage: Garbage,
}

/// A pack and the index entries of its sound records (pack number 0).
pub(crate) type IndexedPack = (PackInfo, Vec<(crate::id::ChunkId, Location)>);

/// One target: its backend and, for a local one, its directory.
#[derive(Debug, Clone)]
struct Target {
    backend: Arc<dyn WriteBackend>,
    dir: Option<PathBuf>,
    /// Given as an absolute path (outside the repository).
    absolute: bool,
}

/// An open repository.
#[derive(Debug, Clone)]
pub struct Repository {
    /// Where it is, for messages and reports: a path or a URL.
    location: String,
    /// The backend holding config, index, snapshots, sessions, trash.
    root: Arc<dyn WriteBackend>,
    /// The canonical path of the repository directory, for a local one.
    home: Option<PathBuf>,
    id: RepoId,
    targets: Vec<Target>,
    pack_size: u64,
    /// Targets given as absolute paths whose marker does not name this
    /// repository's directory as its home yet (written by an older cairn,
    /// or the repository was moved): the next writer claims them.
    unclaimed: Vec<u16>,
    /// The AEAD of an encrypted repository.
    encryption: Option<String>,
    /// Its keys, once a password opened one (always, once opened).
    crypt: Option<Arc<Crypt>>,
    /// The key file that opened it.
    key_id: Option<String>,
    /// The snapshots this machine has seen in it, to notice those that
    /// vanish without a removal record (`seen.rs`).
    seen: Arc<std::sync::Mutex<Seen>>,
}

/// A running writer or reader, registered in the repository
/// (`sessions/<hex>`) for as long as it lives: gc deletes nothing a
/// running session may still use, and salvage leaves packs alone while
/// another writer runs. Dropped (or the process dies): ended.
#[derive(Debug)]
pub struct Session {
    id: String,
    held: Option<Box<dyn Held>>,
}

impl Session {
    /// Its id (the hex of its key).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Fails when the session may have been taken for dead (a remote
    /// lease not refreshed in time): checked before a commit.
    pub fn check(&self) -> Result<()> {
        match &self.held {
            Some(h) => h.check(),
            None => Ok(()),
        }
    }
}

/// The writer's claim on one image (`locks/NAME`): one writable open of an
/// image at a time; other images and backups go on.
#[derive(Debug)]
pub struct ImageLock {
    _held: Box<dyn Held>,
}

/// What [`Repository::unlock_holds`] did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Unlocked {
    /// The sessions and locks removed.
    pub removed: Vec<HoldEntry>,
    /// Those left, with why.
    pub kept: Vec<HoldEntry>,
}

/// A session (`sessions/<hex>`) or lock (`locks/NAME`) and its holder.
#[derive(Debug, Clone, Serialize)]
pub struct HoldEntry {
    /// Its key in the repository.
    pub key: String,
    /// Whether its holder looked alive (a lease within its time, or a
    /// directory's lock taken).
    pub live: bool,
    /// Its holder, as its object records it (`None`: unreadable, such as
    /// one sealed with a key this repository no longer has).
    pub info: Option<SessionInfo>,
    /// Why it was left, for one kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
}

/// Who holds a session or an image lock, as its object records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionInfo {
    /// What it is doing (`cairn backup vm1`).
    pub what: String,
    /// Its process id, on `host`.
    pub pid: u32,
    /// The machine's name.
    pub host: String,
    /// When it began (Unix seconds).
    pub started: i64,
    /// What tells the process apart on `host` (absent in sessions of
    /// older versions): see [`SessionInfo::ended_here`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessMark>,
    /// 16 random bytes, hex (absent in older bodies): no two holds write
    /// the same body, so a holder that finds its exact bytes in the
    /// object after a refused conditional PUT (its own retried PUT, which
    /// had landed) knows they are its own, not another thread's of this
    /// process in the same second.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nonce: String,
}

/// A process as its machine knows it: the boot, the pid namespace and the
/// process's start time (clock ticks after boot), so that a pid used again
/// is not taken for the process that held it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMark {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot: String,
    /// The inode of `/proc/self/ns/pid`.
    pub pid_ns: u64,
    /// Field 22 of `/proc/PID/stat`.
    pub start_ticks: u64,
}

impl ProcessMark {
    /// Process `pid`'s mark, seen from this process; `None` where `/proc`
    /// does not say (no such process, or no `/proc`).
    fn of(pid: u32) -> Option<ProcessMark> {
        use std::os::unix::fs::MetadataExt;
        let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let pid_ns = fs::metadata("/proc/self/ns/pid").ok()?.ino();
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command, in parentheses (which may hold anything), the
        // fields from the third on: the start time is the 22nd.
        let rest = &stat[stat.rfind(')')? + 1..];
        let start_ticks = rest.split_whitespace().nth(19)?.parse().ok()?;
        Some(ProcessMark {
            boot: boot.trim().to_string(),
            pid_ns,
            start_ticks,
        })
    }
}

impl SessionInfo {
    /// This process, doing `what`, as the body of a held object.
    fn now(what: &str) -> Result<Vec<u8>> {
        let info = SessionInfo {
            what: what.to_string(),
            pid: std::process::id(),
            host: hostname(),
            started: now_secs(),
            process: ProcessMark::of(std::process::id()),
            nonce: crate::id::hex(&crate::id::random16()),
        };
        serde_json::to_vec(&info).map_err(|e| StoreError::Invalid(e.to_string()))
    }

    /// True when the process that wrote this ran on this machine, since
    /// its last boot, in this pid namespace, and is gone (no process has
    /// its pid, or one started at another time has). A bucket's sessions
    /// and locks are leases, taken for dead only 15 minutes after their
    /// holder stops refreshing them; one killed on this machine is seen at
    /// once (restic does the same with its locks' host and pid).
    pub fn ended_here(&self) -> bool {
        let Some(mark) = &self.process else {
            return false;
        };
        // This process's own mark and host, read once: a listing asks
        // for every session it finds.
        static HERE: std::sync::OnceLock<(String, Option<ProcessMark>)> =
            std::sync::OnceLock::new();
        let (host, here) = HERE.get_or_init(|| (hostname(), ProcessMark::of(std::process::id())));
        if self.host != *host {
            return false;
        }
        let Some(here) = here else {
            return false;
        };
        if here.boot != mark.boot || here.pid_ns != mark.pid_ns {
            return false;
        }
        match ProcessMark::of(self.pid) {
            Some(now) => now.start_ticks != mark.start_ticks,
            // `/proc` does not show it: gone, unless the pid still names
            // a process (`hidepid` and `ProtectProc=invisible` hide other
            // users' processes from `/proc`, not from `kill`). Its start
            // time is then unknown: taken as the holder, which at worst
            // keeps a session whose pid was used again until its lease
            // ends, the safe way to be wrong.
            None => !pid_exists(self.pid),
        }
    }
}

/// Whether a process has pid `pid` (`kill(pid, 0)`: no signal is sent;
/// `EPERM` says it exists and is another user's). Not for pids `kill`
/// would take for groups (0, or over `i32::MAX` as negative).
fn pid_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 to one positive pid only checks that the process
    // exists and may be signalled; nothing is sent and no memory passed.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Decode a trash list and check every entry: it is a list of objects to
/// delete, so a name that is not an index file or a pack of one of
/// `targets` targets is refused rather than acted on. (Public for the
/// fuzz target.)
#[doc(hidden)]
pub fn check_trash_list(path: &Path, data: &[u8], targets: usize) -> Result<Garbage> {
    check_trash_list_with(path, data, targets, None)
}

/// [`check_trash_list`] of a list sealed under `crypt` if there is one.
#[doc(hidden)]
pub fn check_trash_list_with(
    path: &Path,
    data: &[u8],
    targets: usize,
    crypt: Option<&Crypt>,
) -> Result<Garbage> {
    let (_, body) = meta::open_with(path, data, Kind::Garbage, TRASH_VERSION, crypt)?;
    let g: Garbage = serde_json::from_slice(&body)
        .map_err(|e| StoreError::corrupt(path, 24, format!("trash list: {e}")))?;
    for name in &g.index_files {
        if name
            .strip_suffix(".idx")
            .and_then(PackId::from_hex)
            .is_none()
        {
            return Err(StoreError::corrupt(
                path,
                24,
                format!("trash list names {name:?}, not an index file"),
            ));
        }
    }
    for (id, _, _) in &g.dropped {
        if PackId::from_hex(id).is_none() {
            return Err(StoreError::corrupt(
                path,
                24,
                format!("trash list drops a record of {id:?}, not a pack id"),
            ));
        }
    }
    for (t, id) in &g.packs {
        if usize::from(*t) >= targets || PackId::from_hex(id).is_none() {
            return Err(StoreError::corrupt(
                path,
                24,
                format!("trash list names pack {id:?} on target {t}, not a pack of the {targets} targets"),
            ));
        }
    }
    Ok(g)
}

/// `$OWN`, else `$XDG/cairn`, else `~/HOME_REL`: where cairn keeps a kind
/// of per-user files; `None` when none of those is set.
fn user_dir(own: &str, xdg: &str, home_rel: &str) -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env(own)
        .or_else(|| env(xdg).map(|d| d.join("cairn")))
        .or_else(|| env("HOME").map(|d| d.join(home_rel)))
}

/// Where the local cache of remote repository `location` lives:
/// `$CAIRN_CACHE_DIR`, else `$XDG_CACHE_HOME/cairn`, else
/// `~/.cache/cairn`, in a folder named by a hash of the location; `None`
/// when none of those is set (no cache, everything is fetched).
pub fn cache_dir(location: &str) -> Option<PathBuf> {
    let h = blake3::hash(location.trim_end_matches('/').as_bytes()).to_hex();
    Some(cache_root()?.join(&h[..32]))
}

/// Where cairn keeps what it may lose: `$CAIRN_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/cairn`, else `~/.cache/cairn`; `None` when none of
/// those is set.
pub fn cache_root() -> Option<PathBuf> {
    user_dir("CAIRN_CACHE_DIR", "XDG_CACHE_HOME", ".cache/cairn")
}

/// Where cairn keeps local state that must last: `$CAIRN_STATE_DIR`, else
/// `$XDG_STATE_HOME/cairn`, else `~/.local/state/cairn`; `None` when none
/// of those is set.
pub fn state_root() -> Option<PathBuf> {
    user_dir("CAIRN_STATE_DIR", "XDG_STATE_HOME", ".local/state/cairn")
}

/// Where cairn keeps local state that must last (the overlays of writable
/// images) for the repository with id `id`: `$CAIRN_STATE_DIR`, else
/// `$XDG_STATE_HOME/cairn`, else `~/.local/state/cairn`, in a folder named
/// by the id (the same whichever path or URL reaches the repository);
/// `None` when none of those is set.
pub fn state_dir(id: RepoId) -> Option<PathBuf> {
    Some(state_root()?.join(id.to_string()))
}

/// Whether repositories opened from now on keep the record of the
/// snapshots seen ([`keep_seen_records`]).
static KEEP_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Keep, for every repository opened from now on, the record of the
/// snapshots this machine has seen in it, in the user's state directory
/// ([`state_root`]), and so notice those that vanish without a removal
/// record (`seen.rs`). The cairn binary turns it on; a program using the
/// library (its tests among them) keeps no such state unless it asks.
pub fn keep_seen_records() {
    KEEP_SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The record of the snapshots seen in repository `id` reached at `home`
/// (a directory's canonical path) or `location` (a URL): one per place,
/// so that a copy of a repository (the same id elsewhere) is not taken for
/// it rolled back.
fn seen_record(id: RepoId, home: Option<&Path>, location: &str) -> Seen {
    if !KEEP_SEEN.load(std::sync::atomic::Ordering::Relaxed) {
        return Seen::default();
    }
    let place = match home {
        Some(h) => h.display().to_string(),
        None => location.trim_end_matches('/').to_string(),
    };
    let h = blake3::hash(place.as_bytes()).to_hex();
    Seen::at(state_dir(id), format!("seen-{}", &h[..32]))
}

/// The user running cairn, for key files.
fn username() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| {
            // SAFETY: getuid has no preconditions and cannot fail.
            format!("uid {}", unsafe { libc::getuid() })
        })
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// The index as loaded, with the files that could not be read.
#[derive(Debug, Default)]
pub struct LoadedIndex {
    /// Every readable entry.
    pub index: ChunkIndex,
    /// Index files that are damaged, with the error.
    pub damaged: Vec<StoreError>,
    /// Their keys.
    pub damaged_keys: Vec<Key>,
    /// Index files that could not be read (an I/O or network error: they
    /// may well be sound), with the error. Writers stop on one
    /// ([`LoadedIndex::check_read`]): without its entries, chunks it lists
    /// look unused and their packs dead.
    pub unread: Vec<StoreError>,
    /// The index files read.
    pub files: Vec<Key>,
}

impl LoadedIndex {
    /// An error naming the first index file that could not be read, if
    /// any: for whoever must not act on a part of the index (a writer, a
    /// copy, a restore, which would take its chunks for missing).
    pub fn check_read(&self) -> Result<()> {
        match self.unread.first() {
            None => Ok(()),
            Some(e) => Err(StoreError::Invalid(format!(
                "an index file could not be read ({e}); the command stopped there: run it \
                 again (a file that stays unreadable: rename it to end in .damaged, then run \
                 `cairn repair`, which indexes its packs' records again){}",
                match self.unread.len() {
                    1 => String::new(),
                    n => format!("; {} more could not be read", n - 1),
                }
            ))),
        }
    }
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
    /// Damaged index files left in place because salvage could not run
    /// (another command was running): the entries they held are not in
    /// `index`, and chunks they list look unused. gc deletes nothing then.
    pub damaged_left: Vec<PathBuf>,
    /// The index files loaded (what gc may supersede: never one written
    /// by a concurrent writer after the load).
    pub files: Vec<Key>,
    /// What earlier gcs' trash lists came to first.
    pub collected: crate::gc::Collected,
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
    /// Where it is (a path or a URL), for messages.
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
    /// Whether salvage looked at all (it waits while another writer runs).
    pub ran: bool,
    /// Packs the index knew, read again because an index file was damaged
    /// (or by repair), for chunks no entry names (counted in `packs` too
    /// when they held some).
    pub reread: u64,
}

/// The offsets of the records the index names (or another copy of a
/// chunk does), by pack number: what salvage need not read again.
fn named_records(index: &ChunkIndex) -> HashMap<u32, HashSet<u32>> {
    let mut out: HashMap<u32, HashSet<u32>> = HashMap::new();
    for (_, l) in index.locations().chain(index.other_locations()) {
        out.entry(l.pack).or_default().insert(l.offset);
    }
    out
}

pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// How an encrypted repository lists an image none of whose manifests
/// can be read (its name is inside them): `#` and its directory, a name
/// no backup can take ([`validate_name`] refuses `#`).
pub const UNNAMED: char = '#';

/// The directory of an image listed as unnamed (`#` and 32 hex digits).
fn unnamed_dir(name: &str) -> Option<&str> {
    name.strip_prefix(UNNAMED)
        .filter(|d| PackId::from_hex(d).is_some())
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

impl Repository {
    /// Create a repository at `root` with packs on `targets` (none: one
    /// target at `root/data`), sealing packs at `pack_size` bytes (1 MiB to
    /// 2 GiB; `None`: [`DEFAULT_PACK_SIZE`]).
    ///
    /// All or nothing: if any step fails, every file and directory init
    /// made is removed again (and nothing that was there before), so a
    /// failed init can simply be run again.
    pub fn init(root: &Path, targets: &[PathBuf], pack_size: Option<u64>) -> Result<Repository> {
        Self::init_with(
            root,
            &InitOptions {
                targets: targets.to_vec(),
                pack_size,
                encryption: None,
                reserve: 0,
                chunker: None,
            },
        )
    }

    /// [`Repository::init`] with every option (encryption too).
    pub fn init_with(root: &Path, opts: &InitOptions) -> Result<Repository> {
        let mut made = Made::default();
        let result = Self::init_recording(root, opts, &mut made);
        if result.is_err() {
            made.undo();
        }
        result
    }

    /// A repository can be made at `root`: it is missing or an empty
    /// directory.
    fn check_new_root(root: &Path) -> Result<()> {
        if root.exists() {
            let mut entries = fs::read_dir(root).ctx(root, "read directory")?;
            if entries.next().is_some() {
                return Err(StoreError::AlreadyExists(root.to_path_buf()));
            }
        }
        Ok(())
    }

    /// What [`Repository::init_location_with`] would refuse at `location`
    /// before it writes anything, checked without a password (so `init`
    /// does not ask for one to then refuse the place): a local directory
    /// that is not empty. An object store is checked by the init itself.
    pub fn check_init_location(location: &str) -> Result<()> {
        if location.starts_with("s3://") {
            return Ok(());
        }
        Self::check_new_root(Path::new(location))
    }

    /// The pack size `opts` asks for, once its options are checked.
    fn check_options(opts: &InitOptions) -> Result<u64> {
        if let Some(c) = &opts.chunker {
            Self::check_chunker_copy(c, opts.encryption.is_some())?;
        }
        Self::check_pack_size(opts.pack_size)
    }

    /// Whether a new repository, encrypted or not, can cut as `chunker`
    /// says ([`InitOptions::chunker`]): a plain one has nowhere to keep a
    /// keyed table's secret. For a caller to refuse before it asks for a
    /// password; `init` checks it again.
    pub fn check_chunker_copy(chunker: &ChunkerParams, encrypted: bool) -> Result<()> {
        if chunker.keyed() && !encrypted {
            return Err(StoreError::Invalid(
                "its chunker is keyed, and a repository that is not encrypted has nowhere to keep the secret".into(),
            ));
        }
        Ok(())
    }

    fn check_pack_size(pack_size: Option<u64>) -> Result<u64> {
        let pack_size = pack_size.unwrap_or(DEFAULT_PACK_SIZE);
        if !(MIN_PACK_SIZE..=MAX_PACK_SIZE).contains(&pack_size) {
            return Err(StoreError::Invalid(format!(
                "pack size {pack_size} is out of range {MIN_PACK_SIZE}..={MAX_PACK_SIZE}"
            )));
        }
        Ok(pack_size)
    }

    fn init_recording(root: &Path, opts: &InitOptions, made: &mut Made) -> Result<Repository> {
        let targets = &opts.targets;
        let pack_size = Self::check_options(opts)?;
        Self::check_new_root(root)?;
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
            if dir.join(MARKER).exists() {
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
            marker.write(&LocalDir::new(&dir))?;
            made.file(dir.join(MARKER));
            meta::sync_dir(&packs)?;
        }
        if opts.reserve > 0 {
            made.file(root.join(crate::reserve::RESERVE_FILE));
            crate::reserve::create(&root, opts.reserve)?;
        }
        let local = LocalDir::new(&root);
        if let Some(key) = Self::write_first_key(&local, id, opts)? {
            made.dir_all(&root.join("keys"))?;
            made.file(root.join(key.as_str()));
        }
        // The config is written last: until it exists, this is not a repository.
        Self::write_config(&local, id, stored, pack_size, opts.encryption.is_some())?;
        made.file(root.join("config"));
        Repository::open_with(&root, &*Self::init_password(opts))
    }

    /// The password `init` made the repository with, to open it.
    fn init_password(opts: &InitOptions) -> Box<dyn PasswordSource> {
        match &opts.encryption {
            Some((p, _)) => Box::new(p.clone()),
            None => Box::new(NoPassword),
        }
    }

    /// With encryption: a fresh master key, wrapped under the password
    /// into the first key file. Returns the key file's key.
    fn write_first_key(
        root: &dyn WriteBackend,
        id: RepoId,
        opts: &InitOptions,
    ) -> Result<Option<Key>> {
        let Some((password, params)) = &opts.encryption else {
            return Ok(None);
        };
        let crypt = match &opts.chunker {
            Some(c) => Crypt::generate_with(c.clone())?,
            None => Crypt::generate()?,
        };
        Self::write_key(root, id, &crypt, &password.0, *params).map(Some)
    }

    /// Wrap `crypt` under `password` into a new key file.
    fn write_key(
        root: &dyn WriteBackend,
        id: RepoId,
        crypt: &Crypt,
        password: &[u8],
        params: KdfParams,
    ) -> Result<Key> {
        let file = KeyFile::wrap(
            crypt,
            id,
            password,
            params,
            hostname(),
            username(),
            now_secs(),
        )?;
        let body =
            serde_json::to_vec_pretty(&file).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let key = Key::new(format!("keys/{}", PackId::random()));
        if !root.put_new(
            &key,
            &meta::seal(Kind::Key, crypt.key_file_version(), &body),
        )? {
            return Err(StoreError::AlreadyExists(root.locate(&key)));
        }
        Ok(key)
    }

    fn write_config(
        root: &dyn WriteBackend,
        id: RepoId,
        targets: Vec<PathBuf>,
        pack_size: u64,
        encrypted: bool,
    ) -> Result<()> {
        let config = Config {
            id: id.to_string(),
            created: now_secs(),
            targets,
            pack_size,
            encryption: encrypted.then(|| AEAD_NAME.to_string()),
        };
        let body =
            serde_json::to_vec_pretty(&config).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let key = Key::new("config");
        let version = if encrypted {
            ENCRYPTED_REPO_VERSION
        } else {
            REPO_VERSION
        };
        if !root.put_new(&key, &meta::seal(Kind::Config, version, &body))? {
            return Err(StoreError::AlreadyExists(root.locate(&key)));
        }
        Ok(())
    }

    /// Create a repository in an object store's `root` (one target,
    /// `data`, under it). Refused where a repository already is.
    pub fn init_remote(
        location: &str,
        root: Arc<dyn WriteBackend>,
        opts: &InitOptions,
    ) -> Result<Repository> {
        let pack_size = Self::check_options(opts)?;
        if root.get(&Key::new("config"))?.is_some() {
            return Err(StoreError::AlreadyExists(PathBuf::from(location)));
        }
        let id = RepoId::random();
        let data = root.child("data");
        // Created, not replaced: of two inits racing for this prefix the
        // one that made the marker goes on, the other stops here having
        // written nothing (a replaced marker left one init's config with
        // the other's marker, a repository no command opens).
        let created = Marker {
            repository: id.to_string(),
            target: 0,
            home: None,
        }
        .create(&*data)?;
        if !created {
            return Err(StoreError::Invalid(format!(
                "{location}/data: already a target of a cairn repository"
            )));
        }
        let mut key = None;
        let made = Self::write_first_key(&*root, id, opts).and_then(|k| {
            key = k;
            Self::write_config(
                &*root,
                id,
                vec![PathBuf::from("data")],
                pack_size,
                opts.encryption.is_some(),
            )
        });
        if let Err(e) = made {
            // What this init made, so that it can run again (the config,
            // if there is one, is not ours: it is written last).
            let _ = root.delete(&key.into_iter().collect::<Vec<_>>());
            let _ = data.delete(&[Key::new(MARKER)]);
            return Err(e);
        }
        Repository::open_remote(location, root, &*Self::init_password(opts))
    }

    /// Open the repository at `root` and check that every target is the
    /// right one.
    pub fn open(root: &Path) -> Result<Repository> {
        Self::open_with(root, &NoPassword)
    }

    /// [`Repository::open`] of a repository that may be encrypted.
    pub fn open_with(root: &Path, password: &dyn PasswordSource) -> Result<Repository> {
        let config = root.join("config");
        match fs::metadata(&config) {
            Ok(m) if m.is_file() => {}
            // A directory that cannot be entered is no proof there is no
            // repository in it: say why it cannot be read.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(e).ctx(&config, "open");
            }
            _ => return Err(StoreError::NotARepository(root.to_path_buf())),
        }
        let home = fs::canonicalize(root).ctx(root, "resolve path")?;
        Self::open_backend(
            root.display().to_string(),
            Arc::new(LocalDir::new(root)),
            Some((home, root)),
        )?
        .unlock(password)
    }

    /// Open the repository at `location`: a directory, or
    /// `s3://BUCKET/PREFIX` (credentials from the environment, see
    /// [`S3Backend`](crate::S3Backend)). A remote repository's index files are
    /// cached locally ([`cache_dir`]); with `pack_cache` > 0 bytes, the
    /// ranges of packs read too (for a served image's random reads).
    pub fn open_location(location: &str, pack_cache: u64) -> Result<Repository> {
        Self::open_location_with(location, pack_cache, &NoPassword)
    }

    /// [`Repository::open_location`] of a repository that may be
    /// encrypted: `password` is asked for if it is.
    pub fn open_location_with(
        location: &str,
        pack_cache: u64,
        password: &dyn PasswordSource,
    ) -> Result<Repository> {
        match Self::remote(location, Some(pack_cache))? {
            Some(root) => Self::open_remote(location, root, password),
            None => Self::open_with(Path::new(location), password),
        }
    }

    /// [`Repository::open_location_with`] without the local cache of a
    /// remote repository: every index file comes from the store. For
    /// `verify` and `repair`, which must judge what the store holds, not
    /// a copy made before it was damaged (restic's `check` uses a fresh
    /// cache for the same reason).
    pub fn open_location_uncached(
        location: &str,
        password: &dyn PasswordSource,
    ) -> Result<Repository> {
        match Self::remote(location, None)? {
            Some(root) => Self::open_remote(location, root, password),
            None => Self::open_with(Path::new(location), password),
        }
    }

    /// Create a repository at `location` (see [`Repository::open_location`]);
    /// `targets` only for a directory.
    pub fn init_location(
        location: &str,
        targets: &[PathBuf],
        pack_size: Option<u64>,
    ) -> Result<Repository> {
        Self::init_location_with(
            location,
            &InitOptions {
                targets: targets.to_vec(),
                pack_size,
                encryption: None,
                reserve: 0,
                chunker: None,
            },
        )
    }

    /// [`Repository::init_location`] with every option (encryption too).
    pub fn init_location_with(location: &str, opts: &InitOptions) -> Result<Repository> {
        match Self::remote(location, Some(0))? {
            Some(_) if !opts.targets.is_empty() => Err(StoreError::Invalid(format!(
                "{location}: an object store's repository keeps its packs in it (no --target)"
            ))),
            Some(root) => Self::init_remote(location, root, opts),
            None => Self::init_with(Path::new(location), opts),
        }
    }

    /// The backend of a remote `location`, with its local cache (`None`:
    /// without); `None` for a directory.
    fn remote(location: &str, pack_cache: Option<u64>) -> Result<Option<Arc<dyn WriteBackend>>> {
        if !location.starts_with("s3://") {
            return Ok(None);
        }
        let s3: Arc<dyn WriteBackend> = Arc::new(crate::s3::S3Backend::from_url(location)?);
        let Some(pack_cache) = pack_cache else {
            return Ok(Some(s3));
        };
        let Some(dir) = cache_dir(location) else {
            return Ok(Some(s3));
        };
        let cached = match crate::cache::CachedBackend::new(
            s3.clone(),
            &dir,
            if pack_cache > 0 {
                pack_cache
            } else {
                crate::cache::DEFAULT_CACHE_BYTES
            },
        ) {
            Ok(c) => c,
            Err(e) => {
                // As restic does: the cache only saves requests.
                tracing::warn!(
                    "cannot use the local cache ({e}); going on without it: every index file \
                     and manifest comes from the bucket (set CAIRN_CACHE_DIR to a writable \
                     directory)"
                );
                return Ok(Some(s3));
            }
        };
        Ok(Some(Arc::new(if pack_cache > 0 {
            cached
        } else {
            cached.metadata_only()
        })))
    }

    /// Open the repository in an object store's `root`.
    pub fn open_remote(
        location: &str,
        root: Arc<dyn WriteBackend>,
        password: &dyn PasswordSource,
    ) -> Result<Repository> {
        if root.get(&Key::new("config"))?.is_none() {
            return Err(StoreError::NotARepository(PathBuf::from(location)));
        }
        Self::open_backend(location.to_string(), root, None)?.unlock(password)
    }

    /// Open the keys of an encrypted repository with the password; refuse
    /// a plain repository when a password was given.
    fn unlock(mut self, password: &dyn PasswordSource) -> Result<Repository> {
        if self.encryption.is_none() {
            if password.given() {
                return Err(StoreError::Invalid(format!(
                    "{}: the repository is not encrypted, but a password was given; refusing (it may have been replaced by a plain one); use it without a password if it was made with --encryption none",
                    self.location
                )));
            }
            // Its config is not sealed: rewritten to say "none", an
            // encrypted repository would take a backup in the clear from
            // whoever types the password at a prompt (never asked now).
            // Key files say what it was.
            if self.root.list("keys/")?.iter().any(|l| {
                l.key
                    .as_str()
                    .strip_prefix("keys/")
                    .is_some_and(|id| PackId::from_hex(id).is_some())
            }) {
                return Err(StoreError::corrupt(
                    self.root.locate(&Key::new("config")),
                    0,
                    "the config says the repository is not encrypted, but it holds key files: \
                     the config may have been replaced; refusing to read or write it in the clear",
                ));
            }
            return Ok(self);
        }
        let secret = match password.password() {
            Ok(p) => p,
            Err(_) if !password.given() => {
                return Err(StoreError::KeyNeeded(self.location.clone()))
            }
            Err(why) => return Err(StoreError::Password(why)),
        };
        // A damaged (or planted) key file does not lock out the others:
        // it is reported only if no key opens.
        let (mut keys, mut damaged) = self.key_files_lenient()?;
        // Cheapest first (then oldest): a planted key file asking for the
        // most Argon2id allows is paid only when no cheaper key opens.
        keys.sort_by_key(|(_, f)| u64::from(f.params.memory_kib) * u64::from(f.params.iterations));
        let found = keys.len();
        for (id, file) in keys {
            match file.unwrap(self.id, &secret) {
                Ok(Some(crypt)) => {
                    self.crypt = Some(Arc::new(crypt));
                    self.key_id = Some(id);
                    return Ok(self);
                }
                Ok(None) => {}
                Err(e) => damaged.push((id, e)),
            }
        }
        match damaged.first().map(|(_, e)| e) {
            None if found == 0 => Err(StoreError::corrupt(
                self.root.locate(&Key::new("keys")),
                0,
                "the repository is encrypted but holds no key file",
            )),
            None => Err(StoreError::WrongPassword(self.location.clone())),
            Some(e) => Err(StoreError::WrongPassword(format!(
                "{} ({} damaged key file(s), the password may be theirs: {e})",
                self.location,
                damaged.len()
            ))),
        }
    }

    /// Every key file that can be read, and the errors of those that
    /// cannot (damaged, or with parameters out of bounds).
    fn key_files_lenient(&self) -> Result<(Vec<NamedKey>, Vec<DamagedKey>)> {
        let mut good = Vec::new();
        let mut damaged = Vec::new();
        for l in self.root.list("keys/")? {
            let Some(id) = l.key.as_str().strip_prefix("keys/") else {
                continue;
            };
            if PackId::from_hex(id).is_none() {
                continue;
            }
            let Some(data) = self.root.get(&l.key)? else {
                continue;
            };
            let path = self.root.locate(&l.key);
            let read = meta::open(&path, &data, Kind::Key, KEY_VERSION).and_then(|(_, body)| {
                let file: KeyFile = serde_json::from_slice(body)
                    .map_err(|e| StoreError::corrupt(&path, 24, format!("key file: {e}")))?;
                file.check()
                    .map_err(|e| StoreError::corrupt(&path, 24, e.to_string()))?;
                Ok(file)
            });
            match read {
                Ok(file) => good.push((id.to_string(), file)),
                Err(e) => damaged.push((id.to_string(), e)),
            }
        }
        good.sort_by(|a, b| a.1.created.cmp(&b.1.created).then(a.0.cmp(&b.0)));
        Ok((good, damaged))
    }

    /// The keys of an encrypted repository (none for a plain one).
    pub fn keys(&self) -> Result<Vec<KeyInfo>> {
        Ok(self.key_list()?.0)
    }

    /// The keys of an encrypted repository, and the key files that cannot
    /// be read (id and why): damaged, or asking for more than cairn allows.
    pub fn key_list(&self) -> Result<KeyList> {
        if self.crypt.is_none() {
            return Ok((Vec::new(), Vec::new()));
        }
        let (good, damaged) = self.key_files_lenient()?;
        let keys = good
            .into_iter()
            .map(|(id, file)| KeyInfo {
                current: self.key_id.as_deref() == Some(id.as_str()),
                id,
                file,
            })
            .collect();
        Ok((
            keys,
            damaged
                .into_iter()
                .map(|(id, e)| (id, e.to_string()))
                .collect(),
        ))
    }

    /// Add a key: the master key wrapped under another password. Returns
    /// its id.
    pub fn add_key(&self, password: &Password, params: KdfParams) -> Result<String> {
        let Some(crypt) = &self.crypt else {
            return Err(StoreError::Invalid(format!(
                "{}: the repository is not encrypted; it has no keys",
                self.location
            )));
        };
        let key = Self::write_key(&*self.root, self.id, crypt, &password.0, params)?;
        Ok(key.as_str().trim_start_matches("keys/").to_string())
    }

    /// Remove key `id` (a unique prefix of it will do), also a damaged
    /// one. The key that opened the repository (so the last key) is
    /// refused.
    ///
    /// Removals run one at a time, under the held object `locks/keys`,
    /// and each checks, under it, that the key in use is still there: two
    /// at once, each removing the key the other opened with, left the
    /// repository without any key (its data lost for good).
    pub fn remove_key(&self, id: &str) -> Result<String> {
        let _lock = self.lock_keys()?;
        let (keys, damaged) = self.key_list()?;
        if let Some(used) = self.key_id.as_deref() {
            if !keys.iter().any(|k| k.current) {
                return Err(StoreError::Invalid(format!(
                    "{}: key {used}, the one in use, was removed meanwhile; nothing removed (open the repository again)",
                    self.location
                )));
            }
        }
        let found: Vec<(&str, bool)> = keys
            .iter()
            .map(|k| (k.id.as_str(), k.current))
            .chain(damaged.iter().map(|(d, _)| (d.as_str(), false)))
            .filter(|(k, _)| k.starts_with(id))
            .collect();
        let (k, current) = match found[..] {
            [k] => k,
            [] => {
                return Err(StoreError::NotFound(format!(
                    "{}: no key {id:?} (cairn key list shows them)",
                    self.location
                )))
            }
            _ => {
                return Err(StoreError::Invalid(format!(
                    "{}: {id:?} names {} keys; give more of its id",
                    self.location,
                    found.len()
                )))
            }
        };
        if current {
            return Err(StoreError::Invalid(format!(
                "{}: key {k} is the one in use; open the repository with another key's password to remove it",
                self.location
            )));
        }
        self.root.delete(&[Key::new(format!("keys/{k}"))])?;
        Ok(k.to_string())
    }

    /// Hold `locks/keys` (never an image's lock: those are 32 hex in an
    /// encrypted repository), waiting up to a minute for another key
    /// removal to end.
    fn lock_keys(&self) -> Result<Box<dyn Held>> {
        self.hold_waiting("keys", "cairn key remove")
    }

    /// Hold `locks/NAME` (a name no image's lock has: see
    /// [`Repository::lock_keys`]) for `what`, waiting up to a minute for
    /// its holder to let go.
    fn hold_waiting(&self, name: &str, what: &str) -> Result<Box<dyn Held>> {
        let key = Key::new(format!("locks/{name}"));
        let body = self.info_body(what)?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            match self.hold_or_take_over(&key, &body) {
                Err(StoreError::Locked { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(StoreError::Locked { holder, .. }) => {
                    return Err(StoreError::Locked {
                        path: PathBuf::from(format!("{}: {name}", self.location)),
                        holder: self.describe_holder(holder),
                    })
                }
                other => return other,
            }
        }
    }

    /// The AEAD of an encrypted repository (`None`: plain).
    pub fn encryption(&self) -> Option<&str> {
        self.encryption.as_deref()
    }

    /// The repository's keys, in an encrypted repository.
    pub fn crypt(&self) -> Option<&Arc<Crypt>> {
        self.crypt.as_ref()
    }

    /// The gear table of the repository's content-defined chunker: keyed
    /// in an encrypted repository that has a chunker secret, the public
    /// one otherwise. Every writer that cuts chunks takes it from here.
    pub fn gear_table(&self) -> GearTable {
        self.crypt
            .as_ref()
            .and_then(|c| c.gear_table())
            .unwrap_or_else(GearTable::public)
    }

    /// Whether the chunker's gear table is keyed ([`Self::gear_table`]).
    pub fn chunker_keyed(&self) -> bool {
        self.crypt.as_ref().is_some_and(|c| c.has_chunker_secret())
    }

    /// The chunker's gear table as reports name it: `keyed` or `public`.
    pub fn chunker_table(&self) -> &'static str {
        if self.chunker_keyed() {
            "keyed"
        } else {
            "public"
        }
    }

    /// Where this repository's chunker cuts, for a new repository to cut
    /// alike ([`InitOptions::chunker`]).
    pub fn chunker_params(&self) -> ChunkerParams {
        self.crypt
            .as_ref()
            .map(|c| c.chunker_params())
            .unwrap_or_default()
    }

    /// The key file that opened an encrypted repository.
    pub fn key_id(&self) -> Option<&str> {
        self.key_id.as_deref()
    }

    /// The id of a chunk's bytes in this repository (keyed if encrypted).
    pub fn chunk_id(&self, data: &[u8]) -> crate::id::ChunkId {
        crate::crypt::chunk_id(self.crypt.as_deref(), data)
    }

    /// Whether packs hold sealed records.
    pub fn sealed(&self) -> bool {
        self.crypt.is_some()
    }

    /// A record decoder for this repository's packs.
    pub fn record_decoder(&self) -> crate::pack::RecordDecoder {
        crate::pack::RecordDecoder::new(self.crypt.clone())
    }

    /// Wrap a metadata body (sealed in an encrypted repository).
    pub(crate) fn seal_meta(&self, kind: Kind, version: u32, body: &[u8]) -> Result<Vec<u8>> {
        meta::seal_with(kind, version, body, self.crypt.as_deref())
    }

    /// Open the repository in `root`; `local` is a local repository's
    /// canonical directory (its home) and the path it was opened by (its
    /// targets inside are named by that path, as given).
    fn open_backend(
        location: String,
        root: Arc<dyn WriteBackend>,
        local: Option<(PathBuf, &Path)>,
    ) -> Result<Repository> {
        let (home, given) = match local {
            Some((home, given)) => (Some(home), Some(given)),
            None => (None, None),
        };
        let cfg_key = Key::new("config");
        let cfg_path = root.locate(&cfg_key);
        let data = root
            .get(&cfg_key)?
            .ok_or_else(|| StoreError::NotARepository(PathBuf::from(&location)))?;
        let (version, body) = meta::open(&cfg_path, &data, Kind::Config, ENCRYPTED_REPO_VERSION)?;
        let config: Config = serde_json::from_slice(body)
            .map_err(|e| StoreError::corrupt(&cfg_path, 24, format!("config: {e}")))?;
        match (&config.encryption, version) {
            (None, REPO_VERSION) => {}
            (Some(a), ENCRYPTED_REPO_VERSION) if a == AEAD_NAME => {}
            (Some(a), ENCRYPTED_REPO_VERSION) => {
                return Err(StoreError::Invalid(format!(
                    "{}: encrypted with {a}; this cairn knows {AEAD_NAME}",
                    cfg_path.display()
                )))
            }
            (e, v) => {
                return Err(StoreError::corrupt(
                    &cfg_path,
                    24,
                    format!("config version {v} with encryption {e:?}"),
                ))
            }
        }
        let id = RepoId::from_hex(&config.id)
            .ok_or_else(|| StoreError::corrupt(&cfg_path, 24, "config: bad repository id"))?;
        let mut targets = Vec::new();
        let mut unclaimed = Vec::new();
        for (i, t) in config.targets.iter().enumerate() {
            let target = if t.is_absolute() {
                let Some(home) = &home else {
                    return Err(StoreError::corrupt(
                        &cfg_path,
                        24,
                        format!("config: target {} is a local path", t.display()),
                    ));
                };
                let _ = home;
                Target {
                    backend: Arc::new(LocalDir::new(t)),
                    dir: Some(t.clone()),
                    absolute: true,
                }
            } else {
                let rel = t.to_str().filter(|s| {
                    !s.is_empty() && s.split('/').all(|p| !p.is_empty() && p != "." && p != "..")
                });
                let Some(rel) = rel else {
                    return Err(StoreError::corrupt(
                        &cfg_path,
                        24,
                        format!("config: bad target {}", t.display()),
                    ));
                };
                Target {
                    backend: root.child(rel),
                    dir: given.map(|g| g.join(rel)),
                    absolute: false,
                }
            };
            let marker = Marker::read(&*target.backend)?;
            let shown = target.backend.locate(&Key::new(""));
            if marker.repository != config.id || usize::from(marker.target) != i {
                return Err(StoreError::Invalid(format!(
                    "{}: belongs to repository {} as target {}, expected {} target {i}",
                    shown.display(),
                    marker.repository,
                    marker.target,
                    config.id
                )));
            }
            // A target outside the repository is shared by every copy of
            // the repository (`cp -a`, same id): it belongs to the one
            // its marker names as home. A home that no longer holds the
            // repository means it was moved: the next writer claims it.
            if let (true, Some(home)) = (target.absolute, &home) {
                match &marker.home {
                    Some(h) if h == home || same_dir(h, home) => {}
                    Some(h) if holds_repository(h, &config.id) => {
                        return Err(copy_refused(&shown, i, h, home));
                    }
                    _ => unclaimed.push(i as u16),
                }
            }
            targets.push(target);
        }
        if targets.is_empty() {
            return Err(StoreError::corrupt(
                &cfg_path,
                24,
                "config lists no targets",
            ));
        }
        let seen = seen_record(id, home.as_deref(), &location);
        Ok(Repository {
            location,
            root,
            home,
            id,
            targets,
            pack_size: config.pack_size.clamp(MIN_PACK_SIZE, MAX_PACK_SIZE),
            unclaimed,
            encryption: config.encryption,
            crypt: None,
            key_id: None,
            seen: Arc::new(std::sync::Mutex::new(seen)),
        })
    }

    /// Write this repository's home into the markers of targets that do
    /// not name it yet (see [`Repository::open`]), so that a repository
    /// copied before markers named their home is claimed by one side only.
    fn claim_targets(&self) -> Result<()> {
        let Some(home) = &self.home else {
            return Ok(());
        };
        for &i in &self.unclaimed {
            let Some(t) = self.targets.get(usize::from(i)) else {
                continue;
            };
            let marker = Marker::read(&*t.backend)?;
            match &marker.home {
                Some(h) if h == home => continue,
                // Claimed by a copy since this one was opened.
                Some(h) if holds_repository(h, &self.id.to_string()) && !same_dir(h, home) => {
                    return Err(copy_refused(
                        &t.backend.locate(&Key::new("")),
                        usize::from(i),
                        h,
                        home,
                    ));
                }
                _ => {}
            }
            Marker {
                home: Some(home.clone()),
                ..marker
            }
            .write(&*t.backend)?;
        }
        Ok(())
    }

    /// Where the repository is: its directory or its URL.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The repository directory, for a local repository.
    pub fn local_root(&self) -> Option<&Path> {
        self.home.as_deref()
    }

    /// The backend of the repository's metadata.
    pub fn backend(&self) -> &Arc<dyn WriteBackend> {
        &self.root
    }

    /// The repository id.
    pub fn id(&self) -> RepoId {
        self.id
    }

    /// How many targets packs are spread over.
    pub fn target_count(&self) -> usize {
        self.targets.len()
    }

    /// Target `t`'s backend.
    pub fn target(&self, t: u16) -> Result<&Arc<dyn WriteBackend>> {
        self.targets
            .get(usize::from(t))
            .map(|t| &t.backend)
            .ok_or_else(|| {
                StoreError::Invalid(format!(
                    "target {t} named, the repository has {}",
                    self.targets.len()
                ))
            })
    }

    /// Where each target is (a directory or a URL), in order.
    pub fn target_locations(&self) -> Vec<String> {
        self.targets
            .iter()
            .map(|t| match &t.dir {
                Some(d) => d.display().to_string(),
                None => t.backend.locate(&Key::new("")).display().to_string(),
            })
            .collect()
    }

    /// Target directories of a local repository (empty for a remote one).
    pub fn target_dirs(&self) -> Vec<PathBuf> {
        self.targets.iter().filter_map(|t| t.dir.clone()).collect()
    }

    /// Size at which packs are sealed.
    pub fn pack_size(&self) -> u64 {
        self.pack_size
    }

    // ---- the reserve (local repositories) ----

    /// The reserve's size and the bytes it holds now; None: no reserve
    /// (made without one, or in an object store).
    pub fn reserve(&self) -> Result<Option<(u64, u64)>> {
        match self.local_root() {
            Some(root) => crate::reserve::read(root),
            None => Ok(None),
        }
    }

    /// Check the reserve's header, and with `contents` that it holds
    /// only zeros.
    pub fn check_reserve(&self, contents: bool) -> Result<()> {
        match self.local_root() {
            Some(root) => crate::reserve::check(root, contents),
            None => Ok(()),
        }
    }

    /// Give the reserve's space back to the disk, for a command that
    /// frees space on a full disk; the bytes released (0: none).
    pub fn release_reserve(&self) -> Result<u64> {
        match self.local_root() {
            Some(root) => crate::reserve::release(root),
            None => Ok(0),
        }
    }

    /// Release the reserve now if the disk has less free space than the
    /// reserve holds (gc on a nearly full disk: released before its work,
    /// not after a failure midway). The bytes released (0: none).
    pub fn release_reserve_if_short(&self) -> Result<u64> {
        let Some(root) = self.local_root() else {
            return Ok(0);
        };
        let Ok(Some((size, _))) = crate::reserve::read(root) else {
            return Ok(0);
        };
        match crate::reserve::free_space(root) {
            Some(free) if free < size => crate::reserve::release(root),
            _ => Ok(0),
        }
    }

    /// Fill a released reserve again; `false` when the disk has no room
    /// for it yet.
    pub fn refill_reserve(&self) -> Result<bool> {
        match self.local_root() {
            Some(root) => crate::reserve::refill(root),
            None => Ok(true),
        }
    }

    /// [`Repository::session`] for a command that frees space (rm,
    /// forget, gc, repair): on a full disk the reserve is released to
    /// register it. The bytes released come back with the session.
    pub fn session_freeing(&self, what: &str) -> Result<(Session, u64)> {
        match self.session(what) {
            Err(e) if e.is_no_space() => {
                // (A reserve that cannot be released leaves the full disk's
                // error as it was.)
                let released = self.release_reserve().unwrap_or(0);
                if released == 0 {
                    return Err(e);
                }
                Ok((self.session(what)?, released))
            }
            other => other.map(|s| (s, 0)),
        }
    }

    // ---- sessions ----

    /// Register a running writer or reader, described by `what` (shown to
    /// whoever finds the repository busy). A reader of a read-only local
    /// directory runs without one (nothing can be deleted there).
    pub fn session(&self, what: &str) -> Result<Session> {
        let id = PackId::random().to_string();
        let body = self.info_body(what)?;
        let held = match self.root.hold(&Key::new(format!("sessions/{id}")), &body) {
            Ok(h) => Some(h),
            Err(StoreError::Io { source, .. }) if source.raw_os_error() == Some(libc::EROFS) => {
                None
            }
            Err(e) => return Err(e),
        };
        self.claim_targets()?;
        Ok(Session { id, held })
    }

    /// The sessions registered now, with whether each is still running
    /// (the dead ones, left by killed processes, are removed).
    pub(crate) fn sessions(&self) -> Result<Vec<(String, Liveness)>> {
        Ok(self
            .session_list()?
            .into_iter()
            .map(|(id, live, _)| (id, live))
            .collect())
    }

    /// [`Repository::sessions`] with what each says of its holder (one
    /// look at each: a bucket's session costs one GET).
    fn session_list(&self) -> Result<Vec<(String, Liveness, Option<SessionInfo>)>> {
        let mut out = Vec::new();
        for l in self.root.list("sessions/")? {
            let Some(id) = l.key.as_str().strip_prefix("sessions/") else {
                continue;
            };
            if PackId::from_hex(id).is_none() {
                continue;
            }
            let (live, info, _) = self.look_at_hold(&l.key)?;
            if live == Liveness::Dead {
                self.root.delete(std::slice::from_ref(&l.key))?;
            }
            out.push((id.to_string(), live, info));
        }
        Ok(out)
    }

    /// The sessions running now, as they describe themselves (one whose
    /// object cannot be read is left out).
    pub fn running(&self) -> Result<Vec<SessionInfo>> {
        let mut out: Vec<SessionInfo> = self
            .session_list()?
            .into_iter()
            .filter(|(_, live, _)| *live == Liveness::Live)
            .filter_map(|(_, _, info)| info)
            .collect();
        out.sort_by_key(|i| i.started);
        Ok(out)
    }

    /// Whether session `id` is still running.
    pub(crate) fn session_liveness(&self, id: &str) -> Result<Liveness> {
        if PackId::from_hex(id).is_none() {
            return Ok(Liveness::Gone);
        }
        Ok(self.look_at_hold(&Key::new(format!("sessions/{id}")))?.0)
    }

    /// Whether the holder of session or lock `key` still runs, what its
    /// object says of it, and the object's body (empty when gone). In a
    /// bucket, one left by a process of this machine that is gone
    /// ([`SessionInfo::ended_here`]) is dead at once; a directory's holds
    /// are locks the kernel drops.
    fn look_at_hold(&self, key: &Key) -> Result<(Liveness, Option<SessionInfo>, Vec<u8>)> {
        let Some((live, body)) = self.root.inspect(key)? else {
            return Ok((Liveness::Gone, None, Vec::new()));
        };
        let info = self.read_info(&body);
        let live = match live {
            Liveness::Live if self.ended_here(info.as_ref()) => Liveness::Dead,
            live => live,
        };
        Ok((live, info, body))
    }

    /// Whether the holder `info` names, of a bucket's held object, was a
    /// process of this machine that is gone (a directory's holds are
    /// locks the kernel drops: never).
    fn ended_here(&self, info: Option<&SessionInfo>) -> bool {
        self.local_root().is_none() && info.is_some_and(SessionInfo::ended_here)
    }

    /// Hold session or lock `key` with `body`; one left by a writer of
    /// this machine that has ended is taken over, as one whose lease ran
    /// out is (only from that writer: of two takers one wins).
    fn hold_or_take_over(&self, key: &Key, body: &[u8]) -> Result<Box<dyn Held>> {
        match self.root.hold(key, body) {
            Err(StoreError::Locked { holder, .. })
                if self.ended_here(self.read_info(holder.as_bytes()).as_ref()) =>
            {
                tracing::info!(key = %key, "taking over the hold of an ended process");
                self.root.take_over(key, body, holder.as_bytes())
            }
            other => other,
        }
    }

    /// Whether a session other than `me` is running.
    pub(crate) fn others_running(&self, me: &Session) -> Result<bool> {
        Ok(self
            .sessions()?
            .iter()
            .any(|(id, l)| *l == Liveness::Live && id != me.id()))
    }

    /// Remove the sessions and locks of processes that are gone (`cairn
    /// unlock`): those whose lease ran out or whose process of this
    /// machine ended (the rest of cairn takes these for dead too; this
    /// removes them at once). With `all`, also those that look live: in a
    /// bucket, a lease left by a process killed on another machine stays
    /// live for its 15 minutes, and only its owner can tell it is gone.
    /// A directory's live ones are kernel locks of running processes and
    /// are kept even then. Each is removed only if it still holds what was
    /// read (one taken meanwhile by a new holder is left).
    pub fn unlock_holds(&self, all: bool) -> Result<Unlocked> {
        let mut out = Unlocked::default();
        let mut keys = self.root.list("sessions/")?;
        keys.extend(self.root.list("locks/")?);
        for l in keys {
            let (live, info, body) = self.look_at_hold(&l.key)?;
            if live == Liveness::Gone {
                continue;
            }
            let mut entry = HoldEntry {
                key: l.key.to_string(),
                live: live == Liveness::Live,
                info,
                kept: None,
            };
            if live == Liveness::Live && !all {
                // In a directory a live one is a running process's lock,
                // which --remove-all keeps too: no hint that it would not
                // (found by a black-box test).
                let why = match self.local_root() {
                    Some(_) => "held by a running process (its lock is taken)",
                    None => "live (--remove-all removes it)",
                };
                entry.kept = Some(why.into());
                out.kept.push(entry);
                continue;
            }
            match self.root.break_hold(&l.key, &body) {
                Ok(true) => out.removed.push(entry),
                // Ended, or taken by a new holder, meanwhile.
                Ok(false) => {}
                Err(StoreError::Locked { .. }) => {
                    entry.kept = Some("held by a running process (its lock is taken)".into());
                    out.kept.push(entry);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Take image `name` for writing: one writer of an image at a time
    /// (fails at once naming the holder).
    pub fn lock_image(&self, name: &str, what: &str) -> Result<ImageLock> {
        validate_name(name)?;
        let body = self.info_body(what)?;
        let key = Key::new(format!("locks/{}", self.image_dir(name)));
        match self.hold_or_take_over(&key, &body) {
            Ok(h) => Ok(ImageLock { _held: h }),
            Err(StoreError::Locked { holder, .. }) => Err(StoreError::Locked {
                path: PathBuf::from(format!("{}: image {name}", self.location)),
                holder: self.describe_holder(holder),
            }),
            Err(e) => Err(e),
        }
    }

    /// Who holds a lock, from its body: what, pid, host and since when.
    fn describe_holder(&self, holder: String) -> String {
        self.read_info(holder.as_bytes())
            .map(|i| {
                format!(
                    "{}, pid {} on {}, since {}",
                    i.what,
                    i.pid,
                    i.host,
                    crate::retention::format_time(i.started)
                )
            })
            .unwrap_or(holder)
    }

    /// The body of a session or image lock: JSON, or in an encrypted
    /// repository the hex of it sealed (it names an image).
    fn info_body(&self, what: &str) -> Result<Vec<u8>> {
        let json = SessionInfo::now(what)?;
        let Some(c) = &self.crypt else {
            return Ok(json);
        };
        let mut sealed = Vec::new();
        c.seal_to(b"cairn session", &json, &mut sealed)?;
        Ok(crate::id::hex(&sealed).into_bytes())
    }

    /// A session's or lock's body, as [`Repository::info_body`] wrote it.
    fn read_info(&self, body: &[u8]) -> Option<SessionInfo> {
        let Some(c) = &self.crypt else {
            return serde_json::from_slice(body).ok();
        };
        let text = std::str::from_utf8(body).ok()?.trim();
        let mut sealed = vec![0u8; text.len() / 2];
        if !crate::id::unhex(text, &mut sealed) {
            return None;
        }
        let mut json = Vec::new();
        c.open_to(b"cairn session", &sealed, &mut json)
            .then(|| serde_json::from_slice(&json).ok())
            .flatten()
    }

    // ---- snapshots ----

    /// The directory of image `name` under `snapshots/` (and its name
    /// under `locks/`): the name itself, or in an encrypted repository a
    /// keyed hash of it.
    fn image_dir(&self, name: &str) -> String {
        match (&self.crypt, unnamed_dir(name)) {
            (Some(_), Some(dir)) => dir.to_string(),
            (Some(c), None) => c.name_tag(name),
            (None, _) => name.to_string(),
        }
    }

    fn manifest_key(&self, name: &str, snapshot: u64) -> Key {
        Key::new(format!(
            "snapshots/{}/{snapshot:010}.snap",
            self.image_dir(name)
        ))
    }

    /// Where a manifest is (a path or a URL).
    pub fn manifest_path(&self, name: &str, snapshot: u64) -> PathBuf {
        self.root.locate(&self.manifest_key(name, snapshot))
    }

    /// Every image with its snapshot numbers, sorted. In an encrypted
    /// repository an image's name is read from its latest manifest.
    pub fn images(&self) -> Result<Vec<(String, Vec<u64>)>> {
        let mut by_dir: BTreeMap<String, Vec<u64>> = Default::default();
        for l in self.root.list("snapshots/")? {
            let Some((dir, n)) = self.parse_manifest_key(&l.key) else {
                continue;
            };
            by_dir.entry(dir.to_string()).or_default().push(n);
        }
        for v in by_dir.values_mut() {
            v.sort_unstable();
        }
        let mut out = Vec::new();
        for (dir, v) in &by_dir {
            let (dir, v) = (dir.clone(), v.clone());
            if self.crypt.is_none() {
                out.push((dir, v));
                continue;
            }
            // The latest manifest names the image (one removed since the
            // listing, or damaged: the one before it). With none readable,
            // the image is named `#DIR`, so that every snapshot of it is
            // reported (and can be removed) while the others are listed.
            let mut name = None;
            let mut present = false;
            for &n in v.iter().rev() {
                let key = Key::new(format!("snapshots/{dir}/{n:010}.snap"));
                let Some(data) = self.root.get(&key)? else {
                    continue;
                };
                present = true;
                let path = self.root.locate(&key);
                match Manifest::decode_with(&path, &data, self.crypt.as_deref()) {
                    Ok(m) if self.image_dir(&m.name) == dir => {
                        name = Some(m.name);
                        break;
                    }
                    // Damaged, or in another image's place: reading it
                    // by this name reports it.
                    _ => continue,
                }
            }
            match name {
                Some(name) => out.push((name, v)),
                None if present => out.push((format!("{UNNAMED}{dir}"), v)),
                None => {}
            }
        }
        let names: HashMap<String, String> = out
            .iter()
            .map(|(name, _)| (self.image_dir(name), name.clone()))
            .collect();
        self.note_listing(None, &by_dir, |dir| {
            names
                .get(dir)
                .cloned()
                .unwrap_or_else(|| format!("{UNNAMED}{dir}"))
        });
        out.sort();
        Ok(out)
    }

    /// Take in a listing of snapshots (`present`, by image folder;
    /// `scope`: the one folder listed, or `None` for every image): a
    /// snapshot this machine saw before that is absent and that no removal
    /// record names has vanished, and is warned of (`seen.rs`). `name_of`
    /// names a folder's image.
    fn note_listing(
        &self,
        scope: Option<&str>,
        present: &BTreeMap<String, Vec<u64>>,
        name_of: impl Fn(&str) -> String,
    ) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if !seen.kept() {
            return;
        }
        let mut removed = Vec::new();
        let mut vanished = Vec::new();
        let missing = seen.missing(scope, present).0;
        seen.drop_settled();
        for (place, name) in missing {
            if seen.is_vanished(&place) {
                vanished.push((place, name));
                continue;
            }
            let said = seen.unchecked.remove(&place).is_some();
            match self.removal_recorded(&place) {
                Ok(true) => removed.push(place),
                Ok(false) => vanished.push((place, name)),
                // Not read (an I/O or network error): neither, until it is.
                Err(e) => {
                    if !said {
                        tracing::warn!(
                            "{name}@{}, seen on this machine, is gone, and its removal record \
                             cannot be read: {e}",
                            place.1
                        );
                    }
                    seen.unchecked.insert(place, (name, e.to_string()));
                }
            }
        }
        for (dir, numbers) in present {
            for &n in numbers {
                seen.unchecked.remove(&(dir.clone(), n));
            }
        }
        let listed = present.iter().flat_map(|(dir, v)| {
            let name = name_of(dir);
            v.iter().map(move |&n| ((dir.clone(), n), name.clone()))
        });
        seen.take(&removed, vanished, listed, &self.location);
    }

    fn removal_key(dir: &str, snapshot: u64) -> Key {
        Key::new(format!("removed/{dir}/{snapshot:010}.rm"))
    }

    /// Whether a sound removal record names the snapshot at `place`
    /// (`false` for none, and for one damaged, forged, or naming another
    /// snapshot, which is said).
    fn removal_recorded(&self, place: &(String, u64)) -> Result<bool> {
        let key = Self::removal_key(&place.0, place.1);
        let Some(data) = self.root.get(&key)? else {
            return Ok(false);
        };
        let path = self.root.locate(&key);
        match Removal::decode(&path, &data, self.crypt.as_deref()) {
            Ok(r) if r.snapshot == place.1 && self.image_dir(&r.name) == place.0 => Ok(true),
            Ok(r) => {
                tracing::warn!(
                    "{}: names {}@{}, not the snapshot of its place",
                    path.display(),
                    r.name,
                    r.snapshot
                );
                Ok(false)
            }
            Err(e) => {
                tracing::warn!("{e}");
                Ok(false)
            }
        }
    }

    /// The numbers of image `name`'s removal records, ascending.
    fn removed_numbers(&self, name: &str) -> Result<Vec<u64>> {
        let dir = self.image_dir(name);
        let prefix = format!("removed/{dir}/");
        let mut v: Vec<u64> = self
            .root
            .list(&prefix)?
            .iter()
            .filter_map(|l| {
                l.key
                    .as_str()
                    .strip_prefix(&prefix)?
                    .strip_suffix(".rm")?
                    .parse()
                    .ok()
            })
            .collect();
        v.sort_unstable();
        Ok(v)
    }

    /// Snapshots this machine saw in the repository that are gone with no
    /// removal record, found by the listings so far (run [`Repository::images`]
    /// first for all of them): (image name, number).
    pub fn vanished(&self) -> Vec<(String, u64)> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.vanished()
    }

    /// Forget the vanished snapshots on this machine (lost, or removed on
    /// purpose by hand or by a cairn that wrote no removal records): they
    /// are no longer reported, and gc runs again. Returns them.
    pub fn accept_vanished(&self) -> Result<Vec<(String, u64)>> {
        // Found without the warnings that say to run this.
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).quiet = true;
        let listed = self.images();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.quiet = false;
        listed?;
        Ok(seen.accept_vanished())
    }

    /// Fail when snapshots have vanished (see [`Repository::vanished`]),
    /// as found by the listings so far: for what would delete the chunks
    /// only they use (gc, right after the listing it marks from).
    pub fn refuse_vanished(&self, what: &str) -> Result<()> {
        let v = self.vanished();
        let unchecked = self.unreadable_removals();
        let mut why = Vec::new();
        if !v.is_empty() {
            why.push(format!(
                "{}: it may be put back. `cairn verify` reports what is gone; `cairn verify \
                 --accept-vanished` forgets it",
                crate::seen::gone_without_record(&v, &self.location)
            ));
        }
        if let Some((name, snapshot, error)) = unchecked.first() {
            why.push(format!(
                "the removal record of {name}@{snapshot} (seen on this machine, gone) cannot be \
                 read: {error}{}. Run it again once the store reads; a record that never will \
                 can be deleted, and the snapshot is then reported vanished",
                match unchecked.len() {
                    1 => String::new(),
                    n => format!(" (and {} more records)", n - 1),
                }
            ));
        }
        if why.is_empty() {
            return Ok(());
        }
        Err(StoreError::Invalid(format!(
            "{what} deletes nothing while {}",
            why.join("; and while ")
        )))
    }

    /// Snapshots this machine saw that are gone, whose removal record
    /// could not be read by the listings so far: (image name, number, the
    /// error). Neither removed nor vanished until it is read.
    pub fn unreadable_removals(&self) -> Vec<(String, u64, String)> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.unchecked
            .iter()
            .map(|(p, (name, e))| (name.clone(), p.1, e.clone()))
            .collect()
    }

    fn parse_manifest_key<'k>(&self, key: &'k Key) -> Option<(&'k str, u64)> {
        let rest = key.as_str().strip_prefix("snapshots/")?;
        let (dir, file) = rest.split_once('/')?;
        if self.crypt.is_some() {
            PackId::from_hex(dir)?;
        } else {
            validate_name(dir).ok()?;
        }
        let n = file.strip_suffix(".snap")?.parse::<u64>().ok()?;
        Some((dir, n))
    }

    /// Snapshot numbers of one image, ascending (empty if none).
    pub fn snapshots(&self, name: &str) -> Result<Vec<u64>> {
        let dir = self.image_dir(name);
        let mut v: Vec<u64> = self
            .root
            .list(&format!("snapshots/{dir}/"))?
            .iter()
            .filter_map(|l| self.parse_manifest_key(&l.key))
            .filter(|(d, _)| *d == dir)
            .map(|(_, s)| s)
            .collect();
        v.sort_unstable();
        let present = BTreeMap::from([(dir.clone(), v)]);
        self.note_listing(Some(&dir), &present, |_| name.to_string());
        Ok(present.into_values().next().unwrap_or_default())
    }

    /// `NAME` (latest snapshot) or `NAME@N` or `NAME@latest`.
    pub fn resolve(&self, spec: &str) -> Result<(String, u64)> {
        let (name, snap) = match spec.rsplit_once('@') {
            Some((n, s)) => (n, Some(s)),
            None => (spec, None),
        };
        if self.crypt.is_none() || unnamed_dir(name).is_none() {
            validate_name(name)?;
        }
        let snaps = self.snapshots(name)?;
        let Some(&latest) = snaps.last() else {
            return Err(StoreError::NotFound(format!(
                "no image named {name:?} in {}",
                self.location
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
        self.read_manifest_if_present(name, snapshot)?
            .ok_or_else(|| StoreError::Io {
                path: self.manifest_path(name, snapshot),
                what: "read",
                source: std::io::ErrorKind::NotFound.into(),
            })
    }

    /// Read one manifest, or `None` if it was removed since the listing
    /// (an `rm` running beside a reader).
    pub fn read_manifest_if_present(&self, name: &str, snapshot: u64) -> Result<Option<Manifest>> {
        let key = self.manifest_key(name, snapshot);
        let Some(data) = self.root.get(&key)? else {
            return Ok(None);
        };
        let path = self.root.locate(&key);
        let m = Manifest::decode_with(&path, &data, self.crypt.as_deref())?;
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
        Ok(Some(m))
    }

    /// Commit a manifest (the commit point of a backup) under the number
    /// it names; `false` (nothing written) if another writer has taken
    /// that number meanwhile.
    pub fn write_manifest(&self, session: &Session, m: &Manifest) -> Result<bool> {
        session.check()?;
        self.root.put_new(
            &self.manifest_key(&m.name, m.snapshot),
            &m.encode_with(self.crypt.as_deref())?,
        )
    }

    /// Commit `m` as the image's next snapshot: numbered after the latest
    /// one, again after it if a concurrent writer of the same image took
    /// that number first. Returns the number.
    pub fn commit_manifest(&self, session: &Session, m: &mut Manifest) -> Result<u64> {
        // Never a number a removed snapshot had (a removal record names
        // one snapshot), nor one this machine saw and lost (given again,
        // it would hide the loss): `seen.rs`. The snapshots are listed
        // before the removal records, so an `rm` running beside (its
        // record written before its manifest is deleted) shows in one.
        let dir = self.image_dir(&m.name);
        loop {
            let last = self.snapshots(&m.name)?.last().copied().unwrap_or(0);
            let removed = self.removed_numbers(&m.name)?.last().copied().unwrap_or(0);
            let seen = self
                .seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .highest(&dir)
                .unwrap_or(0);
            m.snapshot = last.max(removed).max(seen) + 1;
            if self.write_manifest(session, m)? {
                self.seen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .add((dir, m.snapshot), m.name.clone());
                return Ok(m.snapshot);
            }
        }
    }

    /// Change the tags of snapshot `name@snapshot` with `change`, and
    /// write its manifest again, whole, in place of the old one (one
    /// `put`: a reader sees the old tags or the new ones, never a torn
    /// file). Returns the tags before and after; nothing is written when
    /// they are the same. Tag changes hold `locks/tags`, one at a time,
    /// so two at once both take (the last one written won, and a tag
    /// meant to keep a snapshot from `forget` was lost: found by a
    /// black-box test). A snapshot removed between the read and the
    /// write (its removal record is written before its manifest is
    /// deleted) is removed again and the change fails: the write had
    /// brought it back.
    pub fn retag(
        &self,
        session: &Session,
        name: &str,
        snapshot: u64,
        change: impl FnOnce(&mut Vec<String>),
    ) -> Result<(Vec<String>, Vec<String>)> {
        session.check()?;
        let _held = self.hold_waiting("tags", "cairn tag")?;
        let mut m = self.read_manifest(name, snapshot)?;
        let before = m.tags.clone();
        change(&mut m.tags);
        for t in &m.tags {
            crate::manifest::validate_tag(t)?;
        }
        if m.tags != before {
            let key = self.manifest_key(name, snapshot);
            self.root
                .put(&key, &m.encode_with(self.crypt.as_deref())?)?;
            if self.removed_numbers(name)?.contains(&snapshot) {
                self.root.delete(std::slice::from_ref(&key))?;
                return Err(StoreError::NotFound(format!(
                    "{name}@{snapshot} was removed while its tags were changed"
                )));
            }
        }
        Ok((before, m.tags))
    }

    /// Remove a snapshot (its chunks stay until `gc`).
    pub fn remove_snapshot(&self, session: &Session, name: &str, snapshot: u64) -> Result<()> {
        self.remove_snapshot_freeing(session, name, snapshot)
            .map(|_| ())
    }

    /// [`Repository::remove_snapshot`], on a full disk releasing the
    /// reserve for the removal record; returns the bytes released (0
    /// almost always). With no room even then, the snapshot is removed
    /// without a record (said: a machine that listed it will report it
    /// vanished), as removing frees space and must not need it.
    pub fn remove_snapshot_freeing(
        &self,
        _session: &Session,
        name: &str,
        snapshot: u64,
    ) -> Result<u64> {
        let key = self.manifest_key(name, snapshot);
        let Some(data) = self.root.get(&key)? else {
            return Err(StoreError::Io {
                path: self.root.locate(&key),
                what: "remove",
                source: std::io::ErrorKind::NotFound.into(),
            });
        };
        // The removal record first (`seen.rs`): a crash between the two
        // leaves the snapshot, recorded as removed, which the next rm
        // removes. A damaged manifest is recorded by its place alone.
        let m = Manifest::decode_with(&self.root.locate(&key), &data, self.crypt.as_deref()).ok();
        let record = Removal {
            name: name.to_string(),
            snapshot,
            created: m.as_ref().map_or(0, |m| m.created),
            size: m.as_ref().map_or(0, |m| m.size),
            removed: now_secs(),
        };
        let dir = self.image_dir(name);
        let record_key = Self::removal_key(&dir, snapshot);
        let record = record.encode(self.crypt.as_deref())?;
        let mut released = 0;
        let mut written = self.root.put(&record_key, &record);
        if matches!(&written, Err(e) if e.is_no_space()) {
            released = self.release_reserve().unwrap_or(0);
            if released > 0 {
                written = self.root.put(&record_key, &record);
            }
        }
        match written {
            Ok(()) => {}
            Err(e) if e.is_no_space() => {
                tracing::warn!(
                    "{name}@{snapshot}: no room for its removal record ({e}): removed without \
                     one, so a machine that listed it will report it vanished (`cairn verify \
                     --accept-vanished` there)"
                );
                self.seen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .forget(&(dir.clone(), snapshot));
            }
            Err(e) => return Err(e),
        }
        self.root.delete(&[key])?;
        // A local image's directory goes with its last snapshot (removing
        // a directory that still holds one fails). Not by listing it: a
        // listing also takes the removal into the record of snapshots
        // seen, a rewrite and fsync per snapshot a forget removes; the
        // next listing takes them all at once.
        if let Some(home) = &self.home {
            let _ = fs::remove_dir(home.join("snapshots").join(&dir));
        }
        Ok(released)
    }

    // ---- index ----

    /// Every index file's key.
    pub fn index_files(&self) -> Result<Vec<Key>> {
        let mut v: Vec<Key> = self
            .root
            .list("index/")?
            .into_iter()
            .map(|l| l.key)
            .filter(|k| Self::index_file_name(k).is_some())
            .collect();
        v.sort();
        Ok(v)
    }

    /// `<hex>.idx` of an index file's key.
    fn index_file_name(key: &Key) -> Option<&str> {
        let name = key.as_str().strip_prefix("index/")?;
        name.strip_suffix(".idx")
            .and_then(PackId::from_hex)
            .map(|_| name)
    }

    /// Where an index file is.
    pub fn locate(&self, key: &Key) -> PathBuf {
        self.root.locate(key)
    }

    /// Read one index file (`None` if removed since the listing).
    pub(crate) fn read_index_file(&self, key: &Key) -> Result<Option<IndexFile>> {
        match self.root.get(key)? {
            Some(data) => {
                IndexFile::decode_with(&self.root.locate(key), &data, self.crypt.as_deref())
                    .map(Some)
            }
            None => Ok(None),
        }
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
        for key in self.index_files()? {
            if Self::index_file_name(&key)
                .is_some_and(|n| garbage.index_files.iter().any(|s| n == s.as_str()))
            {
                continue;
            }
            let data = match self.root.get(&key) {
                Ok(Some(d)) => d,
                // Removed by a gc since the listing; its replacement was
                // committed before, and every session that listed the old
                // one has ended.
                Ok(None) => continue,
                Err(e) => {
                    out.unread.push(e);
                    continue;
                }
            };
            if self.crypt.is_none() && meta::is_sealed(&self.root.locate(&key), &data, Kind::Index)
            {
                // Not damage: the config, which is not sealed, may have
                // been rewritten to say "not encrypted" (and the key files
                // removed); a writer would set the index aside and go on
                // in the clear.
                return Err(StoreError::corrupt(
                    self.root.locate(&key),
                    8,
                    "index file is encrypted, but the config says the repository is not: \
                     the config may have been replaced; refusing to read or write it in the clear",
                ));
            }
            match IndexFile::decode_with(&self.root.locate(&key), &data, self.crypt.as_deref()) {
                Ok(f) => {
                    out.index.add_file(&f)?;
                    out.files.push(key);
                }
                Err(e) => {
                    out.damaged_keys.push(key);
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

    /// Length of each pack `index` names, by pack number (0 when it is
    /// missing).
    pub fn pack_sizes(&self, index: &ChunkIndex) -> Result<Vec<u64>> {
        let stored: std::collections::HashMap<PackId, u64> = self
            .pack_files()?
            .into_iter()
            .map(|p| (p.id, p.len))
            .collect();
        Ok(index
            .packs()
            .iter()
            .map(|p| stored.get(&p.id).copied().unwrap_or(0))
            .collect())
    }

    /// Write index files for `file` (split so no file is too big to load
    /// cheaply); returns their keys.
    pub fn write_index(&self, _session: &Session, file: &IndexFile) -> Result<Vec<Key>> {
        let mut keys = Vec::new();
        if file.entries.is_empty() && file.packs.is_empty() {
            return Ok(keys);
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
            let key = Key::new(format!("index/{}.idx", PackId::random()));
            self.root
                .put(&key, &f.encode_with(self.crypt.as_deref())?)?;
            keys.push(key);
        }
        Ok(keys)
    }

    /// Where a pack named by the index is (a path or a URL).
    pub fn pack_path(&self, p: &PackInfo) -> Result<PathBuf> {
        Ok(self.target(p.target)?.locate(&Key::pack(p.id)))
    }

    /// Every pack on every target.
    pub fn pack_files(&self) -> Result<Vec<PackFile>> {
        let mut v = Vec::new();
        for (t, target) in self.targets.iter().enumerate() {
            for l in target.backend.list("packs/")? {
                let Some(id) = l
                    .key
                    .as_str()
                    .rsplit('/')
                    .next()
                    .and_then(|n| n.strip_suffix(".pack"))
                    .and_then(PackId::from_hex)
                else {
                    continue;
                };
                if l.key != Key::pack(id) {
                    continue;
                }
                v.push(PackFile {
                    target: t as u16,
                    id,
                    path: target.backend.locate(&l.key),
                    len: l.len,
                });
            }
        }
        Ok(v)
    }

    // ---- gc's trash ----

    /// Every trash list, checked: a list of objects to delete, so a name
    /// that is not an index file or a pack of a target is refused rather
    /// than acted on.
    pub(crate) fn trash_lists(&self) -> Result<Vec<TrashList>> {
        let mut out = Vec::new();
        for (key, _, checked) in self.read_trash_lists()? {
            let garbage = checked.map_err(|e| match e {
                // Not damage: written by a newer cairn, which it needs.
                e @ StoreError::NewerVersion { .. } => e,
                e => StoreError::Invalid(format!(
                    "{e} (backup and gc refuse to run while it is there; it only names \
                     objects to delete, so `cairn repair` removes it: nothing stored is lost, \
                     and the damaged records a repair's list kept out of the index are \
                     dropped again by that repair)"
                )),
            })?;
            out.push(TrashList { key, garbage });
        }
        Ok(out)
    }

    /// Remove every trash list that fails its checks (`repair`): such a
    /// list names only objects to delete, so without it they stay (packs
    /// no index names are taken in again by the next writer, old index
    /// files are read beside the new): nothing is lost, space is kept
    /// until the next gc. Returns the removed lists' paths.
    pub(crate) fn remove_damaged_trash_lists(&self) -> Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        for (key, path, checked) in self.read_trash_lists()? {
            // A list of a newer version is not damaged: it stays (this
            // build refuses to write beside it).
            if checked
                .as_ref()
                .is_err_and(|e| !matches!(e, StoreError::NewerVersion { .. }))
            {
                self.root.delete(&[key])?;
                removed.push(path);
            }
        }
        Ok(removed)
    }

    /// Every trash list there is, with its path and what its checks say.
    #[allow(clippy::type_complexity)]
    fn read_trash_lists(&self) -> Result<Vec<(Key, PathBuf, Result<Garbage>)>> {
        let mut out = Vec::new();
        for key in self.trash_keys()? {
            let Some(data) = self.root.get(&key)? else {
                continue;
            };
            let path = self.root.locate(&key);
            let checked =
                check_trash_list_with(&path, &data, self.targets.len(), self.crypt.as_deref());
            out.push((key, path, checked));
        }
        Ok(out)
    }

    /// The keys of the trash lists there may be: the old single list
    /// first, then gc's lists in name order.
    fn trash_keys(&self) -> Result<Vec<Key>> {
        let mut keys: Vec<Key> = self
            .root
            .list("trash/")?
            .into_iter()
            .map(|l| l.key)
            .filter(|k| {
                k.as_str()
                    .strip_prefix("trash/")
                    .and_then(PackId::from_hex)
                    .is_some()
            })
            .collect();
        keys.sort();
        keys.insert(0, Key::new("garbage"));
        Ok(keys)
    }

    /// Everything on every trash list, as one list.
    pub(crate) fn all_trash(&self) -> Result<Garbage> {
        let mut all = Garbage::default();
        for t in self.trash_lists()? {
            all.merge(&t.garbage);
        }
        Ok(all)
    }

    /// Write a new trash list; it records the sessions running once it is
    /// in place (listed after, so none is missed).
    pub(crate) fn write_trash(&self, session: &Session, mut g: Garbage) -> Result<TrashList> {
        let key = Key::new(format!("trash/{}", PackId::random()));
        g.created = now_secs();
        let seal = |g: &Garbage| -> Result<Vec<u8>> {
            let body = serde_json::to_vec(g).map_err(|e| StoreError::Invalid(e.to_string()))?;
            self.seal_meta(Kind::Garbage, trash_version(g), &body)
        };
        g.recording = Some(session.id().to_string());
        self.root.put(&key, &seal(&g)?)?;
        g.recording = None;
        g.sessions = self
            .sessions()?
            .into_iter()
            .filter(|(id, l)| *l == Liveness::Live && id != session.id())
            .map(|(id, _)| id)
            .collect();
        self.root.put(&key, &seal(&g)?)?;
        Ok(TrashList { key, garbage: g })
    }

    /// Replace a trash list's contents (fewer entries, as it is worked
    /// off), or remove it once empty.
    pub(crate) fn rewrite_trash(&self, t: &TrashList) -> Result<()> {
        if t.garbage.is_empty() {
            return self.root.delete(std::slice::from_ref(&t.key));
        }
        let body =
            serde_json::to_vec(&t.garbage).map_err(|e| StoreError::Invalid(e.to_string()))?;
        self.root.put(
            &t.key,
            &self.seal_meta(Kind::Garbage, trash_version(&t.garbage), &body)?,
        )
    }

    /// Delete index files (by `<hex>.idx` name) and packs.
    pub(crate) fn delete_objects(
        &self,
        index_files: &[String],
        packs: &[(u16, PackId)],
    ) -> Result<()> {
        let keys: Vec<Key> = index_files
            .iter()
            .map(|n| Key::new(format!("index/{n}")))
            .collect();
        self.root.delete(&keys)?;
        for (t, target) in self.targets.iter().enumerate() {
            let keys: Vec<Key> = packs
                .iter()
                .filter(|(pt, _)| usize::from(*pt) == t)
                .map(|(_, id)| Key::pack(*id))
                .collect();
            if !keys.is_empty() {
                target.backend.delete(&keys)?;
            }
        }
        Ok(())
    }

    // ---- interrupted writers ----

    /// The index for a writer (backup, gc): finish the trash that nothing
    /// can need any more, load the index, salvage unindexed packs, set
    /// aside damaged index files (salvage has re-indexed every pack they
    /// could name), and drop the entries of packs that are gone or cut
    /// short, so that nothing new is deduplicated against chunks that
    /// cannot be read.
    pub fn writer_index(&self, session: &Session) -> Result<WriterIndex> {
        self.writer_index_with(session, false)
    }

    /// [`Repository::writer_index`]; `reread`: salvage also reads again
    /// every pack the index knows, for chunks no entry names, as after a
    /// damaged index file (`repair`: an index file moved aside by hand is
    /// no damaged file any more, but its entries are gone).
    pub(crate) fn writer_index_with(&self, session: &Session, reread: bool) -> Result<WriterIndex> {
        let collected = crate::gc::collect_trash(self, session, &HashSet::new())?;
        // What a gc put on a trash list is invisible to writers: nothing
        // new may come to depend on a doomed pack. The live chunks of
        // those index files are in the files gc wrote.
        let trash = self.all_trash()?;
        let mut loaded = self.load_index_without(&trash)?;
        // A file that could not be read is no damage: stop, and change
        // nothing (salvage would not index its packs again: they are in
        // the pack table of the other parts of a file written in parts).
        loaded.check_read()?;
        // A file of a newer format is no damage: refuse to write over it.
        if let Some(pos) = loaded
            .damaged
            .iter()
            .position(|e| matches!(e, StoreError::NewerVersion { .. }))
        {
            return Err(loaded.damaged.swap_remove(pos));
        }
        // With an index file damaged, packs the index knows may hold
        // chunks it no longer names (a file written in parts gives every
        // part the whole pack table, and a record's entries may be split
        // between two parts): salvage reads every pack again.
        let suspect = reread || !loaded.damaged_keys.is_empty();
        let salvaged = self.salvage(session, &mut loaded.index, &mut loaded.files, suspect)?;
        let mut quarantined = Vec::new();
        let mut damaged_left = Vec::new();
        // Set aside only when salvage ran (no other writer): then every
        // pack a damaged file could name has been indexed again.
        for key in loaded.damaged_keys {
            if !salvaged.ran {
                damaged_left.push(self.root.locate(&key));
                continue;
            }
            let aside = Key::new(format!("{}.damaged", key.as_str()));
            if let Some(data) = self.root.get(&key)? {
                // Read whole this time (a read cut short looks damaged):
                // it stays.
                if IndexFile::decode_with(&self.root.locate(&key), &data, self.crypt.as_deref())
                    .is_ok()
                {
                    continue;
                }
                self.root.put(&aside, &data)?;
            }
            self.root.delete(std::slice::from_ref(&key))?;
            quarantined.push(self.root.locate(&aside));
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
            // Only the entries of those packs past their end: an entry of
            // a whole pack that runs past it has a wrong length (repair
            // corrects it from the record's own).
            let cut: Vec<bool> = (loaded.index.packs().iter().zip(&sizes))
                .map(|(p, &size)| size < p.len)
                .collect();
            loaded.index.retain(|loc| {
                let at = loc.pack as usize;
                !cut[at] || u64::from(loc.offset) + u64::from(loc.len) <= sizes[at]
            });
        }
        Ok(WriterIndex {
            index: loaded.index,
            salvaged,
            quarantined,
            damaged_left,
            files: loaded.files,
            lost_packs,
            collected,
        })
    }

    /// Index entries for every sound record of pack `pf` (its header must
    /// be this repository's); `None` when it is not a pack of ours.
    pub(crate) fn index_pack(
        &self,
        pf: &PackFile,
        report: &mut Salvaged,
    ) -> Result<Option<IndexedPack>> {
        self.index_pack_but(pf, None, report)
    }

    /// [`Repository::index_pack`]; with `named` (a pack the index knows),
    /// only the records at other offsets, and of those only the chunks
    /// that decode and hash to their ids: a record a repair dropped
    /// because its chunk does not (its CRC holds) stays out.
    fn index_pack_but(
        &self,
        pf: &PackFile,
        named: Option<(&HashSet<u32>, &ChunkIndex)>,
        report: &mut Salvaged,
    ) -> Result<Option<IndexedPack>> {
        let Some(data) = crate::reader::read_unindexed(&**self.target(pf.target)?, pf.id)? else {
            return Ok(None);
        };
        if data.len() < PACK_HEADER_LEN {
            // Created, then killed before its header was written.
            report.skipped_bytes += data.len() as u64;
            self.target(pf.target)?.delete(&[Key::pack(pf.id)])?;
            return Ok(None);
        }
        if pack::check_pack_header(&pf.path, &data, self.id, self.sealed()).ok() != Some(pf.id) {
            report.skipped_bytes += data.len() as u64;
            return Ok(None);
        }
        let mut entries = Vec::new();
        let mut covered = 0u64;
        let mut decoder = pack::RecordDecoder::new(self.crypt.clone());
        let mut group = Vec::new();
        pack::scan_records(&data, self.crypt.as_deref(), |off, len, r| {
            covered += len as u64;
            let mut sound: Option<Vec<bool>> = None;
            if let Some((named, index)) = named {
                // A record the index names may still hold chunks no entry
                // names (its entries split between two index files, one
                // lost): only those are taken.
                let at_named = named.contains(&(off as u32));
                let wanted: Vec<bool> = r
                    .chunks()
                    .map(|(id, _, _)| !at_named || !index.contains(&id))
                    .collect();
                if !wanted.contains(&true) {
                    return Ok(());
                }
                let rec = &data[off as usize..off as usize + len];
                let decoded = decoder.decode(&pf.path, off, rec, &mut group).is_ok();
                sound = Some(
                    r.chunks()
                        .zip(wanted)
                        .map(|((id, slice, n), wanted)| {
                            wanted
                                && decoded
                                && group.get(slice as usize..(slice + n) as usize).is_some_and(
                                    |b| decoder.check_chunk(&pf.path, off, &id, b).is_ok(),
                                )
                        })
                        .collect(),
                );
            }
            for (i, (id, slice, _)) in r.chunks().enumerate() {
                if sound.as_ref().is_some_and(|s| !s[i]) {
                    continue;
                }
                entries.push((
                    id,
                    Location {
                        pack: 0,
                        offset: off as u32,
                        len: len as u32,
                        slice,
                    },
                ));
            }
            Ok(())
        })?;
        report.skipped_bytes += data.len() as u64 - PACK_HEADER_LEN as u64 - covered;
        Ok(Some((
            PackInfo {
                id: pf.id,
                target: pf.target,
                len: data.len() as u64,
            },
            entries,
        )))
    }

    /// Take into the index the packs that an interrupted backup or gc
    /// wrote but did not index, so that the next backup reuses them
    /// instead of storing them again. Every sound record is taken, also
    /// past a damaged one. Packs are never cut or removed here (a pack
    /// whose index file is damaged looks the same as an interrupted one),
    /// except a file too short to hold even a pack header. Packs on a
    /// trash list, and packs whose header is not this repository's, are
    /// left alone (verify lists them as unindexed).
    ///
    /// Runs only while no other session is running: another writer's
    /// packs are unindexed until it commits. The packs are listed before
    /// the sessions are, so a pack listed was begun by a session that was
    /// registered by then, and has ended if none is running.
    /// The index files it writes are added to `files`.
    pub(crate) fn salvage(
        &self,
        session: &Session,
        index: &mut ChunkIndex,
        files: &mut Vec<Key>,
        suspect: bool,
    ) -> Result<Salvaged> {
        let mut report = Salvaged::default();
        let doomed = self.all_trash()?.pack_set();
        let packs = self.pack_files()?;
        if self.others_running(session)? {
            return Ok(report);
        }
        report.ran = true;
        let named = suspect.then(|| named_records(index));
        let no_offsets = HashSet::new();
        let mut found = IndexFile::default();
        for pf in packs {
            let number = index.pack_number(&pf.id);
            if (number.is_some() && named.is_none()) || doomed.contains(&(pf.target, pf.id)) {
                continue;
            }
            let known = number.is_some();
            let but = match (&named, number) {
                (Some(named), Some(n)) => {
                    report.reread += 1;
                    Some((named.get(&n).unwrap_or(&no_offsets), &*index))
                }
                _ => None,
            };
            let Some((info, entries)) = self.index_pack_but(&pf, but, &mut report)? else {
                continue;
            };
            if entries.is_empty() {
                // (A known pack is not empty: its records are named.)
                if !known {
                    report.empty.push((pf.target, pf.id));
                }
                continue;
            }
            let pack_no = found.packs.len() as u32;
            report.packs += 1;
            report.chunks += entries.len() as u64;
            found.packs.push(info);
            found.entries.extend(entries.into_iter().map(|(id, loc)| {
                (
                    id,
                    Location {
                        pack: pack_no,
                        ..loc
                    },
                )
            }));
        }
        if report.packs > 0 {
            files.extend(self.write_index(session, &found)?);
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
            // Private (0700), as restic makes a repository.
            use std::os::unix::fs::DirBuilderExt;
            match fs::DirBuilder::new().mode(0o700).create(&d) {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

    use super::*;

    /// A snapshot this machine saw, gone, whose removal record cannot be
    /// read (a network error): said, and gc frees nothing until the record
    /// is read (it was only logged at debug level, and gc went on: had the
    /// snapshot been lost, its chunks would have been freed).
    #[test]
    fn gc_waits_for_a_removal_record_it_cannot_read() {
        let mut r = crate::faults::FaultyRepo::new();
        let state = tempfile::tempdir().unwrap();
        r.repo.seen = Arc::new(std::sync::Mutex::new(Seen::at(
            Some(state.path().to_path_buf()),
            "seen-test".into(),
        )));
        r.backup("b");
        assert_eq!(r.repo.images().unwrap().len(), 2);
        // Removed by another cairn, with its record.
        let other = Repository::open(&r.dir.path().join("repo")).unwrap();
        let session = other.session("rm").unwrap();
        other.remove_snapshot(&session, "b", 1).unwrap();
        drop(session);
        let record = r
            .repo
            .root
            .locate(&Repository::removal_key(&r.repo.image_dir("b"), 1));
        assert!(record.exists(), "{}", record.display());
        r.faults.fail(&record);
        let session = r.repo.session("gc").unwrap();
        let gc = || crate::gc::gc(&r.repo, &session, &crate::gc::GcOptions::default());
        for _ in 0..2 {
            // Still unreadable the second time: still refused.
            let e = gc().unwrap_err().to_string();
            assert!(e.contains("b@1") && e.contains("cannot be read"), "{e}");
        }
        assert!(r.repo.vanished().is_empty());
        let v = crate::verify::verify(&r.repo, &crate::verify::VerifyOptions::default()).unwrap();
        let kinds: Vec<&str> = v.problems.iter().map(|p| p.kind).collect();
        assert_eq!(kinds, vec!["unreadable-removal-record"], "{:?}", v.problems);
        // Read at last: removed, and gc goes on.
        r.faults.clear();
        gc().unwrap();
        assert!(r.repo.vanished().is_empty());
        assert!(r.repo.unreadable_removals().is_empty());
    }

    /// `kill(pid, 0)` tells a process that exists, this one's or
    /// another user's (the check behind a pid `/proc` hides), from none,
    /// and never takes 0 or a pid `kill` would read as a group for one.
    #[test]
    fn a_pid_exists_while_its_process_runs() {
        assert!(pid_exists(std::process::id()));
        assert!(pid_exists(1));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!pid_exists(pid));
        for never in [0, u32::MAX, 1 << 31, i32::MAX as u32] {
            assert!(!pid_exists(never), "{never}");
        }
    }

    /// A session of a process of this machine is ended once the process
    /// is gone, not while it runs; one of another host, boot or pid
    /// namespace, or of an older version (no mark), is never taken for
    /// ended here; a pid used again by a later process is not the holder.
    #[test]
    fn a_session_is_ended_here_only_when_its_process_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let info = SessionInfo {
            what: "test".into(),
            pid: child.id(),
            host: hostname(),
            started: now_secs(),
            process: ProcessMark::of(child.id()),
            nonce: String::new(),
        };
        assert!(info.process.is_some(), "no mark read from /proc");
        assert!(!info.ended_here(), "a running process taken for ended");
        let me = serde_json::from_slice::<SessionInfo>(&SessionInfo::now("me").unwrap()).unwrap();
        assert!(!me.ended_here());
        let again =
            serde_json::from_slice::<SessionInfo>(&SessionInfo::now("me").unwrap()).unwrap();
        assert_eq!(me.nonce.len(), 32);
        assert_ne!(
            me.nonce, again.nonce,
            "two holds of one process wrote one body"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(info.ended_here(), "a killed process still counted");
        // Not decidable here: kept for the lease to decide.
        let elsewhere = SessionInfo {
            host: format!("{}-other", hostname()),
            ..info.clone()
        };
        assert!(!elsewhere.ended_here());
        let mark = info.process.clone().unwrap();
        for other in [
            ProcessMark {
                boot: "another boot".into(),
                ..mark.clone()
            },
            ProcessMark {
                pid_ns: mark.pid_ns + 1,
                ..mark.clone()
            },
        ] {
            let i = SessionInfo {
                process: Some(other),
                ..info.clone()
            };
            assert!(!i.ended_here());
        }
        let old = SessionInfo {
            process: None,
            ..info.clone()
        };
        assert!(!old.ended_here());
        // This very process, recorded with another start time: its pid
        // was used again.
        let reused = SessionInfo {
            pid: std::process::id(),
            process: Some(ProcessMark {
                start_ticks: me.process.unwrap().start_ticks + 1,
                ..mark
            }),
            ..info
        };
        assert!(reused.ended_here());
        // Bodies of older versions still read.
        let v1: SessionInfo =
            serde_json::from_str(r#"{"what":"w","pid":1,"host":"h","started":5}"#).unwrap();
        assert!(v1.process.is_none());
    }

    /// Every version of the trash list decodes: version 1 (`garbage`, no
    /// sessions), version 2 (`trash/<hex>`), version 3 (`recording`
    /// while its gc lists the sessions) and version 4 (`dropped`). `CAIRN_BLESS=1` writes them
    /// anew (only for a deliberate change, which must come with a new
    /// version).
    #[test]
    fn trash_list_fixtures_of_every_version_decode() {
        use crate::meta::seal;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/trash");
        let packs = vec![(0u16, "00112233445566778899aabbccddeeff".to_string())];
        let files = vec!["0123456789abcdef0123456789abcdef.idx".to_string()];
        if std::env::var("CAIRN_BLESS").as_deref() == Ok("1") {
            fs::create_dir_all(dir.join("repo/trash")).unwrap();
            let v1 = serde_json::json!({"index_files": files, "packs": packs});
            fs::write(
                dir.join("repo/garbage"),
                seal(Kind::Garbage, 1, v1.to_string().as_bytes()),
            )
            .unwrap();
            let v2 = Garbage {
                index_files: files.clone(),
                packs: packs.clone(),
                created: 1_795_600_000,
                sessions: vec!["fedcba9876543210fedcba9876543210".into()],
                recording: None,
                dropped: Vec::new(),
            };
            fs::write(
                dir.join("repo/trash/ffeeddccbbaa99887766554433221100"),
                seal(Kind::Garbage, 2, &serde_json::to_vec(&v2).unwrap()),
            )
            .unwrap();
            let v3 = Garbage {
                recording: Some("0123456789abcdef0123456789abcdef".into()),
                sessions: Vec::new(),
                ..v2
            };
            fs::write(
                dir.join("repo/trash/ffeeddccbbaa99887766554433221101"),
                seal(Kind::Garbage, 3, &serde_json::to_vec(&v3).unwrap()),
            )
            .unwrap();
            let v4 = Garbage {
                recording: None,
                sessions: Vec::new(),
                dropped: vec![("00112233445566778899aabbccddeeff".into(), 4096, 2)],
                ..v3
            };
            fs::write(
                dir.join("repo/trash/ffeeddccbbaa99887766554433221102"),
                seal(Kind::Garbage, 4, &serde_json::to_vec(&v4).unwrap()),
            )
            .unwrap();
        }
        let root = dir.join("repo");
        let repo = Repository {
            location: root.display().to_string(),
            root: Arc::new(LocalDir::new(&root)),
            home: None,
            id: RepoId::random(),
            targets: vec![Target {
                backend: Arc::new(LocalDir::new(&root.join("data"))),
                dir: None,
                absolute: false,
            }],
            pack_size: DEFAULT_PACK_SIZE,
            unclaimed: Vec::new(),
            encryption: None,
            crypt: None,
            key_id: None,
            seen: Default::default(),
        };
        let lists = repo.trash_lists().unwrap();
        assert_eq!(lists.len(), 4);
        assert_eq!(lists[0].key.as_str(), "garbage");
        assert_eq!(lists[0].garbage.sessions, Vec::<String>::new());
        assert_eq!(lists[0].garbage.created, 0);
        assert_eq!(lists[1].garbage.created, 1_795_600_000);
        assert_eq!(lists[1].garbage.sessions.len(), 1);
        assert_eq!(lists[1].garbage.recording, None);
        // Version 3, as first written: its writer still lists sessions.
        assert_eq!(lists[2].garbage.sessions.len(), 0);
        assert!(lists[2].garbage.recording.is_some());
        // Version 4: the records a repair dropped as damaged.
        assert_eq!(
            lists[3].garbage.dropped_set(),
            [(
                PackId::from_hex("00112233445566778899aabbccddeeff").unwrap(),
                4096,
                2
            )]
            .into_iter()
            .collect()
        );
        assert!(lists[..3].iter().all(|l| l.garbage.dropped.is_empty()));
        for l in &lists {
            assert_eq!(l.garbage.packs, packs);
            assert_eq!(l.garbage.index_files, files);
        }
    }

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
            .write(&LocalDir::new(&dir))
            .unwrap();
        }
        let v1 = Marker::read(&LocalDir::new(&fixtures.join("repository-v1/repo/data"))).unwrap();
        assert_eq!((v1.target, v1.home), (0, None));
        let v2 = Marker::read(&LocalDir::new(&fixtures.join("target-marker-v2"))).unwrap();
        assert_eq!(v2.target, 1);
        assert_eq!(v2.home, Some(PathBuf::from("/srv/cairn/repo")));
        assert_eq!(v2.repository, "0123456789abcdef0123456789abcdef");
    }

    /// A new plain repository holding `data` as image `img`, snapshot 1
    /// (zstd:1, 16 KiB chunks, groups of `group_size`).
    fn backed_up(data: &[u8], group_size: usize) -> (tempfile::TempDir, Repository) {
        let dir = tempfile::tempdir().unwrap();
        let r = Repository::init(&dir.path().join("r"), &[], None).unwrap();
        let s = r.session("backup").unwrap();
        let opts = crate::BackupOptions {
            name: "img".into(),
            codec: "zstd:1".parse().unwrap(),
            chunker: "fixed:16384".parse().unwrap(),
            threads: 1,
            group_size,
            source: "test".into(),
            progress: None,
            time: None,
            tags: Vec::new(),
        };
        crate::backup(&r, &s, &mut std::io::Cursor::new(data.to_vec()), &opts).unwrap();
        drop(s);
        (dir, r)
    }

    /// A repair's gc deferred by a command that started meanwhile: the
    /// trash list records the dropped records, and the ordinary writer
    /// that works it off later keeps them out of the index, where it
    /// indexed them again from their packs (their CRC holds; a record
    /// whose chunk does not hash to its id looks the same). The list is
    /// version 4 only then.
    #[test]
    fn records_a_repair_dropped_stay_out_when_its_list_is_collected_later() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (_dir, r) = backed_up(&data, 64 << 10);
        let loaded = r.load_index().unwrap();
        let (chunk, record) = {
            let index = &loaded.index;
            let (id, loc) = index.locations().next().unwrap();
            let pack = index.pack(loc.pack).unwrap().id;
            (id, (pack, loc.offset, loc.slice))
        };
        let indexed = |r: &Repository| {
            let l = r.load_index().unwrap();
            let index = &l.index;
            let found = index.locations().any(|(id, loc)| {
                id == chunk && (index.pack(loc.pack).unwrap().id, loc.offset, loc.slice) == record
            });
            found
        };
        assert!(indexed(&r));
        let me = r.session("repair").unwrap();
        let other = r.session("restore").unwrap();
        let g = crate::gc::gc(
            &r,
            &me,
            &crate::gc::GcOptions {
                repack_below: 0.0,
                drop_records: [record].into_iter().collect(),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(g.deferred);
        drop(me);
        let lists = r.trash_lists().unwrap();
        assert_eq!(lists.len(), 1);
        assert_eq!(
            lists[0].garbage.dropped_set(),
            [record].into_iter().collect()
        );
        let sealed = r.root.get(&lists[0].key).unwrap().unwrap();
        let (version, _) =
            meta::open_with(Path::new("t"), &sealed, Kind::Garbage, TRASH_VERSION, None).unwrap();
        assert_eq!(version, 4);
        // A gc meanwhile names the snapshot as missing the chunk (the old
        // index files, still there on the list, do not count).
        {
            let g2 = r.session("gc").unwrap();
            let g = crate::gc::gc(&r, &g2, &crate::gc::GcOptions::default()).unwrap();
            assert_eq!(g.missing.len(), 1, "{:?}", g.missing);
            assert!(g.missing[0].starts_with("img@1 "), "{:?}", g.missing);
        }
        drop(other);
        // Worked off by an ordinary writer (no records of its own to drop).
        let writer = r.session("backup").unwrap();
        r.writer_index(&writer).unwrap();
        assert!(r.trash_lists().unwrap().is_empty());
        assert!(!indexed(&r), "a record the repair dropped is indexed again");
    }

    /// An index file written in parts (each with the whole pack table),
    /// one part damaged: the writer reads the packs again whose records
    /// the rest does not all name, so gc loses no chunk (it took the pack
    /// as known, kept half its entries, and repacked it without the
    /// rest); an index file that cannot be read stops writers and changes
    /// nothing; and one damaged while another command runs stops gc.
    #[test]
    fn a_damaged_part_of_an_index_file_loses_no_chunk_to_gc() {
        let data: Vec<u8> = (0..400_000u32)
            .map(|i| (i * 7 % 251) as u8 ^ (i >> 12) as u8)
            .collect();
        // Records of 4 chunks: one's entries end up in both parts.
        let (_dir, r) = backed_up(&data, 64 << 10);
        let restored = |r: &Repository| -> Result<Vec<u8>> {
            let loaded = r.load_index()?;
            loaded.check_read()?;
            let m = r.read_manifest("img", 1)?;
            let mut out = Vec::new();
            crate::restore::restore(
                r,
                &loaded.index,
                &m,
                crate::restore::Destination::Stream(&mut out),
                &crate::restore::RestoreOptions {
                    threads: 1,
                    zero_damaged: false,
                    progress: None,
                },
            )?;
            Ok(out)
        };
        // The one index file, written again as two parts.
        let keys = r.index_files().unwrap();
        assert_eq!(keys.len(), 1);
        let file = r.read_index_file(&keys[0]).unwrap().unwrap();
        assert!(file.entries.len() >= 20, "{}", file.entries.len());
        let half = file.entries.len() / 2 + 1;
        let mut parts = Vec::new();
        for entries in [&file.entries[..half], &file.entries[half..]] {
            let f = IndexFile {
                packs: file.packs.clone(),
                entries: entries.to_vec(),
            };
            let key = Key::new(format!("index/{}.idx", PackId::random()));
            r.root.put(&key, &f.encode_with(None).unwrap()).unwrap();
            parts.push(key);
        }
        r.root.delete(&keys).unwrap();
        assert!(restored(&r).unwrap() == data);
        let part = r.root.locate(&parts[1]);

        // Unreadable (a link to itself reads as an I/O error, ELOOP):
        // every writer stops, and nothing is set aside.
        let bytes = std::fs::read(&part).unwrap();
        std::fs::remove_file(&part).unwrap();
        std::os::unix::fs::symlink(&part, &part).unwrap();
        {
            let s = r.session("gc").unwrap();
            let e = crate::gc::gc(&r, &s, &crate::gc::GcOptions::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains("could not be read"), "{e}");
            let e = restored(&r).unwrap_err().to_string();
            assert!(e.contains("could not be read"), "{e}");
        }
        std::fs::remove_file(&part).unwrap();

        // Damaged, while another command runs: gc stops.
        let mut bad = bytes.clone();
        let at = bad.len() / 2;
        bad[at] ^= 0x40;
        std::fs::write(&part, &bad).unwrap();
        {
            let other = r.session("restore").unwrap();
            let s = r.session("gc").unwrap();
            let e = crate::gc::gc(&r, &s, &crate::gc::GcOptions::default())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("is damaged") && e.contains("deletes nothing"),
                "{e}"
            );
            drop(other);
        }
        assert!(part.exists());

        // Damaged, gc alone, repacking anything with a dead byte.
        let s = r.session("gc").unwrap();
        let g = crate::gc::gc(
            &r,
            &s,
            &crate::gc::GcOptions {
                repack_below: 1.0,
                ..Default::default()
            },
        )
        .unwrap();
        drop(s);
        assert_eq!(g.quarantined.len(), 1, "{g:?}");
        assert_eq!(g.salvaged.reread, 1, "{g:?}");
        assert!(g.missing.is_empty(), "{:?}", g.missing);
        assert!(
            restored(&r).unwrap() == data,
            "a chunk of the damaged part was lost"
        );
    }

    /// A trash list of a newer version is not damage: writers refuse to
    /// run beside it (saying it is newer), and repair leaves it; a damaged
    /// one is removed.
    #[test]
    fn a_newer_trash_list_is_kept_and_a_damaged_one_removed() {
        let dir = tempfile::tempdir().unwrap();
        let r = Repository::init(&dir.path().join("r"), &[], None).unwrap();
        let body = serde_json::to_vec(&Garbage::default()).unwrap();
        let newer = Key::new(format!("trash/{}", PackId::random()));
        r.root
            .put(
                &newer,
                &r.seal_meta(Kind::Garbage, TRASH_VERSION + 1, &body)
                    .unwrap(),
            )
            .unwrap();
        assert!(matches!(
            r.trash_lists(),
            Err(StoreError::NewerVersion { .. })
        ));
        assert!(r.remove_damaged_trash_lists().unwrap().is_empty());
        let damaged = Key::new(format!("trash/{}", PackId::random()));
        r.root.put(&damaged, b"not a trash list").unwrap();
        let removed = r.remove_damaged_trash_lists().unwrap();
        assert_eq!(removed, vec![r.root.locate(&damaged)]);
        assert!(r.root.get(&newer).unwrap().is_some());
    }

    /// Regression (outside QA: two gcs and a backup lost a snapshot's
    /// chunks): a trash list read between its first write and the one
    /// that records the sessions to wait for was taken for a list that
    /// waits for none, and worked off under a running backup. Such a list
    /// waits for its gc; if that gc died, for every other session.
    #[test]
    fn a_trash_list_still_recording_its_sessions_waits() {
        let dir = tempfile::tempdir().unwrap();
        let r = Repository::init(&dir.path().join("r"), &[], None).unwrap();
        let me = r.session("collector").unwrap();
        let gc = r.session("gc").unwrap();
        let backup = r.session("backup").unwrap();
        let g = Garbage {
            packs: vec![(0, PackId::random().to_string())],
            recording: Some(gc.id().to_string()),
            ..Garbage::default()
        };
        let key = Key::new(format!("trash/{}", PackId::random()));
        let body = serde_json::to_vec(&g).unwrap();
        r.root
            .put(
                &key,
                &r.seal_meta(Kind::Garbage, TRASH_VERSION, &body).unwrap(),
            )
            .unwrap();
        let waiting = || {
            let c = crate::gc::collect_trash(&r, &me, &HashSet::new()).unwrap();
            (c.lists_waiting, c.lists_done)
        };
        // Its gc is listing the sessions: it waits.
        assert_eq!(waiting(), (1, 0));
        // Its gc died before recording them: it waits for the backup too.
        drop(gc);
        assert_eq!(waiting(), (1, 0));
        drop(backup);
        assert_eq!(waiting(), (0, 1));
    }
}
