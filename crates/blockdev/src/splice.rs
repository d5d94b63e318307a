//! Bytes handed to a pipe by reference (`vmsplice`) instead of copied
//! into it.
//!
//! A `write` to a pipe allocates a page per 4 KiB and copies into it: for
//! a restore streamed through `| cat` that was a quarter of the whole
//! pipeline's CPU (os2.img, 604 MB: 0.75 CPU-s with `cat`, 0.60 without
//! the pipe). `vmsplice` puts references to the writer's own pages in the
//! pipe instead; the reader copies out of them as it would out of the
//! pipe's pages.
//!
//! The price is that those pages must not change until every reader is
//! done with them, and a reader that splices them on (`pv`, `tee`, a
//! socket) keeps them referenced after they have left this pipe, so no
//! amount of waiting on the pipe tells when they are free. Memory given to
//! a pipe here is therefore never written again: a [`SpliceBuf`] is an
//! anonymous mapping of its own, written once, then frozen read-only
//! ([`SpliceBuf::freeze`], `mprotect`) into [`SpliceBytes`], and unmapped
//! when dropped (the pipe's references keep the pages alive until its
//! readers let go). Only frozen bytes (and a frozen run of zeros) can be
//! named in a splice ([`Spliced`]).
//!
//! That means fresh pages for every buffer, which pays only in huge pages:
//! a 2 MiB buffer is one page fault instead of 512. Measured with a
//! writer of 300 buffers of 2 MiB through `| cat` (2 cores, `perf stat -r
//! 15`): `write` from reused buffers 336-399 ms of CPU; `vmsplice` of
//! fresh 4 KiB pages 348-392 ms (no gain); of fresh huge pages 144-155 ms.
//! So splicing is used only where transparent huge pages can be had
//! ([`splice_pays`]); elsewhere the caller writes.

use memmap2::{Advice, Mmap, MmapMut};
use std::fs::File;
use std::io;
use std::ops::Deref;
use std::os::fd::AsFd;
use std::sync::OnceLock;

/// A transparent huge page: buffers are aligned to it.
const HUGE: usize = 2 << 20;
/// The frozen zeros runs of zeros are spliced from.
const ZERO_RUN: usize = 1 << 20;

/// Whether handing a pipe frozen buffers pays here: `f` is a pipe and the
/// kernel gives transparent huge pages on request (`enabled` is `always`
/// or `madvise`, not `never`).
pub fn splice_pays(f: &File) -> bool {
    let Ok(stat) = rustix::fs::fstat(f.as_fd()) else {
        return false;
    };
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Fifo {
        return false;
    }
    // On a descriptor open only for reading `vmsplice` reads the pipe
    // into the buffers instead (a standard output that is a pipe's read
    // end, `cmd >&0`): such a one is left to `write`, which says EBADF.
    let writable = rustix::fs::fcntl_getfl(f.as_fd()).is_ok_and(|fl| {
        let mode = fl & rustix::fs::OFlags::RWMODE;
        mode == rustix::fs::OFlags::WRONLY || mode == rustix::fs::OFlags::RDWR
    });
    if !writable {
        return false;
    }
    static HUGE_PAGES: OnceLock<bool> = OnceLock::new();
    *HUGE_PAGES.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"))
    })
}

/// A buffer of `len` bytes in a mapping of its own, on huge pages where
/// the kernel has them, to be written once and then frozen.
pub struct SpliceBuf {
    map: MmapMut,
    at: usize,
    len: usize,
}

impl SpliceBuf {
    /// Whether a buffer of `len` bytes pays for a mapping of its own: it
    /// fills at least half a huge page. (Restoring an image of 4 KiB chunks
    /// stored alone, a mapping per chunk took 0.95-1.5 s where writes took
    /// 0.35 s.)
    pub fn pays(len: usize) -> bool {
        len >= HUGE / 2
    }

    /// A zeroed buffer of `len` bytes (its pages are made as they are
    /// first written).
    pub fn new(len: usize) -> io::Result<SpliceBuf> {
        // Huge pages from a huge page's boundary, as many as the length
        // fills at least half of: a tail under half a huge page stays on
        // small pages. (A huge page is zeroed whole when first touched:
        // os2.img's groups of 2 MiB and a little were zeroed for 4 MiB
        // each when the tail got one too, 10 % of the restore's CPU.)
        // The slack past the buffer is address space, never touched.
        let huge = (len + HUGE / 2) / HUGE * HUGE;
        let mapped = len
            .max(huge)
            .checked_add(HUGE)
            .ok_or(io::ErrorKind::OutOfMemory)?;
        let map = MmapMut::map_anon(mapped)?;
        let at = (HUGE - map.as_ptr() as usize % HUGE) % HUGE;
        if huge > 0 {
            // Advice only: without it the buffer works on small pages.
            let _ = map.advise_range(Advice::HugePage, at, huge);
        }
        Ok(SpliceBuf { map, at, len })
    }

    /// The bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map[self.at..self.at + self.len]
    }

    /// Make the bytes read-only for good: from here they may be spliced.
    pub fn freeze(self) -> io::Result<SpliceBytes> {
        Ok(SpliceBytes {
            map: self.map.make_read_only()?,
            at: self.at,
            len: self.len,
        })
    }
}

impl AsMut<[u8]> for SpliceBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// Bytes that can no longer change (their mapping is read-only), so a
/// pipe may hold references to them for as long as its readers like.
pub struct SpliceBytes {
    map: Mmap,
    at: usize,
    len: usize,
}

impl SpliceBytes {
    /// `len` bytes from `start`, to splice.
    ///
    /// # Panics
    ///
    /// If the range is not within the bytes (a caller's bug).
    pub fn range(&self, start: usize, len: usize) -> Spliced<'_> {
        Spliced(&self[start..start + len])
    }

    /// A run of zeros, frozen once for the process; `None` when it could
    /// not be made.
    fn zeros() -> Option<&'static SpliceBytes> {
        static ZEROS: OnceLock<Option<SpliceBytes>> = OnceLock::new();
        ZEROS
            .get_or_init(|| {
                let mut b = SpliceBuf::new(ZERO_RUN).ok()?;
                // Real pages: the shared zero page is not for handing out.
                b.as_mut_slice().fill(0);
                b.freeze().ok()
            })
            .as_ref()
    }
}

impl Deref for SpliceBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map[self.at..self.at + self.len]
    }
}

impl std::fmt::Debug for SpliceBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SpliceBytes({} bytes)", self.len)
    }
}

/// A stretch of frozen bytes: all that [`splice_all`] takes.
#[derive(Clone, Copy)]
pub struct Spliced<'a>(&'a [u8]);

impl<'a> Spliced<'a> {
    /// `n` zeros as stretches of the frozen zeros (empty when they could
    /// not be made: the caller then writes them).
    pub fn zeros(n: u64) -> Option<impl Iterator<Item = Spliced<'a>>> {
        let z = SpliceBytes::zeros()?;
        let step = z.len() as u64;
        Some((0..n.div_ceil(step)).map(move |k| Spliced(&z[..(n - k * step).min(step) as usize])))
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Slices handed to one `vmsplice` at most (Linux's `IOV_MAX`).
const MAX_IOV: usize = 1024;

/// Hand all of `parts` to pipe `pipe`, in order, by reference, waiting
/// while it is full; `done` counts the bytes handed over (so an error can
/// say where it stopped). A pipe whose readers have gone fails with
/// `EPIPE` (and `SIGPIPE`), as a write does.
pub fn splice_all(pipe: &File, parts: &[Spliced<'_>], done: &mut u64) -> io::Result<()> {
    let mut left: Vec<&[u8]> = parts
        .iter()
        .map(|p| p.0)
        .filter(|p| !p.is_empty())
        .collect();
    let mut first = 0;
    while first < left.len() {
        let iov: Vec<rustix::pipe::IoSliceRaw<'_>> = left[first..left.len().min(first + MAX_IOV)]
            .iter()
            .map(|p| rustix::pipe::IoSliceRaw::from_slice(p))
            .collect();
        // SAFETY: `pipe` is written to, so the kernel only reads the
        // slices, and every one of them is frozen memory (`Spliced` is
        // made only from `SpliceBytes`, whose mapping is read-only and
        // unmapped only when dropped, the pipe's page references outliving
        // it): the pipe's readers see exactly these bytes, however late.
        // No SPLICE_F_GIFT: nothing is asserted about alignment.
        let n =
            match unsafe { rustix::pipe::vmsplice(pipe, &iov, rustix::pipe::SpliceFlags::empty()) }
            {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        *done += n as u64;
        let mut n = n;
        while n > 0 {
            let len = left[first].len();
            if n >= len {
                n -= len;
                first += 1;
            } else {
                left[first] = &left[first][n..];
                n = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn pipe() -> (File, File) {
        let (r, w) = rustix::pipe::pipe().unwrap();
        (File::from(r), File::from(w))
    }

    #[test]
    fn frozen_bytes_and_zeros_arrive_in_order() {
        let mut a = SpliceBuf::new(3 * HUGE + 12345).unwrap();
        for (i, b) in a.as_mut_slice().iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        let want_a = a.as_mut_slice().to_vec();
        let a = a.freeze().unwrap();
        let mut b = SpliceBuf::new(100).unwrap();
        b.as_mut_slice().fill(9);
        let b = b.freeze().unwrap();
        let (mut r, w) = pipe();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            r.read_to_end(&mut got).unwrap();
            got
        });
        let zeros = 3 * ZERO_RUN as u64 + 5;
        let mut parts = vec![a.range(5, a.len() - 5)];
        parts.extend(Spliced::zeros(zeros).unwrap());
        parts.push(b.range(0, 0));
        parts.push(b.range(1, 99));
        // More slices than one call takes.
        parts.extend((0..3000).map(|i| a.range(i, 1)));
        let mut done = 0;
        splice_all(&w, &parts, &mut done).unwrap();
        drop((w, parts));
        // The buffers go before the reader has read them all.
        drop((a, b));
        let got = reader.join().unwrap();
        let mut want = want_a[5..].to_vec();
        want.resize(want.len() + zeros as usize, 0);
        want.extend_from_slice(&[9; 99]);
        want.extend_from_slice(&want_a[..3000]);
        assert_eq!(done, want.len() as u64);
        assert!(got == want, "spliced bytes differ");
    }

    #[test]
    fn a_pipe_without_readers_is_an_error() {
        let (r, w) = pipe();
        drop(r);
        let mut a = SpliceBuf::new(10).unwrap();
        a.as_mut_slice().fill(1);
        let a = a.freeze().unwrap();
        let mut done = 0;
        // (The test harness ignores SIGPIPE, as Rust programs do.)
        let e = splice_all(&w, &[a.range(0, 10)], &mut done).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        assert_eq!(done, 0);
    }

    #[test]
    fn only_pipes_are_spliced_to() {
        let (r, w) = pipe();
        let file = tempfile::tempfile().unwrap();
        assert!(!splice_pays(&file));
        // Its read end is no place to splice to (vmsplice would read it).
        assert!(!splice_pays(&r));
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"));
        assert_eq!(splice_pays(&w), thp);
    }

    #[test]
    fn a_frozen_buffer_is_read_only() {
        let mut a = SpliceBuf::new(HUGE).unwrap();
        a.as_mut_slice()[0] = 1;
        let a = a.freeze().unwrap();
        assert_eq!((a[0], a.len()), (1, HUGE));
        // Its mapping says so (a write would fault, which cannot be
        // tested in process).
        let addr = a.as_ptr() as usize;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let perms = maps
            .lines()
            .find_map(|l| {
                let (range, rest) = l.split_once(' ')?;
                let (lo, hi) = range.split_once('-')?;
                let (lo, hi) = (
                    usize::from_str_radix(lo, 16).ok()?,
                    usize::from_str_radix(hi, 16).ok()?,
                );
                (lo <= addr && addr < hi).then(|| rest[..4].to_string())
            })
            .unwrap();
        assert_eq!(perms, "r--p");
    }
}
