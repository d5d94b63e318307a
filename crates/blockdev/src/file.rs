//! Files and block devices through the kernel: `pread`/`pwrite`, optional
//! `O_DIRECT` with aligned bounce buffers, hole punching and zeroing by
//! `fallocate`, discard and zero-out by ioctl, holes by `SEEK_DATA`.
//!
//! Every request is positional and takes `&self`: many threads may call
//! one [`FileDev`] at once (the NBD server's worker threads do). The only
//! lock is the striped one that direct mode needs around read-modify-write
//! of partly written blocks.

use crate::{
    check_range, read_only, write_zeroes_by_writing, BlockDev, BlockError, BlockSizes, Caps,
    ErrorKind, Extent, Op, Result, ZeroFlags,
};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// How to open a [`FileDev`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileOptions {
    /// Open for reading only: every write, trim and zeroing is refused
    /// with [`ErrorKind::ReadOnly`].
    pub read_only: bool,
    /// Bypass the page cache (`O_DIRECT`). Requests need not be aligned:
    /// unaligned ones go through aligned bounce buffers, with a
    /// read-modify-write of partly written blocks.
    pub direct: bool,
    /// Hold a `flock` on the file while the device lives, as qemu-nbd
    /// locks its images: exclusive when writable, shared when read-only,
    /// so a file cannot be written by two exports, nor written while
    /// another reads it, nor exported while it is a write-back cache in
    /// use. Taken at once or refused ([`std::io::ErrorKind::WouldBlock`]).
    pub lock: bool,
}

/// What the path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Regular,
    Block,
}

/// Number of read-modify-write lock stripes (direct mode).
const STRIPES: usize = 64;
/// Largest bounce buffer used for one direct request piece.
const BOUNCE_MAX: u64 = 1 << 20;

/// A regular file or a block device as a [`BlockDev`].
#[derive(Debug)]
pub struct FileDev {
    file: File,
    /// Direct mode on a regular file whose size is not a multiple of the
    /// alignment: a second, buffered descriptor for the bytes past the last
    /// aligned boundary (`O_DIRECT` cannot write a partial last block
    /// without growing the file). Those bytes are only ever accessed
    /// through this descriptor, so the two never overlap.
    tail: Option<File>,
    path: PathBuf,
    kind: Kind,
    size: u64,
    read_only: bool,
    direct: bool,
    /// Alignment of direct I/O (1 when buffered).
    align: u64,
    /// Logical block size of a block device (discard and zero-out need
    /// it), 1 for a regular file.
    lbs: u64,
    /// First byte served by `tail` (`size` when there is no tail).
    direct_end: u64,
    rotational: bool,
    /// Trim releases space (cleared on the first EOPNOTSUPP).
    trim_ok: AtomicBool,
    /// `FALLOC_FL_ZERO_RANGE` works (cleared on the first EOPNOTSUPP).
    zero_range_ok: AtomicBool,
    /// `pwritev2(RWF_DSYNC)` works (cleared on ENOSYS/EOPNOTSUPP).
    dsync_ok: AtomicBool,
    /// Direct mode: read-modify-write of a block takes its stripe for
    /// writing; every other change to a block takes it for reading.
    stripes: Box<[RwLock<()>]>,
}

/// Linux `_IOC` encoding: the generic layout, and the one of the
/// architectures with 13 size bits and 3 direction bits.
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
mod ioc {
    pub const NONE: u64 = 1;
    pub const READ: u64 = 2;
    pub const DIRSHIFT: u64 = 29;
}
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
mod ioc {
    pub const NONE: u64 = 0;
    pub const READ: u64 = 2;
    pub const DIRSHIFT: u64 = 30;
}

const fn ioc(dir: u64, ty: u64, nr: u64, size: u64) -> u64 {
    (dir << ioc::DIRSHIFT) | (size << 16) | (ty << 8) | nr
}

/// `BLKSSZGET`: logical sector size (int).
const BLKSSZGET: u64 = ioc(ioc::NONE, 0x12, 104, 0);
/// `BLKGETSIZE64`: size in bytes (u64).
const BLKGETSIZE64: u64 = ioc(ioc::READ, 0x12, 114, std::mem::size_of::<usize>() as u64);
/// `BLKDISCARD`: discard `[start, len]`.
const BLKDISCARD: u64 = ioc(ioc::NONE, 0x12, 119, 0);
/// `BLKZEROOUT`: zero `[start, len]`.
const BLKZEROOUT: u64 = ioc(ioc::NONE, 0x12, 127, 0);

fn off_t(op: Op, offset: u64, len: u64, v: u64) -> Result<libc::off_t> {
    libc::off_t::try_from(v).map_err(|_| BlockError::new(op, offset, len, ErrorKind::OutOfRange))
}

/// An io::Error that names the path.
fn path_error(path: &Path, e: io::Error) -> BlockError {
    let e = BlockError::io(Op::Open, 0, 0, e);
    match e.kind {
        ErrorKind::Io(io) => BlockError::new(
            Op::Open,
            0,
            0,
            ErrorKind::Io(io::Error::new(
                io.kind(),
                format!("{}: {io}", path.display()),
            )),
        ),
        _ => e,
    }
}

fn round_down(v: u64, a: u64) -> u64 {
    v - v % a
}

fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// A zeroed buffer of `len` bytes whose start is aligned to `align`
/// (carved out of a slightly larger `Vec`, so no unsafe allocation): what
/// `O_DIRECT` reads and writes need.
#[derive(Debug, Default)]
pub struct AlignedBuf {
    vec: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes starting at a multiple of `align` (a power of two).
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        let vec = vec![0u8; len + align];
        let addr = vec.as_ptr() as usize;
        let start = (align - addr % align) % align;
        AlignedBuf { vec, start, len }
    }

    /// How many aligned bytes it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The aligned bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.vec[self.start..self.start + self.len]
    }

    /// The aligned bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.vec[self.start..self.start + self.len]
    }
}

/// A held stripe lock (held only to be dropped).
#[allow(dead_code, reason = "the guards are held for their Drop")]
enum StripeGuard<'a> {
    Read(RwLockReadGuard<'a, ()>),
    Write(RwLockWriteGuard<'a, ()>),
}

/// Read a sysfs attribute of the disk holding device number `dev`
/// (a partition's attributes are its disk's).
fn sysfs_queue_attr(dev: u64, attr: &str) -> Option<String> {
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    if maj == 0 {
        return None;
    }
    let base = format!("/sys/dev/block/{maj}:{min}");
    let own = format!("{base}/queue/{attr}");
    let parent = format!("{base}/../queue/{attr}");
    std::fs::read_to_string(own)
        .or_else(|_| std::fs::read_to_string(parent))
        .ok()
        .map(|s| s.trim().to_string())
}

impl FileDev {
    /// Open a regular file or a block device. Directories, character
    /// devices, FIFOs and sockets are refused (with [`ErrorKind::Io`]
    /// naming the path) without being opened.
    pub fn open(path: &Path, opts: FileOptions) -> Result<FileDev> {
        // Look before opening: opening a FIFO would block.
        let meta = std::fs::metadata(path).map_err(|e| path_error(path, e))?;
        Self::check_type(path, &meta.file_type())?;

        let mut oo = OpenOptions::new();
        oo.read(true).write(!opts.read_only);
        if opts.direct {
            oo.custom_flags(libc::O_DIRECT);
        }
        let file = oo.open(path).map_err(|e| path_error(path, e))?;
        if opts.lock {
            let mode = if opts.read_only {
                libc::LOCK_SH
            } else {
                libc::LOCK_EX
            };
            if !flock(&file, mode | libc::LOCK_NB).map_err(|e| path_error(path, e))? {
                let busy = std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "in use by another process or export (writable, or a write-back cache)",
                );
                return Err(path_error(path, busy));
            }
        }
        // And look again at what was opened.
        let meta = file.metadata().map_err(|e| path_error(path, e))?;
        let kind = Self::check_type(path, &meta.file_type())?;

        let (size, lbs, sysdev) = match kind {
            Kind::Regular => (meta.len(), 1, meta.dev()),
            Kind::Block => {
                let size = device_size(&file).map_err(|e| path_error(path, e))?;
                let lbs = Self::blk_sector_size(&file).map_err(|e| path_error(path, e))?;
                (size, lbs, meta.rdev())
            }
        };
        let align = match (opts.direct, kind) {
            (false, _) => 1,
            (true, Kind::Regular) => 4096,
            (true, Kind::Block) => lbs,
        };
        let direct_end = round_down(size, align);
        let tail = if opts.direct && direct_end != size {
            let mut oo = OpenOptions::new();
            oo.read(true).write(!opts.read_only);
            Some(oo.open(path).map_err(|e| path_error(path, e))?)
        } else {
            None
        };
        let rotational = sysfs_queue_attr(sysdev, "rotational").is_some_and(|s| s == "1");
        let writable = !opts.read_only;
        let trim_ok = writable
            && match kind {
                Kind::Regular => Self::probe_punch(&file, size),
                Kind::Block => {
                    sysfs_queue_attr(meta.rdev(), "discard_max_bytes").is_none_or(|s| s != "0")
                }
            };
        let zero_range_ok = kind == Kind::Regular && trim_ok;
        Ok(FileDev {
            file,
            tail,
            path: path.to_path_buf(),
            kind,
            size,
            read_only: opts.read_only,
            direct: opts.direct,
            align,
            lbs,
            direct_end,
            rotational,
            trim_ok: AtomicBool::new(trim_ok),
            zero_range_ok: AtomicBool::new(zero_range_ok),
            dsync_ok: AtomicBool::new(true),
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
        })
    }

    /// The path the device was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the device is a block device (not a regular file).
    pub fn is_block_device(&self) -> bool {
        self.kind == Kind::Block
    }

    /// Whether the device was opened with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn check_type(path: &Path, ft: &std::fs::FileType) -> Result<Kind> {
        let what = if ft.is_file() {
            return Ok(Kind::Regular);
        } else if ft.is_block_device() {
            return Ok(Kind::Block);
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "of an unknown type"
        };
        Err(BlockError::new(
            Op::Open,
            0,
            0,
            ErrorKind::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: is {what}, not a regular file or a block device",
                    path.display()
                ),
            )),
        ))
    }

    fn blk_sector_size(file: &File) -> io::Result<u64> {
        let mut ssz: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int through the pointer, which
        // points to a live, writable c_int; the fd is open for the call.
        let r = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                BLKSSZGET as _,
                &mut ssz as *mut libc::c_int,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        match u64::try_from(ssz) {
            Ok(s) if s.is_power_of_two() && s <= 65536 => Ok(s),
            _ => Err(io::Error::other(format!("odd logical block size {ssz}"))),
        }
    }

    /// Whether the filesystem can punch holes: punch one page at the end
    /// of the file with `KEEP_SIZE`, where there is no data to lose.
    fn probe_punch(file: &File, size: u64) -> bool {
        let at = round_up(size, 4096);
        let Ok(at) = libc::off_t::try_from(at) else {
            return true;
        };
        match Self::fallocate_raw(
            file,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            at,
            4096,
        ) {
            Ok(()) => true,
            Err(e) => !Self::is_unsupported(&e),
        }
    }

    fn fallocate_raw(
        file: &File,
        mode: libc::c_int,
        offset: libc::off_t,
        len: libc::off_t,
    ) -> io::Result<()> {
        loop {
            // SAFETY: fallocate takes only integers; the fd is open for the
            // call. It changes no memory of this process.
            let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) };
            if r == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn fallocate(&self, op: Op, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        let o = off_t(op, offset, len, offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let l =
            off_t(op, offset, len, len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        Self::fallocate_raw(&self.file, mode, o, l)
    }

    /// A range ioctl (`BLKDISCARD`, `BLKZEROOUT`) on a block device.
    fn blk_range_ioctl(&self, req: u64, offset: u64, len: u64) -> io::Result<()> {
        let range: [u64; 2] = [offset, len];
        loop {
            // SAFETY: BLKDISCARD and BLKZEROOUT read two u64 (start, length)
            // through the pointer, which points to a live [u64; 2]; the fd
            // is open for the call.
            let r = unsafe { libc::ioctl(self.file.as_raw_fd(), req as _, range.as_ptr()) };
            if r == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn check_write(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        if self.read_only {
            return Err(read_only(op, offset, len));
        }
        check_range(self.size, op, offset, len)
    }

    fn sync(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| BlockError::io(op, offset, len, e))
    }

    // ---- striped locks (direct mode) ----

    /// Lock the blocks of `offset..offset + len` against a concurrent
    /// read-modify-write: for writing (exclusive) if this request does a
    /// read-modify-write of its first or last block, else shared. Stripes
    /// are always taken in index order, so two requests cannot deadlock.
    fn lock_blocks(&self, offset: u64, len: u64, rmw: bool) -> Vec<StripeGuard<'_>> {
        if !self.direct || len == 0 || offset >= self.direct_end {
            return Vec::new();
        }
        let end = (offset + len).min(self.direct_end);
        let a = self.align;
        let first = offset / a;
        let last = (end - 1) / a;
        // 0: untouched, 1: shared, 2: exclusive.
        let mut mode = [0u8; STRIPES];
        if last - first + 1 >= STRIPES as u64 {
            mode = [1u8; STRIPES];
        } else {
            for b in first..=last {
                mode[(b % STRIPES as u64) as usize] = 1;
            }
        }
        if rmw {
            if offset % a != 0 {
                mode[(first % STRIPES as u64) as usize] = 2;
            }
            if end % a != 0 {
                mode[(last % STRIPES as u64) as usize] = 2;
            }
        }
        let mut guards = Vec::new();
        for (i, m) in mode.iter().enumerate() {
            let lock = &self.stripes[i];
            match m {
                1 => guards.push(StripeGuard::Read(
                    lock.read().unwrap_or_else(|p| p.into_inner()),
                )),
                2 => guards.push(StripeGuard::Write(
                    lock.write().unwrap_or_else(|p| p.into_inner()),
                )),
                _ => {}
            }
        }
        guards
    }

    // ---- reads ----

    fn pread_exact(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        file.read_exact_at(buf, offset)
    }

    /// `pread` until `buf` is full or the end of the file; how much was
    /// read.
    fn pread_upto(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    fn read_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let a = self.align;
        let len = buf.len() as u64;
        let aligned = offset % a == 0 && len % a == 0 && (buf.as_ptr() as usize) % a as usize == 0;
        if aligned {
            return Self::pread_exact(&self.file, buf, offset);
        }
        let mut done = 0u64;
        while done < len {
            let at = offset + done;
            let a0 = round_down(at, a);
            let skip = at - a0;
            let n = (len - done).min(BOUNCE_MAX - skip);
            let a1 = round_up(at + n, a);
            let mut bounce = AlignedBuf::new((a1 - a0) as usize, a as usize);
            // The last block may be short at the end of a file that
            // shrank: what was asked for must be there, the rest need not.
            let got = Self::pread_upto(&self.file, bounce.as_mut_slice(), a0)?;
            if (got as u64) < skip + n {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file ends before the device does",
                ));
            }
            buf[done as usize..(done + n) as usize]
                .copy_from_slice(&bounce.as_slice()[skip as usize..(skip + n) as usize]);
            done += n;
        }
        Ok(())
    }

    // ---- writes ----

    /// `pwrite` the whole buffer; with `fua`, durable on return
    /// (`pwritev2(RWF_DSYNC)`, or write then `fdatasync`).
    fn pwrite_all(&self, file: &File, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        if fua && self.dsync_ok.load(Ordering::Relaxed) {
            match Self::pwrite_dsync(file, buf, offset) {
                Ok(()) => return Ok(()),
                Err((e, written)) => match e.raw_os_error() {
                    Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) if written == 0 => {
                        self.dsync_ok.store(false, Ordering::Relaxed);
                    }
                    _ => return Err(e),
                },
            }
        }
        file.write_all_at(buf, offset)?;
        if fua {
            file.sync_data()?;
        }
        Ok(())
    }

    /// `pwritev2(.., RWF_DSYNC)` until all is written; on error, also how
    /// much was written.
    fn pwrite_dsync(
        file: &File,
        buf: &[u8],
        offset: u64,
    ) -> std::result::Result<(), (io::Error, usize)> {
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &buf[done..];
            let iov = libc::iovec {
                iov_base: rest.as_ptr() as *mut libc::c_void,
                iov_len: rest.len(),
            };
            let at = libc::off_t::try_from(offset + done as u64)
                .map_err(|_| (io::Error::from_raw_os_error(libc::EFBIG), done))?;
            // SAFETY: one iovec describing `rest`, a live slice that outlives
            // the call; pwritev2 only reads from it. The fd is open.
            let r = unsafe { libc::pwritev2(file.as_raw_fd(), &iov, 1, at, libc::RWF_DSYNC) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err((e, done));
            }
            if r == 0 {
                return Err((io::Error::from(io::ErrorKind::WriteZero), done));
            }
            done += r as usize;
        }
        Ok(())
    }

    fn write_direct(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        let a = self.align;
        let len = buf.len() as u64;
        let aligned_io = offset % a == 0 && len % a == 0;
        let _guards = self.lock_blocks(offset, len, !aligned_io);
        if aligned_io && (buf.as_ptr() as usize) % a as usize == 0 {
            return self.pwrite_all(&self.file, buf, offset, fua);
        }
        let mut done = 0u64;
        while done < len {
            let at = offset + done;
            let a0 = round_down(at, a);
            let skip = at - a0;
            let n = (len - done).min(BOUNCE_MAX - skip);
            let a1 = round_up(at + n, a);
            let mut bounce = AlignedBuf::new((a1 - a0) as usize, a as usize);
            let b = bounce.as_mut_slice();
            // Read-modify-write of a partly written first or last block.
            if skip != 0 {
                Self::pread_exact(&self.file, &mut b[..a as usize], a0)?;
            }
            if at + n < a1 && (a1 - a > a0 || skip == 0) {
                let k = (a1 - a - a0) as usize;
                Self::pread_exact(&self.file, &mut b[k..], a1 - a)?;
            }
            b[skip as usize..(skip + n) as usize]
                .copy_from_slice(&buf[done as usize..(done + n) as usize]);
            // Every piece with FUA: RWF_DSYNC covers only its own range.
            self.pwrite_all(&self.file, bounce.as_slice(), a0, fua)?;
            done += n;
        }
        Ok(())
    }

    // ---- zeroing ----

    fn punch(&self, op: Op, offset: u64, len: u64) -> io::Result<()> {
        self.fallocate(
            op,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    }

    fn is_unsupported(e: &io::Error) -> bool {
        matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
        )
    }

    /// Zero a regular file's range without writing data, if the
    /// filesystem can: Ok(true) done, Ok(false) no fast way.
    fn zero_file_fast(&self, offset: u64, len: u64, may_trim: bool) -> Result<bool> {
        let op = Op::WriteZeroes;
        let err = |e| BlockError::io(op, offset, len, e);
        if may_trim && self.trim_ok.load(Ordering::Relaxed) {
            match self.punch(op, offset, len) {
                Ok(()) => return Ok(true),
                Err(e) if Self::is_unsupported(&e) => self.trim_ok.store(false, Ordering::Relaxed),
                Err(e) => return Err(err(e)),
            }
        }
        if self.zero_range_ok.load(Ordering::Relaxed) {
            let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
            match self.fallocate(op, mode, offset, len) {
                Ok(()) => return Ok(true),
                Err(e) if Self::is_unsupported(&e) => {
                    self.zero_range_ok.store(false, Ordering::Relaxed)
                }
                Err(e) => return Err(err(e)),
            }
        }
        if self.trim_ok.load(Ordering::Relaxed) {
            match self.punch(op, offset, len) {
                Ok(()) => {}
                Err(e) if Self::is_unsupported(&e) => {
                    self.trim_ok.store(false, Ordering::Relaxed);
                    return Ok(false);
                }
                Err(e) => return Err(err(e)),
            }
            // Allocate the range again: the caller did not allow a hole.
            // It reads as zeroes either way, so a filesystem that cannot
            // allocate leaves the hole.
            match self.fallocate(op, libc::FALLOC_FL_KEEP_SIZE, offset, len) {
                Ok(()) => {}
                Err(e) if Self::is_unsupported(&e) => {}
                Err(e) => return Err(err(e)),
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// Zero a block device's range: aligned middle by ioctl (or, for a
    /// fast zero, by `fallocate(PUNCH_HOLE)`, which the kernel turns into a
    /// zero-out without the slow fallback), unaligned edges by writing.
    fn zero_block(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let op = Op::WriteZeroes;
        let end = offset + len;
        let m0 = round_up(offset, self.lbs).min(end);
        let m1 = round_down(end, self.lbs).max(m0);
        if flags.fast {
            if m0 != offset || m1 != end {
                // Edges would need writing: not fast.
                return Err(BlockError::new(op, offset, len, ErrorKind::Unsupported));
            }
            let _guards = self.lock_blocks(offset, len, false);
            return self
                .punch(op, offset, len)
                .map_err(|e| BlockError::io(op, offset, len, e));
        }
        if m0 > offset {
            write_zeroes_by_writing(self, offset, m0 - offset, false)?;
        }
        if m1 > m0 {
            let _guards = self.lock_blocks(m0, m1 - m0, false);
            self.blk_range_ioctl(BLKZEROOUT, m0, m1 - m0)
                .map_err(|e| BlockError::io(op, offset, len, e))?;
        }
        if end > m1 {
            write_zeroes_by_writing(self, m1, end - m1, false)?;
        }
        Ok(())
    }

    fn extents_file(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        const MAX_EXTENTS: usize = 1024;
        let end = offset + len;
        let failed = |e| BlockError::io(Op::Extents, offset, len, e);
        let mut out: Vec<Extent> = Vec::new();
        let mut at = offset;
        while at < end && out.len() < MAX_EXTENTS {
            let data = next_data(&self.file, at)
                .map_err(failed)?
                .unwrap_or(end)
                .clamp(at, end);
            if data > at {
                Extent::hole(data - at).push_to(&mut out);
                at = data;
                continue;
            }
            // Data at `at`: up to the next hole (EOF counts as one).
            let hole = next_hole(&self.file, at)
                .map_err(failed)?
                .unwrap_or(end)
                .clamp(at, end);
            if hole == at {
                // Racing with a change of the file: call the rest data.
                Extent::data(end - at).push_to(&mut out);
                break;
            }
            Extent::data(hole - at).push_to(&mut out);
            at = hole;
        }
        Ok(out)
    }
}

/// The size of the block device open as `file`, in bytes (`BLKGETSIZE64`).
pub fn device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which
    // points to a live, writable u64; the fd is open for the call.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

#[test]
fn the_size_ioctl_is_refused_for_a_regular_file() {
    #![allow(clippy::unwrap_used, reason = "tests")]
    let f = tempfile::tempfile().unwrap();
    assert!(device_size(&f).is_err());
}

/// Tell the kernel `file` is read at random places (`posix_fadvise`
/// `RANDOM`): no readahead around each read, which for reads of a few KiB
/// all over a big file would read (and cache) many times what is asked.
pub fn read_at_random(file: &File) -> io::Result<()> {
    rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::Random).map_err(io::Error::from)
}

#[test]
fn a_file_can_be_marked_as_read_at_random() {
    #![allow(clippy::unwrap_used, reason = "tests")]
    let f = tempfile::tempfile().unwrap();
    read_at_random(&f).unwrap();
}

/// Give `file` blocks for its first `len` bytes (`fallocate`, mode 0), so
/// writes there never fail for want of space. `Ok(false)`: the file
/// system cannot (the file is left as it was, sparse).
pub fn allocate(file: &File, len: u64) -> io::Result<bool> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    match FileDev::fallocate_raw(file, 0, 0, len) {
        Ok(()) => Ok(true),
        Err(e) if FileDev::is_unsupported(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

#[test]
fn allocated_blocks_are_counted_and_read_as_zeros() {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use std::os::unix::fs::{FileExt, MetadataExt};
    let d = tempfile::tempdir().unwrap();
    let f = tempfile::tempfile_in(d.path()).unwrap();
    if allocate(&f, 1 << 20).unwrap() {
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), 1 << 20);
        assert!(m.blocks() * 512 >= 1 << 20, "{} blocks", m.blocks());
        let mut b = [1u8; 16];
        f.read_exact_at(&mut b, 1000).unwrap();
        assert_eq!(b, [0; 16]);
    }
    assert!(allocate(&f, u64::MAX).is_err());
}

/// The first offset at or after `at` where `file` holds data
/// (`lseek(SEEK_DATA)`), or `None` when only a hole, or the end, follows.
///
/// Like [`next_hole`], this moves the descriptor's position: use it on
/// files read and written by position (`pread`/`pwrite`) only. A
/// filesystem that does not track holes reports all data.
pub fn next_data(file: &File, at: u64) -> io::Result<Option<u64>> {
    seek_or_nothing(file, rustix::fs::SeekFrom::Data(at))
}

/// The first hole at or after `at` (`lseek(SEEK_HOLE)`; the end of the
/// file counts as one), or `None` when `at` is at or past the end.
pub fn next_hole(file: &File, at: u64) -> io::Result<Option<u64>> {
    seek_or_nothing(file, rustix::fs::SeekFrom::Hole(at))
}

fn seek_or_nothing(file: &File, to: rustix::fs::SeekFrom) -> io::Result<Option<u64>> {
    match rustix::fs::seek(file, to) {
        Ok(at) => Ok(Some(at)),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl BlockDev for FileDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn identity(&self) -> Option<crate::FileIdentity> {
        self.file
            .metadata()
            .ok()
            .as_ref()
            .and_then(crate::FileIdentity::of)
    }

    fn caps(&self) -> Caps {
        let writable = !self.read_only;
        let trim = writable && self.trim_ok.load(Ordering::Relaxed);
        let (zeroes, fast_zero, extents) = match self.kind {
            Kind::Regular => {
                let fast = writable && (trim || self.zero_range_ok.load(Ordering::Relaxed));
                (fast, fast, true)
            }
            Kind::Block => (writable, false, false),
        };
        Caps {
            writable,
            flush: writable,
            fua: writable,
            trim,
            zeroes,
            fast_zero,
            extents,
            multi_conn: true,
            rotational: self.rotational,
        }
    }

    fn block_sizes(&self) -> BlockSizes {
        // Any request works (unaligned ones are bounced, the bytes past
        // the last aligned boundary go through a buffered descriptor), so
        // the alignment is a hint, and one a file whose size is no
        // multiple of it must not give: clients round the size to the
        // minimum (qemu refuses to open such an export for writing:
        // "Image size is not a multiple of request alignment"). Such a
        // file says the largest power of two that divides its size.
        let minimum = self.align.min(1 << self.size.trailing_zeros().min(63));
        BlockSizes {
            minimum: minimum as u32,
            preferred: 4096.max(self.align as u32),
            maximum: 32 << 20,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        check_range(self.size, Op::Read, offset, len)?;
        let err = |e| BlockError::io(Op::Read, offset, len, e);
        if !self.direct {
            return Self::pread_exact(&self.file, buf, offset).map_err(err);
        }
        let split = self.direct_end.clamp(offset, offset + len);
        let (head, rest) = buf.split_at_mut((split - offset) as usize);
        if !head.is_empty() {
            self.read_direct(head, offset).map_err(err)?;
        }
        if !rest.is_empty() {
            if let Some(tail) = &self.tail {
                Self::pread_exact(tail, rest, split).map_err(err)?;
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        let len = buf.len() as u64;
        self.check_write(Op::Write, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let err = |e| BlockError::io(Op::Write, offset, len, e);
        if !self.direct {
            return self.pwrite_all(&self.file, buf, offset, fua).map_err(err);
        }
        let split = self.direct_end.clamp(offset, offset + len);
        let (head, rest) = buf.split_at((split - offset) as usize);
        if !head.is_empty() {
            self.write_direct(head, offset, fua).map_err(err)?;
        }
        if !rest.is_empty() {
            if let Some(tail) = &self.tail {
                self.pwrite_all(tail, rest, split, fua).map_err(err)?;
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.sync(Op::Flush, 0, 0)
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.check_write(Op::Trim, offset, len)?;
        if len == 0 || !self.trim_ok.load(Ordering::Relaxed) {
            return Ok(());
        }
        let r = match self.kind {
            Kind::Regular => {
                let _guards = self.lock_blocks(offset, len, false);
                self.punch(Op::Trim, offset, len)
            }
            Kind::Block => {
                // Discard only whole logical blocks: trim is advisory.
                let m0 = round_up(offset, self.lbs);
                let m1 = round_down(offset + len, self.lbs);
                if m1 <= m0 {
                    return Ok(());
                }
                let _guards = self.lock_blocks(m0, m1 - m0, false);
                self.blk_range_ioctl(BLKDISCARD, m0, m1 - m0)
            }
        };
        match r {
            Ok(()) => {}
            Err(e) if Self::is_unsupported(&e) => {
                self.trim_ok.store(false, Ordering::Relaxed);
                return Ok(());
            }
            Err(e) => return Err(BlockError::io(Op::Trim, offset, len, e)),
        }
        if fua {
            self.sync(Op::Trim, offset, len)?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let op = Op::WriteZeroes;
        self.check_write(op, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        match self.kind {
            Kind::Regular => {
                let done = {
                    let _guards = self.lock_blocks(offset, len, false);
                    self.zero_file_fast(offset, len, flags.may_trim)?
                };
                if !done {
                    if flags.fast {
                        return Err(BlockError::new(op, offset, len, ErrorKind::Unsupported));
                    }
                    // Not FUA piece by piece: the sync below covers it all.
                    write_zeroes_by_writing(self, offset, len, false)?;
                }
            }
            Kind::Block => self.zero_block(offset, len, flags)?,
        }
        if flags.fua {
            self.sync(op, offset, len)?;
        }
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range(self.size, Op::Extents, offset, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        match self.kind {
            Kind::Regular => self.extents_file(offset, len),
            Kind::Block => Ok(vec![Extent::data(len)]),
        }
    }
}

/// `flock(2)` on `file` with `op` (`libc::LOCK_EX`, `LOCK_SH`, `LOCK_UN`,
/// with `LOCK_NB`), retried on EINTR; `Ok(false)` when a non-blocking
/// request would block (another holder). The one flock of the project:
/// the store's held objects and record of seen snapshots, and the
/// write-back cache's device lock.
pub fn flock(file: &File, op: libc::c_int) -> std::io::Result<bool> {
    loop {
        // SAFETY: flock on a descriptor this File owns; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn flock_is_exclusive_per_open_file_and_released_on_close() {
        let dir = std::env::temp_dir().join(format!("cairn-flock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"x").unwrap();
        let a = File::open(&path).unwrap();
        let b = File::open(&path).unwrap();
        assert!(flock(&a, libc::LOCK_EX | libc::LOCK_NB).unwrap());
        assert!(
            !flock(&b, libc::LOCK_EX | libc::LOCK_NB).unwrap(),
            "held by a"
        );
        assert!(
            !flock(&b, libc::LOCK_SH | libc::LOCK_NB).unwrap(),
            "no sharing either"
        );
        drop(a);
        assert!(
            flock(&b, libc::LOCK_EX | libc::LOCK_NB).unwrap(),
            "released on close"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ioctl_numbers_match_libc_and_linux() {
        assert_eq!(BLKSSZGET as libc::Ioctl, libc::BLKSSZGET);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(BLKGETSIZE64, 0x8008_1272);
            assert_eq!(BLKDISCARD, 0x1277);
            assert_eq!(BLKZEROOUT, 0x127f);
        }
    }

    #[test]
    fn aligned_buf_is_aligned() {
        for align in [512usize, 4096] {
            for len in [0usize, 1, 4096, 10000] {
                let mut b = AlignedBuf::new(len, align);
                assert_eq!(b.as_slice().as_ptr() as usize % align, 0);
                assert_eq!(b.as_mut_slice().len(), len);
                assert!(b.as_slice().iter().all(|&x| x == 0));
            }
        }
    }

    #[test]
    fn stripes_lock_in_order_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
        let d = FileDev::open(
            &p,
            FileOptions {
                read_only: false,
                direct: false,
                lock: false,
            },
        )
        .unwrap();
        // Buffered: no locks at all.
        assert!(d.lock_blocks(0, 100, true).is_empty());
        let mut d = d;
        d.direct = true;
        d.align = 4096;
        d.direct_end = 1 << 20;
        assert_eq!(d.lock_blocks(1, 10, true).len(), 1);
        assert_eq!(d.lock_blocks(4000, 200, true).len(), 2);
        assert_eq!(d.lock_blocks(0, 1 << 20, false).len(), STRIPES);
        // Two shared holders of the same stripe do not block each other.
        let g1 = d.lock_blocks(0, 4096, false);
        let g2 = d.lock_blocks(0, 4096, false);
        assert_eq!(g1.len() + g2.len(), 2);
    }
}
