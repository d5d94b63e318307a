//! Loading records for a served image through the store's one
//! [`PackReader`], with a pool of decoder buffers, and what a failed load
//! tells its waiters ([`GroupError`]).

use cairn_store::{
    GroupBuffers, GroupScratch, LoadedIndex, Location, PackReader, Repository, StoreError,
};
use std::io;
use std::sync::{Arc, Mutex};

pub(crate) use cairn_store::Group;

/// Why a record could not be used. Cloneable, because every reader
/// waiting on the same record gets the same answer.
#[derive(Debug, Clone)]
pub(crate) struct GroupError {
    /// `None`: the stored data is damaged or missing; `Some`: the
    /// operating system failed.
    pub io: Option<io::ErrorKind>,
    /// What happened, with the pack path and offset.
    pub msg: String,
}

impl GroupError {
    fn corrupt(msg: impl Into<String>) -> GroupError {
        GroupError {
            io: None,
            msg: msg.into(),
        }
    }
}

impl From<StoreError> for GroupError {
    fn from(e: StoreError) -> GroupError {
        match &e {
            // A pack the index names but that is gone is damage, not an
            // I/O failure: retrying will not bring it back.
            StoreError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                GroupError::corrupt(format!("pack is missing: {e}"))
            }
            StoreError::Io { source, .. } => GroupError {
                io: Some(source.kind()),
                msg: e.to_string(),
            },
            _ => GroupError::corrupt(e.to_string()),
        }
    }
}

/// Reads and decodes records from the packs of one repository, through
/// the store's one [`PackReader`].
pub(crate) struct Packs {
    index: Arc<LoadedIndex>,
    reader: PackReader,
    scratch: Mutex<Vec<GroupScratch>>,
    /// Byte buffers of evicted groups, for the next decodes.
    buffers: Arc<GroupBuffers>,
}

/// Bytes of free group buffers kept for reuse (16 of the default 2 MiB
/// groups), besides what the caches hold.
const SPARE_GROUP_BYTES: usize = 32 << 20;

impl Packs {
    pub(crate) fn new(repo: Arc<Repository>, index: Arc<LoadedIndex>) -> Packs {
        Packs {
            reader: PackReader::new(&repo, &index.index),
            index,
            scratch: Mutex::default(),
            buffers: GroupBuffers::new(SPARE_GROUP_BYTES),
        }
    }

    pub(crate) fn index(&self) -> &LoadedIndex {
        &self.index
    }

    /// Read, check (CRC, lengths) and decode the record at `loc`.
    pub(crate) fn load(&self, loc: Location) -> Result<Group, GroupError> {
        let mut s = self
            .scratch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_else(|| self.reader.scratch(Some(self.buffers.clone())));
        let out = self.reader.load_group(loc, &mut s);
        self.scratch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s);
        Ok(out?)
    }
}
