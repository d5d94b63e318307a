//! The caches of a volume's records: CLOCK over a ring, bounded by bytes,
//! with one slot per record that readers of the same record wait on. The
//! same code holds decoded groups and their compact (LZ4) copies.

use crate::packs::GroupError;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What loading a record gave.
pub(crate) type Loaded<T> = Result<Arc<T>, GroupError>;

/// What a cache holds: something that says how much memory it takes.
pub(crate) trait Weigh {
    fn bytes(&self) -> usize;
}

impl Weigh for cairn_store::Group {
    fn bytes(&self) -> usize {
        self.bytes()
    }
}

impl Weigh for cairn_store::CompactGroup {
    fn bytes(&self) -> usize {
        self.bytes()
    }
}

/// The cache key of a record: its pack number and offset.
pub(crate) fn key(pack: u32, offset: u32) -> u64 {
    u64::from(pack) << 32 | u64::from(offset)
}

/// One record's place in the cache. The `OnceLock` is the in-flight
/// state: the first thread to call `get_or_init` decodes, every other
/// reader of the same record blocks in `get_or_init` until it is done, so
/// a record is decoded once however many readers want it.
pub(crate) struct Slot<T> {
    key: u64,
    cell: OnceLock<Loaded<T>>,
    /// CLOCK's reference bit: set on every hit, cleared as the hand
    /// passes; a slot is evicted when the hand finds it clear.
    referenced: AtomicBool,
    /// Bytes counted for it, 0 until its loader has counted them (only
    /// changed under the cache lock).
    size: AtomicUsize,
    /// Worth keeping in a second tier once evicted (set by the reader
    /// that created it: a random read, not a stream).
    keep: AtomicBool,
}

impl<T> Slot<T> {
    /// The loaded group, loading it with `load` if nobody has; the flag
    /// says whether this call did the loading.
    pub(crate) fn get_or_load(&self, load: impl FnOnce() -> Loaded<T>) -> (Loaded<T>, bool) {
        let mut ran = false;
        let r = self.cell.get_or_init(|| {
            ran = true;
            load()
        });
        (r.clone(), ran)
    }

    /// Whether it is loaded (successfully or not).
    pub(crate) fn is_loaded(&self) -> bool {
        self.cell.get().is_some()
    }

    /// Mark it worth a second tier once evicted.
    pub(crate) fn keep(&self) {
        self.keep.store(true, Ordering::Relaxed);
    }
}

struct Inner<T> {
    map: HashMap<u64, Arc<Slot<T>>>,
    /// The CLOCK ring: the front is under the hand.
    ring: VecDeque<Arc<Slot<T>>>,
    bytes: usize,
}

/// Counters, for tests and `cairn` to show.
#[derive(Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    pub ahead: AtomicU64,
    pub queued: AtomicU64,
    /// Reads served from a second tier (see [`Cache::peek`]).
    pub second: AtomicU64,
}

/// The cache.
pub(crate) struct Cache<T> {
    cap: usize,
    inner: Mutex<Inner<T>>,
    pub counters: Counters,
}

impl<T: Weigh> Cache<T> {
    pub(crate) fn new(cap: usize) -> Cache<T> {
        Cache {
            cap,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                ring: VecDeque::new(),
                bytes: 0,
            }),
            counters: Counters::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        // No code that can panic runs under this lock, so a poisoned
        // lock still guards consistent state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot of `key`, created empty if there is none; the flag says
    /// whether it was created. A readahead slot starts referenced so that
    /// it survives one pass of the hand before its reader comes.
    pub(crate) fn slot(&self, key: u64, ahead: bool) -> (Arc<Slot<T>>, bool) {
        let mut g = self.lock();
        if let Some(s) = g.map.get(&key) {
            s.referenced.store(true, Ordering::Relaxed);
            return (s.clone(), false);
        }
        let s = Arc::new(Slot {
            key,
            cell: OnceLock::new(),
            referenced: AtomicBool::new(ahead),
            size: AtomicUsize::new(0),
            keep: AtomicBool::new(false),
        });
        g.map.insert(key, s.clone());
        g.ring.push_back(s.clone());
        (s, true)
    }

    /// Drop an empty slot that will not be loaded after all.
    pub(crate) fn forget(&self, slot: &Arc<Slot<T>>) {
        let mut g = self.lock();
        if !slot.is_loaded() && g.map.get(&slot.key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            g.map.remove(&slot.key);
            g.ring.retain(|s| !Arc::ptr_eq(s, slot));
        }
    }

    /// What `key` holds if it is loaded (and loaded well), marking it
    /// used (and worth a second tier, with `keep`); never creates a slot
    /// nor waits.
    pub(crate) fn peek(&self, key: u64, keep: bool) -> Option<Arc<T>> {
        let g = self.lock();
        let s = g.map.get(&key)?;
        let got = s.cell.get()?.as_ref().ok()?.clone();
        s.referenced.store(true, Ordering::Relaxed);
        if keep {
            s.keep();
        }
        Some(got)
    }

    /// Whether `key` has a slot (loaded or in flight).
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.lock().map.contains_key(&key)
    }

    /// Called once by the thread that loaded `slot`: count its bytes and
    /// evict down to the bound, or drop it if the load failed (so that a
    /// later read tries again: an I/O error may be transient). Returns
    /// the evicted entries marked to keep ([`Slot::keep`]), with their
    /// keys, for a second tier.
    pub(crate) fn loaded(&self, slot: &Arc<Slot<T>>) -> Vec<(u64, Arc<T>)> {
        let mut g = self.lock();
        let live = g.map.get(&slot.key).is_some_and(|s| Arc::ptr_eq(s, slot));
        match slot.cell.get() {
            Some(Ok(group)) if live => {
                let n = group.bytes().max(1);
                slot.size.store(n, Ordering::Relaxed);
                g.bytes += n;
            }
            _ => {
                if live {
                    g.map.remove(&slot.key);
                }
                // Rare (a failed load): a linear sweep is fine.
                g.ring.retain(|s| !Arc::ptr_eq(s, slot));
                return Vec::new();
            }
        }
        self.evict(&mut g)
    }

    fn evict(&self, g: &mut Inner<T>) -> Vec<(u64, Arc<T>)> {
        let mut kept = Vec::new();
        // Each slot is passed at most twice (once to clear its bit, once
        // to evict it); slots still in flight are skipped, so bound the
        // sweep rather than spin when every slot is in flight.
        let mut budget = 2 * g.ring.len() + 1;
        while g.bytes > self.cap && budget > 0 {
            budget -= 1;
            let Some(s) = g.ring.pop_front() else {
                break;
            };
            if !g.map.get(&s.key).is_some_and(|m| Arc::ptr_eq(m, &s)) {
                continue;
            }
            let size = s.size.load(Ordering::Relaxed);
            if size == 0 {
                // In flight, or loaded but not yet counted by its loader.
                g.ring.push_back(s);
            } else if s.referenced.swap(false, Ordering::Relaxed) {
                g.ring.push_back(s);
            } else {
                g.bytes -= size;
                g.map.remove(&s.key);
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                if s.keep.load(Ordering::Relaxed) {
                    if let Some(Ok(v)) = s.cell.get() {
                        kept.push((s.key, v.clone()));
                    }
                }
            }
        }
        kept
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Whether it has reached its bound (it evicted something, so a new
    /// entry evicts another: entries only leave by eviction).
    pub(crate) fn full(&self) -> bool {
        self.counters.evictions.load(Ordering::Relaxed) > 0
    }
}
