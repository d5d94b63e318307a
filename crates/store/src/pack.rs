//! Pack files: append-only files of chunk records, one writer at a time.
//!
//! ```text
//! pack header (64 bytes)
//! 0   8   magic "CAIRNPAK"
//! 8   4   version (u32 LE): 1 plain records, 2 sealed records
//! 12  16  repository id
//! 28  16  pack id (also the file name)
//! 44  16  reserved, zero
//! 60  4   CRC-32C of bytes 0..60
//!
//! record: a group of chunks compressed together
//! 0   4   magic "CBLK"
//! 4   1   codec (0 none, 1 lz4, 2 snappy, 3 lzo, 4 zstd, 5 deflate, 6 bzip2, 7 xz)
//! 5   1   reserved, zero
//! 6   2   chunk count n (u16 LE, at least 1)
//! 8   4   raw length: the chunks' lengths added up (u32 LE, at most 8 MiB)
//! 12  4   stored length (u32 LE)
//! 16  4   CRC-32C of bytes 0..16, the chunk table and the stored bytes
//! 20  36n chunk table: n × { chunk id [32] (BLAKE3-256 of its bytes), length u32 }
//! ..      stored bytes: the chunks, concatenated in table order, compressed
//!
//! sealed record (version 2, in an encrypted repository)
//! 0   4   magic "CSEA"
//! 4   4   L: length of ciphertext and tag (u32 LE)
//! 8   12  nonce
//! 20  L   a record as above, AES-256-GCM encrypted, then its 16-byte tag;
//!         bytes 0..8 are authenticated with it
//! ```
//!
//! Chunks are deduplicated one by one, but the new chunks of a backup are
//! compressed in groups of about a MiB: a 32 KiB chunk alone compresses
//! badly (no history to match against), a group nearly as well as the
//! whole stream. A record is self-describing, so a pack can be read
//! without any index: that is how packs left by an interrupted backup are
//! salvaged, and how `verify --read-data` walks them. The CRC finds torn
//! and flipped records cheaply; the BLAKE3 id proves each decoded chunk.

use crate::backend::{Key, ObjectWriter, WriteBackend};
use crate::crypt::{Crypt, TAG_LEN};
use crate::error::{Result, StoreError};
use crate::id::{ChunkId, PackId, RepoId};
use cairn_codec::{BlockCodec, CodecKind, CodecSpec, Probe};
use std::path::Path;
use std::sync::Arc;

/// Version of the packs of a plain repository.
pub const PACK_VERSION: u32 = 1;
/// Version of the packs of an encrypted repository (sealed records).
pub const SEALED_PACK_VERSION: u32 = 2;
/// Bytes of a sealed record's frame before the ciphertext.
pub const SEALED_FIXED_LEN: usize = 20;
const SEALED_MAGIC: &[u8; 4] = b"CSEA";
/// Bytes before the first record.
pub const PACK_HEADER_LEN: usize = 64;
const PACK_MAGIC: &[u8; 8] = b"CAIRNPAK";
const RECORD_MAGIC: &[u8; 4] = b"CBLK";

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

/// The header of a pack; `sealed` in an encrypted repository.
pub fn encode_pack_header(repo: RepoId, pack: PackId, sealed: bool) -> [u8; PACK_HEADER_LEN] {
    let mut h = [0u8; PACK_HEADER_LEN];
    h[..8].copy_from_slice(PACK_MAGIC);
    let version = if sealed {
        SEALED_PACK_VERSION
    } else {
        PACK_VERSION
    };
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[12..28].copy_from_slice(&repo.0);
    h[28..44].copy_from_slice(&pack.0);
    let crc = crc32c::crc32c(&h[..60]);
    h[60..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Whether a pack header is damaged (cut short, or failing its CRC), as
/// opposed to sound but not this repository's: none of its fields can be
/// trusted then, but the records after it carry their own checks (a
/// CRC-32C or an AEAD tag each, and chunk ids hashed on reading), so they
/// are read and checked on their own.
pub fn header_damaged(data: &[u8]) -> bool {
    let Some(h) = data.get(..PACK_HEADER_LEN) else {
        return true;
    };
    let mut word = [0u8; 4];
    word.copy_from_slice(&h[60..64]);
    crc32c::crc32c(&h[..60]) != u32::from_le_bytes(word)
}

/// Check a pack header (of a repository whose records are `sealed` or
/// not); returns the pack id it names.
pub fn check_pack_header(path: &Path, data: &[u8], repo: RepoId, sealed: bool) -> Result<PackId> {
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
    if version > SEALED_PACK_VERSION {
        return Err(StoreError::NewerVersion {
            path: path.to_path_buf(),
            found: version,
            supported: SEALED_PACK_VERSION,
        });
    }
    if (version == SEALED_PACK_VERSION) != sealed {
        return bad(
            8,
            if sealed {
                "a plain pack in an encrypted repository"
            } else {
                "an encrypted pack in a plain repository"
            },
        );
    }
    if data[12..28] != repo.0 {
        return bad(12, "pack belongs to another repository");
    }
    let mut id = [0u8; 16];
    id.copy_from_slice(&data[28..44]);
    Ok(PackId(id))
}

/// Largest sum of chunk lengths in one record.
pub const MAX_GROUP_RAW: usize = 8 << 20;
/// Bytes of a record before its chunk table.
pub const RECORD_FIXED_LEN: usize = 20;
/// Bytes per chunk-table entry.
pub const TABLE_ENTRY_LEN: usize = 36;

/// The fixed part of a record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Codec of the stored bytes.
    pub codec: CodecKind,
    /// Chunks in the record (at least one).
    pub count: u16,
    /// Length of the decoded group (the chunks' lengths added up).
    pub raw_len: u32,
    /// Length of the stored bytes.
    pub stored_len: u32,
    /// CRC-32C of bytes 0..16, the chunk table and the stored bytes.
    pub crc: u32,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(w)
}

impl RecordHeader {
    /// Parse the fixed part; `Err(reason)` if it is not a record.
    pub fn parse(h: &[u8]) -> std::result::Result<RecordHeader, &'static str> {
        if h.len() < RECORD_FIXED_LEN {
            return Err("record header is truncated");
        }
        if &h[..4] != RECORD_MAGIC {
            return Err("bad record magic");
        }
        let codec = codec_of(h[4]).ok_or("unknown codec number")?;
        let count = u16::from_le_bytes([h[6], h[7]]);
        if count == 0 {
            return Err("record holds no chunk");
        }
        let raw_len = u32_at(h, 8);
        if raw_len as usize > MAX_GROUP_RAW {
            return Err("record's raw length is over the limit");
        }
        Ok(RecordHeader {
            codec,
            count,
            raw_len,
            stored_len: u32_at(h, 12),
            crc: u32_at(h, 16),
        })
    }

    /// Header length: fixed part and chunk table.
    pub fn header_len(&self) -> usize {
        RECORD_FIXED_LEN + TABLE_ENTRY_LEN * usize::from(self.count)
    }

    /// Total record length.
    pub fn record_len(&self) -> usize {
        self.header_len() + self.stored_len as usize
    }
}

/// A whole record whose lengths, table and CRC have been checked.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The fixed header.
    pub header: RecordHeader,
    table: &'a [u8],
    /// The stored (compressed) bytes.
    pub stored: &'a [u8],
}

impl<'a> Record<'a> {
    /// Check the record at the start of `data` (which may go on past it).
    pub fn parse(data: &'a [u8]) -> std::result::Result<Record<'a>, &'static str> {
        let header = RecordHeader::parse(data)?;
        let end = header.record_len();
        if data.len() < end {
            return Err("record runs past the end of the data");
        }
        let rec = &data[..end];
        let crc = crc32c::crc32c_append(crc32c::crc32c(&rec[..16]), &rec[RECORD_FIXED_LEN..]);
        if crc != header.crc {
            return Err("record checksum mismatch");
        }
        let table = &rec[RECORD_FIXED_LEN..header.header_len()];
        let sum: u64 = table
            .chunks_exact(TABLE_ENTRY_LEN)
            .map(|e| u64::from(u32_at(e, 32)))
            .sum();
        if sum != u64::from(header.raw_len) {
            return Err("chunk table does not add up to the raw length");
        }
        Ok(Record {
            header,
            table,
            stored: &rec[header.header_len()..],
        })
    }

    /// The record's bytes length.
    pub fn len(&self) -> usize {
        self.header.record_len()
    }

    /// Never empty: a record holds at least one chunk.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The chunks: id, offset in the decoded group, length.
    pub fn chunks(&self) -> impl Iterator<Item = (ChunkId, u32, u32)> + 'a {
        self.table
            .chunks_exact(TABLE_ENTRY_LEN)
            .scan(0u32, |off, e| {
                let mut id = [0u8; 32];
                id.copy_from_slice(&e[..32]);
                let len = u32_at(e, 32);
                let at = *off;
                *off += len;
                Some((ChunkId(id), at, len))
            })
    }
}

/// Append a record holding the chunks `table` (id and length, in order)
/// whose bytes are `raw` (their concatenation), compressed with `codec`
/// unless that does not make it smaller (then stored as is). Groups that
/// `probe` finds incompressible are stored as they are without trying.
/// With `crypt`, the record is sealed (encrypted in place).
pub fn encode_record(
    out: &mut Vec<u8>,
    table: &[(ChunkId, u32)],
    raw: &[u8],
    codec: &mut dyn BlockCodec,
    probe: &mut Probe,
    crypt: Option<&Crypt>,
) -> Result<()> {
    debug_assert_eq!(table.iter().map(|t| t.1 as usize).sum::<usize>(), raw.len());
    if table.is_empty() || table.len() > usize::from(u16::MAX) || raw.len() > MAX_GROUP_RAW {
        return Err(StoreError::Invalid(format!(
            "a record holds 1 to 65535 chunks and at most {MAX_GROUP_RAW} bytes ({} chunks, {} bytes given)",
            table.len(),
            raw.len()
        )));
    }
    let frame = out.len();
    if crypt.is_some() {
        out.extend_from_slice(&[0u8; SEALED_FIXED_LEN]);
    }
    let start = out.len();
    out.extend_from_slice(&[0u8; RECORD_FIXED_LEN]);
    for (id, len) in table {
        out.extend_from_slice(&id.0);
        out.extend_from_slice(&len.to_le_bytes());
    }
    let data_at = out.len();
    let mut kind = codec.kind();
    if kind != CodecKind::None && probe.incompressible(raw) {
        kind = CodecKind::None;
    }
    if kind != CodecKind::None {
        codec.compress(raw, out)?;
        if out.len() - data_at >= raw.len() {
            out.truncate(data_at);
            kind = CodecKind::None;
        }
    }
    if kind == CodecKind::None {
        out.extend_from_slice(raw);
    }
    let stored_len = (out.len() - data_at) as u32;
    let h = &mut out[start..start + RECORD_FIXED_LEN];
    h[..4].copy_from_slice(RECORD_MAGIC);
    h[4] = codec_code(kind);
    h[6..8].copy_from_slice(&(table.len() as u16).to_le_bytes());
    h[8..12].copy_from_slice(&(raw.len() as u32).to_le_bytes());
    h[12..16].copy_from_slice(&stored_len.to_le_bytes());
    let crc = crc32c::crc32c_append(
        crc32c::crc32c(&out[start..start + 16]),
        &out[start + RECORD_FIXED_LEN..],
    );
    out[start + 16..start + 20].copy_from_slice(&crc.to_le_bytes());
    if let Some(c) = crypt {
        let sealed_len = (out.len() - start + TAG_LEN) as u32;
        out[frame..frame + 4].copy_from_slice(SEALED_MAGIC);
        out[frame + 4..frame + 8].copy_from_slice(&sealed_len.to_le_bytes());
        let aad: [u8; 8] = out[frame..frame + 8].try_into().unwrap_or([0; 8]);
        c.seal_in_place(&aad, out, start)?;
    }
    Ok(())
}

/// The plain record at the start of `data` (which may go on past it) and
/// the length of its frame in the pack: with `crypt`, a sealed record is
/// decrypted into `plain`; without, the record is `data`'s own.
pub fn open_record<'a>(
    data: &'a [u8],
    crypt: Option<&Crypt>,
    plain: &'a mut Vec<u8>,
) -> std::result::Result<(Record<'a>, usize), &'static str> {
    let Some(c) = crypt else {
        let r = Record::parse(data)?;
        return Ok((r, r.len()));
    };
    if data.len() < SEALED_FIXED_LEN {
        return Err("sealed record header is truncated");
    }
    if &data[..4] != SEALED_MAGIC {
        return Err(if &data[..4] == RECORD_MAGIC {
            "a plain record in an encrypted repository"
        } else {
            "bad sealed record magic"
        });
    }
    let sealed_len = u32_at(data, 4) as usize;
    let end = SEALED_FIXED_LEN + sealed_len;
    if sealed_len < TAG_LEN + RECORD_FIXED_LEN || data.len() < end {
        return Err("sealed record runs past the end of the data");
    }
    if !c.open_to(&data[..8], &data[8..end], plain) {
        return Err("record does not decrypt (damaged, or forged)");
    }
    let r = Record::parse(plain)?;
    if r.len() != plain.len() {
        return Err("sealed record holds more than one record");
    }
    Ok((r, end))
}

/// Opens and decodes records: one decoding context per codec, built on
/// first use, the repository's key if it is encrypted, and a buffer for
/// decrypted records.
#[derive(Default)]
pub struct RecordDecoder {
    codecs: Vec<(CodecKind, Box<dyn BlockCodec>)>,
    crypt: Option<Arc<Crypt>>,
    plain: Vec<u8>,
}

fn codec_for(
    codecs: &mut Vec<(CodecKind, Box<dyn BlockCodec>)>,
    kind: CodecKind,
) -> &mut dyn BlockCodec {
    let i = match codecs.iter().position(|(k, _)| *k == kind) {
        Some(i) => i,
        None => {
            codecs.push((kind, CodecSpec::default_for(kind).build()));
            codecs.len() - 1
        }
    };
    codecs[i].1.as_mut()
}

impl RecordDecoder {
    /// A decoder for the records of a repository with key `crypt` (none:
    /// a plain repository).
    pub fn new(crypt: Option<Arc<Crypt>>) -> RecordDecoder {
        RecordDecoder {
            crypt,
            ..RecordDecoder::default()
        }
    }

    /// The repository's key.
    pub fn crypt(&self) -> Option<&Crypt> {
        self.crypt.as_deref()
    }

    /// The length of the record that begins `data` (sealed or plain, as
    /// the repository's are), if it parses, passes its CRC and, sealed,
    /// decrypts: what its own header says, whatever an index says.
    pub fn length_at(&mut self, data: &[u8]) -> Option<usize> {
        open_record(data, self.crypt.as_deref(), &mut self.plain)
            .ok()
            .map(|(_, len)| len)
    }

    /// Check (and decrypt) the record that is exactly `rec` (read from
    /// `path` at `offset`), replacing the contents of `out` with the
    /// decoded group. Chunks are not hashed here: see
    /// [`RecordDecoder::check_chunk`].
    pub fn decode<'s>(
        &'s mut self,
        path: &Path,
        offset: u64,
        rec: &'s [u8],
        out: &mut Vec<u8>,
    ) -> Result<Record<'s>> {
        let buf = std::mem::take(out);
        let (r, data) = self.decode_with(path, offset, rec, |_| buf)?;
        *out = data;
        Ok(r)
    }

    /// [`RecordDecoder::decode`] into the buffer `buffer` gives for the
    /// group's decoded length (its contents are replaced), returned with
    /// the record.
    pub fn decode_with<'s>(
        &'s mut self,
        path: &Path,
        offset: u64,
        rec: &'s [u8],
        buffer: impl FnOnce(usize) -> Vec<u8>,
    ) -> Result<(Record<'s>, Vec<u8>)> {
        let (r, codec) = self.open(path, offset, rec)?;
        let raw_len = r.header.raw_len as usize;
        let mut out = buffer(raw_len);
        out.clear();
        codec
            .decompress(r.stored, &mut out, raw_len)
            .map_err(|e| undecodable(path, offset, e))?;
        decoded_len(path, offset, out.len(), raw_len)?;
        Ok((r, out))
    }

    /// [`RecordDecoder::decode`] in place into memory `buffer` makes for
    /// the group's decoded length (a buffer to be handed to a pipe), or,
    /// where it makes none (`None`), into `otherwise` as `decode` does.
    pub fn decode_into<B: AsMut<[u8]>>(
        &mut self,
        path: &Path,
        offset: u64,
        rec: &[u8],
        buffer: impl FnOnce(usize) -> Result<Option<B>>,
        otherwise: &mut Vec<u8>,
    ) -> Result<Option<B>> {
        let (r, codec) = self.open(path, offset, rec)?;
        let raw_len = r.header.raw_len as usize;
        let Some(mut out) = buffer(raw_len)? else {
            otherwise.clear();
            codec
                .decompress(r.stored, otherwise, raw_len)
                .map_err(|e| undecodable(path, offset, e))?;
            decoded_len(path, offset, otherwise.len(), raw_len)?;
            return Ok(None);
        };
        codec
            .decompress_into(r.stored, out.as_mut())
            .map_err(|e| undecodable(path, offset, e))?;
        Ok(Some(out))
    }

    /// The checked (and decrypted) record that is exactly `rec`, and the
    /// codec that decodes it.
    fn open<'s>(
        &'s mut self,
        path: &Path,
        offset: u64,
        rec: &'s [u8],
    ) -> Result<(Record<'s>, &'s mut dyn BlockCodec)> {
        let RecordDecoder {
            codecs,
            crypt,
            plain,
        } = self;
        let (r, len) = open_record(rec, crypt.as_deref(), plain)
            .map_err(|why| StoreError::corrupt(path, offset, why))?;
        if len != rec.len() {
            return Err(StoreError::corrupt(
                path,
                offset,
                format!("record is {len} bytes, the index says {}", rec.len()),
            ));
        }
        let codec = codec_for(codecs, r.header.codec);
        Ok((r, codec))
    }

    /// Check that `data` (decoded from the record at `offset` in `path`)
    /// is chunk `id`.
    pub fn check_chunk(&self, path: &Path, offset: u64, id: &ChunkId, data: &[u8]) -> Result<()> {
        check_chunk(self.crypt(), path, offset, id, data)
    }
}

/// Check that a record decoded to the length its header says.
fn decoded_len(path: &Path, offset: u64, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(StoreError::corrupt(
            path,
            offset,
            "decoded length differs from the header",
        ))
    }
}

/// A record whose stored bytes the codec refuses.
fn undecodable(path: &Path, offset: u64, e: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(path, offset, format!("record does not decode: {e}"))
}

/// Check that `data` (decoded from the record at `offset` in `path`) is
/// chunk `id` of a repository with keys `crypt` (none: plain).
pub fn check_chunk(
    crypt: Option<&Crypt>,
    path: &Path,
    offset: u64,
    id: &ChunkId,
    data: &[u8],
) -> Result<()> {
    if crate::crypt::chunk_id(crypt, data) == *id {
        Ok(())
    } else {
        Err(StoreError::BadChunk {
            chunk: *id,
            path: path.to_path_buf(),
            offset,
            reason: "decoded bytes do not hash to the chunk id".into(),
        })
    }
}

/// Walk the records of a whole pack held in `data`: calls `each(offset,
/// frame length, record)` for every record that parses and passes its
/// CRC (and, with `crypt`, decrypts), and returns the offset where the
/// valid sequence ends (the file length for an intact pack), so a torn
/// tail ends the walk.
pub fn walk_records(
    data: &[u8],
    crypt: Option<&Crypt>,
    mut each: impl FnMut(u64, usize, &Record) -> Result<()>,
) -> Result<u64> {
    let mut pos = PACK_HEADER_LEN;
    let mut plain = Vec::new();
    while pos < data.len() {
        let Ok((r, len)) = open_record(&data[pos..], crypt, &mut plain) else {
            break;
        };
        each(pos as u64, len, &r)?;
        pos += len;
    }
    Ok(pos as u64)
}

/// Every sound record of a whole pack held in `data`, also past damage:
/// where a record does not parse, fails its CRC or does not decrypt, the
/// scan moves on to the next record magic. Returns the end of the last
/// sound record.
pub fn scan_records(
    data: &[u8],
    crypt: Option<&Crypt>,
    mut each: impl FnMut(u64, usize, &Record) -> Result<()>,
) -> Result<u64> {
    let magic = if crypt.is_some() {
        SEALED_MAGIC
    } else {
        RECORD_MAGIC
    };
    let mut pos = PACK_HEADER_LEN;
    let mut end = pos;
    let mut plain = Vec::new();
    while pos < data.len() {
        match open_record(&data[pos..], crypt, &mut plain) {
            Ok((r, len)) => {
                each(pos as u64, len, &r)?;
                pos += len;
                end = pos;
            }
            Err(_) => match data[pos + 1..].windows(4).position(|w| w == magic) {
                Some(i) => pos += 1 + i,
                None => break,
            },
        }
    }
    Ok(end as u64)
}

/// A pack being written, to any backend.
pub struct PackWriter {
    sink: Box<dyn ObjectWriter>,
    id: PackId,
    len: u64,
}

impl PackWriter {
    /// Start a new pack in `target` (a target's backend) of repository
    /// `repo`, for `sealed` records or plain ones.
    pub fn create(target: &dyn WriteBackend, repo: RepoId, sealed: bool) -> Result<PackWriter> {
        let id = PackId::random();
        let mut sink = target.create(&Key::pack(id))?;
        sink.append(&encode_pack_header(repo, id, sealed))?;
        Ok(PackWriter {
            sink,
            id,
            len: PACK_HEADER_LEN as u64,
        })
    }

    /// Append records; returns the offset of the first byte.
    pub fn append(&mut self, bytes: &[u8]) -> Result<u64> {
        let at = self.len;
        self.sink.append(bytes)?;
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

    /// Make the pack durable and visible.
    pub fn finish(self) -> Result<(PackId, u64)> {
        self.sink.finish()?;
        Ok((self.id, self.len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: usize, seed: u8) -> (Vec<(ChunkId, u32)>, Vec<u8>) {
        let mut raw = Vec::new();
        let mut table = Vec::new();
        for i in 0..n {
            let chunk: Vec<u8> = (0..5000 + i * 37)
                .map(|j| (j % 251) as u8 ^ (j / 7) as u8 ^ seed ^ i as u8)
                .collect();
            table.push((ChunkId::of(&chunk), chunk.len() as u32));
            raw.extend_from_slice(&chunk);
        }
        (table, raw)
    }

    #[test]
    fn records_round_trip_with_every_codec() {
        let (table, raw) = group(5, 1);
        let mut dec = RecordDecoder::default();
        for kind in CodecKind::ALL {
            let mut codec = CodecSpec::default_for(kind).build();
            let mut rec = Vec::new();
            encode_record(
                &mut rec,
                &table,
                &raw,
                codec.as_mut(),
                &mut Probe::new(),
                None,
            )
            .unwrap();
            let mut out = Vec::new();
            let r = dec.decode(Path::new("p"), 64, &rec, &mut out).unwrap();
            assert_eq!(out, raw, "{kind}");
            let chunks: Vec<_> = r.chunks().collect();
            assert_eq!(chunks.len(), 5);
            for ((id, at, len), (want, wlen)) in chunks.iter().zip(&table) {
                assert_eq!((id, len), (want, wlen));
                dec.check_chunk(
                    Path::new("p"),
                    64,
                    id,
                    &out[*at as usize..(*at + *len) as usize],
                )
                .unwrap();
            }
        }
    }

    #[test]
    fn incompressible_groups_are_stored_raw() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let mut dec = RecordDecoder::default();
        // 4 KiB: too small for the probe, zstd is tried and does not
        // shrink it; 1 MiB: the probe stores it without trying.
        for len in [4096, 1 << 20] {
            let raw = &noise[..len];
            let table: Vec<_> = raw
                .chunks(32 << 10)
                .map(|c| (ChunkId::of(c), c.len() as u32))
                .collect();
            let mut rec = Vec::new();
            let mut codec = CodecSpec::default_for(CodecKind::Zstd).build();
            encode_record(
                &mut rec,
                &table,
                raw,
                codec.as_mut(),
                &mut Probe::new(),
                None,
            )
            .unwrap();
            let h = RecordHeader::parse(&rec).unwrap();
            assert_eq!(h.codec, CodecKind::None, "{len}");
            assert_eq!(
                rec.len(),
                RECORD_FIXED_LEN + TABLE_ENTRY_LEN * table.len() + raw.len()
            );
            let mut out = Vec::new();
            dec.decode(Path::new("p"), 64, &rec, &mut out).unwrap();
            assert_eq!(out, raw, "{len}");
        }
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let (table, raw) = group(2, 3);
        let mut rec = Vec::new();
        let mut codec = CodecSpec::default_for(CodecKind::Lz4).build();
        encode_record(
            &mut rec,
            &table,
            &raw,
            codec.as_mut(),
            &mut Probe::new(),
            None,
        )
        .unwrap();
        let mut dec = RecordDecoder::default();
        for i in 0..rec.len() {
            let mut bad = rec.clone();
            bad[i] ^= 1;
            let mut out = Vec::new();
            assert!(
                dec.decode(Path::new("p"), 0, &bad, &mut out).is_err(),
                "flip at {i}"
            );
        }
    }

    #[test]
    fn walk_stops_at_a_torn_tail() {
        let repo = RepoId::random();
        let mut data = encode_pack_header(repo, PackId::random(), false).to_vec();
        let mut codec = CodecSpec::default_for(CodecKind::Lz4).build();
        let mut ends = Vec::new();
        for i in 0..5u8 {
            let (table, raw) = group(1 + usize::from(i), i);
            encode_record(
                &mut data,
                &table,
                &raw,
                codec.as_mut(),
                &mut Probe::new(),
                None,
            )
            .unwrap();
            ends.push(data.len() as u64);
        }
        assert!(check_pack_header(Path::new("p"), &data, repo, false).is_ok());
        assert!(check_pack_header(Path::new("p"), &data, RepoId::random(), false).is_err());
        let mut n = 0;
        assert_eq!(
            walk_records(&data, None, |_, _, r| {
                n += r.chunks().count();
                Ok(())
            })
            .unwrap(),
            ends[4]
        );
        assert_eq!(n, 1 + 2 + 3 + 4 + 5);
        for cut in [ends[3] + 10, ends[4] - 1, ends[3] + 21] {
            let end = walk_records(&data[..cut as usize], None, |_, _, _| Ok(())).unwrap();
            assert_eq!(end, ends[3], "cut {cut}");
        }
    }

    #[test]
    fn bad_groups_are_refused() {
        let mut codec = CodecSpec::default_for(CodecKind::None).build();
        let mut out = Vec::new();
        assert!(
            encode_record(&mut out, &[], &[], codec.as_mut(), &mut Probe::new(), None).is_err()
        );
        let big = vec![1u8; MAX_GROUP_RAW + 1];
        assert!(encode_record(
            &mut out,
            &[(ChunkId::of(&big), big.len() as u32)],
            &big,
            codec.as_mut(),
            &mut Probe::new(),
            None
        )
        .is_err());
    }

    #[test]
    fn sealed_packs_hide_their_records_and_walk_with_the_key() {
        let crypt = Arc::new(Crypt::generate().unwrap());
        let c = Some(&*crypt);
        let repo = RepoId::random();
        let mut data = encode_pack_header(repo, PackId::random(), true).to_vec();
        assert!(check_pack_header(Path::new("p"), &data, repo, true).is_ok());
        assert!(check_pack_header(Path::new("p"), &data, repo, false).is_err());
        let mut codec = CodecSpec::default_for(CodecKind::Zstd).build();
        let mut starts = Vec::new();
        let mut groups = Vec::new();
        for i in 0..4u8 {
            let (plain_table, raw) = group(2 + usize::from(i), i);
            // The ids a keyed repository gives these chunks.
            let table: Vec<_> = plain_table
                .iter()
                .scan(0usize, |at, (_, n)| {
                    let chunk = &raw[*at..*at + *n as usize];
                    *at += *n as usize;
                    Some((crypt.chunk_id(chunk), *n))
                })
                .collect();
            starts.push(data.len());
            encode_record(
                &mut data,
                &table,
                &raw,
                codec.as_mut(),
                &mut Probe::new(),
                c,
            )
            .unwrap();
            groups.push((table, raw));
        }
        starts.push(data.len());
        // Neither the chunk ids nor the group's bytes appear in the pack.
        for (table, raw) in &groups {
            assert!(!data.windows(32).any(|w| w == table[0].0 .0));
            assert!(!data.windows(64).any(|w| w == &raw[..64]));
        }
        let mut dec = RecordDecoder::new(Some(crypt.clone()));
        for (k, (table, raw)) in groups.iter().enumerate() {
            let rec = &data[starts[k]..starts[k + 1]];
            let mut out = Vec::new();
            let r = dec.decode(Path::new("p"), 0, rec, &mut out).unwrap();
            let chunks: Vec<_> = r.chunks().collect();
            assert_eq!(&out, raw);
            for ((id, at, n), (want, _)) in chunks.iter().zip(table) {
                assert_eq!(id, want);
                dec.check_chunk(
                    Path::new("p"),
                    0,
                    id,
                    &out[*at as usize..(*at + *n) as usize],
                )
                .unwrap();
            }
            // Every flipped byte of a sealed record is caught.
            for i in (0..rec.len()).step_by(97) {
                let mut bad = rec.to_vec();
                bad[i] ^= 4;
                assert!(
                    dec.decode(Path::new("p"), 0, &bad, &mut out).is_err(),
                    "flip at {i}"
                );
            }
            // Without the key, or with another, it does not open.
            let mut plain_dec = RecordDecoder::default();
            assert!(plain_dec.decode(Path::new("p"), 0, rec, &mut out).is_err());
            let mut other = RecordDecoder::new(Some(Arc::new(Crypt::generate().unwrap())));
            assert!(other.decode(Path::new("p"), 0, rec, &mut out).is_err());
        }
        let mut n = 0;
        let end = walk_records(&data, c, |_, _, r| {
            n += r.chunks().count();
            Ok(())
        })
        .unwrap();
        assert_eq!((end, n), (data.len() as u64, 2 + 3 + 4 + 5));
        // Damage in the second record: the scan finds the others.
        let mut bad = data.clone();
        bad[starts[1] + 40] ^= 1;
        let mut seen = Vec::new();
        scan_records(&bad, c, |off, len, _| {
            seen.push((off as usize, off as usize + len));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            seen,
            vec![
                (starts[0], starts[1]),
                (starts[2], starts[3]),
                (starts[3], starts[4])
            ]
        );
    }
}
