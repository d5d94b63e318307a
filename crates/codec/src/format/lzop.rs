//! lzop files: the lzop header, then blocks of at most 256 KiB (lzop's own
//! block size, which every lzop reads) each with its sizes and an Adler-32
//! of its uncompressed bytes, then a zero end mark. Blocks
//! are independent, so cairn groups them into units and decodes in
//! parallel. lzop stores a block uncompressed when LZO does not shrink it.
//!
//! Header written: magic, version 0x1040, library 0x20a0, needed 0x0940
//! (0x1001 with CRC-32s, as lzop), method (1 = LZO1X-1 at levels 1-6, 3 =
//! LZO1X-999 at 7-9), level, flags (Unix, and the data's check: Adler-32
//! by default, CRC-32 with `--crc32`, none with `-F`, which lzop ignores
//! at levels 7-9 and so does cairn), mode 0644, the input's modification
//! time and name as lzop keeps them (none from standard input or with
//! `-n`), Adler-32 of the header (CRC-32 with CRC-32s).
//!
//! [`members`] reads what `lzop -l` lists (each member's header and the
//! sizes of its blocks), passing over the blocks' data.

use super::{be32, in_stream, pass_plain, BlockMeta, Unit, UnitKind, MAX_UNIT};
use crate::block::{BlockCodec, LzoCodec};
use crate::error::{CodecError, Result};
use crate::input::{begins_like, Input};
use crate::IntegrityCheck;

const NAME: &str = "lzop";
/// The lzop magic.
pub const MAGIC: &[u8] = b"\x89LZO\x00\r\n\x1a\n";
/// lzop's block size.
pub const BLOCK: usize = 256 << 10;
/// Largest block lzop accepts on reading.
const MAX_BLOCK: usize = 64 << 20;
const F_ADLER32_D: u32 = 0x0001;
const F_ADLER32_C: u32 = 0x0002;
const F_H_EXTRA_FIELD: u32 = 0x0040;
const F_CRC32_D: u32 = 0x0100;
const F_CRC32_C: u32 = 0x0200;
/// Set in every member `lzop -c a b` or `lzop -o x a b` writes.
pub const F_MULTIPART: u32 = 0x0400;
const F_H_FILTER: u32 = 0x0800;
const F_H_CRC32: u32 = 0x1000;
const F_OS_UNIX: u32 = 0x0300_0000;
/// Group blocks into units of about this many decoded bytes.
const UNIT_TARGET: usize = 4 << 20;

fn adler(data: &[u8]) -> u32 {
    simd_adler32::adler32(&data)
}

/// The sum each block's data carries, as lzop's flags name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sum {
    Adler32,
    Crc32,
    None,
}

impl Sum {
    /// The sum for `check` at `level`: lzop stores one at levels 7-9 even
    /// when told not to (`-F`).
    fn of(check: IntegrityCheck, level: i32) -> Sum {
        match check {
            IntegrityCheck::Crc32 => Sum::Crc32,
            IntegrityCheck::None if level < 7 => Sum::None,
            _ => Sum::Adler32,
        }
    }

    fn of_data(self, data: &[u8]) -> Option<u32> {
        match self {
            Sum::Adler32 => Some(adler(data)),
            Sum::Crc32 => Some(crc32fast::hash(data)),
            Sum::None => None,
        }
    }

    fn flags(self) -> u32 {
        match self {
            Sum::Adler32 => F_ADLER32_D,
            Sum::Crc32 => F_CRC32_D | F_H_CRC32,
            Sum::None => 0,
        }
    }
}

/// Compresses input into lzop blocks.
pub struct Encoder {
    codec: LzoCodec,
    sum: Sum,
}

impl Encoder {
    /// An encoder at lzop `level` (1-6 = LZO1X-1, 7-9 = LZO1X-999),
    /// each block's data summed as `check` says (the default: Adler-32;
    /// CRC-32; none, but at levels 7-9, as lzop).
    pub fn new(level: i32, check: IntegrityCheck) -> Self {
        Encoder {
            codec: LzoCodec::new(level),
            sum: Sum::of(check, level),
        }
    }
}

impl super::BlockEncoder for Encoder {
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        let start = out.len();
        for piece in src.chunks(BLOCK) {
            // Block: uncompressed length, compressed length, the sum of
            // the uncompressed bytes (lzop's default: no sum of the
            // compressed bytes), data; stored as is when LZO does not
            // shrink it.
            let at = out.len();
            let sum = self.sum.of_data(piece);
            let head = 8 + if sum.is_some() { 4 } else { 0 };
            out.extend_from_slice(&(piece.len() as u32).to_be_bytes());
            out.extend_from_slice(&[0; 4]);
            if let Some(sum) = sum {
                out.extend_from_slice(&sum.to_be_bytes());
            }
            self.codec.compress(piece, out)?;
            let clen = (out.len() - at - head).min(piece.len());
            if clen == piece.len() {
                out.truncate(at + head);
                out.extend_from_slice(piece);
            }
            out[at + 4..at + 8].copy_from_slice(&(clen as u32).to_be_bytes());
        }
        Ok(BlockMeta {
            raw_len: src.len() as u64,
            packed_len: (out.len() - start) as u64,
            check: 0,
        })
    }
}

/// Writes the lzop header and the end mark.
pub struct Framer {
    level: i32,
    sum: Sum,
    /// The input's name (at most 255 bytes, as lzop's field) and time.
    origin: super::Origin,
}

impl Framer {
    /// A framer recording `level` and the blocks' sum (as
    /// [`Encoder::new`] is given `check`) in the header.
    pub fn new(level: i32, check: IntegrityCheck) -> Self {
        Framer {
            level,
            sum: Sum::of(check, level),
            origin: super::Origin::default(),
        }
    }
}

impl super::Framer for Framer {
    fn origin(&mut self, origin: &super::Origin) {
        self.origin = origin.clone();
    }

    fn header(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        let h = out.len();
        // M_LZO1X_1 for levels 1-6 (cairn writes LZO1X-1 at level 1 too:
        // see `LzoCodec::new`), M_LZO1X_999 above.
        let method = if self.level <= 6 { 1 } else { 3 };
        out.extend_from_slice(&0x1040u16.to_be_bytes());
        out.extend_from_slice(&0x20a0u16.to_be_bytes());
        // lzop 1.0.1 read CRC-32s first.
        let needed: u16 = if self.sum == Sum::Crc32 {
            0x1001
        } else {
            0x0940
        };
        out.extend_from_slice(&needed.to_be_bytes());
        out.push(method);
        out.push(self.level.clamp(1, 9) as u8);
        out.extend_from_slice(&(self.sum.flags() | F_OS_UNIX).to_be_bytes());
        out.extend_from_slice(&0o100644u32.to_be_bytes());
        // The time's low 32 bits, then its high ones (none here).
        out.extend_from_slice(&self.origin.mtime.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        let name = &self.origin.name[..self.origin.name.len().min(255)];
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        let sum = match self.sum {
            Sum::Crc32 => crc32fast::hash(&out[h..]),
            _ => adler(&out[h..]),
        };
        out.extend_from_slice(&sum.to_be_bytes());
    }
    fn block(&mut self, _meta: &BlockMeta) {}
    fn trailer(&mut self, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(&[0; 4]);
        Ok(())
    }
}

/// Cuts an lzop file into runs of blocks.
pub struct Splitter {
    input: Input,
    flags: Option<u32>,
    files: u64,
    /// Stop where a second member begins ([`Splitter::first_member`]).
    first_member: bool,
    /// Where the member not read begins, once stopped there.
    next_member: Option<u64>,
    /// A member that is a part (after the first, or marked as one)
    /// keeps no name.
    nameless_part: bool,
    /// An error met after whole blocks of a unit were taken.
    deferred: super::Deferred,
}

impl Splitter {
    /// A splitter over `input`.
    pub fn new(input: Input) -> Self {
        Splitter {
            input,
            flags: None,
            files: 0,
            first_member: false,
            next_member: None,
            nameless_part: false,
            deferred: super::Deferred::default(),
        }
    }

    /// Read the first member only, and end where another lzop member
    /// begins after it ([`super::Members::next_at`] says where):
    /// `lzop -d` writes each member of a file of parts to a file of its
    /// own. Bytes after the first member that begin none are read on,
    /// as without it (zeros to the end are nothing, others garbage).
    pub fn first_member(mut self, only: bool) -> Self {
        self.first_member = only;
        self
    }

    /// Append the next block (its sizes, sums and data) to `data`: its
    /// decoded size, or `None` at the end mark (consumed).
    fn take_block(&mut self, flags: u32, data: &mut Vec<u8>) -> Result<Option<usize>> {
        let off = self.input.offset();
        let b = self.input.need(4, NAME)?;
        let dst_len = be32(b, 0) as usize;
        if dst_len == 0 {
            self.input.consume(4);
            return Ok(None);
        }
        let b = self.input.need(8, NAME)?;
        let src_len = be32(b, 4) as usize;
        if dst_len > MAX_BLOCK {
            return Err(CodecError::TooLarge {
                format: NAME,
                what: "block size field",
                offset: off,
                size: dst_len as u64,
                limit: MAX_BLOCK as u64,
            });
        }
        if src_len > dst_len {
            return Err(CodecError::corrupt(
                NAME,
                off + 4,
                format!("compressed size {src_len} exceeds block size {dst_len}"),
            ));
        }
        let total = 8 + sums_len(flags, src_len == dst_len) + src_len;
        self.input.take(total, data, NAME)?;
        Ok(Some(dst_len))
    }

    /// Whether nothing but zeros follows (read through them), as lzop
    /// takes zeros after its last member; `false` where a member may
    /// follow (no zero first). Zeros and then anything are trailing
    /// garbage, from where the zeros begin, as lzop has it.
    fn rest_is_zeros(&mut self) -> Result<bool> {
        let start = self.input.offset();
        loop {
            if self.input.fill(64 << 10)? == 0 {
                return Ok(true);
            }
            let zeros = self.input.peek().iter().take_while(|&&b| b == 0).count();
            if zeros < self.input.peek().len() {
                if zeros == 0 && self.input.offset() == start {
                    return Ok(false);
                }
                return Err(CodecError::TrailingGarbage {
                    format: NAME,
                    offset: start,
                });
            }
            self.input.consume(zeros);
        }
    }

    fn parse_header(&mut self) -> Result<u32> {
        let off = self.input.offset();
        let mut n = MAGIC.len() + 2;
        self.input
            .need_start(n, NAME, |b| begins_like(b, MAGIC))
            .and_then(|b| magic(b, off))?;
        let header = loop {
            match header(self.input.need(n, NAME)?, off)? {
                Parsed::Needs(more) => n = more,
                Parsed::Header(h) => break h,
            }
        };
        self.input.consume(header.len);
        let part = self.files > 0 || header.flags & F_MULTIPART != 0;
        self.nameless_part |= part && header.name.is_empty();
        self.files += 1;
        Ok(header.flags)
    }
}

/// What an lzop member's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// 1 (LZO1X-1), 2 (LZO1X-1(15)) or 3 (LZO1X-999).
    pub method: u8,
    /// The level it was packed at (0 in headers before lzop 0.94).
    pub level: u8,
    /// lzop's flags (the sums the blocks carry, the system).
    pub flags: u32,
    /// The packed file's mode.
    pub mode: u32,
    /// Its modification time, in seconds either side of the epoch (0:
    /// none), 64 signed bits as lzop keeps it.
    pub mtime: i64,
    /// Its name as kept (empty: none).
    pub name: Vec<u8>,
    /// The header's length, magic and extra field included.
    pub len: usize,
}

impl Header {
    /// lzop's name of the method (`lzop -l`'s first column): LZO1X-999
    /// with the level it ran at.
    pub fn method_name(&self) -> String {
        match self.method {
            1 => "LZO1X-1".into(),
            2 => "LZO1X-1(15)".into(),
            3 if self.level > 0 => format!("LZO1X-999/{}", self.level),
            3 => "LZO1X-999".into(),
            m => format!("method {m}"),
        }
    }
}

/// A header read so far: the length it needs to be read whole, or it.
enum Parsed {
    Needs(usize),
    Header(Header),
}

/// `b` (at least the magic and the version) begins with the lzop magic:
/// else what is there is no lzop member.
fn magic(b: &[u8], off: u64) -> Result<()> {
    if &b[..MAGIC.len()] != MAGIC {
        return Err(CodecError::TrailingGarbage {
            format: NAME,
            offset: off,
        });
    }
    Ok(())
}

/// The header at the start of `b` (at `off` in the stream), checked
/// against its sum, or how many bytes it needs to be read whole.
fn header(b: &[u8], off: u64) -> Result<Parsed> {
    let m = MAGIC.len();
    if b.len() < m + 2 {
        return Ok(Parsed::Needs(m + 2));
    }
    magic(b, off)?;
    let version = u16::from_be_bytes([b[m], b[m + 1]]);
    let new = version >= 0x0940;
    // version, lib version, [needed], method, [level], flags, [filter],
    // mode, mtime low, [mtime high], name length.
    let mut len = m + 4 + if new { 2 } else { 0 };
    let method_at = len;
    len += 1 + usize::from(new);
    if b.len() < len + 4 {
        return Ok(Parsed::Needs(len + 4));
    }
    let method = b[method_at];
    let level = if new { b[method_at + 1] } else { 0 };
    let flags = be32(b, len);
    len += 4;
    if !(1..=3).contains(&method) {
        return Err(CodecError::corrupt(
            NAME,
            off + method_at as u64,
            format!("unsupported method {method}"),
        ));
    }
    if flags & F_H_FILTER != 0 {
        len += 4;
    }
    let times_at = len;
    len += 8 + if new { 4 } else { 0 };
    if b.len() < len + 1 {
        return Ok(Parsed::Needs(len + 1));
    }
    let mode = be32(b, times_at);
    let high = if new { be32(b, times_at + 8) } else { 0 };
    let mtime = (u64::from(be32(b, times_at + 4)) | u64::from(high) << 32) as i64;
    let name_len = usize::from(b[len]);
    len += 1 + name_len;
    if b.len() < len + 4 {
        return Ok(Parsed::Needs(len + 4));
    }
    let name = b[len - name_len..len].to_vec();
    let stored = be32(b, len);
    let got = if flags & F_H_CRC32 != 0 {
        crc32fast::hash(&b[m..len])
    } else {
        adler(&b[m..len])
    };
    if stored != got {
        return Err(CodecError::corrupt(
            NAME,
            off + len as u64,
            "header checksum mismatch",
        ));
    }
    len += 4;
    if flags & F_H_EXTRA_FIELD != 0 {
        if b.len() < len + 4 {
            return Ok(Parsed::Needs(len + 4));
        }
        let extra = be32(b, len) as usize;
        if extra > (1 << 20) {
            return Err(CodecError::corrupt(
                NAME,
                off + len as u64,
                "extra field too large",
            ));
        }
        len += 4 + extra + 4;
        if b.len() < len {
            return Ok(Parsed::Needs(len));
        }
    }
    // F_MULTIPART marks the members of one `lzop -c a b` (each a file
    // of its own to lzop -d, one stream after another to lzop -dc): they
    // decode as any members do.
    Ok(Parsed::Header(Header {
        method,
        level,
        flags,
        mode,
        mtime,
        name,
        len,
    }))
}

/// The header of the first member of an lzop stream beginning with
/// `prefix` (its name and time, as `lzop -d` restores them); `None`
/// when `prefix` holds no whole, valid one.
pub fn first_header(prefix: &[u8]) -> Option<Header> {
    match header(prefix, 0) {
        Ok(Parsed::Header(h)) => Some(h),
        _ => None,
    }
}

/// How many bytes the header of the first member of an lzop stream
/// beginning with `prefix` takes, where `prefix` holds only part of it
/// (the magic and version at least): what to read before
/// [`first_header`] can tell; `None` where it is whole, or no header.
pub fn first_header_needs(prefix: &[u8]) -> Option<usize> {
    match header(prefix, 0) {
        Ok(Parsed::Needs(n)) if n > prefix.len() => Some(n),
        _ => None,
    }
}

/// One member of an lzop file, as `lzop -l` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its header.
    pub header: Header,
    /// The bytes of its blocks' data, as packed (sizes and sums not
    /// counted, as lzop counts them).
    pub packed: u64,
    /// The bytes they decode to.
    pub unpacked: u64,
    /// Where it starts in the file (its magic), and its length, through
    /// its end marker: a member alone is an lzop file.
    pub at: u64,
    /// (See `at`.)
    pub len: u64,
}

/// What [`members`] found in a file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Its members, in order.
    pub members: Vec<Member>,
    /// Where bytes that begin no member follow the last one, if any do
    /// (lzop lists the file and warns; zeros there are no garbage).
    pub garbage_at: Option<u64>,
}

impl Listing {
    /// Whether this is a file of parts, and from which member on
    /// `lzop -d` names its members by the names they keep: from the
    /// first where it is marked as a part (`lzop -c a b` marks them
    /// all), else from the second; `None` for a file of one member not
    /// so marked. (Before that member, and where one keeps no name,
    /// lzop names a member after the file.)
    pub fn parts_named_from(&self) -> Option<usize> {
        let first = self.members.first()?;
        if first.header.flags & F_MULTIPART != 0 {
            Some(0)
        } else {
            (self.members.len() > 1).then_some(1)
        }
    }
}

/// The members of the lzop file `r` reads (from its start), their
/// headers read whole and their blocks' sizes summed; `pass_over`
/// moves `r` on by a number of bytes without reading them where it can
/// (a file seeks). [`CodecError::UnknownFormat`] where it does not begin
/// as lzop; an error names what is wrong and where. Nothing is decoded
/// or checked but the headers, and memory stays within a header.
pub fn members<R: std::io::Read>(
    r: &mut R,
    pass_over: fn(&mut R, u64) -> std::io::Result<()>,
) -> Result<Listing> {
    let mut at = 0u64;
    let mut b = Vec::new();
    let fill = super::read_up_to::<R>;
    let mut members = Vec::new();
    loop {
        b.clear();
        fill(r, &mut b, MAGIC.len() + 2, at)?;
        if !members.is_empty() && !b.starts_with(MAGIC) {
            // Zeros to the end are no garbage.
            let mut zeros = b.iter().take_while(|&&z| z == 0).count() as u64;
            let mut more = [0u8; 64 << 10];
            while zeros == (b.len() as u64) {
                let n = match r.read(&mut more) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(source) => {
                        return Err(CodecError::Io {
                            offset: at + zeros,
                            source,
                        })
                    }
                };
                if n == 0 {
                    return Ok(Listing {
                        members,
                        garbage_at: None,
                    });
                }
                b.clear();
                b.extend_from_slice(&more[..n]);
                zeros = b.iter().take_while(|&&z| z == 0).count() as u64;
            }
            return Ok(Listing {
                members,
                garbage_at: Some(at),
            });
        }
        if !b.starts_with(MAGIC) {
            return Err(CodecError::UnknownFormat);
        }
        let start = at;
        let header = loop {
            let n = match header(&b, at)? {
                Parsed::Header(h) => break h,
                Parsed::Needs(n) => n,
            };
            fill(r, &mut b, n, at)?;
            if b.len() < n {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: at + b.len() as u64,
                });
            }
        };
        at += header.len as u64;
        let mut member = Member {
            header,
            packed: 0,
            unpacked: 0,
            at: start,
            len: 0,
        };
        loop {
            b.clear();
            fill(r, &mut b, 4, at)?;
            let dst_len = match b.len() {
                4 => be32(&b, 0),
                got => {
                    return Err(CodecError::Truncated {
                        format: NAME,
                        offset: at + got as u64,
                    })
                }
            };
            if dst_len == 0 {
                at += 4;
                break;
            }
            fill(r, &mut b, 8, at)?;
            if b.len() < 8 {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: at + b.len() as u64,
                });
            }
            let src_len = be32(&b, 4);
            if dst_len as usize > MAX_BLOCK || src_len > dst_len {
                return Err(CodecError::corrupt(
                    NAME,
                    at,
                    format!("block sizes {src_len} of {dst_len} bytes"),
                ));
            }
            let flags = member.header.flags;
            let rest = sums_len(flags, src_len == dst_len) as u64 + u64::from(src_len);
            pass_over(r, rest).map_err(|source| CodecError::Io {
                offset: at + 8,
                source,
            })?;
            at += 8 + rest;
            member.packed += u64::from(src_len);
            member.unpacked += u64::from(dst_len);
        }
        member.len = at - start;
        members.push(member);
    }
}

/// The sums a block carries after its two sizes, in lzop's order: of
/// the decoded data (Adler-32, then CRC-32), then of the packed data
/// (Adler-32, then CRC-32; none for a stored block); each `(its flag,
/// whether it sums the packed data)`.
fn sums(flags: u32, stored: bool) -> impl Iterator<Item = (u32, bool)> {
    [
        (F_ADLER32_D, false),
        (F_CRC32_D, false),
        (F_ADLER32_C, true),
        (F_CRC32_C, true),
    ]
    .into_iter()
    .filter(move |&(flag, packed)| flags & flag != 0 && !(packed && stored))
}

fn sums_len(flags: u32, stored: bool) -> usize {
    sums(flags, stored).count() * 4
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        self.deferred.take()?;
        loop {
            let flags = match self.flags {
                Some(f) => f,
                None => {
                    if self.files > 0 && self.rest_is_zeros()? {
                        return Ok(false);
                    }
                    if self.files > 0 && self.first_member {
                        self.input.fill(MAGIC.len())?;
                        if self.input.peek().starts_with(MAGIC) {
                            self.next_member = Some(self.input.offset());
                            return Ok(false);
                        }
                    }
                    let f = self.parse_header()?;
                    self.flags = Some(f);
                    f
                }
            };
            unit.offset = self.input.offset();
            unit.kind = UnitKind::Packed(flags);
            let mut raw = 0usize;
            while raw < UNIT_TARGET && unit.data.len() < MAX_UNIT - 2 * MAX_BLOCK.min(BLOCK * 4) {
                let whole = unit.data.len();
                match self.take_block(flags, &mut unit.data) {
                    Ok(Some(dst_len)) => raw += dst_len,
                    Ok(None) => {
                        self.flags = None;
                        break;
                    }
                    // The whole blocks before a cut or damage go out
                    // first, as lzop writes them; the error follows.
                    Err(e) if raw > 0 => {
                        unit.data.truncate(whole);
                        self.deferred.later(e);
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            unit.raw_len = raw;
            if unit.data.is_empty() {
                continue;
            }
            return Ok(true);
        }
    }

    fn offset(&self) -> u64 {
        self.input.offset()
    }

    fn members(&self) -> Option<super::Members> {
        Some(super::Members {
            begun: self.files,
            next_at: self.next_member,
            nameless_part: self.nameless_part,
        })
    }
}

/// Decodes runs of lzop blocks, checking their sums.
pub struct Decoder {
    codec: LzoCodec,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            codec: LzoCodec::new(1),
        }
    }
}

/// `data` against the sum `stored`, of the kind `flag` names.
fn check(flag: u32, data: &[u8], stored: u32, off: u64, what: &str) -> Result<()> {
    let got = if flag & (F_ADLER32_D | F_ADLER32_C) != 0 {
        adler(data)
    } else {
        crc32fast::hash(data)
    };
    if got != stored {
        return Err(CodecError::corrupt(
            NAME,
            off,
            format!("{what} checksum mismatch: stored {stored:08x}, computed {got:08x}"),
        ));
    }
    Ok(())
}

impl super::UnitDecoder for Decoder {
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()> {
        let UnitKind::Packed(flags) = unit.kind else {
            pass_plain(unit, out);
            return Ok(());
        };
        self.blocks(unit, flags, out, &mut 0)
    }

    /// The blocks before the first damaged one, as lzop writes them.
    fn salvage(&mut self, unit: &Unit, out: &mut Vec<u8>) {
        if let UnitKind::Packed(flags) = unit.kind {
            let mut whole = out.len();
            if self.blocks(unit, flags, out, &mut whole).is_err() {
                out.truncate(whole);
            }
        }
    }
}

impl Decoder {
    /// Decode the unit's blocks into `out`, checking their sums; `whole`
    /// is moved to the end of each block once it passed.
    fn blocks(
        &mut self,
        unit: &Unit,
        flags: u32,
        out: &mut Vec<u8>,
        whole: &mut usize,
    ) -> Result<()> {
        out.reserve(unit.raw_len);
        let data = &unit.data;
        let mut i = 0;
        while i < data.len() {
            let off = unit.offset + i as u64;
            let dst_len = be32(data, i) as usize;
            let src_len = be32(data, i + 4) as usize;
            let stored = src_len == dst_len;
            let p = i + 8 + sums_len(flags, stored);
            let body = &data[p..p + src_len];
            let stored_sums = || {
                sums(flags, stored)
                    .enumerate()
                    .map(move |(k, (flag, packed))| (flag, packed, be32(data, i + 8 + 4 * k)))
            };
            for (flag, _, sum) in stored_sums().filter(|s| s.1) {
                check(flag, body, sum, off, "compressed block")?;
            }
            let at = out.len();
            if stored {
                out.extend_from_slice(body);
            } else {
                self.codec
                    .decompress(body, out, dst_len)
                    .map_err(|e| in_stream(e, NAME, off))?;
            }
            for (flag, _, sum) in stored_sums().filter(|s| !s.1) {
                check(flag, &out[at..], sum, off, "block")?;
            }
            *whole = out.len();
            i = p + src_len;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

    use super::*;
    use crate::format::{decode_all, encode_all_with, EncodeOptions, Format, Framer as _};

    /// Text-like bytes that compress, `len` of them.
    fn text(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| b"lzop keeps what it packs "[(i * 7 + i / 300) % 25])
            .collect()
    }

    fn packed(level: i32, check: IntegrityCheck, data: &[u8]) -> Vec<u8> {
        let opts = EncodeOptions {
            check,
            ..EncodeOptions::default()
        };
        encode_all_with(Format::Lzop, level, 1 << 20, &opts, data).unwrap()
    }

    fn pass_over(r: &mut std::io::Cursor<&[u8]>, n: u64) -> std::io::Result<()> {
        std::io::Seek::seek(r, std::io::SeekFrom::Current(n as i64)).map(|_| ())
    }

    #[test]
    fn the_sum_asked_is_the_sum_written_as_lzop_writes_it() {
        let data = text(600 << 10);
        // (check, level, flags of the data's sum, version needed)
        let cases = [
            (IntegrityCheck::Default, 3, F_ADLER32_D, 0x0940),
            (IntegrityCheck::Crc32, 3, F_CRC32_D | F_H_CRC32, 0x1001),
            (IntegrityCheck::None, 3, 0, 0x0940),
            // lzop -F -9 keeps the sum.
            (IntegrityCheck::None, 9, F_ADLER32_D, 0x0940),
        ];
        for (check, level, sum_flags, needed) in cases {
            let file = packed(level, check, &data);
            let h = first_header(&file).unwrap();
            assert_eq!(h.flags, sum_flags | F_OS_UNIX, "{check} -{level}");
            assert_eq!(u16::from_be_bytes([file[13], file[14]]), needed);
            assert!(decode_all(&file).unwrap() == data, "{check} -{level}");
            // Three blocks, each with its sizes and 4 bytes of sum or none.
            let sums = if sum_flags == 0 { 0 } else { 4 };
            let m = members(&mut std::io::Cursor::new(&file[..]), pass_over)
                .unwrap()
                .members;
            assert_eq!(m.len(), 1);
            assert_eq!(m[0].unpacked, data.len() as u64);
            assert_eq!(
                m[0].packed,
                (file.len() - h.len - 4 - 3 * (8 + sums)) as u64,
                "{check} -{level}"
            );
            // A damaged sum is found.
            if sums > 0 {
                let mut bad = file.clone();
                bad[h.len + 8] ^= 1;
                assert!(decode_all(&bad).is_err(), "{check} -{level}");
            }
        }
    }

    /// A block may carry an Adler-32 and a CRC-32 of its data, and of
    /// its packed bytes too: lzop reads all four, in that order.
    #[test]
    fn every_sum_a_block_carries_is_read_and_checked() {
        let data = text(70_000);
        let mut codec = LzoCodec::new(3);
        let mut packed = Vec::new();
        codec.compress(&data, &mut packed).unwrap();
        assert!(packed.len() < data.len());
        let flags = F_ADLER32_D | F_CRC32_D | F_ADLER32_C | F_CRC32_C | F_OS_UNIX;
        // A header with those flags, from a real one's fields.
        let plain = packed_file_header(flags);
        let mut file = plain.clone();
        file.extend_from_slice(&(data.len() as u32).to_be_bytes());
        file.extend_from_slice(&(packed.len() as u32).to_be_bytes());
        for sum in [
            adler(&data),
            crc32fast::hash(&data),
            adler(&packed),
            crc32fast::hash(&packed),
        ] {
            file.extend_from_slice(&sum.to_be_bytes());
        }
        file.extend_from_slice(&packed);
        file.extend_from_slice(&[0; 4]);
        assert!(decode_all(&file).unwrap() == data);
        let listed = members(&mut std::io::Cursor::new(&file[..]), pass_over).unwrap();
        assert_eq!(listed.members[0].packed, packed.len() as u64);
        // Each of the four is checked.
        for k in 0..4 {
            let mut bad = file.clone();
            bad[plain.len() + 8 + 4 * k] ^= 1;
            assert!(decode_all(&bad).is_err(), "sum {k}");
        }
    }

    /// An lzop header with `flags`, its sum made anew.
    fn packed_file_header(flags: u32) -> Vec<u8> {
        let whole = packed(3, IntegrityCheck::Default, b"x");
        let h = first_header(&whole).unwrap();
        let mut head = whole[..h.len].to_vec();
        let at = MAGIC.len() + 8;
        head[at..at + 4].copy_from_slice(&flags.to_be_bytes());
        let sum = adler(&head[MAGIC.len()..h.len - 4]);
        let end = head.len();
        head[end - 4..].copy_from_slice(&sum.to_be_bytes());
        head
    }

    #[test]
    fn members_are_listed_from_headers_and_block_sizes() {
        let mut file = Vec::new();
        for (name, mtime, len, level) in [("a", 1_600_000_000, 300_000, 3), ("b.txt", 0, 5, 9)] {
            let mut framer = Framer::new(level, IntegrityCheck::Default);
            framer.origin(&crate::format::Origin {
                name: name.as_bytes().to_vec(),
                mtime,
            });
            let data = text(len);
            let whole = packed(level, IntegrityCheck::Default, &data);
            let mut head = Vec::new();
            framer.header(&mut head);
            let plain = first_header(&whole).unwrap().len;
            file.extend_from_slice(&head);
            file.extend_from_slice(&whole[plain..]);
        }
        let m = members(&mut std::io::Cursor::new(&file[..]), pass_over)
            .unwrap()
            .members;
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].header.name.as_slice(), m[0].header.mtime),
            (&b"a"[..], 1_600_000_000)
        );
        assert_eq!(
            (m[1].header.name.as_slice(), m[1].header.mtime),
            (&b"b.txt"[..], 0)
        );
        assert_eq!((m[0].unpacked, m[1].unpacked), (300_000, 5));
        assert_eq!(m[0].header.method_name(), "LZO1X-1");
        assert_eq!(m[1].header.method_name(), "LZO1X-999/9");
        assert!(m[0].packed < 300_000 && m[0].packed > 0);
        // Each member alone, from where it starts, is an lzop file.
        assert_eq!(
            (m[0].at, m[0].at + m[0].len, m[1].at + m[1].len),
            (0, m[1].at, file.len() as u64)
        );
        for (member, len) in m.iter().zip([300_000, 5]) {
            let alone = &file[member.at as usize..(member.at + member.len) as usize];
            assert_eq!(crate::decode_all(alone).unwrap(), text(len));
        }
        // Read from a pipe, passing over by reading, the same.
        let mut r = std::io::Cursor::new(&file[..]);
        let read_over = |r: &mut std::io::Cursor<&[u8]>, n: u64| {
            std::io::copy(&mut std::io::Read::take(r, n), &mut std::io::sink()).map(|_| ())
        };
        assert_eq!(members(&mut r, read_over).unwrap().members, m);
    }

    #[test]
    fn the_first_member_alone_ends_where_a_second_begins() {
        use crate::format::Splitter as _;
        let (a, b) = (text(700_000), text(3_000));
        let (pa, pb) = (
            packed(3, IntegrityCheck::Default, &a),
            packed(3, IntegrityCheck::Default, &b),
        );
        // What a splitter over `file` hands out, raw bytes, its members
        // begun and where it stopped before one; or its error.
        let split = |file: &[u8], first: bool| {
            let input = Input::new(Box::new(std::io::Cursor::new(file.to_vec())));
            let mut s = Splitter::new(input).first_member(first);
            let mut raw = 0;
            loop {
                let mut unit = Unit::default();
                match s.next_unit(&mut unit) {
                    Ok(true) => raw += unit.raw_len,
                    Ok(false) => {
                        let m = s.members().unwrap_or_default();
                        return Ok((raw, Some(m.begun), m.next_at));
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let two = [&pa[..], &pb].concat();
        let whole = (a.len() + b.len(), Some(2), None);
        assert_eq!(split(&two, false).unwrap(), whole);
        let first = (a.len(), Some(1), Some(pa.len() as u64));
        assert_eq!(split(&two, true).unwrap(), first);
        // Zeros after it are nothing; other bytes are garbage, as without.
        let zeros = [&pa[..], &[0; 300]].concat();
        assert_eq!(split(&zeros, true).unwrap(), (a.len(), Some(1), None));
        let junk = [&pa[..], b"junk\n"].concat();
        assert!(matches!(
            split(&junk, true),
            Err(CodecError::TrailingGarbage { .. })
        ));
        assert_eq!(split(&pa, true).unwrap(), (a.len(), Some(1), None));
        // A listing says it is a file of parts, and from which member on
        // lzop names them by the names they keep.
        let list = |b: &[u8]| members(&mut std::io::Cursor::new(b), pass_over).unwrap();
        assert_eq!(list(&two).parts_named_from(), Some(1));
        assert_eq!(list(&zeros).parts_named_from(), None);
        let mut marked = list(&pa);
        marked.members[0].header.flags |= F_MULTIPART;
        assert_eq!(marked.parts_named_from(), Some(0));
        assert_eq!(Listing::default().parts_named_from(), None);
    }

    #[test]
    fn what_is_no_whole_lzop_file_is_said_where() {
        let file = packed(3, IntegrityCheck::Default, &text(100_000));
        let list = |b: &[u8]| members(&mut std::io::Cursor::new(b), pass_over);
        assert!(matches!(list(b""), Err(CodecError::UnknownFormat)));
        assert!(matches!(
            list(b"not lzop at all"),
            Err(CodecError::UnknownFormat)
        ));
        assert!(matches!(
            list(&file[..20]),
            Err(CodecError::Truncated { .. })
        ));
        let h = first_header(&file).unwrap().len;
        assert!(matches!(
            list(&file[..h + 6]),
            Err(CodecError::Truncated { .. })
        ));
        // Cut inside a block's data: the end mark is not where it should be.
        assert!(list(&file[..file.len() - 40]).is_err());
        // Bytes after the last member are listed as garbage, zeros not.
        let mut garbage = file.clone();
        garbage.extend_from_slice(b"junk after it");
        let listed = list(&garbage).unwrap();
        assert_eq!(
            (listed.members.len(), listed.garbage_at),
            (1, Some(file.len() as u64))
        );
        for zeros in [1, 11, 70_000, 200_000] {
            let mut padded = file.clone();
            padded.resize(file.len() + zeros, 0);
            let listed = list(&padded).unwrap();
            assert_eq!(
                (listed.members.len(), listed.garbage_at),
                (1, None),
                "{zeros}"
            );
            assert!(decode_all(&padded).unwrap() == text(100_000), "{zeros}");
            padded.push(1);
            assert_eq!(list(&padded).unwrap().garbage_at, Some(file.len() as u64));
            assert!(decode_all(&padded).is_err(), "{zeros} and a 1");
            // A member after zeros is garbage too, as lzop takes it.
            let mut then = file.clone();
            then.resize(file.len() + zeros, 0);
            then.extend_from_slice(&file);
            assert!(
                matches!(decode_all(&then), Err(CodecError::TrailingGarbage { offset, .. })
                    if offset == file.len() as u64),
                "{zeros} and a member"
            );
            assert_eq!(list(&then).unwrap().members.len(), 1);
        }
        let mut bad = file.clone();
        bad[12] ^= 1;
        assert!(matches!(list(&bad), Err(CodecError::Corrupt { .. })));
        // A block claiming more than lzop allows.
        let mut huge = file.clone();
        huge[h..h + 4].copy_from_slice(&(MAX_BLOCK as u32 + 1).to_be_bytes());
        assert!(matches!(list(&huge), Err(CodecError::Corrupt { .. })));
    }
}
