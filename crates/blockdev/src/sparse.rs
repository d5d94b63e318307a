//! Sequential reading that knows holes: any byte stream, or a regular file
//! whose holes can be skipped without being read.
//!
//! A sparse image (a VM disk, an OS image with free space) read through
//! `read(2)` costs the kernel a zero-filled page-cache page and a copy for
//! every byte of every hole. [`SparseFile`] asks the filesystem where the
//! data is (`lseek` with `SEEK_DATA`/`SEEK_HOLE`, by
//! [`crate::next_data`]), reads only the data with `pread`, and reports the holes as
//! [`SparseRead::zeros_ahead`], so a reader can pass over them without
//! touching their bytes (the backup records whole zero chunks as holes,
//! `cairn pack` encodes a zero block once). A filesystem that cannot say
//! where the holes are is read as all data.

use crate::file::{next_data, next_hole, AlignedBuf};
use std::fs::File;
use std::io::{self, ErrorKind, Read, Seek};
use std::os::unix::fs::FileExt;

/// Whether every byte is zero (64 bytes at a time, which vectorises).
pub fn is_zero(data: &[u8]) -> bool {
    let mut blocks = data.chunks_exact(64);
    blocks.all(|b| b.iter().fold(0u8, |a, &x| a | x) == 0)
        && blocks.remainder().iter().all(|&x| x == 0)
}

/// A byte stream that may know where it holds only zeros.
///
/// Every `Read` is one with no known holes; [`SparseFile`] knows its
/// holes.
pub trait SparseRead: Send {
    /// Read some bytes into `buf`; 0 at the end of the stream.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;

    /// How many bytes from the current position are known to be zero
    /// without reading them (a hole); 0 when none or not known.
    fn zeros_ahead(&mut self) -> io::Result<u64> {
        Ok(0)
    }

    /// Move past `n` bytes of the zeros [`SparseRead::zeros_ahead`] reported.
    fn skip_zeros(&mut self, n: u64) -> io::Result<()> {
        if n == 0 {
            Ok(())
        } else {
            Err(io::Error::new(
                ErrorKind::InvalidInput,
                "this source has no holes to skip",
            ))
        }
    }

    /// For a source that reads into aligned buffers of its own, in blocks
    /// of at least `min_block` bytes: have it keep `head` bytes (a
    /// multiple of [`crate::DIRECT_ALIGN`]) free in front of each block it
    /// reads, and hand its blocks over whole through
    /// [`SparseRead::swap_block`] instead of copying them out. Returns the
    /// block size, or `None` (most sources, smaller blocks, and any source
    /// asked after its first read). Such a source reports no holes.
    fn offer_blocks(&mut self, _head: usize, _min_block: usize) -> Option<usize> {
        None
    }

    /// The next block, after [`SparseRead::offer_blocks`] said yes: its
    /// buffer is swapped with `buf` (`head + block` bytes, contents no
    /// longer needed), and its `n` bytes are `buf[head..head + n]`; 0 at
    /// the end. Not mixed with [`SparseRead::read`] within a block.
    fn swap_block(&mut self, _buf: &mut AlignedBuf) -> io::Result<usize> {
        Err(io::Error::new(
            ErrorKind::Unsupported,
            "this source does not hand over its blocks",
        ))
    }
}

impl<R: Read + Send> SparseRead for R {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Read::read(self, buf)
    }
}

/// A regular file read by its data extents; its holes read as zeros and
/// are reported by [`SparseRead::zeros_ahead`].
#[derive(Debug)]
pub struct SparseFile {
    file: File,
    /// Offset of the next byte.
    pos: u64,
    /// End of the region `pos` is in, or `pos` when it must be looked up.
    region_end: u64,
    /// Whether that region is a hole.
    hole: bool,
    /// Whether the filesystem answers `SEEK_DATA`; after a refusal the
    /// rest of the file is read as data.
    ask: bool,
}

impl SparseFile {
    /// Read `file` by its data extents, from its current position (a
    /// redirected stdin may have been read partly). Reads are positional:
    /// the descriptor's own position is left wherever it is.
    pub fn new(file: File) -> io::Result<Self> {
        let pos = (&file).stream_position()?;
        Ok(SparseFile {
            file,
            pos,
            region_end: 0,
            hole: false,
            ask: true,
        })
    }

    /// Find the region `pos` is in, unless known.
    fn locate(&mut self) -> io::Result<()> {
        if self.pos < self.region_end {
            return Ok(());
        }
        // Data until the end of the stream, whatever its length by then.
        let (hole, end) = if !self.ask {
            (false, u64::MAX)
        } else {
            match next_data(&self.file, self.pos) {
                Ok(Some(d)) if d > self.pos => (true, d),
                Ok(Some(_)) => match next_hole(&self.file, self.pos)? {
                    Some(h) if h > self.pos => (false, h),
                    // At or past the end: read to the end, however far.
                    _ => (false, u64::MAX),
                },
                // No data at or after `pos`: a hole up to the size the file
                // has now (or the end of the stream).
                Ok(None) => {
                    let size = self.file.metadata()?.len();
                    if size > self.pos {
                        (true, size)
                    } else {
                        (false, u64::MAX)
                    }
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS)
                    ) =>
                {
                    self.ask = false;
                    (false, u64::MAX)
                }
                Err(e) => return Err(e),
            }
        };
        self.hole = hole;
        self.region_end = end;
        Ok(())
    }
}

impl SparseRead for SparseFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.locate()?;
        let n = (self.region_end - self.pos).min(buf.len() as u64) as usize;
        let n = if self.hole {
            buf[..n].fill(0);
            n
        } else {
            // A data region that ends early means the file shrank: the
            // stream ends there.
            self.file.read_at(&mut buf[..n], self.pos)?
        };
        self.pos += n as u64;
        Ok(n)
    }

    fn zeros_ahead(&mut self) -> io::Result<u64> {
        self.locate()?;
        Ok(if self.hole {
            self.region_end - self.pos
        } else {
            0
        })
    }

    fn skip_zeros(&mut self, n: u64) -> io::Result<()> {
        if n > self.zeros_ahead()? {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "cannot skip {n} bytes at offset {}: not a hole that long",
                    self.pos
                ),
            ));
        }
        self.pos += n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A sparse file: data at `(offset, len)` pieces, holes elsewhere.
    fn sparse(size: u64, pieces: &[(u64, usize)]) -> (tempfile::NamedTempFile, Vec<u8>) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(size).unwrap();
        let mut want = vec![0u8; size as usize];
        for (i, &(at, len)) in pieces.iter().enumerate() {
            let bytes: Vec<u8> = (0..len).map(|k| (k * 7 + i * 13 + 1) as u8).collect();
            f.as_file().write_all_at(&bytes, at).unwrap();
            want[at as usize..at as usize + len].copy_from_slice(&bytes);
        }
        f.flush().unwrap();
        (f, want)
    }

    /// Read everything; of each hole, skip the first half and read the
    /// rest. Returns the bytes and how many were skipped.
    fn drain(src: &mut SparseFile, step: usize) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let mut skipped = 0;
        let mut through = 0u64;
        let mut buf = vec![0xAAu8; step];
        loop {
            if through == 0 {
                let z = src.zeros_ahead().unwrap();
                if z > 1 {
                    let n = z / 2;
                    src.skip_zeros(n).unwrap();
                    out.resize(out.len() + n as usize, 0);
                    skipped += n;
                    through = z - n;
                }
            }
            let n = SparseRead::read(src, &mut buf).unwrap();
            if n == 0 {
                break;
            }
            through = through.saturating_sub(n as u64);
            out.extend_from_slice(&buf[..n]);
        }
        (out, skipped)
    }

    #[test]
    fn zero_test() {
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 1000]));
        for i in [0, 63, 64, 999] {
            let mut v = vec![0u8; 1000];
            v[i] = 1;
            assert!(!is_zero(&v), "{i}");
        }
    }

    #[test]
    fn holes_read_as_zeros_and_can_be_skipped() {
        let size = 1 << 20;
        let (f, want) = sparse(size, &[(0, 5000), (300_000, 70_000), (700_000, 1)]);
        for step in [1000, 4096, 65536, 1 << 20] {
            let mut src = SparseFile::new(f.reopen().unwrap()).unwrap();
            let (got, skipped) = drain(&mut src, step);
            assert_eq!(got.len(), want.len(), "step {step}");
            assert!(got == want, "step {step}: bytes differ");
            // tmpfs and ext4 both report holes (4 KiB granularity).
            assert!(skipped > 150_000, "step {step}: skipped only {skipped}");
        }
    }

    #[test]
    fn trailing_hole_and_all_hole_files() {
        for (size, pieces) in [
            (200_000u64, vec![(0u64, 10usize)]),
            (200_000, vec![]),
            (0, vec![]),
            (8192, vec![(0, 8192)]),
        ] {
            let (f, want) = sparse(size, &pieces);
            let (got, _) = drain(&mut SparseFile::new(f.reopen().unwrap()).unwrap(), 4096);
            assert!(got == want, "size {size}");
        }
    }

    #[test]
    fn skipping_more_than_the_hole_is_refused() {
        let (f, _) = sparse(100_000, &[(50_000, 100)]);
        let mut src = SparseFile::new(f.reopen().unwrap()).unwrap();
        let z = src.zeros_ahead().unwrap();
        assert!(z > 0 && z <= 50_000);
        assert!(src.skip_zeros(z + 1).is_err());
        src.skip_zeros(z).unwrap();
        assert_eq!(src.zeros_ahead().unwrap(), 0);
        let mut plain = std::io::Cursor::new(vec![1u8; 10]);
        assert_eq!(plain.zeros_ahead().unwrap(), 0);
        assert!(plain.skip_zeros(1).is_err());
    }

    #[test]
    fn a_file_that_grows_is_read_to_its_new_end() {
        let (f, _) = sparse(10_000, &[(0, 100)]);
        let mut src = SparseFile::new(f.reopen().unwrap()).unwrap();
        let mut buf = vec![0u8; 100];
        assert_eq!(SparseRead::read(&mut src, &mut buf).unwrap(), 100);
        f.as_file().write_all_at(&[9u8; 50], 10_000).unwrap();
        let (rest, _) = drain(&mut src, 4096);
        assert_eq!(rest.len(), 10_050 - 100);
        assert_eq!(&rest[rest.len() - 50..], &[9u8; 50]);
    }
}
