//! Pack files: append-only files of chunk records, one writer at a time.
//!
//! ```text
//! pack header (64 bytes)
//! 0   8   magic "CAIRNPAK"
//! 8   4   version (u32 LE) = 1
//! 12  16  repository id
//! 28  16  pack id (also the file name)
//! 44  16  reserved, zero
//! 60  4   CRC-32C of bytes 0..60
//!
//! record (52-byte header, then the stored bytes)
//! 0   4   magic "CCHK"
//! 4   1   codec (0 none, 1 lz4, 2 snappy, 3 lzo, 4 zstd, 5 deflate, 6 bzip2, 7 xz)
//! 5   3   reserved, zero
//! 8   4   raw length (u32 LE)
//! 12  4   stored length (u32 LE)
//! 16  32  chunk id: BLAKE3-256 of the raw bytes
//! 48  4   CRC-32C of bytes 0..48 and the stored bytes
//! ```
//!
//! A record is self-describing, so a pack can be read without any index:
//! that is how packs left by an interrupted backup are salvaged, and how
//! `verify --read-data` walks them. The CRC finds torn and flipped records
//! cheaply; the BLAKE3 id proves the decoded bytes.

use crate::error::{IoContext, Result, StoreError};
use crate::id::{ChunkId, PackId, RepoId};
use cairn_codec::{BlockCodec, CodecKind, CodecSpec};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Version of the pack format this build writes and reads.
pub const PACK_VERSION: u32 = 1;
/// Bytes before the first record.
pub const PACK_HEADER_LEN: usize = 64;
/// Bytes of a record before its data.
pub const RECORD_HEADER_LEN: usize = 52;
const PACK_MAGIC: &[u8; 8] = b"CAIRNPAK";
const RECORD_MAGIC: &[u8; 4] = b"CCHK";

/// Codec number in a record.
pub fn codec_code(kind: CodecKind) -> u8 {
    match kind {
        CodecKind::None => 0,
        CodecKind::Lz4 => 1,
        CodecKind::Snappy => 2,
        CodecKind::Lzo => 3,
        CodecKind::Zstd => 4,
        CodecKind::Deflate => 5,
        CodecKind::Bzip2 => 6,
        CodecKind::Xz => 7,
    }
}

fn codec_of(code: u8) -> Option<CodecKind> {
    CodecKind::ALL.into_iter().find(|&k| codec_code(k) == code)
}

/// The header of a pack.
pub fn encode_pack_header(repo: RepoId, pack: PackId) -> [u8; PACK_HEADER_LEN] {
    let mut h = [0u8; PACK_HEADER_LEN];
    h[..8].copy_from_slice(PACK_MAGIC);
    h[8..12].copy_from_slice(&PACK_VERSION.to_le_bytes());
    h[12..28].copy_from_slice(&repo.0);
    h[28..44].copy_from_slice(&pack.0);
    let crc = crc32c::crc32c(&h[..60]);
    h[60..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Check a pack header; returns the pack id it names.
pub fn check_pack_header(path: &Path, data: &[u8], repo: RepoId) -> Result<PackId> {
    let bad = |off: u64, why: &str| Err(StoreError::corrupt(path, off, why.to_string()));
    if data.len() < PACK_HEADER_LEN {
        return bad(data.len() as u64, "pack header is truncated");
    }
    if &data[..8] != PACK_MAGIC {
        return bad(0, "bad magic (not a cairn pack)");
    }
    let mut word = [0u8; 4];
    word.copy_from_slice(&data[60..64]);
    if crc32c::crc32c(&data[..60]) != u32::from_le_bytes(word) {
        return bad(60, "pack header checksum mismatch");
    }
    word.copy_from_slice(&data[8..12]);
    let version = u32::from_le_bytes(word);
    if version > PACK_VERSION {
        return Err(StoreError::NewerVersion {
            path: path.to_path_buf(),
            found: version,
            supported: PACK_VERSION,
        });
    }
    if data[12..28] != repo.0 {
        return bad(12, "pack belongs to another repository");
    }
    let mut id = [0u8; 16];
    id.copy_from_slice(&data[28..44]);
    Ok(PackId(id))
}

/// A record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Codec of the stored bytes.
    pub codec: CodecKind,
    /// Length after decoding.
    pub raw_len: u32,
    /// Length of the stored bytes.
    pub stored_len: u32,
    /// The chunk.
    pub id: ChunkId,
    /// CRC-32C of header bytes 0..48 and the stored bytes.
    pub crc: u32,
}

impl RecordHeader {
    /// Parse a record header; `Err(reason)` if it is not one.
    pub fn parse(h: &[u8]) -> std::result::Result<RecordHeader, &'static str> {
        if h.len() < RECORD_HEADER_LEN {
            return Err("record header is truncated");
        }
        if &h[..4] != RECORD_MAGIC {
            return Err("bad record magic");
        }
        let codec = codec_of(h[4]).ok_or("unknown codec number")?;
        let u32_at = |o: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&h[o..o + 4]);
            u32::from_le_bytes(w)
        };
        let mut id = [0u8; 32];
        id.copy_from_slice(&h[16..48]);
        Ok(RecordHeader {
            codec,
            raw_len: u32_at(8),
            stored_len: u32_at(12),
            id: ChunkId(id),
            crc: u32_at(48),
        })
    }

    /// Total record length.
    pub fn record_len(&self) -> usize {
        RECORD_HEADER_LEN + self.stored_len as usize
    }
}

/// Append a record for chunk `id` holding `raw` to `out`, compressed with
/// `codec` unless that does not make it smaller (then stored as is).
pub fn encode_record(
    out: &mut Vec<u8>,
    id: &ChunkId,
    raw: &[u8],
    codec: &mut dyn BlockCodec,
) -> Result<()> {
    let start = out.len();
    out.extend_from_slice(&[0u8; RECORD_HEADER_LEN]);
    let mut kind = codec.kind();
    if kind != CodecKind::None {
        codec.compress(raw, out)?;
        if out.len() - start - RECORD_HEADER_LEN >= raw.len() {
            out.truncate(start + RECORD_HEADER_LEN);
            kind = CodecKind::None;
        }
    }
    if kind == CodecKind::None {
        out.extend_from_slice(raw);
    }
    let stored_len = (out.len() - start - RECORD_HEADER_LEN) as u32;
    let h = &mut out[start..start + RECORD_HEADER_LEN];
    h[..4].copy_from_slice(RECORD_MAGIC);
    h[4] = codec_code(kind);
    h[8..12].copy_from_slice(&(raw.len() as u32).to_le_bytes());
    h[12..16].copy_from_slice(&stored_len.to_le_bytes());
    h[16..48].copy_from_slice(&id.0);
    let crc = crc32c::crc32c(&out[start..start + 48]);
    let crc = crc32c::crc32c_append(crc, &out[start + RECORD_HEADER_LEN..]);
    out[start + 48..start + 52].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// One decoding context per codec, built on first use.
#[derive(Default)]
pub struct Decoders {
    codecs: Vec<(CodecKind, Box<dyn BlockCodec>)>,
}

impl Decoders {
    fn get(&mut self, kind: CodecKind) -> &mut dyn BlockCodec {
        let i = match self.codecs.iter().position(|(k, _)| *k == kind) {
            Some(i) => i,
            None => {
                self.codecs
                    .push((kind, CodecSpec::default_for(kind).build()));
                self.codecs.len() - 1
            }
        };
        self.codecs[i].1.as_mut()
    }
}

/// Check and decode the record in `rec` (read from `path` at `offset`),
/// appending the chunk's bytes to `out`. With `expect`, the record must
/// hold that chunk. The decoded bytes are always hashed and compared with
/// the id.
pub fn decode_record(
    path: &Path,
    offset: u64,
    rec: &[u8],
    expect: Option<&ChunkId>,
    decoders: &mut Decoders,
    out: &mut Vec<u8>,
) -> Result<RecordHeader> {
    let corrupt = |why: String| StoreError::corrupt(path, offset, why);
    let h = RecordHeader::parse(rec).map_err(|e| corrupt(e.to_string()))?;
    let bad = |why: String| StoreError::BadChunk {
        chunk: h.id,
        path: path.to_path_buf(),
        offset,
        reason: why,
    };
    if let Some(want) = expect {
        if *want != h.id {
            return Err(corrupt(format!(
                "record holds chunk {} instead of {want}",
                h.id
            )));
        }
    }
    if rec.len() != h.record_len() {
        return Err(bad(format!(
            "record is {} bytes, its header says {}",
            rec.len(),
            h.record_len()
        )));
    }
    let crc = crc32c::crc32c(&rec[..48]);
    let crc = crc32c::crc32c_append(crc, &rec[RECORD_HEADER_LEN..]);
    if crc != h.crc {
        return Err(bad("record checksum mismatch".into()));
    }
    if h.raw_len > crate::chunker::MAX_CHUNK {
        return Err(bad(format!("raw length {} is over the limit", h.raw_len)));
    }
    let start = out.len();
    let stored = &rec[RECORD_HEADER_LEN..];
    decoders
        .get(h.codec)
        .decompress(stored, out, h.raw_len as usize)
        .map_err(|e| bad(e.to_string()))?;
    if out.len() - start != h.raw_len as usize {
        return Err(bad("decoded length differs from the header".into()));
    }
    if ChunkId::of(&out[start..]) != h.id {
        return Err(bad("decoded bytes do not hash to the chunk id".into()));
    }
    Ok(h)
}

/// Walk the records of a whole pack held in `data`: calls `each(offset,
/// header, record bytes)` for every record whose header and length are
/// sane, and returns the offset where the valid sequence ends (the file
/// length for an intact pack). The CRC is checked here too, so a torn
/// tail ends the walk.
pub fn walk_records(
    data: &[u8],
    mut each: impl FnMut(u64, &RecordHeader, &[u8]) -> Result<()>,
) -> Result<u64> {
    let mut pos = PACK_HEADER_LEN;
    while pos < data.len() {
        let Ok(h) = RecordHeader::parse(&data[pos..]) else {
            break;
        };
        let end = pos + h.record_len();
        if end > data.len() || h.raw_len > crate::chunker::MAX_CHUNK {
            break;
        }
        let rec = &data[pos..end];
        let crc = crc32c::crc32c_append(crc32c::crc32c(&rec[..48]), &rec[RECORD_HEADER_LEN..]);
        if crc != h.crc {
            break;
        }
        each(pos as u64, &h, rec)?;
        pos = end;
    }
    Ok(pos as u64)
}

/// Where a pack lives under a target directory.
pub fn pack_path(target: &Path, id: PackId) -> PathBuf {
    let hex = id.to_string();
    target
        .join("packs")
        .join(&hex[..2])
        .join(format!("{hex}.pack"))
}

/// A pack being written.
pub struct PackWriter {
    file: File,
    path: PathBuf,
    id: PackId,
    len: u64,
}

impl PackWriter {
    /// Create a new pack under `target`.
    pub fn create(target: &Path, repo: RepoId) -> Result<PackWriter> {
        let id = PackId::random();
        let path = pack_path(target, id);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).ctx(dir, "create directory")?;
        }
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .ctx(&path, "create pack")?;
        file.write_all(&encode_pack_header(repo, id))
            .ctx(&path, "write")?;
        Ok(PackWriter {
            file,
            path,
            id,
            len: PACK_HEADER_LEN as u64,
        })
    }

    /// Append records; returns the offset of the first byte.
    pub fn append(&mut self, bytes: &[u8]) -> Result<u64> {
        let at = self.len;
        self.file.write_all(bytes).ctx(&self.path, "write")?;
        self.len += bytes.len() as u64;
        Ok(at)
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether only the header is written.
    pub fn is_empty(&self) -> bool {
        self.len == PACK_HEADER_LEN as u64
    }

    /// The pack's id.
    pub fn id(&self) -> PackId {
        self.id
    }

    /// Make the pack durable (data and its name) and close it.
    pub fn finish(self) -> Result<(PackId, u64)> {
        self.file.sync_all().ctx(&self.path, "fsync")?;
        if let Some(dir) = self.path.parent() {
            crate::meta::sync_dir(dir)?;
        }
        Ok((self.id, self.len))
    }

    /// Remove a pack that received nothing.
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_with_every_codec() {
        let raw: Vec<u8> = (0..50_000u32)
            .map(|i| (i % 251) as u8 ^ (i / 7) as u8)
            .collect();
        let id = ChunkId::of(&raw);
        let mut dec = Decoders::default();
        for kind in CodecKind::ALL {
            let mut codec = CodecSpec::default_for(kind).build();
            let mut rec = Vec::new();
            encode_record(&mut rec, &id, &raw, codec.as_mut()).unwrap();
            let mut out = Vec::new();
            let h = decode_record(Path::new("p"), 64, &rec, Some(&id), &mut dec, &mut out).unwrap();
            assert_eq!(out, raw, "{kind}");
            assert_eq!(h.raw_len as usize, raw.len());
        }
    }

    #[test]
    fn incompressible_chunks_are_stored_raw() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let raw: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let mut rec = Vec::new();
        let mut codec = CodecSpec::default_for(CodecKind::Zstd).build();
        encode_record(&mut rec, &ChunkId::of(&raw), &raw, codec.as_mut()).unwrap();
        let h = RecordHeader::parse(&rec).unwrap();
        assert_eq!(h.codec, CodecKind::None);
        assert_eq!(rec.len(), RECORD_HEADER_LEN + raw.len());
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let raw = b"hello hello hello hello hello hello".repeat(20);
        let id = ChunkId::of(&raw);
        let mut rec = Vec::new();
        let mut codec = CodecSpec::default_for(CodecKind::Lz4).build();
        encode_record(&mut rec, &id, &raw, codec.as_mut()).unwrap();
        let mut dec = Decoders::default();
        for i in 0..rec.len() {
            let mut bad = rec.clone();
            bad[i] ^= 1;
            let mut out = Vec::new();
            assert!(
                decode_record(Path::new("p"), 0, &bad, Some(&id), &mut dec, &mut out).is_err(),
                "flip at {i}"
            );
        }
    }

    #[test]
    fn walk_stops_at_a_torn_tail() {
        let repo = RepoId::random();
        let mut data = encode_pack_header(repo, PackId::random()).to_vec();
        let mut codec = CodecSpec::default_for(CodecKind::Lz4).build();
        let mut ends = Vec::new();
        for i in 0..5u8 {
            let raw = vec![i; 1000 + usize::from(i)];
            encode_record(&mut data, &ChunkId::of(&raw), &raw, codec.as_mut()).unwrap();
            ends.push(data.len() as u64);
        }
        assert!(check_pack_header(Path::new("p"), &data, repo).is_ok());
        assert!(check_pack_header(Path::new("p"), &data, RepoId::random()).is_err());
        let mut n = 0;
        assert_eq!(
            walk_records(&data, |_, _, _| {
                n += 1;
                Ok(())
            })
            .unwrap(),
            ends[4]
        );
        assert_eq!(n, 5);
        for cut in [ends[3] + 10, ends[4] - 1, ends[3] + 51] {
            let end = walk_records(&data[..cut as usize], |_, _, _| Ok(())).unwrap();
            assert_eq!(end, ends[3], "cut {cut}");
        }
    }
}
