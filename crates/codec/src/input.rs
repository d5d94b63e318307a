//! A buffered reader that knows its absolute offset, for splitters that
//! must peek at headers, walk block sizes and copy whole frames out.

use crate::error::{CodecError, Result};
use memmap2::Mmap;
use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Bytes of a memory-mapped input file, shared with the workers: a
/// splitter hands a worker a frame without copying it (no `read(2)` copy
/// out of the page cache at all).
#[derive(Clone)]
pub struct SharedBytes {
    map: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({}..{})", self.start, self.start + self.len)
    }
}

impl SharedBytes {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.map).as_ref()[self.start..self.start + self.len]
    }

    /// The bytes from `offset` on, shared (`None` past the end).
    pub fn from_offset(&self, offset: usize) -> Option<SharedBytes> {
        Some(SharedBytes {
            map: self.map.clone(),
            start: self.start + offset,
            len: self.len.checked_sub(offset)?,
        })
    }

    /// Bytes in memory, shared the same way (tests, callers that hold the
    /// whole input).
    pub fn from_vec(v: Vec<u8>) -> Self {
        Self::from_arc(Arc::new(v))
    }

    /// Bytes in memory that the caller keeps a handle on too (to take the
    /// buffer back for reuse once every share is gone).
    pub fn from_arc(v: Arc<Vec<u8>>) -> Self {
        Self::from_owner(v)
    }

    /// Bytes of any owner, shared: a buffer that goes back to its pool when
    /// the last share is dropped, say.
    pub fn from_owner(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        let len = (*owner).as_ref().len();
        SharedBytes {
            map: owner,
            start: 0,
            len,
        }
    }

    /// `len` bytes from `offset` on, shared (`None` past the end).
    pub fn slice(&self, offset: usize, len: usize) -> Option<SharedBytes> {
        let mut s = self.from_offset(offset)?;
        if len > s.len {
            return None;
        }
        s.len = len;
        Some(s)
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

/// Buffered input with offset tracking and look-ahead of any length.
pub struct Input {
    inner: Box<dyn Read + Send>,
    /// The regular file behind `inner` and its length, when it is one: a
    /// splitter may read an index at its end (the zstd seek table) without
    /// moving the stream position.
    file: Option<(File, u64)>,
    /// That file mapped into memory: not tried yet (`None`), or the map
    /// when it could be made. Made on the first [`Input::take_shared`], so
    /// formats that never take frames in place never map their input.
    map: Option<Option<Arc<Mmap>>>,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Absolute offset of `buf[pos]`.
    offset: u64,
    eof: bool,
}

const CHUNK: usize = 1 << 20;

impl Input {
    /// Wrap a reader.
    pub fn new(inner: Box<dyn Read + Send>) -> Self {
        Self::with_buffer(inner, CHUNK)
    }

    /// Wrap a reader, reading `size` bytes at a time at first (more when
    /// a look-ahead needs them): for a few header bytes.
    pub(crate) fn with_buffer(inner: Box<dyn Read + Send>, size: usize) -> Self {
        Input {
            inner,
            file: None,
            map: None,
            buf: vec![0; size],
            pos: 0,
            end: 0,
            offset: 0,
            eof: false,
        }
    }

    /// Wrap a reader whose first bytes were already read (e.g. to sniff a
    /// magic number).
    pub fn with_prefix(prefix: &[u8], inner: Box<dyn Read + Send>) -> Self {
        let mut input = Input::new(inner);
        if input.buf.len() < prefix.len() {
            input.buf.resize(prefix.len(), 0);
        }
        input.buf[..prefix.len()].copy_from_slice(prefix);
        input.end = prefix.len();
        input
    }

    /// Like [`Input::with_prefix`] over a file whose first `prefix.len()`
    /// bytes were read; when it is a regular file, [`Input::stream_len`]
    /// and [`Input::read_tail`] work.
    pub fn with_prefix_file(prefix: &[u8], file: File) -> Self {
        // Only a file read from its start: a redirected stdin may have been
        // read partly by someone else, and the tail's offsets would not
        // match the stream's.
        let at = std::io::Seek::stream_position(&mut &file).ok();
        let len = file
            .metadata()
            .ok()
            .filter(|m| m.is_file() && at == Some(prefix.len() as u64))
            .map(|m| m.len());
        // A second handle (same open file) for `read_at`; the reader stays a
        // plain `File`, whose `read_buf` fills spare capacity without
        // zeroing it first (a wrapper type would have it zeroed).
        let tail = len.and_then(|len| Some((file.try_clone().ok()?, len)));
        let mut input = Input::with_prefix(prefix, Box::new(file));
        input.file = tail;
        input
    }

    /// The next `n` bytes without copying them, when the input is a
    /// mapped file that holds them; `None` (nothing consumed) otherwise.
    pub fn take_shared(&mut self, n: usize) -> Result<Option<SharedBytes>> {
        let Some((file, len)) = &self.file else {
            return Ok(None);
        };
        let map = self.map.get_or_insert_with(|| map_file(file, *len));
        let Some(map) = map.clone() else {
            return Ok(None);
        };
        let start = self.offset;
        let end = start.saturating_add(n as u64);
        if end > map.len() as u64 {
            return Ok(None);
        }
        // The buffered bytes are the file's bytes at this offset; the rest
        // is skipped in the stream (the two handles share one position).
        let buffered = (self.end - self.pos).min(n);
        let skip = n - buffered;
        if skip > 0 {
            (&*file)
                .seek(SeekFrom::Current(skip as i64))
                .map_err(|source| CodecError::Io {
                    offset: start,
                    source,
                })?;
        }
        self.consume(buffered);
        self.offset += skip as u64;
        Ok(Some(SharedBytes {
            map,
            start: start as usize,
            len: n,
        }))
    }

    /// The rest of a mapped input file from the current offset, without
    /// consuming it; `None` when the input is not a file that maps.
    pub fn mapped_rest(&mut self) -> Option<SharedBytes> {
        let (file, len) = self.file.as_ref()?;
        let map = self.map.get_or_insert_with(|| map_file(file, *len));
        let map = map.clone()?;
        let start = usize::try_from(self.offset).ok()?;
        let len = map.len().checked_sub(start)?;
        Some(SharedBytes { map, start, len })
    }

    /// Length of the whole stream, when it is a regular file.
    pub fn stream_len(&self) -> Option<u64> {
        self.file.as_ref().map(|(_, len)| *len)
    }

    /// The last `n` bytes of a regular file (as it was measured when
    /// opened), read without moving the stream position; `None` when the
    /// input is not a regular file, is shorter, or the read fails (a
    /// splitter then does without the index it looked for).
    pub fn read_tail(&self, n: usize) -> Option<Vec<u8>> {
        let (file, len) = self.file.as_ref()?;
        let at = len.checked_sub(n as u64)?;
        let mut v = vec![0; n];
        file.read_exact_at(&mut v, at).ok()?;
        Some(v)
    }

    /// Put `bytes`, just taken, back in front of the unread input.
    pub fn unread(&mut self, bytes: &[u8]) {
        let rest = self.end - self.pos;
        let mut buf = Vec::with_capacity((bytes.len() + rest).max(CHUNK));
        buf.extend_from_slice(bytes);
        buf.extend_from_slice(&self.buf[self.pos..self.end]);
        let end = buf.len();
        buf.resize(buf.capacity(), 0);
        self.buf = buf;
        self.pos = 0;
        self.end = end;
        self.offset -= bytes.len() as u64;
    }

    /// Absolute offset of the next unread byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The buffered, unread bytes.
    pub fn peek(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    /// Make at least `n` bytes available unless the input ends first;
    /// returns how many are available (`>= n` or everything left).
    pub fn fill(&mut self, n: usize) -> Result<usize> {
        while self.end - self.pos < n && !self.eof {
            if self.pos > 0 && (self.pos == self.end || self.buf.len() - self.pos < n) {
                self.buf.copy_within(self.pos..self.end, 0);
                self.end -= self.pos;
                self.pos = 0;
            }
            if self.buf.len() - self.pos < n {
                self.buf.resize((self.pos + n).max(CHUNK), 0);
            }
            if self.end == self.buf.len() {
                let grow = self.buf.len().max(CHUNK);
                self.buf.resize(self.buf.len() + grow, 0);
            }
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(CodecError::Io {
                        offset: self.offset + (self.end - self.pos) as u64,
                        source,
                    })
                }
            }
        }
        Ok(self.end - self.pos)
    }

    /// Make exactly `n` bytes available or fail as truncated `format`.
    pub fn need(&mut self, n: usize, format: &'static str) -> Result<&[u8]> {
        if self.fill(n)? < n {
            return Err(CodecError::Truncated {
                format,
                offset: self.offset + (self.end - self.pos) as u64,
            });
        }
        Ok(&self.buf[self.pos..self.pos + n])
    }

    /// Make `n` bytes available where a next stream (member, frame) may
    /// start. Fewer than `n` are a cut stream if they could begin one
    /// (`could_start` of what is there), else garbage after the last one
    /// (`echo junk >> x.gz`), which is not a truncation.
    pub fn need_start(
        &mut self,
        n: usize,
        format: &'static str,
        could_start: impl Fn(&[u8]) -> bool,
    ) -> Result<&[u8]> {
        let have = self.fill(n)?;
        if have < n && !could_start(self.peek()) {
            return Err(CodecError::TrailingGarbage {
                format,
                offset: self.offset(),
            });
        }
        self.need(n, format)
    }

    /// True when every byte has been consumed and the source is exhausted.
    pub fn at_end(&mut self) -> Result<bool> {
        Ok(self.fill(1)? == 0)
    }

    /// Drop `n` buffered bytes (at most what is buffered).
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.end - self.pos);
        self.pos += n;
        self.offset += n as u64;
    }

    /// Move exactly `n` bytes to the end of `dst` or fail as truncated.
    pub fn take(&mut self, n: usize, dst: &mut Vec<u8>, format: &'static str) -> Result<()> {
        if self.read_up_to(dst, n)? < n {
            return Err(CodecError::Truncated {
                format,
                offset: self.offset,
            });
        }
        Ok(())
    }

    /// Move `n` bytes to the end of `dst`, fewer only where the input
    /// ends; returns how many were moved.
    pub fn read_up_to(&mut self, dst: &mut Vec<u8>, n: usize) -> Result<usize> {
        // What is buffered first, then the rest straight from the source
        // into `dst`: a whole frame or block run is copied once, not twice.
        let k = (self.end - self.pos).min(n);
        dst.extend_from_slice(&self.buf[self.pos..self.pos + k]);
        self.consume(k);
        let mut left = (n - k) as u64;
        if left == 0 {
            return Ok(n);
        }
        dst.reserve(left as usize);
        while left > 0 && !self.eof {
            // `take` + `read_to_end` fills spare capacity without zeroing.
            match Read::by_ref(&mut self.inner).take(left).read_to_end(dst) {
                Ok(0) => self.eof = true,
                Ok(got) => {
                    left -= got as u64;
                    self.offset += got as u64;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(CodecError::Io {
                        offset: self.offset,
                        source,
                    })
                }
            }
        }
        Ok(n - left as usize)
    }

    /// Skip exactly `n` bytes or fail as truncated `format`.
    pub fn skip(&mut self, n: u64, format: &'static str) -> Result<()> {
        let mut left = n;
        while left > 0 {
            let have = self.fill(1)?;
            if have == 0 {
                return Err(CodecError::Truncated {
                    format,
                    offset: self.offset,
                });
            }
            let k = (have as u64).min(left) as usize;
            self.consume(k);
            left -= k as u64;
        }
        Ok(())
    }

    /// Read up to `max` bytes (fewer only at the end of input) into `dst`,
    /// appending; returns how many.
    pub fn take_up_to(&mut self, max: usize, dst: &mut Vec<u8>) -> Result<usize> {
        let mut got = 0;
        while got < max {
            if self.end == self.pos && self.fill(1)? == 0 {
                break;
            }
            let k = (self.end - self.pos).min(max - got);
            dst.extend_from_slice(&self.buf[self.pos..self.pos + k]);
            self.consume(k);
            got += k;
        }
        Ok(got)
    }
}

/// Map a regular file of `len` bytes for reading, or `None` (empty
/// file, a filesystem that cannot map): the caller then reads as usual.
fn map_file(file: &File, len: u64) -> Option<Arc<Mmap>> {
    if len == 0 || usize::try_from(len).is_err() {
        return None;
    }
    // SAFETY: the mapping is read-only and private to this process, and
    // is only ever read as compressed input, which the decoders check like
    // any other input. Another process may still change the file while it
    // is mapped: changed bytes then read as damaged input (decoders and
    // content checksums catch them, as with `read(2)`); a file cut shorter
    // makes a read of the lost pages raise SIGBUS, which the CLI turns into
    // a one-line error (`cli/src/signals.rs`). The unit test
    // `incompressible_frames_are_decoded_in_place` and the CLI test
    // `an_input_cut_short_while_mapped_fails_cleanly` exercise this path.
    let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(file) }.ok()?;
    // Frames are taken in order: read ahead, and let pages go behind.
    let _ = map.advise(memmap2::Advice::Sequential);
    Some(Arc::new(map))
}

impl crate::inflate::segmented::Source for Input {
    fn read_up_to(&mut self, dst: &mut Vec<u8>, max: usize) -> Result<usize> {
        Input::read_up_to(self, dst, max)
    }

    fn unread(&mut self, bytes: &[u8]) {
        Input::unread(self, bytes)
    }
}

/// Whether `have` (maybe shorter) begins like `magic`.
pub(crate) fn begins_like(have: &[u8], magic: &[u8]) -> bool {
    magic.starts_with(&have[..have.len().min(magic.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dribble(Vec<u8>, usize);
    impl Read for Dribble {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            let n = b.len().min(3).min(self.0.len() - self.1);
            b[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
            self.1 += n;
            Ok(n)
        }
    }

    #[test]
    fn offsets_and_lookahead() {
        let data: Vec<u8> = (0..=255u8).cycle().take(3 * CHUNK + 17).collect();
        let mut input = Input::with_prefix(&data[..2], Box::new(Dribble(data[2..].to_vec(), 0)));
        assert_eq!(input.need(10, "t").unwrap(), &data[..10]);
        input.consume(5);
        assert_eq!(input.offset(), 5);
        let mut out = Vec::new();
        input.take(CHUNK * 2, &mut out, "t").unwrap();
        assert_eq!(out, &data[5..5 + 2 * CHUNK]);
        out.clear();
        let n = input.take_up_to(usize::MAX, &mut out).unwrap();
        assert_eq!(n, data.len() - 5 - 2 * CHUNK);
        assert!(input.at_end().unwrap());
        assert!(input.need(1, "t").is_err());
    }

    #[test]
    fn unread_puts_bytes_back_in_front() {
        let data: Vec<u8> = (0..=255u8).cycle().take(CHUNK + 100).collect();
        let mut input = Input::new(Box::new(Dribble(data.clone(), 0)));
        let mut out = Vec::new();
        input.take(CHUNK - 3, &mut out, "t").unwrap();
        input.need(10, "t").unwrap();
        input.unread(&out[7..]);
        assert_eq!(input.offset(), 7);
        let mut all = Vec::new();
        input.take_up_to(usize::MAX, &mut all).unwrap();
        assert_eq!(all, &data[7..]);
        assert_eq!(input.offset(), data.len() as u64);
    }

    #[test]
    fn a_regular_file_has_a_length_and_a_tail_that_does_not_move_the_stream() {
        let data: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &data).unwrap();
        std::io::Seek::rewind(&mut f).unwrap();
        let mut head = [0u8; 4];
        f.read_exact(&mut head).unwrap();
        let mut input = Input::with_prefix_file(&head, f);
        assert_eq!(input.stream_len(), Some(5000));
        assert_eq!(input.read_tail(9).unwrap(), &data[5000 - 9..]);
        assert!(input.read_tail(5001).is_none());
        let mut all = Vec::new();
        input.take_up_to(usize::MAX, &mut all).unwrap();
        assert_eq!(all, data);
        // A file whose reading began past its start: no tail.
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &data).unwrap();
        std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(100)).unwrap();
        f.read_exact(&mut head).unwrap();
        let late = Input::with_prefix_file(&head, f);
        assert_eq!(late.stream_len(), None);
        assert!(late.read_tail(9).is_none());
        // A pipe has neither.
        let piped = Input::new(Box::new(std::io::Cursor::new(data)));
        assert_eq!(piped.stream_len(), None);
        assert!(piped.read_tail(1).is_none());
    }
}
