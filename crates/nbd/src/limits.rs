//! What one client, or all of them together, may make the server hold.
//!
//! Every byte of request payload and read data the server holds is
//! granted first by two [`Budget`]s: the connection's and the server's.
//! Each request takes its whole grant in one [`Grant::grow`] before it
//! holds anything: a read's buffer before it is allocated, a write's
//! payload before its first byte is read (the buffer itself still grows
//! as the bytes arrive, so what is allocated is what was sent). When a
//! budget is spent, the worker that wants more waits (and so stops
//! reading its socket: TCP pushes back on the client) until a reply frees
//! some; waiters are served first come, first served ([`Budget`]).
//! Buffers between requests are kept in one [`BufPool`] of bounded
//! size.
//!
//! Nobody waits for budget while holding part of a grant, so requests can
//! never wait on each other in a ring: each holder waits only for its own
//! client (to send the rest of a payload, or to take a reply). A write's
//! payload was once granted a step at a time as it arrived; then a few
//! connections each part-way through a 32 MiB write could hold the whole
//! budget between them, each waiting for the next step, forever.
//!
//! So the server holds at most the server budget in requests, plus the
//! pool, plus a read buffer and a few worker threads per connection,
//! whatever clients send; [`crate::ServerConfig`] sets each bound.
//!
//! A client that keeps a grant and does not let it go (it sends reads and
//! never takes the replies, or announces a write and trickles its
//! payload, a byte now and then so no timeout fires) could, with a few
//! others, spend the server's budget and make every other client wait. So
//! the server watches each connection ([`Watch`]): whether a reply is
//! being sent and since when it last moved, how much of a write's payload
//! has arrived and since when, and how many of its threads wait for the
//! server budget. While threads of other connections wait for it, the
//! server closes a connection whose reply has not moved (neither a write
//! of it returned nor its client took 16 KiB from the socket), or whose
//! payload has not brought 16 KiB, for
//! [`crate::ServerConfig::stall_under_pressure`]; or whose payload falls
//! behind the pace that would bring all of it within
//! [`crate::ServerConfig::payload_time_under_pressure`] of its grant, or
//! whose reply's client falls behind the pace that would take all of it
//! within that time of its first write ([`behind_pace`]). The floor alone
//! let a client keep a grant for ever by sending 16 KiB just inside each
//! stall time, or taking as much of a reply; the pace makes the grant a
//! write or a read holds, times how long it holds it, bounded.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often a waiting worker looks whether its connection is closing.
const WAIT_TICK: Duration = Duration::from_millis(100);

/// Bytes that may be held at once, granted and returned. Waiters are
/// served first come, first served: a waiter is granted only once every
/// one that came before it was (or gave up), and only when its grant
/// fits. Served in no order, a large request could wait for ever behind a
/// stream of small ones that each fit in what was free, and the reverse.
#[derive(Debug)]
pub(crate) struct Budget {
    cap: u64,
    /// Bytes granted, and threads waiting for some to be given back.
    used: Mutex<Held>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct Held {
    bytes: u64,
    /// Threads waiting: the tickets they drew, in the order they came.
    queue: VecDeque<u64>,
    /// The ticket the next waiter draws.
    next_ticket: u64,
}

impl Budget {
    pub(crate) fn new(cap: u64) -> Budget {
        Budget {
            cap: cap.max(1),
            used: Mutex::new(Held::default()),
            freed: Condvar::new(),
        }
    }

    /// Take `n` bytes (at most the whole budget), waiting while they are
    /// not free or others came first; returns how many were taken.
    /// `None`: `cancelled` said to give up first (it is asked before
    /// waiting at all).
    /// `watch`, if given, counts this thread among its connection's
    /// waiters while it waits.
    ///
    /// No deadlock: the head of the queue waits only for bytes granted
    /// already, which their holders give back without waiting for any
    /// budget (see the module doc), and the most it waits for is the
    /// whole budget.
    fn take(&self, n: u64, cancelled: &dyn Fn() -> bool, watch: Option<&Watch>) -> Option<u64> {
        let n = n.min(self.cap);
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        if used.queue.is_empty() && used.bytes + n <= self.cap {
            used.bytes += n;
            return Some(n);
        }
        if cancelled() {
            return None;
        }
        let ticket = used.next_ticket;
        used.next_ticket += 1;
        used.queue.push_back(ticket);
        // (Both counts change under the budget's lock: the server
        // compares them.)
        if let Some(w) = watch {
            w.waiting.fetch_add(1, Ordering::Relaxed);
        }
        let granted = loop {
            if used.queue.front() == Some(&ticket) && used.bytes + n <= self.cap {
                break true;
            }
            if cancelled() {
                break false;
            }
            used = self
                .freed
                .wait_timeout(used, WAIT_TICK)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        if let Some(at) = used.queue.iter().position(|&t| t == ticket) {
            used.queue.remove(at);
        }
        if let Some(w) = watch {
            w.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        if granted {
            used.bytes += n;
        }
        // The next in line may fit in what is left, or be the head now.
        if !used.queue.is_empty() {
            self.freed.notify_all();
        }
        granted.then_some(n)
    }

    fn give_back(&self, n: u64) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.bytes = used.bytes.saturating_sub(n);
        // A notify is a futex system call even with nobody waiting: on
        // every request's return, that was a measurable share of a
        // served file's 4 KiB writes.
        if !used.queue.is_empty() {
            self.freed.notify_all();
        }
    }

    /// Whether threads of other connections than `watch`'s wait for
    /// bytes of this budget now.
    pub(crate) fn others_wait(&self, watch: &Watch) -> bool {
        let used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.queue.len() > watch.waiting.load(Ordering::Relaxed)
    }

    /// Threads waiting now.
    #[cfg(test)]
    pub(crate) fn waiters(&self) -> usize {
        self.used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .queue
            .len()
    }

    /// Bytes granted now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }
}

/// Bytes granted by a connection's budget and the server's together,
/// returned to both when dropped.
pub(crate) struct Grant<'a> {
    conn: &'a Budget,
    server: &'a Budget,
    /// Taken from `conn` and from `server` (each clamped to its budget).
    held: (u64, u64),
    /// The connection's watch, told of waits for the server budget.
    watch: Option<&'a Watch>,
}

impl<'a> Grant<'a> {
    pub(crate) fn new(conn: &'a Budget, server: &'a Budget) -> Grant<'a> {
        Grant {
            conn,
            server,
            held: (0, 0),
            watch: None,
        }
    }

    /// The same, its waits for the server budget counted by `watch`.
    pub(crate) fn watched(conn: &'a Budget, server: &'a Budget, watch: &'a Watch) -> Grant<'a> {
        Grant {
            watch: Some(watch),
            ..Grant::new(conn, server)
        }
    }

    /// Grow the grant by `n` bytes, from the connection's budget first
    /// (always in that order, so two grants never wait on each other
    /// crosswise). `false`: cancelled while waiting; nothing was added.
    pub(crate) fn grow(&mut self, n: u64, cancelled: &dyn Fn() -> bool) -> bool {
        if n == 0 {
            return true;
        }
        let Some(c) = self.conn.take(n, cancelled, None) else {
            return false;
        };
        let Some(s) = self.server.take(n, cancelled, self.watch) else {
            self.conn.give_back(c);
            return false;
        };
        self.held.0 += c;
        self.held.1 += s;
        true
    }

    /// Return everything granted so far.
    pub(crate) fn release(&mut self) {
        let (c, s) = std::mem::take(&mut self.held);
        self.server.give_back(s);
        self.conn.give_back(c);
    }
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// What the server watches of a connection: the reply it is sending, the
/// write payload it is receiving, its threads waiting for the server
/// budget, and whether the server closed it for a stalled reply or
/// payload.
#[derive(Debug)]
pub(crate) struct Watch {
    epoch: Instant,
    /// Milliseconds from `epoch` to the last write of a reply that
    /// returned, plus one; 0 while no reply is being sent.
    last: AtomicU64,
    /// The last sequence number drawn for a reply or a payload: each is
    /// told from the next by its own, not by a stamp (two can begin in
    /// the same millisecond).
    seq: AtomicU64,
    /// The reply being sent: its sequence number, 0 while none is.
    reply: AtomicU64,
    /// That reply's length.
    reply_len: AtomicU64,
    /// Milliseconds from `epoch`, plus one, to its first write.
    reply_began: AtomicU64,
    /// A write's payload being received under its grant: its sequence
    /// number, 0 while none is.
    payload: AtomicU64,
    /// Milliseconds from `epoch`, plus one, to when its stall clock
    /// started (see [`Watch::receiving`]).
    payload_since: AtomicU64,
    /// Bytes of that payload received.
    received: AtomicU64,
    /// That payload's length.
    payload_len: AtomicU64,
    /// Milliseconds from `epoch`, plus one, to when its grant was taken.
    granted: AtomicU64,
    /// The connection's threads waiting for the server budget.
    waiting: AtomicUsize,
    /// Closed by the server for a stalled reply or payload.
    cut: AtomicBool,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            reply: AtomicU64::new(0),
            reply_len: AtomicU64::new(0),
            reply_began: AtomicU64::new(0),
            payload: AtomicU64::new(0),
            payload_since: AtomicU64::new(0),
            received: AtomicU64::new(0),
            payload_len: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            cut: AtomicBool::new(false),
        }
    }
}

impl Watch {
    /// Now, as a stamp for [`Watch::receiving`].
    pub(crate) fn stamp(&self) -> u64 {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        ms.saturating_add(1)
    }

    /// A sequence number for a reply or a payload (never 0).
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A reply of `len` bytes begins: its first write is under way.
    pub(crate) fn begin_reply(&self, len: u64) {
        let stamp = self.stamp();
        // (The reader sees `reply` 0 (set by `done`) or this reply's
        // number around anything it reads of these: see `Watch::reply`.)
        fence(Ordering::Release);
        self.reply_len.store(len, Ordering::Relaxed);
        self.reply_began.store(stamp, Ordering::Relaxed);
        self.reply.store(self.next_seq(), Ordering::Release);
        self.last.store(stamp, Ordering::Relaxed);
    }

    /// A write of the reply being sent has just returned.
    pub(crate) fn progress(&self) {
        self.last.store(self.stamp(), Ordering::Relaxed);
    }

    /// The reply being sent (`None`: none is, or another began while it
    /// was looked at).
    pub(crate) fn reply(&self) -> Option<Reply> {
        let seq = self.reply.load(Ordering::Acquire);
        if seq == 0 {
            return None;
        }
        let len = self.reply_len.load(Ordering::Relaxed);
        let began = self.reply_began.load(Ordering::Relaxed).checked_sub(1)?;
        fence(Ordering::Acquire);
        if self.reply.load(Ordering::Relaxed) != seq {
            return None;
        }
        Some(Reply {
            seq,
            began: self.epoch + Duration::from_millis(began),
            len,
        })
    }

    /// A write's payload of `len` bytes is being received under its
    /// grant, `got` bytes of it so far; `seq` (a [`Watch::next_seq`])
    /// tells it from the next. Its stall clock started at `since` (a
    /// [`Watch::stamp`]), its grant was taken at `granted` (a stamp too;
    /// the same one unless the grant waited).
    pub(crate) fn receiving(&self, seq: u64, since: u64, granted: u64, len: u64, got: u64) {
        // (Between two payloads `payload` was 0 (`received_all`): a
        // reader that sees any of these stores sees that or `seq` after
        // them, never the last payload's number.)
        fence(Ordering::Release);
        self.received.store(got, Ordering::Relaxed);
        self.payload_len.store(len, Ordering::Relaxed);
        self.granted.store(granted, Ordering::Relaxed);
        self.payload_since.store(since, Ordering::Relaxed);
        self.payload.store(seq, Ordering::Release);
    }

    /// No payload is being received.
    pub(crate) fn received_all(&self) {
        self.payload.store(0, Ordering::Release);
    }

    /// The payload being received (`None`: none is, or another began
    /// while it was looked at).
    pub(crate) fn payload(&self) -> Option<Payload> {
        let seq = self.payload.load(Ordering::Acquire);
        if seq == 0 {
            return None;
        }
        let got = self.received.load(Ordering::Relaxed);
        let len = self.payload_len.load(Ordering::Relaxed);
        let granted = self.granted.load(Ordering::Relaxed).checked_sub(1)?;
        let since = self.payload_since.load(Ordering::Relaxed).checked_sub(1)?;
        // (A payload that began between the loads is seen next time: the
        // fence keeps the loads above before the one below.)
        fence(Ordering::Acquire);
        if self.payload.load(Ordering::Relaxed) != seq {
            return None;
        }
        let at = |ms| self.epoch + Duration::from_millis(ms);
        Some(Payload {
            seq,
            since: at(since),
            granted: at(granted),
            len,
            got,
        })
    }

    /// No reply is being sent.
    pub(crate) fn done(&self) {
        self.reply.store(0, Ordering::Release);
        self.last.store(0, Ordering::Relaxed);
    }

    /// How long since a write of the reply being sent last returned
    /// (`None`: none is being sent).
    pub(crate) fn stalled_for(&self) -> Option<Duration> {
        let last = self.last.load(Ordering::Relaxed).checked_sub(1)?;
        Some(
            self.epoch
                .elapsed()
                .saturating_sub(Duration::from_millis(last)),
        )
    }

    /// The server closes the connection for a stalled reply or payload.
    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::Release);
    }

    /// Whether the server closed the connection for a stalled reply or
    /// payload.
    pub(crate) fn was_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }
}

/// A write's payload being received, as [`Watch::payload`] sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Payload {
    /// Tells this payload from the next one of the connection.
    pub seq: u64,
    /// When its stall clock started: when its grant began to wait, else
    /// when its grant was taken.
    pub since: Instant,
    /// When its grant was taken.
    pub granted: Instant,
    /// Its length.
    pub len: u64,
    /// Bytes of it received.
    pub got: u64,
}

/// A reply being sent, as [`Watch::reply`] sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reply {
    /// Tells this reply from the next one of the connection.
    pub seq: u64,
    /// When its first write began.
    pub began: Instant,
    /// Its length.
    pub len: u64,
}

/// Whether a payload of `len` bytes, `got` of them received `elapsed`
/// after its grant, is behind the pace that brings all of it within
/// `grace` + `window` of the grant: after the grace, `len / window` bytes
/// a second. A client sending at least that fast from its grant on is
/// never behind, however its bytes bunch; one sending slower is, within
/// `grace` + `window` at the latest, whatever it sends now and then to
/// look alive.
pub(crate) fn behind_pace(
    len: u64,
    got: u64,
    elapsed: Duration,
    grace: Duration,
    window: Duration,
) -> bool {
    let late = elapsed.saturating_sub(grace);
    if late.is_zero() {
        return false;
    }
    let due = if late >= window {
        len
    } else {
        // (Below `len`: late < window.)
        (u128::from(len) * late.as_nanos() / window.as_nanos()) as u64
    };
    got < due
}

/// Request buffers kept between requests, shared by all connections, at
/// most `cap` bytes of capacity in all; a buffer larger than a quarter of
/// that is freed instead of kept.
#[derive(Debug)]
pub(crate) struct BufPool {
    cap: usize,
    idle: Mutex<(Vec<Vec<u8>>, usize)>,
}

impl BufPool {
    pub(crate) fn new(cap: usize) -> BufPool {
        BufPool {
            cap,
            idle: Mutex::new((Vec::new(), 0)),
        }
    }

    /// An empty buffer, with capacity from an earlier request if one is kept.
    pub(crate) fn get(&self) -> Vec<u8> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        match idle.0.pop() {
            Some(b) => {
                idle.1 -= b.capacity();
                b
            }
            None => Vec::new(),
        }
    }

    /// Keep `buf` for a later request, if the pool has room for it.
    pub(crate) fn put(&self, mut buf: Vec<u8>) {
        let size = buf.capacity();
        if size == 0 || size > self.cap / 4 {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.1 + size <= self.cap {
            buf.clear();
            idle.1 += size;
            idle.0.push(buf);
        }
    }

    /// Capacity kept now.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn grants_come_back_when_dropped() {
        let conn = Budget::new(100);
        let server = Budget::new(150);
        {
            let mut g = Grant::new(&conn, &server);
            assert!(g.grow(60, &|| false));
            assert!(g.grow(40, &|| false));
            assert_eq!((conn.used(), server.used()), (100, 100));
        }
        assert_eq!((conn.used(), server.used()), (0, 0));
    }

    #[test]
    fn a_spent_budget_waits_until_cancelled() {
        let conn = Budget::new(100);
        let server = Budget::new(100);
        let mut g = Grant::new(&conn, &server);
        assert!(g.grow(100, &|| false));
        let other = Budget::new(100);
        let mut h = Grant::new(&other, &server);
        // The server budget is spent: the second grant waits and gives up.
        assert!(!h.grow(1, &|| true));
        assert_eq!((other.used(), server.used()), (0, 100));
    }

    #[test]
    fn a_waiting_grant_goes_on_when_another_is_released() {
        let server = Arc::new(Budget::new(10));
        let conn = Budget::new(10);
        let mut g = Grant::new(&conn, &server);
        assert!(g.grow(10, &|| false));
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let (server, done) = (server.clone(), done.clone());
            std::thread::spawn(move || {
                let conn = Budget::new(10);
                let mut h = Grant::new(&conn, &server);
                let got = h.grow(5, &|| false);
                done.store(true, Ordering::SeqCst);
                got
            })
        };
        std::thread::sleep(Duration::from_millis(150));
        assert!(!done.load(Ordering::SeqCst), "granted beyond the budget");
        g.release();
        assert!(t.join().unwrap_or(false));
    }

    /// Grants are served in the order they were asked for: a large one
    /// waiting is not overtaken by a small one that fits in what is
    /// free (before, the small one took it, and a stream of them could
    /// keep the large one waiting for ever), and one that gives up lets
    /// the next in line go on.
    #[test]
    fn waiters_are_served_first_come_first_served() {
        let server = Arc::new(Budget::new(10));
        let (c1, c2) = (Budget::new(10), Budget::new(10));
        let mut nine = Grant::new(&c1, &server);
        let mut one = Grant::new(&c2, &server);
        assert!(nine.grow(9, &|| false) && one.grow(1, &|| false));
        // Each waiter: its grant held until `release` is set.
        let waiter = |n: u64, give_up: Arc<AtomicBool>, release: Arc<AtomicBool>| {
            let server = server.clone();
            let done = Arc::new(AtomicBool::new(false));
            let d = done.clone();
            let t = std::thread::spawn(move || {
                let conn = Budget::new(10);
                let mut g = Grant::new(&conn, &server);
                let got = g.grow(n, &|| give_up.load(Ordering::SeqCst));
                d.store(got, Ordering::SeqCst);
                while got && !release.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                got
            });
            (t, done)
        };
        let until = |what: &dyn Fn() -> bool| {
            (0..300).any(|_| {
                std::thread::sleep(Duration::from_millis(10));
                what()
            })
        };
        let flag = || Arc::new(AtomicBool::new(false));
        let (big_release, small_release) = (flag(), flag());
        let (big, big_done) = waiter(10, flag(), big_release.clone());
        assert!(until(&|| server.waiters() == 1));
        let (small, small_done) = waiter(1, flag(), small_release.clone());
        assert!(until(&|| server.waiters() == 2));
        // One byte free: the small grant fits, but the large came first.
        one.release();
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !small_done.load(Ordering::SeqCst),
            "the small grant overtook the large one"
        );
        nine.release();
        assert!(until(&|| big_done.load(Ordering::SeqCst)));
        assert!(!small_done.load(Ordering::SeqCst));
        big_release.store(true, Ordering::SeqCst);
        assert!(until(&|| small_done.load(Ordering::SeqCst)));
        small_release.store(true, Ordering::SeqCst);
        assert!(big.join().unwrap_or(false) && small.join().unwrap_or(false));
        assert_eq!(server.used(), 0);

        // The head gives up: the next in line is served.
        assert!(nine.grow(9, &|| false) && one.grow(1, &|| false));
        let (give_up, release) = (flag(), flag());
        let (big, _) = waiter(10, give_up.clone(), release.clone());
        assert!(until(&|| server.waiters() == 1));
        let (small, small_done) = waiter(1, flag(), release.clone());
        assert!(until(&|| server.waiters() == 2));
        one.release();
        assert!(!one.grow(1, &|| true), "a newcomer overtook the queue");
        std::thread::sleep(Duration::from_millis(200));
        assert!(!small_done.load(Ordering::SeqCst));
        give_up.store(true, Ordering::SeqCst);
        assert!(until(&|| small_done.load(Ordering::SeqCst)));
        release.store(true, Ordering::SeqCst);
        assert!(!big.join().unwrap_or(true) && small.join().unwrap_or(false));
        nine.release();
        assert_eq!(server.used(), 0);
    }

    #[test]
    fn waits_of_other_connections_are_told_from_a_connections_own() {
        let server = Arc::new(Budget::new(10));
        let conn = Budget::new(10);
        let mine = Arc::new(Watch::default());
        let theirs = Arc::new(Watch::default());
        let mut g = Grant::watched(&conn, &server, &mine);
        assert!(g.grow(10, &|| false));
        assert!(!server.others_wait(&mine) && !server.others_wait(&theirs));
        // A thread of `mine` waits: no other connection does.
        let stop = Arc::new(AtomicBool::new(false));
        let wait = |watch: Arc<Watch>| {
            let (server, stop) = (server.clone(), stop.clone());
            std::thread::spawn(move || {
                let conn = Budget::new(10);
                let mut h = Grant::watched(&conn, &server, &watch);
                h.grow(1, &|| stop.load(Ordering::SeqCst))
            })
        };
        let until = |what: &dyn Fn() -> bool| {
            (0..300).any(|_| {
                std::thread::sleep(Duration::from_millis(10));
                what()
            })
        };
        let t = wait(mine.clone());
        assert!(
            until(&|| server.others_wait(&theirs)),
            "a waiting grant did not show"
        );
        assert!(!server.others_wait(&mine));
        // Then one of `theirs` too.
        let u = wait(theirs.clone());
        assert!(until(&|| server.others_wait(&mine)));
        stop.store(true, Ordering::SeqCst);
        assert!(!t.join().unwrap_or(true) && !u.join().unwrap_or(true));
        assert!(!server.others_wait(&mine) && !server.others_wait(&theirs));
    }

    #[test]
    fn a_reply_stalls_from_its_last_progress_until_done() {
        let s = Watch::default();
        assert_eq!(s.stalled_for(), None);
        s.progress();
        std::thread::sleep(Duration::from_millis(30));
        let stalled = s.stalled_for().unwrap_or_default();
        assert!(stalled >= Duration::from_millis(20), "{stalled:?}");
        s.progress();
        assert!(s.stalled_for().unwrap_or(Duration::MAX) < stalled);
        s.done();
        assert_eq!(s.stalled_for(), None);
    }

    /// A payload that keeps to the pace (its length over the window, a
    /// second) is never behind; one that brings 16 KiB just inside each
    /// stall time, as the floor asks, falls behind once the grace is
    /// over, and every payload is due whole by grace + window.
    #[test]
    fn a_payload_is_held_to_a_pace_after_its_grace() {
        let (grace, window) = (Duration::from_secs(1), Duration::from_secs(4));
        let len = 1u64 << 20;
        let at = |ms: u64| Duration::from_millis(ms);
        for ms in (0..6000).step_by(50) {
            let honest = len * ms / 4000;
            assert!(
                !behind_pace(len, honest.min(len), at(ms), grace, window),
                "{ms}"
            );
        }
        // The trickler: 16 KiB every 0.9 s.
        let trickled = |ms: u64| (ms / 900 + 1) * (16 << 10);
        assert!(!behind_pace(len, trickled(1000), at(1000), grace, window));
        assert!(behind_pace(len, trickled(1200), at(1200), grace, window));
        // Due whole by grace + window, however much came before.
        assert!(behind_pace(len, len - 1, at(5000), grace, window));
        assert!(!behind_pace(len, len, at(60_000), grace, window));
        // A window of zero: due whole once the grace is over.
        assert!(behind_pace(len, len - 1, at(1001), grace, Duration::ZERO));
    }

    #[test]
    fn more_than_the_whole_budget_is_clamped_not_deadlocked() {
        let conn = Budget::new(8);
        let server = Budget::new(8);
        let mut g = Grant::new(&conn, &server);
        assert!(g.grow(1 << 20, &|| false));
        assert_eq!(server.used(), 8);
    }

    #[test]
    fn the_pool_keeps_at_most_its_cap() {
        let pool = BufPool::new(1000);
        pool.put(Vec::with_capacity(200));
        pool.put(Vec::with_capacity(200));
        pool.put(Vec::with_capacity(300)); // over a quarter: freed
        assert_eq!(pool.kept(), 400);
        for _ in 0..10 {
            pool.put(Vec::with_capacity(250));
        }
        assert!(pool.kept() <= 1000);
        let b = pool.get();
        assert!(b.is_empty() && b.capacity() > 0);
    }
}
