//! A fault-injecting decorator, for tests and benchmarks: [`FaultDev`]
//! wraps any device and, following a [`FaultPlan`], fails chosen
//! operations, tears writes, delays operations or dies; optionally it
//! makes the device as slow as a spinning disk with a [`RotationalModel`].
//!
//! ## Faults
//!
//! Operations are counted from the moment a plan is installed, 1-based,
//! all kinds together ([`When::Nth`]) and per kind ([`When::NthOf`]).
//! Every call of `read_at`, `write_at`, `flush`, `trim`, `write_zeroes` and
//! `extents` is an operation (`size`, `caps` and `block_sizes` are not).
//! A failed, torn or crashed operation does not reach the wrapped device
//! (a torn write reaches it with its prefix only).
//!
//! - **fail**: the matching operation returns the given error;
//! - **tear**: the matching write writes only a prefix of its buffer
//!   ([`Tear`]), then returns an I/O error (EIO): what a crash in the
//!   middle of a write leaves behind;
//! - **crash**: the matching operation and every later one fail (a dead
//!   disk) until a new plan is installed;
//! - **delay**: the matching operation sleeps first.
//!
//! ## The rotational model
//!
//! A single-actuator disk with no write cache, one zone and command
//! queuing (NCQ). Reads, writes and write-zeroes of `len > 0` bytes go
//! through the model's one head; a flush costs `flush_cost` and is a
//! barrier; trim and extents are free and bypass the model (they neither
//! wait nor move the head). Write-zeroes is modelled as a write (a disk
//! has no cheaper way).
//!
//! **Geometry.** `R = 60 s / rpm` is one revolution, `TB = media_rate * R`
//! the bytes that pass under the head in one revolution (one "track";
//! 1.25 MB at the defaults), `C` the modelled capacity (the wrapped
//! device's size unless set). Tracks are cut by byte offset: track
//! `o / TB`, angle `frac((o mod TB) / TB)`. The platter's angle at model
//! time `t` is `frac(t / R)`.
//!
//! **Cost of one request** at `offset`, `len` bytes, with the head at
//! `pos` (where the last request ended, 0 at first) and the model's clock
//! at `t`:
//!
//! ```text
//! sequential (offset = pos):  T = len / media_rate
//! otherwise:                  T = seek + wait + len / media_rate
//! seek  = 0                                 same track (offset/TB = pos/TB)
//!       = t2t + (full - t2t) * sqrt(min(d, C) / C), d = |offset - pos|
//! wait  = frac(angle(offset) - angle(t + seek)) * R     (Positional, default)
//!       = R / 2                                          (Average)
//!       = R * u, u uniform [0,1), seeded PRNG            (Random; seek never 0)
//! ```
//!
//! (`Average` and `Random` keep the older model: the seek formula for any
//! `d > 0`, same track or not.) The clock advances by each request's cost;
//! when a request finds the disk idle (head free, nothing queued) and
//! `time_scale > 0`, the clock first jumps to the real time since the
//! device was made divided by `time_scale`, because the platter kept
//! turning. The time between a queued request's predecessor finishing and
//! its own thread waking up is not idle time (a disk serves its next
//! queued command at once), so it is not added.
//!
//! **Queue.** A request that arrives while the head is busy waits. When
//! the head frees, the next one served is:
//!
//! 1. a flush, if it is the oldest waiting (a flush is served after every
//!    request that arrived before it; requests arriving after it wait for
//!    it: SATA FLUSH CACHE is not a queued command);
//! 2. the oldest waiting, if it has waited longer than `age_limit` of model
//!    time (the firmware's starvation guard; default 1 s, see
//!    [`RotationalModel::age_limit`] for why not less);
//! 3. otherwise, among the `queue_depth` oldest waiting that arrived
//!    before the first waiting flush, the one with the smallest
//!    positioning time `seek + wait` from the head's position at the
//!    clock (shortest positioning time first, SPTF; ties to the oldest).
//!    With `Average` or `Random` the wait is not known in advance and
//!    counts as `R / 2`, which makes this shortest seek first.
//!
//! `queue_depth = 1` is first come, first served (the model before NCQ).
//!
//! **What it predicts at the defaults** (0.5 ms track to track, 15 ms full
//! stroke, 7200 rpm, 150 MB/s, 2 ms flush, depth 32, positional latency),
//! measured by the unit tests of this module on a closed loop (every
//! request served is replaced by a new one at once), over 1 GiB:
//!
//! - uniform random 4 KiB requests: 12.4 ms each at depth 1 (80 IOPS:
//!   8.23 ms mean seek, 4.17 ms mean wait, 27 µs transfer), 4.8 ms at
//!   depth 32 (207 IOPS, 2.6x): a little above the 2x-2.5x usually quoted
//!   for 7200 rpm disks at queue depth 32 (not measured here), because the
//!   model knows seek and angle exactly where a drive leaves margins;
//! - 4 KiB writes in ascending order 256 KiB apart (about five per
//!   track), 32 in flight: 1.43 ms each (700 IOPS); issued one at a time
//!   with no gap, 1.75 ms (the wait for the next one to come round);
//!   1 MiB apart (about one per track), 1.45 ms at depth 32 and 6.99 ms
//!   at depth 1 (the next block, on the next track, has just passed when
//!   the seek ends);
//! - the same, with 32 threads at a time scale of 1e-3 (the integration
//!   tests in `tests/devices.rs`): random 4 KiB reads 12.5 ms at depth 1
//!   and 5.1 ms at depth 32 (about 2.45x: the queue is a little shallower
//!   than 31 at times), sorted writes 256 KiB apart 1.44 ms.
//!
//! **Simplifications**: one zone (the same media rate and track size
//! everywhere), no write cache and no read-ahead (a sequential request
//! costs its transfer only, even after the platter has turned while the
//! disk was idle), no head-switch or command overhead (a request on the
//! same track pays only its wait), tracks and angles by byte offset (no
//! spare sectors, no track skew), the seek formula above for every
//! distance, perfect knowledge of seek and angle in the SPTF choice.
//!
//! Requests serialise through the one head, the sleep is real
//! ([`std::thread::sleep`] of the modelled cost times `time_scale`, then
//! the wrapped device's I/O, before the head frees), and the modelled cost
//! (unscaled) is added up in a counter ([`FaultDev::modelled_time`]);
//! [`FaultDev::rotational_stats`] tells the queue's story, so tests can
//! check the model without a clock.

use crate::{BlockDev, BlockError, BlockSizes, Caps, ErrorKind, Extent, Op, Result, ZeroFlags};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Which operation a rule matches (counted from the plan's installation,
/// 1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// The Nth operation of any kind.
    Nth(u64),
    /// The Nth operation of this kind.
    NthOf(Op, u64),
    /// Every operation.
    Always,
    /// Every operation of this kind.
    AlwaysOf(Op),
}

/// How much of a torn write reaches the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tear {
    /// The first `k` bytes of the buffer (all of it if shorter).
    Bytes(u64),
    /// The bytes of the buffer that lie in the first `k` 512-byte sectors
    /// of the device it touches (the sector holding its first byte is the
    /// first): a disk that persists whole sectors.
    Sectors(u64),
}

impl Tear {
    /// How many bytes of a write of `len` bytes at `offset` are kept.
    pub fn prefix(self, offset: u64, len: u64) -> u64 {
        match self {
            Tear::Bytes(k) => k.min(len),
            Tear::Sectors(k) => {
                let end = (offset - offset % 512).saturating_add(k.saturating_mul(512));
                end.saturating_sub(offset).min(len)
            }
        }
    }
}

#[derive(Debug)]
enum Action {
    Fail(ErrorKind),
    Tear(Tear),
    Crash(ErrorKind),
    Delay(Duration),
}

#[derive(Debug)]
struct Rule {
    when: When,
    action: Action,
}

/// What a [`FaultDev`] does wrong, built rule by rule. Every rule whose
/// [`When`] matches an operation applies: delays add up; a tear wins over
/// a failure for the write it matches.
#[derive(Debug, Default)]
pub struct FaultPlan {
    rules: Vec<Rule>,
}

fn eio() -> ErrorKind {
    ErrorKind::Io(io::Error::from_raw_os_error(libc::EIO))
}

/// A copy of an error kind (an OS error keeps its errno).
fn clone_kind(k: &ErrorKind) -> ErrorKind {
    match k {
        ErrorKind::OutOfRange => ErrorKind::OutOfRange,
        ErrorKind::ReadOnly => ErrorKind::ReadOnly,
        ErrorKind::Unsupported => ErrorKind::Unsupported,
        ErrorKind::NoSpace => ErrorKind::NoSpace,
        ErrorKind::Corrupt(s) => ErrorKind::Corrupt(s.clone()),
        ErrorKind::Io(e) => ErrorKind::Io(match e.raw_os_error() {
            Some(n) => io::Error::from_raw_os_error(n),
            None => io::Error::new(e.kind(), e.to_string()),
        }),
    }
}

impl FaultPlan {
    /// A plan that does nothing wrong.
    pub fn new() -> FaultPlan {
        FaultPlan::default()
    }

    fn rule(mut self, when: When, action: Action) -> FaultPlan {
        self.rules.push(Rule { when, action });
        self
    }

    /// The matching operations fail with `kind`.
    pub fn fail(self, when: When, kind: ErrorKind) -> FaultPlan {
        self.rule(when, Action::Fail(kind))
    }

    /// The Nth operation (any kind) fails with EIO.
    pub fn fail_nth(self, n: u64) -> FaultPlan {
        self.fail(When::Nth(n), eio())
    }

    /// The Nth write keeps only the prefix `tear` says, then fails with
    /// EIO.
    pub fn tear_write(self, n: u64, tear: Tear) -> FaultPlan {
        self.rule(When::NthOf(Op::Write, n), Action::Tear(tear))
    }

    /// The matching operation and every later one fail with EIO.
    pub fn crash(self, when: When) -> FaultPlan {
        self.crash_with(when, eio())
    }

    /// The matching operation and every later one fail with `kind`.
    pub fn crash_with(self, when: When, kind: ErrorKind) -> FaultPlan {
        self.rule(when, Action::Crash(kind))
    }

    /// The Nth write is torn and the disk dies with it: a power cut in the
    /// middle of a write.
    pub fn tear_and_crash(self, n: u64, tear: Tear) -> FaultPlan {
        self.tear_write(n, tear).crash(When::NthOf(Op::Write, n))
    }

    /// The matching operations sleep `d` before running.
    pub fn delay(self, when: When, d: Duration) -> FaultPlan {
        self.rule(when, Action::Delay(d))
    }

    /// Every operation sleeps `d` before running.
    pub fn delay_all(self, d: Duration) -> FaultPlan {
        self.delay(When::Always, d)
    }
}

/// How the rotational latency of a non-sequential request is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotationalLatency {
    /// The wait until the request's sector comes under the head, from the
    /// platter's angle at the model's clock (the default; see
    /// [`RotationalModel`]): request order can save it.
    Positional,
    /// Always half a revolution (deterministic).
    Average,
    /// Uniform in one revolution, from a simple PRNG with this seed
    /// (xorshift64*; repeatable for a given seed and request order).
    Random(u64),
}

/// The cost model of a spinning disk with one actuator, no write cache and
/// command queuing (NCQ), for [`FaultDev::rotational`]. (The module
/// documentation of `fault.rs` has the same with more commentary.)
///
/// **Geometry.** `R = 60 s / rpm` ([`revolution`](Self::revolution)), a
/// track is `TB = media_rate * R` bytes ([`track_bytes`](Self::track_bytes),
/// 1.25 MB at the defaults), `C` is `capacity` (the wrapped device's size
/// if 0). Byte offset `o` is on track `o / TB` at angle
/// `frac((o mod TB) / TB)`; at model time `t` the platter is at angle
/// `frac(t / R)`.
///
/// **Cost.** A read, write or write-zeroes of `len > 0` bytes at `offset`,
/// with the head at `pos` (where the last request ended, 0 at first) and
/// the model's clock at `t`:
///
/// ```text
/// offset == pos:  len / media_rate
/// otherwise:      seek + wait + len / media_rate
/// seek = 0 on the same track (offset / TB == pos / TB), else
///        track_to_track + (full_stroke - track_to_track) * sqrt(min(d, C) / C),
///        d = |offset - pos|
/// wait = frac(angle(offset) - angle(t + seek)) * R   (Positional, the default)
///      = R / 2                                       (Average)
///      = R * u, u uniform in [0, 1), seeded          (Random)
/// ```
///
/// With `Average` or `Random` the seek formula applies to any `d > 0`,
/// same track or not (the older model, kept for its tests). A flush costs
/// `flush_cost` and leaves the head in place; trim and extents are free
/// and bypass the model. The clock advances by each cost; when a request
/// finds the disk idle (head free, queue empty) and `time_scale > 0`, the
/// clock first moves up to the real time since the device was made divided
/// by `time_scale` (the platter kept turning).
///
/// **Queue.** Requests arriving while the head is busy wait. When it
/// frees, it serves: a flush if it is the oldest waiting (a flush is a
/// barrier: after everything queued before it, before everything queued
/// after it); else the oldest waiting if it has waited longer than
/// `age_limit` of model time; else, among the `queue_depth` oldest waiting
/// ahead of any flush, the one with the least `seek + wait` from where the
/// head is now (shortest positioning time first; ties to the oldest; with
/// `Average` or `Random` the wait counts as `R / 2`: shortest seek first).
/// `queue_depth` 1 is first come, first served.
///
/// **Simplified**: one zone, no write cache or read-ahead (a sequential
/// request costs its transfer even after the disk sat idle), no head
/// switch or command overhead, tracks and angles by byte offset, exact
/// knowledge of seek and angle when choosing.
///
/// **Predicted at the defaults** (0.5 ms, 15 ms, 7200 rpm, 150 MB/s, 2 ms
/// flush, depth 32, positional, 1 s age limit), over 1 GiB: uniform random
/// 4 KiB requests cost 12.4 ms one at a time (80 IOPS) and 4.8 ms with 32
/// in flight (207 IOPS, 2.6x); 4 KiB writes in ascending order 256 KiB
/// apart cost 1.43 ms with 32 in flight (1.75 ms one at a time, issued
/// with no gap).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RotationalModel {
    /// Bytes the full stroke spans; 0: the wrapped device's size.
    pub capacity: u64,
    /// Seek to a neighbouring track, and the least cost of any seek
    /// between tracks.
    pub track_to_track: Duration,
    /// Seek across the whole capacity.
    pub full_stroke: Duration,
    /// Spindle speed.
    pub rpm: u32,
    /// How rotational latency is chosen.
    pub latency: RotationalLatency,
    /// Media transfer rate, bytes per second.
    pub media_rate: u64,
    /// Cost of a flush.
    pub flush_cost: Duration,
    /// Real sleep = modelled time × `time_scale` (0: never sleep; the
    /// modelled time is still counted, and idle time does not turn the
    /// platter).
    pub time_scale: f64,
    /// How many of the oldest waiting requests the head chooses among
    /// (NCQ allows 32); 1 (or 0) serves them in order of arrival.
    pub queue_depth: usize,
    /// A waiting request older than this (in model time) is served next,
    /// whatever it costs. Default 1 s: what a drive's firmware uses is not
    /// known here, and the value must stay well above the mean wait of a full queue
    /// (31 requests at ~4.8 ms each: ~150 ms), or the guard fires for most
    /// requests and the queue falls back to first come, first served. The
    /// unit tests' closed loop of random 4 KiB requests, 32 in flight:
    /// at 8 revolutions (67 ms) and at 250 ms, 80 IOPS (depth 1's rate)
    /// with nearly every request aged; at 500 ms 196 IOPS, 4 % aged; at
    /// 1 s 206 IOPS, 0.16 % aged.
    pub age_limit: Duration,
}

impl Default for RotationalModel {
    fn default() -> Self {
        RotationalModel {
            capacity: 0,
            track_to_track: Duration::from_micros(500),
            full_stroke: Duration::from_millis(15),
            rpm: 7200,
            latency: RotationalLatency::Positional,
            media_rate: 150_000_000,
            flush_cost: Duration::from_millis(2),
            time_scale: 1.0,
            queue_depth: 32,
            age_limit: Duration::from_secs(1),
        }
    }
}

impl RotationalModel {
    /// Seek time over `distance` bytes on a disk of `capacity` bytes
    /// (0 for no distance), by the formula alone (the positional model
    /// charges no seek on the same track).
    pub fn seek_time(&self, distance: u64, capacity: u64) -> Duration {
        if distance == 0 {
            return Duration::ZERO;
        }
        let c = capacity.max(1) as f64;
        let frac = (distance as f64).min(c) / c;
        let span = self.full_stroke.saturating_sub(self.track_to_track);
        self.track_to_track + span.mul_f64(frac.sqrt())
    }

    /// One revolution.
    pub fn revolution(&self) -> Duration {
        Duration::from_secs(60) / self.rpm.max(1)
    }

    /// Bytes passing under the head in one revolution (`media_rate ×
    /// revolution`, rounded, at least 1): one track of the positional
    /// model.
    pub fn track_bytes(&self) -> u64 {
        let b = u128::from(self.media_rate) * self.revolution().as_nanos();
        u64::try_from((b + 500_000_000) / 1_000_000_000)
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Moving `len` bytes under the head.
    pub fn transfer_time(&self, len: u64) -> Duration {
        Duration::from_secs_f64(len as f64 / self.media_rate.max(1) as f64)
    }

    /// Mean seek between two uniformly random positions
    /// (`track_to_track + (full_stroke - track_to_track) * 8/15`).
    pub fn mean_random_seek(&self) -> Duration {
        self.track_to_track
            + self
                .full_stroke
                .saturating_sub(self.track_to_track)
                .mul_f64(8.0 / 15.0)
    }
}

/// xorshift64*: a uniform number in [0, 1).
fn next_unit(state: &mut u64) -> f64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
    (r >> 11) as f64 / (1u64 << 53) as f64
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What the head is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    /// Read, write or write-zeroes of `len > 0` bytes.
    Access {
        offset: u64,
        len: u64,
    },
    Flush,
}

/// The modelled disk: where the head is and what time it is (model time,
/// nanoseconds).
#[derive(Debug, Clone)]
struct Disk {
    model: RotationalModel,
    capacity: u64,
    track: u64,
    rev_ns: u64,
    pos: u64,
    clock: u64,
    rng: u64,
}

impl Disk {
    fn new(model: RotationalModel, capacity: u64) -> Disk {
        let rng = match model.latency {
            RotationalLatency::Random(seed) if seed != 0 => seed,
            _ => 0x9E37_79B9_7F4A_7C15,
        };
        Disk {
            model,
            capacity,
            track: model.track_bytes(),
            rev_ns: nanos(model.revolution()).max(1),
            pos: 0,
            clock: 0,
            rng,
        }
    }

    /// Seek from the head to `offset` (not sequential).
    fn seek(&self, offset: u64) -> u64 {
        let positional = self.model.latency == RotationalLatency::Positional;
        if positional && offset / self.track == self.pos / self.track {
            return 0;
        }
        nanos(
            self.model
                .seek_time(offset.abs_diff(self.pos), self.capacity),
        )
    }

    /// The wait, at model time `t`, until `offset`'s angle comes under
    /// the head.
    fn wait_at(&self, offset: u64, t: u64) -> u64 {
        let a_off = (offset % self.track) as f64 / self.track as f64;
        let a_t = (t % self.rev_ns) as f64 / self.rev_ns as f64;
        let mut f = a_off - a_t;
        if f < 0.0 {
            f += 1.0;
        }
        ((f * self.rev_ns as f64) as u64).min(self.rev_ns - 1)
    }

    /// Seek plus rotational wait to start a job now (0 for a sequential
    /// access; a flush does not move the head). With `Average` or `Random`
    /// the wait is counted as half a revolution.
    fn positioning(&self, job: Job) -> u64 {
        let Job::Access { offset, .. } = job else {
            return 0;
        };
        if offset == self.pos {
            return 0;
        }
        let seek = self.seek(offset);
        let wait = match self.model.latency {
            RotationalLatency::Positional => self.wait_at(offset, self.clock.saturating_add(seek)),
            RotationalLatency::Average | RotationalLatency::Random(_) => self.rev_ns / 2,
        };
        seek.saturating_add(wait)
    }

    /// Serve a job now: its cost; the head moves and the clock advances.
    fn serve(&mut self, job: Job) -> u64 {
        let cost = match job {
            Job::Flush => nanos(self.model.flush_cost),
            Job::Access { offset, len } => {
                let transfer = nanos(self.model.transfer_time(len));
                let reach = if offset == self.pos {
                    0
                } else {
                    match self.model.latency {
                        RotationalLatency::Positional => self.positioning(job),
                        RotationalLatency::Average => self.seek(offset) + self.rev_ns / 2,
                        RotationalLatency::Random(_) => {
                            let u = next_unit(&mut self.rng);
                            self.seek(offset) + (self.rev_ns as f64 * u) as u64
                        }
                    }
                };
                self.pos = offset.saturating_add(len);
                reach.saturating_add(transfer)
            }
        };
        self.clock = self.clock.saturating_add(cost);
        cost
    }
}

/// The queue's story so far, from [`FaultDev::rotational_stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RotationalStats {
    /// Requests the head served (reads, writes and write-zeroes of at
    /// least one byte, and flushes).
    pub served: u64,
    /// Of them, the ones that waited in the queue (the others found the
    /// disk idle).
    pub queued: u64,
    /// Over the queued ones, the sum of the number of requests the head
    /// chose among (`candidates / queued`: the mean useful queue depth).
    pub candidates: u64,
    /// Queued requests served first because they had waited longer than
    /// the age limit.
    pub aged: u64,
    /// The longest a request waited in the queue, in model time (from
    /// the model's clock when it arrived, which is when the request then
    /// being served ends, to the clock when it was chosen).
    pub max_wait: Duration,
    /// Requests waiting now.
    pub waiting: u64,
    /// The model's clock (model time since the device was made, including
    /// idle time when `time_scale > 0`).
    pub clock: Duration,
}

/// A request waiting for the head.
struct Ticket {
    id: u64,
    job: Job,
    /// The model's clock when it arrived.
    arrived: u64,
    /// Notified when the head is granted to it.
    wake: Arc<Condvar>,
}

/// The head and its queue.
struct Sched {
    disk: Disk,
    /// Waiting requests, oldest first.
    queue: VecDeque<Ticket>,
    /// The head is serving a request (if not, the queue is empty).
    busy: bool,
    /// The ticket the head was just granted to, and its cost, until that
    /// request's thread picks it up.
    grant: Option<(u64, u64)>,
    next_id: u64,
    stats: RotationalStats,
}

impl Sched {
    fn new(disk: Disk) -> Sched {
        Sched {
            disk,
            queue: VecDeque::new(),
            busy: false,
            grant: None,
            next_id: 0,
            stats: RotationalStats::default(),
        }
    }

    /// Which waiting request the head serves next: its index in the
    /// queue, among how many it chose, and whether the age limit chose it.
    fn pick(&self) -> Option<(usize, u64, bool)> {
        let first = self.queue.front()?;
        if first.job == Job::Flush {
            return Some((0, 1, false));
        }
        if self.disk.clock.saturating_sub(first.arrived) > nanos(self.disk.model.age_limit) {
            return Some((0, 1, true));
        }
        let n = self
            .queue
            .iter()
            .take(self.disk.model.queue_depth.max(1))
            .take_while(|t| t.job != Job::Flush)
            .count();
        let best = self
            .queue
            .iter()
            .take(n)
            .enumerate()
            .min_by_key(|(_, t)| self.disk.positioning(t.job))
            .map_or(0, |(i, _)| i);
        Some((best, n as u64, false))
    }

    /// Serve a request that found the disk idle.
    fn start_idle(&mut self, job: Job, now: Option<u64>) -> u64 {
        if let Some(now) = now {
            self.disk.clock = self.disk.clock.max(now);
        }
        self.busy = true;
        self.stats.served += 1;
        self.disk.serve(job)
    }

    /// Queue a request; its ticket id.
    fn enqueue(&mut self, job: Job, wake: Arc<Condvar>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Ticket {
            id,
            job,
            arrived: self.disk.clock,
            wake,
        });
        id
    }

    /// The head is done: serve the next waiting request (its ticket and
    /// cost, granted), or go idle.
    fn next(&mut self) -> Option<(Ticket, u64)> {
        let Some((i, n, aged)) = self.pick() else {
            self.busy = false;
            return None;
        };
        let Some(t) = self.queue.remove(i) else {
            self.busy = false;
            return None;
        };
        let wait = self.disk.clock.saturating_sub(t.arrived);
        self.stats.aged += u64::from(aged);
        self.stats.served += 1;
        self.stats.queued += 1;
        self.stats.candidates += n;
        self.stats.max_wait = self.stats.max_wait.max(Duration::from_nanos(wait));
        let cost = self.disk.serve(t.job);
        self.grant = Some((t.id, cost));
        Some((t, cost))
    }

    fn stats(&self) -> RotationalStats {
        RotationalStats {
            waiting: self.queue.len() as u64,
            clock: Duration::from_nanos(self.disk.clock),
            ..self.stats
        }
    }
}

/// The rotational model of a [`FaultDev`].
struct Rotational {
    sched: Mutex<Sched>,
    made: Instant,
    time_scale: f64,
}

impl Rotational {
    fn lock(&self) -> MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn scale(&self) -> Option<f64> {
        (self.time_scale > 0.0 && self.time_scale.is_finite()).then_some(self.time_scale)
    }

    /// Wait for the head, take it: the cost of `job`.
    fn acquire(&self, job: Job) -> u64 {
        let mut s = self.lock();
        if !s.busy {
            let now = self.scale().map(|k| {
                let t = self.made.elapsed().as_secs_f64() / k * 1e9;
                if t >= u64::MAX as f64 / 2.0 {
                    u64::MAX / 2
                } else {
                    t as u64
                }
            });
            return s.start_idle(job, now);
        }
        let wake = Arc::new(Condvar::new());
        let id = s.enqueue(job, wake.clone());
        loop {
            if let Some((g, cost)) = s.grant {
                if g == id {
                    s.grant = None;
                    return cost;
                }
            }
            s = wake.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Free the head: hand it to the next request, if one waits.
    fn release(&self) {
        let mut s = self.lock();
        if let Some((t, _)) = s.next() {
            t.wake.notify_one();
        }
    }
}

/// Holding the head; frees it when dropped (also when the wrapped
/// device's I/O panics, so that the others do not wait forever).
struct HeadGuard<'a>(&'a Rotational);

impl Drop for HeadGuard<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Operations seen by a [`FaultDev`], per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpCounts {
    /// `read_at` calls.
    pub read: u64,
    /// `write_at` calls.
    pub write: u64,
    /// `flush` calls.
    pub flush: u64,
    /// `trim` calls.
    pub trim: u64,
    /// `write_zeroes` calls.
    pub write_zeroes: u64,
    /// `extents` calls.
    pub extents: u64,
}

impl OpCounts {
    /// All operations.
    pub fn total(&self) -> u64 {
        self.read + self.write + self.flush + self.trim + self.write_zeroes + self.extents
    }

    /// Operations of one kind.
    pub fn of(&self, op: Op) -> u64 {
        match op {
            Op::Read => self.read,
            Op::Write => self.write,
            Op::Flush => self.flush,
            Op::Trim => self.trim,
            Op::WriteZeroes => self.write_zeroes,
            Op::Extents => self.extents,
            Op::Open => 0,
        }
    }

    fn bump(&mut self, op: Op) {
        match op {
            Op::Read => self.read += 1,
            Op::Write => self.write += 1,
            Op::Flush => self.flush += 1,
            Op::Trim => self.trim += 1,
            Op::WriteZeroes => self.write_zeroes += 1,
            Op::Extents => self.extents += 1,
            Op::Open => {}
        }
    }
}

struct State {
    plan: FaultPlan,
    /// Since the plan was installed.
    seen: OpCounts,
    /// Since the device was made.
    total: OpCounts,
    crashed: Option<ErrorKind>,
    injected: u64,
}

/// What to do with an admitted operation.
enum Verdict {
    Run,
    Tear(Tear),
}

/// A device that fails, tears, delays and slows down the operations of
/// the device it wraps, as a [`FaultPlan`] and an optional
/// [`RotationalModel`] say.
pub struct FaultDev {
    inner: Arc<dyn BlockDev>,
    state: Mutex<State>,
    rot: Option<Rotational>,
    delayed_ns: AtomicU64,
    modelled_ns: AtomicU64,
}

impl FaultDev {
    /// Wrap `inner`, misbehaving as `plan` says.
    pub fn new(inner: Arc<dyn BlockDev>, plan: FaultPlan) -> FaultDev {
        FaultDev {
            inner,
            state: Mutex::new(State {
                plan,
                seen: OpCounts::default(),
                total: OpCounts::default(),
                crashed: None,
                injected: 0,
            }),
            rot: None,
            delayed_ns: AtomicU64::new(0),
            modelled_ns: AtomicU64::new(0),
        }
    }

    /// Wrap `inner`, as slow as a spinning disk, with no faults.
    pub fn with_rotational(inner: Arc<dyn BlockDev>, model: RotationalModel) -> FaultDev {
        FaultDev::new(inner, FaultPlan::new()).rotational(model)
    }

    /// Make the device as slow as `model` says (and report it rotational).
    /// The platter starts turning now.
    pub fn rotational(mut self, model: RotationalModel) -> FaultDev {
        let capacity = if model.capacity == 0 {
            self.inner.size()
        } else {
            model.capacity
        };
        self.rot = Some(Rotational {
            sched: Mutex::new(Sched::new(Disk::new(model, capacity))),
            made: Instant::now(),
            time_scale: model.time_scale,
        });
        self
    }

    /// Replace the plan: per-plan counts start again and a crash is
    /// forgotten (the total counts go on).
    pub fn set_plan(&self, plan: FaultPlan) {
        let mut st = self.lock();
        st.plan = plan;
        st.seen = OpCounts::default();
        st.crashed = None;
    }

    /// The wrapped device.
    pub fn inner(&self) -> &Arc<dyn BlockDev> {
        &self.inner
    }

    /// Operations seen since the device was made, per kind (including the
    /// failed ones).
    pub fn counts(&self) -> OpCounts {
        self.lock().total
    }

    /// Operations seen since the current plan was installed.
    pub fn plan_counts(&self) -> OpCounts {
        self.lock().seen
    }

    /// Operations that failed or were torn by injection (crashed ones
    /// included).
    pub fn injected_failures(&self) -> u64 {
        self.lock().injected
    }

    /// Whether a crash rule has fired (every operation now fails).
    pub fn is_crashed(&self) -> bool {
        self.lock().crashed.is_some()
    }

    /// Total injected delay.
    pub fn delayed(&self) -> Duration {
        Duration::from_nanos(self.delayed_ns.load(Ordering::Relaxed))
    }

    /// Total time the rotational model charged (before `time_scale`).
    pub fn modelled_time(&self) -> Duration {
        Duration::from_nanos(self.modelled_ns.load(Ordering::Relaxed))
    }

    /// The rotational model's queue statistics and clock (None without a
    /// model).
    pub fn rotational_stats(&self) -> Option<RotationalStats> {
        self.rot.as_ref().map(|r| r.lock().stats())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count the operation and decide its fate.
    fn admit(&self, op: Op, offset: u64, len: u64) -> Result<Verdict> {
        let mut delay = Duration::ZERO;
        let verdict = {
            let mut st = self.lock();
            st.seen.bump(op);
            st.total.bump(op);
            if let Some(k) = &st.crashed {
                let kind = clone_kind(k);
                st.injected += 1;
                return Err(BlockError::new(op, offset, len, kind));
            }
            let (n_all, n_op) = (st.seen.total(), st.seen.of(op));
            let mut fail: Option<ErrorKind> = None;
            let mut tear: Option<Tear> = None;
            let mut crash: Option<ErrorKind> = None;
            for r in &st.plan.rules {
                let hit = match r.when {
                    When::Nth(n) => n == n_all,
                    When::NthOf(o, n) => o == op && n == n_op,
                    When::Always => true,
                    When::AlwaysOf(o) => o == op,
                };
                if !hit {
                    continue;
                }
                match &r.action {
                    Action::Delay(d) => delay += *d,
                    Action::Fail(k) => {
                        fail.get_or_insert_with(|| clone_kind(k));
                    }
                    Action::Crash(k) => {
                        crash.get_or_insert_with(|| clone_kind(k));
                    }
                    Action::Tear(t) if op == Op::Write => tear = Some(*t),
                    Action::Tear(_) => {}
                }
            }
            let fail = match crash {
                Some(k) => {
                    let now = clone_kind(&k);
                    st.crashed = Some(k);
                    fail.or(Some(now))
                }
                None => fail,
            };
            match (tear, fail) {
                (Some(t), _) => {
                    st.injected += 1;
                    Ok(Verdict::Tear(t))
                }
                (None, Some(k)) => {
                    st.injected += 1;
                    Err(BlockError::new(op, offset, len, k))
                }
                (None, None) => Ok(Verdict::Run),
            }
        };
        if !delay.is_zero() {
            let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
            self.delayed_ns.fetch_add(ns, Ordering::Relaxed);
            std::thread::sleep(delay);
        }
        verdict
    }

    /// Run `f` as the disk's head would: wait for the head (in the
    /// model's queue), charge and sleep the modelled time, run `f`, free
    /// the head.
    fn serve<T>(&self, op: Op, offset: u64, len: u64, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let Some(rot) = &self.rot else {
            return f();
        };
        let job = match op {
            Op::Read | Op::Write | Op::WriteZeroes if len > 0 => Job::Access { offset, len },
            Op::Flush => Job::Flush,
            _ => return f(),
        };
        let cost = rot.acquire(job);
        let _head = HeadGuard(rot);
        self.modelled_ns.fetch_add(cost, Ordering::Relaxed);
        if let Some(k) = rot.scale() {
            std::thread::sleep(Duration::from_nanos(cost).mul_f64(k));
        }
        f()
    }
}

impl BlockDev for FaultDev {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn identity(&self) -> Option<crate::FileIdentity> {
        self.inner.identity()
    }

    fn caps(&self) -> Caps {
        let mut c = self.inner.caps();
        if self.rot.is_some() {
            c.rotational = true;
        }
        c
    }

    fn block_sizes(&self) -> BlockSizes {
        self.inner.block_sizes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.admit(Op::Read, offset, len)?;
        self.serve(Op::Read, offset, len, || self.inner.read_at(buf, offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        let len = buf.len() as u64;
        match self.admit(Op::Write, offset, len)? {
            Verdict::Run => self.serve(Op::Write, offset, len, || {
                self.inner.write_at(buf, offset, fua)
            }),
            Verdict::Tear(t) => {
                let keep = t.prefix(offset, len);
                self.serve(Op::Write, offset, keep, || {
                    if keep > 0 {
                        self.inner.write_at(&buf[..keep as usize], offset, fua)?;
                    }
                    Ok(())
                })?;
                Err(BlockError::new(Op::Write, offset, len, eio()))
            }
        }
    }

    fn flush(&self) -> Result<()> {
        self.admit(Op::Flush, 0, 0)?;
        self.serve(Op::Flush, 0, 0, || self.inner.flush())
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.admit(Op::Trim, offset, len)?;
        self.serve(Op::Trim, offset, len, || self.inner.trim(offset, len, fua))
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.admit(Op::WriteZeroes, offset, len)?;
        self.serve(Op::WriteZeroes, offset, len, || {
            self.inner.write_zeroes(offset, len, flags)
        })
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.admit(Op::Extents, offset, len)?;
        self.serve(Op::Extents, offset, len, || self.inner.extents(offset, len))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::MemDev;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1000.0)
    }

    fn close(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) < Duration::from_nanos(1000)
    }

    #[test]
    fn seek_formula() {
        let m = RotationalModel::default();
        assert_eq!(m.seek_time(0, 1000), Duration::ZERO);
        assert!(close(m.seek_time(1000, 1000), ms(15.0)));
        assert!(
            close(m.seek_time(5000, 1000), ms(15.0)),
            "capped at full stroke"
        );
        assert!(close(m.seek_time(250, 1000), ms(0.5 + 14.5 * 0.5)));
        assert!(m.seek_time(1, 1 << 40) >= ms(0.5));
        assert!(close(m.mean_random_seek(), ms(0.5 + 14.5 * 8.0 / 15.0)));
        assert!(close(m.revolution() / 2, ms(60_000.0 / 7200.0 / 2.0)));
        assert!(close(m.transfer_time(150_000), ms(1.0)));
    }

    #[test]
    fn random_latency_is_seeded_and_within_a_revolution() {
        let m = RotationalModel {
            latency: RotationalLatency::Random(42),
            ..Default::default()
        };
        let (mut a, mut b) = (Disk::new(m, 1 << 30), Disk::new(m, 1 << 30));
        for i in 0..1000u64 {
            a.pos = 0;
            b.pos = 0;
            let job = Job::Access {
                offset: 4096 * (i + 1),
                len: 1,
            };
            let (x, y) = (a.serve(job), b.serve(job));
            assert_eq!(x, y);
            let x = Duration::from_nanos(x) - m.transfer_time(1);
            let seek = m.seek_time(4096 * (i + 1), 1 << 30);
            assert!(x >= seek && x < seek + m.revolution());
        }
    }

    const GIB: u64 = 1 << 30;

    fn access(offset: u64, len: u64) -> Job {
        Job::Access { offset, len }
    }

    #[test]
    fn track_and_angles() {
        let m = RotationalModel::default();
        assert_eq!(m.track_bytes(), 1_250_000, "150 MB/s x 8.33 ms");
        let d = Disk::new(m, GIB);
        assert_eq!(d.rev_ns, 8_333_333);
        // At time 0 the head is at angle 0: a sector at a quarter of a
        // track comes round after a quarter of a revolution, and one at
        // angle 0 of another track is under the head at once.
        assert_eq!(d.wait_at(312_500, 0), 2_083_333);
        assert_eq!(d.wait_at(3 * 1_250_000, 0), 0);
        // A quarter of a revolution later it has just passed: three
        // quarters to go.
        assert!(d.wait_at(0, 2_083_334) / 1000 == 6_249);
        assert!(d.wait_at(1, 0) < d.rev_ns);
    }

    /// The positional cost by its formula, step by step from time 0.
    #[test]
    fn positional_cost_by_formula() {
        let m = RotationalModel::default();
        let mut d = Disk::new(m, GIB);
        let (tb, r) = (1_250_000f64, 8_333_333f64);
        let transfer = nanos(m.transfer_time(4096)) as f64;
        let near = |a: u64, b: f64| (a as f64 - b).abs() <= 2.0;
        // Sequential from 0: transfer only.
        let c0 = d.serve(access(0, 4096));
        assert!(near(c0, transfer));
        // Same track, further on: no seek, wait for the sector to come
        // round (the head's angle is where the last request ended).
        let c1 = d.serve(access(500_000, 4096));
        assert!(near(c1, (500_000.0 - 4096.0) / tb * r + transfer), "{c1}");
        // Same track, behind the head: nearly a whole revolution.
        let c2 = d.serve(access(100_000, 4096));
        let back = (1.0 - (504_096.0 - 100_000.0) / tb) * r;
        assert!(near(c2, back + transfer), "{c2}");
        // Another track: the seek, then the wait from where the platter
        // is when the seek ends.
        let clock = d.clock;
        let target = 600 * 1_250_000 + 1_000_000;
        let seek = nanos(m.seek_time(target - 104_096, GIB));
        let a_t = ((clock + seek) % 8_333_333) as f64 / r;
        let mut f = 1_000_000.0 / tb - a_t;
        if f < 0.0 {
            f += 1.0;
        }
        let c3 = d.serve(access(target, 4096));
        assert!(near(c3, seek as f64 + f * r + transfer), "{c3}");
        assert_eq!(d.clock, c0 + c1 + c2 + c3);
        assert_eq!(d.pos, target + 4096);
        // A flush: its cost, the head stays.
        assert_eq!(d.serve(Job::Flush), 2_000_000);
        assert_eq!(d.pos, target + 4096);
        // Sequential after the flush: still transfer only.
        assert!(near(d.serve(access(target + 4096, 4096)), transfer));
    }

    /// A closed loop: `outstanding` requests in flight, each served one
    /// replaced by the next from `gen` as soon as it is done (after the
    /// head has chosen its successor, as a host resubmits on completion).
    /// The mean cost per request and the queue's statistics.
    fn closed_loop(
        m: RotationalModel,
        outstanding: usize,
        n: usize,
        mut gen: impl FnMut() -> u64,
    ) -> (Duration, RotationalStats) {
        let mut s = Sched::new(Disk::new(m, GIB));
        let cv = Arc::new(Condvar::new());
        let mut total = s.start_idle(access(gen(), 4096), None);
        for _ in 1..outstanding {
            s.enqueue(access(gen(), 4096), cv.clone());
        }
        for _ in 1..n {
            match s.next() {
                Some((_, c)) => {
                    s.grant = None;
                    total += c;
                    s.enqueue(access(gen(), 4096), cv.clone());
                }
                None => total += s.start_idle(access(gen(), 4096), None),
            }
        }
        (Duration::from_nanos(total / n as u64), s.stats())
    }

    fn uniform(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || (next_unit(&mut x) * (GIB / 4096) as f64) as u64 * 4096
    }

    fn sorted(spacing: u64) -> impl FnMut() -> u64 {
        let mut i = 0;
        move || {
            i += 1;
            ((i - 1) * spacing) % GIB
        }
    }

    fn iops(per: Duration) -> f64 {
        1.0 / per.as_secs_f64()
    }

    /// Uniform random 4 KiB over 1 GiB: one at a time, the old model's
    /// mean; 32 in flight, the gain of SPTF.
    #[test]
    fn random_4k_depth_1_and_32() {
        let m = RotationalModel::default();
        let (d1, st1) = closed_loop(m, 1, 20_000, uniform(1));
        let (d32, st32) = closed_loop(m, 32, 20_000, uniform(1));
        let old = m.mean_random_seek() + m.revolution() / 2 + m.transfer_time(4096);
        eprintln!(
            "random 4 KiB over 1 GiB: depth 1 {d1:?} ({:.0} IOPS), depth 32 {d32:?} ({:.0} IOPS), \
             {:.2}x, old mean {old:?}, depth 32 chose among {:.1}, aged {}, max wait {:?}",
            iops(d1),
            iops(d32),
            d1.as_secs_f64() / d32.as_secs_f64(),
            st32.candidates as f64 / st32.queued as f64,
            st32.aged,
            st32.max_wait
        );
        assert_eq!(st1.queued, 0, "one at a time never queues");
        assert!(
            d1 > old.mul_f64(0.97) && d1 < old.mul_f64(1.03),
            "{d1:?} vs {old:?}"
        );
        let gain = d1.as_secs_f64() / d32.as_secs_f64();
        // The simulation gives 2.57x; datasheets 2x-2.5x. A band that
        // fails if queuing gains nothing (1x) or far more than a disk.
        assert!((2.2..2.9).contains(&gain), "gain {gain:.2}");
        assert!(st32.candidates >= 30 * st32.queued, "31 waiting");
        assert!(st32.aged < 200, "the age limit rarely fires: {}", st32.aged);
    }

    /// Why the age limit is 1 s: a short one fires for most requests of a
    /// full queue (whose mean wait is ~150 ms) and undoes the gain.
    #[test]
    fn age_limit_must_exceed_a_full_queue() {
        let m = RotationalModel::default();
        let (d1, _) = closed_loop(m, 1, 20_000, uniform(1));
        let mut line = String::new();
        for (limit, lo, hi) in [
            (m.revolution() * 8, 0.9, 1.2),
            (Duration::from_millis(250), 0.9, 1.5),
            (Duration::from_millis(500), 2.2, 2.9),
            (Duration::from_secs(1), 2.2, 2.9),
        ] {
            let m = RotationalModel {
                age_limit: limit,
                ..m
            };
            let (d, st) = closed_loop(m, 32, 20_000, uniform(1));
            let gain = d1.as_secs_f64() / d.as_secs_f64();
            line += &format!(
                "; {limit:?}: {:.0} IOPS, {gain:.2}x, {} aged",
                iops(d),
                st.aged
            );
            assert!((lo..hi).contains(&gain), "{limit:?}: {gain:.2}");
        }
        eprintln!("age limit, random 4 KiB at depth 32{line}");
    }

    /// The same at depth 32 with queue_depth 1: first come, first served,
    /// the cost of one at a time.
    #[test]
    fn queue_depth_1_is_fifo() {
        let m = RotationalModel {
            queue_depth: 1,
            ..Default::default()
        };
        let (d, st) = closed_loop(m, 32, 20_000, uniform(2));
        let old = m.mean_random_seek() + m.revolution() / 2 + m.transfer_time(4096);
        assert!(
            d > old.mul_f64(0.97) && d < old.mul_f64(1.03),
            "{d:?} vs {old:?}"
        );
        assert_eq!(st.candidates, st.queued);
        // Always the oldest: every request waits 31 services, ~390 ms.
        assert!(
            st.max_wait < Duration::from_millis(700),
            "{:?}",
            st.max_wait
        );
        // Average latency with queuing is shortest seek first: the seeks
        // shrink, the half revolution stays.
        let avg = RotationalModel {
            latency: RotationalLatency::Average,
            ..Default::default()
        };
        let (d_avg, _) = closed_loop(avg, 32, 20_000, uniform(2));
        assert!(
            d_avg > m.revolution() / 2 && d_avg < old.mul_f64(0.6),
            "{d_avg:?}"
        );
    }

    /// Ascending 4 KiB writes a few per track: the platter brings them
    /// round one after another.
    #[test]
    fn sorted_writes() {
        let m = RotationalModel::default();
        let (rnd, _) = closed_loop(m, 32, 4096, uniform(3));
        let mut line = format!("random at depth 32 {rnd:?}");
        for (spacing, lo1, hi1, lo32, hi32) in [
            (256 << 10, 1.6, 1.9, 1.3, 1.6),
            (1 << 20, 6.5, 7.5, 1.3, 1.6),
        ] {
            let (d1, _) = closed_loop(m, 1, 4096, sorted(spacing));
            let (d32, _) = closed_loop(m, 32, 4096, sorted(spacing));
            line += &format!(
                "; {} KiB apart: depth 1 {d1:?} ({:.0} IOPS), depth 32 {d32:?} ({:.0} IOPS)",
                spacing >> 10,
                iops(d1),
                iops(d32)
            );
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            assert!((lo1..hi1).contains(&ms(d1)), "{d1:?}");
            assert!((lo32..hi32).contains(&ms(d32)), "{d32:?}");
            assert!(d32 < rnd / 3);
        }
        eprintln!("sorted 4 KiB writes over 1 GiB: {line}");
    }

    /// A flush is served after everything queued before it, and what
    /// comes after it waits for it, however cheap.
    #[test]
    fn flush_is_a_barrier() {
        let mut s = Sched::new(Disk::new(RotationalModel::default(), GIB));
        let cv = Arc::new(Condvar::new());
        s.start_idle(access(0, 4096), None);
        let far = [GIB / 2, GIB - 4096, GIB / 3];
        for o in far {
            s.enqueue(access(o, 4096), cv.clone());
        }
        s.enqueue(Job::Flush, cv.clone());
        // Sequential: free for the head, but after the flush.
        s.enqueue(access(4096, 4096), cv.clone());
        let mut order = Vec::new();
        while let Some((t, _)) = s.next() {
            s.grant = None;
            order.push(t.job);
        }
        assert_eq!(order.len(), 5);
        for j in &order[..3] {
            assert!(matches!(j, Job::Access { offset, .. } if far.contains(offset)));
        }
        assert_eq!(order[3], Job::Flush);
        assert_eq!(order[4], access(4096, 4096));
        assert!(!s.busy);
    }

    /// A far request among a stream of near ones is served once it is
    /// older than the age limit; with no limit, only when the stream ends.
    #[test]
    fn nothing_starves() {
        let run = |age_limit: Duration| {
            let m = RotationalModel {
                age_limit,
                ..Default::default()
            };
            let mut s = Sched::new(Disk::new(m, GIB));
            let cv = Arc::new(Condvar::new());
            let mut near = uniform(5);
            let mut near = move || near() % (4 << 20);
            s.start_idle(access(near(), 4096), None);
            for _ in 0..30 {
                s.enqueue(access(near(), 4096), cv.clone());
            }
            s.enqueue(access(GIB - 4096, 4096), cv.clone());
            let far_arrived = s.disk.clock;
            for i in 0..20_000 {
                let (t, _) = s.next().unwrap();
                s.grant = None;
                if t.job == access(GIB - 4096, 4096) {
                    return Some((i, Duration::from_nanos(s.disk.clock - far_arrived), s.stats));
                }
                s.enqueue(access(near(), 4096), cv.clone());
            }
            None
        };
        let limit = RotationalModel::default().age_limit;
        let (i, waited, st) = run(limit).unwrap();
        eprintln!("far request served after {i} near ones, {waited:?}");
        let m = RotationalModel::default();
        let longest = m.full_stroke + m.revolution() + m.transfer_time(4096);
        assert!(
            waited > limit && waited <= limit + longest * 2,
            "{waited:?}"
        );
        assert_eq!(st.aged, 1);
        assert!(run(Duration::MAX).is_none(), "without the guard it starves");
    }
    #[test]
    fn unit_prng_in_range() {
        let mut s = 1u64;
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let u = next_unit(&mut s);
            assert!((0.0..1.0).contains(&u));
            sum += u;
        }
        assert!((sum / 10_000.0 - 0.5).abs() < 0.05);
    }

    #[test]
    fn tear_prefixes() {
        assert_eq!(Tear::Bytes(10).prefix(3, 100), 10);
        assert_eq!(Tear::Bytes(1000).prefix(3, 100), 100);
        assert_eq!(Tear::Sectors(1).prefix(500, 100), 12);
        assert_eq!(Tear::Sectors(2).prefix(500, 1000), 524);
        assert_eq!(Tear::Sectors(0).prefix(0, 1000), 0);
        assert_eq!(Tear::Sectors(1).prefix(1024, 4096), 512);
    }

    #[test]
    fn clone_kind_keeps_errno() {
        let k = clone_kind(&ErrorKind::Io(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(k.errno(), libc::EIO);
        assert!(matches!(
            clone_kind(&ErrorKind::NoSpace),
            ErrorKind::NoSpace
        ));
    }

    #[test]
    fn caps_rotational_when_modelled() {
        let m: Arc<dyn BlockDev> = Arc::new(MemDev::new(4096));
        assert!(!FaultDev::new(m.clone(), FaultPlan::new()).caps().rotational);
        assert!(
            FaultDev::with_rotational(m, RotationalModel::default())
                .caps()
                .rotational
        );
    }
}
