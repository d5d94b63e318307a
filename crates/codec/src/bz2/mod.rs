//! A native bzip2 codec: the pieces lbzip2 shows can be much faster than
//! libbzip2's (block sorting, Huffman decoding, the inverse BWT), written
//! here because no maintained crate offers them; libbzip2 (through the
//! `bzip2` crate) stays the reference the tests compare against.
//!
//! The encoder ([`encode`]) exists because libbzip2's block sorter is about
//! 1.5x slower than lbzip2's and no maintained crate encodes bzip2 faster:
//! it sorts with libsais (a suffix sorter, applied to the block turned to its
//! least rotation) and writes the rest of the format by hand.
//! The decoder ([`decode`]) exists because libbzip2 decodes about 25% slower
//! per core than lbzip2, which left cairn's parallel `unpack` of .bz2 behind
//! `lbzip2 -d` on the same cores; it walks the inverse BWT in many chains
//! at once and so decodes about twice as fast as either.
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
/// `crc` crate's slice-by-16 tables: it runs over every byte packed and
/// unpacked, and slice-by-16 is about three times a slice-by-4 loop.
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
