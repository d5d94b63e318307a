//! Writable images against a model: random writes, zeroes and trims of
//! any size and alignment, flushes (each a new snapshot), reads through
//! the device and through a fresh volume of every snapshot, which must
//! equal the model as it was at that flush. Earlier snapshots never change.

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

fn opts() -> VolumeOptions {
    VolumeOptions {
        cache_bytes: 8 << 20,
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

/// Random changes and flushes; every snapshot checked against the model
/// as it was when it was committed.
fn exercise(seed: u64, chunker: &str, len: usize, rounds: usize) {
    let mut model = image(seed, len);
    let (_dir, repo) = repo_with(&model, chunker, "zstd:1");
    let dev = WritableVolume::open(repo.clone(), "img", &opts()).unwrap();
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
        if r.below(3) != 0 || round + 1 == rounds {
            dev.flush().unwrap();
            let snap = dev.snapshot();
            assert_eq!(
                snap,
                committed.last().unwrap().0 + 1,
                "one snapshot a flush"
            );
            committed.push((snap, model.clone()));
            check_reads(&dev, &model, &mut r);
        }
    }
    // A flush with nothing changed commits nothing.
    let before = dev.snapshot();
    dev.flush().unwrap();
    assert_eq!(dev.snapshot(), before);
    drop(dev);
    for (snap, want) in &committed {
        let got = read_snapshot(&repo, &format!("img@{snap}"));
        assert!(&got == want, "snapshot {snap} differs from the model");
    }
    let report = cairn_store::verify(
        &repo,
        &cairn_store::VerifyOptions {
            read_data: true,
            threads: 2,
            progress: None,
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
    let (_dir, repo) = repo_with(&data, "cdc:4096,16384,65536", "none");
    let dev = WritableVolume::open(repo.clone(), "img", &opts()).unwrap();
    dev.write_at(&[0xAB; 4096], 1 << 20, false).unwrap();
    dev.flush().unwrap();
    let s = dev.stats();
    assert_eq!((s.commits, s.snapshot), (1, 2));
    // One 4 KiB change rewrites at most the chunks around it.
    assert!(s.new_raw <= 3 * 65536, "stored {} bytes", s.new_raw);
}

#[test]
fn the_writer_lock_is_held_and_snapshots_are_refused() {
    let data = image(6, 1 << 20);
    let (_dir, repo) = repo_with(&data, "fixed:65536", "none");
    let err = WritableVolume::open(repo.clone(), "img@1", &opts())
        .err()
        .unwrap();
    assert!(err.to_string().contains("latest snapshot"), "{err}");
    let err = WritableVolume::open(repo.clone(), "nope", &opts())
        .err()
        .unwrap();
    assert!(err.to_string().contains("no snapshot"), "{err}");
    let dev = WritableVolume::open(repo.clone(), "img", &opts()).unwrap();
    let second = WritableVolume::open(repo.clone(), "img", &opts());
    assert!(matches!(second, Err(StoreError::Locked { .. })));
    // Readers are not blocked.
    assert_eq!(read_snapshot(&repo, "img"), data);
    drop(dev);
    assert!(WritableVolume::open(repo, "img", &opts()).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn any_changes_round_trip(seed in 1u64..u64::MAX, len in 1usize..300_000) {
        exercise(seed, "cdc:1024,4096,16384", len, 4);
    }
}
