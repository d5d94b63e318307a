//! What one client, or all of them together, may make the server hold.
//!
//! Every byte of request payload and read data the server holds is
//! granted first by two [`Budget`]s: the connection's and the server's.
//! A write's payload is granted a step at a time as it arrives, so a
//! client that announces 32 MiB and then trickles holds only what it sent;
//! a read's buffer is granted before it is allocated. When a budget is
//! spent, the worker that wants more waits (and so stops reading its
//! socket: TCP pushes back on the client) until a reply frees some.
//! Buffers between requests are kept in one [`BufPool`] of bounded size.
//!
//! So the server holds at most the server budget in requests, plus the
//! pool, plus a read buffer and a few worker threads per connection,
//! whatever clients send; [`crate::ServerConfig`] sets each bound.
//!
//! A client that sends reads and never takes the replies keeps its grants
//! until its socket's write times out; a few such clients could spend the
//! server's budget and make every other client wait that long. So each
//! connection says when its reply last made progress ([`Sending`]), and
//! while the server budget has threads waiting, the server closes a
//! connection whose reply has taken no bytes for
//! [`crate::ServerConfig::stall_under_pressure`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often a waiting worker looks whether its connection is closing.
const WAIT_TICK: Duration = Duration::from_millis(100);

/// Bytes that may be held at once, granted and returned.
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
    waiting: usize,
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
    /// not free; returns how many were taken. `None`: `cancelled` said to
    /// give up first.
    fn take(&self, n: u64, cancelled: &dyn Fn() -> bool) -> Option<u64> {
        let n = n.min(self.cap);
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        while used.bytes + n > self.cap {
            if cancelled() {
                return None;
            }
            used.waiting += 1;
            used = self
                .freed
                .wait_timeout(used, WAIT_TICK)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            used.waiting -= 1;
        }
        used.bytes += n;
        Some(n)
    }

    fn give_back(&self, n: u64) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.bytes = used.bytes.saturating_sub(n);
        // A notify is a futex system call even with nobody waiting: on
        // every request's return, that was a measurable share of a
        // served file's 4 KiB writes.
        if used.waiting > 0 {
            self.freed.notify_all();
        }
    }

    /// Whether a thread is waiting for bytes of this budget now.
    pub(crate) fn contended(&self) -> bool {
        self.used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waiting
            > 0
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
}

impl<'a> Grant<'a> {
    pub(crate) fn new(conn: &'a Budget, server: &'a Budget) -> Grant<'a> {
        Grant {
            conn,
            server,
            held: (0, 0),
        }
    }

    /// Grow the grant by `n` bytes, from the connection's budget first
    /// (always in that order, so two grants never wait on each other
    /// crosswise). `false`: cancelled while waiting; nothing was added.
    pub(crate) fn grow(&mut self, n: u64, cancelled: &dyn Fn() -> bool) -> bool {
        if n == 0 {
            return true;
        }
        let Some(c) = self.conn.take(n, cancelled) else {
            return false;
        };
        let Some(s) = self.server.take(n, cancelled) else {
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

/// When a connection's reply last took bytes, while one is being sent.
#[derive(Debug)]
pub(crate) struct Sending {
    epoch: Instant,
    /// Milliseconds from `epoch` to the last progress, plus one; 0 while
    /// no reply is being sent.
    last: AtomicU64,
}

impl Default for Sending {
    fn default() -> Self {
        Sending {
            epoch: Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl Sending {
    /// A reply is being sent, and has just taken bytes (or begun).
    pub(crate) fn progress(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last.store(ms + 1, Ordering::Relaxed);
    }

    /// No reply is being sent.
    pub(crate) fn done(&self) {
        self.last.store(0, Ordering::Relaxed);
    }

    /// How long the reply being sent has taken no bytes (`None`: none is
    /// being sent).
    pub(crate) fn stalled_for(&self) -> Option<Duration> {
        let last = self.last.load(Ordering::Relaxed).checked_sub(1)?;
        Some(
            self.epoch
                .elapsed()
                .saturating_sub(Duration::from_millis(last)),
        )
    }
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

    #[test]
    fn a_budget_is_contended_while_a_grant_waits() {
        let server = Arc::new(Budget::new(10));
        let conn = Budget::new(10);
        let mut g = Grant::new(&conn, &server);
        assert!(g.grow(10, &|| false));
        assert!(!server.contended());
        let stop = Arc::new(AtomicBool::new(false));
        let t = {
            let (server, stop) = (server.clone(), stop.clone());
            std::thread::spawn(move || {
                let conn = Budget::new(10);
                let mut h = Grant::new(&conn, &server);
                h.grow(1, &|| stop.load(Ordering::SeqCst))
            })
        };
        let mut seen = false;
        for _ in 0..200 {
            seen = server.contended();
            if seen {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(seen, "a waiting grant did not show");
        stop.store(true, Ordering::SeqCst);
        assert!(!t.join().unwrap_or(true));
        assert!(!server.contended());
    }

    #[test]
    fn a_reply_stalls_from_its_last_progress_until_done() {
        let s = Sending::default();
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
