//! A native bzip2 codec: the pieces lbzip2 shows can be much faster than
//! libbzip2's (block sorting, Huffman decoding, the inverse BWT), written
//! here because no maintained crate offers them; libbzip2 (through the
//! `bzip2` crate) stays the reference the tests compare against.
//!
//! The decoder ([`decode`]) exists because libbzip2 decodes about 25% slower
//! per core than lbzip2, which left cairn's parallel `unpack` of .bz2 behind
//! `lbzip2 -d` on the same cores; it walks the inverse BWT in many chains
//! at once and so decodes about twice as fast as either.
//!
//! This module holds what encoder and decoder share: the format's constants
//! and its CRC.

pub mod decode;

/// Starts every block (BCD pi).
pub const BLOCK_MAGIC: u64 = 0x3141_5926_5359;
/// Ends every stream (BCD sqrt(pi)).
pub const EOS_MAGIC: u64 = 0x1772_4538_5090;

/// bzip2's CRC-32: polynomial 0x04C11DB7, most significant bit first,
/// initial value and final xor all ones (CRC-32/BZIP2).
#[derive(Debug, Clone, Copy)]
pub struct Crc(u32);

const POLY: u32 = 0x04C1_1DB7;

/// Slice-by-4 tables: `TABLES[k][b]` is the CRC of byte `b` followed by
/// `k` zero bytes.
static TABLES: [[u32; 256]; 4] = make_tables();

const fn make_tables() -> [[u32; 256]; 4] {
    let mut t = [[0u32; 256]; 4];
    let mut b = 0;
    while b < 256 {
        let mut c = (b as u32) << 24;
        let mut i = 0;
        while i < 8 {
            c = if c & 0x8000_0000 != 0 {
                (c << 1) ^ POLY
            } else {
                c << 1
            };
            i += 1;
        }
        t[0][b] = c;
        b += 1;
    }
    let mut k = 1;
    while k < 4 {
        let mut b = 0;
        while b < 256 {
            let prev = t[k - 1][b];
            t[k][b] = (prev << 8) ^ t[0][(prev >> 24) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

impl Default for Crc {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc {
    /// A CRC over no bytes yet.
    pub const fn new() -> Self {
        Crc(u32::MAX)
    }

    /// Feed `data`.
    pub fn update(&mut self, data: &[u8]) {
        let mut c = self.0;
        let mut chunks = data.chunks_exact(4);
        for w in &mut chunks {
            let x = c ^ u32::from_be_bytes([w[0], w[1], w[2], w[3]]);
            c = TABLES[3][(x >> 24) as usize]
                ^ TABLES[2][((x >> 16) & 0xff) as usize]
                ^ TABLES[1][((x >> 8) & 0xff) as usize]
                ^ TABLES[0][(x & 0xff) as usize];
        }
        for &b in chunks.remainder() {
            c = (c << 8) ^ TABLES[0][((c >> 24) ^ u32::from(b)) as usize];
        }
        self.0 = c;
    }

    /// Feed `n` copies of `byte` (a run, as the run-length passes make).
    pub fn update_run(&mut self, byte: u8, n: usize) {
        let mut c = self.0;
        for _ in 0..n {
            c = (c << 8) ^ TABLES[0][((c >> 24) ^ u32::from(byte)) as usize];
        }
        self.0 = c;
    }

    /// The CRC of everything fed so far.
    pub const fn value(&self) -> u32 {
        !self.0
    }
}

/// A stream's combined CRC: each block's CRC folded in, in order.
pub const fn combine(stream_crc: u32, block_crc: u32) -> u32 {
    stream_crc.rotate_left(1) ^ block_crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crc_of(data: &[u8]) -> u32 {
        let mut c = Crc::new();
        c.update(data);
        c.value()
    }

    #[test]
    fn check_value_of_crc32_bzip2() {
        // The catalogue's check value for CRC-32/BZIP2.
        assert_eq!(crc_of(b"123456789"), 0xFC89_1918);
        assert_eq!(crc_of(b""), 0);
    }

    #[test]
    fn slices_and_runs_agree_with_bytewise() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let whole = crc_of(&data);
        for cut in [0, 1, 3, 4, 5, 999, 1000] {
            let mut c = Crc::new();
            c.update(&data[..cut]);
            c.update(&data[cut..]);
            assert_eq!(c.value(), whole, "cut at {cut}");
        }
        let mut c = Crc::new();
        c.update_run(b'x', 37);
        assert_eq!(c.value(), crc_of(&[b'x'; 37]));
    }
}
