//! The cache device at a path, as servers and tools use it: held under an
//! exclusive lock for as long as the cache is open (two processes
//! replaying and appending to one log would destroy it), formatted on
//! first use when it is blank (a new file, or a wiped device), read
//! without writing for a status, and detached (drained, then its
//! superblock wiped, so the backing device stands alone).

use crate::format::{self, WATERMARK_OFFSETS};
use crate::{FormatOptions, Inspection, Place, Result, WbCache, WbConfig, WbError, WbStatus};
use cairn_blockdev::{flock, BlockDev, BlockError, FileDev, FileOptions, Op};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// An exclusive, non-blocking `flock` on the cache device's file, held
/// while the value lives.
#[derive(Debug)]
pub(crate) struct PathLock {
    _file: File,
}

impl PathLock {
    fn take(path: &Path) -> Result<PathLock> {
        let file = File::open(path).map_err(|e| WbError::Open {
            path: path.to_path_buf(),
            source: BlockError::io(Op::Open, 0, 0, e),
        })?;
        // Held while `file` stays open; closing it releases the lock.
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(true) => Ok(PathLock { _file: file }),
            Ok(false) => Err(WbError::InUse(path.to_path_buf())),
            Err(e) => Err(WbError::Open {
                path: path.to_path_buf(),
                source: BlockError::io(Op::Open, 0, 0, e),
            }),
        }
    }
}

/// Open the cache device at `path` (locked) as a file device, read-only
/// when `read_only`.
fn open_dev(path: &Path, read_only: bool) -> Result<(FileDev, PathLock)> {
    let lock = PathLock::take(path)?;
    let opts = FileOptions {
        read_only,
        ..FileOptions::default()
    };
    let dev = FileDev::open(path, opts).map_err(|e| WbError::Open {
        path: path.to_path_buf(),
        source: e,
    })?;
    Ok((dev, lock))
}

/// Whether the device holds no cache: its superblock block is all zero
/// and neither watermark slot holds a watermark. A zeroed superblock in
/// front of a watermark is damage, not a blank device (it used to be
/// formatted over, and the flushed writes in its log lost); `detach`
/// wipes the watermarks with the superblock.
fn is_blank(dev: &dyn BlockDev) -> Result<bool> {
    let mut b = vec![0u8; (WIPED as usize).min(dev.size() as usize)];
    dev.read_at(&mut b, 0)
        .map_err(|e| WbError::io(Place::Superblock, e))?;
    if !b[..b.len().min(4096)].iter().all(|&x| x == 0) {
        return Ok(false);
    }
    let watermark = WATERMARK_OFFSETS
        .iter()
        .any(|&at| b.get(at as usize..).is_some_and(format::is_watermark));
    if watermark {
        return Err(WbError::BadSuperblock {
            reason: "the superblock is zeroed but a watermark follows it: the cache is damaged \
                     and its log is not formatted over (a cache detached by a cairn before \
                     2026-11-28 left its watermarks: zero its first 12 KiB to use it anew)",
        });
    }
    Ok(true)
}

/// Bytes `detach` zeroes: the superblock and both watermark slots.
const WIPED: u64 = WATERMARK_OFFSETS[1] + 4096;

impl WbCache {
    /// The cache id of the cache device at `path` (None: blank), read
    /// from its superblock: nothing written, no lock taken (the superblock
    /// is written once, by `format`).
    pub fn id_at(path: &Path) -> Result<Option<[u8; 16]>> {
        let opts = FileOptions {
            read_only: true,
            ..FileOptions::default()
        };
        let dev = FileDev::open(path, opts).map_err(|e| WbError::Open {
            path: path.to_path_buf(),
            source: e,
        })?;
        if is_blank(&dev)? {
            return Ok(None);
        }
        let mut b = vec![0u8; format::BLOCK_SIZE as usize];
        dev.read_at(&mut b, 0)
            .map_err(|e| WbError::io(Place::Superblock, e))?;
        Ok(Some(format::Superblock::decode(&b)?.cache_id))
    }

    /// Open the cache device at `path` in front of `backing`, holding an
    /// exclusive lock on it until the cache is closed or dropped. A blank
    /// device is formatted when `format_blank`, refused otherwise
    /// ([`WbError::Blank`]); another process holding it is
    /// [`WbError::InUse`].
    pub fn open_path(
        path: &Path,
        backing: Arc<dyn BlockDev>,
        cfg: WbConfig,
        format_blank: bool,
    ) -> Result<WbCache> {
        let (dev, lock) = open_dev(path, false)?;
        let id = dev.identity();
        if id.is_some() && id == backing.identity() {
            return Err(WbError::CacheIsBacking(path.to_path_buf()));
        }
        if is_blank(&dev)? {
            if !format_blank {
                return Err(WbError::Blank(path.to_path_buf()));
            }
            WbCache::format(&dev, backing.size(), &FormatOptions::default())?;
        }
        let mut wb = WbCache::open(Arc::new(dev), backing, cfg)?;
        wb.lock = Some(lock);
        Ok(wb)
    }

    /// What the cache device at `path` holds, read through a read-only
    /// descriptor under its lock ([`WbCache::inspect`]); a blank device is
    /// [`WbError::Blank`].
    pub fn inspect_path(path: &Path, backing_size: u64) -> Result<Inspection> {
        let (dev, _lock) = open_dev(path, true)?;
        if is_blank(&dev)? {
            return Err(WbError::Blank(path.to_path_buf()));
        }
        WbCache::inspect(&dev, backing_size)
    }

    /// Write everything back, stop, and wipe the cache device's
    /// superblock (with FUA), so that the backing device stands alone and
    /// the cache device is blank. Returns the status after the drain.
    pub fn detach(mut self) -> Result<WbStatus> {
        self.drain()?;
        let status = self.status();
        let r = self.inner.flush_seal();
        self.shutdown();
        r?;
        self.inner
            .cache
            .write_at(&[0u8; WIPED as usize], 0, true)
            .map_err(|e| WbError::io(Place::Superblock, e))?;
        Ok(status)
    }
}
