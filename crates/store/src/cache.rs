//! A local cache in front of a remote backend: [`CachedBackend`] keeps
//! what was read from immutable objects (index files, ranges of packs) in
//! a directory, so that a served image's random reads and every command's
//! index load do not fetch the same bytes from the object store again.
//!
//! - **Only immutable objects.** Index files and packs are written once
//!   under fresh random names (128 bits), never reused for other
//!   contents, even by a repository made again at the same place; those
//!   are cached. Everything else goes to the store each time: config,
//!   sessions, locks, trash lists, markers, every listing, and manifests,
//!   whose names can come back (a backup by a cairn older than removal
//!   records, after `rm NAME@3`, made another `NAME@3`; a manifest is
//!   also rewritten by `tag`). So the store stays the truth: an index
//!   file is only asked for after a listing named it.
//! - **Checked, and damage is the cache's, not the repository's.** Each
//!   entry carries the CRC-32C of its bytes; one that fails the check (a
//!   torn write, a flipped bit on the cache disk) is dropped and fetched
//!   again, never reported as damage of the repository. What the store
//!   returns is checked by the repository's own means (record CRCs, chunk
//!   hashes, metadata envelopes) as without the cache.
//! - **Bounded by bytes, oldest first out.** Entries are files named by a
//!   hash of the key and range; the total is kept under the bound by
//!   removing the least recently used. The cache is rebuilt from the
//!   directory's contents when opened (recency from the files' times), so
//!   it survives restarts. It is written without fsync: a cache entry lost
//!   in a crash is fetched again.
//! - **Packs by range, metadata whole.** A range read of a pack caches
//!   that range (a record, or a pack header): served images read the
//!   same records again and again. Whole reads (`get`) of packs, as gc and
//!   verify do once per pack, pass through: caching them would only evict
//!   what a served image uses.
//! - **Not for judging the store.** `verify` and `repair` open a remote
//!   repository without the cache
//!   ([`Repository::open_location_uncached`](crate::Repository::open_location_uncached)):
//!   an index file damaged in the bucket after it was cached would
//!   otherwise pass (restic's `check` uses a fresh cache for this).
//!
//! Written by hand: a few dozen lines of file handling over the backend
//! traits; a caching crate would add a second store format to check.

use crate::backend::{Held, Key, Listed, Liveness, ObjectWriter, ReadBackend, WriteBackend};
use crate::error::{IoContext, Result};
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes kept at most by default.
pub const DEFAULT_CACHE_BYTES: u64 = 4 << 30;

/// The bookkeeping of one cache directory, shared by a backend and its
/// children.
#[derive(Debug)]
struct Entries {
    dir: PathBuf,
    limit: u64,
    state: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    /// Entry name -> (tick of last use, bytes).
    by_name: HashMap<String, (u64, u64)>,
    /// Tick -> entry name, oldest first.
    by_tick: BTreeMap<u64, String>,
    tick: u64,
    bytes: u64,
}

impl Lru {
    fn touch(&mut self, name: &str, len: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((old, bytes)) = self.by_name.insert(name.to_string(), (tick, len)) {
            self.by_tick.remove(&old);
            self.bytes -= bytes;
        }
        self.by_tick.insert(tick, name.to_string());
        self.bytes += len;
    }

    fn forget(&mut self, name: &str) {
        if let Some((tick, bytes)) = self.by_name.remove(name) {
            self.by_tick.remove(&tick);
            self.bytes -= bytes;
        }
    }
}

impl Entries {
    fn open(dir: &Path, limit: u64) -> Result<Entries> {
        fs::create_dir_all(dir).ctx(dir, "create directory")?;
        let mut found = Vec::new();
        for e in fs::read_dir(dir).ctx(dir, "read directory")? {
            let e = e.ctx(dir, "read directory")?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(md) = e.metadata() else { continue };
            if name.starts_with('.') {
                // A temporary of a killed process.
                let _ = fs::remove_file(e.path());
                continue;
            }
            let used = md
                .accessed()
                .or_else(|_| md.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            found.push((used, name, md.len()));
        }
        found.sort();
        let mut lru = Lru::default();
        for (_, name, len) in found {
            lru.touch(&name, len);
        }
        let entries = Entries {
            dir: dir.to_path_buf(),
            limit,
            state: Mutex::new(lru),
        };
        entries.trim();
        Ok(entries)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached bytes of entry `name`, if present and sound.
    fn get(&self, name: &str) -> Option<Vec<u8>> {
        let path = self.dir.join(name);
        let data = fs::read(&path).ok()?;
        let sound = data.len() >= 4 && {
            let (body, crc) = data.split_at(data.len() - 4);
            crc32c::crc32c(body).to_le_bytes() == crc
        };
        let mut lru = self.lock();
        if !sound {
            lru.forget(name);
            drop(lru);
            let _ = fs::remove_file(&path);
            return None;
        }
        lru.touch(name, data.len() as u64);
        drop(lru);
        let mut data = data;
        data.truncate(data.len() - 4);
        Some(data)
    }

    /// Keep `data` as entry `name`. A cache that cannot be written is
    /// only slower: failures are ignored.
    fn put(&self, name: &str, data: &[u8]) {
        let tmp = self.dir.join(format!(".{name}.{}", std::process::id()));
        let mut with_crc = Vec::with_capacity(data.len() + 4);
        with_crc.extend_from_slice(data);
        with_crc.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
        if fs::write(&tmp, &with_crc).is_err() || fs::rename(&tmp, self.dir.join(name)).is_err() {
            let _ = fs::remove_file(&tmp);
            return;
        }
        self.lock().touch(name, with_crc.len() as u64);
        self.trim();
    }

    /// Drop entries, oldest first, until the total is under the limit.
    fn trim(&self) {
        loop {
            let victim = {
                let mut lru = self.lock();
                if lru.bytes <= self.limit {
                    return;
                }
                let Some((_, name)) = lru.by_tick.iter().next().map(|(t, n)| (*t, n.clone()))
                else {
                    return;
                };
                lru.forget(&name);
                name
            };
            let _ = fs::remove_file(self.dir.join(victim));
        }
    }

    fn drop_prefix(&self, prefix: &str) {
        let names: Vec<String> = self
            .lock()
            .by_name
            .keys()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect();
        for n in names {
            self.lock().forget(&n);
            let _ = fs::remove_file(self.dir.join(&n));
        }
    }
}

/// A backend with a local cache of its immutable objects in front.
#[derive(Debug)]
pub struct CachedBackend {
    inner: Arc<dyn WriteBackend>,
    entries: Arc<Entries>,
    /// Whether ranges of packs are cached too (a served image), or only
    /// metadata (a restore reads each record once: caching them would
    /// only write a second copy of everything).
    packs: bool,
    /// This backend's folder in the cached store ("" or "data/"), part of
    /// every entry's name.
    folder: String,
}

impl CachedBackend {
    /// `inner`, with a cache in `dir` (made if missing) of at most `limit`
    /// bytes.
    pub fn new(inner: Arc<dyn WriteBackend>, dir: &Path, limit: u64) -> Result<CachedBackend> {
        Ok(CachedBackend {
            inner,
            entries: Arc::new(Entries::open(dir, limit)?),
            packs: true,
            folder: String::new(),
        })
    }

    /// The same, caching metadata only (no pack ranges).
    pub fn metadata_only(mut self) -> CachedBackend {
        self.packs = false;
        self
    }

    /// Bytes in the cache now.
    #[cfg(test)]
    pub fn cached_bytes(&self) -> u64 {
        self.entries.lock().bytes
    }

    /// Whether `key` names an object that never changes once written.
    fn immutable(&self, key: &Key) -> bool {
        let full = format!("{}{}", self.folder, key.as_str());
        full.starts_with("index/") || key.as_str().starts_with("packs/")
    }

    fn is_pack(key: &Key) -> bool {
        key.as_str().starts_with("packs/")
    }

    /// The entry name of a key (and range): a hash, so any key makes a
    /// plain file name; the key's hash leads, so one key's ranges share a
    /// prefix.
    fn name(&self, key: &Key, range: Option<(u64, usize)>) -> String {
        let full = format!("{}{}", self.folder, key.as_str());
        let h = blake3::hash(full.as_bytes()).to_hex();
        match range {
            Some((off, len)) => format!("{}-{off}-{len}", &h[..32]),
            None => format!("{}-all", &h[..32]),
        }
    }

    fn key_prefix(&self, key: &Key) -> String {
        let full = format!("{}{}", self.folder, key.as_str());
        blake3::hash(full.as_bytes()).to_hex()[..32].to_string()
    }
}

impl ReadBackend for CachedBackend {
    fn locate(&self, key: &Key) -> PathBuf {
        self.inner.locate(key)
    }

    fn read_at(&self, key: &Key, offset: u64, buf: &mut [u8]) -> Result<()> {
        if !self.packs || !Self::is_pack(key) {
            return self.inner.read_at(key, offset, buf);
        }
        let name = self.name(key, Some((offset, buf.len())));
        if let Some(data) = self.entries.get(&name).filter(|d| d.len() == buf.len()) {
            buf.copy_from_slice(&data);
            return Ok(());
        }
        self.inner.read_at(key, offset, buf)?;
        self.entries.put(&name, buf);
        Ok(())
    }

    fn read_prefix(&self, key: &Key, len: u64) -> Result<Vec<u8>> {
        self.inner.read_prefix(key, len)
    }

    fn get(&self, key: &Key) -> Result<Option<Vec<u8>>> {
        if !self.immutable(key) || Self::is_pack(key) {
            return self.inner.get(key);
        }
        let name = self.name(key, None);
        if let Some(data) = self.entries.get(&name) {
            return Ok(Some(data));
        }
        let got = self.inner.get(key)?;
        if let Some(data) = &got {
            self.entries.put(&name, data);
        }
        Ok(got)
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.inner.list(prefix)
    }

    fn reads_per_core(&self) -> usize {
        self.inner.reads_per_core()
    }
}

impl WriteBackend for CachedBackend {
    fn child(&self, folder: &str) -> Arc<dyn WriteBackend> {
        Arc::new(CachedBackend {
            inner: self.inner.child(folder),
            entries: self.entries.clone(),
            packs: self.packs,
            folder: format!("{}{folder}/", self.folder),
        })
    }

    fn put(&self, key: &Key, data: &[u8]) -> Result<()> {
        self.entries.drop_prefix(&self.key_prefix(key));
        self.inner.put(key, data)
    }

    fn put_new(&self, key: &Key, data: &[u8]) -> Result<bool> {
        self.inner.put_new(key, data)
    }

    fn delete(&self, keys: &[Key]) -> Result<()> {
        for k in keys {
            self.entries.drop_prefix(&self.key_prefix(k));
        }
        self.inner.delete(keys)
    }

    fn create(&self, key: &Key) -> Result<Box<dyn ObjectWriter>> {
        self.inner.create(key)
    }

    fn hold(&self, key: &Key, data: &[u8]) -> Result<Box<dyn Held>> {
        self.inner.hold(key, data)
    }

    fn take_over(&self, key: &Key, data: &[u8], old: &[u8]) -> Result<Box<dyn Held>> {
        self.inner.take_over(key, data, old)
    }

    fn break_hold(&self, key: &Key, seen: &[u8]) -> Result<bool> {
        self.entries.drop_prefix(&self.key_prefix(key));
        self.inner.break_hold(key, seen)
    }

    fn liveness(&self, key: &Key) -> Result<Liveness> {
        self.inner.liveness(key)
    }

    fn inspect(&self, key: &Key) -> Result<Option<(Liveness, Vec<u8>)>> {
        self.inner.inspect(key)
    }

    fn sweep(&self, folder: &str, age: std::time::Duration) -> Result<u64> {
        self.inner.sweep(folder, age)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::backend::{conformance, LocalDir};

    fn pair() -> (tempfile::TempDir, Arc<dyn WriteBackend>, CachedBackend) {
        let d = tempfile::tempdir().unwrap();
        let inner: Arc<dyn WriteBackend> = Arc::new(LocalDir::new(&d.path().join("store")));
        let c = CachedBackend::new(inner.clone(), &d.path().join("cache"), 1 << 20).unwrap();
        (d, inner, c)
    }

    #[test]
    fn a_cached_backend_is_a_backend() {
        let (_d, _inner, c) = pair();
        conformance(&c).unwrap();
    }

    #[test]
    fn ranges_and_metadata_come_from_the_cache_once_read() {
        let (d, inner, c) = pair();
        let pack = Key::new("packs/ab/x.pack");
        let idx = Key::new("index/1.idx");
        inner
            .put(
                &pack,
                &(0..=255u8).cycle().take(100_000).collect::<Vec<_>>(),
            )
            .unwrap();
        inner.put(&idx, b"index bytes").unwrap();
        let mut buf = [0u8; 100];
        c.read_at(&pack, 1000, &mut buf).unwrap();
        assert_eq!(c.get(&idx).unwrap().unwrap(), b"index bytes");
        // Over an empty store (as if gone from it): still served from the
        // cache.
        let empty: Arc<dyn WriteBackend> = Arc::new(LocalDir::new(&d.path().join("empty")));
        let c = CachedBackend::new(empty, &d.path().join("cache"), 1 << 20).unwrap();
        let mut again = [0u8; 100];
        c.read_at(&pack, 1000, &mut again).unwrap();
        assert_eq!(buf, again);
        assert_eq!(c.get(&idx).unwrap().unwrap(), b"index bytes");
        // Another range is not.
        assert!(c.read_at(&pack, 2000, &mut again).is_err());
    }

    #[test]
    fn a_damaged_entry_is_fetched_again() {
        let (d, inner, c) = pair();
        let pack = Key::new("packs/ab/x.pack");
        inner.put(&pack, &[7u8; 5000]).unwrap();
        let mut buf = [0u8; 10];
        c.read_at(&pack, 10, &mut buf).unwrap();
        for e in std::fs::read_dir(d.path().join("cache")).unwrap() {
            let p = e.unwrap().path();
            let mut data = std::fs::read(&p).unwrap();
            data[0] ^= 1;
            std::fs::write(&p, data).unwrap();
        }
        let mut again = [0u8; 10];
        c.read_at(&pack, 10, &mut again).unwrap();
        assert_eq!(again, [7u8; 10]);
    }

    #[test]
    fn the_cache_stays_under_its_bound_and_survives_a_reopen() {
        let (d, inner, c) = pair();
        let pack = Key::new("packs/ab/x.pack");
        inner.put(&pack, &vec![1u8; 4 << 20]).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        for i in 0..40u64 {
            c.read_at(&pack, i * (64 << 10), &mut buf).unwrap();
        }
        assert!(c.cached_bytes() <= 1 << 20, "{}", c.cached_bytes());
        let on_disk: u64 = std::fs::read_dir(d.path().join("cache"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert_eq!(on_disk, c.cached_bytes());
        let reopened = CachedBackend::new(inner, &d.path().join("cache"), 1 << 20).unwrap();
        assert_eq!(reopened.cached_bytes(), on_disk);
    }

    #[test]
    fn mutable_objects_are_never_cached() {
        let (_d, inner, c) = pair();
        // A trash list is rewritten; a manifest's name comes back after
        // an rm (regression: a cached manifest of a removed snapshot was
        // restored in place of the new one of the same number).
        for key in [Key::new("trash/1"), Key::new("snapshots/a/0000000001.snap")] {
            inner.put(&key, b"one").unwrap();
            assert_eq!(c.get(&key).unwrap().unwrap(), b"one");
            inner.delete(std::slice::from_ref(&key)).unwrap();
            inner.put(&key, b"two").unwrap();
            assert_eq!(c.get(&key).unwrap().unwrap(), b"two");
        }
    }
}
