//! libdeflate's whole-buffer inflate, through its C API for what the
//! `libdeflater` crate does not expose: writing into a vector's spare
//! capacity (no zeroing of buffers of a hundred MiB) and the number of input
//! bytes the stream took.

use libdeflate_sys as ld;

/// A libdeflate decompressor.
pub struct Whole {
    d: std::ptr::NonNull<ld::libdeflate_decompressor>,
}

// SAFETY: a libdeflate decompressor is plain heap state with no tie to the
// thread that allocated it; it is used by one thread at a time (`&mut`).
unsafe impl Send for Whole {}

/// How a whole-buffer inflate ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The stream ended after taking this many input bytes.
    Done { used: usize },
    /// The output did not fit.
    NoSpace,
    /// Not valid DEFLATE.
    Bad,
}

impl Whole {
    /// A decompressor; `None` when libdeflate cannot allocate one.
    pub fn new() -> Option<Self> {
        // SAFETY: no arguments; a null return is handled.
        let p = unsafe { ld::libdeflate_alloc_decompressor() };
        std::ptr::NonNull::new(p).map(|d| Whole { d })
    }

    /// Inflate the DEFLATE stream at the start of `input` into the spare
    /// capacity of `out` (appending).
    pub fn inflate(&mut self, input: &[u8], out: &mut Vec<u8>) -> Outcome {
        let spare = out.spare_capacity_mut();
        let avail = spare.len();
        let mut used = 0usize;
        let mut produced = 0usize;
        // SAFETY: the decompressor is live; `input` is readable for its
        // length and the spare capacity writable for `avail` bytes during
        // the call; the two out-pointers are valid.
        let rc = unsafe {
            ld::libdeflate_deflate_decompress_ex(
                self.d.as_ptr(),
                input.as_ptr().cast(),
                input.len(),
                spare.as_mut_ptr().cast(),
                avail,
                &mut used,
                &mut produced,
            )
        };
        match rc {
            ld::libdeflate_result_LIBDEFLATE_SUCCESS => {
                // SAFETY: libdeflate wrote `produced` (at most `avail`)
                // bytes at the start of the spare capacity.
                unsafe { out.set_len(out.len() + produced.min(avail)) };
                Outcome::Done { used }
            }
            ld::libdeflate_result_LIBDEFLATE_INSUFFICIENT_SPACE => Outcome::NoSpace,
            _ => Outcome::Bad,
        }
    }
}

impl Drop for Whole {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once.
        unsafe { ld::libdeflate_free_decompressor(self.d.as_ptr()) };
    }
}

/// Bits written least significant first, as DEFLATE packs them.
struct BitWriter<'a> {
    buf: &'a mut Vec<u8>,
    acc: u64,
    n: u32,
}

impl BitWriter<'_> {
    fn put(&mut self, value: u64, bits: u32) {
        self.acc |= value << self.n;
        self.n += bits;
        while self.n >= 8 {
            self.buf.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// An empty block with fixed codes: 10 bits.
    fn empty_fixed(&mut self, last: bool) {
        self.put(u64::from(last) | 1 << 1, 3);
        self.put(0, 7);
    }

    /// An empty block with dynamic codes: 91 bits. Two literal/length
    /// codes of one bit (0 and end-of-block), one distance code; the
    /// code-length code has symbols 1 and 18, of one bit each.
    fn empty_dynamic(&mut self) {
        self.put(0b100, 3);
        self.put(0, 5); // HLIT: 257 codes
        self.put(0, 5); // HDIST: 1 code
        self.put(14, 4); // HCLEN: 18 code-length codes
        const ORDER: [u8; 18] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1];
        for sym in ORDER {
            self.put(u64::from(sym == 1 || sym == 18), 3);
        }
        // Lengths: literal 0 is 1 (code-length code for "1" is 0); 255
        // zeros as 138 and 117 (code for 18 is 1, then 7 extra bits);
        // end-of-block is 1; the distance code is 1.
        self.put(0, 1);
        self.put(1, 1);
        self.put(138 - 11, 7);
        self.put(1, 1);
        self.put(117 - 11, 7);
        self.put(0, 1);
        self.put(0, 1);
        // End of block: literal 0 is code 0, end-of-block code 1.
        self.put(1, 1);
    }
}

/// Empty blocks, as (fixed, dynamic) counts, whose bits add up to `r`
/// modulo 8 (10 bits each fixed, 91 each dynamic).
const PAD: [(u8, u8); 8] = [
    (0, 0),
    (0, 3),
    (1, 0),
    (0, 1),
    (2, 0),
    (1, 1),
    (3, 0),
    (2, 1),
];

/// A DEFLATE stream that libdeflate can inflate whole: the `window` as a
/// stored block, empty blocks that bring the bit position to `from`'s
/// place in its byte, the bytes of `data` holding bits `from..to` (so a
/// stored block in them keeps its byte alignment), then an empty final
/// block at `to` (where `to` stands for a stored block's start,
/// [`super::marker::stored_at`]: an empty stored block read from wherever
/// that block's header really is, then the final block). `from` and `to`
/// must be block boundaries (or places that stand for them); the output is
/// the window then the bytes of those blocks. With no `to`, all of `data`
/// from `from` on is taken, for a stream that ends in it. Returns where
/// `data`'s byte `from / 8` is in `buf`.
pub fn rebase(
    data: &[u8],
    from: usize,
    to: Option<usize>,
    window: &[u8],
    buf: &mut Vec<u8>,
) -> usize {
    buf.clear();
    let mut w = BitWriter { buf, acc: 0, n: 0 };
    if !window.is_empty() {
        // BFINAL 0, BTYPE 00, padding to the byte; LEN, NLEN; the bytes.
        w.put(0, 8);
        let len = window.len() as u16;
        w.buf.extend_from_slice(&len.to_le_bytes());
        w.buf.extend_from_slice(&(!len).to_le_bytes());
        w.buf.extend_from_slice(window);
    }
    let r = from % 8;
    let (fixed, dynamic) = PAD[r];
    for _ in 0..dynamic {
        w.empty_dynamic();
    }
    for _ in 0..fixed {
        w.empty_fixed(false);
    }
    debug_assert_eq!(w.n as usize, r);
    let (acc, pending) = (w.acc as u8, w.n);
    let first = from / 8;
    let last = to.map_or(data.len(), |t| t.div_ceil(8));
    let base = buf.len();
    buf.extend_from_slice(&data[first..last]);
    buf.extend_from_slice(&[0, 0]);
    if pending > 0 {
        let keep = !((1u8 << pending) - 1);
        buf[base] = (buf[base] & keep) | acc;
    }
    let Some(to) = to else {
        buf.truncate(buf.len() - 2);
        return base;
    };
    if super::marker::stored_at(data, to) {
        // The bits up to the byte boundary are the stored block's header
        // and padding, wherever it starts; its lengths become those of an
        // empty block, and the final block follows.
        let q = (to + 3).div_ceil(8);
        buf.truncate(base + (q - first));
        buf.extend_from_slice(&[0, 0, 0xff, 0xff]);
        let mut w = BitWriter { buf, acc: 0, n: 0 };
        w.empty_fixed(true);
        w.put(0, 7);
        return base;
    }
    // Clear the bits past `to`, then an empty final block there.
    let end = base * 8 + r + (to - from);
    let byte = end / 8;
    buf[byte] &= (1u8 << (end % 8)) - 1;
    buf.truncate(byte + 1);
    let mut w = BitWriter {
        acc: u64::from(buf[byte]),
        n: (end % 8) as u32,
        buf,
    };
    w.buf.pop();
    w.empty_fixed(true);
    w.put(0, 7);
    base
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

    use super::*;

    #[test]
    fn an_empty_stretch_at_every_bit_phase_inflates_to_the_window() {
        let mut w = Whole::new().unwrap();
        let mut z = super::super::zstream::ZInflate::new().unwrap();
        let mut buf = Vec::new();
        for from in 0..24 {
            for window in [&b"window"[..], &[]] {
                rebase(&[0xff; 8], from, Some(from), window, &mut buf);
                let mut out = Vec::with_capacity(64);
                assert_eq!(w.inflate(&buf, &mut out), Outcome::Done { used: buf.len() });
                assert_eq!(out, window);
                // zlib reads the same padding blocks.
                let mut z2 = super::super::zstream::ZInflate::new().unwrap();
                std::mem::swap(&mut z, &mut z2);
                let mut out = Vec::with_capacity(64);
                let step = z.inflate(&buf, &mut out, false).unwrap();
                assert!(step.end && out == window, "from {from}");
            }
        }
    }
}
