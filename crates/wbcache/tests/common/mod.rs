//! Helpers shared by the wbcache integration tests.
#![allow(dead_code, clippy::unwrap_used)] // each test file uses a part; a panic is a failure

use cairn_blockdev::{BlockDev, MemDev};
use cairn_wbcache::{FormatOptions, WbCache, WbConfig, RING_OFFSET, SEGMENT_BYTES};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of the backing device.
pub const BACKING: u64 = 4 << 20;

/// Writeback only when asked (drain) or when the ring is nearly full; in
/// persistent-log mode if `plog`.
pub fn lazy_config(plog: bool) -> WbConfig {
    WbConfig {
        batch: 32,
        writeback_depth: 32,
        dirty_high: 1.0,
        idle_writeback: Duration::from_secs(3600),
        max_sealed_in_ram: 2,
        plog,
        seq_cutoff: 0,
        // The cache itself, never around it (MemDev backings are fast).
        bypass_below: Duration::ZERO,
        flush_deadline: Duration::ZERO,
        // Flush marks at open, close and when asked only, so that tests
        // of a crash after a FLUSH know whether its mark was written.
        mark_delay: Duration::from_secs(3600),
        owner: None,
        accept_loss: false,
    }
}

/// A formatted cache of `segments` slots and an empty backing device.
pub fn devs(segments: u64) -> (Arc<MemDev>, Arc<MemDev>) {
    let cache = Arc::new(MemDev::new(
        (RING_OFFSET + segments * SEGMENT_BYTES) as usize,
    ));
    let backing = Arc::new(MemDev::new(BACKING as usize));
    WbCache::format(&*cache, BACKING, &FormatOptions::default()).unwrap();
    (cache, backing)
}

/// A block whose bytes depend on `tag`.
pub fn block(tag: u8) -> Vec<u8> {
    (0..4096u32).map(|i| (i as u8) ^ tag).collect()
}

/// Block `lba` as the cache reads it.
pub fn read_block(wb: &WbCache, lba: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    wb.read_at(&mut b, lba * 4096).unwrap();
    b
}
