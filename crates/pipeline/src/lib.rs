//! # cairn-pipeline
//!
//! The ordered parallel map every bulk path of cairn runs on:
//!
//! ```text
//! source (reader thread) -> N workers -> sink (calling thread, in order)
//! ```
//!
//! ## Design decisions
//!
//! - **Slots, not messages.** A fixed number of [`Slot`]s, each holding an
//!   input and an output buffer, circulate: the source fills a free slot's
//!   input, a worker fills its output, the sink consumes both and returns
//!   the slot. Memory is therefore bounded by `depth` slots whatever the
//!   stream's length, and buffers are reused (no allocation per block in
//!   the steady state).
//! - **No reorder deadlock.** Because a slot carries its input and output
//!   together and the source takes slots in sequence order, the slot the
//!   sink waits for always exists and always has its output buffer; a
//!   reorder buffer can hold at most `depth - 1` slots.
//! - **Errors travel in order.** A source or worker error is stored in its
//!   slot and surfaces when the sink reaches that sequence number, so
//!   everything before a damaged block is written and nothing after it,
//!   deterministically. The first error stops the source and the workers.
//! - **`threads == 1` is exactly one thread**: the same three closures run
//!   in a loop on the calling thread, with one slot.
//! - Written by hand on crossbeam channels: rayon's `par_bridge` does not
//!   preserve order and has no memory bound; the few crates that do ordered
//!   parallel maps neither recycle buffers nor bound their queues.

use crossbeam_channel::{bounded, Receiver, Sender};
use std::collections::BTreeMap;

/// One unit of work in flight: the source's input, the worker's output.
#[derive(Debug, Default)]
pub struct Slot<I, O> {
    /// Filled by the source.
    pub input: I,
    /// Filled by a worker.
    pub output: O,
    seq: u64,
}

impl<I, O> Slot<I, O> {
    /// Position of this slot in the stream (0-based).
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// How many threads and slots.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Worker threads (1 = run everything on the calling thread).
    pub threads: usize,
    /// Slots in circulation; at least `threads + 1`.
    pub depth: usize,
}

impl Config {
    /// `threads` workers with one slot each plus two for the ends (one
    /// being filled, one being written). More slots bought nothing in
    /// measurement (lz4 and zstd decoding of a 256 MiB image got slower:
    /// each extra slot is memory touched for the first time, and page
    /// faults on fresh buffers cost more than the slack saves).
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        Config {
            threads,
            depth: if threads == 1 { 1 } else { threads + 2 },
        }
    }
}

/// What a source reports after filling a slot's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// The slot holds work.
    Item,
    /// The stream is over; the slot is unused.
    End,
}

struct Job<I, O, E> {
    slot: Slot<I, O>,
    error: Option<E>,
}

/// Run an ordered parallel map.
///
/// `source` fills a slot's input (after `reset`), `make_worker` builds one
/// worker closure per thread, `sink` sees every slot in sequence order.
/// `reset` prepares a recycled slot for reuse (clear buffers, keep capacity).
/// Returns the first error in sequence order, or `Ok` once the source has
/// ended and the sink has seen every item.
pub fn run<I, O, E, Src, Mk, W, Snk, Rst>(
    config: Config,
    mut source: Src,
    make_worker: Mk,
    mut sink: Snk,
    reset: Rst,
) -> Result<(), E>
where
    I: Default + Send,
    O: Default + Send,
    E: Send,
    Src: FnMut(&mut I) -> Result<Fill, E> + Send,
    Mk: Fn() -> W + Sync,
    W: FnMut(&mut I, &mut O) -> Result<(), E>,
    Snk: FnMut(&mut Slot<I, O>) -> Result<(), E>,
    Rst: Fn(&mut Slot<I, O>) + Sync,
{
    if config.threads <= 1 {
        return run_inline(source, make_worker, sink, reset);
    }
    let depth = config.depth.max(config.threads + 1);
    let (free_tx, free_rx) = bounded::<Slot<I, O>>(depth);
    for _ in 0..depth {
        // The channel holds exactly `depth`, so this cannot block or fail.
        let _ = free_tx.send(Slot::default());
    }
    let (work_tx, work_rx) = bounded::<Job<I, O, E>>(depth);
    let (done_tx, done_rx) = bounded::<Job<I, O, E>>(depth);

    std::thread::scope(|scope| {
        let reset = &reset;
        scope.spawn(move || feed(&mut source, free_rx, work_tx, reset));
        for _ in 0..config.threads {
            let work_rx = work_rx.clone();
            let done_tx = done_tx.clone();
            let make_worker = &make_worker;
            scope.spawn(move || {
                let mut worker = make_worker();
                for mut job in work_rx.iter() {
                    if job.error.is_none() {
                        if let Err(e) = worker(&mut job.slot.input, &mut job.slot.output) {
                            job.error = Some(e);
                        }
                    }
                    if done_tx.send(job).is_err() {
                        break;
                    }
                }
            });
        }
        drop(work_rx);
        drop(done_tx);
        drain_in_order(&mut sink, done_rx, free_tx)
    })
}

/// The reader thread: fill free slots until the source ends or fails.
fn feed<I, O, E, Src, Rst>(
    source: &mut Src,
    free_rx: Receiver<Slot<I, O>>,
    work_tx: Sender<Job<I, O, E>>,
    reset: &Rst,
) where
    Src: FnMut(&mut I) -> Result<Fill, E>,
    Rst: Fn(&mut Slot<I, O>),
{
    for (seq, mut slot) in (0u64..).zip(free_rx.iter()) {
        reset(&mut slot);
        slot.seq = seq;
        let (error, more) = match source(&mut slot.input) {
            Ok(Fill::Item) => (None, true),
            Ok(Fill::End) => return,
            Err(e) => (Some(e), false),
        };
        if work_tx.send(Job { slot, error }).is_err() || !more {
            return;
        }
    }
}

/// The calling thread: hand slots to the sink in sequence order.
fn drain_in_order<I, O, E, Snk>(
    sink: &mut Snk,
    done_rx: Receiver<Job<I, O, E>>,
    free_tx: Sender<Slot<I, O>>,
) -> Result<(), E>
where
    Snk: FnMut(&mut Slot<I, O>) -> Result<(), E>,
{
    let mut next = 0u64;
    let mut waiting: BTreeMap<u64, Job<I, O, E>> = BTreeMap::new();
    for job in done_rx.iter() {
        waiting.insert(job.slot.seq, job);
        while let Some(mut job) = waiting.remove(&next) {
            if let Some(e) = job.error {
                return Err(e);
            }
            sink(&mut job.slot)?;
            next += 1;
            // The feeder may have stopped; a closed channel is fine.
            let _ = free_tx.send(job.slot);
        }
    }
    Ok(())
}

fn run_inline<I, O, E, Src, Mk, W, Snk, Rst>(
    mut source: Src,
    make_worker: Mk,
    mut sink: Snk,
    reset: Rst,
) -> Result<(), E>
where
    I: Default,
    O: Default,
    Src: FnMut(&mut I) -> Result<Fill, E>,
    Mk: Fn() -> W,
    W: FnMut(&mut I, &mut O) -> Result<(), E>,
    Snk: FnMut(&mut Slot<I, O>) -> Result<(), E>,
    Rst: Fn(&mut Slot<I, O>),
{
    let mut worker = make_worker();
    let mut slot = Slot::default();
    loop {
        reset(&mut slot);
        if source(&mut slot.input)? == Fill::End {
            return Ok(());
        }
        worker(&mut slot.input, &mut slot.output)?;
        sink(&mut slot)?;
        slot.seq += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn squares(threads: usize, n: u64) -> Result<Vec<u64>, String> {
        let mut next = 0u64;
        let mut out = Vec::new();
        run(
            Config::new(threads),
            |i: &mut u64| {
                if next == n {
                    return Ok::<_, String>(Fill::End);
                }
                *i = next;
                next += 1;
                Ok(Fill::Item)
            },
            || {
                |i: &mut u64, o: &mut u64| {
                    // Uneven work so that completion order differs from input order.
                    if *i % 3 == 0 {
                        std::thread::yield_now();
                    }
                    *o = *i * *i;
                    Ok(())
                }
            },
            |s: &mut Slot<u64, u64>| {
                assert_eq!(s.seq(), s.input);
                out.push(s.output);
                Ok(())
            },
            |_| {},
        )?;
        Ok(out)
    }

    #[test]
    fn keeps_order_at_every_thread_count() {
        for threads in [1, 2, 3, 8] {
            for n in [0, 1, 2, 17, 1000] {
                let got = squares(threads, n).unwrap();
                let want: Vec<u64> = (0..n).map(|i| i * i).collect();
                assert_eq!(got, want, "threads={threads} n={n}");
            }
        }
    }

    #[test]
    fn first_error_in_order_wins_and_earlier_items_are_delivered() {
        for threads in [1, 2, 4] {
            let mut seen = Vec::new();
            let mut next = 0u64;
            let r = run(
                Config::new(threads),
                |i: &mut u64| {
                    *i = next;
                    next += 1;
                    Ok::<_, String>(Fill::Item)
                },
                || {
                    |i: &mut u64, o: &mut u64| {
                        if *i >= 50 && *i % 5 == 0 {
                            return Err(format!("bad {i}"));
                        }
                        *o = *i;
                        Ok(())
                    }
                },
                |s: &mut Slot<u64, u64>| {
                    seen.push(s.output);
                    Ok(())
                },
                |_| {},
            );
            assert_eq!(r, Err("bad 50".to_string()), "threads={threads}");
            assert_eq!(seen, (0..50).collect::<Vec<_>>());
        }
    }

    #[test]
    fn source_and_sink_errors_stop_everything() {
        let mut next = 0;
        let r = run(
            Config::new(3),
            |i: &mut u32| {
                next += 1;
                if next > 10 {
                    return Err("source broke".to_string());
                }
                *i = next;
                Ok(Fill::Item)
            },
            || |_: &mut u32, _: &mut u32| Ok(()),
            |_| Ok(()),
            |_| {},
        );
        assert_eq!(r, Err("source broke".to_string()));
        let r = run(
            Config::new(3),
            |_: &mut u32| Ok::<_, String>(Fill::Item),
            || |_: &mut u32, _: &mut u32| Ok(()),
            |s: &mut Slot<u32, u32>| {
                if s.seq() == 7 {
                    Err("disk full".to_string())
                } else {
                    Ok(())
                }
            },
            |_| {},
        );
        assert_eq!(r, Err("disk full".to_string()));
    }

    #[test]
    fn buffers_are_bounded_and_reused() {
        // Count distinct slot allocations: with Default called only for the
        // initial slots, the number of live inputs never exceeds depth.
        static LIVE: AtomicUsize = AtomicUsize::new(0);
        static PEAK: AtomicUsize = AtomicUsize::new(0);
        struct Tracked;
        impl Default for Tracked {
            fn default() -> Self {
                let n = LIVE.fetch_add(1, Ordering::SeqCst) + 1;
                PEAK.fetch_max(n, Ordering::SeqCst);
                Tracked
            }
        }
        let config = Config::new(2);
        let mut left = 10_000;
        run(
            config,
            |_: &mut Tracked| {
                if left == 0 {
                    return Ok::<_, ()>(Fill::End);
                }
                left -= 1;
                Ok(Fill::Item)
            },
            || |_: &mut Tracked, _: &mut ()| Ok(()),
            |_| Ok(()),
            |_| {},
        )
        .unwrap();
        assert!(PEAK.load(Ordering::SeqCst) <= config.depth);
    }
}
