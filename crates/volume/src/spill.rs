//! The third tier: compact copies spilled to local disk.
//!
//! The compact tier ([`cairn_store::CompactGroup`]) keeps random reads of
//! an image at LZ4's speed as long as the copies fit in its memory (1 GiB
//! by default, about 3 GiB of an OS image). An image whose randomly read
//! part is bigger fell back to decoding a whole 2 MiB zstd group per 4 KiB
//! read, a fifth of qemu-nbd on a compressed qcow2. Here the copies the
//! compact tier evicts go on to a file on local disk, where the page cache
//! keeps the hot ones in memory the kernel can take back (unless that file
//! system is itself memory: tmpfs), and a cold one costs a read of one
//! chunk's compact bytes (about a third of a 32 KiB chunk of an OS image)
//! instead of a decode of 2 MiB.
//!
//! - **A ring, written in order.** The file is a ring of the tier's size:
//!   each copy is written whole after the last, and the copies it comes
//!   to overwrite are dropped first (first in, first out: a copy read
//!   often is not moved back to memory, and once the ring has gone round
//!   its record is decoded again and spilled anew, once a lap). Addresses grow without end; the
//!   place in the file is the address modulo the size, and no copy
//!   straddles the end. There is no allocator and no fragmentation, and
//!   the file never grows past its size. A copy is never given a place a
//!   write still under way will write (it is not spilled instead).
//! - **Sealed under a key of the volume.** Each chunk's bytes are
//!   encrypted and authenticated (AES-256-GCM) with a random key made with
//!   the file and never stored ([`cairn_store::SpillKey`]), its address
//!   the nonce, each address sealed once. An encrypted repository's data
//!   is so never on local disk in the clear; a flipped bit on that disk,
//!   or a place rewritten by a later copy while a reader still held the
//!   old one, does not open, and the read goes to the repository instead.
//!   Damage is said (`tracing`) and counted, never served.
//! - **Written by a thread of its own.** The reader whose decode evicted
//!   a copy hands it over and goes on; when the writer is behind by
//!   [`QUEUE`] copies, the reader writes its copy itself (bounded memory).
//!   A copy whose place a write still under way has not finished with is
//!   not spilled (counted as `skipped`).
//! - **Read without readahead** (`posix_fadvise` `RANDOM`): a read
//!   wants one chunk's few KiB, and the kernel's readahead around it read
//!   and cached three times the bytes (os3.img in a 640 MiB box: 555 k
//!   reads of 13.7 GB from the disk in 30 s at 44.2 k IOPS, against 249 k
//!   of 4.6 GB at 65.5 k IOPS without it).
//! - **Unlinked from the start** (`tempfile`: `O_TMPFILE` where the file
//!   system has it, else created and removed at once; NFS keeps such a
//!   file as `.nfs*` while it is open): nothing is left behind by a crash,
//!   and nothing but this process can open it by name.
//! - **Made on the first copy, bounded, and its space taken then.** Its
//!   size is `--image-spill`, at most what the image's copies can fill and
//!   (with this process's other spill files) half of the space free where
//!   it lives; its blocks are allocated when it is made (`fallocate`; a
//!   file system that cannot gets no spill tier), so it does not run that
//!   disk out of space later (on a copy-on-write file system, btrfs, a
//!   lap's rewrites need fresh space all the same: a write that fails
//!   for it ends spilling, as any failed write). A failed write or read (an I/O error) is
//!   said and ends spilling (`failed`; a failed read also counts its copy
//!   as damaged); copies already there are still read (each checked as
//!   ever).
//!
//! Written by hand: a ring of sealed records over one file is a few dozen
//! lines, and it shares its keys and records with `cairn_store`.

use cairn_store::{CompactGroup, SpillKey, SpilledGroup, PREFIX_LEN};
use crossbeam_channel::{bounded, Sender, TrySendError};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Copies bigger than this share of the ring are not spilled (one copy
/// would push out too much).
const MAX_SHARE: u64 = 2;
/// The least size worth a spill file when free space cuts it down.
const MIN_CAP: u64 = 64 << 20;
/// Copies waiting for the writer thread at most.
const QUEUE: usize = 8;

/// Bytes allocated by the spill files of this process now: together they
/// take at most half of the space that was free (with them counted as
/// free), however many images open one.
static ALLOCATED: Mutex<u64> = Mutex::new(0);

/// A volume's spill tier, made on its first copy: an image only streamed
/// (or read where both tiers in front hold it) takes no disk at all.
pub(crate) struct LazySpill {
    dir: PathBuf,
    asked: u64,
    image: u64,
    cell: OnceLock<Option<Spill>>,
}

impl LazySpill {
    /// A tier of `asked` bytes in `dir` for an image of `image` bytes, not
    /// made yet.
    pub(crate) fn new(dir: PathBuf, asked: u64, image: u64) -> LazySpill {
        LazySpill {
            dir,
            asked,
            image,
            cell: OnceLock::new(),
        }
    }

    /// The tier, if it has been made.
    pub(crate) fn get(&self) -> Option<&Spill> {
        self.cell.get()?.as_ref()
    }

    /// The tier, made now if it has not been (where it cannot be, that is
    /// said once and the volume does without).
    pub(crate) fn make(&self) -> Option<&Spill> {
        self.cell
            .get_or_init(|| match Spill::create(&self.dir, self.asked, self.image) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(
                        "no spill tier in {}: {e}; random reads past --image-compact-cache decode whole groups",
                        self.dir.display()
                    );
                    None
                }
            })
            .as_ref()
    }
}

thread_local! {
    /// A thread's buffer for sealed bytes read back.
    static SEALED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// A reader's buffer for a copy it writes itself.
    static INLINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// One copy handed over is done with, however its write ended (a panic
/// too, or a queue dropped with copies in it: [`Spill::settle`] waits for
/// the count to fall).
struct Done(Arc<Shared>);

/// A copy handed to the writer thread.
type Job = (u64, Arc<CompactGroup>, Done);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Release);
    }
}

struct Ring {
    /// The address the next copy is written at.
    head: u64,
    map: HashMap<u64, Arc<SpilledGroup>>,
    /// Copies in the order they were written: key, address.
    order: VecDeque<(u64, u64)>,
    /// Addresses of the writes under way.
    writing: Vec<u64>,
    /// Bytes on disk of the copies in `map`.
    bytes: u64,
    /// Bytes in memory of the copies in `map`.
    mem: usize,
}

impl Ring {
    /// The address for a copy of record `key` of `n` bytes in a ring of
    /// `cap`, and the lowest address left intact once it is written; the
    /// copies it will write over are dropped, and it is marked as written
    /// ([`Ring::written`] unmarks it). `None`: it would write over a write
    /// still under way (or `key` has a copy): not spilled.
    fn reserve(&mut self, key: u64, n: u64, cap: u64) -> Option<(u64, u64)> {
        if self.map.contains_key(&key) {
            return None;
        }
        let mut at = self.head;
        let off = at % cap;
        if off + n > cap {
            at += cap - off;
        }
        let end = at + n;
        let floor = end.saturating_sub(cap);
        if self.writing.iter().any(|&w| w < floor) {
            return None;
        }
        self.head = end;
        while let Some(&(k, a)) = self.order.front() {
            if a >= floor {
                break;
            }
            self.order.pop_front();
            self.drop_copy(k, a);
        }
        self.order.push_back((key, at));
        self.writing.push(at);
        Some((at, floor))
    }

    /// The write at `at` is over (done or failed).
    fn written(&mut self, at: u64) {
        self.writing.retain(|&w| w != at);
    }

    /// Drop the copy of `key` if it is the one at `at`; whether it was.
    fn drop_copy(&mut self, key: u64, at: u64) -> bool {
        if self.map.get(&key).is_none_or(|g| g.at() != at) {
            return false;
        }
        if let Some(g) = self.map.remove(&key) {
            self.bytes -= g.len();
            self.mem -= g.bytes();
        }
        true
    }
}

/// Counters of the spill tier.
#[derive(Default)]
pub(crate) struct SpillCounters {
    pub hits: AtomicU64,
    pub spilled: AtomicU64,
    pub damaged: AtomicU64,
    /// Copies not spilled: the ring would have written over a write
    /// still under way.
    pub skipped: AtomicU64,
}

/// What the reader threads and the writer thread share.
struct Shared {
    file: File,
    dir: PathBuf,
    cap: u64,
    key: SpillKey,
    ring: Mutex<Ring>,
    /// Copies at addresses below this may have been written over.
    tail: AtomicU64,
    /// A write or a read failed: spill no more.
    failed: AtomicBool,
    /// A copy too big for the ring was refused (said once).
    too_big: AtomicBool,
    /// Copies handed over and not yet written.
    pending: AtomicUsize,
    counters: SpillCounters,
}

/// The spill tier of one volume.
pub(crate) struct Spill {
    shared: Arc<Shared>,
    /// To the writer thread (taken on drop, which ends it).
    queue: Option<Sender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

/// The size of a spill file asked to be `asked` bytes for an image of
/// `image` bytes, where `free` bytes are free and this process's other
/// spill files have `allocated`; `None`: not worth a file. Copies are the
/// image's chunks (LZ4 or as they are) plus 16 bytes a chunk of sealing;
/// the files take half of what is free (theirs counted as free), but not
/// so little that it is not worth it (unless that little was asked for).
fn size(asked: u64, image: u64, free: u64, allocated: u64) -> Option<u64> {
    let room = (free.saturating_add(allocated) / 2).saturating_sub(allocated);
    let cap = asked.min(image + image / 64 + (1 << 20)).min(room);
    (cap >= asked.min(MIN_CAP).min(image).max(1)).then_some(cap)
}

impl Drop for Spill {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(w) = self.writer.take() {
            // The writer only writes; a panic there has nothing to hand on.
            let _ = w.join();
        }
        let mut allocated = ALLOCATED.lock().unwrap_or_else(|p| p.into_inner());
        *allocated = allocated.saturating_sub(self.shared.cap);
    }
}

impl Spill {
    /// A spill tier of `asked` bytes in an unlinked file in `dir`
    /// (created if need be) for the copies of an image of `image` bytes
    /// (see [`size`]), its blocks allocated now, so that what it writes
    /// later never runs the disk out of space.
    fn create(dir: &Path, asked: u64, image: u64) -> std::io::Result<Spill> {
        std::fs::create_dir_all(dir)?;
        let key = SpillKey::new().map_err(std::io::Error::other)?;
        let mut allocated = ALLOCATED.lock().unwrap_or_else(|p| p.into_inner());
        let free = cairn_store::free_space(dir).ok_or_else(|| {
            std::io::Error::other("the space free there cannot be told (statvfs failed)")
        })?;
        let Some(cap) = size(asked, image, free, *allocated) else {
            return Err(std::io::Error::other(format!(
                "{} MiB free there, and {} MiB taken by this process's other spill files",
                free >> 20,
                *allocated >> 20
            )));
        };
        let file = tempfile::tempfile_in(dir)?;
        if !cairn_blockdev::allocate(&file, cap)? {
            return Err(std::io::Error::other(
                "the file system there cannot allocate a file's space ahead (fallocate)",
            ));
        }
        cairn_blockdev::read_at_random(&file)?;
        let shared = Arc::new(Shared {
            file,
            dir: dir.to_path_buf(),
            cap,
            key,
            ring: Mutex::new(Ring {
                head: 0,
                map: HashMap::new(),
                order: VecDeque::new(),
                writing: Vec::new(),
                bytes: 0,
                mem: 0,
            }),
            tail: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            too_big: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            counters: SpillCounters::default(),
        });
        let (tx, rx) = bounded::<Job>(QUEUE);
        let writer = std::thread::Builder::new()
            .name("cairn-spill".into())
            .spawn(move || {
                let mut buf = Vec::new();
                for (key, copy, done) in rx {
                    done.0.write(key, &copy, &mut buf);
                }
            })?;
        *allocated += cap;
        Ok(Spill {
            shared,
            queue: Some(tx),
            writer: Some(writer),
        })
    }

    /// Its size on disk.
    pub(crate) fn cap(&self) -> u64 {
        self.shared.cap
    }

    /// Its counters.
    pub(crate) fn counters(&self) -> &SpillCounters {
        &self.shared.counters
    }

    /// Whether writing stopped after an I/O error.
    pub(crate) fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::Relaxed)
    }

    /// Bytes held on disk, and in memory.
    pub(crate) fn held(&self) -> (u64, usize) {
        let r = self.shared.lock();
        (r.bytes, r.mem)
    }

    /// Whether `key` has a copy here.
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.shared.lock().map.contains_key(&key)
    }

    /// The copy of `key`, if there is one.
    pub(crate) fn get(&self, key: u64) -> Option<Arc<SpilledGroup>> {
        self.shared.lock().map.get(&key).cloned()
    }

    /// Spill `copy`, the compact copy of the record `key`: handed to the
    /// writer thread, or written now if that is [`QUEUE`] copies behind.
    pub(crate) fn put(&self, key: u64, copy: Arc<CompactGroup>) {
        if self.shared.failed.load(Ordering::Relaxed) {
            return;
        }
        let Some(queue) = &self.queue else {
            return;
        };
        self.shared.pending.fetch_add(1, Ordering::Relaxed);
        let job = (key, copy, Done(self.shared.clone()));
        let (key, copy, done) = match queue.try_send(job) {
            Ok(()) => return,
            Err(TrySendError::Full(j) | TrySendError::Disconnected(j)) => j,
        };
        INLINE.with(|b| self.shared.write(key, &copy, &mut b.borrow_mut()));
        drop(done);
    }

    /// Wait until every copy handed over has been written (or refused),
    /// for at most a minute; whether they were.
    pub(crate) fn settle(&self) -> bool {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.shared.pending.load(Ordering::Acquire) > 0 {
            if std::time::Instant::now() > until {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
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
        let sh = &*self.shared;
        let (i, a, n) = g.locate(slice, len, prefix)?;
        let stale = || {
            let gone = g.at() < sh.tail.load(Ordering::Acquire);
            if gone {
                // Written over: not damage. (A reader took it from the
                // map before the ring came round; it is gone from there.)
                sh.lock().drop_copy(key, g.at());
            }
            gone
        };
        if stale() {
            return Ok(false);
        }
        let pos = (g.at() + u64::from(a)) % sh.cap;
        SEALED.with(|b| {
            let sealed = &mut *b.borrow_mut();
            sealed.resize(n as usize, 0);
            let read = sh.file.read_exact_at(sealed, pos);
            if stale() {
                return Ok(false);
            }
            let why = match read {
                Err(e) => {
                    sh.failed.store(true, Ordering::Relaxed);
                    format!("{e} (spilling stopped)")
                }
                Ok(()) => {
                    if g.read(i, sealed, &sh.key, from, dst, scratch)? {
                        sh.counters.hits.fetch_add(1, Ordering::Relaxed);
                        return Ok(true);
                    }
                    if stale() {
                        return Ok(false);
                    }
                    "its bytes do not authenticate".to_string()
                }
            };
            // Said and counted once, by the reader that drops it.
            if sh.lock().drop_copy(key, g.at()) {
                sh.counters.damaged.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "spilled copy at {pos} of the file in {}: {why}; read from the repository instead",
                    sh.dir.display()
                );
            }
            Ok(false)
        })
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        // No code that can panic runs under this lock.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Write `copy` of record `key` at the ring's head (sealed into
    /// `buf`), dropping the copies it overwrites, and publish it.
    fn write(&self, key: u64, copy: &CompactGroup, buf: &mut Vec<u8>) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let n = copy.sealed_len() as u64;
        if n == 0 {
            return;
        }
        if n > self.cap / MAX_SHARE {
            if !self.too_big.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "a compact copy of {} KiB is over half the {} KiB spill file in {}: such copies are not spilled",
                    n >> 10,
                    self.cap >> 10,
                    self.dir.display()
                );
            }
            return;
        }
        let at = {
            let mut r = self.lock();
            if r.map.contains_key(&key) {
                return;
            }
            let Some((at, floor)) = r.reserve(key, n, self.cap) else {
                self.counters.skipped.fetch_add(1, Ordering::Relaxed);
                return;
            };
            // Before the write: a reader of an overwritten copy finds it
            // below the tail (and its bytes would not open anyway).
            self.tail.fetch_max(floor, Ordering::Release);
            at
        };
        // Unmarked however this ends, a panic too: a mark left behind
        // would stop every write a lap later.
        struct Mark<'a>(&'a Shared, u64);
        impl Drop for Mark<'_> {
            fn drop(&mut self) {
                self.0.lock().written(self.1);
            }
        }
        let mark = Mark(self, at);
        buf.clear();
        let written = copy
            .seal(&self.key, at, buf)
            .map_err(|e| e.to_string())
            .and_then(|g| {
                // Its place and nonces were given for `n` bytes.
                if buf.len() as u64 != n {
                    return Err(format!("a copy sealed to {} bytes, not {n}", buf.len()));
                }
                self.file
                    .write_all_at(buf, at % self.cap)
                    .map(|()| g)
                    .map_err(|e| e.to_string())
            });
        // Unmarked and published at once: a reservation that passes it
        // from here on finds it to drop.
        let mut r = self.lock();
        r.written(at);
        std::mem::forget(mark);
        match written {
            Ok(g) => {
                r.bytes += g.len();
                r.mem += g.bytes();
                if let Some(old) = r.map.insert(key, Arc::new(g)) {
                    r.bytes -= old.len();
                    r.mem -= old.bytes();
                }
                self.counters.spilled.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                drop(r);
                if !self.failed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "spilling compact copies to {} stopped: {e}; copies already there are still read",
                        self.dir.display()
                    );
                }
            }
        }
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
    fn a_write_under_way_is_never_written_over() {
        let mut r = super::Ring {
            head: 0,
            map: Default::default(),
            order: Default::default(),
            writing: Vec::new(),
            bytes: 0,
            mem: 0,
        };
        // A ring of 100: A at 0 still being written, B at 40 done.
        assert_eq!(r.reserve(1, 40, 100), Some((0, 0)));
        assert_eq!(r.reserve(2, 40, 100), Some((40, 0)));
        r.written(40);
        // C does not fit before the end: the next lap, from 100 to 140,
        // would write over A (0..40) while it is written: not spilled,
        // and the head stays.
        assert_eq!(r.reserve(3, 40, 100), None);
        assert_eq!(r.head, 80);
        // Once A is done, C goes there, and A and B are in its way only
        // as far as it reaches: A's entry is dropped from the order.
        r.written(0);
        assert_eq!(r.reserve(3, 40, 100), Some((100, 40)));
        assert_eq!(r.order.iter().map(|o| o.0).collect::<Vec<_>>(), [2, 3]);
        // D fits from 140 to 180: B (40..80) is written over in part.
        r.written(100);
        assert_eq!(r.reserve(4, 40, 100), Some((140, 80)));
        assert_eq!(r.order.iter().map(|o| o.0).collect::<Vec<_>>(), [3, 4]);
    }

    #[test]
    fn spill_files_take_at_most_half_of_the_free_space_together() {
        use super::size;
        const G: u64 = 1 << 30;
        // Asked for, bounded by the image's copies, or by half the room.
        assert_eq!(size(8 * G, 100 * G, 100 * G, 0), Some(8 * G));
        assert_eq!(size(8 * G, G, 100 * G, 0), Some(G + G / 64 + (1 << 20)));
        assert_eq!(size(8 * G, 100 * G, 10 * G, 0), Some(5 * G));
        // Others of this process already hold 4 GiB of 20 (16 free): the
        // whole is 20, so half of it is 10, 6 of that left.
        assert_eq!(size(8 * G, 100 * G, 16 * G, 4 * G), Some(6 * G));
        // They hold their half: nothing left, however much is asked.
        assert_eq!(size(8 * G, 100 * G, 10 * G, 10 * G), None);
        // Under 64 MiB left is not worth a file, unless less was asked.
        assert_eq!(size(8 * G, 100 * G, 100 << 20, 0), None);
        assert_eq!(size(1 << 20, 100 * G, 100 << 20, 0), Some(1 << 20));
        // A small image needs only a small file.
        assert_eq!(
            size(8 * G, 10 << 20, 30 << 20, 0),
            Some((11 << 20) + (10 << 14))
        );
        assert_eq!(size(8 * G, 0, 0, 0), None);
    }

    /// The image served with tiers small enough that most copies are
    /// spilled to a ring of `ring` bytes, after 3,000 random reads.
    fn spilled(ring: u64) -> (tempfile::TempDir, Volume, Vec<u8>) {
        let (dir, repo, data) = image();
        let opts = VolumeOptions {
            cache_bytes: 300 << 10,
            compact_bytes: 100 << 10,
            spill_bytes: ring,
            spill_dir: Some(dir.path().join("spill")),
            readahead: 1 << 20,
            threads: 0,
        };
        let v = Volume::open(repo, "img", &opts).unwrap();
        check_random(&v, &data, 1, 3000);
        assert!(v.settle_spill());
        (dir, v, data)
    }

    #[test]
    fn copies_written_over_while_held_are_read_from_the_repository_not_as_damage() {
        // A ring of 1 MiB for about 2 MiB of copies.
        let (_dir, v, data) = spilled(1 << 20);
        let spill = &v.cache.spill.as_ref().unwrap().get().unwrap().shared;
        let held: Vec<_> = spill
            .lock()
            .map
            .iter()
            .map(|(k, g)| (*k, g.clone()))
            .collect();
        assert!(held.len() > 3, "{}", held.len());
        // The ring goes round more than once: every copy held is written
        // over, and its place taken by others.
        let at = spill.lock().head;
        let mut seed = 2;
        while spill.lock().head < at + 2 * spill.cap {
            assert!(seed < 200, "the ring does not go round");
            check_random(&v, &data, seed, 500);
            assert!(v.settle_spill());
            seed += 1;
        }
        // As if readers had taken them from the map just before: put them
        // back, and read everything again.
        {
            let mut r = spill.lock();
            for (k, g) in &held {
                r.bytes += g.len();
                r.mem += g.bytes();
                if let Some(old) = r.map.insert(*k, g.clone()) {
                    r.bytes -= old.len();
                    r.mem -= old.bytes();
                }
            }
        }
        check_random(&v, &data, 99, 3000);
        assert!(v.settle_spill());
        let st = v.stats();
        assert_eq!(st.spill_damaged, 0, "{st:?}");
    }

    #[test]
    fn damaged_spilled_copies_are_said_and_read_from_the_repository() {
        let (_dir, v, data) = spilled(64 << 20);
        let before = v.stats();
        assert!(before.spilled > 10, "{before:?}");
        // Every byte written so far turned over.
        let spill = &v.cache.spill.as_ref().unwrap().get().unwrap().shared;
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
        assert!(v.settle_spill());
        let hit = v.stats();
        assert!(hit.spill_damaged > 0, "{hit:?}");
        assert!(hit.spill_damaged <= before.spilled, "{hit:?}");
        assert!(hit.misses > before.misses, "{hit:?}");
        check_random(&v, &data, 3, 3000);
        assert!(v.settle_spill());
        let after = v.stats();
        assert_eq!(after.spill_damaged, hit.spill_damaged, "{after:?}");
        assert!(after.spill_hits > hit.spill_hits, "{after:?}");
    }
}
