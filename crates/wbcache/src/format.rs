//! The on-disk format of the cache device (docs/format/wbcache.md): the
//! superblock, the two watermark slots, segment headers and persistent
//! log records, encoded and decoded. Nothing here does I/O.

use crate::error::WbError;

/// Bytes in a block of the backing device (the unit the cache logs).
pub const BLOCK_SIZE: u64 = 4096;
/// Bytes in a sector (the unit of the dirty bits).
pub const SECTOR_SIZE: u64 = 512;
/// Data blocks per segment: a header block holds 64 bytes of header and
/// 16 bytes of metadata per data block, so 252 fill it exactly.
pub const DATA_BLOCKS: usize = 252;
/// Bytes of one segment slot: a header block and the data blocks.
pub const SEGMENT_BYTES: u64 = (1 + DATA_BLOCKS as u64) * BLOCK_SIZE;
/// Where the segment ring starts on the cache device.
pub const RING_OFFSET: u64 = 1 << 20;
/// Where the persistent log (plog) region starts on the cache device; it
/// ends where the ring starts.
pub const PLOG_OFFSET: u64 = 64 << 10;
/// Byte offsets of watermark slots A and B.
pub const WATERMARK_OFFSETS: [u64; 2] = [4096, 8192];
/// Byte offsets of flush mark slots A and B (format version 4).
pub const MARK_OFFSETS: [u64; 2] = [12288, 16384];
/// Byte offset of the owner block (format version 4).
pub const OWNER_OFFSET: u64 = 20480;
/// The format version this crate writes and the newest it reads. Version
/// 2 added the persistent log; a version 1 cache (no plog records, the
/// region unused) is read as one with an empty plog. The bump keeps a
/// reader that knows no plog from opening a cache whose newest flushed
/// writes may be only in the plog. Version 3 made damage tell itself from
/// a torn tail: every segment header records the newest segment known
/// durable when it was sealed, and `format` writes a first watermark, so
/// a cache with no readable watermark is damaged. Versions 1 and 2 (no
/// such record: a damaged segment there still reads as the end of the
/// log) are read. Version 4 added the flush mark: a record, written
/// shortly after each completed FLUSH, of the segments and plog records
/// that FLUSH made durable, so that damage to the last ones (which no
/// later segment vouches for) is not read as a torn tail. Versions 1-3
/// (no mark) are read, and written to without one.
pub const FORMAT_VERSION: u32 = 4;
/// The first version whose segment headers record the durable id and
/// whose `format` writes a watermark.
pub const DAMAGE_EVIDENT_VERSION: u32 = 3;
/// The first version with flush marks.
pub const MARKED_VERSION: u32 = 4;

const SB_MAGIC: &[u8; 8] = b"CAIRNWB\0";
const WM_MAGIC: &[u8; 8] = b"CAIRNWM\0";
const SG_MAGIC: &[u8; 8] = b"CAIRNSG\0";
const MK_MAGIC: &[u8; 8] = b"CAIRNFM\0";
const OW_MAGIC: &[u8; 8] = b"CAIRNOW\0";

/// Whether `b` starts with a watermark's magic (of any cache).
pub fn is_watermark(b: &[u8]) -> bool {
    b.starts_with(WM_MAGIC)
}
const PL_MAGIC: &[u8; 8] = b"CAIRNPL\0";
/// Bytes of the fixed part of a segment header.
const HEADER_FIXED: usize = 64;
/// Bytes of one metadata entry.
const ENTRY_BYTES: usize = 16;

/// The slot that segment `id` (>= 1) lives in.
pub fn segment_slot(id: u64, segment_count: u64) -> u64 {
    (id - 1) % segment_count
}

/// The byte offset of segment `id` on the cache device.
pub fn segment_offset(id: u64, segment_count: u64) -> u64 {
    RING_OFFSET + segment_slot(id, segment_count) * SEGMENT_BYTES
}

/// How many segments a cache device of `cache_size` bytes holds.
pub fn segments_for(cache_size: u64) -> u64 {
    cache_size.saturating_sub(RING_OFFSET) / SEGMENT_BYTES
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn id16(b: &[u8], at: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    a
}

/// The superblock (offset 0, written once by `format`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Superblock {
    /// The format version on disk (encode always writes FORMAT_VERSION).
    pub version: u32,
    pub segment_count: u64,
    pub cache_id: [u8; 16],
    pub backing_size: u64,
    pub created: u64,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_SIZE as usize];
        b[0..8].copy_from_slice(SB_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
        b[16..20].copy_from_slice(&(DATA_BLOCKS as u32).to_le_bytes());
        b[24..32].copy_from_slice(&self.segment_count.to_le_bytes());
        b[32..48].copy_from_slice(&self.cache_id);
        b[48..56].copy_from_slice(&self.backing_size.to_le_bytes());
        b[56..64].copy_from_slice(&self.created.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..64]);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, WbError> {
        let bad = |reason: &'static str| WbError::BadSuperblock { reason };
        if b.len() < 68 || &b[0..8] != SB_MAGIC {
            return Err(bad("no cairn write-back cache superblock (magic)"));
        }
        if crc32c::crc32c(&b[0..64]) != le_u32(b, 64) {
            return Err(bad("checksum mismatch"));
        }
        let version = le_u32(b, 8);
        if version > FORMAT_VERSION || version == 0 {
            return Err(WbError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        if u64::from(le_u32(b, 12)) != BLOCK_SIZE {
            return Err(bad("block size is not 4096"));
        }
        if le_u32(b, 16) as usize != DATA_BLOCKS {
            return Err(bad("data blocks per segment is not 252"));
        }
        let segment_count = le_u64(b, 24);
        if segment_count < 2 {
            return Err(bad("fewer than 2 segments"));
        }
        Ok(Superblock {
            version,
            segment_count,
            cache_id: id16(b, 32),
            backing_size: le_u64(b, 48),
            created: le_u64(b, 56),
        })
    }
}

/// The highest sequence number a watermark or flush mark slot may hold:
/// one above it is never reached by counting (2^62 writes), so it is
/// damage, and the next write's sequence number cannot overflow.
pub const MAX_SEQ: u64 = 1 << 62;

/// A watermark slot's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Watermark {
    pub seq: u64,
    pub clean_id: u64,
}

impl Watermark {
    /// The slot (0 = A, 1 = B) a watermark with this sequence number goes to.
    pub fn slot(seq: u64) -> usize {
        if seq % 2 == 1 {
            0
        } else {
            1
        }
    }

    pub fn encode(&self, cache_id: &[u8; 16]) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_SIZE as usize];
        b[0..8].copy_from_slice(WM_MAGIC);
        b[8..24].copy_from_slice(cache_id);
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.clean_id.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The watermark in `b`, if it is valid and belongs to `cache_id`.
    pub fn decode(b: &[u8], cache_id: &[u8; 16]) -> Option<Watermark> {
        if b.len() < 44 || &b[0..8] != WM_MAGIC || &b[8..24] != cache_id {
            return None;
        }
        if crc32c::crc32c(&b[0..40]) != le_u32(b, 40) || le_u64(b, 24) > MAX_SEQ {
            return None;
        }
        Some(Watermark {
            seq: le_u64(b, 24),
            clean_id: le_u64(b, 32),
        })
    }
}

/// A flush mark slot's contents (format version 4): what completed
/// FLUSHes had made durable when it was written. Slots alternate like the
/// watermark's (odd sequence numbers in A).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct FlushMark {
    pub seq: u64,
    /// Every segment up to this id was written and a cache flush followed.
    pub durable_id: u64,
    /// Plog records `1..=plog_seq` of segment `plog_segment` were written
    /// and flushed (0, 0: none claimed).
    pub plog_segment: u64,
    pub plog_seq: u64,
}

impl FlushMark {
    /// The claims of the mark, without its sequence number.
    pub fn claims(&self) -> (u64, u64, u64) {
        (self.durable_id, self.plog_segment, self.plog_seq)
    }

    pub fn encode(&self, cache_id: &[u8; 16]) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_SIZE as usize];
        b[0..8].copy_from_slice(MK_MAGIC);
        b[8..24].copy_from_slice(cache_id);
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.durable_id.to_le_bytes());
        b[40..48].copy_from_slice(&self.plog_segment.to_le_bytes());
        b[48..56].copy_from_slice(&self.plog_seq.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..56]);
        b[56..60].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The mark in `b`, if it is valid and belongs to `cache_id`.
    pub fn decode(b: &[u8], cache_id: &[u8; 16]) -> Option<FlushMark> {
        if b.len() < 60 || &b[0..8] != MK_MAGIC || &b[8..24] != cache_id {
            return None;
        }
        if crc32c::crc32c(&b[0..56]) != le_u32(b, 56) || le_u64(b, 24) > MAX_SEQ {
            return None;
        }
        Some(FlushMark {
            seq: le_u64(b, 24),
            durable_id: le_u64(b, 32),
            plog_segment: le_u64(b, 40),
            plog_seq: le_u64(b, 48),
        })
    }
}

/// What the cache is in front of (format version 4): a key compared
/// between opens, and a description for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Compared: the same backing gives the same key (a file's device
    /// and inode; an image's repository, name and overlay).
    pub key: String,
    /// Shown: what a user recognises (a path, an image name).
    pub description: String,
}

impl Owner {
    /// Longest key plus description an owner block holds.
    pub const MAX_TEXT: usize = BLOCK_SIZE as usize - 36;

    /// The part of the key that names the backing: before an `@`, what
    /// follows being where it was found (a block device's number, which
    /// may name another disk after a reboot or `losetup -d`).
    pub fn base_key(&self) -> &str {
        self.key.split_once('@').map_or(&self.key, |(base, _)| base)
    }

    /// Whether `self` (recorded in a cache) and `given` (named now) are
    /// the same backing: the same base key; or `self` is a block device
    /// recorded by number alone (before stable names), and `given` is
    /// found at that number.
    pub fn same_backing(&self, given: &Owner) -> bool {
        self.base_key() == given.base_key()
            || (!self.key.contains('@')
                && self.key.starts_with("device:")
                && given
                    .key
                    .split_once('@')
                    .is_some_and(|(_, at)| at == self.key))
    }

    pub(crate) fn encode(&self, cache_id: &[u8; 16]) -> Vec<u8> {
        let mut key = self.key.as_bytes();
        key = &key[..key.len().min(Self::MAX_TEXT / 2)];
        let mut desc = self.description.as_bytes();
        desc = &desc[..desc.len().min(Self::MAX_TEXT - key.len())];
        let mut b = vec![0u8; BLOCK_SIZE as usize];
        b[0..8].copy_from_slice(OW_MAGIC);
        b[8..24].copy_from_slice(cache_id);
        b[24..26].copy_from_slice(&(key.len() as u16).to_le_bytes());
        b[26..28].copy_from_slice(&(desc.len() as u16).to_le_bytes());
        b[28..28 + key.len()].copy_from_slice(key);
        b[28 + key.len()..28 + key.len() + desc.len()].copy_from_slice(desc);
        let end = 28 + key.len() + desc.len();
        let crc = crc32c::crc32c(&b[..end]);
        b[end..end + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The owner in `b`, if it is valid and belongs to `cache_id`.
    pub(crate) fn decode(b: &[u8], cache_id: &[u8; 16]) -> Option<Owner> {
        if b.len() < 32 || &b[0..8] != OW_MAGIC || &b[8..24] != cache_id {
            return None;
        }
        let klen = usize::from(u16::from_le_bytes([b[24], b[25]]));
        let dlen = usize::from(u16::from_le_bytes([b[26], b[27]]));
        let end = 28 + klen + dlen;
        if end + 4 > b.len() || crc32c::crc32c(&b[..end]) != le_u32(b, end) {
            return None;
        }
        Some(Owner {
            key: String::from_utf8_lossy(&b[28..28 + klen]).into_owned(),
            description: String::from_utf8_lossy(&b[28 + klen..end]).into_owned(),
        })
    }
}

/// One metadata entry of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub lba: u64,
    pub dirty: u8,
    /// kind = 1: the block reads as zeroes and uses no data block.
    pub zero: bool,
}

/// Build a segment image (header block + `data`, which holds one block
/// per data entry in entry order).
#[cfg(test)]
pub(crate) fn encode_segment(
    cache_id: &[u8; 16],
    id: u64,
    entries: &[Entry],
    data: &[u8],
) -> Vec<u8> {
    let mut img = vec![0u8; BLOCK_SIZE as usize + data.len()];
    img[BLOCK_SIZE as usize..].copy_from_slice(data);
    finish_segment(cache_id, id, 0, entries, &mut img);
    img
}

/// Write the header of a segment image in place: `img` is the header
/// block (overwritten whole) followed by one block per data entry, in
/// entry order. `durable`: every segment up to this id was written and
/// followed by a cache device flush before this one was sealed.
pub(crate) fn finish_segment(
    cache_id: &[u8; 16],
    id: u64,
    durable: u64,
    entries: &[Entry],
    img: &mut [u8],
) {
    let (hdr, data) = img.split_at_mut(BLOCK_SIZE as usize);
    hdr.fill(0);
    hdr[0..8].copy_from_slice(SG_MAGIC);
    hdr[8..24].copy_from_slice(cache_id);
    hdr[24..32].copy_from_slice(&id.to_le_bytes());
    hdr[32..36].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    hdr[SG_DURABLE_AT..SG_DURABLE_AT + 8].copy_from_slice(&durable.to_le_bytes());
    put_entries(hdr, entries);
    let crc = header_crc(
        &hdr[..HEADER_FIXED + entries.len() * ENTRY_BYTES],
        SG_CRC_AT,
        data,
    );
    hdr[SG_CRC_AT..SG_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Where the CRC field of a segment header is.
const SG_CRC_AT: usize = 36;
/// Where a segment header records the newest durable segment (version 3;
/// zero before).
const SG_DURABLE_AT: usize = 40;
/// Where the CRC field of a plog record header is.
const PL_CRC_AT: usize = 44;

/// CRC of a header (its bytes up to the last used entry; the 4-byte CRC
/// field at `crc_at` is taken as 0) followed by the data blocks.
fn header_crc(header: &[u8], crc_at: usize, data: &[u8]) -> u32 {
    let c = crc32c::crc32c(&header[..crc_at]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    let c = crc32c::crc32c_append(c, &header[crc_at + 4..]);
    crc32c::crc32c_append(c, data)
}

fn put_entries(b: &mut [u8], entries: &[Entry]) {
    for (i, e) in entries.iter().enumerate() {
        let at = HEADER_FIXED + i * ENTRY_BYTES;
        b[at..at + 8].copy_from_slice(&e.lba.to_le_bytes());
        b[at + 8] = e.dirty;
        b[at + 9] = u8::from(e.zero);
    }
}

/// Parse `count` entries (1..=`DATA_BLOCKS`) of a header block, each inside
/// a device of `blocks` blocks.
fn get_entries(b: &[u8], count: usize, blocks: u64) -> Option<Vec<Entry>> {
    if count == 0 || count > DATA_BLOCKS || b.len() < HEADER_FIXED + count * ENTRY_BYTES {
        return None;
    }
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let at = HEADER_FIXED + i * ENTRY_BYTES;
        let lba = le_u64(b, at);
        let kind = b[at + 9];
        if lba >= blocks || kind > 1 {
            return None;
        }
        entries.push(Entry {
            lba,
            dirty: b[at + 8],
            zero: kind == 1,
        });
    }
    Some(entries)
}

/// Build a plog record (header block + `data`, one block per data entry in
/// entry order) for the open segment that will get id `segment_id`.
#[cfg(test)]
pub(crate) fn encode_plog_record(
    cache_id: &[u8; 16],
    segment_id: u64,
    seq: u64,
    entries: &[Entry],
    data: &[u8],
) -> Vec<u8> {
    let mut img = vec![0u8; BLOCK_SIZE as usize + data.len()];
    img[BLOCK_SIZE as usize..].copy_from_slice(data);
    finish_plog_record(cache_id, segment_id, seq, entries, &mut img);
    img
}

/// Write the header of a plog record in place: `img` is the header block
/// (overwritten whole) followed by one block per data entry, in entry
/// order.
pub(crate) fn finish_plog_record(
    cache_id: &[u8; 16],
    segment_id: u64,
    seq: u64,
    entries: &[Entry],
    img: &mut [u8],
) {
    let (hdr, data) = img.split_at_mut(BLOCK_SIZE as usize);
    hdr.fill(0);
    hdr[0..8].copy_from_slice(PL_MAGIC);
    hdr[8..24].copy_from_slice(cache_id);
    hdr[24..32].copy_from_slice(&segment_id.to_le_bytes());
    hdr[32..40].copy_from_slice(&seq.to_le_bytes());
    hdr[40..44].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    put_entries(hdr, entries);
    let crc = header_crc(
        &hdr[..HEADER_FIXED + entries.len() * ENTRY_BYTES],
        PL_CRC_AT,
        data,
    );
    hdr[PL_CRC_AT..PL_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A plog record header that passed its structural checks (the CRC needs
/// the data blocks too: [`PlogHeader::check_crc`]).
#[derive(Debug, Clone)]
pub(crate) struct PlogHeader {
    pub segment_id: u64,
    pub seq: u64,
    pub entries: Vec<Entry>,
    header: Vec<u8>,
    crc: u32,
}

impl PlogHeader {
    /// The segment id in a block, if it has the plog record magic and this
    /// cache's id (used to find stale records).
    pub fn peek_segment(b: &[u8], cache_id: &[u8; 16]) -> Option<u64> {
        if b.len() < 32 || &b[0..8] != PL_MAGIC || &b[8..24] != cache_id {
            return None;
        }
        Some(le_u64(b, 24))
    }

    /// Parse a block that may hold a record header of this cache. `blocks`
    /// is the number of blocks of the backing device.
    pub fn decode(b: &[u8], cache_id: &[u8; 16], blocks: u64) -> Option<PlogHeader> {
        let segment_id = PlogHeader::peek_segment(b, cache_id)?;
        if b.len() < HEADER_FIXED {
            return None;
        }
        let count = le_u32(b, 40) as usize;
        let entries = get_entries(b, count, blocks)?;
        Some(PlogHeader {
            segment_id,
            seq: le_u64(b, 32),
            entries,
            header: b[..HEADER_FIXED + count * ENTRY_BYTES].to_vec(),
            crc: le_u32(b, PL_CRC_AT),
        })
    }

    /// Data blocks the entries use.
    pub fn data_blocks(&self) -> usize {
        self.entries.iter().filter(|e| !e.zero).count()
    }

    /// Whether the CRC matches with these data blocks.
    pub fn check_crc(&self, data: &[u8]) -> bool {
        header_crc(&self.header, PL_CRC_AT, data) == self.crc
    }
}

/// A segment header that passed its structural checks (the CRC needs the
/// data blocks too: [`SegmentHeader::check_crc`]).
#[derive(Debug, Clone)]
pub(crate) struct SegmentHeader {
    pub entries: Vec<Entry>,
    header: Vec<u8>,
    crc: u32,
}

impl SegmentHeader {
    /// The id in a header block, if it has the segment magic and this
    /// cache's id (used to find stale segments).
    pub fn peek_id(b: &[u8], cache_id: &[u8; 16]) -> Option<u64> {
        if b.len() < 32 || &b[0..8] != SG_MAGIC || &b[8..24] != cache_id {
            return None;
        }
        Some(le_u64(b, 24))
    }

    /// Parse a header block that should hold segment `id`. `blocks` is the
    /// number of blocks of the backing device (entries must lie inside).
    pub fn decode(b: &[u8], cache_id: &[u8; 16], id: u64, blocks: u64) -> Option<SegmentHeader> {
        if SegmentHeader::peek_id(b, cache_id) != Some(id) {
            return None;
        }
        let count = le_u32(b, 32) as usize;
        let entries = get_entries(b, count, blocks)?;
        Some(SegmentHeader {
            entries,
            header: b[..HEADER_FIXED + count * ENTRY_BYTES].to_vec(),
            crc: le_u32(b, 36),
        })
    }

    /// Data blocks the entries use.
    pub fn data_blocks(&self) -> usize {
        self.entries.iter().filter(|e| !e.zero).count()
    }

    /// Whether the CRC matches with these data blocks.
    pub fn check_crc(&self, data: &[u8]) -> bool {
        header_crc(&self.header, SG_CRC_AT, data) == self.crc
    }

    /// Every segment up to this id was durable when this one was sealed
    /// (0 in versions 1 and 2: no claim).
    pub fn durable(&self) -> u64 {
        le_u64(&self.header, SG_DURABLE_AT)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn header_fits_one_block() {
        assert_eq!(
            HEADER_FIXED + DATA_BLOCKS * ENTRY_BYTES,
            BLOCK_SIZE as usize
        );
    }

    #[test]
    fn superblock_round_trip_and_damage() {
        let sb = Superblock {
            version: FORMAT_VERSION,
            segment_count: 7,
            cache_id: [3; 16],
            backing_size: 1 << 30,
            created: 12,
        };
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        b[25] ^= 1;
        assert!(matches!(
            Superblock::decode(&b),
            Err(WbError::BadSuperblock { .. })
        ));
    }

    #[test]
    fn segment_round_trip_and_damage() {
        let id = [9; 16];
        let entries = [
            Entry {
                lba: 5,
                dirty: 0xff,
                zero: false,
            },
            Entry {
                lba: 2,
                dirty: 0xff,
                zero: true,
            },
        ];
        let data = vec![7u8; 4096];
        let img = encode_segment(&id, 3, &entries, &data);
        let h = SegmentHeader::decode(&img[..4096], &id, 3, 100).unwrap();
        assert_eq!(h.entries, entries);
        assert_eq!(h.data_blocks(), 1);
        assert!(h.check_crc(&img[4096..]));
        let mut bad = img[4096..].to_vec();
        bad[100] ^= 1;
        assert!(!h.check_crc(&bad));
        assert!(SegmentHeader::decode(&img[..4096], &id, 4, 100).is_none());
        assert!(SegmentHeader::decode(&img[..4096], &[0; 16], 3, 100).is_none());
        assert!(SegmentHeader::decode(&img[..4096], &id, 3, 5).is_none());
    }

    #[test]
    fn plog_record_round_trip_and_damage() {
        let id = [4; 16];
        let entries = [
            Entry {
                lba: 8,
                dirty: 0x0c,
                zero: false,
            },
            Entry {
                lba: 1,
                dirty: 0xff,
                zero: true,
            },
        ];
        let data = vec![5u8; 4096];
        let img = encode_plog_record(&id, 7, 3, &entries, &data);
        assert_eq!(img.len(), 8192);
        assert_eq!(PlogHeader::peek_segment(&img, &id), Some(7));
        let h = PlogHeader::decode(&img[..4096], &id, 100).unwrap();
        assert_eq!((h.segment_id, h.seq), (7, 3));
        assert_eq!(h.entries, entries);
        assert_eq!(h.data_blocks(), 1);
        assert!(h.check_crc(&img[4096..]));
        let mut bad = img[4096..].to_vec();
        bad[9] ^= 1;
        assert!(!h.check_crc(&bad));
        let mut hb = img[..4096].to_vec();
        hb[33] ^= 1; // the sequence number is covered by the CRC
        assert!(!PlogHeader::decode(&hb, &id, 100)
            .unwrap()
            .check_crc(&img[4096..]));
        assert!(PlogHeader::decode(&img[..4096], &[0; 16], 100).is_none());
        assert!(PlogHeader::decode(&img[..4096], &id, 8).is_none());
        // A segment header is not a record, nor are zeroes.
        let seg = encode_segment(&id, 7, &entries, &data);
        assert!(PlogHeader::decode(&seg[..4096], &id, 100).is_none());
        assert!(PlogHeader::decode(&[0u8; 4096], &id, 100).is_none());
        assert!(PLOG_OFFSET >= WATERMARK_OFFSETS[1] + BLOCK_SIZE);
    }

    #[test]
    fn owners_round_trip_and_are_checked() {
        let id = [5u8; 16];
        let o = Owner {
            key: "file:1:2".into(),
            description: "the file /x/back.img".into(),
        };
        let b = o.encode(&id);
        assert_eq!(Owner::decode(&b, &id), Some(o.clone()));
        assert_eq!(Owner::decode(&b, &[6u8; 16]), None);
        for at in [9, 25, 30, 40, 58] {
            let mut bad = b.clone();
            bad[at] ^= 1;
            assert_eq!(Owner::decode(&bad, &id), None, "byte {at}");
        }
        // Too long a text is cut, never past the block.
        // The base key names the backing; a device number recorded alone
        // (older caches) matches a device found at that number.
        let at = |key: &str| Owner {
            key: key.into(),
            description: String::new(),
        };
        assert!(at("file:1:2@device:7").same_backing(&at("file:1:2")));
        assert!(at("file:1:2").same_backing(&at("file:1:2@device:9")));
        assert!(!at("file:1:2@device:7").same_backing(&at("file:1:3@device:7")));
        assert!(at("device:7").same_backing(&at("device:dm:x@device:7")));
        assert!(!at("device:7").same_backing(&at("device:dm:x@device:8")));
        assert!(!at("device:dm:y@device:7").same_backing(&at("device:dm:x@device:7")));
        let long = Owner {
            key: "k".repeat(5000),
            description: "d".repeat(5000),
        };
        let b = long.encode(&id);
        assert_eq!(b.len(), 4096);
        let back = Owner::decode(&b, &id).unwrap();
        assert!(back.key.len() + back.description.len() <= Owner::MAX_TEXT);
        const { assert!(OWNER_OFFSET >= MARK_OFFSETS[1] + BLOCK_SIZE) };
        const { assert!(OWNER_OFFSET + BLOCK_SIZE <= PLOG_OFFSET) };
    }

    #[test]
    fn flush_marks_round_trip_and_are_checked() {
        let id = [3u8; 16];
        let m = FlushMark {
            seq: 5,
            durable_id: 12,
            plog_segment: 13,
            plog_seq: 4,
        };
        let b = m.encode(&id);
        assert_eq!(FlushMark::decode(&b, &id), Some(m));
        assert_eq!(FlushMark::decode(&b, &[4u8; 16]), None);
        for at in [24, 33, 41, 49, 57] {
            let mut bad = b.clone();
            bad[at] ^= 1;
            assert_eq!(FlushMark::decode(&bad, &id), None, "byte {at}");
        }
        // A watermark is not a mark, and the slots lie between the
        // watermarks and the plog.
        let w = Watermark {
            seq: 5,
            clean_id: 12,
        };
        assert_eq!(FlushMark::decode(&w.encode(&id), &id), None);
        // A sequence number no count reaches is not taken.
        let huge = FlushMark { seq: u64::MAX, ..m };
        assert_eq!(FlushMark::decode(&huge.encode(&id), &id), None);
        let huge = Watermark {
            seq: MAX_SEQ + 1,
            clean_id: 1,
        };
        assert_eq!(Watermark::decode(&huge.encode(&id), &id), None);
        assert!(MARK_OFFSETS[0] >= WATERMARK_OFFSETS[1] + BLOCK_SIZE);
        assert!(MARK_OFFSETS[1] + BLOCK_SIZE <= PLOG_OFFSET);
    }

    #[test]
    fn watermark_slots_alternate() {
        assert_eq!(Watermark::slot(1), 0);
        assert_eq!(Watermark::slot(2), 1);
        let w = Watermark {
            seq: 4,
            clean_id: 9,
        };
        let b = w.encode(&[1; 16]);
        assert_eq!(Watermark::decode(&b, &[1; 16]), Some(w));
        assert_eq!(Watermark::decode(&b, &[2; 16]), None);
    }
}
