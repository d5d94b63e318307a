//! The repository's verbs end to end on both backends, with the real
//! binary: a local directory, and a bucket of a real S3 server (SeaweedFS,
//! started by the test). The same suite runs on both; then what only an
//! object store has to survive: the server stopped in the middle of a
//! backup, objects flipped or deleted in the bucket.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

mod common;
use cairn_testkit::SeaweedFs;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Where a repository is, and the environment its commands need.
struct Store {
    /// A directory, or `s3://bucket/prefix`.
    loc: String,
    env: Vec<(String, String)>,
    dir: tempfile::TempDir,
}

impl Store {
    fn local() -> Store {
        let dir = tempdir();
        Store {
            loc: dir.path().join("repo").display().to_string(),
            env: Vec::new(),
            dir,
        }
    }

    fn s3(server: &SeaweedFs, prefix: &str) -> Store {
        Store {
            loc: server.url(prefix),
            env: server.env(),
            dir: tempdir(),
        }
    }

    fn cmd(&self) -> Command {
        let mut c = cairn();
        c.env_remove("CAIRN_REPO");
        for (k, v) in &self.env {
            c.env(k, v);
        }
        // Retries end within seconds here (a stopped server is the test).
        c.env("CAIRN_S3_RETRY_SECS", "8");
        // The local cache of this test alone (not the user's).
        c.env("CAIRN_CACHE_DIR", self.dir.path().join("cache"));
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).stdin(Stdio::null()).output().unwrap()
    }

    /// `cairn VERB ARGS --repo LOC`.
    fn verb(&self, verb: &str, args: &[&str]) -> Output {
        let mut all = vec![verb];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--repo", &self.loc]);
        self.run(&all)
    }

    fn file(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p
    }

    fn backup(&self, name: &str, data: &[u8]) -> Value {
        let f = self.file(&format!("{name}.in"), data);
        json(&ok(self.verb(
            "backup",
            &[f.to_str().unwrap(), "--name", name, "-q", "--json"],
        )))
    }

    fn restore(&self, spec: &str) -> Vec<u8> {
        ok(self.verb("restore", &[spec, "-", "-q"])).stdout
    }

    /// How many sessions `stats` lists as running.
    fn running(&self) -> usize {
        json(&ok(self.verb("stats", &["--json"])))["sessions"]
            .as_array()
            .map_or(0, Vec::len)
    }

    /// A backup of image `name` from standard input, fed the first 4 MiB
    /// of `image(_, seed)` and left running (its session registered);
    /// its standard error is piped.
    fn running_backup(&self, name: &str, seed: u64) -> (Child, std::process::ChildStdin) {
        let mut child = self
            .cmd()
            .args(["backup", "-", "--repo", &self.loc, "--name", name, "-q"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&image(4 << 20, seed)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.running() == 0 {
            assert!(
                Instant::now() < deadline,
                "the backup never showed as running"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        (child, stdin)
    }

    fn verify(&self) -> Value {
        let out = self.verb("verify", &["--read-data", "--json", "-q"]);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "verify printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// One line on stderr, a non-zero exit, no panic.
fn one_line_failure(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "succeeded: {err}");
    assert_ne!(out.status.code(), Some(101), "panicked: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

/// An image with runs of shared content (dedup), text (compression) and
/// noise; `seed` varies it.
fn image(len: usize, seed: u64) -> Vec<u8> {
    let mut v = mixed(len / 2, seed);
    v.extend(noise(len / 4, seed + 100));
    v.extend(vec![0u8; len / 8]);
    v.extend(mixed(len - v.len(), 7));
    v
}

/// A running `cairn serve` of a repository, on a unix socket.
struct Served {
    child: Child,
    sock: PathBuf,
}

impl Served {
    fn start(store: &Store, args: &[&str]) -> Served {
        let sock = store.dir.path().join("nbd.sock");
        let mut child = store
            .cmd()
            .args([
                "serve",
                "--repo",
                &store.loc,
                "--socket",
                sock.to_str().unwrap(),
            ])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let mut lines = BufReader::new(err).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        loop {
            assert!(Instant::now() < deadline, "serve not ready: {seen:?}");
            match lines.next() {
                Some(Ok(line)) => {
                    let ready = line.starts_with("cairn serve: exports:");
                    seen.push(line);
                    if ready {
                        break;
                    }
                }
                _ => panic!("serve ended: {seen:?}"),
            }
        }
        // Keep draining stderr so that serve never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Served { child, sock }
    }

    fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.sock.display())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

/// Every verb, on whatever backend `s` is.
fn every_verb(s: &Store) {
    let init = json(&ok(s.run(&["init", &s.loc, "--json"])));
    assert_eq!(init["repository"], s.loc.as_str(), "{init}");
    // A second init is refused, the first repository untouched.
    one_line_failure(&s.run(&["init", &s.loc]));

    let a1 = image(3 << 20, 1);
    let mut a2 = a1.clone();
    a2[1 << 20..(1 << 20) + 70_000].fill(0x5a);
    let b1 = image(2 << 20, 2);
    assert_eq!(s.backup("a", &a1)["snapshot"], 1);
    let j = s.backup("a", &a2);
    assert_eq!(j["snapshot"], 2);
    // Deduplicated, or zero runs left out (never stored either way).
    assert!(
        j["bytes_dedup"].as_u64().unwrap() + j["bytes_zero"].as_u64().unwrap() > 2 << 20,
        "a@2 deduplicates: {j}"
    );
    // From standard input.
    let mut child = s
        .cmd()
        .args([
            "backup", "-", "--repo", &s.loc, "--name", "b", "-q", "--json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&b1).unwrap();
    let j = json(&ok(child.wait_with_output().unwrap()));
    assert_eq!(j["snapshot"], 1);

    let ls = json(&ok(s.verb("ls", &["--json"])));
    assert_eq!(ls["snapshots"].as_array().unwrap().len(), 3, "{ls}");
    assert!(s.restore("a@1") == a1);
    assert!(s.restore("a") == a2);
    assert!(s.restore("b@latest") == b1);
    let out = s.dir.path().join("restored");
    ok(s.verb("restore", &["a@1", out.to_str().unwrap(), "-q"]));
    assert!(std::fs::read(&out).unwrap() == a1);

    let v = s.verify();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["snapshots"], 3, "{v}");
    let st = json(&ok(s.verb("stats", &["--json"])));
    assert_eq!(st["snapshots"], 3, "{st}");
    assert!(st["pack_bytes"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["unindexed_packs"], 0, "{st}");

    // diff: the one range a2 changed (its ends may match a1 by chance).
    let d = json(&ok(s.verb("diff", &["a@1", "a@2", "--json"])));
    let ranges = d["ranges"].as_array().unwrap();
    assert_eq!(ranges.len(), 1, "{d}");
    let (o, l) = (
        ranges[0]["offset"].as_u64().unwrap(),
        ranges[0]["len"].as_u64().unwrap(),
    );
    assert!(
        o >= 1 << 20 && o + l <= (1 << 20) + 70_000 && l > 69_000,
        "{d}"
    );

    // copy: every snapshot out of this store into a local repository
    // (from a bucket, records are fetched in spans as restore does).
    let local = s.dir.path().join("copied");
    let local = local.to_str().unwrap();
    ok(s.run(&["init", local, "--kdf-memory", "1M", "--kdf-iterations", "1"]));
    let copy = |args: &[&str]| {
        let out = s
            .cmd()
            .env("CAIRN_FROM_PASSWORD", PASSWORD)
            .args(["copy", "--from", &s.loc, "--repo", local, "--json"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        json(&ok(out))
    };
    let c = copy(&[]);
    assert_eq!(c["snapshots_copied"], 3, "{c}");
    let got = ok(s.run(&["restore", "a@2", "-", "-q", "--repo", local])).stdout;
    assert!(got == a2, "the copy of a@2 differs");
    let c = copy(&["a"]);
    assert_eq!(
        (
            c["snapshots_copied"].as_u64(),
            c["snapshots_skipped"].as_u64()
        ),
        (Some(0), Some(2)),
        "{c}"
    );

    // Served read-only: what NBD clients read is the image.
    if have("nbdcopy") {
        let srv = Served::start(s, &["--image", "a@1"]);
        let got = s.dir.path().join("served");
        let o = Command::new("nbdcopy")
            .args([&srv.uri("a@1"), got.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(std::fs::read(&got).unwrap() == a1, "served a@1 differs");
        if have("qemu-img") {
            let conv = s.dir.path().join("converted");
            let o = Command::new("qemu-img")
                .args(["convert", "-f", "raw", "-O", "raw", &srv.uri("a@1")])
                .arg(&conv)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert!(
                std::fs::read(&conv).unwrap() == a1,
                "qemu-img convert differs"
            );
        }
    }

    // Served writable: a FLUSH commits a new snapshot, in the same store;
    // a second writable open of the image is refused meanwhile.
    if have("qemu-io") {
        let srv = Served::start(s, &["--image", "b,rw"]);
        let o = Command::new("qemu-io")
            .args(["-f", "raw", "-t", "writeback"])
            .args(["-c", "write -P 0xab 100k 8k", "-c", "flush"])
            .arg(srv.uri("b"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let second = s
            .cmd()
            .args(["serve", "--repo", &s.loc, "--image", "b,rw"])
            .args([
                "--socket",
                s.dir.path().join("other.sock").to_str().unwrap(),
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&second.stderr);
        assert!(!second.status.success() && err.contains("lock"), "{err}");
        // Issue 16: a writable export of one image does not block a
        // backup of another (the lock is per image).
        let c = image(300_000, 9);
        ok(s.verb(
            "backup",
            &[s.file("c", &c).to_str().unwrap(), "-n", "c", "-q"],
        ));
        assert!(s.restore("c@1") == c, "c backed up while b is served rw");
        ok(s.verb("rm", &["c@1"]));
        drop(srv);
        let mut want = b1.clone();
        want[100 * 1024..108 * 1024].fill(0xab);
        assert!(s.restore("b@2") == want, "the flushed write is b@2");
        assert!(s.restore("b@1") == b1);
        ok(s.verb("rm", &["b@2"]));
    }

    // rm and gc: what is left still restores, and verifies.
    one_line_failure(&s.verb("rm", &["a"]));
    ok(s.verb("rm", &["a@1"]));
    let g = json(&ok(s.verb("gc", &["--json"])));
    assert_eq!(g["deferred"], false, "{g}");
    assert!(s.restore("a@2") == a2);
    assert!(s.restore("b") == b1);
    assert_eq!(s.verify()["ok"], true);

    // Retention: keep the newest of each image, then prune.
    ok(s.verb(
        "backup",
        &[
            s.file("b2", &image(1 << 20, 3)).to_str().unwrap(),
            "-n",
            "b",
            "-q",
        ],
    ));
    let f = json(&ok(
        s.verb("forget", &["--keep-last", "1", "--prune", "--json"])
    ));
    assert_eq!(f["forgotten"], 1, "{f}");
    let ls = json(&ok(s.verb("ls", &["--json"])));
    assert_eq!(ls["snapshots"].as_array().unwrap().len(), 2, "{ls}");
    assert_eq!(s.verify()["ok"], true);
}

/// Two backups of different images at once, as from two hosts, and a gc
/// beside a third: all succeed, all restore, nothing is lost.
fn writers_side_by_side(s: &Store) {
    ok(s.run(&["init", &s.loc]));
    let x = image(6 << 20, 11);
    let y = image(6 << 20, 12);
    let spawn = |name: &str, data: &[u8]| {
        let f = s.file(&format!("{name}.in"), data);
        s.cmd()
            .args([
                "backup",
                f.to_str().unwrap(),
                "--repo",
                &s.loc,
                "--name",
                name,
                "-q",
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (cx, cy) = (spawn("x", &x), spawn("y", &y));
    for c in [cx, cy] {
        assert_eq!(json(&ok(c.wait_with_output().unwrap()))["snapshot"], 1);
    }
    assert!(s.restore("x") == x);
    assert!(s.restore("y") == y);

    // A backup deduplicating against x, held open while x is removed and
    // gc'd: the gc defers, the backup commits, the next gc keeps x's packs.
    let mut held = s
        .cmd()
        .args([
            "backup", "-", "--repo", &s.loc, "--name", "z", "-q", "--json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = held.stdin.take().unwrap();
    stdin.write_all(&x[..2 << 20]).unwrap();
    // Wait for its session (stats lists the running ones).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = json(&ok(s.verb("stats", &["--json"])));
        let running = st["sessions"].as_array().unwrap();
        if running.iter().any(|r| r["what"] == "cairn backup z") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the backup never registered: {st}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    ok(s.verb("rm", &["x"]));
    let g = json(&ok(s.verb("gc", &["--json"])));
    assert_eq!(g["deferred"], true, "{g}");
    stdin.write_all(&x[2 << 20..]).unwrap();
    drop(stdin);
    assert_eq!(json(&ok(held.wait_with_output().unwrap()))["snapshot"], 1);
    let g = json(&ok(s.verb("gc", &["--json"])));
    assert_eq!(g["deferred"], false, "{g}");
    assert!(s.restore("z") == x);
    assert!(s.restore("y") == y);
    assert_eq!(s.verify()["ok"], true);
}

#[test]
fn every_verb_on_a_directory() {
    every_verb(&Store::local());
}

#[test]
fn writers_side_by_side_on_a_directory() {
    writers_side_by_side(&Store::local());
}

#[test]
fn every_verb_on_s3() {
    let Some(server) = SeaweedFs::start_or_skip() else {
        return;
    };
    every_verb(&Store::s3(&server, "verbs"));
}

/// Found from outside (2026-11-28): every command on an S3 repository
/// failed when the local cache directory could not be made; restic warns
/// and goes on, and so does cairn now.
#[test]
fn s3_without_a_usable_cache_directory_warns_and_goes_on() {
    let Some(server) = SeaweedFs::start_or_skip() else {
        return;
    };
    let s = Store::s3(&server, "nocache");
    ok(s.run(&["init", &s.loc]));
    let data = image(1 << 20, 31);
    s.backup("a", &data);
    // Below a regular file: no directory can be made there (as root too).
    let file = s.file("not-a-dir", b"x");
    let out = s
        .cmd()
        .env("CAIRN_CACHE_DIR", file.join("cache"))
        .args(["restore", "a", "-", "-q", "--repo", &s.loc])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(out.stdout == data);
    assert!(err.contains("cannot use the local cache"), "{err}");
}

/// Found by the repository audit (2026-11-29): a gc deferred by a
/// running reader left its packs to the next gc, which deleted them and
/// reported "0 pack(s) deleted, 0 B -> 0 B" (`--json`: `packs_deleted`
/// 0, `bytes_before` 0), as if there had been nothing to reclaim. It now
/// counts them apart: `earlier_packs_deleted`, `earlier_bytes_deleted`,
/// and `bytes_before` is what was on disk when it began.
#[test]
fn gc_reports_the_packs_it_deletes_for_an_earlier_gc() {
    let s = Store::local();
    ok(s.run(&["init", &s.loc, "--pack-size", "1M"]));
    let data = image(4 << 20, 41);
    s.backup("a", &data);
    // A restore into a pipe nobody reads yet: its session runs.
    let mut child = s
        .cmd()
        .args(["restore", "a", "-", "-q", "--repo", &s.loc])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.running() == 0 {
        assert!(Instant::now() < deadline, "the restore never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    ok(s.verb("rm", &["a", "--all"]));
    let g = json(&ok(s.verb("gc", &["--json"])));
    assert_eq!(g["deferred"], true, "{g}");
    let planned = g["packs_deleted"].as_u64().unwrap() + g["packs_repacked"].as_u64().unwrap();
    assert!(planned > 0, "{g}");
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(out == data);
    let on_disk = json(&ok(s.verb("stats", &["--json"])))["pack_bytes"]
        .as_u64()
        .unwrap();
    assert!(on_disk > 0);
    let g = json(&ok(s.verb("gc", &["--json"])));
    assert_eq!(g["deferred"], false, "{g}");
    assert_eq!(g["earlier_packs_deleted"], planned, "{g}");
    assert_eq!(g["earlier_bytes_deleted"], on_disk, "{g}");
    assert_eq!(g["bytes_before"], on_disk, "{g}");
    assert_eq!(g["bytes_after"], 0, "{g}");
    let out = ok(s.verb("gc", &[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("earlier gc"), "nothing left to delete: {err}");
}

/// Found by the repository audit (2026-11-29): two `cairn init` of one
/// S3 prefix at once (provisioning scripts on several hosts, each
/// running "init unless it exists", as restic users do) could both fail
/// and leave a config of one with the target marker of the other, a
/// repository no command opens, or leave the loser's key file, a key
/// that opens nothing, in the winner's repository. Now exactly one init
/// wins, the other fails in one line having written nothing.
#[test]
fn s3_inits_racing_for_one_prefix_leave_one_whole_repository() {
    let Some(server) = SeaweedFs::start_or_skip() else {
        return;
    };
    for round in 0..8 {
        let s = Store::s3(&server, &format!("race{round}"));
        let spawn = || {
            s.cmd()
                .args(["init", &s.loc])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(), spawn());
        let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
        let won = outs.iter().filter(|o| o.status.success()).count();
        assert_eq!(
            won,
            1,
            "round {round}: {:?}",
            outs.iter()
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .collect::<Vec<_>>()
        );
        for o in outs.iter().filter(|o| !o.status.success()) {
            one_line_failure(o);
        }
        let keys = json(&ok(s.verb("key", &["list", "--json"])));
        assert_eq!(
            keys["keys"].as_array().unwrap().len(),
            1,
            "round {round}: {keys}"
        );
        assert_eq!(
            keys["damaged"],
            serde_json::json!([]),
            "round {round}: {keys}"
        );
        let data = image(1 << 20, round);
        s.backup("a", &data);
        assert!(s.restore("a") == data, "round {round}");
    }
}

#[test]
fn writers_side_by_side_on_s3() {
    let Some(server) = SeaweedFs::start_or_skip() else {
        return;
    };
    writers_side_by_side(&Store::s3(&server, "writers/repo"));
}

/// The S3 server stops in the middle of a backup: the backup fails with
/// one line (retries exhausted) or succeeds (back in time); either way
/// the repository verifies and earlier snapshots restore.
#[test]
fn s3_server_stopped_mid_backup() {
    let Some(mut server) = SeaweedFs::start_or_skip() else {
        return;
    };
    let s = Store::s3(&server, "fault");
    ok(s.run(&["init", &s.loc]));
    let first = image(2 << 20, 21);
    s.backup("first", &first);

    let data = image(24 << 20, 22);
    let mut child = s
        .cmd()
        .args(["backup", "-", "--repo", &s.loc, "--name", "second", "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&data[..8 << 20]).unwrap();
    server.stop();
    // The rest goes in while the server is down (the pipe buffers some;
    // the writer blocks on the failed uploads, or fails).
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&data[8 << 20..]);
    });
    let out = child.wait_with_output().unwrap();
    let _ = feeder.join();
    let err = one_line_failure(&out);
    assert!(err.contains("s3://"), "the error names the object: {err}");
    server.start_again().unwrap();

    let v = s.verify();
    assert_eq!(v["ok"], true, "{v}");
    assert!(s.restore("first") == first);
    // And the repository takes the backup again.
    let again = image(4 << 20, 23);
    s.backup("second", &again);
    assert!(s.restore("second") == again);
}

/// A backup into a bucket killed with SIGKILL leaves its session and its
/// image's lock behind, refreshed no more: they are leases, taken for dead
/// only 15 minutes on. Left by a process of this machine that is gone,
/// they are seen dead at once: `stats` lists no running command, the
/// image takes a backup again, `repair` (which runs alone) runs, and a
/// writable serve killed too leaves no lock on its image.
#[test]
fn s3_backup_killed_on_this_machine_holds_nothing() {
    let Some(server) = SeaweedFs::start_or_skip() else {
        return;
    };
    let s = Store::s3(&server, "killed");
    ok(s.run(&["init", &s.loc]));
    let (mut child, mut stdin) = s.running_backup("vm", 31);
    // A pack or more in the bucket (packs close at 32 MiB).
    stdin.write_all(&image(40 << 20, 33)).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    child.kill().unwrap();
    child.wait().unwrap();
    drop(stdin);
    assert_eq!(s.running(), 0, "a killed backup still counts as running");
    // What it wrote is taken in by gc and, used by no snapshot, deleted.
    ok(s.verb("gc", &[]));
    let st = json(&ok(s.verb("stats", &["--json"])));
    assert_eq!(st["unindexed_packs"], 0, "{st}");
    assert_eq!(st["pack_bytes"], 0, "{st}");
    let data = image(3 << 20, 32);
    s.backup("vm", &data);
    assert!(s.restore("vm") == data);
    ok(s.verb("repair", &["-q"]));
    // A writable serve killed the same way leaves the image's lock: the
    // next writable serve takes it over.
    let mut srv = Served::start(&s, &["--image", "vm,rw"]);
    srv.child.kill().unwrap();
    srv.child.wait().unwrap();
    drop(srv);
    let srv = Served::start(&s, &["--image", "vm,rw"]);
    drop(srv);
    assert_eq!(s.running(), 0);
}

/// An object flipped or deleted in the bucket: `verify --read-data`
/// finds it and names the images it damages.
#[test]
fn s3_damage_is_found_and_named() {
    let Some(server) = SeaweedFs::start_or_skip() else {
        return;
    };
    let s = Store::s3(&server, "damage");
    ok(s.run(&["init", &s.loc, "--pack-size", "1M"]));
    let a = image(3 << 20, 31);
    let b = image(3 << 20, 32);
    s.backup("a", &a);
    s.backup("b", &b);
    assert_eq!(s.verify()["ok"], true);

    let env = server.env();
    let lookup = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let config = cairn_store::S3Config::new(&s.loc, &lookup).unwrap();
    let bucket = cairn_store::S3Backend::new(config).unwrap();
    use cairn_store::backend::{ReadBackend, WriteBackend};
    let packs: Vec<_> = bucket
        .list("data/packs/")
        .unwrap()
        .into_iter()
        .map(|l| l.key)
        .collect();
    assert!(packs.len() >= 2, "{packs:?}");

    // An index file flipped in the bucket after a restore cached it
    // locally: verify judges the bucket's copy, not the cache's (it said
    // ok while the cache held the sound one).
    assert_eq!(s.restore("a"), a);
    let index = bucket.list("index/").unwrap()[0].key.clone();
    let sound = bucket.get(&index).unwrap().unwrap();
    let mut flipped = sound.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 1;
    bucket.put(&index, &flipped).unwrap();
    let v = s.verify();
    assert_eq!(v["ok"], false, "{v}");
    bucket.put(&index, &sound).unwrap();
    assert_eq!(s.verify()["ok"], true);

    // A flipped byte in the middle of one pack.
    let mut data = bucket.get(&packs[0]).unwrap().unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0x20;
    bucket.put(&packs[0], &data).unwrap();
    let v = s.verify();
    assert_eq!(v["ok"], false, "{v}");
    let text = v.to_string();
    assert!(text.contains("\"image\""), "damaged images are named: {v}");

    // Another pack deleted.
    bucket.delete(&[packs[1].clone()]).unwrap();
    let v = s.verify();
    let problems = v["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p["message"].as_str().unwrap_or("").contains("missing")),
        "{v}"
    );
    let named: Vec<&str> = problems
        .iter()
        .flat_map(|p| p["affected"].as_array().into_iter().flatten())
        .filter_map(|a| a["image"].as_str())
        .collect();
    assert!(!named.is_empty(), "{v}");
}

/// A chunk stored twice in a bucket (its pack lost, the image backed up
/// again, the pack put back), one copy then damaged: the image restores
/// whole from the other copy, read through the spans a remote restore
/// fetches; verify names damaged copies only, and repair keeps every chunk.
#[test]
fn s3_a_chunk_stored_twice_is_read_from_its_sound_copy() {
    let Some(server) = SeaweedFs::start_or_skip() else {
        return;
    };
    let env = server.env();
    let lookup = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    use cairn_store::backend::{ReadBackend, WriteBackend};
    let a = image(8 << 20, 41);
    let s = Store::s3(&server, "twice");
    ok(s.run(&["init", &s.loc, "--pack-size", "1M"]));
    s.backup("a", &a);
    let config = cairn_store::S3Config::new(&s.loc, &lookup).unwrap();
    let bucket = cairn_store::S3Backend::new(config).unwrap();
    let packs = || -> Vec<_> {
        let mut v: Vec<_> = bucket
            .list("data/packs/")
            .unwrap()
            .into_iter()
            .map(|l| l.key)
            .collect();
        v.sort_by(|x, y| x.as_str().cmp(y.as_str()));
        v
    };
    let first = packs();
    assert!(first.len() >= 2, "{first:?}");
    let lost = first[0].clone();
    let bytes = bucket.get(&lost).unwrap().unwrap();
    bucket.delete(std::slice::from_ref(&lost)).unwrap();
    s.backup("a", &a);
    bucket.put(&lost, &bytes).unwrap();
    let again: Vec<_> = packs().into_iter().filter(|k| !first.contains(k)).collect();
    assert!(!again.is_empty(), "the lost pack's chunks are stored again");
    assert_eq!(s.verify()["ok"], true, "both copies sound");
    // Either copy damaged in turn (the same index, so one of the two is
    // the copy it uses), then put back as it was.
    let mut said_in = Vec::new();
    for (damaged, keys) in [
        ("the first copy", vec![lost.clone()]),
        ("the second", again),
    ] {
        let kept: Vec<_> = keys
            .iter()
            .map(|k| bucket.get(k).unwrap().unwrap())
            .collect();
        for (key, data) in keys.iter().zip(&kept) {
            let mut data = data.clone();
            let mid = data.len() / 2;
            data[mid] ^= 0x20;
            bucket.put(key, &data).unwrap();
        }
        for spec in ["a@1", "a@2"] {
            let out = ok(s.verb("restore", &[spec, "-", "-q", "-T", "2"]));
            assert!(out.stdout == a, "{damaged}: {spec} differs");
            let stderr = String::from_utf8_lossy(&out.stderr);
            match stderr.matches("read from its other copy").count() {
                0 => {}
                1 => said_in.push(damaged),
                _ => panic!("{damaged}: said once: {stderr}"),
            }
        }
        let v = s.verify();
        assert_eq!(v["ok"], false, "{damaged}: {v}");
        let problems = v["problems"].as_array().unwrap();
        assert!(
            !problems.is_empty() && problems.iter().all(|p| p["kind"] == "damaged-copy"),
            "{damaged}: {v}"
        );
        if damaged == "the second" {
            ok(s.verb("repair", &["--json", "-q"]));
        } else {
            for (key, data) in keys.iter().zip(&kept) {
                bucket.put(key, data).unwrap();
            }
        }
        assert_eq!(s.verify()["ok"], true, "{damaged}: put back or repaired");
    }
    assert_eq!(
        said_in.len(),
        2,
        "one damaged copy is the index's, read by both: {said_in:?}"
    );
    assert_eq!(said_in[0], said_in[1], "{said_in:?}");
    for spec in ["a@1", "a@2"] {
        assert!(s.restore(spec) == a, "repaired: {spec} differs");
    }
}

/// `cairn unlock` on a bucket: a running backup's session looks live and
/// is kept; `--remove-all` removes it (as for a process killed on
/// another machine), and the backup, still running, finds its session
/// gone and fails before it commits anything.
#[test]
fn s3_unlock_removes_what_looks_live_only_when_told() {
    let Some(server) = SeaweedFs::start_or_skip() else {
        return;
    };
    let s = Store::s3(&server, "unlock");
    ok(s.run(&["init", &s.loc]));
    let (child, mut stdin) = s.running_backup("vm", 41);
    let out = json(&ok(s.verb("unlock", &["--json"])));
    assert_eq!(out["removed"].as_array().unwrap().len(), 0, "{out}");
    let kept = out["kept"].as_array().unwrap();
    assert_eq!(kept.len(), 1, "{out}");
    assert_eq!(kept[0]["info"]["what"], "cairn backup vm", "{out}");
    assert_eq!(kept[0]["live"], true, "{out}");
    assert_eq!(s.running(), 1);
    let out = json(&ok(s.verb("unlock", &["--remove-all", "--json"])));
    let removed = out["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 1, "{out}");
    assert!(
        removed[0]["key"].as_str().unwrap().starts_with("sessions/"),
        "{out}"
    );
    assert_eq!(s.running(), 0);
    // The backup goes on to its end, and finds its session gone.
    stdin.write_all(&image(4 << 20, 42)).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "the backup committed on a removed session"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("removed or taken over by another process"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let ls = json(&ok(s.verb("ls", &["--json"])));
    assert_eq!(ls.as_array().map_or(0, Vec::len), 0, "{ls}");
    // Nothing left to remove.
    let out = json(&ok(s.verb("unlock", &["--json"])));
    assert_eq!(out["removed"].as_array().unwrap().len(), 0, "{out}");
    assert_eq!(out["kept"].as_array().unwrap().len(), 0, "{out}");
}

/// `cairn unlock` on a directory: a running writable serve's lock is a
/// kernel lock, kept even with --remove-all (status 1, naming it); the
/// file a killed one leaves is removed.
#[test]
fn unlock_on_a_directory_keeps_the_locks_of_running_processes() {
    let s = Store::local();
    ok(s.run(&["init", &s.loc]));
    s.backup("vm", &image(1 << 20, 43));
    let srv = Served::start(&s, &["--image", "vm,rw"]);
    // Without --remove-all: no hint that it would remove them.
    let out = s.verb("unlock", &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("--remove-all removes it"), "{text}");
    assert!(text.contains("held by a running process"), "{text}");
    let out = s.verb("unlock", &["--remove-all"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("kept") && text.contains("writing image vm"),
        "{text}"
    );
    let err = one_line_failure(&out);
    assert!(err.contains("running processes"), "{err}");
    drop(srv);
    // As a killed process leaves one: a file no process locks.
    let left = std::path::Path::new(&s.loc).join("sessions/0123456789abcdef0123456789abcdef");
    std::fs::write(
        &left,
        br#"{"what":"cairn backup vm","pid":1,"host":"h","started":0}"#,
    )
    .unwrap();
    let out = json(&ok(s.verb("unlock", &["--json"])));
    let removed = out["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 1, "{out}");
    assert_eq!(removed[0]["live"], false, "{out}");
    assert!(!left.exists());
    assert_eq!(out["kept"].as_array().unwrap().len(), 0, "{out}");
}
