//! The third tier: compact copies spilled to local disk.
//!
//! The compact tier ([`cairn_store::CompactGroup`]) keeps random reads of
//! an image at LZ4's speed as long as the copies fit in its memory (1 GiB
//! by default, about 3 GiB of an OS image). An image whose randomly read
//! part is bigger fell back to decoding a whole 2 MiB zstd group per 4 KiB
//! read, a fifth of qemu-nbd on a compressed qcow2. Here the copies the
//! compact tier evicts go on to a file on local disk, where the page cache
//! keeps the hot ones in memory the kernel can take back, and a cold one
//! costs a read of a few KiB instead of a decode of 2 MiB.
//!
//! - **A ring, written in order.** The file is a ring of the tier's size:
//!   each copy is written whole after the last, and the copies it comes
//!   to overwrite are dropped first (first in, first out: the two tiers
//!   in front already keep what is hot). Addresses grow without end; the
//!   place in the file is the address modulo the size, and no copy
//!   straddles the end. There is no allocator and no fragmentation, and
//!   the file never grows past its size.
//! - **Sealed under a key of the process.** Each chunk's bytes are
//!   encrypted and authenticated with a key made at random when the
//!   volume opens and never stored ([`cairn_store::SpillKey`]), with its
//!   address as associated data. An encrypted repository's data is so
//!   never on local disk in the clear; a flipped bit on that disk, or a
//!   place rewritten by a later copy while a reader still held the old
//!   one, does not open, and the read goes to the repository instead.
//!   Damage is said (`tracing`), never served.
//! - **Unlinked from the start** (`tempfile`, `O_TMPFILE` where the file
//!   system has it): nothing is left behind by a crash, and nothing but
//!   this process can open it by name.
//! - **Bounded.** Its size is `--image-spill`, at most half of the space
//!   free where it lives when the volume opens. A failed write (the disk
//!   full after all, an I/O error) is said once and ends spilling; reads
//!   carry on from the repository.
//!
//! Written by hand: a ring of sealed records over one file is a few dozen
//! lines, and it shares its keys and records with `cairn_store`.

use cairn_store::{CompactGroup, SpillKey, SpilledGroup, PREFIX_LEN};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Copies bigger than this share of the ring are not spilled (one copy
/// would push out too much).
const MAX_SHARE: u64 = 8;
/// The least size worth a spill file when free space cuts it down.
const MIN_CAP: u64 = 64 << 20;

thread_local! {
    /// A thread's buffers: sealed bytes read back, and their plaintext.
    static BUFS: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

struct Ring {
    /// The address the next copy is written at.
    head: u64,
    map: HashMap<u64, Arc<SpilledGroup>>,
    /// Copies in the order they were written: key, address, end.
    order: VecDeque<(u64, u64, u64)>,
    /// Bytes on disk of the copies in `map`.
    bytes: u64,
    /// Bytes in memory of the copies in `map`.
    mem: usize,
}

/// Counters of the spill tier.
#[derive(Default)]
pub(crate) struct SpillCounters {
    pub hits: AtomicU64,
    pub spilled: AtomicU64,
    pub damaged: AtomicU64,
}

/// The spill tier of one volume.
pub(crate) struct Spill {
    file: File,
    dir: PathBuf,
    cap: u64,
    key: SpillKey,
    ring: Mutex<Ring>,
    /// Copies at addresses below this may have been written over.
    tail: AtomicU64,
    /// A write failed: spill no more.
    failed: AtomicBool,
    pub counters: SpillCounters,
}

impl Spill {
    /// A spill tier of `cap` bytes (at most half of what is free there)
    /// in an unlinked file in `dir`, created if need be.
    pub(crate) fn create(dir: &Path, asked: u64) -> std::io::Result<Spill> {
        std::fs::create_dir_all(dir)?;
        let cap = asked;
        let free = cairn_store::free_space(dir).unwrap_or(0);
        // Half of what is free, but not so little that it is not worth a
        // file (unless that little was asked for).
        let cap = cap.min(free / 2);
        if cap < asked.min(MIN_CAP) {
            return Err(std::io::Error::other(format!(
                "{} MiB free there",
                free >> 20
            )));
        }
        let file = tempfile::tempfile_in(dir)?;
        let key = SpillKey::new().map_err(std::io::Error::other)?;
        Ok(Spill {
            file,
            dir: dir.to_path_buf(),
            cap,
            key,
            ring: Mutex::new(Ring {
                head: 0,
                map: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
                mem: 0,
            }),
            tail: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            counters: SpillCounters::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        // No code that can panic runs under this lock.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its size on disk.
    pub(crate) fn cap(&self) -> u64 {
        self.cap
    }

    /// Bytes held on disk, and in memory.
    pub(crate) fn held(&self) -> (u64, usize) {
        let r = self.lock();
        (r.bytes, r.mem)
    }

    /// Whether `key` has a copy here.
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.lock().map.contains_key(&key)
    }

    /// The copy of `key`, if there is one.
    pub(crate) fn get(&self, key: u64) -> Option<Arc<SpilledGroup>> {
        self.lock().map.get(&key).cloned()
    }

    /// Write `copy`, the compact copy of the record `key`, at the ring's
    /// head, dropping the copies it overwrites.
    pub(crate) fn put(&self, key: u64, copy: &CompactGroup) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let n = copy.sealed_len() as u64;
        if n == 0 || n > self.cap / MAX_SHARE {
            return;
        }
        let at = {
            let mut r = self.lock();
            if r.map.contains_key(&key) {
                return;
            }
            let mut at = r.head;
            let off = at % self.cap;
            if off + n > self.cap {
                at += self.cap - off;
            }
            let end = at + n;
            r.head = end;
            let floor = end.saturating_sub(self.cap);
            while let Some(&(k, a, _)) = r.order.front() {
                if a >= floor {
                    break;
                }
                r.order.pop_front();
                if r.map.get(&k).is_some_and(|g| g.at() == a) {
                    if let Some(g) = r.map.remove(&k) {
                        r.bytes -= g.len();
                        r.mem -= g.bytes();
                    }
                }
            }
            // Before the write: a reader of an overwritten copy finds it
            // below the tail (and its bytes would not open anyway).
            self.tail.fetch_max(floor, Ordering::Release);
            r.order.push_back((key, at, end));
            at
        };
        let mut sealed = Vec::with_capacity(n as usize);
        let written = copy
            .seal(&self.key, at, &mut sealed)
            .map_err(|e| e.to_string())
            .and_then(|g| {
                self.file
                    .write_all_at(&sealed, at % self.cap)
                    .map(|()| g)
                    .map_err(|e| e.to_string())
            });
        match written {
            Ok(g) => {
                let mut r = self.lock();
                // Unless a wrap of the ring passed it while it was written.
                if at >= self.tail.load(Ordering::Acquire) {
                    r.bytes += g.len();
                    r.mem += g.bytes();
                    if let Some(old) = r.map.insert(key, Arc::new(g)) {
                        r.bytes -= old.len();
                        r.mem -= old.bytes();
                    }
                    self.counters.spilled.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                if !self.failed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "spilling compact copies to {} stopped: {e}; reads go on from the repository",
                        self.dir.display()
                    );
                }
            }
        }
    }

    /// Bytes `from..from + dst.len()` of the chunk at group offset
    /// `slice` (`len` bytes, id starting with `prefix`) of `g`, the copy
    /// of `key`: `Ok(true)` if copied into `dst`, `Ok(false)` if the copy
    /// cannot serve them (written over, unreadable or damaged: the caller
    /// reads the record), `Err` what is wrong with the chunk itself.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read(
        &self,
        key: u64,
        g: &SpilledGroup,
        slice: u32,
        len: u32,
        prefix: &[u8; PREFIX_LEN],
        from: usize,
        dst: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> Result<bool, String> {
        let (i, a, n) = g.locate(slice, len, prefix)?;
        let stale = || g.at() < self.tail.load(Ordering::Acquire);
        if stale() {
            return Ok(false);
        }
        let pos = (g.at() + u64::from(a)) % self.cap;
        BUFS.with(|b| {
            let (sealed, plain) = &mut *b.borrow_mut();
            sealed.resize(n as usize, 0);
            let read = self.file.read_exact_at(sealed, pos);
            if stale() {
                return Ok(false);
            }
            let why = match read {
                Err(e) => e.to_string(),
                Ok(()) => {
                    if g.read(i, sealed, &self.key, from, dst, plain, scratch)? {
                        self.counters.hits.fetch_add(1, Ordering::Relaxed);
                        return Ok(true);
                    }
                    if stale() {
                        return Ok(false);
                    }
                    "its bytes do not authenticate".to_string()
                }
            };
            self.counters.damaged.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "spilled copy at {pos} of the file in {}: {why}; read from the repository instead",
                self.dir.display()
            );
            let mut r = self.lock();
            if r.map.get(&key).is_some_and(|c| c.at() == g.at()) {
                if let Some(c) = r.map.remove(&key) {
                    r.bytes -= c.len();
                    r.mem -= c.bytes();
                }
            }
            Ok(false)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use crate::{Volume, VolumeOptions};
    use cairn_blockdev::BlockDev;
    use cairn_store::{backup, BackupOptions, Repository};
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;

    /// 4 MiB: random bytes between runs of text, stored in 128 KiB groups.
    fn image() -> (tempfile::TempDir, Arc<Repository>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(&dir.path().join("repo"), &[], None).unwrap();
        let mut data = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        while data.len() < 4 << 20 {
            for _ in 0..3000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                data.push(x as u8);
            }
            data.extend(b"a line of text that compresses well. ".repeat(200));
        }
        let lock = repo.session("test").unwrap();
        let opts = BackupOptions {
            name: "img".into(),
            codec: "zstd:3".parse().unwrap(),
            chunker: "cdc:4K,16K,64K".parse().unwrap(),
            threads: 2,
            group_size: 128 << 10,
            source: "test".into(),
            progress: None,
            time: None,
            tags: Vec::new(),
        };
        backup(&repo, &lock, &mut std::io::Cursor::new(data.clone()), &opts).unwrap();
        drop(lock);
        (dir, Arc::new(repo), data)
    }

    fn check_random(v: &Volume, data: &[u8], seed: u64, n: usize) {
        let mut x = seed | 1;
        let mut buf = vec![0u8; 4096];
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % (data.len() as u64 - 4096)) as usize;
            v.read_at(&mut buf, off as u64).unwrap();
            assert!(buf == data[off..off + 4096], "bytes at {off}");
        }
    }

    #[test]
    fn damaged_spilled_copies_are_said_and_read_from_the_repository() {
        let (dir, repo, data) = image();
        let opts = VolumeOptions {
            cache_bytes: 300 << 10,
            compact_bytes: 100 << 10,
            spill_bytes: 64 << 20,
            spill_dir: Some(dir.path().join("spill")),
            readahead: 1 << 20,
            threads: 0,
        };
        let v = Volume::open(repo, "img", &opts).unwrap();
        check_random(&v, &data, 1, 3000);
        let before = v.stats();
        assert!(before.spilled > 10, "{before:?}");
        // Every byte written so far turned over.
        let spill = v.cache.spill.as_ref().unwrap();
        let len = spill.file.metadata().unwrap().len();
        let mut all = vec![0u8; len as usize];
        spill.file.read_exact_at(&mut all, 0).unwrap();
        for b in &mut all {
            *b = !*b;
        }
        spill.file.write_all_at(&all, 0).unwrap();
        // Reads stay right, and the damage is counted once per copy: a
        // damaged copy is dropped, the record decoded again.
        check_random(&v, &data, 2, 3000);
        let hit = v.stats();
        assert!(hit.spill_damaged > 0, "{hit:?}");
        assert!(hit.spill_damaged <= before.spilled, "{hit:?}");
        assert!(hit.misses > before.misses, "{hit:?}");
        check_random(&v, &data, 3, 3000);
        let after = v.stats();
        assert_eq!(after.spill_damaged, hit.spill_damaged, "{after:?}");
        assert!(after.spill_hits > hit.spill_hits, "{after:?}");
    }
}
