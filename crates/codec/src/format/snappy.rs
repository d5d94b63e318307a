//! The Snappy framing format (`framing_format.txt` of the snappy project):
//! a stream identifier chunk, then chunks of at most 64 KiB of input, each
//! with a masked CRC-32C of its uncompressed bytes. Every chunk decodes on
//! its own, so cairn cuts a stream into runs of chunks and decodes the runs
//! in parallel.
//!
//! Layout 2 adds two reserved skippable chunks (type `0xca`), which every
//! reader skips: a start chunk after the stream identifier (`CAIRNS`, the
//! layout u16le) and an end chunk after the last data chunk (`CAIRNE`, the
//! decoded length u64le). The framing has no end of its own, so a writer
//! killed between chunks left a stream that read as whole; cairn refuses a
//! stream that began with a start chunk and lacks its end chunk.

use super::{
    at_offset, le32, pass_plain, BlockMeta, Mark, MarkNames, Marks, Unit, UnitKind, MAX_UNIT,
};
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
/// Type of layout 2's start and end chunks (reserved skippable).
const MARK: u8 = 0xca;
/// The start chunk's body: who wrote it, and the layout.
const START_BODY: [u8; 8] = *b"CAIRNS\x02\x00";
/// The end chunk's body begins so; the decoded length follows, u64le.
const END_TAG: &[u8; 6] = b"CAIRNE";
/// How a reader names snappy's start and end chunks.
const SNAPPY_MARKS: MarkNames = MarkNames {
    format: NAME,
    start: "start chunk",
    end: "end chunk",
    pieces: "chunks",
    end_alone_ok: false,
};

/// Append a chunk of type [`MARK`] holding `body`.
fn mark_chunk(body: &[u8], out: &mut Vec<u8>) {
    out.push(MARK);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes()[..3]);
    out.extend_from_slice(body);
}

/// What the body of a chunk of type [`MARK`] says, if it is cairn's.
fn mark_of(body: &[u8]) -> Option<Mark> {
    if body.len() == START_BODY.len() && body.starts_with(&START_BODY[..6]) {
        return Some(Mark::Start);
    }
    let total = body.strip_prefix(END_TAG)?;
    Some(Mark::End(u64::from_le_bytes(total.try_into().ok()?)))
}

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

/// Writes the stream identifier and layout 2's start and end chunks.
#[derive(Default)]
pub struct Framer {
    total: u64,
}

impl super::Framer for Framer {
    fn header(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(STREAM_ID);
        mark_chunk(&START_BODY, out);
    }
    fn block(&mut self, meta: &BlockMeta) {
        self.total += meta.raw_len;
    }
    fn trailer(&mut self, out: &mut Vec<u8>) -> Result<()> {
        mark_chunk(&[&END_TAG[..], &self.total.to_le_bytes()].concat(), out);
        Ok(())
    }
}

/// Cuts a framed stream into runs of chunks.
pub struct Splitter {
    input: Input,
    seen_ident: bool,
    /// Start and end chunks seen.
    marks: Marks,
    /// An error met after the whole chunks handed out last, for the next
    /// call.
    failed: Option<CodecError>,
}

impl Splitter {
    /// A splitter over `input`.
    pub fn new(input: Input) -> Self {
        Splitter {
            input,
            seen_ident: false,
            marks: Marks::new(SNAPPY_MARKS),
            failed: None,
        }
    }
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        unit.offset = self.input.offset();
        unit.kind = UnitKind::Packed(0);
        let mut raw = 0usize;
        match self.fill(unit, &mut raw) {
            Ok(()) => {}
            // The whole chunks before the failure are handed out first, as
            // gzip and zstd hand out every whole member or frame (a cut
            // stream's good part was held back, up to a unit of 4 MiB).
            Err(e) if !unit.data.is_empty() => self.failed = Some(e),
            Err(e) => return Err(e),
        }
        unit.raw_len = raw;
        Ok(!unit.data.is_empty())
    }

    fn offset(&self) -> u64 {
        self.input.offset()
    }
}

impl Splitter {
    /// Add whole chunks to `unit` up to about [`UNIT_TARGET`] decoded bytes
    /// (`raw`, counted in whole chunks) or the end of the input; on an
    /// error, `unit` holds the whole chunks before it.
    fn fill(&mut self, unit: &mut Unit, raw: &mut usize) -> Result<()> {
        while *raw < UNIT_TARGET && unit.data.len() < MAX_UNIT - CHUNK_RAW * 2 {
            if self.input.at_end()? {
                if !self.seen_ident {
                    return Err(CodecError::Truncated {
                        format: NAME,
                        offset: 0,
                    });
                }
                self.marks.ended(self.input.offset())?;
                break;
            }
            let off = self.input.offset();
            // A chunk starts with its type; a reserved unskippable one
            // is not the start of a cut chunk.
            let could_start = |b: &[u8]| !matches!(b.first(), Some(0x02..=0x7f));
            let b = match self.input.need_start(4, NAME, could_start) {
                Ok(b) => b,
                Err(e) => return Err(self.marks.cut(e)),
            };
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
                    let at = unit.data.len();
                    if let Err(e) = self.input.take(4 + len, &mut unit.data, NAME) {
                        unit.data.truncate(at);
                        return Err(e);
                    }
                    *raw += CHUNK_RAW;
                    // The decoded length (the decoder checks it against
                    // the data): a stored chunk's body, a compressed one's
                    // leading varint.
                    let body = &unit.data[at + 8..];
                    self.marks.decoded(match kind {
                        COMPRESSED => snap::raw::decompress_len(body).unwrap_or(0),
                        _ => body.len(),
                    } as u64);
                }
                0x02..=0x7f => {
                    return Err(CodecError::corrupt(
                        NAME,
                        off,
                        format!("reserved unskippable chunk type {kind:#04x}"),
                    ))
                }
                _ => {
                    // Padding (0xfe) and reserved skippable chunks, among
                    // them layout 2's start and end chunks.
                    let _ = PADDING;
                    let b = self.input.need(4 + len, NAME)?;
                    if kind == MARK {
                        if let Some(mark) = mark_of(&b[4..4 + len]) {
                            self.marks.see(off, mark)?;
                        }
                    }
                    self.input.consume(4 + len);
                }
            }
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

    use super::*;
    use crate::{decode_all, encode_all, Format};

    /// 300 000 bytes, cairn's snappy of them in blocks of 100 000, and
    /// where each of its chunks ends.
    fn sample() -> (Vec<u8>, Vec<u8>, Vec<usize>) {
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 10) as u8)
            .collect();
        let packed = encode_all(Format::Snappy, 0, 100_000, &data).unwrap();
        let ends = chunk_ends(&packed);
        (data, packed, ends)
    }

    /// Where each chunk of `stream` ends.
    fn chunk_ends(stream: &[u8]) -> Vec<usize> {
        let (mut at, mut ends) = (0, Vec::new());
        while at < stream.len() {
            at += 4 + (le32(stream, at) >> 8) as usize;
            ends.push(at);
        }
        ends
    }

    /// A cut stream's whole chunks are handed out before the error, as
    /// gzip's members and zstd's frames are: all of them when only the end
    /// chunk is missing (before, a unit's worth, up to 4 MiB, was held
    /// back).
    #[test]
    fn a_cut_stream_gives_its_whole_chunks_first() {
        let (data, packed, ends) = sample();
        // Blocks of 100 000 bytes are chunks of 65 536 and 34 464: after
        // the identifier and the start chunk, chunk ends 2-4 are the first
        // block and the second block's first chunk.
        for (cut, whole) in [(ends.len() - 2, data.len()), (4, 100_000 + CHUNK_RAW)] {
            let input = crate::input::Input::new(Box::new(std::io::Cursor::new(
                packed[..ends[cut]].to_vec(),
            )));
            let mut s = Splitter::new(input);
            let (mut dec, mut out, mut unit) = (Decoder::default(), Vec::new(), Unit::default());
            let e = loop {
                unit.clear();
                match super::super::Splitter::next_unit(&mut s, &mut unit) {
                    Ok(true) => {
                        super::super::UnitDecoder::decode(&mut dec, &mut unit, &mut out).unwrap()
                    }
                    Ok(false) => panic!("a cut stream ended cleanly"),
                    Err(e) => break e.to_string(),
                }
            };
            assert!(e.contains("without its end chunk"), "{e}");
            assert_eq!(out.len(), whole, "cut at chunk {cut}");
            assert!(data.starts_with(&out));
        }
    }

    /// Layout 2's start and end chunks pair up: a stream cut after any
    /// chunk before its end chunk is refused; two streams concatenated,
    /// and streams without the chunks (layout 1, other writers) before or
    /// after, read as ever; an end chunk that states another length, or
    /// none before it, is refused.
    #[test]
    fn start_and_end_chunks_pair_up() {
        let (data, packed, ends) = sample();
        assert_eq!(
            packed[ends[0]], MARK,
            "the start chunk after the identifier"
        );
        assert_eq!(packed[ends[ends.len() - 2]], MARK, "the end chunk last");
        assert!(decode_all(&packed).unwrap() == data);
        for &end in &ends[1..ends.len() - 1] {
            let e = decode_all(&packed[..end]).unwrap_err().to_string();
            assert!(e.contains("without its end chunk"), "cut at {end}: {e}");
        }
        let twice = [&data[..], &data[..]].concat();
        assert!(decode_all(&[&packed[..], &packed[..]].concat()).unwrap() == twice);
        let (start, end) = (ends[0]..ends[1], ends[ends.len() - 2]);
        let layout1 = [&packed[..start.start], &packed[start.end..end]].concat();
        assert!(decode_all(&layout1).unwrap() == data);
        assert!(decode_all(&[&layout1[..], &packed[..]].concat()).unwrap() == twice);
        assert!(decode_all(&[&packed[..], &layout1[..]].concat()).unwrap() == twice);
        let mut lying = packed.clone();
        lying[end + 4 + END_TAG.len()] ^= 1;
        let e = decode_all(&lying).unwrap_err().to_string();
        assert!(e.contains("the end chunk says"), "{e}");
        // Bytes that are no chunk after a cut: the stream's end is missing.
        let e = decode_all(&[&packed[..ends[3]], b"XY"].concat())
            .unwrap_err()
            .to_string();
        assert!(e.contains("without its end chunk"), "{e}");
        let no_start = [&packed[..start.start], &packed[start.end..]].concat();
        let e = decode_all(&no_start).unwrap_err().to_string();
        assert!(e.contains("has no start chunk"), "{e}");
    }
}
