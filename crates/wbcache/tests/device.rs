//! The cache device by path: the lock, formatting a blank device,
//! read-only status and detach (what `cairn serve` and `cairn cache` use).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use cairn_blockdev::{BlockDev, FileDev, FileOptions, MemDev};
use cairn_wbcache::{WbCache, WbConfig, WbError, RING_OFFSET, SEGMENT_BYTES};
use std::path::PathBuf;
use std::sync::Arc;

const BACKING: u64 = 4 << 20;

/// A fresh, blank cache file of 4 segments in a directory of its own.
fn blank_cache(name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("cairn-wbdev-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cache.dev");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(RING_OFFSET + 4 * SEGMENT_BYTES).unwrap();
    (dir, path)
}

/// Writeback only on drain, so what was written stays in the log.
fn cfg() -> WbConfig {
    WbConfig {
        bypass_below: std::time::Duration::ZERO,
        dirty_high: 1.0,
        idle_writeback: std::time::Duration::from_secs(3600),
        ..WbConfig::default()
    }
}

#[test]
fn a_cache_is_locked_formatted_inspected_and_detached_by_path() {
    let (dir, path) = blank_cache("cycle");
    let backing: Arc<dyn BlockDev> = Arc::new(MemDev::new(BACKING as usize));

    // Blank: refused unless formatting is asked for; status says so too.
    let e = WbCache::open_path(&path, backing.clone(), cfg(), false)
        .err()
        .unwrap();
    assert!(matches!(e, WbError::Blank(ref p) if *p == path), "{e}");
    assert!(matches!(
        WbCache::inspect_path(&path, BACKING),
        Err(WbError::Blank(_))
    ));

    let wb = WbCache::open_path(&path, backing.clone(), cfg(), true).unwrap();
    // Held: a second opener, or a status, is refused while it is open.
    let e = WbCache::open_path(&path, backing.clone(), cfg(), true)
        .err()
        .unwrap();
    assert!(matches!(e, WbError::InUse(_)), "{e}");
    assert!(e.to_string().contains("in use"), "{e}");
    assert!(matches!(
        WbCache::inspect_path(&path, BACKING),
        Err(WbError::InUse(_))
    ));
    wb.write_at(&[7u8; 8192], 4096, false).unwrap();
    wb.flush().unwrap();
    wb.close().unwrap();

    // Closed: the lock is gone; status reads the log and writes nothing.
    let before = std::fs::read(&path).unwrap();
    let i = WbCache::inspect_path(&path, BACKING).unwrap();
    assert_eq!(i.dirty_blocks, 2, "{i:?}");
    assert!(
        std::fs::read(&path).unwrap() == before,
        "status changed the cache file"
    );

    // Detach: everything on the backing device, and the cache blank again.
    let wb = WbCache::open_path(&path, backing.clone(), cfg(), false).unwrap();
    let st = wb.detach().unwrap();
    assert_eq!(st.dirty_blocks, 0, "{st:?}");
    let mut b = vec![0u8; 8192];
    backing.read_at(&mut b, 4096).unwrap();
    assert!(
        b.iter().all(|&x| x == 7),
        "the written blocks are on the backing device"
    );
    assert!(matches!(
        WbCache::inspect_path(&path, BACKING),
        Err(WbError::Blank(_))
    ));
    let e = WbCache::open_path(&path, backing, cfg(), false)
        .err()
        .unwrap();
    assert!(matches!(e, WbError::Blank(_)), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_missing_cache_file_is_one_clear_error() {
    let path =
        std::env::temp_dir().join(format!("cairn-wbdev-{}-missing/none", std::process::id()));
    let backing: Arc<dyn BlockDev> = Arc::new(MemDev::new(BACKING as usize));
    let e = WbCache::open_path(&path, backing, cfg(), true)
        .err()
        .unwrap();
    assert!(matches!(e, WbError::Open { .. }), "{e}");
    assert!(e.to_string().contains("none"), "names the path: {e}");
}

#[test]
fn a_cache_that_is_its_backing_file_is_refused_untouched() {
    let (dir, _) = blank_cache("self");
    let path = dir.join("self.img");
    std::fs::write(&path, vec![0x5au8; 8 << 20]).unwrap();
    let backing: Arc<dyn BlockDev> =
        Arc::new(FileDev::open(&path, FileOptions::default()).unwrap());
    let e = WbCache::open_path(&path, backing, cfg(), true)
        .err()
        .expect("refused");
    assert!(matches!(e, WbError::CacheIsBacking(_)), "{e}");
    assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0x5a));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_zeroed_superblock_before_a_watermark_is_damage_not_blank() {
    let (dir, cache) = blank_cache("zeroed-sb");
    let back = dir.join("back.img");
    std::fs::write(&back, vec![0u8; BACKING as usize]).unwrap();
    let open = || {
        let backing: Arc<dyn BlockDev> =
            Arc::new(FileDev::open(&back, FileOptions::default()).unwrap());
        WbCache::open_path(&cache, backing, cfg(), true)
    };
    let wb = open().unwrap();
    wb.write_at(&[7u8; 4096], 0, false).unwrap();
    wb.sync().unwrap();
    drop(wb);
    // Zero the superblock only: the watermark after it says a cache was
    // here, so it is damage, never formatted over.
    let mut img = std::fs::read(&cache).unwrap();
    let whole = img.clone();
    img[..4096].fill(0);
    std::fs::write(&cache, &img).unwrap();
    let e = open().err().expect("refused");
    assert!(matches!(e, WbError::BadSuperblock { .. }), "{e}");
    assert!(std::fs::read(&cache).unwrap() == img, "left as it was");
    // Put back, detached, it is blank: formatted on the next use, and
    // what was written is on the backing file.
    std::fs::write(&cache, &whole).unwrap();
    open().unwrap().detach().unwrap();
    let wb = open().unwrap();
    let mut b = [0u8; 4096];
    wb.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [7u8; 4096]);
    assert_eq!(std::fs::read(&back).unwrap()[..4096], [7u8; 4096]);
    drop(wb);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Block status through the cache (outside QA: it reported the whole
/// export as data, so nbdcopy copied every byte of a sparse file): the
/// backing's holes where the cache holds none of the blocks; data where
/// it holds written blocks, zero where it holds zeroed ones; and after
/// the drain, the backing's own allocation.
#[test]
fn block_status_shows_the_backings_holes_and_the_cached_blocks() {
    let (dir, path) = blank_cache("extents");
    let file = dir.join("backing.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(BACKING)
        .unwrap();
    let backing: Arc<dyn BlockDev> =
        Arc::new(FileDev::open(&file, FileOptions::default()).unwrap());
    // Data on the backing itself at 1 MiB (64 KiB).
    backing.write_at(&[9u8; 65536], 1 << 20, false).unwrap();
    if backing.extents(0, BACKING).unwrap().len() < 3 {
        assert!(
            std::env::var_os("CI").is_none(),
            "the CI machine's temporary directory reports no holes"
        );
        eprintln!(
            "skipping: the filesystem of {} reports no holes",
            file.display()
        );
        return;
    }
    let wb = WbCache::open_path(&path, backing.clone(), cfg(), true).unwrap();
    assert!(wb.caps().extents);
    wb.write_at(&[7u8; 8192], 8192, false).unwrap();
    wb.write_zeroes(3 << 20, 4096, cairn_blockdev::ZeroFlags::default())
        .unwrap();
    // Kinds of each 4 KiB block, as reported over the whole device.
    let kinds = |dev: &dyn BlockDev| -> Vec<char> {
        let mut v = Vec::new();
        let mut pos = 0;
        while pos < BACKING {
            let ex = dev.extents(pos, BACKING - pos).unwrap();
            assert!(!ex.is_empty() && ex.iter().all(|e| e.len > 0), "{ex:?}");
            for e in ex {
                let c = match (e.hole, e.zero) {
                    (true, _) => 'h',
                    (false, true) => 'z',
                    _ => 'd',
                };
                v.extend(std::iter::repeat_n(c, (e.len / 4096) as usize));
                pos += e.len;
            }
        }
        v
    };
    let got = kinds(&wb);
    let mut want = vec!['h'; (BACKING / 4096) as usize];
    want[2..4].fill('d');
    want[256..272].fill('d');
    want[768] = 'z';
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "{:?}",
        got.iter()
            .enumerate()
            .filter(|(i, c)| want[*i] != **c)
            .take(8)
            .collect::<Vec<_>>()
    );
    // A range starting inside a cached block, and one that is all hole.
    let ex = wb.extents(8192 + 100, 10_000).unwrap();
    assert_eq!((ex[0].len, ex[0].hole), (8192 - 100, false), "{ex:?}");
    assert!(wb.extents(2 << 20, 4096).unwrap()[0].hole);
    // Drained: what the backing says.
    wb.drain().unwrap();
    let drained = kinds(&wb);
    assert!(drained[2..4].iter().all(|&c| c == 'd'), "{drained:?}");
    assert!(drained[256..272].iter().all(|&c| c == 'd'));
    assert!(drained[1000] == 'h');
    wb.close().unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}
