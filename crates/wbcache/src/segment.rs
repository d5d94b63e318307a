//! Segments in memory: the open one being filled, sealed ones waiting
//! for the flusher, written ones waiting for writeback, and the index
//! entry saying where a block's newest version is.

use super::{Entry, BU, SEGMENT_BYTES};
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeSet;

/// One block of a segment in memory. `data` is the block's index among
/// the segment's data blocks (None: a zero entry).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    pub(crate) lba: u64,
    pub(crate) dirty: u8,
    pub(crate) data: Option<u16>,
    pub(crate) trim: bool,
}

impl Meta {
    /// A block that reads as zeroes (from write-zeroes, or a trim).
    pub(crate) fn zero(lba: u64, trim: bool) -> Meta {
        Meta {
            lba,
            dirty: 0xff,
            data: None,
            trim,
        }
    }
}

/// Where a block's newest version is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Loc {
    pub(crate) seg: u64,
    pub(crate) data: Option<u16>,
    pub(crate) dirty: u8,
    pub(crate) trim: bool,
}

/// The segment being filled in RAM. `buf` is the segment image being
/// built: a header block (written at sealing) followed by the data blocks;
/// data indexes are into those blocks (a zero entry that replaced data
/// leaves its block unused until sealing compacts).
pub(crate) struct OpenSeg {
    pub(crate) id: u64,
    pub(crate) entries: Vec<Meta>,
    pub(crate) map: HashMap<u64, usize>,
    pub(crate) buf: Vec<u8>,
    /// Entries changed since the last plog record (plog mode only).
    pub(crate) pending: BTreeSet<usize>,
}

/// A buffer for an open segment: a reused one (`spare`) or a new one,
/// with room for a whole segment so that filling it never moves it.
pub(crate) fn segment_buf(spare: &mut Vec<Vec<u8>>) -> Vec<u8> {
    let mut b = spare
        .pop()
        .unwrap_or_else(|| Vec::with_capacity(SEGMENT_BYTES as usize));
    b.clear();
    b.resize(BU, 0);
    b
}

impl OpenSeg {
    /// An empty open segment over `buf` (from [`segment_buf`]).
    pub(crate) fn with_buf(id: u64, buf: Vec<u8>) -> OpenSeg {
        OpenSeg {
            id,
            entries: Vec::new(),
            map: HashMap::default(),
            buf,
            pending: BTreeSet::new(),
        }
    }

    pub(crate) fn data_used(&self) -> usize {
        self.buf.len() / BU - 1
    }

    /// Data block `d`.
    pub(crate) fn block(&self, d: u16) -> &[u8] {
        let at = (1 + usize::from(d)) * BU;
        &self.buf[at..at + BU]
    }

    pub(crate) fn block_mut(&mut self, d: u16) -> &mut [u8] {
        let at = (1 + usize::from(d)) * BU;
        &mut self.buf[at..at + BU]
    }

    /// Append a data block and return its index.
    pub(crate) fn push_block(&mut self, b: &[u8]) -> u16 {
        self.buf.extend_from_slice(b);
        (self.data_used() - 1) as u16
    }

    /// Put a block replayed from the plog (None: a zero block), replacing
    /// this segment's version of it; the caller checked there is room.
    pub(crate) fn put_replayed(
        &mut self,
        e: &Entry,
        block: Option<&[u8]>,
        index: &mut HashMap<u64, Loc>,
    ) {
        let old = self.map.get(&e.lba).copied();
        let data = block.map(|b| match old.and_then(|i| self.entries[i].data) {
            Some(d) => {
                self.block_mut(d).copy_from_slice(b);
                d
            }
            None => self.push_block(b),
        });
        let m = Meta {
            lba: e.lba,
            dirty: e.dirty,
            data,
            trim: false,
        };
        match old {
            Some(i) => self.entries[i] = m,
            None => {
                self.map.insert(e.lba, self.entries.len());
                self.entries.push(m);
            }
        }
        index.insert(
            e.lba,
            Loc {
                seg: self.id,
                data,
                dirty: e.dirty,
                trim: false,
            },
        );
    }
}

/// A sealed segment: its image (header + data) and entries with compacted
/// data indexes.
pub(crate) struct Sealed {
    pub(crate) id: u64,
    pub(crate) image: Vec<u8>,
    pub(crate) entries: Vec<Meta>,
}

/// A segment on the cache device that is not written back yet.
pub(crate) struct Written {
    pub(crate) id: u64,
    pub(crate) entries: Vec<Meta>,
}
