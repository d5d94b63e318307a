//! Writeback: the thread that takes the oldest written segments in
//! batches, sorts their newest block versions by address, writes them to
//! the backing device many at a time, flushes it and only then moves the
//! watermark. See the crate doc, "Sorted, batched writeback, many writes
//! in flight", for the rules (which version of a block may be skipped).

use crate::format::{segment_slot, Watermark};
use crate::throttle::PACE_SAMPLE;
use crate::{lock, Inner, Meta, Place, Result, State, WbError, WbWait, B, BU, SECTOR_SIZE};
use cairn_blockdev::{write_zeroes_by_writing, ErrorKind, ZeroFlags};
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The largest merged backing write writeback builds.
const MAX_MERGED_WRITE: usize = 8 << 20;
/// Writeback writes in flight to a backing device as fast as
/// [`crate::WbConfig::bypass_below`] (see [`crate::WbConfig::writeback_depth`]).
const FAST_DEPTH: usize = 4;
/// A writeback batch in progress: when it started, and
/// [`Inner::wb_done`] then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchProgress {
    pub(crate) started: Instant,
    pub(crate) base: u64,
}

impl Inner {
    /// Whether writeback should run now.
    pub(crate) fn want_writeback(&self, st: &State) -> bool {
        let dirty = st.last_written_id - st.clean_id;
        if dirty == 0 {
            return false;
        }
        let count = self.segment_count;
        dirty as f64 >= self.cfg.dirty_high * count as f64
            || st.open.id + 1 >= st.clean_id + count
            || st.drain_to > st.clean_id
            || st.last_write.elapsed() >= self.cfg.idle_writeback
    }

    /// The writeback thread. It sleeps until woken for work (segments
    /// written, the ring nearly full, a drain, stop), or, while dirty
    /// segments wait, until [`WbConfig::idle_writeback`] after the last
    /// write.
    pub(crate) fn writeback_loop(&self) {
        loop {
            let batch = {
                let mut st = lock(&self.state);
                loop {
                    if st.stop || st.error.is_some() {
                        return;
                    }
                    // The flush deadline: seal an open segment that has
                    // waited long enough (if there is room; else retry
                    // soon, writeback is making room).
                    let seal_at = if self.cfg.flush_deadline.is_zero() || st.open.entries.is_empty()
                    {
                        None
                    } else {
                        st.open_since
                            .and_then(|t| t.checked_add(self.cfg.flush_deadline))
                    };
                    let mut retry = None;
                    if seal_at.is_some_and(|t| t <= Instant::now()) {
                        if self.can_seal(&st) {
                            self.seal(&mut st, true);
                            continue;
                        }
                        retry = Instant::now().checked_add(Duration::from_millis(10));
                    }
                    if self.want_writeback(&st) {
                        break;
                    }
                    let idle = if st.last_written_id > st.clean_id {
                        st.last_write.checked_add(self.cfg.idle_writeback)
                    } else {
                        None
                    };
                    let deadline = [idle, retry.or(seal_at)].into_iter().flatten().min();
                    st = match deadline {
                        Some(d) => {
                            st.wb_wait = WbWait::Timed;
                            let left = d
                                .saturating_duration_since(Instant::now())
                                .max(Duration::from_millis(1));
                            self.wb_cv
                                .wait_timeout(st, left)
                                .map_or_else(|p| p.into_inner().0, |r| r.0)
                        }
                        None => {
                            st.wb_wait = WbWait::Untimed;
                            self.wb_cv.wait(st).unwrap_or_else(|p| p.into_inner())
                        }
                    };
                    st.wb_wait = WbWait::Busy;
                }
                self.collect_batch(&st)
            };
            if let Err(e) = self.write_back(batch) {
                let mut st = lock(&self.state);
                self.fail(&mut st, e);
                return;
            }
        }
    }

    /// Segments per writeback batch: [`WbConfig::batch`], but, unless
    /// draining, at most half the ring. The other half takes the writes
    /// that arrive while the batch is written (paced to last until it
    /// ends, see [`Inner::pace`]), so writers neither stop for a whole
    /// batch nor leave it small: a batch is sorted as one, and the more
    /// blocks it has, the closer together they lie on the disk.
    fn batch_segments(&self, st: &State) -> usize {
        if st.drain_to > st.clean_id {
            return self.cfg.batch.max(1);
        }
        let half = usize::try_from(self.segment_count / 2).unwrap_or(usize::MAX);
        self.cfg.batch.min(half).max(1)
    }

    fn collect_batch(&self, st: &State) -> Batch {
        // Per block, the newest version among the batch's segments that
        // must go to the backing device. A version is skipped only when a
        // newer one is durable in the log (a written and flushed segment
        // after it, which recovery replays): skipping it for a newer
        // version still in RAM, or written but not flushed, lost it at a
        // crash once the watermark moved past its segment (the newer one
        // died with the crash, the older one was never written back).
        let mut newest: HashMap<u64, Cand> = HashMap::default();
        let mut last = st.clean_id;
        for w in st.written.iter().take(self.batch_segments(st)) {
            last = w.id;
            for m in &w.entries {
                let Some(l) = st.index.get(&m.lba) else {
                    continue;
                };
                let (wanted, trim) = if l.seg == w.id {
                    (true, l.trim)
                } else {
                    (l.seg > st.durable_id, m.trim)
                };
                if wanted {
                    newest.insert(
                        m.lba,
                        Cand {
                            seg: w.id,
                            meta: *m,
                            trim,
                            buf: 0,
                        },
                    );
                }
            }
        }
        let mut cands: Vec<Cand> = newest.into_values().collect();
        cands.sort_unstable_by_key(|c| c.seg);
        Batch { last, cands }
    }

    /// Write one batch back, advance the watermark, drop its index entries.
    fn write_back(&self, mut batch: Batch) -> Result<()> {
        let batch_started = Instant::now();
        // Read the data blocks, one read per segment; each candidate then
        // points into its segment's buffer.
        let mut bufs: Vec<Vec<u8>> = Vec::new();
        let mut i = 0;
        while i < batch.cands.len() {
            let seg = batch.cands[i].seg;
            let mut j = i;
            let mut max = None;
            while j < batch.cands.len() && batch.cands[j].seg == seg {
                if let Some(d) = batch.cands[j].meta.data {
                    max = Some(max.map_or(d, |m: u16| m.max(d)));
                }
                j += 1;
            }
            if let Some(max) = max {
                let mut buf = vec![0u8; (usize::from(max) + 1) * BU];
                self.cache
                    .read_at(&mut buf, self.slot_off(seg, 0))
                    .map_err(|e| {
                        WbError::io(
                            Place::Segment {
                                id: seg,
                                slot: segment_slot(seg, self.segment_count),
                            },
                            e,
                        )
                    })?;
                for c in &mut batch.cands[i..j] {
                    c.buf = bufs.len();
                }
                bufs.push(buf);
            }
            i = j;
        }
        batch.cands.sort_by_key(|c| c.meta.lba);

        // Dirty sector runs (merged) and zero runs, in address order.
        let mut ops = WbOps::default();
        for c in &batch.cands {
            let base = c.meta.lba * B;
            match c.meta.data {
                None => ops.zero(base, (base + B).min(self.size), c.trim),
                Some(d) => {
                    let at = usize::from(d) * BU;
                    let block = &bufs[c.buf][at..at + BU];
                    let mut first = true;
                    let mut s = 0usize;
                    while s < 8 {
                        if c.meta.dirty & (1 << s) == 0 {
                            s += 1;
                            continue;
                        }
                        let mut e = s;
                        while e < 8 && c.meta.dirty & (1 << e) != 0 {
                            e += 1;
                        }
                        let off = base + s as u64 * SECTOR_SIZE;
                        let stop = (base + e as u64 * SECTOR_SIZE).min(self.size);
                        if off < stop {
                            ops.data(off, &block[s * 512..s * 512 + (stop - off) as usize], first);
                            first = false;
                        }
                        s = e;
                    }
                }
            }
        }
        {
            let mut st = lock(&self.state);
            st.wb_batch = Some(BatchProgress {
                started: Instant::now(),
                base: self.wb_done.load(Ordering::Relaxed),
            });
        }
        let started = Instant::now();
        let written = self.run_ops(&ops.ops);
        let took = started.elapsed();
        if written.is_ok() && !ops.ops.is_empty() {
            self.note_backing(took / u32::try_from(ops.ops.len()).unwrap_or(u32::MAX));
        }
        lock(&self.state).wb_batch = None;
        written?;
        self.backing
            .flush()
            .map_err(|e| WbError::io(Place::BackingFlush, e))?;

        // The watermark, then the cache flush that makes slot reuse safe.
        let seq = lock(&self.state).wm_seq + 1;
        let slot = Watermark::slot(seq);
        let wm = Watermark {
            seq,
            clean_id: batch.last,
        };
        self.cache
            .write_at(
                &wm.encode(&self.cache_id),
                crate::format::WATERMARK_OFFSETS[slot],
                false,
            )
            .map_err(|e| WbError::io(Place::Watermark { slot, seq }, e))?;
        self.cache
            .flush()
            .map_err(|e| WbError::io(Place::CacheFlush, e))?;

        let mut st = lock(&self.state);
        // The pace writers are admitted at: blocks per second of whole
        // batches, reading, flushes and watermark included, averaged.
        let secs = batch_started.elapsed().as_secs_f64();
        if secs > 0.0 && batch.cands.len() as u64 >= PACE_SAMPLE {
            let rate = batch.cands.len() as f64 / secs;
            st.wb_rate = if st.wb_rate > 0.0 {
                (st.wb_rate + rate) / 2.0
            } else {
                rate
            };
        }
        st.wm_seq = seq;
        st.clean_id = batch.last;
        while st.written.front().is_some_and(|w| w.id <= batch.last) {
            st.written.pop_front();
        }
        for c in &batch.cands {
            if st.index.get(&c.meta.lba).is_some_and(|l| l.seg == c.seg) {
                st.index.remove(&c.meta.lba);
            }
        }
        st.counters.written_back_blocks += batch.cands.len() as u64;
        st.counters.writeback_batches += 1;
        self.update_pace(&st);
        // Ring slots are free again (for blocked writers) and drain
        // callers wait for `clean_id`.
        self.notify_space(&st);
        self.notify_done(&st);
        Ok(())
    }

    /// Write `ops` to the backing device, `writeback_depth` at a time,
    /// taken in order (address order) by that many threads, so that the
    /// device's queue always holds the next sorted writes. Returns the
    /// first failure; after one, no further write starts.
    fn run_ops(&self, ops: &[WbOp<'_>]) -> Result<()> {
        let mut depth = self.cfg.writeback_depth;
        if self.fast_backing() {
            depth = depth.min(FAST_DEPTH);
        }
        let depth = depth.clamp(1, ops.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let first: Mutex<Option<WbError>> = Mutex::new(None);
        let work = || {
            let mut joined = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let Some(op) = ops.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return;
                };
                match self.write_op(op, &mut joined) {
                    Ok(()) => {
                        self.wb_done.fetch_add(op.blocks(), Ordering::Relaxed);
                    }
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        lock(&first).get_or_insert(e);
                        return;
                    }
                }
            }
        };
        std::thread::scope(|s| {
            for _ in 1..depth {
                // A thread that cannot start leaves its share to the others.
                let _ = std::thread::Builder::new()
                    .name("wbcache-wb".into())
                    .spawn_scoped(s, work);
            }
            work();
        });
        match first.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One writeback write: a run of dirty sectors (its parts joined in
    /// `joined` when there are several), or a run of zeroes.
    fn write_op(&self, op: &WbOp<'_>, joined: &mut Vec<u8>) -> Result<()> {
        match op {
            WbOp::Data { off, parts, .. } => {
                let buf: &[u8] = if parts.len() == 1 {
                    parts[0]
                } else {
                    joined.clear();
                    for p in parts {
                        joined.extend_from_slice(p);
                    }
                    joined
                };
                self.backing
                    .write_at(buf, *off, false)
                    .map_err(|e| WbError::io(Place::Backing { offset: *off }, e))
            }
            WbOp::Zero {
                start, end, trim, ..
            } => self.zero_run((*start, *end, *trim)),
        }
    }

    fn zero_run(&self, (start, end, trim): (u64, u64, bool)) -> Result<()> {
        let len = end - start;
        let place = Place::Backing { offset: start };
        let flags = ZeroFlags {
            fua: false,
            may_trim: trim,
            fast: false,
        };
        if self.backing.caps().zeroes {
            match self.backing.write_zeroes(start, len, flags) {
                Ok(()) => return Ok(()),
                Err(e) if matches!(e.kind, ErrorKind::Unsupported) => {}
                Err(e) => return Err(WbError::io(place, e)),
            }
        }
        write_zeroes_by_writing(&*self.backing, start, len, false)
            .map_err(|e| WbError::io(place, e))
    }
}

/// A block a writeback batch writes.
struct Cand {
    seg: u64,
    meta: Meta,
    trim: bool,
    /// Which of the batch's segment buffers holds its data block.
    buf: usize,
}

/// One write of a writeback batch.
enum WbOp<'a> {
    /// Consecutive dirty sectors at `off`: pieces of the segment buffers.
    Data {
        off: u64,
        parts: Vec<&'a [u8]>,
        len: usize,
        blocks: u64,
    },
    /// Blocks that read as zeroes, `start..end` (`trim`: all were trims).
    Zero {
        start: u64,
        end: u64,
        trim: bool,
        blocks: u64,
    },
}

impl WbOp<'_> {
    /// Cache blocks whose writeback this write completes (for pacing).
    fn blocks(&self) -> u64 {
        match self {
            WbOp::Data { blocks, .. } | WbOp::Zero { blocks, .. } => *blocks,
        }
    }
}

/// A batch's writes in address order, adjacent ones merged (up to
/// [`MAX_MERGED_WRITE`] for data).
#[derive(Default)]
struct WbOps<'a> {
    ops: Vec<WbOp<'a>>,
}

impl<'a> WbOps<'a> {
    /// Sectors `bytes` at `off`; `new_block`: the first piece of a block.
    fn data(&mut self, off: u64, bytes: &'a [u8], new_block: bool) {
        let n = u64::from(new_block);
        if let Some(WbOp::Data {
            off: o,
            parts,
            len,
            blocks,
        }) = self.ops.last_mut()
        {
            if *o + *len as u64 == off && *len < MAX_MERGED_WRITE {
                parts.push(bytes);
                *len += bytes.len();
                *blocks += n;
                return;
            }
        }
        self.ops.push(WbOp::Data {
            off,
            parts: vec![bytes],
            len: bytes.len(),
            blocks: n,
        });
    }

    /// A block at `start..end` that reads as zeroes.
    fn zero(&mut self, start: u64, end: u64, trim: bool) {
        if let Some(WbOp::Zero {
            end: e,
            trim: t,
            blocks,
            ..
        }) = self.ops.last_mut()
        {
            if *e == start {
                *e = end;
                *t &= trim;
                *blocks += 1;
                return;
            }
        }
        self.ops.push(WbOp::Zero {
            start,
            end,
            trim,
            blocks: 1,
        });
    }
}

pub(crate) struct Batch {
    last: u64,
    cands: Vec<Cand>,
}
