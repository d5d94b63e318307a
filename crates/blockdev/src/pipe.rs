//! Pipes cairn reads or writes a stream through, grown so that each side
//! moves a megabyte per wake-up instead of 64 KiB.
//!
//! A pipe holds 64 KiB by default: a reader that wants a megabyte (a
//! segment of a gzip member, a restore's 8 MiB batch on the other side)
//! waits for sixteen refills, each a switch to the writer and back.
//! `cat F.gz | cairn unpack -c > F` of a 604 MB image took 0.69 s against
//! 0.79 s before; `cairn restore - | cat` 0.39 s against 0.46 s, with the
//! other changes of that build (docs/benchmarks.md, "Pipes grown to a
//! megabyte").

use std::os::fd::AsFd;

/// What a pipe is grown to: the largest size an unprivileged process may
/// set by default (`/proc/sys/fs/pipe-max-size`).
pub const PIPE_BYTES: usize = 1 << 20;

/// If `fd` is a pipe holding less than [`PIPE_BYTES`], grow it to that;
/// returns the pipe's size afterwards, `None` when `fd` is no pipe. Best
/// effort: a pipe that cannot grow (a lowered `pipe-max-size`, a user over
/// `pipe-user-pages-soft`) keeps its size, which only costs speed.
pub fn grow_pipe(fd: impl AsFd) -> Option<usize> {
    let fd = fd.as_fd();
    let stat = rustix::fs::fstat(fd).ok()?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Fifo {
        return None;
    }
    let size = rustix::pipe::fcntl_getpipe_size(fd).ok()?;
    if size >= PIPE_BYTES {
        return Some(size);
    }
    Some(rustix::pipe::fcntl_setpipe_size(fd, PIPE_BYTES).unwrap_or(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_grows_to_a_megabyte_and_nothing_else_is_touched() {
        let (r, w) = rustix::pipe::pipe().unwrap();
        assert!(rustix::pipe::fcntl_getpipe_size(&r).unwrap() < PIPE_BYTES);
        assert_eq!(grow_pipe(&w), Some(PIPE_BYTES));
        // Both ends are one pipe.
        assert_eq!(rustix::pipe::fcntl_getpipe_size(&r).unwrap(), PIPE_BYTES);
        // Already grown: left as it is.
        assert_eq!(grow_pipe(&r), Some(PIPE_BYTES));
        let file = tempfile::tempfile().unwrap();
        assert_eq!(grow_pipe(&file), None);
    }
}
