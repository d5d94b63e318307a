//! The LZ4 frame format with independent 4 MiB blocks and per-block XXH32
//! checksums. One frame holds the whole stream: the framer writes the frame
//! header and the end mark, each worker writes whole blocks. With no
//! dependency between blocks, cairn decodes any independent-block frame in
//! parallel, cut at block boundaries; linked-block frames (`lz4 -BD`) are
//! decoded in the splitter with the previous 64 KiB as dictionary.
//!
//! The content checksum (XXH32 of everything) cannot be computed in
//! parallel, so cairn leaves it out of what it writes and relies on the
//! block checksums; it verifies the content checksum of frames that have
//! one on the writing side, in order.
//!
//! Legacy frames (`lz4 -l`, what Linux kernels and initramfs images
//! use) are read and written too: magic `0x184C2102`, then blocks of a
//! 4-byte compressed size and an LZ4 block of at most 8 MiB decoded, all
//! independent, with no checksum and no end mark: a legacy frame ends at
//! the end of the input or where the next 4 bytes are a frame magic.
//! Written ([`Encoder::with`], [`LegacyFramer`]), every block but the
//! last holds 8 MiB, as `lz4 -l` cuts them, and a block is always
//! compressed (the format has no stored blocks), so it may be a little
//! bigger than its input.

use super::{le32, pass_plain, BlockMeta, ContentCheck, Unit, UnitKind, MAX_UNIT, PLAIN_UNIT};
use crate::block::{BlockCodec, Lz4Codec};
use crate::error::{CodecError, Result};
use crate::input::{begins_like, Input};
use crate::lz4_ffi::{self, xxh32};

const NAME: &str = "lz4";
/// Magic of an LZ4 frame.
pub const MAGIC: u32 = 0x184D_2204;
/// Largest block the frame format allows (the "4 MB" block size id 7).
pub const MAX_BLOCK: usize = 4 << 20;
/// Magic of a legacy frame (`lz4 -l`).
pub const LEGACY_MAGIC: u32 = 0x184C_2102;
/// Decoded size of a legacy frame's blocks (the last may be shorter):
/// lz4's LEGACY_BLOCKSIZE.
pub const LEGACY_BLOCK: usize = 8 << 20;
const FLG_INDEP: u8 = 0x20;
const FLG_BLOCK_CHECKSUM: u8 = 0x10;
const FLG_CONTENT_SIZE: u8 = 0x08;
const FLG_CONTENT_CHECKSUM: u8 = 0x04;
const FLG_DICT_ID: u8 = 0x01;
const UNCOMPRESSED_BIT: u32 = 0x8000_0000;

/// Compresses input into whole LZ4 blocks of at most 4 MiB (of a frame)
/// or 8 MiB (of a legacy frame).
pub struct Encoder {
    codec: Lz4Codec,
    /// Blocks of a legacy frame (`lz4 -l`).
    legacy: bool,
}

impl Encoder {
    /// A new encoder at `level`: 1-2 the fast coder, 3-12 LZ4 HC, as the
    /// `lz4` tool has them (its default is 1, `--best` 12); -N is its
    /// `--fast=N`, the fast coder with acceleration N + 1.
    pub fn new(level: i32) -> Self {
        Encoder::with(level, false, false)
    }

    /// As [`Encoder::new`], writing a legacy frame's blocks if `legacy`
    /// (`lz4 -l`), and with LZ4 HC favoring decompression speed if
    /// `favor_dec_speed` (`lz4 --favor-decSpeed`, which changes levels 10
    /// to 12). Both as the `lz4` tool (1.10) does them: a legacy frame's
    /// blocks are `LZ4_compress_fast` with acceleration N for `--fast=N`
    /// (lz4 1.9 takes 1 whatever N), `LZ4_compress_HC` from level 3, and
    /// never favor decompression speed (lz4 sets that on frames only).
    pub fn with(level: i32, legacy: bool, favor_dec_speed: bool) -> Self {
        let codec = if legacy {
            // Level -N is acceleration N + 1 in the compressor; lz4 -l
            // accelerates --fast=N by N.
            Lz4Codec::with_level(if level < 0 { level + 1 } else { level })
        } else if favor_dec_speed {
            Lz4Codec::favoring_decompression_speed(level)
        } else {
            Lz4Codec::with_level(level)
        };
        Encoder { codec, legacy }
    }

    /// A legacy frame's blocks: each 8 MiB piece of `src` as its
    /// compressed size and the LZ4 block, compressed even where that is
    /// bigger (a legacy frame has no stored blocks).
    fn encode_legacy(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        let start = out.len();
        for piece in src.chunks(LEGACY_BLOCK) {
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            self.codec.compress(piece, out)?;
            let clen = u32::try_from(out.len() - at - 4).map_err(|_| CodecError::Compress {
                codec: NAME,
                reason: "a legacy block over 4 GiB".into(),
            })?;
            out[at..at + 4].copy_from_slice(&clen.to_le_bytes());
        }
        Ok(BlockMeta {
            raw_len: src.len() as u64,
            packed_len: (out.len() - start) as u64,
            check: 0,
        })
    }
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder::new(1)
    }
}

impl super::BlockEncoder for Encoder {
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        if self.legacy {
            return self.encode_legacy(src, out);
        }
        let start = out.len();
        for piece in src.chunks(MAX_BLOCK) {
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            self.codec.compress(piece, out)?;
            let mut clen = out.len() - at - 4;
            if clen >= piece.len() {
                out.truncate(at + 4);
                out.extend_from_slice(piece);
                clen = piece.len();
                out[at..at + 4].copy_from_slice(&(clen as u32 | UNCOMPRESSED_BIT).to_le_bytes());
            } else {
                out[at..at + 4].copy_from_slice(&(clen as u32).to_le_bytes());
            }
            let sum = xxh32(&out[at + 4..at + 4 + clen]);
            out.extend_from_slice(&sum.to_le_bytes());
        }
        Ok(BlockMeta {
            raw_len: src.len() as u64,
            packed_len: (out.len() - start) as u64,
            check: 0,
        })
    }
}

/// Writes the frame header and the end mark.
pub struct Framer;

impl super::Framer for Framer {
    fn header(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC.to_le_bytes());
        let flg = 0x40 | FLG_INDEP | FLG_BLOCK_CHECKSUM;
        let bd = 7 << 4;
        let hc = (xxh32(&[flg, bd]) >> 8) as u8;
        out.extend_from_slice(&[flg, bd, hc]);
    }
    fn block(&mut self, _meta: &BlockMeta) {}
    fn trailer(&mut self, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(&[0; 4]);
        Ok(())
    }
}

/// Writes a legacy frame's magic (`lz4 -l`); the frame has no end mark.
pub struct LegacyFramer;

impl super::Framer for LegacyFramer {
    fn header(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&LEGACY_MAGIC.to_le_bytes());
    }
    fn block(&mut self, _meta: &BlockMeta) {}
    fn trailer(&mut self, _out: &mut Vec<u8>) -> Result<()> {
        Ok(())
    }
}

/// Flags of the frame being split, kept as the unit tag.
#[derive(Clone, Copy)]
struct FrameFlags {
    flg: u8,
    max_block: usize,
    /// A legacy frame: no checksums, no end mark.
    legacy: bool,
}

/// Group independent blocks into units of about this many decoded bytes.
const UNIT_TARGET: usize = 4 << 20;

/// Cuts LZ4 frames at block boundaries.
pub struct Splitter {
    input: Input,
    frame: Option<FrameFlags>,
    /// Whether the current frame has handed out a unit yet.
    started: bool,
    /// Last 64 KiB of output of a linked-block frame.
    dict: Vec<u8>,
    frames: u64,
    /// A cut or damage met after whole blocks of a unit: they go out
    /// first, as lz4 writes them.
    deferred: super::Deferred,
}

impl Splitter {
    /// A splitter over `input`.
    pub fn new(input: Input) -> Self {
        Splitter {
            input,
            frame: None,
            started: false,
            dict: Vec::new(),
            frames: 0,
            deferred: super::Deferred::default(),
        }
    }

    fn parse_frame_header(&mut self) -> Result<Option<FrameFlags>> {
        loop {
            if self.input.at_end()? {
                if self.frames == 0 {
                    return Err(CodecError::Truncated {
                        format: NAME,
                        offset: 0,
                    });
                }
                return Ok(None);
            }
            let off = self.input.offset();
            let could_start = |b: &[u8]| {
                begins_like(b, &MAGIC.to_le_bytes())
                    || begins_like(b, &LEGACY_MAGIC.to_le_bytes())
                    || super::zstd::could_start_skippable(b)
            };
            let b = self.input.need_start(4, NAME, could_start)?;
            let magic = le32(b, 0);
            if magic & 0xFFFF_FFF0 == 0x184D_2A50 {
                let b = self.input.need(8, NAME)?;
                let size = le32(b, 4);
                self.input.consume(8);
                self.input.skip(u64::from(size), NAME)?;
                self.frames += 1;
                continue;
            }
            if magic == LEGACY_MAGIC {
                self.input.consume(4);
                self.frames += 1;
                self.started = false;
                self.dict.clear();
                return Ok(Some(FrameFlags {
                    flg: FLG_INDEP,
                    max_block: LEGACY_BLOCK,
                    legacy: true,
                }));
            }
            if magic != MAGIC {
                return Err(if self.frames == 0 {
                    CodecError::UnknownFormat
                } else {
                    CodecError::TrailingGarbage {
                        format: NAME,
                        offset: off,
                    }
                });
            }
            let b = self.input.need(7, NAME)?;
            let (flg, bd) = (b[4], b[5]);
            if flg >> 6 != 1 {
                return Err(CodecError::corrupt(
                    NAME,
                    off + 4,
                    format!("unsupported frame version {}", flg >> 6),
                ));
            }
            if flg & 0x02 != 0 || bd & 0x8F != 0 {
                return Err(CodecError::corrupt(
                    NAME,
                    off + 4,
                    "reserved bits set in frame descriptor",
                ));
            }
            let max_block = match (bd >> 4) & 7 {
                4 => 64 << 10,
                5 => 256 << 10,
                6 => 1 << 20,
                7 => 4 << 20,
                id => {
                    return Err(CodecError::corrupt(
                        NAME,
                        off + 5,
                        format!("invalid block size id {id}"),
                    ))
                }
            };
            let desc_len = 2
                + if flg & FLG_CONTENT_SIZE != 0 { 8 } else { 0 }
                + if flg & FLG_DICT_ID != 0 { 4 } else { 0 };
            let b = self.input.need(4 + desc_len + 1, NAME)?;
            let hc = (xxh32(&b[4..4 + desc_len]) >> 8) as u8;
            if hc != b[4 + desc_len] {
                return Err(CodecError::corrupt(
                    NAME,
                    off + 4 + desc_len as u64,
                    "frame descriptor checksum mismatch",
                ));
            }
            if flg & FLG_DICT_ID != 0 {
                return Err(CodecError::corrupt(
                    NAME,
                    off + 4,
                    "frames that need a preset dictionary are not supported",
                ));
            }
            self.input.consume(4 + desc_len + 1);
            self.frames += 1;
            self.started = false;
            self.dict.clear();
            return Ok(Some(FrameFlags {
                flg,
                max_block,
                legacy: false,
            }));
        }
    }

    /// Read one block header; `None` at the end mark (content checksum
    /// consumed and returned through `end`).
    fn block_header(
        &mut self,
        ff: FrameFlags,
        end: &mut Option<u32>,
    ) -> Result<Option<(u32, usize)>> {
        let off = self.input.offset();
        if ff.legacy {
            // No end mark: the input ends, or another frame begins.
            if self.input.at_end()? {
                return Ok(None);
            }
            let word = le32(self.input.need(4, NAME)?, 0);
            if word == MAGIC || word == LEGACY_MAGIC || word & 0xFFFF_FFF0 == 0x184D_2A50 {
                return Ok(None);
            }
            let size = word as usize;
            if size > lz4_ffi::bound(LEGACY_BLOCK) {
                return Err(CodecError::TooLarge {
                    format: NAME,
                    what: "legacy block size field",
                    offset: off,
                    size: size as u64,
                    limit: lz4_ffi::bound(LEGACY_BLOCK) as u64,
                });
            }
            return Ok(Some((word, size)));
        }
        let word = le32(self.input.need(4, NAME)?, 0);
        if word == 0 {
            self.input.consume(4);
            if ff.flg & FLG_CONTENT_CHECKSUM != 0 {
                *end = Some(le32(self.input.need(4, NAME)?, 0));
                self.input.consume(4);
            }
            return Ok(None);
        }
        let size = (word & !UNCOMPRESSED_BIT) as usize;
        if size > ff.max_block {
            return Err(CodecError::TooLarge {
                format: NAME,
                what: "block size field",
                offset: off,
                size: size as u64,
                limit: ff.max_block as u64,
            });
        }
        Ok(Some((word, size)))
    }

    fn linked_blocks(&mut self, ff: FrameFlags, unit: &mut Unit) -> Result<Option<u32>> {
        let mut end = None;
        let mut comp = Vec::new();
        unit.kind = UnitKind::Plain;
        while unit.data.len() < PLAIN_UNIT {
            let at = unit.data.len();
            match self.linked_block(ff, unit, &mut comp, &mut end) {
                Ok(true) => {}
                Ok(false) => {
                    self.frame = None;
                    break;
                }
                Err(e) if at > 0 => {
                    unit.data.truncate(at);
                    self.deferred.later(e);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(end)
    }

    /// Decode the next block of a linked-block frame onto `unit`'s data;
    /// `false` at the frame's end mark.
    fn linked_block(
        &mut self,
        ff: FrameFlags,
        unit: &mut Unit,
        comp: &mut Vec<u8>,
        end: &mut Option<u32>,
    ) -> Result<bool> {
        let Some((word, size)) = self.block_header(ff, end)? else {
            return Ok(false);
        };
        let off = self.input.offset();
        self.input.consume(4);
        comp.clear();
        self.input.take(size, comp, NAME)?;
        if ff.flg & FLG_BLOCK_CHECKSUM != 0 {
            let want = le32(self.input.need(4, NAME)?, 0);
            self.input.consume(4);
            if xxh32(comp) != want {
                return Err(CodecError::corrupt(NAME, off, "block checksum mismatch"));
            }
        }
        let at = unit.data.len();
        if word & UNCOMPRESSED_BIT != 0 {
            unit.data.extend_from_slice(comp);
        } else {
            lz4_ffi::decompress_append(comp, &mut unit.data, ff.max_block, &self.dict)
                .ok_or_else(|| CodecError::corrupt(NAME, off, "invalid LZ4 block"))?;
        }
        let produced = &unit.data[at..];
        if produced.len() >= 64 << 10 {
            self.dict.clear();
            self.dict
                .extend_from_slice(&produced[produced.len() - (64 << 10)..]);
        } else {
            self.dict.extend_from_slice(produced);
            let excess = self.dict.len().saturating_sub(64 << 10);
            self.dict.drain(..excess);
        }
        Ok(true)
    }

    fn independent_blocks(&mut self, ff: FrameFlags, unit: &mut Unit) -> Result<Option<u32>> {
        let mut end = None;
        let mut raw_bound = 0usize;
        unit.kind = UnitKind::Packed(u32::from(ff.flg) | (ff.max_block as u32));
        let sum = if ff.flg & FLG_BLOCK_CHECKSUM != 0 {
            4
        } else {
            0
        };
        while raw_bound < UNIT_TARGET && unit.data.len() < MAX_UNIT - ff.max_block - 8 {
            let whole = unit.data.len();
            let step = match self.block_header(ff, &mut end) {
                Ok(Some((_, size))) => self.input.take(4 + size + sum, &mut unit.data, NAME),
                Ok(None) => {
                    self.frame = None;
                    break;
                }
                Err(e) => Err(e),
            };
            match step {
                Ok(()) => raw_bound += ff.max_block,
                // The whole blocks before a cut go out first.
                Err(e) if whole > 0 => {
                    unit.data.truncate(whole);
                    self.deferred.later(e);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        unit.raw_len = raw_bound;
        Ok(end)
    }
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        self.deferred.take()?;
        loop {
            let ff = match self.frame {
                Some(ff) => ff,
                None => match self.parse_frame_header()? {
                    Some(ff) => {
                        self.frame = Some(ff);
                        ff
                    }
                    None => return Ok(false),
                },
            };
            unit.offset = self.input.offset();
            let end = if ff.flg & FLG_INDEP != 0 {
                self.independent_blocks(ff, unit)?
            } else {
                self.linked_blocks(ff, unit)?
            };
            let first = !self.started;
            self.started = true;
            let ends = self.frame.is_none();
            if ff.flg & FLG_CONTENT_CHECKSUM != 0 {
                unit.content = match (first, ends, end) {
                    (_, true, Some(v)) => ContentCheck::EndXxh32(v),
                    (true, _, _) => ContentCheck::StartXxh32,
                    _ => ContentCheck::Continue,
                };
            }
            if unit.data.is_empty() && unit.content == ContentCheck::None && ends {
                // An empty frame: nothing to hand out.
                continue;
            }
            return Ok(true);
        }
    }

    fn offset(&self) -> u64 {
        self.input.offset()
    }
}

/// Decodes runs of independent blocks.
pub struct Decoder;

impl super::UnitDecoder for Decoder {
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()> {
        let UnitKind::Packed(flg) = unit.kind else {
            pass_plain(unit, out);
            return Ok(());
        };
        blocks(unit, flg, out, &mut 0)
    }

    /// The blocks before the first damaged one, as lz4 writes them.
    fn salvage(&mut self, unit: &Unit, out: &mut Vec<u8>) {
        if let UnitKind::Packed(flg) = unit.kind {
            let mut whole = out.len();
            if blocks(unit, flg, out, &mut whole).is_err() {
                out.truncate(whole);
            }
        }
    }
}

/// Decode the unit's blocks into `out`, checking their sums where the
/// frame has them; `whole` is moved to the end of each block decoded.
fn blocks(unit: &Unit, flg: u32, out: &mut Vec<u8>, whole: &mut usize) -> Result<()> {
    let sums = flg as u8 & FLG_BLOCK_CHECKSUM != 0;
    let max_block = (flg & !0xFF) as usize;
    let data = &unit.data;
    out.reserve(unit.raw_len);
    let mut i = 0;
    while i < data.len() {
        let word = le32(data, i);
        let size = (word & !UNCOMPRESSED_BIT) as usize;
        let body = &data[i + 4..i + 4 + size];
        let block_off = unit.offset + i as u64;
        if sums {
            let want = le32(data, i + 4 + size);
            if xxh32(body) != want {
                return Err(CodecError::corrupt(
                    NAME,
                    block_off,
                    "block checksum mismatch",
                ));
            }
        }
        if word & UNCOMPRESSED_BIT != 0 {
            out.extend_from_slice(body);
        } else {
            lz4_ffi::decompress_append(body, out, max_block, &[])
                .ok_or_else(|| CodecError::corrupt(NAME, block_off, "invalid LZ4 block"))?;
        }
        *whole = out.len();
        i += 4 + size + if sums { 4 } else { 0 };
    }
    Ok(())
}

/// What a frame of an lz4 file is, as `lz4 --list` tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListedKind {
    /// An LZ4 frame.
    Frame {
        /// Its block size id (4-7: 64 KiB to 4 MiB).
        block_id: u8,
        /// Whether its blocks are independent (`lz4 -BD` links them).
        independent: bool,
        /// Whether it ends in an XXH32 of its content.
        content_check: bool,
        /// The content size its header states (`None` where it states
        /// none, or 0, which lz4 takes for none).
        content_size: Option<u64>,
    },
    /// A legacy frame (`lz4 -l`).
    Legacy,
    /// A skippable frame.
    Skippable,
}

/// One frame of an lz4 file and its length in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedFrame {
    /// What it is.
    pub kind: ListedKind,
    /// Its bytes, magic to end mark and checksum.
    pub len: u64,
}

/// How the frames [`frames`] walked end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// With the input.
    End,
    /// Bytes follow the last frame (or begin the input) that begin no
    /// frame: where, and how many of them (up to 4) were read there.
    /// `lz4 --list` names the place and fails.
    Garbage {
        /// Their offset.
        at: u64,
        /// Bytes read there.
        len: usize,
    },
    /// A legacy frame holds a block size over 8 MiB that is no frame's
    /// magic (lz4: "Corrupted legacy frame").
    BadLegacyBlock {
        /// Offset of the size.
        at: u64,
    },
    /// The input ends inside a frame's header where lz4 reads it, which
    /// `lz4 --list` reports with a status of its own.
    CutHeader {
        /// Offset of the frame.
        at: u64,
        /// Which read found the end.
        cut: HeaderCut,
    },
}

/// Where a frame header cut short ends, as `lz4 --list` reads one: the
/// frame's magic, then the 3 bytes of the smallest header, then (where
/// its flags state a content size) the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderCut {
    /// Nothing after an LZ4 frame's magic (lz4's status 71).
    AfterMagic,
    /// A header whose flags state a content size ends within its first 7
    /// bytes (lz4's status 72).
    BeforeContentSize,
    /// A skippable frame's size is cut short (lz4's status 42).
    SkippableSize,
}

/// What [`frames`] found in a file, besides the frames it handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walked {
    /// Frames found.
    pub frames: u64,
    /// How they end.
    pub tail: Tail,
}

/// The frames of the lz4 file `r` reads (from its start), as `lz4 --list`
/// walks them, each handed to `each` as it is found: each header read
/// whole, blocks passed over by their sizes (`pass_over` moves `r` on by
/// a number of bytes and says how many it passed, fewer only at the end;
/// a file seeks); a legacy frame ends at the end of the input or at the
/// next frame's magic, as lz4 ends it. `size`, where the input's length
/// is known, is checked against what the frames claim. An input that
/// begins with no frame magic has no frames and garbage at 0;
/// [`CodecError::UnknownFormat`] where it is empty, its first frame header
/// is cut short, or a legacy frame holds no block (lz4 lists none of
/// these); another error names what is wrong and where. Nothing is
/// decoded or checked but the headers, and memory stays within a header.
pub fn frames<R: std::io::Read>(
    r: &mut R,
    size: Option<u64>,
    pass_over: fn(&mut R, u64) -> std::io::Result<u64>,
    each: &mut dyn FnMut(ListedFrame),
) -> Result<Walked> {
    let fill = super::read_up_to::<R>;
    let truncated = |offset| CodecError::Truncated {
        format: NAME,
        offset,
    };
    // Pass `n` bytes that begin at `at`; the offset after them.
    let pass = |r: &mut R, at: u64, n: u64| -> Result<u64> {
        let end = at.checked_add(n).ok_or_else(|| truncated(at))?;
        if size.is_some_and(|s| end > s) {
            return Err(truncated(size.unwrap_or(at)));
        }
        let passed = pass_over(r, n).map_err(|source| CodecError::Io { offset: at, source })?;
        if passed < n {
            return Err(truncated(at + passed));
        }
        Ok(end)
    };
    let is_magic = |w: u32| w == MAGIC || w == LEGACY_MAGIC || w & 0xFFFF_FFF0 == 0x184D_2A50;
    let mut walked = Walked {
        frames: 0,
        tail: Tail::End,
    };
    let mut at = 0u64;
    let mut b = Vec::with_capacity(32);
    // The word read past the end of a legacy frame: the next magic.
    let mut held: Option<[u8; 4]> = None;
    loop {
        b.clear();
        match held.take() {
            Some(word) => b.extend_from_slice(&word),
            None => fill(r, &mut b, 4, at)?,
        }
        if b.is_empty() && walked.frames == 0 {
            return Err(CodecError::UnknownFormat);
        }
        if b.len() < 4 {
            if !b.is_empty() {
                walked.tail = Tail::Garbage { at, len: b.len() };
            }
            return Ok(walked);
        }
        let start = at;
        let magic = le32(&b, 0);
        let kind = if magic & 0xFFFF_FFF0 == 0x184D_2A50 {
            fill(r, &mut b, 8, at)?;
            if b.len() < 8 {
                walked.tail = Tail::CutHeader {
                    at,
                    cut: HeaderCut::SkippableSize,
                };
                return Ok(walked);
            }
            at = pass(r, at + 8, u64::from(le32(&b, 4)))?;
            ListedKind::Skippable
        } else if magic == LEGACY_MAGIC {
            at += 4;
            let mut blocks = 0u64;
            loop {
                b.clear();
                fill(r, &mut b, 4, at)?;
                match b.len() {
                    0 => break,
                    4 => {}
                    got => return Err(truncated(at + got as u64)),
                }
                let block = le32(&b, 0);
                if is_magic(block) {
                    held = Some([b[0], b[1], b[2], b[3]]);
                    break;
                }
                if block as usize > LEGACY_BLOCK {
                    walked.tail = Tail::BadLegacyBlock { at };
                    return Ok(walked);
                }
                at = pass(r, at + 4, u64::from(block))?;
                blocks += 1;
            }
            if blocks == 0 {
                return Err(CodecError::UnknownFormat);
            }
            ListedKind::Legacy
        } else if magic == MAGIC {
            // A file cut inside its first header does not begin as lz4.
            let cut = |got: usize| match walked.frames {
                0 => CodecError::UnknownFormat,
                _ => truncated(at + got as u64),
            };
            fill(r, &mut b, 7, at)?;
            // lz4 reads the smallest header, then the content size it
            // states: a read that finds nothing fails apart.
            // (lz4 sizes a header by its flags alone, whatever its version.)
            let states_size = |b: &[u8]| b.len() > 4 && b[4] & FLG_CONTENT_SIZE != 0;
            let cut_header = |cut| Tail::CutHeader { at, cut };
            if b.len() == 4 {
                walked.tail = cut_header(HeaderCut::AfterMagic);
                return Ok(walked);
            }
            if b.len() < 7 {
                if states_size(&b) {
                    walked.tail = cut_header(HeaderCut::BeforeContentSize);
                    return Ok(walked);
                }
                return Err(cut(b.len()));
            }
            let (flg, bd) = (b[4], b[5]);
            let desc_len = 2
                + if flg & FLG_CONTENT_SIZE != 0 { 8 } else { 0 }
                + if flg & FLG_DICT_ID != 0 { 4 } else { 0 };
            fill(r, &mut b, 4 + desc_len + 1, at)?;
            if b.len() == 7 && states_size(&b) {
                walked.tail = cut_header(HeaderCut::BeforeContentSize);
                return Ok(walked);
            }
            if flg >> 6 != 1 || flg & 0x02 != 0 || bd & 0x8F != 0 || (bd >> 4) & 7 < 4 {
                return Err(CodecError::corrupt(
                    NAME,
                    at + 4,
                    "invalid frame descriptor",
                ));
            }
            if b.len() < 4 + desc_len + 1 {
                return Err(cut(b.len()));
            }
            if (xxh32(&b[4..4 + desc_len]) >> 8) as u8 != b[4 + desc_len] {
                return Err(CodecError::corrupt(
                    NAME,
                    at + 4 + desc_len as u64,
                    "frame descriptor checksum mismatch",
                ));
            }
            let content_size = (flg & FLG_CONTENT_SIZE != 0)
                .then(|| u64::from_le_bytes(b[6..14].try_into().unwrap_or_default()))
                .filter(|&n| n != 0);
            at += 4 + desc_len as u64 + 1;
            let block_sum = if flg & FLG_BLOCK_CHECKSUM != 0 { 4 } else { 0 };
            loop {
                b.clear();
                fill(r, &mut b, 4, at)?;
                if b.len() < 4 {
                    return Err(truncated(at + b.len() as u64));
                }
                let block = le32(&b, 0) & !UNCOMPRESSED_BIT;
                if block == 0 {
                    at += 4;
                    break;
                }
                at = pass(r, at + 4, u64::from(block) + block_sum)?;
            }
            if flg & FLG_CONTENT_CHECKSUM != 0 {
                at = pass(r, at, 4)?;
            }
            ListedKind::Frame {
                block_id: (bd >> 4) & 7,
                independent: flg & FLG_INDEP != 0,
                content_check: flg & FLG_CONTENT_CHECKSUM != 0,
                content_size,
            }
        } else {
            walked.tail = Tail::Garbage { at, len: 4 };
            return Ok(walked);
        };
        walked.frames += 1;
        each(ListedFrame {
            kind,
            len: at - start,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{decode_all, encode_all, EncodeOptions, Format};
    use crate::testutil::noise;

    /// A frame written by hand: block size id 5, the flags `flg` adds to
    /// version 1, a content size if given, blocks of the given lengths
    /// (their bytes not LZ4, which listing never reads), an end mark and a
    /// content checksum if flagged.
    fn frame_by_hand(flg: u8, content: Option<u64>, blocks: &[u32]) -> Vec<u8> {
        let flg = 0x40
            | flg
            | if content.is_some() {
                FLG_CONTENT_SIZE
            } else {
                0
            };
        let mut desc = vec![flg, 0x50];
        if let Some(c) = content {
            desc.extend_from_slice(&c.to_le_bytes());
        }
        let mut out = MAGIC.to_le_bytes().to_vec();
        out.extend_from_slice(&desc);
        out.push((xxh32(&desc) >> 8) as u8);
        for &n in blocks {
            out.extend_from_slice(&n.to_le_bytes());
            out.extend(std::iter::repeat_n(7u8, (n & !UNCOMPRESSED_BIT) as usize));
            if flg & FLG_BLOCK_CHECKSUM != 0 {
                out.extend_from_slice(&[1; 4]);
            }
        }
        out.extend_from_slice(&[0; 4]);
        if flg & FLG_CONTENT_CHECKSUM != 0 {
            out.extend_from_slice(&[2; 4]);
        }
        out
    }

    /// [`frames`] over `file` as lz4 reads a file: by seeking, its size
    /// known; and as it would read a stream, by reading: the frames found
    /// and the outcome.
    fn listed(file: &[u8]) -> (Vec<ListedFrame>, Result<Walked>) {
        let mut found = Vec::new();
        let mut r = std::io::Cursor::new(file.to_vec());
        let seeking = frames(
            &mut r,
            Some(file.len() as u64),
            |r, n| {
                r.set_position(r.position() + n);
                Ok(n)
            },
            &mut |f| found.push(f),
        );
        let mut again = Vec::new();
        let mut r = std::io::Cursor::new(file.to_vec());
        let reading = frames(
            &mut r,
            None,
            |r, n| std::io::copy(&mut std::io::Read::take(r, n), &mut std::io::sink()),
            &mut |f| again.push(f),
        );
        assert_eq!(format!("{seeking:?}"), format!("{reading:?}"));
        assert_eq!(found, again);
        (found, seeking)
    }

    /// How [`listed`] ends: its tail, or its error.
    fn tail(file: &[u8]) -> Result<Tail> {
        listed(file).1.map(|w| w.tail)
    }

    #[test]
    fn frames_of_every_kind_are_listed_with_their_lengths() {
        let sized = frame_by_hand(
            FLG_INDEP | FLG_CONTENT_CHECKSUM,
            Some(500),
            &[100, 0x8000_0020],
        );
        let linked = frame_by_hand(FLG_BLOCK_CHECKSUM, Some(0), &[10]);
        let skippable = [
            &0x184D_2A5Fu32.to_le_bytes()[..],
            &3u32.to_le_bytes(),
            b"xyz",
        ]
        .concat();
        // A legacy frame ends at the next frame's magic.
        let old = [
            &LEGACY_MAGIC.to_le_bytes()[..],
            &5u32.to_le_bytes(),
            &[9; 5],
            &2u32.to_le_bytes(),
            &[9; 2],
        ]
        .concat();
        let file = [&sized[..], &linked, &skippable, &old, &sized].concat();
        let (found, walked) = listed(&file);
        let sized_kind = ListedKind::Frame {
            block_id: 5,
            independent: true,
            content_check: true,
            content_size: Some(500),
        };
        assert_eq!(
            found,
            vec![
                ListedFrame {
                    kind: sized_kind,
                    len: sized.len() as u64
                },
                // (A content size of 0 is none, as lz4 takes it.)
                ListedFrame {
                    kind: ListedKind::Frame {
                        block_id: 5,
                        independent: false,
                        content_check: false,
                        content_size: None,
                    },
                    len: linked.len() as u64,
                },
                ListedFrame {
                    kind: ListedKind::Skippable,
                    len: 11
                },
                ListedFrame {
                    kind: ListedKind::Legacy,
                    len: old.len() as u64
                },
                ListedFrame {
                    kind: sized_kind,
                    len: sized.len() as u64
                },
            ]
        );
        assert_eq!(
            walked.unwrap(),
            Walked {
                frames: 5,
                tail: Tail::End
            }
        );
        // A legacy frame at the end ends with the input.
        let (found, _) = listed(&[&sized[..], &old].concat());
        assert_eq!(
            found[1],
            ListedFrame {
                kind: ListedKind::Legacy,
                len: old.len() as u64
            }
        );
        // A block size over 8 MiB that is no magic is damage, as lz4
        // says ("Corrupted legacy frame"); one of 8 MiB is a block.
        let over = [&old[..], &(LEGACY_BLOCK as u32 + 1).to_le_bytes()].concat();
        assert_eq!(
            tail(&over).unwrap(),
            Tail::BadLegacyBlock {
                at: old.len() as u64
            }
        );
        let full = [&old[..], &(LEGACY_BLOCK as u32).to_le_bytes()].concat();
        assert!(matches!(tail(&full), Err(CodecError::Truncated { .. })));
        // A legacy frame of no block is no lz4 to lz4.
        assert!(matches!(
            tail(&LEGACY_MAGIC.to_le_bytes()),
            Err(CodecError::UnknownFormat)
        ));
        let empty_then = [&LEGACY_MAGIC.to_le_bytes()[..], &sized].concat();
        assert!(matches!(tail(&empty_then), Err(CodecError::UnknownFormat)));
    }

    #[test]
    fn what_is_not_a_frame_is_named_where_it_begins() {
        let f = frame_by_hand(FLG_INDEP, None, &[40]);
        let end = f.len() as u64;
        let garbage = |at, len| Tail::Garbage { at, len };
        assert_eq!(tail(&[&f[..], b"junk!"].concat()).unwrap(), garbage(end, 4));
        assert_eq!(tail(&[&f[..], b"ab"].concat()).unwrap(), garbage(end, 2));
        let (found, none) = listed(b"not lz4 at all");
        assert_eq!(
            (found.len(), none.unwrap()),
            (
                0,
                Walked {
                    frames: 0,
                    tail: garbage(0, 4)
                }
            )
        );
        assert_eq!(tail(b"x").unwrap(), garbage(0, 1));
        // Empty, or cut in the first header: not lz4.
        assert!(matches!(tail(b""), Err(CodecError::UnknownFormat)));
        assert!(matches!(tail(&f[..6]), Err(CodecError::UnknownFormat)));
        // Cut later: where it ends, the frames before it handed out.
        for cut in [f.len() - 1, 20, 8] {
            match tail(&f[..cut]) {
                Err(CodecError::Truncated { offset, .. }) => {
                    assert!(offset <= cut as u64, "{cut}: {offset}")
                }
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        let (found, two) = listed(&[&f[..], &f[..9]].concat());
        assert!(matches!(two, Err(CodecError::Truncated { .. })));
        assert_eq!(found.len(), 1);
        // A damaged descriptor.
        let mut bad = f.clone();
        bad[6] ^= 1;
        assert!(matches!(tail(&bad), Err(CodecError::Corrupt { .. })));
    }

    #[test]
    fn headers_cut_where_lz4_reads_them_are_named() {
        let f = frame_by_hand(FLG_INDEP, None, &[40]);
        let sized = frame_by_hand(FLG_INDEP, Some(40), &[40]);
        let end = f.len() as u64;
        let cut = |at, cut| Tail::CutHeader { at, cut };
        // Nothing after the magic, first frame or later.
        assert_eq!(tail(&f[..4]).unwrap(), cut(0, HeaderCut::AfterMagic));
        let later = [&f[..], &f[..4]].concat();
        assert_eq!(tail(&later).unwrap(), cut(end, HeaderCut::AfterMagic));
        // A header that states a content size, cut within its first 7
        // bytes; past them it is cut inside what lz4 reads second.
        for n in 5..=7 {
            let at = [&f[..], &sized[..n]].concat();
            assert_eq!(tail(&at).unwrap(), cut(end, HeaderCut::BeforeContentSize));
            assert_eq!(
                tail(&sized[..n]).unwrap(),
                cut(0, HeaderCut::BeforeContentSize)
            );
        }
        assert!(matches!(tail(&sized[..9]), Err(CodecError::UnknownFormat)));
        // No content size stated: a short header is not lz4.
        assert!(matches!(tail(&f[..5]), Err(CodecError::UnknownFormat)));
        // lz4 sizes a header by its flags, whatever their version or
        // reserved bits: a size stated by a bad descriptor is still read.
        for flg in [0x08u8, 0x88, 0xC8, 0x4A] {
            for n in 5..=7 {
                let mut bad = sized[..n].to_vec();
                bad[4] = flg;
                assert_eq!(
                    tail(&bad).unwrap(),
                    cut(0, HeaderCut::BeforeContentSize),
                    "{flg:#x} cut at {n}"
                );
            }
        }
        // A skippable frame's size cut short.
        let skip = [&0x184D_2A51u32.to_le_bytes()[..], &[3, 0]].concat();
        assert_eq!(tail(&skip).unwrap(), cut(0, HeaderCut::SkippableSize));
        let after = [&f[..], &skip[..4]].concat();
        assert_eq!(tail(&after).unwrap(), cut(end, HeaderCut::SkippableSize));
    }

    /// A legacy frame as `lz4 -l` writes it: the magic, then each 8 MiB
    /// of `data` as a size and an LZ4 block.
    fn legacy(data: &[u8]) -> Vec<u8> {
        let mut c = lz4_ffi::Compressor::new();
        let mut out = LEGACY_MAGIC.to_le_bytes().to_vec();
        for block in data.chunks(LEGACY_BLOCK) {
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            let n = c.compress_append(block, &mut out).unwrap();
            out[at..at + 4].copy_from_slice(&(n as u32).to_le_bytes());
        }
        out
    }

    fn text(len: usize) -> Vec<u8> {
        let mut v: Vec<u8> = b"legacy lz4 frames hold 8 MiB blocks; "
            .iter()
            .copied()
            .cycle()
            .take(len)
            .collect();
        v[len / 2..len / 2 + 100_000].copy_from_slice(&noise(100_000, 3));
        v
    }

    #[test]
    fn legacy_frames_are_read_alone_concatenated_and_before_a_modern_one() {
        let a = text(19 << 20);
        let b = text(1 << 20);
        assert_eq!(Format::detect(&legacy(&a)), Some(Format::Lz4));
        assert!(decode_all(&legacy(&a)).unwrap() == a);
        // An empty legacy frame (`lz4 -l` of nothing) is the magic alone.
        assert!(decode_all(&legacy(&[])).unwrap().is_empty());
        let mut two = legacy(&a);
        two.extend_from_slice(&legacy(&b));
        let modern = encode_all(Format::Lz4, 1, 1 << 20, &b).unwrap();
        two.extend_from_slice(&modern);
        let mut want = a.clone();
        want.extend_from_slice(&b);
        want.extend_from_slice(&b);
        assert!(decode_all(&two).unwrap() == want);
    }

    /// `data` as cairn writes it with `opts`, cut into pipeline blocks of
    /// `block` bytes (the last shorter; none empty unless `data` is).
    fn write(level: i32, block: usize, opts: &EncodeOptions, data: &[u8]) -> Vec<u8> {
        let mut enc = Format::Lz4.encoder_with(level, block, opts).unwrap();
        let mut framer = Format::Lz4.framer(level, opts);
        let mut out = Vec::new();
        framer.header(&mut out);
        let mut blocks: Vec<&[u8]> = data.chunks(block).collect();
        if blocks.is_empty() {
            blocks.push(&[]);
        }
        for b in blocks {
            let meta = enc.encode(b, &mut out).unwrap();
            framer.block(&meta);
        }
        framer.trailer(&mut out).unwrap();
        out
    }

    const LEGACY: EncodeOptions = EncodeOptions {
        long: None,
        extreme: false,
        check: crate::format::IntegrityCheck::Default,
        legacy: true,
        favor_dec_speed: false,
        filters: None,
        zstd_dictionary: None,
        zstd_no_dict_id: false,
        zstd_tuning: crate::format::zstd::Tuning {
            params: Vec::new(),
            no_content_size: false,
            row_match_finder: None,
            target_block: 0,
        },
        gzip_comment: None,
    };

    #[test]
    fn legacy_frames_are_written_as_lz4_l_writes_them() {
        let a = text(19 << 20);
        // 8 MiB pipeline blocks (the default for legacy frames): the very
        // bytes of `lz4 -l`'s layout, 8 MiB blocks and a shorter last.
        assert_eq!(
            Format::Lz4.default_block_size_with(1, &LEGACY),
            LEGACY_BLOCK
        );
        let ours = write(1, LEGACY_BLOCK, &LEGACY, &a);
        assert!(ours == legacy(&a));
        // A bigger pipeline block is cut into 8 MiB ones all the same.
        assert!(write(1, 24 << 20, &LEGACY, &a) == ours);
        // Nothing: the magic alone, as lz4 -l writes it.
        assert_eq!(
            write(1, LEGACY_BLOCK, &LEGACY, &[]),
            LEGACY_MAGIC.to_le_bytes()
        );
        // Smaller blocks and HC levels read back; HC is smaller.
        for level in [-5, 1, 3, 9, 12] {
            let packed = write(level, 3 << 20, &LEGACY, &a);
            assert_eq!(packed[..4], LEGACY_MAGIC.to_le_bytes());
            assert!(decode_all(&packed).unwrap() == a, "level {level}");
            if level >= 9 {
                assert!(packed.len() < ours.len(), "level {level}");
            }
        }
        // Incompressible data is still a compressed block (legacy frames
        // have no stored ones), a little bigger than its input.
        let n = noise(1 << 20, 9);
        let packed = write(1, LEGACY_BLOCK, &LEGACY, &n);
        let size = le32(&packed, 4) as usize;
        assert!(size > n.len() && size <= lz4_ffi::bound(n.len()), "{size}");
        assert_eq!(packed.len(), 8 + size);
        assert!(decode_all(&packed).unwrap() == n);
        // favorDecSpeed is a frame's option, as in lz4: legacy blocks are
        // written without it.
        let favored = EncodeOptions {
            favor_dec_speed: true,
            ..LEGACY
        };
        assert!(write(12, LEGACY_BLOCK, &favored, &a) == write(12, LEGACY_BLOCK, &LEGACY, &a));
    }

    #[test]
    fn favoring_decompression_speed_changes_hc_frames_from_level_10() {
        // Words of varied lengths: matches that the optimal parser may
        // trade for faster decoding.
        let a = crate::testutil::image_like(6 << 20, 5);
        let favored = EncodeOptions {
            favor_dec_speed: true,
            ..EncodeOptions::default()
        };
        let plain = EncodeOptions::default();
        for level in [1, 9] {
            assert!(
                write(level, MAX_BLOCK, &favored, &a) == write(level, MAX_BLOCK, &plain, &a),
                "level {level}"
            );
        }
        for level in [10, 12] {
            let f = write(level, MAX_BLOCK, &favored, &a);
            let p = write(level, MAX_BLOCK, &plain, &a);
            // Another parse (usually a little bigger, not always).
            assert!(f != p, "level {level}");
            assert!(decode_all(&f).unwrap() == a, "level {level}");
        }
    }

    #[test]
    fn legacy_and_favor_dec_speed_are_lz4s_alone() {
        for f in [Format::Gzip, Format::Zstd, Format::Xz, Format::Snappy] {
            assert!(f.check_options(&LEGACY).is_err(), "{f}");
            let favored = EncodeOptions {
                favor_dec_speed: true,
                ..EncodeOptions::default()
            };
            assert!(f.check_options(&favored).is_err(), "{f}");
        }
        assert!(Format::Lz4.check_options(&LEGACY).is_ok());
        let crc = EncodeOptions {
            check: crate::format::IntegrityCheck::Crc32,
            ..LEGACY
        };
        assert!(Format::Lz4.check_options(&crc).is_err());
    }

    #[test]
    fn damaged_legacy_frames_are_errors() {
        let a = text(9 << 20);
        let good = legacy(&a);
        // Cut inside a block.
        let e = decode_all(&good[..good.len() - 100]).unwrap_err();
        assert!(matches!(e, CodecError::Truncated { .. }), "{e}");
        // A block size no 8 MiB block can have.
        let mut big = good.clone();
        big[4..8].copy_from_slice(&(lz4_ffi::bound(LEGACY_BLOCK) as u32 + 1).to_le_bytes());
        let e = decode_all(&big).unwrap_err();
        assert!(matches!(e, CodecError::TooLarge { .. }), "{e}");
        // A flipped byte in a block: invalid, or decoded to other bytes
        // (legacy frames have no checksum: lz4 itself cannot tell either).
        let mut flipped = good.clone();
        flipped[20] ^= 0xff;
        assert!(decode_all(&flipped).map_or(true, |d| d != a));
    }
}
