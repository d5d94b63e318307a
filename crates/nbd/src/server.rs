//! Listeners, the accept loop, connections and clean shutdown.

use crate::handshake::{greet, options, refuse, Outcome, TlsState};
use crate::limits::{behind_pace, Budget, BufPool, Watch};
use crate::tls::{SendWithin, TlsIo};
use crate::transmission::{self, End, Limits};
use crate::Export;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the server behaves, and what clients may make it hold.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Requests in flight per connection (worker threads per connection).
    pub workers: usize,
    /// Largest read or write accepted, in bytes.
    pub max_request: u32,
    /// Clients served at once; more are refused during the handshake.
    pub max_connections: usize,
    /// Bytes of requests (write payloads, read data) one connection may
    /// hold at once; at least `max_request`.
    pub conn_budget: u64,
    /// Bytes of requests all connections together may hold at once; at
    /// least `max_request`.
    pub server_budget: u64,
    /// Capacity of request buffers kept between requests, in all.
    pub buffer_pool: usize,
    /// A client must finish negotiating within this time.
    pub handshake_timeout: Duration,
    /// A request whose bytes stop arriving, or a reply the client stops
    /// taking, for this long ends the connection.
    pub io_timeout: Duration,
    /// While requests wait for the server budget, a connection whose
    /// reply has taken no bytes for this long (if shorter than
    /// `io_timeout`), or whose write's payload has brought less than
    /// 16 KiB in this long, is closed, so that clients that never read
    /// replies or trickle their payloads cannot hold every other client
    /// back.
    pub stall_under_pressure: Duration,
    /// While requests wait for the server budget, a write's payload must
    /// also keep the pace that brings all of it within
    /// `stall_under_pressure` and then this long of its grant (after the
    /// first `stall_under_pressure`, its length divided by this time
    /// every second: for 32 MiB in 30 s about 1.1 MB/s, for 256 KiB
    /// 9 KB/s), or its connection is closed: a client that
    /// sent 16 KiB just inside each `stall_under_pressure` kept its grant
    /// for ever. The same pace holds for the client taking a reply,
    /// timed from the reply's first write. Nobody waiting, a payload may
    /// come, and a reply be taken, as slowly as `io_timeout` lets it.
    pub payload_time_under_pressure: Duration,
    /// A connection without requests for this long is closed (`None`:
    /// never, as qemu-nbd and nbdkit: clients such as nbd-client idle).
    pub idle_timeout: Option<Duration>,
    /// After a stop, requests in flight get this long to be answered;
    /// then their sockets are shut and their replies dropped.
    pub shutdown_timeout: Duration,
    /// Offer TLS (NBD_OPT_STARTTLS) with these settings.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// With `tls`: serve nothing until the client has started TLS.
    pub tls_required: bool,
    /// Print one line per connection event on stderr.
    pub verbose: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: 8,
            max_request: 32 << 20,
            max_connections: 256,
            conn_budget: 64 << 20,
            server_budget: 256 << 20,
            buffer_pool: 64 << 20,
            handshake_timeout: Duration::from_secs(10),
            io_timeout: Duration::from_secs(60),
            stall_under_pressure: Duration::from_secs(5),
            payload_time_under_pressure: Duration::from_secs(30),
            idle_timeout: None,
            shutdown_timeout: Duration::from_secs(4),
            tls: None,
            tls_required: false,
            verbose: false,
        }
    }
}

/// How often a waiting reader looks whether the server is stopping.
const READ_TICK: Duration = Duration::from_millis(200);
/// Refusals of clients over `max_connections` answered at once; more are
/// closed without a word.
const MAX_REFUSING: usize = 16;

/// Where clients connect.
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// A unix socket, removed when the server stops.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Listen on a TCP address such as `127.0.0.1:10809`.
    pub fn tcp(addr: &str) -> io::Result<Listener> {
        TcpListener::bind(addr).map(Listener::Tcp)
    }

    /// Listen on a unix socket at `path` (a stale socket file is replaced).
    pub fn unix(path: PathBuf) -> io::Result<Listener> {
        if std::fs::symlink_metadata(&path)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
        {
            // Only a socket nobody answers on is stale.
            if UnixStream::connect(&path).is_err() {
                std::fs::remove_file(&path)?;
            }
        }
        UnixListener::bind(&path).map(|l| Listener::Unix(l, path))
    }

    /// A printable address.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map_or_else(|_| "tcp".into(), |a| format!("nbd://{a}")),
            Listener::Unix(_, p) => format!("nbd+unix:///?socket={}", p.display()),
        }
    }

    fn fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, _) => l.as_raw_fd(),
        }
    }

    fn accept(&self) -> io::Result<(Stream, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, a) = l.accept()?;
                // Replies are whole messages: don't hold them back.
                s.set_nodelay(true)?;
                Ok((Stream::Tcp(s), a.to_string()))
            }
            Listener::Unix(l, p) => {
                let (s, _) = l.accept()?;
                Ok((Stream::unix(s), p.display().to_string()))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A client's socket.
pub(crate) enum Stream {
    Tcp(TcpStream),
    /// With the bytes written to it, by all its handles (see
    /// [`Stream::taken`]).
    Unix(UnixStream, Arc<AtomicU64>),
}

impl Stream {
    fn unix(s: UnixStream) -> Stream {
        Stream::Unix(s, Arc::new(AtomicU64::new(0)))
    }

    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s, sent) => Stream::Unix(s.try_clone()?, sent.clone()),
        })
    }

    /// Bytes the client has taken from this socket so far, as far as it
    /// can be told: for TCP those it acknowledged (`TCP_INFO`'s
    /// `tcpi_bytes_acked`, counted by the kernel); for a Unix socket the
    /// bytes written to it less its queue (`SIOCOUTQ`). That queue is
    /// the memory charged for the buffers queued, not their bytes: each
    /// buffer's overhead counts (a few percent), and a buffer the client
    /// has read part of counts in full until it has read all of it (a
    /// buffer holds at most what one write queued, and Linux queues a
    /// large write in buffers of about 36 KiB). So what this says is less
    /// than what was taken, by up to a buffer and a few percent of the
    /// queue: never more. `None` where neither can be asked.
    ///
    /// (The drops of a Unix socket's queue from one look to the next
    /// were summed before: a writer that refilled the queue between two
    /// looks hid what the client took in between, so a client taking
    /// its replies steadily could show nothing for a second and be cut,
    /// the flake of the Unix test of stalled replies. Counting the bytes
    /// written needs them known as they go: see [`Stream::send_some`].)
    fn taken(&self) -> Option<u64> {
        match self {
            Stream::Tcp(s) => {
                // SAFETY: all-zero bytes are a valid tcp_info (plain
                // integers).
                let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
                let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
                // SAFETY: the socket is open (`s` keeps it so through the
                // call); the kernel writes at most `len` bytes to `info`,
                // which lives across the call, and says in `len` how many.
                let r = unsafe {
                    libc::getsockopt(
                        s.as_raw_fd(),
                        libc::IPPROTO_TCP,
                        libc::TCP_INFO,
                        &mut info as *mut libc::tcp_info as *mut libc::c_void,
                        &mut len,
                    )
                };
                // (A kernel whose tcp_info ends before the field: none.)
                let needed = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + 8;
                (r == 0 && len as usize >= needed).then_some(info.tcpi_bytes_acked)
            }
            Stream::Unix(s, sent) => {
                // (Written first: a write between the two can only make
                // this less than what was taken.)
                let sent = sent.load(Ordering::Acquire);
                let mut n: libc::c_int = 0;
                // SAFETY: the socket is open (`s` keeps it so through the
                // call); SIOCOUTQ (TIOCOUTQ's number) writes one int, to
                // `n`, which lives across the call.
                let r = unsafe {
                    libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n as *mut libc::c_int)
                };
                if r != 0 {
                    return None;
                }
                Some(sent.saturating_sub(u64::try_from(n).unwrap_or(0)))
            }
        }
    }

    fn fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s, _) => s.as_raw_fd(),
        }
    }

    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s, _) => s.shutdown(how),
        };
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s, _) => s.set_read_timeout(t),
        }
    }

    fn write_timeout(&self) -> io::Result<Option<Duration>> {
        match self {
            Stream::Tcp(s) => s.write_timeout(),
            Stream::Unix(s, _) => s.write_timeout(),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s, _) => s.set_write_timeout(t),
        }
    }
}

impl Stream {
    /// Write some of `buf` without blocking in the kernel: when the
    /// socket has no room, wait for some with `poll` until `deadline`
    /// (`None`: for ever), then fail with `WouldBlock`, as a socket write
    /// timeout does. A Unix socket counts what was written, as it is
    /// queued: a blocking write of a reply queued its bytes for as long
    /// as its client took to make room for the last of them, and said
    /// how many only then.
    fn send_some(&self, buf: &[u8], deadline: Option<Instant>) -> io::Result<usize> {
        loop {
            // SAFETY: the socket is open (`self` keeps it so through the
            // call); send() reads at most `buf.len()` bytes from `buf`,
            // which lives across it.
            let n = unsafe {
                libc::send(
                    self.fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if let Ok(n) = usize::try_from(n) {
                if let Stream::Unix(_, sent) = self {
                    sent.fetch_add(n as u64, Ordering::AcqRel);
                }
                return Ok(n);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => {
                    let ms = match deadline {
                        None => -1,
                        Some(d) => {
                            let left = d.saturating_duration_since(Instant::now());
                            if left.is_zero() {
                                return Err(e);
                            }
                            libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(1000)
                        }
                    };
                    let mut p = libc::pollfd {
                        fd: self.fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: `p` is one valid pollfd that lives across
                    // the call.
                    if unsafe { libc::poll(&mut p, 1, ms) } < 0 {
                        // (Ignored, a failing poll made this loop spin
                        // for ever when there was no deadline.)
                        let e = io::Error::last_os_error();
                        if e.kind() != io::ErrorKind::Interrupted {
                            return Err(e);
                        }
                    }
                }
                _ => return Err(e),
            }
        }
    }
}

impl SendWithin for Stream {
    fn send_within(&self, mut buf: &[u8], limit: Duration) -> io::Result<()> {
        let deadline = Instant::now() + limit;
        while !buf.is_empty() {
            let n = self.send_some(buf, Some(deadline))?;
            buf = &buf[n.min(buf.len())..];
        }
        Ok(())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s, _) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Stream::Tcp(s) = self {
            return s.write(buf);
        }
        // A Unix socket is written without blocking in the kernel (see
        // `send_some`), keeping the socket's write timeout, which is asked
        // for only when there is no room.
        match self.send_some(buf, Some(Instant::now())) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let timeout = self.write_timeout()?;
                self.send_some(buf, timeout.map(|t| Instant::now() + t))
            }
            sent => sent,
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A stream whose reads and writes fail once `deadline` has passed: a
/// client must finish the handshake by then, however slowly it trickles.
/// `ctl` is the socket under `io`, whose timeouts are set.
struct Deadline<'a, T> {
    io: &'a mut T,
    ctl: &'a Stream,
    deadline: Instant,
}

impl<T> Deadline<'_, T> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake not finished in time",
            ));
        }
        Ok(left)
    }
}

impl<T: Read> Read for Deadline<'_, T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.ctl.set_read_timeout(Some(left))?;
        self.io.read(buf)
    }
}

impl<T: Write> Write for Deadline<'_, T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.ctl.set_write_timeout(Some(left))?;
        self.io.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.io.flush()
    }
}

/// What a server did.
#[derive(Debug, Clone, Default)]
pub struct ServeReport {
    /// Connections accepted.
    pub connections: u64,
    /// Connections closed because the client broke the protocol.
    pub protocol_errors: u64,
    /// Clients refused because `max_connections` were being served.
    pub refused: u64,
    /// Connections whose sockets were shut at the stop deadline, with
    /// requests still in flight or replies not taken.
    pub cut_at_stop: u64,
    /// Connections closed because their replies took no bytes, or their
    /// write payloads brought too few, for `stall_under_pressure`, or
    /// whose write payloads fell behind the pace of
    /// `payload_time_under_pressure`, while other requests waited for
    /// memory.
    pub cut_stalled: u64,
}

/// What every connection shares.
struct Common {
    exports: Arc<Vec<Export>>,
    config: ServerConfig,
    budget: Budget,
    pool: BufPool,
    draining: AtomicBool,
    protocol_errors: AtomicU64,
}

/// An NBD server over a fixed list of exports.
pub struct Server {
    exports: Arc<Vec<Export>>,
    config: ServerConfig,
    /// Starts of connection threads to fail, as under a thread limit
    /// (tests of what the accept loop does then).
    #[cfg(test)]
    fail_spawns: AtomicUsize,
}

/// Counts a connection in while it lives.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Live {
    handle: JoinHandle<()>,
    stream: Stream,
    peer: String,
    watch: Arc<Watch>,
    /// While a reply is being sent: the bytes the client had taken (see
    /// [`Stream::taken`]) when it last took [`MIN_DRAIN`] more, and when.
    drain_mark: Option<(u64, Instant)>,
    /// While a reply is being sent: its sequence number (see
    /// [`Watch::reply`]) and the bytes the client had taken when the
    /// server first saw it, for its pace.
    reply_mark: Option<(u64, u64)>,
    /// While a write's payload is being received: its sequence number
    /// (see [`Watch::receiving`]), the bytes of it received when it last
    /// brought [`MIN_DRAIN`] more, and when.
    payload_mark: Option<(u64, u64, Instant)>,
}

/// A stalled reply's client must take at least this much in
/// `stall_under_pressure` for its reply to count as moving, and a write's
/// payload must bring as much for it to count as arriving. (The kernel
/// says what was taken in steps: on loopback TCP as the window reopens,
/// about 64 KiB; from a Unix socket a queued chunk at a time.)
const MIN_DRAIN: u64 = 16 << 10;

/// What a reply's pace allows for the bytes `Stream::taken` may miss: a
/// Unix socket's queue is told in memory charged for its buffers, not in
/// bytes, so a buffer the client read part of counts whole (up to 64 KiB
/// with 64 KiB pages), and the buffers' overhead is about a twentieth of
/// the queue (a 1 MiB send buffer: 64 KiB). Replies this small are held
/// only to the floor ([`MIN_DRAIN`]).
const TAKEN_SLACK: u64 = 128 << 10;

impl Server {
    /// A server for `exports` (the first is the default export).
    pub fn new(exports: Vec<Export>, config: ServerConfig) -> Server {
        Server {
            exports: Arc::new(exports),
            config,
            #[cfg(test)]
            fail_spawns: AtomicUsize::new(0),
        }
    }

    /// Start a connection's thread.
    fn spawn_connection(&self, f: impl FnOnce() + Send + 'static) -> io::Result<JoinHandle<()>> {
        #[cfg(test)]
        if self
            .fail_spawns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            // What pthread_create says at a thread limit; `f` (and the
            // stream it owns) is dropped, as `spawn` drops it.
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        std::thread::Builder::new().name("nbd-conn".into()).spawn(f)
    }

    /// The exports.
    pub fn exports(&self) -> &[Export] {
        &self.exports
    }

    /// Accept and serve clients until `stop` is set; then stop taking
    /// requests, give those in flight `shutdown_timeout` to be answered,
    /// shut the sockets of connections still busy (a client that does not
    /// read its replies cannot hold the server), and flush every writable
    /// export.
    pub fn serve(&self, listeners: &[Listener], stop: &AtomicBool) -> io::Result<ServeReport> {
        let cfg = &self.config;
        let common = Arc::new(Common {
            exports: self.exports.clone(),
            config: cfg.clone(),
            budget: Budget::new(cfg.server_budget.max(u64::from(cfg.max_request))),
            pool: BufPool::new(cfg.buffer_pool),
            draining: AtomicBool::new(false),
            protocol_errors: AtomicU64::new(0),
        });
        let serving = Arc::new(AtomicUsize::new(0));
        let refusing = Arc::new(AtomicUsize::new(0));
        let mut live: Vec<Live> = Vec::new();
        let mut report = ServeReport::default();
        let mut fds: Vec<libc::pollfd> = listeners
            .iter()
            .map(|l| libc::pollfd {
                fd: l.fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // A failed poll ends the accept loop, but the stop below still
        // runs (connections ended, exports flushed) before it is returned.
        let mut failed = None;
        while !stop.load(Ordering::Acquire) {
            // SAFETY: `fds` is a valid, initialised array of `fds.len()`
            // pollfd structs that lives across the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                failed = Some(e);
                break;
            }
            live.retain(|c| !c.handle.is_finished());
            report.cut_stalled += cut_stalled(&mut live, &common);
            for (i, p) in fds.iter_mut().enumerate() {
                if p.revents & libc::POLLIN == 0 {
                    continue;
                }
                p.revents = 0;
                let (stream, peer) = match listeners[i].accept() {
                    Ok(x) => x,
                    Err(e) => {
                        if cfg.verbose {
                            eprintln!("cairn serve: accept: {e}");
                        }
                        continue;
                    }
                };
                report.connections += 1;
                if serving.load(Ordering::Acquire) >= cfg.max_connections {
                    report.refused += 1;
                    refuse_busy(stream, &peer, cfg, &refusing);
                    continue;
                }
                let Ok(keep) = stream.try_clone() else {
                    continue;
                };
                serving.fetch_add(1, Ordering::AcqRel);
                let slot = Slot(serving.clone());
                let common = common.clone();
                let watch = Arc::new(Watch::default());
                let conn_watch = watch.clone();
                let conn_peer = peer.clone();
                let spawned = self.spawn_connection(move || {
                    let _slot = slot;
                    let what = connection(stream, &common, &conn_watch);
                    // (One closed for a stalled reply was named when it
                    // was closed.)
                    if let Some(what) = what.filter(|_| !conn_watch.was_cut()) {
                        common.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        if common.config.verbose {
                            eprintln!("cairn serve: {conn_peer}: {what}");
                        }
                    }
                });
                // No thread (a limit on threads or memory): this client is
                // closed (the closure, its stream and its slot were
                // dropped) and the server goes on. Returning the error
                // would leave every other connection running and the
                // exports unflushed, and the caller waiting on a stop.
                let handle = match spawned {
                    Ok(h) => h,
                    Err(e) => {
                        eprintln!(
                            "cairn serve: {peer}: cannot start a thread for the connection \
                             ({e}): connection closed"
                        );
                        continue;
                    }
                };
                live.push(Live {
                    handle,
                    stream: keep,
                    peer,
                    watch,
                    drain_mark: None,
                    reply_mark: None,
                    payload_mark: None,
                });
            }
        }
        // Stop taking requests; replies to the ones in flight still go out
        // until the deadline.
        common.draining.store(true, Ordering::Release);
        for c in &live {
            c.stream.shutdown(Shutdown::Read);
        }
        let deadline = Instant::now() + cfg.shutdown_timeout;
        while Instant::now() < deadline && live.iter().any(|c| !c.handle.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
        }
        for c in &live {
            if !c.handle.is_finished() {
                report.cut_at_stop += 1;
                c.stream.shutdown(Shutdown::Both);
            }
        }
        for c in live {
            let _ = c.handle.join();
        }
        for e in self.exports.iter().filter(|e| !e.is_read_only()) {
            e.dev
                .flush()
                .map_err(|err| io::Error::other(format!("flush of export {:?}: {err}", e.name)))?;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        report.protocol_errors = common.protocol_errors.load(Ordering::Relaxed);
        Ok(report)
    }
}

/// Shut the sockets of the connections whose reply or write payload has
/// not moved for `stall_under_pressure` while threads of other
/// connections wait for the server budget (their threads then fail, end
/// and give their grants back); returns how many were shut. A reply
/// moves when a write of it returns or its client takes [`MIN_DRAIN`]
/// bytes more from the socket (a client that reads slowly is not stalled;
/// one that takes a few bytes now and then to look alive is). A payload
/// moves when [`MIN_DRAIN`] more bytes of it arrive, timed from when its
/// grant was asked for if that waited (see `read_job`); and a payload
/// that moves but falls behind the pace of
/// `payload_time_under_pressure` ([`behind_pace`], timed from its grant)
/// is shut as well, and so is a reply whose client takes it more slowly
/// than that pace (timed from its first write). Called every tick of the
/// accept loop.
fn cut_stalled(live: &mut [Live], common: &Common) -> u64 {
    let cfg = &common.config;
    let patience = cfg.stall_under_pressure;
    let now = Instant::now();
    let mut cut = 0;
    for c in live.iter_mut() {
        let window = cfg.payload_time_under_pressure;
        let mut reply_slow = false;
        let reply = match c.watch.stalled_for() {
            None => {
                c.drain_mark = None;
                c.reply_mark = None;
                None
            }
            Some(written) => {
                let taken = c.stream.taken();
                // Behind the pace that takes all of the reply within the
                // stall time and `payload_time_under_pressure` of its
                // first write, as a payload must arrive: the bytes the
                // client took since the server first saw the reply
                // (nothing of it is counted that was taken in the tick
                // before; what is still queued of earlier replies is)
                // against its length.
                if let (Some(r), Some(t)) = (c.watch.reply(), taken) {
                    let base = match c.reply_mark {
                        Some((seq, base)) if seq == r.seq => base,
                        _ => t,
                    };
                    c.reply_mark = Some((r.seq, base));
                    let elapsed = now.saturating_duration_since(r.began);
                    // (`taken` may count short by a socket buffer and a
                    // twentieth of the queue: a Unix socket's queue is
                    // told in memory charged, not bytes. A client right
                    // at the pace is given that much.)
                    let got = t.saturating_sub(base).saturating_add(TAKEN_SLACK);
                    reply_slow = behind_pace(r.len, got, elapsed, patience, window);
                }
                // Since when the client has taken less than MIN_DRAIN
                // (where that can be told; else the writes alone say).
                let draining_since = taken.map(|taken| match c.drain_mark {
                    Some((mark, since)) if taken < mark.saturating_add(MIN_DRAIN) => since,
                    _ => {
                        c.drain_mark = Some((taken, now));
                        now
                    }
                });
                Some(draining_since.map_or(written, |since| {
                    written.min(now.saturating_duration_since(since))
                }))
            }
        };
        let payload = match c.watch.payload() {
            None => {
                c.payload_mark = None;
                None
            }
            Some(p) => {
                let mark = match c.payload_mark {
                    Some(m) if m.0 == p.seq => m,
                    // A payload not seen before: nothing of it counted yet.
                    _ => (p.seq, 0, p.since),
                };
                let mark = if p.got >= mark.1.saturating_add(MIN_DRAIN) {
                    (p.seq, p.got, now)
                } else {
                    mark
                };
                c.payload_mark = Some(mark);
                // Stalled (under the floor), or behind the pace.
                let elapsed = now.saturating_duration_since(p.granted);
                Some((
                    now.saturating_duration_since(mark.2) >= patience,
                    behind_pace(p.len, p.got, elapsed, patience, window),
                ))
            }
        };
        // A stalled reply fails its write at the I/O timeout, so with a
        // timeout as short as the patience that rule is left to it. Not
        // so a payload: each byte restarts the I/O timeout of a read, so a
        // trickle would keep its grant for ever.
        let reply_stalled = reply.is_some_and(|s| s >= patience && patience < cfg.io_timeout);
        let payload_stalled = payload.is_some_and(|(stalled, _)| stalled);
        let payload_slow = payload.is_some_and(|(_, behind)| behind);
        if !(reply_stalled || reply_slow || payload_stalled || payload_slow)
            || c.watch.was_cut()
            || !common.budget.others_wait(&c.watch)
        {
            continue;
        }
        c.watch.cut();
        cut += 1;
        c.stream.shutdown(Shutdown::Both);
        if cfg.verbose {
            let what = if reply_stalled {
                format!("its reply did not move for {} s", patience.as_secs_f64())
            } else if reply_slow {
                format!(
                    "it took its reply too slowly to take all of it within {} s of its first write",
                    (patience + cfg.payload_time_under_pressure).as_secs_f64()
                )
            } else if payload_stalled {
                format!(
                    "its write's payload did not arrive for {} s",
                    patience.as_secs_f64()
                )
            } else {
                format!(
                    "its write's payload came too slowly to arrive whole within {} s of its grant",
                    (patience + cfg.payload_time_under_pressure).as_secs_f64()
                )
            };
            eprintln!(
                "cairn serve: {}: {what} while other clients' requests waited for \
                 memory (--max-inflight): connection closed",
                c.peer,
            );
        }
    }
    cut
}

/// Tell a client over `max_connections` why it is not served, in its own
/// thread (bounded by the handshake timeout), unless too many such
/// refusals are already under way: then just close.
fn refuse_busy(mut stream: Stream, peer: &str, cfg: &ServerConfig, refusing: &Arc<AtomicUsize>) {
    if cfg.verbose {
        eprintln!(
            "cairn serve: {peer}: refused: {} connections served (--max-connections)",
            cfg.max_connections
        );
    }
    if refusing.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
        refusing.fetch_sub(1, Ordering::AcqRel);
        stream.shutdown(Shutdown::Both);
        return;
    }
    let slot = Slot(refusing.clone());
    let msg = format!(
        "server busy: {} clients are connected, the most it serves at once",
        cfg.max_connections
    );
    let deadline = Instant::now() + cfg.handshake_timeout;
    let Ok(ctl) = stream.try_clone() else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("nbd-refuse".into())
        .spawn(move || {
            let _slot = slot;
            let _ = refuse(
                &mut Deadline {
                    io: &mut stream,
                    ctl: &ctl,
                    deadline,
                },
                &msg,
            );
            stream.shutdown(Shutdown::Both);
        });
    // Without a thread the stream was dropped with the closure: closed.
    drop(spawned);
}

/// The socket a connection talks over: plain or under TLS.
enum Talk {
    Plain(Stream),
    Tls(TlsIo<Stream>),
}

impl Read for Talk {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Talk::Plain(s) => s.read(buf),
            Talk::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Talk {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Talk::Plain(s) => s.write(buf),
            Talk::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Talk::Plain(s) => s.flush(),
            Talk::Tls(t) => t.flush(),
        }
    }
}

impl Talk {
    /// End a TLS session in order (close_notify, best effort); nothing
    /// for a plain socket.
    fn close(&self) {
        if let Talk::Tls(t) = self {
            t.close();
        }
    }

    /// A second handle for the other direction.
    fn try_clone(&self) -> io::Result<Talk> {
        Ok(match self {
            Talk::Plain(s) => Talk::Plain(s.try_clone()?),
            Talk::Tls(t) => Talk::Tls(t.with_socket(t.socket().try_clone()?)),
        })
    }
}

/// Greet the client and haggle over options, starting TLS when asked,
/// all within the handshake deadline. `Ok(None)`: the client left.
fn handshake(
    stream: &Stream,
    common: &Common,
) -> io::Result<Option<(Talk, crate::handshake::Negotiated)>> {
    let config = &common.config;
    let deadline = Instant::now() + config.handshake_timeout;
    let ctl = stream.try_clone()?;
    let mut talk = Talk::Plain(stream.try_clone()?);
    let mut timed = Deadline {
        io: &mut talk,
        ctl: &ctl,
        deadline,
    };
    let Some(no_zeroes) = greet(&mut timed)? else {
        return Ok(None);
    };
    let mut tls = TlsState {
        offered: config.tls.is_some(),
        required: config.tls.is_some() && config.tls_required,
        active: false,
    };
    loop {
        let mut timed = Deadline {
            io: &mut talk,
            ctl: &ctl,
            deadline,
        };
        match options(
            &mut timed,
            &common.exports,
            config.max_request,
            no_zeroes,
            tls,
        )? {
            Outcome::Chosen(n) => return Ok(Some((talk, n))),
            Outcome::Leave => {
                talk.close();
                return Ok(None);
            }
            Outcome::StartTls => {
                let Some(tls_config) = &config.tls else {
                    return Ok(None);
                };
                talk = Talk::Tls(TlsIo::new(tls_config.clone(), stream.try_clone()?)?);
                tls.active = true;
            }
        }
    }
}

/// Serve one client. Returns what went wrong if the client broke the
/// protocol or the socket failed.
fn connection(stream: Stream, common: &Common, watch: &Watch) -> Option<String> {
    let config = &common.config;
    let (mut talk, neg) = match handshake(&stream, common) {
        Ok(Some(x)) => x,
        Ok(None) => return None,
        // A client that leaves during the handshake (a probe of whether
        // the socket is alive, a port scan) broke nothing.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
            ) =>
        {
            return None
        }
        Err(e) => return Some(format!("handshake: {e}")),
    };
    // Reads wake up every tick to see whether the server is stopping; a
    // reply the client does not take for io_timeout fails.
    if let Err(e) = stream
        .set_read_timeout(Some(READ_TICK))
        .and_then(|_| stream.set_write_timeout(Some(config.io_timeout)))
    {
        return Some(format!("cannot set the socket timeouts: {e}"));
    }
    let export = &common.exports[neg.export];
    let Ok(reader) = talk.try_clone() else {
        return Some("cannot clone the socket".into());
    };
    let limits = Limits {
        workers: config.workers,
        max_request: config.max_request,
        conn_budget: config.conn_budget.max(u64::from(config.max_request)),
        server_budget: &common.budget,
        pool: &common.pool,
        io_timeout: config.io_timeout,
        idle_timeout: config.idle_timeout,
        draining: &common.draining,
        watch,
        socket: Some(stream.fd()),
    };
    let (end, whole) = transmission::run(reader, &mut talk, export, neg, &limits);
    // Over TLS, close_notify after the last reply (NBD_CMD_DISC, the
    // client's end of stream, a stop, and also a request that broke the
    // protocol: the records are whole), unless a reply failed part-way.
    if whole {
        talk.close();
    }
    stream.shutdown(Shutdown::Both);
    match end {
        End::Clean => None,
        End::BadMagic => Some("request with a bad magic: connection closed".into()),
        End::TooLong(n) => Some(format!(
            "request with a {n}-byte payload, over the {}-byte maximum: connection closed",
            config.max_request
        )),
        End::Idle => Some(format!(
            "no request for {} s: connection closed",
            config.idle_timeout.map_or(0, |t| t.as_secs())
        )),
        End::Io(e) => Some(format!("connection: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_blockdev::MemDev;

    /// Write to `w` in writes of [`FILL_STEP`] until its socket has had
    /// no room for 50 ms.
    fn fill(w: &mut Stream) {
        let _ = w.set_write_timeout(Some(Duration::from_millis(50)));
        while w.write(&[7u8; FILL_STEP]).is_ok() {}
    }

    /// The size of [`fill`]'s writes, so the largest buffer queued.
    const FILL_STEP: usize = 16 << 10;

    /// Issue: what a Unix client took was summed from the drops of the
    /// socket's queue from one look to the next, so a writer that
    /// refilled the queue between two looks hid what the client took in
    /// between: here 128 KiB showed as nothing. A client taking its
    /// replies steadily could so show nothing for a second and be cut
    /// (the Unix test of stalled replies failed once in 13 runs). Now the
    /// bytes written, counted as they are queued, less the queue, show
    /// it. (`SIOCOUTQ` is memory charged, not bytes: a buffer partly
    /// read counts in full, and each one's overhead too. The send buffer
    /// is pinned, so the queue is bounded whatever the kernel's default;
    /// what shows may fall short by a buffer and 5% of the queue.)
    #[test]
    fn what_a_unix_client_takes_shows_though_the_queue_is_refilled() {
        let (ours, mut theirs) = UnixStream::pair().unwrap_or_else(|e| panic!("pair: {e}"));
        // (The kernel doubles it: a queue of 256 KiB at most.)
        let sndbuf: libc::c_int = 128 << 10;
        // SAFETY: the socket is open (`ours` keeps it so through the
        // call); SO_SNDBUF reads one int from `sndbuf`, which lives
        // across it.
        let set = unsafe {
            libc::setsockopt(
                ours.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                &sndbuf as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "{}", io::Error::last_os_error());
        let queue = 2 * sndbuf as u64;
        let stream = Stream::unix(ours);
        let mut writer = stream.try_clone().unwrap_or_else(|e| panic!("clone: {e}"));
        fill(&mut writer);
        let before = stream.taken().unwrap_or(0);
        const TAKEN: u64 = 128 << 10;
        let mut got = vec![0u8; TAKEN as usize];
        theirs
            .read_exact(&mut got)
            .unwrap_or_else(|e| panic!("read: {e}"));
        fill(&mut writer);
        let after = stream.taken().unwrap_or(0);
        let short = FILL_STEP as u64 + queue / 20;
        assert!(
            after >= before + TAKEN - short,
            "{TAKEN} bytes taken showed as {}",
            after.saturating_sub(before)
        );
        // Nothing more taken, nothing more shows, however the queue is
        // written.
        fill(&mut writer);
        assert!(stream.taken().unwrap_or(u64::MAX) <= after);
    }

    /// A connection whose thread cannot be started (a thread limit) is
    /// closed and the server goes on: the next client is served, and the
    /// stop ends as usual. Before, `serve` returned the error at once,
    /// leaving the other connections running and the exports unflushed.
    #[test]
    fn a_connection_without_a_thread_is_closed_and_the_server_goes_on() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("nbd.sock");
        let listener = Listener::unix(path.clone()).unwrap_or_else(|e| panic!("listen: {e}"));
        let server = Server::new(
            vec![Export {
                name: "mem".into(),
                description: String::new(),
                dev: Arc::new(MemDev::new(1 << 20)),
                read_only: false,
            }],
            ServerConfig::default(),
        );
        server.fail_spawns.store(1, Ordering::Release);
        let stop = AtomicBool::new(false);
        let greeted = |s: &mut UnixStream| {
            // (Bounds the test where the server has stopped answering.)
            let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
            let mut g = Vec::new();
            let _ = s.take(18).read_to_end(&mut g);
            g.starts_with(b"NBDMAGIC")
        };
        let served = std::thread::scope(|scope| {
            let t = scope.spawn(|| server.serve(&[listener], &stop));
            let first = UnixStream::connect(&path).map(|mut s| greeted(&mut s));
            let second = UnixStream::connect(&path).map(|mut s| greeted(&mut s));
            stop.store(true, Ordering::Release);
            let report = t.join().map_err(|_| "serve panicked");
            (first.ok(), second.ok(), report)
        });
        let (first, second, report) = served;
        assert_eq!(
            first,
            Some(false),
            "the client without a thread was greeted"
        );
        assert_eq!(second, Some(true), "the next client was not served");
        match report {
            Ok(Ok(r)) => assert_eq!(r.connections, 2, "{r:?}"),
            Ok(Err(e)) => panic!("serve failed: {e}"),
            Err(e) => panic!("{e}"),
        }
    }
}
