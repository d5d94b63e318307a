//! Where a repository's objects live, as capabilities in rustic_core's
//! manner: [`ReadBackend`] (list, get, ranged get) and, later, a write
//! side (put that never overwrites a finished object, delete). Objects
//! are named by [`Key`]s such as `packs/ab/ab12…cd.pack`; a backend maps
//! them to its own storage (files under a directory here; objects under
//! a prefix in a bucket next).
//!
//! Packs are written through [`WriteBackend::create`] and read through
//! [`crate::PackReader`]; the rest of the repository's objects are moving
//! onto the seam (see the issue tracker's store-core work).

use crate::error::{IoContext, Result, StoreError};
use crate::id::PackId;
use crate::meta;
use cairn_blockdev::flock;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// An object's name within a backend: `/`-separated, relative.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// The key of pack `id`: `packs/<first two hex digits>/<hex>.pack`.
    pub fn pack(id: PackId) -> Key {
        let hex = id.to_string();
        Key(format!("packs/{}/{hex}.pack", &hex[..2]))
    }

    /// A key from its text (`/`-separated, relative, no `.` or `..`
    /// parts).
    pub fn new(text: impl Into<String>) -> Key {
        Key(text.into())
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// An object found by [`ReadBackend::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its key.
    pub key: Key,
    /// Its length in bytes.
    pub len: u64,
}

/// Whether the holder of a [`Held`] object is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Held by a running process (a local lock is taken, or a remote
    /// object was refreshed within its lease).
    Live,
    /// Still there, but its holder died (the lock is free, or the lease
    /// ran out).
    Dead,
    /// No such object: its holder ended and removed it.
    Gone,
}

/// Reading objects. Every error names the object (for a directory, its
/// path; for a bucket, its URL) and, for damage, the offset.
pub trait ReadBackend: Send + Sync + std::fmt::Debug {
    /// Where `key` is, for messages (a path, or a URL).
    fn locate(&self, key: &Key) -> PathBuf;

    /// Fill `buf` with the object's bytes from `offset`. An object shorter
    /// than that is damage ([`StoreError::Corrupt`]), not an I/O error.
    fn read_at(&self, key: &Key, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// The first `len` bytes of the object, read once (not cached).
    fn read_prefix(&self, key: &Key, len: u64) -> Result<Vec<u8>>;

    /// The whole object, or `None` when there is no such object.
    fn get(&self, key: &Key) -> Result<Option<Vec<u8>>>;

    /// Every finished object whose key starts with `prefix` (a folder such
    /// as `index/`), in no particular order. Objects being written (a
    /// directory's temporary files) are not listed.
    fn list(&self, prefix: &str) -> Result<Vec<Listed>>;

    /// How many reads to keep in flight per core: a local disk is kept
    /// busy by one reader a core; a remote store, whose every read waits
    /// a round trip, by several.
    fn reads_per_core(&self) -> usize {
        1
    }
}

/// Writing objects. Finished objects are immutable except through
/// [`WriteBackend::put`] (metadata replaced whole, atomically); every
/// call returns once what it did is durable.
pub trait WriteBackend: ReadBackend {
    /// The backend of the objects under `folder` (a target inside the
    /// repository, such as `data`).
    fn child(&self, folder: &str) -> Arc<dyn WriteBackend>;

    /// Store `data` as `key`, replacing any object there at once: a reader
    /// sees the old object or the new one, never a mix.
    fn put(&self, key: &Key, data: &[u8]) -> Result<()>;

    /// Store `data` as `key` only if there is no such object; `false` (and
    /// nothing written) if there is. Two racing callers: one wins. An
    /// object store also takes an object holding exactly `data` as this
    /// call's (its retried request refused by its own first try).
    fn put_new(&self, key: &Key, data: &[u8]) -> Result<bool>;

    /// Remove objects; one that is already gone is no error.
    fn delete(&self, keys: &[Key]) -> Result<()>;

    /// Start writing a new object `key` (a pack): it is listed and
    /// readable once [`ObjectWriter::finish`] returns (a directory may
    /// also show an unfinished one, which salvage handles).
    fn create(&self, key: &Key) -> Result<Box<dyn ObjectWriter>>;

    /// Create `key` holding `data` and hold it for as long as the returned
    /// guard lives (a session, a lock: see [`WriteBackend::liveness`]);
    /// dropping the guard removes the object. Fails with
    /// [`StoreError::Locked`] (naming what the holder wrote) while a live
    /// holder has it; the object of a dead holder is taken over.
    fn hold(&self, key: &Key, data: &[u8]) -> Result<Box<dyn Held>>;

    /// [`WriteBackend::hold`] of `key` from a holder the caller found
    /// ended though its object looks live (a bucket's lease left by a
    /// process of this machine that is gone): the object is replaced only
    /// while it still holds `old`, so of two takers one wins, and one that
    /// changed meanwhile is [`StoreError::Locked`] by whoever wrote it. A
    /// missing object is held as by `hold`.
    fn take_over(&self, key: &Key, data: &[u8], old: &[u8]) -> Result<Box<dyn Held>>;

    /// Remove the held object `key` whatever its lease says, if it still
    /// holds `seen` (`cairn unlock --remove-all`: a holder killed on a
    /// machine that cannot tell). `false`: it changed or is gone, and was
    /// left. A holder whose liveness is certain (a directory's lock, taken
    /// by a running process) is refused with [`StoreError::Locked`]. A
    /// remote holder still running finds its hold lost at its next refresh
    /// or [`Held::check`], and commits nothing on it.
    fn break_hold(&self, key: &Key, seen: &[u8]) -> Result<bool>;

    /// Whether the holder of `key` (made by [`WriteBackend::hold`]) is
    /// still running.
    fn liveness(&self, key: &Key) -> Result<Liveness>;

    /// [`WriteBackend::liveness`] and the body of held object `key` in
    /// one look (a bucket: one GET, where liveness and get took two
    /// requests); `None`: no such object ([`Liveness::Gone`]).
    fn inspect(&self, key: &Key) -> Result<Option<(Liveness, Vec<u8>)>>;

    /// Remove what killed writers left half-written under `folder` and
    /// longer ago than `age` (a directory's temporaries; an object store
    /// has none, its uploads are whole or absent). Returns how many.
    fn sweep(&self, _folder: &str, _age: std::time::Duration) -> Result<u64> {
        Ok(0)
    }
}

/// An object being written by [`WriteBackend::create`].
pub trait ObjectWriter: Send {
    /// Append bytes.
    fn append(&mut self, bytes: &[u8]) -> Result<()>;

    /// Make the object durable and visible.
    fn finish(self: Box<Self>) -> Result<()>;

    /// Drop the object (it received nothing worth keeping).
    fn discard(self: Box<Self>);
}

/// A held object (see [`WriteBackend::hold`]); removed when dropped
/// (unless another process took it over).
pub trait Held: Send + Sync + std::fmt::Debug {
    /// Fails when the hold may have been lost (a remote lease that could
    /// not be refreshed in time, or an object removed or taken over by
    /// another process): a writer checks this before it commits.
    fn check(&self) -> Result<()>;
}

/// Objects kept open at most by a [`LocalDir`] (a big repository has
/// more packs than a process may hold open).
const MAX_OPEN: usize = 256;

/// A directory on a local filesystem: key `a/b` is the file `DIR/a/b`.
/// Objects read by range are kept open (at most `MAX_OPEN`).
#[derive(Debug)]
pub struct LocalDir {
    root: PathBuf,
    open: Mutex<HashMap<Key, Arc<File>>>,
}

impl LocalDir {
    /// The backend of directory `root`.
    pub fn new(root: &Path) -> LocalDir {
        LocalDir {
            root: root.to_path_buf(),
            open: Mutex::default(),
        }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn file(&self, key: &Key) -> Result<Arc<File>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = open.get(key) {
            return Ok(f.clone());
        }
        if open.len() >= MAX_OPEN {
            open.clear();
        }
        let path = self.locate(key);
        let f = Arc::new(File::open(&path).ctx(&path, "open")?);
        open.insert(key.clone(), f.clone());
        Ok(f)
    }

    /// Forget open handles of `keys` (deleted objects).
    fn forget(&self, keys: &[Key]) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        for k in keys {
            open.remove(k);
        }
    }

    /// Make the directory that will hold `path`, the new directories'
    /// names made durable.
    fn make_parent(&self, path: &Path) -> Result<()> {
        match path.parent() {
            Some(dir) => meta::create_dirs(dir),
            None => Ok(()),
        }
    }

    /// A temporary name beside `path`, unique in this machine.
    /// A held object's liveness, and with `read` its body (else empty);
    /// `None`: no such file.
    fn look(&self, key: &Key, read: bool) -> Result<Option<(Liveness, Vec<u8>)>> {
        let path = self.locate(key);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).ctx(&path, "open"),
        };
        // The holder's lock is exclusive: a shared one is refused while it
        // lives (and leaves the holder alone when taken).
        let live = if flock(&file, libc::LOCK_SH | libc::LOCK_NB).ctx(&path, "lock")? {
            Liveness::Dead
        } else {
            Liveness::Live
        };
        let mut body = Vec::new();
        if read {
            (&file).read_to_end(&mut body).ctx(&path, "read")?;
        }
        Ok(Some((live, body)))
    }

    fn temporary(path: &Path) -> PathBuf {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        path.with_file_name(format!(
            ".{name}.tmp-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Write `data` to a new temporary file beside `path`, fsync'd.
    fn write_temporary(&self, path: &Path, data: &[u8]) -> Result<(PathBuf, File)> {
        self.make_parent(path)?;
        let tmp = Self::temporary(path);
        let written = (|| {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .ctx(&tmp, "create")?;
            f.write_all(data).ctx(&tmp, "write")?;
            f.sync_all().ctx(&tmp, "fsync")?;
            Ok(f)
        })();
        match written {
            Ok(f) => Ok((tmp, f)),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }
}

impl ReadBackend for LocalDir {
    fn locate(&self, key: &Key) -> PathBuf {
        self.root.join(key.as_str())
    }

    fn read_at(&self, key: &Key, offset: u64, buf: &mut [u8]) -> Result<()> {
        let f = self.file(key)?;
        f.read_exact_at(buf, offset)
            .map_err(|e| short_or_io(&self.locate(key), offset, e))
    }

    fn read_prefix(&self, key: &Key, len: u64) -> Result<Vec<u8>> {
        let path = self.locate(key);
        let f = File::open(&path).ctx(&path, "open")?;
        let mut data = vec![0u8; len as usize];
        f.read_exact_at(&mut data, 0)
            .map_err(|e| short_or_io(&path, 0, e))?;
        Ok(data)
    }

    fn get(&self, key: &Key) -> Result<Option<Vec<u8>>> {
        let path = self.locate(key);
        match std::fs::read(&path) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).ctx(&path, "read"),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        // The folder part of the prefix is walked; the rest filters names.
        let (folder, _) = prefix.rsplit_once('/').unwrap_or(("", prefix));
        let mut out = Vec::new();
        let mut todo = vec![folder.to_string()];
        while let Some(rel) = todo.pop() {
            let dir = self.root.join(&rel);
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).ctx(&dir, "read directory"),
            };
            for e in rd {
                let e = e.ctx(&dir, "read directory")?;
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                let key = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                let path = e.path();
                let md = match e.metadata() {
                    Ok(md) => md,
                    // Removed since the listing.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e).ctx(&path, "stat"),
                };
                if md.is_dir() {
                    if prefix.starts_with(&format!("{key}/")) || key.starts_with(prefix) {
                        todo.push(key);
                    }
                } else if key.starts_with(prefix) {
                    out.push(Listed {
                        key: Key(key),
                        len: md.len(),
                    });
                }
            }
        }
        Ok(out)
    }
}

impl WriteBackend for LocalDir {
    fn sweep(&self, folder: &str, age: std::time::Duration) -> Result<u64> {
        let mut swept = 0;
        let mut todo = vec![self.root.join(folder)];
        while let Some(dir) = todo.pop() {
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).ctx(&dir, "read directory"),
            };
            for e in rd {
                let e = e.ctx(&dir, "read directory")?;
                let Ok(md) = e.metadata() else { continue };
                let name = e.file_name().to_string_lossy().into_owned();
                if md.is_dir() {
                    todo.push(e.path());
                } else if name.starts_with('.')
                    && name.contains(".tmp-")
                    && md
                        .modified()
                        .ok()
                        .and_then(|m| m.elapsed().ok())
                        .is_some_and(|a| a > age)
                {
                    match std::fs::remove_file(e.path()) {
                        Ok(()) => swept += 1,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(err) => return Err(err).ctx(e.path(), "remove"),
                    }
                }
            }
        }
        Ok(swept)
    }

    fn child(&self, folder: &str) -> Arc<dyn WriteBackend> {
        Arc::new(LocalDir::new(&self.root.join(folder)))
    }

    fn put(&self, key: &Key, data: &[u8]) -> Result<()> {
        let path = self.locate(key);
        let (tmp, _f) = self.write_temporary(&path, data)?;
        if let Err(e) = std::fs::rename(&tmp, &path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).ctx(&path, "rename into place");
        }
        self.forget(std::slice::from_ref(key));
        meta::sync_dir(path.parent().unwrap_or(&self.root))
    }

    fn put_new(&self, key: &Key, data: &[u8]) -> Result<bool> {
        let path = self.locate(key);
        let (tmp, _f) = self.write_temporary(&path, data)?;
        // link(2) makes the name only where there is none.
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(e).ctx(&path, "link into place"),
        }
        meta::sync_dir(path.parent().unwrap_or(&self.root))?;
        Ok(true)
    }

    fn delete(&self, keys: &[Key]) -> Result<()> {
        self.forget(keys);
        let mut dirs = std::collections::BTreeSet::new();
        for key in keys {
            let path = self.locate(key);
            match std::fs::remove_file(&path) {
                // Only a directory that lost a name needs its sync.
                Ok(()) => {
                    if let Some(d) = path.parent() {
                        dirs.insert(d.to_path_buf());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).ctx(&path, "remove"),
            }
        }
        for d in dirs {
            meta::sync_dir(&d)?;
        }
        Ok(())
    }

    fn create(&self, key: &Key) -> Result<Box<dyn ObjectWriter>> {
        let path = self.locate(key);
        self.make_parent(&path)?;
        Ok(Box::new(crate::direct::FileWriter::create(&path)?))
    }

    fn hold(&self, key: &Key, data: &[u8]) -> Result<Box<dyn Held>> {
        use std::os::unix::fs::MetadataExt;
        let path = self.locate(key);
        // A checker may remove a file it finds unlocked (its holder died)
        // at any moment: so retry, and keep only a lock on the file that
        // is still at `path`.
        for _ in 0..100 {
            // A new object is written and locked under a temporary name,
            // then linked into place: it is never seen unlocked.
            let (tmp, file) = self.write_temporary(&path, data)?;
            let locked = flock(&file, libc::LOCK_EX | libc::LOCK_NB).ctx(&tmp, "lock");
            let linked = locked.and_then(|_| match std::fs::hard_link(&tmp, &path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(e).ctx(&path, "link into place"),
            });
            let _ = std::fs::remove_file(&tmp);
            if linked? {
                meta::sync_dir(path.parent().unwrap_or(&self.root))?;
                return Ok(Box::new(LocalHold { path, file }));
            }
            drop(file);
            // Taken: by a live holder, or left by a dead one.
            let file = match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).ctx(&path, "open"),
            };
            if !flock(&file, libc::LOCK_EX | libc::LOCK_NB).ctx(&path, "lock")? {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                if holder.is_empty() {
                    // Its holder is letting go (emptied, then removed).
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    continue;
                }
                return Err(StoreError::Locked { path, holder });
            }
            let mine = file.metadata().ctx(&path, "stat")?;
            match std::fs::metadata(&path) {
                Ok(now) if now.ino() == mine.ino() && now.dev() == mine.dev() => {}
                _ => continue,
            }
            let mut f = &file;
            f.set_len(0).ctx(&path, "truncate")?;
            f.write_all(data).ctx(&path, "write")?;
            file.sync_all().ctx(&path, "fsync")?;
            return Ok(Box::new(LocalHold { path, file }));
        }
        Err(StoreError::Locked {
            path,
            holder: "processes that keep taking and dropping it".into(),
        })
    }

    fn take_over(&self, key: &Key, data: &[u8], _old: &[u8]) -> Result<Box<dyn Held>> {
        // A directory's holder that ended has dropped its lock: `hold`
        // takes such an object over, and refuses a live one.
        self.hold(key, data)
    }

    fn break_hold(&self, key: &Key, seen: &[u8]) -> Result<bool> {
        let path = self.locate(key);
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e).ctx(&path, "open"),
        };
        // Exclusive, as a holder's: refused while its holder runs, and a
        // taker waits for it (and then finds the path gone and retries).
        if !flock(&file, libc::LOCK_EX | libc::LOCK_NB).ctx(&path, "lock")? {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            return Err(StoreError::Locked { path, holder });
        }
        let mut body = Vec::new();
        (&file).read_to_end(&mut body).ctx(&path, "read")?;
        if body != seen {
            return Ok(false);
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e).ctx(&path, "remove"),
        }
        meta::sync_dir(path.parent().unwrap_or(&self.root))?;
        Ok(true)
    }

    fn liveness(&self, key: &Key) -> Result<Liveness> {
        Ok(self.look(key, false)?.map_or(Liveness::Gone, |(l, _)| l))
    }

    fn inspect(&self, key: &Key) -> Result<Option<(Liveness, Vec<u8>)>> {
        self.look(key, true)
    }
}

/// A local held object: an exclusive `flock` on the file, which the kernel
/// drops when the process dies.
#[derive(Debug)]
struct LocalHold {
    path: PathBuf,
    file: File,
}

impl Held for LocalHold {
    /// Still the file at its path. Only its holder removes it while the
    /// `flock` holds; but where file locks do not reach every host that
    /// shares the directory (NFS without locking, sshfs), another host
    /// takes it for dead and removes it, and then collects what this
    /// writer uses: the writer stops before it commits instead.
    fn check(&self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let held = self.file.metadata().ctx(&self.path, "stat")?;
        match std::fs::metadata(&self.path) {
            Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => Ok(()),
            Ok(_) => Err(StoreError::HoldTaken {
                path: self.path.clone(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StoreError::HoldTaken {
                path: self.path.clone(),
            }),
            Err(e) => Err(e).ctx(&self.path, "stat"),
        }
    }
}

impl Drop for LocalHold {
    /// Emptied, then removed, then unlocked (when the file closes): a
    /// process that opened it meanwhile finds it empty or gone and
    /// retries on the path.
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A read that ran past the end of an object is damage (it is shorter
/// than the index says); anything else is the system's failure.
fn short_or_io(path: &Path, offset: u64, e: std::io::Error) -> StoreError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        StoreError::corrupt(
            path,
            offset,
            "pack is shorter than the index says (truncated?)",
        )
    } else {
        StoreError::Io {
            path: path.to_path_buf(),
            what: "read",
            source: e,
        }
    }
}

/// What every [`WriteBackend`] must do, as one check run against each
/// kind (a directory in the unit tests, SeaweedFS in the integration
/// tests). `scratch` is a folder of the backend no one else uses.
#[doc(hidden)]
pub fn conformance(b: &dyn WriteBackend) -> std::result::Result<(), String> {
    fn ok<T>(what: &str, r: Result<T>) -> std::result::Result<T, String> {
        r.map_err(|e| format!("{what}: {e}"))
    }
    let k = |s: &str| Key(s.to_string());
    // put, get, replace, ranged reads.
    ok("put", b.put(&k("meta/one"), b"first"))?;
    ok("put again", b.put(&k("meta/one"), b"second value"))?;
    let got = ok("get", b.get(&k("meta/one")))?;
    if got.as_deref() != Some(&b"second value"[..]) {
        return Err(format!("get after replace gave {got:?}"));
    }
    if ok("get absent", b.get(&k("meta/none")))?.is_some() {
        return Err("an absent object was found".into());
    }
    ok("put empty", b.put(&k("empty/zero"), b""))?;
    let got = ok("get empty", b.get(&k("empty/zero")))?;
    if got.as_deref() != Some(&b""[..]) {
        return Err(format!("an empty object read as {got:?}"));
    }
    ok("delete empty", b.delete(&[k("empty/zero")]))?;
    let mut buf = [0u8; 5];
    ok("read_at", b.read_at(&k("meta/one"), 7, &mut buf))?;
    if &buf != b"value" {
        return Err(format!("read_at gave {buf:?}"));
    }
    match b.read_at(&k("meta/one"), 9, &mut buf) {
        Err(StoreError::Corrupt { .. }) => {}
        other => return Err(format!("a read past the end gave {other:?}, not damage")),
    }
    if ok("read_prefix", b.read_prefix(&k("meta/one"), 6))? != b"second" {
        return Err("read_prefix gave other bytes".into());
    }
    // put_new: one winner, the loser changes nothing.
    if !ok("put_new", b.put_new(&k("meta/new"), b"a"))? {
        return Err("put_new refused a new key".into());
    }
    if ok("put_new again", b.put_new(&k("meta/new"), b"b"))? {
        return Err("put_new replaced an object".into());
    }
    if ok("get new", b.get(&k("meta/new")))?.as_deref() != Some(&b"a"[..]) {
        return Err("put_new's loser changed the object".into());
    }
    // Streamed objects.
    let mut w = ok("create", b.create(&k("packs/ab/x.pack")))?;
    let big: Vec<u8> = (0..5_000_003u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    for part in big.chunks(1_000_001) {
        ok("append", w.append(part))?;
    }
    ok("finish", w.finish())?;
    if ok("get pack", b.get(&k("packs/ab/x.pack")))?.as_deref() != Some(&big[..]) {
        return Err("a streamed object reads back different".into());
    }
    let mut mid = vec![0u8; 100_000];
    ok(
        "read_at pack",
        b.read_at(&k("packs/ab/x.pack"), 4_000_000, &mut mid),
    )?;
    if mid[..] != big[4_000_000..4_100_000] {
        return Err("a ranged read of a streamed object differs".into());
    }
    let mut w = ok("create discarded", b.create(&k("packs/ab/y.pack")))?;
    ok("append", w.append(b"junk"))?;
    w.discard();
    // list: finished objects under a prefix, with their lengths.
    let mut listed = ok("list", b.list("packs/"))?;
    listed.sort_by(|a, b| a.key.cmp(&b.key));
    if listed
        != [Listed {
            key: k("packs/ab/x.pack"),
            len: big.len() as u64,
        }]
    {
        return Err(format!("list packs/ gave {listed:?}"));
    }
    let mut metas: Vec<String> = ok("list meta", b.list("meta/"))?
        .into_iter()
        .map(|l| l.key.0)
        .collect();
    metas.sort();
    if metas != ["meta/new", "meta/one"] {
        return Err(format!("list meta/ gave {metas:?}"));
    }
    if !ok("list none", b.list("nothing/"))?.is_empty() {
        return Err("an empty folder listed objects".into());
    }
    // delete: gone, and again is no error.
    ok("delete", b.delete(&[k("meta/new"), k("packs/ab/x.pack")]))?;
    ok("delete again", b.delete(&[k("meta/new")]))?;
    if ok("get deleted", b.get(&k("meta/new")))?.is_some() {
        return Err("a deleted object is still there".into());
    }
    // hold: live while held, gone when dropped.
    let h = ok("hold", b.hold(&k("sessions/s1"), b"me"))?;
    ok("check", h.check())?;
    if ok("liveness", b.liveness(&k("sessions/s1")))? != Liveness::Live {
        return Err("a held object is not live".into());
    }
    if ok("get held", b.get(&k("sessions/s1")))?.as_deref() != Some(&b"me"[..]) {
        return Err("a held object does not hold its data".into());
    }
    if ok("inspect held", b.inspect(&k("sessions/s1")))? != Some((Liveness::Live, b"me".to_vec())) {
        return Err("inspect of a held object does not say live, with its data".into());
    }
    if ok("inspect none", b.inspect(&k("sessions/none")))?.is_some() {
        return Err("inspect of a missing object found one".into());
    }
    // take over: only from the holder named; break: only what was seen.
    match b.take_over(&k("sessions/s1"), b"taker", b"someone else") {
        Err(StoreError::Locked { holder, .. }) if holder == "me" => {}
        other => return Err(format!("take_over from another holder gave {other:?}")),
    }
    // (A directory refuses to break a live hold at all.)
    match b.break_hold(&k("sessions/s1"), b"someone else") {
        Ok(false) | Err(StoreError::Locked { .. }) => {}
        other => {
            return Err(format!(
                "break_hold of an object that changed gave {other:?}"
            ))
        }
    }
    if ok("get unbroken", b.get(&k("sessions/s1")))?.as_deref() != Some(&b"me"[..]) {
        return Err("break_hold of an object that changed removed it".into());
    }
    drop(h);
    if ok("liveness after", b.liveness(&k("sessions/s1")))? != Liveness::Gone {
        return Err("a dropped hold left its object".into());
    }
    if ok("break gone", b.break_hold(&k("sessions/s1"), b"me"))? {
        return Err("break_hold of a missing object said it removed it".into());
    }
    let h = ok(
        "take_over gone",
        b.take_over(&k("sessions/s1"), b"new", b"me"),
    )?;
    if ok("get taken", b.get(&k("sessions/s1")))?.as_deref() != Some(&b"new"[..]) {
        return Err("take_over of a missing object does not hold its data".into());
    }
    drop(h);
    // child: a folder as a backend of its own.
    let c = b.child("meta");
    if ok("child get", c.get(&k("one")))?.as_deref() != Some(&b"second value"[..]) {
        return Err("a child backend does not see its folder".into());
    }
    ok("cleanup", b.delete(&[k("meta/one")]))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn pack_keys_match_the_layout_on_disk() {
        let id = PackId::random();
        let dir = Path::new("/t");
        let hex = id.to_string();
        assert_eq!(
            LocalDir::new(dir).locate(&Key::pack(id)),
            dir.join("packs")
                .join(&hex[..2])
                .join(format!("{hex}.pack"))
        );
    }

    #[test]
    fn a_directory_is_a_backend() {
        let dir = tempfile::tempdir().unwrap();
        conformance(&LocalDir::new(dir.path())).unwrap();
        // Nothing temporary is left behind.
        let left = crate::faults::files_under(dir.path());
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn sweep_removes_only_old_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalDir::new(dir.path());
        std::fs::create_dir_all(dir.path().join("index/sub")).unwrap();
        let old = dir.path().join("index/sub/.x.idx.tmp-1-0");
        let young = dir.path().join("index/.y.idx.tmp-1-1");
        let kept = dir.path().join("index/z.idx");
        for p in [&old, &young, &kept] {
            std::fs::write(p, b"x").unwrap();
        }
        let f = std::fs::File::options().write(true).open(&old).unwrap();
        f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(7200))
            .unwrap();
        drop(f);
        assert_eq!(
            b.sweep("index", std::time::Duration::from_secs(3600))
                .unwrap(),
            1
        );
        assert!(!old.exists() && young.exists() && kept.exists());
        assert_eq!(b.sweep("nothing", std::time::Duration::ZERO).unwrap(), 0);
    }

    #[test]
    fn a_dead_holders_object_is_dead() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalDir::new(dir.path());
        let key = Key("sessions/x".into());
        std::fs::create_dir_all(dir.path().join("sessions")).unwrap();
        // As a killed process leaves it: the file, with no lock on it.
        std::fs::write(b.locate(&key), b"pid 1").unwrap();
        assert_eq!(b.liveness(&key).unwrap(), Liveness::Dead);
        // Checking took and dropped a shared lock: a holder can still come.
        std::fs::remove_file(b.locate(&key)).unwrap();
        let h = b.hold(&key, b"me").unwrap();
        assert_eq!(b.liveness(&key).unwrap(), Liveness::Live);
        drop(h);
    }

    /// A hold whose file was removed or replaced behind its back (as a
    /// host whose file locks do not reach this one does) fails its check.
    #[test]
    fn a_hold_whose_file_went_fails_its_check() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalDir::new(dir.path());
        let key = Key("sessions/y".into());
        let h = b.hold(&key, b"me").unwrap();
        h.check().unwrap();
        std::fs::remove_file(b.locate(&key)).unwrap();
        assert!(matches!(h.check(), Err(StoreError::HoldTaken { .. })));
        std::fs::write(b.locate(&key), b"another").unwrap();
        assert!(matches!(h.check(), Err(StoreError::HoldTaken { .. })));
    }

    #[test]
    fn only_a_dead_holders_object_is_broken() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalDir::new(dir.path());
        let key = Key("locks/x".into());
        // A running holder's lock is certain: refused, naming it.
        let h = b.hold(&key, b"holder").unwrap();
        match b.break_hold(&key, b"holder") {
            Err(StoreError::Locked { holder, .. }) => assert_eq!(holder, "holder"),
            other => panic!("{other:?}"),
        }
        drop(h);
        // Left by a killed process: removed, if it is what was seen.
        std::fs::write(b.locate(&key), b"pid 1").unwrap();
        assert!(!b.break_hold(&key, b"pid 2").unwrap());
        assert!(b.break_hold(&key, b"pid 1").unwrap());
        assert_eq!(b.liveness(&key).unwrap(), Liveness::Gone);
        assert!(!b.break_hold(&key, b"pid 1").unwrap());
    }

    #[test]
    fn short_objects_are_damage_and_missing_ones_io_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("packs/aa")).unwrap();
        std::fs::write(dir.path().join("packs/aa/x"), b"0123456789").unwrap();
        let b = LocalDir::new(dir.path());
        let key = Key("packs/aa/x".into());
        let mut buf = [0u8; 4];
        b.read_at(&key, 3, &mut buf).unwrap();
        assert_eq!(&buf, b"3456");
        let e = b.read_at(&key, 8, &mut buf).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        assert!(
            e.to_string().contains("offset 8") || e.to_string().contains('8'),
            "{e}"
        );
        assert_eq!(b.read_prefix(&key, 10).unwrap(), b"0123456789");
        let e = b
            .read_at(&Key("packs/aa/y".into()), 0, &mut buf)
            .unwrap_err();
        assert!(matches!(e, StoreError::Io { .. }), "{e}");
    }
}
