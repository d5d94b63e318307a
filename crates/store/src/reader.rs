//! The one way records come out of packs. Restore, the served volumes
//! and verify all read through a [`PackReader`]: it knows where each pack
//! named by an index lives, keeps a bounded set of them open (their
//! headers checked once), and reads records or whole packs, turning a
//! short read into damage named by pack and offset. Decoding is
//! [`crate::pack::decode_record`]'s.
//!
//! This is the seam where a storage backend other than local files
//! (striped directories today; an object store later, with ranged reads)
//! comes in: callers ask for a record by its [`Location`], never for a
//! path to open.

use crate::error::{IoContext, Result, StoreError};
use crate::id::RepoId;
use crate::index::{ChunkIndex, Location};
use crate::pack::{check_pack_header, PACK_HEADER_LEN};
use crate::repo::Repository;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// Packs kept open at most (a big repository has more packs than a
/// process may hold open).
const MAX_OPEN: usize = 256;

/// Reads records from the packs an index names.
#[derive(Debug)]
pub struct PackReader {
    repo: RepoId,
    /// Each pack number's path, or why it has none.
    paths: Vec<std::result::Result<PathBuf, String>>,
    open: Mutex<HashMap<u32, Arc<File>>>,
}

impl PackReader {
    /// A reader of the packs `index` names in `repo`.
    pub fn new(repo: &Repository, index: &ChunkIndex) -> PackReader {
        let paths = index
            .packs()
            .iter()
            .map(|p| repo.pack_path(p).map_err(|e| e.to_string()))
            .collect();
        PackReader {
            repo: repo.id(),
            paths,
            open: Mutex::default(),
        }
    }

    /// The path of pack number `pack`.
    pub fn path(&self, pack: u32) -> Result<&Path> {
        match self.paths.get(pack as usize) {
            Some(Ok(p)) => Ok(p),
            Some(Err(why)) => Err(StoreError::Invalid(why.clone())),
            None => Err(StoreError::Invalid(format!(
                "index names unknown pack number {pack}"
            ))),
        }
    }

    /// Pack `pack`, opened (and its header checked) if it is not open.
    fn file(&self, pack: u32) -> Result<(Arc<File>, &Path)> {
        let path = self.path(pack)?;
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = open.get(&pack) {
            return Ok((f.clone(), path));
        }
        if open.len() >= MAX_OPEN {
            open.clear();
        }
        let f = File::open(path).ctx(path, "open pack")?;
        let mut header = [0u8; PACK_HEADER_LEN];
        f.read_exact_at(&mut header, 0)
            .map_err(|e| short_or_io(path, 0, e))?;
        check_pack_header(path, &header, self.repo)?;
        let f = Arc::new(f);
        open.insert(pack, f.clone());
        Ok((f, path))
    }

    /// Read the record at `loc` into `buf` (replacing its contents);
    /// returns its pack's path, for the decoder's errors.
    pub fn read_record(&self, loc: Location, buf: &mut Vec<u8>) -> Result<&Path> {
        let (file, path) = self.file(loc.pack)?;
        let at = u64::from(loc.offset);
        buf.clear();
        buf.resize(loc.len as usize, 0);
        file.read_exact_at(buf, at)
            .map_err(|e| short_or_io(path, at, e))?;
        Ok(path)
    }

    /// The whole of pack `pack`, `len` bytes (its sealed length), for
    /// verify, which reads every record of it once. The header is not
    /// checked here: verify checks it and reports a bad one as damage of
    /// every chunk in the pack. The pack is not kept open.
    pub fn read_pack(&self, pack: u32, len: u64) -> Result<Vec<u8>> {
        let path = self.path(pack)?;
        let file = File::open(path).ctx(path, "open pack")?;
        let mut data = vec![0u8; len as usize];
        file.read_exact_at(&mut data, 0)
            .map_err(|e| short_or_io(path, 0, e))?;
        Ok(data)
    }
}

/// A read that ran past the end of a pack is damage (the pack is shorter
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
