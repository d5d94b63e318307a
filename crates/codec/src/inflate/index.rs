//! The checkpoint index of a gzip file (`cairn unpack --index FILE`):
//! where the parallel inflate of each member found a block boundary that
//! the output reached exactly, with the 32 KiB of output before it, so a
//! later read starts every chunk there with its window known (no search,
//! no marker stage). The file format is `docs/format/gzip-index.md`.
//!
//! An index makes a read faster; the data decides the output: a
//! checkpoint is used only where the data passes the checks a block found
//! by the search passes, a chunk started from it is kept only if the
//! output before it reached the same bit with the same 32 KiB (the reader
//! compares them), and the member's CRC is checked as always. Decoding
//! bounds what a hostile file can make a reader hold (`MIN_CHUNK`).

use std::collections::BTreeMap;
use std::fmt;

/// Magic at the start of an index file.
pub const MAGIC: &[u8; 8] = b"CAIRNGZX";
/// The format version written and read.
pub const VERSION: u32 = 1;

/// A block boundary inside a member, with the output before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The chunk (of the member's compressed bytes, `chunk_bits` each)
    /// whose first block this is.
    pub chunk: u64,
    /// Its bit, from the start of the member's DEFLATE data.
    pub bit: u64,
    /// Output bytes of the member before it.
    pub out: u64,
    /// The last 32 KiB of that output (fewer near the member's start).
    pub window: Vec<u8>,
}

/// The checkpoints of one member.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberIndex {
    /// The chunk size in bits the checkpoints were found with.
    pub chunk_bits: u64,
    /// The member's output length.
    pub out_len: u64,
    /// In order of `chunk` (and of `bit`).
    pub points: Vec<Checkpoint>,
}

/// The index of a gzip file: its length and, for each member inflated in
/// parallel, keyed by the offset of its DEFLATE data, its checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GzipIndex {
    /// Length of the gzip file it was made for.
    pub input_len: u64,
    /// Each member inflated in parallel, by the offset of its DEFLATE data.
    pub members: BTreeMap<u64, MemberIndex>,
    /// Whether members were added since it was read (it needs writing).
    pub changed: bool,
}

/// Why an index file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexError(pub String);

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IndexError {}

/// Largest window a checkpoint holds.
const WINDOW: usize = 32 << 10;
/// Most members and checkpoints per member a file may declare (a 1 TiB
/// member in 8 MiB chunks has 2^17); bounds what a damaged count reserves.
const MAX_COUNT: u32 = 1 << 24;
/// Smallest and largest chunk an index may use, in bytes (cairn writes
/// 8 MiB). With every checkpoint in a chunk of its own, the windows take
/// at most 1/32 of the gzip file's size in memory.
pub const MIN_CHUNK: u64 = 1 << 20;
/// See [`MIN_CHUNK`].
pub const MAX_CHUNK: u64 = 1 << 28;

impl GzipIndex {
    /// An empty index for a gzip file of `input_len` bytes.
    pub fn new(input_len: u64) -> Self {
        GzipIndex {
            input_len,
            ..Default::default()
        }
    }

    /// The index as a file's bytes: windows compressed with zstd, a
    /// CRC-32C of everything at the end.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.input_len.to_le_bytes());
        b.extend_from_slice(&(self.members.len() as u32).to_le_bytes());
        for (offset, m) in &self.members {
            b.extend_from_slice(&offset.to_le_bytes());
            b.extend_from_slice(&m.chunk_bits.to_le_bytes());
            b.extend_from_slice(&m.out_len.to_le_bytes());
            b.extend_from_slice(&(m.points.len() as u32).to_le_bytes());
            for p in &m.points {
                b.extend_from_slice(&p.chunk.to_le_bytes());
                b.extend_from_slice(&p.bit.to_le_bytes());
                b.extend_from_slice(&p.out.to_le_bytes());
                // Compressing 32 KiB from memory cannot fail; store it
                // plain if it ever did.
                let z = zstd::bulk::compress(&p.window, 3).unwrap_or_default();
                let (kind, body) = if z.is_empty() || z.len() >= p.window.len() {
                    (0u8, &p.window[..])
                } else {
                    (1u8, &z[..])
                };
                b.extend_from_slice(&(p.window.len() as u32).to_le_bytes());
                b.push(kind);
                b.extend_from_slice(&(body.len() as u32).to_le_bytes());
                b.extend_from_slice(body);
            }
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Read an index file's bytes; damage, truncation and a newer version
    /// are errors.
    pub fn decode(data: &[u8]) -> Result<GzipIndex, IndexError> {
        let bad = |what: &str| IndexError(format!("not a valid cairn gzip index: {what}"));
        if data.len() < 8 || &data[..8] != MAGIC {
            return Err(bad("wrong magic"));
        }
        if data.len() < 32 {
            return Err(bad("truncated"));
        }
        let (body, crc) = data.split_at(data.len() - 4);
        let version = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
        if version == 0 {
            return Err(bad("version 0"));
        }
        if version > VERSION {
            return Err(IndexError(format!(
                "gzip index format version {version} is newer than this cairn supports"
            )));
        }
        if crc32c::crc32c(body).to_le_bytes() != crc {
            return Err(bad("checksum mismatch (damaged)"));
        }
        let mut r = Reader { b: body, at: 12 };
        if r.u32()? != 0 {
            return Err(bad("reserved field not zero"));
        }
        let input_len = r.u64()?;
        let mut index = GzipIndex::new(input_len);
        let members = r.count()?;
        // Every checkpoint lies in a chunk of its own of the file.
        let mut points_left = input_len / MIN_CHUNK;
        let mut last_offset = None;
        for _ in 0..members {
            let offset = r.u64()?;
            if offset >= input_len || last_offset.is_some_and(|o| o >= offset) {
                return Err(bad("member offsets out of order or past the file"));
            }
            last_offset = Some(offset);
            let chunk_bits = r.u64()?;
            if chunk_bits % 8 != 0 || !(MIN_CHUNK..=MAX_CHUNK).contains(&(chunk_bits / 8)) {
                return Err(bad("chunk size"));
            }
            let out_len = r.u64()?;
            let member_bits = (input_len - offset).saturating_mul(8);
            let n = r.count()?;
            points_left = points_left
                .checked_sub(u64::from(n))
                .ok_or_else(|| bad("more checkpoints than the file has chunks"))?;
            let mut points = Vec::new();
            for _ in 0..n {
                let chunk = r.u64()?;
                let bit = r.u64()?;
                let out = r.u64()?;
                let len = r.u32()? as usize;
                let kind = r.take(1)?[0];
                let stored = r.u32()? as usize;
                let body = r.take(stored)?;
                if len > WINDOW {
                    return Err(bad("window longer than 32 KiB"));
                }
                let window = match kind {
                    0 if stored == len => body.to_vec(),
                    1 => zstd::bulk::decompress(body, len)
                        .ok()
                        .filter(|w| w.len() == len)
                        .ok_or_else(|| bad("window does not decompress"))?,
                    _ => return Err(bad("window encoding")),
                };
                if chunk == 0 || bit / chunk_bits != chunk || bit >= member_bits || out > out_len {
                    return Err(bad("checkpoint outside its chunk, member or output"));
                }
                if points
                    .last()
                    .is_some_and(|q: &Checkpoint| q.chunk >= chunk || q.out > out)
                {
                    return Err(bad("checkpoints out of order"));
                }
                points.push(Checkpoint {
                    chunk,
                    bit,
                    out,
                    window,
                });
            }
            index.members.insert(
                offset,
                MemberIndex {
                    chunk_bits,
                    out_len,
                    points,
                },
            );
        }
        if r.at != body.len() {
            return Err(bad("bytes after the last checkpoint"));
        }
        Ok(index)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], IndexError> {
        let s = self
            .b
            .get(self.at..self.at.saturating_add(n))
            .ok_or_else(|| IndexError("not a valid cairn gzip index: truncated".into()))?;
        self.at += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, IndexError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, IndexError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn count(&mut self) -> Result<u32, IndexError> {
        let n = self.u32()?;
        if n > MAX_COUNT {
            return Err(IndexError(format!(
                "not a valid cairn gzip index: count {n} too large"
            )));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GzipIndex {
        let mut i = GzipIndex::new(123_456_789);
        i.members.insert(
            10,
            MemberIndex {
                chunk_bits: 8 << 23,
                out_len: 100_000_000,
                points: vec![
                    Checkpoint {
                        chunk: 1,
                        bit: 67_108_870,
                        out: 30_000_000,
                        window: (0..WINDOW).map(|i| (i % 7) as u8).collect(),
                    },
                    Checkpoint {
                        chunk: 3,
                        bit: 201_326_600,
                        out: 90_000_000,
                        // Random-looking bytes are stored plain.
                        window: (0..WINDOW as u32)
                            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                            .collect(),
                    },
                ],
            },
        );
        i.members.insert(
            50_000_000,
            MemberIndex {
                chunk_bits: 8 << 20,
                out_len: 0,
                points: vec![],
            },
        );
        i
    }

    #[test]
    fn an_index_reads_back_as_written() {
        let i = sample();
        assert_eq!(GzipIndex::decode(&i.encode()).unwrap(), i);
        let empty = GzipIndex::new(0);
        assert_eq!(GzipIndex::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_refused() {
        let b = sample().encode();
        for at in (0..b.len()).step_by(97).chain([b.len() - 1]) {
            let mut d = b.clone();
            d[at] ^= 0x10;
            assert!(GzipIndex::decode(&d).is_err(), "flip at {at}");
        }
        for len in (0..b.len()).step_by(101) {
            assert!(GzipIndex::decode(&b[..len]).is_err(), "cut at {len}");
        }
    }

    #[test]
    fn a_newer_version_is_named() {
        let mut b = sample().encode();
        b[8] = 2;
        let n = b.len() - 4;
        let crc = crc32c::crc32c(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
        let e = GzipIndex::decode(&b).unwrap_err();
        assert!(e.0.contains("version 2 is newer"), "{e}");
    }
}
