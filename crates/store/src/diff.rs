//! `diff`: the byte ranges where two snapshots differ.
//!
//! The snapshots are compared at equal offsets (an insertion shows as a
//! change of everything after it, as `cmp` would see it). Both extent
//! lists are walked together, in segments where neither side changes
//! extent:
//!
//! - both holes, or both the same chunk starting at the same offset: equal,
//!   nothing is read;
//! - otherwise both sides' bytes are read (a hole reads as zeros; chunks
//!   through the restore's [`Fetcher`], which checks each one against its
//!   id) and compared byte by byte.
//!
//! Differing runs separated by fewer than [`MERGE_GAP`] equal bytes are
//! reported as one range (a rewritten block whose bytes partly happen to
//! match its old ones is one change, not dozens). Where the sizes differ,
//! the bytes from the shorter size to the longer one are a range too
//! (merged with a change just before it by the same rule). Ranges are
//! handed to a sink in ascending order as they are found, so a diff of two
//! huge images holds one chunk per side in memory, never a list of ranges.

use crate::error::{Result, StoreError};
use crate::index::ChunkIndex;
use crate::manifest::{Extent, Manifest};
use crate::reader::{DamagedRecords, PackReader};
use crate::repo::Repository;
use crate::restore::{with_image_offset, Fetcher};
use std::sync::Arc;

/// Differing runs closer than this many equal bytes are one range.
pub const MERGE_GAP: u64 = 512;

/// What a diff found, besides the ranges given to the sink.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffReport {
    /// Size of the first snapshot.
    pub size_a: u64,
    /// Size of the second.
    pub size_b: u64,
    /// Ranges reported.
    pub ranges: u64,
    /// Bytes in those ranges (gaps merged into a range included).
    pub changed_bytes: u64,
    /// Image bytes read and compared (the rest was equal by its extents).
    pub compared_bytes: u64,
    /// Bytes read from packs.
    pub stored_read: u64,
}

/// Collects differing runs, merges close ones and hands ranges on.
struct Ranges<'s> {
    pending: Option<(u64, u64)>,
    sink: &'s mut dyn FnMut(u64, u64) -> Result<()>,
    count: u64,
    bytes: u64,
}

impl Ranges<'_> {
    /// The bytes `start..end` differ (runs come in ascending order).
    fn push(&mut self, start: u64, end: u64) -> Result<()> {
        match &mut self.pending {
            Some((_, e)) if start.saturating_sub(*e) < MERGE_GAP => *e = end,
            _ => {
                self.flush()?;
                self.pending = Some((start, end));
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if let Some((s, e)) = self.pending.take() {
            self.count += 1;
            self.bytes += e - s;
            (self.sink)(s, e - s)?;
        }
        Ok(())
    }
}

/// One side of the comparison: its extents, where the current one
/// starts, and the bytes of the last chunk read.
struct Side<'a, 'r> {
    extents: std::iter::Peekable<Box<dyn Iterator<Item = (u64, &'a Extent)> + 'a>>,
    fetcher: Fetcher<'r>,
    /// Image offset of the chunk in `bytes`.
    held: Option<u64>,
    bytes: Vec<u8>,
}

impl<'a, 'r> Side<'a, 'r> {
    fn new(
        m: &'a Manifest,
        files: &'r PackReader,
        index: &'r ChunkIndex,
        said: &Arc<DamagedRecords>,
    ) -> Self {
        let it: Box<dyn Iterator<Item = (u64, &'a Extent)> + 'a> = Box::new(m.with_offsets());
        Side {
            extents: it.peekable(),
            fetcher: Fetcher::new(files, index).sharing_warnings(said),
            held: None,
            bytes: Vec::new(),
        }
    }

    /// The extent covering `pos` and its start.
    fn at(&mut self, pos: u64) -> Result<(u64, Extent)> {
        while let Some(&(start, e)) = self.extents.peek() {
            if start + e.len() > pos {
                return Ok((start, *e));
            }
            self.extents.next();
        }
        Err(StoreError::Invalid(format!(
            "internal: no extent covers offset {pos}"
        )))
    }

    /// The bytes of data extent `e` starting at `start`; returns the bytes
    /// read from packs.
    fn load(&mut self, start: u64, e: Extent) -> Result<u64> {
        let Extent::Data { len, id } = e else {
            return Ok(0);
        };
        if self.held == Some(start) {
            return Ok(0);
        }
        self.held = None;
        self.bytes.clear();
        let read = self
            .fetcher
            .fetch(&id, len, start, &mut self.bytes)
            .map_err(|err| with_image_offset(err, start))?;
        self.held = Some(start);
        Ok(read)
    }
}

/// Compare snapshot `a` with `b` (whose chunks `index` locates, in
/// `repo`), handing each differing range (offset, length) to `sink` in
/// ascending order.
pub fn diff(
    repo: &Repository,
    index: &ChunkIndex,
    a: &Manifest,
    b: &Manifest,
    sink: &mut dyn FnMut(u64, u64) -> Result<()>,
) -> Result<DiffReport> {
    let files = PackReader::new(repo, index);
    // A damaged record both sides read is warned of once.
    let said = Arc::<DamagedRecords>::default();
    let mut sa = Side::new(a, &files, index, &said);
    let mut sb = Side::new(b, &files, index, &said);
    let mut ranges = Ranges {
        pending: None,
        sink,
        count: 0,
        bytes: 0,
    };
    let mut report = DiffReport {
        size_a: a.size,
        size_b: b.size,
        ..DiffReport::default()
    };
    let common = a.size.min(b.size);
    let mut zeros: Vec<u8> = Vec::new();
    let mut pos = 0u64;
    while pos < common {
        let (a0, ea) = sa.at(pos)?;
        let (b0, eb) = sb.at(pos)?;
        let end = (a0 + ea.len()).min(b0 + eb.len()).min(common);
        let equal = match (ea, eb) {
            (Extent::Hole { .. }, Extent::Hole { .. }) => true,
            (Extent::Data { id: x, .. }, Extent::Data { id: y, .. }) => x == y && a0 == b0,
            _ => false,
        };
        if !equal {
            report.stored_read += sa.load(a0, ea)? + sb.load(b0, eb)?;
            let n = (end - pos) as usize;
            if zeros.len() < n && (ea.is_hole() || eb.is_hole()) {
                zeros.resize(n, 0);
            }
            let x = match chunk_range(pos, a0, ea, n) {
                Some(r) => sa.bytes.get(r),
                None => zeros.get(..n),
            };
            let y = match chunk_range(pos, b0, eb, n) {
                Some(r) => sb.bytes.get(r),
                None => zeros.get(..n),
            };
            let (Some(x), Some(y)) = (x, y) else {
                return Err(StoreError::Invalid(format!(
                    "internal: a chunk at offset {pos} is shorter than its extent"
                )));
            };
            for (s, e) in differing_runs(x, y) {
                ranges.push(pos + s as u64, pos + e as u64)?;
            }
            report.compared_bytes += end - pos;
        }
        pos = end;
    }
    if a.size != b.size {
        ranges.push(common, a.size.max(b.size))?;
    }
    ranges.flush()?;
    report.ranges = ranges.count;
    report.changed_bytes = ranges.bytes;
    Ok(report)
}

/// Where the `n` bytes at image offset `pos` are in the bytes of data
/// extent `e` (starting at `start`); `None` for a hole.
fn chunk_range(pos: u64, start: u64, e: Extent, n: usize) -> Option<std::ops::Range<usize>> {
    match e {
        Extent::Hole { .. } => None,
        Extent::Data { .. } => {
            let from = (pos - start) as usize;
            Some(from..from + n)
        }
    }
}

/// The runs `start..end` where `x` and `y` (of equal length) differ.
fn differing_runs<'x>(x: &'x [u8], y: &'x [u8]) -> impl Iterator<Item = (usize, usize)> + 'x {
    const BLOCK: usize = 64;
    let n = x.len().min(y.len());
    let mut i = 0usize;
    std::iter::from_fn(move || {
        // Skip equal blocks whole, then equal bytes.
        while i + BLOCK <= n && x[i..i + BLOCK] == y[i..i + BLOCK] {
            i += BLOCK;
        }
        while i < n && x[i] == y[i] {
            i += 1;
        }
        if i >= n {
            return None;
        }
        let start = i;
        while i < n && x[i] != y[i] {
            i += 1;
        }
        Some((start, i))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::{backup, BackupOptions};
    use crate::chunker::ChunkerSpec;

    use cairn_testkit::noise;

    fn store(r: &Repository, name: &str, data: &[u8], chunker: ChunkerSpec) -> Manifest {
        let lock = r.session("test").unwrap();
        let opts = BackupOptions {
            name: name.into(),
            codec: "lz4".parse().unwrap(),
            chunker,
            threads: 2,
            group_size: 1 << 20,
            source: "test".into(),
            progress: None,
            time: None,
            tags: Vec::new(),
        };
        let rep = backup(r, &lock, &mut std::io::Cursor::new(data.to_vec()), &opts).unwrap();
        r.read_manifest(name, rep.snapshot).unwrap()
    }

    fn run(r: &Repository, a: &Manifest, b: &Manifest) -> (Vec<(u64, u64)>, DiffReport) {
        let index = r.load_index().unwrap().index;
        let mut got = Vec::new();
        let rep = diff(r, &index, a, b, &mut |o, l| {
            got.push((o, l));
            Ok(())
        })
        .unwrap();
        assert_eq!(rep.ranges, got.len() as u64);
        assert_eq!(rep.changed_bytes, got.iter().map(|r| r.1).sum::<u64>());
        (got, rep)
    }

    fn with_changes(base: &[u8], changes: &[(usize, usize)]) -> Vec<u8> {
        let mut v = base.to_vec();
        for &(at, len) in changes {
            for b in &mut v[at..at + len] {
                *b ^= 0xA5;
            }
        }
        v
    }

    #[test]
    fn exact_ranges_equal_chunks_unread_and_close_runs_merged() {
        let dir = tempfile::tempdir().unwrap();
        let r = Repository::init(&dir.path().join("repo"), &[], None).unwrap();
        let mut base = noise(3 << 20, 1);
        // A zero run: a hole in both.
        base[1 << 20..(1 << 20) + 300_000].fill(0);
        for chunker in [ChunkerSpec::Fixed(65536), crate::DEFAULT_CHUNKER] {
            let a = store(&r, "a", &base, chunker);
            let (same, rep) = run(&r, &a, &a);
            assert!(same.is_empty());
            assert_eq!((rep.compared_bytes, rep.stored_read), (0, 0));

            // Changes far apart are exact; two 100 bytes apart are one
            // range; one inside the zero run too (hole against data).
            let changes = [
                (10, 1),
                (70_000, 5000),
                (500_000, 7),
                (500_107, 20),
                ((1 << 20) + 4096, 33),
                ((3 << 20) - 3, 3),
            ];
            let b = store(&r, "b", &with_changes(&base, &changes), chunker);
            let (got, rep) = run(&r, &a, &b);
            let want = vec![
                (10, 1),
                (70_000, 5000),
                (500_000, 127),
                ((1 << 20) + 4096, 33),
                ((3 << 20) - 3, 3),
            ];
            assert_eq!(got, want, "{chunker}");
            assert!(rep.compared_bytes < base.len() as u64 / 2, "{rep:?}");
            // And the other way round.
            assert_eq!(run(&r, &b, &a).0, want);
        }
    }

    #[test]
    fn a_size_change_is_a_range_to_the_longer_size() {
        let dir = tempfile::tempdir().unwrap();
        let r = Repository::init(&dir.path().join("repo"), &[], None).unwrap();
        let base = noise(1 << 20, 2);
        let fixed = ChunkerSpec::Fixed(4096);
        let a = store(&r, "a", &base, fixed);
        let mut longer = base.clone();
        longer.extend(noise(10_000, 3));
        let b = store(&r, "b", &longer, fixed);
        let (got, rep) = run(&r, &a, &b);
        assert_eq!(got, vec![(1 << 20, 10_000)]);
        assert_eq!((rep.size_a, rep.size_b), (1 << 20, (1 << 20) + 10_000));
        // Shorter, with a change 100 bytes before the end of the shorter:
        // merged into the size range.
        let mut shorter = base[..500_000].to_vec();
        shorter[499_900] ^= 1;
        let c = store(&r, "c", &shorter, fixed);
        assert_eq!(run(&r, &a, &c).0, vec![(499_900, (1 << 20) - 499_900)]);
        // Against an empty image: the whole of the other.
        let e = store(&r, "e", &[], fixed);
        assert_eq!(run(&r, &e, &a).0, vec![(0, 1 << 20)]);
    }

    #[test]
    fn runs_are_exact() {
        let x = noise(1000, 4);
        let mut y = x.clone();
        for i in [0usize, 1, 2, 63, 64, 65, 500, 999] {
            y[i] ^= 0xFF;
        }
        let runs: Vec<_> = differing_runs(&x, &y).collect();
        assert_eq!(runs, vec![(0, 3), (63, 66), (500, 501), (999, 1000)]);
        assert_eq!(differing_runs(&x, &x).count(), 0);
    }
}
