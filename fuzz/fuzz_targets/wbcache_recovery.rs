//! Recovery of the write-back log on hostile cache contents: the fuzz
//! input becomes a watermark slot, a flush mark slot and the owner block
//! (their magic, cache id and CRC fixed up, so that any claims, lengths
//! and owners are read) and the first segment
//! (header and data blocks) of a freshly formatted cache, with the magic,
//! cache id, segment id and CRC fixed up so that the entry parser and
//! replay are reached. Inspecting and opening must fail cleanly (a damaged log is
//! refused) or give a cache whose reads and drain work; never a panic or
//! a hang.
#![no_main]
use cairn_blockdev::{BlockDev, MemDev};
use cairn_wbcache::format::{
    BLOCK_SIZE, MARK_OFFSETS, OWNER_OFFSET, RING_OFFSET, SEGMENT_BYTES, WATERMARK_OFFSETS,
};
use cairn_wbcache::{FormatOptions, Owner, WbCache, WbConfig};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

const ID: [u8; 16] = [7; 16];
const BACKING: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let bs = BLOCK_SIZE as usize;
    let cache = MemDev::new((RING_OFFSET + 2 * SEGMENT_BYTES) as usize);
    let opts = FormatOptions {
        max_segments: Some(2),
        cache_id: Some(ID),
    };
    if WbCache::format(&cache, BACKING as u64, &opts).is_err() {
        return;
    }
    let (wm, seg) = data.split_at(data.len().min(64));
    // A watermark slot as given (its CRC is not fixed: both outcomes are
    // legal).
    let _ = cache.write_at(wm, WATERMARK_OFFSETS[0], false);
    let (mark, seg) = seg.split_at(seg.len().min(64));
    let mut mk = mark.to_vec();
    mk.resize(64, 0);
    mk[0..8].copy_from_slice(b"CAIRNFM\0");
    mk[8..24].copy_from_slice(&ID);
    let crc = crc32c::crc32c(&mk[..56]);
    mk[56..60].copy_from_slice(&crc.to_le_bytes());
    let _ = cache.write_at(&mk, MARK_OFFSETS[1], false);
    // The owner block: lengths as given (clamped to the block), CRC over
    // what they cover.
    let (own, seg) = seg.split_at(seg.len().min(64));
    let mut ow = vec![0u8; bs];
    ow[..own.len()].copy_from_slice(own);
    ow[0..8].copy_from_slice(b"CAIRNOW\0");
    ow[8..24].copy_from_slice(&ID);
    let k = usize::from(u16::from_le_bytes([ow[24], ow[25]])).min(bs / 2);
    let d = usize::from(u16::from_le_bytes([ow[26], ow[27]])).min(bs - 36 - k);
    let end = 28 + k + d;
    let crc = crc32c::crc32c(&ow[..end]);
    ow[end..end + 4].copy_from_slice(&crc.to_le_bytes());
    let _ = cache.write_at(&ow, OWNER_OFFSET, false);
    // Segment 1: the input, then magic, cache id, id 1 and the CRC.
    let mut img = seg.to_vec();
    img.resize(img.len().max(bs), 0);
    img.truncate(SEGMENT_BYTES as usize);
    img[0..8].copy_from_slice(b"CAIRNSG\0");
    img[8..24].copy_from_slice(&ID);
    img[24..32].copy_from_slice(&1u64.to_le_bytes());
    let count = (u32::from_le_bytes([img[32], img[33], img[34], img[35]]) as usize).min(252);
    let used = 64 + count * 16;
    let blocks = (0..count).filter(|i| img[64 + i * 16 + 9] == 0).count();
    let data_end = (bs + blocks * bs).min(img.len());
    let mut crc = crc32c::crc32c(&img[..36]);
    crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc = crc32c::crc32c_append(crc, &img[40..used]);
    crc = crc32c::crc32c_append(crc, &img[bs..data_end]);
    img[36..40].copy_from_slice(&crc.to_le_bytes());
    let _ = cache.write_at(&img, RING_OFFSET, false);
    // The read-only scan must agree with itself and never panic.
    let _ = WbCache::inspect(&cache, BACKING as u64);
    let backing = Arc::new(MemDev::new(BACKING));
    let cfg = WbConfig {
        idle_writeback: std::time::Duration::from_secs(3600),
        owner: Some(Owner {
            key: "fuzz".into(),
            description: "the fuzzer's backing".into(),
        }),
        ..WbConfig::default()
    };
    if let Ok(wb) = WbCache::open(Arc::new(cache), backing, cfg) {
        let mut buf = vec![0u8; BACKING];
        let _ = wb.read_at(&mut buf, 0);
        let _ = wb.drain();
        let _ = wb.close();
    }
});
