//! # cairn-nbd
//!
//! An NBD server (the protocol of `nbd-client`, qemu-nbd, nbdkit and
//! libnbd) that exports [`BlockDev`]s. It knows nothing of the repository:
//! the CLI hands it devices.
//!
//! ## Design decisions
//!
//! - **Fixed newstyle only**, with NBD_OPT_GO / INFO / LIST / ABORT /
//!   EXPORT_NAME, structured replies, extended headers and the
//!   `base:allocation` metadata context (so clients such as `nbdcopy` and
//!   `qemu-img convert` skip holes), and NBD_OPT_STARTTLS with X.509
//!   certificates when the server is given them (optional or required;
//!   see `tls.rs`).
//! - **Extended headers are offered** (NBD_OPT_EXTENDED_HEADERS, which
//!   qemu 8.2+ and libnbd 1.18+ ask for): 32-byte requests with 64-bit
//!   lengths, so trim, zeroing and block status can act on more than
//!   4 GiB at once; every reply is a 32-byte chunk header (no simple
//!   replies, as the spec requires), and block status answers with 64-bit
//!   extents (NBD_REPLY_TYPE_BLOCK_STATUS_EXT). Payloads stay within the
//!   32-bit maximum of NBD_INFO_BLOCK_SIZE: a longer one ends the
//!   connection instead of being drained, and no length from a header
//!   sizes a buffer before the budgets grant it. Older clients keep
//!   compact headers and structured or simple replies.
//! - **What is advertised is what the device can do**: transmission flags
//!   come from [`BlockDev::caps`] (read-only, FUA, fast zero, rotational,
//!   multi-conn only when the device says concurrent connections are
//!   coherent: one device object serves every connection of an export,
//!   a write-back cache included, so its flush covers them all).
//! - **Threads, not an async runtime.** Each connection has a few worker
//!   threads in a leader/follower ring: one reads a request, passes the
//!   socket on, does the I/O (a blocking pread/pwrite or a decode) and
//!   writes its reply. Block I/O is blocking anyway, and no request is
//!   handed between threads.
//! - **Bounded, whatever clients do**: every byte a request holds is
//!   granted by a per-connection and a server-wide budget, whole before
//!   it holds any (so no two requests wait on each other for budget; a
//!   write's buffer still grows only as its payload arrives), a client
//!   that holds a grant and stalls its reply or trickles its payload is
//!   closed while others wait for memory, buffers between requests are
//!   pooled with a cap,
//!   connections are limited (`max_connections`, over it a refusal with a
//!   message), the handshake has a deadline, a request or reply that
//!   stalls past `io_timeout` ends its connection. See [`ServerConfig`].
//! - **Errors are mapped at the edge**: device errors become NBD error
//!   numbers here and only here; a request the export cannot take is
//!   refused before the device is touched (read-only, out of range,
//!   oversized). A request with a bad magic (or a compact header where
//!   extended ones were agreed) closes that connection; every other
//!   connection goes on.
//! - **Shutdown that finishes**: when asked to stop, [`Server::serve`]
//!   takes no more requests, gives those in flight `shutdown_timeout` to
//!   be answered, then shuts the sockets still busy (a client that never
//!   reads its replies cannot hold it), and flushes writable exports.
//!
//! Written by hand: the NBD server crates on crates.io are either tied to
//! an async runtime or implement the old handshake only; the protocol is
//! small and this server needs to control threading and errors.

mod handshake;
mod limits;
pub mod proto;
mod server;
mod tls;
mod transmission;

pub use rustls::ServerConfig as TlsConfig;
pub use server::{Listener, ServeReport, Server, ServerConfig};
pub use tls::{server_config as tls_server_config, TlsError};

use cairn_blockdev::BlockDev;
use std::sync::Arc;

/// One export: a name clients ask for and the device behind it.
#[derive(Clone)]
pub struct Export {
    /// The name (the first export is also the default, `""`).
    pub name: String,
    /// Shown by NBD_OPT_LIST and NBD_INFO_DESCRIPTION.
    pub description: String,
    /// The device.
    pub dev: Arc<dyn BlockDev>,
    /// Refuse writes even if the device takes them.
    pub read_only: bool,
}

impl Export {
    /// Whether clients may not write.
    pub fn is_read_only(&self) -> bool {
        self.read_only || !self.dev.caps().writable
    }
}

/// Run one whole session (handshake and transmission, one worker) over
/// `input`, collecting what the server writes: the fuzz targets' entry
/// point, also used by tests to drive the server without sockets.
pub fn session_over_bytes(input: &[u8], exports: &[Export], workers: usize) -> Vec<u8> {
    let mut io = Duplex {
        input,
        output: Vec::new(),
    };
    if let Ok(Some(neg)) = handshake::negotiate(&mut io, exports, 32 << 20) {
        let Duplex { input, mut output } = io;
        let config = ServerConfig::default();
        let budget = limits::Budget::new(config.server_budget);
        let pool = limits::BufPool::new(config.buffer_pool);
        let draining = std::sync::atomic::AtomicBool::new(false);
        let limits = transmission::Limits {
            workers,
            max_request: config.max_request,
            conn_budget: config.conn_budget,
            server_budget: &budget,
            pool: &pool,
            io_timeout: config.io_timeout,
            idle_timeout: None,
            draining: &draining,
            watch: &limits::Watch::default(),
            socket: None,
        };
        let _ = transmission::run(input, &mut output, &exports[neg.export], neg, &limits);
        return output;
    }
    io.output
}

struct Duplex<'a> {
    input: &'a [u8],
    output: Vec<u8>,
}

impl std::io::Read for Duplex<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl std::io::Write for Duplex<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
