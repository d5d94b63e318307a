//! Safe wrappers over liblz4, the reference LZ4 implementation (built from
//! source by lz4-sys), for the calls lz4-sys compiles but does not declare:
//! compression into a caller-owned state, decompression with a dictionary
//! (linked blocks), and XXH32. lz4_flex was measured here at about a third
//! of liblz4's decoding speed and 0.85x its encoding speed on an ext4 image,
//! which would cap `cairn unpack` of lz4 below the single-threaded `lz4 -d`.

use crate::buf::append_raw;
use std::ffi::{c_char, c_int, c_uint, c_void};

// Link liblz4: nothing of lz4-sys's own declarations is used, so name the
// crate to keep its static library on the link line.
extern crate lz4_sys as _;

#[repr(C)]
struct Xxh32State {
    _private: [u8; 0],
}

extern "C" {
    fn LZ4_sizeofState() -> c_int;
    fn LZ4_compress_fast_extState(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
    fn LZ4_sizeofStateHC() -> c_int;
    fn LZ4_compress_HC_extStateHC(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        compression_level: c_int,
    ) -> c_int;
    fn LZ4_initStreamHC(buffer: *mut c_void, size: usize) -> *mut c_void;
    fn LZ4_favorDecompressionSpeed(stream: *mut c_void, favor: c_int);
    fn LZ4_compress_HC_extStateHC_fastReset(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        compression_level: c_int,
    ) -> c_int;
    fn LZ4_decompress_safe_usingDict(
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        dict_start: *const c_char,
        dict_size: c_int,
    ) -> c_int;
    fn LZ4_decompress_safe_partial(
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        target_output_size: c_int,
        dst_capacity: c_int,
    ) -> c_int;
    fn XXH32(input: *const c_void, length: usize, seed: c_uint) -> c_uint;
    fn XXH32_createState() -> *mut Xxh32State;
    fn XXH32_freeState(state: *mut Xxh32State) -> c_int;
    fn XXH32_reset(state: *mut Xxh32State, seed: c_uint) -> c_int;
    fn XXH32_update(state: *mut Xxh32State, input: *const c_void, length: usize) -> c_int;
    fn XXH32_digest(state: *const Xxh32State) -> c_uint;
}

/// Largest input LZ4 accepts (LZ4_MAX_INPUT_SIZE).
pub const MAX_INPUT: usize = 0x7E00_0000;

/// Worst-case compressed size of `n` bytes (LZ4_COMPRESSBOUND).
pub fn bound(n: usize) -> usize {
    n + n / 255 + 16
}

/// Levels from which the high-compression coder (LZ4 HC) is used, as the
/// `lz4` tool uses it (LZ4HC_CLEVEL_MIN); below, the fast one.
pub const HC_FROM: i32 = 3;

/// Highest LZ4 HC level (LZ4HC_CLEVEL_MAX), `lz4 --best`.
pub const MAX_LEVEL: i32 = 12;

/// Lowest level: `lz4 --fast=65536`. A level -N below 1 is the fast coder
/// with acceleration N + 1, as the `lz4` tool's frames have it (its bare
/// `--fast` is -1, acceleration 2); LZ4 caps acceleration at 65537
/// (LZ4_ACCELERATION_MAX).
pub const MIN_LEVEL: i32 = -65536;

/// LZ4 HC levels from which the optimal parser runs (LZ4HC_CLEVEL_OPT_MIN),
/// the only ones that favoring decompression speed changes.
pub const OPT_FROM: i32 = 10;

/// An LZ4 compression state, allocated once and reused for every block.
pub struct Compressor {
    state: Vec<u64>,
    level: i32,
    /// LZ4 HC's favorDecSpeed (`lz4 --favor-decSpeed`): fewer, longer
    /// matches, so blocks decode faster and are a little bigger.
    favor_dec_speed: bool,
}

impl Compressor {
    /// A fresh state for level 1 (the fast coder).
    pub fn new() -> Self {
        Compressor::with_level(1)
    }

    /// A fresh state for `level` (up to 2 the fast coder, below 0 with
    /// acceleration -`level` + 1 ([`MIN_LEVEL`]); 3-12 LZ4 HC).
    pub fn with_level(level: i32) -> Self {
        let level = level.clamp(MIN_LEVEL, MAX_LEVEL);
        // SAFETY: pure functions returning a constant size.
        let size = unsafe {
            match level >= HC_FROM {
                true => LZ4_sizeofStateHC(),
                false => LZ4_sizeofState(),
            }
        };
        let words = usize::try_from(size).unwrap_or(1 << 18) / 8 + 1;
        Compressor {
            state: vec![0u64; words],
            level,
            favor_dec_speed: false,
        }
    }

    /// As [`Compressor::with_level`], with LZ4 HC's favorDecSpeed (as
    /// `lz4 --favor-decSpeed` sets it on frames): its optimal parser
    /// (levels [`OPT_FROM`] up) prefers what decodes faster; the other
    /// levels are unchanged, as in LZ4.
    pub fn favoring_decompression_speed(level: i32) -> Self {
        let mut c = Compressor::with_level(level);
        c.favor_dec_speed = true;
        c
    }

    /// Compress `src`, appending to `dst`; returns the compressed length,
    /// or `None` when `src` is over [`MAX_INPUT`].
    pub fn compress_append(&mut self, src: &[u8], dst: &mut Vec<u8>) -> Option<usize> {
        let src_len = c_int::try_from(src.len())
            .ok()
            .filter(|_| src.len() <= MAX_INPUT)?;
        let cap = bound(src.len());
        let dst_cap = c_int::try_from(cap).ok()?;
        let state_bytes = self.state.len() * 8;
        let state = self.state.as_mut_ptr().cast::<c_void>();
        let level = self.level;
        let acceleration = if level < 0 { 1 - level } else { 1 };
        let favor = self.favor_dec_speed && level >= HC_FROM;
        let write = |d: *mut u8, _: usize| {
            // SAFETY: `state` is `state_bytes` bytes (LZ4_sizeofState(),
            // or LZ4_sizeofStateHC() for an HC level, as made in
            // `with_level`), 8-aligned as LZ4 requires, owned by `self`;
            // `src` is valid for `src_len` bytes, `d` for `cap` bytes.
            let n = unsafe {
                if favor {
                    // LZ4_initStreamHC makes the state a clean HC state
                    // (null only if too small or misaligned, which it is
                    // not), favorDecSpeed is set on it, and the fast-reset
                    // compression keeps that flag on a clean state.
                    if LZ4_initStreamHC(state, state_bytes).is_null() {
                        return None;
                    }
                    LZ4_favorDecompressionSpeed(state, 1);
                }
                match (favor, level >= HC_FROM) {
                    (true, _) => LZ4_compress_HC_extStateHC_fastReset(
                        state,
                        src.as_ptr().cast(),
                        d.cast(),
                        src_len,
                        dst_cap,
                        level,
                    ),
                    (false, true) => LZ4_compress_HC_extStateHC(
                        state,
                        src.as_ptr().cast(),
                        d.cast(),
                        src_len,
                        dst_cap,
                        level,
                    ),
                    (false, false) => LZ4_compress_fast_extState(
                        state,
                        src.as_ptr().cast(),
                        d.cast(),
                        src_len,
                        dst_cap,
                        acceleration,
                    ),
                }
            };
            usize::try_from(n).ok().filter(|&n| n > 0 || src.is_empty())
        };
        // SAFETY (append_raw's contract): LZ4 writes only within
        // `dst_capacity` = `cap` bytes and returns how many it wrote.
        unsafe { append_raw(dst, cap, write) }
    }
}

impl Default for Compressor {
    fn default() -> Self {
        Compressor::new()
    }
}

/// Decompress one block of at most `cap` bytes, appending to `dst`, with
/// the preceding output `dict` (empty for independent blocks); returns the
/// decoded length, `None` on damage.
pub fn decompress_append(src: &[u8], dst: &mut Vec<u8>, cap: usize, dict: &[u8]) -> Option<usize> {
    let src_len = c_int::try_from(src.len()).ok()?;
    let dst_cap = c_int::try_from(cap).ok()?;
    let dict_len = c_int::try_from(dict.len()).ok()?;
    let write = |d: *mut u8, _: usize| {
        // SAFETY: never reads past `src_len` bytes of `src` nor writes
        // past `dst_cap` bytes at `d`; match offsets reaching before
        // `d` resolve in `dict` (`dict_len` valid bytes) or are refused.
        let n = unsafe {
            LZ4_decompress_safe_usingDict(
                src.as_ptr().cast(),
                d.cast(),
                src_len,
                dst_cap,
                dict.as_ptr().cast(),
                dict_len,
            )
        };
        usize::try_from(n).ok()
    };
    // SAFETY (append_raw's contract): the `_safe` decoder writes only
    // within `dst_cap` bytes and returns how many it wrote (< 0 on damage).
    unsafe { append_raw(dst, cap, write) }
}

/// Decompress one independent block into `dst`, which it must not
/// overflow; returns the decoded length, `None` on damage.
pub fn decompress_into(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    let src_len = c_int::try_from(src.len()).ok()?;
    let dst_cap = c_int::try_from(dst.len()).ok()?;
    // SAFETY: the `_safe` decoder reads at most `src_len` bytes of `src`
    // and writes at most `dst_cap` bytes of `dst`, both valid for the call.
    let n = unsafe {
        LZ4_decompress_safe_usingDict(
            src.as_ptr().cast(),
            dst.as_mut_ptr().cast(),
            src_len,
            dst_cap,
            std::ptr::null(),
            0,
        )
    };
    usize::try_from(n).ok()
}

/// Decompress at least the first `want` bytes of one independent block
/// (all of it if it is shorter) and at most `cap`, appending to `dst`;
/// returns how many were decoded, `None` on damage. LZ4 stops soon after
/// `want`, so reading the head of a block costs only the head.
pub fn decompress_prefix_append(
    src: &[u8],
    dst: &mut Vec<u8>,
    want: usize,
    cap: usize,
) -> Option<usize> {
    let src_len = c_int::try_from(src.len()).ok()?;
    let dst_cap = c_int::try_from(cap).ok()?;
    let target = c_int::try_from(want.min(cap)).ok()?;
    let write = |d: *mut u8, _: usize| {
        // SAFETY: never reads past `src_len` bytes of `src` nor writes
        // past `dst_cap` bytes at `d` (the `_safe` decoder).
        let n = unsafe {
            LZ4_decompress_safe_partial(src.as_ptr().cast(), d.cast(), src_len, target, dst_cap)
        };
        usize::try_from(n).ok()
    };
    // SAFETY (append_raw's contract): the `_safe` decoder writes only
    // within `dst_cap` bytes and returns how many it wrote (< 0 on damage).
    unsafe { append_raw(dst, cap, write) }
}

/// XXH32 of `data` with seed 0.
pub fn xxh32(data: &[u8]) -> u32 {
    // SAFETY: reads exactly `data.len()` bytes of a valid slice.
    unsafe { XXH32(data.as_ptr().cast(), data.len(), 0) }
}

/// Streaming XXH32 (seed 0).
pub struct Xxh32 {
    state: *mut Xxh32State,
}

// SAFETY: the state is a plain heap block owned by this value alone; it
// has no thread affinity.
unsafe impl Send for Xxh32 {}

impl Xxh32 {
    /// A fresh hash, or `None` if the C allocator fails.
    pub fn new() -> Option<Self> {
        // SAFETY: returns a new heap state or null.
        let state = unsafe { XXH32_createState() };
        if state.is_null() {
            return None;
        }
        // SAFETY: `state` is a valid, exclusively owned state.
        unsafe { XXH32_reset(state, 0) };
        Some(Xxh32 { state })
    }

    /// Hash more bytes.
    pub fn update(&mut self, data: &[u8]) {
        // SAFETY: valid state; reads exactly `data.len()` bytes.
        unsafe { XXH32_update(self.state, data.as_ptr().cast(), data.len()) };
    }

    /// The hash of everything so far.
    pub fn digest(&self) -> u32 {
        // SAFETY: valid state, only read.
        unsafe { XXH32_digest(self.state) }
    }
}

impl Drop for Xxh32 {
    fn drop(&mut self) {
        // SAFETY: `state` came from XXH32_createState and is freed once.
        unsafe { XXH32_freeState(self.state) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxh32_known_values() {
        // Reference values of XXH32 with seed 0.
        assert_eq!(xxh32(b""), 0x02CC_5D05);
        assert_eq!(xxh32(b"a"), 0x550D_7456);
        let mut h = Xxh32::new().unwrap();
        h.update(b"ab");
        h.update(b"c");
        assert_eq!(h.digest(), xxh32(b"abc"));
        assert_eq!(xxh32(b"abc"), 0x32D1_53FF);
    }

    #[test]
    fn a_prefix_decodes_the_head_of_a_block_and_refuses_damage() {
        let mut c = Compressor::new();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let mut packed = Vec::new();
        c.compress_append(&data, &mut packed).unwrap();
        for want in [0, 1, 4096, 65_537, data.len()] {
            let mut out = vec![5u8];
            let n = decompress_prefix_append(&packed, &mut out, want, data.len()).unwrap();
            assert!(n >= want && n <= data.len(), "{want}: {n}");
            assert_eq!(out[0], 5);
            assert_eq!(&out[1..], &data[..n]);
        }
        // Asking for more than the block holds gives the whole block.
        let mut out = Vec::new();
        let n = decompress_prefix_append(&packed, &mut out, data.len() + 10, data.len() + 10);
        assert_eq!(n, Some(data.len()));
        // A cut block cannot give its tail.
        let mut out = Vec::new();
        let cut = &packed[..packed.len() / 2];
        assert_ne!(
            decompress_prefix_append(cut, &mut out, data.len(), data.len()),
            Some(data.len())
        );
    }

    #[test]
    fn every_level_round_trips_and_hc_compresses_more() {
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| ((i / 7) % 61) as u8 ^ (i % 13 == 0) as u8)
            .collect();
        let mut sizes = Vec::new();
        for level in [1, 2, HC_FROM, 9, MAX_LEVEL] {
            let mut c = Compressor::with_level(level);
            for _ in 0..2 {
                // The state is reused for a second block.
                let mut out = Vec::new();
                let n = c.compress_append(&data, &mut out).unwrap();
                assert_eq!(n, out.len());
                let mut back = Vec::new();
                assert_eq!(
                    decompress_append(&out, &mut back, data.len(), &[]),
                    Some(data.len()),
                    "level {level}"
                );
                assert!(back == data, "level {level}");
                sizes.push((level, n));
            }
        }
        let at = |l: i32| {
            sizes
                .iter()
                .find(|(x, _)| *x == l)
                .map(|(_, n)| *n)
                .unwrap()
        };
        assert!(at(9) < at(1), "{sizes:?}");
        assert!(at(MAX_LEVEL) <= at(9), "{sizes:?}");
    }

    #[test]
    fn round_trip_with_and_without_dictionary() {
        let mut c = Compressor::new();
        let dict: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut packed = vec![9u8];
        let n = c.compress_append(&data, &mut packed).unwrap();
        assert_eq!(packed.len(), n + 1, "appends after existing bytes");
        let packed = &packed[1..];
        let mut out = Vec::new();
        assert_eq!(
            decompress_append(packed, &mut out, data.len(), &[]),
            Some(data.len())
        );
        assert_eq!(out, data);
        out.clear();
        assert_eq!(
            decompress_append(packed, &mut out, data.len(), &dict),
            Some(data.len())
        );
        assert_eq!(out, data);
        // Too small an output or a short input is refused, not overrun,
        // and leaves the Vec as it was.
        let mut small = vec![1, 2, 3];
        assert_eq!(
            decompress_append(packed, &mut small, data.len() - 1, &[]),
            None
        );
        assert_eq!(small, [1, 2, 3]);
        assert_eq!(
            decompress_append(&packed[..n / 2], &mut small, data.len(), &[]),
            None
        );
        assert_eq!(small, [1, 2, 3]);
        let mut empty = Vec::new();
        assert_eq!(c.compress_append(&[], &mut empty), Some(1));
    }
}
