//! The write-back cache a writable image's overlay is bound to
//! (`docs/format/overlay.md`, "Cache binding").
//!
//! A cache in front of a writable image holds writes that are not yet in
//! the overlay. If the server dies, those writes are only in the cache's
//! log: a commit of the overlay alone would make a snapshot without them,
//! and a serve of the image without the cache would take writes the cache
//! later puts its older blocks over. So while a cache is in front of the
//! image, the overlay says which one (file `cache` in its directory), and
//! every opener of the image without that cache refuses.

use cairn_store::{sync_dir, StoreError};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"CAIRNOCB";
const VERSION: u32 = 1;
const FILE: &str = "cache";

/// The cache an overlay is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheBinding {
    /// The cache's id (from its superblock).
    pub cache_id: [u8; 16],
    /// Where the cache was when it was bound (to name it in messages).
    pub path: PathBuf,
}

fn io(path: &Path, what: &'static str, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

impl CacheBinding {
    fn encode(&self) -> Vec<u8> {
        let path = self.path.to_string_lossy();
        let path = path.as_bytes();
        let len = path.len().min(u16::MAX as usize);
        let mut b = Vec::with_capacity(34 + len);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.cache_id);
        b.extend_from_slice(&(len as u16).to_le_bytes());
        b.extend_from_slice(&path[..len]);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(file: &Path, b: &[u8]) -> cairn_store::Result<CacheBinding> {
        let bad = |why: &str| {
            StoreError::Invalid(format!(
                "{}: damaged cache binding ({why}); it named the write-back cache that may hold \
                 writes not yet in this overlay (`cairn cache status --cache C` shows what a \
                 cache is in front of): drain that cache with `cairn cache drain --image`, then \
                 remove this file, or remove it to give those writes up",
                file.display()
            ))
        };
        if b.len() < 34 || &b[..8] != MAGIC {
            return Err(bad("magic"));
        }
        let crc = u32::from_le_bytes([
            b[b.len() - 4],
            b[b.len() - 3],
            b[b.len() - 2],
            b[b.len() - 1],
        ]);
        if crc32c::crc32c(&b[..b.len() - 4]) != crc {
            return Err(bad("checksum"));
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if version != VERSION {
            return Err(StoreError::Invalid(format!(
                "{}: cache binding of version {version}, this cairn reads version {VERSION}",
                file.display()
            )));
        }
        let mut cache_id = [0u8; 16];
        cache_id.copy_from_slice(&b[12..28]);
        let len = usize::from(u16::from_le_bytes([b[28], b[29]]));
        if 30 + len + 4 != b.len() {
            return Err(bad("length"));
        }
        Ok(CacheBinding {
            cache_id,
            path: PathBuf::from(String::from_utf8_lossy(&b[30..30 + len]).into_owned()),
        })
    }

    /// The cache id in hex, for messages.
    pub fn id_hex(&self) -> String {
        self.cache_id.iter().map(|x| format!("{x:02x}")).collect()
    }
}

/// The binding of the overlay in `dir` (None: no cache is bound).
pub(crate) fn read(dir: &Path) -> cairn_store::Result<Option<CacheBinding>> {
    let file = dir.join(FILE);
    match std::fs::read(&file) {
        Ok(b) => CacheBinding::decode(&file, &b).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&file, "read the cache binding", e)),
    }
}

/// Bind the overlay in `dir` to `b`, durably (a temporary file synced,
/// renamed over, the directory synced).
pub(crate) fn write(dir: &Path, b: &CacheBinding) -> cairn_store::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, "create", e))?;
    f.write_all(&b.encode())
        .and_then(|()| f.sync_all())
        .map_err(|e| io(&tmp, "write", e))?;
    let file = dir.join(FILE);
    std::fs::rename(&tmp, &file).map_err(|e| io(&file, "rename into place", e))?;
    sync_dir(dir)
}

/// Remove the binding of the overlay in `dir`, durably.
pub(crate) fn remove(dir: &Path) -> cairn_store::Result<()> {
    let file = dir.join(FILE);
    match std::fs::remove_file(&file) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(&file, "remove the cache binding", e)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_binding_round_trips_and_damage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let b = CacheBinding {
            cache_id: [7; 16],
            path: PathBuf::from("/dev/fast"),
        };
        write(dir.path(), &b).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(b.clone()));
        let file = dir.path().join(FILE);
        let good = std::fs::read(&file).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 1;
            std::fs::write(&file, &bad).unwrap();
            assert!(read(dir.path()).is_err(), "byte {i}");
        }
        std::fs::write(&file, &good[..good.len() - 1]).unwrap();
        assert!(read(dir.path()).is_err());
        remove(dir.path()).unwrap();
        remove(dir.path()).unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
    }
}
