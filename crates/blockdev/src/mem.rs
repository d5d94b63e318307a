//! A device in memory: for tests, and as a scratch export.

use crate::{check_range, BlockDev, Caps, Op, Result, ZeroFlags};
use std::sync::RwLock;

/// A writable device held in RAM. Trim and zeroing clear the bytes.
pub struct MemDev {
    data: RwLock<Vec<u8>>,
}

impl MemDev {
    /// A device of `size` zero bytes.
    pub fn new(size: usize) -> MemDev {
        MemDev::from_vec(vec![0; size])
    }

    /// A device holding `data`.
    pub fn from_vec(data: Vec<u8>) -> MemDev {
        MemDev {
            data: RwLock::new(data),
        }
    }

    /// A copy of the contents.
    pub fn contents(&self) -> Vec<u8> {
        self.data.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn fill(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        check_range(self.size(), op, offset, len)?;
        let mut d = self.data.write().unwrap_or_else(|p| p.into_inner());
        d[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
}

impl BlockDev for MemDev {
    fn size(&self) -> u64 {
        self.data.read().unwrap_or_else(|p| p.into_inner()).len() as u64
    }

    fn caps(&self) -> Caps {
        Caps {
            writable: true,
            flush: false,
            fua: true,
            trim: true,
            zeroes: true,
            fast_zero: true,
            extents: false,
            multi_conn: true,
            rotational: false,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(self.size(), Op::Read, offset, buf.len() as u64)?;
        let d = self.data.read().unwrap_or_else(|p| p.into_inner());
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> Result<()> {
        check_range(self.size(), Op::Write, offset, buf.len() as u64)?;
        let mut d = self.data.write().unwrap_or_else(|p| p.into_inner());
        d[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, _fua: bool) -> Result<()> {
        self.fill(Op::Trim, offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, _flags: ZeroFlags) -> Result<()> {
        self.fill(Op::WriteZeroes, offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written_and_refuses_out_of_range() {
        let d = MemDev::new(100);
        d.write_at(b"abc", 10, false).unwrap();
        let mut b = [0u8; 5];
        d.read_at(&mut b, 9).unwrap();
        assert_eq!(&b, b"\0abc\0");
        d.write_zeroes(11, 1, ZeroFlags::default()).unwrap();
        d.read_at(&mut b, 9).unwrap();
        assert_eq!(&b, b"\0a\0c\0");
        assert!(d.read_at(&mut b, 96).is_err());
        assert!(d.write_at(b"x", u64::MAX, false).is_err());
        assert!(d.trim(100, 1, false).is_err());
        assert!(d.trim(100, 0, false).is_ok());
    }
}
