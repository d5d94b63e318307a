//! The NBD protocol's numbers and wire layouts (fixed newstyle handshake,
//! compact and extended requests, simple, structured and extended
//! replies), as pure functions over bytes.

/// "NBDMAGIC": the server's first word.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation, and the prefix of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of an option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a compact (28-byte) transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of an extended (32-byte) transmission request.
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Magic of an extended reply chunk.
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

/// Handshake flags (server).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// The server omits the 124 zero bytes after NBD_OPT_EXPORT_NAME if asked.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags.
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
/// The client does not want the 124 zero bytes.
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

/// Option numbers.
pub mod opt {
    /// Choose an export, old way (no reply on failure: the server closes).
    pub const EXPORT_NAME: u32 = 1;
    /// End negotiation.
    pub const ABORT: u32 = 2;
    /// List exports.
    pub const LIST: u32 = 3;
    /// Upgrade the connection to TLS.
    pub const STARTTLS: u32 = 5;
    /// Describe an export.
    pub const INFO: u32 = 6;
    /// Describe and choose an export.
    pub const GO: u32 = 7;
    /// Structured replies.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List metadata contexts.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Choose metadata contexts.
    pub const SET_META_CONTEXT: u32 = 10;
    /// Extended (32-byte, 64-bit length) headers.
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types.
pub mod rep {
    /// Done.
    pub const ACK: u32 = 1;
    /// One export of a list.
    pub const SERVER: u32 = 2;
    /// One piece of information about an export.
    pub const INFO: u32 = 3;
    /// One metadata context.
    pub const META_CONTEXT: u32 = 4;
    /// Unknown option.
    pub const ERR_UNSUP: u32 = (1 << 31) + 1;
    /// Refused by policy.
    pub const ERR_POLICY: u32 = (1 << 31) + 2;
    /// Malformed option.
    pub const ERR_INVALID: u32 = (1 << 31) + 3;
    /// TLS must be negotiated first.
    pub const ERR_TLS_REQD: u32 = (1 << 31) + 5;
    /// No such export.
    pub const ERR_UNKNOWN: u32 = (1 << 31) + 6;
    /// Too large to process.
    pub const ERR_TOO_BIG: u32 = (1 << 31) + 9;
    /// Extended headers are on: no downgrade to structured replies.
    pub const ERR_EXT_HEADER_REQD: u32 = (1 << 31) + 10;
}

/// NBD_INFO types.
pub mod info {
    /// Size and transmission flags.
    pub const EXPORT: u16 = 0;
    /// Export name.
    pub const NAME: u16 = 1;
    /// Description.
    pub const DESCRIPTION: u16 = 2;
    /// Minimum, preferred and maximum block sizes.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission flags.
pub mod tflag {
    /// Always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// Writes are refused.
    pub const READ_ONLY: u16 = 1 << 1;
    /// NBD_CMD_FLUSH works.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// NBD_CMD_FLAG_FUA works.
    pub const SEND_FUA: u16 = 1 << 3;
    /// Seeks are expensive.
    pub const ROTATIONAL: u16 = 1 << 4;
    /// NBD_CMD_TRIM works.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// NBD_CMD_WRITE_ZEROES works.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// NBD_CMD_FLAG_DF works.
    pub const SEND_DF: u16 = 1 << 7;
    /// Several connections are safe.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// NBD_CMD_FLAG_FAST_ZERO works.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Commands.
pub mod cmd {
    /// Read.
    pub const READ: u16 = 0;
    /// Write.
    pub const WRITE: u16 = 1;
    /// Disconnect.
    pub const DISC: u16 = 2;
    /// Flush.
    pub const FLUSH: u16 = 3;
    /// Trim.
    pub const TRIM: u16 = 4;
    /// Prefetch.
    pub const CACHE: u16 = 5;
    /// Write zeroes.
    pub const WRITE_ZEROES: u16 = 6;
    /// Block status.
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod cflag {
    /// Force unit access.
    pub const FUA: u16 = 1 << 0;
    /// Write zeroes without punching a hole.
    pub const NO_HOLE: u16 = 1 << 1;
    /// Don't fragment the read reply.
    pub const DF: u16 = 1 << 2;
    /// One block status descriptor only.
    pub const REQ_ONE: u16 = 1 << 3;
    /// Fail write zeroes unless it is fast.
    pub const FAST_ZERO: u16 = 1 << 4;
    /// Extended headers only: the length is that of a payload that
    /// follows the header, not the range the command acts on.
    pub const PAYLOAD_LEN: u16 = 1 << 5;
    /// Every flag the protocol defines: any other is refused (EINVAL).
    pub const KNOWN: u16 = FUA | NO_HOLE | DF | REQ_ONE | FAST_ZERO | PAYLOAD_LEN;
}

/// Structured reply chunk types.
pub mod reply {
    /// Last chunk, no payload.
    pub const NONE: u16 = 0;
    /// Data at an offset.
    pub const OFFSET_DATA: u16 = 1;
    /// Zeroes at an offset.
    pub const OFFSET_HOLE: u16 = 2;
    /// Block status descriptors (32-bit lengths).
    pub const BLOCK_STATUS: u16 = 5;
    /// Block status descriptors with 64-bit lengths (extended headers).
    pub const BLOCK_STATUS_EXT: u16 = 6;
    /// An error.
    pub const ERROR: u16 = (1 << 15) + 1;
    /// The chunk ends the reply.
    pub const FLAG_DONE: u16 = 1 << 0;
}

/// NBD error numbers (the wire values, not the host's errno).
pub mod err {
    /// Operation not permitted.
    pub const EPERM: u32 = 1;
    /// I/O error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space.
    pub const ENOSPC: u32 = 28;
    /// Value too large.
    pub const EOVERFLOW: u32 = 75;
    /// Not supported.
    pub const ENOTSUP: u32 = 95;
    /// Server shutting down.
    pub const ESHUTDOWN: u32 = 108;

    /// The wire value for a host errno.
    pub fn from_errno(e: i32) -> u32 {
        match e {
            libc::EPERM | libc::EROFS | libc::EACCES => EPERM,
            libc::ENOMEM => ENOMEM,
            libc::EINVAL => EINVAL,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
            libc::EOVERFLOW => EOVERFLOW,
            libc::ENOTSUP => ENOTSUP,
            libc::ESHUTDOWN => ESHUTDOWN,
            _ => EIO,
        }
    }
}

/// base:allocation status bits.
pub const STATE_HOLE: u32 = 1 << 0;
/// Reads as zeroes.
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context served.
pub const BASE_ALLOCATION: &str = "base:allocation";

/// Length of a compact request header.
pub const REQUEST_LEN: usize = 28;
/// Length of an extended request header (and of every extended reply
/// header).
pub const EXTENDED_REQUEST_LEN: usize = 32;

/// The reply headers (and request headers) a connection uses, as
/// negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replies {
    /// Nothing negotiated: compact requests, simple replies only.
    Simple,
    /// NBD_OPT_STRUCTURED_REPLY: compact requests; 20-byte chunk headers,
    /// simple replies where there is no payload.
    Structured,
    /// NBD_OPT_EXTENDED_HEADERS: 32-byte requests with 64-bit lengths;
    /// every reply is 32-byte chunks (the spec forbids simple replies).
    Extended,
}

impl Replies {
    /// Replies may be chunks (structured or extended).
    pub fn chunked(self) -> bool {
        self != Replies::Simple
    }

    /// Length of a request header in this mode.
    pub fn request_len(self) -> usize {
        if self == Replies::Extended {
            EXTENDED_REQUEST_LEN
        } else {
            REQUEST_LEN
        }
    }
}

/// A transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// NBD_CMD_FLAG_* bits.
    pub flags: u16,
    /// NBD_CMD_*.
    pub kind: u16,
    /// The client's cookie, echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length: of the payload for a write (or, with extended
    /// headers, a request with [`cflag::PAYLOAD_LEN`]), else of the range
    /// acted on. At most 32 bits unless extended headers are on.
    pub len: u64,
}

/// Parse a request header of `mode` (`b` is [`Replies::request_len`]
/// bytes); `None` if the magic is not that of the mode or the length is
/// wrong (the stream has lost sync and the connection must close).
pub fn parse_request(b: &[u8], mode: Replies) -> Option<Request> {
    let (magic, len) = match mode {
        Replies::Extended if b.len() == EXTENDED_REQUEST_LEN => {
            (EXTENDED_REQUEST_MAGIC, be64(&b[24..32]))
        }
        Replies::Simple | Replies::Structured if b.len() == REQUEST_LEN => {
            (REQUEST_MAGIC, u64::from(be32(&b[24..28])))
        }
        _ => return None,
    };
    if be32(&b[0..4]) != magic {
        return None;
    }
    Some(Request {
        flags: be16(&b[4..6]),
        kind: be16(&b[6..8]),
        cookie: be64(&b[8..16]),
        offset: be64(&b[16..24]),
        len,
    })
}

/// Encode a request header for `mode` (for clients and tests); `None` if
/// the length does not fit a compact header.
pub fn encode_request(r: &Request, mode: Replies) -> Option<Vec<u8>> {
    let mut b = Vec::with_capacity(EXTENDED_REQUEST_LEN);
    let magic = if mode == Replies::Extended {
        EXTENDED_REQUEST_MAGIC
    } else {
        REQUEST_MAGIC
    };
    b.extend_from_slice(&magic.to_be_bytes());
    b.extend_from_slice(&r.flags.to_be_bytes());
    b.extend_from_slice(&r.kind.to_be_bytes());
    b.extend_from_slice(&r.cookie.to_be_bytes());
    b.extend_from_slice(&r.offset.to_be_bytes());
    if mode == Replies::Extended {
        b.extend_from_slice(&r.len.to_be_bytes());
    } else {
        b.extend_from_slice(&u32::try_from(r.len).ok()?.to_be_bytes());
    }
    Some(b)
}

/// Append a simple reply header (never under extended headers).
pub fn simple_reply(out: &mut Vec<u8>, error: u32, cookie: u64) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

/// Append a reply chunk header: structured (20 bytes; `len` must fit 32
/// bits, which every payload this server sends does) or, under extended
/// headers, extended (32 bytes, repeating the request's `offset` as the
/// spec requires).
pub fn chunk_header(
    out: &mut Vec<u8>,
    mode: Replies,
    flags: u16,
    kind: u16,
    cookie: u64,
    offset: u64,
    len: u64,
) {
    let extended = mode == Replies::Extended;
    let magic = if extended {
        EXTENDED_REPLY_MAGIC
    } else {
        STRUCTURED_REPLY_MAGIC
    };
    out.extend_from_slice(&magic.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    if extended {
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&len.to_be_bytes());
    } else {
        debug_assert!(
            len <= u64::from(u32::MAX),
            "structured chunk of {len} bytes"
        );
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

/// Append an error chunk that ends the reply to the request at `offset`
/// (the message is cut to the spec's 4096 bytes).
pub fn error_chunk(
    out: &mut Vec<u8>,
    mode: Replies,
    cookie: u64,
    offset: u64,
    error: u32,
    message: &str,
) {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    chunk_header(
        out,
        mode,
        reply::FLAG_DONE,
        reply::ERROR,
        cookie,
        offset,
        6 + msg.len() as u64,
    );
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

/// Append an option reply.
pub fn option_reply(out: &mut Vec<u8>, option: u32, kind: u32, data: &[u8]) {
    out.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// Big-endian u16 of the first two bytes.
pub fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// Big-endian u32 of the first four bytes.
pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Big-endian u64 of the first eight bytes.
pub fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// A cursor over an option's data that fails instead of panicking.
pub struct Cursor<'a> {
    data: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// Read from the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.data.len() < n {
            return None;
        }
        let (a, b) = self.data.split_at(n);
        self.data = b;
        Some(a)
    }

    /// A big-endian u16.
    pub fn u16(&mut self) -> Option<u16> {
        self.take(2).map(be16)
    }

    /// A big-endian u32.
    pub fn u32(&mut self) -> Option<u32> {
        self.take(4).map(be32)
    }

    /// A string with a u32 length prefix, at most 4096 bytes.
    pub fn string(&mut self) -> Option<&'a str> {
        let n = self.u32()? as usize;
        if n > 4096 {
            return None;
        }
        std::str::from_utf8(self.take(n)?).ok()
    }

    /// Bytes left.
    pub fn rest(&self) -> usize {
        self.data.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_and_bad_magic() {
        let mut r = Request {
            flags: cflag::FUA,
            kind: cmd::WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            len: 4096,
        };
        for mode in [Replies::Simple, Replies::Structured, Replies::Extended] {
            let b = encode_request(&r, mode).unwrap_or_default();
            assert_eq!(b.len(), mode.request_len());
            assert_eq!(parse_request(&b, mode), Some(r));
            let mut bad = b.clone();
            bad[0] ^= 1;
            assert_eq!(parse_request(&bad, mode), None);
        }
        // A compact header where extended ones were agreed (and the
        // reverse) is a lost stream, whatever its length.
        let compact = encode_request(&r, Replies::Structured).unwrap_or_default();
        let mut padded = compact.clone();
        padded.extend_from_slice(&[0; 4]);
        assert_eq!(parse_request(&padded, Replies::Extended), None);
        let ext = encode_request(&r, Replies::Extended).unwrap_or_default();
        assert_eq!(
            parse_request(&ext[..REQUEST_LEN], Replies::Structured),
            None
        );
        // 64-bit lengths: only in extended headers.
        r.len = 5 << 32;
        assert_eq!(encode_request(&r, Replies::Simple), None);
        let b = encode_request(&r, Replies::Extended).unwrap_or_default();
        assert_eq!(&b[0..4], &EXTENDED_REQUEST_MAGIC.to_be_bytes());
        assert_eq!(&b[24..32], &(5u64 << 32).to_be_bytes());
        assert_eq!(
            parse_request(&b, Replies::Extended).map(|r| r.len),
            Some(5 << 32)
        );
    }

    #[test]
    fn extended_chunk_headers_are_32_bytes_and_repeat_the_offset() {
        let mut out = Vec::new();
        chunk_header(
            &mut out,
            Replies::Extended,
            reply::FLAG_DONE,
            reply::OFFSET_DATA,
            7,
            1 << 33,
            4104,
        );
        assert_eq!(out.len(), 32);
        assert_eq!(be32(&out[0..4]), EXTENDED_REPLY_MAGIC);
        assert_eq!(be16(&out[4..6]), reply::FLAG_DONE);
        assert_eq!(be16(&out[6..8]), reply::OFFSET_DATA);
        assert_eq!(be64(&out[8..16]), 7);
        assert_eq!(be64(&out[16..24]), 1 << 33);
        assert_eq!(be64(&out[24..32]), 4104);
        out.clear();
        chunk_header(&mut out, Replies::Structured, 0, reply::NONE, 7, 1 << 33, 9);
        assert_eq!(out.len(), 20);
        assert_eq!(be32(&out[0..4]), STRUCTURED_REPLY_MAGIC);
        assert_eq!(be32(&out[16..20]), 9);
        out.clear();
        error_chunk(&mut out, Replies::Extended, 3, 99, err::EINVAL, "no");
        assert_eq!(out.len(), 32 + 6 + 2);
        assert_eq!(be16(&out[6..8]), reply::ERROR);
        assert_eq!(be64(&out[16..24]), 99);
        assert_eq!(be64(&out[24..32]), 8);
        assert_eq!(be32(&out[32..36]), err::EINVAL);
    }

    #[test]
    fn cursor_never_reads_past_the_end() {
        let mut c = Cursor::new(&[0, 0, 0, 9, b'a']);
        assert_eq!(c.string(), None);
        let mut c = Cursor::new(&[0, 0, 0, 1, b'a', 0]);
        assert_eq!(c.string(), Some("a"));
        assert_eq!(c.u16(), None);
        assert_eq!(c.rest(), 1);
    }
}
