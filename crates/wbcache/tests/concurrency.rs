//! Many threads writing, reading and flushing at once, with a tiny ring
//! and eager or idle writeback, so that writers wait for room, FLUSH
//! callers write segments themselves or wait for the flusher, and
//! writeback runs concurrently: every run must finish (no lost wakeup)
//! and read back what was written, before and after drain and reopen.
#![allow(clippy::unwrap_used)] // a panic is a test failure

mod common;

use cairn_blockdev::{BlockDev, ZeroFlags};
use cairn_wbcache::{WbCache, WbConfig};
use common::{devs, BACKING};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const THREADS: u64 = 4;

fn pattern(off: u64, len: u64, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((off + i) as u8) ^ (seed as u8).wrapping_mul(31))
        .collect()
}

/// One run: THREADS threads on disjoint regions, then checks.
fn stress(cfg: WbConfig, segments: u64, flush_every: u64) {
    let (cache, backing) = devs(segments);
    let wb = Arc::new(WbCache::open(cache.clone(), backing.clone(), cfg.clone()).unwrap());
    let region = BACKING / THREADS;
    let mut handles = Vec::new();
    for t in 0..THREADS {
        let wb = wb.clone();
        handles.push(std::thread::spawn(move || {
            let base = t * region;
            let mut model = vec![0u8; region as usize];
            let mut x = t * 7919 + 1;
            for i in 0..400u64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let off = (x >> 20) % (region - 20_000);
                let len = 1 + (x >> 40) % 20_000;
                if i % 17 == 5 {
                    wb.write_zeroes(base + off, len, ZeroFlags::default())
                        .unwrap();
                    model[off as usize..(off + len) as usize].fill(0);
                } else {
                    let p = pattern(off, len, t * 1000 + i);
                    wb.write_at(&p, base + off, i % 23 == 0).unwrap();
                    model[off as usize..(off + len) as usize].copy_from_slice(&p);
                }
                if i % flush_every == 0 {
                    wb.flush().unwrap();
                }
                if i % 9 == 0 {
                    let mut b = vec![0u8; len as usize];
                    wb.read_at(&mut b, base + off).unwrap();
                    assert!(b == model[off as usize..(off + len) as usize]);
                }
            }
            model
        }));
    }
    let mut model = Vec::new();
    for h in handles {
        model.extend(h.join().unwrap());
    }
    let mut all = vec![0u8; BACKING as usize];
    wb.read_at(&mut all, 0).unwrap();
    assert!(all == model, "read back after the writers");
    wb.drain().unwrap();
    assert!(backing.contents() == model, "backing after drain");
    let wb = Arc::try_unwrap(wb).ok().unwrap();
    wb.close().unwrap();
    let wb = WbCache::open(cache, backing, cfg).unwrap();
    let mut all = vec![0u8; BACKING as usize];
    wb.read_at(&mut all, 0).unwrap();
    assert!(all == model, "read back after reopen");
    wb.close().unwrap();
}

/// `stress` in a thread; a run that does not finish in time is a hang.
fn stress_in_time(cfg: WbConfig, segments: u64, flush_every: u64) {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        stress(cfg, segments, flush_every);
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(()) => t.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => t.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("stress run hung"),
    }
}

fn cfg(plog: bool, dirty_high: f64, idle_ms: u64, batch: usize) -> WbConfig {
    WbConfig {
        batch,
        // Several writeback threads, racing the writers and readers too.
        writeback_depth: 8,
        dirty_high,
        idle_writeback: Duration::from_millis(idle_ms),
        max_sealed_in_ram: 1,
        plog,
        // Low, so that writers' runs of blocks go around the cache too.
        seq_cutoff: 64 << 10,
        // And random ones, once a few backing writes were measured.
        bypass_below: Duration::from_secs(1),
        // Short, so that the writeback thread also seals segments.
        flush_deadline: Duration::from_millis(3),
        // Flush marks written while everything else runs.
        mark_delay: Duration::from_millis(1),
        owner: None,
        accept_loss: false,
    }
}

#[test]
fn eager_writeback_small_ring() {
    for plog in [false, true] {
        stress_in_time(cfg(plog, 0.0, 0, 1), 3, 3);
    }
}

#[test]
fn idle_writeback_small_ring() {
    for plog in [false, true] {
        stress_in_time(cfg(plog, 1.0, 2, 2), 3, 5);
    }
}

#[test]
fn lazy_writeback_ring_full_waits() {
    for plog in [false, true] {
        stress_in_time(cfg(plog, 1.0, 3_600_000, 32), 4, 50);
    }
}

#[test]
fn flush_after_every_write() {
    for plog in [false, true] {
        stress_in_time(cfg(plog, 0.5, 1, 4), 8, 1);
    }
}

/// Writeback after `idle_writeback` without writes (a deadline now, not a
/// polling tick): not while writes keep coming, soon after they stop.
#[test]
fn idle_writeback_waits_for_quiet_then_runs() {
    // Room for every segment written (about 30): only idleness can start
    // writeback.
    let (cache, backing) = devs(64);
    let cfg = WbConfig {
        batch: 32,
        writeback_depth: 32,
        dirty_high: 1.0,
        idle_writeback: Duration::from_millis(1500),
        max_sealed_in_ram: 2,
        plog: false,
        seq_cutoff: 0,
        bypass_below: Duration::ZERO,
        flush_deadline: Duration::ZERO,
        mark_delay: Duration::from_millis(50),
        owner: None,
        accept_loss: false,
    };
    let wb = WbCache::open(cache, backing.clone(), cfg).unwrap();
    let start = std::time::Instant::now();
    // Writes every 100 ms for 3 s, each flushed (a written segment).
    let mut i = 0u64;
    while start.elapsed() < Duration::from_secs(3) {
        wb.write_at(&pattern(i, 4096, i), (i % 64) * 4096, false)
            .unwrap();
        wb.flush().unwrap();
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = wb.status();
    assert!(st.dirty_segments > 0, "{st:?}");
    assert_eq!(st.writeback_batches, 0, "written back while busy: {st:?}");
    // Then quiet: written back within a few idle periods.
    let quiet = std::time::Instant::now();
    loop {
        let st = wb.status();
        if st.dirty_segments == 0 && st.dirty_blocks == 0 {
            break;
        }
        assert!(
            quiet.elapsed() < Duration::from_secs(20),
            "no idle writeback: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(quiet.elapsed() >= Duration::from_millis(1000));
    let last = i - 1;
    let mut b = vec![0u8; 4096];
    backing.read_at(&mut b, (last % 64) * 4096).unwrap();
    assert!(
        b == pattern(last, 4096, last),
        "the newest write is on the backing device"
    );
    wb.close().unwrap();
}

/// A full ring is written back half at a time (batch 32 > 16 slots): a
/// writer waiting for room waits for half the ring, not all of it. A
/// drain takes whole batches.
#[test]
fn a_full_ring_is_written_back_half_at_a_time() {
    let (cache, backing) = devs(16);
    let wb = WbCache::open(cache, backing.clone(), common::lazy_config(false)).unwrap();
    // 40 segments of writes, one FLUSH (one written segment) per 64 blocks,
    // over the 1024 blocks of the backing device.
    for i in 0..40 * 64u64 {
        wb.write_at(&pattern(i, 4096, i), (i % 1024) * 4096, false)
            .unwrap();
        if i % 64 == 63 {
            wb.flush().unwrap();
        }
    }
    let st = wb.status();
    assert!(st.writeback_batches > 0, "{st:?}");
    assert!(
        st.clean_id <= st.writeback_batches * 8,
        "a batch took more than half of the 16-slot ring: {st:?}"
    );
    // Let a batch the full ring started finish (the ring is then no
    // longer nearly full, so no other starts), then drain the rest.
    let mut settled = wb.status();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let now = wb.status();
        if now == settled {
            break;
        }
        settled = now;
    }
    assert!(
        settled.dirty_segments > 4,
        "the last batch left part of the ring for the drain: {settled:?}"
    );
    wb.drain().unwrap();
    let st = wb.status();
    assert_eq!(st.dirty_segments, 0, "{st:?}");
    assert_eq!(
        st.writeback_batches - settled.writeback_batches,
        1,
        "a drain of at most 16 segments takes one batch of 32: {st:?}"
    );
    let last = 40 * 64 - 1;
    let mut b = vec![0u8; 4096];
    backing.read_at(&mut b, (last % 1024) * 4096).unwrap();
    assert!(b == pattern(last, 4096, last));
    wb.close().unwrap();
}

/// While `quiesced` runs, no write reaches the cache or the backing
/// device: those started before end first, later ones wait. A drain
/// inside leaves the backing device holding every write before and none
/// after: one moment of the device.
#[test]
fn quiesced_holds_new_writes_back_until_it_returns() {
    let (cache, backing) = devs(16);
    let wb = Arc::new(WbCache::open(cache, backing.clone(), common::lazy_config(false)).unwrap());
    for i in 0..64u64 {
        wb.write_at(&pattern(i, 4096, 1), i * 4096, false).unwrap();
    }
    let (tx, rx) = mpsc::channel();
    let seen = wb.quiesced(|| {
        let writer = {
            let wb = wb.clone();
            std::thread::spawn(move || {
                wb.write_at(&pattern(3, 4096, 2), 3 * 4096, false).unwrap();
                wb.write_zeroes(5 * 4096, 4096, ZeroFlags::default())
                    .unwrap();
                tx.send(()).unwrap();
            })
        };
        wb.drain().unwrap();
        // Time for the writer to get in, were it let in.
        std::thread::sleep(Duration::from_millis(300));
        let mut b = vec![0u8; 6 * 4096];
        backing.read_at(&mut b, 0).unwrap();
        (rx.try_recv().is_err(), b, writer)
    });
    let (held, before, writer) = seen;
    assert!(held, "a write got in while quiesced");
    for i in 0..6u64 {
        let at = (i * 4096) as usize;
        assert!(
            before[at..at + 4096] == pattern(i, 4096, 1)[..],
            "block {i}: the drain inside left the backing device without the writes before"
        );
    }
    writer.join().unwrap();
    assert!(rx.recv_timeout(Duration::from_secs(10)).is_ok());
    assert_eq!(common::read_block(&wb, 3), pattern(3, 4096, 2));
    assert_eq!(common::read_block(&wb, 5), vec![0u8; 4096]);
    Arc::try_unwrap(wb).ok().unwrap().close().unwrap();
}
