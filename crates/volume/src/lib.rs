//! # cairn-volume
//!
//! A snapshot of an image in a cairn repository, seen as a read-only
//! [`BlockDev`]: what the NBD server exports when a user asks to mount,
//! copy or boot a backup without restoring it first.
//!
//! ```no_run
//! # fn main() -> Result<(), cairn_store::StoreError> {
//! use cairn_blockdev::BlockDev;
//! use std::sync::Arc;
//! let repo = Arc::new(cairn_store::Repository::open("/backup/repo".as_ref())?);
//! let vol = cairn_volume::Volume::open(repo, "vm@3", &Default::default())?;
//! let mut sector = [0u8; 512];
//! vol.read_at(&mut sector, 0).ok();
//! # Ok(()) }
//! ```
//!
//! ## Design decisions
//!
//! - **The lookup table costs 12 bytes per extent.** A volume keeps, per
//!   extent of the manifest, its start offset (`u64`) and the position of
//!   its chunk in the repository's sorted in-memory index (`u32`), in two
//!   flat vectors (no padding, no per-entry allocation); an offset is
//!   found by bisection. The manifest itself (40 bytes an extent in
//!   memory) is dropped after open: the record location comes from the
//!   index position, the chunk length from the next start, and the chunk
//!   id is checked through the 152-bit id prefix the index keeps (the
//!   store's own identity rule, see `cairn_store::PREFIX_LEN`) and
//!   the full id in the record's chunk table, whose BLAKE3 is verified.
//!   A 1 TiB image of 32 KiB chunks costs 384 MiB of table, against the
//!   1.25 GiB its manifest would. The manifest is read again only to name
//!   a damaged chunk in full in an error message.
//! - **One index for many volumes.** [`RepoView`] registers a reader's session,
//!   then loads the index once (32 bytes per chunk of the repository);
//!   every volume opened from it shares that index and also takes a read
//!   lock of its own for its whole life, so `gc` never deletes a pack
//!   under a reader.
//! - **The cache holds decoded groups, bounded by bytes, with CLOCK.**
//!   Chunks are compressed in groups of about 2 MiB, and a group is the
//!   unit that costs something to get (one read and one decode), so the
//!   cache holds whole decoded groups keyed by pack and record offset;
//!   deduplicated chunks and neighbouring small reads hit the same entry.
//!   CLOCK rather than strict LRU: a hit sets a bit and moves nothing, so
//!   the common case needs only a short map lookup under the lock. The
//!   bound is on bytes (default 256 MiB), not entries, because group sizes
//!   vary from one chunk to 8 MiB. Groups in use by a reader stay alive
//!   after eviction until it is done, so the true peak is the bound plus
//!   one group per reading thread.
//! - **A second tier keeps compact copies of what random reads used.**
//!   A 4 KiB read that misses the decoded cache costs the decode of a
//!   whole group (2 MiB of zstd: milliseconds), so once an image's
//!   randomly read part outgrows the decoded cache, random reads ran at a
//!   fifth of qemu-nbd on a compressed qcow2, whose clusters are 64 KiB.
//!   Smaller groups or trained dictionaries cost 4-17 % of repository size
//!   (`docs/benchmarks.md`). Instead, a group evicted from the decoded
//!   cache that a random read had loaded is compressed again, chunk by
//!   chunk, with LZ4 ([`cairn_store::CompactGroup`]) into a second cache
//!   (default 1 GiB, about 3 GiB of OS image); a later read decodes only
//!   the head of one chunk (32 KiB on average) at LZ4's speed. Groups
//!   only streams used (readahead, or reads moving a stream forward from
//!   about where it got to) are not
//!   copied: a sequential pass over a big image would pay an LZ4 pass per
//!   group for copies nobody reads. Once the second tier is full it makes
//!   new copies only while its hits keep pace with its evictions, so a
//!   working set far bigger than both tiers does not pay for copies it
//!   never reads (one refused copy in 32 is made anyway, so a new hot
//!   set still gets in). Copies keep each chunk's check state; a chunk not yet
//!   checked is decoded whole and hashed on its first read from a copy.
//! - **A third tier spills compact copies to local disk.** An image whose
//!   randomly read part outgrows the compact tier fell back to decoding
//!   whole groups again (2.4k IOPS on a 1.5 GB OS image with a 64 MiB
//!   compact tier, against 88k with the spill: docs/benchmarks.md). Copies the compact tier
//!   evicts go on to a ring in an unlinked file, written by a thread of
//!   its own and sealed under a key of the volume (see the `spill` module
//!   and docs/format/repository.md); the page cache keeps the hot part in
//!   memory the kernel can take back.
//! - **Decode once, however many readers.** A cache entry is created
//!   before its group is decoded, holding a `OnceLock`: the first reader
//!   (or readahead thread) decodes, the others block on it. Failed loads
//!   are not cached, so a transient I/O error is retried by the next read.
//! - **Verify on first serve.** A record's CRC-32C and lengths are
//!   checked when it is decoded; each chunk's BLAKE3 is checked the first
//!   time a read touches it (one atomic state per chunk), so a random 4 KiB
//!   read hashes one chunk, not the whole 2 MiB group. Damage is reported
//!   as [`ErrorKind::Corrupt`] naming the image, offset and chunk; wrong
//!   bytes are never returned.
//! - **Readahead follows streams, on a pool.** Reads are matched against
//!   a few tracked streams (a read starting within one readahead window of
//!   where a stream got to continues it, because the parallel requests of
//!   nbdcopy or `qemu-img convert` arrive slightly out of order). From the
//!   second continuing read on, the records of the next window (default
//!   16 MiB, at most half the cache) are queued for decoding on a pool of
//!   threads (default: one per core), so a sequential reader finds decoded
//!   groups. A random read far from every stream schedules nothing. The
//!   queue is short and never waited on: when it is full, readahead simply
//!   stops where it got to. Only reads that move a stream forward count,
//!   so a reader going back and forth in one place is not "sequential". A
//!   request spanning several records also has its later records (those
//!   big enough, 64 KiB stored, to be worth a hand-off) decoded in
//!   parallel while the caller does the first. Records with a compact
//!   copy are not queued: reading from the copy is cheaper than decoding.
//!
//! Written by hand: the repository format is cairn's own, and the cache
//! needs the in-flight state tied to it.

mod ahead;
mod binding;
mod cache;
mod map;
mod overlay;
mod packs;
mod spill;
mod writable;

use ahead::{Job, Pool, Streams};
pub use binding::CacheBinding;
use cache::{key, Cache, Loaded, Slot};
use cairn_blockdev::{
    check_range, read_only, BlockDev, BlockError, BlockSizes, Caps, ErrorKind, Extent, Op,
    ZeroFlags,
};
use cairn_store::LoadedIndex;
use cairn_store::Session;
use cairn_store::{CompactGroup, Group, Repository, Result};
use map::{ExtentMap, HOLE, MISSING};
use std::cell::RefCell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
pub use writable::{WritableStats, WritableVolume};

/// Most extents one `extents` call reports (a device may stop early).
pub(crate) const MAX_EXTENTS: usize = 1 << 16;
/// Records queued for background decoding at most. Deep enough for a
/// whole readahead window of small records (a queue of one request's
/// worth would only ever hold what the reader is about to decode itself);
/// the memory bound is the window, not this.
const QUEUE_DEPTH: usize = 4096;
/// Records of a request smaller than this (stored bytes) are decoded by
/// the reader itself: handing them to another thread costs about as much
/// as decoding them, and the reader would get there first anyway.
const MIN_PARALLEL_RECORD: u32 = 64 << 10;

/// How a volume caches and reads ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeOptions {
    /// Bytes of decoded groups to keep (default 256 MiB).
    pub cache_bytes: usize,
    /// Bytes of compact copies (chunk by chunk LZ4) of groups that random
    /// reads loaded, kept once the decoded copy is evicted (default 1
    /// GiB; 0: none).
    pub compact_bytes: usize,
    /// Bytes of local disk for the compact copies the compact tier
    /// evicts (default 0: none; `cairn serve` spills 8 GiB), at most
    /// about the image's size and, with the process's other spill files,
    /// half of what is free there; taken when the first copy is spilled
    /// (see the `spill` module). Needs a compact tier.
    pub spill_bytes: u64,
    /// Where the spilled copies go (an unlinked file in it); `None`:
    /// cairn's cache directory ([`cairn_store::cache_root`]).
    pub spill_dir: Option<std::path::PathBuf>,
    /// Bytes to decode ahead of a sequential reader (default 16 MiB; 0
    /// turns readahead off). Capped at half of `cache_bytes`, so readahead
    /// never evicts what it just decoded.
    pub readahead: u64,
    /// Background decoding threads (default: one per core; 0: none, every
    /// record is decoded by the reader that needs it).
    pub threads: usize,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions {
            cache_bytes: 256 << 20,
            compact_bytes: 1 << 30,
            spill_bytes: 0,
            spill_dir: None,
            readahead: 16 << 20,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

/// A repository opened for reading volumes: a reader's session, and the index
/// loaded once under it and shared by every volume opened from here.
pub struct RepoView {
    repo: Arc<Repository>,
    index: Arc<LoadedIndex>,
    _session: Session,
}

impl RepoView {
    /// Register a reader's session (gc deletes nothing it may use while
    /// it lives), then load the index.
    pub fn open(repo: Arc<Repository>) -> Result<RepoView> {
        let lock = repo.session("serving images")?;
        let loaded = repo.load_index()?;
        // Served without a file's entries, its chunks would read as
        // missing (I/O errors to a guest) for as long as the server runs.
        loaded.check_read()?;
        let index = Arc::new(loaded);
        Ok(RepoView {
            repo,
            index,
            _session: lock,
        })
    }

    /// Register a reader's session and use `index` (a writer's index,
    /// already in memory) instead of loading one.
    pub fn with_index(repo: Arc<Repository>, index: LoadedIndex) -> Result<RepoView> {
        let lock = repo.session("serving an image")?;
        Ok(RepoView {
            repo,
            index: Arc::new(index),
            _session: lock,
        })
    }

    /// The repository.
    pub fn repository(&self) -> &Arc<Repository> {
        &self.repo
    }

    /// The index (its `damaged` list names damaged index files: chunks
    /// only they knew read as missing).
    pub fn index(&self) -> &Arc<LoadedIndex> {
        &self.index
    }

    /// Open `spec` (`NAME`, `NAME@N` or `NAME@latest`) as a volume.
    pub fn volume(&self, spec: &str, opts: &VolumeOptions) -> Result<Volume> {
        Volume::open_with(self, spec, opts)
    }
}

/// Cache and readahead figures of a volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeStats {
    /// Reads of a record served from the cache (or from a decode another
    /// thread was already doing).
    pub hits: u64,
    /// Records a reader had to read and decode itself.
    pub misses: u64,
    /// Records queued for decoding in the background (readahead, and the
    /// later records of a request spanning several).
    pub queued: u64,
    /// Records the background threads decoded before any reader needed
    /// them (the rest of the queued ones were decoded by their reader
    /// first, or are still queued).
    pub readahead: u64,
    /// Groups evicted from the cache.
    pub evictions: u64,
    /// Bytes of decoded groups in the cache now.
    pub cached_bytes: usize,
    /// Reads of a chunk served from a compact copy.
    pub compact_hits: u64,
    /// Compact copies made (groups evicted that random reads had loaded).
    pub compacted: u64,
    /// Bytes of compact copies held now.
    pub compact_bytes: usize,
    /// Reads of a chunk served from a copy spilled to disk.
    pub spill_hits: u64,
    /// Copies spilled to disk.
    pub spilled: u64,
    /// Spilled copies found damaged or unreadable (read from the
    /// repository instead).
    pub spill_damaged: u64,
    /// Copies not spilled because the ring would have written over a
    /// write still under way.
    pub spill_skipped: u64,
    /// Spilling stopped after an I/O error (said on stderr).
    pub spill_failed: bool,
    /// Bytes on disk of the spilled copies held now.
    pub spill_bytes: u64,
    /// Bytes in memory of what says where they are.
    pub spill_memory: usize,
    /// The spill tier's size on disk (0: none).
    pub spill_capacity: u64,
    /// Heap bytes of the offset → chunk table.
    pub map_bytes: usize,
}

thread_local! {
    /// A reader thread's buffer for decoding compact chunks.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// A thread's LZ4 state for making compact copies.
    static LZ4: RefCell<cairn_codec::lz4_ffi::Compressor> = RefCell::new(Default::default());
}

/// A volume's two caches: decoded groups, and compact copies of the
/// groups random reads loaded, made when their decoded copy is evicted.
pub(crate) struct Tiers {
    pub decoded: Cache<Group>,
    pub compact: Option<Cache<CompactGroup>>,
    /// Where the compact tier's evicted copies go on.
    pub spill: Option<spill::LazySpill>,
    /// Reads served by compact copies, less [`COPY_COST`] for each copy
    /// made while the compact tier was full (each of which evicts
    /// another), at most [`CREDIT`]: once the tier is full, a copy is
    /// made only while copies still earn their keep. A working set far
    /// bigger than both tiers would otherwise pay an LZ4 pass per miss
    /// for copies evicted before anyone reads them.
    credit: AtomicI64,
    /// Copies refused for want of credit: one in [`RETRY`] is made
    /// anyway, so a tier filled by a phase of reads nobody repeats takes
    /// in the next phase's groups and earns credit again.
    refused: AtomicU64,
}

/// One in this many copies refused for want of credit is made anyway.
const RETRY: u64 = 32;
/// Credit a copy costs once the compact tier is full, in hits. An LZ4
/// pass over a group costs about 1.6-1.9 zstd decodes of it (perf of a
/// served image), but hits are also what the copies already in the tier
/// earn without any new one: at a cost of 1 or 2, a tier much smaller
/// than the random working set churned and gained nothing (64M tier on
/// os2.img, quick 15 s runs: 3.1-3.5k IOPS at 1, 3.3-3.4k at 2,
/// 3.8-5.0k at 8).
const COPY_COST: i64 = 8;

/// Most credit the compact tier saves up (see [`Tiers::credit`]).
const CREDIT: i64 = 256;

impl Tiers {
    fn new(decoded: usize, compact: usize, spill: Option<spill::LazySpill>) -> Tiers {
        let compact = (compact > 0).then(|| Cache::new(compact));
        Tiers {
            decoded: Cache::new(decoded),
            spill,
            compact,
            credit: AtomicI64::new(CREDIT),
            refused: AtomicU64::new(0),
        }
    }

    /// A read was served by a compact copy, in memory or spilled.
    fn copy_hit(&self) {
        if self.credit.load(Ordering::Relaxed) < CREDIT {
            self.credit.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The spill tier, if it has been made.
    fn spill(&self) -> Option<&spill::Spill> {
        self.spill.as_ref()?.get()
    }

    /// Whether record `key` has a compact copy, in memory or spilled.
    fn copied(&self, key: u64) -> bool {
        self.compact.as_ref().is_some_and(|c| c.contains(key))
            || self.spill().is_some_and(|s| s.contains(key))
    }

    /// A decoded group, if it is in the cache (a hit); `keep`: a random
    /// read uses it, so keep a compact copy once it is evicted.
    fn peek(&self, key: u64, keep: bool) -> Option<Arc<Group>> {
        let g = self.decoded.peek(key, keep)?;
        self.decoded.counters.hits.fetch_add(1, Ordering::Relaxed);
        Some(g)
    }

    /// Called once by the thread that loaded `slot` into the decoded
    /// cache: evict down to its bound, and make compact copies of the
    /// evicted groups that random reads had loaded (outside the lock: an
    /// LZ4 pass over a 2 MiB group takes a few milliseconds).
    pub(crate) fn loaded(&self, slot: &Arc<Slot<Group>>) {
        let evicted = self.decoded.loaded(slot);
        let Some(compact) = &self.compact else {
            return;
        };
        for (key, group) in evicted {
            if self.copied(key) {
                continue;
            }
            if compact.full() && self.credit.fetch_sub(COPY_COST, Ordering::Relaxed) < COPY_COST {
                self.credit.fetch_add(COPY_COST, Ordering::Relaxed);
                if self.refused.fetch_add(1, Ordering::Relaxed) % RETRY != RETRY - 1 {
                    continue;
                }
            }
            let (s, created) = compact.slot(key, false);
            if !created {
                continue;
            }
            if self.spill.is_some() {
                // Spilled once evicted from here.
                s.keep();
            }
            let (_, ran) = s.get_or_load(|| {
                LZ4.with(|c| group.compact(&mut c.borrow_mut()))
                    .map(Arc::new)
                    .ok_or_else(|| packs::GroupError {
                        io: None,
                        msg: "the group's chunk table runs past its bytes".into(),
                    })
            });
            if ran {
                compact.counters.misses.fetch_add(1, Ordering::Relaxed);
                let evicted = compact.loaded(&s);
                if let Some(spill) = self.spill.as_ref().filter(|_| !evicted.is_empty()) {
                    let Some(spill) = spill.make() else {
                        continue;
                    };
                    for (key, copy) in evicted {
                        spill.put(key, copy);
                    }
                }
            }
        }
    }
}

/// The spill tier `opts` ask for (made on its first copy), if there is a
/// place for it (where there is not, that is said).
fn open_spill(opts: &VolumeOptions, image: u64) -> Option<spill::LazySpill> {
    if opts.spill_bytes == 0 || opts.compact_bytes == 0 {
        return None;
    }
    let Some(dir) = opts.spill_dir.clone().or_else(cairn_store::cache_root) else {
        tracing::warn!(
            "no place to spill compact copies to: set CAIRN_CACHE_DIR (or XDG_CACHE_HOME, or HOME); random reads past --image-compact-cache decode whole groups"
        );
        return None;
    };
    Some(spill::LazySpill::new(dir, opts.spill_bytes, image))
}

/// A snapshot of an image as a read-only block device.
pub struct Volume {
    // Declared first so it is dropped first: its threads are joined
    // before the lock below is released.
    pool: Option<Pool>,
    name: String,
    snapshot: u64,
    created: i64,
    size: u64,
    map: ExtentMap,
    packs: Arc<packs::Packs>,
    cache: Arc<Tiers>,
    streams: Streams,
    repo: Arc<Repository>,
    /// Damaged records whose chunks were read from other copies (see
    /// [`Volume::read_other_copy`]).
    recovered: cairn_store::DamagedRecords,
    _session: Session,
}

impl Volume {
    /// Open `spec` (`NAME`, `NAME@N` or `NAME@latest`) in `repo`, loading
    /// the index for this volume alone (use [`RepoView`] to share it).
    pub fn open(repo: Arc<Repository>, spec: &str, opts: &VolumeOptions) -> Result<Volume> {
        RepoView::open(repo)?.volume(spec, opts)
    }

    /// Open `spec` with the index `view` loaded.
    pub fn open_with(view: &RepoView, spec: &str, opts: &VolumeOptions) -> Result<Volume> {
        let repo = view.repo.clone();
        let lock = repo.session(&format!("serving {spec}"))?;
        let (name, snapshot) = repo.resolve(spec)?;
        let manifest = repo.read_manifest(&name, snapshot)?;
        let map = ExtentMap::build(&manifest, &view.index.index)?;
        let size = manifest.size;
        let created = manifest.created;
        drop(manifest);
        let packs = Arc::new(packs::Packs::new(repo.clone(), view.index.clone()));
        let cache = Arc::new(Tiers::new(
            opts.cache_bytes,
            opts.compact_bytes,
            open_spill(opts, size),
        ));
        let window = opts.readahead.min(opts.cache_bytes as u64 / 2);
        let pool = (opts.threads > 0)
            .then(|| Pool::new(opts.threads, QUEUE_DEPTH, packs.clone(), cache.clone()));
        Ok(Volume {
            pool,
            name,
            snapshot,
            created,
            size,
            map,
            packs,
            cache,
            streams: Streams::new(window),
            repo,
            recovered: Default::default(),
            _session: lock,
        })
    }

    /// The image name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The snapshot number.
    pub fn snapshot(&self) -> u64 {
        self.snapshot
    }

    /// When the snapshot was made (its manifest's time, Unix seconds).
    pub fn created(&self) -> i64 {
        self.created
    }

    /// Extents (chunks and holes) in the image.
    pub fn extent_count(&self) -> usize {
        self.map.len()
    }

    /// The extent holding `offset` (clamped to the image): its start,
    /// end, and whether it is a hole.
    pub(crate) fn extent_at(&self, offset: u64) -> (u64, u64, bool) {
        let k = self.map.find(offset.min(self.size.saturating_sub(1)));
        (self.map.start(k), self.map.end(k), self.map.pos(k) == HOLE)
    }

    /// Wait until the compact copies handed to the spill tier are
    /// written (its writer thread works behind the readers), for at most
    /// a minute; whether they were.
    pub fn settle_spill(&self) -> bool {
        self.cache.spill().is_none_or(|s| s.settle())
    }

    /// Cache and readahead figures so far.
    pub fn stats(&self) -> VolumeStats {
        let c = &self.cache.decoded.counters;
        let compact = self.cache.compact.as_ref();
        let spill = self.cache.spill();
        let held = spill.map_or((0, 0), |s| s.held());
        VolumeStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            queued: c.queued.load(Ordering::Relaxed),
            readahead: c.ahead.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            cached_bytes: self.cache.decoded.bytes(),
            compact_hits: c.second.load(Ordering::Relaxed),
            compacted: compact.map_or(0, |t| t.counters.misses.load(Ordering::Relaxed)),
            compact_bytes: compact.map_or(0, |t| t.bytes()),
            spill_hits: spill.map_or(0, |s| s.counters().hits.load(Ordering::Relaxed)),
            spilled: spill.map_or(0, |s| s.counters().spilled.load(Ordering::Relaxed)),
            spill_damaged: spill.map_or(0, |s| s.counters().damaged.load(Ordering::Relaxed)),
            spill_skipped: spill.map_or(0, |s| s.counters().skipped.load(Ordering::Relaxed)),
            spill_failed: spill.is_some_and(|s| s.failed()),
            spill_bytes: held.0,
            spill_memory: held.1,
            spill_capacity: spill.map_or(0, |s| s.cap()),
            map_bytes: self.map.heap_bytes(),
        }
    }

    /// The decoded group holding `loc`, from the cache or decoded now;
    /// `keep`: a random read wants it, so keep a compact copy once it is
    /// evicted (also if readahead loaded it: a stride of small reads uses
    /// groups that readahead decodes).
    fn group(&self, loc: cairn_store::Location, keep: bool) -> Loaded<Group> {
        let (slot, _) = self.cache.decoded.slot(key(loc.pack, loc.offset), false);
        if keep {
            slot.keep();
        }
        let (got, ran) = slot.get_or_load(|| self.packs.load(loc).map(Arc::new));
        let c = &self.cache.decoded.counters;
        if ran {
            c.misses.fetch_add(1, Ordering::Relaxed);
            self.cache.loaded(&slot);
        } else {
            c.hits.fetch_add(1, Ordering::Relaxed);
        }
        got
    }

    /// Queue for decoding the records of `from..to` that have no cache
    /// entry. For the caller's own request (`own`), the first record is
    /// left out (the caller decodes it) and so are small ones. Returns
    /// where it stopped: `to`, or earlier if the queue was full.
    fn prefetch(&self, from: u64, to: u64, own: bool) -> u64 {
        let mut skip_first = own;
        let Some(pool) = &self.pool else {
            return to;
        };
        let to = to.min(self.size);
        if from >= to {
            return to;
        }
        let index = &self.packs.index().index;
        let mut last = None;
        let mut k = self.map.find(from);
        while k < self.map.len() && self.map.start(k) < to {
            let p = self.map.pos(k);
            if let Some(loc) = (p < MISSING)
                .then(|| index.location_at(p as usize))
                .flatten()
            {
                let key = key(loc.pack, loc.offset);
                if last != Some(key) {
                    last = Some(key);
                    if skip_first {
                        skip_first = false;
                    } else if (!own || loc.len >= MIN_PARALLEL_RECORD) && !self.cache.copied(key) {
                        let (slot, created) = self.cache.decoded.slot(key, true);
                        if created {
                            if let Err(job) = pool.try_send(Job { slot, loc }) {
                                self.cache.decoded.forget(&job.slot);
                                return self.map.start(k).max(from);
                            }
                            self.cache
                                .decoded
                                .counters
                                .queued
                                .fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            k += 1;
        }
        to
    }

    /// Bytes `from..from + dst.len()` of a chunk (`clen` bytes, id
    /// `prefix`) from its record at `loc`: from the group `held` by this
    /// request, the caches, or decoded now (then held). The error is its
    /// message and I/O kind ([`Volume::damaged`] makes it a request's).
    #[allow(clippy::too_many_arguments)]
    fn read_chunk(
        &self,
        loc: cairn_store::Location,
        prefix: &[u8; cairn_store::PREFIX_LEN],
        clen: u32,
        from: usize,
        dst: &mut [u8],
        random: bool,
        held: &mut Option<(u64, Arc<packs::Group>)>,
    ) -> std::result::Result<(), (String, Option<std::io::ErrorKind>)> {
        let n = dst.len();
        let key = key(loc.pack, loc.offset);
        let group = match &*held {
            Some((hk, g)) if *hk == key => Some(g.clone()),
            _ => self.cache.peek(key, random),
        };
        if let Some(group) = group {
            let chunk = group
                .chunk(loc.slice, clen, prefix)
                .map_err(|m| (m, None))?;
            dst.copy_from_slice(&chunk[from..from + n]);
            *held = Some((key, group));
            return Ok(());
        }
        if let Some(cg) = self.cache.compact.as_ref().and_then(|c| c.peek(key, false)) {
            self.cache
                .decoded
                .counters
                .second
                .fetch_add(1, Ordering::Relaxed);
            self.cache.copy_hit();
            return SCRATCH
                .with(|b| cg.read(loc.slice, clen, prefix, from, dst, &mut b.borrow_mut()))
                .map_err(|m| (m, None));
        }
        if let Some((spill, g)) = self.cache.spill().and_then(|s| Some((s, s.get(key)?))) {
            let served = SCRATCH
                .with(|b| {
                    spill.read(
                        key,
                        &g,
                        loc.slice,
                        clen,
                        prefix,
                        from,
                        dst,
                        &mut b.borrow_mut(),
                    )
                })
                .map_err(|m| (m, None))?;
            if served {
                self.cache.copy_hit();
                return Ok(());
            }
        }
        let group = self.group(loc, random).map_err(|e| (e.msg, e.io))?;
        let chunk = group
            .chunk(loc.slice, clen, prefix)
            .map_err(|m| (m, None))?;
        dst.copy_from_slice(&chunk[from..from + n]);
        *held = Some((key, group));
        Ok(())
    }

    /// [`Volume::read_chunk`] from another copy of the chunk (one stored
    /// twice, see `ChunkIndex::other_copies`), its copy at `first` having
    /// failed with `why` (empty: it failed before, and was said); whether
    /// one was sound. A warning says so, once per damaged record.
    #[allow(clippy::too_many_arguments)]
    fn read_other_copy(
        &self,
        first: cairn_store::Location,
        why: &str,
        prefix: &[u8; cairn_store::PREFIX_LEN],
        clen: u32,
        from: usize,
        dst: &mut [u8],
        random: bool,
    ) -> bool {
        let index = &self.packs.index().index;
        let read = |other: cairn_store::Location| {
            let group = self.group(other, random).ok()?;
            let chunk = group.chunk(other.slice, clen, prefix).ok()?;
            dst.copy_from_slice(&chunk[from..from + dst.len()]);
            Some(())
        };
        let say = |_| {
            tracing::warn!(
                "image {}@{}: chunk {}...: {why}; the chunks of that record are read from their \
                 other copies where they have one (`cairn verify --read-data` names the damage, \
                 `cairn repair` has the index use the sound copies)",
                self.name,
                self.snapshot,
                cairn_store::hex(prefix),
            );
        };
        self.recovered
            .from_other_copy(index, *prefix, first, read, say)
            .is_some()
    }

    /// The error for extent `k` being unreadable during a request.
    fn damaged(
        &self,
        k: usize,
        req: (u64, u64),
        msg: &str,
        io: Option<std::io::ErrorKind>,
    ) -> BlockError {
        let text = format!(
            "image {}@{} offset {}: chunk {}: {msg}",
            self.name,
            self.snapshot,
            self.map.start(k),
            self.chunk_name(k)
        );
        let kind = match io {
            None => ErrorKind::Corrupt(text),
            Some(kind) => ErrorKind::Io(std::io::Error::new(kind, text)),
        };
        BlockError::new(Op::Read, req.0, req.1, kind)
    }

    /// The full id of extent `k`'s chunk, from the manifest read again
    /// (errors are rare; keeping every id would triple the table), or
    /// the prefix the index holds if the manifest cannot be read.
    fn chunk_name(&self, k: usize) -> String {
        if let Ok(m) = self.repo.read_manifest(&self.name, self.snapshot) {
            if let Some(cairn_store::Extent::Data { id, .. }) = m.extents.get(k) {
                return id.to_string();
            }
        }
        let p = self.map.pos(k);
        match self.packs.index().index.prefix_at(p as usize) {
            Some(prefix) if p < MISSING => {
                let hex: String = prefix.iter().map(|b| format!("{b:02x}")).collect();
                format!("{hex}…")
            }
            _ => "(id unknown: the manifest cannot be read)".into(),
        }
    }
}

impl BlockDev for Volume {
    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        Caps {
            extents: true,
            multi_conn: true,
            ..Caps::default()
        }
    }

    fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum: 1,
            preferred: 4096,
            maximum: 32 << 20,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> cairn_blockdev::Result<()> {
        let len = buf.len() as u64;
        check_range(self.size, Op::Read, offset, len)?;
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset + len;
        let mut k = self.map.find(offset);
        if self.map.end(k) < end {
            self.prefetch(offset, end, true);
        }
        // Streams are followed with or without a pool to read ahead: a
        // read that continues one leaves no compact copy behind.
        let (streaming, ahead) = self.streams.on_read(offset, end);
        let random = !streaming;
        if let Some((stream, from, to)) = ahead {
            let reached = self.prefetch(from, to, false);
            if reached < to {
                self.streams.stopped_at(stream, reached);
            }
        }
        let index = &self.packs.index().index;
        let mut held: Option<(u64, Arc<packs::Group>)> = None;
        let mut at = offset;
        while at < end {
            let (s, e) = (self.map.start(k), self.map.end(k));
            let n = (e.min(end) - at) as usize;
            let dst = &mut buf[(at - offset) as usize..][..n];
            let p = self.map.pos(k);
            if p == HOLE {
                dst.fill(0);
            } else {
                let found = (p != MISSING)
                    .then(|| {
                        index
                            .location_at(p as usize)
                            .zip(index.prefix_at(p as usize))
                    })
                    .flatten();
                let Some((loc, prefix)) = found else {
                    return Err(self.damaged(
                        k,
                        (offset, len),
                        "the chunk is missing from the repository",
                        None,
                    ));
                };
                // Chunks are at most MAX_CHUNK (well under 4 GiB) long.
                let (clen, from) = ((e - s) as u32, (at - s) as usize);
                // Damaged where the index says: a chunk stored twice is
                // read from its other copy, as restore does.
                // (A record found damaged before goes to the copies first.)
                let known = self.recovered.contains(loc);
                let mut read = match known {
                    false => self.read_chunk(loc, &prefix, clen, from, dst, random, &mut held),
                    true => Err((String::new(), None)),
                };
                if let Err((why, _)) = &read {
                    if self.read_other_copy(loc, why, &prefix, clen, from, dst, random) {
                        read = Ok(());
                    } else if known {
                        // No sound copy of this chunk: its own error.
                        read = self.read_chunk(loc, &prefix, clen, from, dst, random, &mut held);
                    }
                }
                if let Err((why, io)) = read {
                    return Err(self.damaged(k, (offset, len), &why, io));
                }
            }
            at += n as u64;
            k += 1;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> cairn_blockdev::Result<()> {
        Err(read_only(Op::Write, offset, buf.len() as u64))
    }

    fn flush(&self) -> cairn_blockdev::Result<()> {
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, _fua: bool) -> cairn_blockdev::Result<()> {
        Err(read_only(Op::Trim, offset, len))
    }

    fn write_zeroes(&self, offset: u64, len: u64, _flags: ZeroFlags) -> cairn_blockdev::Result<()> {
        Err(read_only(Op::WriteZeroes, offset, len))
    }

    fn extents(&self, offset: u64, len: u64) -> cairn_blockdev::Result<Vec<Extent>> {
        check_range(self.size, Op::Extents, offset, len)?;
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        if len == 0 {
            return Ok(out);
        }
        let mut k = self.map.find(offset);
        let mut at = offset;
        while at < end {
            let n = self.map.end(k).min(end) - at;
            let hole = self.map.pos(k) == HOLE;
            let full = out.len() >= MAX_EXTENTS;
            match out.last_mut() {
                Some(last) if last.hole == hole => last.len += n,
                _ if full => break,
                _ => out.push(if hole {
                    Extent::hole(n)
                } else {
                    Extent::data(n)
                }),
            }
            at += n;
            k += 1;
        }
        Ok(out)
    }
}
