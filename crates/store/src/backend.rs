//! Where a repository's objects live, as capabilities in rustic_core's
//! manner: [`ReadBackend`] (list, get, ranged get) and, later, a write
//! side (put that never overwrites a finished object, delete). Objects
//! are named by [`Key`]s such as `packs/ab/ab12…cd.pack`; a backend maps
//! them to its own storage (files under a directory here; objects under
//! a prefix in a bucket next).
//!
//! Today the read side is used by [`crate::PackReader`], so restore,
//! serve, verify and gc read packs through it; writers still write files
//! under the target directories (see the issue tracker's store-core
//! work).

use crate::error::{IoContext, Result, StoreError};
use crate::id::PackId;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// An object's name within a backend: `/`-separated, relative.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// The key of pack `id`: `packs/<first two hex digits>/<hex>.pack`.
    pub fn pack(id: PackId) -> Key {
        let hex = id.to_string();
        Key(format!("packs/{}/{hex}.pack", &hex[..2]))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reading objects. Every error names the object (for a directory, its
/// path) and, for damage, the offset.
pub trait ReadBackend: Send + Sync + std::fmt::Debug {
    /// Where `key` is, for messages (a path, or a URL).
    fn locate(&self, key: &Key) -> PathBuf;

    /// Fill `buf` with the object's bytes from `offset`. An object shorter
    /// than that is damage ([`StoreError::Corrupt`]), not an I/O error.
    fn read_at(&self, key: &Key, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// The first `len` bytes of the object, read once (not cached).
    fn read_prefix(&self, key: &Key, len: u64) -> Result<Vec<u8>>;
}

/// Objects kept open at most by a [`LocalDir`] (a big repository has
/// more packs than a process may hold open).
const MAX_OPEN: usize = 256;

/// A directory on a local filesystem: key `a/b` is the file `DIR/a/b`.
/// Objects read by range are kept open (at most [`MAX_OPEN`]).
#[derive(Debug)]
pub struct LocalDir {
    root: PathBuf,
    open: Mutex<HashMap<Key, Arc<File>>>,
}

impl LocalDir {
    /// The backend of directory `root`.
    pub fn new(root: &Path) -> LocalDir {
        LocalDir {
            root: root.to_path_buf(),
            open: Mutex::default(),
        }
    }

    fn file(&self, key: &Key) -> Result<Arc<File>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = open.get(key) {
            return Ok(f.clone());
        }
        if open.len() >= MAX_OPEN {
            open.clear();
        }
        let path = self.locate(key);
        let f = Arc::new(File::open(&path).ctx(&path, "open")?);
        open.insert(key.clone(), f.clone());
        Ok(f)
    }
}

impl ReadBackend for LocalDir {
    fn locate(&self, key: &Key) -> PathBuf {
        self.root.join(key.as_str())
    }

    fn read_at(&self, key: &Key, offset: u64, buf: &mut [u8]) -> Result<()> {
        let f = self.file(key)?;
        f.read_exact_at(buf, offset)
            .map_err(|e| short_or_io(&self.locate(key), offset, e))
    }

    fn read_prefix(&self, key: &Key, len: u64) -> Result<Vec<u8>> {
        let path = self.locate(key);
        let f = File::open(&path).ctx(&path, "open")?;
        let mut data = vec![0u8; len as usize];
        f.read_exact_at(&mut data, 0)
            .map_err(|e| short_or_io(&path, 0, e))?;
        Ok(data)
    }
}

/// A read that ran past the end of an object is damage (it is shorter
/// than the index says); anything else is the system's failure.
fn short_or_io(path: &Path, offset: u64, e: std::io::Error) -> StoreError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        StoreError::corrupt(
            path,
            offset,
            "pack is shorter than the index says (truncated?)",
        )
    } else {
        StoreError::Io {
            path: path.to_path_buf(),
            what: "read",
            source: e,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn pack_keys_match_the_layout_on_disk() {
        let id = PackId::random();
        let dir = Path::new("/t");
        assert_eq!(
            LocalDir::new(dir).locate(&Key::pack(id)),
            crate::pack::pack_path(dir, id)
        );
    }

    #[test]
    fn short_objects_are_damage_and_missing_ones_io_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("packs/aa")).unwrap();
        std::fs::write(dir.path().join("packs/aa/x"), b"0123456789").unwrap();
        let b = LocalDir::new(dir.path());
        let key = Key("packs/aa/x".into());
        let mut buf = [0u8; 4];
        b.read_at(&key, 3, &mut buf).unwrap();
        assert_eq!(&buf, b"3456");
        let e = b.read_at(&key, 8, &mut buf).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        assert!(
            e.to_string().contains("offset 8") || e.to_string().contains('8'),
            "{e}"
        );
        assert_eq!(b.read_prefix(&key, 10).unwrap(), b"0123456789");
        let e = b
            .read_at(&Key("packs/aa/y".into()), 0, &mut buf)
            .unwrap_err();
        assert!(matches!(e, StoreError::Io { .. }), "{e}");
    }
}
