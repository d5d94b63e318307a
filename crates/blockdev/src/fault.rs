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
//! A single-actuator disk with no write cache. The head sits where the
//! last request ended (at 0 at first). With `C` the modelled capacity
//! (the wrapped device's size unless set) and `d = |offset - head|`, a read,
//! write or write-zeroes of `len` bytes costs
//!
//! ```text
//! sequential (d = 0):  T = len / media_rate
//! otherwise:           T = seek(d) + rotation + len / media_rate
//! seek(d)   = track_to_track + (full_stroke - track_to_track) * sqrt(min(d, C) / C)
//! rotation  = 60 s / rpm / 2                 (RotationalLatency::Average)
//!           = 60 s / rpm * u, u uniform [0,1) (RotationalLatency::Random, seeded)
//! ```
//!
//! With the defaults (0.5 ms track to track, 15 ms full stroke, 7200 rpm,
//! 150 MB/s) a random 4 KiB read costs on average
//! `0.5 + 14.5 * 8/15 = 8.23 ms` of seek (the mean of `sqrt(d/C)` over two
//! uniform random positions is 8/15), `4.17 ms` of rotation and `27 µs` of
//! transfer: about 12.4 ms, 80 IOPS. A flush costs `flush_cost`; trim and
//! extents cost nothing and leave the head where it is; write-zeroes is
//! modelled as a write (a disk has no cheaper way).
//!
//! Requests serialise through the one head (a mutex held while the request
//! is served), the sleep is real ([`std::thread::sleep`] of the modelled
//! time times `time_scale`), and the modelled time (unscaled) is added up
//! in a counter ([`FaultDev::modelled_time`]) so tests can check the model
//! without a clock.

use crate::{BlockDev, BlockError, BlockSizes, Caps, ErrorKind, Extent, Op, Result, ZeroFlags};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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
    /// Always half a revolution (deterministic).
    Average,
    /// Uniform in one revolution, from a simple PRNG with this seed
    /// (xorshift64*; repeatable for a given seed and request order).
    Random(u64),
}

/// The cost model of a spinning disk with one actuator and no write
/// cache, for [`FaultDev::rotational`].
///
/// The head sits where the last request ended (0 at first). With `C` the
/// capacity and `d = |offset - head|`, a read, write or write-zeroes of
/// `len` bytes costs
///
/// ```text
/// sequential (d = 0):  T = len / media_rate
/// otherwise:           T = seek(d) + rotation + len / media_rate
/// seek(d)   = track_to_track + (full_stroke - track_to_track) * sqrt(min(d, C) / C)
/// rotation  = 60 s / rpm / 2                  (RotationalLatency::Average)
///           = 60 s / rpm * u, u uniform [0,1)  (RotationalLatency::Random)
/// ```
///
/// A flush costs `flush_cost`; trim and extents are free and leave the
/// head in place. The defaults (0.5 ms, 15 ms, 7200 rpm, 150 MB/s, 2 ms
/// flush) give a mean random seek of 8.23 ms and about 12.4 ms per random
/// 4 KiB request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RotationalModel {
    /// Bytes the full stroke spans; 0: the wrapped device's size.
    pub capacity: u64,
    /// Seek to a neighbouring track, and the least cost of any seek.
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
    /// modelled time is still counted).
    pub time_scale: f64,
}

impl Default for RotationalModel {
    fn default() -> Self {
        RotationalModel {
            capacity: 0,
            track_to_track: Duration::from_micros(500),
            full_stroke: Duration::from_millis(15),
            rpm: 7200,
            latency: RotationalLatency::Average,
            media_rate: 150_000_000,
            flush_cost: Duration::from_millis(2),
            time_scale: 1.0,
        }
    }
}

impl RotationalModel {
    /// Seek time over `distance` bytes on a disk of `capacity` bytes
    /// (0 for no distance).
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

    /// Cost of a transfer of `len` bytes at `offset` with the head at
    /// `head`, drawing rotational latency from `rng`.
    fn access(&self, head: u64, offset: u64, len: u64, capacity: u64, rng: &mut u64) -> Duration {
        let transfer = self.transfer_time(len);
        if offset == head {
            return transfer;
        }
        let rotation = match self.latency {
            RotationalLatency::Average => self.revolution() / 2,
            RotationalLatency::Random(_) => self.revolution().mul_f64(next_unit(rng)),
        };
        self.seek_time(offset.abs_diff(head), capacity) + rotation + transfer
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

/// The head of the modelled disk.
struct Head {
    model: RotationalModel,
    capacity: u64,
    pos: u64,
    rng: u64,
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
    head: Option<Mutex<Head>>,
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
            head: None,
            delayed_ns: AtomicU64::new(0),
            modelled_ns: AtomicU64::new(0),
        }
    }

    /// Wrap `inner`, as slow as a spinning disk, with no faults.
    pub fn with_rotational(inner: Arc<dyn BlockDev>, model: RotationalModel) -> FaultDev {
        FaultDev::new(inner, FaultPlan::new()).rotational(model)
    }

    /// Make the device as slow as `model` says (and report it rotational).
    pub fn rotational(mut self, model: RotationalModel) -> FaultDev {
        let capacity = if model.capacity == 0 {
            self.inner.size()
        } else {
            model.capacity
        };
        let rng = match model.latency {
            RotationalLatency::Random(0) | RotationalLatency::Average => 0x9E37_79B9_7F4A_7C15,
            RotationalLatency::Random(seed) => seed,
        };
        self.head = Some(Mutex::new(Head {
            model,
            capacity,
            pos: 0,
            rng,
        }));
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

    /// Run `f` as the disk's head would: charge and sleep the modelled
    /// time, holding the head so requests serialise.
    fn serve<T>(&self, op: Op, offset: u64, len: u64, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let Some(head) = &self.head else {
            return f();
        };
        let mut h = head.lock().unwrap_or_else(|p| p.into_inner());
        let cost = match op {
            Op::Read | Op::Write | Op::WriteZeroes if len > 0 => {
                let Head {
                    model,
                    capacity,
                    pos,
                    rng,
                } = &mut *h;
                let t = model.access(*pos, offset, len, *capacity, rng);
                *pos = offset.saturating_add(len);
                t
            }
            Op::Flush => h.model.flush_cost,
            _ => Duration::ZERO,
        };
        if !cost.is_zero() {
            let ns = u64::try_from(cost.as_nanos()).unwrap_or(u64::MAX);
            self.modelled_ns.fetch_add(ns, Ordering::Relaxed);
            let scale = h.model.time_scale;
            if scale > 0.0 && scale.is_finite() {
                std::thread::sleep(cost.mul_f64(scale));
            }
        }
        let r = f();
        drop(h);
        r
    }
}

impl BlockDev for FaultDev {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn caps(&self) -> Caps {
        let mut c = self.inner.caps();
        if self.head.is_some() {
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
        let (mut a, mut b) = (42u64, 42u64);
        for i in 0..1000u64 {
            let x = m.access(0, 4096 * (i + 1), 0, 1 << 30, &mut a);
            let y = m.access(0, 4096 * (i + 1), 0, 1 << 30, &mut b);
            assert_eq!(x, y);
            let seek = m.seek_time(4096 * (i + 1), 1 << 30);
            assert!(x >= seek && x < seek + m.revolution());
        }
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
