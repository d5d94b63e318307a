//! The transmission phase: requests in, replies out, several in flight.
//!
//! Leader/follower: each of a connection's worker threads in turn takes
//! the reader, reads one request (with its payload), gives the reader to
//! the next, does the I/O and writes its reply under the writer lock.
//! Requests complete out of order, as the protocol allows; no request is
//! handed between threads.
//!
//! What a request holds is granted by the connection's and the server's
//! budgets ([`crate::limits`]), whole, before it holds anything: a
//! write's payload before its first byte is read (its buffer grows as the
//! bytes arrive), a read's buffer before it is allocated. Lengths are 64 bits
//! under extended headers, so nothing is sized from a header: a payload
//! longer than the largest request is drained through a small scratch
//! buffer (compact headers, at most 4 GiB) or ends the connection
//! (extended headers, as the spec recommends), and a read longer than
//! that is refused before anything is granted.
//!
//! The socket's read timeout is a short tick, so a reader waiting for the
//! next request notices a server that is stopping, and a payload that
//! stops arriving is timed out by the time since its last byte (one that
//! trickles, a byte now and then, is left to the server's stall watch:
//! [`crate::limits`]).

use crate::handshake::{Negotiated, BASE_ALLOCATION_ID};
use crate::limits::{Budget, BufPool, Grant, Watch};
use crate::proto::{self, cflag, cmd, err, reply, Replies, Request, EXTENDED_REQUEST_LEN};
use crate::Export;
use cairn_blockdev::{BlockError, ErrorKind, Op, ZeroFlags};
use std::io::{self, BufReader, Read, Write};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Replies up to this size are copied into one buffer and sent with one
/// write; larger read data goes in a second write.
const COALESCE: usize = 64 << 10;
/// A write's payload is read (and its buffer grown) in steps of this size.
const PAYLOAD_STEP: usize = 256 << 10;
/// Reply data goes out in writes of this size at most, each one progress
/// the server sees ([`Watch`]; it also sees what the client takes from
/// the socket).
const SEND_STEP: usize = 1 << 20;
/// The socket's read buffer.
const READ_BUFFER: usize = 128 << 10;
/// Trim and zeroing are handed to the device in pieces of this size at
/// most (see [`in_pieces`]).
const EFFECT_STEP: u64 = 1 << 30;
/// Block status descriptors in one reply, at most (the spec asks for no
/// more than 2^20; this keeps a reply under 1 MiB, and its grant with it:
/// [`status_reply_len`]).
const MAX_DESCRIPTORS: usize = 1 << 16;

/// A block status reply of `descriptors` descriptors (at most
/// [`MAX_DESCRIPTORS`]), in bytes: chunk header, context id (and under
/// extended headers the descriptor count), the descriptors.
fn status_reply_len(replies: Replies, descriptors: usize) -> u64 {
    let n = descriptors as u64;
    if replies == Replies::Extended {
        32 + 8 + 16 * n
    } else {
        20 + 4 + 8 * n
    }
}

/// Why a connection ended.
#[derive(Debug)]
pub(crate) enum End {
    /// NBD_CMD_DISC, end of stream, or the server is stopping.
    Clean,
    /// A request with a bad magic: the stream lost sync.
    BadMagic,
    /// A payload longer than the largest request under extended headers
    /// (the spec has the server disconnect rather than drain it).
    TooLong(u64),
    /// No request for longer than the idle timeout.
    Idle,
    /// The socket failed, or a request stalled past the I/O timeout.
    Io(io::Error),
}

/// What a connection may hold and how long it may stall.
pub(crate) struct Limits<'a> {
    /// Worker threads, so requests in flight.
    pub workers: usize,
    /// Largest read or write accepted, in bytes.
    pub max_request: u32,
    /// Bytes of requests this connection may hold at once.
    pub conn_budget: u64,
    /// Bytes of requests all connections may hold at once.
    pub server_budget: &'a Budget,
    /// Buffers kept between requests.
    pub pool: &'a BufPool,
    /// A request whose bytes stop arriving for this long ends the connection.
    pub io_timeout: Duration,
    /// No request for this long ends the connection (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Set when the server stops: readers stop taking requests.
    pub draining: &'a AtomicBool,
    /// What the server watches of this connection.
    pub watch: &'a Watch,
    /// The connection's socket, looked at while a request waits for
    /// budget: a client that is gone takes its waits out of the queue
    /// (`None`: no socket, as in [`crate::session_over_bytes`]).
    pub socket: Option<RawFd>,
}

struct Shared<'a, R, W> {
    reader: Mutex<BufReader<R>>,
    writer: Mutex<W>,
    export: &'a Export,
    neg: Negotiated,
    limits: &'a Limits<'a>,
    conn_budget: Budget,
    /// The reader takes no more requests (NBD_CMD_DISC, end of stream,
    /// an error): each worker leaves once its request is answered.
    closing: AtomicBool,
    /// The connection is lost (the stream broke or lost sync): requests
    /// in flight give up their waits and their remaining pieces too.
    /// Not set by a disconnect, after which the spec has the server
    /// finish every request it took.
    dead: AtomicBool,
    /// A reply failed to go out (the client stopped taking replies for
    /// the I/O timeout, or the socket broke): the stream may hold part of
    /// a reply, so nothing more is sent. Workers queued on the writer see
    /// it and leave at once rather than each waiting out the timeout.
    broken: AtomicBool,
    end: Mutex<Option<End>>,
    /// When `peer_lost` last polled the socket: milliseconds after
    /// `born`, or [`NEVER_POLLED`].
    polled_ms: AtomicU64,
    born: Instant,
}

/// How often, at most, a connection's waiters poll its socket.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// `Shared::polled_ms` before the first poll.
const NEVER_POLLED: u64 = u64::MAX;

/// Serve requests until the client disconnects, the stream fails or the
/// server drains. `reader` must have a short read timeout (see the module
/// doc); `writer` a write timeout. Returns why it ended, and whether the
/// replies sent are whole (no write of one failed part-way: something
/// may still follow them, such as TLS's close_notify).
pub(crate) fn run<R: Read + Send, W: Write + Send>(
    reader: R,
    writer: W,
    export: &Export,
    neg: Negotiated,
    limits: &Limits,
) -> (End, bool) {
    let shared = Shared {
        reader: Mutex::new(BufReader::with_capacity(READ_BUFFER, reader)),
        writer: Mutex::new(writer),
        export,
        neg,
        limits,
        conn_budget: Budget::new(limits.conn_budget),
        closing: AtomicBool::new(false),
        dead: AtomicBool::new(false),
        broken: AtomicBool::new(false),
        end: Mutex::new(None),
        polled_ms: AtomicU64::new(NEVER_POLLED),
        born: Instant::now(),
    };
    std::thread::scope(|s| {
        for _ in 1..limits.workers.max(1) {
            s.spawn(|| worker(&shared));
        }
        worker(&shared);
    });
    let end = shared.end.lock().map(|mut e| e.take()).unwrap_or(None);
    (
        end.unwrap_or(End::Clean),
        !shared.broken.load(Ordering::Acquire),
    )
}

/// One request read off the stream.
struct Job {
    req: Request,
    /// A payload the server does not take (too long, or on a command
    /// that has none) was read and discarded: the request is refused.
    discarded: bool,
}

fn worker<R: Read, W: Write>(sh: &Shared<R, W>) {
    let pool = sh.limits.pool;
    // In-flight work stops for a server stop or a lost connection, not
    // for a disconnect (see `Shared::giving_up`).
    let give_up = || sh.giving_up();
    loop {
        let mut grant = Grant::watched(&sh.conn_budget, sh.limits.server_budget, sh.limits.watch);
        let mut buf = pool.get();
        let job = {
            let Ok(mut r) = sh.reader.lock() else { return };
            if sh.closing.load(Ordering::Acquire) {
                return;
            }
            match read_job(sh, &mut r, &mut buf, &mut grant) {
                Ok(Some(job)) => job,
                Ok(None) => {
                    sh.finish(End::Clean);
                    return;
                }
                Err(e) => {
                    sh.finish(e);
                    return;
                }
            }
        };
        let mut out = pool.get();
        let data = handle(sh, &job, &mut buf, &mut out, &mut grant, &give_up);
        let sent = match sh.writer.lock() {
            // An earlier reply failed: this one cannot be delivered in
            // a stream that may end inside that one.
            Ok(_) if sh.broken.load(Ordering::Acquire) => Err(None),
            Ok(mut w) => {
                let sent = send(&mut *w, &out, data, sh.limits.watch);
                if sent.is_err() {
                    sh.broken.store(true, Ordering::Release);
                }
                sent.map_err(|e| Some(send_error(e, sh.limits.io_timeout)))
            }
            Err(_) => Err(Some(io::Error::other("a worker panicked"))),
        };
        pool.put(out);
        pool.put(buf);
        drop(grant);
        match sent {
            Ok(()) => {}
            Err(Some(e)) => {
                sh.finish(End::Io(e));
                return;
            }
            Err(None) => return,
        }
    }
}

/// Write a reply's header (and short data) `head`, then `data`, in steps
/// of at most [`SEND_STEP`], telling `watch` of each.
fn send<W: Write>(w: &mut W, head: &[u8], data: Option<&[u8]>, watch: &Watch) -> io::Result<()> {
    watch.begin_reply((head.len() + data.map_or(0, <[u8]>::len)) as u64);
    let sent = (|| {
        for part in [head, data.unwrap_or_default()] {
            for step in part.chunks(SEND_STEP) {
                w.write_all(step)?;
                watch.progress();
            }
        }
        w.flush()
    })();
    watch.done();
    sent
}

impl<R, W> Shared<'_, R, W> {
    /// Whether [`POLL_EVERY`] has passed since the socket was last polled
    /// (and, if so, it counts as polled now).
    fn poll_due(&self) -> bool {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let every = u64::try_from(POLL_EVERY.as_millis()).unwrap_or(u64::MAX);
        let last = self.polled_ms.load(Ordering::Relaxed);
        if last != NEVER_POLLED && now.saturating_sub(last) < every {
            return false;
        }
        self.polled_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// The reader stops. A clean end (NBD_CMD_DISC, end of stream between
    /// requests) or an idle one leaves the requests in flight to finish
    /// and be answered, as the spec requires for NBD_CMD_DISC; any other
    /// end means the connection is lost, and they give up too.
    fn finish(&self, end: End) {
        if !matches!(end, End::Clean | End::Idle) {
            self.dead.store(true, Ordering::Release);
        }
        self.closing.store(true, Ordering::Release);
        if let Ok(mut e) = self.end.lock() {
            e.get_or_insert(end);
        }
    }

    /// The reader stops waiting for request bytes and budget: the
    /// connection is ending or the server stopping.
    fn stopping(&self) -> bool {
        self.closing.load(Ordering::Acquire) || self.limits.draining.load(Ordering::Acquire)
    }

    /// Requests in flight give up (their waits for budget, the rest of a
    /// long trim or zeroing): the server is stopping or the connection is
    /// lost. A disconnect alone is not a reason: NBD_CMD_DISC came after
    /// them, and the spec has the server handle them all first.
    fn giving_up(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.limits.draining.load(Ordering::Acquire)
    }

    /// Whether the client is gone: the server cut the connection, or the
    /// socket was reset (`POLLERR`; a clean close cannot be told from a
    /// half-close: Linux reports `POLLHUP` only with `POLLIN`); then the
    /// connection is lost, as if a read had failed. Asked at each tick of
    /// a wait for budget, under the budget's lock, so the socket is
    /// polled at most once per [`POLL_EVERY`] for the connection, however
    /// many waiters it has and however often they are woken: a reader waiting for a payload's grant reads nothing
    /// meanwhile, so without this a client that died kept its waits in
    /// the queue, where they counted as others waiting and could get
    /// honest slow clients cut. (Not asked between the pieces of a trim
    /// or zeroing, which are finished after a disconnect. A client that
    /// only shut its sending side, `POLLRDHUP`, or closed a Unix socket
    /// with requests still queued in it, is not gone: an end of stream
    /// leaves the requests it sent to be answered.)
    fn peer_lost(&self) -> bool {
        if self.dead.load(Ordering::Acquire) {
            return true;
        }
        let Some(fd) = self.limits.socket else {
            return false;
        };
        let mut gone = self.limits.watch.was_cut();
        if !gone && self.poll_due() {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: `p` is one valid pollfd that lives across the call;
            // the connection keeps `fd` open while its requests run. A
            // timeout of 0 does not wait. (POLLERR is always reported.)
            let n = unsafe { libc::poll(&mut p, 1, 0) };
            gone = n > 0 && p.revents & libc::POLLERR != 0;
        }
        if gone {
            self.finish(End::Io(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the client went away while its request waited for memory",
            )));
        }
        gone
    }
}

/// A failed reply, said as what happened: the socket's write timeout
/// shows as EAGAIN ("Resource temporarily unavailable"), which is the
/// client not taking replies for `timeout`.
fn send_error(e: io::Error, timeout: Duration) -> io::Error {
    if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client took no reply bytes for {} s", timeout.as_secs()),
        )
    } else {
        e
    }
}

fn is_tick(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Fill `buf` from `r`; a stall of more than `timeout` fails, and so does
/// the server stopping (the request is dropped). The stall is timed from
/// the first tick without bytes (at most a tick after the last byte), so
/// the clock is not read for every request. `on_read` is told of each
/// read that returns: the bytes it brought (0: a tick without any).
fn read_full<R: Read>(
    r: &mut R,
    mut buf: &mut [u8],
    timeout: Duration,
    stopping: &dyn Fn() -> bool,
    on_read: &mut dyn FnMut(usize),
) -> Result<(), End> {
    let mut stalled: Option<Instant> = None;
    while !buf.is_empty() {
        match r.read(buf) {
            Ok(0) => return Err(End::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => {
                buf = &mut buf[n..];
                stalled = None;
                on_read(n);
            }
            Err(e) if is_tick(&e) => {
                on_read(0);
                if stopping() {
                    return Err(End::Clean);
                }
                if stalled.get_or_insert_with(Instant::now).elapsed() > timeout {
                    return Err(End::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no request bytes for {} s", timeout.as_secs()),
                    )));
                }
            }
            Err(e) => return Err(End::Io(e)),
        }
    }
    Ok(())
}

/// Read the next request and, for a write, its payload into `buf`, granted
/// by `grant` as it arrives. `Ok(None)`: disconnect (NBD_CMD_DISC, end of
/// stream between requests, or the server stopping).
fn read_job<R: Read, W>(
    sh: &Shared<R, W>,
    r: &mut BufReader<R>,
    buf: &mut Vec<u8>,
    grant: &mut Grant,
) -> Result<Option<Job>, End> {
    let limits = sh.limits;
    let stopping = || sh.stopping();
    let mut h = [0u8; EXTENDED_REQUEST_LEN];
    // End of stream before a header starts is a clean (if rude) exit.
    // Idle time counts from the first tick without a request.
    let mut idle_since: Option<Instant> = None;
    loop {
        match r.read(&mut h[..1]) {
            Ok(0) => return Ok(None),
            Ok(_) => break,
            Err(e) if is_tick(&e) => {
                if stopping() {
                    return Ok(None);
                }
                if limits
                    .idle_timeout
                    .is_some_and(|t| idle_since.get_or_insert_with(Instant::now).elapsed() > t)
                {
                    return Err(End::Idle);
                }
            }
            Err(e) => return Err(End::Io(e)),
        }
    }
    let h = &mut h[..sh.neg.replies.request_len()];
    read_full(r, &mut h[1..], limits.io_timeout, &stopping, &mut |_| {})?;
    let req = proto::parse_request(h, sh.neg.replies).ok_or(End::BadMagic)?;
    if req.kind == cmd::DISC {
        return Ok(None);
    }
    let payload = payload_len(&req, sh.neg.replies);
    let mut discarded = false;
    if payload == 0 {
        return Ok(Some(Job { req, discarded }));
    }
    if req.kind == cmd::WRITE && payload <= u64::from(limits.max_request) {
        let watch = limits.watch;
        // The whole payload is granted in one take before a byte of it is
        // read (see `crate::limits`): granted a step at a time as it
        // arrived, connections part-way through their writes could hold
        // the budget between them, each waiting for its next step, for
        // ever. A grant that has to wait starts the payload's stall clock
        // for the server's watch there: the client's bytes queue in the
        // socket meanwhile. Its pace is timed from the grant (a client
        // whose grant waited long has not sent at its pace meanwhile,
        // only what its socket held). (The clock is read only then and
        // once a payload takes more than one read: not for each small
        // write.)
        let mut clock = None;
        if !grant.grow(payload, &|| true) {
            let since = watch.stamp();
            if !grant.grow(payload, &|| stopping() || sh.peer_lost()) {
                return Ok(None);
            }
            clock = Some((watch.next_seq(), since, watch.stamp()));
        }
        // The server is told how much has arrived from the second read
        // on: the first may bring only what the read buffer held with
        // the header, the second what queued in the socket. So a client
        // whose bytes were queued shows them before it is judged, and
        // one that is judged has sent no more than it shows.
        let (mut got, mut reads) = (0u64, 0u32);
        let mut tell = |n: usize| {
            got += n as u64;
            reads += 1;
            if reads > 1 && got < payload {
                let (seq, since, granted) = *clock.get_or_insert_with(|| {
                    let now = watch.stamp();
                    (watch.next_seq(), now, now)
                });
                watch.receiving(seq, since, granted, payload, got);
            }
        };
        buf.clear();
        let mut left = payload;
        let mut read = Ok(());
        while left > 0 && read.is_ok() {
            // The buffer grows as the bytes arrive: what a client that
            // trickles makes the server allocate is what it sent.
            let n = left.min(PAYLOAD_STEP as u64);
            let at = buf.len();
            buf.resize(at + n as usize, 0);
            read = read_full(r, &mut buf[at..], limits.io_timeout, &stopping, &mut tell);
            left -= n;
        }
        watch.received_all();
        read?;
    } else if sh.neg.replies == Replies::Extended && payload > u64::from(limits.max_request) {
        return Err(End::TooLong(payload));
    } else {
        // Drained through the read buffer, never held: the stream stays
        // in sync and the request is refused.
        let mut left = payload;
        let mut scrap = [0u8; 4096];
        while left > 0 {
            let n = left.min(scrap.len() as u64) as usize;
            read_full(
                r,
                &mut scrap[..n],
                limits.io_timeout,
                &stopping,
                &mut |_| {},
            )?;
            left -= n as u64;
        }
        discarded = true;
    }
    Ok(Some(Job { req, discarded }))
}

/// Bytes of payload after the header of `req`. A write always carries
/// its length in payload: the spec has clients set
/// [`cflag::PAYLOAD_LEN`] on it under extended headers, and the bytes
/// follow either way, so they are read either way. Under extended
/// headers the flag gives any other command a payload too (which this
/// server takes for no command); under compact headers the flag is
/// invalid and means nothing for the stream.
fn payload_len(req: &Request, replies: Replies) -> u64 {
    let flagged = replies == Replies::Extended && req.flags & cflag::PAYLOAD_LEN != 0;
    if req.kind == cmd::WRITE || flagged {
        req.len
    } else {
        0
    }
}

/// The NBD error for a device error.
fn wire_error(e: &BlockError) -> u32 {
    match &e.kind {
        ErrorKind::OutOfRange => err::EINVAL,
        ErrorKind::ReadOnly => err::EPERM,
        ErrorKind::Unsupported => err::ENOTSUP,
        ErrorKind::NoSpace => err::ENOSPC,
        ErrorKind::Corrupt(_) => err::EIO,
        ErrorKind::Io(_) => err::from_errno(e.kind.errno()),
    }
}

/// Do the request; put the reply (or its header) in `out` and return
/// read data to send after it.
fn handle<'b, R, W>(
    sh: &Shared<R, W>,
    job: &Job,
    buf: &'b mut Vec<u8>,
    out: &mut Vec<u8>,
    grant: &mut Grant,
    give_up: &dyn Fn() -> bool,
) -> Option<&'b [u8]> {
    let req = job.req;
    let replies = sh.neg.replies;
    if let Err(e) = check(sh, &job.req, job.discarded) {
        error_reply(replies, &req, out, e, "request refused");
        return None;
    }
    let dev = &*sh.export.dev;
    let off = req.offset;
    let len = req.len;
    let fua = req.flags & cflag::FUA != 0;
    let done = match req.kind {
        cmd::READ => {
            if len == 0 {
                // A chunked reply may not carry an empty data chunk.
                ok_reply(replies, &req, out);
                return None;
            }
            if !grant.grow(len, &|| give_up() || sh.peer_lost()) {
                error_reply(replies, &req, out, err::ESHUTDOWN, "server stopping");
                return None;
            }
            // `check` refused lengths over `max_request` (32 bits).
            buf.clear();
            buf.resize(len as usize, 0);
            match dev.read_at(buf, off) {
                Ok(()) => {
                    if replies.chunked() {
                        proto::chunk_header(
                            out,
                            replies,
                            reply::FLAG_DONE,
                            reply::OFFSET_DATA,
                            req.cookie,
                            off,
                            8 + len,
                        );
                        out.extend_from_slice(&off.to_be_bytes());
                    } else {
                        proto::simple_reply(out, 0, req.cookie);
                    }
                    if buf.len() <= COALESCE {
                        out.extend_from_slice(buf);
                        return None;
                    }
                    return Some(&buf[..]);
                }
                Err(e) => Err(e),
            }
        }
        cmd::WRITE => {
            if len == 0 {
                Ok(())
            } else {
                dev.write_at(&buf[..len as usize], off, fua)
            }
        }
        cmd::FLUSH => {
            if sh.export.is_read_only() {
                Ok(())
            } else {
                dev.flush()
            }
        }
        cmd::TRIM => in_pieces(Op::Trim, off, len, give_up, |o, n| dev.trim(o, n, fua)),
        cmd::WRITE_ZEROES => {
            let flags = ZeroFlags {
                fua,
                may_trim: req.flags & cflag::NO_HOLE == 0,
                fast: req.flags & cflag::FAST_ZERO != 0,
            };
            in_pieces(Op::WriteZeroes, off, len, give_up, |o, n| {
                dev.write_zeroes(o, n, flags)
            })
        }
        cmd::CACHE => Ok(()),
        cmd::BLOCK_STATUS => {
            // The reply is built in memory, up to 1 MiB: granted before
            // the device is asked, as a read's buffer is (unbudgeted, a
            // few hundred clients' block status held that much each).
            // At most a descriptor per 512 bytes asked for (one with
            // REQ_ONE): a small request is granted little. The reply is
            // written straight from the device's extents, never more
            // descriptors than granted, with no list between
            // (`block_status_reply`). (The device's own list is the
            // device's: at most 65,536 extents from an image, 1,024 from
            // a file.)
            let most = if req.flags & cflag::REQ_ONE != 0 {
                1
            } else {
                let per_sector = req.len.div_ceil(512).saturating_add(1);
                MAX_DESCRIPTORS.min(usize::try_from(per_sector).unwrap_or(MAX_DESCRIPTORS))
            };
            let wait = || give_up() || sh.peer_lost();
            if !grant.grow(status_reply_len(replies, most), &wait) {
                error_reply(replies, &req, out, err::ESHUTDOWN, "server stopping");
                return None;
            }
            match dev.extents(off, len) {
                Ok(extents) => {
                    block_status_reply(out, replies, &req, &extents, most);
                    return None;
                }
                Err(e) => Err(e),
            }
        }
        _ => {
            error_reply(replies, &req, out, err::EINVAL, "unknown command");
            return None;
        }
    };
    match done {
        Ok(()) => ok_reply(replies, &req, out),
        Err(e) => {
            let msg = e.to_string();
            error_reply(replies, &req, out, wire_error(&e), &msg);
        }
    }
    None
}

/// Do `op` over `off..off + len` in pieces of [`EFFECT_STEP`], so that a
/// stopping server waits for one piece, not for a 64-bit trim or zeroing
/// (a device may take time, or per-block memory such as a write-back
/// cache's index, in proportion to the length). A stop between pieces
/// fails the request with ESHUTDOWN, the range partly done, which a
/// trim or a zeroing the client will retry may be.
fn in_pieces(
    what: Op,
    off: u64,
    len: u64,
    give_up: &dyn Fn() -> bool,
    op: impl Fn(u64, u64) -> cairn_blockdev::Result<()>,
) -> cairn_blockdev::Result<()> {
    let end = off.saturating_add(len);
    let mut at = off;
    while at < end {
        if at > off && give_up() {
            let stop = io::Error::from_raw_os_error(libc::ESHUTDOWN);
            return Err(BlockError::io(what, off, len, stop));
        }
        let n = (end - at).min(EFFECT_STEP);
        op(at, n)?;
        at += n;
    }
    Ok(())
}

/// Refuse what the export cannot take, before touching the device.
fn check<R, W>(sh: &Shared<R, W>, req: &Request, discarded: bool) -> Result<(), u32> {
    let size = sh.export.dev.size();
    let end = req.offset.checked_add(req.len);
    let writes = matches!(req.kind, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES);
    // Unknown commands are refused by `handle` itself.
    if writes && sh.export.is_read_only() {
        return Err(err::EPERM);
    }
    if discarded || (req.kind == cmd::READ && req.len > u64::from(sh.limits.max_request)) {
        return Err(err::EINVAL);
    }
    // Only extended headers have a payload flag (and `read_job` took its
    // payload); in a compact header it is a client's error.
    if req.flags & cflag::PAYLOAD_LEN != 0
        && (sh.neg.replies != Replies::Extended || req.kind != cmd::WRITE)
    {
        return Err(err::EINVAL);
    }
    if req.flags & cflag::FAST_ZERO != 0 && req.kind != cmd::WRITE_ZEROES {
        return Err(err::EINVAL);
    }
    // A flag the protocol does not define, as qemu-nbd and nbdkit answer.
    if req.flags & !cflag::KNOWN != 0 {
        return Err(err::EINVAL);
    }
    let ranged = matches!(
        req.kind,
        cmd::READ | cmd::WRITE | cmd::TRIM | cmd::CACHE | cmd::WRITE_ZEROES | cmd::BLOCK_STATUS
    );
    if ranged && end.is_none_or(|e| e > size) {
        return Err(if writes { err::ENOSPC } else { err::EINVAL });
    }
    if req.kind == cmd::BLOCK_STATUS && (!sh.neg.base_allocation || req.len == 0) {
        return Err(err::EINVAL);
    }
    Ok(())
}

/// Success without payload: a simple reply, or under extended headers
/// (which allow no simple replies) a final NONE chunk.
fn ok_reply(replies: Replies, req: &Request, out: &mut Vec<u8>) {
    // A read's reply must be chunks once structured replies are on.
    let chunk =
        replies == Replies::Extended || (replies == Replies::Structured && req.kind == cmd::READ);
    if chunk {
        proto::chunk_header(
            out,
            replies,
            reply::FLAG_DONE,
            reply::NONE,
            req.cookie,
            req.offset,
            0,
        );
    } else {
        proto::simple_reply(out, 0, req.cookie);
    }
}

/// An error: a chunk with a message where chunks are required (reads and
/// block status with structured replies, everything with extended
/// headers), else a simple reply.
fn error_reply(replies: Replies, req: &Request, out: &mut Vec<u8>, e: u32, msg: &str) {
    let chunk = match replies {
        Replies::Extended => true,
        Replies::Structured => matches!(req.kind, cmd::READ | cmd::BLOCK_STATUS),
        Replies::Simple => false,
    };
    if chunk {
        proto::error_chunk(out, replies, req.cookie, req.offset, e, msg);
    } else {
        proto::simple_reply(out, e, req.cookie);
    }
}

/// Holes and zeroes reported only for whole aligned 4 KiB blocks: the
/// edges of an unaligned one (a zero run inside a stored chunk) are
/// reported as data, which is always a safe answer. qemu-img read an
/// image wrong from unaligned hole extents.
const STATUS_ALIGN: u64 = 4096;

/// The pieces of `extents`, which start at `offset`, with every edge
/// between a hole or zero range and data moved into the hole to a
/// [`STATUS_ALIGN`] boundary (what falls outside is data), handed to
/// `piece` in order while it returns `true`. Pieces of one kind may
/// follow each other (the caller merges them); none is empty. Nothing is
/// collected: a block status holds no list but its reply, which its grant
/// covers.
fn aligned_holes(
    offset: u64,
    extents: &[cairn_blockdev::Extent],
    piece: &mut dyn FnMut(cairn_blockdev::Extent) -> bool,
) {
    let mut at = offset;
    for (i, e) in extents.iter().enumerate() {
        let end = at.saturating_add(e.len);
        let pieces = if e.hole || e.zero {
            // The request's own start and end stay where they are: only
            // the edges between extents are the device's.
            let from = if i == 0 {
                at
            } else {
                at.next_multiple_of(STATUS_ALIGN).min(end)
            };
            let to = if i + 1 == extents.len() {
                end
            } else {
                (end / STATUS_ALIGN * STATUS_ALIGN).max(from)
            };
            [
                cairn_blockdev::Extent::data(from - at),
                cairn_blockdev::Extent {
                    len: to - from,
                    ..*e
                },
                cairn_blockdev::Extent::data(end - to),
            ]
        } else {
            let none = cairn_blockdev::Extent::data(0);
            [*e, none, none]
        };
        for p in pieces {
            if p.len > 0 && !piece(p) {
                return;
            }
        }
        at = end;
    }
}

/// The base:allocation descriptors (length, state flags) of a reply
/// covering at most `want` bytes from `extents`, which start at `offset`
/// (see [`aligned_holes`]), pieces of one kind merged, at most `most` of
/// them: each handed to `desc`; returns how many. Stops reading
/// `extents` at the first piece past the last descriptor.
fn status_descriptors(
    offset: u64,
    want: u64,
    extents: &[cairn_blockdev::Extent],
    most: usize,
    desc: &mut dyn FnMut(u64, u32),
) -> usize {
    let mut left = want;
    let mut last: Option<(u64, u32)> = None;
    let mut count = 0;
    aligned_holes(offset, extents, &mut |e| {
        if left == 0 {
            return false;
        }
        let n = e.len.min(left);
        let flags = (if e.hole { proto::STATE_HOLE } else { 0 })
            | (if e.zero { proto::STATE_ZERO } else { 0 });
        match &mut last {
            Some((l, f)) if *f == flags => *l += n,
            // `last` is the last one there is room for.
            Some(_) if count + 1 >= most => return false,
            Some(d) => {
                desc(d.0, d.1);
                count += 1;
                *d = (n, flags);
            }
            None => last = Some((n, flags)),
        }
        left -= n;
        true
    });
    if let Some((l, f)) = last {
        desc(l, f);
        count += 1;
    }
    count
}

/// One status chunk for base:allocation, clamped to the request: 32-bit
/// descriptors (NBD_REPLY_TYPE_BLOCK_STATUS) with structured replies,
/// 64-bit ones (NBD_REPLY_TYPE_BLOCK_STATUS_EXT) with extended headers,
/// so one descriptor may cover more than 4 GiB. At most `most`
/// descriptors (REQ_ONE: 1), as granted ([`status_reply_len`]). They are
/// counted in a first walk of `extents` and written in a second, so
/// nothing is built but the reply, and `out` grows by its length only.
fn block_status_reply(
    out: &mut Vec<u8>,
    replies: Replies,
    req: &Request,
    extents: &[cairn_blockdev::Extent],
    most: usize,
) {
    let extended = replies == Replies::Extended;
    // Compact lengths are 32 bits: covering no more than that keeps every
    // merged descriptor within them.
    let want = if extended {
        req.len
    } else {
        req.len.min(u64::from(u32::MAX))
    };
    let count = status_descriptors(req.offset, want, extents, most, &mut |_, _| {});
    // The device reported nothing: the conservative answer, one
    // descriptor of data.
    let n = count.max(1);
    let (kind, len) = if extended {
        (reply::BLOCK_STATUS_EXT, 8 + 16 * n as u64)
    } else {
        (reply::BLOCK_STATUS, 4 + 8 * n as u64)
    };
    out.reserve_exact(usize::try_from(status_reply_len(replies, n)).unwrap_or(0));
    proto::chunk_header(
        out,
        replies,
        reply::FLAG_DONE,
        kind,
        req.cookie,
        req.offset,
        len,
    );
    out.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    if extended {
        // The descriptor count is optional; given, it must match.
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    let mut put = |l: u64, f: u32| {
        if extended {
            out.extend_from_slice(&l.to_be_bytes());
            // The status word is 64 bits with the high half zero.
            out.extend_from_slice(&0u32.to_be_bytes());
        } else {
            out.extend_from_slice(&(l as u32).to_be_bytes());
        }
        out.extend_from_slice(&f.to_be_bytes());
    };
    if count == 0 {
        put(want, 0);
    } else {
        status_descriptors(req.offset, want, extents, most, &mut put);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_blockdev::{BlockDev, Caps, Extent};
    use std::cell::RefCell;
    use std::sync::Arc;

    /// A device of 8 GiB that holds nothing, whose zeroing takes 100 ms a
    /// call and is recorded, and whose block status records what the
    /// server budget had granted when it was asked.
    struct Slow {
        zeroed: Mutex<Vec<(u64, u64)>>,
        budget: Arc<Budget>,
        granted: Mutex<Option<u64>>,
    }

    impl BlockDev for Slow {
        fn size(&self) -> u64 {
            8 << 30
        }
        fn caps(&self) -> Caps {
            Caps {
                writable: true,
                zeroes: true,
                extents: true,
                ..Caps::default()
            }
        }
        fn read_at(&self, buf: &mut [u8], _: u64) -> cairn_blockdev::Result<()> {
            buf.fill(0);
            Ok(())
        }
        fn write_at(&self, _: &[u8], _: u64, _: bool) -> cairn_blockdev::Result<()> {
            Ok(())
        }
        fn flush(&self) -> cairn_blockdev::Result<()> {
            Ok(())
        }
        fn trim(&self, _: u64, _: u64, _: bool) -> cairn_blockdev::Result<()> {
            Ok(())
        }
        fn write_zeroes(&self, off: u64, len: u64, _: ZeroFlags) -> cairn_blockdev::Result<()> {
            std::thread::sleep(Duration::from_millis(100));
            if let Ok(mut z) = self.zeroed.lock() {
                z.push((off, len));
            }
            Ok(())
        }
        fn extents(&self, _: u64, len: u64) -> cairn_blockdev::Result<Vec<Extent>> {
            if let Ok(mut g) = self.granted.lock() {
                *g = Some(self.budget.used());
            }
            Ok(vec![Extent::hole(len)])
        }
    }

    /// Serve `requests` (already encoded, compact headers with structured
    /// replies and base:allocation) to `dev` with two workers and the
    /// server budget `budget`; what the server wrote back.
    fn serve_requests(dev: Arc<dyn BlockDev>, budget: &Budget, requests: &[u8]) -> Vec<u8> {
        let export = Export {
            name: String::new(),
            description: String::new(),
            dev,
            read_only: false,
        };
        let neg = Negotiated {
            export: 0,
            replies: Replies::Structured,
            base_allocation: true,
        };
        let pool = BufPool::new(1 << 20);
        let draining = AtomicBool::new(false);
        let watch = Watch::default();
        let limits = Limits {
            workers: 2,
            max_request: 1 << 20,
            conn_budget: 4 << 20,
            server_budget: budget,
            pool: &pool,
            io_timeout: Duration::from_secs(60),
            idle_timeout: None,
            draining: &draining,
            watch: &watch,
            socket: None,
        };
        let mut out = Vec::new();
        run(requests, &mut out, &export, neg, &limits);
        out
    }

    fn slow() -> Arc<Slow> {
        Arc::new(Slow {
            zeroed: Mutex::new(Vec::new()),
            budget: Arc::new(Budget::new(8 << 20)),
            granted: Mutex::new(None),
        })
    }

    fn encoded(kind: u16, cookie: u64, offset: u64, len: u64) -> Vec<u8> {
        let r = Request {
            flags: 0,
            kind,
            cookie,
            offset,
            len,
        };
        proto::encode_request(&r, Replies::Structured).unwrap_or_default()
    }

    /// A block status holds its largest reply's grant from before the
    /// device is asked until the reply is sent; it was granted nothing.
    /// A small one is granted little (a descriptor per 512 bytes asked
    /// for, and one more), not the largest reply.
    #[test]
    fn a_block_status_is_granted_its_reply() {
        for (len, most) in [(1u64 << 30, MAX_DESCRIPTORS), (4096, 9)] {
            let dev = slow();
            let input = encoded(cmd::BLOCK_STATUS, 3, 0, len);
            let out = serve_requests(dev.clone(), &dev.budget, &input);
            let granted = dev.granted.lock().map(|g| *g).unwrap_or_default();
            assert_eq!(granted, Some(status_reply_len(Replies::Structured, most)));
            // One descriptor: the hole.
            assert_eq!(out.len(), 20 + 4 + 8, "{out:?}");
            assert_eq!(dev.budget.used(), 0, "the grant was not given back");
        }
    }

    /// NBD_CMD_DISC right behind a zeroing of almost 4 GiB (four pieces):
    /// the zeroing is finished and answered before the connection ends,
    /// as the spec requires. Before, the disconnect made it give up after
    /// its first piece, answered ESHUTDOWN.
    #[test]
    fn a_disconnect_lets_the_requests_before_it_finish() {
        let dev = slow();
        let len = u64::from(u32::MAX);
        let mut input = encoded(cmd::WRITE_ZEROES, 7, 0, len);
        input.extend(encoded(cmd::DISC, 8, 0, 0));
        let out = serve_requests(dev.clone(), &dev.budget, &input);
        let mut want = Vec::new();
        proto::simple_reply(&mut want, 0, 7);
        assert_eq!(out, want, "the zeroing's reply");
        let zeroed = dev.zeroed.lock().map(|z| z.clone()).unwrap_or_default();
        assert_eq!(zeroed.iter().map(|z| z.1).sum::<u64>(), len, "{zeroed:?}");
    }

    #[test]
    fn long_effects_go_in_pieces_and_stop_between_them() {
        let done = RefCell::new(Vec::new());
        let op = |o, n| {
            done.borrow_mut().push((o, n));
            Ok(())
        };
        let len = 2 * EFFECT_STEP + 5;
        assert!(in_pieces(Op::Trim, 7, len, &|| false, op).is_ok());
        assert_eq!(
            *done.borrow(),
            [
                (7, EFFECT_STEP),
                (7 + EFFECT_STEP, EFFECT_STEP),
                (7 + 2 * EFFECT_STEP, 5)
            ]
        );
        // A stop: the piece under way finishes, the rest is refused with
        // ESHUTDOWN on the wire.
        done.borrow_mut().clear();
        let e = in_pieces(Op::WriteZeroes, 0, len, &|| true, op).err();
        assert_eq!(done.borrow().len(), 1);
        assert_eq!(e.as_ref().map(wire_error), Some(err::ESHUTDOWN));
        // Nothing to do is no call at all.
        done.borrow_mut().clear();
        assert!(in_pieces(Op::Trim, 0, 0, &|| true, op).is_ok());
        assert!(done.borrow().is_empty());
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;
    use cairn_blockdev::Extent;

    /// What [`aligned_holes`] makes of `extents`, pieces of one kind
    /// merged: (length, hole) each.
    fn pieces(offset: u64, extents: &[Extent]) -> Vec<(u64, bool)> {
        let mut v = Vec::new();
        aligned_holes(offset, extents, &mut |e| {
            e.push_to(&mut v);
            true
        });
        v.iter().map(|e| (e.len, e.hole)).collect()
    }

    /// Holes between data keep only their whole aligned blocks; the
    /// request's own edges stay put; aligned holes are unchanged.
    #[test]
    fn holes_are_reported_by_whole_aligned_blocks() {
        let small = [Extent::data(100), Extent::hole(5000), Extent::data(10)];
        assert_eq!(pieces(0, &small), [(5110, false)]);
        let unaligned = [Extent::data(100), Extent::hole(9000), Extent::data(10)];
        assert_eq!(
            pieces(0, &unaligned),
            [(4096, false), (4096, true), (918, false)]
        );
        let aligned = [Extent::data(4096), Extent::hole(8192), Extent::data(1)];
        assert_eq!(
            pieces(0, &aligned),
            [(4096, false), (8192, true), (1, false)]
        );
        // A request from offset 10 into a hole, ending inside it.
        let edges = [Extent::hole(100)];
        assert_eq!(pieces(10, &edges), [(100, true)]);
    }
}

/// What the test thread allocates, counted by a global allocator for the
/// crate's unit tests (each thread counts its own).
#[cfg(test)]
mod counted {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    struct Counting;

    thread_local! {
        /// Bytes live, and the most live since [`peak_of`] began.
        static LIVE: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    }

    fn count(add: usize, sub: usize) {
        let _ = LIVE.try_with(|c| {
            let (live, peak) = c.get();
            let live = (live + add).saturating_sub(sub);
            c.set((live, peak.max(live)));
        });
    }

    // SAFETY: every call is handed to `System` as it came; the counting
    // allocates nothing (a const thread-local of plain integers).
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            count(l.size(), 0);
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            count(0, l.size());
            // SAFETY: the caller's contract, passed on.
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            count(new, l.size());
            // SAFETY: the caller's contract, passed on.
            unsafe { System.realloc(p, l, new) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// The most bytes `f` had allocated at once on this thread, beyond
    /// what was live when it began.
    pub(crate) fn peak_of(f: impl FnOnce()) -> usize {
        let base = LIVE.with(|c| {
            let (live, _) = c.get();
            c.set((live, live));
            live
        });
        f();
        LIVE.with(|c| c.get().1) - base
    }
}

#[cfg(test)]
mod status_memory_tests {
    use super::*;
    use cairn_blockdev::Extent;

    /// Issue: a block status built the device's extents again as a list
    /// of aligned pieces, and then a list of descriptors, before it
    /// encoded the reply: its grant covered the reply only (a descriptor
    /// per 512 bytes asked for and one more, at most 65,536: b2b947d), so
    /// 200,000 extents of a device made some 3.2 MB of lists for a
    /// 512 KiB grant, and a REQ_ONE request (granted one descriptor) as
    /// much. Now the reply is written as the extents are walked, and no
    /// more is allocated than the reply granted.
    #[test]
    fn a_block_status_allocates_no_more_than_its_grant() {
        const N: usize = 200_000;
        let extents: Vec<Extent> = (0..N)
            .map(|i| {
                if i % 2 == 0 {
                    Extent::data(4096)
                } else {
                    Extent::hole(4096)
                }
            })
            .collect();
        for (replies, flags) in [
            (Replies::Structured, 0),
            (Replies::Extended, 0),
            (Replies::Structured, cflag::REQ_ONE),
        ] {
            let req = Request {
                flags,
                kind: cmd::BLOCK_STATUS,
                cookie: 1,
                offset: 0,
                len: (N * 4096) as u64,
            };
            let most = if flags & cflag::REQ_ONE != 0 {
                1
            } else {
                MAX_DESCRIPTORS
            };
            let granted = status_reply_len(replies, most);
            let mut out = Vec::new();
            let peak = counted::peak_of(|| {
                block_status_reply(&mut out, replies, &req, &extents, most);
            });
            assert!(
                peak as u64 <= granted,
                "{replies:?} {flags}: {peak} bytes allocated for a grant of {granted}"
            );
            assert_eq!(out.len() as u64, granted, "{replies:?} {flags}");
            // The descriptors alternate data and hole, 4 KiB each.
            let (head, size) = if replies == Replies::Extended {
                (32 + 8, 16)
            } else {
                (20 + 4, 8)
            };
            for (i, d) in out[head..].chunks(size).enumerate() {
                let len = if size == 16 {
                    proto::be64(&d[..8])
                } else {
                    u64::from(proto::be32(&d[..4]))
                };
                let state = proto::be32(&d[size - 4..]);
                let hole = proto::STATE_HOLE | proto::STATE_ZERO;
                assert_eq!((len, state), (4096, if i % 2 == 0 { 0 } else { hole }));
            }
        }
    }
}
