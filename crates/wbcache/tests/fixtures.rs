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
        // Flush marks only where `build` asks for one.
        mark_delay: Duration::from_secs(3600),
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

/// A cache image with every group written and flushed; the flush mark
/// written after the last FLUSH if `marked` (else the crash came first).
fn build(plog: bool, marked: bool) -> Vec<u8> {
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
    if marked {
        wb.write_flush_mark().unwrap();
    }
    wb.crash();
    cache.contents()
}

/// (file name, image) of every fixture today's code writes (format
/// version 4). The version 1-3 fixtures were made by earlier code and
/// are kept as they are.
fn fixtures() -> Vec<(&'static str, Vec<u8>)> {
    let seg = build(false, true);
    let plog = build(true, true);
    let seg_unmarked = build(false, false);
    let plog_unmarked = build(true, false);
    // A byte of segment 2's data; segment 3, sealed after segment 2 was
    // flushed, says so: damage, not a torn tail.
    let mut damaged_segment = seg.clone();
    damaged_segment[(RING_OFFSET + SEGMENT_BYTES + 5 * 4096 + 17) as usize] ^= 0x40;
    // A byte of the last segment (5), nothing after it: damage where the
    // flush mark says it was flushed, a torn tail where the crash came
    // before the mark.
    let last_segment = (RING_OFFSET + 4 * SEGMENT_BYTES + 4096 + 9) as usize;
    let mut damaged_last = seg.clone();
    damaged_last[last_segment] ^= 0x40;
    let mut torn_tail = seg_unmarked.clone();
    torn_tail[last_segment] ^= 0x40;
    // The second plog record damaged, the third intact after it: damage.
    let mut damaged_record = plog.clone();
    let records = plog_record_offsets(&plog);
    damaged_record[records[1] + 4096 + 3] ^= 0x01;
    // The last record damaged: damage or a torn tail, as for segments.
    let last_record = records[records.len() - 1] + 4096 + 3;
    let mut damaged_last_record = plog.clone();
    damaged_last_record[last_record] ^= 0x01;
    let mut torn_record = plog_unmarked.clone();
    torn_record[last_record] ^= 0x01;
    // Both flush mark slots unreadable.
    let mut no_mark = seg.clone();
    no_mark[12288..20480].fill(0);
    let mut bad_sb = seg.clone();
    bad_sb[30] ^= 0xff;
    vec![
        ("v4-segments.img", seg),
        ("v4-plog.img", plog),
        ("v4-damaged-segment.img", damaged_segment),
        ("v4-damaged-last-segment.img", damaged_last),
        ("v4-torn-tail-segment.img", torn_tail),
        ("v4-damaged-plog-record.img", damaged_record),
        ("v4-damaged-last-plog-record.img", damaged_last_record),
        ("v4-torn-tail-plog-record.img", torn_record),
        ("v4-no-flush-mark.img", no_mark),
        ("v4-bad-superblock.img", bad_sb),
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

/// Open `name`; `Ok` with what it reads as, `Err` if refused.
fn open_fixture(name: &str, plog: bool, accept_loss: bool) -> Result<Vec<u8>, WbError> {
    let cache = load(name);
    let cfg = WbConfig {
        accept_loss,
        ..cfg(plog)
    };
    let wb = WbCache::open(cache.clone(), Arc::new(MemDev::new(BACKING)), cfg.clone())?;
    let got = read_all(&wb);
    // And what it reads is what a drain writes back.
    let backing = Arc::new(MemDev::new(BACKING));
    wb.crash();
    let wb = WbCache::open(cache, backing.clone(), cfg).unwrap();
    wb.drain().unwrap();
    wb.close().unwrap();
    assert!(backing.contents() == got, "{name}: drained backing");
    Ok(got)
}

#[test]
fn every_fixture_opens_as_documented() {
    // (fixture, writes that must read back, damaged). All 315 writes were
    // flushed. Segment 1 holds the first 252 (the open segment filled);
    // without plog, the flush after write 300 sealed segment 2 and each
    // later group one more segment (3, 4, 5). With plog, writes 253..300
    // are record 1 and each later group one more record.
    for (name, upto, damaged) in [
        ("v1-segments.img", 315, false),
        ("v2-segments.img", 315, false),
        ("v2-plog.img", 315, false),
        // Version 2 segments claim nothing: damage there still reads as
        // a torn tail (the reason for version 3).
        ("v2-torn-segment.img", 252, false),
        // A damaged record with an intact one after it is damage in any
        // version: records are flushed one by one.
        ("v2-torn-plog-record.img", 300, true),
        ("v3-segments.img", 315, false),
        ("v3-plog.img", 315, false),
        ("v3-damaged-segment.img", 252, true),
        ("v3-torn-tail-segment.img", 310, false),
        ("v3-damaged-plog-record.img", 300, true),
        ("v3-torn-tail-plog-record.img", 310, false),
        ("v4-segments.img", 315, false),
        ("v4-plog.img", 315, false),
        ("v4-damaged-segment.img", 252, true),
        // The new case of version 4: the last FLUSH's segment or record
        // damaged, vouched for by the flush mark only.
        ("v4-damaged-last-segment.img", 310, true),
        ("v4-torn-tail-segment.img", 310, false),
        ("v4-damaged-plog-record.img", 300, true),
        ("v4-damaged-last-plog-record.img", 310, true),
        ("v4-torn-tail-plog-record.img", 310, false),
        // Nothing lost, but what was flushed cannot be told.
        ("v4-no-flush-mark.img", 315, true),
    ] {
        for plog in [false, true] {
            match open_fixture(name, plog, false) {
                Ok(got) => {
                    assert!(!damaged, "{name}: damage was not noticed");
                    assert!(got == model(upto), "{name} (plog {plog})");
                }
                Err(e) => {
                    assert!(damaged, "{name}: {e}");
                    assert!(matches!(e, WbError::Damaged { .. }), "{name}: {e}");
                    let got = open_fixture(name, plog, true).unwrap();
                    assert!(got == model(upto), "{name} with the loss accepted");
                }
            }
        }
    }
    for name in [
        "v2-bad-superblock.img",
        "v3-bad-superblock.img",
        "v4-bad-superblock.img",
    ] {
        let e = WbCache::open(load(name), Arc::new(MemDev::new(BACKING)), cfg(false))
            .err()
            .unwrap();
        assert!(matches!(e, WbError::BadSuperblock { .. }), "{e}");
    }
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
