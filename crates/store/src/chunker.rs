//! Chunkers: where a stream is cut into chunks.
//!
//! - `cdc:MIN,AVG,MAX` — content-defined (FastCDC 2020, from the `fastcdc`
//!   crate: gear hash, normalized chunking, cut-point skipping). Cuts
//!   depend only on the bytes since the previous cut, so an insertion
//!   shifts the cuts near it and the chunks after it dedup again.
//! - `fixed:SIZE` — every SIZE bytes; the right choice for block devices
//!   whose changes are block-aligned and for the fastest possible backup.
//!
//! The chunker runs on the reader thread over large batches; a chunk that
//! might still grow (fewer than MAX bytes left in a batch that is not the
//! last) is carried over to the next batch, so the cuts never depend on
//! batch boundaries.
//!
//! The gear table (the 256 random words the rolling hash adds) is the
//! crate's public one, or, in an encrypted repository made since
//! 2026-12-02, one derived from a secret kept with its master key
//! ([`GearTable::keyed`]): where the cuts fall then tells nothing to whoever
//! reads the store without the key (`docs/format/encryption.md`).
//!
//! The content-defined cut is computed here, not by the crate's loop
//! ([`Gear`]): the same rule, tables and masks, so the same cuts (property
//! tests hold it to the crate), but the gear hash is rolled on four
//! stretches of the chunk at once. The crate's loop is one chain of
//! dependent shifts and adds, and it was the one thread that limits a
//! backup from a fast disk (53 % of all CPU of a cold 4 GiB backup).

use crate::error::{Result, StoreError};
use std::fmt;
use std::str::FromStr;

/// How to cut a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkerSpec {
    /// Content-defined chunks between `min` and `max` bytes, `avg` on average.
    Cdc {
        /// Smallest chunk (except the last).
        min: u32,
        /// Target average.
        avg: u32,
        /// Largest chunk.
        max: u32,
    },
    /// Chunks of exactly `size` bytes (the last may be shorter).
    Fixed(u32),
}

/// The default chunker, chosen by measurement (`bench/chunker.py`, run
/// `bench/runs/2026-11-22-chunker/`, table in `docs/benchmarks.md`): on a
/// pair of Debian images, 32 KiB average chunks save 32.5% of the second
/// image's cost (16 KiB: 34.9%, 64 KiB: 29.1%, fixed 4 KiB: 8.6%), give the
/// smallest repository of all, and half the index memory of 16 KiB chunks
/// (32 bytes per chunk: 1 GiB of RAM per TiB of distinct data).
pub const DEFAULT_CHUNKER: ChunkerSpec = ChunkerSpec::Cdc {
    min: 8192,
    avg: 32768,
    max: 131072,
};

/// Largest chunk any chunker may produce (bounds every buffer that holds
/// one chunk; a chunk must fit in one pack record).
pub const MAX_CHUNK: u32 = 8 << 20;

impl ChunkerSpec {
    /// Check the parameters.
    pub fn validate(self) -> Result<Self> {
        let bad = |m: String| Err(StoreError::Invalid(format!("chunker {self}: {m}")));
        match self {
            ChunkerSpec::Fixed(size) => {
                if !(512..=MAX_CHUNK).contains(&size) {
                    return bad(format!("size must be between 512 and {MAX_CHUNK}"));
                }
            }
            ChunkerSpec::Cdc { min, avg, max } => {
                use fastcdc::v2020::{
                    AVERAGE_MAX, AVERAGE_MIN, MAXIMUM_MAX, MAXIMUM_MIN, MINIMUM_MAX, MINIMUM_MIN,
                };
                if !(min < avg && avg < max) {
                    return bad("need MIN < AVG < MAX".into());
                }
                if !(MINIMUM_MIN..=MINIMUM_MAX).contains(&min)
                    || !(AVERAGE_MIN..=AVERAGE_MAX).contains(&avg)
                    || !(MAXIMUM_MIN..=MAXIMUM_MAX.min(MAX_CHUNK)).contains(&max)
                {
                    return bad(format!(
                        "sizes out of range (MIN {MINIMUM_MIN}..={MINIMUM_MAX}, \
                         AVG {AVERAGE_MIN}..={AVERAGE_MAX}, MAX {MAXIMUM_MIN}..={})",
                        MAXIMUM_MAX.min(MAX_CHUNK)
                    ));
                }
            }
        }
        Ok(self)
    }

    /// The largest chunk this chunker produces.
    pub fn max_chunk(self) -> u32 {
        match self {
            ChunkerSpec::Fixed(size) => size,
            ChunkerSpec::Cdc { max, .. } => max,
        }
    }

    /// A chunker for this spec with the gear table `table` (the
    /// repository's: [`crate::Repository::gear_table`]); computes what it
    /// needs once.
    pub fn build(self, table: &GearTable) -> Chunker {
        let (gear, zero_cut) = match self {
            ChunkerSpec::Fixed(size) => (None, size as usize),
            ChunkerSpec::Cdc { min, avg, max } => {
                let gear = Gear::new(table, min, avg, max);
                let zeros = vec![0u8; max as usize];
                let zero_cut = gear.cut(&zeros).clamp(1, zeros.len());
                (Some(gear), zero_cut)
            }
        };
        Chunker {
            spec: self,
            gear,
            zero_cut,
        }
    }
}

/// The words a gear hash adds, one per byte value.
#[derive(Clone, PartialEq, Eq)]
pub struct GearTable(Box<[u64; 256]>);

impl fmt::Debug for GearTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A keyed table is a secret of its repository.
        f.write_str("GearTable(..)")
    }
}

impl Drop for GearTable {
    fn drop(&mut self) {
        // A keyed table gives the cuts as its secret does.
        zeroize::Zeroize::zeroize(&mut self.0[..]);
    }
}

impl GearTable {
    /// The `fastcdc` crate's table (its seed 0): plain repositories, and
    /// encrypted ones made before keyed tables (their cuts stay where
    /// they were, so their next backups dedup).
    pub fn public() -> GearTable {
        GearTable(fastcdc::v2020::get_gear_with_seed(0).0)
    }

    /// The table of a repository whose chunker secret is `secret`: the
    /// first 2048 bytes of BLAKE3's output in key derivation mode (context
    /// `"cairn 2026-12 chunker gear table"`) over the secret, read as 256
    /// little-endian words.
    pub fn keyed(secret: &[u8; 32]) -> GearTable {
        let mut bytes = zeroize::Zeroizing::new([0u8; 256 * 8]);
        blake3::Hasher::new_derive_key("cairn 2026-12 chunker gear table")
            .update(secret)
            .finalize_xof()
            .fill(&mut bytes[..]);
        let mut table = Box::new([0u64; 256]);
        for (word, b) in table.iter_mut().zip(bytes.chunks_exact(8)) {
            *word = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        }
        GearTable(table)
    }
}

/// FastCDC 2020's cut rule (the `fastcdc` crate's `cut_gear` with a
/// gear table ([`GearTable`]), masks and normalization level 1): the chunk ends at the
/// first byte `i` from MIN on (MIN, AVG and the length rounded down to
/// even) where the gear hash `h = (h << 1) + GEAR[byte]`, rolled from 0 at
/// MIN and including byte `i`, has none of the mask's bits set: the
/// stricter mask before AVG, the looser one after; the chunk is then `i`
/// bytes long, or MAX (or all there is) if no byte matches.
///
/// A hash after 64 bytes no longer depends on where it started (the
/// oldest byte is shifted out), so the bytes are scanned in rounds of
/// [`LANES`] stretches of [`LANE`] bytes, each stretch's hash started 64
/// bytes before it: four independent chains instead of one, and the first
/// match found in stretch order is the first match.
#[derive(Debug, Clone)]
struct Gear {
    table: GearTable,
    min: usize,
    avg: usize,
    max: usize,
    /// The mask before AVG (more bits: fewer cuts) and after it.
    mask_s: u64,
    mask_l: u64,
}

/// Stretches scanned at once, and their length (measured on the cut of
/// 256 MiB of random bytes: 1024-byte stretches, 4 at a time, cut at
/// 1.5x the crate's speed; 8 stretches ran out of registers).
const LANES: usize = 4;
const LANE: usize = 1024;
/// Bytes a gear hash depends on.
const WINDOW: usize = 64;

impl Gear {
    fn new(table: &GearTable, min: u32, avg: u32, max: u32) -> Gear {
        use fastcdc::v2020::{logarithm2, Normalization, MASKS};
        let bits = logarithm2(avg) as usize;
        let level = Normalization::Level1.bits() as usize;
        Gear {
            table: table.clone(),
            min: min as usize,
            avg: avg as usize,
            max: max as usize,
            mask_s: MASKS[bits + level],
            mask_l: MASKS[bits - level],
        }
    }

    /// The length of the chunk that starts `src`.
    fn cut(&self, src: &[u8]) -> usize {
        let len = src.len();
        if len <= self.min {
            return len;
        }
        let (end, center) = if len > self.max {
            (self.max, self.avg)
        } else {
            (len, self.avg.min(len))
        };
        let mut hash = 0u64;
        let mut at = self.min & !1;
        for (stop, mask) in [(center & !1, self.mask_s), (end & !1, self.mask_l)] {
            if let Some(cut) = self.scan(src, &mut at, &mut hash, stop, mask) {
                return cut;
            }
        }
        end
    }

    /// Roll the hash over `src[*at..stop]` (the hash of the bytes before
    /// `*at` in `hash`); the first position that matches `mask`, or `None`
    /// with `*at == stop` and the hash of everything before it.
    fn scan(
        &self,
        src: &[u8],
        at: &mut usize,
        hash: &mut u64,
        stop: usize,
        mask: u64,
    ) -> Option<usize> {
        let gear = &*self.table.0;
        let roll = |h: u64, byte: u8| (h << 1).wrapping_add(gear[usize::from(byte)]);
        while stop.saturating_sub(*at) >= LANES * LANE {
            let i = *at;
            let round = &src[i..i + LANES * LANE];
            let mut h = [*hash; LANES];
            for (j, h) in h.iter_mut().enumerate().skip(1) {
                // `i + j * LANE - WINDOW` is past the hash's start (`i` at
                // the earliest): the hash there is exact.
                let start = i + j * LANE;
                *h = src[start - WINDOW..start]
                    .iter()
                    .fold(0, |h, &b| roll(h, b));
            }
            let lane = |j: usize| -> &[u8; LANE] {
                round[j * LANE..(j + 1) * LANE]
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("a round is LANES * LANE bytes"))
            };
            let (l0, l1, l2, l3) = (lane(0), lane(1), lane(2), lane(3));
            let mut found = [usize::MAX; LANES];
            for t in 0..LANE {
                h[0] = roll(h[0], l0[t]);
                h[1] = roll(h[1], l1[t]);
                h[2] = roll(h[2], l2[t]);
                h[3] = roll(h[3], l3[t]);
                let any = (h[0] & mask == 0)
                    | (h[1] & mask == 0)
                    | (h[2] & mask == 0)
                    | (h[3] & mask == 0);
                if any {
                    if h[0] & mask == 0 {
                        // The first stretch's bytes come before all others.
                        return Some(i + t);
                    }
                    for j in 1..LANES {
                        if h[j] & mask == 0 && found[j] == usize::MAX {
                            found[j] = t;
                        }
                    }
                }
            }
            if let Some(j) = (1..LANES).find(|&j| found[j] != usize::MAX) {
                return Some(i + j * LANE + found[j]);
            }
            *hash = h[LANES - 1];
            *at = i + LANES * LANE;
        }
        while *at < stop {
            *hash = roll(*hash, src[*at]);
            if *hash & mask == 0 {
                return Some(*at);
            }
            *at += 1;
        }
        None
    }
}

/// Cuts batches of a stream; see [`ChunkerSpec::build`].
#[derive(Debug, Clone)]
pub struct Chunker {
    spec: ChunkerSpec,
    /// The content-defined cut, for `Cdc`.
    gear: Option<Gear>,
    /// Where a chunk that starts with MAX zero bytes ends: a cut depends
    /// only on the MAX bytes from the chunk's start, so zero runs (free
    /// space in images, zero pages in memory dumps) are cut without
    /// rolling the hash over them.
    zero_cut: usize,
}

impl Chunker {
    /// The spec this chunker follows.
    pub fn spec(&self) -> ChunkerSpec {
        self.spec
    }

    /// Of `zeros` zero bytes starting at a cut, how many the chunks that
    /// [`Chunker::cut`] would make of them cover whatever follows: every
    /// chunk with at least MAX zeros ahead of its start ends after
    /// `zero_cut` bytes, without looking further. A whole number of those
    /// chunks; 0 when fewer than MAX zeros.
    pub fn zero_run(&self, zeros: u64) -> u64 {
        let max = u64::from(self.spec.max_chunk());
        let step = self.zero_cut as u64;
        if zeros < max {
            0
        } else {
            ((zeros - max) / step + 1) * step
        }
    }

    /// Cut `buf`: push the end offset of every chunk found and return how
    /// many bytes they cover. Unless `eof`, bytes that could still belong
    /// to a longer chunk are left over; the caller puts them in front of
    /// the next batch. With `eof` every byte is covered.
    pub fn cut(&self, buf: &[u8], eof: bool, ends: &mut Vec<u32>) -> usize {
        let len = buf.len();
        match self.spec {
            ChunkerSpec::Fixed(size) => {
                let size = size as usize;
                let mut pos = 0;
                while len - pos >= size || (eof && pos < len) {
                    pos = (pos + size).min(len);
                    ends.push(pos as u32);
                }
                pos
            }
            ChunkerSpec::Cdc { max, .. } => {
                let max = max as usize;
                let Some(gear) = &self.gear else {
                    unreachable!("a cdc chunker is built with its gear")
                };
                let mut pos = 0;
                while len - pos >= max || (eof && pos < len) {
                    let end = if len - pos >= max && cairn_blockdev::is_zero(&buf[pos..pos + max]) {
                        pos + self.zero_cut
                    } else {
                        // A chunk is at least one byte, even if the rule
                        // gave none.
                        pos + gear.cut(&buf[pos..]).max(1)
                    };
                    ends.push(end as u32);
                    pos = end;
                }
                pos
            }
        }
    }
}

impl fmt::Display for ChunkerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkerSpec::Cdc { min, avg, max } => write!(f, "cdc:{min},{avg},{max}"),
            ChunkerSpec::Fixed(size) => write!(f, "fixed:{size}"),
        }
    }
}

/// A size with an optional K/M suffix (powers of 1024).
fn parse_size(s: &str) -> Option<u32> {
    let s = s.trim();
    let (num, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1024u64),
        b'm' | b'M' => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    let v = num.parse::<u64>().ok()?.checked_mul(mult)?;
    u32::try_from(v).ok()
}

impl FromStr for ChunkerSpec {
    type Err = StoreError;
    /// `cdc`, `cdc:4K,16K,64K`, `cdc:16K` (MIN = AVG/4, MAX = AVG*4),
    /// `fixed`, `fixed:64K`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            StoreError::Invalid(format!(
                "bad chunker {s:?}: expected cdc[:MIN,AVG,MAX], cdc:AVG or fixed[:SIZE]"
            ))
        };
        let (kind, args) = s.split_once(':').unwrap_or((s, ""));
        let spec = match (kind, args) {
            ("cdc", "") => DEFAULT_CHUNKER,
            ("cdc", args) => {
                let v: Vec<u32> = args
                    .split(',')
                    .map(parse_size)
                    .collect::<Option<_>>()
                    .ok_or_else(bad)?;
                match v[..] {
                    [avg] => ChunkerSpec::Cdc {
                        min: avg / 4,
                        avg,
                        max: avg.saturating_mul(4),
                    },
                    [min, avg, max] => ChunkerSpec::Cdc { min, avg, max },
                    _ => return Err(bad()),
                }
            }
            ("fixed", "") => ChunkerSpec::Fixed(65536),
            ("fixed", size) => ChunkerSpec::Fixed(parse_size(size).ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        spec.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// Cut `data` fed in batches of `batch` bytes, as the backup reader does.
    fn cut_in_batches(spec: ChunkerSpec, data: &[u8], batch: usize) -> Vec<usize> {
        let chunker = spec.build(&GearTable::public());
        let mut out = Vec::new();
        let mut buf = Vec::new();
        let mut base = 0;
        let mut fed = 0;
        loop {
            let take = batch.min(data.len() - fed);
            buf.extend_from_slice(&data[fed..fed + take]);
            fed += take;
            let eof = fed == data.len();
            let mut ends = Vec::new();
            let used = chunker.cut(&buf, eof, &mut ends);
            out.extend(ends.iter().map(|&e| base + e as usize));
            buf.drain(..used);
            base += used;
            if eof {
                assert!(buf.is_empty());
                return out;
            }
        }
    }

    #[test]
    fn cuts_do_not_depend_on_batch_size() {
        let data = pseudo_random(3 << 20, 7);
        for spec in [
            DEFAULT_CHUNKER,
            "cdc:1K,4K,16K".parse().unwrap(),
            "fixed:4096".parse().unwrap(),
        ] {
            let whole = cut_in_batches(spec, &data, data.len());
            for batch in [70_000, 1 << 20, 1_500_001] {
                assert_eq!(cut_in_batches(spec, &data, batch), whole, "{spec} {batch}");
            }
            assert_eq!(*whole.last().unwrap(), data.len());
            let mut prev = 0;
            for &e in &whole {
                assert!(e - prev <= spec.max_chunk() as usize);
                prev = e;
            }
        }
    }

    #[test]
    fn cdc_resynchronises_after_an_insertion() {
        let data = pseudo_random(2 << 20, 3);
        let mut changed = data[..100_000].to_vec();
        changed.extend_from_slice(b"a few inserted bytes");
        changed.extend_from_slice(&data[100_000..]);
        let chunks = |d: &[u8]| {
            let ends = cut_in_batches(DEFAULT_CHUNKER, d, d.len());
            let mut prev = 0;
            let mut set = std::collections::HashSet::new();
            for e in ends {
                set.insert(d[prev..e].to_vec());
                prev = e;
            }
            set
        };
        let (a, b) = (chunks(&data), chunks(&changed));
        let shared = a.intersection(&b).count();
        assert!(shared + 3 >= a.len(), "shared {shared} of {}", a.len());
    }

    #[test]
    fn zero_runs_cut_as_the_rolling_hash_would() {
        // Data, a long zero run, data: the fast path for zero runs must
        // give the cuts FastCDC gives when it rolls over the zeros.
        let mut data = pseudo_random(300_000, 11);
        data.extend(std::iter::repeat_n(0u8, 2_000_000));
        data.extend(pseudo_random(300_000, 12));
        for spec in [DEFAULT_CHUNKER, "cdc:1K,4K,16K".parse().unwrap()] {
            let ChunkerSpec::Cdc { min, avg, max } = spec else {
                unreachable!()
            };
            let cdc = fastcdc::v2020::FastCDC::new(&data, min, avg, max);
            let slow: Vec<usize> = cdc.map(|c| c.offset + c.length).collect();
            assert_eq!(cut_in_batches(spec, &data, 1 << 20), slow, "{spec}");
        }
    }

    #[test]
    fn skipping_a_zero_run_leaves_the_cuts_unchanged() {
        // What the backup reader does in a hole: drop `zero_run(z)` bytes
        // of the z zeros at a cut, then cut the rest. The cuts must be
        // those of cutting everything.
        for spec in [
            DEFAULT_CHUNKER,
            "cdc:1K,4K,16K".parse().unwrap(),
            "fixed:4096".parse().unwrap(),
        ] {
            let chunker = spec.build(&GearTable::public());
            let max = spec.max_chunk() as usize;
            for z in [0, 1, max - 1, max, max + 1, 2 * max + 4095, 5 * max + 7] {
                let mut data = vec![0u8; z];
                data.extend(pseudo_random(3 * max, z as u64 + 1));
                let all = cut_in_batches(spec, &data, data.len());
                let skip = chunker.zero_run(z as u64) as usize;
                assert!(skip <= z, "{spec} z {z}");
                let rest = cut_in_batches(spec, &data[skip..], data.len());
                let mut joined: Vec<usize> = all.iter().copied().filter(|&e| e <= skip).collect();
                assert_eq!(joined.last().copied().unwrap_or(0), skip, "{spec} z {z}");
                joined.extend(rest.iter().map(|e| e + skip));
                assert_eq!(joined, all, "{spec} z {z}");
            }
        }
    }

    #[test]
    fn parse_and_display() {
        assert_eq!("cdc".parse::<ChunkerSpec>().unwrap(), DEFAULT_CHUNKER);
        assert_eq!(
            "cdc:16K".parse::<ChunkerSpec>().unwrap(),
            ChunkerSpec::Cdc {
                min: 4096,
                avg: 16384,
                max: 65536
            }
        );
        assert_eq!(
            "fixed:1M".parse::<ChunkerSpec>().unwrap(),
            ChunkerSpec::Fixed(1 << 20)
        );
        for s in [
            "cdc:1,2,3",
            "cdc:64K,16K,4K",
            "fixed:0",
            "fixed:1G",
            "rabin",
            "cdc:x",
            "cdc:1K,2K",
        ] {
            assert!(s.parse::<ChunkerSpec>().is_err(), "{s}");
        }
        let spec: ChunkerSpec = "cdc:2K,8K,32K".parse().unwrap();
        assert_eq!(spec.to_string().parse::<ChunkerSpec>().unwrap(), spec);
    }

    /// The crate's cut, the rule [`Gear`] must follow exactly.
    fn crate_cut(spec: ChunkerSpec, src: &[u8]) -> usize {
        let ChunkerSpec::Cdc { min, avg, max } = spec else {
            unreachable!("cdc specs only")
        };
        let cdc = fastcdc::v2020::FastCDC::new(src, min, avg, max);
        cdc.cut(0, src.len()).1
    }

    /// The rule as [`Gear`] states it, one byte at a time, with any table
    /// (held to the crate's cut with the public table below).
    fn one_chain_cut(table: &GearTable, spec: ChunkerSpec, src: &[u8]) -> usize {
        let ChunkerSpec::Cdc { min, avg, max } = spec else {
            unreachable!("cdc specs only")
        };
        let masks = Gear::new(table, min, avg, max);
        let len = src.len();
        if len <= min as usize {
            return len;
        }
        let (end, center) = if len > max as usize {
            (max as usize, avg as usize)
        } else {
            (len, (avg as usize).min(len))
        };
        let mut h = 0u64;
        let start = min as usize & !1;
        for (i, &byte) in src.iter().enumerate().take(end & !1).skip(start) {
            h = (h << 1).wrapping_add(table.0[usize::from(byte)]);
            let mask = if i < center & !1 {
                masks.mask_s
            } else {
                masks.mask_l
            };
            if h & mask == 0 {
                return i;
            }
        }
        end
    }

    /// Bytes that match the masks often or never: few distinct bytes,
    /// zeros, one repeated byte, random.
    fn texture(kind: u8, n: usize, seed: u64) -> Vec<u8> {
        let r = pseudo_random(n, seed);
        match kind % 4 {
            0 => r,
            1 => r.iter().map(|b| b & 3).collect(),
            2 => vec![0u8; n],
            _ => r.iter().map(|b| if b % 64 == 0 { *b } else { 7 }).collect(),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Every chunk start, length, spec and kind of bytes: the cut is
        /// the crate's, to the byte (odd MIN, AVG and lengths included,
        /// which the crate rounds down to even).
        #[test]
        fn the_four_lane_cut_is_the_crates(
            min_log in 6u32..=14, avg_extra in 1u32..=4, max_extra in 1u32..=3,
            odd in 0u32..2, kind in 0u8..4, seed in 1u64.., len in 0usize..300_000,
        ) {
            let avg = 1u32 << (min_log + avg_extra).clamp(8, 22);
            let min = ((1u32 << min_log) + odd).min(avg - 1).max(64);
            let max = (avg << max_extra).clamp(1024, 16 << 20);
            let spec = ChunkerSpec::Cdc { min, avg: avg + odd, max };
            let data = texture(kind, len, seed);
            let gear = spec.build(&GearTable::public());
            let Some(g) = &gear.gear else { unreachable!("cdc") };
            let mut pos = 0;
            while pos < data.len() {
                let want = crate_cut(spec, &data[pos..]);
                proptest::prop_assert_eq!(g.cut(&data[pos..]), want, "{} at {}", spec, pos);
                pos += want.max(1);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(100))]

        /// A keyed table is cut by the same rule: the four-lane cut is the
        /// one-chain cut with that table, and the one-chain cut with the
        /// public table is the crate's.
        #[test]
        fn a_keyed_table_is_cut_by_the_same_rule(
            secret in proptest::array::uniform32(0u8..), kind in 0u8..4,
            seed in 1u64.., len in 0usize..200_000, spec_pick in 0usize..3,
        ) {
            let spec = [DEFAULT_CHUNKER, "cdc:256,1K,4K".parse().unwrap(),
                "cdc:2K,16K,64K".parse().unwrap()][spec_pick];
            let data = texture(kind, len, seed);
            let keyed = GearTable::keyed(&secret);
            let chunker = spec.build(&keyed);
            let Some(g) = &chunker.gear else { unreachable!("cdc") };
            let mut pos = 0;
            while pos < data.len() {
                let want = one_chain_cut(&keyed, spec, &data[pos..]);
                proptest::prop_assert_eq!(g.cut(&data[pos..]), want, "{} at {}", spec, pos);
                proptest::prop_assert_eq!(
                    one_chain_cut(&GearTable::public(), spec, &data[pos..]),
                    crate_cut(spec, &data[pos..])
                );
                pos += want.max(1);
            }
        }
    }

    /// Cut `data` whole with `table`.
    fn ends_with(table: &GearTable, data: &[u8]) -> Vec<u32> {
        let mut ends = Vec::new();
        DEFAULT_CHUNKER.build(table).cut(data, true, &mut ends);
        ends
    }

    /// A keyed table moves the cuts (so their places tell nothing without
    /// the secret), the same secret puts them in the same places (so a
    /// repository's backups dedup), and the sizes stay the spec's.
    #[test]
    fn keyed_tables_cut_elsewhere_and_alike_for_one_secret() {
        let data = texture(0, 4 << 20, 11);
        let public = ends_with(&GearTable::public(), &data);
        let a = ends_with(&GearTable::keyed(&[1; 32]), &data);
        let b = ends_with(&GearTable::keyed(&[2; 32]), &data);
        assert_eq!(a, ends_with(&GearTable::keyed(&[1; 32]), &data));
        for (name, ends) in [("public", &public), ("a", &a), ("b", &b)] {
            // About 4 MiB / 32 KiB chunks.
            assert!((64..=256).contains(&ends.len()), "{name}: {}", ends.len());
            let mut start = 0;
            for (i, &e) in ends.iter().enumerate() {
                let len = e - start;
                assert!(len <= 131072, "{name}: chunk {i} of {len} bytes");
                assert!(
                    len >= 8192 || i + 1 == ends.len(),
                    "{name}: chunk {i} of {len} bytes"
                );
                start = e;
            }
        }
        // Random data: a cut of one table lands on a cut of another by
        // chance only.
        let shared = |x: &[u32], y: &[u32]| x.iter().filter(|e| y.contains(e)).count();
        assert!(shared(&a, &public) < 8, "{}", shared(&a, &public));
        assert!(shared(&a, &b) < 8, "{}", shared(&a, &b));
        assert_eq!(format!("{:?}", GearTable::keyed(&[1; 32])), "GearTable(..)");
    }

    /// Long inputs of the default spec: many rounds of stretches, matches
    /// in every stretch of a round, at both masks.
    #[test]
    fn the_default_cut_is_the_crates_over_many_chunks() {
        for kind in 0..4 {
            let data = texture(kind, 8 << 20, 5 + u64::from(kind));
            let ends = cut_in_batches(DEFAULT_CHUNKER, &data, 1 << 20);
            let cdc = fastcdc::v2020::FastCDC::new(&data, 8192, 32768, 131072);
            let want: Vec<usize> = cdc.map(|c| c.offset + c.length).collect();
            assert_eq!(ends, want, "kind {kind}");
        }
    }

    #[test]
    fn empty_and_tiny_inputs() {
        let mut ends = Vec::new();
        let c = DEFAULT_CHUNKER.build(&GearTable::public());
        assert_eq!(c.cut(&[], true, &mut ends), 0);
        assert!(ends.is_empty());
        assert_eq!(c.cut(&[1], false, &mut ends), 0);
        assert_eq!(c.cut(&[1], true, &mut ends), 1);
        assert_eq!(ends, vec![1]);
    }
}
