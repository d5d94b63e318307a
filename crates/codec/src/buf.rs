//! Appending codec output to caller-owned buffers.
//!
//! Every codec writes into a `Vec` the caller keeps and reuses, and the
//! helpers here do that appending in one place: a zeroed tail for Rust
//! codecs, spare capacity through a raw pointer for C ones (liblz4). They
//! sit below both [`crate::block`] and [`crate::lz4_ffi`] so that those two
//! depend one way only (block uses lz4_ffi, both use this module).

use crate::error::{CodecError, Result};
use std::fmt;

/// A huge page (x86-64, arm64 with 4 KiB pages).
const HUGE_PAGE: usize = 2 << 20;

/// Ask for transparent huge pages under the whole huge pages of `v`'s
/// capacity (advice only; where they are off, nothing changes). A buffer
/// of tens of MiB that is filled once per chunk took a page fault per 4
/// KiB the first time round: parallel gunzip of os2.img's `gzip -6` (604
/// MB, 2 workers) took 55 k faults and 0.76-0.78 CPU-s, 25 k and
/// 0.68-0.69 with this advice on its whole-chunk buffers (`perf stat -r
/// 7`, alternating).
pub(crate) fn advise_huge_pages<T>(v: &Vec<T>) {
    let start = v.as_ptr() as usize;
    let end = start + v.capacity() * std::mem::size_of::<T>();
    let first = start.next_multiple_of(HUGE_PAGE);
    let last = end / HUGE_PAGE * HUGE_PAGE;
    if last > first {
        // SAFETY: the range lies within `v`'s allocation, and
        // MADV_HUGEPAGE only changes how its pages are backed, never their
        // contents or whether they may be accessed.
        unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_HUGEPAGE,
            )
        };
    }
}

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;

    /// The kernel takes the advice: the mapping under the buffer's whole
    /// huge pages may have them (where they are not turned off).
    #[test]
    fn a_big_buffer_is_eligible_for_huge_pages() {
        let v: Vec<u8> = Vec::with_capacity(16 << 20);
        advise_huge_pages(&v);
        let inside = (v.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut in_it = false;
        let mut eligible = None;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = head.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    in_it = lo <= inside && inside < hi;
                    continue;
                }
            }
            if in_it {
                if let Some(flag) = line.strip_prefix("THPeligible:") {
                    eligible = Some(flag.trim() == "1");
                }
            }
        }
        let enabled = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"));
        assert_eq!(eligible, Some(enabled));
        // Advice on a buffer with no whole huge page is no advice.
        advise_huge_pages(&Vec::<u8>::with_capacity(100));
        advise_huge_pages(&Vec::<u16>::new());
    }
}
