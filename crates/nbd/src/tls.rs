//! TLS after NBD_OPT_STARTTLS, with X.509 certificates (rustls, ring).
//!
//! A connection's worker threads read requests and write replies at the
//! same time, but a rustls connection is one state machine. So [`TlsIo`]
//! (one per reader, one per writer, over clones of the socket) shares it
//! under a lock that is never held across a blocking socket call:
//!
//! - a reader takes plaintext if some is decrypted already, or feeds
//!   rustls ciphertext read earlier until some is; else it reads
//!   ciphertext from the socket without the lock and keeps it to feed.
//!   A read that brought bytes but no plaintext yet returns
//!   `ErrorKind::Interrupted`, so that callers look at their deadlines
//!   between socket reads;
//! - bytes to send (replies, and the handshake's or a key update's
//!   records) are encrypted under the lock, taken out, and written with
//!   only the send lock held. Records leave in the order they were
//!   sealed because sealing and sending both happen under the send lock.
//!
//! When rustls rejects what a client sent, the alert it queued is sent
//! before the error is returned, and a connection that ends in order
//! (NBD_CMD_DISC, NBD_OPT_ABORT, the end of the client's stream, a
//! server stop) sends close_notify ([`TlsIo::close`]): both best effort,
//! within [`FINAL_SEND`], and never while a writer is part-way through a
//! record or after a send failed ([`Shared::torn`]). (Before, the client saw the connection drop with no reason,
//! and a disconnect it could not tell from a truncation.)
//!
//! Lock order: send, then state. Certificates are read from a directory
//! laid out as for qemu-nbd and nbdkit (`server-cert.pem`,
//! `server-key.pem`, and `ca-cert.pem` when clients must show a
//! certificate: qemu-nbd's `verify-peer`, nbdkit's `--tls-verify-peer`).
//! Pre-shared keys (psktool files) are not offered: rustls has no
//! external-PSK support.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConnection;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// The longest a last alert (a rejection's, or close_notify) may take to
/// go out: the client may not be reading, and the connection is ending.
pub(crate) const FINAL_SEND: Duration = Duration::from_secs(2);

/// A socket that can be written to within a time limit of the call's
/// own, its timeouts left as they are (they are shared with the other
/// handles of the socket).
pub(crate) trait SendWithin {
    /// Write all of `buf` within `limit`, or fail.
    fn send_within(&self, buf: &[u8], limit: Duration) -> io::Result<()>;
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be read or parsed.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// rustls refused the certificate and key.
    #[error("certificates in {dir}: {reason}")]
    Config {
        /// The directory.
        dir: PathBuf,
        /// What rustls said.
        reason: String,
    },
}

/// The server's TLS settings from `dir/server-cert.pem` (the chain, leaf
/// first) and `dir/server-key.pem`. With `verify_peer`, a client must
/// show a certificate that chains to one in `dir/ca-cert.pem`, or the
/// handshake fails: that is how a client is authenticated.
pub fn server_config(dir: &Path, verify_peer: bool) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let cert_path = dir.join("server-cert.pem");
    let key_path = dir.join("server-key.pem");
    let file_err = |path: &Path, reason: String| TlsError::File {
        path: path.to_path_buf(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .map_err(|e| file_err(&cert_path, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(&cert_path, e.to_string()))?;
    if certs.is_empty() {
        return Err(file_err(&cert_path, "no certificate in it".into()));
    }
    let key =
        PrivateKeyDer::from_pem_file(&key_path).map_err(|e| file_err(&key_path, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config_err = |reason: String| TlsError::Config {
        dir: dir.to_path_buf(),
        reason,
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_err(e.to_string()))?;
    let builder = if verify_peer {
        let ca_path = dir.join("ca-cert.pem");
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&ca_path)
            .map_err(|e| file_err(&ca_path, e.to_string()))?
        {
            let cert = cert.map_err(|e| file_err(&ca_path, e.to_string()))?;
            roots
                .add(cert)
                .map_err(|e| file_err(&ca_path, e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(file_err(&ca_path, "no certificate in it".into()));
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| config_err(e.to_string()))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| config_err(e.to_string()))?;
    Ok(Arc::new(config))
}

/// The session, and ciphertext from the client that rustls has not taken.
struct Session {
    conn: ServerConnection,
    /// rustls holds at most 16 KiB of plaintext not read out and refuses
    /// ciphertext beyond that ("received plaintext buffer full"), so a
    /// socket read (which may hold the end of a full record and more) is
    /// fed only until plaintext comes out; the rest waits here. Shared,
    /// not per handle: the handshake's handle hands over to the
    /// connection's reader what it read ahead.
    unfed: VecDeque<u8>,
}

impl Session {
    /// Plaintext into `buf`, from what rustls holds or makes of
    /// [`Session::unfed`]: `Some(0)` at the end of the stream, `None`
    /// when it needs more ciphertext.
    fn plaintext(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            match self.conn.reader().read(buf) {
                // (0 once the client's close_notify has been read.)
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if self.unfed.is_empty() {
                return Ok(None);
            }
            // rustls takes nothing after a close_notify and says 0. The
            // reader above reports the end first; should it not, this
            // ends the stream rather than offering the same bytes
            // forever. What follows the alert is dropped (RFC 8446).
            if self.conn.read_tls(&mut self.unfed)? == 0 {
                self.unfed.clear();
                return Ok(Some(0));
            }
            self.conn
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))?;
        }
    }
}

/// The state one connection's readers and writers share.
struct Shared {
    state: Mutex<Session>,
    /// Held while records are sealed and sent, so they leave in order.
    send: Mutex<()>,
    /// A send of sealed records failed (part-way, or before a byte went:
    /// either way the client's stream of records is broken); nothing is
    /// sent after it, not even an alert or close_notify.
    torn: AtomicBool,
}

impl Shared {
    /// Write to `sock` records sealed under the send lock (held by the
    /// caller); a failure tears the stream ([`Shared::torn`]).
    fn send_sealed(&self, sock: &mut impl Write, out: &[u8]) -> io::Result<()> {
        let sent = sock.write_all(out);
        if sent.is_err() {
            self.torn.store(true, Ordering::Release);
        }
        sent
    }
}

/// A reader or writer of plaintext over a TLS session on a socket `S`.
pub(crate) struct TlsIo<S> {
    shared: Arc<Shared>,
    sock: S,
    raw: Vec<u8>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<S: Read + Write + SendWithin> TlsIo<S> {
    /// Start a server session on `sock` (right after the STARTTLS reply).
    pub(crate) fn new(config: Arc<rustls::ServerConfig>, sock: S) -> io::Result<TlsIo<S>> {
        let conn = ServerConnection::new(config).map_err(io::Error::other)?;
        Ok(TlsIo {
            shared: Arc::new(Shared {
                state: Mutex::new(Session {
                    conn,
                    unfed: VecDeque::new(),
                }),
                send: Mutex::new(()),
                torn: AtomicBool::new(false),
            }),
            sock,
            raw: vec![0u8; 16 << 10],
        })
    }

    /// Another handle on the same session, over `sock` (a clone of the
    /// same socket).
    pub(crate) fn with_socket<T>(&self, sock: T) -> TlsIo<T> {
        TlsIo {
            shared: self.shared.clone(),
            sock,
            raw: vec![0u8; 16 << 10],
        }
    }

    /// The socket under the session.
    pub(crate) fn socket(&self) -> &S {
        &self.sock
    }

    /// Send every record the session has ready.
    fn send_pending(&mut self) -> io::Result<()> {
        let _order = lock(&self.shared.send);
        let mut out = Vec::new();
        {
            let c = &mut lock(&self.shared.state).conn;
            while c.wants_write() {
                c.write_tls(&mut out)?;
            }
        }
        self.shared.send_sealed(&mut self.sock, &out)
    }

    /// Send what the session has queued (the alert of a rejection), and
    /// first queue close_notify if `close`; best effort, within
    /// [`FINAL_SEND`]. Nothing is sent while another handle is sending:
    /// its record may be part-way out, and nothing can follow it; nor
    /// after a send failed (the lock is free again then, but the stream
    /// may end inside a record).
    fn send_last(&self, close: bool) {
        let Ok(_order) = self.shared.send.try_lock() else {
            return;
        };
        if self.shared.torn.load(Ordering::Acquire) {
            return;
        }
        let mut out = Vec::new();
        {
            let c = &mut lock(&self.shared.state).conn;
            if close {
                // (Nothing, after a fatal alert.)
                c.send_close_notify();
            }
            while c.wants_write() {
                if c.write_tls(&mut out).is_err() {
                    break;
                }
            }
        }
        if !out.is_empty() && self.sock.send_within(&out, FINAL_SEND).is_err() {
            self.shared.torn.store(true, Ordering::Release);
        }
    }

    /// End the session in order: send close_notify (best effort, within
    /// [`FINAL_SEND`]). Only between whole records: not after a write
    /// failed.
    pub(crate) fn close(&self) {
        self.send_last(true);
    }
}

impl<S: Read + Write + SendWithin> Read for TlsIo<S> {
    /// Plaintext, or `ErrorKind::Interrupted` after a socket read that
    /// brought bytes but no plaintext yet (part of a record, or of the
    /// handshake): callers retry, and look at their deadlines and at the
    /// server stopping first. Looping here until plaintext came would let
    /// a client that trickles bytes hold the call (and its handshake)
    /// forever. At most one socket read per call.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut socket_read = false;
        loop {
            let (got, wants_write) = {
                let mut s = lock(&self.shared.state);
                match s.plaintext(buf) {
                    Ok(got) => (got, s.conn.wants_write()),
                    Err(e) => {
                        // rustls queued an alert saying why: the client
                        // is told before the connection closes.
                        drop(s);
                        self.send_last(false);
                        return Err(e);
                    }
                }
            };
            // The handshake's answers, or a key update's.
            if wants_write {
                self.send_pending()?;
            }
            if let Some(n) = got {
                return Ok(n);
            }
            if socket_read {
                return Err(io::ErrorKind::Interrupted.into());
            }
            // Without the lock: a timeout here is the caller's tick.
            let n = self.sock.read(&mut self.raw)?;
            if n == 0 {
                return Ok(0);
            }
            lock(&self.shared.state).unfed.extend(&self.raw[..n]);
            socket_read = true;
        }
    }
}

impl<S: Read + Write + SendWithin> Write for TlsIo<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _order = lock(&self.shared.send);
        let mut out = Vec::with_capacity(buf.len() + 256);
        let n = {
            let c = &mut lock(&self.shared.state).conn;
            let n = c.writer().write(buf)?;
            while c.wants_write() {
                c.write_tls(&mut out)?;
            }
            n
        };
        self.shared.send_sealed(&mut self.sock, &out)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The TLS tests' client (shared with `tests/protocol.rs`).
#[cfg(test)]
#[path = "../tests/tls/client.rs"]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tls_client;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn err(dir: &Path, verify_peer: bool) -> String {
        server_config(dir, verify_peer).unwrap_err().to_string()
    }

    /// One end of an in-memory socket: what the client sent, to read;
    /// what the server sent, kept; and writes that fail once `room`
    /// (if set) more bytes went.
    #[derive(Clone, Default)]
    struct Pipe {
        from_client: Arc<Mutex<VecDeque<u8>>>,
        to_client: Arc<Mutex<Vec<u8>>>,
        room: Arc<Mutex<Option<usize>>>,
    }

    impl Read for Pipe {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let mut q = lock(&self.from_client);
            if q.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(q.len());
            for (b, q) in buf.iter_mut().zip(q.drain(..n)) {
                *b = q;
            }
            Ok(n)
        }
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut room = lock(&self.room);
            let n = room.map_or(buf.len(), |r| r.min(buf.len()));
            if n == 0 {
                return Err(io::ErrorKind::TimedOut.into());
            }
            if let Some(r) = room.as_mut() {
                *r -= n;
            }
            lock(&self.to_client).extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl SendWithin for Pipe {
        fn send_within(&self, buf: &[u8], _: Duration) -> io::Result<()> {
            self.clone().write_all(buf)
        }
    }

    use super::tls_client::{tls_client as client, tls_dir};

    /// Issue: a write that failed part-way released the send lock, and a
    /// rejection after it (`send_last`) appended its alert to the torn
    /// record. Now nothing is sent after a failed send.
    #[test]
    fn no_alert_follows_a_record_that_failed_part_way() {
        let pipe = Pipe::default();
        let mut io = TlsIo::new(server_config(&tls_dir(), false).unwrap(), pipe.clone()).unwrap();
        let mut c = client();
        let mut scrap = [0u8; 64];
        for _ in 0..20 {
            {
                let mut q = lock(&pipe.from_client);
                let mut out = Vec::new();
                while c.wants_write() {
                    c.write_tls(&mut out).unwrap();
                }
                q.extend(out);
            }
            let _ = io.read(&mut scrap);
            let got = std::mem::take(&mut *lock(&pipe.to_client));
            c.read_tls(&mut &got[..]).unwrap();
            c.process_new_packets().unwrap();
        }
        assert!(!c.is_handshaking(), "the handshake did not finish");
        // A reply that fails 100 bytes into its record.
        *lock(&pipe.room) = Some(100);
        assert!(io.write(&[7u8; 4096]).is_err());
        let torn = lock(&pipe.to_client).len();
        assert_eq!(torn, 100);
        // The socket takes bytes again; the client sends a record that no
        // key sealed, which rustls rejects with an alert.
        *lock(&pipe.room) = None;
        let mut forged = vec![0x17, 0x03, 0x03, 0x00, 0x40];
        forged.extend_from_slice(&[0x5a; 0x40]);
        lock(&pipe.from_client).extend(forged);
        let read = io.read(&mut scrap).map_err(|e| e.kind());
        assert_eq!(read, Err(io::ErrorKind::InvalidData));
        assert_eq!(
            lock(&pipe.to_client).len(),
            torn,
            "bytes followed the torn record"
        );
        io.close();
        assert_eq!(lock(&pipe.to_client).len(), torn, "close_notify followed");
    }

    #[test]
    fn a_missing_or_unusable_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(
            err(d, false).contains("server-cert.pem"),
            "{}",
            err(d, false)
        );
        // PEM sections that parse as such (their contents are checked
        // later, by rustls): what is missing next is the CA, under
        // --tls-verify-peer only.
        let pem = |label: &str| format!("-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n");
        std::fs::write(d.join("server-cert.pem"), pem("CERTIFICATE")).unwrap();
        std::fs::write(d.join("server-key.pem"), pem("PRIVATE KEY")).unwrap();
        let e = err(d, true);
        assert!(e.contains("ca-cert.pem"), "{e}");
        std::fs::write(d.join("ca-cert.pem"), pem("CERTIFICATE")).unwrap();
        let e = err(d, true);
        assert!(
            e.contains("ca-cert.pem"),
            "a CA that is not a certificate: {e}"
        );
        std::fs::write(d.join("ca-cert.pem"), "no PEM here\n").unwrap();
        let e = err(d, true);
        assert!(
            e.contains("ca-cert.pem") && e.contains("no certificate"),
            "{e}"
        );
    }
}
