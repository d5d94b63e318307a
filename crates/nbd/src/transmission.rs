//! The transmission phase: requests in, replies out, several in flight.
//!
//! Leader/follower: each of a connection's worker threads in turn takes
//! the reader, reads one request (with its payload), gives the reader to
//! the next, does the I/O and writes its reply under the writer lock.
//! Requests complete out of order, as the protocol allows; no request is
//! handed between threads, and in-flight requests (and so the memory they
//! hold) are bounded by the number of workers.

use crate::handshake::{Negotiated, BASE_ALLOCATION_ID};
use crate::proto::{self, cflag, cmd, err, reply, Request, REQUEST_LEN};
use crate::Export;
use cairn_blockdev::{BlockError, ErrorKind, ZeroFlags};
use std::io::{self, BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Replies up to this size are copied into one buffer and sent with one
/// write; larger read data goes in a second write.
const COALESCE: usize = 64 << 10;
/// A worker keeps a buffer this large between requests at most.
const KEEP_BUFFER: usize = 4 << 20;

/// Why a connection ended.
#[derive(Debug)]
pub(crate) enum End {
    /// NBD_CMD_DISC or end of stream.
    Clean,
    /// A request with a bad magic: the stream lost sync.
    BadMagic,
    /// The socket failed.
    Io(io::Error),
}

struct Shared<'a, R, W> {
    reader: Mutex<BufReader<R>>,
    writer: Mutex<W>,
    export: &'a Export,
    neg: Negotiated,
    max_request: u32,
    closing: AtomicBool,
    end: Mutex<Option<End>>,
}

/// Serve requests until the client disconnects or the stream fails.
pub(crate) fn run<R: Read + Send, W: Write + Send>(
    reader: R,
    writer: W,
    export: &Export,
    neg: Negotiated,
    workers: usize,
    max_request: u32,
) -> End {
    let shared = Shared {
        reader: Mutex::new(BufReader::with_capacity(256 << 10, reader)),
        writer: Mutex::new(writer),
        export,
        neg,
        max_request,
        closing: AtomicBool::new(false),
        end: Mutex::new(None),
    };
    std::thread::scope(|s| {
        for _ in 1..workers.max(1) {
            s.spawn(|| worker(&shared));
        }
        worker(&shared);
    });
    let end = shared.end.lock().map(|mut e| e.take()).unwrap_or(None);
    end.unwrap_or(End::Clean)
}

/// One request read off the stream.
struct Job {
    req: Request,
    /// The payload was longer than the server accepts and was discarded.
    oversized: bool,
}

fn worker<R: Read, W: Write>(sh: &Shared<R, W>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::with_capacity(COALESCE + 64);
    loop {
        let job = {
            let Ok(mut r) = sh.reader.lock() else { return };
            if sh.closing.load(Ordering::Acquire) {
                return;
            }
            match read_job(&mut r, &mut buf, sh.max_request) {
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
        out.clear();
        let data = handle(sh, &job, &mut buf, &mut out);
        let sent = match sh.writer.lock() {
            Ok(mut w) => w
                .write_all(&out)
                .and_then(|_| match data {
                    Some(d) => w.write_all(d),
                    None => Ok(()),
                })
                .and_then(|_| w.flush()),
            Err(_) => Err(io::Error::other("a worker panicked")),
        };
        if let Err(e) = sent {
            sh.finish(End::Io(e));
            return;
        }
        if buf.capacity() > KEEP_BUFFER {
            buf = Vec::new();
        }
    }
}

impl<R, W> Shared<'_, R, W> {
    fn finish(&self, end: End) {
        self.closing.store(true, Ordering::Release);
        if let Ok(mut e) = self.end.lock() {
            e.get_or_insert(end);
        }
    }
}

/// Read the next request and, for a write, its payload into `buf`.
/// `Ok(None)`: disconnect (NBD_CMD_DISC or end of stream between requests).
fn read_job<R: Read>(
    r: &mut BufReader<R>,
    buf: &mut Vec<u8>,
    max_request: u32,
) -> Result<Option<Job>, End> {
    let mut h = [0u8; REQUEST_LEN];
    // End of stream before a header starts is a clean (if rude) exit.
    match r.read(&mut h[..1]) {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(e) => return Err(End::Io(e)),
    }
    r.read_exact(&mut h[1..]).map_err(End::Io)?;
    let req = proto::parse_request(&h).ok_or(End::BadMagic)?;
    if req.kind == cmd::DISC {
        return Ok(None);
    }
    let mut oversized = false;
    if req.kind == cmd::WRITE {
        if req.len > max_request {
            io::copy(&mut r.take(u64::from(req.len)), &mut io::sink()).map_err(End::Io)?;
            oversized = true;
        } else {
            buf.clear();
            buf.resize(req.len as usize, 0);
            r.read_exact(buf).map_err(End::Io)?;
        }
    }
    Ok(Some(Job { req, oversized }))
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
) -> Option<&'b [u8]> {
    let req = job.req;
    if let Err(e) = check(sh, &job.req, job.oversized) {
        error_reply(sh, &req, out, e, "request refused");
        return None;
    }
    let dev = &*sh.export.dev;
    let off = req.offset;
    let len = u64::from(req.len);
    let fua = req.flags & cflag::FUA != 0;
    let done = match req.kind {
        cmd::READ => {
            if req.len == 0 {
                // A structured reply may not carry an empty data chunk.
                if sh.neg.structured {
                    proto::chunk_header(out, reply::FLAG_DONE, reply::NONE, req.cookie, 0);
                } else {
                    proto::simple_reply(out, 0, req.cookie);
                }
                return None;
            }
            buf.clear();
            buf.resize(req.len as usize, 0);
            match dev.read_at(buf, off) {
                Ok(()) => {
                    if sh.neg.structured {
                        proto::chunk_header(
                            out,
                            reply::FLAG_DONE,
                            reply::OFFSET_DATA,
                            req.cookie,
                            8 + req.len,
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
            if req.len == 0 {
                Ok(())
            } else {
                dev.write_at(&buf[..req.len as usize], off, fua)
            }
        }
        cmd::FLUSH => {
            if sh.export.is_read_only() {
                Ok(())
            } else {
                dev.flush()
            }
        }
        cmd::TRIM => {
            if len == 0 {
                Ok(())
            } else {
                dev.trim(off, len, fua)
            }
        }
        cmd::WRITE_ZEROES => {
            let flags = ZeroFlags {
                fua,
                may_trim: req.flags & cflag::NO_HOLE == 0,
                fast: req.flags & cflag::FAST_ZERO != 0,
            };
            if len == 0 {
                Ok(())
            } else {
                dev.write_zeroes(off, len, flags)
            }
        }
        cmd::CACHE => Ok(()),
        cmd::BLOCK_STATUS => match dev.extents(off, len) {
            Ok(extents) => {
                block_status_reply(out, &req, &extents);
                return None;
            }
            Err(e) => Err(e),
        },
        _ => {
            error_reply(sh, &req, out, err::EINVAL, "unknown command");
            return None;
        }
    };
    match done {
        Ok(()) => proto::simple_reply(out, 0, req.cookie),
        Err(e) => {
            let msg = e.to_string();
            error_reply(sh, &req, out, wire_error(&e), &msg);
        }
    }
    None
}

/// Refuse what the export cannot take, before touching the device.
fn check<R, W>(sh: &Shared<R, W>, req: &Request, oversized: bool) -> Result<(), u32> {
    let size = sh.export.dev.size();
    let end = req.offset.checked_add(u64::from(req.len));
    let writes = matches!(req.kind, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES);
    // Unknown commands are refused by `handle` itself.
    if writes && sh.export.is_read_only() {
        return Err(err::EPERM);
    }
    if oversized || (req.kind == cmd::READ && req.len > sh.max_request) {
        return Err(err::EINVAL);
    }
    if req.flags & cflag::FAST_ZERO != 0 && req.kind != cmd::WRITE_ZEROES {
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

fn error_reply<R, W>(sh: &Shared<R, W>, req: &Request, out: &mut Vec<u8>, e: u32, msg: &str) {
    if sh.neg.structured && matches!(req.kind, cmd::READ | cmd::BLOCK_STATUS) {
        proto::error_chunk(out, req.cookie, e, msg);
    } else {
        proto::simple_reply(out, e, req.cookie);
    }
}

/// One BLOCK_STATUS chunk for base:allocation, clamped to the request.
fn block_status_reply(out: &mut Vec<u8>, req: &Request, extents: &[cairn_blockdev::Extent]) {
    let mut descs: Vec<(u32, u32)> = Vec::new();
    let mut left = u64::from(req.len);
    for e in extents {
        if left == 0 {
            break;
        }
        let n = e.len.min(left);
        if n == 0 {
            continue;
        }
        let flags = (if e.hole { proto::STATE_HOLE } else { 0 })
            | (if e.zero { proto::STATE_ZERO } else { 0 });
        match descs.last_mut() {
            Some((l, f)) if *f == flags => *l += n as u32,
            _ => descs.push((n as u32, flags)),
        }
        left -= n;
        if req.flags & cflag::REQ_ONE != 0 {
            break;
        }
    }
    if descs.is_empty() {
        // The device reported nothing: the conservative answer.
        descs.push((req.len, 0));
    }
    proto::chunk_header(
        out,
        reply::FLAG_DONE,
        reply::BLOCK_STATUS,
        req.cookie,
        4 + 8 * descs.len() as u32,
    );
    out.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    for (l, f) in descs {
        out.extend_from_slice(&l.to_be_bytes());
        out.extend_from_slice(&f.to_be_bytes());
    }
}
