//! Persistent-log mode: flush-per-write loads against a model, crashes and
//! reopens, damaged records, caches formatted before the plog existed, a
//! full plog region, and group commit.

// Tests fail loudly on any error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use cairn_blockdev::{BlockDev, Caps, FaultDev, FaultPlan, MemDev, Op, Tear, When, ZeroFlags};
use cairn_wbcache::{WbCache, WbConfig, WbError, PLOG_OFFSET, RING_OFFSET, SEGMENT_BYTES};
use common::{block, devs, lazy_config, read_block, BACKING};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Plog mode; writeback only when asked (drain) or when the ring is
/// nearly full.
fn plog() -> WbConfig {
    lazy_config(true)
}

fn open(cache: &Arc<MemDev>, backing: &Arc<MemDev>) -> WbCache {
    WbCache::open(cache.clone(), backing.clone(), plog()).unwrap()
}

fn read_all(wb: &WbCache) -> Vec<u8> {
    let mut all = vec![0u8; BACKING as usize];
    wb.read_at(&mut all, 0).unwrap();
    all
}

fn flip(cache: &MemDev, offset: u64) {
    let mut b = [0u8; 1];
    cache.read_at(&mut b, offset).unwrap();
    b[0] ^= 0x40;
    cache.write_at(&b, offset, false).unwrap();
}

/// xorshift64*: deterministic pseudo-random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A write of up to a block at a random place in the first `blocks`
/// blocks: (offset, data).
fn random_write(rng: &mut Rng, blocks: u64, i: u64) -> (u64, Vec<u8>) {
    let lba = rng.below(blocks);
    let (off, len) = if rng.below(3) == 0 {
        (lba * 4096, 4096)
    } else {
        let len = 1 + rng.below(4096);
        (lba * 4096 + rng.below(4096), len)
    };
    let len = len.min(BACKING - off);
    let data = (0..len)
        .map(|j| ((off + j) as u8).wrapping_mul(13) ^ (i as u8))
        .collect();
    (off, data)
}

#[test]
fn flush_after_every_write_matches_the_model_without_filling_the_ring() {
    let (cache, backing) = devs(12);
    let wb = open(&cache, &backing);
    let mut model = vec![0u8; BACKING as usize];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut flushes = 0u64;
    for i in 0..600u64 {
        let (off, data) = random_write(&mut rng, 200, i);
        let fua = i % 25 == 0;
        wb.write_at(&data, off, fua).unwrap();
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
        if i % 40 == 7 {
            let lba = rng.below(200);
            wb.write_zeroes(lba * 4096, 8192, ZeroFlags::default())
                .unwrap();
            model[lba as usize * 4096..lba as usize * 4096 + 8192].fill(0);
        }
        if !fua {
            wb.flush().unwrap();
        }
        flushes += 1;
        if i % 10 == 0 {
            let off = rng.below(BACKING - 65536);
            let mut b = vec![0u8; 65536];
            wb.read_at(&mut b, off).unwrap();
            assert!(
                b == model[off as usize..off as usize + 65536],
                "read at {i}"
            );
        }
    }
    let st = wb.status();
    assert!(st.last_written_id < st.segment_count, "{st:?}");
    assert!(st.last_written_id * 40 < flushes, "{st:?}");
    assert!(st.plog_records + st.last_written_id >= flushes, "{st:?}");
    assert!(read_all(&wb) == model);
    wb.drain().unwrap();
    assert!(backing.contents() == model);
    wb.close().unwrap();
    let wb = open(&cache, &backing);
    assert!(read_all(&wb) == model);
    wb.close().unwrap();
}

#[test]
fn flushed_writes_survive_crashes_and_reopens() {
    let (cache, backing) = devs(6);
    let wb = open(&cache, &backing);
    let mut model = vec![0u8; BACKING as usize];
    let mut rng = Rng(42);
    // 150 flushed writes: more than one plog region's worth, so the plog
    // restarts once.
    for i in 0..150u64 {
        let (off, data) = random_write(&mut rng, 400, i);
        wb.write_at(&data, off, false).unwrap();
        wb.flush().unwrap();
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
    }
    assert!(wb.status().last_written_id >= 1, "{:?}", wb.status());
    // Unflushed writes elsewhere: old or new after the crash.
    for lba in 500..520u64 {
        wb.write_at(&block(lba as u8), lba * 4096, false).unwrap();
    }
    wb.crash();

    for round in 0..2 {
        let wb = open(&cache, &backing);
        assert!(wb.status().open_blocks > 0, "{:?}", wb.status());
        let all = read_all(&wb);
        for lba in 500..520u64 {
            let at = lba as usize * 4096;
            let got = &all[at..at + 4096];
            assert!(
                got == &block(lba as u8)[..] || got == &model[at..at + 4096],
                "round {round} lba {lba}"
            );
        }
        assert!(
            all[..500 * 4096] == model[..500 * 4096],
            "round {round}: flushed writes"
        );
        wb.crash();
    }

    // Go on from the replayed plog: the next records continue it.
    let wb = open(&cache, &backing);
    let all = read_all(&wb);
    model[500 * 4096..520 * 4096].copy_from_slice(&all[500 * 4096..520 * 4096]);
    for i in 150..190u64 {
        let (off, data) = random_write(&mut rng, 400, i);
        wb.write_at(&data, off, false).unwrap();
        wb.flush().unwrap();
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
    }
    wb.crash();
    let wb = open(&cache, &backing);
    assert!(read_all(&wb) == model);
    wb.crash();

    // Without plog mode the plog is still replayed; drain puts it all on
    // the backing device.
    let wb = WbCache::open(
        cache.clone(),
        backing.clone(),
        WbConfig {
            plog: false,
            ..plog()
        },
    )
    .unwrap();
    assert!(read_all(&wb) == model);
    wb.drain().unwrap();
    assert!(backing.contents() == model);
    wb.close().unwrap();
}

/// Six flushed single-block writes (lba i gets block(i + 1)): records 1..=6
/// of segment 1, each a header and one data block.
fn six_records() -> (Arc<MemDev>, Arc<MemDev>) {
    six_records_marked(false)
}

/// Six records, each flushed; the flush mark written after the last one
/// if `marked` (else the crash came before it).
fn six_records_marked(marked: bool) -> (Arc<MemDev>, Arc<MemDev>) {
    let (cache, backing) = devs(4);
    let wb = open(&cache, &backing);
    for lba in 0..6u64 {
        wb.write_at(&block(lba as u8 + 1), lba * 4096, false)
            .unwrap();
        wb.flush().unwrap();
    }
    if marked {
        wb.write_flush_mark().unwrap();
    }
    let st = wb.status();
    assert_eq!((st.plog_records, st.last_written_id), (6, 0), "{st:?}");
    wb.crash();
    (cache, backing)
}

/// Where record `seq` (1-based) of [`six_records`] starts.
fn record_at(seq: u64) -> u64 {
    PLOG_OFFSET + (seq - 1) * 8192
}

#[test]
fn a_damaged_newest_record_ends_the_replay_there() {
    for at in [4096 + 100, 30, 50, 64] {
        let (cache, backing) = six_records();
        flip(&cache, record_at(6) + at);
        let wb = open(&cache, &backing);
        assert_eq!(wb.status().open_blocks, 5, "damage at {at}");
        for lba in 0..5u64 {
            assert_eq!(read_block(&wb, lba), block(lba as u8 + 1), "lba {lba}");
        }
        assert_eq!(read_block(&wb, 5), vec![0; 4096], "damage at {at}");
        wb.close().unwrap();
    }
}

#[test]
fn a_damaged_newest_record_the_flush_mark_vouches_for_is_damage() {
    let (cache, backing) = six_records_marked(true);
    flip(&cache, record_at(6) + 4096 + 100);
    let e = WbCache::open(cache.clone(), backing.clone(), plog())
        .err()
        .expect("a damaged plog was opened");
    assert!(matches!(e, WbError::Damaged { .. }), "{e}");
    assert!(e.to_string().contains("flush mark"), "{e}");
    assert!(e.to_string().contains("records 6..=6"), "{e}");
    let accept = WbConfig {
        accept_loss: true,
        ..plog()
    };
    let wb = WbCache::open(cache.clone(), backing.clone(), accept).unwrap();
    assert_eq!(wb.status().open_blocks, 5);
    assert_eq!(read_block(&wb, 5), vec![0; 4096]);
    wb.crash();
    // The open that accepted the loss marked what it kept (records 1..=5
    // of the plog): no damage now.
    let wb = open(&cache, &backing);
    assert_eq!(wb.status().open_blocks, 5);
    assert_eq!(read_block(&wb, 4), block(5));
    wb.close().unwrap();
}

#[test]
fn a_damaged_older_record_is_refused_and_with_accept_loss_ends_the_replay() {
    let (cache, backing) = six_records();
    flip(&cache, record_at(3) + 4096 + 7);
    // Records are written one at a time, each flushed before the next: an
    // intact record 4 proves record 3 was flushed. Damage, not a tear.
    let e = WbCache::open(cache.clone(), backing.clone(), plog())
        .err()
        .expect("a damaged plog was opened");
    assert!(matches!(e, WbError::Damaged { .. }), "{e}");
    assert!(e.to_string().contains("record 3"), "{e}");
    // Every record after it is lost too, not only those up to record 4.
    assert!(e.to_string().contains("records 3..=6"), "{e}");
    let wb = WbCache::open(
        cache.clone(),
        backing.clone(),
        WbConfig {
            accept_loss: true,
            ..plog()
        },
    )
    .unwrap();
    assert_eq!(wb.status().open_blocks, 2);
    assert_eq!(read_block(&wb, 1), block(2));
    for lba in 2..6 {
        assert_eq!(read_block(&wb, lba), vec![0; 4096], "lba {lba}");
    }
    // The new record 3 takes the damaged one's place, exactly as long; the
    // old record 4 right after it must not be replayed as its successor.
    wb.write_at(&block(99), 100 * 4096, false).unwrap();
    wb.flush().unwrap();
    wb.crash();
    let wb = open(&cache, &backing);
    assert_eq!(wb.status().open_blocks, 3);
    assert_eq!(read_block(&wb, 0), block(1));
    assert_eq!(read_block(&wb, 100), block(99));
    for lba in 2..6 {
        assert_eq!(read_block(&wb, lba), vec![0; 4096], "lba {lba}");
    }
    wb.close().unwrap();
}

#[test]
fn a_cache_formatted_without_a_plog_opens_with_an_empty_one() {
    let (cache, backing) = devs(4);
    // Written before plog mode existed: one segment in the ring.
    let wb = WbCache::open(
        cache.clone(),
        backing.clone(),
        WbConfig {
            plog: false,
            ..plog()
        },
    )
    .unwrap();
    for lba in 0..10u64 {
        wb.write_at(&block(3), lba * 4096, false).unwrap();
    }
    wb.flush().unwrap();
    wb.crash();
    // The old format left zeroes (or whatever was there) in the region.
    let len = (RING_OFFSET - PLOG_OFFSET) as usize;
    cache.write_at(&vec![0u8; len], PLOG_OFFSET, false).unwrap();

    let wb = open(&cache, &backing);
    let st = wb.status();
    assert_eq!(
        (st.open_blocks, st.plog_records, st.last_written_id),
        (0, 0, 1),
        "{st:?}"
    );
    assert_eq!(read_block(&wb, 9), block(3));
    wb.write_at(&block(4), 20 * 4096, false).unwrap();
    wb.flush().unwrap();
    assert_eq!(wb.status().plog_records, 1);
    wb.crash();

    // Garbage that is not a record of this cache reads as an empty plog too.
    let junk: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    let (cache2, backing2) = devs(4);
    cache2.write_at(&junk, PLOG_OFFSET, false).unwrap();
    let wb2 = open(&cache2, &backing2);
    assert_eq!(wb2.status().open_blocks, 0);
    wb2.close().unwrap();

    let wb = open(&cache, &backing);
    assert_eq!(read_block(&wb, 20), block(4));
    assert_eq!(read_block(&wb, 0), block(3));
    wb.close().unwrap();
}

#[test]
fn a_full_plog_seals_the_segment_and_restarts() {
    let (cache, backing) = devs(4);
    let wb = open(&cache, &backing);
    // Each record is 8 KiB: 120 fit in the 960 KiB region.
    for lba in 0..300u64 {
        wb.write_at(&block(lba as u8), lba * 4096, false).unwrap();
        wb.flush().unwrap();
    }
    let st = wb.status();
    assert_eq!(st.last_written_id, 2, "{st:?}");
    assert_eq!(st.plog_records, 298, "{st:?}");
    assert_eq!(st.open_blocks, 300 - 2 * 121, "{st:?}");
    wb.crash();
    for _ in 0..2 {
        let wb = open(&cache, &backing);
        let st = wb.status();
        assert_eq!((st.last_written_id, st.open_blocks), (2, 58), "{st:?}");
        for lba in 0..300u64 {
            assert_eq!(read_block(&wb, lba), block(lba as u8), "lba {lba}");
        }
        wb.crash();
    }
    let wb = open(&cache, &backing);
    wb.drain().unwrap();
    let c = backing.contents();
    for lba in 0..300usize {
        assert_eq!(&c[lba * 4096..lba * 4096 + 4096], &block(lba as u8)[..]);
    }
    wb.close().unwrap();
}

#[test]
fn fua_writes_use_the_plog_and_idle_flushes_cost_nothing() {
    let (cache, backing) = devs(4);
    let fault = Arc::new(FaultDev::new(cache.clone(), FaultPlan::new()));
    let wb = WbCache::open(fault.clone(), backing.clone(), plog()).unwrap();
    wb.write_at(&block(7), 9 * 4096, true).unwrap();
    wb.write_zeroes(
        10 * 4096,
        4096,
        ZeroFlags {
            fua: true,
            ..Default::default()
        },
    )
    .unwrap();
    let st = wb.status();
    assert_eq!((st.plog_records, st.last_written_id), (2, 0), "{st:?}");
    let flushes = fault.counts().flush;
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
fn concurrent_flushes_share_records() {
    let (cache, backing) = devs(6);
    let slow = Arc::new(FaultDev::new(
        cache.clone(),
        FaultPlan::new().delay(When::AlwaysOf(Op::Flush), Duration::from_millis(10)),
    ));
    let wb = Arc::new(WbCache::open(slow.clone(), backing.clone(), plog()).unwrap());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let wb = wb.clone();
            std::thread::spawn(move || {
                for i in 0..10u64 {
                    wb.write_at(&block((t * 10 + i) as u8), (t * 100 + i) * 4096, false)
                        .unwrap();
                    wb.flush().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = wb.status();
    assert!(st.plog_records < 80, "{st:?}");
    assert_eq!(st.last_written_id, 0, "{st:?}");
    let wb = Arc::into_inner(wb).unwrap();
    wb.crash();
    let wb = open(&cache, &backing);
    for t in 0..8u64 {
        for i in 0..10u64 {
            assert_eq!(read_block(&wb, t * 100 + i), block((t * 10 + i) as u8));
        }
    }
    wb.close().unwrap();
}

#[test]
fn a_torn_record_write_loses_only_that_flush() {
    for tear in [
        Tear::Sectors(1),
        Tear::Sectors(8),
        Tear::Sectors(9),
        Tear::Bytes(100),
    ] {
        let (cache, backing) = devs(4);
        let fault = Arc::new(FaultDev::new(cache.clone(), FaultPlan::new()));
        let wb = WbCache::open(fault.clone(), backing.clone(), plog()).unwrap();
        for lba in 0..5u64 {
            wb.write_at(&block(lba as u8 + 1), lba * 4096, false)
                .unwrap();
            wb.flush().unwrap();
        }
        // The next cache write is record 6.
        fault.set_plan(FaultPlan::new().tear_and_crash(1, tear));
        wb.write_at(&block(6), 5 * 4096, false).unwrap();
        wb.write_at(&block(7), 6 * 4096, false).unwrap();
        let err = wb.sync().unwrap_err();
        assert!(err.to_string().contains("persistent log record 6"), "{err}");
        assert_eq!(read_block(&wb, 6), block(7));
        wb.crash();
        let wb = open(&cache, &backing);
        assert_eq!(wb.status().open_blocks, 5, "{tear:?}");
        for lba in 0..5u64 {
            assert_eq!(read_block(&wb, lba), block(lba as u8 + 1), "{tear:?}");
        }
        assert_eq!(read_block(&wb, 5), vec![0; 4096], "{tear:?}");
        assert_eq!(read_block(&wb, 6), vec![0; 4096], "{tear:?}");
        wb.close().unwrap();
    }
}

/// A cache device with a volatile write cache: writes are visible at once
/// but durable only after a flush. Whenever a plog record is written at
/// the start of the region (a plog restart), it keeps what a power cut at
/// that moment could leave: the durable contents plus the unflushed plog
/// writes, without the unflushed ring writes.
struct Volatile {
    visible: MemDev,
    durable: MemDev,
    pending: Mutex<Vec<(u64, Vec<u8>)>>,
    /// Writes 0..mark are flushed (set by the test).
    mark: AtomicU64,
    snapshots: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl BlockDev for Volatile {
    fn size(&self) -> u64 {
        self.visible.size()
    }
    fn caps(&self) -> Caps {
        self.visible.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> cairn_blockdev::Result<()> {
        self.visible.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> cairn_blockdev::Result<()> {
        self.visible.write_at(buf, offset, false)?;
        let mut pending = self.pending.lock().unwrap();
        pending.push((offset, buf.to_vec()));
        if offset == PLOG_OFFSET {
            let mut img = self.durable.contents();
            for (o, b) in pending.iter().filter(|(o, _)| *o < RING_OFFSET) {
                img[*o as usize..*o as usize + b.len()].copy_from_slice(b);
            }
            let mark = self.mark.load(Ordering::SeqCst);
            self.snapshots.lock().unwrap().push((mark, img));
        }
        if fua {
            drop(pending);
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&self) -> cairn_blockdev::Result<()> {
        for (o, b) in self.pending.lock().unwrap().drain(..) {
            self.durable.write_at(&b, o, false)?;
        }
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> cairn_blockdev::Result<()> {
        self.write_at(&vec![0u8; len as usize], offset, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, f: ZeroFlags) -> cairn_blockdev::Result<()> {
        self.write_at(&vec![0u8; len as usize], offset, f.fua)
    }
}

#[test]
fn a_plog_restart_never_overwrites_records_of_a_segment_not_yet_durable() {
    let size = (RING_OFFSET + 6 * SEGMENT_BYTES) as usize;
    let (cache, backing) = devs(6);
    let dev = Arc::new(Volatile {
        visible: MemDev::from_vec(cache.contents()),
        durable: MemDev::from_vec(cache.contents()),
        pending: Mutex::new(Vec::new()),
        mark: AtomicU64::new(0),
        snapshots: Mutex::new(Vec::new()),
    });
    assert_eq!(dev.size() as usize, size);
    let wb = WbCache::open(dev.clone(), backing.clone(), plog()).unwrap();
    // Ten flushed writes (records 1..=10 of segment 1), then enough
    // unflushed ones to fill segment 1, which a writer seals: the next
    // flush restarts the plog for segment 2 while segment 1 may not be
    // durable yet.
    for lba in 0..10u64 {
        wb.write_at(&block(lba as u8), lba * 4096, false).unwrap();
        wb.flush().unwrap();
        dev.mark.store(lba + 1, Ordering::SeqCst);
    }
    for lba in 10..260u64 {
        wb.write_at(&block(lba as u8), lba * 4096, false).unwrap();
    }
    wb.flush().unwrap();
    dev.mark.store(260, Ordering::SeqCst);
    assert_eq!(wb.status().last_written_id, 1);
    // Then a restart after the plog region fills.
    for lba in 260..400u64 {
        wb.write_at(&block(lba as u8), lba * 4096, false).unwrap();
        wb.flush().unwrap();
        dev.mark.store(lba + 1, Ordering::SeqCst);
    }
    let st = wb.status();
    assert_eq!(
        (st.last_written_id, st.written_back_blocks),
        (2, 0),
        "{st:?}"
    );
    wb.crash();
    let snapshots = std::mem::take(&mut *dev.snapshots.lock().unwrap());
    // The first record, and the restarts after segments 1 and 2.
    let marks: Vec<u64> = snapshots.iter().map(|s| s.0).collect();
    assert_eq!(marks.len(), 3, "{marks:?}");
    assert_eq!(marks[1], 10, "{marks:?}");
    for (mark, img) in snapshots {
        // Nothing was written back: the data is in the cache or lost.
        let cache = Arc::new(MemDev::from_vec(img));
        let backing = Arc::new(MemDev::new(BACKING as usize));
        let wb = open(&cache, &backing);
        for lba in 0..mark {
            assert_eq!(
                read_block(&wb, lba),
                block(lba as u8),
                "mark {mark} lba {lba}"
            );
        }
        wb.crash();
    }
}

/// Found from outside (2026-11-28): with segment 1 damaged, the scan read
/// the plog's leftovers of segment 1 (its record 1 overwritten by segment
/// 2's) as damaged records of segment 1, and named them first; the loss
/// that mattered (segment 1, and the plog's record of segment 2 after
/// it) is what the damage must say.
#[test]
fn a_damaged_segment_before_the_plog_names_the_segment_only() {
    let (cache, backing) = devs(4);
    let wb = open(&cache, &backing);
    // Records 1..8 of segment 1, then enough blocks to seal it and two
    // more: segment 2's record 1 (3 blocks) overwrites records 1 and 2
    // of segment 1 and leaves 3..8 behind.
    for i in 0..8u64 {
        wb.write_at(&block(1), i * 4096, false).unwrap();
        wb.flush().unwrap();
    }
    for i in 0..246u64 {
        wb.write_at(&block(2), (100 + i) * 4096, false).unwrap();
    }
    wb.flush().unwrap();
    assert_eq!(wb.status().last_written_id, 1);
    wb.write_flush_mark().unwrap();
    wb.crash();
    flip(&cache, RING_OFFSET + 4096 * 9 + 5);
    let inspected = WbCache::inspect(&*cache, BACKING).unwrap();
    assert_eq!(inspected.damage.len(), 1, "{:?}", inspected.damage);
    let what = inspected.damage[0].to_string();
    assert!(what.contains("segment 1"), "{what}");
    assert!(!what.contains("record"), "{what}");
    let e = WbCache::open(cache.clone(), backing.clone(), plog())
        .err()
        .unwrap();
    assert!(matches!(e, WbError::Damaged { .. }), "{e}");
}
