//! The one way records come out of packs. Restore, the served volumes,
//! verify and gc all read through a [`PackReader`]: it knows which
//! backend holds each pack an index names and under which key, checks a
//! pack's header the first time it is read, and reads records or whole
//! packs, a short read being damage named by pack and offset. Decoding is
//! [`crate::pack::decode_record`]'s.
//!
//! It reads through [`ReadBackend`]s (one per target: striping is a
//! backend per disk), never by path, so an object store comes in here.
//! The one other read of a pack, of a pack no index names yet (salvage),
//! is [`read_unindexed`], beside it.

use crate::backend::{Key, ReadBackend};
use crate::error::{Result, StoreError};
use crate::id::{PackId, RepoId};
use crate::index::{ChunkIndex, Location};
use crate::pack::{check_pack_header, PACK_HEADER_LEN};
use crate::repo::Repository;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The whole of a pack no index names yet (salvage, and gc keeping a pack
/// off a trash list), or `None` if it is gone: the one read of a pack
/// that is not through a [`PackReader`], since there is no index entry to
/// read it by.
pub(crate) fn read_unindexed(target: &dyn ReadBackend, id: PackId) -> Result<Option<Vec<u8>>> {
    target.get(&Key::pack(id))
}

/// Where one pack is.
#[derive(Debug)]
struct Place {
    backend: usize,
    key: Key,
    /// Its header was read and is this repository's.
    checked: AtomicBool,
}

/// Reads records from the packs an index names.
#[derive(Debug)]
pub struct PackReader {
    repo: RepoId,
    /// Packs hold sealed records (an encrypted repository).
    sealed: bool,
    /// The repository's keys, for the decoders of what is read.
    crypt: Option<Arc<crate::crypt::Crypt>>,
    backends: Vec<Arc<dyn ReadBackend>>,
    /// Each pack number's place, or why it has none.
    places: Vec<std::result::Result<Place, String>>,
}

impl PackReader {
    /// A reader of the packs `index` names in `repo`.
    pub fn new(repo: &Repository, index: &ChunkIndex) -> PackReader {
        let backends: Vec<Arc<dyn ReadBackend>> = (0..repo.target_count() as u16)
            .filter_map(|t| repo.target(t).ok())
            .map(|t| t.clone() as Arc<dyn ReadBackend>)
            .collect();
        let places = index
            .packs()
            .iter()
            .map(|p| {
                let backend = usize::from(p.target);
                if backend >= backends.len() {
                    return Err(format!(
                        "pack {} names target {}, the repository has {}",
                        p.id,
                        p.target,
                        backends.len()
                    ));
                }
                Ok(Place {
                    backend,
                    key: Key::pack(p.id),
                    checked: AtomicBool::new(false),
                })
            })
            .collect();
        PackReader {
            repo: repo.id(),
            sealed: repo.sealed(),
            crypt: repo.crypt().cloned(),
            backends,
            places,
        }
    }

    fn place(&self, pack: u32) -> Result<(&Place, &dyn ReadBackend)> {
        match self.places.get(pack as usize) {
            Some(Ok(p)) => Ok((p, &*self.backends[p.backend])),
            Some(Err(why)) => Err(StoreError::Invalid(why.clone())),
            None => Err(StoreError::Invalid(format!(
                "index names unknown pack number {pack}"
            ))),
        }
    }

    /// A decoder of the records read (with the repository's keys).
    pub fn record_decoder(&self) -> crate::pack::RecordDecoder {
        crate::pack::RecordDecoder::new(self.crypt.clone())
    }

    /// The repository's keys, if it is encrypted.
    pub fn crypt(&self) -> Option<&crate::crypt::Crypt> {
        self.crypt.as_deref()
    }

    /// The repository's keys, shared.
    pub fn crypt_arc(&self) -> Option<Arc<crate::crypt::Crypt>> {
        self.crypt.clone()
    }

    /// How many readers keep the backends busy per core (see
    /// [`ReadBackend::reads_per_core`]).
    pub fn reads_per_core(&self) -> usize {
        self.backends
            .iter()
            .map(|b| b.reads_per_core())
            .max()
            .unwrap_or(1)
    }

    /// Where pack number `pack` is (a path, for messages).
    pub fn path(&self, pack: u32) -> Result<PathBuf> {
        let (p, b) = self.place(pack)?;
        Ok(b.locate(&p.key))
    }

    /// Read the record at `loc` into `buf` (replacing its contents);
    /// returns its pack's path, for the decoder's errors.
    pub fn read_record(&self, loc: Location, buf: &mut Vec<u8>) -> Result<PathBuf> {
        self.read_span(loc.pack, u64::from(loc.offset), loc.len as usize, buf)
    }

    /// Read `len` bytes of pack `pack` from `offset` into `buf` (replacing
    /// its contents): one record, or several neighbours at once (one
    /// request to a remote store instead of one each); returns the pack's
    /// path, for the decoder's errors.
    pub fn read_span(
        &self,
        pack: u32,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<PathBuf> {
        let (p, b) = self.place(pack)?;
        if !p.checked.load(Ordering::Acquire) {
            let mut header = [0u8; PACK_HEADER_LEN];
            b.read_at(&p.key, 0, &mut header)?;
            check_pack_header(&b.locate(&p.key), &header, self.repo, self.sealed)?;
            p.checked.store(true, Ordering::Release);
        }
        // Every byte is overwritten by the read: only a grown tail is
        // zeroed (a reused buffer is not cleared first).
        buf.resize(len, 0);
        b.read_at(&p.key, offset, buf)?;
        Ok(b.locate(&p.key))
    }

    /// The whole of pack `pack`, `len` bytes (its sealed length), for
    /// verify and gc, which use every record of it once. The header is not
    /// checked here: verify checks it and reports a bad one as damage of
    /// every chunk in the pack.
    pub fn read_pack(&self, pack: u32, len: u64) -> Result<Vec<u8>> {
        let (p, b) = self.place(pack)?;
        b.read_prefix(&p.key, len)
    }
}
