//! What a block status query allocates over a writable image whose
//! overlay holds many runs. In a test binary of its own: it counts the
//! allocations of its thread with a global allocator.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure

use cairn_blockdev::BlockDev;
use cairn_store::{backup, BackupOptions, Repository};
use cairn_volume::{VolumeOptions, WritableVolume};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Read;
use std::sync::Arc;

/// The system allocator, counting the bytes live and their peak for the
/// threads that ask (`COUNT`).
struct Counting;

thread_local! {
    static COUNT: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn note(delta: i64) {
    // (`try_with`: a thread's locals may be gone while it exits.)
    let _ = COUNT.try_with(|c| {
        if c.get() {
            let live = LIVE.with(|l| {
                l.set(l.get() + delta);
                l.get()
            });
            PEAK.with(|p| p.set(p.get().max(live)));
        }
    });
}

// SAFETY: every call is passed to the system allocator unchanged; the
// counting touches only const-initialised thread locals, which allocate
// nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as i64);
        // SAFETY: the caller's layout, as given.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as i64));
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Old and new are both live while the bytes are copied.
        note(new_size as i64);
        // SAFETY: as the caller's call.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        note(-(layout.size() as i64));
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak bytes live on this thread during `f`, over what was live before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, u64) {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    COUNT.with(|c| c.set(true));
    let out = f();
    COUNT.with(|c| c.set(false));
    (out, PEAK.with(|p| p.get()).max(0) as u64)
}

/// Issue: a block status over a writable image listed where every piece
/// of the range comes from (one per run of its overlay) before the
/// 65,536-extent cap applied: over millions of runs, some 200 MB per
/// request. 262,144 zeroed runs between stored blocks here: the list of
/// all 524,288 pieces took 12 MiB (18 MiB while it grew); now the lookup
/// stops at the cap.
#[test]
fn block_status_over_many_runs_stops_at_the_cap() {
    const SIZE: u64 = 2 << 30;
    const BS: u64 = 4096;
    let t = tempfile::tempdir().unwrap();
    let repo = Repository::init(
        &t.path().join("repo"),
        &[t.path().join("t0")],
        Some(1 << 20),
    )
    .unwrap();
    let session = repo.session("test").unwrap();
    let opts = BackupOptions {
        name: "img".into(),
        codec: "zstd:1".parse().unwrap(),
        chunker: "fixed:16384".parse().unwrap(),
        threads: 1,
        group_size: 256 << 10,
        source: "test".into(),
        progress: None,
        time: None,
        tags: Vec::new(),
    };
    // Stored data everywhere (one chunk, deduplicated).
    let mut data = std::io::repeat(7).take(SIZE);
    backup(&repo, &session, &mut data, &opts).unwrap();
    drop(session);
    let vopts = VolumeOptions {
        cache_bytes: 1 << 20,
        compact_bytes: 1 << 20,
        spill_bytes: 0,
        spill_dir: None,
        readahead: 0,
        threads: 1,
    };
    let dev =
        WritableVolume::open(Arc::new(repo), "img", &vopts, &t.path().join("overlay")).unwrap();
    // Every other block zeroed: runs of zeroes between stored blocks.
    for b in (0..SIZE / BS).step_by(2) {
        dev.write_zeroes(b * BS, BS, cairn_blockdev::ZeroFlags::default())
            .unwrap();
    }
    let (extents, peak) = peak_of(|| dev.extents(0, SIZE).unwrap());
    eprintln!(
        "block status over 524,288 pieces: {} KiB at its peak",
        peak >> 10
    );
    assert_eq!(extents.len(), 1 << 16, "the cap");
    let covered: u64 = extents.iter().map(|e| e.len).sum();
    assert_eq!(covered, (1 << 16) * BS, "a prefix, block by block");
    assert!(
        peak < 6 << 20,
        "a block status allocated {} KiB at its peak",
        peak >> 10
    );
}
