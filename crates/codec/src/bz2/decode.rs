//! A bzip2 stream decoder.
//!
//! A block is undone in passes, each a tight loop over one array:
//!
//! 1. Huffman symbols are read with a 64-bit bit buffer and a 10-bit
//!    lookup table per coding group (longer codes, rare by construction,
//!    take a canonical-code search), and the move-to-front and RUNA/RUNB
//!    steps turn them into the block's BWT column `ll`.
//! 2. The inverse BWT follows one link per byte (`fwd[row]` = next row
//!    << 8 | byte), each a cache miss in a 3.6 MB table whose address is
//!    the value of the load before: latency bound. Rows at fixed strides
//!    are marked and the cycle is walked as segments between marks, 16 at
//!    a time, so the core overlaps their misses (see `Walk`); that makes
//!    the walk several times faster than one chain.
//! 3. The first run-length pass is undone into the output in bulk copies
//!    and fills, and the block CRC is computed over what was written.
//!
//! Every field a damaged stream can break is checked; errors carry the
//! byte offset in the stream where they were noticed. Blocks with the
//! obsolete "randomised" bit (bzip2 0.9.0 and older) are handed to
//! libbzip2, which still carries the table they need.

use super::{block_crc, combine, BLOCK_MAGIC, EOS_MAGIC};
use crate::error::{CodecError, Result};

const NAME: &str = "bzip2";
/// Symbols per Huffman group (one selector each).
const GROUP_SIZE: usize = 50;
/// Selectors libbzip2 keeps; it reads but ignores any beyond (1.0.8).
const MAX_SELECTORS: usize = 18002;
const MAX_GROUPS: usize = 6;
/// 256 move-to-front positions (less the one RUNA/RUNB stand for), RUNA,
/// RUNB and end-of-block.
const MAX_ALPHA: usize = 258;
const MAX_CODE_LEN: u32 = 20;
/// Bits resolved by one lookup in the primary Huffman table.
const FAST_BITS: u32 = 10;

/// Why decoding stopped.
enum Fail {
    Codec(CodecError),
    /// A randomised block: left to libbzip2.
    Randomised,
}

impl From<CodecError> for Fail {
    fn from(e: CodecError) -> Self {
        Fail::Codec(e)
    }
}

type Res<T> = std::result::Result<T, Fail>;

/// Reads bits most significant first, as bzip2 writes them. Past the end
/// of the input it reads zeros and remembers that it did, so the hot loops
/// need no end checks; any error (and the end of the stream) is then
/// reported as a truncation.
struct Bits<'a> {
    src: &'a [u8],
    /// Next byte to load into `buf`.
    pos: usize,
    /// Left-aligned unread bits.
    buf: u64,
    /// How many bits of `buf` are valid.
    count: u32,
}

impl<'a> Bits<'a> {
    fn new(src: &'a [u8], pos: usize) -> Self {
        Bits {
            src,
            pos,
            buf: 0,
            count: 0,
        }
    }

    /// Tops the buffer up to at least 56 bits.
    #[inline(always)]
    fn refill(&mut self) {
        if let Some(w) = self.src.get(self.pos..).and_then(|s| s.first_chunk::<8>()) {
            // Load 8 bytes, keep the whole ones that fit behind what is
            // left; the next load overlaps the rest.
            self.buf |= u64::from_be_bytes(*w) >> self.count;
            let take = (63 - self.count) / 8;
            self.pos += take as usize;
            self.count += take * 8;
        } else {
            self.refill_slowly();
        }
    }

    #[cold]
    fn refill_slowly(&mut self) {
        while self.count <= 56 {
            let b = self.src.get(self.pos).copied().unwrap_or(0);
            self.buf |= u64::from(b) << (56 - self.count);
            self.pos += 1;
            self.count += 8;
        }
    }

    /// The next `n` (1..=32) bits.
    #[inline(always)]
    fn get(&mut self, n: u32) -> u32 {
        if self.count < n {
            self.refill();
        }
        let v = (self.buf >> (64 - n)) as u32;
        self.consume(n);
        v
    }

    #[inline(always)]
    fn bit(&mut self) -> bool {
        self.get(1) == 1
    }

    #[inline(always)]
    fn consume(&mut self, n: u32) {
        self.buf <<= n;
        self.count -= n;
    }

    /// Bits read so far, from the start of `src`.
    fn bit_pos(&self) -> usize {
        self.pos * 8 - self.count as usize
    }

    /// Whether more bits were read than `src` holds.
    fn overrun(&self) -> bool {
        self.bit_pos() > self.src.len() * 8
    }

    /// An error noticed at the current position: a truncation if the
    /// reader has run past the end (the zeros it read there are what
    /// looked wrong), else corrupt data.
    #[cold]
    fn corrupt(&self, reason: impl Into<String>) -> Fail {
        if self.overrun() {
            return self.truncated();
        }
        Fail::Codec(CodecError::corrupt(
            NAME,
            (self.bit_pos() / 8) as u64,
            reason,
        ))
    }

    #[cold]
    fn truncated(&self) -> Fail {
        Fail::Codec(CodecError::Truncated {
            format: NAME,
            offset: self.src.len() as u64,
        })
    }
}

/// Huffman decoding table of one coding group.
#[derive(Clone)]
struct Table {
    /// Indexed by the next `FAST_BITS` bits: `symbol | length << 9` for
    /// codes of at most `FAST_BITS` bits, 0 when the code is longer (or the
    /// bits are no code at all).
    fast: [u16; 1 << FAST_BITS],
    /// `limit[l]`: first 20-bit left-aligned value past the codes of length
    /// `l`; canonical codes grow with their length, so the length of the
    /// code at the head of the buffer is the first `l` whose limit is above
    /// it.
    limit: [u32; MAX_CODE_LEN as usize + 1],
    /// `first[l]`: the first code of length `l`.
    first: [u32; MAX_CODE_LEN as usize + 1],
    /// `index[l]`: where the symbols of length `l` start in `perm`.
    index: [u16; MAX_CODE_LEN as usize + 1],
    /// Symbols in code order.
    perm: [u16; MAX_ALPHA],
    max_len: u32,
}

impl Table {
    fn new() -> Self {
        Table {
            fast: [0; 1 << FAST_BITS],
            limit: [0; MAX_CODE_LEN as usize + 1],
            first: [0; MAX_CODE_LEN as usize + 1],
            index: [0; MAX_CODE_LEN as usize + 1],
            perm: [0; MAX_ALPHA],
            max_len: 0,
        }
    }

    /// Builds the table for code `lens` (each 1..=20); `false` if the
    /// lengths over-subscribe the code space (no encoder writes that). An
    /// incomplete code is accepted, as libbzip2 does; its unused bit
    /// patterns are an error when met.
    fn build(&mut self, lens: &[u8]) -> bool {
        let mut count = [0u32; MAX_CODE_LEN as usize + 2];
        for &l in lens {
            count[usize::from(l)] += 1;
        }
        self.fast.fill(0);
        self.max_len = 0;
        let mut code = 0u32;
        let mut idx = 0u16;
        for l in 1..=MAX_CODE_LEN {
            let c = count[l as usize];
            self.first[l as usize] = code;
            self.index[l as usize] = idx;
            code += c;
            if code > 1 << l {
                return false;
            }
            self.limit[l as usize] = code << (MAX_CODE_LEN - l);
            if c > 0 {
                self.max_len = l;
            }
            idx += c as u16;
            code <<= 1;
        }
        // Symbols in canonical order: by length, then by value.
        let mut next = self.index;
        for (sym, &l) in lens.iter().enumerate() {
            let slot = &mut next[usize::from(l)];
            self.perm[usize::from(*slot)] = sym as u16;
            *slot += 1;
        }
        for l in 1..=FAST_BITS.min(self.max_len) {
            let (lo, hi) = (
                usize::from(self.index[l as usize]),
                usize::from(self.index[l as usize + 1]),
            );
            let span = 1usize << (FAST_BITS - l);
            for (k, &sym) in self.perm[lo..hi].iter().enumerate() {
                let code = self.first[l as usize] as usize + k;
                let entry = sym | (l as u16) << 9;
                self.fast[code * span..(code + 1) * span].fill(entry);
            }
        }
        true
    }

    /// The symbol of a code longer than `FAST_BITS` bits at the head of
    /// `head` (20 bits, left-aligned in a u32's low bits), and its length.
    #[cold]
    #[inline(never)]
    fn slow(&self, head: u32) -> Option<(u16, u32)> {
        for l in FAST_BITS + 1..=self.max_len {
            if head < self.limit[l as usize] {
                let code = head >> (MAX_CODE_LEN - l);
                let k = code - self.first[l as usize] + u32::from(self.index[l as usize]);
                return Some((*self.perm.get(k as usize)?, l));
            }
        }
        None
    }
}

/// A bzip2 stream decoder whose buffers are kept from block to block, so a
/// worker that keeps it allocates nothing per block in the steady state.
pub struct StreamDecoder {
    /// The BWT column of the current block (move-to-front output).
    ll: Vec<u8>,
    /// Forward inverse-BWT links: next row << 8 | byte.
    fwd: Vec<u32>,
    /// Where the walk's chains write their chunks.
    pool: Vec<u8>,
    pieces: Vec<Piece>,
    /// The block before its run-length pass is undone.
    text: Vec<u8>,
    selectors: Vec<u8>,
    tables: Vec<Table>,
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamDecoder {
    /// A decoder; buffers grow to the largest block size seen.
    pub fn new() -> Self {
        StreamDecoder {
            ll: Vec::new(),
            fwd: Vec::new(),
            pool: Vec::new(),
            pieces: Vec::new(),
            text: Vec::new(),
            selectors: Vec::new(),
            tables: vec![Table::new(); MAX_GROUPS],
        }
    }

    /// Decodes the bzip2 stream at the start of `src` (header, blocks,
    /// end-of-stream marker and combined CRC), appending its content to
    /// `out`; more than `limit` bytes of content is an error. Returns the
    /// stream's length in bytes; `src` may go on after it. On error `out`
    /// is left as it was.
    pub fn decode(&mut self, src: &[u8], out: &mut Vec<u8>, limit: usize) -> Result<usize> {
        let start = out.len();
        match self.decode_inner(src, out, limit) {
            Ok(n) => Ok(n),
            Err(fail) => {
                out.truncate(start);
                match fail {
                    Fail::Codec(e) => Err(e),
                    Fail::Randomised => libbzip2_stream(src, out, limit),
                }
            }
        }
    }

    fn decode_inner(&mut self, src: &[u8], out: &mut Vec<u8>, limit: usize) -> Res<usize> {
        let start = out.len();
        let level = match src {
            [b'B', b'Z', b'h', d @ b'1'..=b'9', ..] => usize::from(d - b'0'),
            [b'B', b'Z', b'h', d, ..] => {
                return Err(CodecError::corrupt(
                    NAME,
                    3,
                    format!("bad block size {d:#04x} in the stream header"),
                )
                .into())
            }
            _ if src.len() < 4 && b"BZh".starts_with(&src[..src.len().min(3)]) => {
                return Err(CodecError::Truncated {
                    format: NAME,
                    offset: src.len() as u64,
                }
                .into())
            }
            _ => {
                return Err(
                    CodecError::corrupt(NAME, 0, "not a bzip2 stream (no \"BZh\" header)").into(),
                )
            }
        };
        let max_block = level * 100_000;
        self.grow(max_block);
        let mut br = Bits::new(src, 4);
        let mut combined = 0u32;
        loop {
            let magic = u64::from(br.get(24)) << 24 | u64::from(br.get(24));
            let stored = br.get(32);
            match magic {
                BLOCK_MAGIC => {
                    let block_start = out.len();
                    self.block(&mut br, max_block, out, limit - (block_start - start))?;
                    let crc = block_crc(&out[block_start..]);
                    if crc != stored {
                        return Err(br.corrupt(format!(
                            "block CRC mismatch: stored {stored:08x}, computed {crc:08x}"
                        )));
                    }
                    combined = combine(combined, stored);
                }
                EOS_MAGIC => {
                    if br.overrun() {
                        return Err(br.truncated());
                    }
                    if stored != combined {
                        return Err(br.corrupt(format!(
                            "stream CRC mismatch: stored {stored:08x}, computed {combined:08x}"
                        )));
                    }
                    return Ok(br.bit_pos().div_ceil(8));
                }
                _ => return Err(br.corrupt("expected a block or end-of-stream marker")),
            }
        }
    }

    /// Sizes the BWT column for blocks of up to `max` bytes; buffers only
    /// ever grow, so a kept decoder allocates nothing in the steady state.
    fn grow(&mut self, max: usize) {
        if self.ll.len() < max {
            self.ll.resize(max, 0);
        }
    }

    /// Decodes one block (after its magic and CRC) onto `out`, at most
    /// `room` bytes.
    fn block(
        &mut self,
        br: &mut Bits,
        max_block: usize,
        out: &mut Vec<u8>,
        room: usize,
    ) -> Res<()> {
        if br.bit() {
            return Err(Fail::Randomised);
        }
        let orig_ptr = br.get(24) as usize;
        if orig_ptr >= max_block + 10 {
            return Err(br.corrupt(format!("origPtr {orig_ptr} out of range")));
        }
        // Which byte values occur, 16 at a time.
        let mut in_use = [0u8; 256];
        let mut n_in_use = 0;
        let map = br.get(16);
        for i in 0..16 {
            if map & (0x8000 >> i) != 0 {
                let bits = br.get(16);
                for j in 0..16 {
                    if bits & (0x8000 >> j) != 0 {
                        in_use[n_in_use] = (i * 16 + j) as u8;
                        n_in_use += 1;
                    }
                }
            }
        }
        if n_in_use == 0 {
            return Err(br.corrupt("no byte values in use"));
        }
        let alpha = n_in_use + 2;
        let groups = br.get(3) as usize;
        if !(2..=MAX_GROUPS).contains(&groups) {
            return Err(br.corrupt(format!("{groups} Huffman groups (2 to 6 allowed)")));
        }
        self.read_selectors(br, groups)?;
        self.read_tables(br, groups, alpha)?;
        let n = self.read_symbols(br, &in_use, n_in_use, max_block)?;
        if orig_ptr >= n {
            return Err(br.corrupt(format!("origPtr {orig_ptr} beyond the block's {n} bytes")));
        }
        // Sized to the block, not the level: small blocks (and streams
        // that stop short) touch no more memory than they need.
        if self.fwd.len() < n {
            self.fwd.resize(n, 0);
            self.text.resize(n, 0);
        }
        self.inverse_bwt(n, orig_ptr).map_err(|e| br.corrupt(e))?;
        unrle(&self.text[..n], out, room).map_err(|e| br.corrupt(e))
    }

    /// Reads the selectors (which table codes each group of 50 symbols),
    /// stored move-to-front coded in unary.
    fn read_selectors(&mut self, br: &mut Bits, groups: usize) -> Res<()> {
        let count = br.get(15) as usize;
        if count == 0 {
            return Err(br.corrupt("no selectors"));
        }
        let mut mtf = [0u8, 1, 2, 3, 4, 5];
        self.selectors.clear();
        for _ in 0..count {
            let mut j = 0;
            while br.bit() {
                j += 1;
                if j >= groups {
                    return Err(br.corrupt("selector beyond the group count"));
                }
            }
            let v = mtf[j];
            mtf.copy_within(0..j, 1);
            mtf[0] = v;
            if self.selectors.len() < MAX_SELECTORS {
                self.selectors.push(v);
            }
        }
        Ok(())
    }

    /// Reads each group's delta-coded code lengths and builds its table.
    fn read_tables(&mut self, br: &mut Bits, groups: usize, alpha: usize) -> Res<()> {
        let mut lens = [0u8; MAX_ALPHA];
        for t in 0..groups {
            let mut len = br.get(5);
            for l in &mut lens[..alpha] {
                loop {
                    if !(1..=MAX_CODE_LEN).contains(&len) {
                        return Err(br.corrupt(format!("code length {len} (1 to 20 allowed)")));
                    }
                    if !br.bit() {
                        break;
                    }
                    if br.bit() {
                        len -= 1;
                    } else {
                        len += 1;
                    }
                }
                *l = len as u8;
            }
            if !self.tables[t].build(&lens[..alpha]) {
                return Err(br.corrupt("over-subscribed Huffman code"));
            }
        }
        Ok(())
    }

    /// Decodes the block's symbols into `ll` (undoing move-to-front and the
    /// RUNA/RUNB zero-run coding) up to end-of-block; returns the length.
    #[inline(never)]
    fn read_symbols(
        &mut self,
        br: &mut Bits,
        in_use: &[u8; 256],
        n_in_use: usize,
        max_block: usize,
    ) -> Res<usize> {
        let eob = (n_in_use + 1) as u16;
        let mut mtf = *in_use;
        let ll = &mut self.ll[..max_block];
        let mut n = 0usize;
        // Pending zero run: its length and the weight of the next digit.
        let mut run = 0usize;
        let mut weight = 1usize;
        let mut selectors = self.selectors.iter();
        let mut table = &self.tables[0];
        let mut left = 0;
        loop {
            if left == 0 {
                let Some(&s) = selectors.next() else {
                    return Err(br.corrupt("block data runs past its last selector"));
                };
                table = match self.tables.get(usize::from(s)) {
                    Some(t) => t,
                    None => return Err(br.corrupt("selector out of range")),
                };
                left = GROUP_SIZE;
            }
            left -= 1;
            if br.count < MAX_CODE_LEN {
                br.refill();
            }
            let e = table.fast[(br.buf >> (64 - FAST_BITS)) as usize];
            let sym = if e != 0 {
                br.consume(u32::from(e >> 9));
                e & 0x1ff
            } else {
                let Some((sym, l)) = table.slow((br.buf >> (64 - MAX_CODE_LEN)) as u32) else {
                    return Err(br.corrupt("invalid Huffman code"));
                };
                br.consume(l);
                sym
            };
            if sym <= 1 {
                // RUNA/RUNB: a digit (1 or 2) of a bijective base-2 count.
                run += weight << sym;
                weight <<= 1;
                if run > max_block {
                    return Err(br.corrupt("zero run longer than the block"));
                }
                continue;
            }
            if run > 0 {
                let Some(dst) = ll.get_mut(n..n + run) else {
                    return Err(br.corrupt("block longer than its stated size"));
                };
                dst.fill(mtf[0]);
                n += run;
                run = 0;
                weight = 1;
            }
            if sym == eob {
                return Ok(n);
            }
            let v = move_to_front(&mut mtf, usize::from(sym - 1));
            let Some(slot) = ll.get_mut(n) else {
                return Err(br.corrupt("block longer than its stated size"));
            };
            *slot = v;
            n += 1;
        }
    }

    /// Undoes the BWT of `ll[..n]` into `text[..n]`: builds the forward
    /// links, walks them in many chains at once (see [`Walk`]) and puts
    /// the pieces together in text order.
    #[inline(never)]
    fn inverse_bwt(&mut self, n: usize, orig_ptr: usize) -> std::result::Result<(), String> {
        let ll = &self.ll[..n];
        let mut counts = [0u32; 256];
        for &b in ll {
            counts[usize::from(b)] += 1;
        }
        // Rows starting with byte b begin at the count of smaller bytes.
        let mut next = [0u32; 256];
        let mut sum = 0;
        for (c, &k) in next.iter_mut().zip(&counts) {
            *c = sum;
            sum += k;
        }
        let fwd = &mut self.fwd[..n];
        for (i, &b) in ll.iter().enumerate() {
            // Row i ends with b, so the row that starts with this b (the
            // rotation one step back) is LF(i), and row i follows it.
            let slot = &mut next[usize::from(b)];
            let lf = *slot as usize;
            *slot += 1;
            let mark = u32::from(i & (MARK_STRIDE - 1) == 0) << MARK_SHIFT;
            fwd[lf] = mark | (i as u32) << 8 | u32::from(ll[lf]);
        }
        // The text starts at the row after origPtr's: a segment start too.
        let first = ((fwd[orig_ptr] >> 8) & ROW_MASK) as usize;
        fwd[orig_ptr] |= MARK;
        let walk = Walk {
            fwd,
            marks: n.div_ceil(MARK_STRIDE),
            first,
        };
        walk.run(&mut self.pool, &mut self.pieces)?;
        walk.assemble(&self.pool, &mut self.pieces, &mut self.text[..n])
    }
}

/// Rows whose index is a multiple of this start a segment of the walk.
const MARK_STRIDE: usize = 2048;
/// Where the "next row starts a segment" flag sits in a link.
const MARK_SHIFT: u32 = 31;
const MARK: u32 = 1 << MARK_SHIFT;
/// Row numbers take 20 bits (blocks hold at most 900000 bytes).
const ROW_MASK: u32 = (1 << 20) - 1;
/// How many chains are walked at once: enough to keep the core's miss
/// buffers busy.
const CHAINS: usize = 16;
/// Output of a chain is written in chunks of this size.
const CHUNK: usize = 4096;

/// The inverse BWT is a walk along one cycle through all rows, a load per
/// byte whose address is the value of the load before: latency bound, one
/// cache miss per byte in a 3.6 MB table. To overlap misses, rows at fixed
/// strides (and the first row of the text) are marked and the cycle is cut
/// there into segments; each segment's walk starts at its mark and ends
/// where the next marked row comes, and `CHAINS` segments are walked in
/// lockstep. Segment lengths are not known beforehand, so each chain writes
/// into 4 KiB chunks of a pool, recorded as pieces; the pieces are then
/// copied out in the order of the cycle.
struct Walk<'a> {
    /// `fwd[row]` = mark flag | next row << 8 | byte.
    fwd: &'a [u32],
    /// Number of stride marks (rows 0, MARK_STRIDE, ...).
    marks: usize,
    /// The row the text starts at.
    first: usize,
}

/// A run of one segment's bytes in the pool.
#[derive(Clone, Copy, Debug)]
struct Piece {
    seg: u32,
    start: u32,
    len: u32,
    /// The row after the segment's last byte if the segment ends here,
    /// else `u32::MAX`.
    next: u32,
}

/// One chain of the walk.
#[derive(Clone, Copy, Default)]
struct Chain {
    row: u32,
    /// Write position in the pool and the end of the chain's chunk.
    at: u32,
    end: u32,
    seg: u32,
    /// Where the current piece started.
    from: u32,
}

impl Walk<'_> {
    /// The segment that starts at `row`, if a marked one does.
    fn segment_of(&self, row: usize) -> Option<u32> {
        if row % MARK_STRIDE == 0 && row < self.fwd.len() {
            Some((row / MARK_STRIDE) as u32)
        } else if row == self.first {
            Some(self.marks as u32)
        } else {
            None
        }
    }

    /// The row segment `seg` starts at.
    fn start_of(&self, seg: usize) -> usize {
        if seg == self.marks {
            self.first
        } else {
            seg * MARK_STRIDE
        }
    }

    fn segments(&self) -> usize {
        // The text's first row gets a segment of its own unless it is a
        // stride mark already.
        self.marks + usize::from(self.first % MARK_STRIDE != 0)
    }

    /// Walks every segment into `pool`, recording the pieces.
    #[inline(never)]
    fn run(&self, pool: &mut Vec<u8>, pieces: &mut Vec<Piece>) -> std::result::Result<(), String> {
        let n = self.fwd.len();
        // Every row is read at most once and each chain wastes at most the
        // rest of one chunk when it ends.
        let need = (n / CHUNK + CHAINS + 1) * CHUNK;
        if pool.len() < need {
            pool.resize(need, 0);
        }
        pieces.clear();
        let segments = self.segments();
        let mut next_seg = 0;
        let mut next_chunk = 0;
        let mut chains = [Chain::default(); CHAINS];
        let mut active = 0;
        while active < CHAINS && next_seg < segments {
            let at = (next_chunk * CHUNK) as u32;
            next_chunk += 1;
            let row = self.start_of(next_seg) as u32;
            chains[active] = Chain {
                row,
                at,
                end: at + CHUNK as u32,
                seg: next_seg as u32,
                from: at,
            };
            next_seg += 1;
            active += 1;
        }
        let too_long = || "the BWT walk runs longer than the block".to_string();
        while active > 0 {
            let mut k = 0;
            while k < active {
                let c = &mut chains[k];
                let e = self.fwd[c.row as usize];
                let Some(slot) = pool.get_mut(c.at as usize) else {
                    return Err(too_long());
                };
                *slot = e as u8;
                c.at += 1;
                c.row = (e >> 8) & ROW_MASK;
                if e & MARK == 0 && c.at != c.end {
                    k += 1;
                    continue;
                }
                // A segment or a chunk ends: record the piece.
                pieces.push(Piece {
                    seg: c.seg,
                    start: c.from,
                    len: c.at - c.from,
                    next: if e & MARK != 0 { c.row } else { u32::MAX },
                });
                if c.at == c.end {
                    c.at = (next_chunk * CHUNK) as u32;
                    c.end = c.at + CHUNK as u32;
                    next_chunk += 1;
                }
                c.from = c.at;
                if e & MARK == 0 {
                    k += 1;
                    continue;
                }
                // The segment ends here; the next unwalked one follows.
                if next_seg < segments {
                    c.row = self.start_of(next_seg) as u32;
                    c.seg = next_seg as u32;
                    next_seg += 1;
                    k += 1;
                } else {
                    active -= 1;
                    chains.swap(k, active);
                }
            }
        }
        Ok(())
    }

    /// Copies the walked pieces of the cycle through the text's first row
    /// into `text`, in order.
    #[inline(never)]
    fn assemble(
        &self,
        pool: &[u8],
        pieces: &mut [Piece],
        text: &mut [u8],
    ) -> std::result::Result<(), String> {
        let broken = || "damaged BWT links".to_string();
        // Pieces of one segment stay in the order they were written.
        pieces.sort_by_key(|p| p.seg);
        let start = self.segment_of(self.first).ok_or_else(broken)?;
        let mut seg = start;
        let mut out = 0;
        for _ in 0..self.segments() {
            let lo = pieces.partition_point(|p| p.seg < seg);
            let hi = pieces.partition_point(|p| p.seg <= seg);
            for p in &pieces[lo..hi] {
                let (s, l) = (p.start as usize, p.len as usize);
                let dst = text.get_mut(out..out + l).ok_or_else(broken)?;
                dst.copy_from_slice(pool.get(s..s + l).ok_or_else(broken)?);
                out += l;
            }
            // The segment's last piece says where its walk stopped: at the
            // start of the next segment.
            let next = pieces[lo..hi].last().map_or(u32::MAX, |p| p.next);
            seg = self.segment_of(next as usize).ok_or_else(broken)?;
            if seg == start {
                break;
            }
        }
        if seg != start || out == 0 {
            return Err(broken());
        }
        // A block whose text repeats a shorter string exactly (w w ... w)
        // has equal rotations, and its rows form one cycle per copy; the
        // text is the cycle through its first row, over and over (a plain
        // walk of n steps gives the same).
        let mut have = out;
        while have < text.len() {
            let take = have.min(text.len() - have);
            text.copy_within(0..take, have);
            have += take;
        }
        Ok(())
    }
}

/// Moves the byte at position `k` (below 256) of the move-to-front list
/// to its front and returns it. Short moves, the common case in most data,
/// go byte by byte: byte stores forward to the next symbol's byte loads,
/// where a `memmove` by one byte makes the next one's wide loads wait for
/// its stores. Long moves, which random-looking data has as often as
/// short ones, are a `memmove`.
#[inline(always)]
fn move_to_front(mtf: &mut [u8; 256], k: usize) -> u8 {
    let v = mtf[k];
    if k < 8 {
        for j in (0..k).rev() {
            mtf[j + 1] = mtf[j];
        }
    } else {
        mtf.copy_within(0..k, 1);
    }
    mtf[0] = v;
    v
}

/// Undoes bzip2's first run-length pass (four equal bytes, then a count of
/// 0-255 more) from `text` onto `out`, at most `room` bytes.
#[inline(never)]
fn unrle(text: &[u8], out: &mut Vec<u8>, room: usize) -> std::result::Result<(), String> {
    let too_long = || format!("block expands beyond {room} bytes");
    let start = out.len();
    let n = text.len();
    // Literal bytes from `lit` on are copied in one go when a run (or the
    // end) is reached. `p` is where a run of four could start.
    let mut lit = 0;
    let mut p = 0;
    while p + 4 <= n {
        let b = text[p + 3];
        if text[p + 2] != b {
            p += 3;
            continue;
        }
        if text[p + 1] != b {
            p += 2;
            continue;
        }
        if text[p] != b {
            p += 1;
            continue;
        }
        let Some(&extra) = text.get(p + 4) else {
            return Err("run of four at the end of the block lacks its count".into());
        };
        let lits = &text[lit..p + 4];
        if out.len() - start + lits.len() + usize::from(extra) > room {
            return Err(too_long());
        }
        out.extend_from_slice(lits);
        out.resize(out.len() + usize::from(extra), b);
        p += 5;
        lit = p;
    }
    let lits = &text[lit..];
    if out.len() - start + lits.len() > room {
        return Err(too_long());
    }
    out.extend_from_slice(lits);
    Ok(())
}

/// Decodes one stream with libbzip2 (for randomised blocks), appending at
/// most `limit` bytes to `out`; returns the stream's length.
fn libbzip2_stream(src: &[u8], out: &mut Vec<u8>, limit: usize) -> Result<usize> {
    let mut d = bzip2::Decompress::new(false);
    let start = out.len();
    let fail = |out: &mut Vec<u8>, e: CodecError| {
        out.truncate(start);
        Err(e)
    };
    loop {
        let consumed = usize::try_from(d.total_in()).unwrap_or(usize::MAX);
        let rest = src.get(consumed..).unwrap_or(&[]);
        out.reserve((64 << 10).min(limit.saturating_add(1)));
        let before = out.len();
        let status = match d.decompress_vec(rest, out) {
            Ok(s) => s,
            Err(e) => {
                let e = CodecError::corrupt(NAME, d.total_in(), e.to_string());
                return fail(out, e);
            }
        };
        if out.len() - start > limit {
            let e = CodecError::corrupt(
                NAME,
                d.total_in(),
                format!("stream expands beyond {limit} bytes"),
            );
            return fail(out, e);
        }
        let now = usize::try_from(d.total_in()).unwrap_or(usize::MAX);
        match status {
            bzip2::Status::StreamEnd => return Ok(now),
            _ if out.len() == before && now == consumed => {
                let e = CodecError::Truncated {
                    format: NAME,
                    offset: src.len() as u64,
                };
                return fail(out, e);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{noise, run};
    use proptest::prelude::*;
    use std::io::Read;

    /// The reference: libbzip2 through the `bzip2` crate.
    fn lib_compress(level: u32, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        bzip2::read::BzEncoder::new(data, bzip2::Compression::new(level))
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    fn lib_decompress(src: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        bzip2::read::BzDecoder::new(src).read_to_end(&mut out)?;
        Ok(out)
    }

    fn decode(src: &[u8]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let n = StreamDecoder::new().decode(src, &mut out, usize::MAX)?;
        assert!(n <= src.len());
        Ok(out)
    }

    /// Decodes every concatenated stream of `src`.
    fn decode_all(src: &[u8]) -> Result<Vec<u8>> {
        let mut dec = StreamDecoder::new();
        let mut out = Vec::new();
        let mut at = 0;
        while at < src.len() {
            at += dec.decode(&src[at..], &mut out, usize::MAX)?;
        }
        Ok(out)
    }

    fn text(n: usize, seed: u64) -> Vec<u8> {
        const WORDS: [&str; 12] = [
            "the", "block", "sorting", "of", "bzip2", "and", "a", "tree", "\n", "aaaa", "Huffman",
            "    ",
        ];
        let r = noise(n, seed);
        let mut out = Vec::with_capacity(n + 16);
        let mut i = 0;
        while out.len() < n {
            out.extend_from_slice(WORDS[usize::from(r[i % n]) % WORDS.len()].as_bytes());
            out.push(b' ');
            i += 1;
        }
        out.truncate(n);
        out
    }

    /// Runs of assorted lengths of few values: the first run-length pass
    /// and RUNA/RUNB at work.
    fn runs(n: usize, seed: u64) -> Vec<u8> {
        let r = noise(n / 4 + 2, seed);
        let mut out = Vec::with_capacity(n + 300);
        let mut i = 0;
        while out.len() < n {
            let len = usize::from(r[i % r.len()]) + usize::from(r[(i + 1) % r.len()] & 3) * 100;
            out.resize(out.len() + len + 1, r[(i + 2) % r.len()] & 7);
            i += 3;
        }
        out.truncate(n);
        out
    }

    fn check(level: u32, data: &[u8], what: &str) {
        let packed = lib_compress(level, data);
        let back = decode(&packed).unwrap_or_else(|e| panic!("{what} level {level}: {e}"));
        assert!(back == data, "{what} level {level}: wrong output");
    }

    #[test]
    fn round_trips_edge_cases() {
        let mut cases: Vec<(String, Vec<u8>)> = vec![
            ("empty".into(), vec![]),
            ("one byte".into(), vec![b'x']),
            ("all bytes".into(), (0..=255).collect()),
            (
                "all bytes twice".into(),
                (0..512).map(|i| (i % 256) as u8).collect(),
            ),
        ];
        for n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 255, 256, 259, 260, 1000, 100_000] {
            cases.push((format!("run of {n}"), vec![b'q'; n]));
            let mut framed = b"ab".to_vec();
            framed.extend(std::iter::repeat_n(0u8, n));
            framed.extend_from_slice(b"cd");
            cases.push((format!("framed run of {n}"), framed));
        }
        // Texts that repeat a shorter string exactly: their rotations are
        // not all distinct, and the BWT rows form several cycles.
        for (period, copies) in [(2, 5000), (3, 33_333), (256, 300), (1000, 7), (7, 1)] {
            let unit: Vec<u8> = (0..period).map(|i| (i * 37 % 251) as u8).collect();
            cases.push((format!("{copies} copies of {period}"), unit.repeat(copies)));
        }
        cases.push(("noise".into(), noise(300_000, 1)));
        cases.push(("text".into(), text(300_000, 2)));
        cases.push(("runs".into(), runs(300_000, 3)));
        for level in [1, 9] {
            for (what, data) in &cases {
                check(level, data, what);
            }
        }
    }

    #[test]
    fn multi_block_streams() {
        // Level 1 blocks hold 100k bytes; these take several.
        let data = [noise(250_000, 4), text(400_000, 5), runs(2_000_000, 6)].concat();
        for level in [1, 2, 9] {
            check(level, &data, "mixed");
        }
    }

    #[test]
    fn one_decoder_for_streams_of_all_levels() {
        let mut dec = StreamDecoder::new();
        for (k, level) in [1, 9, 3, 1, 9].into_iter().enumerate() {
            let data = text(150_000 * level as usize, k as u64);
            let packed = lib_compress(level, &data);
            let mut out = b"prefix".to_vec();
            let n = dec.decode(&packed, &mut out, usize::MAX).unwrap();
            assert_eq!(n, packed.len());
            assert!(out[6..] == data[..], "level {level}");
        }
    }

    #[test]
    fn trailing_bytes_are_left_alone() {
        let data = text(5000, 7);
        let packed = lib_compress(9, &data);
        let more = [&packed[..], b"tail"].concat();
        let mut out = Vec::new();
        let n = StreamDecoder::new()
            .decode(&more, &mut out, usize::MAX)
            .unwrap();
        assert_eq!(n, packed.len());
        assert!(out == data);
    }

    #[test]
    fn output_limit_is_kept() {
        let data = runs(500_000, 8);
        let packed = lib_compress(1, &data);
        let mut dec = StreamDecoder::new();
        for limit in [0, 1, 1000, 99_999, 100_000, 250_000, data.len() - 1] {
            let mut out = vec![7u8; 3];
            let err = dec.decode(&packed, &mut out, limit).unwrap_err();
            assert!(err.to_string().contains("expands beyond"), "{err}");
            assert_eq!(out, [7u8; 3], "output left as it was");
        }
        let mut out = Vec::new();
        dec.decode(&packed, &mut out, data.len()).unwrap();
        assert!(out == data);
    }

    #[test]
    fn streams_of_bzip2_lbzip2_pbzip2() {
        let data = [text(1_500_000, 9), noise(300_000, 10), runs(1_000_000, 11)].concat();
        for (tool, args) in [
            ("bzip2", &["-9", "-c"][..]),
            ("bzip2", &["-1", "-c"]),
            ("lbzip2", &["-9", "-c"]),
            ("lbzip2", &["-1", "-c", "-n2"]),
            ("pbzip2", &["-9", "-c"]),
            ("pbzip2", &["-1", "-c", "-p2"]),
        ] {
            if let Some(packed) = run(tool, args, &data) {
                let back = decode_all(&packed).unwrap_or_else(|e| panic!("{tool} {args:?}: {e}"));
                assert!(back == data, "{tool} {args:?}: wrong output");
            }
        }
    }

    #[test]
    fn move_to_front_agrees_with_the_plain_list() {
        let mut fast: [u8; 256] = std::array::from_fn(|i| (i as u8).wrapping_mul(167));
        let mut plain = fast.to_vec();
        for (step, k) in (0..256)
            .chain(noise(5000, 23).into_iter().map(usize::from))
            .enumerate()
        {
            let want = plain.remove(k);
            plain.insert(0, want);
            assert_eq!(move_to_front(&mut fast, k), want, "step {step}");
            assert_eq!(fast[..], plain[..], "step {step}, k {k}");
        }
    }

    /// `n` bits of `buf` from bit `pos`, most significant first.
    fn bits_at(buf: &[u8], pos: usize, n: usize) -> u64 {
        (0..n).fold(0, |v, k| {
            let p = pos + k;
            v << 1 | u64::from(buf[p / 8] >> (7 - p % 8) & 1)
        })
    }

    fn set_bits(buf: &mut [u8], pos: usize, n: usize, value: u64) {
        for k in 0..n {
            let p = pos + k;
            let bit = (value >> (n - 1 - k)) & 1 == 1;
            buf[p / 8] = (buf[p / 8] & !(0x80 >> (p % 8))) | (u8::from(bit) << (7 - p % 8));
        }
    }

    /// Bit positions in the first block of a stream: (origPtr, group
    /// count, selector count, end of the selectors).
    fn first_block_fields(packed: &[u8]) -> (usize, usize, usize, usize) {
        let orig = 32 + 48 + 32 + 1;
        let map = bits_at(packed, orig + 24, 16);
        let groups = orig + 24 + 16 + 16 * map.count_ones() as usize;
        let sel_count = groups + 3;
        let n_groups = bits_at(packed, groups, 3);
        let count = bits_at(packed, sel_count, 15);
        let mut p = sel_count + 15;
        for _ in 0..count {
            let mut j = 0;
            while bits_at(packed, p, 1) == 1 {
                p += 1;
                j += 1;
                assert!(j < n_groups);
            }
            p += 1;
        }
        (orig, groups, sel_count, p)
    }

    /// Bit position of the last end-of-stream magic.
    fn last_eos(packed: &[u8]) -> usize {
        (0..packed.len() * 8 - 48)
            .rev()
            .find(|&p| bits_at(packed, p, 48) == EOS_MAGIC)
            .unwrap()
    }

    fn expect_err(bad: &[u8], what: &str, says: &str) {
        let err = decode(bad).expect_err(what);
        assert!(err.to_string().contains(says), "{what}: {err}");
    }

    #[test]
    fn damaged_fields_are_errors() {
        let data = text(20_000, 12);
        let packed = lib_compress(9, &data);
        let (orig, groups, sel_count, _) = first_block_fields(&packed);

        let mut bad = packed.clone();
        bad[12] ^= 0x10; // inside the block CRC (bits 80..112)
        expect_err(&bad, "block CRC", "block CRC mismatch");

        let mut bad = packed.clone();
        let crc_bit = last_eos(&packed) + 48 + 7;
        bad[crc_bit / 8] ^= 0x80 >> (crc_bit % 8);
        expect_err(&bad, "stream CRC", "stream CRC mismatch");

        for (ptr, says) in [(0xFF_FFFF, "out of range"), (20_001, "beyond the block")] {
            let mut bad = packed.clone();
            set_bits(&mut bad, orig, 24, ptr);
            expect_err(&bad, "origPtr", says);
        }
        let mut bad = packed.clone();
        set_bits(&mut bad, orig, 24, bits_at(&packed, orig, 24) ^ 1);
        expect_err(&bad, "origPtr off by one", "CRC mismatch");

        for g in [0, 1, 7] {
            let mut bad = packed.clone();
            set_bits(&mut bad, groups, 3, g);
            expect_err(&bad, "group count", "Huffman groups");
        }
        let mut bad = packed.clone();
        set_bits(&mut bad, sel_count, 15, 0);
        expect_err(&bad, "no selectors", "no selectors");

        let mut bad = packed.clone();
        set_bits(&mut bad, orig + 24, 16, 0);
        expect_err(&bad, "no bytes in use", "no byte values");

        let mut bad = packed.clone();
        bad[3] = b'0';
        expect_err(&bad, "level 0", "block size");
        expect_err(b"BZX9", "magic", "not a bzip2 stream");
        let mut bad = packed.clone();
        bad[4] ^= 1;
        expect_err(&bad, "block magic", "expected a block");

        // A randomised block goes to libbzip2, which finds the CRC wrong.
        let mut bad = packed.clone();
        set_bits(&mut bad, orig - 1, 1, 1);
        assert!(decode(&bad).is_err());
    }

    #[test]
    fn code_lengths_out_of_range_are_errors() {
        // The first table's starting length is the 5 bits after the
        // selectors; 0 and 21 and above are invalid.
        let packed = lib_compress(9, &text(5000, 13));
        let (_, _, _, lens) = first_block_fields(&packed);
        for len in [0, 21, 31] {
            let mut bad = packed.clone();
            set_bits(&mut bad, lens, 5, len);
            expect_err(&bad, "code length", "code length");
        }
    }

    /// Re-writes the first block of `packed` with `extra` more selectors
    /// (each a single 0 bit: "same as the one before"), which decoders
    /// read and ignore.
    fn with_extra_selectors(packed: &[u8], extra: usize) -> Vec<u8> {
        let (_, _, sel_count, sel_end) = first_block_fields(packed);
        let count = bits_at(packed, sel_count, 15) as usize;
        let total = packed.len() * 8;
        let mut out = vec![0u8; (total + extra).div_ceil(8)];
        for p in 0..sel_end {
            set_bits(&mut out, p, 1, bits_at(packed, p, 1));
        }
        set_bits(&mut out, sel_count, 15, (count + extra) as u64);
        for p in sel_end..total {
            set_bits(&mut out, p + extra, 1, bits_at(packed, p, 1));
        }
        out
    }

    #[test]
    fn selectors_beyond_the_limit_are_ignored() {
        let data = text(3000, 14);
        let packed = lib_compress(9, &data);
        for extra in [1, 100, MAX_SELECTORS, 32767 - 200] {
            let bad = with_extra_selectors(&packed, extra);
            assert_eq!(decode(&bad).unwrap(), data, "{extra} extra");
            assert_eq!(
                lib_decompress(&bad).unwrap(),
                data,
                "libbzip2, {extra} extra"
            );
        }
    }

    #[test]
    fn truncation_is_always_an_error() {
        let data = [text(150_000, 15), runs(100_000, 16)].concat();
        let packed = lib_compress(1, &data);
        let mut dec = StreamDecoder::new();
        let step = (packed.len() / 500).max(1);
        for cut in (0..packed.len())
            .step_by(step)
            .chain(packed.len() - 20..packed.len())
        {
            let mut out = Vec::new();
            match dec.decode(&packed[..cut], &mut out, usize::MAX) {
                Err(CodecError::Truncated { offset, .. }) => assert_eq!(offset, cut as u64),
                Err(e) => panic!("cut at {cut}: {e}"),
                Ok(_) => panic!("cut at {cut} decoded"),
            }
            assert!(out.is_empty());
        }
    }

    /// Flips bytes or bits of `packed` at the given positions: each decode
    /// is an error or the original data, never a panic, and never more
    /// output than the limit.
    fn flips(packed: &[u8], data: &[u8], positions: impl Iterator<Item = (usize, u8)>) -> usize {
        let mut dec = StreamDecoder::new();
        let limit = data.len() + 10;
        let mut errors = 0;
        for (at, mask) in positions {
            let mut bad = packed.to_vec();
            bad[at] ^= mask;
            let mut out = Vec::new();
            match dec.decode(&bad, &mut out, limit) {
                Ok(_) => assert!(out == data, "flip {mask:#x} at {at} gave wrong data"),
                Err(_) => {
                    assert!(out.is_empty());
                    errors += 1;
                }
            }
        }
        errors
    }

    #[test]
    fn byte_flips_of_a_real_stream() {
        let data = [text(120_000, 17), runs(50_000, 18)].concat();
        let packed = lib_compress(1, &data);
        let step = (packed.len() / 400).max(1);
        let positions = (0..packed.len())
            .step_by(step)
            .chain(packed.len() - 12..packed.len())
            .flat_map(|i| [(i, 0x01), (i, 0x80), (i, 0xFF)]);
        assert!(flips(&packed, &data, positions) > 1000);
    }

    #[test]
    fn thousands_of_random_flips_of_a_small_stream() {
        let data = [text(3000, 19), runs(2000, 20), noise(500, 21)].concat();
        let packed = lib_compress(9, &data);
        let r = noise(20_000, 22);
        let positions = r
            .chunks_exact(4)
            .map(|c| {
                let at = (usize::from(c[0]) << 8 | usize::from(c[1])) % packed.len();
                (at, 1u8 << (c[2] % 8))
            })
            .chain(r.chunks_exact(4).take(1000).map(|c| {
                let at = (usize::from(c[3]) << 8 | usize::from(c[0])) % packed.len();
                (at, c[1] | 1)
            }));
        flips(&packed, &data, positions);
    }

    #[test]
    fn arbitrary_bytes_after_a_header_never_panic() {
        let mut dec = StreamDecoder::new();
        for seed in 0..300 {
            let mut src = b"BZh9".to_vec();
            src.extend(noise(seed * 7 % 300, seed as u64));
            if seed % 3 == 0 {
                // A real block magic, so the header parser gets going.
                src.splice(4..4, [0x31, 0x41, 0x59, 0x26, 0x53, 0x59]);
            }
            let mut out = Vec::new();
            assert!(dec.decode(&src, &mut out, 1 << 20).is_err());
        }
    }

    /// `BZ_FILE=x.bz2 cargo test --release -p cairn-codec decode_speed --
    /// --ignored --nocapture`: one thread, best of three.
    #[test]
    #[ignore]
    fn decode_speed() {
        let Ok(path) = std::env::var("BZ_FILE") else {
            eprintln!("set BZ_FILE");
            return;
        };
        let packed = std::fs::read(path).unwrap();
        let mut out = Vec::new();
        let mut best = f64::MAX;
        for _ in 0..3 {
            out.clear();
            let t = std::time::Instant::now();
            let mut dec = StreamDecoder::new();
            let mut at = 0;
            while at < packed.len() {
                at += dec.decode(&packed[at..], &mut out, usize::MAX).unwrap();
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        eprintln!(
            "{:.1} MB in, {:.1} MB out: {:.3} s, {:.1} MB/s out",
            packed.len() as f64 / 1e6,
            out.len() as f64 / 1e6,
            best,
            out.len() as f64 / 1e6 / best
        );
    }

    fn input() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..5000),
            proptest::collection::vec(0u8..3, 0..20_000),
            (proptest::collection::vec((any::<u8>(), 1usize..600), 0..100)).prop_map(|runs| {
                runs.into_iter()
                    .flat_map(|(b, n)| std::iter::repeat_n(b, n))
                    .collect()
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn agrees_with_libbzip2(data in input(), level in prop_oneof![Just(1u32), Just(9)]) {
            let packed = lib_compress(level, &data);
            let ours = decode(&packed).unwrap();
            prop_assert_eq!(&ours, &lib_decompress(&packed).unwrap());
            prop_assert_eq!(ours, data);
        }
    }
}
