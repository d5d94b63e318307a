//! The bzip2 encoder: one complete stream (`BZh` + level, blocks, end of
//! stream) per call, with every buffer kept in [`Encoder`] for the next.
//!
//! Per block: the first run-length pass (RLE1) and the block CRC; the
//! Burrows-Wheeler transform of the block's cyclic rotations, computed as
//! the suffix array (libsais) of the block turned to its least rotation;
//! move-to-front with zero runs written as RUNA/RUNB digits; 2 to 6 Huffman
//! tables chosen per 50-symbol group over a few refinement passes; and the
//! bit writer.

use super::{block_crc, combine, BLOCK_MAGIC, EOS_MAGIC};
use crate::error::{CodecError, Result};

/// Symbols per selector group.
const GROUP: usize = 50;
/// Longest Huffman code written (decoders accept up to 20).
const MAX_LEN: u8 = 17;
/// Table refinement passes.
const ITERS: usize = 4;
/// Most symbols an alphabet has: 256 byte values, RUNA/RUNB in place of
/// position 0, and the end of block.
const MAX_ALPHA: usize = 258;
/// Most Huffman tables a block has.
const MAX_TABLES: usize = 6;
const RUNA: u16 = 0;
const RUNB: u16 = 1;

/// A reusable bzip2 stream encoder.
#[derive(Debug)]
pub struct Encoder {
    level: u32,
    /// The current block after RLE1, and later its BWT.
    block: Vec<u8>,
    /// The block twice over, for its least rotation.
    twice: Vec<u8>,
    sa: Vec<i32>,
    /// Move-to-front output: RUNA/RUNB digits, positions + 1, end of block.
    mtf: Vec<u16>,
    selectors: Vec<u8>,
}

impl Encoder {
    /// An encoder at `level` (1-9: blocks of up to level x 100000 bytes
    /// after RLE1; out-of-range levels are clamped).
    pub fn new(level: i32) -> Self {
        Encoder {
            level: level.clamp(1, 9).unsigned_abs(),
            block: Vec::new(),
            twice: Vec::new(),
            sa: Vec::new(),
            mtf: Vec::new(),
            selectors: Vec::new(),
        }
    }

    /// The level this encoder writes.
    pub fn level(&self) -> i32 {
        self.level as i32
    }

    /// Largest block after RLE1 (as libbzip2 keeps it, 19 bytes under the
    /// level x 100000 decoders allow).
    fn block_cap(&self) -> usize {
        self.level as usize * 100_000 - 19
    }

    /// Compress `src` into one complete bzip2 stream appended to `dst`.
    pub fn compress(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
        dst.reserve(src.len() + src.len() / 64 + 64);
        let mut bits = BitWriter::new(dst);
        bits.put(
            32,
            u32::from_be_bytes([b'B', b'Z', b'h', b'0' + self.level as u8]),
        );
        let cap = self.block_cap();
        let mut stream_crc = 0u32;
        let mut pos = 0;
        while pos < src.len() {
            let used = rle1(&src[pos..], cap, &mut self.block);
            let crc = block_crc(&src[pos..pos + used]);
            pos += used;
            stream_crc = combine(stream_crc, crc);
            self.write_block(crc, &mut bits)?;
        }
        bits.put48(EOS_MAGIC);
        bits.put(32, stream_crc);
        bits.finish();
        Ok(())
    }

    /// Transform and write the block in `self.block`.
    fn write_block(&mut self, crc: u32, bits: &mut BitWriter<'_>) -> Result<()> {
        let mut in_use = [false; 256];
        for &b in &self.block {
            in_use[usize::from(b)] = true;
        }
        let n = self.block.len();
        let (r, orig_ptr) = bwt(&self.block, &mut self.twice, &mut self.sa)?;
        // The BWT replaces the block (its bytes live on in `twice`).
        bwt_output(&self.twice[r..r + n], &self.sa[..n], &mut self.block);
        let n_in_use = in_use.iter().filter(|&&u| u).count();
        let mut mtf_freq = [0u32; MAX_ALPHA];
        mtf_encode(&self.block, &in_use, &mut self.mtf, &mut mtf_freq);
        let alpha = n_in_use + 2;

        bits.put48(BLOCK_MAGIC);
        bits.put(32, crc);
        bits.put(1, 0);
        bits.put(24, orig_ptr);
        write_symbol_map(&in_use, bits);

        let mut tables = Tables::new(alpha, self.mtf.len());
        tables.choose(&self.mtf, &mtf_freq, &mut self.selectors);
        tables.write(&self.selectors, bits);
        tables.write_data(&self.mtf, &self.selectors, bits);
        Ok(())
    }
}

/// Run-length code the front of `src` into `block` (cleared first) until it
/// holds at most `cap` bytes; returns how many bytes of `src` it took.
/// Runs of 4 to 255 equal bytes become the first 4 and a count (0-251);
/// everything between such runs is copied as it is.
#[inline(never)]
fn rle1(src: &[u8], cap: usize, block: &mut Vec<u8>) -> usize {
    block.clear();
    block.reserve(cap);
    let mut p = 0;
    while p < src.len() {
        let run = next_run(src, p);
        let room = cap - block.len();
        if run - p > room {
            block.extend_from_slice(&src[p..p + room]);
            return p + room;
        }
        block.extend_from_slice(&src[p..run]);
        p = run;
        if p == src.len() || block.len() + 5 > cap {
            break;
        }
        let b = src[p];
        let end = src.len().min(p + 255);
        let mut q = p + 4;
        while q < end && src[q] == b {
            q += 1;
        }
        block.extend_from_slice(&[b, b, b, b, (q - p - 4) as u8]);
        p = q;
    }
    p
}

/// The first `i >= from` where 4 equal bytes start, or `src.len()`; eight
/// bytes compared at a time.
fn next_run(src: &[u8], mut i: usize) -> usize {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&src[at..at + 8]);
        u64::from_le_bytes(b)
    };
    while i + 9 <= src.len() {
        // Byte k: zero where src[i + k] == src[i + k + 1].
        let d = word(i) ^ word(i + 1);
        // High bit of each byte of d that is zero (exact: no carries).
        let zero = !(((d & LOW7) + LOW7) | d | LOW7);
        let three = zero & (zero >> 8) & (zero >> 16);
        if three != 0 {
            return i + (three.trailing_zeros() / 8) as usize;
        }
        i += 6;
    }
    while i + 4 <= src.len() {
        let b = src[i];
        if src[i + 1] == b && src[i + 2] == b && src[i + 3] == b {
            return i;
        }
        i += 1;
    }
    src.len()
}

/// Start of the lexicographically least rotation of `s` (the first one if
/// several are equal), by Duval's Lyndon factorisation of `twice`, which is
/// `s` twice over.
#[inline(never)]
fn least_rotation(twice: &[u8]) -> usize {
    let n = twice.len() / 2;
    let mut i = 0;
    let mut ans = 0;
    while i < n {
        ans = i;
        let mut j = i + 1;
        let mut k = i;
        while j < 2 * n {
            let (x, y) = (twice[k], twice[j]);
            if x > y {
                break;
            }
            k = if x < y { i } else { k + 1 };
            j += 1;
        }
        while i <= k {
            i += j - k;
        }
    }
    ans
}

/// Sort the cyclic rotations of `block` (not empty). `twice` becomes the
/// block twice over, holding at `r..r + n` the block turned to its least
/// rotation; `sa` gets the order of that string's rotations as its suffix
/// array (for a Lyndon word suffixes and rotations sort alike; a block that
/// is one word repeated has equal rotations, and any order of those gives
/// the same last column). Returns `r` and the row of the block's own
/// rotation (origPtr).
#[inline(never)]
fn bwt(block: &[u8], twice: &mut Vec<u8>, sa: &mut Vec<i32>) -> Result<(usize, u32)> {
    let n = block.len();
    twice.clear();
    twice.extend_from_slice(block);
    twice.extend_from_slice(block);
    let r = least_rotation(twice);
    if sa.len() < n {
        sa.resize(n, 0);
    }
    libsais::SuffixArrayConstruction::for_text(&twice[r..r + n])
        .in_borrowed_buffer(&mut sa[..n])
        .single_threaded()
        .run()
        .map_err(|e| CodecError::Compress {
            codec: "bzip2",
            reason: format!("suffix sorting failed: {e:?}"),
        })?;
    // The block's rotation 0 is the turned string's rotation n - r.
    let own = ((n - r) % n) as i32;
    let row = sa[..n]
        .iter()
        .position(|&p| p == own)
        .ok_or(CodecError::Compress {
            codec: "bzip2",
            reason: "suffix array misses the block's rotation".into(),
        })?;
    Ok((r, row as u32))
}

/// The last column of the sorted rotations: each row's preceding byte.
#[inline(never)]
fn bwt_output(rot: &[u8], sa: &[i32], out: &mut Vec<u8>) {
    let n = rot.len();
    let last = rot[n - 1];
    out.clear();
    out.extend(sa.iter().map(|&p| {
        let p = p as usize;
        if p == 0 {
            last
        } else {
            rot[p - 1]
        }
    }));
}

/// Move-to-front over the used byte values, zero runs as RUNA/RUNB
/// (bijective base 2, least significant digit first), positions p > 0 as
/// p + 1, then the end-of-block symbol; `freq` counts each symbol.
#[inline(never)]
fn mtf_encode(bwt: &[u8], in_use: &[bool; 256], out: &mut Vec<u16>, freq: &mut [u32; MAX_ALPHA]) {
    let mut rank = [0u8; 256];
    let mut k = 0usize;
    for (b, _) in in_use.iter().enumerate().filter(|(_, &u)| u) {
        rank[b] = k as u8;
        k += 1;
    }
    // Ranks 0..k; the identity's entries from k on are never looked for.
    let mut list = MtfList::new(k);
    let eob = (k + 1) as u16;
    out.clear();
    out.reserve(bwt.len() + 1);
    let mut zeros = 0usize;
    for &b in bwt {
        let j = list.move_to_front(rank[usize::from(b)]);
        if j == 0 {
            zeros += 1;
            continue;
        }
        push_zero_run(zeros, out, freq);
        zeros = 0;
        let sym = (j + 1) as u16;
        out.push(sym);
        freq[usize::from(sym)] += 1;
    }
    push_zero_run(zeros, out, freq);
    out.push(eob);
    freq[usize::from(eob)] += 1;
}

/// The move-to-front list, kept as each value's place in it: moving a value
/// to the front is one branch-free pass (vector instructions) that pushes
/// back every value in front of it.
struct MtfList {
    place: [u8; 256],
    /// How many places the passes look at: the values in use, rounded up
    /// to a vector (the values past them are never in front of one in use).
    len: usize,
}

impl MtfList {
    /// Values `0..n` in order (`n` at most 256).
    fn new(n: usize) -> Self {
        let mut place = [0u8; 256];
        for (i, x) in place.iter_mut().enumerate() {
            *x = i as u8;
        }
        MtfList {
            place,
            len: n.next_multiple_of(16).min(256),
        }
    }

    /// Move `c` to the front; returns where it was.
    #[inline]
    fn move_to_front(&mut self, c: u8) -> usize {
        let at = self.place[usize::from(c)];
        if at != 0 {
            for chunk in self.place[..self.len].chunks_exact_mut(16) {
                for p in chunk {
                    *p += u8::from(*p < at);
                }
            }
            self.place[usize::from(c)] = 0;
        }
        usize::from(at)
    }
}

fn push_zero_run(mut z: usize, out: &mut Vec<u16>, freq: &mut [u32; MAX_ALPHA]) {
    while z > 0 {
        z -= 1;
        let d = if z & 1 == 0 { RUNA } else { RUNB };
        out.push(d);
        freq[usize::from(d)] += 1;
        z >>= 1;
    }
}

/// Which 16-value ranges are used, then each used range's values.
fn write_symbol_map(in_use: &[bool; 256], bits: &mut BitWriter<'_>) {
    let mut ranges = 0u32;
    let mut maps = [0u32; 16];
    for (i, chunk) in in_use.chunks_exact(16).enumerate() {
        let m = chunk.iter().fold(0u32, |m, &u| (m << 1) | u32::from(u));
        maps[i] = m;
        ranges = (ranges << 1) | u32::from(m != 0);
    }
    bits.put(16, ranges);
    for &m in maps.iter().filter(|&&m| m != 0) {
        bits.put(16, m);
    }
}

/// The Huffman tables of one block.
struct Tables {
    alpha: usize,
    n: usize,
    len: [[u8; MAX_ALPHA]; MAX_TABLES],
    code: [[u32; MAX_ALPHA]; MAX_TABLES],
}

impl Tables {
    /// Tables for `n_sym` symbols of an `alpha`-symbol alphabet; as many
    /// tables as the block is worth (more tables cost more header).
    fn new(alpha: usize, n_sym: usize) -> Self {
        let n = match n_sym {
            0..200 => 2,
            200..600 => 3,
            600..1200 => 4,
            1200..2400 => 5,
            _ => 6,
        };
        Tables {
            alpha,
            n,
            len: [[0; MAX_ALPHA]; MAX_TABLES],
            code: [[0; MAX_ALPHA]; MAX_TABLES],
        }
    }

    /// Pick each group's table and the tables' code lengths: start from
    /// tables that each cover a slice of the alphabet holding an equal
    /// share of the symbols, then alternately give each group its cheapest
    /// table and rebuild each table from the groups that chose it.
    #[inline(never)]
    fn choose(&mut self, syms: &[u16], freq: &[u32; MAX_ALPHA], selectors: &mut Vec<u8>) {
        let (alpha, n) = (self.alpha, self.n);
        let mut rest: u32 = freq[..alpha].iter().sum();
        let mut lo = 0;
        for t in 0..n {
            let parts = (n - t) as u32;
            let want = rest / parts;
            let mut hi = lo;
            let mut got = 0;
            while hi < alpha && got < want {
                got += freq[hi];
                hi += 1;
            }
            if parts == 1 {
                hi = alpha;
            }
            for (s, l) in self.len[t][..alpha].iter_mut().enumerate() {
                *l = if (lo..hi).contains(&s) { 0 } else { 15 };
            }
            rest = rest.saturating_sub(got);
            lo = hi;
        }

        // No table yet: every group's first choice counts as a change.
        const NONE: u8 = u8::MAX;
        selectors.clear();
        selectors.resize(syms.len().div_ceil(GROUP), NONE);
        // Symbol counts of the groups that chose each table, kept from pass
        // to pass: only a group that changes its table is counted again.
        let mut counts = [[0u32; MAX_ALPHA]; MAX_TABLES];
        for _ in 0..ITERS {
            // Every table's length of a symbol in one word, 10 bits each: a
            // group costs at most 50 x 17 < 1024 bits per table.
            // (512 entries: a symbol masked to 9 bits needs no bounds check.)
            let mut packed = [0u64; 512];
            for (s, p) in packed[..alpha].iter_mut().enumerate() {
                *p = (0..n).fold(0, |p, t| p | u64::from(self.len[t][s]) << (10 * t));
            }
            for (group, sel) in syms.chunks(GROUP).zip(selectors.iter_mut()) {
                let cost = group
                    .iter()
                    .fold(0u64, |c, &s| c + packed[usize::from(s) & 511]);
                let mut best = 0;
                let mut best_cost = cost & 0x3ff;
                for t in 1..n {
                    let c = (cost >> (10 * t)) & 0x3ff;
                    if c < best_cost {
                        best_cost = c;
                        best = t;
                    }
                }
                if *sel == best as u8 {
                    continue;
                }
                if let Some(old) = counts.get_mut(usize::from(*sel)) {
                    for &s in group {
                        old[usize::from(s)] -= 1;
                    }
                }
                *sel = best as u8;
                let count = &mut counts[best];
                for &s in group {
                    count[usize::from(s)] += 1;
                }
            }
            for (count, len) in counts.iter().zip(&mut self.len).take(n) {
                code_lengths(&count[..alpha], &mut len[..alpha]);
            }
        }
        for t in 0..n {
            assign_codes(&self.len[t][..alpha], &mut self.code[t][..alpha]);
        }
    }

    /// Table count, selectors (move-to-front, unary) and each table's code
    /// lengths (a start, then +1/-1 steps per symbol).
    fn write(&self, selectors: &[u8], bits: &mut BitWriter<'_>) {
        bits.put(3, self.n as u32);
        bits.put(15, selectors.len() as u32);
        let mut order = [0u8, 1, 2, 3, 4, 5];
        for &s in selectors {
            let mut j = 0;
            while order[j] != s {
                j += 1;
            }
            order.copy_within(0..j, 1);
            order[0] = s;
            // j ones and a zero.
            bits.put(j as u32 + 1, ((1u32 << j) - 1) << 1);
        }
        for t in 0..self.n {
            let lens = &self.len[t][..self.alpha];
            let mut cur = lens[0];
            bits.put(5, u32::from(cur));
            for &l in lens {
                while cur < l {
                    bits.put(2, 0b10);
                    cur += 1;
                }
                while cur > l {
                    bits.put(2, 0b11);
                    cur -= 1;
                }
                bits.put(1, 0);
            }
        }
    }

    /// The symbols, each group in its table's code.
    #[inline(never)]
    fn write_data(&self, syms: &[u16], selectors: &[u8], bits: &mut BitWriter<'_>) {
        for (group, &sel) in syms.chunks(GROUP).zip(selectors) {
            let (len, code) = (&self.len[usize::from(sel)], &self.code[usize::from(sel)]);
            for &s in group {
                let s = usize::from(s);
                bits.put(u32::from(len[s]), code[s]);
            }
        }
    }
}

/// Huffman code lengths for `freq` (a symbol never seen counts once, as
/// every symbol of the alphabet needs a code), none over [`MAX_LEN`]: when
/// the tree is too deep, the weights are flattened and it is built again.
#[inline(never)]
fn code_lengths(freq: &[u32], lens: &mut [u8]) {
    let n = freq.len();
    debug_assert!((2..=MAX_ALPHA).contains(&n));
    let mut w = [0u32; MAX_ALPHA];
    for (w, &f) in w.iter_mut().zip(freq) {
        *w = f.max(1);
    }
    let mut idx = [0u16; MAX_ALPHA];
    let mut weight = [0u32; 2 * MAX_ALPHA];
    let mut parent = [0u16; 2 * MAX_ALPHA];
    let mut depth = [0u8; 2 * MAX_ALPHA];
    loop {
        for (i, x) in idx[..n].iter_mut().enumerate() {
            *x = i as u16;
        }
        idx[..n].sort_unstable_by_key(|&s| w[usize::from(s)]);
        for k in 0..n {
            weight[k] = w[usize::from(idx[k])];
        }
        // Two queues: leaves in weight order, then inner nodes in the order
        // made (which is also weight order); ties take the leaf, keeping
        // the tree shallow.
        let (mut leaf, mut inner, mut next) = (0, n, n);
        let pick = |leaf: &mut usize, inner: &mut usize, next: usize, weight: &[u32]| {
            if *leaf < n && (*inner >= next || weight[*leaf] <= weight[*inner]) {
                *leaf += 1;
                *leaf - 1
            } else {
                *inner += 1;
                *inner - 1
            }
        };
        while next < 2 * n - 1 {
            let a = pick(&mut leaf, &mut inner, next, &weight);
            let b = pick(&mut leaf, &mut inner, next, &weight);
            weight[next] = weight[a] + weight[b];
            parent[a] = next as u16;
            parent[b] = next as u16;
            next += 1;
        }
        depth[2 * n - 2] = 0;
        let mut deepest = 0;
        for k in (0..2 * n - 2).rev() {
            depth[k] = depth[usize::from(parent[k])] + 1;
            deepest = deepest.max(depth[k]);
        }
        if deepest <= MAX_LEN {
            for k in 0..n {
                lens[usize::from(idx[k])] = depth[k];
            }
            return;
        }
        for x in &mut w[..n] {
            *x = 1 + *x / 2;
        }
    }
}

/// Canonical codes: shorter codes first, equal lengths in symbol order.
fn assign_codes(lens: &[u8], codes: &mut [u32]) {
    let mut code = 0u32;
    for l in 1..=MAX_LEN {
        for (s, &len) in lens.iter().enumerate() {
            if len == l {
                codes[s] = code;
                code += 1;
            }
        }
        code <<= 1;
    }
}

/// Most significant bit first, 32 bits at a time into the output.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    n: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter { out, acc: 0, n: 0 }
    }

    /// The low `n` (at most 32) bits of `v`, which has no higher bits set.
    #[inline]
    fn put(&mut self, n: u32, v: u32) {
        self.acc = (self.acc << n) | u64::from(v);
        self.n += n;
        if self.n >= 32 {
            self.n -= 32;
            self.out
                .extend_from_slice(&((self.acc >> self.n) as u32).to_be_bytes());
        }
    }

    fn put48(&mut self, v: u64) {
        self.put(24, (v >> 24) as u32);
        self.put(24, (v & 0xff_ffff) as u32);
    }

    /// Pad the last byte with zeros and write what is left.
    fn finish(mut self) {
        let pad = (8 - self.n % 8) % 8;
        self.put(pad, 0);
        let bytes = self.n / 8;
        for i in (0..bytes).rev() {
            self.out.push((self.acc >> (8 * i)) as u8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{noise, run, Rng};
    use proptest::prelude::*;
    use std::io::Read;

    fn compress(level: i32, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        Encoder::new(level).compress(data, &mut out).unwrap();
        out
    }

    fn libbz2_decode(packed: &[u8]) -> Vec<u8> {
        let mut back = Vec::new();
        bzip2::read::BzDecoder::new(packed)
            .read_to_end(&mut back)
            .unwrap();
        back
    }

    fn libbz2_encode(level: u32, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        bzip2::read::BzEncoder::new(data, bzip2::Compression::new(level))
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    /// The last column of the naively sorted rotations, and whether the
    /// row `orig` holds the string itself.
    fn naive_bwt(s: &[u8]) -> (Vec<u8>, Vec<Vec<u8>>) {
        let n = s.len();
        let mut rots: Vec<Vec<u8>> = (0..n)
            .map(|i| s[i..].iter().chain(&s[..i]).copied().collect())
            .collect();
        rots.sort();
        (rots.iter().map(|r| r[n - 1]).collect(), rots)
    }

    fn check_bwt(s: &[u8]) {
        let (mut twice, mut sa, mut out) = (Vec::new(), vec![7; 3], Vec::new());
        let (r, orig) = bwt(s, &mut twice, &mut sa).unwrap();
        let n = s.len();
        bwt_output(&twice[r..r + n], &sa[..n], &mut out);
        let orig = orig as usize;
        let (want, rots) = naive_bwt(s);
        assert_eq!(out, want, "BWT of {s:?}");
        assert_eq!(rots[orig], s, "origPtr {orig} of {s:?}");
    }

    #[test]
    fn bwt_matches_naive_rotation_sort() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..4000 {
            let n = 1 + rng.below(40) as usize;
            let s: Vec<u8> = match case % 4 {
                0 => (0..n).map(|_| rng.next() as u8).collect(),
                1 => (0..n).map(|_| b'a' + rng.below(2) as u8).collect(),
                2 => (0..n).map(|_| b'a' + rng.below(3) as u8).collect(),
                _ => {
                    // A power u^k of a short random word.
                    let u: Vec<u8> = (0..1 + rng.below(4))
                        .map(|_| b'a' + rng.below(2) as u8)
                        .collect();
                    let k = 1 + rng.below(8) as usize;
                    u.repeat(k)
                }
            };
            check_bwt(&s);
        }
        for s in [
            &b"a"[..],
            b"aaaa",
            b"abab",
            b"ababab",
            b"ba",
            b"bab",
            b"abcabcabc",
        ] {
            check_bwt(s);
        }
    }

    #[test]
    fn mtf_list_agrees_with_a_plain_list() {
        let mut rng = Rng(11);
        let mut list = MtfList::new(256);
        let mut plain: Vec<u8> = (0..=255).collect();
        for i in 0..200_000 {
            // Mostly near the front, sometimes anywhere.
            let c = if i % 3 == 0 {
                rng.next() as u8
            } else {
                plain[rng.below(20) as usize]
            };
            let j = plain.iter().position(|&x| x == c).unwrap();
            plain.remove(j);
            plain.insert(0, c);
            assert_eq!(list.move_to_front(c), j);
        }
        for (i, &x) in plain.iter().enumerate() {
            assert_eq!(usize::from(list.place[usize::from(x)]), i);
        }
    }

    /// RLE1 a run at a time, as the format describes it.
    fn rle1_slowly(src: &[u8], cap: usize) -> (Vec<u8>, usize) {
        let (mut out, mut p) = (Vec::new(), 0);
        while p < src.len() {
            let b = src[p];
            let run = src[p..].iter().take(255).take_while(|&&x| x == b).count();
            let code: Vec<u8> = if run < 4 {
                vec![b; run]
            } else {
                vec![b, b, b, b, (run - 4) as u8]
            };
            if out.len() + code.len() > cap {
                // Literals may be cut anywhere; a coded run not at all.
                if run < 4 {
                    let room = cap - out.len();
                    out.extend(&code[..room]);
                    p += room;
                }
                break;
            }
            out.extend(code);
            p += run;
        }
        (out, p)
    }

    #[test]
    fn rle1_agrees_with_the_format() {
        let mut rng = Rng(21);
        let mut block = Vec::new();
        for _ in 0..3000 {
            let n = rng.below(700) as usize;
            let s: Vec<u8> = (0..n)
                .map(|i| {
                    if (i / 97) % 2 == 0 {
                        0
                    } else {
                        rng.below(2) as u8
                    }
                })
                .collect();
            let cap = 5 + rng.below(800) as usize;
            let used = rle1(&s, cap, &mut block);
            assert_eq!((block.clone(), used), rle1_slowly(&s, cap), "cap {cap}");
        }
    }

    #[test]
    fn next_run_finds_the_first_four_equal_bytes() {
        let mut rng = Rng(5);
        for _ in 0..3000 {
            let n = rng.below(40) as usize;
            let s: Vec<u8> = (0..n).map(|_| rng.below(2) as u8).collect();
            let from = rng.below(n as u64 + 1) as usize;
            let want = (from..n)
                .find(|&i| i + 4 <= n && s[i..i + 4].iter().all(|&x| x == s[i]))
                .unwrap_or(n);
            assert_eq!(next_run(&s, from), want, "{s:?} from {from}");
        }
    }

    #[test]
    fn least_rotation_is_least() {
        let mut rng = Rng(7);
        for _ in 0..2000 {
            let n = 1 + rng.below(30) as usize;
            let s: Vec<u8> = (0..n).map(|_| rng.below(3) as u8).collect();
            let r = least_rotation(&s.repeat(2));
            let turned: Vec<u8> = s[r..].iter().chain(&s[..r]).copied().collect();
            let least = (0..n)
                .map(|i| s[i..].iter().chain(&s[..i]).copied().collect::<Vec<u8>>())
                .min()
                .unwrap();
            assert_eq!(turned, least, "{s:?}");
        }
    }

    /// Text-like data: words from a small vocabulary.
    fn text(len: usize, seed: u64) -> Vec<u8> {
        let words = [
            "the ",
            "block ",
            "sorting ",
            "compressor ",
            "of ",
            "bzip2 ",
            "and ",
            "a ",
            "stream\n",
            "Huffman ",
            "tables, ",
            "runs ",
            "moves ",
            "front. ",
        ];
        let mut rng = Rng(seed | 1);
        let mut out = Vec::with_capacity(len + 16);
        while out.len() < len {
            out.extend_from_slice(words[rng.below(words.len() as u64) as usize].as_bytes());
        }
        out.truncate(len);
        out
    }

    fn cases() -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> = vec![
            ("empty".into(), vec![]),
            ("one byte".into(), vec![42]),
            ("all bytes".into(), (0..=255).collect()),
        ];
        for n in [2, 3, 4, 5, 255, 256, 259, 1000] {
            v.push((format!("run of {n}"), vec![b'z'; n]));
            let mut mixed = b"ab".to_vec();
            mixed.extend(std::iter::repeat_n(b'q', n));
            mixed.extend_from_slice(b"qc");
            v.push((format!("run of {n} inside"), mixed));
        }
        v.push(("random".into(), noise(100_000, 3)));
        v.push(("text".into(), text(300_000, 5)));
        v.push(("repetitive".into(), b"abcdefgh".repeat(40_000)));
        v.push(("zeros".into(), vec![0; 2_000_000]));
        let mut sparse = vec![0u8; 1_500_000];
        for i in (0..sparse.len()).step_by(4099) {
            sparse[i] = (i / 4099) as u8;
        }
        v.push(("sparse".into(), sparse));
        // Runs of four (five bytes after RLE1 for four) push a level-1 block
        // of 99000 input bytes over its 99981 bytes: a second block.
        v.push(("spill".into(), b"aaaab".repeat(99_000 / 5)));
        v
    }

    #[test]
    fn libbzip2_reads_what_we_write() {
        for (name, data) in cases() {
            for level in [1, 9] {
                let packed = compress(level, &data);
                assert!(libbz2_decode(&packed) == data, "{name} at level {level}");
            }
        }
    }

    #[test]
    fn spill_makes_a_second_block() {
        let data = b"aaaab".repeat(99_000 / 5);
        let packed = compress(1, &data);
        let magic = BLOCK_MAGIC.to_be_bytes();
        // The first block starts byte-aligned after `BZh1`.
        assert_eq!(&packed[4..10], &magic[2..]);
        let mut r = Rng(1);
        let mut enc = Encoder::new(1);
        let mut block = Vec::new();
        let used = rle1(&data, enc.block_cap(), &mut block);
        assert!(used < data.len(), "one block took everything");
        // An encoder is reusable.
        let again = {
            let mut out = Vec::new();
            enc.compress(&data, &mut out).unwrap();
            enc.compress(&noise(1000, r.next()), &mut out).unwrap();
            out
        };
        assert_eq!(&again[..packed.len()], &packed[..]);
    }

    #[test]
    fn empty_input_is_a_bare_stream() {
        assert_eq!(compress(9, &[]), libbz2_encode(9, &[]));
    }

    #[test]
    fn bzip2_lbzip2_pbzip2_read_what_we_write() {
        for (name, data) in cases() {
            let packed = compress(if data.len() > 200_000 { 1 } else { 9 }, &data);
            for tool in ["bzip2", "lbzip2", "pbzip2"] {
                if let Some(back) = run(tool, &["-d", "-c"], &packed) {
                    assert!(back == data, "{tool} -d read {name} wrongly");
                }
            }
            run("bzip2", &["-t"], &packed);
        }
    }

    #[test]
    fn size_is_close_to_libbzip2() {
        let mut mixed = text(400_000, 9);
        mixed.extend(noise(100_000, 2));
        mixed.extend(vec![0; 200_000]);
        mixed.extend((0..300_000u64).map(|i| (i * i / 7 % 251) as u8));
        for (name, data) in [
            ("text", text(1_500_000, 1)),
            ("random", noise(500_000, 4)),
            ("mixed", mixed),
            (
                "structured",
                (0..1_000_000u32)
                    .map(|i| ((i / 3) ^ (i / 1000)) as u8)
                    .collect(),
            ),
        ] {
            let ours = compress(9, &data).len() as f64;
            let theirs = libbz2_encode(9, &data).len() as f64;
            assert!(ours <= theirs * 1.02, "{name}: {ours} vs libbzip2 {theirs}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn round_trips(data in proptest::collection::vec(
            prop_oneof![Just(0u8), Just(1u8), any::<u8>()], 0..3000),
            level in 1i32..=9,
        ) {
            let packed = compress(level, &data);
            prop_assert!(libbz2_decode(&packed) == data);
        }
    }
}
