//! Crashes, torn and damaged segments, torn watermarks, a full cache, bad
//! superblocks and background failures.

// Tests fail loudly on any error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use cairn_blockdev::{BlockDev, FaultDev, FaultPlan, MemDev, Op, Tear, When};
use cairn_wbcache::{
    segment_offset, FormatOptions, WbCache, WbConfig, WbError, RING_OFFSET, SEGMENT_BYTES,
};
use common::{block, devs, lazy_config, read_block, BACKING};
use std::sync::Arc;
use std::time::Duration;

/// Writeback only when asked (drain) or when the ring is nearly full.
fn lazy() -> WbConfig {
    lazy_config(false)
}

fn open(cache: &Arc<MemDev>, backing: &Arc<MemDev>) -> WbCache {
    WbCache::open(cache.clone(), backing.clone(), lazy()).unwrap()
}

#[test]
fn crash_keeps_flushed_writes_and_unflushed_are_old_or_new() {
    let (cache, backing) = devs(8);
    let wb = open(&cache, &backing);
    for lba in 0..300 {
        wb.write_at(&block(1), lba * 4096, false).unwrap();
    }
    // Partial writes too.
    wb.write_at(b"hello", 5 * 4096 + 100, false).unwrap();
    wb.flush().unwrap();
    for lba in 200..600 {
        wb.write_at(&block(2), lba * 4096, false).unwrap();
    }
    wb.crash();

    for round in 0..2 {
        let wb = open(&cache, &backing);
        for lba in 0..200 {
            let mut want = block(1);
            if lba == 5 {
                want[100..105].copy_from_slice(b"hello");
            }
            assert_eq!(read_block(&wb, lba), want, "round {round} lba {lba}");
        }
        for lba in 200..600 {
            let got = read_block(&wb, lba);
            let old = if lba < 300 { block(1) } else { vec![0; 4096] };
            assert!(got == old || got == block(2), "round {round} lba {lba}");
        }
        wb.crash();
    }
    // And a drain after recovery puts the flushed data on the backing device.
    let wb = open(&cache, &backing);
    wb.drain().unwrap();
    let c = backing.contents();
    assert_eq!(&c[4096..8192], &block(1)[..]);
    wb.close().unwrap();
}

/// Three flushed segments: 1 = blocks 0..10 tag 1, 2 = blocks 0..5 tag 2,
/// 3 = blocks 20..25 tag 3.
fn three_segments() -> (Arc<MemDev>, Arc<MemDev>) {
    let (cache, backing) = devs(6);
    let wb = open(&cache, &backing);
    for lba in 0..10 {
        wb.write_at(&block(1), lba * 4096, false).unwrap();
    }
    wb.flush().unwrap();
    for lba in 0..5 {
        wb.write_at(&block(2), lba * 4096, false).unwrap();
    }
    wb.flush().unwrap();
    for lba in 20..25 {
        wb.write_at(&block(3), lba * 4096, false).unwrap();
    }
    wb.flush().unwrap();
    assert_eq!(wb.status().last_written_id, 3);
    wb.crash();
    (cache, backing)
}

fn flip(cache: &MemDev, offset: u64) {
    let mut b = [0u8; 1];
    cache.read_at(&mut b, offset).unwrap();
    b[0] ^= 0x40;
    cache.write_at(&b, offset, false).unwrap();
}

#[test]
fn damaged_newest_segment_ends_the_log_there() {
    let (cache, backing) = three_segments();
    flip(&cache, segment_offset(3, 6) + 4096 + 77);
    let wb = open(&cache, &backing);
    assert_eq!(wb.status().last_written_id, 2);
    assert_eq!(read_block(&wb, 0), block(2));
    assert_eq!(read_block(&wb, 7), block(1));
    assert_eq!(read_block(&wb, 21), vec![0; 4096]);
    wb.close().unwrap();
}

/// Issue 17: damage in a flushed segment with an intact one after it was
/// taken for a torn tail, and the flushed writes of both vanished without
/// a word. It is refused, naming the segment, and opens (dropping them)
/// only when the loss is accepted.
#[test]
fn damaged_older_segment_is_refused_and_with_accept_loss_ends_the_log() {
    let (cache, backing) = three_segments();
    // Damage segment 2's header: segments 2 and 3 are lost, 1 survives.
    flip(&cache, segment_offset(2, 6) + 64);
    let before = cache.contents();
    let e = WbCache::open(cache.clone(), backing.clone(), lazy())
        .err()
        .expect("a damaged log was opened");
    assert!(matches!(e, WbError::Damaged { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("segment 2 (slot 1)"), "{msg}");
    assert!(msg.contains("segment 3"), "{msg}");
    assert!(
        cache.contents() == before,
        "a refused open wrote to the cache"
    );
    let inspected = WbCache::inspect(&*cache, BACKING).unwrap();
    assert_eq!(inspected.damage.len(), 1, "{inspected:?}");
    assert_eq!(inspected.last_id, 1);
    assert!(cache.contents() == before, "inspect wrote to the cache");
    let wb = WbCache::open(
        cache.clone(),
        backing.clone(),
        WbConfig {
            accept_loss: true,
            ..lazy()
        },
    )
    .unwrap();
    assert_eq!(wb.status().last_written_id, 1);
    assert_eq!(read_block(&wb, 0), block(1));
    assert_eq!(read_block(&wb, 21), vec![0; 4096]);
    // A new segment 2 takes the damaged slot; the old segment 3 after it
    // must not be replayed as if it followed.
    wb.write_at(&block(9), 50 * 4096, false).unwrap();
    wb.flush().unwrap();
    wb.crash();
    assert!(WbCache::inspect(&*cache, BACKING)
        .unwrap()
        .damage
        .is_empty());
    let wb = open(&cache, &backing);
    assert_eq!(wb.status().last_written_id, 2);
    assert_eq!(read_block(&wb, 50), block(9));
    assert_eq!(read_block(&wb, 21), vec![0; 4096]);
    assert_eq!(read_block(&wb, 3), block(1));
    wb.close().unwrap();
}

/// Found from outside (2026-11-28): one FLUSH after a burst covers many
/// segments, all sealed before it, so none vouches for another; with no
/// segment sealed after it, damage to the first read as a torn tail and
/// every flushed write of the burst vanished. The flush mark, written by
/// the flusher shortly after the FLUSH, says they were flushed.
#[test]
fn damage_in_the_last_flush_is_refused_once_the_flusher_marked_it() {
    let (cache, backing) = devs(8);
    let cfg = WbConfig {
        mark_delay: Duration::from_millis(1),
        ..lazy()
    };
    let wb = WbCache::open(cache.clone(), backing.clone(), cfg).unwrap();
    for lba in 0..3 * 252 + 10 {
        wb.write_at(&block(7), lba * 4096, false).unwrap();
    }
    wb.flush().unwrap();
    let last = wb.status().last_written_id;
    assert_eq!(last, 4);
    let start = std::time::Instant::now();
    while wb.status().marked_id < last {
        assert!(start.elapsed() < Duration::from_secs(10), "no flush mark");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(wb.status().flush_marks >= 1);
    wb.crash();
    flip(&cache, segment_offset(1, 8) + 4096 * 9 + 3);
    let e = WbCache::open(cache.clone(), backing.clone(), lazy())
        .err()
        .expect("a damaged log was opened");
    assert!(matches!(e, WbError::Damaged { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("segment 1 (slot 0)"), "{msg}");
    assert!(msg.contains("segments 1..=4"), "{msg}");
    let inspected = WbCache::inspect(&*cache, BACKING).unwrap();
    assert_eq!((inspected.damage.len(), inspected.marked_id), (1, 4));
    // Accepting the loss drops the whole burst and says so in the mark:
    // the next open finds nothing missing.
    let accept = WbConfig {
        accept_loss: true,
        ..lazy()
    };
    let wb = WbCache::open(cache.clone(), backing.clone(), accept).unwrap();
    assert_eq!(wb.status().last_written_id, 0);
    assert_eq!(read_block(&wb, 300), vec![0; 4096]);
    wb.crash();
    let wb = open(&cache, &backing);
    assert_eq!(wb.status().marked_id, 0);
    wb.close().unwrap();
}

/// The same damage before the mark was written (a crash right after the
/// FLUSH was acknowledged) is refused too: segments 2 to 4, written after
/// segment 1, are intact, and the writer writes one segment at a time, so
/// no crash tears 1 and leaves them whole (it was read as a torn tail,
/// and the acknowledged writes dropped without a word: found by a
/// black-box test). Damage to the last segment before its mark is still
/// a torn tail: nothing on the device tells the two apart.
#[test]
fn damage_in_the_last_flush_before_its_mark_is_refused_if_later_segments_are_whole() {
    let (cache, backing) = devs(8);
    let wb = open(&cache, &backing);
    for lba in 0..3 * 252 + 10 {
        wb.write_at(&block(7), lba * 4096, false).unwrap();
    }
    wb.flush().unwrap();
    assert_eq!(wb.status().marked_id, 0);
    wb.crash();
    let before = cache.contents();
    flip(&cache, segment_offset(1, 8) + 4096 * 9 + 3);
    let e = WbCache::open(cache.clone(), backing.clone(), lazy())
        .err()
        .expect("a damaged log was opened");
    assert!(matches!(e, WbError::Damaged { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("segment 2 (slot 1), written after it, is intact"),
        "{e}"
    );
    // The last segment damaged: a torn tail, the three before it kept.
    cache.write_at(&before, 0, false).unwrap();
    flip(&cache, segment_offset(4, 8) + 4096 * 9 + 3);
    let wb = open(&cache, &backing);
    assert_eq!(wb.status().last_written_id, 3);
    assert_eq!(read_block(&wb, 0), block(7));
    wb.close().unwrap();
}

/// Found from outside (2026-11-28): a cache holding flushed writes for
/// one image was opened in front of another (or a plain file) and put
/// them there. The owner block says what the cache is in front of: a
/// cache with writes not yet written back refuses another owner; a clean
/// one takes it.
#[test]
fn a_cache_holding_writes_refuses_another_owner() {
    let (cache, backing) = devs(8);
    let owner = |k: &str| {
        Some(cairn_wbcache::Owner {
            key: k.into(),
            description: format!("backing {k}"),
        })
    };
    let cfg = |k: &str| WbConfig {
        owner: owner(k),
        ..lazy()
    };
    let wb = WbCache::open(cache.clone(), backing.clone(), cfg("a")).unwrap();
    wb.write_at(&block(3), 0, false).unwrap();
    wb.flush().unwrap();
    wb.crash();
    let e = WbCache::open(cache.clone(), backing.clone(), cfg("b"))
        .err()
        .expect("a dirty cache took another owner");
    assert!(matches!(e, WbError::OtherOwner { .. }), "{e}");
    assert!(e.to_string().contains("backing a"), "{e}");
    // Its own owner, or an opener that names none, reads the writes.
    let wb = WbCache::open(cache.clone(), backing.clone(), cfg("a")).unwrap();
    assert_eq!(read_block(&wb, 0), block(3));
    assert_eq!(
        WbCache::inspect(&*cache, BACKING).unwrap().owner,
        owner("a")
    );
    wb.drain().unwrap();
    wb.close().unwrap();
    // Clean: the new owner is taken and recorded.
    let wb = WbCache::open(cache.clone(), backing.clone(), cfg("b")).unwrap();
    wb.close().unwrap();
    assert_eq!(
        WbCache::inspect(&*cache, BACKING).unwrap().owner,
        owner("b")
    );
}

#[test]
fn torn_segment_write_then_crash_gives_the_last_flush() {
    for sectors in [1, 8, 9, 100, 400] {
        let (cache, backing) = devs(6);
        let fault = Arc::new(FaultDev::new(cache.clone(), FaultPlan::new()));
        let wb = WbCache::open(fault.clone(), backing.clone(), lazy()).unwrap();
        for lba in 0..100 {
            wb.write_at(&block(1), lba * 4096, false).unwrap();
        }
        wb.flush().unwrap();
        fault.set_plan(FaultPlan::new().tear_and_crash(1, Tear::Sectors(sectors)));
        for lba in 50..150 {
            wb.write_at(&block(2), lba * 4096, false).unwrap();
        }
        let err = wb.sync().unwrap_err();
        assert!(err.to_string().contains("segment 2 (slot 1)"), "{err}");
        // Later flushes fail with the remembered error; data stays readable.
        assert!(wb.flush().is_err());
        assert_eq!(read_block(&wb, 60), block(2));
        wb.crash();

        let wb = open(&cache, &backing);
        assert_eq!(wb.status().last_written_id, 1, "tear at {sectors} sectors");
        for lba in 0..150 {
            let want = if lba < 100 { block(1) } else { vec![0; 4096] };
            assert_eq!(read_block(&wb, lba), want, "lba {lba}");
        }
        wb.close().unwrap();
    }
}

#[test]
fn torn_watermark_falls_back_to_the_other_slot() {
    let (cache, backing) = devs(6);
    let fault = Arc::new(FaultDev::new(cache.clone(), FaultPlan::new()));
    let wb = WbCache::open(fault.clone(), backing.clone(), lazy()).unwrap();
    for lba in 0..20 {
        wb.write_at(&block(1), lba * 4096, false).unwrap();
    }
    wb.drain().unwrap();
    let clean = wb.status().clean_id;
    assert_eq!(clean, 1);
    for lba in 10..30 {
        wb.write_at(&block(2), lba * 4096, false).unwrap();
    }
    wb.flush().unwrap();
    // The next cache write is the watermark (slot B, sequence 2).
    fault.set_plan(FaultPlan::new().tear_and_crash(1, Tear::Bytes(20)));
    let err = wb.drain().unwrap_err();
    assert!(err.to_string().contains("watermark"), "{err}");
    wb.crash();

    let wb = open(&cache, &backing);
    assert_eq!(wb.status().clean_id, clean);
    assert_eq!(wb.status().last_written_id, 2);
    for lba in 0..30 {
        let want = if lba < 10 { block(1) } else { block(2) };
        assert_eq!(read_block(&wb, lba), want, "lba {lba}");
    }
    wb.drain().unwrap();
    assert_eq!(wb.status().clean_id, 2);
    wb.close().unwrap();
    let c = backing.contents();
    assert_eq!(&c[29 * 4096..30 * 4096], &block(2)[..]);
}

#[test]
fn a_full_cache_makes_writers_wait_never_fail() {
    let cache = Arc::new(MemDev::new((RING_OFFSET + 3 * SEGMENT_BYTES) as usize));
    let backing_mem = Arc::new(MemDev::new(BACKING as usize));
    WbCache::format(&*cache, BACKING, &FormatOptions::default()).unwrap();
    let slow = Arc::new(FaultDev::new(
        backing_mem.clone(),
        FaultPlan::new().delay(When::AlwaysOf(Op::Write), Duration::from_millis(3)),
    ));
    let cfg = WbConfig {
        batch: 1,
        ..WbConfig::default()
    };
    let wb = WbCache::open(cache, slow.clone(), cfg).unwrap();
    let mut model = vec![0u8; BACKING as usize];
    // ~6 MiB through a 3 MiB ring, scattered so writeback needs many writes.
    for i in 0..1600u64 {
        let lba = (i * 7919) % (BACKING / 4096);
        let off = lba * 4096 + (i % 3) * 100;
        let len = 4096 - (i % 3) * 200;
        let b: Vec<u8> = (0..len).map(|j| (i as u8) ^ (j as u8)).collect();
        wb.write_at(&b, off, false).unwrap();
        model[off as usize..(off + len) as usize].copy_from_slice(&b);
    }
    let st = wb.status();
    assert!(st.writeback_batches > 0, "{st:?}");
    wb.drain().unwrap();
    assert_eq!(wb.status().dirty_blocks, 0);
    let mut all = vec![0u8; BACKING as usize];
    wb.read_at(&mut all, 0).unwrap();
    assert!(all == model);
    assert!(backing_mem.contents() == model);
    wb.close().unwrap();
}

#[test]
fn backing_failure_keeps_data_and_fails_flushes() {
    let (cache, backing_mem) = devs(6);
    let bad = Arc::new(FaultDev::new(
        backing_mem.clone(),
        FaultPlan::new().fail(
            When::AlwaysOf(Op::Write),
            cairn_blockdev::ErrorKind::NoSpace,
        ),
    ));
    let wb = WbCache::open(cache.clone(), bad.clone(), lazy()).unwrap();
    for lba in 0..10 {
        wb.write_at(&block(4), lba * 4096, false).unwrap();
    }
    assert!(wb.drain().is_err());
    let e = wb.flush().unwrap_err();
    assert!(matches!(e.kind, cairn_blockdev::ErrorKind::NoSpace), "{e}");
    assert_eq!(read_block(&wb, 3), block(4));
    wb.crash();
    // The log still has it: a healthy backing device gets it on drain.
    let wb = open(&cache, &backing_mem);
    wb.drain().unwrap();
    assert_eq!(&backing_mem.contents()[3 * 4096..4 * 4096], &block(4)[..]);
    wb.close().unwrap();
}

#[test]
fn bad_superblocks_are_refused_clearly() {
    let (cache, backing) = devs(2);
    // Wrong backing size.
    let other = Arc::new(MemDev::new((BACKING + 4096) as usize));
    match WbCache::open(cache.clone(), other, lazy()) {
        Err(WbError::BackingSizeMismatch { formatted, actual }) => {
            assert_eq!((formatted, actual), (BACKING, BACKING + 4096));
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened with the wrong backing size"),
    }
    // Newer version with a good checksum.
    let mut sb = vec![0u8; 4096];
    cache.read_at(&mut sb, 0).unwrap();
    let mut newer = sb.clone();
    newer[8..12].copy_from_slice(&(cairn_wbcache::format::FORMAT_VERSION + 1).to_le_bytes());
    let crc = crc32c::crc32c(&newer[..64]);
    newer[64..68].copy_from_slice(&crc.to_le_bytes());
    cache.write_at(&newer, 0, false).unwrap();
    let e = WbCache::open(cache.clone(), backing.clone(), lazy())
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            WbError::UnsupportedVersion {
                found: 5,
                supported: 4
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("newer"), "{e}");
    // A damaged byte.
    let mut bad = sb.clone();
    bad[40] ^= 1;
    cache.write_at(&bad, 0, false).unwrap();
    let e = WbCache::open(cache.clone(), backing.clone(), lazy())
        .err()
        .unwrap();
    assert!(matches!(e, WbError::BadSuperblock { .. }), "{e}");
    // Not a cache at all.
    cache.write_at(&[0u8; 4096], 0, false).unwrap();
    let e = WbCache::open(cache.clone(), backing.clone(), lazy())
        .err()
        .unwrap();
    assert!(e.to_string().contains("magic"), "{e}");
    // Restored, it opens.
    cache.write_at(&sb, 0, false).unwrap();
    WbCache::open(cache, backing, lazy())
        .unwrap()
        .close()
        .unwrap();
    // Too small to format.
    let tiny = MemDev::new((RING_OFFSET + SEGMENT_BYTES + 4096) as usize);
    let e = WbCache::format(&tiny, BACKING, &FormatOptions::default()).unwrap_err();
    assert!(matches!(e, WbError::CacheTooSmall { .. }), "{e}");
}

#[test]
fn a_size_no_multiple_of_512_takes_any_request_up_to_its_last_byte() {
    // Clients round an export's size to its minimum block size: a
    // minimum of 512 on a 10000000-byte device made qemu read past the
    // end and abort. Such a device says 1, and its last bytes write,
    // read and write back exactly.
    let size = 10_000_000u64;
    let cache = Arc::new(MemDev::new((RING_OFFSET + 4 * SEGMENT_BYTES) as usize));
    let backing = Arc::new(MemDev::new(size as usize));
    WbCache::format(&*cache, size, &FormatOptions::default()).unwrap();
    let wb = WbCache::open(cache.clone(), backing.clone(), lazy()).unwrap();
    assert_eq!(wb.block_sizes().minimum, 1);
    let tail: Vec<u8> = (0..333u32).map(|i| i as u8 ^ 0x5a).collect();
    wb.write_at(&tail, size - 333, false).unwrap();
    let mut back = vec![0u8; 333];
    wb.read_at(&mut back, size - 333).unwrap();
    assert_eq!(back, tail);
    wb.drain().unwrap();
    let mut on_backing = vec![0u8; 333];
    backing.read_at(&mut on_backing, size - 333).unwrap();
    assert_eq!(on_backing, tail);
    wb.close().unwrap();
}

#[test]
fn reads_and_writes_beyond_the_end_are_out_of_range() {
    let (cache, backing) = devs(2);
    let wb = open(&cache, &backing);
    let e = wb.write_at(&[1u8; 10], BACKING - 5, false).unwrap_err();
    assert!(matches!(e.kind, cairn_blockdev::ErrorKind::OutOfRange));
    let mut b = [0u8; 10];
    assert!(wb.read_at(&mut b, BACKING - 5).is_err());
    assert!(wb.trim(BACKING, 1, false).is_err());
    assert_eq!(
        wb.block_sizes().minimum,
        1,
        "any write works: no alignment asked"
    );
    assert!(wb.caps().flush && wb.caps().fua && wb.caps().multi_conn);
    wb.close().unwrap();
}

#[test]
fn fua_writes_survive_a_crash_and_idle_flushes_cost_nothing() {
    let (cache, backing) = devs(4);
    let fault = Arc::new(FaultDev::new(cache.clone(), FaultPlan::new()));
    let wb = WbCache::open(fault.clone(), backing.clone(), lazy()).unwrap();
    wb.write_at(&block(7), 9 * 4096, true).unwrap();
    wb.write_zeroes(
        10 * 4096,
        4096,
        cairn_blockdev::ZeroFlags {
            fua: true,
            ..Default::default()
        },
    )
    .unwrap();
    let flushes = fault.counts().flush;
    assert!(flushes >= 2);
    // Nothing new: no seal, no device flush.
    wb.flush().unwrap();
    wb.flush().unwrap();
    assert_eq!(fault.counts().flush, flushes);
    wb.crash();
    let wb = open(&cache, &backing);
    assert_eq!(read_block(&wb, 9), block(7));
    assert_eq!(read_block(&wb, 10), vec![0; 4096]);
    wb.close().unwrap();
}

#[test]
fn concurrent_flushes_share_device_flushes() {
    let (cache, backing) = devs(8);
    let slow = Arc::new(FaultDev::new(
        cache.clone(),
        FaultPlan::new().delay(When::AlwaysOf(Op::Flush), Duration::from_millis(20)),
    ));
    let wb = Arc::new(WbCache::open(slow.clone(), backing, lazy()).unwrap());
    let before = slow.counts().flush;
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let wb = wb.clone();
            std::thread::spawn(move || {
                for i in 0..5u64 {
                    wb.write_at(&block(t as u8), (t * 100 + i) * 4096, false)
                        .unwrap();
                    wb.flush().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let used = slow.counts().flush - before;
    assert!(used < 40, "{used} device flushes for 40 flushes");
    for t in 0..8u64 {
        assert_eq!(read_block(&wb, t * 100 + 4), block(t as u8));
    }
}

/// A version 1 cache (before the persistent log; its plog region never
/// written) opens, replays its segments and serves them, in both modes.
#[test]
fn version_1_cache_is_read() {
    let (cache, backing) = devs(3);
    let wb = open(&cache, &backing);
    wb.write_at(&block(5), 8192, false).unwrap();
    wb.flush().unwrap();
    wb.crash();
    let mut sb = vec![0u8; 4096];
    cache.read_at(&mut sb, 0).unwrap();
    sb[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&sb[..64]);
    sb[64..68].copy_from_slice(&crc.to_le_bytes());
    // Version 1 left the plog region as mkfs-time garbage or zeroes.
    cache.write_at(&sb, 0, false).unwrap();
    cache.write_at(&[0xa5; 8192], 64 << 10, false).unwrap();
    for plog in [false, true] {
        let wb =
            WbCache::open(cache.clone(), backing.clone(), WbConfig { plog, ..lazy() }).unwrap();
        assert_eq!(read_block(&wb, 2), block(5), "plog {plog}");
        wb.crash();
    }
}

/// Regression (found by the SIGKILL rounds of crates/cli/tests/
/// wbcache_crash.rs, about 1 run in 10): writeback skipped a block's
/// version in the segment it wrote back when a newer version of the block
/// existed only in RAM, then moved the watermark past that segment. A
/// crash then lost the newer version (allowed: never flushed) and the
/// older one too (it was flushed): the block read as what the backing
/// device had before both.
#[test]
fn writeback_never_skips_a_flushed_version_for_one_still_in_ram() {
    let (cache, backing) = devs(8);
    let cfg = WbConfig {
        idle_writeback: Duration::from_millis(30),
        ..lazy()
    };
    let wb = WbCache::open(cache.clone(), backing.clone(), cfg).unwrap();
    wb.write_at(&block(1), 0, false).unwrap();
    wb.write_at(&block(1), 9 * 4096, false).unwrap();
    wb.flush().unwrap(); // segment 1: both blocks, durable
    wb.write_at(&block(2), 0, false).unwrap(); // block 0 again, RAM only
                                               // Idle writeback writes segment 1 back and moves the watermark.
    let t = std::time::Instant::now();
    while wb.status().clean_id < 1 {
        assert!(t.elapsed() < Duration::from_secs(10), "no writeback");
        std::thread::sleep(Duration::from_millis(10));
    }
    wb.crash();
    let wb = open(&cache, &backing);
    assert!(read_block(&wb, 9) == block(1));
    assert!(read_block(&wb, 0) == block(1), "a flushed write was lost");
    wb.close().unwrap();
}
