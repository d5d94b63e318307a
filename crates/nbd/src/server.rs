//! Listeners, the accept loop, connections and clean shutdown.

use crate::handshake::negotiate;
use crate::transmission::{self, End};
use crate::Export;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Requests in flight per connection (worker threads per connection).
    pub workers: usize,
    /// Largest read or write accepted, in bytes.
    pub max_request: u32,
    /// A client must finish negotiating within this time.
    pub handshake_timeout: Duration,
    /// Print one line per connection event on stderr.
    pub verbose: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: 8,
            max_request: 32 << 20,
            handshake_timeout: Duration::from_secs(30),
            verbose: false,
        }
    }
}

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
                Ok((Stream::Unix(s), p.display().to_string()))
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
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        };
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What a server did.
#[derive(Debug, Clone, Default)]
pub struct ServeReport {
    /// Connections accepted.
    pub connections: u64,
    /// Connections closed because the client broke the protocol.
    pub protocol_errors: u64,
}

/// An NBD server over a fixed list of exports.
pub struct Server {
    exports: Arc<Vec<Export>>,
    config: ServerConfig,
}

struct Live {
    handle: JoinHandle<()>,
    stream: Stream,
}

impl Server {
    /// A server for `exports` (the first is the default export).
    pub fn new(exports: Vec<Export>, config: ServerConfig) -> Server {
        Server {
            exports: Arc::new(exports),
            config,
        }
    }

    /// The exports.
    pub fn exports(&self) -> &[Export] {
        &self.exports
    }

    /// Accept and serve clients until `stop` is set; then stop reading
    /// requests, let requests in flight finish, and flush every writable
    /// export.
    pub fn serve(&self, listeners: &[Listener], stop: &AtomicBool) -> io::Result<ServeReport> {
        let mut live: Vec<Live> = Vec::new();
        let protocol_errors = Arc::new(AtomicU64::new(0));
        let mut report = ServeReport::default();
        let mut fds: Vec<libc::pollfd> = listeners
            .iter()
            .map(|l| libc::pollfd {
                fd: l.fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        while !stop.load(Ordering::Acquire) {
            // SAFETY: `fds` is a valid, initialised array of `fds.len()`
            // pollfd structs that lives across the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            live.retain(|c| !c.handle.is_finished());
            for (i, p) in fds.iter_mut().enumerate() {
                if p.revents & libc::POLLIN == 0 {
                    continue;
                }
                p.revents = 0;
                let (stream, peer) = match listeners[i].accept() {
                    Ok(x) => x,
                    Err(e) => {
                        if self.config.verbose {
                            eprintln!("cairn serve: accept: {e}");
                        }
                        continue;
                    }
                };
                report.connections += 1;
                let Ok(keep) = stream.try_clone() else {
                    continue;
                };
                let exports = self.exports.clone();
                let config = self.config.clone();
                let errors = protocol_errors.clone();
                let handle =
                    std::thread::Builder::new()
                        .name("nbd-conn".into())
                        .spawn(move || {
                            if let Some(what) = connection(stream, &exports, &config) {
                                errors.fetch_add(1, Ordering::Relaxed);
                                if config.verbose {
                                    eprintln!("cairn serve: {peer}: {what}");
                                }
                            }
                        })?;
                live.push(Live {
                    handle,
                    stream: keep,
                });
            }
        }
        // Stop reading requests; replies to the ones in flight still go out.
        for c in &live {
            c.stream.shutdown(Shutdown::Read);
        }
        for c in live {
            let _ = c.handle.join();
        }
        for e in self.exports.iter().filter(|e| !e.is_read_only()) {
            e.dev
                .flush()
                .map_err(|err| io::Error::other(format!("flush of export {:?}: {err}", e.name)))?;
        }
        report.protocol_errors = protocol_errors.load(Ordering::Relaxed);
        Ok(report)
    }
}

/// Serve one client. Returns what went wrong if the client broke the
/// protocol or the socket failed.
fn connection(mut stream: Stream, exports: &[Export], config: &ServerConfig) -> Option<String> {
    // Without the timeout a client stalled in the handshake would hold
    // this thread forever; without clearing it, an idle client would be
    // cut off: either failure ends the connection.
    if let Err(e) = stream.set_read_timeout(Some(config.handshake_timeout)) {
        return Some(format!("cannot set the handshake timeout: {e}"));
    }
    let neg = match negotiate(&mut stream, exports, config.max_request) {
        Ok(Some(n)) => n,
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
    if let Err(e) = stream.set_read_timeout(None) {
        return Some(format!("cannot clear the handshake timeout: {e}"));
    }
    let export = &exports[neg.export];
    let Ok(reader) = stream.try_clone() else {
        return Some("cannot clone the socket".into());
    };
    let end = transmission::run(
        reader,
        &mut stream,
        export,
        neg,
        config.workers,
        config.max_request,
    );
    stream.shutdown(Shutdown::Both);
    match end {
        End::Clean => None,
        End::BadMagic => Some("request with a bad magic: connection closed".into()),
        End::Io(e) => Some(format!("connection: {e}")),
    }
}
