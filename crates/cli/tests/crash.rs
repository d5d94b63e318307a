//! Crash safety with the real binary: `cairn backup` and `cairn gc` are
//! killed with SIGKILL at many points, and after every kill the repository
//! must be sound: `verify --read-data` clean (packs an interrupted run left
//! unindexed are a note, not a problem), every earlier snapshot restoring
//! byte for byte, and the interrupted snapshot either absent or whole.
//!
//! Kill points are chosen two ways. By the input: a backup reads a pipe
//! the test writes, so with the pipe held open the backup cannot finish
//! and a kill after k MiB always lands mid-run (8 MiB batches: before the
//! first batch is full, while one is hashed and compressed, after several
//! packs are sealed). By the repository directory, watched with inotify:
//! the kill is sent as soon as the n-th new pack file is created or closed
//! (sealed), an index file or a manifest or the garbage list is being
//! written or renamed into place, an index file or a pack is deleted. The
//! last stages of a run are also hit after small delays once the input is
//! closed; such a kill may come after the run finished, which is counted,
//! not hidden: at least 20 kills of each command must really interrupt it.
//!
//! Then: a rerun of a backup killed after several packs were sealed reuses
//! them (salvage) and stores much less than the same backup into an empty
//! repository; a second writer fails at once naming the lock holder while
//! readers keep working; a killed writer's lock is free at once.
//!
//! The repositories here are plain (`--encryption none`): the kill points
//! are found by watching the repository's files by name (an image's
//! snapshot directory, the sessions' bodies), which encryption hides. The
//! commit protocol is the same either way; the sealed records' torn tails
//! and salvage are covered by the store's tests (`pack.rs`, `roundtrip.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

mod common;
use common::{plain as cairn, tempdir, WORDS};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// How long a stage may take to come before the test gives up (a hang
/// guard only: every awaited stage is certain to come).
const HANG: Duration = Duration::from_secs(180);

// ---------------------------------------------------------------- data

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x5DEE_CE66_D1CE_4E5B).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Append one MiB made from `seed`: zero runs long enough to become holes,
/// random bytes, and text-like runs of words (compressible), so that holes,
/// dedup and compression all happen. Equal seeds give equal segments,
/// which is how images share data.
fn segment(seed: u64, out: &mut Vec<u8>) {
    let end = out.len() + MIB;
    let mut r = Rng::new(seed);
    while out.len() < end {
        let x = r.next();
        let n = (x >> 8) as usize;
        match x % 10 {
            0 | 1 => out.resize(out.len() + 16_384 + n % 98_304, 0),
            2..=4 => {
                let stop = out.len() + 4096 + n % 61_440;
                while out.len() < stop {
                    out.extend_from_slice(&r.next().to_le_bytes());
                }
            }
            _ => {
                let stop = out.len() + 2048 + n % 40_960;
                while out.len() < stop {
                    let w = r.next();
                    out.extend_from_slice(WORDS[(w % 12) as usize]);
                }
            }
        }
    }
    out.truncate(end);
}

/// An image: segments by seed, cut to `len` bytes (the last one short).
#[derive(Clone, Debug)]
struct Image {
    segs: Vec<u64>,
    len: usize,
}

impl Image {
    fn new(segs: Vec<u64>, minus: usize) -> Image {
        let len = segs.len() * MIB - minus;
        Image { segs, len }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.segs.len() * MIB);
        for &s in &self.segs {
            segment(s, &mut v);
        }
        v.truncate(self.len);
        v
    }
}

/// A snapshot the repository must hold.
#[derive(Clone, Debug)]
struct Snap {
    name: String,
    snap: u64,
    img: Image,
}

impl Snap {
    fn spec(&self) -> String {
        format!("{}@{}", self.name, self.snap)
    }
}

// ---------------------------------------------------------------- running cairn

/// A repository with two targets and 1 MiB packs.
struct Repo {
    root: PathBuf,
    targets: Vec<PathBuf>,
}

impl Repo {
    fn init(d: &Path) -> Repo {
        let root = d.join("repo");
        let targets = vec![d.join("t0"), d.join("t1")];
        ok(&run(&[
            "init",
            s(&root),
            "--target",
            s(&targets[0]),
            "--target",
            s(&targets[1]),
            "--pack-size",
            "1M",
            "--encryption",
            "none",
        ]));
        Repo { root, targets }
    }

    fn r(&self) -> &str {
        s(&self.root)
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(args: &[&str]) -> Output {
    cairn().args(args).stdin(Stdio::null()).output().unwrap()
}

fn ok(out: &Output) -> &Output {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// Spawn cairn with `input` on stdin; fail the test (not hang) if it is
/// still running after [`HANG`].
fn run_with_input(args: &[&str], input: &[u8]) -> Output {
    let mut child = cairn()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    // A writer that fails early closes its end; a broken pipe is fine.
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > HANG {
            let _ = child.kill();
            panic!("cairn {args:?} still running after {HANG:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    out
}

/// Back up `img` as a new snapshot of `name`, to completion.
fn backup_ok(repo: &Repo, name: &str, img: &Image, extra: &[&str]) -> Value {
    let mut args = vec![
        "backup",
        "-",
        "--repo",
        repo.r(),
        "--name",
        name,
        "-q",
        "--json",
    ];
    args.extend_from_slice(extra);
    json(ok(&run_with_input(&args, &img.bytes())))
}

/// `gc` to completion; then a second gc must find nothing left to do:
/// nothing to salvage, nothing dead, nothing to repack, and no unindexed
/// pack left.
fn gc_to_completion(repo: &Repo) -> Value {
    let j = json(ok(&run(&["gc", "--repo", repo.r(), "--json"])));
    assert_eq!(j["deferred"], false, "{j}");
    let again = json(ok(&run(&["gc", "--repo", repo.r(), "--json"])));
    for key in ["salvaged_packs", "packs_deleted", "packs_written"] {
        assert_eq!(again[key], 0, "a second gc still had work: {again}");
    }
    // Nothing an interrupted run left is still lying around: packs with a
    // sound record were taken in, torn ones deleted.
    let v = json(&run(&["verify", "--repo", repo.r(), "--json"]));
    assert_eq!(
        v["unindexed_packs"].as_array().map(Vec::len),
        Some(0),
        "gc left unindexed packs: {v}"
    );
    j
}

// ---------------------------------------------------------------- checks

struct Checked {
    /// The interrupted snapshot exists (and restored byte for byte).
    interrupted_exists: bool,
    /// Packs on disk that no index names.
    unindexed: usize,
}

/// After a kill: `verify --read-data` is clean, `ls` lists exactly the
/// expected snapshots (plus, perhaps, the interrupted one), and each of
/// them restores byte for byte.
fn check(repo: &Repo, expected: &[Snap], interrupted: Option<&Snap>, out: &Path) -> Checked {
    let v = run(&["verify", "--read-data", "--repo", repo.r(), "--json", "-q"]);
    let vj = json(&v);
    assert!(
        v.status.success() && vj["ok"] == true,
        "verify after a kill: {vj}\nstderr: {}",
        String::from_utf8_lossy(&v.stderr)
    );
    assert_eq!(vj["problems"].as_array().map(Vec::len), Some(0), "{vj}");
    let unindexed = vj["unindexed_packs"].as_array().unwrap().len();

    let ls = json(ok(&run(&["ls", "--repo", repo.r(), "--json"])));
    let listed: BTreeSet<(String, u64)> = ls["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["name"].as_str().unwrap().to_string(),
                x["snapshot"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut want: BTreeSet<(String, u64)> =
        expected.iter().map(|x| (x.name.clone(), x.snap)).collect();
    let mut interrupted_exists = false;
    if let Some(i) = interrupted {
        if listed.contains(&(i.name.clone(), i.snap)) {
            interrupted_exists = true;
            want.insert((i.name.clone(), i.snap));
        }
    }
    assert_eq!(listed, want, "snapshots listed after a kill");
    assert_eq!(vj["snapshots"].as_u64(), Some(want.len() as u64), "{vj}");

    for x in expected
        .iter()
        .chain(interrupted.filter(|_| interrupted_exists))
    {
        restores_identical(repo, x, out);
    }
    Checked {
        interrupted_exists,
        unindexed,
    }
}

fn restores_identical(repo: &Repo, x: &Snap, out: &Path) {
    let _ = std::fs::remove_file(out);
    let spec = x.spec();
    ok(&run(&["restore", &spec, s(out), "--repo", repo.r(), "-q"]));
    let got = std::fs::read(out).unwrap();
    let want = x.img.bytes();
    if got != want {
        let at = got.iter().zip(&want).position(|(a, b)| a != b);
        panic!(
            "{spec} restores {} bytes, expected {}; first difference at {at:?}",
            got.len(),
            want.len()
        );
    }
    std::fs::remove_file(out).unwrap();
}

// ---------------------------------------------------------------- watching the repository

/// Where an event happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Pack,
    Index,
    Snapshots,
    Trash,
}

struct Event {
    place: Place,
    mask: u32,
    name: String,
}

/// inotify on every pack directory of every target, the index directory,
/// one image's snapshot directory and the repository directory.
struct Watcher {
    fd: libc::c_int,
    places: Vec<(libc::c_int, Place)>,
    buf: Vec<u8>,
}

impl Watcher {
    fn new(repo: &Repo, image: Option<&str>) -> Watcher {
        // SAFETY: plain syscall, no pointers.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        let mut w = Watcher {
            fd,
            places: Vec::new(),
            buf: vec![0u8; 1 << 16],
        };
        for t in &repo.targets {
            // cairn makes a fan-out directory with its first pack; made
            // here up front, every pack's creation can be watched.
            for b in 0..=255u8 {
                let sub = t.join("packs").join(format!("{b:02x}"));
                std::fs::create_dir_all(&sub).unwrap();
                w.add(&sub, Place::Pack);
            }
        }
        w.add(&repo.root.join("index"), Place::Index);
        // gc's trash lists; the directory comes with the first one.
        std::fs::create_dir_all(repo.root.join("trash")).unwrap();
        w.add(&repo.root.join("trash"), Place::Trash);
        if let Some(name) = image {
            w.add(&repo.root.join("snapshots").join(name), Place::Snapshots);
        }
        w
    }

    fn add(&mut self, dir: &Path, place: Place) {
        let c = std::ffi::CString::new(s(dir)).unwrap();
        let mask = libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE | libc::IN_DELETE;
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        let wd = unsafe { libc::inotify_add_watch(self.fd, c.as_ptr(), mask) };
        assert!(
            wd >= 0,
            "inotify_add_watch {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
        self.places.push((wd, place));
    }

    /// Events so far, waiting up to `ms` for the first.
    fn poll(&mut self, ms: i32) -> Vec<Event> {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) };
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::read(self.fd, self.buf.as_mut_ptr().cast(), self.buf.len()) };
        let mut out = Vec::new();
        let mut at = 0usize;
        while n > 0 && at + 16 <= n as usize {
            let word =
                |o: usize| u32::from_ne_bytes(self.buf[at + o..at + o + 4].try_into().unwrap());
            let (wd, mask, len) = (word(0) as i32, word(4), word(12) as usize);
            assert_eq!(mask & libc::IN_Q_OVERFLOW, 0, "inotify queue overflowed");
            let raw = &self.buf[at + 16..at + 16 + len];
            let name = String::from_utf8_lossy(raw.split(|&b| b == 0).next().unwrap_or(&[]));
            if let Some(&(_, place)) = self.places.iter().find(|(w, _)| *w == wd) {
                out.push(Event {
                    place,
                    mask,
                    name: name.into_owned(),
                });
            }
            at += 16 + len;
        }
        out
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// When to send SIGKILL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// As soon as the input is in the pipe (gc: at once).
    Fed,
    /// Milliseconds after the input is in the pipe (gc: after the start).
    Delay(u64),
    /// The n-th new pack file is created.
    PackCreated(usize),
    /// The n-th new pack file is closed after writing: sealed and fsync'd.
    PackSealed(usize),
    /// The n-th index file's temporary is created.
    IdxTmp(usize),
    /// The n-th index file is renamed into place.
    IdxDone(usize),
    /// The manifest's temporary is created.
    SnapTmp,
    /// The manifest is linked into place (the snapshot is committed).
    SnapDone,
    /// A trash list's temporary is created.
    GarbageTmp,
    /// A trash list is renamed into place.
    GarbageDone,
    /// The n-th index file is deleted.
    IdxDeleted(usize),
    /// The n-th pack file is deleted.
    PackDeleted(usize),
}

impl At {
    fn stage(self) -> &'static str {
        match self {
            At::Fed | At::Delay(_) => "timed",
            At::PackCreated(_) => "pack created",
            At::PackSealed(_) => "pack sealed",
            At::IdxTmp(_) => "index being written",
            At::IdxDone(_) => "index renamed",
            At::SnapTmp => "manifest being written",
            At::SnapDone => "manifest linked",
            At::GarbageTmp => "trash list being written",
            At::GarbageDone => "trash list renamed",
            At::IdxDeleted(_) => "index deleted",
            At::PackDeleted(_) => "pack deleted",
        }
    }
}

/// Stages seen so far in one run.
#[derive(Default)]
struct Seen {
    created: HashSet<String>,
    /// Packs closed after writing; a pack has two handles (one with
    /// O_DIRECT), both closed once it is fsync'd.
    sealed: HashSet<String>,
    idx_tmp: usize,
    idx_done: usize,
    snap_tmp: usize,
    snap_done: usize,
    garbage_tmp: usize,
    garbage_done: usize,
    idx_deleted: usize,
    pack_deleted: usize,
}

impl Seen {
    fn note(&mut self, e: &Event) {
        let m = e.mask;
        let tmp = e.name.starts_with('.') && e.name.contains(".tmp-");
        match e.place {
            Place::Pack if e.name.ends_with(".pack") => {
                if m & libc::IN_CREATE != 0 {
                    self.created.insert(e.name.clone());
                }
                // Only packs this run created: salvage also opens old packs
                // for writing, to cut a torn tail.
                if m & libc::IN_CLOSE_WRITE != 0 && self.created.contains(&e.name) {
                    self.sealed.insert(e.name.clone());
                }
                if m & libc::IN_DELETE != 0 {
                    self.pack_deleted += 1;
                }
            }
            Place::Index => {
                if m & libc::IN_CREATE != 0 && tmp {
                    self.idx_tmp += 1;
                }
                if m & libc::IN_MOVED_TO != 0 && e.name.ends_with(".idx") {
                    self.idx_done += 1;
                }
                if m & libc::IN_DELETE != 0 && e.name.ends_with(".idx") {
                    self.idx_deleted += 1;
                }
            }
            Place::Snapshots => {
                if m & libc::IN_CREATE != 0 && tmp {
                    self.snap_tmp += 1;
                }
                // Created only where no other writer took the number: a
                // link to the written temporary.
                if m & (libc::IN_MOVED_TO | libc::IN_CREATE) != 0
                    && !tmp
                    && e.name.ends_with(".snap")
                {
                    self.snap_done += 1;
                }
            }
            Place::Trash => {
                if m & libc::IN_CREATE != 0 && tmp {
                    self.garbage_tmp += 1;
                }
                if m & libc::IN_MOVED_TO != 0 && !tmp {
                    self.garbage_done += 1;
                }
            }
            Place::Pack => {}
        }
    }

    fn reached(&self, at: At) -> bool {
        match at {
            At::Fed | At::Delay(_) => false,
            At::PackCreated(n) => self.created.len() >= n,
            At::PackSealed(n) => self.sealed.len() >= n,
            At::IdxTmp(n) => self.idx_tmp >= n,
            At::IdxDone(n) => self.idx_done >= n,
            At::SnapTmp => self.snap_tmp >= 1,
            At::SnapDone => self.snap_done >= 1,
            At::GarbageTmp => self.garbage_tmp >= 1,
            At::GarbageDone => self.garbage_done >= 1,
            At::IdxDeleted(n) => self.idx_deleted >= n,
            At::PackDeleted(n) => self.pack_deleted >= n,
        }
    }
}

/// Input for a run: `data[..upto]` is written, then the pipe is closed or
/// held open (so that the run cannot finish).
struct Feed {
    data: Arc<Vec<u8>>,
    upto: usize,
    close: bool,
}

/// What became of a run.
struct Killed {
    /// It died of our SIGKILL (rather than finishing first).
    killed: bool,
    /// The awaited stage came (and the kill was sent then).
    fired: bool,
    status: ExitStatus,
    stdout: Vec<u8>,
}

/// Run cairn and SIGKILL it at `at`. A run that fails on its own (rather
/// than finishing or being killed) fails the test.
fn run_and_kill(
    repo: &Repo,
    args: &[&str],
    feed: Option<Feed>,
    at: At,
    image: Option<&str>,
) -> Killed {
    let mut watcher = Watcher::new(repo, image);
    let mut child = cairn()
        .args(args)
        .stdin(if feed.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut feeder: Option<JoinHandle<Option<ChildStdin>>> = feed.map(|f| {
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            // The child dies mid-write: a broken pipe is expected.
            let _ = stdin.write_all(&f.data[..f.upto]);
            (!f.close).then_some(stdin)
        })
    });
    let mut held = None;
    let mut fired = false;
    let started = Instant::now();
    match at {
        At::Fed | At::Delay(_) => {
            if let Some(h) = feeder.take() {
                while !h.is_finished() {
                    if started.elapsed() > HANG {
                        let _ = child.kill();
                        panic!("cairn {args:?} stopped reading its input");
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                held = h.join().unwrap();
            }
            if let At::Delay(ms) = at {
                std::thread::sleep(Duration::from_millis(ms));
            }
            let _ = child.kill();
        }
        _ => {
            let mut seen = Seen::default();
            'wait: loop {
                for e in watcher.poll(5) {
                    seen.note(&e);
                    if seen.reached(at) {
                        let _ = child.kill();
                        fired = true;
                        break 'wait;
                    }
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                if started.elapsed() > HANG {
                    let _ = child.kill();
                    panic!("cairn {args:?}: {at:?} did not come within {HANG:?}");
                }
            }
        }
    }
    let status = child.wait().unwrap();
    if let Some(h) = feeder {
        held = h.join().unwrap();
    }
    drop(held);
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    let killed = status.signal() == Some(libc::SIGKILL);
    assert!(
        killed || status.success(),
        "cairn {args:?} failed on its own ({status:?}) before the kill at {at:?}: {}",
        String::from_utf8_lossy(&stderr)
    );
    Killed {
        killed,
        fired,
        status,
        stdout,
    }
}

// ---------------------------------------------------------------- backup

/// One kill of a backup: how much input is written before (MiB; `None`:
/// all of it), whether the pipe is then closed, when the kill comes,
/// worker threads and compression group size.
struct BackupKill {
    fed: Option<usize>,
    close: bool,
    at: At,
    threads: &'static str,
    group: &'static str,
}

/// Input of the interrupted backups: 32 MiB, 8 MiB batches. Held open
/// after 31 MiB, three batches are complete and each holds over 1 MiB of
/// new compressed data: three packs are certainly created and sealed.
const KILL_SEGS: usize = 32;

fn backup_kills() -> Vec<BackupKill> {
    let open = |fed: usize, at: At, threads, group| BackupKill {
        fed: Some(fed),
        close: false,
        at,
        threads,
        group,
    };
    let closed = |at: At, threads, group| BackupKill {
        fed: None,
        close: true,
        at,
        threads,
        group,
    };
    vec![
        // Held open: the backup cannot finish, every kill interrupts it.
        open(0, At::Fed, "2", "2M"),      // starting up
        open(0, At::Delay(3), "2", "2M"), // lock, index, salvage
        open(1, At::Fed, "1", "2M"),      // first batch still filling
        open(6, At::Fed, "2", "256K"),
        open(9, At::Fed, "2", "2M"), // first batch hashed and compressed
        open(9, At::Delay(4), "1", "2M"),
        open(31, At::PackCreated(1), "2", "2M"), // first pack half-written
        open(31, At::PackSealed(1), "2", "256K"), // first pack sealed
        open(17, At::Fed, "2", "2M"),
        open(31, At::PackCreated(2), "1", "2M"),
        open(31, At::PackSealed(2), "2", "2M"),
        open(0, At::Delay(8), "1", "2M"),
        open(25, At::Delay(10), "2", "2M"),
        open(31, At::PackCreated(3), "2", "256K"),
        open(31, At::PackSealed(3), "1", "2M"), // every complete batch stored
        open(31, At::Delay(30), "2", "2M"),
        open(12, At::PackCreated(1), "1", "256K"),
        open(4, At::Delay(2), "2", "2M"),
        open(31, At::Fed, "2", "2M"),
        open(20, At::PackSealed(1), "2", "2M"),
        open(31, At::PackSealed(2), "1", "256K"),
        // Closed: the last stages; the run may finish before the kill.
        closed(At::Fed, "2", "2M"),
        closed(At::Delay(1), "1", "2M"),
        closed(At::Delay(3), "2", "2M"),
        closed(At::Delay(6), "2", "256K"),
        closed(At::Delay(12), "1", "2M"),
        closed(At::PackSealed(4), "2", "2M"), // the last pack
        closed(At::IdxTmp(1), "2", "2M"),     // salvage's index or the commit's
        closed(At::IdxDone(1), "1", "2M"),
        closed(At::SnapTmp, "2", "2M"),
        closed(At::SnapDone, "2", "256K"),
        closed(At::Delay(20), "2", "2M"),
        // Late enough that the run may well have finished.
        closed(At::Delay(60), "1", "2M"),
        closed(At::Delay(150), "2", "2M"),
    ]
}

/// Shared segments: images made of them dedup against each other.
fn pool(j: usize) -> u64 {
    j as u64
}

/// Input of the i-th interrupted backup: half shared segments, half new.
fn kill_input(i: usize) -> Image {
    let segs = (0..KILL_SEGS)
        .map(|j| {
            if (i * 7 + j * 3) % 4 < 2 {
                pool(j)
            } else {
                10_000 + (i * 100 + j) as u64
            }
        })
        .collect();
    Image::new(segs, 777)
}

#[test]
fn backup_killed_at_many_points() {
    let dir = tempdir();
    let d = dir.path();
    let repo = Repo::init(d);
    let out = d.join("out.img");

    // Earlier snapshots, with three codecs.
    let vm1 = Image::new((0..24).map(pool).collect(), 4321);
    let mut vm2 = vm1.clone();
    for (j, seg) in vm2.segs.iter_mut().enumerate() {
        if j % 5 == 2 {
            *seg = 1000 + j as u64;
        }
    }
    vm2.segs.push(1100);
    vm2.len += 1234 + 4321;
    let other = Image::new((2000..2008).collect(), 1);
    let mut expected = Vec::new();
    for (name, img, codec) in [
        ("vm", vm1, "zstd:1"),
        ("vm", vm2, "zstd:3"),
        ("other", other, "lz4"),
    ] {
        let j = backup_ok(&repo, name, &img, &["-c", codec]);
        expected.push(Snap {
            name: name.into(),
            snap: j["snapshot"].as_u64().unwrap(),
            img,
        });
    }
    check(&repo, &expected, None, &out);

    let mut interrupted = 0;
    let mut finished = 0;
    let mut left_unindexed = 0;
    let mut salvaged_by_reruns = 0;
    let mut committed_then_killed = 0;
    let mut stages: BTreeMap<&str, usize> = BTreeMap::new();
    let kills = backup_kills();
    for (i, k) in kills.iter().enumerate() {
        let img = kill_input(i);
        let data = Arc::new(img.bytes());
        let upto = k.fed.map_or(data.len(), |m| (m * MIB).min(data.len()));
        let snap = Snap {
            name: "vm".into(),
            snap: expected.iter().filter(|x| x.name == "vm").count() as u64 + 1,
            img,
        };
        let args = [
            "backup",
            "-",
            "--repo",
            repo.r(),
            "--name",
            "vm",
            "-c",
            "zstd:1",
            "-q",
            "--json",
            "-T",
            k.threads,
            "--group",
            k.group,
        ];
        let feed = Feed {
            data,
            upto,
            close: k.close,
        };
        let r = run_and_kill(&repo, &args, Some(feed), k.at, Some("vm"));
        if !k.close {
            assert!(
                r.killed,
                "kill {i}: a backup with its input held open ended: {:?}",
                r.status
            );
        }
        let c = check(&repo, &expected, Some(&snap), &out);
        eprintln!(
            "backup kill {i} at {:?} after {:.1} MiB ({}): {}, snapshot {}, {} unindexed pack(s)",
            k.at,
            upto as f64 / MIB as f64,
            if k.close {
                "input closed"
            } else {
                "input open"
            },
            if r.killed {
                "interrupted"
            } else {
                "after the end"
            },
            if c.interrupted_exists {
                "committed"
            } else {
                "absent"
            },
            c.unindexed
        );
        if c.interrupted_exists && r.killed {
            committed_then_killed += 1;
        }
        if r.killed {
            interrupted += 1;
            *stages.entry(k.at.stage()).or_default() += 1;
        } else {
            finished += 1;
            let j: Value = serde_json::from_slice(&r.stdout).unwrap();
            assert_eq!(j["snapshot"].as_u64(), Some(snap.snap), "{j}");
            assert!(
                c.interrupted_exists,
                "kill {i}: a finished backup left no snapshot"
            );
            salvaged_by_reruns += j["salvaged_chunks"].as_u64().unwrap();
        }
        if k.at == At::SnapDone && r.fired {
            assert!(
                c.interrupted_exists,
                "kill {i}: killed after the manifest was renamed into place, yet no snapshot"
            );
        }
        if c.unindexed > 0 {
            left_unindexed += 1;
        }
        if c.interrupted_exists {
            expected.push(snap);
        }
    }
    eprintln!(
        "backup: {} kills, {interrupted} interrupted a run ({stages:?}; {committed_then_killed} \
         after the snapshot was committed), {finished} came after it finished; {left_unindexed} \
         left unindexed packs; finished runs salvaged {salvaged_by_reruns} chunks",
        kills.len()
    );
    assert!(
        interrupted >= 20,
        "only {interrupted} kills interrupted a backup"
    );
    assert!(
        left_unindexed >= 5,
        "only {left_unindexed} kills left packs behind: the kills did not land mid-write"
    );

    // gc to completion: everything reusable indexed, the rest gone.
    gc_to_completion(&repo);
    let before = check(&repo, &expected, None, &out).unindexed;

    // Reuse: a backup killed after several packs were sealed, then rerun.
    let fresh = Image::new((0..40).map(|j| 90_000 + j).collect(), 99);
    let data = Arc::new(fresh.bytes());
    let opts = ["-c", "zstd:1", "-T", "2"];
    let empty = Repo::init(&d.join("empty"));
    let reference = backup_ok(&empty, "fresh", &fresh, &opts);
    let full = reference["bytes_stored_new"].as_u64().unwrap();
    let mut args = vec![
        "backup",
        "-",
        "--repo",
        repo.r(),
        "--name",
        "fresh",
        "-q",
        "--json",
    ];
    args.extend_from_slice(&opts);
    // 39 of 40 MiB: four batches complete, the fifth waits for input.
    let feed = Feed {
        data: data.clone(),
        upto: 39 * MIB,
        close: false,
    };
    // Packs hold at most 1 MiB, so the four complete batches fill about
    // `full / 1 MiB` of them: kill once two thirds of those are sealed.
    let sealed = (full / MIB as u64 * 2 / 3).max(4) as usize;
    let r = run_and_kill(&repo, &args, Some(feed), At::PackSealed(sealed), None);
    assert!(r.killed && r.fired);
    let snap = Snap {
        name: "fresh".into(),
        snap: 1,
        img: fresh.clone(),
    };
    let c = check(&repo, &expected, Some(&snap), &out);
    assert!(!c.interrupted_exists);
    assert!(
        c.unindexed >= before + sealed,
        "the {sealed} sealed packs are left unindexed: {} (before: {before})",
        c.unindexed
    );
    let rerun = json(ok(&run_with_input(&args, &data)));
    let salvaged = rerun["salvaged_chunks"].as_u64().unwrap();
    let stored = rerun["bytes_stored_new"].as_u64().unwrap();
    eprintln!(
        "reuse: the same backup into an empty repository stores {full} bytes; the rerun of the \
         killed one stores {stored}, salvaging {salvaged} chunks from {} packs",
        rerun["salvaged_packs"]
    );
    assert!(salvaged > 0, "{rerun}");
    assert!(
        rerun["salvaged_packs"].as_u64().unwrap() >= sealed as u64,
        "{rerun}"
    );
    assert!(
        stored * 2 < full,
        "the rerun stores {stored} bytes, a fresh backup {full}: what reached disk was not reused"
    );
    assert_eq!(rerun["bytes_in"].as_u64(), Some(fresh.len as u64));
    expected.push(snap);

    gc_to_completion(&repo);
    let c = check(&repo, &expected, None, &out);
    eprintln!(
        "after the last gc: {} unindexed pack(s) (holding no sound record) left",
        c.unindexed
    );
}

// ---------------------------------------------------------------- gc

/// Kill points of gc, by round: each round gives gc new work, then runs
/// gc and kills it at each point in turn (every run resumes what the
/// killed one left), stopping early when a run finishes first. The first
/// point of a round is one a run with fresh work certainly reaches. In
/// round 1 a gc has already done the work while a reader held the
/// repository, leaving the packs on the garbage list: its kills hit the
/// deletion of that list's packs.
fn gc_rounds() -> Vec<Vec<At>> {
    use At::*;
    vec![
        vec![PackCreated(1), IdxTmp(1), GarbageTmp],
        vec![PackDeleted(1), Delay(0), PackDeleted(3)],
        vec![PackSealed(1), IdxDone(1), GarbageDone],
        vec![Delay(5), PackCreated(2), IdxDeleted(1)],
        vec![PackCreated(1), Delay(10), PackSealed(2)],
        vec![Delay(2), IdxTmp(2), PackDeleted(2)],
        vec![PackSealed(1), Delay(15), PackDeleted(1)],
        vec![Delay(25), GarbageTmp, IdxDone(2)],
        vec![PackCreated(3), Delay(1), Delay(7)],
        vec![IdxTmp(1), PackSealed(2), GarbageDone],
        vec![Delay(40), PackCreated(1), IdxDeleted(1)],
        vec![Delay(3), PackDeleted(2), Delay(12)],
    ]
}

/// A reader's session, as restore or serve registers one (until dropped).
fn reader_lock(repo: &Repo) -> cairn_store::Session {
    cairn_store::Repository::open(&repo.root)
        .unwrap()
        .session("a reader")
        .unwrap()
}

#[test]
fn gc_killed_at_many_points() {
    let dir = tempdir();
    let d = dir.path();
    let repo = Repo::init(d);
    let out = d.join("out.img");

    let keep1 = Image::new((3000..3016).collect(), 3);
    let mut keep2 = keep1.clone();
    for j in [1, 6, 11, 14] {
        keep2.segs[j] = 3100 + j as u64;
    }
    let mut expected = Vec::new();
    for img in [keep1, keep2] {
        let j = backup_ok(&repo, "keep", &img, &["-c", "zstd:1"]);
        expected.push(Snap {
            name: "keep".into(),
            snap: j["snapshot"].as_u64().unwrap(),
            img,
        });
    }

    let rounds = gc_rounds();
    let mut kills = 0;
    let mut interrupted = 0;
    let mut finished = 0;
    let mut stages: BTreeMap<&str, usize> = BTreeMap::new();
    let mut round = 0;
    let mut leftover = 0;
    // Every round once, then more until 20 kills have interrupted a run.
    while round < rounds.len() || interrupted < 20 {
        assert!(
            round < 3 * rounds.len(),
            "only {interrupted} of {kills} kills interrupted gc ({stages:?})"
        );
        // Work: `a` (each chunk its own record) is removed but shares a
        // quarter of every pack with `b`, so its packs are sparse and get
        // repacked; `c` and the previous round's `b` are removed whole,
        // their packs dead.
        let base = 50_000 + round as u64 * 1000;
        let a = Image::new((0..24).map(|j| base + j).collect(), 0);
        let mut b_segs: Vec<u64> = [0, 3, 8, 11, 16, 19].iter().map(|&j| base + j).collect();
        b_segs.extend((100..106).map(|j| base + j));
        let b = Image::new(b_segs, 555);
        let c = Image::new((200..208).map(|j| base + j).collect(), 0);
        // Removing an image's last snapshot removes the image: numbers
        // start again, so take them from the backups.
        let number = |j: Value| j["snapshot"].as_u64().unwrap();
        let na = number(backup_ok(&repo, "a", &a, &["-c", "zstd:1", "--group", "0"]));
        let nb = number(backup_ok(&repo, "b", &b, &["-c", "zstd:1"]));
        let nc = number(backup_ok(&repo, "c", &c, &["-c", "lz4"]));
        let mut gone = vec![format!("a@{na}"), format!("c@{nc}")];
        gone.extend(expected.iter().filter(|x| x.name == "b").map(Snap::spec));
        for g in &gone {
            ok(&run(&["rm", g, "--repo", repo.r()]));
        }
        expected.retain(|x| x.name != "b");
        expected.push(Snap {
            name: "b".into(),
            snap: nb,
            img: b,
        });
        check(&repo, &expected, None, &out);

        if round == 1 {
            // A reader holds the repository: gc leaves the packs on the
            // garbage list for the next writer (the kills below).
            let reader = reader_lock(&repo);
            let j = json(ok(&run(&["gc", "--repo", repo.r(), "--json"])));
            assert_eq!(j["deferred"], true, "{j}");
            // (A killed gc may have left a temporary: not a list.)
            let lists: Vec<String> = std::fs::read_dir(repo.root.join("trash"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
                .map(|p| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned())
                .collect();
            assert_eq!(lists.len(), 1, "{lists:#?}");
            check(&repo, &expected, None, &out);
            drop(reader);
        }

        for &at in &rounds[round % rounds.len()] {
            kills += 1;
            let r = run_and_kill(&repo, &["gc", "--repo", repo.r(), "--json"], None, at, None);
            let c = check(&repo, &expected, None, &out);
            eprintln!(
                "gc round {round}: kill at {at:?}: {}, {} unindexed pack(s) left",
                if r.killed {
                    "interrupted"
                } else {
                    "after the end"
                },
                c.unindexed
            );
            if !r.killed {
                finished += 1;
                break;
            }
            interrupted += 1;
            *stages.entry(at.stage()).or_default() += 1;
        }
        gc_to_completion(&repo);
        leftover = check(&repo, &expected, None, &out).unindexed;
        round += 1;
    }
    eprintln!(
        "gc: {kills} kills in {round} rounds, {interrupted} interrupted a run ({stages:?}), \
         {finished} came after it finished; after the last gc {leftover} unindexed pack(s) \
         (holding no sound record) left"
    );
    // The later stages pass in a millisecond or two (fsync is fast): a
    // kill there may come after the end, so only these must have hit.
    for stage in ["pack created", "timed"] {
        assert!(
            stages.get(stage).copied().unwrap_or(0) > 0,
            "no kill interrupted gc at stage {stage:?}: {stages:?}"
        );
    }
    let stats = json(ok(&run(&["stats", "--repo", repo.r(), "--json"])));
    assert_eq!(stats["snapshots"].as_u64(), Some(expected.len() as u64));
    assert_eq!(stats["unindexed_packs"].as_u64(), Some(leftover as u64));
}

// ---------------------------------------------------------------- writers side by side

/// Wait until `pid` has registered its session in the repository.
fn wait_for_session(repo: &Repo, pid: u32) {
    let started = Instant::now();
    let mine = format!("\"pid\":{pid},");
    loop {
        let found = std::fs::read_dir(repo.root.join("sessions"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|body| body.contains(&mine)));
        if found {
            return;
        }
        assert!(
            started.elapsed() < HANG,
            "pid {pid} never registered its session"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Several writers at once, as from several hosts: a backup holding its
/// input open, and beside it another backup, an rm and a gc that marks
/// dead the very chunks the held backup deduplicates against. Everything
/// succeeds, and nothing is lost: the gc's deletions wait for the held
/// backup, whose snapshot then keeps the packs it uses.
#[test]
fn writers_run_side_by_side_and_gc_beside_them_loses_nothing() {
    let dir = tempdir();
    let d = dir.path();
    let repo = Repo::init(d);
    let out = d.join("out.img");
    let first = Image::new((7000..7006).collect(), 10);
    backup_ok(&repo, "a", &first, &["-c", "zstd:1"]);

    // A backup of the same data (every chunk deduplicates against a@1's),
    // its input held open past its index load.
    let held = first.clone();
    let data = held.bytes();
    let mut child = cairn()
        .args([
            "backup",
            "-",
            "--repo",
            repo.r(),
            "--name",
            "b",
            "-q",
            "--json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&data[..3 * MIB]).unwrap();
    wait_for_session(&repo, child.id());

    // Beside it: another backup, the removal of a@1 (its chunks are now
    // dead to the gc), and the gc, which must defer its deletions.
    let other = Image::new(vec![7200], 0);
    let c = backup_ok(&repo, "c", &other, &[]);
    assert_eq!(c["snapshot"], 1);
    ok(&run(&["rm", "a@1", "--repo", repo.r()]));
    let g = json(ok(&run(&["gc", "--repo", repo.r(), "--json"])));
    assert_eq!(g["deferred"], true, "{g}");
    assert!(g["packs_deleted"].as_u64().unwrap() > 0, "{g}");

    // Readers go on meanwhile.
    let c1 = Snap {
        name: "c".into(),
        snap: 1,
        img: other,
    };
    restores_identical(&repo, &c1, &out);

    // The held backup finishes; its snapshot is whole.
    stdin.write_all(&data[3 * MIB..]).unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    let j = json(ok(&o));
    assert_eq!(j["snapshot"], 1);
    let b1 = Snap {
        name: "b".into(),
        snap: 1,
        img: held,
    };
    restores_identical(&repo, &b1, &out);

    // The next gc finishes the deferred list, keeping the packs b uses.
    let g = json(ok(&run(&["gc", "--repo", repo.r(), "--json"])));
    assert_eq!(g["deferred"], false, "{g}");
    assert!(g["packs_kept"].as_u64().unwrap() > 0, "{g}");
    assert_eq!(
        std::fs::read_dir(repo.root.join("trash")).unwrap().count(),
        0
    );
    let c = check(&repo, &[b1, c1], None, &out);
    assert_eq!(c.unindexed, 0);

    // A killed writer's session is no obstacle: the next gc runs whole.
    let mut child = cairn()
        .args(["backup", "-", "--repo", repo.r(), "--name", "k", "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_session(&repo, child.id());
    child.kill().unwrap();
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    ok(&run(&["rm", "c@1", "--repo", repo.r()]));
    let g = json(ok(&run(&["gc", "--repo", repo.r(), "--json"])));
    assert_eq!(g["deferred"], false, "{g}");
}
