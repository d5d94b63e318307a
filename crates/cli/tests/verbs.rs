//! Tags, diff and copy with the real binary (issue 16, item 4): tags
//! round-trip through backup, ls and forget; diff lists exactly the
//! ranges a test changed; copy moves snapshots between repositories of
//! different keys (and plain ones) byte for byte, and a second copy skips
//! what the first copied; forget keeps what restic's forget keeps, run
//! beside it on the same snapshots.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

mod common;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const OTHER_PASSWORD: &str = "another test password";

fn go(cmd: &mut Command, args: &[&str]) -> Output {
    cmd.env_remove("CAIRN_REPO")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A failure with exit status 1 and one line on stderr naming `what`.
fn fails_with(out: &Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(what), "{what:?} not in: {err}");
}

/// A new repository (cheap key derivation): encrypted with `password`,
/// or plain with `None`.
fn init(dir: &Path, name: &str, password: Option<&str>) -> String {
    let repo = dir.join(name);
    let r = s(&repo).to_string();
    match password {
        Some(p) => ok(go(
            cairn().env("CAIRN_PASSWORD", p),
            &["init", &r, "--kdf-memory", "1M", "--kdf-iterations", "1"],
        )),
        None => ok(go(&mut plain(), &["init", &r, "--encryption", "none"])),
    };
    r
}

/// `cairn` for a repository with `password` (plain: `None`), and no
/// password for a `copy --from` repository from the caller's environment.
fn with(password: Option<&str>) -> Command {
    let mut c = match password {
        Some(p) => {
            let mut c = cairn();
            c.env("CAIRN_PASSWORD", p);
            c
        }
        None => plain(),
    };
    c.env_remove("CAIRN_FROM_PASSWORD")
        .env_remove("CAIRN_FROM_PASSWORD_FILE")
        .env_remove("CAIRN_FROM_PASSWORD_COMMAND");
    c
}

fn backup(repo: &str, pw: Option<&str>, file: &Path, name: &str, extra: &[&str]) -> Value {
    let mut args = vec!["backup", s(file), "-r", repo, "-n", name, "--json"];
    args.extend(extra);
    json(&ok(go(&mut with(pw), &args)))
}

fn ls(repo: &str, pw: Option<&str>, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["ls", "-r", repo, "--json"];
    args.extend(extra);
    json(&ok(go(&mut with(pw), &args)))["snapshots"]
        .as_array()
        .unwrap()
        .clone()
}

/// (name, snapshot) of `ls` rows.
fn ids(rows: &[Value]) -> Vec<(String, u64)> {
    rows.iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["snapshot"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn snaps(v: &[(&str, u64)]) -> Vec<(String, u64)> {
    v.iter().map(|(n, s)| (n.to_string(), *s)).collect()
}

#[test]
fn tags_round_trip_through_backup_ls_and_forget() {
    let dir = tempdir();
    let repo = init(dir.path(), "r", Some(PASSWORD));
    let pw = Some(PASSWORD);
    let img = dir.path().join("img");
    std::fs::write(&img, mixed(300_000, 1)).unwrap();
    backup(
        &repo,
        pw,
        &img,
        "vm",
        &["--tag", "daily", "--tag", "host1", "--time", "@1000000"],
    );
    backup(
        &repo,
        pw,
        &img,
        "vm",
        &["--tag", "weekly,host1", "--time", "@2000000"],
    );
    backup(&repo, pw, &img, "vm", &["--time", "@3000000"]);
    backup(
        &repo,
        pw,
        &img,
        "db",
        &["--tag", "daily", "--time", "@1500000"],
    );

    let all = ls(&repo, pw, &[]);
    let tags: Vec<Vec<String>> = all
        .iter()
        .map(|r| {
            r["tags"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(
        tags,
        vec![
            vec!["daily".to_string()],
            vec!["daily".to_string(), "host1".to_string()],
            vec!["weekly".to_string(), "host1".to_string()],
            vec![],
        ]
    );
    let text = String::from_utf8(ok(go(&mut with(pw), &["ls", "-r", &repo])).stdout).unwrap();
    assert!(text.lines().next().unwrap().ends_with("TAGS"), "{text}");
    assert!(text.contains("weekly,host1"), "{text}");

    // restic's rule: a,b is both; repeated --tag is either.
    assert_eq!(
        ids(&ls(&repo, pw, &["--tag", "daily"])),
        snaps(&[("db", 1), ("vm", 1)])
    );
    assert_eq!(
        ids(&ls(&repo, pw, &["--tag", "host1"])),
        snaps(&[("vm", 1), ("vm", 2)])
    );
    assert_eq!(
        ids(&ls(&repo, pw, &["--tag", "daily,host1"])),
        snaps(&[("vm", 1)])
    );
    assert!(ls(&repo, pw, &["--tag", "daily,weekly"]).is_empty());
    assert_eq!(
        ids(&ls(&repo, pw, &["--tag", "daily,host1", "--tag", "weekly"])),
        snaps(&[("vm", 1), ("vm", 2)])
    );

    // forget --tag: the policy sees only vm@1 and vm@2 (keeps vm@2);
    // vm@3, newer and untagged, is not the policy's to keep or forget,
    // and db@1 (no host1) is untouched.
    let out = json(&ok(go(
        &mut with(pw),
        &[
            "forget",
            "-r",
            &repo,
            "--tag",
            "host1",
            "--keep-last",
            "1",
            "--json",
        ],
    )));
    let verdicts: Vec<(String, u64, bool)> = out["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_string(),
                v["snapshot"].as_u64().unwrap(),
                v["keep"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        vec![("vm".to_string(), 2, true), ("vm".to_string(), 1, false)]
    );
    assert_eq!(
        ids(&ls(&repo, pw, &[])),
        snaps(&[("db", 1), ("vm", 2), ("vm", 3)])
    );

    // A bad tag is one line and exit 1, before anything is written.
    fails_with(
        &go(
            &mut with(pw),
            &["backup", s(&img), "-r", &repo, "-n", "vm", "--tag", "a b"],
        ),
        "bad tag",
    );
    fails_with(
        &go(&mut with(pw), &["ls", "-r", &repo, "--tag", "x,"]),
        "bad tag",
    );
    assert_eq!(ls(&repo, pw, &[]).len(), 3);
    // An image no snapshot has is an error, as in restore; one whose
    // snapshots the tags leave out is an empty list.
    fails_with(
        &go(&mut with(pw), &["ls", "-r", &repo, "nope"]),
        "no image named \"nope\"",
    );
    assert!(ls(&repo, pw, &["vm", "--tag", "absent"]).is_empty());
}

/// `cairn tag` changes the tags of committed snapshots (restic's tag),
/// in an encrypted repository (the manifest is sealed again), and
/// `forget --keep-tag` keeps what carries them.
#[test]
fn tag_changes_tags_and_forget_keep_tag_keeps_them() {
    let dir = tempdir();
    let repo = init(dir.path(), "r", Some(PASSWORD));
    let pw = Some(PASSWORD);
    let img = dir.path().join("img");
    std::fs::write(&img, mixed(300_000, 2)).unwrap();
    for t in ["@1000000", "@2000000", "@3000000", "@4000000"] {
        backup(&repo, pw, &img, "vm", &["--time", t, "--tag", "daily"]);
    }
    let tags_of = |n: u64| -> Vec<String> {
        ls(&repo, pw, &[])
            .iter()
            .find(|r| r["snapshot"] == n)
            .unwrap()["tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect()
    };
    let tag = |args: &[&str]| -> Value {
        let mut a = vec!["tag", "-r", &repo, "--json"];
        a.extend(args);
        json(&ok(go(&mut with(pw), &a)))
    };
    let v = tag(&["vm@1", "vm@2", "--add", "keep,audit"]);
    assert_eq!(v["snapshots"][0]["changed"], true, "{v}");
    assert_eq!(tags_of(1), ["daily", "keep", "audit"]);
    tag(&["vm@2", "--remove", "audit,daily"]);
    assert_eq!(tags_of(2), ["keep"]);
    // restic's order: add, then remove.
    tag(&["vm@2", "--add", "q", "--remove", "q"]);
    assert_eq!(tags_of(2), ["keep"]);
    // NAME is its latest; --set replaces; --set '' clears.
    tag(&["vm", "--set", "x,y"]);
    assert_eq!(tags_of(4), ["x", "y"]);
    let v = tag(&["vm", "--set", ""]);
    assert_eq!(v["snapshots"][0]["before"], serde_json::json!(["x", "y"]));
    assert!(tags_of(4).is_empty());
    let v = tag(&["vm", "--all", "--add", "daily"]);
    let changed: Vec<bool> = v["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["changed"].as_bool().unwrap())
        .collect();
    assert_eq!(changed, [false, true, false, true], "{v}");
    // A snapshot named twice is changed once, in the order first named.
    let v = tag(&["vm@3", "vm@1", "vm@3", "--add", "twice"]);
    let named: Vec<u64> = v["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot"].as_u64().unwrap())
        .collect();
    assert_eq!(named, [3, 1], "{v}");
    // The snapshots read as before: only the tags changed.
    let out = ok(go(
        &mut with(pw),
        &["restore", "vm@1", "-", "-r", &repo, "-q"],
    ));
    assert!(out.stdout == mixed(300_000, 2));

    fails_with(&go(&mut with(pw), &["tag", "vm", "-r", &repo]), "--add");
    fails_with(
        &go(&mut with(pw), &["tag", "vm@9", "-r", &repo, "--add", "a"]),
        "has no snapshot 9",
    );
    fails_with(
        &go(&mut with(pw), &["tag", "vm", "-r", &repo, "--add", "a b"]),
        "bad tag",
    );

    // --keep-tag keep: vm@1 and vm@2 carry it; --keep-last 1 keeps vm@4.
    let out = json(&ok(go(
        &mut with(pw),
        &[
            "forget",
            "-r",
            &repo,
            "vm",
            "vm",
            "--keep-tag",
            "keep",
            "--keep-last",
            "1",
            "--json",
        ],
    )));
    // (An image named twice is judged once.)
    assert_eq!(out["forgotten"], 1, "{out}");
    assert_eq!(
        ids(&ls(&repo, pw, &[])),
        snaps(&[("vm", 1), ("vm", 2), ("vm", 4)])
    );
}

#[test]
fn forget_runs_at_once_both_succeed() {
    // Two forget runs over the same snapshots: one removes what the
    // other meant to, which is forgotten either way (it was "entity not
    // found" and status 1).
    let dir = tempdir();
    let d = dir.path();
    let img = d.join("img");
    std::fs::write(&img, mixed(64 << 10, 9)).unwrap();
    for round in 0..3 {
        let repo = init(d, &format!("r{round}"), None);
        for i in 0..12 {
            let t = format!("2026-03-{:02}T06:00:00Z", i + 1);
            backup(&repo, None, &img, "vm", &["--time", &t]);
        }
        let runs: Vec<_> = (0..2)
            .map(|_| {
                with(None)
                    .args(["forget", "-r", &repo, "--keep-last", "1"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for run in runs {
            let out = run.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert_eq!(ids(&ls(&repo, None, &[])), snaps(&[("vm", 12)]));
    }
}

/// `data` with the bytes of `ranges` inverted (every byte differs).
fn changed(data: &[u8], ranges: &[(usize, usize)]) -> Vec<u8> {
    let mut v = data.to_vec();
    for &(at, len) in ranges {
        for b in &mut v[at..at + len] {
            *b ^= 0xFF;
        }
    }
    v
}

/// `cairn diff A B --json` as (ranges, changed bytes, size a, size b).
fn diff_json(repo: &str, a: &str, b: &str) -> (Vec<(u64, u64)>, u64, u64, u64) {
    let out = ok(go(
        &mut with(Some(PASSWORD)),
        &["diff", a, b, "-r", repo, "--json"],
    ));
    let v = json(&out);
    assert_eq!(v["a"].as_str().unwrap(), a);
    assert_eq!(v["b"].as_str().unwrap(), b);
    let ranges: Vec<(u64, u64)> = v["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["offset"].as_u64().unwrap(), r["len"].as_u64().unwrap()))
        .collect();
    let changed = v["changed_bytes"].as_u64().unwrap();
    assert_eq!(changed, ranges.iter().map(|r| r.1).sum::<u64>());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{} range(s), {changed} byte(s) differ",
            ranges.len()
        )),
        "{err}"
    );
    (
        ranges,
        changed,
        v["size_a"].as_u64().unwrap(),
        v["size_b"].as_u64().unwrap(),
    )
}

#[test]
fn diff_lists_exactly_the_changed_ranges() {
    let dir = tempdir();
    let repo = init(dir.path(), "r", Some(PASSWORD));
    let pw = Some(PASSWORD);
    let size = 4 << 20;
    let mut base = noise(size, 7);
    // A stretch of zeros (holes in the snapshots) with a change inside.
    base[2 << 20..(2 << 20) + 500_000].fill(0);
    let a = dir.path().join("a");
    std::fs::write(&a, &base).unwrap();
    // Far apart (exact), two 100 bytes apart (one range by the 512-byte
    // rule), one in the zeros, one at the very end.
    let changes = [
        (0, 1),
        (1000, 10),
        (300_000, 4096),
        (1_000_000, 50),
        (1_000_150, 50),
        ((2 << 20) + 100_000, 7),
        (size - 100, 100),
    ];
    let b = dir.path().join("b");
    std::fs::write(&b, changed(&base, &changes)).unwrap();
    backup(&repo, pw, &a, "vm", &[]);
    backup(&repo, pw, &b, "vm", &[]);
    backup(&repo, pw, &b, "other", &[]);
    let want = vec![
        (0, 1),
        (1000, 10),
        (300_000, 4096),
        (1_000_000, 200),
        ((2 << 20) + 100_000, 7),
        (size as u64 - 100, 100),
    ];
    let (ranges, changed_bytes, sa, sb) = diff_json(&repo, "vm@1", "vm@2");
    assert_eq!(ranges, want);
    assert_eq!(changed_bytes, 1 + 10 + 4096 + 200 + 7 + 100);
    assert_eq!((sa, sb), (size as u64, size as u64));
    // The text form says the same, a line per range.
    let out = ok(go(&mut with(pw), &["diff", "vm@1", "vm@2", "-r", &repo]));
    let lines: Vec<(u64, u64)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (o, n) = l.split_once(' ').unwrap();
            (o.parse().unwrap(), n.parse().unwrap())
        })
        .collect();
    assert_eq!(lines, want);
    // Across images, and the other way round.
    assert_eq!(diff_json(&repo, "vm@1", "other@1").0, want);
    assert_eq!(diff_json(&repo, "other@1", "vm@1").0, want);
    // Itself, and two snapshots of the same bytes: nothing.
    assert!(diff_json(&repo, "vm@2", "vm@2").0.is_empty());
    assert!(diff_json(&repo, "vm@2", "other@1").0.is_empty());
    let out = ok(go(&mut with(pw), &["diff", "vm@1", "vm@1", "-r", &repo]));
    assert!(out.stdout.is_empty());
}

#[test]
fn diff_of_a_size_change() {
    let dir = tempdir();
    let repo = init(dir.path(), "r", Some(PASSWORD));
    let pw = Some(PASSWORD);
    let base = noise(1 << 20, 3);
    let a = dir.path().join("a");
    std::fs::write(&a, &base).unwrap();
    let mut longer = base.clone();
    longer.extend(noise(5000, 4));
    let b = dir.path().join("b");
    std::fs::write(&b, &longer).unwrap();
    let c = dir.path().join("c");
    std::fs::write(&c, changed(&base[..600_000], &[(10_000, 3)])).unwrap();
    backup(&repo, pw, &a, "vm", &[]);
    backup(&repo, pw, &b, "vm", &[]);
    backup(&repo, pw, &c, "vm", &[]);
    let n = 1u64 << 20;
    assert_eq!(
        diff_json(&repo, "vm@1", "vm@2"),
        (vec![(n, 5000)], 5000, n, n + 5000)
    );
    assert_eq!(
        diff_json(&repo, "vm@2", "vm@3"),
        (
            vec![(10_000, 3), (600_000, n + 5000 - 600_000)],
            3 + n + 5000 - 600_000,
            n + 5000,
            600_000
        )
    );
}

/// Bytes of every file under `dir`.
fn du(dir: &Path) -> u64 {
    tree(dir)
        .iter()
        .map(|p| std::fs::metadata(dir.join(p)).unwrap().len())
        .sum()
}

/// `cairn restore NAME@N -` from `repo`.
fn restored(repo: &str, pw: Option<&str>, spec: &str) -> Vec<u8> {
    let out = ok(go(&mut with(pw), &["restore", spec, "-", "-r", repo, "-q"]));
    out.stdout
}

/// The chunk ids of a snapshot, through the store.
fn chunk_ids(repo: &str, pw: Option<&str>, name: &str, n: u64) -> Vec<cairn_store::ChunkId> {
    let r = match pw {
        Some(p) => {
            cairn_store::Repository::open_with(Path::new(repo), &cairn_store::Password::new(p))
                .unwrap()
        }
        None => cairn_store::Repository::open(Path::new(repo)).unwrap(),
    };
    r.read_manifest(name, n)
        .unwrap()
        .extents
        .iter()
        .filter_map(|e| match e {
            cairn_store::Extent::Data { id, .. } => Some(*id),
            cairn_store::Extent::Hole { .. } => None,
        })
        .collect()
}

fn copy_json(dest_pw: Option<&str>, args: &[&str]) -> Value {
    let mut all = vec!["copy", "--json"];
    all.extend(args);
    json(&ok(go(&mut with(dest_pw), &all)))
}

/// `cairn copy --from src --from-password-file pwfile -r dest NAME...`.
fn copy_with_file(
    dest_pw: Option<&str>,
    src: &str,
    pwfile: &Path,
    dest: &str,
    names: &[&str],
) -> Value {
    let mut args = vec!["--from", src, "--from-password-file", s(pwfile), "-r", dest];
    args.extend(names);
    copy_json(dest_pw, &args)
}

/// (snapshots copied, snapshots skipped) of a copy's JSON.
fn counts(r: &Value) -> (u64, u64) {
    (
        r["snapshots_copied"].as_u64().unwrap(),
        r["snapshots_skipped"].as_u64().unwrap(),
    )
}

fn verify_clean(repo: &str, pw: Option<&str>) {
    let v = json(&ok(go(
        &mut with(pw),
        &["verify", "-r", repo, "--read-data", "--json", "-q"],
    )));
    assert_eq!(v["ok"], true, "{v}");
}

#[test]
fn copy_between_encrypted_repositories_of_different_keys() {
    let dir = tempdir();
    let d = dir.path();
    let src = init(d, "src", Some(PASSWORD));
    let dest = init(d, "dest", Some(OTHER_PASSWORD));
    let (spw, dpw) = (Some(PASSWORD), Some(OTHER_PASSWORD));
    let mut one = mixed(3 << 20, 5);
    one[1 << 20..(1 << 20) + 400_000].fill(0);
    let two = changed(&one, &[(5000, 3000)]);
    let other = noise(700_000, 6);
    let files: Vec<_> = [("one", &one), ("two", &two), ("other", &other)]
        .iter()
        .map(|(n, data)| {
            let p = d.join(n);
            std::fs::write(&p, data).unwrap();
            p
        })
        .collect();
    backup(&src, spw, &files[0], "vm", &["--tag", "daily"]);
    backup(&src, spw, &files[1], "vm", &[]);
    backup(&src, spw, &files[2], "db", &[]);
    let pwfile = d.join("pw");
    std::fs::write(&pwfile, format!("{PASSWORD}\n")).unwrap();

    // Named images only.
    let r = copy_with_file(dpw, &src, &pwfile, &dest, &["vm"]);
    assert_eq!(counts(&r), (2, 0), "{r}");
    assert!(r["new_chunks"].as_u64().unwrap() > 0);
    let rows = ls(&dest, dpw, &[]);
    assert_eq!(ids(&rows), snaps(&[("vm", 1), ("vm", 2)]));
    let src_rows = ls(&src, spw, &[]);
    for (d, s) in rows.iter().zip(&src_rows[1..]) {
        for k in ["created", "size", "chunker", "codec", "tags", "chunks"] {
            assert_eq!(d[k], s[k], "{k}");
        }
        assert!(d["source"].as_str().unwrap().starts_with("copy of "), "{d}");
    }
    assert_eq!(restored(&dest, dpw, "vm@1"), one);
    assert_eq!(restored(&dest, dpw, "vm@2"), two);
    // The same chunks under different keys: no id in common.
    let (si, di) = (
        chunk_ids(&src, spw, "vm", 1),
        chunk_ids(&dest, dpw, "vm", 1),
    );
    assert_eq!(si.len(), di.len());
    assert!(si.iter().all(|id| !di.contains(id)));
    verify_clean(&dest, dpw);

    // Everything: vm is skipped, db copied (password from the variable).
    let before = du(Path::new(&dest));
    let out = go(
        with(dpw).env("CAIRN_FROM_PASSWORD", PASSWORD),
        &["copy", "--from", &src, "-r", &dest, "--json"],
    );
    let r = json(&ok(out));
    assert_eq!(counts(&r), (1, 2));
    assert_eq!(r["copied"][0]["name"], "db");
    assert!(du(Path::new(&dest)) > before);
    assert_eq!(restored(&dest, dpw, "db@1"), other);

    // Once more: nothing to do, and the destination does not grow.
    let before = du(Path::new(&dest));
    let r = copy_with_file(dpw, &src, &pwfile, &dest, &[]);
    assert_eq!(counts(&r), (0, 3));
    assert_eq!(r["new_chunks"], 0);
    assert_eq!(du(Path::new(&dest)), before);
    verify_clean(&dest, dpw);
}

#[test]
fn copy_from_plain_to_encrypted_and_back() {
    let dir = tempdir();
    let d = dir.path();
    let plain_src = init(d, "plain", None);
    let enc = init(d, "enc", Some(PASSWORD));
    let plain_dest = init(d, "plain2", None);
    let data = mixed(2 << 20, 8);
    let f = d.join("img");
    std::fs::write(&f, &data).unwrap();
    backup(&plain_src, None, &f, "vm", &["--tag", "t1"]);

    // plain -> encrypted: the destination's password only.
    let r = copy_json(Some(PASSWORD), &["--from", &plain_src, "-r", &enc]);
    assert_eq!(counts(&r), (1, 0), "{r}");
    assert_eq!(restored(&enc, Some(PASSWORD), "vm@1"), data);
    assert_eq!(ls(&enc, Some(PASSWORD), &["--tag", "t1"]).len(), 1);
    let (pi, ei) = (
        chunk_ids(&plain_src, None, "vm", 1),
        chunk_ids(&enc, Some(PASSWORD), "vm", 1),
    );
    assert_eq!(pi.len(), ei.len());
    assert!(pi.iter().all(|id| !ei.contains(id)));
    verify_clean(&enc, Some(PASSWORD));

    // encrypted -> plain: the source's password from a file; the copy of
    // a copy says where it came from.
    let pwfile = d.join("pw");
    std::fs::write(&pwfile, PASSWORD).unwrap();
    let r = copy_with_file(None, &enc, &pwfile, &plain_dest, &[]);
    assert_eq!(counts(&r), (1, 0), "{r}");
    assert_eq!(restored(&plain_dest, None, "vm@1"), data);
    let source = ls(&plain_dest, None, &[])[0]["source"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(source.matches("copy of ").count(), 2, "{source}");
    assert!(source.ends_with(&format!("({}))", s(&f))), "{source}");
    // Plain ids are BLAKE3 of the bytes in both plain repositories.
    assert_eq!(chunk_ids(&plain_dest, None, "vm", 1), pi);
    verify_clean(&plain_dest, None);
    let r = copy_with_file(None, &enc, &pwfile, &plain_dest, &[]);
    assert_eq!(counts(&r), (0, 1), "{r}");
}

/// (name, snapshot) of every snapshot in `repo`, sorted.
fn held(repo: &str, pw: Option<&str>) -> Vec<(String, u64)> {
    let mut v = ids(&ls(repo, pw, &[]));
    v.sort();
    v
}

/// A sync both ways, round after round, between a plain and an encrypted
/// repository, and copies from a `cp -a` copy of one: every snapshot is
/// in each repository once (a copy used to bring a repository's own
/// snapshots back as new ones, doubling them each round), the skipped
/// ones are counted in the JSON and the text, and what is held restores
/// byte for byte.
#[test]
fn copy_both_ways_and_from_a_clone_brings_each_snapshot_once() {
    let dir = tempdir();
    let d = dir.path();
    let ra = init(d, "ra", None);
    let rb = init(d, "rb", Some(PASSWORD));
    let (apw, bpw) = (None, Some(PASSWORD));
    let files: Vec<_> = [mixed(1 << 20, 21), mixed(700_000, 22), mixed(900_000, 23)]
        .into_iter()
        .enumerate()
        .map(|(i, data)| {
            let p = d.join(format!("img{i}"));
            std::fs::write(&p, &data).unwrap();
            (p, data)
        })
        .collect();
    backup(&ra, apw, &files[0].0, "s", &[]);
    backup(&rb, bpw, &files[1].0, "t", &[]);
    // ra -> rb: rb's password is CAIRN_PASSWORD; rb -> ra: it is the
    // source's.
    let a_to_b = || copy_json(bpw, &["--from", &ra, "-r", &rb]);
    let b_to_a = || {
        json(&ok(go(
            with(apw).env("CAIRN_FROM_PASSWORD", PASSWORD),
            &["copy", "--from", &rb, "-r", &ra, "--json"],
        )))
    };
    assert_eq!(counts(&a_to_b()), (1, 0));
    let r = b_to_a();
    assert_eq!(counts(&r), (1, 1), "{r}");
    assert_eq!(r["skipped"][0]["name"], "s");
    assert_eq!(
        (
            r["skipped"][0]["from"].as_u64(),
            r["skipped"][0]["to"].as_u64()
        ),
        (Some(1), Some(1))
    );
    let both = snaps(&[("s", 1), ("t", 1)]);
    for round in 0..4 {
        let r = a_to_b();
        assert_eq!(counts(&r), (0, 2), "round {round}: {r}");
        assert_eq!(r["new_chunks"], 0);
        let r = b_to_a();
        assert_eq!(counts(&r), (0, 2), "round {round}: {r}");
        assert_eq!(
            (held(&ra, apw), held(&rb, bpw)),
            (both.clone(), both.clone())
        );
    }
    // The text says so too.
    let out = ok(go(
        &mut with(bpw),
        &["copy", "--from", &ra, "-r", &rb, "-q"],
    ));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ok(go(&mut with(bpw), &["copy", "--from", &ra, "-r", &rb]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("skipped s@1: the destination has it as s@1"),
        "{err}"
    );
    assert!(err.contains("0 snapshot(s) copied, 2 skipped"), "{err}");

    // A copy of ra (`cp -a`: the same id) brings nothing ra holds, and
    // what it alone holds once; its new snapshot then travels like any.
    let rc = s(&d.join("rc")).to_string();
    let cp = Command::new("cp").args(["-a", &ra, &rc]).status().unwrap();
    assert!(cp.success());
    let out = ok(go(&mut with(apw), &["copy", "--from", &rc, "-r", &ra]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is a copy of this repository"), "{err}");
    assert!(err.contains("0 snapshot(s) copied, 2 skipped"), "{err}");
    let r = copy_json(apw, &["--from", &rc, "-r", &ra]);
    assert_eq!(counts(&r), (0, 2), "{r}");
    assert_eq!(r["same_repository_id"], true);
    backup(&rc, apw, &files[2].0, "s", &[]);
    let r = copy_json(apw, &["--from", &rc, "-r", &ra]);
    assert_eq!(counts(&r), (1, 2), "{r}");
    assert_eq!(
        (
            r["copied"][0]["from"].as_u64(),
            r["copied"][0]["to"].as_u64()
        ),
        (Some(2), Some(2))
    );
    // ra's s@2 is rc's own s@2 under the same number: back to rc, nothing.
    assert_eq!(counts(&copy_json(apw, &["--from", &ra, "-r", &rc])), (0, 3));
    assert_eq!(counts(&a_to_b()), (1, 2));
    for _ in 0..2 {
        assert_eq!(counts(&b_to_a()), (0, 3));
        assert_eq!(counts(&a_to_b()), (0, 3));
        assert_eq!(counts(&copy_json(apw, &["--from", &rc, "-r", &ra])), (0, 3));
    }
    let three = snaps(&[("s", 1), ("s", 2), ("t", 1)]);
    assert_eq!(held(&ra, apw), three);
    assert_eq!(held(&rb, bpw), three);
    assert_eq!(held(&rc, apw), three);
    // Byte for byte, in each (rb's s@1 and s@2 are ra's, in order).
    let want = [
        ("s@1", &files[0].1),
        ("t@1", &files[1].1),
        ("s@2", &files[2].1),
    ];
    for (repo, pw) in [(&ra, apw), (&rb, bpw), (&rc, apw)] {
        for (spec, data) in want {
            assert!(restored(repo, pw, spec) == *data, "{repo} {spec}");
        }
        verify_clean(repo, pw);
    }
}

#[test]
fn errors_are_one_line_and_exit_1() {
    let dir = tempdir();
    let d = dir.path();
    let src = init(d, "src", Some(PASSWORD));
    let dest = init(d, "dest", Some(OTHER_PASSWORD));
    let f = d.join("img");
    std::fs::write(&f, noise(100_000, 1)).unwrap();
    backup(&src, Some(PASSWORD), &f, "vm", &[]);

    let wrong = d.join("wrong");
    std::fs::write(&wrong, "not the password").unwrap();
    fails_with(
        &go(
            &mut with(Some(OTHER_PASSWORD)),
            &[
                "copy",
                "--from",
                &src,
                "--from-password-file",
                s(&wrong),
                "-r",
                &dest,
            ],
        ),
        "wrong password",
    );
    // No password for the source at all (CAIRN_PASSWORD is the
    // destination's, not the source's).
    fails_with(
        &go(
            &mut with(Some(OTHER_PASSWORD)),
            &["copy", "--from", &src, "-r", &dest],
        ),
        "--from",
    );
    fails_with(
        &go(
            with(Some(OTHER_PASSWORD)).env("CAIRN_FROM_PASSWORD", PASSWORD),
            &["copy", "--from", &src, "-r", &dest, "nope"],
        ),
        "no image named \"nope\"",
    );
    assert!(ls(&dest, Some(OTHER_PASSWORD), &[]).is_empty());
    fails_with(
        &go(
            with(Some(PASSWORD)).env("CAIRN_FROM_PASSWORD", PASSWORD),
            &["copy", "--from", &src, "-r", &format!("{src}/.")],
        ),
        "the same repository",
    );
    fails_with(
        &go(
            &mut with(Some(PASSWORD)),
            &["diff", "vm@1", "vm@9", "-r", &src],
        ),
        "has no snapshot 9",
    );
    fails_with(
        &go(
            &mut with(Some(PASSWORD)),
            &["diff", "vm@1", "gone@1", "-r", &src],
        ),
        "no image named \"gone\"",
    );
    // restore -f onto a directory: refused before anything is written
    // (it failed at the end, renaming the image over the directory).
    let onto = d.join("a dir");
    std::fs::create_dir(&onto).unwrap();
    fails_with(
        &go(
            &mut with(Some(PASSWORD)),
            &["restore", "vm", s(&onto), "-f", "-r", &src],
        ),
        "is a directory",
    );
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("cairn-tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // Onto a symlink to a file: written through, as cp and dd do; the
    // link stays.
    let target = d.join("target");
    std::fs::write(&target, b"old").unwrap();
    let link = d.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let out = go(
        &mut with(Some(PASSWORD)),
        &["restore", "vm", s(&link), "-f", "-q", "-r", &src],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), noise(100_000, 1));
}

/// `init` takes its repository as the other verbs do (`-r`, `--repo`,
/// `CAIRN_REPO`) as well as a plain REPO, which wins over CAIRN_REPO; REPO
/// and --repo together are refused, and none at all is one line.
#[test]
fn init_takes_the_repository_as_every_verb_does() {
    let dir = tempdir();
    let d = dir.path();
    let at = |n: &str| s(&d.join(n)).to_string();
    ok(plain()
        .env("CAIRN_REPO", at("env"))
        .args(["init", "--encryption", "none"])
        .stdin(Stdio::null())
        .output()
        .unwrap());
    ok(go(
        &mut plain(),
        &["init", "-r", &at("short"), "--encryption", "none"],
    ));
    ok(go(
        &mut plain(),
        &["init", "--repo", &at("long"), "--encryption", "none"],
    ));
    ok(plain()
        .env("CAIRN_REPO", at("not-this"))
        .args(["init", &at("plain"), "--encryption", "none"])
        .stdin(Stdio::null())
        .output()
        .unwrap());
    for name in ["env", "short", "long", "plain"] {
        ok(go(&mut plain(), &["stats", "-r", &at(name)]));
    }
    assert!(!d.join("not-this").exists());
    let out = go(&mut plain(), &["init", &at("a"), "-r", &at("b")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    fails_with(
        &go(&mut plain(), &["init", "--encryption", "none"]),
        "no repository given",
    );
}

/// Snapshot times for the retention comparison with restic: two groups
/// (restic's hosts, cairn's images), gaps from 20 minutes to 75 days
/// over two years and more, so every rule meets hours, days, ISO weeks,
/// months and years with one snapshot and with several; then times
/// around the cuts of spans counted back from each group's newest (31
/// March 2024, and 1 August 2024): exactly on a cut (not within it:
/// restic keeps what is strictly after), and between the calendar's cut
/// and the one 30-day months and 365-day years give, each the only
/// snapshot of its hour, day, week, month or year inside the span:
/// `1m` from 31 March is 2 March 12:00 (1 March 12:00 in 30 days), `1y`
/// 31 March 2023 12:00 (1 April across 29 February), `1m` from 1 August
/// 1 July 00:00 (2 July), `8m` 1 December 2023 (5 December).
fn retention_times() -> Vec<(&'static str, Vec<String>)> {
    let gaps = [
        1200,
        3 * 3600,
        11 * 3600,
        86400,
        6 * 86400,
        17 * 86400,
        40 * 86400,
        75 * 86400,
    ];
    let mut groups = Vec::new();
    for (host, start, until, edges) in [
        (
            "h1",
            "2022-07-01T08:00:00Z",
            "2023-12-15T00:00:00Z",
            &[
                "2023-03-31T18:00:00Z",
                "2024-01-31T10:00:00Z",
                "2024-02-29T23:00:00Z",
                "2024-03-01T18:00:00Z",
                "2024-03-02T06:00:00Z",
                "2024-03-02T12:00:00Z",
                "2024-03-02T12:30:00Z",
                "2024-03-24T23:59:59Z",
                "2024-03-25T00:00:01Z",
                "2024-03-31T12:00:00Z",
            ][..],
        ),
        (
            "h2",
            "2022-10-01T00:00:00Z",
            "2024-05-15T00:00:00Z",
            &[
                "2023-12-02T12:00:00Z",
                "2024-06-30T23:00:00Z",
                "2024-07-01T00:00:00Z",
                "2024-07-01T12:00:00Z",
                "2024-07-08T06:00:00Z",
                "2024-08-01T00:00:00Z",
            ][..],
        ),
    ] {
        let until = cairn_store::parse_time(until).unwrap();
        let mut t = cairn_store::parse_time(start).unwrap();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ t as u64;
        let mut times = Vec::new();
        while t < until {
            times.push(t);
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += gaps[(x % gaps.len() as u64) as usize] + (x >> 40) as i64 % 600;
        }
        times.extend(edges.iter().map(|e| cairn_store::parse_time(e).unwrap()));
        let times = times.into_iter().map(utc).collect();
        groups.push((host, times));
    }
    groups
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time, for both tools' --time.
fn utc(t: i64) -> String {
    cairn_store::format_time(t)
        .trim_end_matches(" UTC")
        .to_string()
}

/// restic on `repo`, in UTC (it counts periods in local time).
fn restic(repo: &Path, args: &[&str]) -> Output {
    ok(Command::new("restic")
        .args(["--no-cache", "-q", "-r", s(repo)])
        .args(args)
        .env("RESTIC_PASSWORD", "restic")
        .env("TZ", "UTC")
        .stdin(Stdio::null())
        .output()
        .unwrap())
}

/// Each group's kept times (Unix seconds) by `restic forget --dry-run`.
fn restic_kept(repo: &Path, policy: &[&str]) -> std::collections::BTreeMap<String, Vec<i64>> {
    let mut args = vec!["forget", "--dry-run", "--json"];
    args.extend(policy);
    let out = restic(repo, &args);
    let groups: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut kept = std::collections::BTreeMap::new();
    for g in groups.as_array().unwrap() {
        let mut times: Vec<i64> = g["keep"]
            .as_array()
            .map(|k| {
                k.iter()
                    .map(|snap| cairn_store::parse_time(snap["time"].as_str().unwrap()).unwrap())
                    .collect()
            })
            .unwrap_or_default();
        times.sort_unstable();
        kept.insert(g["host"].as_str().unwrap().to_string(), times);
    }
    kept
}

/// `cairn forget --keep-*` keeps what `restic forget --keep-*` keeps,
/// rule by rule and in combinations, run side by side with restic on the
/// same snapshot times and tags (restic in UTC, as cairn counts periods):
/// the counted rules, `--keep-within` counted back on the calendar, the
/// `--keep-within-*` rules and `--keep-tag`. The one difference is
/// cairn's own: an image's latest snapshot is never forgotten, where
/// restic forgets it under a policy that only keeps tags.
#[test]
fn forget_keeps_what_restic_forget_keeps() {
    if !have("restic") {
        return;
    }
    let dir = tempdir();
    let file = dir.path().join("data");
    std::fs::write(&file, b"the same bytes in every snapshot").unwrap();
    let restic_repo = dir.path().join("restic");
    restic(&restic_repo, &["init"]);
    let repo = init(dir.path(), "cairn", None);
    let groups = retention_times();
    // The two groups' backups at once: restic derives its key again for
    // every command (about 0.7 s of CPU each).
    std::thread::scope(|scope| {
        for (host, times) in &groups {
            let (restic_repo, repo, file) = (&restic_repo, &repo, &file);
            scope.spawn(move || {
                for (i, t) in times.iter().enumerate() {
                    // Tags on some: every third "keep", every fifth "db" too.
                    let mut tags = Vec::new();
                    if i % 3 == 0 {
                        tags.push("keep");
                    }
                    if i % 5 == 0 {
                        tags.push("db");
                    }
                    let joined = tags.join(",");
                    let mut r = vec!["backup", "--host", host, "--time", t];
                    let mut c = vec!["--time", t];
                    if !tags.is_empty() {
                        r.extend(["--tag", &joined]);
                        c.extend(["--tag", &joined]);
                    }
                    r.push(s(file));
                    restic(restic_repo, &r);
                    backup(repo, None, file, host, &c);
                }
            });
        }
    });
    let newest: std::collections::BTreeMap<&str, i64> = groups
        .iter()
        .map(|(host, times)| {
            (
                *host,
                cairn_store::parse_time(times.last().unwrap()).unwrap(),
            )
        })
        .collect();
    let policies: &[&[&str]] = &[
        &["--keep-last", "5"],
        &["--keep-hourly", "10"],
        &["--keep-daily", "7"],
        &["--keep-weekly", "5"],
        &["--keep-monthly", "6"],
        &["--keep-yearly", "3"],
        &["--keep-within", "1m"],
        &["--keep-within", "1y"],
        &["--keep-within", "8m"],
        &["--keep-within", "1y2m3d4h"],
        &["--keep-within", "7d"],
        &["--keep-within-hourly", "1m"],
        &["--keep-within-daily", "1m"],
        &["--keep-within-weekly", "1m"],
        &["--keep-within-monthly", "1y"],
        &["--keep-within-yearly", "8m"],
        &["--keep-within-hourly", "2d"],
        &["--keep-within-daily", "10d"],
        &["--keep-within-weekly", "2m"],
        &["--keep-within-monthly", "6m"],
        &["--keep-within-yearly", "3y"],
        &[
            "--keep-last",
            "2",
            "--keep-daily",
            "3",
            "--keep-weekly",
            "2",
            "--keep-monthly",
            "2",
            "--keep-yearly",
            "1",
        ],
        &[
            "--keep-within",
            "36h",
            "--keep-within-daily",
            "1m",
            "--keep-monthly",
            "3",
        ],
        &["--keep-tag", "keep"],
        &[
            "--keep-tag",
            "keep,db",
            "--keep-tag",
            "db",
            "--keep-daily",
            "2",
        ],
    ];
    let mut wrong = Vec::new();
    for policy in policies {
        let want = restic_kept(&restic_repo, policy);
        let mut args = vec!["forget", "-r", &repo, "--dry-run", "--json"];
        args.extend(policy.iter());
        let got = json(&ok(go(&mut plain(), &args)));
        for (host, _) in &groups {
            let mut kept: Vec<i64> = got["snapshots"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|v| v["name"] == *host && v["keep"] == true)
                .map(|v| v["time"].as_i64().unwrap())
                .collect();
            kept.sort_unstable();
            let mut expect = want.get(*host).cloned().unwrap_or_default();
            // cairn keeps an image's latest snapshot whatever the rules.
            if !expect.contains(&newest[host]) {
                expect.push(newest[host]);
            }
            if kept != expect {
                let only = |a: &[i64], b: &[i64]| {
                    a.iter()
                        .filter(|t| !b.contains(t))
                        .map(|&t| utc(t))
                        .collect::<Vec<_>>()
                };
                wrong.push(format!(
                    "{host} {policy:?}: only cairn kept {:?}, only restic {:?}",
                    only(&kept, &expect),
                    only(&expect, &kept)
                ));
            }
        }
    }
    let version = String::from_utf8(restic(&restic_repo, &["version"]).stdout).unwrap();
    assert!(
        wrong.is_empty(),
        "against {}:\n{}",
        version.trim(),
        wrong.join("\n")
    );
}
