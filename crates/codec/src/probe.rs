//! A cheap guess, before compressing a large buffer, that no codec will
//! shrink it: encrypted volumes, compressed archives and media, random
//! fill.
//!
//! zstd spends about 0.3 ns a byte finding that random data does not
//! compress (3.2 GB/s on one core here: `zstd -b3 -e3 -B2097152` on the
//! first 256 MiB of the bench's random.bin), and a caller that then stores the bytes raw has paid
//! that for nothing. [`Probe`] looks at evenly spread samples of the buffer
//! (one 8 KiB sample per 32 KiB, a quarter of it) and calls the buffer
//! incompressible only when every sample is both:
//!
//! - without repeats: LZ4 (the predictor borg's `auto` mode uses too)
//!   cannot take 1/64 off the sample, so it holds little for any LZ
//!   match finder within a sample's reach;
//! - flat: the order-0 entropy of its first 4 KiB is at least 7.8 bits a
//!   byte, so an entropy coder (zstd's and xz's literals, bzip2's Huffman
//!   stage) cannot gain 2.5 % either.
//!
//! One compressible sample is enough to say no, so a compressible buffer
//! costs a sample or two. Two things can be misjudged, and then lose only
//! their own saving: a compressible stretch shorter than the gap between
//! samples (24 KiB) inside random data, and random-looking blocks repeated
//! more than half a sample (4 KiB) apart, which a sample may not hold both
//! of (repeats of 32 KiB and more are chunks that a deduplicating store
//! finds anyway). Sparser samples were tried on the bench's memory dump:
//! with one 16 KiB sample per 128 KiB, three of its 2 MiB groups that zstd
//! shrinks by 2.5 to 5.4 % were called incompressible (247 KB lost in
//! all); per 64 KiB, one (75 KB); with these, none. Buffers shorter than
//! [`Probe::MIN_LEN`] are never judged: compressing them costs little.
//! There is no crate for this: it is a few lines around liblz4.

use crate::lz4_ffi;

/// Reusable state for [`Probe::incompressible`].
pub struct Probe {
    lz4: lz4_ffi::Compressor,
    out: Vec<u8>,
}

impl Probe {
    /// Bytes in each sample.
    pub const SAMPLE: usize = 8 * 1024;
    /// Bytes at the start of a sample whose entropy is measured.
    pub const FLAT_SAMPLE: usize = 4096;
    /// One sample is taken every this many bytes.
    pub const SPACING: usize = 32 * 1024;
    /// Buffers shorter than this are never called incompressible.
    pub const MIN_LEN: usize = 256 * 1024;

    /// A probe with its LZ4 state allocated.
    pub fn new() -> Self {
        Probe {
            lz4: lz4_ffi::Compressor::new(),
            out: Vec::with_capacity(lz4_ffi::bound(Self::SAMPLE)),
        }
    }

    /// Whether `data` looks like no codec will shrink it (see the module
    /// documentation for the test and its limits).
    pub fn incompressible(&mut self, data: &[u8]) -> bool {
        if data.len() < Self::MIN_LEN {
            return false;
        }
        let samples = data.len() / Self::SPACING;
        (0..samples).all(|i| {
            // Sample from the middle of each stretch, away from the
            // boundaries where unrelated data tends to meet.
            let at = i * Self::SPACING + (Self::SPACING - Self::SAMPLE) / 2;
            self.flat_without_repeats(&data[at..at + Self::SAMPLE])
        })
    }

    fn flat_without_repeats(&mut self, sample: &[u8]) -> bool {
        // LZ4 first: it skips quickly through data without matches.
        self.out.clear();
        let no_repeats = match self.lz4.compress_append(sample, &mut self.out) {
            Some(n) => n >= sample.len() - sample.len() / 64,
            None => false,
        };
        no_repeats && entropy_bits(&sample[..Self::FLAT_SAMPLE]) >= 7.8
    }
}

impl Default for Probe {
    fn default() -> Self {
        Probe::new()
    }
}

/// Order-0 entropy of `data` in bits per byte (0 for an empty slice).
fn entropy_bits(data: &[u8]) -> f64 {
    if data.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for &b in data {
        counts[usize::from(b)] += 1;
    }
    let n = data.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{CodecKind, CodecSpec};
    use crate::testutil::noise;

    /// What zstd -3 saves on `data`, as a share of its length.
    fn zstd_saving(data: &[u8]) -> f64 {
        let mut c = CodecSpec::default_for(CodecKind::Zstd).build();
        let mut out = Vec::new();
        c.compress(data, &mut out).unwrap();
        1.0 - out.len() as f64 / data.len() as f64
    }

    #[test]
    fn random_data_is_incompressible_and_zstd_agrees() {
        let data = noise(2 << 20, 7);
        assert!(Probe::new().incompressible(&data));
        assert!(zstd_saving(&data) <= 0.0);
    }

    #[test]
    fn compressible_data_of_every_kind_is_not() {
        let len = 1 << 20;
        let mut probe = Probe::new();
        // Text: repeats and a skewed alphabet.
        let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog; "
            .iter()
            .copied()
            .cycle()
            .take(len)
            .collect();
        // Hex digits of random bytes: no repeats LZ4 can use, but only 4
        // bits of entropy a byte.
        let hex: Vec<u8> = noise(len / 2, 3)
            .iter()
            .flat_map(|b| {
                let d = b"0123456789abcdef";
                [d[usize::from(b >> 4)], d[usize::from(b & 15)]]
            })
            .collect();
        // Random 7-bit bytes: no repeats either, 7 bits of entropy a byte.
        let seven_bit: Vec<u8> = noise(len, 13).iter().map(|b| b & 0x7f).collect();
        // Random 2 KiB blocks, each repeated at once: flat, but LZ
        // matches (half a sample apart: every sample holds a pair).
        let pages: Vec<u8> = noise(len / 2, 5)
            .chunks(2048)
            .flat_map(|p| p.iter().chain(p.iter()).copied().collect::<Vec<_>>())
            .collect();
        // Random data with one sample spacing of zeros.
        let mut patched = noise(len, 9);
        patched[5 * Probe::SPACING..6 * Probe::SPACING].fill(0);
        for (name, data) in [
            ("text", &text),
            ("hex", &hex),
            ("seven_bit", &seven_bit),
            ("pages", &pages),
            ("patched", &patched),
        ] {
            assert!(!probe.incompressible(data), "{name} called incompressible");
            assert!(zstd_saving(data) > 0.02, "{name} should compress");
        }
    }

    #[test]
    fn short_buffers_are_never_judged() {
        let data = noise(Probe::MIN_LEN - 1, 11);
        assert!(!Probe::new().incompressible(&data));
        assert!(!Probe::new().incompressible(&[]));
    }

    #[test]
    fn entropy_of_known_distributions() {
        assert_eq!(entropy_bits(&[]), 0.0);
        assert_eq!(entropy_bits(&[42; 1000]), 0.0);
        let two: Vec<u8> = (0..1000).map(|i| (i % 2) as u8).collect();
        assert!((entropy_bits(&two) - 1.0).abs() < 1e-9);
        let all: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        assert!((entropy_bits(&all) - 8.0).abs() < 1e-9);
    }
}
