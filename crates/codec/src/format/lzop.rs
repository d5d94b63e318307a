//! lzop files: the lzop header, then blocks of at most 256 KiB (lzop's own
//! block size, which every lzop reads) each with its sizes and an Adler-32
//! of its uncompressed bytes, then a zero end mark. Blocks
//! are independent, so cairn groups them into units and decodes in
//! parallel. lzop stores a block uncompressed when LZO does not shrink it.
//!
//! Header written: magic, version 0x1040, library 0x20a0, needed 0x0940,
//! method (1 = LZO1X-1 at levels 1-6, 3 = LZO1X-999 at 7-9), level, flags
//! (Adler-32 of the data, Unix; lzop's defaults), mode 0644, the input's
//! modification time and name as lzop keeps them (none from standard
//! input or with `-n`), Adler-32 of the header.

use super::{be32, in_stream, pass_plain, BlockMeta, Unit, UnitKind, MAX_UNIT};
use crate::block::{BlockCodec, LzoCodec};
use crate::error::{CodecError, Result};
use crate::input::{begins_like, Input};

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
const F_MULTIPART: u32 = 0x0400;
const F_H_FILTER: u32 = 0x0800;
const F_H_CRC32: u32 = 0x1000;
const F_OS_UNIX: u32 = 0x0300_0000;
/// Group blocks into units of about this many decoded bytes.
const UNIT_TARGET: usize = 4 << 20;

fn adler(data: &[u8]) -> u32 {
    simd_adler32::adler32(&data)
}

/// Compresses input into lzop blocks.
pub struct Encoder {
    codec: LzoCodec,
}

impl Encoder {
    /// An encoder at lzop `level` (1-6 = LZO1X-1, 7-9 = LZO1X-999).
    pub fn new(level: i32) -> Self {
        Encoder {
            codec: LzoCodec::new(level),
        }
    }
}

impl super::BlockEncoder for Encoder {
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        let start = out.len();
        for piece in src.chunks(BLOCK) {
            // Block: uncompressed length, compressed length, Adler-32 of the
            // uncompressed bytes (lzop's default: no sum of the compressed
            // bytes), data; stored as is when LZO does not shrink it.
            let at = out.len();
            out.extend_from_slice(&(piece.len() as u32).to_be_bytes());
            out.extend_from_slice(&[0; 8]);
            self.codec.compress(piece, out)?;
            let clen = (out.len() - at - 12).min(piece.len());
            if clen == piece.len() {
                out.truncate(at + 12);
                out.extend_from_slice(piece);
            }
            out[at + 4..at + 8].copy_from_slice(&(clen as u32).to_be_bytes());
            out[at + 8..at + 12].copy_from_slice(&adler(piece).to_be_bytes());
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
    /// The input's name (at most 255 bytes, as lzop's field) and time.
    origin: super::Origin,
}

impl Framer {
    /// A framer recording `level` in the header.
    pub fn new(level: i32) -> Self {
        Framer {
            level,
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
        out.extend_from_slice(&0x0940u16.to_be_bytes());
        out.push(method);
        out.push(self.level.clamp(1, 9) as u8);
        out.extend_from_slice(&(F_ADLER32_D | F_OS_UNIX).to_be_bytes());
        out.extend_from_slice(&0o100644u32.to_be_bytes());
        // The time's low 32 bits, then its high ones (none here).
        out.extend_from_slice(&self.origin.mtime.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        let name = &self.origin.name[..self.origin.name.len().min(255)];
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        let sum = adler(&out[h..]);
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
            deferred: super::Deferred::default(),
        }
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

    fn parse_header(&mut self) -> Result<u32> {
        let off = self.input.offset();
        let b = self
            .input
            .need_start(MAGIC.len() + 2, NAME, |b| begins_like(b, MAGIC))?;
        if &b[..MAGIC.len()] != MAGIC {
            return Err(CodecError::TrailingGarbage {
                format: NAME,
                offset: off,
            });
        }
        let m = MAGIC.len();
        let version = u16::from_be_bytes([b[m], b[m + 1]]);
        // version, lib version, [needed], method, [level], flags, [filter],
        // mode, mtime low, [mtime high], name length.
        let mut len = m + 4;
        if version >= 0x0940 {
            len += 2;
        }
        len += 1; // method
        if version >= 0x0940 {
            len += 1; // level
        }
        let b = self.input.need(len + 4, NAME)?;
        let method = b[len - if version >= 0x0940 { 2 } else { 1 }];
        let flags = be32(b, len);
        len += 4;
        if !(1..=3).contains(&method) {
            return Err(CodecError::corrupt(
                NAME,
                off + len as u64 - 5,
                format!("unsupported method {method}"),
            ));
        }
        if flags & F_H_FILTER != 0 {
            len += 4;
        }
        len += 8; // mode, mtime low
        if version >= 0x0940 {
            len += 4;
        }
        let b = self.input.need(len + 1, NAME)?;
        let name_len = usize::from(b[len]);
        len += 1 + name_len;
        let b = self.input.need(len + 4, NAME)?;
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
            let b = self.input.need(len + 4, NAME)?;
            let extra = be32(b, len) as usize;
            if extra > (1 << 20) {
                return Err(CodecError::corrupt(
                    NAME,
                    off + len as u64,
                    "extra field too large",
                ));
            }
            len += 4 + extra + 4;
            self.input.need(len, NAME)?;
        }
        if flags & F_MULTIPART != 0 {
            return Err(CodecError::corrupt(
                NAME,
                off,
                "multipart lzop files are not supported",
            ));
        }
        self.input.consume(len);
        self.files += 1;
        Ok(flags)
    }
}

fn sums_len(flags: u32, stored: bool) -> usize {
    let d = usize::from(flags & (F_ADLER32_D | F_CRC32_D) != 0) * 4;
    let c = if stored {
        0
    } else {
        usize::from(flags & (F_ADLER32_C | F_CRC32_C) != 0) * 4
    };
    d + c
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        self.deferred.take()?;
        loop {
            let flags = match self.flags {
                Some(f) => f,
                None => {
                    if self.files > 0 && self.input.at_end()? {
                        return Ok(false);
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

fn check(
    flags: u32,
    adler_flag: u32,
    data: &[u8],
    stored: u32,
    off: u64,
    what: &str,
) -> Result<()> {
    let got = if flags & adler_flag != 0 {
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
            let mut p = i + 8;
            let d_sum = if flags & (F_ADLER32_D | F_CRC32_D) != 0 {
                p += 4;
                Some(be32(data, p - 4))
            } else {
                None
            };
            let c_sum = if !stored && flags & (F_ADLER32_C | F_CRC32_C) != 0 {
                p += 4;
                Some(be32(data, p - 4))
            } else {
                None
            };
            let body = &data[p..p + src_len];
            if let Some(s) = c_sum {
                check(flags, F_ADLER32_C, body, s, off, "compressed block")?;
            }
            let at = out.len();
            if stored {
                out.extend_from_slice(body);
            } else {
                self.codec
                    .decompress(body, out, dst_len)
                    .map_err(|e| in_stream(e, NAME, off))?;
            }
            if let Some(s) = d_sum {
                check(flags, F_ADLER32_D, &out[at..], s, off, "block")?;
            }
            *whole = out.len();
            i = p + src_len;
        }
        Ok(())
    }
}
