//! Committed cache devices of every format version and kind of damage
//! (tests/fixtures/wbcache/*.zst, zstd-compressed images), opened by
//! today's code: old formats must stay readable, damage must end the log
//! where docs/format/wbcache.md says.
//!
//! The images were made by `make_fixtures` below (run with
//! `CAIRN_WRITE_FIXTURES=1 cargo test -p cairn-wbcache --test fixtures
//! -- --ignored`); what each must read as is computed here from the same
//! deterministic writes, never taken from the files themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure

use cairn_blockdev::{BlockDev, MemDev};
use cairn_wbcache::{
    FormatOptions, WbCache, WbConfig, WbError, PLOG_OFFSET, RING_OFFSET, SEGMENT_BYTES,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const BACKING: usize = 2 << 20;
const ID: [u8; 16] = *b"cairn-fixture-01";

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/wbcache")
}

fn cfg(plog: bool) -> WbConfig {
    WbConfig {
        idle_writeback: Duration::from_secs(3600),
        dirty_high: 1.0,
        plog,
        ..WbConfig::default()
    }
}

/// Block `lba` after write number `n`.
fn block(n: u64, lba: u64) -> Vec<u8> {
    let mut one = n.to_le_bytes().to_vec();
    one.extend_from_slice(&lba.to_le_bytes());
    one.repeat(256)
}

/// The writes of a fixture: (n, lba), a flush after each group.
fn groups() -> Vec<Vec<(u64, u64)>> {
    // Group 1 fills more than one segment (252 blocks): sealed to the
    // ring. Later groups are small: in plog mode they become records.
    let mut g = vec![(0..300).map(|i| (i, (i * 7) % 500)).collect::<Vec<_>>()];
    for k in 0..3u64 {
        g.push(
            (0..5)
                .map(|i| (1000 + k * 10 + i, 100 + k * 3 + i))
                .collect(),
        );
    }
    g
}

/// Apply the first `writes` writes to a model of the backing device.
fn model(writes: usize) -> Vec<u8> {
    let mut m = vec![0u8; BACKING];
    for (n, lba) in groups().into_iter().flatten().take(writes) {
        let at = lba as usize * 4096;
        m[at..at + 4096].copy_from_slice(&block(n, lba));
    }
    m
}

/// A cache image with every group written and flushed.
fn build(plog: bool) -> Vec<u8> {
    // Eight slots for at most five segments: the ring never gets near
    // full, so nothing is written back and the image alone holds the data.
    let cache = Arc::new(MemDev::new((RING_OFFSET + 8 * SEGMENT_BYTES) as usize));
    let opts = FormatOptions {
        cache_id: Some(ID),
        ..FormatOptions::default()
    };
    WbCache::format(&*cache, BACKING as u64, &opts).unwrap();
    let wb = WbCache::open(cache.clone(), Arc::new(MemDev::new(BACKING)), cfg(plog)).unwrap();
    for g in groups() {
        for (n, lba) in g {
            wb.write_at(&block(n, lba), lba * 4096, false).unwrap();
        }
        wb.flush().unwrap();
    }
    wb.crash();
    cache.contents()
}

fn set_version(img: &mut [u8], v: u32) {
    img[8..12].copy_from_slice(&v.to_le_bytes());
    let crc = crc32c::crc32c(&img[..64]);
    img[64..68].copy_from_slice(&crc.to_le_bytes());
}

/// (file name, image) of every fixture.
fn fixtures() -> Vec<(&'static str, Vec<u8>)> {
    let seg = build(false);
    let plog = build(true);
    let mut v1 = seg.clone();
    set_version(&mut v1, 1);
    // A byte of the second segment's data: the log ends after segment 1.
    let mut torn_segment = seg.clone();
    torn_segment[(RING_OFFSET + SEGMENT_BYTES + 5 * 4096 + 17) as usize] ^= 0x40;
    // The second plog record damaged: the first survives, not the third.
    let mut torn_record = plog.clone();
    let second = plog_record_offsets(&plog)[1];
    torn_record[second + 4096 + 3] ^= 0x01;
    let mut bad_sb = seg.clone();
    bad_sb[30] ^= 0xff;
    vec![
        ("v1-segments.img", v1),
        ("v2-segments.img", seg),
        ("v2-plog.img", plog),
        ("v2-torn-segment.img", torn_segment),
        ("v2-torn-plog-record.img", torn_record),
        ("v2-bad-superblock.img", bad_sb),
    ]
}

/// Offsets of the plog records in an image (headers start with the
/// record magic at 4 KiB boundaries).
fn plog_record_offsets(img: &[u8]) -> Vec<usize> {
    (PLOG_OFFSET as usize..RING_OFFSET as usize)
        .step_by(4096)
        .filter(|&o| &img[o..o + 8] == b"CAIRNPL\0")
        .collect()
}

#[test]
#[ignore = "writes the committed fixtures; run by hand after a format change"]
fn make_fixtures() {
    if std::env::var("CAIRN_WRITE_FIXTURES").as_deref() != Ok("1") {
        return;
    }
    std::fs::create_dir_all(dir()).unwrap();
    for (name, img) in fixtures() {
        let z = zstd::bulk::compress(&img, 19).unwrap();
        std::fs::write(dir().join(format!("{name}.zst")), z).unwrap();
    }
}

fn load(name: &str) -> Arc<MemDev> {
    let z = std::fs::read(dir().join(format!("{name}.zst")))
        .unwrap_or_else(|e| panic!("fixture {name}: {e}"));
    let img = zstd::bulk::decompress(&z, 64 << 20).unwrap();
    Arc::new(MemDev::from_vec(img))
}

fn read_all(wb: &WbCache) -> Vec<u8> {
    let mut b = vec![0u8; BACKING];
    wb.read_at(&mut b, 0).unwrap();
    b
}

#[test]
fn every_fixture_opens_as_documented() {
    // (fixture, writes that must read back). All 315 writes were flushed.
    // Segment 1 holds the first 252 (the open segment filled); without
    // plog, the flush after write 300 sealed segment 2, so damage there
    // leaves 252. With plog, writes 253..300 are record 1 and each later
    // group one more record, so damage in record 2 leaves 300.
    for (name, upto) in [
        ("v1-segments.img", 315),
        ("v2-segments.img", 315),
        ("v2-plog.img", 315),
        ("v2-torn-segment.img", 252),
        ("v2-torn-plog-record.img", 300),
    ] {
        for plog in [false, true] {
            let cache = load(name);
            let wb = WbCache::open(cache.clone(), Arc::new(MemDev::new(BACKING)), cfg(plog))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(read_all(&wb) == model(upto), "{name} (plog {plog})");
            // And what it reads is what a drain writes back.
            let backing = Arc::new(MemDev::new(BACKING));
            wb.crash();
            let wb = WbCache::open(cache, backing.clone(), cfg(plog)).unwrap();
            wb.drain().unwrap();
            wb.close().unwrap();
            assert!(backing.contents() == model(upto), "{name}: drained backing");
        }
    }
    let e = WbCache::open(
        load("v2-bad-superblock.img"),
        Arc::new(MemDev::new(BACKING)),
        cfg(false),
    )
    .err()
    .unwrap();
    assert!(matches!(e, WbError::BadSuperblock { .. }), "{e}");
}

/// The committed images are what today's code writes, byte for byte
/// outside the superblock's creation time: a format change shows here.
#[test]
fn fixtures_match_what_the_code_writes_now() {
    for (name, img) in fixtures() {
        let cache = load(name);
        let committed = cache.contents();
        assert_eq!(committed.len(), img.len(), "{name}");
        // Bytes 56..64 (creation time) and the superblock CRC differ.
        let diff = committed
            .iter()
            .zip(&img)
            .enumerate()
            .filter(|&(i, (a, b))| a != b && !(56..68).contains(&i))
            .count();
        assert_eq!(
            diff, 0,
            "{name}: the format changed; bump the version and add a fixture"
        );
    }
}
