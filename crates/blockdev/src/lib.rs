//! # cairn-blockdev
//!
//! The block layer: [`BlockDev`], what every device in cairn is (a file, a
//! disk, memory, a repository image, a write-back cache in front of any of
//! them), and the plain devices.
//!
//! ## Design decisions
//!
//! - **One small trait, positional and shared.** Every operation takes an
//!   offset and `&self`: a device is shared by many connections and many
//!   threads at once (`Arc<dyn BlockDev>`), with no seek position to race
//!   on. Implementations do their own locking where they need any.
//! - **Capabilities are asked, never assumed** (nbdkit's `can_*`):
//!   [`Caps`] says which operations are real. An operation a device cannot
//!   do returns [`ErrorKind::Unsupported`]; a layer above (the NBD server)
//!   advertises only what the layer below has.
//! - **Errors carry the operation, offset and length**, and a kind that a
//!   protocol edge maps to its own codes (errno for NBD) in one place.
//! - **Allocation is part of the device** ([`BlockDev::extents`]): holes
//!   and zero ranges are reported so a client can skip them (NBD
//!   `base:allocation`); a device that does not know says "all data".
//!
//! - **Files and block devices by `pread`/`pwrite`** ([`FileDev`]): the
//!   concurrency is the caller's threads — the NBD server's worker threads
//!   call `read_at`/`write_at` at once on one shared device, each a
//!   positional syscall with no lock. `O_DIRECT` is an option
//!   ([`FileOptions::direct`]); unaligned requests then go through aligned
//!   bounce buffers, with a read-modify-write of partly written blocks
//!   under a striped lock. FUA is `pwritev2(RWF_DSYNC)`, flush is
//!   `fdatasync`, trim and zeroing are `fallocate` (files) or
//!   `BLKDISCARD`/`BLKZEROOUT` (block devices), holes come from
//!   `SEEK_DATA`/`SEEK_HOLE`.
//! - **io_uring where a thread would wait** ([`ReadAhead`]): a sequential
//!   `O_DIRECT` reader (backup `--direct` from a file or device) keeps a
//!   queue of reads in flight so the disk streams while the one reader
//!   thread cuts chunks; without it each read waited for the disk (see
//!   docs/benchmarks.md, "Cold streaming reads and writes"). Positional
//!   I/O from many threads (the NBD server, restore's workers) stays
//!   `pread`/`pwrite`: their concurrency is already the queue.
//! - **Faults are a device too** ([`FaultDev`]): a decorator that fails,
//!   tears, delays or kills operations by plan, and can make any device as
//!   slow as a spinning disk ([`RotationalModel`]) so that layers above
//!   (write-back cache, striping) can be tested and benchmarked against
//!   seek costs without one.
//! - [`MemDev`] holds a device in RAM, for tests and scratch exports.
//! - **Streams know their holes too** ([`SparseRead`]): the sequential
//!   readers of backup and pack read a regular file by its data extents
//!   ([`SparseFile`], on [`next_data`]/[`next_hole`]) and pass over
//!   holes without reading them; any other `Read` simply has none.
//!
//! - **Pipes are grown to a megabyte** ([`grow_pipe`]) where cairn reads
//!   or writes a stream through one, and **handed frozen buffers by
//!   reference** ([`splice_all`], `vmsplice`) where cairn streams a restore
//!   into one: written once into a mapping of their own on huge pages,
//!   then read-only for good ([`SpliceBuf`], [`SpliceBytes`]).
//!
//! Written by hand: the crates that wrap block devices (e.g. for NBD
//! servers) each bring their own server or runtime; this trait is the
//! seam between cairn's own layers and needs nothing but `std`, libc and
//! rustix (for a safe `lseek(SEEK_DATA)`).

mod direct;
mod error;
mod fault;
mod file;
mod mem;
mod pipe;
mod readahead;
mod sparse;
mod splice;

pub use direct::{open_input, reopen_direct, write_blocks_at, DirectReader, Input, DIRECT_ALIGN};
pub use error::{BlockError, ErrorKind, Op, Result};
pub use fault::{
    FaultDev, FaultPlan, OpCounts, RotationalLatency, RotationalModel, RotationalStats, Tear, When,
};
pub use file::{
    allocate, device_size, flock, next_data, next_hole, read_at_random, AlignedBuf, FileDev,
    FileOptions,
};
pub use mem::MemDev;
pub use pipe::{grow_pipe, PIPE_BYTES};
pub use readahead::{Engine, ReadAhead};
pub use sparse::{is_zero, SparseFile, SparseRead};
pub use splice::{splice_all, splice_pays, SpliceBuf, SpliceBytes, Spliced};

/// Which operations of a [`BlockDev`] are real.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caps {
    /// Writes, trims and zeroing are allowed.
    pub writable: bool,
    /// `flush` makes earlier completed writes durable (false: flush is a
    /// no-op because nothing is ever cached, or the device is read-only).
    pub flush: bool,
    /// `write_at(.., fua = true)` is durable on return by itself.
    pub fua: bool,
    /// `trim` releases space (false: trim is accepted and does nothing).
    pub trim: bool,
    /// `write_zeroes` is cheaper than writing a buffer of zeroes.
    pub zeroes: bool,
    /// `write_zeroes` with [`ZeroFlags::fast`] can succeed (it fails fast
    /// with [`ErrorKind::Unsupported`] when zeroing would be slow).
    pub fast_zero: bool,
    /// `extents` reports real holes and zero ranges.
    pub extents: bool,
    /// Several connections may use the device at once and see each
    /// other's completed writes, and a flush on one covers writes
    /// completed on all of them (NBD multi-conn).
    pub multi_conn: bool,
    /// Seeks are expensive (a spinning disk or a model of one).
    pub rotational: bool,
}

/// Sizes the device prefers, in bytes (NBD_INFO_BLOCK_SIZE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Smallest unit of I/O that works at all (a power of two, 1..=64 KiB).
    pub minimum: u32,
    /// Unit below which I/O costs a read-modify-write.
    pub preferred: u32,
    /// Largest request worth sending at once.
    pub maximum: u32,
}

impl Default for BlockSizes {
    fn default() -> Self {
        BlockSizes {
            minimum: 1,
            preferred: 4096,
            maximum: 32 << 20,
        }
    }
}

/// How `write_zeroes` may do its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ZeroFlags {
    /// Durable on return.
    pub fua: bool,
    /// The range may be deallocated (punched) instead of written.
    pub may_trim: bool,
    /// Fail with [`ErrorKind::Unsupported`] unless zeroing is fast (no
    /// data written), so the caller can choose another way.
    pub fast: bool,
}

/// A run of bytes with the same allocation state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Length in bytes.
    pub len: u64,
    /// No storage is allocated for the range.
    pub hole: bool,
    /// The range reads as zeroes.
    pub zero: bool,
}

impl Extent {
    /// Allocated data.
    pub fn data(len: u64) -> Extent {
        Extent {
            len,
            hole: false,
            zero: false,
        }
    }

    /// A hole that reads as zeroes.
    pub fn hole(len: u64) -> Extent {
        Extent {
            len,
            hole: true,
            zero: true,
        }
    }

    /// Append `self` to `out`, merged into the last extent if that has the
    /// same state; an empty extent is dropped.
    pub fn push_to(self, out: &mut Vec<Extent>) {
        if self.len == 0 {
            return;
        }
        match out.last_mut() {
            Some(l) if l.hole == self.hole && l.zero == self.zero => l.len += self.len,
            _ => out.push(self),
        }
    }
}

/// A block device: a fixed-size array of bytes read and written at
/// offsets, shared between threads.
pub trait BlockDev: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;

    /// What is real.
    fn caps(&self) -> Caps;

    /// Preferred I/O sizes.
    fn block_sizes(&self) -> BlockSizes {
        BlockSizes::default()
    }

    /// Fill `buf` from `offset`. The range must lie inside the device.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;

    /// Write `buf` at `offset`; with `fua`, durable on return.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()>;

    /// Make every completed write durable.
    fn flush(&self) -> Result<()>;

    /// The range's contents are no longer needed; it may read back as
    /// anything until written again.
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<()>;

    /// Make the range read as zeroes.
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()>;

    /// The allocation of `offset..offset + len`, in order, covering at
    /// least the first byte (a device may stop early and report less).
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range(self.size(), Op::Extents, offset, len)?;
        Ok(vec![Extent::data(len)])
    }

    /// What this device stores its bytes in, when that is one file or
    /// block device ([`FileIdentity`]): a layer that puts a second device
    /// in front (a cache) refuses one that is this very file.
    fn identity(&self) -> Option<FileIdentity> {
        None
    }
}

/// Which file or block device an open descriptor is: a regular file by
/// its filesystem and inode, a block device by its device number (two
/// nodes, or a symlink, for one disk are the same device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileIdentity {
    /// A regular file: `st_dev`, `st_ino`.
    File(u64, u64),
    /// A block device: `st_rdev`.
    Device(u64),
}

impl FileIdentity {
    /// The identity of what `meta` describes (other kinds have none).
    pub fn of(meta: &std::fs::Metadata) -> Option<FileIdentity> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let kind = meta.file_type();
        if kind.is_file() {
            Some(FileIdentity::File(meta.dev(), meta.ino()))
        } else if kind.is_block_device() {
            Some(FileIdentity::Device(meta.rdev()))
        } else {
            None
        }
    }
}

/// Whether `offset..offset + len` lies inside a device of `size` bytes.
pub fn check_range(size: u64, op: Op, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BlockError::new(op, offset, len, ErrorKind::OutOfRange)),
    }
}

/// The error for writing to a device that is not writable.
pub fn read_only(op: Op, offset: u64, len: u64) -> BlockError {
    BlockError::new(op, offset, len, ErrorKind::ReadOnly)
}

/// Write zeroes through `write_at`, a buffer at a time: the fallback for
/// devices without a cheaper way.
pub fn write_zeroes_by_writing(
    dev: &(impl BlockDev + ?Sized),
    offset: u64,
    len: u64,
    fua: bool,
) -> Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeroes = vec![0u8; CHUNK.min(len) as usize];
    let mut at = offset;
    let end = offset + len;
    while at < end {
        let n = CHUNK.min(end - at);
        dev.write_at(&zeroes[..n as usize], at, fua && at + n == end)?;
        at += n;
    }
    Ok(())
}
