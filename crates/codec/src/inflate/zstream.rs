//! zlib's inflate through its C API, as zlib-rs implements it
//! (`libz-rs-sys`), for the three things flate2 does not expose: starting
//! at any bit of a raw DEFLATE stream (`inflatePrime`), with the 32 KiB
//! before it as the dictionary (`inflateSetDictionary`), and stopping at
//! each block's end with the exact bit position (`Z_BLOCK`, `data_type`).
//! zran.c, zlib's random-access example, uses the same calls.

use libz_rs_sys as z;
use std::mem::size_of;

/// One raw inflate stream.
pub struct ZInflate {
    strm: Box<z::z_stream>,
}

// SAFETY: the stream's pointers are its own state, allocated by zlib-rs
// with the Rust allocator, and `next_in`/`next_out`, which are set from
// borrowed slices only for the length of one `inflate` call; nothing is
// tied to the thread that made it.
unsafe impl Send for ZInflate {}

/// What one call of [`ZInflate::inflate`] did.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    /// Input bytes consumed.
    pub consumed: usize,
    /// Output bytes written.
    pub produced: usize,
    /// The stream's final block ended.
    pub end: bool,
    /// Stopped just after a block's end-of-block code (or a stored block's
    /// data): the next block's header is next. Not after the final block
    /// (zlib stops there too with `Z_BLOCK`, before it says the stream
    /// ended; zran.c skips it by the same flag): the bits after it are the
    /// padding and the trailer, and taking them for a block header ended a
    /// chunk there (a fixed-code stream failed to decode).
    pub at_block_end: bool,
    /// Bits of the consumed input not used yet (when `at_block_end`): fewer
    /// than 8 in zlib, but zlib-rs may hold several bytes' worth in its bit
    /// buffer, and says how many in `data_type`'s low six bits.
    pub unused_bits: u32,
}

impl ZInflate {
    /// A raw inflate stream (no zlib or gzip header), 32 KiB window.
    pub fn new() -> Option<Self> {
        let mut strm = Box::new(z::z_stream::default());
        // SAFETY: `strm` is a default z_stream (null buffers, the Rust
        // allocator), the version and size are this library's own.
        let rc = unsafe {
            z::inflateInit2_(
                &mut *strm,
                -15,
                z::zlibVersion(),
                size_of::<z::z_stream>() as i32,
            )
        };
        (rc == z::Z_OK).then_some(ZInflate { strm })
    }

    /// A raw inflate stream that starts at bit `bit` of `data` with
    /// `window` (the output before it) as its dictionary, and the offset
    /// of the first byte of `data` it still has to be given (the bits of a
    /// byte split by `bit` are primed).
    pub fn starting_at(
        data: &[u8],
        bit: usize,
        window: &[u8],
    ) -> std::result::Result<(Self, usize), &'static str> {
        let mut z = ZInflate::new().ok_or("out of memory for inflate")?;
        let mut at = bit / 8;
        let skip = bit % 8;
        if skip != 0 {
            let byte = *data.get(at).ok_or("start past the end of the data")?;
            if !z.prime(8 - skip as u32, u32::from(byte >> skip)) {
                return Err("inflate refused a start position");
            }
            at += 1;
        }
        if !window.is_empty() && !z.set_dictionary(window) {
            return Err("inflate refused a window");
        }
        Ok((z, at))
    }

    /// Feed `bits` (at most 16) bits of `value` before the next input
    /// byte: the rest of a byte whose first bits belong to the block before.
    pub fn prime(&mut self, bits: u32, value: u32) -> bool {
        // SAFETY: the stream was initialised by `new`.
        unsafe { z::inflatePrime(&mut *self.strm, bits as i32, value as i32) == z::Z_OK }
    }

    /// The 32 KiB (or fewer) of output before the position the stream
    /// starts at.
    pub fn set_dictionary(&mut self, dict: &[u8]) -> bool {
        // SAFETY: the stream was initialised by `new`; `dict` is valid for
        // its length during the call, which copies it.
        unsafe {
            z::inflateSetDictionary(&mut *self.strm, dict.as_ptr(), dict.len() as u32) == z::Z_OK
        }
    }

    /// Inflate from `input` into the spare capacity of `out` (which the
    /// caller reserves) until the stream ends, the input is used up, `out`
    /// is full or, when `block` is set, a block ends. Damage is an error
    /// with zlib's message.
    pub fn inflate(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        block: bool,
    ) -> Result<Step, &'static str> {
        let spare = out.spare_capacity_mut();
        let avail_out = spare.len().min(u32::MAX as usize) as u32;
        let avail_in = input.len().min(u32::MAX as usize) as u32;
        self.strm.next_in = input.as_ptr();
        self.strm.avail_in = avail_in;
        self.strm.next_out = spare.as_mut_ptr().cast();
        self.strm.avail_out = avail_out;
        let flush = if block { z::Z_BLOCK } else { z::Z_NO_FLUSH };
        // SAFETY: next_in/avail_in and next_out/avail_out describe `input`
        // and `out`'s spare capacity, both borrowed for this call only.
        let rc = unsafe { z::inflate(&mut *self.strm, flush) };
        let consumed = (avail_in - self.strm.avail_in) as usize;
        let produced = (avail_out - self.strm.avail_out) as usize;
        self.strm.next_in = std::ptr::null();
        self.strm.next_out = std::ptr::null_mut();
        // SAFETY: inflate wrote exactly `produced` bytes at the start of the
        // spare capacity.
        unsafe { out.set_len(out.len() + produced) };
        match rc {
            z::Z_OK | z::Z_STREAM_END | z::Z_BUF_ERROR => {
                let dt = self.strm.data_type;
                Ok(Step {
                    consumed,
                    produced,
                    end: rc == z::Z_STREAM_END,
                    at_block_end: dt & 128 != 0 && dt & 64 == 0,
                    // Not `& 7` as zran.c does for zlib: zlib-rs counts up
                    // to 63 buffered bits there (64 is the last-block flag),
                    // and a count of 12 read as 4 put a block boundary a
                    // byte off (a fixed-code stream failed to decode).
                    unused_bits: (dt & 63) as u32,
                })
            }
            _ => Err(self.message()),
        }
    }

    fn message(&self) -> &'static str {
        if self.strm.msg.is_null() {
            return "invalid deflate data";
        }
        // SAFETY: zlib-rs sets `msg` to one of its static, NUL-terminated
        // messages.
        let msg = unsafe { std::ffi::CStr::from_ptr(self.strm.msg) };
        match msg.to_str() {
            Ok(s) => zlib_message(s),
            Err(_) => "invalid deflate data",
        }
    }
}

/// zlib's messages as `'static` strings of ours (its pointer is only valid
/// while the stream lives).
fn zlib_message(s: &str) -> &'static str {
    const KNOWN: [&str; 12] = [
        "invalid block type",
        "invalid stored block lengths",
        "too many length or distance symbols",
        "invalid code lengths set",
        "invalid bit length repeat",
        "invalid literal/lengths set",
        "invalid distances set",
        "invalid literal/length code",
        "invalid distance code",
        "invalid distance too far back",
        "missing end-of-block code",
        "incorrect header check",
    ];
    KNOWN
        .into_iter()
        .find(|k| *k == s)
        .unwrap_or("invalid deflate data")
}

impl Drop for ZInflate {
    fn drop(&mut self) {
        // SAFETY: the stream was initialised by `new` and is ended once.
        unsafe {
            z::inflateEnd(&mut *self.strm);
        }
    }
}
