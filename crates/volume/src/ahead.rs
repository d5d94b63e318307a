//! Sequential-stream detection and the readahead thread pool.

use crate::cache::Slot;
use crate::packs::Packs;
use crate::Tiers;
use cairn_store::Group;
use cairn_store::Location;
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// How far past a stream's end a read may start and still continue it
/// (for [`Streams::on_read`]'s answer, not for readahead).
const NEAR: u64 = 256 << 10;

/// Streams tracked at once: enough for several connections each reading
/// its own part of the image (nbdcopy, `qemu-img convert -m`).
const STREAMS: usize = 8;

#[derive(Clone, Copy, Default)]
struct Stream {
    /// Highest end offset read so far.
    next: u64,
    /// Readahead has been scheduled up to here.
    ahead: u64,
    /// Reads that continued the stream.
    hits: u32,
    /// Last use, for replacing the stalest stream.
    used: u64,
}

/// Finds forward-moving streams among the reads.
pub(crate) struct Streams {
    window: u64,
    state: Mutex<(u64, [Stream; STREAMS])>,
}

impl Streams {
    pub(crate) fn new(window: u64) -> Streams {
        Streams {
            window,
            state: Mutex::new((0, [Stream::default(); STREAMS])),
        }
    }

    /// Note a read of `offset..end`. Returns whether it continues a
    /// stream (moves one forward, starting no further past where it got
    /// to than its own length or [`NEAR`]: requests of a parallel reader
    /// arrive a little out of order), and the range to read ahead with
    /// the stream it belongs to, once a stream has been moved forward
    /// twice by reads starting within a window of where it got to. With
    /// readahead off (a window of 0) every read is random.
    pub(crate) fn on_read(&self, offset: u64, end: u64) -> (bool, Option<(usize, u64, u64)>) {
        if self.window == 0 {
            return (false, None);
        }
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        let tick = g.0;
        let w = self.window;
        let found = g.1.iter().position(|s| {
            s.used != 0 && offset.saturating_add(w) >= s.next && offset <= s.next.saturating_add(w)
        });
        let Some(i) = found else {
            // Random access (or a new stream): take the stalest slot, and
            // read nothing ahead until the stream continues.
            let i = (0..STREAMS).min_by_key(|&i| g.1[i].used).unwrap_or(0);
            g.1[i] = Stream {
                next: end,
                ahead: end,
                hits: 0,
                used: tick,
            };
            return (false, None);
        };
        let s = &mut g.1[i];
        s.used = tick;
        // A read continues the stream only if it moves it forward from
        // about where it got to: one going back, or landing well past
        // the end (random reads near a recent one), is random.
        let streaming = end > s.next && offset <= s.next.saturating_add((end - offset).max(NEAR));
        // Only a read that moves the stream forward counts: a reader
        // going back and forth near one place is not sequential.
        if end > s.next {
            s.hits = s.hits.saturating_add(1);
            s.next = end;
        }
        let to = s.next.saturating_add(w);
        let from = s.ahead.max(s.next);
        if s.hits < 2 || from >= to {
            return (streaming, None);
        }
        s.ahead = to;
        (streaming, Some((i, from, to)))
    }

    /// Scheduling of stream `i`'s range stopped short at `reached` (the
    /// pool was busy): let the next read schedule the rest.
    pub(crate) fn stopped_at(&self, i: usize, reached: u64) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = g.1.get_mut(i) {
            s.ahead = s.ahead.min(reached);
        }
    }
}

/// A record to decode in the background.
pub(crate) struct Job {
    pub slot: Arc<Slot<Group>>,
    pub loc: Location,
}

/// Decoding threads fed by a short queue.
pub(crate) struct Pool {
    tx: Option<Sender<Job>>,
    closing: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// `threads` decoders taking records from a queue of `depth`.
    pub(crate) fn new(threads: usize, depth: usize, packs: Arc<Packs>, cache: Arc<Tiers>) -> Pool {
        let (tx, rx) = bounded::<Job>(depth.max(1));
        let closing = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .filter_map(|i| {
                let (rx, packs, cache, closing) =
                    (rx.clone(), packs.clone(), cache.clone(), closing.clone());
                std::thread::Builder::new()
                    .name(format!("volume-ahead-{i}"))
                    .spawn(move || work(&rx, &packs, &cache, &closing))
                    .ok()
            })
            .collect();
        Pool {
            tx: Some(tx),
            closing,
            threads,
        }
    }

    /// Queue `job`; gives it back if the queue is full (or no thread
    /// could be started).
    pub(crate) fn try_send(&self, job: Job) -> Result<(), Job> {
        match &self.tx {
            Some(tx) if !self.threads.is_empty() => tx.try_send(job).map_err(|e| match e {
                TrySendError::Full(j) | TrySendError::Disconnected(j) => j,
            }),
            _ => Err(job),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn work(rx: &Receiver<Job>, packs: &Packs, cache: &Tiers, closing: &AtomicBool) {
    for job in rx {
        if closing.load(Ordering::Relaxed) {
            continue;
        }
        let (_, ran) = job.slot.get_or_load(|| packs.load(job.loc).map(Arc::new));
        if ran {
            cache.decoded.counters.ahead.fetch_add(1, Ordering::Relaxed);
            cache.loaded(&job.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_moving_a_stream_on_from_where_it_got_count_as_streaming() {
        let st = Streams::new(16 << 20);
        let k = 4096;
        // A new stream is random; reads that follow it stream.
        assert!(!st.on_read(100 * k, 101 * k).0);
        assert!(st.on_read(101 * k, 102 * k).0);
        // A little out of order (a parallel reader): still the stream.
        assert!(st.on_read(104 * k, 105 * k).0);
        assert!(
            !st.on_read(102 * k, 103 * k).0,
            "behind the end: not forward"
        );
        // Within the window but far past the end, or behind it: random.
        assert!(!st.on_read(105 * k + (4 << 20), 106 * k + (4 << 20)).0);
        let st = Streams::new(16 << 20);
        st.on_read(0, 1 << 20);
        assert!(!st.on_read(0, k).0, "going back to the start");
        // A long read may start as far past the end as it is long.
        assert!(st.on_read(3 << 20, 5 << 20).0);
        // Readahead still follows sequential reads from the second one.
        let st = Streams::new(1 << 20);
        assert_eq!(st.on_read(0, k), (false, None));
        assert_eq!(st.on_read(k, 2 * k), (true, None));
        assert_eq!(
            st.on_read(2 * k, 3 * k),
            (true, Some((0, 3 * k, 3 * k + (1 << 20))))
        );
        // Off: nothing streams.
        let st = Streams::new(0);
        st.on_read(0, k);
        assert_eq!(st.on_read(k, 2 * k), (false, None));
    }
}
