//! Errors of block devices: the operation, where, and a kind that a
//! protocol edge maps to its own codes.

use std::fmt;
use std::io;

/// The operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `read_at`.
    Read,
    /// `write_at`.
    Write,
    /// `flush`.
    Flush,
    /// `trim`.
    Trim,
    /// `write_zeroes`.
    WriteZeroes,
    /// `extents`.
    Extents,
    /// Opening or sizing the device.
    Open,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
            Op::WriteZeroes => "write zeroes",
            Op::Extents => "block status",
            Op::Open => "open",
        })
    }
}

/// What kind of failure.
#[derive(Debug)]
pub enum ErrorKind {
    /// The range is not inside the device.
    OutOfRange,
    /// The device is read-only.
    ReadOnly,
    /// The device cannot do this (or, for a fast zero, not fast).
    Unsupported,
    /// No space left to store the data.
    NoSpace,
    /// The stored data is damaged (a checksum failed).
    Corrupt(String),
    /// The operating system's error.
    Io(io::Error),
}

impl ErrorKind {
    /// The closest errno, for protocols that speak errno (NBD).
    pub fn errno(&self) -> i32 {
        match self {
            ErrorKind::OutOfRange => libc::EINVAL,
            ErrorKind::ReadOnly => libc::EPERM,
            ErrorKind::Unsupported => libc::ENOTSUP,
            ErrorKind::NoSpace => libc::ENOSPC,
            ErrorKind::Corrupt(_) => libc::EIO,
            ErrorKind::Io(e) => match e.raw_os_error() {
                Some(n) => n,
                None => libc::EIO,
            },
        }
    }
}

/// A failed block operation.
#[derive(Debug)]
pub struct BlockError {
    /// The operation.
    pub op: Op,
    /// Byte offset of the request.
    pub offset: u64,
    /// Length of the request.
    pub len: u64,
    /// What went wrong.
    pub kind: ErrorKind,
}

impl BlockError {
    /// An error of `kind` for `op` on `offset..offset + len`.
    pub fn new(op: Op, offset: u64, len: u64, kind: ErrorKind) -> BlockError {
        BlockError {
            op,
            offset,
            len,
            kind,
        }
    }

    /// An OS error, classified (ENOSPC becomes [`ErrorKind::NoSpace`]).
    pub fn io(op: Op, offset: u64, len: u64, e: io::Error) -> BlockError {
        let kind = match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => ErrorKind::NoSpace,
            Some(libc::EROFS) => ErrorKind::ReadOnly,
            Some(libc::EOPNOTSUPP) => ErrorKind::Unsupported,
            _ => ErrorKind::Io(e),
        };
        BlockError::new(op, offset, len, kind)
    }
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An open has no range: "open: ..." (it said "open of 0 bytes at
        // offset 0").
        match self.op {
            Op::Open => write!(f, "{}: ", self.op)?,
            _ => write!(
                f,
                "{} of {} bytes at offset {}: ",
                self.op, self.len, self.offset
            )?,
        }
        match &self.kind {
            ErrorKind::OutOfRange => f.write_str("beyond the end of the device"),
            ErrorKind::ReadOnly => f.write_str("the device is read-only"),
            ErrorKind::Unsupported => f.write_str("not supported by the device"),
            ErrorKind::NoSpace => f.write_str("no space left"),
            ErrorKind::Corrupt(why) => write!(f, "damaged data: {why}"),
            ErrorKind::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for BlockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Result of a block operation.
pub type Result<T> = std::result::Result<T, BlockError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_error_names_no_range_and_others_do() {
        let e = crate::FileDev::open(
            std::path::Path::new("/nonexistent/x.img"),
            crate::FileOptions::default(),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.starts_with("open: /nonexistent/x.img: "), "{e}");
        let e = BlockError::new(Op::Read, 4096, 512, ErrorKind::OutOfRange).to_string();
        assert_eq!(
            e,
            "read of 512 bytes at offset 4096: beyond the end of the device"
        );
    }
}
