//! Appending codec output to caller-owned buffers.
//!
//! Every codec writes into a `Vec` the caller keeps and reuses, and the
//! helpers here do that appending in one place: a zeroed tail for Rust
//! codecs, spare capacity through a raw pointer for C ones (liblz4). They
//! sit below both [`crate::block`] and [`crate::lz4_ffi`] so that those two
//! depend one way only (block uses lz4_ffi, both use this module).

use crate::error::{CodecError, Result};
use std::fmt;

/// Grows `dst` by `extra` zeroed bytes and returns the new tail.
///
/// Zeroing costs a memset per block; the codecs write every byte of the tail
/// anyway, and a safe tail keeps this crate free of `unsafe` set_len tricks.
pub(crate) fn grow(dst: &mut Vec<u8>, extra: usize) -> (usize, &mut [u8]) {
    let start = dst.len();
    dst.resize(start + extra, 0);
    (start, &mut dst[start..])
}

/// Append up to `cap` bytes that a C codec writes through a raw pointer
/// into `dst`'s spare capacity, with no zero-filling first (a memset of
/// every block costs up to a fifth of LZ4's decoding time).
///
/// # Safety
///
/// `write(ptr, cap)` must write only within `ptr..ptr + cap` and may return
/// `Some(n)` only after initialising the first `n <= cap` bytes at `ptr`.
pub(crate) unsafe fn append_raw(
    dst: &mut Vec<u8>,
    cap: usize,
    write: impl FnOnce(*mut u8, usize) -> Option<usize>,
) -> Option<usize> {
    dst.reserve(cap);
    let start = dst.len();
    // SAFETY: `reserve` made room for `cap` bytes past `len`, so the pointer
    // stays inside the allocation.
    let ptr = unsafe { dst.as_mut_ptr().add(start) };
    let n = write(ptr, cap)?;
    if n > cap {
        return None;
    }
    // SAFETY: the caller's contract: `write` initialised the first `n`
    // bytes of the spare capacity, and `start + n <= capacity`.
    unsafe { dst.set_len(start + n) };
    Some(n)
}

/// Append the output of a one-shot compressor to `dst`: `compress` gets a
/// tail of `bound` bytes and returns how many it wrote.
pub(crate) fn compress_into<E: fmt::Display>(
    codec: &'static str,
    dst: &mut Vec<u8>,
    bound: usize,
    compress: impl FnOnce(&mut [u8]) -> std::result::Result<usize, E>,
) -> Result<()> {
    let (start, tail) = grow(dst, bound);
    match compress(tail) {
        Ok(n) => {
            dst.truncate(start + n);
            Ok(())
        }
        Err(e) => {
            dst.truncate(start);
            Err(CodecError::Compress {
                codec,
                reason: e.to_string(),
            })
        }
    }
}

/// Append exactly `raw_len` decoded bytes to `dst`: `decode` gets a tail
/// of `raw_len` bytes and returns how many it wrote; fewer is corruption.
pub(crate) fn decompress_into<E: fmt::Display>(
    codec: &'static str,
    dst: &mut Vec<u8>,
    raw_len: usize,
    decode: impl FnOnce(&mut [u8]) -> std::result::Result<usize, E>,
) -> Result<()> {
    let (start, tail) = grow(dst, raw_len);
    let n = decode(tail).map_err(|e| CodecError::corrupt(codec, 0, e.to_string()));
    let n = match n {
        Ok(n) => n,
        Err(e) => {
            dst.truncate(start);
            return Err(e);
        }
    };
    dst.truncate(start + n);
    check_len(codec, n, raw_len)
}

pub(crate) fn check_len(codec: &'static str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(CodecError::corrupt(
            codec,
            0,
            format!("block decodes to {got} bytes, expected {want}"),
        ));
    }
    Ok(())
}
