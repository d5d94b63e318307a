//! bzip2, written as one complete stream per input block and read, from any
//! bzip2 file, block by block in parallel.
//!
//! Writing: each input block (a little under the level's 100k-multiple, so
//! that it fills one bzip2 block) becomes a whole stream of its own, `BZh`
//! level, block, end-of-stream marker and combined CRC. bzip2, lbzip2 and
//! pbzip2 all read concatenated streams as the concatenation of their
//! contents, so no framing is needed. Input with many 4-byte runs grows in
//! bzip2's first run-length pass and may spill into a second block of the
//! same stream; the reader handles that like any multi-block stream.
//!
//! Reading: a bzip2 file gives no sizes to hop on (plain `bzip2` and lbzip2
//! write one stream of many blocks), but every block starts with the 48-bit
//! magic `0x314159265359` and every stream ends with `0x177245385090`, at any
//! bit position. So the splitter scans for these magics, as lbzip2 does, and
//! hands each block out as a unit: a tiny self-contained stream made of the
//! original header, the block's bits re-aligned to a byte, an end-of-stream
//! marker and, as combined CRC, the block's own CRC (a one-block stream's
//! combined CRC is its block CRC). Any bzip2 decoder then decodes a unit on
//! its own (cairn's is [`crate::bz2::decode`]), and its per-block CRC check
//! covers every block. The splitter checks each stream's combined CRC
//! against the block CRCs it collected, so a lost or duplicated block
//! cannot go unnoticed either.
//!
//! The scan looks at 16-bit pairs of whole bytes: a 48-bit magic at any of
//! the 8 bit shifts fully covers the 2nd and 3rd byte of its window, so 16
//! pair values (2 magics x 8 shifts) flag candidates in a 64 Ki-bit table,
//! one lookup per byte; only candidates are checked bit by bit.
//!
//! A magic can occur by chance inside compressed data (2^-48 per bit). A
//! false block boundary would cut a block in two, and both halves would
//! then fail to decode, so it can cause an error but never wrong output. To
//! make even that vanishingly rare, a block magic found by scanning counts
//! only if what follows passes the checks libbzip2 itself makes on a block
//! header (origPtr in range, some byte in use, 2 to 6 Huffman groups, at
//! least one selector, the first selectors below the group count); an
//! end-of-stream magic counts only if the combined CRC after it is right or
//! it is followed by the end of input or another stream header. What is
//! left, a chance block magic that also passes the header checks, is well
//! under one in a billion blocks, and it still ends in an error, not in
//! wrong output; a sequential decoder would read such a file.
//!
//! A block's compressed size is bounded (at most level x 100k symbols of at
//! most 20 bits each, plus tables), so the scan gives up with an error past
//! that bound instead of buffering a non-bzip2 input without limit.

use super::{at_offset, map_offset, pass_plain, BlockMeta, Unit, UnitKind, MAX_UNIT};
use crate::bz2::decode::StreamDecoder;
use crate::error::{CodecError, Result};
use crate::input::Input;

const NAME: &str = "bzip2";
/// Starts every block (BCD pi).
const BLOCK_MAGIC: u64 = 0x3141_5926_5359;
/// Ends every stream (BCD sqrt(pi)).
const EOS_MAGIC: u64 = 0x1772_4538_5090;
const MAGIC_BITS: usize = 48;
/// A magic and the CRC that follows it.
const MAGIC_CRC_BITS: usize = MAGIC_BITS + 32;
/// `BZh` and the level digit.
const HEADER_LEN: usize = 4;
/// How many selectors of a candidate block header are checked: enough to
/// reject chance magics, few enough to stay within a short look-ahead.
const SELECTORS_CHECKED: u64 = 32;
/// Look-ahead that covers every header field the candidate check reads
/// (80 + 1 + 24 + 16 + 256 + 3 + 15 + 32 x 6 bits, plus the bit shift).
const CHECK_BYTES: usize = 96;
/// How much more input to read when a block's end is not buffered yet.
const GROW: usize = 1 << 20;

/// Input block size at `level` (1-9): one bzip2 block holds up to
/// level x 100000 - 19 bytes after its first run-length pass, and the
/// margin keeps ordinary data inside one block.
pub fn block_size(level: i32) -> usize {
    level.clamp(1, 9) as usize * 100_000 - 1000
}

/// Largest compressed block of a stream at `level`: libbzip2 accepts up to
/// level x 100000 + 1 coded symbols of at most 20 bits; 64 KiB covers the
/// header, the selectors (32767 of up to 6 bits) and code-length tables as
/// encoders write them (about 8 KiB at most).
fn max_block_bytes(level: usize) -> usize {
    level * 250_000 + (64 << 10)
}

/// Compresses each block into a whole bzip2 stream.
pub struct Encoder {
    enc: crate::bz2::encode::Encoder,
}

impl Encoder {
    /// An encoder at bzip2 `level` (1-9, the block size in 100k units).
    pub fn new(level: i32) -> Self {
        Encoder {
            enc: crate::bz2::encode::Encoder::new(level),
        }
    }
}

impl super::BlockEncoder for Encoder {
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        let start = out.len();
        self.enc.compress(src, out)?;
        Ok(BlockMeta {
            raw_len: src.len() as u64,
            packed_len: (out.len() - start) as u64,
            check: 0,
        })
    }
}

/// `n` (at most 57) bits of `buf` from bit `pos`, most significant first as
/// bzip2 writes them; `None` past the end of `buf`.
fn bits(buf: &[u8], pos: usize, n: usize) -> Option<u64> {
    if n == 0 {
        return Some(0);
    }
    if n > 57 {
        return None;
    }
    let first = pos / 8;
    let last = (pos + n - 1) / 8;
    let bytes = buf.get(first..=last)?;
    let mut w = 0u64;
    for (k, &b) in bytes.iter().enumerate() {
        w |= u64::from(b) << (56 - 8 * k);
    }
    Some((w << (pos % 8)) >> (64 - n))
}

/// Bytes that hold `nbits` bits.
fn bytes_for(nbits: usize) -> usize {
    nbits.div_ceil(8)
}

/// Which magic a scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Magic {
    Block,
    Eos,
}

const MAGICS: [(u64, Magic); 2] = [(BLOCK_MAGIC, Magic::Block), (EOS_MAGIC, Magic::Eos)];

/// The 16 byte pairs that the 2nd and 3rd byte of a magic's window can be,
/// as a bit set over all 65536 pairs.
static PAIRS: [u64; 1024] = pair_table();

/// The pair of whole bytes covered by `magic` when it starts at bit `shift`
/// of a byte: the byte after the first and the one after that.
const fn pair_of(magic: u64, shift: usize) -> usize {
    ((magic >> (24 + shift)) & 0xFFFF) as usize
}

const fn pair_table() -> [u64; 1024] {
    let mut t = [0u64; 1024];
    let mut m = 0;
    while m < MAGICS.len() {
        let mut s = 0;
        while s < 8 {
            let key = pair_of(MAGICS[m].0, s);
            t[key >> 6] |= 1 << (key & 63);
            s += 1;
        }
        m += 1;
    }
    t
}

/// What a scan of the buffered bytes found.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// A magic starting at this bit.
    Found(usize, Magic),
    /// Nothing up to the end of the buffer; scan on from this bit once more
    /// is buffered.
    More(usize),
}

/// The first magic that starts at or after bit `from` of `buf` and is
/// followed by the byte its window needs (every real magic is followed by
/// at least a CRC, so the last few bits never hold one worth finding).
fn find_magic(buf: &[u8], from: usize) -> Scan {
    // A window is the 7 bytes from the magic's first byte `i`.
    let Some(last_i) = buf.len().checked_sub(7) else {
        return Scan::More(from);
    };
    let first_i = from / 8;
    if first_i > last_i {
        return Scan::More(from);
    }
    let Some(pairs) = buf.get(first_i + 1..last_i + 3) else {
        return Scan::More(from);
    };
    // One table lookup per byte; candidates are rare (16 in 65536 pairs of
    // random bytes), so the bit-level check hardly ever runs. (Checking
    // eight pairs per branch measured no faster: the lookups dominate.)
    for (k, w) in pairs.windows(2).enumerate() {
        let key = usize::from(w[0]) << 8 | usize::from(w[1]);
        if PAIRS[key >> 6] >> (key & 63) & 1 == 0 {
            continue;
        }
        let i = first_i + k;
        let Some(window) = bits(buf, 8 * i, 56) else {
            continue;
        };
        for s in 0..8 {
            for (magic, kind) in MAGICS {
                if pair_of(magic, s) == key
                    && 8 * i + s >= from
                    && (window >> (8 - s)) & 0xFFFF_FFFF_FFFF == magic
                {
                    return Scan::Found(8 * i + s, kind);
                }
            }
        }
    }
    Scan::More(from.max(8 * (last_i + 1)))
}

/// Whether the block header at bit `p` of `buf` passes the checks libbzip2
/// makes on it (so every decodable block passes); `None` when `buf` ends
/// first.
fn block_header_plausible(buf: &[u8], p: usize, level: usize) -> Option<bool> {
    let mut pos = p + MAGIC_CRC_BITS;
    let mut get = |n: usize| {
        let v = bits(buf, pos, n);
        pos += n;
        v
    };
    let _randomised = get(1)?;
    let orig_ptr = get(24)?;
    if orig_ptr > 10 + 100_000 * level as u64 {
        return Some(false);
    }
    let map = get(16)?;
    let mut in_use = 0;
    for i in 0..16 {
        if map & (0x8000 >> i) != 0 {
            in_use += get(16)?.count_ones();
        }
    }
    if in_use == 0 {
        return Some(false);
    }
    let groups = get(3)?;
    if !(2..=6).contains(&groups) {
        return Some(false);
    }
    let selectors = get(15)?;
    if selectors == 0 {
        return Some(false);
    }
    for _ in 0..selectors.min(SELECTORS_CHECKED) {
        let mut j = 0;
        while get(1)? == 1 {
            j += 1;
            if j >= groups {
                return Some(false);
            }
        }
    }
    Some(true)
}

/// Appends bits `from..to` of `buf` to `out` as whole bytes, then `tail`
/// (`(value, bit count)` pairs), zero-padded to a byte. `None` when `buf`
/// is short (the caller has checked it is not).
fn append_bits(
    buf: &[u8],
    from: usize,
    to: usize,
    tail: &[(u64, usize)],
    out: &mut Vec<u8>,
) -> Option<()> {
    let shift = from % 8;
    let first = from / 8;
    let whole = to.checked_sub(from)? / 8;
    if shift == 0 {
        out.extend_from_slice(buf.get(first..first + whole)?);
    } else {
        let src = buf.get(first..first + whole + 1)?;
        out.extend(
            src.windows(2)
                .map(|w| (w[0] << shift) | (w[1] >> (8 - shift))),
        );
    }
    let rest = (to - from) % 8;
    // Bits not yet written, right-aligned in `acc`; fewer than 8 after each
    // step, so pieces of up to 48 bits fit in the 64-bit accumulator.
    let mut acc = bits(buf, from + 8 * whole, rest)?;
    let mut n = rest;
    for &(value, len) in tail {
        acc = (acc << len) | value;
        n += len;
        while n >= 8 {
            n -= 8;
            out.push((acc >> n) as u8);
        }
    }
    if n > 0 {
        out.push((acc << (8 - n)) as u8);
    }
    Some(())
}

/// The stream being split: its level and where the splitter stands in it.
#[derive(Debug, Clone, Copy)]
struct Stream {
    /// Block size digit, 1-9.
    level: u8,
    /// Combined CRC of the blocks handed out so far.
    combined: u32,
    /// Bit of the first buffered byte where the next magic starts.
    bit: usize,
}

/// Cuts bzip2 files into blocks at their bit-aligned magics.
pub struct Splitter {
    input: Input,
    stream: Option<Stream>,
    streams: u64,
}

impl Splitter {
    /// A splitter over `input`.
    pub fn new(input: Input) -> Self {
        Splitter {
            input,
            stream: None,
            streams: 0,
        }
    }

    /// Read a stream header; `false` at a clean end of input.
    fn open_stream(&mut self) -> Result<bool> {
        let off = self.input.offset();
        let avail = self.input.fill(HEADER_LEN)?;
        if avail == 0 {
            if self.streams == 0 {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: off,
                });
            }
            return Ok(false);
        }
        let head = self.input.peek();
        let head = head.get(..avail.min(HEADER_LEN)).unwrap_or(head);
        if !b"BZh".iter().zip(head).all(|(a, b)| a == b) {
            if self.streams == 0 {
                return Err(CodecError::corrupt(
                    NAME,
                    off,
                    "not a bzip2 stream (no \"BZh\" header)",
                ));
            }
            return Err(CodecError::TrailingGarbage {
                format: NAME,
                offset: off,
            });
        }
        let Some(&digit) = head.get(3) else {
            return Err(CodecError::Truncated {
                format: NAME,
                offset: off + avail as u64,
            });
        };
        if !(b'1'..=b'9').contains(&digit) {
            return Err(CodecError::corrupt(
                NAME,
                off + 3,
                format!("bad block size {digit:#04x} in the stream header"),
            ));
        }
        self.input.consume(HEADER_LEN);
        self.streams += 1;
        self.stream = Some(Stream {
            level: digit - b'0',
            combined: 0,
            bit: 0,
        });
        Ok(true)
    }

    /// Check the combined CRC after the end-of-stream magic at the cursor
    /// and step past the stream's padding.
    fn close_stream(&mut self, st: Stream) -> Result<()> {
        let off = self.input.offset();
        let end = bytes_for(st.bit + MAGIC_CRC_BITS);
        let b = self.input.need(end, NAME)?;
        let stored = bits(b, st.bit + MAGIC_BITS, 32).ok_or(CodecError::Truncated {
            format: NAME,
            offset: off,
        })? as u32;
        if stored != st.combined {
            return Err(CodecError::corrupt(
                NAME,
                off + ((st.bit + MAGIC_BITS) / 8) as u64,
                format!(
                    "stream CRC mismatch: stored {stored:08x}, computed {:08x}",
                    st.combined
                ),
            ));
        }
        self.input.consume(end);
        self.stream = None;
        Ok(())
    }

    /// Whether the magic found at bit `p` of the buffer really ends the
    /// block at the cursor, whose CRC is `crc`.
    fn boundary_ok(&mut self, p: usize, kind: Magic, st: Stream, crc: u32) -> Result<bool> {
        match kind {
            Magic::Block => {
                self.input.fill(p / 8 + CHECK_BYTES)?;
                let level = usize::from(st.level);
                Ok(block_header_plausible(self.input.peek(), p, level).unwrap_or(false))
            }
            Magic::Eos => {
                let end = bytes_for(p + MAGIC_CRC_BITS);
                let avail = self.input.fill(end + HEADER_LEN)?;
                let buf = self.input.peek();
                let Some(stored) = bits(buf, p + MAGIC_BITS, 32) else {
                    return Ok(false);
                };
                if stored as u32 == st.combined.rotate_left(1) ^ crc {
                    return Ok(true);
                }
                // A wrong CRC still ends the stream if the input ends or a
                // new stream starts right after; that is then reported as a
                // CRC mismatch rather than as a missing end.
                Ok(avail == end || buf.get(end..end + HEADER_LEN).is_some_and(is_stream_header))
            }
        }
    }

    /// Hand out the block whose magic is at the cursor.
    fn cut_block(&mut self, st: Stream, unit: &mut Unit) -> Result<()> {
        let off = self.input.offset();
        let level = usize::from(st.level);
        let b0 = st.bit;
        let head = self.input.need(bytes_for(b0 + MAGIC_CRC_BITS), NAME)?;
        let crc = bits(head, b0 + MAGIC_BITS, 32).ok_or(CodecError::Truncated {
            format: NAME,
            offset: off,
        })? as u32;
        let limit = max_block_bytes(level);
        let too_big = || {
            CodecError::corrupt(
                NAME,
                off,
                format!(
                    "no end of block within {limit} bytes (the most a level {level} block takes)"
                ),
            )
        };
        let mut from = b0 + MAGIC_CRC_BITS;
        let end = loop {
            let buf = self.input.peek();
            let have = buf.len();
            match find_magic(buf, from) {
                Scan::Found(p, kind) => {
                    if self.boundary_ok(p, kind, st, crc)? {
                        break p;
                    }
                    from = p + 1;
                }
                Scan::More(resume) => {
                    from = resume;
                    if have > limit {
                        return Err(too_big());
                    }
                    if self.input.fill(have + GROW)? <= have {
                        return Err(CodecError::Truncated {
                            format: NAME,
                            offset: off + have as u64,
                        });
                    }
                }
            }
        };
        // The buffer may have held a far boundary already; hold every
        // block to the same bound.
        if (end - b0) / 8 > limit {
            return Err(too_big());
        }
        unit.data.reserve(HEADER_LEN + (end - b0) / 8 + 12);
        unit.data.extend_from_slice(b"BZh");
        unit.data.push(b'0' + st.level);
        let tail = [(EOS_MAGIC, MAGIC_BITS), (u64::from(crc), 32)];
        append_bits(self.input.peek(), b0, end, &tail, &mut unit.data)
            .ok_or_else(|| CodecError::corrupt(NAME, off, "internal: block not buffered"))?;
        unit.offset = off;
        unit.kind = UnitKind::Packed(u32::from(st.level));
        unit.raw_len = level * 100_000;
        self.input.consume(end / 8);
        self.stream = Some(Stream {
            level: st.level,
            combined: st.combined.rotate_left(1) ^ crc,
            bit: end % 8,
        });
        Ok(())
    }
}

/// `BZh` and a level digit.
fn is_stream_header(b: &[u8]) -> bool {
    b.len() >= HEADER_LEN && b.starts_with(b"BZh") && (b'1'..=b'9').contains(&b[3])
}

impl super::Splitter for Splitter {
    fn next_unit(&mut self, unit: &mut Unit) -> Result<bool> {
        loop {
            let Some(st) = self.stream else {
                if !self.open_stream()? {
                    return Ok(false);
                }
                continue;
            };
            let off = self.input.offset();
            let head = self.input.need(bytes_for(st.bit + MAGIC_BITS), NAME)?;
            match bits(head, st.bit, MAGIC_BITS) {
                Some(EOS_MAGIC) => self.close_stream(st)?,
                Some(BLOCK_MAGIC) => {
                    self.cut_block(st, unit)?;
                    return Ok(true);
                }
                _ => {
                    return Err(CodecError::corrupt(
                        NAME,
                        off,
                        "expected a block or end-of-stream marker",
                    ))
                }
            }
        }
    }

    fn offset(&self) -> u64 {
        self.input.offset()
    }
}

/// Decodes the one-block streams the splitter makes, keeping one native
/// decoder's block buffers per worker.
#[derive(Default)]
pub struct Decoder {
    stream: StreamDecoder,
}

impl super::UnitDecoder for Decoder {
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()> {
        if unit.kind == UnitKind::Plain {
            pass_plain(unit, out);
            return Ok(());
        }
        // A block holds at most level x 100k bytes before its first
        // run-length pass is undone, which can expand it up to 51 times;
        // MAX_UNIT covers the worst level-9 block.
        decode_stream(&mut self.stream, &unit.data, out, unit.raw_len, MAX_UNIT)
            .map_err(|e| at_offset(e, unit.offset))
    }
}

/// Decode one bzip2 stream into `out`: `hint` bytes are reserved up front,
/// at most `limit` are accepted, and on error `out` is left as it was.
/// Error offsets are relative to the block (the stream minus its 4-byte
/// header).
fn decode_stream(
    dec: &mut StreamDecoder,
    src: &[u8],
    out: &mut Vec<u8>,
    hint: usize,
    limit: usize,
) -> Result<()> {
    out.reserve(hint.min(limit));
    dec.decode(src, out, limit)
        .map(|_| ())
        .map_err(|e| map_offset(e, |offset| offset.saturating_sub(HEADER_LEN as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::tests::sample;
    use crate::format::{decode_all, encode_all, Format, Splitter as _, UnitDecoder as _};
    use crate::testutil::run;

    fn split_all(data: &[u8]) -> Result<Vec<Unit>> {
        let mut s = Splitter::new(Input::new(Box::new(std::io::Cursor::new(data.to_vec()))));
        let mut units = Vec::new();
        loop {
            let mut u = Unit::default();
            if !s.next_unit(&mut u)? {
                return Ok(units);
            }
            units.push(u);
        }
    }

    fn stream(level: i32, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        crate::block::bzip2_compress_stream(level, data, &mut out).unwrap();
        out
    }

    /// Bit position of the last end-of-stream magic.
    fn last_eos(packed: &[u8]) -> usize {
        (0..packed.len() * 8)
            .rev()
            .find(|&p| bits(packed, p, 48) == Some(EOS_MAGIC))
            .unwrap()
    }

    #[test]
    fn round_trip_edge_sizes() {
        for level in [1, 9] {
            let block = block_size(level);
            let sizes = if level == 1 {
                vec![0, 1, block - 1, block, block + 1, 3 * block + 5]
            } else {
                vec![0, 1, 12345]
            };
            for n in sizes {
                let data = sample(n, n as u32);
                let packed = encode_all(Format::Bzip2, level, block, &data).unwrap();
                assert_eq!(decode_all(&packed).unwrap(), data, "level {level} n={n}");
                let units = split_all(&packed).unwrap();
                assert_eq!(units.len(), n.div_ceil(block), "level {level} n={n}");
            }
        }
    }

    #[test]
    fn empty_streams_give_no_units() {
        let packed = encode_all(Format::Bzip2, 9, 1000, &[]).unwrap();
        assert!(split_all(&packed).unwrap().is_empty());
        assert!(decode_all(&packed).unwrap().is_empty());
        let two = [packed.clone(), packed].concat();
        assert!(decode_all(&two).unwrap().is_empty());
    }

    #[test]
    fn single_stream_with_many_blocks_splits_per_block() {
        let data = sample(2_500_000, 42);
        let packed = stream(1, &data);
        let units = split_all(&packed).unwrap();
        assert!(units.len() >= 3, "only {} units", units.len());
        let mut back = Vec::new();
        for mut u in units {
            assert_eq!(u.kind, UnitKind::Packed(1));
            Decoder::default().decode(&mut u, &mut back).unwrap();
        }
        assert!(back == data);
        assert!(decode_all(&packed).unwrap() == data);
    }

    #[test]
    fn damage_in_multi_block_stream_is_an_error() {
        let data = sample(300_000, 8);
        let mut packed = stream(1, &data);
        packed.extend(stream(2, &data[..1000]));
        let want = [&data[..], &data[..1000]].concat();
        let step = packed.len() / 97;
        for i in (0..packed.len())
            .step_by(step)
            .chain(packed.len() - 12..packed.len())
        {
            for flip in [0x01, 0x80] {
                let mut bad = packed.clone();
                bad[i] ^= flip;
                if let Ok(back) = decode_all(&bad) {
                    assert!(back == want, "flip {flip:#x} at {i} gave wrong data");
                }
            }
        }
        for cut in (0..packed.len())
            .step_by(step)
            .chain(packed.len() - 12..packed.len())
        {
            if let Ok(back) = decode_all(&packed[..cut]) {
                assert!(back == data, "cut at {cut} gave wrong data");
            }
        }
        assert!(matches!(
            decode_all(&packed[..packed.len() - 1]),
            Err(CodecError::Truncated { .. })
        ));
    }

    #[test]
    fn trailing_garbage_and_bad_starts() {
        let packed = encode_all(Format::Bzip2, 9, 1000, &sample(2000, 1)).unwrap();
        for junk in [&b"garbage!"[..], b"\0\0\0\0", b"BZx9", b"x"] {
            let bad = [&packed[..], junk].concat();
            assert!(
                matches!(decode_all(&bad), Err(CodecError::TrailingGarbage { .. })),
                "{junk:?}"
            );
        }
        let bad = [&packed[..], b"BZ"].concat();
        assert!(matches!(
            decode_all(&bad),
            Err(CodecError::Truncated { .. })
        ));
        assert!(matches!(split_all(b""), Err(CodecError::Truncated { .. })));
        assert!(split_all(b"PK\x03\x04").is_err());
        assert!(split_all(b"BZh0").is_err());
        assert!(split_all(b"BZh9").is_err());
        assert!(split_all(b"BZh9\x31\x41\x59\x26\x53").is_err());
    }

    #[test]
    fn wrong_stream_crc_is_an_error() {
        for data in [sample(5000, 3), sample(300_000, 4)] {
            let mut packed = stream(1, &data);
            let crc_bit = last_eos(&packed) + 48 + 5;
            packed[crc_bit / 8] ^= 0x80 >> (crc_bit % 8);
            let err = decode_all(&packed).unwrap_err();
            assert!(err.to_string().contains("stream CRC"), "{err}");
            // Also when another stream follows.
            packed.extend(stream(9, b"more"));
            let err = decode_all(&packed).unwrap_err();
            assert!(err.to_string().contains("stream CRC"), "{err}");
        }
    }

    #[test]
    fn scan_finds_magics_at_every_shift() {
        let noise = sample(64, 77);
        for (magic, kind) in MAGICS {
            for at in 0..80 {
                let mut buf = noise.clone();
                for k in 0..48 {
                    let bit = (magic >> (47 - k)) & 1 == 1;
                    let p = at + k;
                    buf[p / 8] = (buf[p / 8] & !(0x80 >> (p % 8))) | (u8::from(bit) << (7 - p % 8));
                }
                assert_eq!(find_magic(&buf, at), Scan::Found(at, kind), "at {at}");
                if let Scan::Found(p, _) = find_magic(&buf, at + 1) {
                    assert!(p > at);
                }
            }
        }
        assert_eq!(find_magic(&[0; 6], 3), Scan::More(3));
        assert_eq!(find_magic(&[0; 20], 3), Scan::More(8 * 14));
    }

    #[test]
    fn chance_magics_in_block_data_are_rejected() {
        // A block magic followed by noise fails the header check almost
        // always; a real header passes it.
        let packed = stream(9, &sample(10_000, 5));
        assert_eq!(block_header_plausible(&packed, 32, 9), Some(true));
        let mut rejected = 0;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..200 {
            let noise: Vec<u8> = (0..200)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 32) as u8
                })
                .collect();
            if block_header_plausible(&noise, 0, 9) == Some(false) {
                rejected += 1;
            }
        }
        assert!(rejected >= 180, "{rejected}");
    }

    #[test]
    fn interoperates_with_bzip2_lbzip2_pbzip2() {
        let data = sample(1_200_000, 11);
        let ours = encode_all(Format::Bzip2, 1, block_size(1), &data).unwrap();
        for tool in ["bzip2", "lbzip2", "pbzip2"] {
            if let Some(back) = run(tool, &["-d", "-c"], &ours) {
                assert!(back == data, "{tool} -d read our output wrongly");
            }
            if let Some(theirs) = run(tool, &["-c", "-1"], &data) {
                assert!(decode_all(&theirs).unwrap() == data, "{tool} output");
                if tool != "pbzip2" {
                    // One stream of many blocks, still cut per block.
                    assert!(split_all(&theirs).unwrap().len() >= 10, "{tool}");
                }
            }
        }
    }

    #[test]
    fn a_block_without_end_fails_within_bounds() {
        let mut bad = b"BZh1".to_vec();
        bad.extend_from_slice(&stream(1, b"x")[4..14]);
        bad.resize(4 << 20, 0);
        let err = split_all(&bad).unwrap_err();
        assert!(err.to_string().contains("no end of block"), "{err}");
        bad.truncate(200_000);
        assert!(matches!(split_all(&bad), Err(CodecError::Truncated { .. })));
    }

    /// Hands out its bytes in small, odd-sized reads.
    struct Dribble(Vec<u8>, usize);

    impl std::io::Read for Dribble {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            let n = b.len().min(4099).min(self.0.len() - self.1);
            b[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
            self.1 += n;
            Ok(n)
        }
    }

    #[test]
    fn short_reads_give_the_same_units() {
        let data = sample(400_000, 21);
        let packed = [stream(1, &data), stream(2, &data[..5000])].concat();
        let whole = split_all(&packed).unwrap();
        let mut s = Splitter::new(Input::new(Box::new(Dribble(packed.clone(), 0))));
        let mut n = 0;
        loop {
            let mut u = Unit::default();
            if !s.next_unit(&mut u).unwrap() {
                break;
            }
            assert_eq!(u.data, whole[n].data);
            assert_eq!(u.offset, whole[n].offset);
            n += 1;
        }
        assert_eq!(n, whole.len());
        assert_eq!(s.offset(), packed.len() as u64);
    }

    /// Bit-by-bit reference for `find_magic`.
    fn find_magic_slowly(buf: &[u8], from: usize) -> Option<(usize, Magic)> {
        (from..(buf.len().saturating_sub(7)) * 8 + 8).find_map(|p| {
            let m = bits(buf, p, 48)?;
            MAGICS
                .iter()
                .find(|&&(magic, _)| magic == m)
                .map(|&(_, k)| (p, k))
        })
    }

    #[test]
    fn scan_agrees_with_bit_by_bit_search() {
        // Noise with magics planted at every shift, some overlapping.
        let mut buf = sample(20_000, 9);
        let mut at = 13;
        let mut planted = 0;
        while at + 64 < buf.len() * 8 {
            let magic = MAGICS[planted % 2].0;
            for k in 0..48 {
                let p = at + k;
                let bit = u8::from((magic >> (47 - k)) & 1 == 1);
                buf[p / 8] = (buf[p / 8] & !(0x80 >> (p % 8))) | (bit << (7 - p % 8));
            }
            planted += 1;
            at += 40 + (planted * 7919) % 1500;
        }
        let mut from = 0;
        let mut found = 0;
        loop {
            let want = find_magic_slowly(&buf, from);
            match find_magic(&buf, from) {
                Scan::Found(p, kind) => {
                    assert_eq!(Some((p, kind)), want);
                    from = p + 1;
                    found += 1;
                }
                Scan::More(next) => {
                    assert_eq!(want, None);
                    assert!(next >= from);
                    break;
                }
            }
        }
        assert!(found >= planted / 2, "{found} of {planted}");
    }

    /// `cargo test --release -p cairn-codec bzip2::tests::scan_speed --
    /// --ignored --nocapture`; best of several runs, as the machine may be
    /// busy.
    #[test]
    #[ignore]
    fn scan_speed() {
        let packed = stream(9, &sample(40 << 20, 3));
        let mb = packed.len() as f64 / 1e6;
        let best = |f: &mut dyn FnMut()| {
            (0..15)
                .map(|_| {
                    let t = std::time::Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::MAX, f64::min)
        };
        let scan = best(&mut || {
            let mut from = 0;
            while let Scan::Found(p, _) = find_magic(&packed, from) {
                from = p + 1;
            }
        });
        let shared: std::sync::Arc<[u8]> = packed.clone().into();
        let mut unit = Unit::default();
        let mut units = 0;
        let split = best(&mut || {
            let input = Input::new(Box::new(std::io::Cursor::new(shared.clone())));
            let mut s = Splitter::new(input);
            units = 0;
            loop {
                unit.clear();
                if !s.next_unit(&mut unit).unwrap() {
                    break;
                }
                units += 1;
            }
        });
        eprintln!(
            "{mb:.1} MB, {units} blocks: scan {:.0} MB/s, split {:.0} MB/s",
            mb / scan,
            mb / split
        );
    }
}
