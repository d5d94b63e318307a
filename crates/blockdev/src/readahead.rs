//! Sequential reads kept in flight ahead of the reader: the engine behind
//! [`crate::DirectReader`].
//!
//! A file opened with `O_DIRECT` gets no readahead from the kernel: each
//! `read` waits for the disk, and the thread that asked does nothing else
//! meanwhile (backup's reader thread also cuts chunks). Here `depth` reads
//! of `block` bytes at the next offsets are always queued in an io_uring,
//! so the disk streams while the caller works on what has arrived; blocks
//! are handed out in file order whatever order they complete in.
//!
//! A caller that cuts what it reads in place (backup's reader) can take
//! a block whole instead of copying it out ([`ReadAhead::swap_block`]):
//! the block's buffer is swapped with a free one of the caller's, which
//! the next read is queued into. Each buffer keeps `head` bytes free in
//! front of the block ([`ReadAhead::set_head`]) for the caller to put the
//! bytes it carries over from the block before.
//!
//! Where io_uring cannot be set up (a kernel without it, or
//! `kernel.io_uring_disabled`, or a seccomp filter), or the file has no
//! offset (a pipe), the same reader reads one block at a time with
//! `read(2)`; [`ReadAhead::engine`] says which.
//!
//! Written by hand because it is small: the `io-uring` crate gives the
//! queues; what is cairn's is the in-order handout, the short-read rule
//! and never freeing a buffer the kernel may still write.

use crate::file::AlignedBuf;
use crate::DIRECT_ALIGN;
use io_uring::{opcode, types, IoUring};
use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::unix::io::AsRawFd;

/// How the blocks are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Queued in an io_uring, `depth` at a time.
    Uring,
    /// One `read(2)` at a time, on the caller's thread.
    Sync,
}

impl Engine {
    /// A name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Uring => "io_uring",
            Engine::Sync => "read(2)",
        }
    }
}

/// Largest read (an io_uring read's length is 32 bits).
const MAX_BLOCK: usize = 1 << 30;

/// What became of one block's read.
#[derive(Debug)]
enum Slot {
    /// Not in use.
    Free,
    /// Queued in the ring; the kernel may write its buffer.
    InFlight,
    /// Read: this many bytes (fewer than a block only at the end, or where
    /// the kernel cut a read short).
    Done(usize),
    /// The read failed.
    Failed(io::Error),
}

/// A file read front to back from its current offset through `depth`
/// aligned buffers of `block` bytes, with reads queued ahead of the caller.
pub struct ReadAhead {
    file: File,
    ring: Option<IoUring>,
    block: usize,
    /// Bytes kept free in front of each block in its buffer.
    head: usize,
    /// `head + block` bytes each; block `k` is read to `head` of buffer
    /// `k % depth`.
    bufs: Vec<AlignedBuf>,
    slots: Vec<Slot>,
    /// Reads queued and not yet reaped.
    in_flight: usize,
    /// File offset of block number 0 of this run (moves after a short read).
    base: u64,
    /// Blocks of this run handed to the kernel so far; block `k` lives in
    /// slot `k % depth` at `base + k * block`.
    submitted: u64,
    /// Blocks of this run the caller has taken whole.
    taken: u64,
    /// Bytes of block `taken` the caller has taken.
    pos: usize,
    /// The end of the file was seen: nothing more is queued.
    ended: bool,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead")
            .field("engine", &self.engine())
            .field("block", &self.block)
            .field("depth", &self.bufs.len())
            .field("offset", &self.offset())
            .finish()
    }
}

impl ReadAhead {
    /// A reader of `file` from its current offset, `depth` reads of `block`
    /// bytes ahead (`block` a multiple of [`DIRECT_ALIGN`], `depth` ≥ 1).
    pub fn new(mut file: File, block: usize, depth: usize) -> ReadAhead {
        let block = block
            .clamp(DIRECT_ALIGN, MAX_BLOCK)
            .next_multiple_of(DIRECT_ALIGN);
        let depth = depth.max(1);
        let at = file.stream_position().ok();
        let ring = match at {
            Some(_) => IoUring::new(depth.next_power_of_two() as u32).ok(),
            None => None,
        };
        let depth = if ring.is_some() { depth } else { 1 };
        ReadAhead {
            file,
            ring,
            block,
            head: 0,
            bufs: (0..depth)
                .map(|_| AlignedBuf::new(block, DIRECT_ALIGN))
                .collect(),
            slots: (0..depth).map(|_| Slot::Free).collect(),
            in_flight: 0,
            base: at.unwrap_or(0),
            submitted: 0,
            taken: 0,
            pos: 0,
            ended: false,
        }
    }

    /// How this reader reads.
    pub fn engine(&self) -> Engine {
        if self.ring.is_some() {
            Engine::Uring
        } else {
            Engine::Sync
        }
    }

    /// File offset of the next byte [`Read::read`] returns.
    pub fn offset(&self) -> u64 {
        self.base + self.taken * self.block as u64 + self.pos as u64
    }

    fn depth(&self) -> usize {
        self.bufs.len()
    }

    /// Bytes of each read.
    pub fn block(&self) -> usize {
        self.block
    }

    /// Keep `head` bytes (rounded up to [`DIRECT_ALIGN`]) free in front of
    /// every block, for [`ReadAhead::swap_block`]'s callers. Only before
    /// the first read: `false` (and no change) after it.
    pub fn set_head(&mut self, head: usize) -> bool {
        let fresh = self.submitted == 0
            && self.taken == 0
            && self.pos == 0
            && self.in_flight == 0
            && self.slots.iter().all(|s| matches!(s, Slot::Free));
        if fresh {
            self.head = head.next_multiple_of(DIRECT_ALIGN);
            let len = self.buffer_len();
            self.bufs
                .iter_mut()
                .for_each(|b| *b = AlignedBuf::new(len, DIRECT_ALIGN));
        }
        fresh
    }

    /// Bytes of every buffer [`ReadAhead::swap_block`] takes and gives:
    /// the head, then a block.
    pub fn buffer_len(&self) -> usize {
        self.head + self.block
    }

    /// The next block whole, without a copy: its buffer is swapped with
    /// `buf` (one of [`ReadAhead::buffer_len`] bytes, whose contents are
    /// not needed any more), so the block's bytes are
    /// `buf[head..head + n]`; returns `n`, 0 at the end of the file. Only
    /// between blocks: after a [`Read::read`] that took part of one, the
    /// rest of it must be read first (a swap then is refused, and loses
    /// nothing); after reads that took one to its end, the swap takes the
    /// next.
    pub fn swap_block(&mut self, buf: &mut AlignedBuf) -> io::Result<usize> {
        if buf.len() != self.buffer_len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "read-ahead: a buffer of {} bytes swapped for one of {}",
                    buf.len(),
                    self.buffer_len()
                ),
            ));
        }
        if self.ended {
            return Ok(0);
        }
        if self.pos != 0 {
            // A `read` that took a block to its end leaves it current
            // until the next call: go on to the next block. Only bytes
            // not yet read would be lost by a swap.
            let slot = (self.taken % self.depth() as u64) as usize;
            match self.slots[slot] {
                Slot::Done(n) if n == self.pos => {
                    if !self.next_block(n)? {
                        return Ok(0);
                    }
                }
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "read-ahead: a block swapped out after part of it was read",
                    ))
                }
            }
        }
        let n = self.fill()?;
        if n > 0 {
            let slot = (self.taken % self.depth() as u64) as usize;
            std::mem::swap(&mut self.bufs[slot], buf);
        }
        self.pos = n;
        self.next_block(n)?;
        Ok(n)
    }

    /// Block `taken`, of `n` bytes, is used up (`pos == n`): go on to the
    /// next. `false` at the end of the file.
    fn next_block(&mut self, n: usize) -> io::Result<bool> {
        let slot = (self.taken % self.depth() as u64) as usize;
        self.slots[slot] = Slot::Free;
        if n == self.block {
            self.taken += 1;
            self.pos = 0;
            return Ok(true);
        }
        // A short read. Nothing, or a queued read that ends off the
        // alignment, is the end of the file; otherwise (the kernel cut a
        // read short, or a pipe had no more yet) the file is asked again
        // right after it: blocks queued behind it were read at the wrong
        // offsets.
        let at = self.offset();
        if n == 0 || self.ring.is_some() && n % DIRECT_ALIGN != 0 {
            self.ended = true;
            self.drain()?;
            return Ok(false);
        }
        self.restart(at)?;
        Ok(true)
    }

    /// Queue reads of the next blocks into every free slot.
    fn queue(&mut self) -> io::Result<()> {
        let depth = self.depth() as u64;
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        let mut queued = 0;
        while !self.ended && self.submitted < self.taken + depth {
            let k = self.submitted;
            let slot = (k % depth) as usize;
            let at = self.base + k * self.block as u64;
            let buf = self.bufs[slot].as_mut_slice()[self.head..].as_mut_ptr();
            let entry = opcode::Read::new(types::Fd(self.file.as_raw_fd()), buf, self.block as u32)
                .offset(at)
                .build()
                .user_data(slot as u64);
            // SAFETY: the buffer has `block` bytes after `head`, owned by
            // `self.bufs` (never swapped out while in flight),
            // and not touched by this reader until its completion is
            // reaped (`Slot::InFlight`); `Drop` waits for every read in
            // flight (or leaks the buffers) before they are freed.
            if unsafe { ring.submission().push(&entry) }.is_err() {
                break;
            }
            self.slots[slot] = Slot::InFlight;
            self.in_flight += 1;
            self.submitted += 1;
            queued += 1;
        }
        if queued > 0 {
            ring.submit()?;
        }
        Ok(())
    }

    /// Wait for at least one read in flight and record every completion.
    fn reap(&mut self) -> io::Result<()> {
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        for cqe in ring.completion() {
            let slot = cqe.user_data() as usize;
            let r = cqe.result();
            self.slots[slot] = if r >= 0 {
                Slot::Done(r as usize)
            } else {
                Slot::Failed(io::Error::from_raw_os_error(-r))
            };
            self.in_flight -= 1;
        }
        Ok(())
    }

    /// Wait for every read in flight; their results are dropped.
    fn drain(&mut self) -> io::Result<()> {
        while self.in_flight > 0 {
            self.reap()?;
        }
        Ok(())
    }

    /// Start a new run at `at`: what was queued past it is dropped.
    fn restart(&mut self, at: u64) -> io::Result<()> {
        self.drain()?;
        self.slots.iter_mut().for_each(|s| *s = Slot::Free);
        self.base = at;
        self.submitted = 0;
        self.taken = 0;
        self.pos = 0;
        Ok(())
    }

    /// Make block `taken` read, or say why not.
    fn fill(&mut self) -> io::Result<usize> {
        let slot = (self.taken % self.depth() as u64) as usize;
        if self.ring.is_none() {
            if !matches!(self.slots[slot], Slot::Done(_)) {
                let n = loop {
                    match self
                        .file
                        .read(&mut self.bufs[slot].as_mut_slice()[self.head..])
                    {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        r => break r?,
                    }
                };
                self.submitted = self.taken + 1;
                self.slots[slot] = Slot::Done(n);
            }
        } else {
            loop {
                self.queue()?;
                match &self.slots[slot] {
                    Slot::Done(_) | Slot::Failed(_) => break,
                    Slot::Free if self.ended => return Ok(0),
                    _ if self.in_flight == 0 => {
                        // Nothing would ever complete: fail, never hang.
                        return Err(io::Error::other(format!(
                            "read-ahead at offset {}: block not queued",
                            self.offset()
                        )));
                    }
                    _ => self.reap()?,
                }
            }
        }
        match std::mem::replace(&mut self.slots[slot], Slot::InFlight) {
            Slot::Done(n) => {
                self.slots[slot] = Slot::Done(n);
                Ok(n)
            }
            Slot::Failed(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) =>
            {
                // Asked again, from this block on.
                let at = self.offset();
                self.restart(at)?;
                self.fill()
            }
            Slot::Failed(e) => {
                // A later call asks the file again from this block.
                let at = self.offset();
                self.restart(at)?;
                Err(e)
            }
            other => {
                self.slots[slot] = other;
                Ok(0)
            }
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            let n = self.fill()?;
            let slot = (self.taken % self.depth() as u64) as usize;
            if self.pos < n {
                let k = out.len().min(n - self.pos);
                let from = self.head + self.pos;
                out[..k].copy_from_slice(&self.bufs[slot].as_slice()[from..from + k]);
                self.pos += k;
                return Ok(k);
            }
            if !self.next_block(n)? {
                return Ok(0);
            }
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        if self.drain().is_err() {
            // The kernel may still write into the buffers: never free them.
            std::mem::forget(std::mem::take(&mut self.bufs));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::io::SeekFrom;
    use std::os::unix::fs::OpenOptionsExt;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn open(p: &std::path::Path) -> File {
        // O_DIRECT where the filesystem takes it (not every tmpfs does).
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(p)
            .or_else(|_| File::open(p))
            .unwrap()
    }

    /// Every size around the block and alignment edges, odd read sizes,
    /// and several depths: the bytes come out whole and in order.
    #[test]
    fn reads_everything_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let block = 16 << 10;
        for len in [
            0,
            1,
            4095,
            4096,
            4097,
            block - 1,
            block,
            block + 1,
            5 * block + 12_345,
        ] {
            let want = data(len);
            std::fs::write(&p, &want).unwrap();
            for depth in [1, 2, 3, 8] {
                let mut r = ReadAhead::new(open(&p), block, depth);
                let mut got = Vec::new();
                let mut piece = vec![0u8; 5000];
                loop {
                    let n = r.read(&mut piece).unwrap();
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&piece[..n]);
                }
                assert!(got == want, "len {len} depth {depth}");
                assert_eq!(r.read(&mut piece).unwrap(), 0);
                assert_eq!(r.offset(), len as u64);
            }
        }
    }

    /// Every block of `r` taken whole by swapping one buffer in and out,
    /// their bytes behind `head` joined.
    fn swap_all(r: &mut ReadAhead, head: usize) -> Vec<u8> {
        let mut buf = AlignedBuf::new(r.buffer_len(), DIRECT_ALIGN);
        let mut got = Vec::new();
        loop {
            let n = r.swap_block(&mut buf).unwrap();
            if n == 0 {
                return got;
            }
            got.extend_from_slice(&buf.as_slice()[head..head + n]);
            // What the caller leaves in the buffer it gives back does not
            // reach the next blocks.
            buf.as_mut_slice().fill(0xee);
        }
    }

    /// Blocks taken whole by swapping buffers come out whole and in
    /// order, behind the free head, on both engines; the buffers given
    /// back are read into again.
    #[test]
    fn blocks_swapped_out_whole_come_in_order_behind_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let block = 16 << 10;
        for len in [0, 1, 4097, block, 3 * block + 5000] {
            let want = data(len);
            std::fs::write(&p, &want).unwrap();
            for depth in [1, 2, 5] {
                for head in [0, 1, 4096, 5000] {
                    let mut r = ReadAhead::new(open(&p), block, depth);
                    assert!(r.set_head(head));
                    let head = head.next_multiple_of(DIRECT_ALIGN);
                    assert_eq!(r.buffer_len(), head + block);
                    let got = swap_all(&mut r, head);
                    assert!(got == want, "len {len} depth {depth} head {head}");
                    let mut buf = AlignedBuf::new(r.buffer_len(), DIRECT_ALIGN);
                    assert_eq!(r.swap_block(&mut buf).unwrap(), 0);
                    assert_eq!(r.offset(), len as u64);
                }
            }
        }
        // The read(2) engine (a socket) swaps the same way.
        let (rx, mut tx) = std::os::unix::net::UnixStream::pair().unwrap();
        let want = data(100_000);
        let w = want.clone();
        let t = std::thread::spawn(move || std::io::Write::write_all(&mut tx, &w).unwrap());
        let mut r = ReadAhead::new(File::from(std::os::fd::OwnedFd::from(rx)), block, 3);
        assert!(r.set_head(4096));
        let got = swap_all(&mut r, 4096);
        t.join().unwrap();
        assert!(got == want);
    }

    /// A swap is refused with a buffer of the wrong size or in the middle
    /// of a block; the head cannot move once reading has begun.
    #[test]
    fn a_swap_is_refused_where_it_would_lose_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let want = data(100_000);
        std::fs::write(&p, &want).unwrap();
        let mut r = ReadAhead::new(open(&p), 16 << 10, 2);
        let mut wrong = AlignedBuf::new(8192, DIRECT_ALIGN);
        let e = r.swap_block(&mut wrong).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let mut first = [0u8; 10];
        r.read_exact(&mut first).unwrap();
        assert!(!r.set_head(4096), "reading has begun");
        let mut buf = AlignedBuf::new(r.buffer_len(), DIRECT_ALIGN);
        let e = r.swap_block(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // The refused swaps lost nothing: the rest reads on.
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert!([&first[..], &rest[..]].concat() == want);
    }

    /// Reads that take a block to its very end, then swaps: the next
    /// block comes whole, on both engines and at every depth, and a read
    /// that took the last bytes leaves nothing to swap.
    #[test]
    fn a_swap_after_reads_that_end_a_block_takes_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let block = 16 << 10;
        let want = data(3 * block + 5000);
        std::fs::write(&p, &want).unwrap();
        for depth in [1, 2, 4] {
            let mut r = ReadAhead::new(open(&p), block, depth);
            let mut got = vec![0u8; block];
            // One block in two reads, the second ending it exactly.
            r.read_exact(&mut got[..1000]).unwrap();
            r.read_exact(&mut got[1000..]).unwrap();
            got.extend(swap_all(&mut r, 0));
            assert!(got == want, "depth {depth}");
        }
        let mut r = ReadAhead::new(open(&p), block, 2);
        let mut all = Vec::new();
        r.read_to_end(&mut all).unwrap();
        let mut buf = AlignedBuf::new(r.buffer_len(), DIRECT_ALIGN);
        assert_eq!(r.swap_block(&mut buf).unwrap(), 0);
        // The read(2) engine, from a socket.
        let (rx, mut tx) = std::os::unix::net::UnixStream::pair().unwrap();
        let w = want.clone();
        let t = std::thread::spawn(move || std::io::Write::write_all(&mut tx, &w).unwrap());
        let mut r = ReadAhead::new(File::from(std::os::fd::OwnedFd::from(rx)), block, 3);
        // One read of a block's length takes the first block whole, however
        // much of the stream it held.
        let mut got = vec![0u8; block];
        let n = r.read(&mut got).unwrap();
        got.truncate(n);
        got.extend(swap_all(&mut r, 0));
        t.join().unwrap();
        assert!(got == want);
    }

    /// The kernel this runs on has io_uring (CI's does); a reader falls
    /// back to read(2) only where it must, and reads the same either way.
    #[test]
    fn queues_in_an_io_uring_and_starts_at_the_files_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let want = data(1 << 20);
        std::fs::write(&p, &want).unwrap();
        let mut f = open(&p);
        f.seek(SeekFrom::Start(64 << 10)).unwrap();
        let mut r = ReadAhead::new(f, 64 << 10, 4);
        if std::env::var_os("CI").is_some() {
            assert_eq!(r.engine(), Engine::Uring);
        }
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert!(got == want[64 << 10..]);
    }

    /// A socket (or pipe) has no offset: one read(2) at a time, to its end,
    /// through the short reads it gives.
    #[test]
    fn a_stream_is_read_one_block_at_a_time() {
        let (rx, mut tx) = std::os::unix::net::UnixStream::pair().unwrap();
        let want = data(300_000);
        let w = want.clone();
        let t = std::thread::spawn(move || std::io::Write::write_all(&mut tx, &w).unwrap());
        let mut r = ReadAhead::new(File::from(std::os::fd::OwnedFd::from(rx)), 64 << 10, 4);
        assert_eq!(r.engine(), Engine::Sync);
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        t.join().unwrap();
        assert!(got == want);
    }

    /// An error from the disk reaches the caller: a directory cannot be
    /// read.
    #[test]
    fn a_failed_read_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = ReadAhead::new(File::open(dir.path()).unwrap(), 4096, 4);
        for _ in 0..3 {
            // Asked again, it asks the file again (and does not hang).
            let e = r.read(&mut [0u8; 10]).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
        }
        assert_eq!(r.offset(), 0);
    }
}
