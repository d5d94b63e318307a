//! The offset → chunk table of one image.

use cairn_store::ChunkIndex;
use cairn_store::{Extent, Manifest, Result, StoreError};

/// Position value of a hole.
pub(crate) const HOLE: u32 = u32::MAX;
/// Position value of a data extent whose chunk the index does not know.
pub(crate) const MISSING: u32 = u32::MAX - 1;

/// Extent start offsets and, per extent, the chunk's position in the
/// sorted [`ChunkIndex`] (or [`HOLE`] / [`MISSING`]): 12 bytes an extent,
/// in two flat vectors so there is no padding. The location, id prefix
/// and length of a chunk are all derived from these on demand.
pub(crate) struct ExtentMap {
    /// `starts[k]` is where extent `k` begins; one more entry holds the
    /// image size, so extent `k` ends at `starts[k + 1]`.
    starts: Vec<u64>,
    pos: Vec<u32>,
}

impl ExtentMap {
    /// Build the table of `m`, looking every chunk up in `index` once.
    pub(crate) fn build(m: &Manifest, index: &ChunkIndex) -> Result<ExtentMap> {
        if index.len() >= MISSING as usize {
            return Err(StoreError::Invalid(format!(
                "the index holds {} chunks; a volume can address at most {}",
                index.len(),
                MISSING
            )));
        }
        let mut starts = Vec::with_capacity(m.extents.len() + 1);
        let mut pos = Vec::with_capacity(m.extents.len());
        for (off, e) in m.with_offsets() {
            starts.push(off);
            pos.push(match e {
                Extent::Hole { .. } => HOLE,
                // Fits: checked against the index length above.
                Extent::Data { id, .. } => index.position(id).map_or(MISSING, |p| p as u32),
            });
        }
        starts.push(m.size);
        Ok(ExtentMap { starts, pos })
    }

    /// Number of extents.
    pub(crate) fn len(&self) -> usize {
        self.pos.len()
    }

    /// The extent holding byte `offset` (which must be below the size).
    pub(crate) fn find(&self, offset: u64) -> usize {
        // starts[0] is 0 and extents are never empty, so this is >= 1.
        self.starts
            .partition_point(|&s| s <= offset)
            .saturating_sub(1)
    }

    /// Start offset of extent `k` (`k == len()` gives the image size).
    pub(crate) fn start(&self, k: usize) -> u64 {
        self.starts[k]
    }

    /// End offset of extent `k`.
    pub(crate) fn end(&self, k: usize) -> u64 {
        self.starts[k + 1]
    }

    /// Index position of extent `k`, or [`HOLE`] / [`MISSING`].
    pub(crate) fn pos(&self, k: usize) -> u32 {
        self.pos[k]
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.starts.capacity() * 8 + self.pos.capacity() * 4
    }
}
