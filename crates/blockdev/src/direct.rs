//! Direct I/O, one place for every crate: the alignment `O_DIRECT` needs,
//! a second `O_DIRECT` handle on an open file, aligned writes with a
//! buffered fallback, a sequential reader with reads queued ahead, and
//! an input opened whole for reading ([`open_input`]: a file, a device or
//! a stream, with `O_DIRECT` or not, and its size). Pack writers and
//! restore (store), backup's source (cli) and plain-file exports
//! ([`crate::FileDev`]) use these.

use crate::file::{device_size, AlignedBuf};
use crate::readahead::{Engine, ReadAhead};
use crate::{SparseFile, SparseRead};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Alignment of `O_DIRECT` I/O in memory, in the file and in length: a
/// multiple of every logical block size in use (512 B and 4 KiB).
pub const DIRECT_ALIGN: usize = 4096;

/// A second handle on `file`, for writing, with `O_DIRECT` (through
/// `/proc/self/fd`, so it works for a file not yet renamed into place);
/// `None` where the filesystem or device refuses it (tmpfs before Linux
/// 6.6, some FUSE and network mounts).
pub fn reopen_direct(file: &File) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
}

/// Write aligned `blocks` at `at` through `direct`; a device whose blocks
/// are bigger than [`DIRECT_ALIGN`] refuses that (EINVAL), and `buffered`
/// takes them instead.
pub fn write_blocks_at(direct: &File, buffered: &File, blocks: &[u8], at: u64) -> io::Result<()> {
    match direct.write_all_at(blocks, at) {
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => buffered.write_all_at(blocks, at),
        r => r,
    }
}

/// Bytes of each read of a [`DirectReader`], and how many are queued
/// ahead of it (chosen by `bench/stream.py` and paired runs: see
/// docs/benchmarks.md, "Cold streaming reads and writes").
/// Blocks of a backup's batch (8 MiB) or more are handed to the chunker
/// whole, without a copy ([`SparseRead::swap_block`]).
const READ_BLOCK: usize = 8 << 20;
const READ_DEPTH: usize = 8;

/// A file opened with `O_DIRECT`, read front to back with reads queued
/// ahead of the caller ([`ReadAhead`]: io_uring where the kernel has it).
#[derive(Debug)]
pub struct DirectReader {
    inner: ReadAhead,
}

impl DirectReader {
    /// A reader of `file` (opened with `O_DIRECT`) from its current offset.
    pub fn new(file: File) -> DirectReader {
        DirectReader::with_queue(file, READ_BLOCK, READ_DEPTH)
    }

    /// A reader with `depth` reads of `block` bytes queued ahead.
    pub fn with_queue(file: File, block: usize, depth: usize) -> DirectReader {
        DirectReader {
            inner: ReadAhead::new(file, block, depth),
        }
    }

    /// How the reads are made.
    pub fn engine(&self) -> Engine {
        self.inner.engine()
    }
}

/// A source for backup: read through the queue, or block by block without
/// a copy ([`ReadAhead::swap_block`]).
impl SparseRead for DirectReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        Read::read(&mut self.inner, out)
    }

    fn offer_blocks(&mut self, head: usize, min_block: usize) -> Option<usize> {
        (self.inner.block() >= min_block && self.inner.set_head(head)).then(|| self.inner.block())
    }

    fn swap_block(&mut self, buf: &mut AlignedBuf) -> io::Result<usize> {
        self.inner.swap_block(buf)
    }
}

/// An input opened by [`open_input`].
pub struct Input {
    /// Its bytes: read ahead with `O_DIRECT`, by the data extents of a
    /// regular file, or as a stream.
    pub reader: Box<dyn SparseRead>,
    /// Its size: a regular file's length, a block device's
    /// (`BLKGETSIZE64`); `None` for a stream (a FIFO, a character
    /// device, a socket).
    pub size: Option<u64>,
    /// The reads queued ahead, for a direct input.
    pub engine: Option<Engine>,
}

/// Open `path` to be read once, front to back (a backup's source): with
/// `direct` (`Some((block, depth))`), with `O_DIRECT` and `depth` reads of
/// `block` bytes queued ahead ([`DirectReader`]); else a regular file is
/// read by its data extents ([`SparseFile`]: its holes are not read) and
/// anything else as a stream. A directory is refused (`EISDIR`) without
/// being opened.
pub fn open_input(path: &Path, direct: Option<(usize, usize)>) -> io::Result<Input> {
    use std::os::unix::fs::OpenOptionsExt;
    // A directory is refused without being opened (and again after the
    // open, should the name have changed in between).
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    if direct.is_some() {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = opts.open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    let size = match meta.file_type() {
        t if t.is_block_device() => Some(device_size(&file).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("the size of the device (BLKGETSIZE64): {e}"),
            )
        })?),
        _ if meta.is_file() => Some(meta.len()),
        _ => None,
    };
    let (reader, engine): (Box<dyn SparseRead>, _) = match direct {
        Some((block, depth)) => {
            let r = DirectReader::with_queue(file, block, depth);
            let engine = r.engine();
            (Box::new(r), Some(engine))
        }
        None if meta.is_file() => (Box::new(SparseFile::new(file)?), None),
        None => (Box::new(file), None),
    };
    Ok(Input {
        reader,
        size,
        engine,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn read_all(r: &mut dyn SparseRead) -> Vec<u8> {
        let mut got = Vec::new();
        let mut piece = vec![0u8; 1 << 20];
        loop {
            let zeros = r.zeros_ahead().unwrap();
            if zeros > 0 {
                r.skip_zeros(zeros).unwrap();
                got.resize(got.len() + zeros as usize, 0);
                continue;
            }
            let n = r.read(&mut piece).unwrap();
            if n == 0 {
                return got;
            }
            got.extend_from_slice(&piece[..n]);
        }
    }

    /// A regular file is sized and read whole (its hole by its extents
    /// without --direct, read through with it); a device with no size is
    /// a stream; a directory is refused.
    #[test]
    fn inputs_are_opened_sized_and_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let mut data = vec![7u8; 3 << 20];
        data.extend(std::iter::repeat_n(0u8, 4 << 20));
        data.extend((0..12345).map(|i| (i % 251) as u8));
        std::fs::write(&p, &data[..3 << 20]).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&data[7 << 20..], 7 << 20).unwrap();
        drop(f);
        let mut plain = open_input(&p, None).unwrap();
        assert_eq!(plain.size, Some(data.len() as u64));
        assert!(plain.engine.is_none());
        assert!(read_all(plain.reader.as_mut()) == data);
        // O_DIRECT where the filesystem takes it (tmpfs from Linux 6.6).
        match open_input(&p, Some((1 << 20, 4))) {
            Ok(mut direct) => {
                assert_eq!(direct.size, Some(data.len() as u64));
                assert!(direct.engine.is_some());
                assert!(read_all(direct.reader.as_mut()) == data);
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
        }
        let mut null = open_input(Path::new("/dev/null"), None).unwrap();
        assert_eq!(null.size, None);
        assert!(read_all(null.reader.as_mut()).is_empty());
        for direct in [None, Some((1 << 20, 4))] {
            let e = open_input(dir.path(), direct).err().unwrap();
            assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
        }
        let missing = open_input(&dir.path().join("missing"), None);
        assert_eq!(missing.err().unwrap().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_direct_reader_reads_everything_through_an_aligned_window() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..(READ_BLOCK * 2 + 12345))
            .map(|i| (i % 253) as u8)
            .collect();
        std::fs::write(&p, &data).unwrap();
        // O_DIRECT where the filesystem takes it; the reader is the same.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
            .or_else(|_| File::open(&p))
            .unwrap();
        let mut r = DirectReader::new(file);
        let mut got = Vec::new();
        let mut piece = vec![0u8; 100_000];
        loop {
            let n = SparseRead::read(&mut r, &mut piece).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&piece[..n]);
        }
        assert_eq!(got, data);
    }
}
