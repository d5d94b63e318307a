//! Integration tests of the plain devices: FileDev (buffered and direct,
//! regular files and loop block devices) against a model, and FaultDev.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use cairn_blockdev::{
    BlockDev, ErrorKind, FaultDev, FaultPlan, FileDev, FileOptions, MemDev, Op, RotationalLatency,
    RotationalModel, Tear, When, ZeroFlags,
};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Under CI a test must not skip what it cannot do: it fails.
fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A temporary directory on the target's disk (not tmpfs, which has no
/// O_DIRECT).
fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn opts(direct: bool, read_only: bool) -> FileOptions {
    FileOptions {
        read_only,
        direct,
        lock: false,
    }
}

/// Open, or None (with a note) when O_DIRECT is refused by the filesystem
/// outside CI.
fn open(path: &Path, o: FileOptions) -> Option<FileDev> {
    match FileDev::open(path, o) {
        Ok(d) => Some(d),
        Err(e) => {
            let einval = matches!(&e.kind, ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::InvalidInput);
            if o.direct && einval && !ci() {
                eprintln!("skipping: O_DIRECT refused here: {e}");
                None
            } else {
                panic!("open {}: {e}", path.display());
            }
        }
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn make_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

// ---------------------------------------------------------------------------
// FileDev against a Vec<u8> model

#[derive(Debug, Clone)]
enum Cmd {
    Write {
        off: u64,
        len: u64,
        seed: u64,
        fua: bool,
    },
    Read {
        off: u64,
        len: u64,
    },
    Trim {
        off: u64,
        len: u64,
        fua: bool,
    },
    Zero {
        off: u64,
        len: u64,
        flags: ZeroFlags,
    },
    Flush,
}

/// Not a multiple of 4096: direct mode serves the tail through its
/// buffered descriptor.
const SIZE: u64 = 5 * 4096 + 1234;

fn range() -> impl Strategy<Value = (u64, u64)> {
    // Offsets near block boundaries are the interesting ones.
    let off = prop_oneof![
        0..SIZE,
        (0..SIZE / 4096 + 1, 0u64..3).prop_map(|(b, d)| (b * 4096).saturating_sub(d)),
    ];
    let len = prop_oneof![0u64..64, 0u64..10_000, (1u64..4).prop_map(|k| k * 4096)];
    (off, len).prop_map(|(o, l)| {
        let o = o.min(SIZE);
        (o, l.min(SIZE - o))
    })
}

fn cmd() -> impl Strategy<Value = Cmd> {
    prop_oneof![
        4 => (range(), any::<u64>(), any::<bool>())
            .prop_map(|((off, len), seed, fua)| Cmd::Write { off, len, seed, fua }),
        3 => range().prop_map(|(off, len)| Cmd::Read { off, len }),
        1 => (range(), any::<bool>()).prop_map(|((off, len), fua)| Cmd::Trim { off, len, fua }),
        2 => (range(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |((off, len), fua, may_trim, fast)| Cmd::Zero {
                off,
                len,
                flags: ZeroFlags { fua, may_trim, fast },
            }
        ),
        1 => Just(Cmd::Flush),
    ]
}

fn run_model(direct: bool, cmds: &[Cmd], init_seed: u64) -> std::result::Result<(), TestCaseError> {
    let dir = tmpdir();
    let mut model = pattern(init_seed, SIZE as usize);
    // Leave a hole at the start, so punching and data mix.
    model[..8192].fill(0);
    let p = dir.path().join("dev");
    {
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(SIZE).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&model[8192..], 8192).unwrap();
    }
    let Some(d) = open(&p, opts(direct, false)) else {
        return Ok(());
    };
    let caps = d.caps();
    prop_assert!(caps.writable && caps.flush && caps.fua && caps.extents && caps.multi_conn);
    prop_assert_eq!(d.size(), SIZE);
    // SIZE is no multiple of 4096: the minimum divides it.
    let minimum = if direct {
        1 << SIZE.trailing_zeros().min(12)
    } else {
        1
    };
    prop_assert_eq!(d.block_sizes().minimum, minimum);
    for c in cmds {
        match *c {
            Cmd::Write {
                off,
                len,
                seed,
                fua,
            } => {
                let data = pattern(seed, len as usize);
                d.write_at(&data, off, fua).unwrap();
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
            Cmd::Read { off, len } => {
                let mut buf = vec![0xA5u8; len as usize];
                d.read_at(&mut buf, off).unwrap();
                prop_assert!(
                    buf == model[off as usize..(off + len) as usize],
                    "read {off}+{len}"
                );
            }
            Cmd::Trim { off, len, fua } => {
                d.trim(off, len, fua).unwrap();
                // A punched hole reads as zeroes; without punching, trim
                // leaves the data.
                if d.caps().trim {
                    model[off as usize..(off + len) as usize].fill(0);
                }
            }
            Cmd::Zero { off, len, flags } => match d.write_zeroes(off, len, flags) {
                Ok(()) => model[off as usize..(off + len) as usize].fill(0),
                Err(e) => {
                    prop_assert!(
                        flags.fast && matches!(e.kind, ErrorKind::Unsupported),
                        "{e}"
                    );
                    prop_assert!(!d.caps().fast_zero);
                }
            },
            Cmd::Flush => d.flush().unwrap(),
        }
    }
    // Everything, through the device and through the filesystem.
    let mut all = vec![0u8; SIZE as usize];
    d.read_at(&mut all, 0).unwrap();
    prop_assert!(all == model);
    let on_disk = std::fs::read(&p).unwrap();
    prop_assert!(on_disk == model, "file length or bytes differ");
    // Extents cover the range and holes read as zeroes.
    let ex = d.extents(0, SIZE).unwrap();
    let mut at = 0u64;
    for e in &ex {
        if e.zero {
            prop_assert!(model[at as usize..(at + e.len) as usize]
                .iter()
                .all(|&b| b == 0));
        }
        at += e.len;
    }
    prop_assert_eq!(at, SIZE);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn file_buffered_matches_model(cmds in prop::collection::vec(cmd(), 1..40), seed in any::<u64>()) {
        run_model(false, &cmds, seed)?;
    }

    #[test]
    fn file_direct_matches_model(cmds in prop::collection::vec(cmd(), 1..40), seed in any::<u64>()) {
        run_model(true, &cmds, seed)?;
    }
}

// ---------------------------------------------------------------------------
// FileDev: specific behaviours

#[test]
fn sparse_file_extents_report_holes() {
    let dir = tmpdir();
    let p = dir.path().join("sparse");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(1 << 20).unwrap();
    drop(f);
    for direct in [false, true] {
        let Some(d) = open(&p, opts(direct, false)) else {
            continue;
        };
        assert!(d.caps().extents);
        d.write_at(&[7u8; 4096], 256 << 10, false).unwrap();
        d.write_at(&[9u8; 10], (512 << 10) + 100, true).unwrap();
        let ex = d.extents(0, 1 << 20).unwrap();
        assert_eq!(ex.iter().map(|e| e.len).sum::<u64>(), 1 << 20);
        assert!(ex[0].hole && ex[0].zero, "{ex:?}");
        assert!(
            ex.windows(2).all(|w| w[0].hole != w[1].hole),
            "merged: {ex:?}"
        );
        // Where is each written byte?
        let kind_at = |x: u64| {
            let mut at = 0;
            for e in &ex {
                if x < at + e.len {
                    return e.hole;
                }
                at += e.len;
            }
            panic!("{x} not covered");
        };
        assert!(!kind_at(256 << 10));
        assert!(!kind_at((256 << 10) + 4095));
        assert!(!kind_at((512 << 10) + 105));
        assert!(kind_at(0));
        assert!(kind_at(800 << 10));
        // A sub-range starting inside a hole, and one inside data.
        let ex = d.extents(1000, 300_000).unwrap();
        assert_eq!(ex.iter().map(|e| e.len).sum::<u64>(), 300_000);
        assert!(ex[0].hole);
        assert_eq!(ex[0].len, (256 << 10) - 1000);
        let ex = d.extents((256 << 10) + 1, 10).unwrap();
        assert_eq!(ex, vec![cairn_blockdev::Extent::data(10)]);
        // Punch the data away again: all hole.
        d.trim(0, 1 << 20, true).unwrap();
        assert_eq!(
            d.extents(0, 1 << 20).unwrap(),
            vec![cairn_blockdev::Extent::hole(1 << 20)]
        );
        assert!(d.extents(0, 0).unwrap().is_empty());
    }
}

#[test]
fn read_only_refuses_writes_and_leaves_bytes() {
    let dir = tmpdir();
    let data = pattern(1, 3 * 4096 + 17);
    let p = make_file(dir.path(), "ro", &data);
    for direct in [false, true] {
        let Some(d) = open(&p, opts(direct, true)) else {
            continue;
        };
        let c = d.caps();
        assert!(!c.writable && !c.flush && !c.fua && !c.trim && !c.zeroes && !c.fast_zero);
        let ro = |r: cairn_blockdev::Result<()>| {
            assert!(matches!(r.unwrap_err().kind, ErrorKind::ReadOnly));
        };
        ro(d.write_at(b"xx", 5, false));
        ro(d.write_at(b"xx", 5, true));
        ro(d.trim(0, 4096, false));
        ro(d.write_zeroes(0, 100, ZeroFlags::default()));
        ro(d.write_zeroes(
            0,
            100,
            ZeroFlags {
                fua: true,
                may_trim: true,
                fast: true,
            },
        ));
        d.flush().unwrap();
        let mut buf = vec![0u8; data.len()];
        d.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, data);
        assert_eq!(std::fs::read(&p).unwrap(), data);
    }
}

#[test]
fn out_of_range_is_refused_before_any_syscall() {
    let dir = tmpdir();
    let data = pattern(2, 8192);
    let p = make_file(dir.path(), "oor", &data);
    for direct in [false, true] {
        let Some(d) = open(&p, opts(direct, false)) else {
            continue;
        };
        let oor = |r: cairn_blockdev::Result<()>, op: Op| {
            let e = r.unwrap_err();
            assert!(matches!(e.kind, ErrorKind::OutOfRange), "{e}");
            assert_eq!(e.op, op);
        };
        let mut b = [0u8; 10];
        oor(d.read_at(&mut b, 8190), Op::Read);
        oor(d.read_at(&mut b, u64::MAX - 2), Op::Read);
        oor(d.write_at(&b, 8183, false), Op::Write);
        oor(d.write_at(&b, u64::MAX, true), Op::Write);
        oor(d.trim(8000, 200, false), Op::Trim);
        oor(
            d.write_zeroes(1, 8192, ZeroFlags::default()),
            Op::WriteZeroes,
        );
        assert!(matches!(
            d.extents(0, 8193).unwrap_err().kind,
            ErrorKind::OutOfRange
        ));
        // The edge itself is fine.
        d.read_at(&mut b, 8182).unwrap();
        d.write_at(&[], 8192, false).unwrap();
        d.trim(8192, 0, false).unwrap();
        assert_eq!(
            std::fs::read(&p).unwrap(),
            data,
            "nothing written, no growth"
        );
    }
}

#[test]
fn refuses_what_is_not_a_file_or_block_device() {
    let dir = tmpdir();
    let e = FileDev::open(dir.path(), FileOptions::default())
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
    assert!(msg.contains("directory"), "{msg}");
    let e = FileDev::open(Path::new("/dev/null"), FileOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("/dev/null") && e.to_string().contains("character"));
    let missing = dir.path().join("missing");
    let e = FileDev::open(&missing, FileOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("missing"), "{e}");
    assert_eq!(e.op, Op::Open);
}

#[test]
fn a_file_that_shrank_reads_as_an_error() {
    let dir = tmpdir();
    let p = make_file(dir.path(), "shrink", &pattern(3, 3 * 4096));
    for direct in [false, true] {
        std::fs::write(&p, pattern(3, 3 * 4096)).unwrap();
        let Some(d) = open(&p, opts(direct, false)) else {
            continue;
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(4096 + 100)
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let e = d.read_at(&mut buf, 4096).unwrap_err();
        assert!(matches!(e.kind, ErrorKind::Io(_)), "{e}");
        let mut buf = vec![0u8; 10];
        assert!(d.read_at(&mut buf, 8190).is_err());
        d.read_at(&mut buf, 4096 + 90).unwrap();
    }
}

#[test]
fn fua_writes_and_zeroes_are_readable() {
    let dir = tmpdir();
    let p = make_file(dir.path(), "fua", &pattern(4, 40_000));
    for direct in [false, true] {
        let Some(d) = open(&p, opts(direct, false)) else {
            continue;
        };
        let data = pattern(5, 5000);
        d.write_at(&data, 3, true).unwrap();
        d.write_zeroes(
            10_000,
            9_000,
            ZeroFlags {
                fua: true,
                may_trim: false,
                fast: true,
            },
        )
        .unwrap();
        d.write_zeroes(
            20_000,
            100,
            ZeroFlags {
                fua: true,
                may_trim: true,
                fast: false,
            },
        )
        .unwrap();
        d.trim(30_000, 5000, true).unwrap();
        d.flush().unwrap();
        let f = std::fs::read(&p).unwrap();
        assert_eq!(f.len(), 40_000);
        assert_eq!(&f[3..5003], &data[..]);
        assert!(f[10_000..19_000].iter().all(|&b| b == 0));
        assert!(f[20_000..20_100].iter().all(|&b| b == 0));
        assert_eq!(f[19_000..20_000], pattern(4, 40_000)[19_000..20_000]);
        let c = d.caps();
        assert!(
            c.trim && c.zeroes && c.fast_zero,
            "ext4 punches and zeroes: {c:?}"
        );
        assert!(f[30_000..35_000].iter().all(|&b| b == 0));
        assert!(d.path() == p);
    }
}

/// A direct file whose size is no multiple of 4096 said a minimum block
/// size of 4096 anyway, and qemu, which rounds the size to it, refused
/// to open the export for writing ("Image size is not a multiple of
/// request alignment"). The minimum now divides the size, and the last
/// bytes take unaligned requests.
#[test]
fn a_direct_file_says_a_minimum_block_size_that_divides_its_size() {
    let dir = tmpdir();
    for (size, want) in [
        (1_000_001u64, 1u32),
        (999_936, 512),
        (1 << 20, 4096),
        (0, 4096),
    ] {
        let p = make_file(dir.path(), &format!("odd{size}"), &vec![0u8; size as usize]);
        let Some(d) = open(&p, opts(true, false)) else {
            return;
        };
        assert_eq!(d.block_sizes().minimum, want, "size {size}");
        if size >= 4096 {
            let tail = vec![0x5au8; 11];
            d.write_at(&tail, size - 11, false).unwrap();
            let mut back = vec![0u8; 11];
            d.read_at(&mut back, size - 11).unwrap();
            assert_eq!(back, tail, "size {size}");
        }
    }
}

#[test]
fn concurrent_unaligned_direct_writes_to_one_block_all_survive() {
    let dir = tmpdir();
    let p = make_file(dir.path(), "race", &vec![0u8; 4 * 4096]);
    let Some(d) = open(&p, opts(true, false)) else {
        return;
    };
    let d = Arc::new(d);
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 300;
    // Each thread owns 37 bytes; together they straddle the boundary of
    // blocks 0 and 1, and a ninth thread rewrites block 2 whole.
    let base = 4096 - 150;
    let mut hs = Vec::new();
    for t in 0..THREADS {
        let d = d.clone();
        hs.push(std::thread::spawn(move || {
            for r in 0..ROUNDS {
                let v = vec![(t * 31 + r) as u8; 37];
                d.write_at(&v, base + t * 37, r % 50 == 0).unwrap();
            }
        }));
    }
    {
        let d = d.clone();
        hs.push(std::thread::spawn(move || {
            for r in 0..ROUNDS {
                d.write_at(&[r as u8; 4096], 2 * 4096, false).unwrap();
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    let mut all = vec![0u8; 4 * 4096];
    d.read_at(&mut all, 0).unwrap();
    for t in 0..THREADS {
        let want = (t * 31 + ROUNDS - 1) as u8;
        let s = (base + t * 37) as usize;
        assert!(
            all[s..s + 37].iter().all(|&b| b == want),
            "thread {t} lost its write"
        );
    }
    assert!(all[..base as usize].iter().all(|&b| b == 0));
    let end = (base + THREADS * 37) as usize;
    assert!(all[end..2 * 4096].iter().all(|&b| b == 0));
    assert!(all[2 * 4096..3 * 4096]
        .iter()
        .all(|&b| b == (ROUNDS - 1) as u8));
}

// ---------------------------------------------------------------------------
// A real block device: a loop device over a file.

struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn loop_device(backing: &Path, sector: u32) -> Option<Loop> {
    if !is_root() {
        assert!(!ci(), "CI=true: the loop device test needs root");
        eprintln!("skipping: not root");
        return None;
    }
    let out = std::process::Command::new("losetup")
        .args(["--find", "--show", "--sector-size", &sector.to_string()])
        .arg(backing)
        .output();
    match out {
        Ok(o) if o.status.success() => {
            Some(Loop(String::from_utf8_lossy(&o.stdout).trim().to_string()))
        }
        other => {
            assert!(!ci(), "CI=true: losetup failed: {other:?}");
            eprintln!("skipping: losetup failed: {other:?}");
            None
        }
    }
}

#[test]
fn loop_block_device() {
    let dir = tmpdir();
    const LEN: u64 = 8 << 20;
    for sector in [512u32, 4096] {
        let backing = make_file(dir.path(), "backing", &pattern(6, LEN as usize));
        let Some(lo) = loop_device(&backing, sector) else {
            return;
        };
        let path = PathBuf::from(&lo.0);
        for direct in [false, true] {
            let d = FileDev::open(&path, opts(direct, false)).unwrap();
            assert!(d.is_block_device());
            assert_eq!(d.size(), LEN);
            let bs = d.block_sizes();
            assert_eq!(bs.minimum, if direct { sector } else { 1 });
            let c = d.caps();
            assert!(c.writable && c.flush && c.fua && c.zeroes && !c.extents && !c.fast_zero);
            // A loop device over a file on ext4 discards (BLKDISCARD runs).
            assert!(c.trim, "{c:?}");
            assert_eq!(
                d.extents(0, LEN).unwrap(),
                vec![cairn_blockdev::Extent::data(LEN)]
            );
            let mut model = vec![0u8; LEN as usize];
            d.read_at(&mut model, 0).unwrap();
            // Unaligned write (read-modify-write in direct mode), FUA.
            let w = pattern(7 + sector as u64, 10_000);
            d.write_at(&w, 1234, true).unwrap();
            model[1234..11_234].copy_from_slice(&w);
            // Unaligned zeroing: edges written, middle BLKZEROOUT.
            d.write_zeroes(5000, 70_000, ZeroFlags::default()).unwrap();
            model[5000..75_000].fill(0);
            // Fast zeroing of an aligned range works or says Unsupported.
            let fz = ZeroFlags {
                fua: true,
                may_trim: true,
                fast: true,
            };
            match d.write_zeroes(1 << 20, 1 << 20, fz) {
                Ok(()) => model[1 << 20..2 << 20].fill(0),
                Err(e) => assert!(matches!(e.kind, ErrorKind::Unsupported), "{e}"),
            }
            assert!(matches!(
                d.write_zeroes(1, 4096, fz).unwrap_err().kind,
                ErrorKind::Unsupported
            ));
            // Discard: advisory; a loop device punches its backing file.
            d.trim(3 << 20, (1 << 20) + 7, true).unwrap();
            d.trim(100, 10, false).unwrap();
            d.flush().unwrap();
            let mut all = vec![0u8; LEN as usize];
            d.read_at(&mut all, 0).unwrap();
            if c.trim {
                // The whole blocks inside the discarded range read as zero
                // (loop punches); bytes outside are untouched.
                all[3 << 20..4 << 20].iter().for_each(|&b| assert_eq!(b, 0));
                model[3 << 20..4 << 20].fill(0);
            }
            assert!(all == model, "loop sector {sector} direct {direct}");
            let mut b = [0u8; 2];
            assert!(matches!(
                d.read_at(&mut b, LEN - 1).unwrap_err().kind,
                ErrorKind::OutOfRange
            ));
        }
        drop(lo);
    }
}

// ---------------------------------------------------------------------------
// FaultDev

fn mem(size: usize) -> Arc<MemDev> {
    Arc::new(MemDev::new(size))
}

#[test]
fn fault_fails_the_nth_operation() {
    let m = mem(4096);
    let f = FaultDev::new(m.clone(), FaultPlan::new().fail_nth(3));
    let mut b = [0u8; 4];
    f.write_at(b"abcd", 0, false).unwrap();
    f.read_at(&mut b, 0).unwrap();
    let e = f.write_at(b"wxyz", 0, false).unwrap_err();
    assert_eq!(e.kind.errno(), libc::EIO);
    assert_eq!(e.op, Op::Write);
    assert_eq!(
        &m.contents()[..4],
        b"abcd",
        "a failed write does not reach the device"
    );
    f.write_at(b"wxyz", 0, false).unwrap();
    assert_eq!(&m.contents()[..4], b"wxyz");
    assert_eq!(f.injected_failures(), 1);
}

#[test]
fn fault_fails_the_nth_of_a_kind_with_a_chosen_error() {
    let m = mem(4096);
    let plan = FaultPlan::new()
        .fail(When::NthOf(Op::Write, 2), ErrorKind::NoSpace)
        .fail(
            When::AlwaysOf(Op::Flush),
            ErrorKind::Io(std::io::Error::from_raw_os_error(libc::EIO)),
        );
    let f = FaultDev::new(m, plan);
    let mut b = [0u8; 4];
    f.write_at(b"a", 0, false).unwrap();
    f.read_at(&mut b, 0).unwrap();
    f.read_at(&mut b, 0).unwrap();
    assert!(matches!(
        f.write_at(b"b", 1, false).unwrap_err().kind,
        ErrorKind::NoSpace
    ));
    f.write_at(b"c", 2, false).unwrap();
    for _ in 0..3 {
        assert_eq!(f.flush().unwrap_err().kind.errno(), libc::EIO);
    }
    f.trim(0, 1, false).unwrap();
    f.write_zeroes(0, 1, ZeroFlags::default()).unwrap();
    f.extents(0, 10).unwrap();
    let c = f.counts();
    assert_eq!(
        (c.read, c.write, c.flush, c.trim, c.write_zeroes, c.extents),
        (2, 3, 3, 1, 1, 1)
    );
    assert_eq!(c.total(), 11);
    assert_eq!(c.of(Op::Flush), 3);
    assert_eq!(f.injected_failures(), 4);
}

#[test]
fn fault_tears_writes() {
    let m = mem(4096);
    let f = FaultDev::new(
        m.clone(),
        FaultPlan::new()
            .tear_write(1, Tear::Bytes(3))
            .tear_write(2, Tear::Sectors(1)),
    );
    let e = f.write_at(&[1u8; 100], 10, false).unwrap_err();
    assert_eq!(e.kind.errno(), libc::EIO);
    let c = m.contents();
    assert_eq!(&c[10..13], &[1, 1, 1]);
    assert!(c[13..110].iter().all(|&b| b == 0));
    // Second write starts at 500: keeps bytes up to the sector boundary 512.
    assert!(f.write_at(&[2u8; 1000], 500, false).is_err());
    let c = m.contents();
    assert!(c[500..512].iter().all(|&b| b == 2));
    assert!(c[512..1500].iter().all(|&b| b == 0));
    f.write_at(&[3u8; 10], 0, false).unwrap();
    assert!(!f.is_crashed());
}

#[test]
fn fault_crash_kills_every_later_operation_until_a_new_plan() {
    let m = mem(8192);
    let f = FaultDev::new(
        m.clone(),
        FaultPlan::new().tear_and_crash(2, Tear::Sectors(2)),
    );
    f.write_at(&[1u8; 4096], 0, false).unwrap();
    assert!(f.write_at(&[2u8; 4096], 4096, true).is_err());
    assert!(f.is_crashed());
    let mut b = [0u8; 1];
    assert!(f.read_at(&mut b, 0).is_err());
    assert!(f.flush().is_err());
    assert!(f.write_at(&[9u8; 1], 0, false).is_err());
    let c = m.contents();
    assert!(c[..4096].iter().all(|&b| b == 1));
    assert!(
        c[4096..5120].iter().all(|&b| b == 2),
        "two sectors survived the tear"
    );
    assert!(c[5120..].iter().all(|&b| b == 0));
    assert_eq!(f.counts().total(), 5);
    assert_eq!(f.injected_failures(), 4);
    // A crash at the Nth op of any kind, with a chosen error.
    f.set_plan(FaultPlan::new().crash_with(When::Nth(2), ErrorKind::NoSpace));
    assert!(!f.is_crashed());
    f.read_at(&mut b, 0).unwrap();
    assert!(matches!(
        f.read_at(&mut b, 0).unwrap_err().kind,
        ErrorKind::NoSpace
    ));
    assert!(matches!(f.flush().unwrap_err().kind, ErrorKind::NoSpace));
    assert_eq!(f.plan_counts().total(), 3);
    assert_eq!(f.counts().total(), 8);
}

#[test]
fn fault_delays_are_counted() {
    let f = FaultDev::new(
        mem(4096),
        FaultPlan::new()
            .delay_all(Duration::from_micros(100))
            .delay(When::Nth(2), Duration::from_millis(1)),
    );
    let mut b = [0u8; 1];
    f.read_at(&mut b, 0).unwrap();
    f.read_at(&mut b, 0).unwrap();
    f.flush().unwrap();
    assert_eq!(f.delayed(), Duration::from_micros(1300));
}

#[test]
fn fault_wraps_a_file_and_passes_caps_through() {
    let dir = tmpdir();
    let p = make_file(dir.path(), "f", &vec![0u8; 8192]);
    let d: Arc<dyn BlockDev> = Arc::new(FileDev::open(&p, FileOptions::default()).unwrap());
    let f = FaultDev::new(d.clone(), FaultPlan::new());
    assert_eq!(f.caps(), d.caps());
    assert_eq!(f.block_sizes(), d.block_sizes());
    assert_eq!(f.size(), 8192);
    f.write_at(b"hi", 100, true).unwrap();
    let mut b = [0u8; 2];
    d.read_at(&mut b, 100).unwrap();
    assert_eq!(&b, b"hi");
}

// ---------------------------------------------------------------------------
// RotationalModel

fn model(latency: RotationalLatency) -> RotationalModel {
    RotationalModel {
        latency,
        time_scale: 0.0,
        ..RotationalModel::default()
    }
}

#[test]
fn rotational_sequential_is_far_cheaper_than_random() {
    const SIZE: u64 = 1 << 30;
    let seq =
        FaultDev::with_rotational(Arc::new(SparseDev(SIZE)), model(RotationalLatency::Average));
    let rnd = FaultDev::with_rotational(
        Arc::new(SparseDev(SIZE)),
        model(RotationalLatency::Random(7)),
    );
    assert!(seq.caps().rotational);
    let mut buf = vec![0u8; 4096];
    let mut x = 12345u64;
    for i in 0..1000u64 {
        seq.read_at(&mut buf, i * 4096).unwrap();
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        rnd.read_at(&mut buf, ((x >> 20) % (SIZE / 4096)) * 4096)
            .unwrap();
    }
    let m = RotationalModel::default();
    // Sequential from the start: transfer time only.
    let t_seq = seq.modelled_time();
    let want = m.transfer_time(4096) * 1000;
    assert!(
        t_seq.abs_diff(want) < Duration::from_micros(1),
        "{t_seq:?} vs {want:?}"
    );
    // Random: about mean seek + half a revolution + transfer each.
    let t_rnd = rnd.modelled_time();
    let per = t_rnd / 1000;
    let expect = m.mean_random_seek() + m.revolution() / 2 + m.transfer_time(4096);
    assert!(
        per > expect.mul_f64(0.8) && per < expect.mul_f64(1.2),
        "{per:?} vs {expect:?}"
    );
    assert!(t_rnd > t_seq * 100);
    // 8 ms-ish random reads: under 100 IOPS.
    assert!(per > Duration::from_millis(10));
}

#[test]
fn rotational_costs_of_flush_trim_and_a_jump() {
    let m = model(RotationalLatency::Average);
    let f = FaultDev::with_rotational(Arc::new(SparseDev(1 << 30)), m);
    f.flush().unwrap();
    assert_eq!(f.modelled_time(), m.flush_cost);
    f.trim(1 << 29, 4096, false).unwrap();
    f.extents(0, 4096).unwrap();
    assert_eq!(f.modelled_time(), m.flush_cost, "trim and extents are free");
    // Head still at 0: a full-stroke jump to the end.
    f.write_at(&[0u8; 4096], (1 << 30) - 4096, false).unwrap();
    let jump = m.seek_time((1 << 30) - 4096, 1 << 30) + m.revolution() / 2 + m.transfer_time(4096);
    assert!((f.modelled_time() - m.flush_cost).abs_diff(jump) < Duration::from_micros(1));
    // Zeroing counts as writing.
    let before = f.modelled_time();
    f.write_zeroes(0, 1 << 20, ZeroFlags::default()).unwrap();
    // The head is at the end of the last write: 1 GiB away, a full stroke.
    let zero = m.full_stroke + m.revolution() / 2 + m.transfer_time(1 << 20);
    assert!((f.modelled_time() - before).abs_diff(zero) < Duration::from_micros(1));
}

#[test]
fn rotational_really_sleeps_and_serialises_threads() {
    // A tiny time scale: real sleeps, but short. Only the model's counter
    // is checked, never the clock.
    let m = RotationalModel {
        time_scale: 1e-3,
        ..RotationalModel::default()
    };
    let f = Arc::new(FaultDev::with_rotational(Arc::new(SparseDev(1 << 30)), m));
    let hs: Vec<_> = (0..4u64)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                let mut b = vec![0u8; 512];
                for i in 0..10u64 {
                    f.read_at(&mut b, (t * 10 + i) * (16 << 20)).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(f.counts().read, 40);
    // The 40 offsets are 16 MiB apart: whatever order the queue chose,
    // every request after the first pays at least that seek (the positional
    // wait may be anything, and the old bound with half a revolution each
    // held only for first come, first served).
    assert!(f.modelled_time() >= m.seek_time((16 << 20) - 512, 1 << 30) * 39);
    let st = f.rotational_stats().unwrap();
    assert_eq!((st.served, st.waiting), (40, 0));
}

/// Positional latency with time_scale 0 depends on the requests alone.
#[test]
fn rotational_positional_is_deterministic() {
    const SIZE: u64 = 1 << 30;
    let m = model(RotationalLatency::Positional);
    let run = || {
        let f = FaultDev::with_rotational(Arc::new(SparseDev(SIZE)), m);
        let mut buf = vec![0u8; 4096];
        let mut x = 99u64;
        let mut costs = Vec::new();
        for _ in 0..2000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let before = f.modelled_time();
            f.read_at(&mut buf, ((x >> 20) % (SIZE / 4096)) * 4096)
                .unwrap();
            costs.push(f.modelled_time() - before);
        }
        (f.modelled_time(), costs, f.rotational_stats().unwrap())
    };
    let (a, costs, st) = run();
    let (b, costs_b, _) = run();
    assert_eq!(a, b);
    assert_eq!(costs, costs_b);
    assert_eq!(st.clock, a, "no idle time at time_scale 0");
    assert_eq!(st.queued, 0);
    // One at a time, the positional wait averages half a revolution: the
    // old model's mean.
    let per = a / 2000;
    let old = m.mean_random_seek() + m.revolution() / 2 + m.transfer_time(4096);
    assert!(
        per > old.mul_f64(0.95) && per < old.mul_f64(1.05),
        "{per:?} vs {old:?}"
    );
    // Each cost lies between its seek and its seek plus a revolution.
    assert!(costs
        .iter()
        .all(|c| *c < m.full_stroke + m.revolution() + m.transfer_time(4096)));
    // Same track, ahead of the head: no seek, the wait by the formula.
    let f = FaultDev::with_rotational(Arc::new(SparseDev(SIZE)), m);
    f.read_at(&mut [0u8; 4096], 0).unwrap();
    let t0 = f.modelled_time();
    f.read_at(&mut [0u8; 4096], 625_000).unwrap();
    let wait = m
        .revolution()
        .mul_f64((625_000.0 - 4096.0) / m.track_bytes() as f64);
    let got = f.modelled_time() - t0;
    assert!(
        got.abs_diff(wait + m.transfer_time(4096)) < Duration::from_micros(1),
        "{got:?}"
    );
}

/// The platter turns while the disk sits idle: with `time_scale > 0` the
/// clock of a request that finds the disk idle catches up with real time
/// (scaled); the idle time is not charged.
#[test]
fn rotational_platter_turns_while_idle() {
    let m = RotationalModel {
        time_scale: 1e-3,
        ..RotationalModel::default()
    };
    let f = FaultDev::with_rotational(Arc::new(SparseDev(1 << 30)), m);
    f.read_at(&mut [0u8; 4096], 1 << 29).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    f.read_at(&mut [0u8; 4096], 1 << 20).unwrap();
    let st = f.rotational_stats().unwrap();
    // 20 ms of real time at a scale of 1e-3: at least 20 s of model time.
    assert!(st.clock >= Duration::from_secs(20), "{:?}", st.clock);
    assert!(f.modelled_time() < Duration::from_millis(50));
    assert_eq!((st.served, st.queued), (2, 0));
}

/// `threads` threads issue `per_thread` 4 KiB requests each at offsets
/// from `next` (called with a global sequence number), at a tiny time
/// scale: real sleeps and real queuing. The modelled time per request
/// and the queue's statistics.
fn rotational_load(
    m: RotationalModel,
    threads: u64,
    per_thread: u64,
    write: bool,
    next: impl Fn(u64) -> u64 + Send + Sync + 'static,
) -> (Duration, cairn_blockdev::RotationalStats) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let f = Arc::new(FaultDev::with_rotational(Arc::new(SparseDev(1 << 30)), m));
    let seq = Arc::new(AtomicU64::new(0));
    let next = Arc::new(next);
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let (f, seq, next) = (f.clone(), seq.clone(), next.clone());
            std::thread::spawn(move || {
                let mut b = vec![0u8; 4096];
                for _ in 0..per_thread {
                    let off = next(seq.fetch_add(1, Ordering::Relaxed));
                    if write {
                        f.write_at(&b, off, false).unwrap();
                    } else {
                        f.read_at(&mut b, off).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let n = threads * per_thread;
    let st = f.rotational_stats().unwrap();
    assert_eq!(st.served, n);
    (f.modelled_time() / n as u32, st)
}

/// The `i`th of a uniform random sequence of 4 KiB blocks over 1 GiB
/// (splitmix64 of `i`).
fn random_4k(i: u64) -> u64 {
    let mut z = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) % ((1 << 30) / 4096) * 4096
}

fn scaled(queue_depth: usize) -> RotationalModel {
    RotationalModel {
        time_scale: 1e-3,
        queue_depth,
        ..RotationalModel::default()
    }
}

/// 32 threads of random 4 KiB reads: with a 32-deep queue the disk picks
/// the cheapest to reach, and serves about 2.5x as many per second of
/// model time as first come, first served.
#[test]
fn rotational_queue_gains_with_32_threads() {
    let (d1, st1) = rotational_load(scaled(1), 32, 100, false, random_4k);
    let (d32, st32) = rotational_load(scaled(32), 32, 100, false, random_4k);
    let m = RotationalModel::default();
    let old = m.mean_random_seek() + m.revolution() / 2 + m.transfer_time(4096);
    let gain = d1.as_secs_f64() / d32.as_secs_f64();
    eprintln!(
        "32 threads, random 4 KiB over 1 GiB: depth 1 {d1:?} ({:.0} IOPS), depth 32 {d32:?} \
         ({:.0} IOPS), {gain:.2}x; mean choice among {:.1}, aged {}",
        1.0 / d1.as_secs_f64(),
        1.0 / d32.as_secs_f64(),
        st32.candidates as f64 / st32.queued.max(1) as f64,
        st32.aged
    );
    // First come, first served: the old model's mean (3200 draws of a
    // cost with ~4 ms of spread: within 10 %).
    assert!(
        d1 > old.mul_f64(0.9) && d1 < old.mul_f64(1.1),
        "{d1:?} vs {old:?}"
    );
    assert_eq!(st1.candidates, st1.queued);
    // The closed-loop simulation (unit tests) gives 2.56x with 31 waiting;
    // here the queue is a little shallower at the start and the end of the
    // run, and while threads are between two requests. Datasheets: about
    // 2x-2.5x. Below 1.8x queuing is broken; above 3x the model would
    // reward more than a disk.
    assert!((1.8..3.0).contains(&gain), "gain {gain:.2}");
}

/// Ascending 4 KiB writes about five per track (256 KiB apart), 32
/// threads taking the next block in turn (what a sorted writeback with 32
/// in flight does): far cheaper than random ones at the same depth.
#[test]
fn rotational_sorted_writes_32_at_a_time() {
    let (sorted, st) = rotational_load(scaled(32), 32, 100, true, |i| i * (256 << 10));
    let (random, _) = rotational_load(scaled(32), 32, 100, true, random_4k);
    eprintln!(
        "32 threads of 4 KiB writes: sorted 256 KiB apart {sorted:?} ({:.0} IOPS), random \
         {random:?} ({:.0} IOPS); mean choice among {:.1}",
        1.0 / sorted.as_secs_f64(),
        1.0 / random.as_secs_f64(),
        st.candidates as f64 / st.queued.max(1) as f64
    );
    // Simulation: 1.43 ms against 4.8 ms.
    assert!(sorted < Duration::from_micros(2500), "{sorted:?}");
    assert!(sorted * 2 < random, "{sorted:?} vs {random:?}");
}

/// A device that records the order of the operations it serves, and
/// holds a read at `gate` until the gate opens.
struct GateDev {
    inner: SparseDev,
    gate: u64,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    entered: std::sync::atomic::AtomicBool,
    log: std::sync::Mutex<Vec<(Op, u64)>>,
}

impl GateDev {
    fn new(gate: u64) -> GateDev {
        GateDev {
            inner: SparseDev(1 << 30),
            gate,
            open: std::sync::Mutex::new(false),
            opened: std::sync::Condvar::new(),
            entered: std::sync::atomic::AtomicBool::new(false),
            log: std::sync::Mutex::new(Vec::new()),
        }
    }
    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl BlockDev for GateDev {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> cairn_blockdev::Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> cairn_blockdev::Result<()> {
        self.log.lock().unwrap().push((Op::Read, offset));
        if offset == self.gate {
            self.entered
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> cairn_blockdev::Result<()> {
        self.log.lock().unwrap().push((Op::Write, offset));
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> cairn_blockdev::Result<()> {
        self.log.lock().unwrap().push((Op::Flush, 0));
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> cairn_blockdev::Result<()> {
        self.inner.trim(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, f: ZeroFlags) -> cairn_blockdev::Result<()> {
        self.inner.write_zeroes(offset, len, f)
    }
}

/// Hold the head with a gated read at 0, then queue `then` in order (each
/// waits until the one before it is queued), open the gate: the order in
/// which the wrapped device saw them.
fn served_order(queue_depth: usize, then: &[(Op, u64)]) -> Vec<(Op, u64)> {
    let gate = Arc::new(GateDev::new(0));
    let m = RotationalModel {
        queue_depth,
        ..model(RotationalLatency::Positional)
    };
    let f = Arc::new(FaultDev::with_rotational(gate.clone(), m));
    let mut hs = Vec::new();
    let spawn = |op: Op, off: u64| {
        let f = f.clone();
        std::thread::spawn(move || match op {
            Op::Read => f.read_at(&mut [0u8; 4096], off).unwrap(),
            Op::Write => f.write_at(&[0u8; 4096], off, false).unwrap(),
            Op::Flush => f.flush().unwrap(),
            _ => unreachable!(),
        })
    };
    hs.push(spawn(Op::Read, 0));
    while !gate.entered.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    for (k, &(op, off)) in then.iter().enumerate() {
        hs.push(spawn(op, off));
        while f.rotational_stats().unwrap().waiting < k as u64 + 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    gate.release();
    for h in hs {
        h.join().unwrap();
    }
    let log = gate.log.lock().unwrap().clone();
    assert_eq!(log[0], (Op::Read, 0));
    log[1..].to_vec()
}

/// The threaded queue: the head serves the cheapest to reach first (the
/// sequential read after the gate), unless the queue is one deep.
#[test]
fn rotational_queue_serves_cheapest_first() {
    let far = (Op::Read, 900 << 20);
    let seq = (Op::Read, 4096);
    assert_eq!(served_order(32, &[far, seq]), vec![seq, far]);
    assert_eq!(served_order(1, &[far, seq]), vec![far, seq]);
}

/// A flush waits for the requests queued before it, and the ones queued
/// after it wait for the flush, even the cheapest.
#[test]
fn rotational_flush_waits_for_earlier_requests() {
    let before = [
        (Op::Write, 900 << 20),
        (Op::Read, 300 << 20),
        (Op::Write, 600 << 20),
    ];
    let after = [(Op::Write, 4096), (Op::Read, 8192)];
    let mut then = before.to_vec();
    then.push((Op::Flush, 0));
    then.extend(after);
    let order = served_order(32, &then);
    assert_eq!(order.len(), 6);
    let mut first: Vec<_> = order[..3].to_vec();
    first.sort_by_key(|x| x.1);
    let mut want = before.to_vec();
    want.sort_by_key(|x| x.1);
    assert_eq!(first, want);
    assert_eq!(order[3], (Op::Flush, 0));
    // After the flush: the sequential write first (it costs nothing).
    assert_eq!(&order[4..], &after);
}

/// A far read among a stream of near ones (31 threads within 4 MiB) is
/// served once it is older than the age limit, while the stream goes on
/// (the figures printed: how long it waited, as seen from its thread, and
/// how far the stream had got when its thread looked).
#[test]
fn rotational_far_request_does_not_starve() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let m = scaled(32);
    let f = Arc::new(FaultDev::with_rotational(Arc::new(SparseDev(1 << 30)), m));
    let done = Arc::new(AtomicU64::new(0));
    let (threads, per_thread) = (31u64, 200u64);
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (f, done) = (f.clone(), done.clone());
            std::thread::spawn(move || {
                let mut b = vec![0u8; 4096];
                for i in 0..per_thread {
                    let off = random_4k(t * per_thread + i) % (4 << 20);
                    f.read_at(&mut b, off).unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    while done.load(Ordering::Relaxed) < 300 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let clock = f.rotational_stats().unwrap().clock;
    f.read_at(&mut [0u8; 4096], (1 << 30) - 4096).unwrap();
    let waited = f.rotational_stats().unwrap().clock - clock;
    let at = done.load(Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let st = f.rotational_stats().unwrap();
    eprintln!(
        "far read served after {waited:?} of model time, {at} of {} near reads done; aged {}, \
         max wait {:?}",
        threads * per_thread,
        st.aged,
        st.max_wait
    );
    // Served by the age limit, within one or two services of it (two if a
    // near read aged at the same time): without the limit it would wait
    // for the end of the stream, over a second more.
    let longest = m.full_stroke + m.revolution() + m.transfer_time(4096);
    assert!(st.aged >= 1, "the age limit chose it");
    assert!(
        st.max_wait <= m.age_limit + longest * 3,
        "{:?}",
        st.max_wait
    );
}

/// A large device that stores nothing (reads zeroes): for the model tests.
struct SparseDev(u64);

impl BlockDev for SparseDev {
    fn size(&self) -> u64 {
        self.0
    }
    fn caps(&self) -> cairn_blockdev::Caps {
        cairn_blockdev::Caps::default()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> cairn_blockdev::Result<()> {
        cairn_blockdev::check_range(self.0, Op::Read, offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> cairn_blockdev::Result<()> {
        cairn_blockdev::check_range(self.0, Op::Write, offset, buf.len() as u64)
    }
    fn flush(&self) -> cairn_blockdev::Result<()> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, _fua: bool) -> cairn_blockdev::Result<()> {
        cairn_blockdev::check_range(self.0, Op::Trim, offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _f: ZeroFlags) -> cairn_blockdev::Result<()> {
        cairn_blockdev::check_range(self.0, Op::WriteZeroes, offset, len)
    }
}
