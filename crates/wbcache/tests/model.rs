//! The cache against a plain byte vector: random writes, zeroes, trims,
//! flushes and reads over a tiny ring that wraps, then drain and compare
//! the backing device itself.

// Tests fail loudly on any error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use cairn_blockdev::{BlockDev, MemDev, ZeroFlags};
use cairn_wbcache::{FormatOptions, WbCache, WbConfig, RING_OFFSET, SEGMENT_BYTES};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

const BACKING: u64 = 3 << 20;

#[derive(Debug, Clone)]
enum Op {
    Write {
        off: u64,
        len: u64,
        seed: u8,
        fua: bool,
    },
    Zero {
        off: u64,
        len: u64,
    },
    Trim {
        off: u64,
        len: u64,
    },
    Flush,
    Read {
        off: u64,
        len: u64,
    },
    /// `n` writes of `len` bytes one after the other from `off` (a
    /// sequential stream: the sequential cutoff's case).
    Seq {
        off: u64,
        len: u64,
        n: u64,
        seed: u8,
    },
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    let aligned = (0..BACKING / 4096, 1u64..=16).prop_map(|(b, n)| (b * 4096, n * 4096));
    let any = (0..BACKING, 1u64..=65536);
    prop_oneof![aligned, any].prop_map(|(off, len)| (off, len.min(BACKING - off)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (range(), any::<u8>(), prop::bool::weighted(0.05))
            .prop_map(|((off, len), seed, fua)| Op::Write { off, len, seed, fua }),
        1 => range().prop_map(|(off, len)| Op::Zero { off, len }),
        1 => range().prop_map(|(off, len)| Op::Trim { off, len }),
        1 => Just(Op::Flush),
        2 => range().prop_map(|(off, len)| Op::Read { off, len }),
    ]
}

/// Random operations and sequential runs, some block-aligned (bypassed once
/// the stream is long enough), some not.
fn seq_op() -> impl Strategy<Value = Op> {
    let run = (
        0..BACKING / 4096,
        1u64..=8,
        2u64..=24,
        any::<u8>(),
        prop::bool::weighted(0.8),
    )
        .prop_map(|(b, blocks, n, seed, aligned)| {
            let len = if aligned {
                blocks * 4096
            } else {
                blocks * 4096 - 512
            };
            let off = (b * 4096).min(BACKING - len * n);
            Op::Seq { off, len, n, seed }
        });
    prop_oneof![3 => op(), 1 => run]
}

fn pattern(off: u64, len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((off + i) as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn config() -> WbConfig {
    WbConfig {
        batch: 2,
        writeback_depth: 4,
        dirty_high: 0.5,
        idle_writeback: Duration::from_millis(5),
        max_sealed_in_ram: 1,
        plog: false,
        seq_cutoff: 0,
        // Every backing write counts as fast: after a few, uncached
        // block-aligned writes go around the cache, mixed with cached
        // ones (the model must not tell).
        bypass_below: Duration::from_secs(1),
        flush_deadline: Duration::ZERO,
        // A mark right after every FLUSH (races with the writers).
        mark_delay: Duration::ZERO,
        owner: None,
        accept_loss: false,
    }
}

/// With a sequential cutoff low enough for the runs of [`seq_op`].
fn cutoff_config(plog: bool) -> WbConfig {
    WbConfig {
        plog,
        seq_cutoff: 16 << 10,
        // Only sequential streams go around the cache here.
        bypass_below: Duration::ZERO,
        ..config()
    }
}

fn run(ops: &[Op]) -> cairn_wbcache::WbStatus {
    run_with(ops, config())
}

fn run_with(ops: &[Op], cfg: WbConfig) -> cairn_wbcache::WbStatus {
    let cache_dev = Arc::new(MemDev::new((RING_OFFSET + 3 * SEGMENT_BYTES) as usize));
    let backing = Arc::new(MemDev::new(BACKING as usize));
    WbCache::format(&*cache_dev, BACKING, &FormatOptions::default()).unwrap();
    let wb = WbCache::open(cache_dev.clone(), backing.clone(), cfg.clone()).unwrap();
    let mut model = vec![0u8; BACKING as usize];
    for op in ops {
        match *op {
            Op::Write {
                off,
                len,
                seed,
                fua,
            } => {
                let p = pattern(off, len, seed);
                wb.write_at(&p, off, fua).unwrap();
                model[off as usize..(off + len) as usize].copy_from_slice(&p);
            }
            Op::Zero { off, len } => {
                wb.write_zeroes(off, len, ZeroFlags::default()).unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            }
            Op::Trim { off, len } => {
                wb.trim(off, len, false).unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            }
            Op::Flush => wb.flush().unwrap(),
            Op::Seq { off, len, n, seed } => {
                for i in 0..n {
                    let at = off + i * len;
                    let p = pattern(at, len, seed);
                    wb.write_at(&p, at, false).unwrap();
                    model[at as usize..(at + len) as usize].copy_from_slice(&p);
                }
            }
            Op::Read { off, len } => {
                let mut b = vec![0u8; len as usize];
                wb.read_at(&mut b, off).unwrap();
                assert!(
                    b == model[off as usize..(off + len) as usize],
                    "read {off}+{len}"
                );
            }
        }
    }
    let mut all = vec![0u8; BACKING as usize];
    wb.read_at(&mut all, 0).unwrap();
    assert!(all == model, "whole device before drain");
    wb.drain().unwrap();
    let st = wb.status();
    assert_eq!(st.dirty_blocks, 0, "{st:?}");
    assert!(backing.contents() == model, "backing after drain");
    wb.close().unwrap();

    // Reopen: nothing to replay beyond the watermark, still the same.
    let wb = WbCache::open(cache_dev, backing, cfg).unwrap();
    let mut all = vec![0u8; BACKING as usize];
    wb.read_at(&mut all, 0).unwrap();
    assert!(all == model, "after reopen");
    wb.close().unwrap();
    st
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn behaves_like_a_byte_vector(ops in prop::collection::vec(op(), 1..120)) {
        run(&ops);
    }

    #[test]
    fn behaves_like_a_byte_vector_in_plog_mode(ops in prop::collection::vec(op(), 1..120)) {
        run_with(&ops, WbConfig { plog: true, ..config() });
    }

    #[test]
    fn behaves_like_a_byte_vector_with_sequential_cutoff(
        ops in prop::collection::vec(seq_op(), 1..80),
        plog in any::<bool>(),
    ) {
        run_with(&ops, cutoff_config(plog));
    }
}

/// Sequential runs over blocks that are cached and blocks that are not:
/// the uncached ones go straight to the backing device, the cached ones
/// through the cache, and everything reads back as written.
#[test]
fn sequential_runs_bypass_only_uncached_blocks() {
    let ops = vec![
        // Random writes put some blocks in the cache.
        Op::Write {
            off: 40 * 4096,
            len: 4096,
            seed: 1,
            fua: false,
        },
        Op::Write {
            off: 300 * 4096,
            len: 8192,
            seed: 2,
            fua: false,
        },
        // A run of 64 KiB writes over 0..1 MiB: past the first 16 KiB it
        // bypasses, except the write holding block 40.
        Op::Seq {
            off: 0,
            len: 65536,
            n: 16,
            seed: 3,
        },
        Op::Flush,
        Op::Read {
            off: 0,
            len: 1 << 20,
        },
        // A run over the cached blocks at 300..302 and beyond.
        Op::Seq {
            off: 296 * 4096,
            len: 16384,
            n: 10,
            seed: 4,
        },
        Op::Read {
            off: 290 * 4096,
            len: 200 * 4096,
        },
    ];
    let st = run_with(&ops, cutoff_config(false));
    assert!(st.bypassed_blocks >= 200, "{st:?}");
    // Without the cutoff nothing bypasses.
    let st = run_with(&ops, config());
    assert_eq!(st.bypassed_blocks, 0);
}

#[test]
fn many_writes_wrap_the_ring() {
    // Deterministic: enough data for several laps of a 3-segment ring.
    let mut ops = Vec::new();
    for i in 0..400u64 {
        let off = (i * 7919 * 4096 + i * 13) % (BACKING - 70_000);
        ops.push(Op::Write {
            off,
            len: 1 + (i * 4099) % 65536,
            seed: i as u8,
            fua: i % 50 == 0,
        });
        if i % 37 == 0 {
            ops.push(Op::Flush);
        }
        if i % 11 == 0 {
            ops.push(Op::Read {
                off: (i * 4096) % (BACKING - 65536),
                len: 65536,
            });
        }
    }
    let st = run(&ops);
    assert!(st.last_written_id > 3 * st.segment_count, "{st:?}");
    assert!(st.writeback_batches > 3, "{st:?}");
    assert!(st.read_hits_ram + st.read_hits_log > 0, "{st:?}");
}

#[test]
fn concurrent_writers_and_flushes() {
    let cache_dev = Arc::new(MemDev::new((RING_OFFSET + 4 * SEGMENT_BYTES) as usize));
    let backing = Arc::new(MemDev::new(BACKING as usize));
    WbCache::format(&*cache_dev, BACKING, &FormatOptions::default()).unwrap();
    let wb = Arc::new(WbCache::open(cache_dev, backing.clone(), config()).unwrap());
    let region = BACKING / 4;
    let mut handles = Vec::new();
    for t in 0..4u64 {
        let wb = wb.clone();
        handles.push(std::thread::spawn(move || {
            let mut model = vec![0u8; region as usize];
            for i in 0..300u64 {
                let off = (i * 104_729 + 7) % (region - 10_000);
                let len = 1 + (i * 977) % 10_000;
                let p = pattern(off, len, (t * 50 + i) as u8);
                wb.write_at(&p, t * region + off, false).unwrap();
                model[off as usize..(off + len) as usize].copy_from_slice(&p);
                if i % 40 == 0 {
                    wb.flush().unwrap();
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
    assert!(all == model);
    wb.drain().unwrap();
    assert!(backing.contents() == model);
}

#[test]
fn a_backing_size_that_is_not_a_whole_number_of_blocks() {
    let size = (1 << 20) + 1000;
    let cache_dev = Arc::new(MemDev::new((RING_OFFSET + 2 * SEGMENT_BYTES) as usize));
    let backing = Arc::new(MemDev::new(size as usize));
    WbCache::format(&*cache_dev, size, &FormatOptions::default()).unwrap();
    let wb = WbCache::open(cache_dev.clone(), backing.clone(), config()).unwrap();
    let mut model = vec![0u8; size as usize];
    for (off, len) in [
        (size - 1000, 1000),
        (size - 3000, 2500),
        (size - 5000, 5000),
    ] {
        let p = pattern(off, len, off as u8);
        wb.write_at(&p, off, false).unwrap();
        model[off as usize..(off + len) as usize].copy_from_slice(&p);
    }
    wb.write_zeroes(size - 700, 300, ZeroFlags::default())
        .unwrap();
    model[(size - 700) as usize..(size - 400) as usize].fill(0);
    wb.flush().unwrap();
    let mut all = vec![0u8; size as usize];
    wb.read_at(&mut all, 0).unwrap();
    assert!(all == model);
    wb.drain().unwrap();
    assert!(backing.contents() == model);
    wb.close().unwrap();
    let wb = WbCache::open(cache_dev, backing, config()).unwrap();
    wb.read_at(&mut all, 0).unwrap();
    assert!(all == model);
    wb.close().unwrap();
}

/// Writes that bypassed the cache are made durable by the next FLUSH (and
/// FUA): the backing device is flushed, once for many writes.
#[test]
fn flush_after_bypassed_writes_flushes_the_backing_device() {
    use cairn_blockdev::{FaultDev, FaultPlan};
    let cache_dev = Arc::new(MemDev::new((RING_OFFSET + 3 * SEGMENT_BYTES) as usize));
    let mem = Arc::new(MemDev::new(BACKING as usize));
    let backing = Arc::new(FaultDev::new(mem.clone(), FaultPlan::new()));
    WbCache::format(&*cache_dev, BACKING, &FormatOptions::default()).unwrap();
    let wb = WbCache::open(cache_dev, backing.clone(), cutoff_config(false)).unwrap();
    let flushes = || backing.counts().of(cairn_blockdev::Op::Flush);
    let data = pattern(0, 64 << 10, 9);
    for i in 0..8u64 {
        wb.write_at(&data, i * (64 << 10), false).unwrap();
    }
    assert!(wb.status().bypassed_blocks > 0);
    // Bypassed bytes are on the backing device before any writeback.
    assert!(mem.contents()[7 * (64 << 10)..8 * (64 << 10)] == data[..]);
    let before = flushes();
    wb.flush().unwrap();
    assert_eq!(flushes(), before + 1, "FLUSH flushes the backing once");
    wb.flush().unwrap();
    assert_eq!(flushes(), before + 1, "nothing new: no backing flush");
    // A FUA write that bypasses is written with FUA, and durable.
    wb.write_at(&data, 8 * (64 << 10), true).unwrap();
    wb.sync().unwrap();
    wb.close().unwrap();
}

/// A sequential writer that flushes often (a journal) stays in the cache:
/// each FLUSH restarts the count towards the cutoff. FUA writes are never
/// bypassed.
#[test]
fn streams_that_flush_often_stay_cached() {
    let mut journal = Vec::new();
    for i in 0..64u64 {
        journal.push(Op::Write {
            off: i * 8192,
            len: 8192,
            seed: i as u8,
            fua: false,
        });
        if i % 2 == 1 {
            journal.push(Op::Flush);
        }
    }
    // 512 KiB in 8 KiB writes, a flush every 16 KiB: under the 16 KiB
    // cutoff between flushes only at the second write of each pair.
    let st = run_with(
        &journal,
        WbConfig {
            seq_cutoff: 32 << 10,
            ..cutoff_config(false)
        },
    );
    assert_eq!(st.bypassed_blocks, 0, "{st:?}");
    let fua: Vec<Op> = (0..64u64)
        .map(|i| Op::Write {
            off: (1 << 20) + i * 8192,
            len: 8192,
            seed: 7,
            fua: true,
        })
        .collect();
    let st = run_with(&fua, cutoff_config(false));
    assert_eq!(st.bypassed_blocks, 0, "{st:?}");
    // The same writes without flushes go around the cache.
    let plain: Vec<Op> = (0..64u64)
        .map(|i| Op::Write {
            off: i * 8192,
            len: 8192,
            seed: 3,
            fua: false,
        })
        .collect();
    let st = run_with(
        &plain,
        WbConfig {
            seq_cutoff: 32 << 10,
            ..cutoff_config(false)
        },
    );
    assert!(st.bypassed_blocks > 0, "{st:?}");
}

/// The flush deadline: a write that no FLUSH follows is sealed into the
/// log once the open segment is that old; with no deadline it stays in
/// RAM until the segment fills or a FLUSH comes.
#[test]
fn the_flush_deadline_seals_the_open_segment() {
    for (deadline, sealed) in [(Duration::from_millis(30), true), (Duration::ZERO, false)] {
        let cache_dev = Arc::new(MemDev::new((RING_OFFSET + 3 * SEGMENT_BYTES) as usize));
        let backing = Arc::new(MemDev::new(BACKING as usize));
        WbCache::format(&*cache_dev, BACKING, &FormatOptions::default()).unwrap();
        let cfg = WbConfig {
            dirty_high: 1.0,
            idle_writeback: Duration::from_secs(3600),
            flush_deadline: deadline,
            ..config()
        };
        let wb = WbCache::open(cache_dev, backing, cfg).unwrap();
        // Let the writeback thread go to sleep with nothing to do: the
        // write must wake it to arm the deadline.
        std::thread::sleep(Duration::from_millis(50));
        wb.write_at(&pattern(0, 4096, 1), 8192, false).unwrap();
        let t = std::time::Instant::now();
        while wb.status().open_blocks > 0 && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let st = wb.status();
        assert_eq!(st.open_blocks == 0, sealed, "deadline {deadline:?}: {st:?}");
        if sealed {
            // Sealed and written to the log by the flusher.
            let t = std::time::Instant::now();
            while wb.status().last_written_id < 1 && t.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(wb.status().last_written_id >= 1, "{:?}", wb.status());
        }
        let mut b = vec![0u8; 4096];
        wb.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, pattern(0, 4096, 1));
        wb.close().unwrap();
    }
}

/// Random 4 KiB writes over `backing`, a flush every 64, through a cache
/// that goes around itself to a backing device faster than 200 µs a
/// write; the status after, with every block read back checked.
fn random_writes_over(backing: Arc<dyn BlockDev>) -> cairn_wbcache::WbStatus {
    let cache_dev = Arc::new(MemDev::new((RING_OFFSET + 3 * SEGMENT_BYTES) as usize));
    WbCache::format(&*cache_dev, BACKING, &FormatOptions::default()).unwrap();
    let cfg = WbConfig {
        dirty_high: 0.3,
        idle_writeback: Duration::from_millis(5),
        bypass_below: Duration::from_micros(200),
        ..config()
    };
    let wb = WbCache::open(cache_dev, backing, cfg).unwrap();
    let mut model = vec![0u8; BACKING as usize];
    let mut x = 99u64;
    for i in 0..3000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let off = ((x >> 33) % (BACKING / 4096)) * 4096;
        let p = pattern(off, 4096, i as u8);
        wb.write_at(&p, off, false).unwrap();
        model[off as usize..off as usize + 4096].copy_from_slice(&p);
        if i % 64 == 63 {
            wb.flush().unwrap();
        }
    }
    let mut got = vec![0u8; BACKING as usize];
    wb.read_at(&mut got, 0).unwrap();
    assert!(got == model, "reads differ from what was written");
    let st = wb.status();
    wb.close().unwrap();
    st
}

/// Issue 17: never slower on fast devices. Once writeback has measured a
/// backing device that takes a write in well under `bypass_below` (RAM),
/// random writes of uncached blocks go around the cache; in front of one
/// that takes a millisecond a write (a disk), they never do. Either way
/// every block reads back as written.
#[test]
fn random_writes_go_around_the_cache_only_to_a_fast_backing_device() {
    let fast = random_writes_over(Arc::new(MemDev::new(BACKING as usize)));
    assert!(
        fast.bypassed_blocks > 1000,
        "a RAM backing device is fast: {fast:?}"
    );
    let slow = cairn_blockdev::FaultDev::new(
        Arc::new(MemDev::new(BACKING as usize)),
        cairn_blockdev::FaultPlan::new().delay(
            cairn_blockdev::When::AlwaysOf(cairn_blockdev::Op::Write),
            Duration::from_millis(1),
        ),
    );
    let slow = random_writes_over(Arc::new(slow));
    assert_eq!(slow.bypassed_blocks, 0, "1 ms a write is slow: {slow:?}");
    assert!(slow.written_back_blocks > 0, "{slow:?}");
}
