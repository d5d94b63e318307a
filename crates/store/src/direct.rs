//! Writes past the page cache, shared by pack writers and restore.
//!
//! Packs and restored images are written once and fsync'd, so the page
//! cache would only add a copy per byte and a backlog of dirty pages. A
//! second handle with `O_DIRECT` takes the whole, aligned blocks; what is
//! not a whole block goes through the ordinary handle.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Alignment of `O_DIRECT` writes in memory, in the file and in length: a
/// multiple of every logical block size in use (512 B and 4 KiB).
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// A second handle on `file` with `O_DIRECT` (through `/proc/self/fd`, so
/// it works for a file not yet renamed into place); `None` where the
/// filesystem or device refuses it (tmpfs before Linux 6.6, some FUSE and
/// network mounts).
pub(crate) fn reopen_direct(file: &File) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
}

/// Write aligned `blocks` at `at` through `direct`; a device whose blocks
/// are bigger than [`DIRECT_ALIGN`] refuses that (EINVAL), and `buffered`
/// takes them instead.
pub(crate) fn write_blocks_at(
    direct: &File,
    buffered: &File,
    blocks: &[u8],
    at: u64,
) -> std::io::Result<()> {
    match direct.write_all_at(blocks, at) {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => buffered.write_all_at(blocks, at),
        r => r,
    }
}
