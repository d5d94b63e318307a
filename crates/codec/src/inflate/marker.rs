//! A DEFLATE decoder that starts at any block of a stream without the 32 KiB
//! of output before it (the window), and the search for such a block.
//!
//! Back-references into the unknown window cannot be resolved yet, so the
//! output is 16-bit: a value below 256 is a byte, a value `256 + i` stands
//! for byte `i` of the window (`i = 32767` is the byte just before the
//! start). Once the window is known, [`resolve`] turns the output into
//! bytes. This is the two-stage decoding of pugz and rapidgzip; the code is
//! written here from RFC 1951.
//!
//! Speed matters less than in the library inflaters: a chunk is decoded
//! here only until the last 32 KiB of its output hold no marker (or the
//! window before the chunk becomes known), and from there libdeflate
//! inflates the rest of the chunk with that output as its window.

use crate::error::{CodecError, Result};

/// Size of the DEFLATE window.
pub const WINDOW: usize = 32 << 10;

/// First marker value: `MARKER + i` stands for window byte `i`.
pub const MARKER: u16 = 256;

const NAME: &str = "gzip";

/// RFC 1951 3.2.5: base lengths and extra bits of length symbols 257..285.
const LEN_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LEN_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
/// Base distances and extra bits of distance symbols 0..29.
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];
/// Order of the code-length code's lengths in a dynamic block header.
const CL_ORDER: [usize; 19] = [
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
];

/// Little-endian bit reader over a byte slice; positions are in bits.
#[derive(Clone, Copy)]
pub struct Bits<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bits<'a> {
    /// A reader at bit `pos` of `data`.
    pub fn new(data: &'a [u8], pos: usize) -> Self {
        Bits { data, pos }
    }

    /// The bit position.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The next 56 bits or more (zeros past the end).
    #[inline]
    fn peek(&self) -> u64 {
        let byte = self.pos >> 3;
        let w = match self.data.get(byte..byte + 8) {
            Some(b) => {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                u64::from_le_bytes(a)
            }
            None => {
                let mut a = [0u8; 8];
                let tail = self.data.get(byte..).unwrap_or(&[]);
                a[..tail.len()].copy_from_slice(tail);
                u64::from_le_bytes(a)
            }
        };
        w >> (self.pos & 7)
    }

    /// Take `n` (at most 32) bits.
    #[inline]
    fn take(&mut self, n: u32) -> u32 {
        let v = (self.peek() & ((1u64 << n) - 1)) as u32;
        self.pos += n as usize;
        v
    }

    /// True once the reader has gone past the end of the data.
    #[inline]
    fn overrun(&self) -> bool {
        self.pos > self.data.len() * 8
    }
}

/// A canonical Huffman code as a lookup table indexed by the next `bits`
/// bits of the stream (at most `TABLE_BITS`); an entry is `symbol << 4 |
/// length`, 0 for a bit pattern that is no code (an incomplete code),
/// `LONGER` for the first bits of codes longer than the table, which
/// `Table::long` decodes a bit at a time.
pub struct Table {
    entries: Vec<u16>,
    bits: u32,
    /// Codes of each length.
    count: [u16; 16],
    /// The symbols in canonical order (by length, then value).
    sorted: Vec<u16>,
}

/// Most bits a [`Table`] is indexed by. A table of a code's longest
/// length (up to 15 bits: 64 KiB of entries, filled for every block)
/// missed the first-level cache; codes longer than 11 bits are the rare
/// symbols.
const TABLE_BITS: u32 = 11;

/// A table entry for the first bits of codes longer than the table.
const LONGER: u16 = 1 << 4;

impl Table {
    fn empty() -> Self {
        Table {
            entries: Vec::new(),
            bits: 0,
            count: [0; 16],
            sorted: Vec::new(),
        }
    }

    /// The symbol and length of a code longer than the table, from the
    /// stream's next bits `w`, canonical decoding a bit at a time.
    #[cold]
    fn long(&self, w: u64) -> Option<(u16, u32)> {
        let (mut code, mut first, mut index) = (0u32, 0u32, 0u32);
        for len in 1..16 {
            code |= ((w >> (len - 1)) & 1) as u32;
            let count = u32::from(self.count[len]);
            if code < first + count {
                return Some((self.sorted[(index + code - first) as usize], len as u32));
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        None
    }

    /// The symbol and length of the code at the start of `w` (the next
    /// bits of the stream); `None` for a pattern that is no code.
    #[inline(always)]
    fn lookup(&self, w: u64) -> Option<(u16, u32)> {
        let e = self.entries[(w & ((1 << self.bits) - 1)) as usize];
        match e & 15 {
            0 if e == LONGER => self.long(w),
            0 => None,
            l => Some((e >> 4, u32::from(l))),
        }
    }

    /// Build from code lengths; `None` when the lengths are not a code
    /// zlib accepts: over-subscribed, or incomplete (allowed only for a
    /// single code of length one, or none at all when `allow_empty`).
    fn build(&mut self, lengths: &[u8], complete: bool, allow_empty: bool) -> Option<()> {
        let mut count = [0u16; 16];
        for &l in lengths {
            count[l as usize] += 1;
        }
        count[0] = 0;
        let max = (1..16).rev().find(|&l| count[l] != 0).unwrap_or(0);
        if max == 0 {
            if !allow_empty {
                return None;
            }
            self.bits = 1;
            self.count = count;
            self.entries.clear();
            self.entries.resize(2, 0);
            return Some(());
        }
        let mut left: i32 = 1;
        for &c in &count[1..16] {
            left = (left << 1) - i32::from(c);
            if left < 0 {
                return None;
            }
        }
        if left > 0 && (complete || max != 1) {
            return None;
        }
        let mut next = [0u16; 16];
        let mut code = 0u16;
        for l in 1..16 {
            code = (code + count[l - 1]) << 1;
            next[l] = code;
        }
        self.bits = (max as u32).min(TABLE_BITS);
        let size = 1usize << self.bits;
        self.entries.clear();
        self.entries.resize(size, 0);
        self.count = count;
        let mut offs = [0usize; 16];
        for l in 1..15 {
            offs[l + 1] = offs[l] + usize::from(count[l]);
        }
        self.sorted.clear();
        self.sorted.resize(lengths.len(), 0);
        for (sym, &l) in lengths.iter().enumerate() {
            if l == 0 {
                continue;
            }
            let l = l as usize;
            self.sorted[offs[l]] = sym as u16;
            offs[l] += 1;
            let c = next[l];
            next[l] += 1;
            let rev = (c.reverse_bits() >> (16 - l)) as usize;
            if l > size.trailing_zeros() as usize {
                // The table holds this code's first bits only.
                self.entries[rev & (size - 1)] = LONGER;
                continue;
            }
            let entry = ((sym as u16) << 4) | l as u16;
            let mut i = rev;
            while i < size {
                self.entries[i] = entry;
                i += 1 << l;
            }
        }
        Some(())
    }

    /// Decode one symbol; `None` for a pattern that is no code.
    #[inline]
    fn decode(&self, bits: &mut Bits) -> Option<u16> {
        let (sym, l) = self.lookup(bits.peek())?;
        bits.pos += l as usize;
        Some(sym)
    }
}

/// How a block ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockEnd {
    /// A block ended; the next starts at the reader's position.
    More,
    /// The final block of the stream ended.
    Last,
}

/// Why decoding stopped short of a block's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The data ran out inside the block.
    OutOfData,
    /// The bits are not valid DEFLATE (a wrong guess, or damage).
    Invalid(&'static str),
}

/// The decoder of one chunk: tables and the 16-bit output.
pub struct MarkerDecoder {
    lit: Table,
    dist: Table,
    /// The code-length code's table (rebuilt for every header, so the
    /// block search allocates nothing per candidate).
    cl: Table,
    lengths: Vec<u8>,
    /// Output since the start, in `out[..len]`; markers for window bytes.
    /// Past it, room that codes are stored into by index (see
    /// [`Self::codes`]): values of no meaning, initialised once, kept when
    /// the output is cleared or taken (zero-filling it for every block was
    /// a fifth of the decoding of long matches).
    out: Vec<u16>,
    len: usize,
    /// Position in `out` after the last marker written, or 0.
    clean_from: usize,
    /// Output scanned for markers so far.
    scanned: usize,
}

impl Default for MarkerDecoder {
    fn default() -> Self {
        MarkerDecoder {
            lit: Table::empty(),
            dist: Table::empty(),
            cl: Table::empty(),
            lengths: vec![0; 320],
            out: Vec::new(),
            len: 0,
            clean_from: 0,
            scanned: 0,
        }
    }
}

impl MarkerDecoder {
    /// Forget the output (a new start).
    pub fn clear(&mut self) {
        self.len = 0;
        self.clean_from = 0;
        self.scanned = 0;
    }

    /// The output so far.
    pub fn output(&self) -> &[u16] {
        &self.out[..self.len]
    }

    /// Cut the output back to its first `len` values.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Capacity for `n` values of output, untouched until used.
    pub fn reserve_capacity(&mut self, n: usize) {
        let want = self.len + n;
        if self.out.capacity() < want {
            self.out.reserve(want - self.out.len());
        }
    }

    /// Room for `n` values of output without growing.
    pub fn reserve(&mut self, n: usize) {
        make_room(&mut self.out, self.len + n, 0);
    }

    /// The output so far, leaving `spare` in its place (what it holds
    /// becomes room).
    pub fn take_out(&mut self, spare: Vec<u16>) -> Vec<u16> {
        let mut out = std::mem::replace(&mut self.out, spare);
        out.truncate(self.len);
        self.clear();
        out
    }

    /// True when the last [`WINDOW`] values of the output are all bytes:
    /// what follows can be decoded knowing only this output.
    pub fn window_known(&mut self) -> bool {
        let out = &self.out[self.scanned..self.len];
        if let Some(i) = out.iter().rposition(|&v| v >= MARKER) {
            self.clean_from = self.scanned + i + 1;
        }
        self.scanned = self.len;
        self.len - self.clean_from >= WINDOW
    }

    /// The last [`WINDOW`] bytes of the output, once [`Self::window_known`].
    pub fn window(&self) -> Vec<u8> {
        self.out[self.len - WINDOW..self.len]
            .iter()
            .map(|&v| v as u8)
            .collect()
    }

    /// Read a dynamic block's header (after its three type bits) and build
    /// its tables.
    fn dynamic_header(&mut self, bits: &mut Bits) -> std::result::Result<(), Stop> {
        let hlit = bits.take(5) as usize + 257;
        let hdist = bits.take(5) as usize + 1;
        let hclen = bits.take(4) as usize + 4;
        if hlit > 286 || hdist > 30 {
            return Err(Stop::Invalid("too many length or distance symbols"));
        }
        let mut cl = [0u8; 19];
        for &i in &CL_ORDER[..hclen] {
            cl[i] = bits.take(3) as u8;
        }
        let cl_table = &mut self.cl;
        cl_table
            .build(&cl, true, false)
            .ok_or(Stop::Invalid("invalid code lengths set"))?;
        let total = hlit + hdist;
        let lengths = &mut self.lengths[..total];
        let mut i = 0;
        while i < total {
            let sym = cl_table
                .decode(bits)
                .ok_or(Stop::Invalid("invalid code lengths set"))?;
            let (value, repeat) = match sym {
                0..=15 => (sym as u8, 1),
                16 => {
                    if i == 0 {
                        return Err(Stop::Invalid("invalid bit length repeat"));
                    }
                    (lengths[i - 1], 3 + bits.take(2) as usize)
                }
                17 => (0, 3 + bits.take(3) as usize),
                _ => (0, 11 + bits.take(7) as usize),
            };
            if i + repeat > total {
                return Err(Stop::Invalid("invalid bit length repeat"));
            }
            lengths[i..i + repeat].fill(value);
            i += repeat;
        }
        if bits.overrun() {
            return Err(Stop::OutOfData);
        }
        if lengths[256] == 0 {
            return Err(Stop::Invalid("missing end-of-block code"));
        }
        self.lit
            .build(&lengths[..hlit], false, false)
            .ok_or(Stop::Invalid("invalid literal/lengths set"))?;
        self.dist
            .build(&lengths[hlit..], false, true)
            .ok_or(Stop::Invalid("invalid distances set"))?;
        Ok(())
    }

    fn fixed_tables(&mut self) {
        let mut l = [0u8; 288];
        l[..144].fill(8);
        l[144..256].fill(9);
        l[256..280].fill(7);
        l[280..].fill(8);
        // The fixed codes are complete by construction.
        let _ = self.lit.build(&l, true, false);
        let _ = self.dist.build(&[5u8; 32], true, false);
    }

    /// Decode one whole block at the reader's position, appending to
    /// `out`. On a [`Stop`], `out` may hold part of the block: the caller
    /// truncates to what it had.
    pub fn block(&mut self, bits: &mut Bits) -> std::result::Result<BlockEnd, Stop> {
        let head = bits.take(3);
        let last = head & 1 == 1;
        match head >> 1 {
            0 => self.stored(bits)?,
            1 => {
                self.fixed_tables();
                self.codes(bits)?;
            }
            2 => {
                self.dynamic_header(bits)?;
                self.codes(bits)?;
            }
            _ => return Err(Stop::Invalid("invalid block type")),
        }
        if bits.overrun() {
            return Err(Stop::OutOfData);
        }
        Ok(if last { BlockEnd::Last } else { BlockEnd::More })
    }

    fn stored(&mut self, bits: &mut Bits) -> std::result::Result<(), Stop> {
        bits.pos = (bits.pos + 7) & !7;
        let at = bits.pos / 8;
        let head = bits.data.get(at..at + 4).ok_or(Stop::OutOfData)?;
        let len = u16::from_le_bytes([head[0], head[1]]);
        let nlen = u16::from_le_bytes([head[2], head[3]]);
        if len != !nlen {
            return Err(Stop::Invalid("invalid stored block lengths"));
        }
        let body = bits
            .data
            .get(at + 4..at + 4 + len as usize)
            .ok_or(Stop::OutOfData)?;
        self.reserve(body.len());
        let room = &mut self.out[self.len..self.len + body.len()];
        for (v, &b) in room.iter_mut().zip(body) {
            *v = u16::from(b);
        }
        self.len += body.len();
        bits.pos += (4 + len as usize) * 8;
        Ok(())
    }

    /// Decode a block's codes up to its end-of-block code, appending to
    /// `out`.
    fn codes(&mut self, bits: &mut Bits) -> std::result::Result<(), Stop> {
        let mut n = self.len;
        let r = self.codes_in_room(bits, &mut n);
        self.len = n;
        r
    }

    /// [`Self::codes`] writing into room past the output: `out` is kept at
    /// least [`ROOM`] values longer than the `n` decoded, so a symbol is
    /// stored by index, not pushed, and a copy from 16 or more back moves
    /// 16 values at a time, running past its end into the room (memmove
    /// calls for the short copies of text were a third of this loop).
    fn codes_in_room(&mut self, bits: &mut Bits, n: &mut usize) -> std::result::Result<(), Stop> {
        let lit_mask = (1u64 << self.lit.bits) - 1;
        let out = &mut self.out;
        loop {
            if bits.overrun() {
                return Err(Stop::OutOfData);
            }
            make_room(out, *n + ROOM, GROW);
            // One load serves a whole symbol: a literal/length code (15
            // bits), its extra bits (5), a distance code (15) and its extra
            // bits (13) are at most 48 of the 56 or more a peek gives.
            let mut w = bits.peek();
            let Some((sym, l)) = self.lit.lookup(w) else {
                return Err(Stop::Invalid("invalid literal/length code"));
            };
            w >>= l;
            bits.pos += l as usize;
            if sym < 256 {
                out[*n] = sym;
                *n += 1;
                // A second literal from the same load (15 more bits).
                let e = self.lit.entries[(w & lit_mask) as usize];
                if e & 15 != 0 && e >> 4 < 256 {
                    out[*n] = e >> 4;
                    *n += 1;
                    bits.pos += usize::from(e & 15);
                }
                continue;
            }
            if sym == 256 {
                return Ok(());
            }
            let s = (sym - 257) as usize;
            if s >= LEN_BASE.len() {
                return Err(Stop::Invalid("invalid literal/length code"));
            }
            let extra = u32::from(LEN_EXTRA[s]);
            let len = LEN_BASE[s] as usize + (w & ((1 << extra) - 1)) as usize;
            w >>= extra;
            let Some((d, dl)) = self.dist.lookup(w) else {
                return Err(Stop::Invalid("invalid distance code"));
            };
            let d = usize::from(d);
            if d >= DIST_BASE.len() {
                return Err(Stop::Invalid("invalid distance code"));
            }
            w >>= dl;
            let dextra = u32::from(DIST_EXTRA[d]);
            let dist = DIST_BASE[d] as usize + (w & ((1 << dextra) - 1)) as usize;
            bits.pos += (extra + dl + dextra) as usize;
            let have = *n;
            if dist > have + WINDOW {
                return Err(Stop::Invalid("invalid distance too far back"));
            }
            if dist > have {
                // From the window: markers, then maybe output.
                let from_window = (dist - have).min(len);
                let first = (WINDOW - (dist - have)) as u16 + MARKER;
                for (k, v) in out[have..have + from_window].iter_mut().enumerate() {
                    *v = first + k as u16;
                }
                for i in have + from_window..have + len {
                    out[i] = out[i - dist];
                }
            } else if dist >= COPY_STEP && len <= 2 * COPY_STEP {
                // Short copies, most of text's: a step or two, each
                // reading only values already final.
                let mut at = have;
                while at < have + len {
                    let (done, room) = out.split_at_mut(at);
                    room[..COPY_STEP].copy_from_slice(&done[at - dist..at - dist + COPY_STEP]);
                    at += COPY_STEP;
                }
            } else if len <= 2 * COPY_STEP {
                // Overlapping and short: the values repeat with period
                // `dist`, so once a whole number of periods a step long or
                // more is written, the rest is steps from that far back.
                let back = COPY_STEP.div_ceil(dist) * dist;
                let head = back.min(len);
                for i in have..have + head {
                    out[i] = out[i - dist];
                }
                let mut at = have + head;
                while at < have + len {
                    let (done, room) = out.split_at_mut(at);
                    room[..COPY_STEP].copy_from_slice(&done[at - back..at - back + COPY_STEP]);
                    at += COPY_STEP;
                }
            } else {
                // Long: in runs that double, each a whole number of periods
                // of the repeating `dist` values but the last (one run when
                // the copy does not overlap).
                let start = have - dist;
                let mut copied = 0;
                while copied < len {
                    let m = (len - copied).min(dist + copied);
                    let (done, room) = out.split_at_mut(have + copied);
                    room[..m].copy_from_slice(&done[start..start + m]);
                    copied += m;
                }
            }
            *n = have + len;
        }
    }
}

/// Values a copy moves at once in [`MarkerDecoder::codes`].
const COPY_STEP: usize = 16;

/// Room kept past the output while decoding codes: the longest copy, two
/// literals, and a short copy's overrun.
const ROOM: usize = 258 + 2 + COPY_STEP;

/// Values the room grows by at once (each growth zero-fills them).
const GROW: usize = 4 << 10;

/// Make `out` at least `end` long, `more` past that if it must grow (the
/// new values are zeros, written once: room, not output).
fn make_room(out: &mut Vec<u16>, end: usize, more: usize) {
    if out.len() < end {
        out.resize(end + more, 0);
    }
}

/// For the 13 bits a dynamic block header starts with (type, HLIT,
/// HDIST): true when they could start a non-final dynamic block.
const HEAD_OK: [bool; 1 << 13] = {
    let mut t = [false; 1 << 13];
    let mut i = 0;
    while i < t.len() {
        t[i] = i & 7 == 0b100 && (i >> 3) & 31 <= 29 && (i >> 8) & 31 <= 29;
        i += 1;
    }
    t
};

/// Where in its byte a stored block is said to start ([`place`]).
const STORED_PHASE: usize = 5;

/// True when a non-final stored block can be read from `pos`: the bits from
/// there to the next byte boundary are zero (the header's three, then the
/// padding zlib writes as zeros), the lengths that follow agree, and the
/// block after it is not a fixed-code one. Lengths that agree by chance are
/// met every 64 KiB or so, and fixed-code blocks decode from almost any
/// bits, so such a "stored block" could not be checked (a stream of zlib's
/// `Z_FIXED` had a false one in every chunk).
///
/// Where such a block really starts cannot be told from the bits: the
/// block before may end in zero bits too. Reading from any of those places
/// gives the same block, so one of them stands for all of them: the latest,
/// three bits before the byte boundary ([`place`]). The search returns
/// it, decoders report a boundary there as it, and a stretch whole-inflated
/// up to it ends in an empty stored block (`whole::rebase`).
pub fn stored_at(data: &[u8], pos: usize) -> bool {
    let q = (pos + 3).div_ceil(8);
    let Some(h) = data.get(q..q + 4) else {
        return false;
    };
    let len = u16::from_le_bytes([h[0], h[1]]);
    len == !u16::from_le_bytes([h[2], h[3]])
        && (pos..q * 8).all(|b| data[b / 8] >> (b % 8) & 1 == 0)
        && Bits::new(data, (q + 4 + usize::from(len)) * 8).peek() & 6 != 2
}

/// For block boundary `pos`: the place that stands for it (the latest
/// place its stored block could start at, [`stored_at`], or `pos` itself),
/// and whether the block there is of a kind [`find_block`] looks for, and
/// so where a chunk's decoder stops: a non-final stored block (the runs of
/// them gzip writes for data that does not compress) or a non-final
/// dynamic one.
pub fn place(data: &[u8], pos: usize) -> (usize, bool) {
    if stored_at(data, pos) {
        ((pos + 3).div_ceil(8) * 8 - 3, true)
    } else {
        (pos, Bits::new(data, pos).peek() & 7 == 0b100)
    }
}

/// The first bit position in `from..to` where a non-final dynamic block,
/// or a non-final stored block (at the [`place`] that stands for it),
/// starts whose header and whole first block decode without error and
/// whose next blocks decode too (three of them). The decoder holds that block's
/// output on return. Wrong guesses are possible in principle (the checks
/// make them very rare); the caller's stitching finds them.
pub fn find_block(
    dec: &mut MarkerDecoder,
    data: &[u8],
    from: usize,
    to: usize,
) -> Option<(usize, BlockEnd, usize)> {
    let to = to.min(data.len() * 8);
    let mut pos = from;
    while pos < to {
        // Cheap filters before any table is built: three type bits and the
        // symbol counts (a table lookup, eight positions per load), then a
        // complete code-length code.
        let byte = pos & !7;
        let base = Bits::new(data, byte).peek();
        let mut o = pos & 7;
        while o < 8 && !HEAD_OK[((base >> o) & 0x1fff) as usize] {
            o += 1;
        }
        // A stored block, at its canonical place in this byte, before any
        // dynamic candidate after that place.
        if pos & 7 <= STORED_PHASE && o > STORED_PHASE && stored_at(data, byte + STORED_PHASE) {
            pos = byte + STORED_PHASE;
            if pos >= to {
                break;
            }
            if let Some(found) = try_block(dec, data, pos).filter(|f| !inside_stored_run(data, f.0))
            {
                return Some(found);
            }
            pos += 1;
            continue;
        }
        if o == 8 {
            pos = (pos & !7) + 8;
            continue;
        }
        pos = (pos & !7) + o;
        if pos >= to {
            break;
        }
        if !cl_code_ok(Bits::new(data, pos + 13)) {
            pos += 1;
            continue;
        }
        if let Some(found) = try_block(dec, data, pos).filter(|f| !inside_stored_run(data, f.0)) {
            return Some(found);
        }
        pos += 1;
    }
    dec.clear();
    None
}

/// Most bytes a stored block holds.
const STORED_MAX: usize = 65535;

/// The length a stored block's LEN and NLEN at byte `q` give, if they
/// agree.
fn stored_len_at(data: &[u8], q: usize) -> Option<usize> {
    let h = data.get(q..q + 4)?;
    let len = u16::from_le_bytes([h[0], h[1]]);
    (len == !u16::from_le_bytes([h[2], h[3]])).then_some(usize::from(len))
}

/// A stored block starts at byte `e`, as one does right after another's
/// data: a header byte of type 00 with zero padding (the final bit
/// either), then lengths that agree.
fn stored_starts_at(data: &[u8], e: usize) -> bool {
    data.get(e).is_some_and(|&b| b & 0xfe == 0) && stored_len_at(data, e + 1).is_some()
}

/// True when bit `pos` lies in the data of a stored block that is one of a
/// run (another stored block starts right after its data, or it starts
/// right after another's): no block starts there. A `.gz` stored whole in
/// a member (a tar of files that do not compress, which gzip stores in
/// runs of blocks of 16-64 KiB) holds a DEFLATE stream whose blocks
/// decode, each of them, so a candidate in it passes every other check;
/// in a tar of /usr such candidates had whole chunks decoded again on one
/// core (test `a_long_deflate_stream_inside_stored_blocks_is_no_block_start`).
/// Lengths that agree by chance (one place in 65 536), twice in a row at
/// the right distance, are rare enough that a real block start is almost
/// never taken for one (and then the next is found instead).
pub(crate) fn inside_stored_run(data: &[u8], pos: usize) -> bool {
    let p = pos / 8;
    let lo = p.saturating_sub(STORED_MAX + 4);
    (lo..p.saturating_sub(3)).rev().any(|q| {
        stored_len_at(data, q).is_some_and(|len| {
            let end = q + 4 + len;
            p < end
                && (stored_starts_at(data, end)
                    || q.checked_sub(1)
                        .is_some_and(|e| stored_run_ends_at(data, e)))
        })
    })
}

/// Another stored block's data ends at byte `e` and a stored block starts
/// there ([`stored_starts_at`]).
fn stored_run_ends_at(data: &[u8], e: usize) -> bool {
    if !stored_starts_at(data, e) {
        return false;
    }
    let lo = e.saturating_sub(STORED_MAX + 4);
    (lo..e.saturating_sub(3)).any(|q| stored_len_at(data, q).is_some_and(|len| q + 4 + len == e))
}

/// The block at `pos` and the ones after it decode ([`find_block`]).
fn try_block(dec: &mut MarkerDecoder, data: &[u8], pos: usize) -> Option<(usize, BlockEnd, usize)> {
    dec.clear();
    let mut bits = Bits::new(data, pos);
    let end = dec.block(&mut bits).ok()?;
    let next = bits.pos();
    let ok = match end {
        BlockEnd::Last => member_may_end(data, next),
        BlockEnd::More => next_block_decodes(dec, data, next),
    };
    ok.then_some((pos, end, next))
}

/// True when the code-length code whose HCLEN and lengths `bits` is at
/// is complete (zlib writes no other).
fn cl_code_ok(mut bits: Bits) -> bool {
    let hclen = bits.take(4) as usize + 4;
    let mut count = [0u16; 8];
    for _ in 0..hclen {
        count[bits.take(3) as usize] += 1;
    }
    let mut left: i32 = 1;
    for &c in &count[1..8] {
        left = (left << 1) - i32::from(c);
        if left < 0 {
            return false;
        }
    }
    left == 0
}

/// Blocks checked after a candidate's first one.
const CONFIRM_BLOCKS: usize = 3;

/// The blocks after a candidate's first one decode too, up to
/// [`CONFIRM_BLOCKS`] of them or the end of the stream or data: in the
/// random bytes of stored blocks of a real image, a garbage "block" was seen
/// to decode followed by another one.
fn next_block_decodes(dec: &mut MarkerDecoder, data: &[u8], pos: usize) -> bool {
    if !next_header_plausible(dec, data, pos) {
        return false;
    }
    let mark = dec.output().len();
    let mut bits = Bits::new(data, pos);
    let mut ok = true;
    for _ in 0..CONFIRM_BLOCKS {
        match dec.block(&mut bits) {
            Ok(BlockEnd::More) => continue,
            Ok(BlockEnd::Last) => {
                ok = member_may_end(data, bits.pos());
                break;
            }
            Err(Stop::OutOfData) => break,
            Err(Stop::Invalid(_)) => {
                ok = false;
                break;
            }
        }
    }
    dec.truncate(mark);
    ok
}

/// True when a gzip member could end with a final block that ends at bit
/// `end`: the member's 8-byte trailer follows, then the data's end or the
/// next member's magic (or the data ends too soon to tell). A candidate
/// whose blocks reach a final one anywhere else is the DEFLATE stream of a
/// file stored whole in the member (a `.gz`, a zip entry in a tar), whose
/// blocks all decode: an inner stream of two to four blocks passed every
/// other check (test `a_deflate_stream_stored_inside_is_no_block_start`).
fn member_may_end(data: &[u8], end: usize) -> bool {
    const TRAILER: usize = 8;
    let rest = &data[end.div_ceil(8).min(data.len())..];
    match rest.get(TRAILER..) {
        None | Some([]) => true,
        Some(next) => next.starts_with(&[0x1f, 0x8b][..next.len().min(2)]),
    }
}

/// A next block header that could be real: not the reserved type, a
/// stored block's lengths that agree, a dynamic block's tables that build.
fn next_header_plausible(dec: &mut MarkerDecoder, data: &[u8], pos: usize) -> bool {
    let mut bits = Bits::new(data, pos);
    let head = bits.take(3);
    match head >> 1 {
        0 => {
            let at = (pos + 3).div_ceil(8);
            match data.get(at..at + 4) {
                Some(h) => u16::from_le_bytes([h[0], h[1]]) == !u16::from_le_bytes([h[2], h[3]]),
                None => true,
            }
        }
        1 => true,
        2 => !matches!(dec.dynamic_header(&mut bits), Err(Stop::Invalid(_))),
        _ => false,
    }
}

/// Turns 16-bit output into bytes once the window before it is known: one
/// table lookup per value (bytes map to themselves, markers to the window).
pub struct Resolver {
    lut: Vec<u8>,
    /// Window bytes missing at its start (a chunk near the stream's start).
    missing: usize,
}

impl Resolver {
    /// For the `window`: the 32 KiB before the chunk, or fewer at the start
    /// of a stream, when a marker into the missing part is damage.
    pub fn new(window: &[u8]) -> Self {
        let have = window.len().min(WINDOW);
        let missing = WINDOW - have;
        let mut lut = Vec::with_capacity(MARKER as usize + WINDOW);
        lut.extend(0..=255u8);
        lut.resize(MARKER as usize + missing, 0);
        lut.extend_from_slice(&window[window.len() - have..]);
        Resolver { lut, missing }
    }

    /// Append the bytes `out` stands for to `dst`; `at` names the place in
    /// errors.
    pub fn resolve(&self, out: &[u16], dst: &mut Vec<u8>, at: u64) -> Result<()> {
        let lut = &self.lut[..MARKER as usize + WINDOW];
        dst.extend(out.iter().map(|&v| lut[usize::from(v).min(lut.len() - 1)]));
        if self.missing > 0 {
            let lo = MARKER as usize;
            let hi = lo + self.missing;
            if out.iter().any(|&v| (lo..hi).contains(&usize::from(v))) {
                return Err(CodecError::corrupt(
                    NAME,
                    at,
                    "invalid distance too far back",
                ));
            }
        }
        Ok(())
    }
}

/// Turn 16-bit output into bytes with the `window` now known (see
/// [`Resolver`]).
pub fn resolve(out: &[u16], window: &[u8], dst: &mut Vec<u8>, at: u64) -> Result<()> {
    Resolver::new(window).resolve(out, dst, at)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;

    /// Every code of a complete code with lengths 1 to 15 (longer than the
    /// table, so decoded a bit at a time), written LSB first as DEFLATE
    /// does, decodes to its symbol and length; a table of one short code
    /// decodes too.
    #[test]
    fn codes_longer_than_the_table_decode() {
        // Lengths 1, 2, ..., 14, 15, 15: complete (Kraft sum 1).
        let mut lengths: Vec<u8> = (1..=15).collect();
        lengths.push(15);
        // Symbols in an order other than by length.
        lengths.reverse();
        let mut t = Table::empty();
        t.build(&lengths, true, false).unwrap();
        assert_eq!(t.bits, TABLE_BITS);
        let mut next = [0u16; 16];
        let mut count = [0u16; 16];
        for &l in &lengths {
            count[l as usize] += 1;
        }
        let mut code = 0u16;
        for l in 1..16 {
            code = (code + count[l - 1]) << 1;
            next[l] = code;
        }
        for (sym, &l) in lengths.iter().enumerate() {
            let c = next[l as usize];
            next[l as usize] += 1;
            // The code's bits in stream order, then ones after it.
            let rev = u64::from(c.reverse_bits() >> (16 - l));
            let w = rev | (u64::MAX << l);
            assert_eq!(
                t.lookup(w),
                Some((sym as u16, u32::from(l))),
                "symbol {sym}"
            );
        }
        t.build(&[0, 1, 0], false, false).unwrap();
        assert_eq!(t.lookup(0), Some((1, 1)));
        assert_eq!(t.lookup(1), None, "the other one-bit pattern is no code");
    }
}
