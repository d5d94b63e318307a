//! The Snappy framing format (`framing_format.txt` of the snappy project):
//! a stream identifier chunk, then chunks of at most 64 KiB of input, each
//! with a masked CRC-32C of its uncompressed bytes. Every chunk decodes on
//! its own, so cairn cuts a stream into runs of chunks and decodes the runs
//! in parallel.

use super::{at_offset, le32, pass_plain, BlockMeta, Unit, UnitKind, MAX_UNIT};
use crate::block::{BlockCodec, SnappyCodec};
use crate::error::{CodecError, Result};
use crate::input::Input;

const NAME: &str = "snappy";
/// The stream identifier chunk every stream starts with.
pub const STREAM_ID: &[u8] = b"\xff\x06\x00\x00sNaPpY";
const CHUNK_RAW: usize = 1 << 16;
const COMPRESSED: u8 = 0x00;
const UNCOMPRESSED: u8 = 0x01;
const PADDING: u8 = 0xfe;
const IDENT: u8 = 0xff;
/// Group chunks into units of about this many decoded bytes.
const UNIT_TARGET: usize = 4 << 20;

/// The CRC-32C of `data`, masked as the framing format requires.
pub fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Compresses input into framing-format chunks.
#[derive(Default)]
pub struct Encoder {
    codec: SnappyCodec,
}

impl super::BlockEncoder for Encoder {
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        let start = out.len();
        for piece in src.chunks(CHUNK_RAW) {
            let at = out.len();
            out.extend_from_slice(&[0; 8]);
            self.codec.compress(piece, out)?;
            let clen = out.len() - at - 8;
            // Store chunks that do not shrink by 1/8: decoding a stored
            // chunk is a copy, and the reference encoder does the same.
            let (kind, body) = if clen >= piece.len() - piece.len() / 8 {
                out.truncate(at + 8);
                out.extend_from_slice(piece);
                (UNCOMPRESSED, piece.len())
            } else {
                (COMPRESSED, clen)
            };
            let len = (body + 4) as u32;
            out[at] = kind;
            out[at + 1..at + 4].copy_from_slice(&len.to_le_bytes()[..3]);
            out[at + 4..at + 8].copy_from_slice(&masked_crc(piece).to_le_bytes());
        }
        Ok(BlockMeta {
            raw_len: src.len() as u64,
            packed_len: (out.len() - start) as u64,
            check: 0,
        })
    }
}

/// Writes the stream identifier.
pub struct Framer;

impl super::Framer for Framer {
    fn header(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(STREAM_ID);
    }
    fn block(&mut self, _meta: &BlockMeta) {}
    fn trailer(&mut self, _out: &mut Vec<u8>) -> Result<()> {
        Ok(())
    }
}

/// Cuts a framed stream into runs of chunks.
pub struct Splitter {
    input: Input,
    seen_ident: bool,
}

impl Splitter {
    /// A splitter over `input`.
    pub fn new(input: Input) -> Self {
        Splitter {
            input,
            seen_ident: false,
        }
    }
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        unit.offset = self.input.offset();
        unit.kind = UnitKind::Packed(0);
        let mut raw = 0usize;
        while raw < UNIT_TARGET && unit.data.len() < MAX_UNIT - CHUNK_RAW * 2 {
            if self.input.at_end()? {
                if !self.seen_ident {
                    return Err(CodecError::Truncated {
                        format: NAME,
                        offset: 0,
                    });
                }
                break;
            }
            let off = self.input.offset();
            // A chunk starts with its type; a reserved unskippable one
            // is not the start of a cut chunk.
            let could_start = |b: &[u8]| !matches!(b.first(), Some(0x02..=0x7f));
            let b = self.input.need_start(4, NAME, could_start)?;
            let kind = b[0];
            let len = (le32(b, 0) >> 8) as usize;
            if !self.seen_ident && kind != IDENT {
                return Err(CodecError::corrupt(NAME, off, "missing stream identifier"));
            }
            match kind {
                IDENT => {
                    let b = self.input.need(4 + len, NAME)?;
                    if &b[..4 + len] != STREAM_ID {
                        return Err(CodecError::corrupt(NAME, off, "bad stream identifier"));
                    }
                    self.seen_ident = true;
                    self.input.consume(4 + len);
                }
                COMPRESSED | UNCOMPRESSED => {
                    if len < 4 || len > snap::raw::max_compress_len(CHUNK_RAW) + 4 {
                        return Err(CodecError::corrupt(
                            NAME,
                            off,
                            format!("chunk length {len} out of range"),
                        ));
                    }
                    if kind == UNCOMPRESSED && len > CHUNK_RAW + 4 {
                        return Err(CodecError::corrupt(
                            NAME,
                            off,
                            format!("stored chunk of {} bytes exceeds 65536", len - 4),
                        ));
                    }
                    self.input.take(4 + len, &mut unit.data, NAME)?;
                    raw += CHUNK_RAW;
                }
                0x02..=0x7f => {
                    return Err(CodecError::corrupt(
                        NAME,
                        off,
                        format!("reserved unskippable chunk type {kind:#04x}"),
                    ))
                }
                _ => {
                    // Padding (0xfe) and reserved skippable chunks.
                    let _ = PADDING;
                    let mut skip = Vec::new();
                    self.input.take(4 + len, &mut skip, NAME)?;
                }
            }
        }
        unit.raw_len = raw;
        Ok(!unit.data.is_empty())
    }

    fn offset(&self) -> u64 {
        self.input.offset()
    }
}

/// Decodes runs of chunks, checking each chunk's CRC.
#[derive(Default)]
pub struct Decoder {
    codec: SnappyCodec,
}

impl super::UnitDecoder for Decoder {
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()> {
        if unit.kind == UnitKind::Plain {
            pass_plain(unit, out);
            return Ok(());
        }
        out.reserve(unit.raw_len);
        let data = &unit.data;
        let mut i = 0;
        while i < data.len() {
            let kind = data[i];
            let len = (le32(data, i) >> 8) as usize;
            let want = le32(data, i + 4);
            let body = &data[i + 8..i + 4 + len];
            let off = unit.offset + i as u64;
            let at = out.len();
            if kind == COMPRESSED {
                let raw = snap::raw::decompress_len(body)
                    .map_err(|e| CodecError::corrupt(NAME, off, e.to_string()))?;
                if raw > CHUNK_RAW {
                    return Err(CodecError::corrupt(
                        NAME,
                        off,
                        format!("chunk decodes to {raw} bytes, more than 65536"),
                    ));
                }
                self.codec
                    .decompress(body, out, raw)
                    .map_err(|e| at_offset(e, off))?;
            } else {
                out.extend_from_slice(body);
            }
            let got = masked_crc(&out[at..]);
            if got != want {
                return Err(CodecError::corrupt(
                    NAME,
                    off,
                    format!("chunk CRC mismatch: stored {want:08x}, computed {got:08x}"),
                ));
            }
            i += 4 + len;
        }
        Ok(())
    }
}
