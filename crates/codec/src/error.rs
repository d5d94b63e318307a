//! Errors of the codec layer: every one names the format or codec and, for
//! decoding, the byte offset in the compressed stream where the problem sits.

use std::io;

/// What went wrong while compressing, framing or decoding.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The compressed data is damaged or not what the format allows.
    #[error("{format}: corrupt data at offset {offset}: {reason}")]
    Corrupt {
        /// Format or codec name (`gzip`, `zstd`, ...).
        format: &'static str,
        /// Byte offset in the compressed stream.
        offset: u64,
        /// What exactly is wrong.
        reason: String,
    },
    /// A zstd frame packed with a dictionary not given (`-D`), or with
    /// another one than given.
    #[error("zstd: the frame at offset {offset} was packed with dictionary {id}; {given}")]
    Dictionary {
        /// Where the frame starts.
        offset: u64,
        /// The ID the frame names.
        id: u32,
        /// What was given instead.
        given: &'static str,
    },
    /// The stream ends in the middle of a header, block or trailer.
    #[error("{format}: unexpected end of input at offset {offset} (truncated file?)")]
    Truncated {
        /// Format name.
        format: &'static str,
        /// Offset where more bytes were expected.
        offset: u64,
    },
    /// A header declares a size beyond what cairn accepts.
    #[error(
        "{format}: {what} at offset {offset} declares {size} bytes, over the limit of {limit}"
    )]
    TooLarge {
        /// Format name.
        format: &'static str,
        /// What declared the size.
        what: &'static str,
        /// Offset of the declaring header.
        offset: u64,
        /// Declared size.
        size: u64,
        /// Largest accepted size.
        limit: u64,
    },
    /// Bytes after the last complete stream that do not start a new one.
    #[error("{format}: trailing garbage at offset {offset} after the end of the stream")]
    TrailingGarbage {
        /// Format name.
        format: &'static str,
        /// Offset of the first unexpected byte.
        offset: u64,
    },
    /// The input does not start with the magic of any known format.
    #[error("unknown format: the input does not start with the magic of gzip, zstd, lz4, lzop, bzip2, xz or snappy, nor a .lzma header")]
    UnknownFormat,
    /// A codec library refused to compress.
    #[error("{codec}: compression failed: {reason}")]
    Compress {
        /// Codec name.
        codec: &'static str,
        /// Library message.
        reason: String,
    },
    /// An invalid parameter (level, block size, ...).
    #[error("{0}")]
    Invalid(String),
    /// Reading the compressed stream failed.
    #[error("read error at offset {offset}: {source}")]
    Io {
        /// Offset of the failed read.
        offset: u64,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

impl CodecError {
    /// A `Corrupt` error.
    pub fn corrupt(format: &'static str, offset: u64, reason: impl Into<String>) -> Self {
        CodecError::Corrupt {
            format,
            offset,
            reason: reason.into(),
        }
    }
}

/// Result alias of the codec layer.
pub type Result<T, E = CodecError> = std::result::Result<T, E>;
