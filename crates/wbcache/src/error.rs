//! Errors of the write-back cache, with the segment, slot or offset they
//! concern, and their mapping to [`BlockError`] at the `BlockDev` edge.

use cairn_blockdev::{BlockError, ErrorKind, Op};
use std::fmt;
use std::io;
use std::sync::Arc;

/// Where an I/O error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The superblock of the cache device.
    Superblock,
    /// A watermark slot (0 = A, 1 = B) with the sequence number written.
    Watermark {
        /// Slot index.
        slot: usize,
        /// Sequence number being written (0 when reading).
        seq: u64,
    },
    /// A flush mark slot (0 = A, 1 = B) with the sequence number written.
    FlushMark {
        /// Slot index.
        slot: usize,
        /// Sequence number being written (0 when reading).
        seq: u64,
    },
    /// The owner block (format version 4).
    Owner,
    /// A segment on the cache device.
    Segment {
        /// Segment id.
        id: u64,
        /// Slot in the ring.
        slot: u64,
    },
    /// A record of the persistent log on the cache device.
    Plog {
        /// The id of the open segment the record belongs to.
        segment: u64,
        /// Its sequence number within that segment id (0 when reading).
        seq: u64,
    },
    /// Flushing the cache device.
    CacheFlush,
    /// The backing device at this byte offset.
    Backing {
        /// Byte offset.
        offset: u64,
    },
    /// Flushing the backing device.
    BackingFlush,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Superblock => f.write_str("cache superblock"),
            Place::Watermark { slot, seq } => {
                write!(
                    f,
                    "watermark slot {} (sequence {seq})",
                    ["A", "B"][*slot & 1]
                )
            }
            Place::FlushMark { slot, seq } => {
                write!(
                    f,
                    "flush mark slot {} (sequence {seq})",
                    ["A", "B"][*slot & 1]
                )
            }
            Place::Owner => f.write_str("owner block"),
            Place::Segment { id, slot } => write!(f, "segment {id} (slot {slot})"),
            Place::Plog { segment, seq } => {
                write!(f, "persistent log record {seq} of segment {segment}")
            }
            Place::CacheFlush => f.write_str("cache device flush"),
            Place::Backing { offset } => write!(f, "backing device at offset {offset}"),
            Place::BackingFlush => f.write_str("backing device flush"),
        }
    }
}

/// What went wrong in the write-back cache.
#[derive(Debug, thiserror::Error)]
pub enum WbError {
    /// A device operation failed.
    #[error("{place}: {source}")]
    Io {
        /// Where.
        place: Place,
        /// The device's error.
        #[source]
        source: BlockError,
    },
    /// The superblock is not a valid cairn write-back cache superblock.
    #[error("bad cache superblock: {reason}")]
    BadSuperblock {
        /// Why it was refused.
        reason: &'static str,
    },
    /// The cache was formatted by a newer version of the format.
    #[error("cache format version {found} is newer than the supported version {supported}")]
    UnsupportedVersion {
        /// Version on disk.
        found: u32,
        /// Newest version this crate reads.
        supported: u32,
    },
    /// The backing device is not the one the cache was formatted for.
    #[error("backing device is {actual} bytes but the cache was formatted for {formatted}")]
    BackingSizeMismatch {
        /// Size recorded in the superblock.
        formatted: u64,
        /// Size of the device given.
        actual: u64,
    },
    /// The cache device cannot hold the ring.
    #[error("cache device of {size} bytes is too small: {needed} bytes needed")]
    CacheTooSmall {
        /// Its size.
        size: u64,
        /// The least size that works.
        needed: u64,
    },
    /// An earlier failure of a background thread; the cache stopped
    /// writing (acknowledged data is still in RAM or in the log).
    #[error("write-back cache failed earlier: {0}")]
    Failed(Arc<WbError>),
    /// The log is damaged: writes that were flushed cannot be read back.
    #[error(
        "damaged write-back cache: {damage}{}; refusing to start (accepting the loss opens \
         it without what is lost: `cairn serve --cache-accept-loss`, `cairn cache drain \
         --accept-loss`)",
        if *more > 0 { format!(" (and {more} more)") } else { String::new() }
    )]
    Damaged {
        /// The first damage found.
        damage: crate::recovery::Damage,
        /// How many more were found.
        more: usize,
    },
    /// The cache is shutting down.
    #[error("write-back cache is closed")]
    Closed,
    /// The cache device at this path could not be opened.
    #[error("cannot open the cache {path}: {source}")]
    Open {
        /// The cache device's path.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: BlockError,
    },
    /// Another process holds the cache device (two processes replaying and
    /// appending to one log would destroy it).
    #[error("the cache {0} is in use by another process")]
    InUse(std::path::PathBuf),
    /// The cache device is the backing device itself (the same file or
    /// disk): formatting it would overwrite the data it caches.
    #[error("{0} is the backing device itself; a cache needs a device of its own")]
    CacheIsBacking(std::path::PathBuf),
    /// The cache holds writes not yet written back to another backing
    /// device or image than the one it is opened in front of.
    #[error(
        "the cache holds writes not yet written back to {owner}; it is not in front of {given}: \
         drain it in front of {owner} first"
    )]
    OtherOwner {
        /// What the cache was in front of.
        owner: String,
        /// What it was opened in front of now.
        given: String,
    },
    /// The cache device holds no cache (its first block is all zero), and
    /// formatting it was not asked for.
    #[error("{0} is not a cairn cache (blank)")]
    Blank(std::path::PathBuf),
}

/// Result of the cache's own operations.
pub type Result<T> = std::result::Result<T, WbError>;

impl WbError {
    pub(crate) fn io(place: Place, source: BlockError) -> WbError {
        WbError::Io { place, source }
    }

    /// The [`ErrorKind`] a block layer user sees for this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            WbError::Io { place, source } => match &source.kind {
                ErrorKind::OutOfRange => ErrorKind::OutOfRange,
                ErrorKind::ReadOnly => ErrorKind::ReadOnly,
                ErrorKind::Unsupported => ErrorKind::Unsupported,
                ErrorKind::NoSpace => ErrorKind::NoSpace,
                ErrorKind::Corrupt(s) => ErrorKind::Corrupt(format!("{place}: {s}")),
                ErrorKind::Io(e) => ErrorKind::Io(match e.raw_os_error() {
                    Some(n) => io::Error::from_raw_os_error(n),
                    None => io::Error::new(e.kind(), format!("{place}: {e}")),
                }),
            },
            WbError::Failed(inner) => inner.kind(),
            WbError::Closed => ErrorKind::Io(io::Error::from_raw_os_error(libc_eio())),
            other => ErrorKind::Corrupt(other.to_string()),
        }
    }

    /// This error as a [`BlockError`] of `op` on `offset..offset + len`.
    pub fn to_block(&self, op: Op, offset: u64, len: u64) -> BlockError {
        BlockError::new(op, offset, len, self.kind())
    }
}

/// EIO without depending on libc.
fn libc_eio() -> i32 {
    5
}
