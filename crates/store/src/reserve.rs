//! The reserve: space a local repository keeps allocated on its disk so
//! that the commands that free space can still run once backups have
//! filled it (borg's `additional_free_space`, ZFS's slop space).
//!
//! A backup that fills the disk fails with ENOSPC and leaves a partial
//! pack; then `gc` cannot write the trash list or index files it needs
//! before it deletes anything, and nothing frees space (found from
//! outside, 2026-11-28). So `init` writes `REPO/reserve` (16 MiB by
//! default, `--reserve`), which no backup ever touches. `rm`, `forget`,
//! `gc` and `repair` that meet a full disk release it (truncate the file
//! to its header) and go on; `gc` refills it once it has freed space.
//! S3 repositories have none (a bucket does not fill).
//!
//! File: magic `CAIRNRSV`, version (u32 LE, 1), 4 reserved bytes, the
//! reserve's size in bytes (u64 LE, the whole file's length when full),
//! CRC-32C of the 24 bytes before it (u32 LE), then zeros to the size.
//! Written through a temporary file, synced and renamed, so a crash
//! leaves either no reserve, a released one or a whole one.

use crate::error::{IoContext, Result, StoreError};
use crate::meta::sync_dir;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

/// The reserve's file in the repository's root.
pub const RESERVE_FILE: &str = "reserve";
/// The reserve `init` makes unless told otherwise.
pub const DEFAULT_RESERVE: u64 = 16 << 20;
const MAGIC: &[u8; 8] = b"CAIRNRSV";
const HEADER: usize = 28;

fn header(size: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&1u32.to_le_bytes());
    h[16..24].copy_from_slice(&size.to_le_bytes());
    let crc = crc32c::crc32c(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The reserve's intended size and the bytes it holds now (None: the
/// repository has no reserve).
pub(crate) fn read(root: &Path) -> Result<Option<(u64, u64)>> {
    let path = root.join(RESERVE_FILE);
    let mut f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).ctx(&path, "open"),
    };
    let len = f.metadata().ctx(&path, "stat")?.len();
    let mut h = [0u8; HEADER];
    std::io::Read::read_exact(&mut f, &mut h).ctx(&path, "read")?;
    let mut size = [0u8; 8];
    size.copy_from_slice(&h[16..24]);
    let size = u64::from_le_bytes(size);
    if &h[..8] != MAGIC || header(size) != h {
        return Err(StoreError::Corrupt {
            path,
            offset: 0,
            reason: "not a reserve header".into(),
        });
    }
    Ok(Some((size, len)))
}

/// Check the reserve: its header, and with `contents` that the rest is
/// zeros (a byte that is not is damage the disk did: the file holds no
/// data, but what changed it may change files that do).
pub(crate) fn check(root: &Path, contents: bool) -> Result<()> {
    let Some((_, len)) = read(root)? else {
        return Ok(());
    };
    if !contents {
        return Ok(());
    }
    let path = root.join(RESERVE_FILE);
    let mut f = File::open(&path).ctx(&path, "open")?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        let n = std::io::Read::read(&mut f, &mut buf).ctx(&path, "read")?;
        if n == 0 {
            break;
        }
        let from = if at == 0 { HEADER.min(n) } else { 0 };
        if let Some(i) = buf[from..n].iter().position(|&b| b != 0) {
            return Err(StoreError::Corrupt {
                path,
                offset: at + (from + i) as u64,
                reason: "the reserve holds a byte that is not zero (the disk changed it)".into(),
            });
        }
        at += n as u64;
    }
    Ok(())
}

/// Bytes free for an unprivileged writer on the file system of `root`.
pub fn free_space(root: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(root.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` points to writable
    // memory of the struct's size; statvfs writes it only on success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // (u64 on 64-bit Linux, narrower elsewhere.)
    #[allow(clippy::useless_conversion)]
    Some(u64::from(st.f_bavail) * u64::from(st.f_frsize))
}

/// Append zeros to `f` from `from` up to `to` bytes.
fn fill(f: &mut File, from: u64, to: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; 1 << 20];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        f.write_all(&zeros[..n])?;
        at += n as u64;
    }
    f.sync_all()
}

/// Make a reserve of `size` bytes in `root` (init). A disk without room
/// for it is an error that says how to ask for less.
pub(crate) fn create(root: &Path, size: u64) -> Result<()> {
    match write_whole(root, size)? {
        true => Ok(()),
        false => Err(StoreError::Invalid(format!(
            "{}: no room for the repository's reserve of {size} bytes (space kept so that \
             gc can run on a full disk); give init a smaller --reserve, or 0 for none",
            root.display()
        ))),
    }
}

/// Write a whole reserve of `size` bytes through a temporary file;
/// `Ok(false)` when the disk has no room (nothing is left behind).
fn write_whole(root: &Path, size: u64) -> Result<bool> {
    let size = size.max(HEADER as u64);
    let tmp = root.join(format!(".{RESERVE_FILE}.tmp"));
    let made = (|| {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&header(size))?;
        fill(&mut f, HEADER as u64, size)
    })();
    if let Err(e) = made {
        let _ = fs::remove_file(&tmp);
        if e.raw_os_error() == Some(libc::ENOSPC) {
            return Ok(false);
        }
        return Err(e).ctx(&tmp, "write");
    }
    let path = root.join(RESERVE_FILE);
    fs::rename(&tmp, &path).ctx(&path, "rename into place")?;
    sync_dir(root)?;
    Ok(true)
}

/// Give the reserve's space back to the disk (truncate it to its
/// header). The bytes released, 0 if there was none or it was released.
pub(crate) fn release(root: &Path) -> Result<u64> {
    let Some((_, len)) = read(root)? else {
        return Ok(0);
    };
    if len <= HEADER as u64 {
        return Ok(0);
    }
    let path = root.join(RESERVE_FILE);
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .ctx(&path, "open")?;
    f.set_len(HEADER as u64).ctx(&path, "truncate")?;
    f.sync_all().ctx(&path, "fsync")?;
    Ok(len - HEADER as u64)
}

/// Fill a released reserve up to its size again. `Ok(false)` when the
/// disk has no room for it (it stays released), `Ok(true)` when it is
/// whole (or the repository has none).
pub(crate) fn refill(root: &Path) -> Result<bool> {
    let (size, len) = match read(root) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(true),
        // A damaged header: the file holds no data, so it is written anew
        // (at its length, or the default when that is gone too).
        Err(StoreError::Corrupt { .. }) => {
            let path = root.join(RESERVE_FILE);
            let len = fs::metadata(&path).ctx(&path, "stat")?.len();
            let size = if len > HEADER as u64 {
                len
            } else {
                DEFAULT_RESERVE
            };
            return write_whole(root, size);
        }
        Err(e) => return Err(e),
    };
    if len >= size {
        // Whole: rewritten only if the disk changed a byte of it.
        return match check(root, true) {
            Err(StoreError::Corrupt { .. }) => write_whole(root, size),
            other => other.map(|()| true),
        };
    }
    let path = root.join(RESERVE_FILE);
    let mut f = OpenOptions::new()
        .append(true)
        .open(&path)
        .ctx(&path, "open")?;
    match fill(&mut f, len, size) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
            f.set_len(HEADER as u64).ctx(&path, "truncate")?;
            f.sync_all().ctx(&path, "fsync")?;
            Ok(false)
        }
        Err(e) => Err(e).ctx(&path, "write"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_reserve_is_made_released_and_refilled() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(read(root).unwrap(), None);
        assert_eq!(release(root).unwrap(), 0);
        assert!(refill(root).unwrap());
        create(root, 3 << 20).unwrap();
        assert_eq!(read(root).unwrap(), Some((3 << 20, 3 << 20)));
        assert_eq!(release(root).unwrap(), (3 << 20) - HEADER as u64);
        assert_eq!(read(root).unwrap(), Some((3 << 20, HEADER as u64)));
        assert_eq!(release(root).unwrap(), 0);
        assert!(refill(root).unwrap());
        assert_eq!(read(root).unwrap(), Some((3 << 20, 3 << 20)));
        check(root, true).unwrap();
        assert!(free_space(root).is_some_and(|f| f > 0));
        assert_eq!(free_space(&root.join("missing")), None);
        let path = root.join(RESERVE_FILE);
        let mut b = fs::read(&path).unwrap();
        b[2 << 20] = 1;
        fs::write(&path, &b).unwrap();
        check(root, false).unwrap();
        assert!(check(root, true).is_err());
        b[2 << 20] = 0;
        fs::write(&path, &b).unwrap();
        // A damaged header is an error, not a reserve of any size; gc's
        // refill writes it anew.
        let mut b = fs::read(&path).unwrap();
        b[17] ^= 1;
        fs::write(&path, &b).unwrap();
        assert!(read(root).is_err());
        assert!(refill(root).unwrap());
        assert_eq!(read(root).unwrap(), Some((3 << 20, 3 << 20)));
    }
}
