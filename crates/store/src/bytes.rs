//! Little-endian encoding helpers with bounds checks: every parser of the
//! store reads through [`Reader`], which fails with the offset of the first
//! byte it could not read instead of panicking on short input.

/// Appends little-endian values to a `Vec`.
#[derive(Default)]
pub(crate) struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }
    /// A string of at most 65535 bytes, length first (longer ones are cut
    /// at a character boundary: they are labels, never data).
    pub fn str16(&mut self, s: &str) {
        let mut end = s.len().min(usize::from(u16::MAX));
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.bytes(&s.as_bytes()[..end]);
    }
}

/// Reads little-endian values from a slice; `Err(offset)` when the slice
/// ends first.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], usize> {
        if self.remaining() < n {
            return Err(self.pos);
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], usize> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, usize> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, usize> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, usize> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, usize> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn i64(&mut self) -> Result<i64, usize> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    pub fn str16(&mut self) -> Result<String, usize> {
        let at = self.pos;
        let n = usize::from(self.u16()?);
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_short_input() {
        let mut w = Writer::default();
        w.u8(1);
        w.u16(2);
        w.u32(3);
        w.u64(4);
        w.i64(-5);
        w.str16("héllo");
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(2));
        assert_eq!(r.u32(), Ok(3));
        assert_eq!(r.u64(), Ok(4));
        assert_eq!(r.i64(), Ok(-5));
        assert_eq!(r.str16().as_deref(), Ok("héllo"));
        assert_eq!(r.u8(), Err(w.buf.len()));
        let mut r = Reader::new(&w.buf[..3]);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u32(), Err(1));
    }

    #[test]
    fn long_strings_are_cut_at_a_char_boundary() {
        let s = "é".repeat(40_000);
        let mut w = Writer::default();
        w.str16(&s);
        let got = Reader::new(&w.buf).str16().unwrap();
        assert!(got.len() <= 65535 && s.starts_with(&got));
    }
}
