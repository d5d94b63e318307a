//! Writable images against a model: random writes, zeroes and trims of
//! any size and alignment, flushes, reopens after a flush (as after a
//! crash: the overlay must give back every flushed write), commits (each a
//! new snapshot), reads through the device and through a fresh volume of
//! every snapshot, which must equal the model as it was at that commit.
//! Earlier snapshots never change.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

use cairn_blockdev::{BlockDev, ZeroFlags};
use cairn_codec::CodecSpec;
use cairn_store::{backup, BackupOptions, ChunkerSpec, Repository, StoreError};
use cairn_volume::{Volume, VolumeOptions, WritableVolume};
use proptest::prelude::*;
use std::io::Cursor;
use std::sync::Arc;

mod common;
use common::Rng;

/// Random bytes, zero runs and repeated text, `len` bytes.
fn image(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let n = (r.below(200_000) as usize + 1).min(len - v.len());
        match r.below(3) {
            0 => v.extend((0..n).map(|_| r.next() as u8)),
            1 => v.resize(v.len() + n, 0),
            _ => v.extend(b"cairn writes images ".iter().cycle().take(n)),
        }
    }
    v
}

fn repo_with(data: &[u8], chunker: &str, codec: &str) -> (tempfile::TempDir, Arc<Repository>) {
    let dir = tempfile::tempdir().unwrap();
    let ts = vec![dir.path().join("t0"), dir.path().join("t1")];
    let r = Repository::init(&dir.path().join("repo"), &ts, Some(1 << 20)).unwrap();
    let lock = r.session("test").unwrap();
    let opts = BackupOptions {
        name: "img".into(),
        codec: codec.parse::<CodecSpec>().unwrap(),
        chunker: chunker.parse::<ChunkerSpec>().unwrap(),
        threads: 2,
        group_size: 256 << 10,
        source: "test".into(),
        progress: None,
        time: None,
        tags: Vec::new(),
    };
    backup(&r, &lock, &mut Cursor::new(data.to_vec()), &opts).unwrap();
    (dir, Arc::new(r))
}

/// Open `img` of `repo` for writing with its overlay in `dir`.
fn open(repo: &Arc<Repository>, dir: &std::path::Path) -> WritableVolume {
    WritableVolume::open(repo.clone(), "img", &opts(), dir).unwrap()
}

fn opts() -> VolumeOptions {
    VolumeOptions {
        cache_bytes: 8 << 20,
        compact_bytes: 8 << 20,
        spill_bytes: 0,
        spill_dir: None,
        readahead: 1 << 20,
        threads: 1,
    }
}

/// The whole image as a fresh volume of `spec` reads it.
fn read_snapshot(repo: &Arc<Repository>, spec: &str) -> Vec<u8> {
    let v = Volume::open(repo.clone(), spec, &opts()).unwrap();
    let mut buf = vec![0u8; v.size() as usize];
    v.read_at(&mut buf, 0).unwrap();
    buf
}

fn check_reads(dev: &dyn BlockDev, model: &[u8], r: &mut Rng) {
    let mut all = vec![0u8; model.len()];
    dev.read_at(&mut all, 0).unwrap();
    assert!(all == model, "whole-device read differs from the model");
    for _ in 0..20 {
        let off = r.below(model.len() as u64);
        let len = r.below((model.len() as u64 - off).min(70_000)) + 1;
        let mut buf = vec![0u8; len as usize];
        dev.read_at(&mut buf, off).unwrap();
        assert!(
            buf == model[off as usize..(off + len) as usize],
            "read {off}+{len} differs"
        );
    }
    // Extents claim holes only where the model has zeroes.
    let mut at = 0u64;
    while at < model.len() as u64 {
        let ex = dev.extents(at, model.len() as u64 - at).unwrap();
        assert!(!ex.is_empty());
        for e in ex {
            if e.zero {
                let z = &model[at as usize..(at + e.len) as usize];
                assert!(z.iter().all(|&b| b == 0), "extent at {at} says zero");
            }
            at += e.len;
        }
    }
}

/// Random changes, flushes, reopens and commits; every snapshot checked
/// against the model as it was when it was committed.
fn exercise(seed: u64, chunker: &str, len: usize, rounds: usize) {
    let mut model = image(seed, len);
    let (dir, repo) = repo_with(&model, chunker, "zstd:1");
    let overlay = dir.path().join("overlay");
    let mut dev = open(&repo, &overlay);
    assert_eq!(dev.size(), len as u64);
    let mut r = Rng(seed.wrapping_mul(7919) | 1);
    let mut committed: Vec<(u64, Vec<u8>)> = vec![(1, model.clone())];
    for round in 0..rounds {
        for _ in 0..1 + r.below(12) {
            let off = r.below(len as u64);
            let max = if r.below(4) == 0 { 300_000 } else { 9000 };
            let n = (r.below(max) + 1).min(len as u64 - off);
            let (a, b) = (off as usize, (off + n) as usize);
            match r.below(6) {
                0 => {
                    dev.write_zeroes(off, n, ZeroFlags::default()).unwrap();
                    model[a..b].fill(0);
                }
                1 => {
                    dev.trim(off, n, false).unwrap();
                    model[a..b].fill(0);
                }
                2 => {
                    // Copy of another part of the image: dedups.
                    let src = r.below(len as u64 - n) as usize;
                    let bytes = model[src..src + n as usize].to_vec();
                    dev.write_at(&bytes, off, false).unwrap();
                    model[a..b].copy_from_slice(&bytes);
                }
                _ => {
                    let bytes: Vec<u8> = (0..n).map(|_| r.next() as u8).collect();
                    dev.write_at(&bytes, off, false).unwrap();
                    model[a..b].copy_from_slice(&bytes);
                }
            }
        }
        check_reads(&dev, &model, &mut r);
        if r.below(2) == 0 {
            dev.flush().unwrap();
            if r.below(2) == 0 {
                // Gone without a commit, as in a crash after the flush:
                // the next open reads every flushed write back.
                drop(dev);
                dev = open(&repo, &overlay);
                check_reads(&dev, &model, &mut r);
            }
        }
        if r.below(3) == 0 || round + 1 == rounds {
            dev.commit().unwrap().expect("changes to commit");
            let snap = dev.snapshot();
            assert_eq!(
                snap,
                committed.last().unwrap().0 + 1,
                "one snapshot a commit"
            );
            assert_eq!(dev.stats().uncommitted, 0);
            committed.push((snap, model.clone()));
            check_reads(&dev, &model, &mut r);
        }
    }
    // A commit with nothing changed commits nothing.
    let before = dev.snapshot();
    dev.flush().unwrap();
    assert!(dev.commit().unwrap().is_none());
    assert_eq!(dev.snapshot(), before);
    // The end of the session removes the overlay.
    assert!(dev.close().unwrap().is_empty());
    drop(dev);
    assert!(!overlay.exists());
    for (snap, want) in &committed {
        let got = read_snapshot(&repo, &format!("img@{snap}"));
        assert!(&got == want, "snapshot {snap} differs from the model");
    }
    verify_clean(&repo);
}

/// `verify --read-data` finds nothing wrong and no pack left unindexed.
fn verify_clean(repo: &Arc<Repository>) {
    let report = cairn_store::verify(
        repo,
        &cairn_store::VerifyOptions {
            read_data: true,
            threads: 2,
            progress: None,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(report.problems.is_empty(), "verify: {:?}", report.problems);
    assert!(
        report.unindexed_packs.is_empty(),
        "{:?}",
        report.unindexed_packs
    );
}

#[test]
fn cdc_images_take_random_changes() {
    exercise(1, "cdc:4096,16384,65536", 3_000_017, 12);
}

#[test]
fn fixed_chunk_images_take_random_changes() {
    exercise(2, "fixed:65536", 2_100_000, 12);
}

#[test]
fn unchanged_parts_of_a_rewritten_chunk_are_not_stored_again() {
    let data = image(5, 4 << 20);
    let (dir, repo) = repo_with(&data, "cdc:4096,16384,65536", "none");
    let dev = open(&repo, &dir.path().join("o"));
    dev.write_at(&[0xAB; 4096], 1 << 20, false).unwrap();
    dev.flush().unwrap();
    assert_eq!(dev.stats().snapshot, 1, "a flush is not a snapshot");
    dev.commit().unwrap();
    let s = dev.stats();
    assert_eq!((s.commits, s.snapshot), (1, 2));
    // One 4 KiB change rewrites at most the chunks around it.
    assert!(s.new_raw <= 3 * 65536, "stored {} bytes", s.new_raw);
}

#[test]
fn the_writer_lock_is_held_and_snapshots_are_refused() {
    let data = image(6, 1 << 20);
    let (dir, repo) = repo_with(&data, "fixed:65536", "none");
    let o = dir.path().join("o");
    let err = WritableVolume::open(repo.clone(), "img@1", &opts(), &o)
        .err()
        .unwrap();
    assert!(err.to_string().contains("latest snapshot"), "{err}");
    let err = WritableVolume::open(repo.clone(), "nope", &opts(), &o)
        .err()
        .unwrap();
    assert!(err.to_string().contains("no snapshot"), "{err}");
    let dev = open(&repo, &o);
    let second = WritableVolume::open(repo.clone(), "img", &opts(), &o);
    assert!(matches!(second, Err(StoreError::Locked { .. })));
    // Readers are not blocked.
    assert_eq!(read_snapshot(&repo, "img"), data);
    drop(dev);
    assert!(WritableVolume::open(repo, "img", &opts(), &o).is_ok());
}

/// Two writers keep writing while commits run: every snapshot holds, of
/// each writer, all its writes up to some point and none after (a commit
/// is a point in time), and the last one holds everything.
#[test]
fn commits_are_points_in_time_while_writes_go_on() {
    const BLOCKS: u64 = 256;
    let data = vec![0u8; (BLOCKS * 4096) as usize];
    let (dir, repo) = repo_with(&data, "fixed:16384", "none");
    let dev = Arc::new(open(&repo, &dir.path().join("o")));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (dev, stop) = (dev.clone(), stop.clone());
            std::thread::spawn(move || {
                // Writer w owns the blocks b with b % 2 == w; a block holds
                // the sequence number of the write that made it.
                let mut r = Rng(w + 11);
                let mut log: Vec<(u64, u64)> = Vec::new();
                let mut seq = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || seq < 2000 {
                    seq += 1;
                    let b = r.below(BLOCKS / 2) * 2 + w;
                    let mut block = vec![0u8; 4096];
                    block[..8].copy_from_slice(&seq.to_le_bytes());
                    dev.write_at(&block, b * 4096, false).unwrap();
                    log.push((b, seq));
                    if seq % 100 == 0 {
                        dev.flush().unwrap();
                    }
                }
                log
            })
        })
        .collect();
    let mut snaps = Vec::new();
    for _ in 0..6 {
        std::thread::sleep(std::time::Duration::from_millis(30));
        if let Some(r) = dev.commit().unwrap() {
            snaps.push(r.snapshot);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let logs: Vec<Vec<(u64, u64)>> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    dev.flush().unwrap();
    snaps.push(dev.commit().unwrap().unwrap().snapshot);
    assert!(snaps.len() >= 3, "{snaps:?}");
    for &snap in &snaps {
        let img = read_snapshot(&repo, &format!("img@{snap}"));
        let seq_of = |b: u64| {
            let at = (b * 4096) as usize;
            u64::from_le_bytes(img[at..at + 8].try_into().unwrap())
        };
        for (w, log) in logs.iter().enumerate() {
            // The writer's last write the snapshot shows...
            let k = (0..BLOCKS / 2)
                .map(|i| seq_of(i * 2 + w as u64))
                .max()
                .unwrap();
            // ...and every block as that prefix of its writes left it.
            let mut want = vec![0u64; BLOCKS as usize];
            for &(b, seq) in log.iter().take_while(|(_, s)| *s <= k) {
                want[b as usize] = seq;
            }
            for i in 0..BLOCKS / 2 {
                let b = i * 2 + w as u64;
                assert_eq!(
                    seq_of(b),
                    want[b as usize],
                    "snapshot {snap}, writer {w}, block {b}, prefix {k}"
                );
            }
            if snap == *snaps.last().unwrap() {
                assert_eq!(
                    k,
                    log.last().unwrap().1,
                    "the last commit holds every write"
                );
            }
        }
    }
}

/// Files of at least `min` bytes under `dir`, at any depth.
fn big_files(dir: &std::path::Path, min: u64) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        if m.is_dir() {
            n += big_files(&e.path(), min);
        } else if m.len() >= min {
            n += 1;
        }
    }
    n
}

/// A commit of more than a pack and more than the span limit, across
/// data and a hole: written out pack by pack and span by span, and read
/// back whole.
#[test]
fn a_commit_bigger_than_a_pack_and_a_span_streams() {
    let mut model = image(9, 4 << 20);
    model.resize(24 << 20, 0);
    let (dir, repo) = repo_with(&model, "cdc:4096,16384,65536", "none");
    let dev = open(&repo, &dir.path().join("o"));
    let mut r = Rng(5);
    let big: Vec<u8> = (0..18 << 20).map(|_| r.next() as u8).collect();
    dev.write_at(&big, 3 << 20, false).unwrap();
    model[3 << 20..21 << 20].copy_from_slice(&big);
    let packs = |d: &tempfile::TempDir| {
        big_files(&d.path().join("t0"), 100_000) + big_files(&d.path().join("t1"), 100_000)
    };
    let before = packs(&dir);
    let report = dev.commit().unwrap().unwrap();
    assert!(report.new_raw >= 18 << 20, "{report:?}");
    assert!(
        packs(&dir) - before >= 12,
        "18 MiB of new chunks in 1 MiB packs: {} packs",
        packs(&dir) - before
    );
    assert!(read_snapshot(&repo, "img@2") == model, "img@2");
    verify_clean(&repo);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn any_changes_round_trip(seed in 1u64..u64::MAX, len in 1usize..300_000) {
        exercise(seed, "cdc:1024,4096,16384", len, 4);
    }
}
