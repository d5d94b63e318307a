//! `cairn mount` end to end with the real binary, the kernel's FUSE and
//! real readers: cmp and stat on the snapshot files, an ext4 image
//! loop-mounted from the mount, SIGTERM, a missing mount point, and a
//! damaged pack read with cat.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

mod common;
use common::*;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The fusermount there is (fuse3's or fuse 2's), or None (and under CI
/// a failure).
fn fusermount() -> Option<&'static str> {
    let found = ["fusermount3", "fusermount"]
        .into_iter()
        .find(|t| on_path(t));
    need(found.is_some(), "fusermount3 or fusermount").then_some(())?;
    found
}

/// Everything a mount needs here: /dev/fuse and a fusermount.
fn fuse_ready() -> Option<&'static str> {
    if !need(Path::new("/dev/fuse").exists(), "/dev/fuse") {
        return None;
    }
    fusermount()
}

/// Is `dir` a mount point now?
fn is_mount_point(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|p| p.replace("\\040", " ") == s(&dir))
    })
}

fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A running `cairn mount`; on drop, unmounted and killed whatever state
/// the test left it in.
struct Mounted {
    dir: PathBuf,
    child: Child,
    fusermount: &'static str,
    stderr: Arc<Mutex<String>>,
}

impl Mounted {
    /// `cairn mount --repo REPO DIR`, returned once DIR is mounted.
    fn start(repo: &Path, dir: &Path, fusermount: &'static str) -> Mounted {
        Mounted::start_with(repo, dir, fusermount, &[])
    }

    /// The same with more options.
    fn start_with(repo: &Path, dir: &Path, fusermount: &'static str, extra: &[&str]) -> Mounted {
        let mut child = cairn()
            .env_remove("CAIRN_REPO")
            .args(["mount", "--repo", s(repo), s(dir)])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut m = Mounted {
            dir: dir.to_path_buf(),
            child,
            fusermount,
            stderr,
        };
        let t = Instant::now();
        while !is_mount_point(dir) {
            if let Some(st) = m.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                panic!("cairn mount exited with {st:?}: {}", m.stderr());
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{} not mounted after 60 s: {}",
                dir.display(),
                m.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Its stderr once `want` holds of it (the pipe is read by another
    /// thread, so a line written a moment ago may not be in yet).
    fn stderr_when(&self, want: impl Fn(&str) -> bool) -> String {
        let t = Instant::now();
        loop {
            let text = self.stderr();
            if want(&text) || t.elapsed() > Duration::from_secs(10) {
                return text;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `fusermount -u DIR` (retried while busy: a loop device lets go of
    /// its file asynchronously), then the exit status of cairn mount.
    fn unmount(&mut self) -> ExitStatus {
        let t = Instant::now();
        loop {
            let out = tool(self.fusermount, &["-u", s(&self.dir)]);
            if out.status.success() {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{} -u failed: {}",
                self.fusermount,
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.exit_status()
    }

    fn exit_status(&mut self) -> ExitStatus {
        wait_exit(&mut self.child, Duration::from_secs(20)).unwrap_or_else(|| {
            panic!(
                "cairn mount still running 20 s after the unmount: {}",
                self.stderr()
            )
        })
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if is_mount_point(&self.dir) {
            let _ = tool(self.fusermount, &["-u", "-z", s(&self.dir)]);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loop mount (`mount -o loop,ro`), unmounted on drop.
struct LoopMount(PathBuf);

impl Drop for LoopMount {
    fn drop(&mut self) {
        if is_mount_point(&self.0) {
            let _ = tool("umount", &[s(&self.0)]);
        }
    }
}

/// `cmp A B` with the real cmp.
fn assert_cmp(a: &Path, b: &Path) {
    let out = tool("cmp", &[s(a), s(b)]);
    assert!(
        out.status.success(),
        "cmp {} {}: {}{}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn backup(repo: &Path, src: &Path, name: &str) {
    ok(run(&[
        "backup",
        s(src),
        "--repo",
        s(repo),
        "--name",
        name,
        "-q",
    ]));
}

/// A repository under `d` holding `data` as the one snapshot of image
/// `name`, and an empty directory to mount it on.
fn repo_of(d: &Path, name: &str, data: &[u8]) -> (PathBuf, PathBuf) {
    let f = d.join(format!("{name}.img"));
    std::fs::write(&f, data).unwrap();
    let repo = d.join("repo");
    ok(run(&["init", s(&repo)]));
    backup(&repo, &f, name);
    let mnt = d.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    (repo, mnt)
}

/// Creation times of the snapshots, from `cairn ls --json`.
fn created(repo: &Path) -> Vec<(String, u64, i64)> {
    let out = ok(run(&["ls", "--repo", s(repo), "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["snapshot"].as_u64().unwrap(),
                s["created"].as_i64().unwrap(),
            )
        })
        .collect()
}

// ---------------------------------------------------------------------
// 1. Snapshots as files: cmp, stat, listings, fusermount -u

#[test]
fn snapshots_read_back_equal_through_the_mount() {
    let Some(fusermount) = fuse_ready() else {
        return;
    };
    if !have("cmp") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    // Two versions of a 24 MiB image with zero holes; the second changes
    // some of it and grows to a size that is no multiple of a page.
    let mut v1 = mixed(24 << 20, 61);
    for at in [3 << 20, 11 << 20, 20 << 20] {
        v1[at..at + (1 << 20)].fill(0);
    }
    let mut v2 = v1.clone();
    v2[5 << 20..(5 << 20) + 300_000].copy_from_slice(&noise(300_000, 62));
    v2[11 << 20..(11 << 20) + 4096].fill(9);
    v2.extend_from_slice(&mixed((3 << 20) + 1234, 63));
    let small = mixed(100_001, 64);
    let (f1, f2, fs) = (d.join("v1.img"), d.join("v2.img"), d.join("small.img"));
    std::fs::write(&f1, &v1).unwrap();
    std::fs::write(&f2, &v2).unwrap();
    std::fs::write(&fs, &small).unwrap();
    let repo = d.join("repo");
    ok(run(&["init", s(&repo)]));
    backup(&repo, &f1, "disk");
    backup(&repo, &f2, "disk");
    backup(&repo, &fs, "small");
    let times = created(&repo);

    let mnt = d.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mut m = Mounted::start(&repo, &mnt, fusermount);
    assert_eq!(listing(&mnt), ["disk", "small"]);
    assert_eq!(listing(&mnt.join("disk")), ["1", "2", "latest"]);
    assert_eq!(listing(&mnt.join("small")), ["1", "latest"]);
    for (file, want, len) in [
        ("disk/1", &f1, v1.len()),
        ("disk/2", &f2, v2.len()),
        ("disk/latest", &f2, v2.len()),
        ("small/1", &fs, small.len()),
        ("small/latest", &fs, small.len()),
    ] {
        let p = mnt.join(file);
        let meta = std::fs::metadata(&p).unwrap();
        assert!(meta.is_file(), "{file} is not a regular file");
        assert_eq!(meta.len(), len as u64, "size of {file}");
        assert_cmp(&p, want);
    }
    // Times are the snapshots' creation times.
    for (name, snap, when) in &times {
        let p = mnt.join(name).join(snap.to_string());
        let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
        assert_eq!(
            mtime.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64,
            *when,
            "mtime of {}",
            p.display()
        );
    }
    // Random reads too (pread at odd offsets).
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(mnt.join("disk/2")).unwrap();
        for (off, len) in [
            (0u64, 1usize),
            (4095, 2),
            (7_777_777, 100_000),
            (v2.len() as u64 - 10, 10),
        ] {
            let mut buf = vec![0u8; len];
            f.read_exact_at(&mut buf, off).unwrap();
            assert!(
                buf == v2[off as usize..off as usize + len],
                "pread {off}+{len}"
            );
        }
    }
    // Read-only: no writing, no new files.
    assert!(std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("disk/1"))
        .is_err());
    assert!(std::fs::write(mnt.join("disk/new"), b"x").is_err());

    let st = m.unmount();
    assert!(st.success(), "exit {st:?}: {}", m.stderr());
    assert!(!is_mount_point(&mnt));
}

// ---------------------------------------------------------------------
// 2. An ext4 image, loop-mounted from the mount

#[test]
fn ext4_image_loop_mounts_from_the_mount() {
    let Some(fusermount) = fuse_ready() else {
        return;
    };
    if !have("mkfs.ext4") || !have("mount") || !have("umount") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if !need(unsafe { libc::geteuid() } == 0, "root (for loop mounts)") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let src = d.join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("a.bin", noise(3_000_000, 71)),
        ("b.txt", mixed(1_234_567, 72)),
        ("sub/c.bin", noise(700_001, 73)),
        ("sub/deeper/d.txt", mixed(5 << 20, 74)),
        ("sub/empty", Vec::new()),
    ];
    for (name, data) in &files {
        std::fs::write(src.join(name), data).unwrap();
    }
    let img = d.join("fs.img");
    ok(tool(
        "mkfs.ext4",
        &["-q", "-F", "-d", s(&src), s(&img), "48M"],
    ));
    let repo = d.join("repo");
    ok(run(&["init", s(&repo)]));
    backup(&repo, &img, "fs");

    let mnt = d.join("mnt");
    let lo = d.join("lo");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&lo).unwrap();
    let mut m = Mounted::start(&repo, &mnt, fusermount);
    assert_cmp(&mnt.join("fs/latest"), &img);
    {
        let out = tool(
            "mount",
            &["-o", "loop,ro", s(&mnt.join("fs/latest")), s(&lo)],
        );
        let _lomount = LoopMount(lo.clone());
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            need(
                false,
                &format!("a loop device (mount -o loop: {})", why.trim()),
            );
            return;
        }
        let want: Vec<PathBuf> = files.iter().map(|(n, _)| PathBuf::from(n)).collect();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        assert_eq!(tree(&lo), want_sorted);
        for (name, _) in &files {
            assert_cmp(&lo.join(name), &src.join(name));
        }
        ok(tool("umount", &[s(&lo)]));
    }
    let st = m.unmount();
    assert!(st.success(), "exit {st:?}: {}", m.stderr());
}

// ---------------------------------------------------------------------
// 3. SIGTERM unmounts and exits 0

#[test]
fn sigterm_unmounts_and_exits_zero() {
    let Some(fusermount) = fuse_ready() else {
        return;
    };
    let dir = tempdir();
    let d = dir.path();
    let data = mixed(3 << 20, 81);
    let (repo, mnt) = repo_of(d, "a", &data);
    let mut m = Mounted::start(&repo, &mnt, fusermount);
    assert_eq!(std::fs::read(mnt.join("a/latest")).unwrap(), data);
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(m.child.id() as i32, libc::SIGTERM);
    }
    let st = m.exit_status();
    assert!(st.success(), "exit {st:?} after SIGTERM: {}", m.stderr());
    assert!(!is_mount_point(&mnt), "still mounted after SIGTERM");
    // The repository is free again: gc runs (it would wait for a live session).
    ok(run(&["gc", "--repo", s(&repo)]));
}

/// Found from outside (2026-11-28): a snapshot removed while mounted
/// read as EIO, as if damaged. One opened before the removal reads on (and
/// gc, beside the mount, deletes nothing it uses); one first opened after
/// it is gone (ENOENT), and the mount says why.
#[test]
fn snapshots_removed_while_mounted() {
    let Some(fusermount) = fuse_ready() else {
        return;
    };
    let dir = tempdir();
    let d = dir.path();
    let data = mixed(2 << 20, 83);
    let (repo, mnt) = repo_of(d, "a", &data);
    let second = d.join("second");
    std::fs::write(&second, mixed(2 << 20, 84)).unwrap();
    backup(&repo, &second, "a");
    // The tree of the mount's start (a listing again would take the
    // removed files out of it: `new_and_removed_snapshots_show_...`).
    let mut m = Mounted::start_with(&repo, &mnt, fusermount, &["--refresh", "0"]);
    let mut open = std::fs::File::open(mnt.join("a/1")).unwrap();
    ok(run(&["rm", "a@1", "--repo", s(&repo)]));
    ok(run(&["rm", "a@2", "--repo", s(&repo)]));
    ok(run(&["gc", "--repo", s(&repo)]));
    let mut got = Vec::new();
    open.read_to_end(&mut got).unwrap();
    assert!(
        got == data,
        "an open snapshot read differently after rm and gc"
    );
    let e = std::fs::read(mnt.join("a/2")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    let said = m.stderr_when(|t| t.contains("was removed"));
    assert!(
        said.contains("a@2 was removed after the mount started"),
        "{said}"
    );
    drop(open);
    m.unmount();
    // A number given to a new snapshot after the mount started is not
    // the new one's file: the mount's a@1 is gone (its bytes were once
    // read as the new a@1's, or as "damaged").
    let fresh = d.join("fresh");
    std::fs::write(&fresh, mixed(1 << 20, 85)).unwrap();
    // (Numbered 1 again, as below: the removal records taken away.)
    std::fs::remove_dir_all(repo.join("removed")).unwrap();
    ok(run(&[
        "backup",
        s(&fresh),
        "--repo",
        s(&repo),
        "--name",
        "a",
        "--time",
        "@1000000000",
        "-q",
    ]));
    let mut m = Mounted::start_with(&repo, &mnt, fusermount, &["--refresh", "0"]);
    ok(run(&["rm", "a", "--all", "--repo", s(&repo)]));
    // A number is given again only where no removal record keeps it (the
    // repository rolled back, or an rm by a cairn older than the
    // records): as here.
    std::fs::remove_dir_all(repo.join("removed")).unwrap();
    ok(run(&[
        "backup",
        s(&second),
        "--repo",
        s(&repo),
        "--name",
        "a",
        "--time",
        "@1000000100",
        "-q",
    ]));
    let e = std::fs::read(mnt.join("a/1")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    let said = m.stderr_when(|t| t.contains("another snapshot's"));
    assert!(
        said.contains("a@1 was removed after the mount started"),
        "{said}"
    );
    m.unmount();
}

/// Found from outside (2026-11-29): the tree was made once, so a backup
/// made while mounted never showed and a removed snapshot stayed listed
/// (its file failing to open). With `--refresh`, a directory looked at
/// after the period shows the snapshots there are: new ones (read back
/// equal, their chunks in index files written after the mount started),
/// `latest` moved, removed ones gone, a renumbered one as the new
/// snapshot; a file open before its snapshot was removed reads on.
#[test]
fn new_and_removed_snapshots_show_after_a_refresh() {
    let Some(fusermount) = fuse_ready() else {
        return;
    };
    let dir = tempdir();
    let d = dir.path();
    let one = mixed(1 << 20, 91);
    let (repo, mnt) = repo_of(d, "a", &one);
    let mut m = Mounted::start_with(&repo, &mnt, fusermount, &["--refresh", "1"]);
    let names = |p: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    // Listed again within a few periods (the kernel keeps entries 1 s).
    let eventually = |what: &str, cond: &dyn Fn() -> bool| {
        let t = Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(20), "{what}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    assert_eq!(names(&mnt), ["a"]);
    assert_eq!(names(&mnt.join("a")), ["1", "latest"]);
    let mut open = std::fs::File::open(mnt.join("a/1")).unwrap();

    let two = mixed(1 << 20, 92);
    let f = d.join("two.img");
    std::fs::write(&f, &two).unwrap();
    backup(&repo, &f, "a");
    backup(&repo, &f, "b");
    eventually("a@2 and b listed", &|| {
        names(&mnt) == ["a", "b"] && names(&mnt.join("a")) == ["1", "2", "latest"]
    });
    assert!(std::fs::read(mnt.join("a/2")).unwrap() == two);
    assert!(std::fs::read(mnt.join("a/latest")).unwrap() == two);
    assert!(std::fs::read(mnt.join("b/1")).unwrap() == two);

    // a@2 removed and, once the mount has seen it go, its number given to
    // a new snapshot: the new one's bytes under the old name. (Both
    // within one period, a file opened before keeps reading the old one;
    // one not opened yet is taken out and listed again.)
    ok(run(&["rm", "a@2", "--repo", s(&repo)]));
    eventually("a@2 gone", &|| names(&mnt.join("a")) == ["1", "latest"]);
    // (Its removal record taken away, as a rollback or an older cairn
    // would leave it: a number is not given again otherwise.)
    std::fs::remove_dir_all(repo.join("removed")).unwrap();
    let three = mixed(1 << 20, 93);
    std::fs::write(&f, &three).unwrap();
    backup(&repo, &f, "a");
    assert_eq!(created(&repo).len(), 3, "a@1, a@2 and b@1");
    eventually("the new a@2 read", &|| {
        std::fs::read(mnt.join("a/2")).is_ok_and(|b| b == three)
    });
    assert!(std::fs::read(mnt.join("a/latest")).unwrap() == three);

    ok(run(&["rm", "a@1", "--repo", s(&repo)]));
    ok(run(&["rm", "b", "--all", "--repo", s(&repo)]));
    eventually("a@1 and b gone", &|| {
        names(&mnt) == ["a"] && names(&mnt.join("a")) == ["2", "latest"]
    });
    let mut got = Vec::new();
    open.read_to_end(&mut got).unwrap();
    assert!(got == one, "the open a@1 read differently after rm");
    drop(open);
    assert!(!m.stderr().contains("panicked"), "{}", m.stderr());
    m.unmount();
}

#[test]
fn sigterm_with_a_file_open_detaches_and_serves_it_until_closed() {
    let Some(fusermount) = fuse_ready() else {
        return;
    };
    let dir = tempdir();
    let d = dir.path();
    let data = mixed(2 << 20, 82);
    let (repo, mnt) = repo_of(d, "a", &data);
    let mut m = Mounted::start(&repo, &mnt, fusermount);
    let mut open = std::fs::File::open(mnt.join("a/1")).unwrap();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(m.child.id() as i32, libc::SIGTERM);
    }
    let t = Instant::now();
    while is_mount_point(&mnt) {
        assert!(t.elapsed() < Duration::from_secs(20), "not detached");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Detached, and the open file still reads whole.
    let mut got = Vec::new();
    open.read_to_end(&mut got).unwrap();
    assert!(got == data, "the open file read differently after SIGTERM");
    assert!(
        m.child.try_wait().unwrap().is_none(),
        "exited with a file open"
    );
    let said = m.stderr_when(|t| t.contains("busy"));
    assert!(said.contains("busy"), "{said}");
    drop(open);
    let st = m.exit_status();
    assert!(st.success(), "exit {st:?}: {}", m.stderr());
}

// ---------------------------------------------------------------------
// 4. Errors: one line, non-zero exit

#[test]
fn missing_or_bad_mount_point_is_one_line() {
    let dir = tempdir();
    let d = dir.path();
    let repo = d.join("repo");
    ok(run(&["init", s(&repo)]));
    let file = d.join("file");
    std::fs::write(&file, b"x").unwrap();
    for (target, says) in [
        (d.join("missing"), "No such file or directory"),
        (file, "not a directory"),
    ] {
        let out = run(&["mount", "--repo", s(&repo), s(&target)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: {err}", target.display());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("cairn: ") && err.contains(says) && err.contains(s(&target)),
            "{err}"
        );
    }
    // A repository that is not there: also one line.
    let out = run(&["mount", "--repo", s(&d.join("nope")), s(d)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!is_mount_point(d));
}

// ---------------------------------------------------------------------
// 5. A damaged pack: EIO, never wrong bytes

#[test]
fn damaged_pack_reads_fail_with_eio() {
    let Some(fusermount) = fuse_ready() else {
        return;
    };
    if !have("cat") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let data = noise(12 << 20, 91);
    let (repo, mnt) = repo_of(d, "a", &data);
    let packs = repo.join("data/packs");
    let found: Vec<PathBuf> = tree(&packs).iter().map(|p| packs.join(p)).collect();
    assert!(!found.is_empty(), "no pack under {}", repo.display());
    for p in &found {
        let mut bytes = std::fs::read(p).unwrap();
        let mid = bytes.len() / 2;
        for b in &mut bytes[mid..mid + 64] {
            *b ^= 0x5a;
        }
        std::fs::write(p, &bytes).unwrap();
    }
    let mut m = Mounted::start(&repo, &mnt, fusermount);
    let out = Command::new("cat")
        .arg(mnt.join("a/latest"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "cat of a damaged image succeeded");
    assert!(err.contains("Input/output error"), "cat said: {err}");
    // What came before the error is the image's own bytes.
    assert!(out.stdout.len() < data.len());
    assert!(
        out.stdout[..] == data[..out.stdout.len()],
        "cat returned wrong bytes before the error"
    );
    // The mount said what is damaged, and is still serving.
    let names_it = |t: &str| t.contains("a@1") && t.contains("offset") && t.contains("chunk");
    let said = m.stderr_when(names_it);
    assert!(names_it(&said), "cairn mount said: {said}");
    assert!(!said.contains("panicked"), "{said}");
    assert_eq!(
        std::fs::read(mnt.join("a/1"))
            .map(|_| ())
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EIO)
    );
    assert!(m.child.try_wait().unwrap().is_none(), "cairn mount died");
    let st = m.unmount();
    assert!(st.success(), "exit {st:?}: {}", m.stderr());
}
