//! Reading and decoding records: open pack files, decoder contexts, and
//! the decoded group with its lazily checked chunks.

use cairn_store::crypt::Crypt;
use cairn_store::id::{ChunkId, PREFIX_LEN};
use cairn_store::index::Location;
use cairn_store::pack::RecordDecoder;
use cairn_store::repo::LoadedIndex;
use cairn_store::{PackReader, Repository, StoreError};
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

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

const UNCHECKED: u8 = 0;
const GOOD: u8 = 1;
const BAD: u8 = 2;

/// One chunk of a decoded group.
struct GroupChunk {
    offset: u32,
    len: u32,
    id: ChunkId,
    /// Whether its BLAKE3 has been checked, and the answer.
    state: AtomicU8,
}

/// A decoded record: the group's bytes and its chunk table.
pub(crate) struct Group {
    data: Vec<u8>,
    chunks: Vec<GroupChunk>,
    /// The repository's keys (chunk ids are keyed), if it is encrypted.
    crypt: Option<Arc<Crypt>>,
}

impl Group {
    /// Bytes this group holds in memory (what the cache counts).
    pub(crate) fn bytes(&self) -> usize {
        self.data.capacity()
            + self.chunks.capacity() * std::mem::size_of::<GroupChunk>()
            + std::mem::size_of::<Group>()
    }

    /// The chunk at group offset `slice`, `len` bytes long, whose id
    /// starts with `prefix`; its BLAKE3 is checked the first time it is
    /// asked for. `Err` says what is wrong.
    pub(crate) fn chunk(
        &self,
        slice: u32,
        len: u32,
        prefix: &[u8; PREFIX_LEN],
    ) -> Result<&[u8], String> {
        let c = self
            .chunks
            .binary_search_by_key(&slice, |c| c.offset)
            .ok()
            .and_then(|i| self.chunks.get(i))
            .ok_or_else(|| format!("the record holds no chunk at group offset {slice}"))?;
        if c.len != len || c.id.prefix() != *prefix {
            return Err(format!(
                "the record holds chunk {} of {} bytes at group offset {slice}, not this one of {len}",
                c.id, c.len
            ));
        }
        let data = self
            .data
            .get(slice as usize..slice as usize + len as usize)
            .ok_or_else(|| format!("chunk runs past the {}-byte group", self.data.len()))?;
        let ok = match c.state.load(Ordering::Acquire) {
            GOOD => true,
            BAD => false,
            _ => {
                // Two threads may hash the same chunk at once; both get
                // the same answer, so no lock is needed.
                let ok = cairn_store::crypt::chunk_id(self.crypt.as_deref(), data) == c.id;
                c.state
                    .store(if ok { GOOD } else { BAD }, Ordering::Release);
                ok
            }
        };
        if ok {
            Ok(data)
        } else {
            Err("decoded bytes do not hash to the chunk id".into())
        }
    }
}

/// A record read buffer and decoder contexts, reused between loads.
struct Scratch {
    rec: Vec<u8>,
    dec: RecordDecoder,
}

/// Reads and decodes records from the packs of one repository, through
/// the store's one [`PackReader`].
pub(crate) struct Packs {
    index: Arc<LoadedIndex>,
    reader: PackReader,
    scratch: Mutex<Vec<Scratch>>,
}

impl Packs {
    pub(crate) fn new(repo: Arc<Repository>, index: Arc<LoadedIndex>) -> Packs {
        Packs {
            reader: PackReader::new(&repo, &index.index),
            index,
            scratch: Mutex::default(),
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
            .unwrap_or_else(|| Scratch {
                rec: Vec::new(),
                dec: self.reader.record_decoder(),
            });
        let out = self.decode(loc, &mut s);
        self.scratch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s);
        out
    }

    fn decode(&self, loc: Location, s: &mut Scratch) -> Result<Group, GroupError> {
        let at = u64::from(loc.offset);
        let path = self.reader.read_record(loc, &mut s.rec)?;
        let mut data = Vec::new();
        let rec = s.dec.decode(&path, at, &s.rec, &mut data)?;
        data.shrink_to_fit();
        let chunks = rec
            .chunks()
            .map(|(id, offset, len)| GroupChunk {
                offset,
                len,
                id,
                state: AtomicU8::new(UNCHECKED),
            })
            .collect();
        Ok(Group {
            data,
            chunks,
            crypt: self.reader.crypt_arc(),
        })
    }
}
