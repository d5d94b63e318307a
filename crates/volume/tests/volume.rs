//! Volumes read back what backups stored: random reads against the source
//! bytes, extents against its zero runs, many threads at once, a cache too
//! small to hold anything, and damage reported as damage, never as data.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

use cairn_blockdev::{BlockDev, ErrorKind, ZeroFlags};
use cairn_codec::CodecSpec;
use cairn_store::{backup, BackupOptions, ChunkerSpec, Extent as StoreExtent, Repository};
use cairn_volume::{RepoView, Volume, VolumeOptions, VolumeStats};
use proptest::prelude::*;
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

mod common;
use common::Rng;

/// About 6 MiB with long zero runs (holes), a block repeated five times
/// (deduplicated chunks), text, and an odd size.
fn source(seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let mut v = Vec::new();
    let random = |r: &mut Rng, v: &mut Vec<u8>, n: usize| v.extend((0..n).map(|_| r.next() as u8));
    random(&mut r, &mut v, 1_300_000 + 17);
    v.resize(v.len() + 700_001, 0);
    let mut block = Vec::new();
    random(&mut r, &mut block, 200_003);
    for _ in 0..5 {
        v.extend_from_slice(&block);
    }
    v.extend(
        b"the quick brown fox jumps over the lazy dog "
            .iter()
            .cycle()
            .take(900_011),
    );
    v.resize(v.len() + 1_000_000, 0);
    random(&mut r, &mut v, 611_111);
    v.resize(v.len() + 300_000, 0);
    v.extend_from_slice(&block[..99_999]);
    random(&mut r, &mut v, 12_345);
    v
}

fn new_repo() -> (tempfile::TempDir, Arc<Repository>) {
    let dir = tempfile::tempdir().unwrap();
    let ts: Vec<PathBuf> = (0..2).map(|i| dir.path().join(format!("t{i}"))).collect();
    let r = Repository::init(&dir.path().join("repo"), &ts, Some(1 << 20)).unwrap();
    (dir, Arc::new(r))
}

fn store(r: &Repository, name: &str, data: &[u8], chunker: &str, codec: &str, group: usize) {
    let lock = r.session("test").unwrap();
    let opts = BackupOptions {
        name: name.into(),
        codec: codec.parse::<CodecSpec>().unwrap(),
        chunker: chunker.parse::<ChunkerSpec>().unwrap(),
        threads: 2,
        group_size: group,
        source: "test".into(),
        progress: None,
        time: None,
        tags: Vec::new(),
    };
    backup(r, &lock, &mut Cursor::new(data.to_vec()), &opts).unwrap();
}

struct Fixture {
    _dir: tempfile::TempDir,
    repo: Arc<Repository>,
    data: Vec<u8>,
    /// Content-defined chunks, 2 MiB groups.
    cdc: Volume,
    /// Fixed 4 KiB chunks, each compressed alone.
    fixed: Volume,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let (dir, repo) = new_repo();
        let data = source(7);
        store(&repo, "cdc", &data, "cdc:4K,16K,64K", "zstd:3", 2 << 20);
        store(&repo, "fixed", &data, "fixed:4K", "lz4", 0);
        let view = RepoView::open(repo.clone()).unwrap();
        let opts = VolumeOptions::default();
        let cdc = view.volume("cdc", &opts).unwrap();
        let fixed = view.volume("fixed@1", &opts).unwrap();
        Fixture {
            _dir: dir,
            repo,
            data,
            cdc,
            fixed,
        }
    })
}

fn read(v: &dyn BlockDev, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xa5u8; len];
    v.read_at(&mut buf, off).unwrap();
    buf
}

fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let i = got.iter().zip(want).position(|(a, b)| a != b);
        panic!("{what}: differs at byte {i:?} of {}", want.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_reads_match_the_source(off in 0u64..1 << 40, len in 0usize..3 << 20, fixed: bool) {
        let f = fixture();
        let size = f.data.len() as u64;
        let off = off % size;
        let len = len.min((size - off) as usize);
        let v = if fixed { &f.fixed } else { &f.cdc };
        let got = read(v, off, len);
        prop_assert!(got == f.data[off as usize..off as usize + len]);
    }
}

#[test]
fn reads_across_extents_and_the_whole_image() {
    let f = fixture();
    let size = f.data.len() as u64;
    for v in [&f.cdc, &f.fixed] {
        assert_eq!(v.size(), size);
        same(&read(v, 0, size as usize), &f.data, "whole image");
        // Around every hole/data boundary, and the last bytes.
        let mut at = 0;
        for e in v.extents(0, size).unwrap() {
            at += e.len;
            let from = at.saturating_sub(5000);
            let to = (at + 5000).min(size);
            same(
                &read(v, from, (to - from) as usize),
                &f.data[from as usize..to as usize],
                "boundary",
            );
        }
        same(
            &read(v, size - 1, 1),
            &f.data[size as usize - 1..],
            "last byte",
        );
        assert!(read(v, size, 0).is_empty());
    }
    // Plenty of small chunks: 4 KiB fixed chunks make hundreds.
    assert!(f.fixed.extent_count() > 500);
    assert_eq!(f.fixed.stats().map_bytes, 12 * f.fixed.extent_count() + 8);
}

#[test]
fn extents_report_holes_where_the_source_is_zero() {
    let f = fixture();
    let size = f.data.len() as u64;
    for v in [&f.cdc, &f.fixed] {
        assert!(v.caps().extents);
        let all = v.extents(0, size).unwrap();
        assert_eq!(all.iter().map(|e| e.len).sum::<u64>(), size);
        let mut at = 0usize;
        let mut hole_bytes = 0;
        for w in all.windows(2) {
            assert_ne!(w[0].hole, w[1].hole, "neighbours are merged");
        }
        for e in &all {
            let r = &f.data[at..at + e.len as usize];
            if e.hole {
                assert!(e.zero);
                assert!(r.iter().all(|&b| b == 0), "hole at {at} is not zero");
                hole_bytes += e.len;
            } else {
                assert!(!e.zero);
            }
            at += e.len as usize;
        }
        // The long zero runs (0.7 MB, 1 MB, 0.3 MB) are holes but for at
        // most a chunk at each edge.
        assert!(hole_bytes >= 2_000_001 - 6 * 65_536, "{hole_bytes}");
        // A sub-range gives the same picture, clipped.
        let mut r = Rng(3);
        for _ in 0..200 {
            let off = r.below(size);
            let len = r.below(size - off) + 1;
            let part = v.extents(off, len).unwrap();
            assert!(!part.is_empty());
            assert_eq!(part.iter().map(|e| e.len).sum::<u64>(), len);
            let mut at = off;
            for e in &part {
                let bytes = &f.data[at as usize..(at + e.len) as usize];
                assert!(!e.hole || bytes.iter().all(|&b| b == 0));
                at += e.len;
            }
        }
        assert!(v.extents(size, 1).is_err());
        assert!(v.extents(0, 0).unwrap().is_empty());
    }
}

#[test]
fn many_threads_read_at_once() {
    let f = fixture();
    let size = f.data.len() as u64;
    let opts = VolumeOptions {
        cache_bytes: 3 << 20,
        compact_bytes: 1 << 20,
        spill_bytes: 0,
        spill_dir: None,
        readahead: 1 << 20,
        threads: 2,
    };
    let v = Volume::open(f.repo.clone(), "cdc", &opts).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let v = &v;
            s.spawn(move || {
                let mut r = Rng(t + 11);
                if t % 2 == 0 {
                    // Sequential readers, each its own pace.
                    let step = 65_536 + 4096 * t as usize;
                    let mut at = 0;
                    while at < size {
                        let n = step.min((size - at) as usize);
                        same(
                            &read(v, at, n),
                            &f.data[at as usize..at as usize + n],
                            "seq",
                        );
                        at += n as u64;
                    }
                } else {
                    for _ in 0..300 {
                        let off = r.below(size);
                        let n = (r.below(200_000) as usize).min((size - off) as usize);
                        same(
                            &read(v, off, n),
                            &f.data[off as usize..off as usize + n],
                            "rand",
                        );
                    }
                }
            });
        }
    });
    let st = v.stats();
    assert!(st.hits > 0 && st.misses > 0, "{st:?}");
    assert!(st.cached_bytes <= (3 << 20) + (8 << 20), "{st:?}");
}

#[test]
fn sequential_reads_are_decoded_ahead() {
    let f = fixture();
    let size = f.data.len() as u64;
    let opts = VolumeOptions {
        cache_bytes: 64 << 20,
        compact_bytes: 64 << 20,
        spill_bytes: 0,
        spill_dir: None,
        readahead: 8 << 20,
        threads: 2,
    };
    for name in ["fixed", "cdc"] {
        let v = Volume::open(f.repo.clone(), name, &opts).unwrap();
        let mut at = 0;
        while at < size {
            let n = (256 << 10).min((size - at) as usize);
            same(
                &read(&v, at, n),
                &f.data[at as usize..at as usize + n],
                "seq",
            );
            at += n as u64;
        }
        // Whether the threads or the reader get to a record first is a
        // matter of scheduling; that it was queued is not.
        let st = v.stats();
        assert!(st.queued > 0, "{name}: {st:?}");
    }

    // Random reads schedule (almost) nothing: in an image this small a
    // random read now and then lands just past where another one ended.
    let opts = VolumeOptions {
        readahead: 64 << 10,
        ..opts
    };
    let v = Volume::open(f.repo.clone(), "fixed", &opts).unwrap();
    let mut r = Rng(5);
    for _ in 0..200 {
        let off = r.below(size - 4096) / 4096 * 4096;
        same(
            &read(&v, off, 4096),
            &f.data[off as usize..off as usize + 4096],
            "rand",
        );
    }
    let st = v.stats();
    assert!(st.queued < 64, "{st:?}");
}

#[test]
fn a_tiny_cache_evicts_and_stays_correct() {
    let f = fixture();
    let size = f.data.len() as u64;
    for threads in [0, 2] {
        let opts = VolumeOptions {
            cache_bytes: 1,
            compact_bytes: if threads == 0 { 0 } else { 1 },
            spill_bytes: 0,
            spill_dir: None,
            readahead: 4 << 20,
            threads,
        };
        for name in ["cdc", "fixed"] {
            let v = Volume::open(f.repo.clone(), name, &opts).unwrap();
            let mut at = 0;
            while at < size {
                let n = 100_003.min((size - at) as usize);
                same(
                    &read(&v, at, n),
                    &f.data[at as usize..at as usize + n],
                    "seq",
                );
                at += n as u64;
            }
            let mut r = Rng(9);
            for _ in 0..100 {
                let off = r.below(size);
                let n = (r.below(300_000) as usize).min((size - off) as usize);
                same(
                    &read(&v, off, n),
                    &f.data[off as usize..off as usize + n],
                    "rand",
                );
            }
            let st = v.stats();
            assert!(st.evictions > 0, "{st:?}");
            assert!(st.cached_bytes <= 1, "{st:?}");
            assert!(st.compact_bytes <= 1, "{st:?}");
        }
    }
}

/// 4 KiB reads at random offsets of `v` (none in a hole-only stretch
/// matters: holes read as zeros), checked against `data`.
fn random_4k(v: &Volume, data: &[u8], seed: u64, n: usize) {
    let size = data.len() as u64;
    let mut r = Rng(seed);
    for _ in 0..n {
        let off = r.below(size - 4096);
        same(
            &read(v, off, 4096),
            &data[off as usize..off as usize + 4096],
            "rand",
        );
    }
}

/// 200 reads of up to 600 KB at random offsets of `v`, spanning chunks
/// and groups, checked against `data`.
fn spanning_reads(v: &Volume, data: &[u8]) {
    let mut r = Rng(8);
    for _ in 0..200 {
        let off = r.below(data.len() as u64);
        let n = (r.below(600_000) as usize).min(data.len() - off as usize);
        same(
            &read(v, off, n),
            &data[off as usize..off as usize + n],
            "span",
        );
    }
}

/// The figures of image "img" of `repo` opened with `opts` after 5,000
/// random 4 KiB reads, checked to have decoded groups again and again
/// (at least 500 decodes in the last 2,000 reads).
fn decodes_again(repo: &Arc<Repository>, opts: &VolumeOptions, data: &[u8]) -> VolumeStats {
    let v = Volume::open(repo.clone(), "img", opts).unwrap();
    random_4k(&v, data, 3, 3000);
    let warm = v.stats();
    random_4k(&v, data, 4, 2000);
    let st = v.stats();
    assert!(st.misses > warm.misses + 500, "{opts:?}: {st:?}");
    st
}

#[test]
fn random_reads_past_the_decoded_cache_come_from_compact_copies() {
    let (_d, repo) = new_repo();
    let data = source(21);
    store(&repo, "img", &data, "cdc:4K,16K,64K", "zstd:3", 256 << 10);
    for threads in [0, 2] {
        // Room for two decoded groups of about 20; compact copies of all.
        let opts = VolumeOptions {
            cache_bytes: 600 << 10,
            compact_bytes: 64 << 20,
            spill_bytes: 0,
            spill_dir: None,
            readahead: 1 << 20,
            threads,
        };
        let v = Volume::open(repo.clone(), "img", &opts).unwrap();
        random_4k(&v, &data, 3, 3000);
        let warm = v.stats();
        assert!(warm.compacted > 5, "{threads}: {warm:?}");
        assert!(warm.compact_hits > 0, "{threads}: {warm:?}");
        assert!(warm.compact_bytes > 0, "{threads}: {warm:?}");
        // Every group has been read by now: from here on no read decodes
        // a group again, each is served by a decoded or a compact copy.
        random_4k(&v, &data, 4, 2000);
        let st = v.stats();
        assert_eq!(st.misses, warm.misses, "{threads}: {st:?}");
        assert!(
            st.compact_hits >= warm.compact_hits + 1000,
            "{threads}: {st:?}"
        );
        // Reads spanning chunks and groups mix the tiers and still match.
        spanning_reads(&v, &data);
        // Without the tier, the same reads decode groups again and again.
        let off = VolumeOptions {
            compact_bytes: 0,
            ..opts
        };
        let st = decodes_again(&repo, &off, &data);
        assert_eq!((st.compacted, st.compact_hits), (0, 0), "{st:?}");
    }
}

#[test]
fn random_reads_past_the_compact_tier_come_from_spilled_copies() {
    let (d, repo) = new_repo();
    let data = source(23);
    store(&repo, "img", &data, "cdc:4K,16K,64K", "zstd:3", 256 << 10);
    let dir = d.path().join("spill");
    for threads in [0, 2] {
        // Room for two decoded groups and about one compact copy of the
        // 20-odd; the rest are spilled.
        let opts = VolumeOptions {
            cache_bytes: 600 << 10,
            compact_bytes: 300 << 10,
            spill_bytes: 64 << 20,
            spill_dir: Some(dir.clone()),
            readahead: 1 << 20,
            threads,
        };
        let v = Volume::open(repo.clone(), "img", &opts).unwrap();
        // Made on the first copy spilled, not before.
        assert_eq!(v.stats().spill_capacity, 0);
        random_4k(&v, &data, 3, 3000);
        assert!(v.settle_spill());
        let warm = v.stats();
        // No more than the image's copies can take (with their sealing).
        let n = data.len() as u64;
        assert_eq!(
            warm.spill_capacity,
            n + n / 64 + (1 << 20),
            "{threads}: {warm:?}"
        );
        assert!(warm.spilled > 5, "{threads}: {warm:?}");
        assert!(warm.spill_hits > 0, "{threads}: {warm:?}");
        assert!(
            warm.spill_bytes > 0 && warm.spill_memory > 0,
            "{threads}: {warm:?}"
        );
        // Every group has a copy by now: reads decode (next to) none
        // again. (A copy waiting for the spill's writer thread is in no
        // tier for a moment, so a few may; without the spill, hundreds
        // do: below.)
        random_4k(&v, &data, 4, 2000);
        let st = v.stats();
        assert!(st.misses <= warm.misses + 20, "{threads}: {st:?}");
        assert!(st.spill_hits >= warm.spill_hits + 500, "{threads}: {st:?}");
        assert_eq!(st.spill_damaged, 0, "{threads}: {st:?}");
        // Reads spanning chunks and groups mix the three tiers.
        spanning_reads(&v, &data);
        // The file is unlinked from the start: nobody else can open it,
        // and nothing is left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        // Without it, the same reads decode groups again and again.
        let off = VolumeOptions {
            spill_bytes: 0,
            ..opts
        };
        let st = decodes_again(&repo, &off, &data);
        assert_eq!((st.spilled, st.spill_capacity), (0, 0), "{st:?}");
    }
}

#[test]
fn a_spill_ring_smaller_than_the_copies_drops_the_oldest() {
    let (d, repo) = new_repo();
    let data = source(24);
    store(&repo, "img", &data, "cdc:4K,16K,64K", "zstd:3", 64 << 10);
    // 1 MiB of ring for about 3 MiB of copies: it wraps again and again,
    // and a copy written over is read from the repository, not as damage.
    let opts = VolumeOptions {
        cache_bytes: 256 << 10,
        compact_bytes: 128 << 10,
        spill_bytes: 1 << 20,
        spill_dir: Some(d.path().join("spill")),
        readahead: 1 << 20,
        threads: 2,
    };
    let v = Volume::open(repo.clone(), "img", &opts).unwrap();
    // Eight readers at once: copies written over while read, writes of
    // the writer thread and of readers it is behind, at the same time.
    std::thread::scope(|s| {
        for seed in 0..8 {
            let (v, data) = (&v, &data);
            s.spawn(move || random_4k(v, data, 5 + seed, 1500));
        }
    });
    assert!(v.settle_spill());
    let st = v.stats();
    assert!(st.spilled > 40, "{st:?}");
    assert!(st.spill_hits > 0, "{st:?}");
    assert!(st.spill_bytes <= 1 << 20, "{st:?}");
    assert_eq!((st.spill_damaged, st.spill_failed), (0, false), "{st:?}");
}

#[test]
fn a_stream_leaves_no_compact_copies() {
    let (_d, repo) = new_repo();
    let data = source(22);
    store(&repo, "img", &data, "cdc:4K,16K,64K", "zstd:3", 256 << 10);
    // No threads: the reader decodes every group itself.
    let opts = VolumeOptions {
        cache_bytes: 600 << 10,
        compact_bytes: 64 << 20,
        spill_bytes: 0,
        spill_dir: None,
        readahead: 1 << 20,
        threads: 0,
    };
    let v = Volume::open(repo.clone(), "img", &opts).unwrap();
    let mut at = 0;
    while at < data.len() {
        let n = (128 << 10).min(data.len() - at);
        same(&read(&v, at as u64, n), &data[at..at + n], "seq");
        at += n;
    }
    let st = v.stats();
    assert!(st.evictions > 10, "{st:?}");
    // Only the stream's first read counts as random.
    assert!(st.compacted <= 1, "{st:?}");

    // A stride of small reads (4 KiB every 300 KiB): each read lands
    // past where the last ended, so it is random, though readahead
    // follows it (within a window of the last read) and decodes the
    // groups first. The groups it used get copies all the same, and a
    // second pass reads from them.
    let opts = VolumeOptions { threads: 2, ..opts };
    let v = Volume::open(repo.clone(), "img", &opts).unwrap();
    let stride = |v: &Volume| {
        let mut at = 0;
        while at + 4096 < data.len() {
            same(&read(v, at as u64, 4096), &data[at..at + 4096], "stride");
            at += 300 << 10;
        }
    };
    stride(&v);
    let first = v.stats();
    assert!(first.queued > 0, "readahead follows: {first:?}");
    assert!(first.compacted >= 5, "{first:?}");
    stride(&v);
    let st = v.stats();
    assert!(st.compact_hits >= first.compact_hits + 5, "{st:?}");
}

#[test]
fn a_damaged_chunk_is_found_in_its_compact_copy() {
    let (_d, repo) = new_repo();
    let data = source(45);
    // Stored raw in groups of four 64 KiB chunks, so a flipped byte is a
    // flipped byte of the group's last chunk; the record's CRC is then
    // fixed up so that only the BLAKE3 check can notice.
    store(&repo, "raw", &data, "fixed:64K", "none", 256 << 10);
    let (n, s) = repo.resolve("raw").unwrap();
    let m = repo.read_manifest(&n, s).unwrap();
    let idx = repo.load_index().unwrap().index;
    let datas: Vec<(u64, cairn_store::ChunkId)> = m
        .with_offsets()
        .filter_map(|(o, e)| match e {
            StoreExtent::Data { id, .. } => Some((o, *id)),
            _ => None,
        })
        .collect();
    // The chunk that ends its record, in a record of several chunks
    // (the one at the highest group offset of its record), in the text
    // part of the source, so that its compact copy is LZ4-compressed
    // (an incompressible chunk is kept as it is, another path).
    let text = 3_000_033 + 65_536..3_900_044 - 65_536;
    let (off, id) = datas
        .iter()
        .copied()
        .filter(|(o, id)| idx.get(id).unwrap().slice > 0 && text.contains(o))
        .max_by_key(|(o, id)| {
            let loc = idx.get(id).unwrap();
            let later = datas.iter().any(|(_, j)| {
                let l = idx.get(j).unwrap();
                (l.pack, l.offset) == (loc.pack, loc.offset) && l.slice > loc.slice
            });
            (!later, std::cmp::Reverse(*o))
        })
        .unwrap();
    let loc = idx.get(&id).unwrap();
    flip_last_byte_of_record(&repo, &idx, loc);

    // Decoded cache of one byte: every group is evicted as soon as it
    // is loaded, and compacted (reads with no readahead are random).
    let opts = VolumeOptions {
        cache_bytes: 1,
        compact_bytes: 64 << 20,
        spill_bytes: 0,
        spill_dir: None,
        readahead: 0,
        threads: 0,
    };
    let v = Volume::open(repo.clone(), "raw", &opts).unwrap();
    // The group's first chunk reads well (the damaged one is not checked).
    let first = off - u64::from(loc.slice);
    same(
        &read(&v, first, 4096),
        &data[first as usize..][..4096],
        "first",
    );
    // Another group loaded evicts it into the compact tier.
    same(&read(&v, 0, 4096), &data[..4096], "other");
    let st = v.stats();
    assert!(st.compacted >= 1, "{st:?}");
    // Two copies: the random group at 0 as it is (256 KiB), the text one
    // compressed to a fraction of its 256 KiB.
    assert!(st.compact_bytes < 320_000, "the text compresses: {st:?}");
    for _ in 0..2 {
        let msg = corrupt_message(&v, off + 10, 100);
        assert!(msg.contains(&id.to_string()), "{msg}");
        assert!(msg.contains("hash"), "{msg}");
    }
    assert!(v.stats().compact_hits >= 2, "{:?}", v.stats());
    same(
        &read(&v, first, 4096),
        &data[first as usize..][..4096],
        "first again",
    );
}

#[test]
fn writes_are_refused_and_the_device_describes_itself() {
    let f = fixture();
    let v = &f.cdc;
    let caps = v.caps();
    assert!(!caps.writable && caps.extents && caps.multi_conn);
    assert!(!caps.flush && !caps.fua && !caps.trim && !caps.zeroes && !caps.fast_zero);
    assert!(!caps.rotational);
    let bs = v.block_sizes();
    assert_eq!((bs.minimum, bs.preferred, bs.maximum), (1, 4096, 32 << 20));
    let ro = |r: cairn_blockdev::Result<()>| matches!(r.unwrap_err().kind, ErrorKind::ReadOnly);
    assert!(ro(v.write_at(b"x", 0, false)));
    assert!(ro(v.write_at(b"x", 0, true)));
    assert!(ro(v.trim(0, 4096, false)));
    assert!(ro(v.write_zeroes(0, 4096, ZeroFlags::default())));
    v.flush().unwrap();
    let mut b = [0u8; 2];
    let e = v.read_at(&mut b, v.size() - 1).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::OutOfRange));
    assert!(v.read_at(&mut b, u64::MAX).is_err());
    // Still the stored bytes.
    same(&read(v, 0, 4096), &f.data[..4096], "after refused writes");
    assert_eq!((v.name(), v.snapshot()), ("cdc", 1));
}

#[test]
fn a_second_snapshot_is_read_by_its_number() {
    let (_d, repo) = new_repo();
    let v1 = source(21);
    let mut v2 = v1.clone();
    for i in (0..v2.len()).step_by(300_007) {
        v2[i] ^= 0x5a;
    }
    v2.truncate(v2.len() - 4321);
    store(&repo, "disk", &v1, "cdc:4K,16K,64K", "zstd:3", 1 << 20);
    // A volume open during a backup keeps reading its snapshot.
    let old = Volume::open(repo.clone(), "disk", &VolumeOptions::default()).unwrap();
    store(&repo, "disk", &v2, "cdc:4K,16K,64K", "zstd:3", 1 << 20);
    let view = RepoView::open(repo.clone()).unwrap();
    let opts = VolumeOptions::default();
    let first = view.volume("disk@1", &opts).unwrap();
    let latest = view.volume("disk", &opts).unwrap();
    let second = Volume::open_with(&view, "disk@latest", &opts).unwrap();
    assert_eq!(
        (first.snapshot(), latest.snapshot(), second.snapshot()),
        (1, 2, 2)
    );
    assert_eq!(first.size(), v1.len() as u64);
    assert_eq!(latest.size(), v2.len() as u64);
    same(&read(&first, 0, v1.len()), &v1, "disk@1");
    same(
        &read(&old, 0, v1.len()),
        &v1,
        "disk opened before the second backup",
    );
    same(&read(&latest, 0, v2.len()), &v2, "disk");
    same(&read(&second, 0, v2.len()), &v2, "disk@latest");
    assert!(view.volume("disk@3", &opts).is_err());
    assert!(view.volume("nothing", &opts).is_err());
    assert!(view.volume("disk@x", &opts).is_err());
}

/// The data chunks of `name`'s latest snapshot whose record lies in the
/// pack at `path` and covers byte `at` of it, with their image offsets.
fn chunks_at(repo: &Repository, name: &str, path: &std::path::Path, at: u64) -> Vec<(u64, String)> {
    let (n, s) = repo.resolve(name).unwrap();
    let m = repo.read_manifest(&n, s).unwrap();
    let idx = repo.load_index().unwrap().index;
    let mut out = Vec::new();
    for (off, e) in m.with_offsets() {
        if let StoreExtent::Data { id, .. } = e {
            let loc = idx.get(id).unwrap();
            let p = repo.pack_path(idx.pack(loc.pack).unwrap()).unwrap();
            let (from, to) = (
                u64::from(loc.offset),
                u64::from(loc.offset) + u64::from(loc.len),
            );
            if p == path && (from..to).contains(&at) {
                out.push((off, id.to_string()));
            }
        }
    }
    out
}

/// Flip the last byte of the record at `loc` (of a record stored raw: a
/// byte of its last chunk) and fix up the record's CRC, so that only the
/// chunk's BLAKE3 check can notice.
fn flip_last_byte_of_record(
    repo: &Repository,
    idx: &cairn_store::ChunkIndex,
    loc: cairn_store::Location,
) {
    let path = repo.pack_path(idx.pack(loc.pack).unwrap()).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let rec = &mut bytes[loc.offset as usize..(loc.offset + loc.len) as usize];
    let last = rec.len() - 1;
    rec[last] ^= 0x80;
    let crc = crc32c::crc32c_append(crc32c::crc32c(&rec[..16]), &rec[20..]);
    rec[16..20].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
}

fn corrupt_message(v: &Volume, off: u64, len: usize) -> String {
    let mut buf = vec![0u8; len];
    let e = v.read_at(&mut buf, off).unwrap_err();
    match e.kind {
        ErrorKind::Corrupt(msg) => msg,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn a_flipped_byte_in_a_pack_is_damage_naming_the_chunk() {
    let (_d, repo) = new_repo();
    let data = source(33);
    store(&repo, "img", &data, "cdc:4K,16K,64K", "zstd:3", 256 << 10);
    let packs = repo.pack_files().unwrap();
    let pack = packs.iter().max_by_key(|p| p.len).unwrap();
    let at = pack.len / 2;
    let hit = chunks_at(&repo, "img", &pack.path, at);
    assert!(!hit.is_empty());
    let mut bytes = std::fs::read(&pack.path).unwrap();
    bytes[at as usize] ^= 0x01;
    std::fs::write(&pack.path, &bytes).unwrap();

    let v = Volume::open(repo.clone(), "img", &VolumeOptions::default()).unwrap();
    let size = v.size();
    // The whole image: an error naming the first damaged chunk, not data.
    let msg = corrupt_message(&v, 0, size as usize);
    assert!(msg.contains("img@1"), "{msg}");
    assert!(msg.contains(&hit[0].1), "{msg} should name {}", hit[0].1);
    assert!(msg.contains(&format!("offset {}", hit[0].0)), "{msg}");
    // Every damaged chunk alone, again (failures are not cached).
    for (off, id) in &hit {
        let msg = corrupt_message(&v, *off + 1, 10);
        assert!(msg.contains(id.as_str()), "{msg} should name {id}");
    }
    // The rest of the image still reads.
    let (first, last) = (hit[0].0, hit[hit.len() - 1].0);
    same(
        &read(&v, 0, first as usize),
        &data[..first as usize],
        "before the damage",
    );
    let after = last + 70_000;
    if after < size {
        same(
            &read(&v, after, (size - after) as usize),
            &data[after as usize..],
            "after",
        );
    }
}

/// A chunk stored twice (its packs lost, the image stored again, the packs
/// found again) whose copy the index names is damaged is read from its
/// other copy: the whole image reads as it was.
#[test]
fn a_damaged_chunk_stored_twice_is_read_from_its_other_copy() {
    let (_d, repo) = new_repo();
    let data = source(35);
    store(&repo, "img", &data, "cdc:4K,16K,64K", "zstd:3", 256 << 10);
    let first = repo.pack_files().unwrap();
    for p in &first {
        std::fs::rename(&p.path, p.path.with_extension("aside")).unwrap();
    }
    store(&repo, "img", &data, "cdc:4K,16K,64K", "zstd:3", 256 << 10);
    for p in &first {
        std::fs::rename(p.path.with_extension("aside"), &p.path).unwrap();
    }
    let idx = repo.load_index().unwrap().index;
    assert!(
        idx.other_locations().count() > 10,
        "every chunk stored twice"
    );
    // Damage the middle of the largest pack the index uses.
    let used: std::collections::BTreeSet<u32> = idx.locations().map(|(_, l)| l.pack).collect();
    let pack = used
        .iter()
        .map(|&n| repo.pack_path(idx.pack(n).unwrap()).unwrap())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let len = std::fs::metadata(&pack).unwrap().len();
    let hit = chunks_at(&repo, "img@2", &pack, len / 2);
    assert!(!hit.is_empty());
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes[len as usize / 2] ^= 0x01;
    std::fs::write(&pack, &bytes).unwrap();
    for spec in ["img@1", "img@2"] {
        let v = Volume::open(repo.clone(), spec, &VolumeOptions::default()).unwrap();
        same(&read(&v, 0, data.len()), &data, spec);
        // Each damaged chunk alone, again.
        for (off, _) in &hit {
            same(
                &read(&v, *off, 100),
                &data[*off as usize..*off as usize + 100],
                spec,
            );
        }
    }
}

#[test]
fn a_chunk_that_decodes_to_other_bytes_is_caught_by_its_hash() {
    let (_d, repo) = new_repo();
    let data = source(44);
    // Stored raw so a flipped byte is a flipped chunk byte; the record's
    // CRC is then fixed up so that only the BLAKE3 check can notice.
    store(&repo, "raw", &data, "fixed:64K", "none", 0);
    let (n, s) = repo.resolve("raw").unwrap();
    let m = repo.read_manifest(&n, s).unwrap();
    let idx = repo.load_index().unwrap().index;
    let (off, id) = m
        .with_offsets()
        .find_map(|(o, e)| match e {
            StoreExtent::Data { id, .. } if o > 100_000 => Some((o, *id)),
            _ => None,
        })
        .unwrap();
    let loc = idx.get(&id).unwrap();
    flip_last_byte_of_record(&repo, &idx, loc);

    let opts = VolumeOptions {
        threads: 0,
        ..VolumeOptions::default()
    };
    let v = Volume::open(repo.clone(), "raw", &opts).unwrap();
    for _ in 0..2 {
        let msg = corrupt_message(&v, off, 65_536);
        assert!(msg.contains(&id.to_string()), "{msg}");
        assert!(msg.contains("hash"), "{msg}");
    }
    same(&read(&v, 0, off as usize), &data[..off as usize], "before");
}

#[test]
fn a_missing_pack_is_damage() {
    let (_d, repo) = new_repo();
    let data = source(55);
    store(&repo, "img", &data, "cdc:4K,16K,64K", "lz4", 1 << 20);
    let v = Volume::open(repo.clone(), "img", &VolumeOptions::default()).unwrap();
    for p in repo.pack_files().unwrap() {
        std::fs::remove_file(&p.path).unwrap();
    }
    let msg = corrupt_message(&v, 0, data.len());
    assert!(msg.contains("missing"), "{msg}");
    // Holes still read as zeroes without touching packs.
    let hole = v.extents(0, v.size()).unwrap();
    let mut at = 0;
    for e in hole {
        if e.hole {
            assert!(read(&v, at, e.len as usize).iter().all(|&b| b == 0));
        }
        at += e.len;
    }
}

#[test]
fn gc_deletes_no_pack_under_an_open_volume() {
    let (_d, repo) = new_repo();
    let old = source(66);
    let new = source(68);
    store(&repo, "vm", &old, "cdc:4K,16K,64K", "zstd:3", 1 << 20);
    store(&repo, "vm", &new, "cdc:4K,16K,64K", "zstd:3", 1 << 20);
    let v = Volume::open(repo.clone(), "vm@1", &VolumeOptions::default()).unwrap();
    {
        let lock = repo.session("test").unwrap();
        repo.remove_snapshot(&lock, "vm", 1).unwrap();
        let report = cairn_store::gc(&repo, &lock, &cairn_store::GcOptions::default()).unwrap();
        assert!(report.deferred, "{report:?}");
    }
    same(
        &read(&v, 0, old.len()),
        &old,
        "vm@1 after its snapshot was forgotten",
    );
    drop(v);
    let lock = repo.session("test").unwrap();
    let report = cairn_store::gc(&repo, &lock, &cairn_store::GcOptions::default()).unwrap();
    assert!(!report.deferred, "{report:?}");
    drop(lock);
    let v = Volume::open(repo.clone(), "vm", &VolumeOptions::default()).unwrap();
    same(&read(&v, 0, new.len()), &new, "vm after gc");
}
