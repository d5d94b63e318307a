//! xz (the .xz container of XZ Utils) as one stream of independent blocks,
//! each of which states its own compressed and uncompressed size, followed
//! by the index: the same shape `xz -T` writes, so `xz -d`, `xz -t` and
//! `xz -l` read it, and any reader can hop from block to block, even from
//! a pipe, without decoding.
//!
//! Encoding: a worker compresses its block with liblzma's raw LZMA2
//! encoder and wraps it in a block header written here (both size fields,
//! one LZMA2 filter whose property byte is the smallest that covers the
//! dictionary actually used, so `xz -d` allocates no more than needed),
//! then pads it and appends the CRC64 of the block's data. CRC64 is xz's
//! default check and cheap next to LZMA2. The framer writes the stream
//! header, and at the end the index built from each block's unpadded and
//! uncompressed size, and the footer. An empty input gets a stream with no
//! blocks, as `xz` writes it.
//!
//! Decoding parses the container itself rather than handing it to
//! liblzma's stream decoder. Every block header is read here, so the
//! choice between parallel and sequential is made per block and a stream
//! may mix both: a block with both sizes, no bigger than [`MAX_UNIT`],
//! becomes one [`UnitKind::Packed`] unit decoded on a worker with a raw
//! decoder for its filter chain (LZMA2 alone or behind BCJ/delta filters,
//! whatever liblzma supports); a block without sizes (single-threaded `xz`
//! writes those) or a bigger one is decoded by the splitter with the same
//! kind of raw decoder and handed out as [`UnitKind::Plain`] units.
//! Sizes over the limit fall back to that sequential path instead of
//! failing, since `xz -T --block-size=1GiB` files are valid. Either way the
//! block check (CRC32, CRC64 or SHA-256) is verified here (for a streamed
//! block at its end, after its plain units went out, as with gzip's and
//! zstd's fallbacks; a mismatch still fails the run), the index is
//! compared with the blocks actually seen (count, unpadded and uncompressed
//! sizes, CRC32) and the footer with the header. Owning the container code
//! is what makes the per-block choice possible; a stream decoder would
//! have to see a stream from its start. Check types other than none,
//! CRC32, CRC64 and SHA-256 are reserved by the spec and rejected (xz
//! decodes them without verifying; cairn does not hand out unverified data
//! it could have verified).
//!
//! After a stream, stream padding (zero bytes, a multiple of four) and
//! further streams may follow, as `xz -d` accepts; anything else is
//! trailing garbage.
//!
//! Layout: stream header `FD 37 7A 58 5A 00 | 00 check | crc32`; block
//! `size/4-1 | flags | compressed vli | uncompressed vli | filter id vli,
//! props size vli, props ... | zero padding | crc32 | data | zero padding
//! to 4 | check`; index `00 | count vli | (unpadded vli, uncompressed vli)*
//! | zero padding to 4 | crc32`; footer `crc32 | index size/4-1 u32le |
//! 00 check | 59 5A`.

pub use super::xz_filters::FilterChain;
use super::{
    at_offset, le32, pass_plain, BlockMeta, IntegrityCheck, Unit, UnitKind, MAX_UNIT, PLAIN_UNIT,
};
use crate::block::{lzma2_block_dict, lzma2_dict_size, lzma2_options};
use crate::error::{CodecError, Result};
use crate::input::Input;
use liblzma::stream::{Action, Filters, LzmaOptions, Status, Stream};
use sha2::Digest as _;

const NAME: &str = "xz";
/// Magic at the start of every xz stream.
pub const HEADER_MAGIC: &[u8] = b"\xfd7zXZ\x00";
const FOOTER_MAGIC: &[u8] = b"YZ";
const STREAM_HEADER_LEN: usize = 12;
const STREAM_FOOTER_LEN: usize = 12;
const CHECK_NONE: u8 = 0x00;
const CHECK_CRC32: u8 = 0x01;
const CHECK_CRC64: u8 = 0x04;
const CHECK_SHA256: u8 = 0x0a;
const FILTER_LZMA2: u64 = 0x21;
/// A variable-length integer takes at most 9 bytes (63 bits).
const VLI_BYTES: usize = 9;
/// Block flag: the compressed size field is present.
const FLAG_COMPRESSED: u8 = 0x40;
/// Block flag: the uncompressed size field is present.
const FLAG_UNCOMPRESSED: u8 = 0x80;

/// CRC-64/XZ, table-driven 16 bytes at a time.
static CRC64: crc::Crc<u64, crc::Table<16>> = crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_XZ);

/// Input block size for `level`: three dictionaries, at least 1 MiB, as
/// `xz -T` picks it (a smaller block wastes the dictionary), but at most
/// 63 MiB: `xz -T -8`'s 96 MiB and `-9`'s 192 MiB blocks could not be
/// decoded in parallel, and the command line refuses blocks that big.
pub fn block_size(level: i32) -> usize {
    (3 * lzma2_dict_size(level) as usize).clamp(1 << 20, MAX_BLOCK)
}

/// Largest default block: even incompressible, its xz block (LZMA2 adds
/// 3 bytes per 64 KiB chunk, plus header, padding and check) stays within
/// one [`MAX_UNIT`], so the reader hands it to a worker.
const MAX_BLOCK: usize = MAX_UNIT - (1 << 20);

/// Bytes of the check field for check type `id` (the spec fixes the size
/// of even the reserved ones).
fn check_size(id: u8) -> usize {
    match id {
        0 => 0,
        1..=3 => 4,
        4..=6 => 8,
        7..=9 => 16,
        10..=12 => 32,
        _ => 64,
    }
}

/// Running block check.
enum Check {
    None,
    Crc32(crc32fast::Hasher),
    Crc64(crc::Digest<'static, u64, crc::Table<16>>),
    Sha256(sha2::Sha256),
}

impl Check {
    /// A check of type `id`; `None` when cairn cannot compute it.
    fn new(id: u8) -> Option<Check> {
        match id {
            CHECK_NONE => Some(Check::None),
            CHECK_CRC32 => Some(Check::Crc32(crc32fast::Hasher::new())),
            CHECK_CRC64 => Some(Check::Crc64(CRC64.digest())),
            CHECK_SHA256 => Some(Check::Sha256(sha2::Sha256::new())),
            _ => None,
        }
    }

    fn update(&mut self, data: &[u8]) {
        match self {
            Check::None => {}
            Check::Crc32(h) => h.update(data),
            Check::Crc64(h) => h.update(data),
            Check::Sha256(h) => h.update(data),
        }
    }

    /// Compare with the stored field; on mismatch, say what differs.
    fn verify(self, stored: &[u8]) -> std::result::Result<(), String> {
        let (name, got): (&str, Vec<u8>) = match self {
            Check::None => return Ok(()),
            Check::Crc32(h) => ("CRC32", h.finalize().to_le_bytes().to_vec()),
            Check::Crc64(h) => ("CRC64", h.finalize().to_le_bytes().to_vec()),
            Check::Sha256(h) => ("SHA-256", h.finalize().to_vec()),
        };
        if got == stored {
            Ok(())
        } else {
            Err(format!(
                "{name} mismatch: stored {}, computed {}",
                hex(stored),
                hex(&got)
            ))
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Why a variable-length integer could not be read.
enum VliError {
    /// The bytes end inside it.
    Short,
    /// Over 9 bytes, or a non-minimal encoding.
    Bad,
}

/// Decode the variable-length integer at `b[*pos..]`, advancing `pos`.
fn vli(b: &[u8], pos: &mut usize) -> std::result::Result<u64, VliError> {
    let mut v = 0u64;
    for i in 0..VLI_BYTES {
        let Some(&byte) = b.get(*pos + i) else {
            return Err(VliError::Short);
        };
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            if byte == 0 && i > 0 {
                return Err(VliError::Bad);
            }
            *pos += i + 1;
            return Ok(v);
        }
    }
    Err(VliError::Bad)
}

/// What `xz --list` shows of a file, read from its streams' footers and
/// indexes alone: streams, blocks, the sizes, the checks the streams
/// use (bit `1 << id` for check id `id`) and the stream padding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileInfo {
    /// Streams in the file.
    pub streams: u64,
    /// Blocks in all streams.
    pub blocks: u64,
    /// The file's length.
    pub compressed: u64,
    /// The bytes its blocks decode to, as the indexes state them.
    pub uncompressed: u64,
    /// Bit `1 << id` set for every check id a stream uses.
    pub checks: u32,
    /// Zero bytes of stream padding between and after streams.
    pub padding: u64,
}

impl FileInfo {
    /// Add another file's counts (the totals of `xz -l`).
    pub fn add(&mut self, other: &FileInfo) {
        self.streams = self.streams.saturating_add(other.streams);
        self.blocks = self.blocks.saturating_add(other.blocks);
        self.compressed = self.compressed.saturating_add(other.compressed);
        self.uncompressed = self.uncompressed.saturating_add(other.uncompressed);
        self.checks |= other.checks;
        self.padding = self.padding.saturating_add(other.padding);
    }
}

/// One stream of an xz file, as `xz -lv` lists it from the indexes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamInfo {
    /// Where it starts in the file.
    pub offset: u64,
    /// Where its output starts in the file's output.
    pub uncompressed_offset: u64,
    /// Its length, header to footer (padding not counted).
    pub compressed: u64,
    /// The bytes its blocks decode to.
    pub uncompressed: u64,
    /// Its check id.
    pub check: u32,
    /// Zero bytes of stream padding after it.
    pub padding: u64,
    /// Its blocks, in order.
    pub blocks: Vec<BlockInfo>,
}

/// One block of an xz stream, as its index states it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockInfo {
    /// Where it starts in the file.
    pub offset: u64,
    /// Where its output starts in the file's output.
    pub uncompressed_offset: u64,
    /// Its length with its padding (xz's "TotalSize").
    pub total: u64,
    /// The bytes it decodes to.
    pub uncompressed: u64,
}

/// The name xz gives check id `id` (`Unknown-N` for ids no version
/// defines).
pub fn check_name(id: u32) -> String {
    match id {
        0 => "None".into(),
        1 => "CRC32".into(),
        4 => "CRC64".into(),
        10 => "SHA-256".into(),
        n => format!("Unknown-{n}"),
    }
}

/// Walk an xz file of `size` bytes from its end, stream by stream, as
/// `xz --list` does: each stream's footer, its index (checked by its
/// CRC32) and its header; zero padding between streams. An error names
/// what is wrong and where: [`CodecError::UnknownFormat`] for a file that
/// does not begin as xz, else where it is damaged or cut short. Reads go
/// in pieces of at most 64 KiB, so a hostile footer that claims a huge
/// index or a long run of padding costs no more memory than that.
pub fn file_info(r: &mut (impl std::io::Read + std::io::Seek), size: u64) -> Result<FileInfo> {
    walk_streams(r, size, None)
}

/// [`file_info`], and each stream with its blocks, in order (`xz -lv`).
pub fn file_streams(
    r: &mut (impl std::io::Read + std::io::Seek),
    size: u64,
) -> Result<(FileInfo, Vec<StreamInfo>)> {
    let mut streams = Vec::new();
    let info = walk_streams(r, size, Some(&mut streams))?;
    // Walked from the end: put in order, then count the offsets of the
    // output from the start.
    streams.reverse();
    let mut out = 0u64;
    for stream in &mut streams {
        stream.uncompressed_offset = out;
        let mut block_out = out;
        for block in &mut stream.blocks {
            block.uncompressed_offset = block_out;
            block_out = block_out.saturating_add(block.uncompressed);
        }
        out = out.saturating_add(stream.uncompressed);
    }
    Ok((info, streams))
}

/// The walk of [`file_info`]; each stream also into `streams`, last
/// first, where given.
fn walk_streams(
    r: &mut (impl std::io::Read + std::io::Seek),
    size: u64,
    mut streams: Option<&mut Vec<StreamInfo>>,
) -> Result<FileInfo> {
    const PIECE: u64 = 64 << 10;
    // xz's limit of sizes (LZMA_VLI_MAX).
    const VLI_MAX: u64 = u64::MAX >> 1;
    let bad = |offset: u64, why: &str| CodecError::corrupt(NAME, offset, why.to_string());
    let mut read_at = |at: u64, len: usize| -> Result<Vec<u8>> {
        let mut b = vec![0; len];
        r.seek(std::io::SeekFrom::Start(at))
            .and_then(|_| r.read_exact(&mut b))
            .map_err(|source| CodecError::Io { offset: at, source })?;
        Ok(b)
    };
    if size < 6 || read_at(0, 6)? != HEADER_MAGIC {
        return Err(CodecError::UnknownFormat);
    }
    let mut info = FileInfo {
        compressed: size,
        ..FileInfo::default()
    };
    let mut end = size;
    // Padding found after the stream to be read next (from the end).
    let mut padding_after = 0u64;
    while end > 0 {
        if end % 4 != 0 {
            return Err(bad(end, "not a whole number of 4-byte words: no xz file"));
        }
        // Stream padding: zero words before the end of a stream, looked
        // at a piece at a time from the end.
        // (The last word first: a stream that ends the file, or one
        // another follows directly, costs no piece.)
        if read_at(end - 4, 4)? == [0; 4] {
            let piece = end.min(PIECE) as usize;
            let b = read_at(end - piece as u64, piece)?;
            let zeros = b.iter().rev().take_while(|&&z| z == 0).count() / 4 * 4;
            end -= zeros as u64;
            info.padding += zeros as u64;
            padding_after += zeros as u64;
            continue;
        }
        let min = (STREAM_HEADER_LEN + STREAM_FOOTER_LEN) as u64;
        if end < min {
            return Err(bad(end, "too short for an xz stream"));
        }
        let footer_at = end - STREAM_FOOTER_LEN as u64;
        let f = read_at(footer_at, STREAM_FOOTER_LEN)?;
        if &f[10..12] != FOOTER_MAGIC {
            return Err(bad(footer_at + 10, "no xz stream footer"));
        }
        if le32(&f, 0) != crc32fast::hash(&f[4..10]) {
            return Err(bad(footer_at, "stream footer CRC32 mismatch"));
        }
        if f[8] != 0 || f[9] & 0xf0 != 0 {
            return Err(bad(footer_at + 8, "unsupported stream flags"));
        }
        let index_len = (u64::from(le32(&f, 4)) + 1) * 4;
        let Some(index_at) = footer_at.checked_sub(index_len) else {
            return Err(bad(footer_at + 4, "index larger than the file"));
        };
        // The index, read in pieces: its records, then its padding and
        // CRC32.
        let mut index = IndexBytes {
            at: index_at,
            end: footer_at - 4,
            piece: Vec::new(),
            used: 0,
            crc: crc32fast::Hasher::new(),
        };
        let damaged = || bad(index_at, "damaged index");
        if index.byte(&mut read_at)? != Some(0) {
            return Err(damaged());
        }
        let count = index.vli(&mut read_at)?.ok_or_else(damaged)?;
        let (mut blocks_len, mut raw) = (0u64, 0u64);
        let mut blocks = Vec::new();
        for _ in 0..count {
            let unpadded = index.vli(&mut read_at)?.ok_or_else(damaged)?;
            let uncompressed = index.vli(&mut read_at)?.ok_or_else(damaged)?;
            if unpadded < 5 {
                return Err(damaged());
            }
            if streams.is_some() {
                blocks.push(BlockInfo {
                    offset: blocks_len,
                    uncompressed_offset: 0,
                    total: unpadded.div_ceil(4) * 4,
                    uncompressed,
                });
            }
            blocks_len = blocks_len
                .checked_add(unpadded.div_ceil(4) * 4)
                .filter(|&n| n <= VLI_MAX)
                .ok_or_else(damaged)?;
            // (Checked as the records are read: a crafted index of many
            // records holds no more of them in memory than fit the file.)
            if blocks_len > index_at {
                return Err(bad(index_at, "blocks larger than the file"));
            }
            raw = raw
                .checked_add(uncompressed)
                .filter(|&n| n <= VLI_MAX)
                .ok_or_else(damaged)?;
        }
        // Zero padding to a multiple of four, then the CRC32.
        while index.left() > 0 {
            if index.left() >= 4 || index.byte(&mut read_at)? != Some(0) {
                return Err(damaged());
            }
        }
        let crc = index.crc.clone().finalize();
        if le32(&read_at(footer_at - 4, 4)?, 0) != crc {
            return Err(damaged());
        }
        let Some(header_at) = index_at
            .checked_sub(blocks_len)
            .and_then(|a| a.checked_sub(STREAM_HEADER_LEN as u64))
        else {
            return Err(bad(index_at, "blocks larger than the file"));
        };
        let h = read_at(header_at, STREAM_HEADER_LEN)?;
        if &h[..6] != HEADER_MAGIC || h[6..8] != f[8..10] {
            return Err(bad(header_at, "no xz stream header where the index says"));
        }
        if le32(&h, 8) != crc32fast::hash(&h[6..8]) {
            return Err(bad(header_at + 8, "stream header CRC32 mismatch"));
        }
        info.streams += 1;
        info.blocks += count;
        info.uncompressed = info
            .uncompressed
            .checked_add(raw)
            .filter(|&n| n <= VLI_MAX)
            .ok_or_else(damaged)?;
        info.checks |= 1 << (f[9] & 0x0f);
        if let Some(streams) = streams.as_mut() {
            let blocks_at = header_at + STREAM_HEADER_LEN as u64;
            for block in &mut blocks {
                block.offset += blocks_at;
            }
            streams.push(StreamInfo {
                offset: header_at,
                uncompressed_offset: 0,
                compressed: end - header_at,
                uncompressed: raw,
                check: u32::from(f[9] & 0x0f),
                padding: std::mem::take(&mut padding_after),
                blocks,
            });
        }
        padding_after = 0;
        end = header_at;
    }
    if info.streams == 0 {
        return Err(bad(0, "no xz stream"));
    }
    Ok(info)
}

/// The bytes of an index before its CRC32 (`at..end` of the file), read
/// a piece at a time, their CRC32 kept as they go.
struct IndexBytes {
    at: u64,
    end: u64,
    piece: Vec<u8>,
    used: usize,
    crc: crc32fast::Hasher,
}

impl IndexBytes {
    /// Bytes not read yet.
    fn left(&self) -> u64 {
        self.end - self.at + (self.piece.len() - self.used) as u64
    }

    /// The next byte, `None` past the end.
    fn byte(
        &mut self,
        read_at: &mut impl FnMut(u64, usize) -> Result<Vec<u8>>,
    ) -> Result<Option<u8>> {
        if self.used == self.piece.len() {
            if self.at == self.end {
                return Ok(None);
            }
            let len = (self.end - self.at).min(64 << 10) as usize;
            self.piece = read_at(self.at, len)?;
            self.crc.update(&self.piece);
            self.at += len as u64;
            self.used = 0;
        }
        self.used += 1;
        Ok(Some(self.piece[self.used - 1]))
    }

    /// The next variable-length integer, `None` if the index ends inside
    /// it or it is not one.
    fn vli(
        &mut self,
        read_at: &mut impl FnMut(u64, usize) -> Result<Vec<u8>>,
    ) -> Result<Option<u64>> {
        let mut v = 0u64;
        for i in 0..VLI_BYTES {
            let Some(byte) = self.byte(read_at)? else {
                return Ok(None);
            };
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok((byte != 0 || i == 0).then_some(v));
            }
        }
        Ok(None)
    }
}

fn put_vli(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Dictionary size of LZMA2 property byte `p` (at most 40).
fn dict_of_prop(p: u8) -> u32 {
    if p >= 40 {
        u32::MAX
    } else {
        (2 | u32::from(p & 1)) << (p / 2 + 11)
    }
}

/// The smallest LZMA2 property byte whose dictionary holds `dict` bytes.
fn prop_of_dict(dict: u32) -> u8 {
    (0..40).find(|&p| dict_of_prop(p) >= dict).unwrap_or(40)
}

/// The check type id of `check` (xz's default, CRC64, for the format's
/// own).
pub fn check_id(check: IntegrityCheck) -> u8 {
    match check {
        IntegrityCheck::None => CHECK_NONE,
        IntegrityCheck::Crc32 => CHECK_CRC32,
        IntegrityCheck::Default | IntegrityCheck::Crc64 => CHECK_CRC64,
        IntegrityCheck::Sha256 => CHECK_SHA256,
    }
}

/// Append the check of type `id` (one of the four xz defines) over `src`.
fn put_check(id: u8, src: &[u8], out: &mut Vec<u8>) {
    match id {
        CHECK_CRC32 => out.extend_from_slice(&crc32fast::hash(src).to_le_bytes()),
        CHECK_CRC64 => out.extend_from_slice(&CRC64.checksum(src).to_le_bytes()),
        CHECK_SHA256 => out.extend_from_slice(&sha2::Sha256::digest(src)),
        _ => {}
    }
}

/// Compresses blocks into self-sizing xz blocks.
pub struct Encoder {
    level: i32,
    extreme: bool,
    /// The check type every block carries.
    check: u8,
    /// A custom filter chain (`xz --x86 --lzma2=...`), in place of the
    /// preset's LZMA2 alone.
    chain: Option<FilterChain>,
}

impl Encoder {
    /// An encoder at xz preset `level` (0-9) for blocks of up to
    /// `block_size` bytes, with CRC64 checks.
    pub fn new(level: i32, block_size: usize) -> Result<Self> {
        Encoder::with(level, block_size, false, CHECK_CRC64, None)
    }

    /// As [`Encoder::new`], at the extreme variant of the preset if
    /// `extreme` (`xz -e`), each block with the check of type `check` (see
    /// [`check_id`]); with `chain`, each block goes through that filter
    /// chain instead of the preset (which it then ignores).
    pub fn with(
        level: i32,
        block_size: usize,
        extreme: bool,
        check: u8,
        chain: Option<FilterChain>,
    ) -> Result<Self> {
        // Fail now, not on the first block, if liblzma refuses the preset
        // or the chain.
        match &chain {
            Some(c) => {
                c.for_xz()?;
                let cap = u32::try_from(block_size.max(4096)).unwrap_or(u32::MAX);
                Stream::new_raw_encoder(&c.build(cap)?)
                    .map_err(|e| CodecError::Invalid(format!("filter chain {c}: {e}")))?;
            }
            None => {
                lzma2_options(level, extreme, block_size)?;
            }
        }
        Ok(Encoder {
            level,
            extreme,
            check,
            chain,
        })
    }

    /// The liblzma chain for a block of `len` bytes, the filter flags of
    /// the block header before LZMA2's, and LZMA2's property byte.
    fn filters_for(&self, len: usize) -> Result<(Filters, Vec<u8>, u8)> {
        let cap = len.max(4096);
        let mut before = Vec::new();
        let (filters, dict) = match &self.chain {
            Some(c) => {
                let dict = c
                    .lzma()
                    .0
                    .dict_size()
                    .min(u32::try_from(cap).unwrap_or(u32::MAX));
                c.header_flags(&mut before);
                (c.build(dict)?, dict)
            }
            None => {
                let mut f = Filters::new();
                f.lzma2(&lzma2_options(self.level, self.extreme, len)?);
                (f, lzma2_block_dict(self.level, len))
            }
        };
        Ok((filters, before, prop_of_dict(dict)))
    }
}

/// The default input block of a chain: three LZMA2 dictionaries, at
/// least 1 MiB, as `xz -T` picks it, at most what one unit holds.
pub fn chain_block_size(chain: &FilterChain) -> usize {
    (3 * chain.lzma().0.dict_size() as usize).clamp(1 << 20, MAX_BLOCK)
}

/// The memory liblzma's threaded encoder counts for `threads` threads
/// compressing blocks of `block` bytes at `level` (or through `chain`):
/// each thread's encoder and buffers.
pub fn encoder_memusage(
    threads: usize,
    level: i32,
    extreme: bool,
    chain: Option<&FilterChain>,
    block: usize,
) -> Result<u64> {
    let mut b = liblzma::stream::MtStreamBuilder::new();
    b.threads(u32::try_from(threads).unwrap_or(u32::MAX))
        .block_size(block as u64);
    match chain {
        Some(c) => {
            // The same options as LZMA2 (a .lzma stream's LZMA1 needs
            // what LZMA2 does).
            let (l, _) = c.lzma();
            let mut f = Filters::new();
            f.lzma2(&l.options(u32::MAX)?);
            b.filters(f);
        }
        None => {
            let extreme = if extreme {
                liblzma::stream::PRESET_EXTREME
            } else {
                0
            };
            b.preset(u32::try_from(level.clamp(0, 9)).unwrap_or(6) | extreme);
        }
    }
    Ok(b.memusage())
}

/// The most threads, up to `threads`, that compress blocks of `block`
/// bytes at `level` (or through `chain`) within `limit` bytes, as xz's
/// `--memlimit-compress` counts them (liblzma's estimate for its threaded
/// encoder: each thread's encoder and buffers); 0 when even one thread
/// needs more.
pub fn threads_within(
    limit: u64,
    level: i32,
    extreme: bool,
    chain: Option<&FilterChain>,
    block: usize,
    threads: usize,
) -> Result<usize> {
    let mut fits = 0;
    for n in 1..=threads.max(1) {
        if encoder_memusage(n, level, extreme, chain, block)? > limit {
            break;
        }
        fits = n;
    }
    Ok(fits)
}

/// Settings scaled down to fit a memory limit one thread of the asked
/// ones is over ([`fit_dictionary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fitted {
    /// The chain to compress with: the asked one (or the preset's LZMA2
    /// or, for `.lzma`, LZMA1) with a smaller dictionary.
    pub chain: FilterChain,
    /// The block size: the one asked for, else three of the new
    /// dictionaries ([`chain_block_size`]).
    pub block: usize,
    /// The dictionary asked for, in bytes.
    pub dict_from: u32,
    /// The dictionary that fits, in bytes.
    pub dict_to: u32,
}

/// As xz adjusts its settings to a `--memlimit-compress` that one thread
/// is over: the dictionary shrinks a MiB at a time (from the asked size
/// rounded down to a MiB) until one thread fits within `limit` bytes; the
/// block, unless `block_given`, is three dictionaries. An error when even
/// a 1 MiB dictionary does not fit (xz: "Memory usage limit is too low
/// for the given filter setup"), naming what one thread needs.
pub fn fit_dictionary(
    limit: u64,
    level: i32,
    extreme: bool,
    chain: Option<&FilterChain>,
    block: usize,
    block_given: bool,
    lzma1: bool,
) -> Result<Fitted> {
    let asked = match chain {
        Some(c) => *c,
        None => {
            let l = super::xz_filters::Lzma::preset(
                u32::try_from(level.clamp(0, 9)).unwrap_or(6),
                extreme,
            );
            let f = match lzma1 {
                true => super::xz_filters::Filter::Lzma1(l),
                false => super::xz_filters::Filter::Lzma2(l),
            };
            FilterChain::new(&[f]).map_err(CodecError::Invalid)?
        }
    };
    let dict_from = asked.lzma().0.dict_size();
    let mut dict = dict_from / (1 << 20) * (1 << 20);
    while dict >= 1 << 20 {
        let chain = asked.with_dict(dict);
        let block = match block_given {
            true => block,
            false => chain_block_size(&chain),
        };
        if encoder_memusage(1, level, extreme, Some(&chain), block)? <= limit {
            return Ok(Fitted {
                chain,
                block,
                dict_from,
                dict_to: dict,
            });
        }
        dict -= 1 << 20;
    }
    // What the asked settings need, or a 1 MiB dictionary where they
    // ask for more.
    let (smallest, block) = match dict_from < 1 << 20 {
        true => (asked, block),
        false => {
            let smallest = asked.with_dict(1 << 20);
            let block = match block_given {
                true => block,
                false => chain_block_size(&smallest),
            };
            (smallest, block)
        }
    };
    Err(CodecError::Invalid(format!(
        "--memlimit-compress={limit}: too low: one thread needs {} MiB even with a {} KiB \
         dictionary",
        encoder_memusage(1, level, extreme, Some(&smallest), block)?.div_ceil(1 << 20),
        smallest.lzma().0.dict_size() >> 10,
    )))
}

/// A block header with both sizes, the filter flags `before` (of
/// `filters - 1` filters, see [`FilterChain::header_flags`]) and an LZMA2
/// filter of property `prop`.
fn block_header(
    compressed: u64,
    uncompressed: u64,
    before: &[u8],
    filters: usize,
    prop: u8,
) -> Vec<u8> {
    let mut h = vec![
        0,
        FLAG_COMPRESSED | FLAG_UNCOMPRESSED | (filters.saturating_sub(1) & 3) as u8,
    ];
    put_vli(&mut h, compressed);
    put_vli(&mut h, uncompressed);
    h.extend_from_slice(before);
    h.extend_from_slice(&[FILTER_LZMA2 as u8, 1, prop]);
    while h.len() % 4 != 0 {
        h.push(0);
    }
    // At most 2 + 9 + 9 + 3 * 6 + 3 rounded up, plus the CRC: 48 bytes.
    h[0] = (h.len() / 4) as u8;
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

impl super::BlockEncoder for Encoder {
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        if src.is_empty() {
            // No block at all: the framer leaves it out of the index, and
            // an empty input becomes a stream of no blocks, as xz writes.
            return Ok(BlockMeta::default());
        }
        let compress_err = |e: liblzma::stream::Error| CodecError::Compress {
            codec: NAME,
            reason: e.to_string(),
        };
        let (filters, before, prop) = self.filters_for(src.len())?;
        let count = self.chain.map_or(1, |c| c.len());
        let mut enc = Stream::new_raw_encoder(&filters).map_err(compress_err)?;
        let start = out.len();
        out.reserve(src.len() + src.len() / 64 + 1024);
        crate::block::lzma_run(&mut enc, src, out, usize::MAX, NAME)?;
        let packed = (out.len() - start) as u64;
        let header = block_header(packed, src.len() as u64, &before, count, prop);
        // The header holds the compressed size, known only now: move the
        // data up behind it (a memmove, cheap next to LZMA2).
        out.splice(start..start, header.iter().copied());
        while (out.len() - start) % 4 != 0 {
            out.push(0);
        }
        let before_check = out.len();
        put_check(self.check, src, out);
        let check_len = (out.len() - before_check) as u64;
        Ok(BlockMeta {
            raw_len: src.len() as u64,
            packed_len: header.len() as u64 + packed + check_len,
            check: 0,
        })
    }
}

/// Writes the stream header, and the index and footer from the blocks.
pub struct Framer {
    /// (unpadded size, uncompressed size) per block.
    records: Vec<(u64, u64)>,
    /// The stream flags: the blocks' check type.
    flags: [u8; 2],
}

impl Default for Framer {
    fn default() -> Self {
        Framer::new(CHECK_CRC64)
    }
}

impl Framer {
    /// A framer for blocks that carry checks of type `check`.
    pub fn new(check: u8) -> Self {
        Framer {
            records: Vec::new(),
            flags: [0, check],
        }
    }
}

impl super::Framer for Framer {
    fn header(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(HEADER_MAGIC);
        out.extend_from_slice(&self.flags);
        out.extend_from_slice(&crc32fast::hash(&self.flags).to_le_bytes());
    }

    fn block(&mut self, meta: &BlockMeta) {
        // An empty input's empty block wrote nothing: no record.
        if meta.packed_len > 0 {
            self.records.push((meta.packed_len, meta.raw_len));
        }
    }

    fn trailer(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let mut index = vec![0u8];
        put_vli(&mut index, self.records.len() as u64);
        for &(unpadded, raw) in &self.records {
            put_vli(&mut index, unpadded);
            put_vli(&mut index, raw);
        }
        while index.len() % 4 != 0 {
            index.push(0);
        }
        let crc = crc32fast::hash(&index);
        index.extend_from_slice(&crc.to_le_bytes());
        let backward = u32::try_from(index.len() / 4 - 1).map_err(|_| {
            CodecError::Invalid(format!(
                "xz: an index of {} blocks is too big for the stream footer",
                self.records.len()
            ))
        })?;
        out.extend_from_slice(&index);
        let mut tail = [0u8; 6];
        tail[..4].copy_from_slice(&backward.to_le_bytes());
        tail[4..].copy_from_slice(&self.flags);
        out.extend_from_slice(&crc32fast::hash(&tail).to_le_bytes());
        out.extend_from_slice(&tail);
        out.extend_from_slice(FOOTER_MAGIC);
        Ok(())
    }
}

/// A parsed block header.
struct BlockHeader {
    /// Bytes of header, CRC included.
    len: usize,
    compressed: Option<u64>,
    uncompressed: Option<u64>,
    /// (filter id, properties), in the header's order (LZMA2 last).
    filters: Vec<(u64, Vec<u8>)>,
}

/// Parse the block header `h` (exactly the length its first byte gives).
/// Errors are (offset in `h`, reason).
fn parse_block_header(h: &[u8]) -> std::result::Result<BlockHeader, (u64, String)> {
    let len = (usize::from(*h.first().unwrap_or(&0)) + 1) * 4;
    if h.len() != len || h[0] == 0 {
        return Err((0, "bad block header length".into()));
    }
    let body = &h[..len - 4];
    let stored = le32(h, len - 4);
    let got = crc32fast::hash(body);
    if stored != got {
        return Err((
            (len - 4) as u64,
            format!("block header CRC32 mismatch: stored {stored:08x}, computed {got:08x}"),
        ));
    }
    let flags = h[1];
    if flags & 0x3c != 0 {
        return Err((1, format!("reserved block flags set ({flags:#04x})")));
    }
    let mut pos = 2;
    let field = |pos: &mut usize, what: &str| {
        let at = *pos as u64;
        vli(body, pos).map_err(|e| match e {
            VliError::Short => (at, format!("block header too short for its {what}")),
            VliError::Bad => (at, format!("invalid {what} field")),
        })
    };
    let compressed = if flags & FLAG_COMPRESSED != 0 {
        let at = pos as u64;
        let c = field(&mut pos, "compressed size")?;
        if c == 0 {
            return Err((at, "compressed size of zero".into()));
        }
        Some(c)
    } else {
        None
    };
    let uncompressed = if flags & FLAG_UNCOMPRESSED != 0 {
        Some(field(&mut pos, "uncompressed size")?)
    } else {
        None
    };
    let mut filters = Vec::new();
    for _ in 0..=(flags & 3) {
        let id = field(&mut pos, "filter id")?;
        let at = pos as u64;
        let size = field(&mut pos, "filter properties size")?;
        let props = usize::try_from(size)
            .ok()
            .and_then(|n| body.get(pos..pos.checked_add(n)?))
            .ok_or_else(|| (at, "filter properties overrun the block header".to_string()))?;
        pos += props.len();
        filters.push((id, props.to_vec()));
    }
    if let Some(z) = body[pos..].iter().position(|&b| b != 0) {
        return Err(((pos + z) as u64, "non-zero block header padding".into()));
    }
    Ok(BlockHeader {
        len,
        compressed,
        uncompressed,
        filters,
    })
}

/// The dictionary an LZMA2 filter with properties `props` decodes in:
/// the one it declares, capped at the block's size when it states one.
fn lzma2_dict(props: &[u8], max_out: Option<u64>) -> std::result::Result<u32, String> {
    let [p] = props[..] else {
        return Err(format!("LZMA2 properties of {} bytes", props.len()));
    };
    if p > 40 {
        return Err(format!("invalid LZMA2 dictionary property {p}"));
    }
    let dict = dict_of_prop(p);
    Ok(match max_out {
        Some(max) => dict.min(u32::try_from(max.max(4096)).unwrap_or(u32::MAX)),
        None => dict,
    })
}

/// The dictionary a block's filter chain decodes in (what its memory
/// grows with; the other filters keep a few KiB), 0 without LZMA2.
fn block_dict(chain: &[(u64, Vec<u8>)], max_out: Option<u64>) -> std::result::Result<u64, String> {
    let mut dict = 0;
    for (id, props) in chain {
        if *id == FILTER_LZMA2 {
            dict = u64::from(lzma2_dict(props, max_out)?);
        }
    }
    Ok(dict)
}

/// A raw decoder for a block's filter chain. `max_out`, when the block
/// states its size, caps the LZMA2 dictionary: no match reaches further
/// back than the block's start, so a bigger one is wasted memory.
fn raw_decoder(
    chain: &[(u64, Vec<u8>)],
    max_out: Option<u64>,
) -> std::result::Result<Stream, String> {
    let mut f = Filters::new();
    for (id, props) in chain {
        let r = match *id {
            0x03 => f.delta_properties(props).map(drop),
            0x04 => f.x86_properties(props).map(drop),
            0x05 => f.powerpc_properties(props).map(drop),
            0x06 => f.ia64_properties(props).map(drop),
            0x07 => f.arm_properties(props).map(drop),
            0x08 => f.arm_thumb_properties(props).map(drop),
            0x09 => f.sparc_properties(props).map(drop),
            0x0a => f.arm64_properties(props).map(drop),
            0x0b => f.riscv_properties(props).map(drop),
            FILTER_LZMA2 => {
                let mut opts = LzmaOptions::new_preset(0).map_err(|e| e.to_string())?;
                opts.dict_size(lzma2_dict(props, max_out)?);
                f.lzma2(&opts);
                Ok(())
            }
            other => return Err(format!("unsupported filter {other:#x}")),
        };
        r.map_err(|e| format!("filter {id:#x}: {e}"))?;
    }
    Stream::new_raw_decoder(&f).map_err(|e| format!("filter chain: {e}"))
}

/// Zero bytes to pad `n` to a multiple of four.
fn pad4(n: u64) -> usize {
    ((4 - n % 4) % 4) as usize
}

/// A block being decoded by the splitter.
struct Streaming {
    dec: Stream,
    check: Check,
    /// Offset of the block header.
    offset: u64,
    header_len: u64,
    compressed: Option<u64>,
    uncompressed: Option<u64>,
}

/// Where the splitter is.
enum State {
    /// Before a stream header (or, after a stream, its padding or the end).
    Start,
    /// Inside a stream, before a block header or the index.
    Blocks,
    /// Inside a block decoded here.
    Block(Box<Streaming>),
}

/// Walks xz streams block by block.
pub struct Splitter {
    input: Input,
    state: State,
    streams: u64,
    /// Stream flags of the current stream.
    flags: [u8; 2],
    /// (unpadded size, uncompressed size) of the current stream's blocks.
    records: Vec<(u64, u64)>,
    /// Largest LZMA2 dictionary a block may need ([`crate::DecodeOptions::memory`]).
    budget: Option<u64>,
    /// Stop after the first stream (`xz --single-stream`).
    single_stream: bool,
    /// Verify no block check (`xz --ignore-check`).
    ignore_check: bool,
    /// An error met after part of a block was decoded.
    deferred: super::Deferred,
}

/// In a packed unit's kind, beside the check type: do not verify it.
const IGNORE_CHECK: u32 = 0x100;

impl Splitter {
    /// A splitter over `input`.
    pub fn new(input: Input) -> Self {
        Splitter {
            input,
            state: State::Start,
            streams: 0,
            flags: [0; 2],
            records: Vec::new(),
            budget: None,
            single_stream: false,
            ignore_check: false,
            deferred: super::Deferred::default(),
        }
    }

    /// Decode the first stream only, and ignore whatever follows it
    /// (`xz --single-stream`).
    pub fn single_stream(mut self, single: bool) -> Self {
        self.single_stream = single;
        self
    }

    /// Verify no block's check (`xz --ignore-check`); the index and the
    /// headers' CRC32s still are.
    pub fn ignore_check(mut self, ignore: bool) -> Self {
        self.ignore_check = ignore;
        self
    }

    /// Refuse a block whose dictionary is over `budget` bytes (`None`:
    /// the default share of the memory this process may use), as
    /// `xz --memlimit-decompress` refuses one.
    pub fn with_memory(mut self, budget: Option<u64>) -> Self {
        self.budget = crate::memlimit::budget(budget);
        self
    }

    /// Skip stream padding after a stream; `false` at a clean end.
    fn skip_padding(&mut self) -> Result<bool> {
        let start = self.input.offset();
        loop {
            let avail = self.input.fill(1)?;
            if avail == 0 {
                break;
            }
            let zeros = self.input.peek().iter().take_while(|&&b| b == 0).count();
            self.input.consume(zeros);
            if zeros < avail {
                break;
            }
        }
        let len = self.input.offset() - start;
        if len % 4 != 0 {
            return Err(CodecError::corrupt(
                NAME,
                start,
                format!("stream padding of {len} bytes is not a multiple of four"),
            ));
        }
        Ok(!self.input.at_end()?)
    }

    fn stream_header(&mut self) -> Result<()> {
        let off = self.input.offset();
        let avail = self.input.fill(STREAM_HEADER_LEN)?;
        let b = self.input.peek();
        let m = avail.min(HEADER_MAGIC.len());
        if b[..m] != HEADER_MAGIC[..m] {
            return Err(if self.streams > 0 {
                CodecError::TrailingGarbage {
                    format: NAME,
                    offset: off,
                }
            } else {
                CodecError::corrupt(NAME, off, "not an xz stream (bad magic)")
            });
        }
        let b = self.input.need(STREAM_HEADER_LEN, NAME)?;
        let flags = [b[6], b[7]];
        let (stored, got) = (le32(b, 8), crc32fast::hash(&flags));
        if stored != got {
            return Err(CodecError::corrupt(
                NAME,
                off + 8,
                format!("stream header CRC32 mismatch: stored {stored:08x}, computed {got:08x}"),
            ));
        }
        if flags[0] != 0 || flags[1] & 0xf0 != 0 {
            return Err(CodecError::corrupt(
                NAME,
                off + 6,
                format!("unsupported stream flags {:02x}{:02x}", flags[0], flags[1]),
            ));
        }
        if Check::new(flags[1]).is_none() {
            return Err(CodecError::corrupt(
                NAME,
                off + 7,
                format!("unsupported check type {:#x}", flags[1]),
            ));
        }
        self.input.consume(STREAM_HEADER_LEN);
        self.flags = flags;
        self.streams += 1;
        self.records.clear();
        self.state = State::Blocks;
        Ok(())
    }

    fn check_id(&self) -> u8 {
        self.flags[1]
    }

    /// Read one index integer, feeding the index CRC.
    fn index_vli(&mut self, crc: &mut crc32fast::Hasher, what: &str) -> Result<u64> {
        let off = self.input.offset();
        let avail = self.input.fill(VLI_BYTES)?;
        let b = self.input.peek();
        let mut pos = 0;
        match vli(b, &mut pos) {
            Ok(v) => {
                crc.update(&b[..pos]);
                self.input.consume(pos);
                Ok(v)
            }
            Err(VliError::Short) => Err(CodecError::Truncated {
                format: NAME,
                offset: off + avail as u64,
            }),
            Err(VliError::Bad) => Err(CodecError::corrupt(
                NAME,
                off,
                format!("invalid {what} in the index"),
            )),
        }
    }

    /// Parse the index (its indicator byte is next) and the stream footer.
    fn index_and_footer(&mut self) -> Result<()> {
        let start = self.input.offset();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&[0]);
        self.input.consume(1);
        let count = self.index_vli(&mut crc, "record count")?;
        if count != self.records.len() as u64 {
            return Err(CodecError::corrupt(
                NAME,
                start + 1,
                format!(
                    "index lists {count} blocks, the stream has {}",
                    self.records.len()
                ),
            ));
        }
        for i in 0..self.records.len() {
            let at = self.input.offset();
            let unpadded = self.index_vli(&mut crc, "unpadded size")?;
            let raw = self.index_vli(&mut crc, "uncompressed size")?;
            let (want_unpadded, want_raw) = self.records[i];
            if (unpadded, raw) != (want_unpadded, want_raw) {
                return Err(CodecError::corrupt(
                    NAME,
                    at,
                    format!(
                        "index record {i} ({unpadded}, {raw} bytes) does not match the \
                         block ({want_unpadded}, {want_raw} bytes)"
                    ),
                ));
            }
        }
        let pad_at = self.input.offset();
        let pad = pad4(pad_at - start);
        let b = self.input.need(pad + 4, NAME)?;
        if b[..pad].iter().any(|&z| z != 0) {
            return Err(CodecError::corrupt(NAME, pad_at, "non-zero index padding"));
        }
        crc.update(&b[..pad]);
        let (stored, got) = (le32(b, pad), crc.finalize());
        if stored != got {
            return Err(CodecError::corrupt(
                NAME,
                pad_at + pad as u64,
                format!("index CRC32 mismatch: stored {stored:08x}, computed {got:08x}"),
            ));
        }
        self.input.consume(pad + 4);
        let index_len = self.input.offset() - start;

        let off = self.input.offset();
        let b = self.input.need(STREAM_FOOTER_LEN, NAME)?;
        let (stored, got) = (le32(b, 0), crc32fast::hash(&b[4..10]));
        if stored != got {
            return Err(CodecError::corrupt(
                NAME,
                off,
                format!("stream footer CRC32 mismatch: stored {stored:08x}, computed {got:08x}"),
            ));
        }
        let backward = (u64::from(le32(b, 4)) + 1) * 4;
        if backward != index_len {
            return Err(CodecError::corrupt(
                NAME,
                off + 4,
                format!("stream footer gives an index of {backward} bytes, it has {index_len}"),
            ));
        }
        if b[8..10] != self.flags {
            return Err(CodecError::corrupt(
                NAME,
                off + 8,
                "stream footer flags differ from the stream header",
            ));
        }
        if &b[10..12] != FOOTER_MAGIC {
            return Err(CodecError::corrupt(
                NAME,
                off + 10,
                "bad stream footer magic",
            ));
        }
        self.input.consume(STREAM_FOOTER_LEN);
        self.state = State::Start;
        Ok(())
    }

    /// Parse the block header next in the input; fill `unit` with the
    /// whole block when it can go to a worker, else start decoding it here.
    /// `true` when `unit` was filled.
    fn block(&mut self, unit: &mut Unit) -> Result<bool> {
        let off = self.input.offset();
        let len = (usize::from(self.input.need(1, NAME)?[0]) + 1) * 4;
        let h = self.input.need(len, NAME)?;
        let bh =
            parse_block_header(h).map_err(|(at, why)| CodecError::corrupt(NAME, off + at, why))?;
        if let Some(limit) = self.budget {
            let need = block_dict(&bh.filters, bh.uncompressed)
                .map_err(|why| CodecError::corrupt(NAME, off, why))?;
            if need > limit {
                return Err(CodecError::TooLarge {
                    format: NAME,
                    what: "block's LZMA2 dictionary (unpack -M SIZE raises the limit)",
                    offset: off,
                    size: need,
                    limit,
                });
            }
        }
        let check = self.check_id();
        let check_len = check_size(check) as u64;
        let header_len = bh.len as u64;
        if let (Some(c), Some(u)) = (bh.compressed, bh.uncompressed) {
            let unpadded = header_len + c + check_len;
            let total = c.saturating_add(header_len + check_len + pad4(header_len + c) as u64);
            if total <= MAX_UNIT as u64 && u <= MAX_UNIT as u64 {
                unit.offset = off;
                unit.raw_len = u as usize;
                let ignore = if self.ignore_check { IGNORE_CHECK } else { 0 };
                unit.kind = UnitKind::Packed(u32::from(check) | ignore);
                if let Err(e) = self.input.take(total as usize, &mut unit.data, NAME) {
                    // Cut short: what its data decodes to goes out, as xz
                    // writes it, then the error.
                    let mut out = Vec::new();
                    block_prefix(&unit.data, unit.raw_len, &mut out);
                    unit.data = out;
                    unit.kind = UnitKind::Plain;
                    unit.raw_len = 0;
                    self.deferred.hold(Err(e), unit)?;
                    return Ok(true);
                }
                self.records.push((unpadded, u));
                return Ok(true);
            }
        }
        let dec = raw_decoder(&bh.filters, bh.uncompressed)
            .map_err(|why| CodecError::corrupt(NAME, off, why))?;
        let verified = if self.ignore_check { CHECK_NONE } else { check };
        let check = Check::new(verified).ok_or_else(|| {
            CodecError::corrupt(NAME, off, format!("unsupported check type {check:#x}"))
        })?;
        self.input.consume(bh.len);
        self.state = State::Block(Box::new(Streaming {
            dec,
            check,
            offset: off,
            header_len,
            compressed: bh.compressed,
            uncompressed: bh.uncompressed,
        }));
        Ok(false)
    }

    /// Decode up to [`PLAIN_UNIT`] bytes of the block in progress into
    /// `unit`; at the block's end, check it and go back to `Blocks`.
    /// `unit` holds only decoded bytes when this fails.
    fn stream_some(&mut self, unit: &mut Unit) -> Result<()> {
        let State::Block(st) = &mut self.state else {
            return Ok(());
        };
        unit.kind = UnitKind::Plain;
        unit.offset = self.input.offset();
        let mut len = 0;
        unit.data.resize(PLAIN_UNIT, 0);
        let ended = loop {
            let in_left = st
                .compressed
                .map_or(u64::MAX, |c| c.saturating_sub(st.dec.total_in()));
            let avail = if in_left > 0 {
                let avail = match self.input.fill(1) {
                    Ok(avail) => avail,
                    Err(e) => {
                        unit.data.truncate(len);
                        return Err(e);
                    }
                };
                if avail == 0 {
                    unit.data.truncate(len);
                    return Err(CodecError::Truncated {
                        format: NAME,
                        offset: self.input.offset(),
                    });
                }
                avail.min(usize::try_from(in_left).unwrap_or(usize::MAX))
            } else {
                0
            };
            // Room for one byte more than the block says, to catch excess.
            let out_left = st.uncompressed.map_or(u64::MAX, |u| {
                u.saturating_sub(st.dec.total_out()).saturating_add(1)
            });
            let room = (PLAIN_UNIT - len).min(usize::try_from(out_left).unwrap_or(usize::MAX));
            let (in0, out0) = (st.dec.total_in(), st.dec.total_out());
            let status = match st.dec.process(
                &self.input.peek()[..avail],
                &mut unit.data[len..len + room],
                Action::Run,
            ) {
                Ok(status) => status,
                Err(e) => {
                    // What liblzma wrote before it met the damage is the
                    // block's, as xz writes it.
                    let made = (st.dec.total_out() - out0) as usize;
                    unit.data.truncate(len + made.min(room));
                    return Err(CodecError::corrupt(
                        NAME,
                        self.input.offset(),
                        e.to_string(),
                    ));
                }
            };
            let used = (st.dec.total_in() - in0) as usize;
            let made = (st.dec.total_out() - out0) as usize;
            self.input.consume(used);
            st.check.update(&unit.data[len..len + made]);
            len += made;
            if let Some(u) = st.uncompressed.filter(|&u| st.dec.total_out() > u) {
                // Not the byte past the stated size.
                let excess = (st.dec.total_out() - u) as usize;
                unit.data.truncate(len - excess.min(len));
                return Err(CodecError::corrupt(
                    NAME,
                    st.offset,
                    "block decodes to more than its header says",
                ));
            }
            if status == Status::StreamEnd {
                break true;
            }
            if len == PLAIN_UNIT {
                break false;
            }
            if used == 0 && made == 0 {
                unit.data.truncate(len);
                let why = if avail == 0 {
                    "block data runs past the compressed size in its header"
                } else {
                    "the decoder made no progress"
                };
                return Err(CodecError::corrupt(NAME, self.input.offset(), why));
            }
        };
        unit.data.truncate(len);
        if ended {
            self.end_block()?;
        }
        Ok(())
    }

    /// After the block's data: sizes, padding and check.
    fn end_block(&mut self) -> Result<()> {
        let State::Block(st) = std::mem::replace(&mut self.state, State::Blocks) else {
            return Ok(());
        };
        let st = *st;
        let (comp, raw) = (st.dec.total_in(), st.dec.total_out());
        if st.compressed.is_some_and(|c| c != comp) {
            return Err(CodecError::corrupt(
                NAME,
                st.offset,
                format!("block data ends after {comp} bytes, its header says more"),
            ));
        }
        if st.uncompressed.is_some_and(|u| u != raw) {
            return Err(CodecError::corrupt(
                NAME,
                st.offset,
                format!("block decodes to {raw} bytes, fewer than its header says"),
            ));
        }
        let off = self.input.offset();
        let pad = pad4(st.header_len + comp);
        let check_len = check_size(self.check_id());
        let b = self.input.need(pad + check_len, NAME)?;
        if b[..pad].iter().any(|&z| z != 0) {
            return Err(CodecError::corrupt(NAME, off, "non-zero block padding"));
        }
        st.check
            .verify(&b[pad..])
            .map_err(|why| CodecError::corrupt(NAME, off + pad as u64, why))?;
        self.input.consume(pad + check_len);
        let unpadded = st
            .header_len
            .checked_add(comp)
            .and_then(|n| n.checked_add(check_len as u64))
            .ok_or_else(|| CodecError::corrupt(NAME, st.offset, "block too large"))?;
        self.records.push((unpadded, raw));
        Ok(())
    }
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        self.deferred.take()?;
        loop {
            match self.state {
                State::Start => {
                    if self.streams > 0 && self.single_stream {
                        return Ok(false);
                    }
                    if self.streams == 0 {
                        if self.input.at_end()? {
                            return Err(CodecError::Truncated {
                                format: NAME,
                                offset: 0,
                            });
                        }
                    } else if !self.skip_padding()? {
                        return Ok(false);
                    }
                    self.stream_header()?;
                }
                State::Blocks => {
                    if self.input.need(1, NAME)?[0] == 0 {
                        self.index_and_footer()?;
                    } else if self.block(unit)? {
                        return Ok(true);
                    }
                }
                State::Block(_) => {
                    let step = self.stream_some(unit);
                    self.deferred.hold(step, unit)?;
                    if !unit.data.is_empty() {
                        return Ok(true);
                    }
                }
            }
        }
    }

    fn offset(&self) -> u64 {
        self.input.offset()
    }
}

/// Decodes whole self-sizing blocks on a worker.
pub struct Decoder;

impl Decoder {
    /// Decode one whole block (header to check) of check type `check`;
    /// errors carry offsets within the block.
    fn block(data: &[u8], kind: u32, raw_len: usize, out: &mut Vec<u8>) -> Result<()> {
        let check = u8::try_from(kind & 0xff).unwrap_or(u8::MAX);
        let len = (usize::from(*data.first().unwrap_or(&0)) + 1) * 4;
        let h = data.get(..len).ok_or(CodecError::Truncated {
            format: NAME,
            offset: data.len() as u64,
        })?;
        let bh = parse_block_header(h).map_err(|(at, why)| CodecError::corrupt(NAME, at, why))?;
        let (Some(comp), Some(raw)) = (bh.compressed, bh.uncompressed) else {
            return Err(CodecError::corrupt(NAME, 0, "block header lacks its sizes"));
        };
        if raw != raw_len as u64 {
            return Err(CodecError::corrupt(NAME, 0, "block size changed under us"));
        }
        let body_end = usize::try_from(comp)
            .ok()
            .and_then(|c| c.checked_add(len))
            .filter(|&e| e <= data.len())
            .ok_or(CodecError::Truncated {
                format: NAME,
                offset: data.len() as u64,
            })?;
        let body = &data[len..body_end];
        let pad_end = body_end + pad4(body_end as u64);
        let check_len = check_size(check);
        if pad_end + check_len != data.len() {
            return Err(CodecError::corrupt(
                NAME,
                body_end as u64,
                "block length does not match its header",
            ));
        }
        if data[body_end..pad_end].iter().any(|&z| z != 0) {
            return Err(CodecError::corrupt(
                NAME,
                body_end as u64,
                "non-zero block padding",
            ));
        }
        let verified = if kind & IGNORE_CHECK != 0 {
            CHECK_NONE
        } else {
            check
        };
        let mut hash = Check::new(verified).ok_or_else(|| {
            CodecError::corrupt(NAME, 0, format!("unsupported check type {check:#x}"))
        })?;
        let mut dec =
            raw_decoder(&bh.filters, Some(raw)).map_err(|why| CodecError::corrupt(NAME, 0, why))?;

        let start = out.len();
        // One byte of room past the stated size, to catch excess output.
        out.resize(start + raw_len + 1, 0);
        let (mut ip, mut op) = (0, 0);
        let result = loop {
            let (in0, out0) = (dec.total_in(), dec.total_out());
            let status = match dec.process(&body[ip..], &mut out[start + op..], Action::Finish) {
                Ok(s) => s,
                Err(e) => break Err(CodecError::corrupt(NAME, (len + ip) as u64, e.to_string())),
            };
            let used = (dec.total_in() - in0) as usize;
            let made = (dec.total_out() - out0) as usize;
            ip += used;
            op += made;
            if status == Status::StreamEnd {
                break Ok(());
            }
            if used == 0 && made == 0 {
                let why = if op > raw_len {
                    "block decodes to more than its header says"
                } else {
                    "block data ends before its LZMA2 end mark"
                };
                break Err(CodecError::corrupt(NAME, (len + ip) as u64, why));
            }
        };
        let result = result.and_then(|()| {
            if ip != body.len() {
                Err(CodecError::corrupt(
                    NAME,
                    (len + ip) as u64,
                    "LZMA2 end mark before the compressed size in the block header",
                ))
            } else if op != raw_len {
                Err(CodecError::corrupt(
                    NAME,
                    0,
                    format!("block decodes to {op} bytes, its header says {raw_len}"),
                ))
            } else {
                hash.update(&out[start..start + op]);
                hash.verify(&data[pad_end..])
                    .map_err(|why| CodecError::corrupt(NAME, pad_end as u64, why))
            }
        });
        match result {
            Ok(()) => {
                out.truncate(start + raw_len);
                Ok(())
            }
            Err(e) => {
                out.truncate(start);
                Err(e)
            }
        }
    }
}

/// Append to `out` what the block at the start of `block` (its header
/// whole, its data perhaps cut or damaged) decodes to, at most `room`
/// bytes: what `xz -d` writes of the block before its error.
fn block_prefix(block: &[u8], room: usize, out: &mut Vec<u8>) {
    let len = (usize::from(*block.first().unwrap_or(&0)) + 1) * 4;
    let Some(Ok(bh)) = block.get(..len).map(parse_block_header) else {
        return;
    };
    let Ok(mut dec) = raw_decoder(&bh.filters, bh.uncompressed) else {
        return;
    };
    // The data as far as the header's compressed size, not the padding
    // and check after it (xz stops there too).
    let body = &block[len..];
    let body = bh
        .compressed
        .and_then(|c| usize::try_from(c).ok())
        .map_or(body, |c| &body[..c.min(body.len())]);
    let start = out.len();
    out.resize(start + room, 0);
    // One call: liblzma runs until the input or the room is used up, or
    // the data is refused; what it wrote before is the block's.
    let _ = dec.process(body, &mut out[start..], Action::Run);
    let made = usize::try_from(dec.total_out()).unwrap_or(usize::MAX);
    out.truncate(start + made.min(room));
}

impl super::UnitDecoder for Decoder {
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()> {
        let UnitKind::Packed(check) = unit.kind else {
            pass_plain(unit, out);
            return Ok(());
        };
        Decoder::block(&unit.data, check, unit.raw_len, out).map_err(|e| at_offset(e, unit.offset))
    }

    fn salvage(&mut self, unit: &Unit, out: &mut Vec<u8>) {
        if let UnitKind::Packed(_) = unit.kind {
            block_prefix(&unit.data, unit.raw_len, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::sample;
    use super::super::{decode_all, encode_all, Format, Splitter as _, UnitDecoder as _};
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    /// Is `xz` here? Under CI it must be; elsewhere its tests are skipped.
    fn have_xz() -> bool {
        match Command::new("xz").arg("--version").output() {
            Ok(o) if o.status.success() => true,
            _ => {
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "xz is not installed, and CI=true needs it"
                );
                eprintln!("skipping: xz not installed");
                false
            }
        }
    }

    /// Run `xz args` with `input` on stdin: (success, stdout, stderr).
    fn xz(args: &[&str], input: &[u8]) -> (bool, Vec<u8>, String) {
        let mut child = Command::new("xz")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let data = input.to_vec();
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
        let out = child.wait_with_output().unwrap();
        feeder.join().unwrap();
        (
            out.status.success(),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Compress with `xz args` (stdin to stdout).
    fn xz_pack(args: &[&str], data: &[u8]) -> Vec<u8> {
        let mut all = vec!["-c"];
        all.extend_from_slice(args);
        let (ok, out, err) = xz(&all, data);
        assert!(ok, "xz {args:?}: {err}");
        out
    }

    /// `xz --robot -lvv` of `packed` (--list wants a file).
    fn xz_list(packed: &[u8], tag: &str) -> String {
        let path =
            std::env::temp_dir().join(format!("cairn-xz-test-{}-{tag}.xz", std::process::id()));
        std::fs::write(&path, packed).unwrap();
        let out = Command::new("xz")
            .args(["--robot", "-lvv"])
            .arg(&path)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(
            out.status.success(),
            "xz -l: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Split `packed` and decode unit by unit: the output and the kinds.
    fn split(packed: &[u8]) -> Result<(Vec<u8>, Vec<UnitKind>)> {
        let input = Input::new(Box::new(std::io::Cursor::new(packed.to_vec())));
        let mut splitter = Splitter::new(input);
        let mut dec = Decoder;
        let (mut out, mut kinds) = (Vec::new(), Vec::new());
        let mut unit = Unit::default();
        loop {
            unit.clear();
            if !splitter.next_unit(&mut unit)? {
                break;
            }
            kinds.push(unit.kind);
            dec.decode(&mut unit, &mut out)?;
        }
        assert_eq!(splitter.offset(), packed.len() as u64);
        Ok((out, kinds))
    }

    fn packed_units(kinds: &[UnitKind]) -> usize {
        kinds
            .iter()
            .filter(|k| matches!(k, UnitKind::Packed(_)))
            .count()
    }

    #[test]
    fn a_block_needs_its_dictionary_capped_at_its_size() {
        let lzma2 = |p: u8| vec![(FILTER_LZMA2, vec![p])];
        // Property 28 is xz -9's 64 MiB; 40 is 4 GiB - 1.
        assert_eq!(block_dict(&lzma2(28), None), Ok(64 << 20));
        assert_eq!(block_dict(&lzma2(28), Some(1 << 20)), Ok(1 << 20));
        assert_eq!(block_dict(&lzma2(28), Some(10)), Ok(4096));
        assert_eq!(block_dict(&lzma2(40), None), Ok(u64::from(u32::MAX)));
        assert!(block_dict(&lzma2(41), None).is_err());
        assert_eq!(block_dict(&[(0x03, vec![0])], None), Ok(0));
    }

    #[test]
    fn round_trip_sizes_and_levels() {
        let block = 4000;
        for level in [0, 6, 9] {
            for n in [0, 1, block - 1, block, block + 1, 5 * block + 7] {
                let data = sample(n, n as u32 + 1);
                let packed = encode_all(Format::Xz, level, block, &data).unwrap();
                assert_eq!(Format::detect(&packed), Some(Format::Xz));
                assert_eq!(decode_all(&packed).unwrap(), data, "level {level} n={n}");
                let (out, kinds) = split(&packed).unwrap();
                assert_eq!(out, data);
                assert_eq!(packed_units(&kinds), n.div_ceil(block), "n={n}");
            }
        }
    }

    #[test]
    fn empty_input_is_a_stream_without_blocks() {
        let packed = encode_all(Format::Xz, 6, 1000, &[]).unwrap();
        // Header, an index of no records, footer: what `xz` writes.
        assert_eq!(packed.len(), 12 + 8 + 12);
        let (out, kinds) = split(&packed).unwrap();
        assert!(out.is_empty() && kinds.is_empty());
        if have_xz() {
            let (ok, out, err) = xz(&["-dc"], &packed);
            assert!(ok && out.is_empty(), "{err}");
            assert_eq!(packed, xz_pack(&["-6"], &[]));
        }
    }

    #[test]
    fn file_info_reads_streams_from_their_indexes() {
        use crate::format::{encode_all, Format};
        let data = crate::testutil::noise(300_000, 5);
        let one = encode_all(Format::Xz, 1, 100_000, &data).unwrap();
        let info = |b: &[u8]| file_info(&mut std::io::Cursor::new(b), b.len() as u64);
        let i = info(&one).unwrap();
        assert_eq!((i.streams, i.blocks, i.uncompressed), (1, 3, 300_000));
        assert_eq!(
            (i.compressed, i.checks, i.padding),
            (one.len() as u64, 1 << 4, 0)
        );
        // Two streams with padding between and after.
        let two = [&one[..], &[0; 4], &one, &[0; 8]].concat();
        let i = info(&two).unwrap();
        assert_eq!(
            (i.streams, i.blocks, i.uncompressed, i.padding),
            (2, 6, 600_000, 12)
        );
        // Not xz; cut short; damaged index; a padding that is not whole.
        assert!(matches!(
            info(b"plain text here"),
            Err(CodecError::UnknownFormat)
        ));
        assert!(info(&one[..one.len() - 4]).is_err());
        let mut bad = one.clone();
        let at = bad.len() - 14;
        bad[at] ^= 1;
        assert!(info(&bad).is_err());
        assert!(info(&[&one[..], &[0; 2]].concat()).is_err());
        // Padding of many pieces is counted; reserved stream flags are
        // damage.
        let padded = [&one[..], &vec![0; 1 << 20]].concat();
        assert_eq!(info(&padded).unwrap().padding, 1 << 20);
        let mut flags = one.clone();
        let n = flags.len();
        flags[n - 4] = 1;
        let crc = crc32fast::hash(&flags[n - 8..n - 2]);
        flags[n - 12..n - 8].copy_from_slice(&crc.to_le_bytes());
        assert!(info(&flags).is_err());
    }

    #[test]
    fn a_dictionary_is_fitted_to_a_memory_limit_as_xz_fits_it() {
        let limit = 100 << 20;
        assert_eq!(
            threads_within(limit, 9, false, None, block_size(9), 2).unwrap(),
            0
        );
        let f = fit_dictionary(limit, 9, false, None, block_size(9), false, false).unwrap();
        assert_eq!(f.dict_from, 64 << 20);
        assert!(f.dict_to >= 1 << 20 && f.dict_to < 64 << 20 && f.dict_to % (1 << 20) == 0);
        assert_eq!(f.chain.lzma().0.dict_size(), f.dict_to);
        assert_eq!(f.block, chain_block_size(&f.chain));
        assert!(encoder_memusage(1, 9, false, Some(&f.chain), f.block).unwrap() <= limit);
        // A MiB more would not fit.
        let bigger = f.chain.with_dict(f.dict_to + (1 << 20));
        let block = chain_block_size(&bigger);
        assert!(encoder_memusage(1, 9, false, Some(&bigger), block).unwrap() > limit);
        // A block given stays; .lzma keeps LZMA1.
        let f = fit_dictionary(limit, 9, false, None, 1 << 20, true, true).unwrap();
        assert_eq!((f.block, f.chain.lzma().1), (1 << 20, false));
        // Too low for any dictionary.
        let e = fit_dictionary(3 << 20, 9, false, None, block_size(9), false, false).unwrap_err();
        assert!(
            e.to_string().contains("even with a 1024 KiB dictionary"),
            "{e}"
        );
    }

    #[test]
    fn default_block_sizes() {
        assert_eq!(block_size(0), 1 << 20);
        assert_eq!(block_size(1), 3 << 20);
        assert_eq!(block_size(6), 24 << 20);
        assert_eq!(block_size(7), 48 << 20);
        assert_eq!(block_size(9), 63 << 20);
        let worst = MAX_BLOCK + 3 * MAX_BLOCK.div_ceil(64 << 10) + 1 + 28 + 3 + 8;
        assert!(worst <= MAX_UNIT);
    }

    #[test]
    fn dictionary_properties() {
        assert_eq!(prop_of_dict(1), 0);
        assert_eq!(prop_of_dict(4096), 0);
        assert_eq!(prop_of_dict(4097), 1);
        assert_eq!(prop_of_dict(1 << 20), 16);
        assert_eq!(prop_of_dict((1 << 20) + 1), 17);
        assert_eq!(prop_of_dict(3 << 19), 17);
        assert_eq!(prop_of_dict(64 << 20), 28);
        assert_eq!(prop_of_dict(u32::MAX - 1), 40);
        assert_eq!(dict_of_prop(40), u32::MAX);
        for p in 0..40 {
            assert_eq!(prop_of_dict(dict_of_prop(p)), p);
        }
    }

    #[test]
    fn variable_length_integers() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX / 2] {
            let mut b = Vec::new();
            put_vli(&mut b, v);
            let mut pos = 0;
            assert!(matches!(vli(&b, &mut pos), Ok(x) if x == v));
            assert_eq!(pos, b.len());
            if b.len() > 1 {
                let mut pos = 0;
                assert!(matches!(
                    vli(&b[..b.len() - 1], &mut pos),
                    Err(VliError::Short)
                ));
            }
        }
        // Non-minimal, and ten bytes long.
        assert!(matches!(vli(&[0x80, 0x00], &mut 0), Err(VliError::Bad)));
        assert!(matches!(vli(&[0xff; 10], &mut 0), Err(VliError::Bad)));
    }

    #[test]
    fn xz_reads_what_we_write() {
        if !have_xz() {
            return;
        }
        let data = sample(300_000, 42);
        let packed = encode_all(Format::Xz, 6, 64 << 10, &data).unwrap();
        let (ok, out, err) = xz(&["-dc"], &packed);
        assert!(ok, "xz -d: {err}");
        assert_eq!(out, data);
        let (ok, _, err) = xz(&["-t"], &packed);
        assert!(ok, "xz -t: {err}");
        let list = xz_list(&packed, "ours");
        let blocks: Vec<&str> = list.lines().filter(|l| l.starts_with("block")).collect();
        assert_eq!(blocks.len(), 5, "{list}");
        for (i, b) in blocks.iter().enumerate() {
            // Both sizes in every header, CRC64, and the smallest
            // dictionary that holds the block (the last has 37856 bytes).
            let f: Vec<&str> = b.split('\t').collect();
            assert_eq!(f[9], "CRC64", "{b}");
            assert_eq!(f[12], "cu", "{b}");
            let dict = if i == 4 { "48KiB" } else { "64KiB" };
            assert_eq!(f[15], format!("--lzma2=dict={dict}"), "{b}");
        }
        // One byte, and a level with a dictionary far over the block.
        for (level, n) in [(9, 1), (0, 70_000), (9, 70_000)] {
            let data = sample(n, 7);
            let packed = encode_all(Format::Xz, level, 50_000, &data).unwrap();
            let (ok, out, err) = xz(&["-dc"], &packed);
            assert!(ok && out == data, "level {level} n={n}: {err}");
        }
    }

    #[test]
    fn we_read_single_threaded_xz_as_a_stream() {
        if !have_xz() {
            return;
        }
        let data = sample(3 << 20, 9);
        let packed = xz_pack(&["-1", "-T1"], &data);
        let (out, kinds) = split(&packed).unwrap();
        assert_eq!(out, data);
        assert_eq!(packed_units(&kinds), 0);
        assert!(kinds.len() >= 3, "{} plain units", kinds.len());
        assert_eq!(decode_all(&packed).unwrap(), data);
    }

    #[test]
    fn we_read_multithreaded_xz_in_parallel() {
        if !have_xz() {
            return;
        }
        let data = sample(500_000, 11);
        let packed = xz_pack(&["-6", "-T2", "--block-size=100KiB"], &data);
        let (out, kinds) = split(&packed).unwrap();
        assert_eq!(out, data);
        assert_eq!(packed_units(&kinds), 5);
        assert_eq!(kinds.len(), 5);
    }

    #[test]
    fn every_check_type_and_filter_chain() {
        if !have_xz() {
            return;
        }
        let data = sample(250_000, 13);
        for check in ["none", "crc32", "crc64", "sha256"] {
            let check_arg = format!("--check={check}");
            for (mt, extra) in [
                (true, &["-3"][..]),
                (false, &["-3"][..]),
                (true, &["--x86", "--lzma2=preset=1"][..]),
                (false, &["--delta=dist=4", "--lzma2=preset=1"][..]),
            ] {
                let mut args = vec![check_arg.as_str()];
                if mt {
                    args.extend(["-T2", "--block-size=64KiB"]);
                } else {
                    args.push("-T1");
                }
                args.extend_from_slice(extra);
                let packed = xz_pack(&args, &data);
                let (out, kinds) = split(&packed).unwrap_or_else(|e| panic!("{args:?}: {e}"));
                assert!(out == data, "{args:?}");
                assert_eq!(packed_units(&kinds) > 0, mt, "{args:?}");
                // Damage in the last block's data or check is caught.
                if check != "none" {
                    let mut bad = packed.clone();
                    let at = packed.len() - 12 - 8 - 12 - 3;
                    bad[at] ^= 1;
                    assert!(split(&bad).is_err(), "{args:?}: flip at {at}");
                }
            }
        }
    }

    #[test]
    fn concatenated_streams_with_padding() {
        let a = sample(120_000, 1);
        let b = sample(70_000, 2);
        let mut packed = encode_all(Format::Xz, 6, 50_000, &a).unwrap();
        packed.extend_from_slice(&[0; 8]);
        packed.extend(encode_all(Format::Xz, 6, 50_000, &b).unwrap());
        let mut want = [a.clone(), b.clone()].concat();
        if have_xz() {
            let c = sample(90_000, 3);
            packed.extend(xz_pack(&["-1"], &c));
            packed.extend(xz_pack(&["-T2", "--block-size=40KiB"], &a));
            packed.extend_from_slice(&[0; 4]);
            want.extend_from_slice(&c);
            want.extend_from_slice(&a);
            let (ok, out, err) = xz(&["-dc"], &packed);
            assert!(ok && out == want, "xz -d of the concatenation: {err}");
        }
        let (out, kinds) = split(&packed).unwrap();
        assert_eq!(out, want);
        assert!(packed_units(&kinds) >= 6);
        // Padding must come in fours; anything else is garbage.
        let mut bad = packed.clone();
        bad.extend_from_slice(&[0; 3]);
        assert!(matches!(split(&bad), Err(CodecError::Corrupt { .. })));
        let mut bad = packed.clone();
        bad.extend_from_slice(&[0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert!(matches!(
            split(&bad),
            Err(CodecError::TrailingGarbage { format: "xz", offset }) if offset == packed.len() as u64 + 4
        ));
    }

    #[test]
    fn blocks_over_the_unit_limit_are_streamed() {
        let n = MAX_UNIT + 5;
        let data: Vec<u8> = (0..n).map(|i| (i / 4096) as u8).collect();
        let packed = encode_all(Format::Xz, 0, n, &data).unwrap();
        let (out, kinds) = split(&packed).unwrap();
        assert!(out == data);
        assert_eq!(packed_units(&kinds), 0);
        assert_eq!(kinds.len(), n.div_ceil(PLAIN_UNIT));
    }

    /// Every flip and cut of `packed` errs or decodes to `data` (or, for a
    /// cut, to a prefix of it); nothing panics.
    fn damage(packed: &[u8], data: &[u8], what: &str) {
        for i in 0..packed.len() {
            for bit in [0x01, 0x80] {
                let mut bad = packed.to_vec();
                bad[i] ^= bit;
                match split(&bad) {
                    Ok((out, _)) => assert!(out == data, "{what}: flip {bit:#x} at {i}"),
                    Err(CodecError::Corrupt { format, offset, .. }) => {
                        assert_eq!(format, NAME);
                        assert!(offset <= packed.len() as u64, "{what}: offset {offset}");
                    }
                    Err(CodecError::Truncated { format, .. })
                    | Err(CodecError::TrailingGarbage { format, .. }) => assert_eq!(format, NAME),
                    Err(e) => panic!("{what}: flip at {i}: unexpected {e}"),
                }
            }
        }
        for cut in 0..packed.len() {
            match split(&packed[..cut]) {
                Ok((out, _)) => panic!("{what}: cut at {cut} gave {} bytes", out.len()),
                Err(CodecError::Truncated { .. } | CodecError::Corrupt { .. }) => {}
                Err(e) => panic!("{what}: cut at {cut}: unexpected {e}"),
            }
        }
    }

    #[test]
    fn damage_is_caught_in_our_streams() {
        let data = sample(9000, 21);
        let packed = encode_all(Format::Xz, 6, 3000, &data).unwrap();
        damage(&packed, &data, "ours");
    }

    #[test]
    fn damage_is_caught_in_xz_streams() {
        if !have_xz() {
            return;
        }
        let data = sample(9000, 23);
        for (what, args) in [
            ("xz -1", &["-1", "-T1"][..]),
            ("xz -T2", &["-1", "-T2", "--block-size=3000"][..]),
            (
                "xz sha256",
                &["--check=sha256", "-T2", "--block-size=4000"][..],
            ),
        ] {
            let packed = xz_pack(args, &data);
            damage(&packed, &data, what);
        }
    }

    #[test]
    fn huge_declared_sizes_fail_cleanly() {
        let data = sample(20_000, 3);
        let packed = encode_all(Format::Xz, 6, 50_000, &data).unwrap();
        let old_len = (usize::from(packed[12]) + 1) * 4;
        let bh = parse_block_header(&packed[12..12 + old_len]).unwrap();
        let (comp, prop) = (bh.compressed.unwrap(), bh.filters[0].1[0]);
        // Over the unit limit: decoded here, where the sizes then differ
        // from the data, without allocating what they say.
        for (c, u) in [(comp, 1u64 << 40), (1 << 40, data.len() as u64)] {
            let mut bad = packed[..12].to_vec();
            bad.extend(block_header(c, u, &[], 1, prop));
            bad.extend_from_slice(&packed[12 + old_len..]);
            match split(&bad) {
                Err(CodecError::Corrupt { offset: 12, .. }) => {}
                other => panic!("sizes {c}, {u}: {:?}", other.map(|(o, _)| o.len())),
            }
        }
    }

    #[test]
    fn corrupt_block_reports_its_offset() {
        let data = sample(30_000, 5);
        let packed = encode_all(Format::Xz, 6, 10_000, &data).unwrap();
        let (_, kinds) = split(&packed).unwrap();
        assert_eq!(packed_units(&kinds), 3);
        // Damage the data of the third block: the error points past the
        // first two.
        let mut bad = packed.clone();
        let at = packed.len() - 12 - 12 - 20;
        bad[at] ^= 0x55;
        match decode_all(&bad) {
            Err(CodecError::Corrupt { format, offset, .. }) => {
                assert_eq!(format, "xz");
                assert!(offset > packed.len() as u64 / 2, "offset {offset}");
            }
            other => panic!("expected a corrupt error, got {other:?}"),
        }
    }
}
