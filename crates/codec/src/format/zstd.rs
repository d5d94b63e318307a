//! zstd as independent frames followed by a seek table in a skippable
//! frame: the public "zstd seekable format". `zstd -d` decodes the frames
//! and skips the table; cairn walks the frames' block headers (no decoding
//! needed) to cut the stream, so it splits any multi-frame zstd, from a
//! pipe too. Frames without a content size, or bigger than [`MAX_UNIT`],
//! are decoded as a stream in the splitter.
//!
//! Seek table: skippable frame `5E 2A 4D 18 | size u32le | per frame:
//! compressed u32le, decompressed u32le, xxh64-low32 u32le | frame count
//! u32le | descriptor 0x80 | B1 EA 92 8F`.

use super::{at_offset, le32, pass_plain, BlockMeta, Unit, UnitKind, MAX_UNIT, PLAIN_UNIT};
use crate::block::ZstdCodec;
use crate::error::{CodecError, Result};
use crate::input::Input;
use zstd::stream::raw::{Decoder as RawDecoder, InBuffer, Operation, OutBuffer};

const NAME: &str = "zstd";
/// Magic of a zstd frame.
pub const FRAME_MAGIC: u32 = 0xFD2F_B528;
const SEEK_TABLE_MAGIC: u32 = 0x184D_2A5E;
const SEEKABLE_FOOTER_MAGIC: u32 = 0x8F92_EAB1;

/// Is `head` (at least 4 bytes) the magic of a skippable frame?
pub fn is_skippable_magic(head: &[u8]) -> bool {
    le32(head, 0) & 0xFFFF_FFF0 == 0x184D_2A50
}

/// Compresses blocks into frames with content size and checksum.
pub struct Encoder {
    codec: ZstdCodec,
}

impl Encoder {
    /// An encoder at zstd `level`.
    pub fn new(level: i32) -> Self {
        Encoder {
            codec: ZstdCodec::new(level),
        }
    }
}

impl super::BlockEncoder for Encoder {
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        let start = out.len();
        self.codec.compress_frame(src, out)?;
        let len = out.len() - start;
        // The frame ends with the low 32 bits of XXH64 of the content,
        // which is what the seek table stores: no second hash pass.
        let check = if len >= 4 {
            le32(out, out.len() - 4)
        } else {
            0
        };
        Ok(BlockMeta {
            raw_len: src.len() as u64,
            packed_len: len as u64,
            check: u64::from(check),
        })
    }
}

/// Collects frame sizes and writes the seek table.
#[derive(Default)]
pub struct SeekTable {
    entries: Vec<(u32, u32, u32)>,
}

impl super::Framer for SeekTable {
    fn header(&mut self, _out: &mut Vec<u8>) {}
    fn block(&mut self, meta: &BlockMeta) {
        self.entries.push((
            meta.packed_len as u32,
            meta.raw_len as u32,
            meta.check as u32,
        ));
    }
    fn trailer(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let n = self.entries.len();
        let body = n * 12 + 9;
        let size = u32::try_from(body).map_err(|_| {
            CodecError::Invalid(format!("zstd: {n} frames overflow the seek table"))
        })?;
        out.extend_from_slice(&SEEK_TABLE_MAGIC.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        for (c, d, x) in &self.entries {
            out.extend_from_slice(&c.to_le_bytes());
            out.extend_from_slice(&d.to_le_bytes());
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.push(0x80);
        out.extend_from_slice(&SEEKABLE_FOOTER_MAGIC.to_le_bytes());
        Ok(())
    }
}

/// What a frame header says.
struct FrameHeader {
    header_len: usize,
    content_size: Option<u64>,
    checksum: bool,
}

fn parse_frame_header(input: &mut Input) -> Result<FrameHeader> {
    let off = input.offset();
    let b = input.need(5, NAME)?;
    let fhd = b[4];
    if fhd & 0x08 != 0 {
        return Err(CodecError::corrupt(
            NAME,
            off + 4,
            "reserved bit set in frame header",
        ));
    }
    let fcs_flag = fhd >> 6;
    let single = fhd & 0x20 != 0;
    let checksum = fhd & 0x04 != 0;
    let did_len = [0usize, 1, 2, 4][usize::from(fhd & 3)];
    let fcs_len = match (fcs_flag, single) {
        (0, false) => 0,
        (0, true) => 1,
        (1, _) => 2,
        (2, _) => 4,
        _ => 8,
    };
    let header_len = 5 + usize::from(!single) + did_len + fcs_len;
    let b = input.need(header_len, NAME)?;
    let p = header_len - fcs_len;
    let content_size = match fcs_len {
        0 => None,
        1 => Some(u64::from(b[p])),
        2 => Some(u64::from(u16::from_le_bytes([b[p], b[p + 1]])) + 256),
        4 => Some(u64::from(le32(b, p))),
        _ => {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[p..p + 8]);
            Some(u64::from_le_bytes(w))
        }
    };
    Ok(FrameHeader {
        header_len,
        content_size,
        checksum,
    })
}

/// Cuts a zstd stream at frame boundaries.
pub struct Splitter {
    input: Input,
    streaming: Option<Box<RawDecoder<'static>>>,
    frames: u64,
}

impl Splitter {
    /// A splitter over `input`.
    pub fn new(input: Input) -> Self {
        Splitter {
            input,
            streaming: None,
            frames: 0,
        }
    }

    /// Copy one frame whose header is at the input's start into `unit`.
    fn take_frame(&mut self, fh: &FrameHeader, unit: &mut Unit) -> Result<()> {
        self.input.take(fh.header_len, &mut unit.data, NAME)?;
        loop {
            let off = self.input.offset();
            let b = self.input.need(3, NAME)?;
            let bh = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
            let last = bh & 1 != 0;
            let size = (bh >> 3) as usize;
            let body = match (bh >> 1) & 3 {
                0 | 2 => size,
                1 => 1,
                _ => return Err(CodecError::corrupt(NAME, off, "reserved block type")),
            };
            if body > (128 << 10) {
                return Err(CodecError::corrupt(
                    NAME,
                    off,
                    format!("block of {body} bytes exceeds the 128 KiB maximum"),
                ));
            }
            if unit.data.len() + 3 + body > MAX_UNIT {
                return Err(CodecError::TooLarge {
                    format: NAME,
                    what: "frame",
                    offset: unit.offset,
                    size: (unit.data.len() + 3 + body) as u64,
                    limit: MAX_UNIT as u64,
                });
            }
            self.input.take(3 + body, &mut unit.data, NAME)?;
            if last {
                break;
            }
        }
        if fh.checksum {
            self.input.take(4, &mut unit.data, NAME)?;
        }
        Ok(())
    }

    fn stream_some(&mut self, unit: &mut Unit) -> Result<()> {
        let Some(dec) = self.streaming.as_mut() else {
            return Ok(());
        };
        unit.kind = UnitKind::Plain;
        unit.offset = self.input.offset();
        unit.data.resize(PLAIN_UNIT, 0);
        let mut produced = 0;
        loop {
            if self.input.fill(1)? == 0 {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: self.input.offset(),
                });
            }
            let mut inb = InBuffer::around(self.input.peek());
            let mut outb = OutBuffer::around_pos(&mut unit.data[..], produced);
            let hint = dec
                .run(&mut inb, &mut outb)
                .map_err(|e| CodecError::corrupt(NAME, self.input.offset(), e.to_string()))?;
            produced = outb.pos();
            let used = inb.pos();
            self.input.consume(used);
            if hint == 0 {
                // End of frame.
                self.streaming = None;
                break;
            }
            if produced == PLAIN_UNIT {
                break;
            }
        }
        unit.data.truncate(produced);
        Ok(())
    }
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        loop {
            if self.streaming.is_some() {
                self.stream_some(unit)?;
                if unit.data.is_empty() && self.streaming.is_none() {
                    continue;
                }
                return Ok(true);
            }
            if self.input.at_end()? {
                if self.frames == 0 {
                    return Err(CodecError::Truncated {
                        format: NAME,
                        offset: 0,
                    });
                }
                return Ok(false);
            }
            let off = self.input.offset();
            let avail = self.input.fill(4)?;
            if avail < 4 {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: off + avail as u64,
                });
            }
            let magic = le32(self.input.peek(), 0);
            if is_skippable_magic(self.input.peek()) {
                let b = self.input.need(8, NAME)?;
                let size = le32(b, 4);
                self.input.consume(8);
                self.input.skip(u64::from(size), NAME)?;
                self.frames += 1;
                continue;
            }
            if magic != FRAME_MAGIC {
                return Err(CodecError::TrailingGarbage {
                    format: NAME,
                    offset: off,
                });
            }
            self.frames += 1;
            let fh = parse_frame_header(&mut self.input)?;
            match fh.content_size {
                Some(size) if size <= MAX_UNIT as u64 => {
                    unit.offset = off;
                    unit.raw_len = size as usize;
                    unit.kind = UnitKind::Packed(0);
                    self.take_frame(&fh, unit)?;
                    return Ok(true);
                }
                _ => {
                    let mut dec = RawDecoder::new().map_err(|e| {
                        CodecError::corrupt(NAME, off, format!("decoder setup: {e}"))
                    })?;
                    dec.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(31))
                        .map_err(|e| CodecError::corrupt(NAME, off, e.to_string()))?;
                    self.streaming = Some(Box::new(dec));
                }
            }
        }
    }

    fn offset(&self) -> u64 {
        self.input.offset()
    }
}

/// Decodes whole frames on a worker.
pub struct Decoder {
    codec: ZstdCodec,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            codec: ZstdCodec::new(3),
        }
    }
}

impl super::UnitDecoder for Decoder {
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()> {
        match unit.kind {
            UnitKind::Plain => {
                pass_plain(unit, out);
                Ok(())
            }
            UnitKind::Packed(_) => self
                .codec
                .decompress_frame(&unit.data, out, unit.raw_len)
                .map_err(|e| at_offset(e, unit.offset)),
        }
    }
}
