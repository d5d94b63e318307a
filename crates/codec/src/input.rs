//! A buffered reader that knows its absolute offset, for splitters that
//! must peek at headers, walk block sizes and copy whole frames out.

use crate::error::{CodecError, Result};
use std::io::{ErrorKind, Read};

/// Buffered input with offset tracking and look-ahead of any length.
pub struct Input {
    inner: Box<dyn Read + Send>,
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
        Input {
            inner,
            buf: vec![0; CHUNK],
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
        // What is buffered first, then the rest straight from the source
        // into `dst`: a whole frame or block run is copied once, not twice.
        let k = (self.end - self.pos).min(n);
        dst.extend_from_slice(&self.buf[self.pos..self.pos + k]);
        self.consume(k);
        let mut left = (n - k) as u64;
        if left == 0 {
            return Ok(());
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
        if left > 0 {
            return Err(CodecError::Truncated {
                format,
                offset: self.offset,
            });
        }
        Ok(())
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
}
