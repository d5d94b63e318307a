//! Writers' pacing and the measured speed of the backing device: how fast
//! new blocks may enter the log while writeback drains it (Linux's
//! `balance_dirty_pages` shape), and whether the backing device is fast
//! enough for writes to go around the cache. See the crate doc, "Smooth
//! admission" and "Around the cache to a fast backing device".

use crate::{lock, Inner, State, DATA_BLOCKS};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Blocks a writeback batch must have written before its own rate is
/// trusted for pacing (before that, the last batches' rate is used).
pub(crate) const PACE_SAMPLE: u64 = 32;
/// Paced writers sleep only once their slot is this far ahead: a sleep
/// of microseconds costs more than it waits (timer slack), so shorter
/// gaps accumulate in the pacing clock until they are worth a sleep.
const PACE_MIN_SLEEP: Duration = Duration::from_millis(1);
/// Weight of a new sample in [`Inner::backing_fast`]'s average: 1/16.
const BACKING_AVG_SHIFT: u32 = 4;
/// Samples of the backing device's speed before it may count as fast.
const BACKING_MIN_SAMPLES: u64 = 8;
/// The least pacing factor: near a full ring writers still trickle in
/// (a full ring stops them in `insert` until a batch ends).
const PACE_MIN_FACTOR: f64 = 0.05;

impl Inner {
    /// Blocks that can still be logged before the ring is full: the room
    /// in the open segment and the segments after it up to the watermark.
    pub(crate) fn free_blocks(&self, st: &State) -> u64 {
        let segs = (st.clean_id + self.segment_count).saturating_sub(st.open.id);
        let open_room = DATA_BLOCKS.saturating_sub(st.open.data_used()) as u64;
        segs * DATA_BLOCKS as u64 + open_room
    }

    /// The rate (blocks per second) at which writers may log new blocks,
    /// as Linux paces writers of dirty pages: the writeback speed (of the
    /// running batch once it has written [`PACE_SAMPLE`] blocks, else of
    /// the last batches) times a factor of how full the ring is. With
    /// `x` the part of the ring not free and `s` the setpoint halfway
    /// between [`WbConfig::dirty_high`] and full, the factor is
    /// `1 + ((s - x) / (1 - s))^3`: 2 at `dirty_high`, 1 at the setpoint
    /// (writers go exactly as fast as writeback), falling steeply to 0 as
    /// the ring fills. None: no pacing (below `dirty_high`, or no
    /// writeback speed measured yet).
    fn admission_rate(&self, st: &State) -> Option<f64> {
        let mut rate = st.wb_rate;
        if rate <= 0.0 {
            // The first batch: its own speed so far.
            if let Some(b) = st.wb_batch {
                let done = self.wb_done.load(Ordering::Relaxed).saturating_sub(b.base);
                let secs = b.started.elapsed().as_secs_f64();
                if done >= PACE_SAMPLE && secs > 0.0 {
                    rate = done as f64 / secs;
                }
            }
        }
        if rate <= 0.0 || !rate.is_finite() {
            return None;
        }
        let ring = (self.segment_count * DATA_BLOCKS as u64) as f64;
        let x = 1.0 - self.free_blocks(st) as f64 / ring;
        let low = self.cfg.dirty_high.clamp(0.0, 0.9);
        if x < low {
            return None;
        }
        let set = (1.0 + low) / 2.0;
        let factor = (1.0 + ((set - x) / (1.0 - set)).powi(3)).clamp(PACE_MIN_FACTOR, 2.0);
        Some(rate * factor)
    }

    /// Recompute the pacing rate writers read (under the state lock).
    pub(crate) fn update_pace(&self, st: &State) {
        let rate = self.admission_rate(st).unwrap_or(0.0);
        self.pace_rate.store(rate.to_bits(), Ordering::Relaxed);
    }

    /// Smooth admission: once the ring is [`WbConfig::dirty_high`] full,
    /// writes go in one after another at [`Inner::admission_rate`], so a
    /// load faster than the backing device gets that device's speed with
    /// even latencies. Without it, writers fill the ring at full speed and
    /// then all wait for a whole batch (seconds over a disk).
    pub(crate) fn pace(&self, blocks: u64) {
        let rate = f64::from_bits(self.pace_rate.load(Ordering::Relaxed));
        if rate <= 0.0 {
            return;
        }
        let now = Instant::now();
        let mut next = lock(&self.pace_next);
        let at = (*next).max(now);
        // At most a second per request: the rate is positive and finite,
        // but a tiny one must not overflow the clock.
        let step = Duration::try_from_secs_f64(blocks as f64 / rate)
            .map_or(Duration::from_secs(1), |d| d.min(Duration::from_secs(1)));
        *next = at + step;
        drop(next);
        if at >= now + PACE_MIN_SLEEP {
            std::thread::sleep(at - now);
        }
    }

    /// One sample of the backing device's speed: the time it spent per
    /// write (Little's law: a write's time over the writes in flight with
    /// it for a bypassed one, a batch's time over its writes for
    /// writeback), so that a device kept busy by many writes at once is
    /// not taken for a slow one. Each sample counts as fast or slow; the
    /// device is fast while most recent samples are ([`Inner::fast_backing`]):
    /// a median, not a mean, so the odd write stuck behind an fsync does
    /// not flip it.
    pub(crate) fn note_backing(&self, per_write: Duration) {
        let fast = per_write < self.cfg.bypass_below;
        let old = self.backing_fast.load(Ordering::Relaxed);
        let new = old - (old >> BACKING_AVG_SHIFT)
            + if fast {
                1 << (16 - BACKING_AVG_SHIFT)
            } else {
                0
            };
        self.backing_fast.store(new, Ordering::Relaxed);
        self.backing_samples.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the backing device takes writes faster than
    /// [`WbConfig::bypass_below`], as measured so far (off when zero).
    pub(crate) fn fast_backing(&self) -> bool {
        !self.cfg.bypass_below.is_zero()
            && self.backing_samples.load(Ordering::Relaxed) >= BACKING_MIN_SAMPLES
            && self.backing_fast.load(Ordering::Relaxed) >= 1 << 15
    }
}
