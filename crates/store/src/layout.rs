//! Where every chunk of an intact local repository lives: each place in an
//! image that uses it, the record (in a pack file) that holds it, and the
//! index file that names each pack. Read through the library, for the
//! damage tests and fixtures that plant damage in one file and predict
//! which places it must reach (`internals`; not part of the face).

use crate::error::{Result, StoreError};
use crate::id::ChunkId;
use crate::index::IndexFile;
use crate::manifest::Extent;
use crate::repo::Repository;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A place in an image where a chunk is used.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Place {
    /// The image's name.
    pub image: String,
    /// The snapshot.
    pub snap: u64,
    /// Byte offset in the image.
    pub offset: u64,
    /// Bytes of the chunk.
    pub len: u64,
}

/// A record (a group of chunks compressed together) in a pack file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordAt {
    /// The pack file.
    pub pack: PathBuf,
    /// The record's offset in it.
    pub offset: u64,
    /// The record's length.
    pub len: u64,
}

/// What an intact repository holds, and where.
#[derive(Debug, Default)]
pub struct Layout {
    /// Every chunk with the places that use it.
    pub places: BTreeMap<ChunkId, Vec<Place>>,
    /// The record holding each chunk.
    pub records: BTreeMap<ChunkId, RecordAt>,
    /// The index file that names each pack file.
    pub index_of: BTreeMap<PathBuf, PathBuf>,
}

impl Layout {
    /// Read the layout of the local repository `repo`; an error where any
    /// of it is damaged (a damaged index file, a chunk no index names).
    pub fn read(repo: &Repository) -> Result<Layout> {
        let loaded = repo.load_index()?;
        loaded.check_read()?;
        if let Some(e) = loaded.damaged.into_iter().next() {
            return Err(e);
        }
        let mut layout = Layout::default();
        for (name, snaps) in repo.images()? {
            for snap in snaps {
                let m = repo.read_manifest(&name, snap)?;
                for (offset, e) in m.with_offsets() {
                    let Extent::Data { len, id } = *e else {
                        continue;
                    };
                    layout.places.entry(id).or_default().push(Place {
                        image: name.clone(),
                        snap,
                        offset,
                        len: u64::from(len),
                    });
                    let loc = loaded
                        .index
                        .get(&id)
                        .ok_or(StoreError::MissingChunk { chunk: id, offset })?;
                    let pack = loaded.index.pack(loc.pack).ok_or_else(|| {
                        StoreError::Invalid(format!("chunk {id}: its pack is in no index"))
                    })?;
                    let record = RecordAt {
                        pack: repo.pack_path(pack)?,
                        offset: u64::from(loc.offset),
                        len: u64::from(loc.len),
                    };
                    layout.records.insert(id, record);
                }
            }
        }
        for key in repo.index_files()? {
            let path = repo.locate(&key);
            let bytes = std::fs::read(&path).map_err(|source| StoreError::Io {
                path: path.clone(),
                what: "read",
                source,
            })?;
            for p in &IndexFile::decode(&path, &bytes)?.packs {
                layout.index_of.insert(repo.pack_path(p)?, path.clone());
            }
        }
        Ok(layout)
    }

    /// Every place that uses any of `chunks`.
    pub fn places_of<'a>(&self, chunks: impl IntoIterator<Item = &'a ChunkId>) -> BTreeSet<Place> {
        chunks
            .into_iter()
            .filter_map(|id| self.places.get(id))
            .flatten()
            .cloned()
            .collect()
    }

    /// The chunks record `rec` holds: a damaged record loses them all.
    pub fn chunks_of(&self, rec: &RecordAt) -> Vec<ChunkId> {
        self.records
            .iter()
            .filter(|(_, r)| *r == rec)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The chunks whose record lies (partly) at or after `cut` in `pack`.
    pub fn chunks_in(&self, pack: &Path, cut: u64) -> Vec<ChunkId> {
        self.records
            .iter()
            .filter(|(_, r)| r.pack == pack && r.offset + r.len > cut)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The records of `pack`, in order.
    pub fn records_in(&self, pack: &Path) -> Vec<RecordAt> {
        let set: BTreeSet<&RecordAt> = self.records.values().filter(|r| r.pack == pack).collect();
        set.into_iter().cloned().collect()
    }

    /// Every pack file that holds a chunk.
    pub fn packs(&self) -> BTreeSet<PathBuf> {
        self.records.values().map(|r| r.pack.clone()).collect()
    }
}
