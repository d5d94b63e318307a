//! Snapshot manifests: what an image is made of.
//!
//! `REPO/snapshots/<NAME>/<SNAPSHOT>.snap`, SNAPSHOT a zero-padded decimal
//! number counting up from 1 per image; a metadata envelope of kind 4,
//! body version 1:
//!
//! ```text
//! str16 name, u64 snapshot, i64 created (Unix seconds), u64 logical size,
//! str16 chunker, str16 codec, str16 source,
//! u64 chunks, u64 new chunks, u64 zero bytes, u64 new raw bytes,
//! u64 new stored bytes, u64 backup time in milliseconds,
//! u64 N, N × extent:
//!   0x00, u32 length, chunk id [32]     data
//!   0x01, u64 length                    hole (zeros, never stored)
//! ```
//!
//! Writing the manifest is the commit point of a backup: it is renamed
//! into place only after every pack and index file it needs is durable.

use crate::bytes::{Reader, Writer};
use crate::crypt::Crypt;
use crate::error::{Result, StoreError};
use crate::id::ChunkId;
use crate::meta::{self, Kind};
use std::path::Path;

/// Version of the manifest body this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// A run of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// `len` bytes held by chunk `id`.
    Data {
        /// Length of the chunk.
        len: u32,
        /// The chunk.
        id: ChunkId,
    },
    /// `len` zero bytes.
    Hole {
        /// Length of the hole.
        len: u64,
    },
}

impl Extent {
    /// Length in the image.
    pub fn len(&self) -> u64 {
        match *self {
            Extent::Data { len, .. } => u64::from(len),
            Extent::Hole { len } => len,
        }
    }

    /// Whether it covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Figures recorded by the backup that made a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotStats {
    /// Data chunks in the image (with repeats).
    pub chunks: u64,
    /// Chunks this backup stored for the first time.
    pub new_chunks: u64,
    /// Bytes of all-zero chunks (holes).
    pub zero_bytes: u64,
    /// Uncompressed bytes of the new chunks.
    pub new_raw: u64,
    /// Bytes the new chunks take in packs (records included).
    pub new_stored: u64,
    /// How long the backup took.
    pub millis: u64,
}

/// One snapshot of one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Image name.
    pub name: String,
    /// Snapshot number (1, 2, ...).
    pub snapshot: u64,
    /// When the backup started (Unix seconds).
    pub created: i64,
    /// Image size in bytes.
    pub size: u64,
    /// The chunker used, as `cdc:MIN,AVG,MAX` or `fixed:SIZE`.
    pub chunker: String,
    /// The codec used, as `zstd:3`.
    pub codec: String,
    /// What was backed up (path or `-`).
    pub source: String,
    /// The backup's figures.
    pub stats: SnapshotStats,
    /// The image, in order.
    pub extents: Vec<Extent>,
}

impl Manifest {
    /// The file bytes (plain envelope).
    pub fn encode(&self) -> Vec<u8> {
        meta::seal(Kind::Manifest, MANIFEST_VERSION, &self.body())
    }

    /// The file bytes, encrypted under `crypt` if there is one.
    pub fn encode_with(&self, crypt: Option<&Crypt>) -> Result<Vec<u8>> {
        meta::seal_with(Kind::Manifest, MANIFEST_VERSION, &self.body(), crypt)
    }

    fn body(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.buf.reserve(200 + self.extents.len() * 37);
        w.str16(&self.name);
        w.u64(self.snapshot);
        w.i64(self.created);
        w.u64(self.size);
        w.str16(&self.chunker);
        w.str16(&self.codec);
        w.str16(&self.source);
        let s = &self.stats;
        for v in [
            s.chunks,
            s.new_chunks,
            s.zero_bytes,
            s.new_raw,
            s.new_stored,
            s.millis,
        ] {
            w.u64(v);
        }
        w.u64(self.extents.len() as u64);
        for e in &self.extents {
            match *e {
                Extent::Data { len, id } => {
                    w.u8(0);
                    w.u32(len);
                    w.bytes(&id.0);
                }
                Extent::Hole { len } => {
                    w.u8(1);
                    w.u64(len);
                }
            }
        }
        w.buf
    }

    /// Parse a manifest file's bytes (plain envelope).
    pub fn decode(path: &Path, data: &[u8]) -> Result<Manifest> {
        Self::decode_with(path, data, None)
    }

    /// Parse a manifest file's bytes, sealed under `crypt` if there is one.
    pub fn decode_with(path: &Path, data: &[u8], crypt: Option<&Crypt>) -> Result<Manifest> {
        let (_, body) = meta::open_with(path, data, Kind::Manifest, MANIFEST_VERSION, crypt)?;
        let body = &body[..];
        let at = |off: usize| {
            StoreError::corrupt(path, off as u64, "manifest is truncated or malformed")
        };
        let mut r = Reader::new(body);
        let name = r.str16().map_err(at)?;
        let snapshot = r.u64().map_err(at)?;
        let created = r.i64().map_err(at)?;
        let size = r.u64().map_err(at)?;
        let chunker = r.str16().map_err(at)?;
        let codec = r.str16().map_err(at)?;
        let source = r.str16().map_err(at)?;
        let mut v = [0u64; 6];
        for x in &mut v {
            *x = r.u64().map_err(at)?;
        }
        let stats = SnapshotStats {
            chunks: v[0],
            new_chunks: v[1],
            zero_bytes: v[2],
            new_raw: v[3],
            new_stored: v[4],
            millis: v[5],
        };
        let n = r.u64().map_err(at)?;
        if n > (r.remaining() / 9) as u64 {
            return Err(StoreError::corrupt(
                path,
                r.pos() as u64,
                format!("{n} extents cannot fit"),
            ));
        }
        let mut extents = Vec::with_capacity(n as usize);
        let mut total = 0u64;
        for _ in 0..n {
            let pos = r.pos();
            let e = match r.u8().map_err(at)? {
                0 => Extent::Data {
                    len: r.u32().map_err(at)?,
                    id: ChunkId(r.array().map_err(at)?),
                },
                1 => Extent::Hole {
                    len: r.u64().map_err(at)?,
                },
                t => {
                    return Err(StoreError::corrupt(
                        path,
                        pos as u64,
                        format!("unknown extent type {t}"),
                    ))
                }
            };
            if e.is_empty()
                || e.len() > u64::from(crate::chunker::MAX_CHUNK)
                    && matches!(e, Extent::Data { .. })
            {
                return Err(StoreError::corrupt(
                    path,
                    pos as u64,
                    format!("extent of bad length {}", e.len()),
                ));
            }
            total = total
                .checked_add(e.len())
                .ok_or_else(|| StoreError::corrupt(path, pos as u64, "extents overflow"))?;
            extents.push(e);
        }
        if r.remaining() != 0 {
            return Err(StoreError::corrupt(
                path,
                r.pos() as u64,
                "bytes after the last extent",
            ));
        }
        if total != size {
            return Err(StoreError::corrupt(
                path,
                0,
                format!("extents cover {total} bytes, the image is {size}"),
            ));
        }
        Ok(Manifest {
            name,
            snapshot,
            created,
            size,
            chunker,
            codec,
            source,
            stats,
            extents,
        })
    }

    /// Extents with their image offsets.
    pub fn with_offsets(&self) -> impl Iterator<Item = (u64, &Extent)> {
        self.extents.iter().scan(0u64, |off, e| {
            let at = *off;
            *off += e.len();
            Some((at, e))
        })
    }
}

/// Builds the extent list, merging neighbouring holes.
#[derive(Debug, Default)]
pub struct ExtentList {
    /// The extents so far.
    pub extents: Vec<Extent>,
    /// Their total length.
    pub size: u64,
}

impl ExtentList {
    /// Append one extent.
    pub fn push(&mut self, e: Extent) {
        self.size += e.len();
        if let (Extent::Hole { len }, Some(Extent::Hole { len: last })) =
            (e, self.extents.last_mut())
        {
            *last += len;
            return;
        }
        self.extents.push(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        let mut l = ExtentList::default();
        l.push(Extent::Data {
            len: 100,
            id: ChunkId::of(b"a"),
        });
        l.push(Extent::Hole { len: 4096 });
        l.push(Extent::Hole { len: 4096 });
        l.push(Extent::Data {
            len: 7,
            id: ChunkId::of(b"b"),
        });
        Manifest {
            name: "vm".into(),
            snapshot: 3,
            created: 1_700_000_000,
            size: l.size,
            chunker: "cdc:4096,16384,65536".into(),
            codec: "zstd:3".into(),
            source: "/dev/sda".into(),
            stats: SnapshotStats {
                chunks: 2,
                new_chunks: 1,
                zero_bytes: 8192,
                new_raw: 7,
                new_stored: 59,
                millis: 12,
            },
            extents: l.extents,
        }
    }

    #[test]
    fn round_trip_merges_holes_and_rejects_damage() {
        let m = sample();
        assert_eq!(m.extents.len(), 3);
        let bytes = m.encode();
        let p = Path::new("m.snap");
        assert_eq!(Manifest::decode(p, &bytes).unwrap(), m);
        let offsets: Vec<u64> = m.with_offsets().map(|(o, _)| o).collect();
        assert_eq!(offsets, vec![0, 100, 8292]);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(Manifest::decode(p, &bad).is_err(), "flip at {i}");
        }
    }
}
