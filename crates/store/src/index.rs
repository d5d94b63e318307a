//! The chunk index: where each chunk lives.
//!
//! **On disk** (`REPO/index/<random>.idx`, a metadata envelope of kind 3,
//! body version 1), written once and never changed:
//!
//! ```text
//! u32 P                     packs named by this file
//! P × { pack id [16], target u16, pack length u64 }
//! u64 E                     entries
//! E × { chunk id [32], pack u32 (position in the table above),
//!       record offset u32, record length u32,
//!       offset of the chunk in the record's decoded group u32 }
//! ```
//!
//! Each backup writes one file for the packs it wrote; `gc` replaces them
//! with consolidated ones. The repository's index is the union of the
//! files; an id listed twice (a crash between gc's steps) is fine, both
//! places hold the chunk.
//!
//! **In memory** ([`ChunkIndex`]) every chunk costs exactly 32 bytes, in
//! one sorted `Vec` searched by bisection: the first 19 bytes of its id,
//! then pack number (24 bits), record offset (32), record length (24) and
//! offset in the group (24). No hash table (its empty slots and per-entry
//! overhead are what make restic need 56 bytes and borg ~100), no full ids
//! (see [`PREFIX_LEN`] for why 152 bits are
//! enough). Chunks added by a running backup live in a small side set
//! until they are merged at commit.

use crate::bytes::{Reader, Writer};
use crate::crypt::Crypt;
use crate::error::{Result, StoreError};
use crate::id::{ChunkId, PackId, PREFIX_LEN};
use crate::meta::{self, Kind};
use std::collections::HashMap;
use std::path::Path;

/// Version of the index body this build writes and reads.
pub const INDEX_VERSION: u32 = 1;
/// Bytes per entry in an index file.
const ENTRY_LEN: usize = 48;
/// Entries per index file at most (bounds the memory needed to load one).
pub const MAX_ENTRIES_PER_FILE: usize = 1 << 20;

/// A pack named in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackInfo {
    /// Its id (file name).
    pub id: PackId,
    /// Which target holds it.
    pub target: u16,
    /// Its length when it was sealed.
    pub len: u64,
}

/// Where a chunk is: pack number (in the file's or the index's pack
/// table), offset and length of the whole record holding it, and its
/// offset in the record's decoded group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Pack number.
    pub pack: u32,
    /// Offset of the record in the pack.
    pub offset: u32,
    /// Length of the whole record (header, chunk table, stored bytes).
    pub len: u32,
    /// Offset of the chunk in the decoded group.
    pub slice: u32,
}

/// Largest pack number, record length and group offset the in-memory
/// index can hold (24 bits each).
pub const MAX_24: u32 = (1 << 24) - 1;

/// The contents of one index file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IndexFile {
    /// Packs, referred to by position.
    pub packs: Vec<PackInfo>,
    /// Chunks.
    pub entries: Vec<(ChunkId, Location)>,
}

impl IndexFile {
    /// The file bytes (plain envelope).
    pub fn encode(&self) -> Vec<u8> {
        meta::seal(Kind::Index, INDEX_VERSION, &self.body())
    }

    /// The file bytes, encrypted under `crypt` if there is one.
    pub fn encode_with(&self, crypt: Option<&Crypt>) -> Result<Vec<u8>> {
        meta::seal_with(Kind::Index, INDEX_VERSION, &self.body(), crypt)
    }

    fn body(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.buf
            .reserve(12 + self.packs.len() * 26 + self.entries.len() * 44);
        w.u32(self.packs.len() as u32);
        for p in &self.packs {
            w.bytes(&p.id.0);
            w.u16(p.target);
            w.u64(p.len);
        }
        w.u64(self.entries.len() as u64);
        for (id, loc) in &self.entries {
            w.bytes(&id.0);
            w.u32(loc.pack);
            w.u32(loc.offset);
            w.u32(loc.len);
            w.u32(loc.slice);
        }
        w.buf
    }

    /// Parse a file's bytes (the whole file, plain envelope included).
    pub fn decode(path: &Path, data: &[u8]) -> Result<IndexFile> {
        Self::decode_with(path, data, None)
    }

    /// Parse a file's bytes, sealed under `crypt` if there is one.
    pub fn decode_with(path: &Path, data: &[u8], crypt: Option<&Crypt>) -> Result<IndexFile> {
        let (_, body) = meta::open_with(path, data, Kind::Index, INDEX_VERSION, crypt)?;
        let body = &body[..];
        let at = |off: usize| StoreError::corrupt(path, off as u64, "index body is truncated");
        let mut r = Reader::new(body);
        let np = r.u32().map_err(at)? as usize;
        if np > r.remaining() / 26 {
            return Err(StoreError::corrupt(
                path,
                0,
                format!("{np} packs cannot fit"),
            ));
        }
        let mut packs = Vec::with_capacity(np);
        for _ in 0..np {
            packs.push(PackInfo {
                id: PackId(r.array().map_err(at)?),
                target: r.u16().map_err(at)?,
                len: r.u64().map_err(at)?,
            });
        }
        let ne = r.u64().map_err(at)?;
        if ne != (r.remaining() / ENTRY_LEN) as u64 || r.remaining() % ENTRY_LEN != 0 {
            return Err(StoreError::corrupt(
                path,
                r.pos() as u64,
                format!("{ne} entries do not match the {} bytes left", r.remaining()),
            ));
        }
        let mut entries = Vec::with_capacity(ne as usize);
        for _ in 0..ne {
            let id = ChunkId(r.array().map_err(at)?);
            let loc = Location {
                pack: r.u32().map_err(at)?,
                offset: r.u32().map_err(at)?,
                len: r.u32().map_err(at)?,
                slice: r.u32().map_err(at)?,
            };
            if loc.len > MAX_24 || loc.slice > MAX_24 {
                return Err(StoreError::corrupt(
                    path,
                    r.pos() as u64,
                    format!(
                        "entry with record length {} at group offset {}",
                        loc.len, loc.slice
                    ),
                ));
            }
            if loc.pack as usize >= packs.len() {
                return Err(StoreError::corrupt(
                    path,
                    r.pos() as u64,
                    format!("entry names pack {} of {}", loc.pack, packs.len()),
                ));
            }
            entries.push((id, loc));
        }
        Ok(IndexFile { packs, entries })
    }
}

/// One in-memory entry, 32 bytes: id prefix, then pack (24 bits), record
/// offset (32), record length (24) and group offset (24), little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
struct Entry {
    prefix: [u8; PREFIX_LEN],
    packed: [u8; 32 - PREFIX_LEN],
}

const _: () = assert!(std::mem::size_of::<Entry>() == 32);

impl Entry {
    fn new(prefix: [u8; PREFIX_LEN], loc: Location) -> Entry {
        let mut p = [0u8; 32 - PREFIX_LEN];
        p[0..3].copy_from_slice(&loc.pack.to_le_bytes()[..3]);
        p[3..7].copy_from_slice(&loc.offset.to_le_bytes());
        p[7..10].copy_from_slice(&loc.len.to_le_bytes()[..3]);
        p[10..13].copy_from_slice(&loc.slice.to_le_bytes()[..3]);
        Entry { prefix, packed: p }
    }

    fn location(&self) -> Location {
        let p = &self.packed;
        let u24 = |o: usize| u32::from_le_bytes([p[o], p[o + 1], p[o + 2], 0]);
        Location {
            pack: u24(0),
            offset: u32::from_le_bytes([p[3], p[4], p[5], p[6]]),
            len: u24(7),
            slice: u24(10),
        }
    }
}

/// The repository's chunk index in memory.
#[derive(Debug, Default, Clone)]
pub struct ChunkIndex {
    entries: Vec<Entry>,
    /// Where the sorted entries whose ids begin with each value of their
    /// first `bucket_bits` bits start (and, last, the end): a lookup
    /// searches a handful of neighbours instead of the whole table, whose
    /// binary search took 2 % of a restore's CPU (profiled), most of it
    /// cache misses. Empty while the entries are not sorted.
    buckets: Vec<u32>,
    bucket_bits: u32,
    packs: Vec<PackInfo>,
    pack_numbers: HashMap<PackId, u32>,
    /// The other copies of chunks stored more than once (two backups
    /// that stored the same new data at once, a chunk stored again after
    /// its pack was lost, a gc killed while repacking), sorted by prefix:
    /// where a reader turns when the copy in `entries` is damaged
    /// ([`ChunkIndex::other_copies`]). Few, and nothing counts them as
    /// live: gc deletes them with their packs.
    others: Vec<Entry>,
}

/// Entries per bucket aimed at; a bucket costs 4 bytes, an entry 32.
const PER_BUCKET: usize = 4;
/// At most 2^24 buckets (64 MiB, for 64 million chunks or more).
const MAX_BUCKET_BITS: u32 = 24;

impl ChunkIndex {
    /// Add the contents of an index file (call [`ChunkIndex::seal`] after
    /// the last). Fails only past 2^24 packs.
    pub fn add_file(&mut self, file: &IndexFile) -> Result<()> {
        let map: Vec<u32> = file
            .packs
            .iter()
            .map(|p| self.add_pack(*p))
            .collect::<Result<_>>()?;
        self.entries.reserve(file.entries.len());
        self.buckets = Vec::new();
        for (id, loc) in &file.entries {
            let global = Location {
                pack: map[loc.pack as usize],
                ..*loc
            };
            self.entries.push(Entry::new(id.prefix(), global));
        }
        Ok(())
    }

    /// Number a pack (the same id always gets the same number).
    pub fn add_pack(&mut self, p: PackInfo) -> Result<u32> {
        if let Some(&n) = self.pack_numbers.get(&p.id) {
            return Ok(n);
        }
        let n = self.packs.len() as u32;
        if n > MAX_24 {
            return Err(StoreError::Invalid(format!(
                "the repository has more than {MAX_24} packs; run gc, or use a larger --pack-size"
            )));
        }
        self.packs.push(p);
        self.pack_numbers.insert(p.id, n);
        Ok(n)
    }

    /// Sort for lookups and drop duplicate ids; frees spare capacity so
    /// that memory is 32 bytes per chunk and the buckets' 4 per 4-8.
    pub fn seal(&mut self) {
        self.seal_preferring(|_| true);
    }

    /// [`ChunkIndex::seal`], keeping of two entries for the same chunk one
    /// that `good` accepts (a record that is on disk) if there is one,
    /// else the one in the pack numbered first (added first: the index
    /// files come before the packs salvage finds). The choice must not be
    /// left to the sort: a gc killed while repacking leaves copies of live
    /// records in packs that salvage indexes, and keeping some entries
    /// of each pack left both packs part live, their duplicates kept for
    /// as long as neither fell below gc's repack threshold (found from
    /// outside, 2026-11-28). Keeping the first pack's makes the copies
    /// dead, and the next gc deletes them whole.
    pub fn seal_preferring(&mut self, mut good: impl FnMut(Location) -> bool) {
        self.entries.sort_unstable_by(|a, b| {
            a.prefix.cmp(&b.prefix).then_with(|| {
                let (x, y) = (a.location(), b.location());
                (x.pack, x.offset, x.slice).cmp(&(y.pack, y.offset, y.slice))
            })
        });
        let mut others = std::mem::take(&mut self.others);
        self.entries.dedup_by(|later, kept| {
            if later.prefix != kept.prefix {
                return false;
            }
            if !good(kept.location()) && good(later.location()) {
                std::mem::swap(later, kept);
            }
            // The same place named twice (a gc killed between writing its
            // index files and removing the old ones) is no other copy.
            if later.location() != kept.location() && good(later.location()) {
                others.push(*later);
            }
            true
        });
        // In pack order within a chunk, as the seal's choice.
        others.sort_unstable_by_key(|e| {
            let l = e.location();
            (e.prefix, l.pack, l.offset, l.slice)
        });
        others.dedup();
        others.shrink_to_fit();
        self.others = others;
        self.entries.shrink_to_fit();
        self.make_buckets();
    }

    /// Keep only the entries (and other copies) whose location passes
    /// `keep` (sorted order is kept); a chunk whose entry fails it but
    /// that has another copy that passes keeps that one.
    pub fn retain(&mut self, mut keep: impl FnMut(Location) -> bool) {
        self.prefer(&mut keep);
        self.entries.retain(|e| keep(e.location()));
        self.others.retain(|e| keep(e.location()));
        self.entries.shrink_to_fit();
        self.make_buckets();
    }

    /// The other places chunk `id` is stored, besides [`ChunkIndex::get`]'s
    /// (see `others`); empty for almost every chunk.
    pub fn other_copies(&self, id: &ChunkId) -> impl Iterator<Item = Location> + '_ {
        self.other_copies_of(id.prefix())
    }

    /// [`ChunkIndex::other_copies`] by id prefix.
    pub fn other_copies_of(&self, prefix: [u8; PREFIX_LEN]) -> impl Iterator<Item = Location> + '_ {
        let start = self.others.partition_point(|e| e.prefix < prefix);
        self.others[start..]
            .iter()
            .take_while(move |e| e.prefix == prefix)
            .map(Entry::location)
    }

    /// Every other copy (see [`ChunkIndex::other_copies`]), with its id
    /// prefix.
    pub fn other_locations(&self) -> impl Iterator<Item = ([u8; PREFIX_LEN], Location)> + '_ {
        self.others.iter().map(|e| (e.prefix, e.location()))
    }

    /// Where the copy the index uses fails `sound` and another copy
    /// passes it, use that one instead (the first such); returns how many
    /// were switched. `repair` has the index use a sound copy of a chunk
    /// whose record is damaged, so that the chunk stays stored.
    pub fn prefer(&mut self, mut sound: impl FnMut(Location) -> bool) -> usize {
        let mut switched = 0;
        for e in &mut self.entries {
            if sound(e.location()) {
                continue;
            }
            let start = self.others.partition_point(|o| o.prefix < e.prefix);
            let found = self.others[start..]
                .iter()
                .take_while(|o| o.prefix == e.prefix)
                .position(|o| sound(o.location()));
            if let Some(i) = found {
                std::mem::swap(e, &mut self.others[start + i]);
                switched += 1;
            }
        }
        switched
    }

    /// Give every entry (and other copy) for which `length` returns one
    /// that record length instead of its own; returns how many changed.
    /// `repair` corrects entries whose length is not their record's. A
    /// copy that names the place its chunk's entry now does is no other
    /// copy and goes.
    pub fn correct_lengths(&mut self, mut length: impl FnMut(Location) -> Option<u32>) -> usize {
        let mut changed = 0;
        for e in self.entries.iter_mut().chain(self.others.iter_mut()) {
            let loc = e.location();
            if let Some(len) = length(loc).filter(|&len| len != loc.len && len <= MAX_24) {
                *e = Entry::new(e.prefix, Location { len, ..loc });
                changed += 1;
            }
        }
        if changed > 0 {
            let mut others = std::mem::take(&mut self.others);
            others.retain(|o| {
                let start = self.entries.partition_point(|e| e.prefix < o.prefix);
                !self.entries[start..]
                    .iter()
                    .take_while(|e| e.prefix == o.prefix)
                    .any(|e| e.location() == o.location())
            });
            others.dedup();
            self.others = others;
        }
        changed
    }

    /// The bucket of an id prefix: its first `bucket_bits` bits.
    fn bucket(&self, prefix: &[u8; PREFIX_LEN]) -> usize {
        let top = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        (u64::from(top) >> (32 - self.bucket_bits)) as usize
    }

    /// Count the sorted entries into buckets (none when there are more
    /// than a `u32` counts: the whole table is searched then).
    fn make_buckets(&mut self) {
        self.buckets = Vec::new();
        let n = self.entries.len();
        if u32::try_from(n).is_err() {
            return;
        }
        let want = (n / PER_BUCKET).max(1);
        self.bucket_bits = (usize::BITS - want.leading_zeros() - 1).min(MAX_BUCKET_BITS);
        let mut starts = vec![0u32; (1 << self.bucket_bits) + 1];
        for e in &self.entries {
            starts[self.bucket(&e.prefix) + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        self.buckets = starts;
    }

    /// Position of chunk `id` in the sorted table (stable until the next
    /// [`ChunkIndex::seal`]).
    pub fn position(&self, id: &ChunkId) -> Option<usize> {
        let p = id.prefix();
        let (lo, hi) = match self.buckets.is_empty() {
            true => (0, self.entries.len()),
            false => {
                let b = self.bucket(&p);
                (self.buckets[b] as usize, self.buckets[b + 1] as usize)
            }
        };
        let found = self.entries[lo..hi].binary_search_by(|e| e.prefix.cmp(&p));
        found.ok().map(|i| lo + i)
    }

    /// Where chunk `id` is stored.
    pub fn get(&self, id: &ChunkId) -> Option<Location> {
        self.position(id).map(|i| self.entries[i].location())
    }

    /// The location at a position.
    pub fn location_at(&self, i: usize) -> Option<Location> {
        self.entries.get(i).map(Entry::location)
    }

    /// The id prefix stored at a position: lets a reader that keeps only
    /// positions check that a record's chunk is the one it looked up.
    pub fn prefix_at(&self, i: usize) -> Option<[u8; PREFIX_LEN]> {
        self.entries.get(i).map(|e| e.prefix)
    }

    /// Whether chunk `id` is stored.
    pub fn contains(&self, id: &ChunkId) -> bool {
        self.get(id).is_some()
    }

    /// The pack numbered `n`.
    pub fn pack(&self, n: u32) -> Option<&PackInfo> {
        self.packs.get(n as usize)
    }

    /// The number of a pack, if the index knows it.
    pub fn pack_number(&self, id: &PackId) -> Option<u32> {
        self.pack_numbers.get(id).copied()
    }

    /// Every pack.
    pub fn packs(&self) -> &[PackInfo] {
        &self.packs
    }

    /// Distinct chunks.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No chunks at all.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Heap bytes held by the entry table (the per-chunk cost).
    pub fn entry_bytes(&self) -> usize {
        (self.entries.capacity() + self.others.capacity()) * std::mem::size_of::<Entry>()
            + self.buckets.capacity() * 4
    }

    /// Every (pack, offset, len) the index holds, with the id prefix.
    pub fn locations(&self) -> impl Iterator<Item = ([u8; PREFIX_LEN], Location)> + '_ {
        self.entries.iter().map(|e| (e.prefix, e.location()))
    }
}

/// A `HashSet`/`HashMap` hasher for chunk ids and prefixes: they are
/// already uniformly random, so their first eight bytes are the hash.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        if bytes.len() >= 8 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[..8]);
            self.0 = u64::from_le_bytes(w);
        }
    }
    fn write_usize(&mut self, _: usize) {}
}

/// Builds [`IdHasher`]s.
pub type IdHash = std::hash::BuildHasherDefault<IdHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: u32) -> IndexFile {
        let packs = vec![
            PackInfo {
                id: PackId::random(),
                target: 0,
                len: 1000,
            },
            PackInfo {
                id: PackId::random(),
                target: 1,
                len: 2000,
            },
        ];
        let entries = (0..n)
            .map(|i| {
                (
                    ChunkId::of(&i.to_le_bytes()),
                    Location {
                        pack: i % 2,
                        offset: 64 + i * 100,
                        len: 100 + i % 7,
                        slice: i * 3 % 1000,
                    },
                )
            })
            .collect();
        IndexFile { packs, entries }
    }

    /// Of two entries for one chunk, the one in the pack added first is
    /// kept, whatever the order the sort meets them in: every chunk of a
    /// pack that duplicates an earlier one is dropped, so that pack is
    /// dead whole.
    #[test]
    fn duplicates_keep_the_pack_added_first() {
        let f = sample(2000);
        // The same chunks again in a pack added later, at lower offsets.
        let copy = IndexFile {
            packs: vec![PackInfo {
                id: PackId::random(),
                target: 0,
                len: 500,
            }],
            entries: f
                .entries
                .iter()
                .map(|(id, l)| {
                    (
                        *id,
                        Location {
                            pack: 0,
                            offset: 1,
                            ..*l
                        },
                    )
                })
                .collect(),
        };
        for order in [[&f, &copy], [&copy, &f]] {
            let mut idx = ChunkIndex::default();
            for file in order {
                idx.add_file(file).unwrap();
            }
            idx.seal();
            assert_eq!(idx.len(), 2000);
            let first: Vec<PackId> = order[0].packs.iter().map(|p| p.id).collect();
            for (id, _) in &f.entries {
                let l = idx.get(id).unwrap();
                assert!(first.contains(&idx.pack(l.pack).unwrap().id));
            }
        }
    }

    /// The copies a seal drops are kept as other copies (not a place named
    /// twice, nor one `good` refuses), and `prefer` turns to one of them
    /// where the kept copy is not sound.
    #[test]
    fn other_copies_are_kept_and_preferred_where_the_first_is_damaged() {
        let f = sample(300);
        let copy = IndexFile {
            packs: vec![PackInfo {
                id: PackId::random(),
                target: 0,
                len: 500,
            }],
            entries: f.entries[..100]
                .iter()
                .map(|(id, l)| (*id, Location { pack: 0, ..*l }))
                .collect(),
        };
        let mut idx = ChunkIndex::default();
        idx.add_file(&f).unwrap();
        idx.add_file(&copy).unwrap();
        idx.add_file(&f).unwrap(); // the same places again: no copies
        let third = idx.pack_number(&copy.packs[0].id).unwrap();
        idx.seal();
        assert_eq!(idx.len(), 300);
        assert_eq!(idx.other_locations().count(), 100);
        for (i, (id, l)) in f.entries.iter().enumerate() {
            let others: Vec<Location> = idx.other_copies(id).collect();
            if i < 100 {
                assert_eq!(others, vec![Location { pack: third, ..*l }]);
            } else {
                assert!(others.is_empty());
            }
        }
        // The first pack's records of the first 50 chunks are damaged.
        let damaged = |l: Location| l.pack != third && l.offset < 64 + 50 * 100;
        assert_eq!(idx.prefer(|l| !damaged(l)), 50);
        for (i, (id, l)) in f.entries.iter().enumerate() {
            let now = idx.get(id).unwrap();
            let others: Vec<Location> = idx.other_copies(id).collect();
            match i {
                0..50 => {
                    assert_eq!(now.pack, third);
                    assert_eq!(others, vec![*l]);
                }
                _ => assert_eq!(now, *l),
            }
        }
        // Nothing sound to turn to: nothing changes.
        assert_eq!(idx.prefer(|_| false), 0);
        // A copy `good` refuses (its pack is gone) is none.
        let mut idx = ChunkIndex::default();
        idx.add_file(&f).unwrap();
        idx.add_file(&copy).unwrap();
        idx.seal_preferring(|l| l.pack != third);
        assert_eq!(idx.other_locations().count(), 0);
        // retain() drops copies as it drops entries.
        let mut idx = ChunkIndex::default();
        idx.add_file(&f).unwrap();
        idx.add_file(&copy).unwrap();
        idx.seal();
        idx.retain(|l| l.pack != third);
        assert_eq!(idx.other_locations().count(), 0);
        assert_eq!(idx.len(), 300);
        // ... and where the entry fails and a copy passes, the copy stays.
        let mut idx = ChunkIndex::default();
        idx.add_file(&f).unwrap();
        idx.add_file(&copy).unwrap();
        idx.seal();
        idx.retain(|l| l.pack == third || l.offset >= 64 + 100 * 100);
        assert_eq!(idx.len(), 300, "every chunk has a copy kept");
        assert_eq!(idx.other_locations().count(), 0);
        for (i, (id, l)) in f.entries.iter().enumerate() {
            let now = idx.get(id).unwrap();
            match i {
                0..100 => assert_eq!(now, Location { pack: third, ..*l }),
                _ => assert_eq!(now, *l),
            }
        }
    }

    #[test]
    fn file_round_trip_and_damage() {
        let f = sample(100);
        let bytes = f.encode();
        let p = Path::new("i.idx");
        assert_eq!(IndexFile::decode(p, &bytes).unwrap(), f);
        let mut bad = bytes.clone();
        bad[40] ^= 1;
        assert!(IndexFile::decode(p, &bad).is_err());
        assert!(IndexFile::decode(p, &bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn lookups_find_every_entry_and_nothing_else() {
        let f = sample(1000);
        let mut idx = ChunkIndex::default();
        idx.add_file(&f).unwrap();
        idx.add_file(&f).unwrap(); // twice, as after an interrupted gc
        idx.seal();
        assert_eq!(idx.len(), 1000);
        // 1000 entries in 128 buckets of about 8.
        assert_eq!(idx.entry_bytes(), 32 * 1000 + 4 * 129);
        for (id, loc) in &f.entries {
            let got = idx.get(id).unwrap();
            assert_eq!(
                (got.offset, got.len, got.slice),
                (loc.offset, loc.len, loc.slice)
            );
            assert_eq!(
                idx.pack(got.pack).unwrap().id,
                f.packs[loc.pack as usize].id
            );
        }
        assert!(!idx.contains(&ChunkId::of(b"absent")));
        for (id, _) in &f.entries {
            let i = idx.position(id).unwrap();
            assert_eq!(idx.prefix_at(i), Some(id.prefix()));
        }
        assert_eq!(idx.prefix_at(idx.len()), None);
    }

    #[test]
    fn lookups_work_at_every_size_and_before_sealing() {
        for n in [0u32, 1, 2, 3, 7, 8, 9, 63, 64, 65, 4097] {
            let f = sample(n);
            let mut idx = ChunkIndex::default();
            idx.add_file(&f).unwrap();
            idx.seal();
            assert!(idx.buckets.len() >= 2 && idx.buckets.len() <= n as usize / 4 + 2);
            for (id, loc) in &f.entries {
                assert_eq!(idx.get(id).map(|l| l.offset), Some(loc.offset), "n={n}");
            }
            for i in 0..50 {
                let absent = ChunkId::of(format!("absent {i}").as_bytes());
                assert!(!idx.contains(&absent), "n={n}");
            }
            // More added: found (a whole-table search) until sealed again,
            // and after.
            let g = sample(n + 5);
            idx.add_file(&g).unwrap();
            assert!(idx.buckets.is_empty());
            idx.seal();
            for (id, _) in &g.entries {
                assert!(idx.contains(id), "n={n}");
            }
        }
    }
}
