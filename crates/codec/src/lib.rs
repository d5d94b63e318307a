//! # cairn-codec
//!
//! Block codecs and the standard stream formats, as pure functions over
//! buffers. This crate imports nothing of cairn; the pipeline and the CLI
//! run its pieces on many threads.
//!
//! ## Design decisions
//!
//! - **Libraries, not hand-written codecs.** Every codec is the reference
//!   library or the fastest well-kept one: libdeflate for DEFLATE (whole
//!   buffers, which is what parallel blocks are; about twice zlib's speed at
//!   equal size), zlib-rs for streaming inflate of foreign gzip, libzstd,
//!   liblz4, snap, `lzo1x` (a Rust port of liblzo2, whose C build needs
//!   cmake), libbz2 (Rust port), liblzma. What is written
//!   here is only the framing each format needs to be produced in pieces and
//!   cut again: BGZF-style member sizes, the zstd seek table, LZ4 frame and
//!   lzop block framing, snappy chunking, bzip2 block scanning and xz blocks
//!   and index. No library exposes those as parallel building blocks.
//!   Foreign one-member gzip is decoded on every core by [`inflate`]:
//!   libdeflate does the bulk, but the first stage (decoding a chunk from a
//!   guessed block without its window) is written here, since no library
//!   can start there.
//!   The one exception is bzip2 ([`bz2`]), encoder and decoder both:
//!   with libbzip2, cairn packed and unpacked .bz2 at 0.61-0.80x of
//!   lbzip2 on the same cores, no maintained crate does better, and the
//!   time went to its block sorter and inverse BWT (figures in [`bz2`]). The
//!   format's stages are written here around libsais, the fastest suffix
//!   sorter, with libbzip2 kept as the reference the tests compare with.
//! - **Reusable contexts.** A [`BlockCodec`] or [`BlockEncoder`] owns its
//!   state and writes into caller-owned `Vec`s, so a worker that keeps them
//!   allocates nothing per block in the steady state.
//! - **Splittable output, sequential fallback.** Everything cairn writes
//!   can be cut into independent units without decoding; a foreign gzip
//!   member read from a file is decoded in parallel from guessed block
//!   starts, every guess checked by stitching and by the member's CRC;
//!   anything else that cannot be cut (a gzip member from a pipe, a zstd
//!   frame without a size) is decoded in the splitter.
//! - **Errors carry the format and the stream offset**, and a declared size
//!   is checked against [`format::MAX_UNIT`] before anything is allocated.

pub mod block;
mod buf;
pub mod bz2;
pub mod error;
pub mod format;
pub mod inflate;
pub mod input;
pub mod lz4_ffi;
pub mod memlimit;
pub mod probe;
#[cfg(test)]
mod testutil;

pub use block::{BlockCodec, CodecKind, CodecSpec};
pub use error::{CodecError, Result};
pub use format::{
    decode_all, encode_all, encode_all_with, BlockEncoder, BlockMeta, ContentCheck, ContentChecker,
    DecodeOptions, EncodeOptions, Format, Framer, IntegrityCheck, Origin, Splitter, Unit,
    UnitDecoder, UnitKind,
};
pub use inflate::index::{GzipIndex, IndexError as GzipIndexError};
pub use input::Input;
pub use probe::Probe;
