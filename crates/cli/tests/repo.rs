//! The repository commands end to end with the real binary: block devices
//! (loop devices) as source and destination, O_DIRECT, stdin, and the
//! report commands' JSON.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    cairn().args(args).output().unwrap()
}

/// A loop device over `file`, detached on drop.
struct Loop(String);

impl Loop {
    fn attach(file: &Path) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output();
        match out {
            Ok(o) if o.status.success() => {
                Some(Loop(String::from_utf8_lossy(&o.stdout).trim().to_string()))
            }
            other => {
                let why = format!("{other:?}");
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("cannot attach a loop device under CI: {why}");
                }
                eprintln!("skipping: no loop device ({why})");
                None
            }
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// `verify --read-data` finds nothing wrong.
fn verify_clean(repo: &str) {
    let v = json(&ok(run(&[
        "verify",
        "--repo",
        repo,
        "--read-data",
        "--json",
    ])));
    assert_eq!(v["ok"], true, "{v}");
}

/// An image with data, a hole and a size that is no multiple of anything.
fn image(len: usize) -> Vec<u8> {
    let mut v = mixed(len, 77);
    v[len / 3..len / 3 + (1 << 20)].fill(0);
    v
}

#[test]
fn block_devices_in_and_out() {
    let dir = tempdir();
    let d = dir.path();
    // Loop devices need a multiple of 512 bytes.
    let data = image(6 << 20);
    std::fs::write(d.join("disk.img"), &data).unwrap();
    std::fs::write(d.join("blank.img"), vec![0xAAu8; data.len()]).unwrap();
    let Some(src) = Loop::attach(&d.join("disk.img")) else {
        return;
    };
    let Some(dst) = Loop::attach(&d.join("blank.img")) else {
        return;
    };
    let repo = d.join("repo");
    let repo = repo.to_str().unwrap();
    ok(run(&["init", repo]));
    for (name, extra) in [("dev", None), ("direct", Some("--direct"))] {
        let mut args = vec![
            "backup", &src.0, "--repo", repo, "--name", name, "-q", "--json",
        ];
        args.extend(extra);
        let out = ok(run(&args));
        let j = json(&out);
        assert_eq!(
            j["bytes_in"],
            data.len() as u64,
            "size of the device by ioctl"
        );
        assert!(j["bytes_zero"].as_u64().unwrap() >= 1 << 19, "{j}");
    }
    // To a block device: only with -f, as over an existing file, and
    // not while another program holds it (as a mount does).
    let out = run(&["restore", "direct", &dst.0, "--repo", repo, "-q"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("use -f"));
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _held = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(&dst.0)
            .unwrap();
        let out = run(&["restore", "direct", &dst.0, "--repo", repo, "-q", "-f"]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
    }
    assert!(std::fs::read(d.join("blank.img")).unwrap() == vec![0xAAu8; data.len()]);
    // Every byte written, holes included (the blank device is not zero).
    ok(run(&[
        "restore", "direct", &dst.0, "--repo", repo, "-q", "-f",
    ]));
    drop(dst);
    assert!(std::fs::read(d.join("blank.img")).unwrap() == data);
    // A device smaller than the image is refused.
    std::fs::write(d.join("small.img"), vec![0u8; 1 << 20]).unwrap();
    let Some(small) = Loop::attach(&d.join("small.img")) else {
        return;
    };
    let out = run(&["restore", "dev", &small.0, "--repo", repo, "-q", "-f"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("device has"));
}

/// A regular file read with O_DIRECT through reads queued ahead, whose
/// size is no multiple of the alignment: every queue shape reads it whole,
/// blocks copied out (under 8M) or cut where they were read (8M and up).
#[test]
fn direct_reads_queued_ahead_read_a_file_whole() {
    let dir = tempdir();
    let d = dir.path();
    let data = image((17 << 20) + 4097);
    let src = d.join("disk.img");
    std::fs::write(&src, &data).unwrap();
    let repo = d.join("repo");
    let repo = repo.to_str().unwrap();
    ok(run(&["init", repo]));
    for (i, (block, depth)) in [
        ("4K", "1"),
        ("64K", "3"),
        ("1M", "8"),
        ("4M", "64"),
        ("8M", "1"),
        ("8M", "8"),
        ("12M", "2"),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("d{i}");
        let out = ok(run(&[
            "backup",
            src.to_str().unwrap(),
            "--repo",
            repo,
            "--name",
            &name,
            "--direct",
            "--read-block",
            block,
            "--read-depth",
            depth,
            "-q",
            "--json",
        ]));
        assert_eq!(json(&out)["bytes_in"], data.len() as u64);
        if i > 0 {
            // Cut exactly as the first: every chunk is already stored.
            assert_eq!(json(&out)["new_chunks"], 0, "{block} x {depth}");
        }
        let dest = d.join(format!("{name}.out"));
        ok(run(&[
            "restore",
            &name,
            dest.to_str().unwrap(),
            "--repo",
            repo,
            "-q",
        ]));
        assert!(std::fs::read(&dest).unwrap() == data, "{block} x {depth}");
    }
    let bad = run(&[
        "backup",
        src.to_str().unwrap(),
        "--repo",
        repo,
        "--name",
        "x",
        "--direct",
        "--read-block",
        "5000",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("multiple of 4096"));
    verify_clean(repo);
}

#[test]
fn stdin_files_and_reports() {
    let dir = tempdir();
    let d = dir.path();
    let repo = d.join("repo");
    let repo = repo.to_str().unwrap();
    ok(run(&[
        "init",
        repo,
        "--target",
        d.join("t0").to_str().unwrap(),
        "--target",
        d.join("t1").to_str().unwrap(),
        "--pack-size",
        "1M",
    ]));
    let a = image(5_000_001);
    let mut b = a.clone();
    b[4_000_000..4_000_100].fill(9);
    b.extend_from_slice(b"tail");
    let out = cairn_pipe(
        &[
            "backup", "-", "--repo", repo, "--name", "a", "-q", "--json", "-c", "lz4",
        ],
        &a,
    );
    let first = json(&ok(out));
    assert_eq!(first["snapshot"], 1);
    std::fs::write(d.join("b.img"), &b).unwrap();
    let second = json(&ok(run(&[
        "backup",
        d.join("b.img").to_str().unwrap(),
        "--repo",
        repo,
        "--name",
        "a",
        "-q",
        "--json",
    ])));
    assert_eq!(second["snapshot"], 2);
    assert!(
        second["bytes_new_raw"].as_u64().unwrap() < 600_000,
        "{second}"
    );
    let other = mixed(3_000_000, 5);
    ok(cairn_pipe(
        &["backup", "-", "--repo", repo, "--name", "other", "-q"],
        &other,
    ));

    // Both snapshots, to a file and to stdout.
    let out_file = d.join("a1.img");
    ok(run(&[
        "restore",
        "a@1",
        out_file.to_str().unwrap(),
        "--repo",
        repo,
        "-q",
    ]));
    assert!(std::fs::read(&out_file).unwrap() == a);
    let out = ok(run(&["restore", "a", "-", "--repo", repo, "-q"]));
    assert!(out.stdout == b);
    // An existing file is not overwritten without -f.
    let again = run(&[
        "restore",
        "a@1",
        out_file.to_str().unwrap(),
        "--repo",
        repo,
        "-q",
    ]);
    assert!(!again.status.success());
    ok(run(&[
        "restore",
        "a@1",
        out_file.to_str().unwrap(),
        "--repo",
        repo,
        "-q",
        "-f",
    ]));

    let ls = json(&ok(run(&["ls", "--repo", repo, "--json"])));
    let snaps = ls["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 3);
    assert_eq!(snaps[0]["name"], "a");
    assert_eq!(snaps[0]["size"], a.len() as u64);
    assert_eq!(snaps[1]["size"], b.len() as u64);
    let stats = json(&ok(run(&["stats", "--repo", repo, "--json"])));
    assert_eq!(stats["images"], 2);
    assert_eq!(stats["snapshots"], 3);
    // 32 bytes an entry, and a 4-byte bucket per 4-8 entries.
    let per_chunk = stats["index_heap_bytes_per_chunk"].as_f64().unwrap();
    assert!((32.0..34.0).contains(&per_chunk), "{per_chunk}");
    let targets = stats["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2);
    assert!(
        targets.iter().all(|t| t["packs"].as_u64().unwrap() > 0),
        "both targets get packs: {stats}"
    );
    verify_clean(repo);

    // rm + gc give space back and leave the rest restorable.
    ok(run(&["rm", "other", "--repo", repo]));
    ok(run(&["rm", "a@1", "--repo", repo]));
    // The bytes of the chunks still used count once each, also those
    // that a removed snapshot stored and a kept one deduplicated against.
    let stats = json(&ok(run(&["stats", "--repo", repo, "--json"])));
    let kept = json(&ok(run(&["ls", "a", "--repo", repo, "--json"])));
    let unique = stats["unique_raw_bytes"].as_u64().unwrap();
    let want = b.len() as u64 - kept["snapshots"][0]["zero_bytes"].as_u64().unwrap_or(0);
    assert!(unique >= want / 10 * 9 && unique <= want, "{want}: {stats}");
    let gc = json(&ok(run(&["gc", "--repo", repo, "--json"])));
    assert!(
        gc["bytes_after"].as_u64().unwrap() < gc["bytes_before"].as_u64().unwrap(),
        "{gc}"
    );
    assert!(
        gc["chunks_after"].as_u64().unwrap() < gc["chunks_before"].as_u64().unwrap(),
        "{gc}"
    );
    verify_clean(repo);
    let out = ok(run(&["restore", "a@2", "-", "--repo", repo, "-q"]));
    assert!(out.stdout == b);
    let ls = json(&ok(run(&["ls", "--repo", repo, "--json"])));
    assert_eq!(ls["snapshots"].as_array().unwrap().len(), 1);
    // A second gc finds nothing to do (and -q is taken, as by the other
    // long verbs).
    let gc = json(&ok(run(&["gc", "--repo", repo, "--json", "-q"])));
    assert_eq!(gc["bytes_after"], gc["bytes_before"]);
}

#[test]
fn repo_from_the_environment_and_fixed_chunks() {
    let dir = tempdir();
    let repo = dir.path().join("r");
    ok(run(&["init", repo.to_str().unwrap()]));
    let data = mixed(1_000_003, 9);
    let out = cairn()
        .env("CAIRN_REPO", &repo)
        .args([
            "backup",
            "-",
            "--name",
            "x",
            "--chunker",
            "fixed:4K",
            "-q",
            "--json",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(&data)?;
            c.wait_with_output()
        })
        .unwrap();
    let j = json(&ok(out));
    assert_eq!(j["chunker"], "fixed:4096");
    assert_eq!(
        j["chunks"].as_u64().unwrap() + j["bytes_zero"].as_u64().unwrap() / 4096,
        245
    );
    let out = ok(cairn()
        .env("CAIRN_REPO", &repo)
        .args(["restore", "x", "-", "-q"])
        .output()
        .unwrap());
    assert!(out.stdout == data);
}

#[test]
fn a_sparse_file_is_read_by_its_data_and_restored_sparse() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let dir = tempdir();
    let d = dir.path();
    let repo = d.join("repo");
    let repo = repo.to_str().unwrap();
    ok(run(&["init", repo]));
    // 64 GiB with 3 MB of data: reading its holes would take minutes, and
    // the report must say they were skipped.
    let size = 64u64 << 30;
    let src = d.join("sparse.img");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(size).unwrap();
    let pieces = [
        (0u64, mixed(1 << 20, 1)),
        (40 << 30, image(3_000_001)),
        (size - 4096, mixed(4096, 2)),
    ];
    for (at, bytes) in &pieces {
        f.write_all_at(bytes, *at).unwrap();
    }
    drop(f);
    let j = json(&ok(run(&[
        "backup",
        src.to_str().unwrap(),
        "--repo",
        repo,
        "--name",
        "sparse",
        "-q",
        "--json",
    ])));
    assert_eq!(j["bytes_in"], size, "{j}");
    let skipped = j["bytes_skipped"].as_u64().unwrap();
    assert!(skipped > size - (8 << 20), "{j}");
    assert!(j["bytes_zero"].as_u64().unwrap() >= skipped, "{j}");
    // The same file as a redirected stdin: read the same way, and the
    // same chunks (nothing new to store).
    let again = cairn()
        .args([
            "backup", "-", "--repo", repo, "--name", "sparse", "-q", "--json",
        ])
        .stdin(std::fs::File::open(&src).unwrap())
        .output()
        .unwrap();
    let again = json(&ok(again));
    assert_eq!(again["bytes_in"], size, "{again}");
    assert_eq!(again["bytes_skipped"], skipped, "{again}");
    assert_eq!(again["bytes_new_raw"], 0, "{again}");
    // Restored sparse, byte for byte.
    let out = d.join("out.img");
    ok(run(&[
        "restore",
        "sparse",
        out.to_str().unwrap(),
        "--repo",
        repo,
        "-q",
    ]));
    let meta = std::fs::metadata(&out).unwrap();
    assert_eq!(meta.len(), size);
    assert!(
        meta.blocks() * 512 < 64 << 20,
        "restored sparse: {} blocks",
        meta.blocks()
    );
    let restored = std::fs::File::open(&out).unwrap();
    for (at, bytes) in &pieces {
        let mut got = vec![0u8; bytes.len()];
        restored.read_exact_at(&mut got, *at).unwrap();
        assert!(&got == bytes, "data at {at}");
    }
    let mut gap = vec![1u8; 1 << 20];
    restored.read_exact_at(&mut gap, 20 << 30).unwrap();
    assert!(gap.iter().all(|&b| b == 0));
    verify_clean(repo);
}

/// Every path under `dir` with its length, sorted.
fn deep_listing(dir: &Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                todo.push(e.path());
            }
            out.push((e.path(), meta.len()));
        }
    }
    out.sort();
    out
}

/// The one line of a failed command's stderr.
/// A repository in `d`/repo holding `img`, 3 MiB (in two groups); its
/// path.
fn repo_with_img(d: &Path) -> String {
    let repo = d.join("repo");
    let repo = repo.to_str().unwrap();
    ok(run(&["init", repo]));
    std::fs::write(d.join("img"), image(3 << 20)).unwrap();
    ok(run(&[
        "backup",
        s(&d.join("img")),
        "--repo",
        repo,
        "--name",
        "img",
        "-q",
    ]));
    repo.to_string()
}

fn one_line_failure(out: &Output) -> String {
    assert!(!out.status.success(), "should have failed");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    err
}

/// Outside QA: with standard output a pipe's read end (`cmd >&0` in a
/// pipeline), the restore handed its buffers to `vmsplice`, which on a
/// descriptor open for reading reads the pipe: it waited for the pipe's
/// writers to go. It fails at once with the write's EBADF.
#[test]
fn a_restore_to_a_pipes_read_end_fails_at_once() {
    let dir = tempdir();
    let repo = repo_with_img(dir.path());
    let repo = repo.as_str();
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both are fresh descriptors of this process, owned once.
    let (read_end, write_end) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    let mut child = cairn()
        .args(["restore", "img", "-", "--repo", repo, "-q"])
        .stdout(std::process::Stdio::from(read_end))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The pipe keeps a writer (this test) all along.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the restore waited on its own output");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    drop(write_end);
    let out = child.wait_with_output().unwrap();
    assert!(!status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Bad file descriptor"), "{err}");
}

/// Regression: `cairn init` with a target it cannot create left the
/// repository directory half made (index/, snapshots/, no config).
#[test]
fn a_restore_that_cannot_write_names_its_destination() {
    // The store's error names the image offset; the line says where the
    // bytes were going (it did not).
    let dir = tempdir();
    let repo = repo_with_img(dir.path());
    let repo = repo.as_str();
    let out = run(&["restore", "img", "/dev/full", "--repo", repo, "-q"]);
    let line = one_line_failure(&out);
    assert!(
        line.contains("restore to /dev/full") && line.contains("No space left"),
        "{line}"
    );
}

#[test]
fn failed_init_leaves_nothing_behind() {
    let dir = tempdir();
    let d = dir.path();
    std::fs::write(d.join("file"), b"x").unwrap();
    let repo = d.join("repo");
    let out = run(&[
        "init",
        repo.to_str().unwrap(),
        "--target",
        d.join("new-target").to_str().unwrap(),
        "--target",
        d.join("file/t").to_str().unwrap(),
    ]);
    let line = one_line_failure(&out);
    assert!(line.contains("file/t"), "{line}");
    assert_eq!(listing(d), vec!["file".to_string()]);
}

/// Regression: a copy (`cp -a`) of a repository whose targets are
/// absolute paths wrote into the original's targets.
#[test]
fn a_copied_repository_is_refused_and_the_original_works() {
    let dir = tempdir();
    let d = dir.path();
    let (repo, copy, t0) = (d.join("repo"), d.join("copy"), d.join("t0"));
    let repo_s = repo.to_str().unwrap();
    ok(run(&["init", repo_s, "--target", t0.to_str().unwrap()]));
    let a = image(3_000_000);
    ok(cairn_pipe(
        &["backup", "-", "--repo", repo_s, "--name", "a", "-q"],
        &a,
    ));
    let before = deep_listing(&t0);
    let st = Command::new("cp").arg("-a").arg(&repo).arg(&copy).status();
    assert!(st.unwrap().success());
    let copy_s = copy.to_str().unwrap();
    for args in [
        vec!["backup", "-", "--repo", copy_s, "--name", "b", "-q"],
        vec!["gc", "--repo", copy_s],
        vec!["ls", "--repo", copy_s],
    ] {
        let line = one_line_failure(&cairn_pipe(&args, &a[..1000]));
        assert!(line.contains(t0.to_str().unwrap()), "{line}");
        assert!(line.contains("is a copy of it"), "{line}");
    }
    assert_eq!(deep_listing(&t0), before);
    verify_clean(repo_s);
    let out = ok(run(&["restore", "a", "-", "--repo", repo_s, "-q"]));
    assert!(out.stdout == a);
}

/// Issue 16: nothing pruned snapshots by policy, and `cairn rm NAME`
/// silently deleted every snapshot of an image. Backups with --time, then
/// forget by restic's rules: the dry run changes nothing, the real run
/// forgets exactly the snapshots the policy does not keep, and the kept
/// ones restore.
#[test]
fn forget_keeps_by_policy_and_rm_needs_all() {
    let dir = tempdir();
    let repo = dir.path().join("repo");
    let r = repo.to_str().unwrap();
    ok(run(&["init", r]));
    let src = dir.path().join("img");
    // Two backups a day for four days, 06:00 and 18:00 UTC.
    let mut contents = Vec::new();
    for day in 1..=4 {
        for hour in [6, 18] {
            let data = image((4 << 20) + contents.len() * 4096);
            std::fs::write(&src, &data).unwrap();
            let time = format!("2026-03-{day:02}T{hour:02}:00:00Z");
            ok(run(&[
                "backup",
                src.to_str().unwrap(),
                "--repo",
                r,
                "--name",
                "vm",
                "--time",
                &time,
                "-q",
            ]));
            contents.push(data);
        }
    }
    ok(run(&[
        "backup",
        src.to_str().unwrap(),
        "--repo",
        r,
        "--name",
        "other",
        "-q",
    ]));
    // rm of an image with several snapshots refuses without --all.
    let out = run(&["rm", "vm", "--repo", r]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("8 snapshots") && err.contains("--all"),
        "{err}"
    );
    // No rule: refused.
    assert!(!run(&["forget", "--repo", r]).status.success());
    let policy = [
        "forget",
        "vm",
        "--repo",
        r,
        "--keep-daily",
        "2",
        "--keep-last",
        "1",
    ];
    // Dry run: verdicts, nothing removed.
    let v = json(&ok(run(&[&policy[..], &["--dry-run", "--json"]].concat())));
    let keep: Vec<u64> = v["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["keep"] == true)
        .map(|s| s["snapshot"].as_u64().unwrap())
        .collect();
    // Days 4 and 3: their 18:00 backups, 8 and 6; last: 8.
    assert_eq!(
        {
            let mut k = keep.clone();
            k.sort_unstable();
            k
        },
        vec![6, 8],
        "{v}"
    );
    assert_eq!(v["forgotten"], 6, "{v}");
    let ls = json(&ok(run(&["ls", "vm", "--repo", r, "--json"])));
    assert_eq!(
        ls["snapshots"].as_array().map(Vec::len),
        Some(8),
        "dry run removed: {ls}"
    );
    // The real run, with prune.
    // (-q as for the other long verbs: gc's steps are not drawn.)
    ok(run(&[&policy[..], &["--prune", "-q"]].concat()));
    let ls = json(&ok(run(&["ls", "vm", "--repo", r, "--json"])));
    let left: Vec<u64> = ls["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot"].as_u64().unwrap())
        .collect();
    assert_eq!(left, vec![6, 8], "{ls}");
    for (snap, want) in [(6, &contents[5]), (8, &contents[7])] {
        let out = ok(run(&["restore", &format!("vm@{snap}"), "-", "--repo", r]));
        assert!(out.stdout == *want, "vm@{snap} restores other bytes");
    }
    // The other image was not touched; verify is clean after the prune.
    let ls = json(&ok(run(&["ls", "other", "--repo", r, "--json"])));
    assert_eq!(ls["snapshots"].as_array().map(Vec::len), Some(1), "{ls}");
    verify_clean(r);
    ok(run(&["rm", "vm", "--all", "--repo", r]));
}

/// `ls` states the group size each snapshot's new chunks were written in
/// (manifest version 3): the default, `--group 64K`, `--group 0` (each
/// chunk alone), in the table and in `--json`.
#[test]
fn ls_states_each_snapshots_group_size() {
    let dir = tempdir();
    let repo = dir.path().join("r");
    let r = s(&repo);
    ok(run(&["init", r]));
    let src = dir.path().join("img");
    for (i, group) in ["2M", "64K", "0"].into_iter().enumerate() {
        std::fs::write(&src, image(3 << 20 | i)).unwrap();
        let name = format!("g{i}");
        ok(run(&[
            "backup",
            s(&src),
            "--repo",
            r,
            "--name",
            &name,
            "--group",
            group,
            "-q",
        ]));
    }
    let ls = json(&ok(run(&["ls", "--repo", r, "--json"])));
    let groups: Vec<_> = ls["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["group"].as_u64())
        .collect();
    assert_eq!(groups, vec![Some(2 << 20), Some(64 << 10), Some(0)], "{ls}");
    let table = String::from_utf8(ok(run(&["ls", "--repo", r])).stdout).unwrap();
    // The column is right-aligned under its heading.
    let end = table.find("GROUP").unwrap() + "GROUP".len();
    let column: Vec<&str> = table
        .lines()
        .skip(1)
        .map(|l| l.get(end - 6..end).unwrap_or("").trim())
        .collect();
    assert_eq!(column, ["2M", "64K", "chunk"], "{table}");
}

/// A repository whose directory the user may not enter is a permission
/// error, not "not a cairn repository" (restic says the same).
#[test]
fn a_repository_not_readable_says_so() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempdir();
    let repo = dir.path().join("repo");
    ok(plain()
        .args(["init", s(&repo), "--encryption", "none"])
        .output()
        .unwrap());
    let mut ls = plain();
    ls.args(["ls", "--repo", s(&repo)]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Root enters any directory: ls runs as nobody.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        ls.uid(65534).gid(65534).env("HOME", "/tmp");
    } else {
        std::fs::set_permissions(&repo, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let out = ls.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let _ = std::fs::set_permissions(&repo, std::fs::Permissions::from_mode(0o700));
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("config: open: Permission denied"), "{err}");
    assert!(!err.contains("not a cairn repository"), "{err}");
}

/// A file written to while it is read is stored as read, and said (as
/// tar's "file changed as we read it"); one left alone is not, nor a
/// /proc or /sys file, whose size by stat (0, 4096) is not what it reads.
#[test]
fn a_source_that_changed_while_read_is_warned_of() {
    let dir = tempdir();
    let repo = dir.path().join("repo");
    ok(run(&["init", s(&repo)]));
    let file = dir.path().join("f");
    std::fs::write(&file, mixed(16 << 20, 3)).unwrap();
    // Appended to from before the backup starts until after it ends.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (file, stop) = (file.clone(), stop.clone());
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&file)
                .unwrap();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 64 << 20 {
                f.write_all(&[7; 4096]).unwrap();
                n += 4096;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(20));
    let out = ok(run(&[
        "backup",
        s(&file),
        "--repo",
        s(&repo),
        "-n",
        "f",
        "--json",
    ]));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("f changed during the backup (") && err.contains("f@1 holds what was read"),
        "{err}"
    );
    assert_eq!(json(&out)["source_size_changed"], true);
    let mut sources = vec![file.display().to_string(), "/proc/self/status".to_string()];
    if Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
        sources.push("/sys/kernel/mm/transparent_hugepage/enabled".into());
    }
    for src in &sources {
        let out = ok(run(&[
            "backup",
            src,
            "--repo",
            s(&repo),
            "-n",
            "g",
            "--json",
        ]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("changed"), "{src}: {err}");
        assert_eq!(json(&out)["source_size_changed"], false, "{src}");
    }
}
