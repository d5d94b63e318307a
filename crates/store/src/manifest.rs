//! Snapshot manifests: what an image is made of.
//!
//! `REPO/snapshots/<NAME>/<SNAPSHOT>.snap`, SNAPSHOT a zero-padded decimal
//! number counting up from 1 per image; a metadata envelope of kind 4,
//! body version 3 (1 or 2 as written before version 3, still read):
//!
//! ```text
//! str16 name, u64 snapshot, i64 created (Unix seconds), u64 logical size,
//! str16 chunker, str16 codec, str16 source,
//! u64 chunks, u64 new chunks, u64 zero bytes, u64 new raw bytes,
//! u64 new stored bytes, u64 backup time in milliseconds,
//! u64 N, N × extent:
//!   0x00, u32 length, chunk id [32]     data
//!   0x01, u64 length                    hole (zeros, never stored)
//! version 2: u16 T (at least 1), T × str16 tag
//! version 3: u16 T (0 or more), T × str16 tag, u32 group
//! ```
//!
//! `group` is the raw bytes of chunks compressed together per record
//! when the snapshot was written (`--group`, after the pack size's limit;
//! 0: each chunk alone): the trade of size against random reads that the
//! snapshot made, shown by `ls` and kept by a commit of a served writable
//! image. Version 1 (no tags)
//! and 2 (tags) did not record it; they are read with the group unknown.
//! Every new snapshot is written as version 3, which a cairn older than it
//! refuses as newer instead of misreading.
//!
//! Writing the manifest is the commit point of a backup: it is renamed
//! into place only after every pack and index file it needs is durable.

use crate::bytes::{Reader, Writer};
use crate::crypt::Crypt;
use crate::error::{Result, StoreError};
use crate::id::ChunkId;
use crate::meta::{self, Kind};
use std::path::Path;

/// Newest version of the manifest body this build reads and writes (3:
/// with the group size; 1 and 2 are still read).
pub const MANIFEST_VERSION: u32 = 3;

/// Longest tag, in bytes.
pub const MAX_TAG_LEN: usize = 128;

/// Check a tag: 1 to [`MAX_TAG_LEN`] bytes, no comma (a comma separates
/// tags on the command line), no white space or control character.
pub fn validate_tag(tag: &str) -> Result<()> {
    if tag.is_empty()
        || tag.len() > MAX_TAG_LEN
        || tag
            .chars()
            .any(|c| c == ',' || c.is_whitespace() || c.is_control())
    {
        return Err(StoreError::Invalid(format!(
            "bad tag {tag:?}: use 1 to {MAX_TAG_LEN} bytes without commas, spaces or control characters"
        )));
    }
    Ok(())
}

/// Whether a snapshot with `tags` matches the filter `groups`, restic's
/// rule: it matches if it has every tag of at least one group (`--tag
/// a,b --tag c`: a and b, or c). No group matches everything.
pub fn tags_match(tags: &[String], groups: &[Vec<String>]) -> bool {
    groups.is_empty() || groups.iter().any(|g| g.iter().all(|t| tags.contains(t)))
}

/// Tags as given on the command line: each value a comma-separated list,
/// checked; duplicates dropped, order kept.
pub fn parse_tags<S: AsRef<str>>(values: &[S]) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for v in values {
        for t in v.as_ref().split(',') {
            validate_tag(t)?;
            if !out.iter().any(|x| x == t) {
                out.push(t.to_string());
            }
        }
    }
    Ok(out)
}

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

    /// Whether it is a hole.
    pub fn is_hole(&self) -> bool {
        matches!(self, Extent::Hole { .. })
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
    /// Labels given at backup (`--tag`).
    pub tags: Vec<String>,
    /// Raw bytes compressed together per record (0: each chunk alone);
    /// `None` for a snapshot written before version 3, which did not say.
    pub group: Option<u32>,
}

impl Manifest {
    /// The body version this manifest is written as: 3 when it records
    /// its group (every new snapshot); else 2 with tags, 1 without (as
    /// written before version 3).
    pub fn version(&self) -> u32 {
        match (self.group, self.tags.is_empty()) {
            (Some(_), _) => 3,
            (None, false) => 2,
            (None, true) => 1,
        }
    }

    /// Whether it matches a tag filter (see [`tags_match`]).
    pub fn has_tags(&self, groups: &[Vec<String>]) -> bool {
        tags_match(&self.tags, groups)
    }

    /// The file bytes (plain envelope).
    pub fn encode(&self) -> Vec<u8> {
        meta::seal(Kind::Manifest, self.version(), &self.body())
    }

    /// The file bytes, encrypted under `crypt` if there is one.
    pub fn encode_with(&self, crypt: Option<&Crypt>) -> Result<Vec<u8>> {
        meta::seal_with(Kind::Manifest, self.version(), &self.body(), crypt)
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
        if self.version() >= 2 {
            w.u16(self.tags.len().min(usize::from(u16::MAX)) as u16);
            for t in self.tags.iter().take(usize::from(u16::MAX)) {
                w.str16(t);
            }
        }
        if let Some(g) = self.group {
            w.u32(g);
        }
        w.buf
    }

    /// Parse a manifest file's bytes (plain envelope).
    pub fn decode(path: &Path, data: &[u8]) -> Result<Manifest> {
        Self::decode_with(path, data, None)
    }

    /// Parse a manifest file's bytes, sealed under `crypt` if there is one.
    pub fn decode_with(path: &Path, data: &[u8], crypt: Option<&Crypt>) -> Result<Manifest> {
        let (version, body) = meta::open_with(path, data, Kind::Manifest, MANIFEST_VERSION, crypt)?;
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
        let mut tags = Vec::new();
        if version >= 2 {
            let n = r.u16().map_err(at)?;
            if n == 0 && version == 2 {
                return Err(StoreError::corrupt(
                    path,
                    r.pos() as u64,
                    "a version 2 manifest without tags",
                ));
            }
            for _ in 0..n {
                let pos = r.pos();
                let t = r.str16().map_err(at)?;
                if validate_tag(&t).is_err() {
                    return Err(StoreError::corrupt(
                        path,
                        pos as u64,
                        format!("bad tag {t:?}"),
                    ));
                }
                tags.push(t);
            }
        }
        let group = if version >= 3 {
            let pos = r.pos();
            let g = r.u32().map_err(at)?;
            if g as usize > crate::pack::MAX_GROUP_RAW {
                return Err(StoreError::corrupt(
                    path,
                    pos as u64,
                    format!("group of {g} bytes, over the most a backup writes"),
                ));
            }
            Some(g)
        } else {
            None
        };
        if r.remaining() != 0 {
            return Err(StoreError::corrupt(
                path,
                r.pos() as u64,
                match version {
                    1 => "bytes after the last extent",
                    2 => "bytes after the last tag",
                    _ => "bytes after the group size",
                },
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
            tags,
            group,
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
            tags: Vec::new(),
            group: None,
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

    fn version_of(file: &[u8]) -> u32 {
        u32::from_le_bytes(file[12..16].try_into().unwrap())
    }

    #[test]
    fn tags_make_a_version_2_body_that_round_trips_and_rejects_damage() {
        let mut m = sample();
        m.tags = vec!["daily".into(), "host=db1".into()];
        for crypt in [None, Some(crate::crypt::Crypt::generate().unwrap())] {
            let bytes = m.encode_with(crypt.as_ref()).unwrap();
            assert_eq!(version_of(&bytes), 2);
            let p = Path::new("m.snap");
            assert_eq!(Manifest::decode_with(p, &bytes, crypt.as_ref()).unwrap(), m);
            for i in 0..bytes.len() {
                let mut bad = bytes.clone();
                bad[i] ^= 0x10;
                assert!(
                    Manifest::decode_with(p, &bad, crypt.as_ref()).is_err(),
                    "flip at {i}"
                );
            }
        }
    }

    #[test]
    fn without_tags_or_group_the_body_stays_version_1_and_unchanged() {
        let m = sample();
        let bytes = m.encode();
        assert_eq!(version_of(&bytes), 1);
        // Version 1 bytes end at the last extent: the same bytes as
        // before tags existed (a tagged copy is the v1 body plus tags).
        let mut tagged = m.clone();
        tagged.tags = vec!["t".into()];
        let v2 = tagged.encode();
        assert_eq!(v2.len(), bytes.len() + 2 + 2 + 1);
        assert_eq!(
            &v2[24..24 + bytes.len() - 24 - 32],
            &bytes[24..bytes.len() - 32]
        );
    }

    /// The committed repository of version 1 (written before tags): its
    /// manifests still decode, with no tags.
    #[test]
    fn committed_version_1_manifests_decode() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/repository-v1/repo/snapshots/alpha");
        let mut seen = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let bytes = std::fs::read(&p).unwrap();
            assert_eq!(version_of(&bytes), 1);
            let m = Manifest::decode(&p, &bytes).unwrap();
            assert_eq!(m.name, "alpha");
            assert!(m.tags.is_empty());
            assert_eq!(m.group, None);
            seen += 1;
        }
        assert!(seen >= 1);
    }

    /// A committed version 2 manifest (`tests/fixtures/manifest-v2/`,
    /// written by `CAIRN_BLESS=1`): what this version writes stays readable.
    #[test]
    fn committed_version_2_manifest_decodes() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/manifest-v2/tagged.snap");
        let mut m = sample();
        m.tags = vec!["daily".into(), "pre-upgrade".into()];
        if std::env::var_os("CAIRN_BLESS").is_some() {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, m.encode()).unwrap();
        }
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(version_of(&bytes), 2);
        assert_eq!(Manifest::decode(&p, &bytes).unwrap(), m);
    }

    /// Every new snapshot records its group: version 3, with or without
    /// tags, read back the same; a group over the most a backup writes,
    /// a cut group field and bytes after it are refused.
    #[test]
    fn the_group_makes_a_version_3_body_that_round_trips_and_rejects_damage() {
        let p = Path::new("m.snap");
        for (group, tags) in [(0, vec![]), (2 << 20, vec!["daily".to_string()])] {
            let mut m = sample();
            m.group = Some(group);
            m.tags = tags;
            let bytes = m.encode();
            assert_eq!(version_of(&bytes), 3);
            assert_eq!(Manifest::decode(p, &bytes).unwrap(), m);
        }
        let mut m = sample();
        m.group = Some(crate::pack::MAX_GROUP_RAW as u32 + 1);
        let err = Manifest::decode(p, &m.encode()).unwrap_err().to_string();
        assert!(err.contains("over the most a backup writes"), "{err}");
        m.group = Some(1 << 20);
        let body = m.body();
        for bad in [&body[..body.len() - 1], &[&body[..], &[0][..]].concat()[..]] {
            let bytes = meta::seal(Kind::Manifest, 3, bad);
            assert!(Manifest::decode(p, &bytes).is_err());
        }
    }

    /// A version 2 body must have tags (a version 3 body may have none).
    #[test]
    fn a_version_2_body_without_tags_is_refused() {
        let mut m = sample();
        m.group = Some(0);
        let bytes = meta::seal(Kind::Manifest, 2, &m.body()[..m.body().len() - 4]);
        let err = Manifest::decode(Path::new("m.snap"), &bytes).unwrap_err();
        assert!(err.to_string().contains("without tags"), "{err}");
    }

    /// A committed version 3 manifest (`tests/fixtures/manifest-v3/`,
    /// written by `CAIRN_BLESS=1`): what this version writes stays readable.
    #[test]
    fn committed_version_3_manifest_decodes() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/manifest-v3/grouped.snap");
        let mut m = sample();
        m.group = Some(64 << 10);
        if std::env::var_os("CAIRN_BLESS").is_some() {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, m.encode()).unwrap();
        }
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(version_of(&bytes), 3);
        assert_eq!(Manifest::decode(&p, &bytes).unwrap(), m);
    }

    #[test]
    fn tag_filters_follow_restic() {
        let tags = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let have = tags(&["a", "b"]);
        assert!(tags_match(&have, &[]));
        assert!(tags_match(&have, &[tags(&["a", "b"])]));
        assert!(!tags_match(&have, &[tags(&["a", "c"])]));
        assert!(tags_match(&have, &[tags(&["a", "c"]), tags(&["b"])]));
        assert!(!tags_match(&[], &[tags(&["a"])]));
        assert_eq!(
            parse_tags(&["a,b", "a", "c"]).unwrap(),
            tags(&["a", "b", "c"])
        );
        for bad in ["", "a,,b", "has space", "x\u{7}"] {
            assert!(parse_tags(&[bad]).is_err(), "{bad:?}");
        }
        assert!(parse_tags(&["x".repeat(MAX_TAG_LEN + 1)]).is_err());
    }
}
