//! A native bzip2 codec: the pieces lbzip2 shows can be much faster than
//! libbzip2's (block sorting, Huffman decoding, the inverse BWT), written
//! here because no maintained crate offers them; libbzip2 (through the
//! `bzip2` crate) stays the reference the tests compare against.
//!
//! With libbzip2, `cairn pack -F bzip2 -9 -T2` ran at 0.70x (os) and 0.61x
//! (mem) of `lbzip2 -n2 -9`, and `unpack` at 0.77x and 0.80x of `lbzip2
//! -n2 -d` (bench/runs/2026-11-22-pack-os-mem); perf put 58 % of packing in
//! its block sorter and 41 % of unpacking in the inverse BWT. The encoder
//! ([`encode`]) sorts with libsais (a suffix sorter, applied to the block
//! turned to its least rotation) and writes the rest of the format by hand;
//! the decoder ([`decode`]) walks the inverse BWT in 16 chains at once so
//! their cache misses overlap. With them: pack 1.47x / 1.58x and unpack
//! 1.56x / 1.92x of lbzip2 (bench/runs/2026-11-23-pack-bzip2, `bench/pack.py
//! --inputs os,mem --only bzip2 --runs 3`).
//!
//! This module holds what encoder and decoder share: the format's constants
//! and its CRC.

pub mod decode;
pub mod encode;

/// Starts every block (BCD pi).
pub const BLOCK_MAGIC: u64 = 0x3141_5926_5359;
/// Ends every stream (BCD sqrt(pi)).
pub const EOS_MAGIC: u64 = 0x1772_4538_5090;

/// bzip2's block CRC (CRC-32/BZIP2: polynomial 0x04C11DB7, most
/// significant bit first, initial value and final xor all ones), by the
/// `crc` crate's slice-by-16 tables, since it runs over every byte packed
/// and unpacked.
pub fn block_crc(data: &[u8]) -> u32 {
    CRC.checksum(data)
}

const CRC: crc::Crc<u32, crc::Table<16>> = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_BZIP2);

/// A stream's combined CRC: each block's CRC folded in, in order.
pub const fn combine(stream_crc: u32, block_crc: u32) -> u32 {
    stream_crc.rotate_left(1) ^ block_crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_of_crc32_bzip2() {
        // The catalogue's check value for CRC-32/BZIP2.
        assert_eq!(block_crc(b"123456789"), 0xFC89_1918);
        assert_eq!(block_crc(b""), 0);
    }

    #[test]
    fn combined_crc_rotates_then_xors() {
        assert_eq!(combine(0, 0x8000_0001), 0x8000_0001);
        assert_eq!(combine(0x8000_0001, 0), 0x0000_0003);
    }
}
