//! Direct I/O, one place for every crate: the alignment `O_DIRECT` needs,
//! a second `O_DIRECT` handle on an open file, aligned writes with a
//! buffered fallback, a sequential reader with reads queued ahead, and
//! a block device's size. Pack writers and restore (store), backup from a
//! device (cli) and plain-file exports ([`crate::FileDev`]) use these.

use crate::file::AlignedBuf;
use crate::readahead::{Engine, ReadAhead};
use crate::SparseRead;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

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
