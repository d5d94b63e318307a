//! Encrypted repositories end to end with the real binary (issue 16):
//! no plaintext anywhere in the repository's files, every source of the
//! password, wrong and missing passwords, the key commands, a changed
//! byte in every kind of file, and a plain repository that refuses a
//! password.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A failure with one line on stderr naming `what`, and no panic.
fn fails_with(out: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "succeeded: {err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(what), "{what:?} not in: {err}");
    err
}

fn run(cmd: &mut Command, args: &[&str]) -> Output {
    cmd.args(args).stdin(Stdio::null()).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every regular file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The files under `dir` holding `needle`.
fn holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    files(dir)
        .into_iter()
        .filter(|f| {
            std::fs::read(f)
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle)
        })
        .collect()
}

const MARKER: &[u8] = b"MARKER-4b1d9c-cairn-plaintext";

/// 8 MiB of the marker, with a counter so chunks do not all dedup into
/// one (and compress, as text does).
fn marked_image() -> Vec<u8> {
    let mut v = Vec::with_capacity(8 << 20);
    let mut i = 0u64;
    while v.len() < 8 << 20 {
        v.extend_from_slice(MARKER);
        v.extend_from_slice(format!(" line {i:012}\n").as_bytes());
        i += 1;
    }
    v.truncate(8 << 20);
    v
}

const IMAGE_NAME: &str = "secret-image-name-77";

#[test]
fn a_default_repository_holds_no_plaintext_and_a_plain_one_does() {
    let dir = tempdir();
    let d = dir.path();
    let img = d.join("img");
    std::fs::write(&img, marked_image()).unwrap();
    let enc = d.join("enc");
    let init = json(&ok(run(&mut cairn(), &["init", s(&enc), "--json"])));
    assert_eq!(init["encryption"], "aes-256-gcm", "{init}");
    for _ in 0..2 {
        ok(run(
            &mut cairn(),
            &[
                "backup",
                s(&img),
                "--repo",
                s(&enc),
                "--name",
                IMAGE_NAME,
                "-q",
            ],
        ));
    }
    // A gc (repack, trash list) and a served writable image leave no
    // plaintext either.
    ok(run(
        &mut cairn(),
        &["rm", &format!("{IMAGE_NAME}@1"), "--repo", s(&enc)],
    ));
    ok(run(&mut cairn(), &["gc", "--repo", s(&enc)]));
    assert_eq!(holding(&enc, MARKER), Vec::<PathBuf>::new());
    assert_eq!(holding(&enc, &MARKER[..12]), Vec::<PathBuf>::new());
    assert_eq!(holding(&enc, IMAGE_NAME.as_bytes()), Vec::<PathBuf>::new());
    // Neither do the chunk ids: the plain BLAKE3 of the first chunk-sized
    // pieces is nowhere (ids are keyed).
    let data = marked_image();
    let st = json(&ok(run(
        &mut cairn(),
        &["stats", "--repo", s(&enc), "--json"],
    )));
    assert_eq!(st["encryption"], "aes-256-gcm", "{st}");
    // Where chunks are cut is secret too (a gear table from the key files).
    assert_eq!(st["chunker_table"], "keyed", "{st}");
    let listing = json(&ok(run(&mut cairn(), &["ls", "--repo", s(&enc), "--json"])));
    assert!(listing.to_string().contains(IMAGE_NAME), "{listing}");
    let out = d.join("out");
    ok(run(
        &mut cairn(),
        &["restore", IMAGE_NAME, s(&out), "--repo", s(&enc), "-q"],
    ));
    assert!(std::fs::read(&out).unwrap() == data);
    let v = json(&ok(run(
        &mut cairn(),
        &["verify", "--read-data", "--repo", s(&enc), "--json"],
    )));
    assert_eq!(v["ok"], true, "{v}");

    // The control: the same in a plain repository leaves the marker and
    // the name in its files (so the search above can find them).
    let plain_repo = d.join("plain");
    let init = json(&ok(run(
        &mut plain(),
        &["init", s(&plain_repo), "--encryption", "none", "--json"],
    )));
    assert_eq!(init["encryption"], "none");
    ok(run(
        &mut plain(),
        &[
            "backup",
            s(&img),
            "--repo",
            s(&plain_repo),
            "--name",
            IMAGE_NAME,
            "-q",
            "-c",
            "none",
        ],
    ));
    assert!(!holding(&plain_repo, MARKER).is_empty());
    assert!(!holding(&plain_repo, IMAGE_NAME.as_bytes()).is_empty());
    let st = json(&ok(run(
        &mut plain(),
        &["stats", "--repo", s(&plain_repo), "--json"],
    )));
    assert_eq!(st["encryption"], "none", "{st}");
    assert_eq!(st["chunker_table"], "public", "{st}");
    // A plain repository refuses a password (it could have been swapped
    // for the encrypted one, and backups would land in the clear).
    fails_with(
        &run(&mut cairn(), &["ls", "--repo", s(&plain_repo)]),
        "not encrypted, but a password was given",
    );
}

/// The ids of the keys `key list --json` marks as in use.
fn current_keys(list: &serde_json::Value) -> Vec<String> {
    list["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["current"] == true)
        .map(|k| k["id"].as_str().unwrap().to_string())
        .collect()
}

/// An encrypted repository whose config is replaced by a plain one (the
/// config is not sealed) is refused without a password too: a backup by
/// someone who types the password at a prompt (so gives none up front)
/// went on in the clear, setting the sealed index files aside as
/// damaged.
#[test]
fn a_config_rewritten_to_plain_is_refused() {
    let dir = tempdir();
    let d = dir.path();
    let repo = d.join("repo");
    ok(run(&mut cairn(), &["init", s(&repo)]));
    let img = d.join("img");
    std::fs::write(&img, mixed(1 << 20, 5)).unwrap();
    let backup = ["backup", s(&img), "--repo", s(&repo), "-n", "a", "-q"];
    ok(run(&mut cairn(), &backup));
    let plain_repo = d.join("plain");
    ok(run(
        &mut plain(),
        &["init", s(&plain_repo), "--encryption", "none"],
    ));
    // The plain config with the encrypted one's id, its checksum made
    // again (it is no seal).
    let id_of = |c: &[u8]| {
        let at = c.windows(7).position(|w| w == b"\"id\": \"").unwrap() + 7;
        (at, c[at..at + 32].to_vec())
    };
    let (_, id) = id_of(&std::fs::read(repo.join("config")).unwrap());
    let mut config = std::fs::read(plain_repo.join("config")).unwrap();
    let (at, _) = id_of(&config);
    config[at..at + 32].copy_from_slice(&id);
    let body = config.len() - 32;
    let sum = *blake3::hash(&config[..body]).as_bytes();
    config[body..].copy_from_slice(&sum);
    std::fs::write(repo.join("config"), &config).unwrap();
    let files = |dir: &std::path::Path| std::fs::read_dir(dir).unwrap().count();
    let index_files = files(&repo.join("index"));
    fails_with(&run(&mut plain(), &backup), "holds key files");
    fails_with(
        &run(&mut plain(), &["ls", "--repo", s(&repo)]),
        "holds key files",
    );
    assert_eq!(files(&repo.join("index")), index_files);
    // The key files deleted too: the encrypted index files say it.
    std::fs::remove_dir_all(repo.join("keys")).unwrap();
    fails_with(&run(&mut plain(), &backup), "index file is encrypted");
    assert_eq!(files(&repo.join("index")), index_files);
}

/// Key files are tried cheapest first: one asking for a costly
/// Argon2id (as a planted one may, up to 4 GiB and 64 passes) is paid
/// only when no cheaper key opens, not first because it is older.
#[test]
fn the_cheapest_key_is_tried_first() {
    let dir = tempdir();
    let d = dir.path();
    let repo = d.join("repo");
    ok(run(
        &mut cairn(),
        &[
            "init",
            s(&repo),
            "--kdf-memory",
            "32M",
            "--kdf-iterations",
            "3",
        ],
    ));
    let r = ["--repo", s(&repo)];
    // An empty CAIRN_NEW_PASSWORD is no new password given (as the
    // other password variables): not "an empty password".
    let out = fails_with(
        &run(
            cairn().env("CAIRN_NEW_PASSWORD", ""),
            &[&["key", "add"][..], &r].concat(),
        ),
        "no password given and no terminal to ask on",
    );
    assert!(!out.contains("gives an empty password"), "{out}");
    // The costly key older by a second (keys of one second go by id).
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let added = json(&ok(run(
        cairn().env("CAIRN_NEW_PASSWORD", PASSWORD),
        &[&["key", "add", "--json", "--kdf-memory", "8M"][..], &r].concat(),
    )));
    let cheap = added["added"].as_str().unwrap().to_string();
    let keys = json(&ok(run(
        &mut cairn(),
        &[&["key", "list", "--json"][..], &r].concat(),
    )));
    let current = current_keys(&keys);
    assert_eq!(current, vec![cheap], "{keys}");
}

#[test]
fn wrong_missing_and_every_source_of_password() {
    let dir = tempdir();
    let d = dir.path();
    let repo = d.join("repo");
    ok(run(&mut cairn(), &["init", s(&repo)]));
    let img = d.join("img");
    std::fs::write(&img, mixed(1 << 20, 3)).unwrap();
    ok(run(
        &mut cairn(),
        &["backup", s(&img), "--repo", s(&repo), "-n", "a", "-q"],
    ));
    let ls = ["ls", "--repo", s(&repo)];

    fails_with(
        &run(plain().env("CAIRN_PASSWORD", "not it"), &ls),
        "wrong password",
    );
    // No password, no terminal: one line saying what to give.
    fails_with(
        &run(&mut plain(), &ls),
        "the repository is encrypted; give its password",
    );
    fails_with(
        &run(&mut plain(), &["init", s(&d.join("new"))]),
        "needs a password",
    );
    assert!(!d.join("new").join("config").exists());
    // A place init refuses is refused before a password is asked for.
    fails_with(
        &run(&mut plain(), &["init", s(&repo)]),
        "already exists and is not empty",
    );

    let file = d.join("pw");
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    ok(run(
        &mut plain(),
        &[&ls[..], &["--password-file", s(&file)]].concat(),
    ));
    ok(run(plain().env("CAIRN_PASSWORD_FILE", &file), &ls));
    ok(run(
        &mut plain(),
        &[
            &ls[..],
            &["--password-command", &format!("cat {}", s(&file))],
        ]
        .concat(),
    ));
    ok(run(
        plain().env("CAIRN_PASSWORD_COMMAND", format!("echo '{PASSWORD}'")),
        &ls,
    ));
    // A variable set to nothing counts as not set (as restic's do): the
    // next source is taken, not "a value is required".
    ok(run(
        cairn()
            .env("CAIRN_PASSWORD_FILE", "")
            .env("CAIRN_PASSWORD_COMMAND", ""),
        &ls,
    ));
    // CAIRN_PASSWORD too: empty, it is no password given (it was one,
    // and refused as empty, and a plain repository refused it as given).
    fails_with(
        &run(plain().env("CAIRN_PASSWORD", ""), &ls),
        "the repository is encrypted; give its password",
    );
    let plain_repo = d.join("plain-repo");
    ok(run(
        &mut plain(),
        &["init", s(&plain_repo), "--encryption", "none"],
    ));
    ok(run(
        plain().env("CAIRN_PASSWORD", ""),
        &["ls", "--repo", s(&plain_repo)],
    ));
    let out = run(cairn().env("CAIRN_REPO", ""), &["ls"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("required arguments were not provided: --repo"),
        "{err}"
    );
    fails_with(
        &run(
            &mut plain(),
            &[&ls[..], &["--password-command", "exit 3"]].concat(),
        ),
        "--password-command",
    );
    fails_with(
        &run(
            &mut plain(),
            &[&ls[..], &["--password-file", s(&d.join("missing"))]].concat(),
        ),
        "missing",
    );
    fails_with(
        &run(
            &mut plain(),
            &[
                &ls[..],
                &["--password-file", s(&file), "--password-command", "true"],
            ]
            .concat(),
        ),
        "not both",
    );
    std::fs::write(&file, "\n").unwrap();
    fails_with(
        &run(
            &mut plain(),
            &[&ls[..], &["--password-file", s(&file)]].concat(),
        ),
        "empty password",
    );
}

#[test]
fn keys_are_added_listed_changed_and_removed() {
    let dir = tempdir();
    let d = dir.path();
    let repo = d.join("repo");
    // A cheap key for the test's speed; its cost is recorded in it.
    ok(run(
        &mut cairn(),
        &[
            "init",
            s(&repo),
            "--kdf-memory",
            "8M",
            "--kdf-iterations",
            "2",
        ],
    ));
    let img = d.join("img");
    let data = mixed(2 << 20, 9);
    std::fs::write(&img, &data).unwrap();
    ok(run(
        &mut cairn(),
        &["backup", s(&img), "--repo", s(&repo), "-n", "a", "-q"],
    ));
    let r = ["--repo", s(&repo)];

    let keys = json(&ok(run(
        &mut cairn(),
        &[&["key", "list", "--json"][..], &r].concat(),
    )));
    let list = keys["keys"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{keys}");
    assert_eq!(list[0]["current"], true);
    assert_eq!(list[0]["memory_kib"], 8192);
    assert_eq!(list[0]["iterations"], 2);
    let first = list[0]["id"].as_str().unwrap().to_string();

    let added = json(&ok(run(
        cairn().env("CAIRN_NEW_PASSWORD", "second password"),
        &[&["key", "add", "--json", "--kdf-memory", "8M"][..], &r].concat(),
    )));
    let second = added["added"].as_str().unwrap().to_string();
    // Either password opens it, and sees the same data.
    for pw in [PASSWORD, "second password"] {
        let out = d.join("out");
        ok(run(
            plain().env("CAIRN_PASSWORD", pw),
            &[&["restore", "a", s(&out), "-q"][..], &r].concat(),
        ));
        assert!(std::fs::read(&out).unwrap() == data);
        std::fs::remove_file(&out).unwrap();
    }
    let keys = json(&ok(run(
        plain().env("CAIRN_PASSWORD", "second password"),
        &[&["key", "list", "--json"][..], &r].concat(),
    )));
    let current = current_keys(&keys);
    assert_eq!(current, vec![second.clone()]);

    // The key in use cannot be removed; another one can.
    fails_with(
        &run(
            &mut cairn(),
            &[&["key", "remove", &first[..8]][..], &r].concat(),
        ),
        "in use",
    );
    fails_with(
        &run(
            &mut cairn(),
            &[&["key", "remove", "ffffffff"][..], &r].concat(),
        ),
        "no key",
    );
    ok(run(
        &mut cairn(),
        &[&["key", "remove", &second][..], &r].concat(),
    ));
    fails_with(
        &run(
            plain().env("CAIRN_PASSWORD", "second password"),
            &[&["ls"][..], &r].concat(),
        ),
        "wrong password",
    );

    // passwd: the new password opens it, the old one no longer does.
    let pw_file = d.join("new-pw");
    std::fs::write(&pw_file, "third password\n").unwrap();
    let changed = json(&ok(run(
        &mut cairn(),
        &[
            &[
                "key",
                "passwd",
                "--json",
                "--kdf-memory",
                "8M",
                "--new-password-file",
                s(&pw_file),
            ][..],
            &r,
        ]
        .concat(),
    )));
    assert_eq!(changed["removed"], first.as_str(), "{changed}");
    fails_with(
        &run(&mut cairn(), &[&["ls"][..], &r].concat()),
        "wrong password",
    );
    ok(run(
        plain().env("CAIRN_PASSWORD", "third password"),
        &[&["verify", "--read-data"][..], &r].concat(),
    ));
    // Changing to the same password changes nothing.
    fails_with(
        &run(
            plain()
                .env("CAIRN_PASSWORD", "third password")
                .env("CAIRN_NEW_PASSWORD", "third password"),
            &[&["key", "passwd", "--kdf-memory", "8M"][..], &r].concat(),
        ),
        "nothing changed",
    );
    let keys = json(&ok(run(
        plain().env("CAIRN_PASSWORD", "third password"),
        &[&["key", "list", "--json"][..], &r].concat(),
    )));
    assert_eq!(keys["keys"].as_array().unwrap().len(), 1, "{keys}");
    // A plain repository has no keys.
    let p = d.join("plain");
    ok(run(&mut plain(), &["init", s(&p), "--encryption", "none"]));
    fails_with(
        &run(&mut plain(), &["key", "list", "--repo", s(&p)]),
        "not encrypted",
    );
}

/// Flip one byte at `at` of `path`.
/// Found by the repository audit (2026-11-29): two `key remove` at once,
/// each opened with one password and removing the other password's key,
/// both passed the "not the key in use" check and both deleted: the
/// repository was left without any key, every snapshot lost for good
/// (restic's `key remove` takes an exclusive lock). Now removals run one
/// at a time and the second finds its own key gone and removes nothing.
#[test]
fn two_key_removals_at_once_never_leave_no_key() {
    let dir = tempdir();
    let d = dir.path();
    for round in 0..3 {
        let repo = d.join(format!("repo{round}"));
        let r = ["--repo", s(&repo)];
        let cheap = ["--kdf-memory", "8M", "--kdf-iterations", "1"];
        ok(run(
            &mut cairn(),
            &[&["init", s(&repo)][..], &cheap].concat(),
        ));
        ok(run(
            cairn().env("CAIRN_NEW_PASSWORD", "second password"),
            &[&["key", "add"][..], &cheap, &r].concat(),
        ));
        let current = |pw: &str| {
            let keys = json(&ok(run(
                plain().env("CAIRN_PASSWORD", pw),
                &[&["key", "list", "--json"][..], &r].concat(),
            )));
            keys["keys"]
                .as_array()
                .unwrap()
                .iter()
                .find(|k| k["current"] == true)
                .unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let (first, second) = (current(PASSWORD), current("second password"));
        let remove = |pw: &str, id: &str| {
            plain()
                .env("CAIRN_PASSWORD", pw)
                .args([&["key", "remove", id][..], &r].concat())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let a = remove(PASSWORD, &second);
        let b = remove("second password", &first);
        let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
        let removed = outs.iter().filter(|o| o.status.success()).count();
        assert_eq!(removed, 1, "round {round}: {outs:?}");
        for o in outs.iter().filter(|o| !o.status.success()) {
            fails_with(o, "removed meanwhile");
        }
        // One password still opens it.
        let opens = [PASSWORD, "second password"]
            .iter()
            .filter(|pw| {
                run(
                    plain().env("CAIRN_PASSWORD", pw),
                    &[&["ls"][..], &r].concat(),
                )
                .status
                .success()
            })
            .count();
        assert_eq!(opens, 1, "round {round}");
    }
}

fn flip(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    let at = at.min(b.len() - 1);
    b[at] ^= 0x20;
    std::fs::write(path, b).unwrap();
}

#[test]
fn a_changed_byte_in_any_file_is_detected() {
    let dir = tempdir();
    let d = dir.path();
    let img = d.join("img");
    let data = mixed(3 << 20, 5);
    std::fs::write(&img, &data).unwrap();
    let pristine = d.join("pristine");
    ok(run(
        &mut cairn(),
        &["init", s(&pristine), "--kdf-memory", "8M"],
    ));
    ok(run(
        &mut cairn(),
        &[
            "backup",
            s(&img),
            "--repo",
            s(&pristine),
            "-n",
            "a",
            "-q",
            "--group",
            "256K",
        ],
    ));
    // Every file of the repository, at its start, middle and end: the
    // damage is reported (by the first command that reads the file), never
    // read as good data.
    let all = files(&pristine);
    let mut tried = 0;
    for f in &all {
        let rel = f.strip_prefix(&pristine).unwrap().to_path_buf();
        let len = std::fs::metadata(f).unwrap().len() as usize;
        for at in [0, len / 2, len.saturating_sub(1)] {
            let copy = d.join(format!("copy-{tried}"));
            tried += 1;
            let status = Command::new("cp")
                .args(["-a", s(&pristine), s(&copy)])
                .status()
                .unwrap();
            assert!(status.success());
            // The copy's target marker names no home (a relative target).
            flip(&copy.join(&rel), at);
            let v = run(
                &mut cairn(),
                &["verify", "--read-data", "--repo", s(&copy), "--json"],
            );
            let restored = d.join("restored");
            let r = run(
                &mut cairn(),
                &["restore", "a", s(&restored), "--repo", s(&copy), "-q"],
            );
            let verify_ok = v.status.success()
                && serde_json::from_slice::<serde_json::Value>(&v.stdout)
                    .map(|j| j["ok"] == true)
                    .unwrap_or(false);
            let restore_ok = r.status.success() && std::fs::read(&restored).unwrap() == data;
            let err = String::from_utf8_lossy(&v.stderr).to_string()
                + &String::from_utf8_lossy(&r.stderr);
            assert!(!err.contains("panicked"), "{}: {err}", rel.display());
            assert!(
                !(verify_ok && restore_ok),
                "a byte changed at {at} of {} went unnoticed",
                rel.display()
            );
            let _ = std::fs::remove_file(&restored);
            std::fs::remove_dir_all(&copy).unwrap();
        }
    }
    assert!(tried >= 5 * 3, "{all:?}");
}

/// A key file planted with an absurd Argon2id cost (or damaged) neither
/// makes cairn allocate it nor locks out the real key; with a wrong
/// password the damaged key is named.
#[test]
fn a_planted_key_file_locks_nobody_out() {
    let dir = tempdir();
    let d = dir.path();
    let repo = d.join("repo");
    ok(run(&mut cairn(), &["init", s(&repo), "--kdf-memory", "8M"]));
    let keys = repo.join("keys");
    let real = std::fs::read_dir(&keys)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let data = std::fs::read(&real).unwrap();
    let mut body: serde_json::Value = serde_json::from_slice(&data[24..data.len() - 32]).unwrap();
    // 4 TiB of memory, and a created time before the real key's, so it
    // is tried first.
    body["memory_kib"] = serde_json::json!(u32::MAX);
    body["created"] = serde_json::json!(0);
    let planted = cairn_store::internals::seal(
        cairn_store::internals::Kind::Key,
        1,
        &serde_json::to_vec(&body).unwrap(),
    );
    std::fs::write(keys.join("00000000000000000000000000000000"), planted).unwrap();
    ok(run(&mut cairn(), &["ls", "--repo", s(&repo)]));
    let err = fails_with(
        &run(
            plain().env("CAIRN_PASSWORD", "not it"),
            &["ls", "--repo", s(&repo)],
        ),
        "wrong password",
    );
    assert!(err.contains("damaged key file"), "{err}");
    assert!(err.contains("beyond what cairn allows"), "{err}");
    // key list names it (and lists the good key); key remove removes it.
    let out = ok(run(
        &mut cairn(),
        &["key", "list", "--json", "--repo", s(&repo)],
    ));
    let listed = json(&out);
    assert_eq!(listed["keys"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(
        listed["damaged"][0]["id"],
        "00000000000000000000000000000000"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used"));
    // verify says so too (it said "ok").
    let out = run(&mut cairn(), &["verify", "--json", "--repo", s(&repo)]);
    assert!(!out.status.success());
    let v = json(&out);
    assert_eq!(v["problems"][0]["kind"], "key", "{v}");
    ok(run(
        &mut cairn(),
        &["key", "remove", "0000", "--repo", s(&repo)],
    ));
    ok(run(&mut cairn(), &["verify", "--repo", s(&repo)]));
    let err = fails_with(
        &run(
            plain().env("CAIRN_PASSWORD", "not it"),
            &["ls", "--repo", s(&repo)],
        ),
        "wrong password",
    );
    assert!(!err.contains("damaged"), "{err}");
}

/// Regression (outside QA): in an encrypted repository an image's name
/// is inside its manifests, and one damaged manifest (an image's only
/// snapshot) stopped `ls`, `verify`, `stats` and `forget` for every
/// image. Now the image is listed as `#DIR`, reported where it is, left
/// out of the policy (kept), and `rm` can remove it.
#[test]
fn a_damaged_manifest_stops_no_report_of_the_other_images() {
    let dir = tempdir();
    let d = dir.path();
    let repo = d.join("r");
    ok(run(&mut cairn(), &["init", s(&repo), "--reserve", "0"]));
    let img = d.join("img");
    std::fs::write(&img, mixed(300_000, 5)).unwrap();
    for name in ["a", "b"] {
        ok(run(
            &mut cairn(),
            &["backup", s(&img), "--repo", s(&repo), "--name", name, "-q"],
        ));
    }
    let manifests: Vec<PathBuf> = files(&repo.join("snapshots"));
    assert_eq!(manifests.len(), 2);
    let bad = &manifests[0];
    let mut bytes = std::fs::read(bad).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(bad, &bytes).unwrap();
    let dir_name = bad.parent().unwrap().file_name().unwrap().to_str().unwrap();
    let unnamed = format!("#{dir_name}@1");
    let args = |verb: &[&str]| {
        let mut v: Vec<String> = verb.iter().map(|a| a.to_string()).collect();
        v.extend(["--repo".into(), s(&repo).into(), "--json".into()]);
        v
    };
    let json_of = |verb: &[&str]| {
        let a = args(verb);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let out = run(&mut cairn(), &a);
        assert_eq!(out.status.code(), Some(1), "{verb:?}");
        json(&out)
    };
    let ls = json_of(&["ls"]);
    assert_eq!(ls["snapshots"].as_array().unwrap().len(), 1, "{ls}");
    assert!(
        ls["unreadable"][0].as_str().unwrap().contains(&unnamed),
        "{ls}"
    );
    let v = json_of(&["verify"]);
    assert_eq!(v["ok"], false, "{v}");
    assert!(v.to_string().contains(&unnamed), "{v}");
    let st = json_of(&["stats"]);
    assert_eq!(st["images"], 2, "{st}");
    let f = json_of(&["forget", "--keep-last", "1", "-n"]);
    assert_eq!(f["snapshots"].as_array().unwrap().len(), 1, "{f}");
    assert!(
        f["unreadable"][0].as_str().unwrap().contains(&unnamed),
        "{f}"
    );
    // gc refuses while a manifest cannot be read (it could not mark).
    assert!(!run(&mut cairn(), &["gc", "--repo", s(&repo)])
        .status
        .success());
    ok(run(&mut cairn(), &["rm", &unnamed, "--repo", s(&repo)]));
    let v = json(&ok(run(
        &mut cairn(),
        &["verify", "--repo", s(&repo), "--json"],
    )));
    assert_eq!(v["ok"], true, "{v}");
    // A name no backup can take.
    let out = run(
        &mut cairn(),
        &[
            "backup",
            s(&img),
            "--repo",
            s(&repo),
            "--name",
            &unnamed[..33],
            "-q",
        ],
    );
    assert!(!out.status.success());
}

/// Outside QA: with umask 022 every repository file was 0644 (the key
/// files too: the sealed master key and its salt, all an attacker needs
/// to guess the password offline). As restic: files 0600, directories
/// 0700, whatever the umask lets through besides.
#[test]
fn repository_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir();
    let repo = dir.path().join("r");
    ok(run(&mut cairn(), &["init", s(&repo)]));
    let img = dir.path().join("img");
    std::fs::write(&img, mixed(200_000, 9)).unwrap();
    ok(run(
        &mut cairn(),
        &["backup", s(&img), "--repo", s(&repo), "--name", "a", "-q"],
    ));
    let mut open = Vec::new();
    let mut dirs = vec![repo.clone()];
    while let Some(d) = dirs.pop() {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode();
        if mode & 0o077 != 0 {
            open.push((d.clone(), mode));
        }
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if std::fs::metadata(&p).unwrap().permissions().mode() & 0o077 != 0 {
                open.push((
                    p.clone(),
                    std::fs::metadata(&p).unwrap().permissions().mode(),
                ));
            }
        }
    }
    assert!(open.is_empty(), "{open:?}");
    // key list --json shows no sealed key or salt.
    let keys = json(&ok(run(
        &mut cairn(),
        &["key", "list", "--repo", s(&repo), "--json"],
    )));
    assert!(keys["keys"][0]["id"].is_string(), "{keys}");
    assert!(keys["keys"][0].get("master").is_none() && keys["keys"][0].get("salt").is_none());
}

/// Whether `out`'s stderr warns that `snap` vanished.
fn warns_vanished(out: &Output, snap: &str) -> bool {
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines().any(|l| {
        l.contains(&format!("snapshot {snap} was seen")) && l.contains("no removal record")
    })
}

/// `cairn` (a password, or none for a plain repository) keeping what it
/// saw in `state`.
fn with_state(plain_repo: bool, state: &Path) -> Command {
    let mut c = if plain_repo { plain() } else { cairn() };
    c.env("CAIRN_STATE_DIR", state);
    c
}

/// The snapshot numbers `ls --json` printed.
fn numbers(out: &Output) -> Vec<u64> {
    json(out)["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["snapshot"].as_u64().unwrap())
        .collect()
}

/// `cp -a from to`.
fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .args(["-a", s(from), s(to)])
        .status()
        .unwrap();
    assert!(st.success(), "cp -a {}", from.display());
}

/// `repo`'s snapshots put back as `saved` held them: a rollback.
fn roll_back(repo: &Path, saved: &Path) {
    std::fs::remove_dir_all(repo.join("snapshots")).unwrap();
    copy_tree(saved, &repo.join("snapshots"));
}

/// A test's folder, with its state directory, repository path and a data
/// file of `len` bytes: (folder, state, repository, data).
fn seen_setup(len: usize, seed: u64) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let dir = tempdir();
    let state = dir.path().join("state");
    let repo = dir.path().join("r");
    let data = dir.path().join("data");
    std::fs::write(&data, mixed(len, seed)).unwrap();
    (dir, state, repo, data)
}

#[test]
fn a_snapshot_gone_without_removal_is_reported_until_accepted() {
    let (dir, state, repo, data) = seen_setup(256 << 10, 5);
    let c = || with_state(false, &state);
    let okr = |args: &[&str]| ok(run(&mut c(), args));
    okr(&["init", s(&repo)]);
    let backup = |expect: u64| {
        let out = okr(&[
            "backup",
            "-q",
            "--repo",
            s(&repo),
            "--name",
            "img",
            s(&data),
        ]);
        let listed = numbers(&okr(&["ls", "--repo", s(&repo), "--json"]));
        assert_eq!(listed.last(), Some(&expect), "{listed:?}");
        out
    };
    backup(1);
    backup(2);
    // A removal through cairn leaves a sealed record, and is no loss.
    okr(&["rm", "--repo", s(&repo), "img@1"]);
    let removed: Vec<PathBuf> = files(&repo.join("removed"));
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert!(removed[0].ends_with("0000000001.rm"), "{removed:?}");
    assert!(
        holding(&repo.join("removed"), b"img").is_empty(),
        "the name is sealed"
    );
    // The repository's snapshots as they were, to be put back.
    let old = dir.path().join("old-snapshots");
    copy_tree(&repo.join("snapshots"), &old);
    backup(3);
    let out = okr(&["ls", "--repo", s(&repo)]);
    assert!(!warns_vanished(&out, "img@1"), "removed, not lost");
    // Rolled back: snapshot 3 is gone.
    roll_back(&repo, &old);
    let out = okr(&["ls", "--repo", s(&repo)]);
    assert!(warns_vanished(&out, "img@3"), "{out:?}");
    // A record of another snapshot, copied into its place, and a damaged
    // one, do not pass for its removal.
    let rec_dir = removed[0].parent().unwrap();
    let planted = rec_dir.join("0000000003.rm");
    std::fs::copy(&removed[0], &planted).unwrap();
    let out = okr(&["ls", "--repo", s(&repo)]);
    assert!(warns_vanished(&out, "img@3"), "{out:?}");
    std::fs::write(&planted, b"CAIRNMET not a record").unwrap();
    let out = okr(&["ls", "--repo", s(&repo)]);
    assert!(warns_vanished(&out, "img@3"), "{out:?}");
    // gc would free its chunks: it refuses, naming it.
    let out = run(&mut c(), &["gc", "--repo", s(&repo)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let refusal: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("gc deletes nothing while"))
        .collect();
    assert!(refusal.len() == 1 && refusal[0].contains("img@3"), "{err}");
    // verify reports it.
    let out = run(&mut c(), &["verify", "--repo", s(&repo), "--json"]);
    assert!(!out.status.success());
    let v = json(&out);
    let kinds: Vec<&str> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["vanished-snapshot"], "{v}");
    // Another machine never saw it.
    let elsewhere = dir.path().join("elsewhere");
    let out = ok(run(
        &mut with_state(false, &elsewhere),
        &["ls", "--repo", s(&repo)],
    ));
    assert!(!warns_vanished(&out, "img@3"));
    // Accepted: named once, then neither reported nor in gc's way.
    let out = okr(&["verify", "--repo", s(&repo), "--accept-vanished"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("forgotten as gone") && said.contains("img@3"),
        "{said}"
    );
    let out = okr(&["ls", "--repo", s(&repo)]);
    assert!(!warns_vanished(&out, "img@3"), "{out:?}");
    okr(&["gc", "--repo", s(&repo)]);
    // Numbers are never given twice: 3 has a record (planted, here), so
    // the next backup is 4.
    std::fs::remove_file(&planted).unwrap();
    std::fs::copy(&removed[0], &planted).unwrap();
    backup(4);
    okr(&["rm", "--repo", s(&repo), "img@2"]);
    let out = okr(&["ls", "--repo", s(&repo)]);
    assert!(
        String::from_utf8_lossy(&out.stderr).trim().is_empty(),
        "{out:?}"
    );
}

#[test]
fn a_manifest_deleted_by_hand_in_a_plain_repository_is_reported() {
    let (dir, state, repo, data) = seen_setup(64 << 10, 6);
    let c = || with_state(true, &state);
    let okr = |args: &[&str]| ok(run(&mut c(), args));
    okr(&["init", "--encryption", "none", s(&repo)]);
    for _ in 0..3 {
        okr(&["backup", "-q", "--repo", s(&repo), "--name", "a", s(&data)]);
    }
    okr(&["backup", "-q", "--repo", s(&repo), "--name", "b", s(&data)]);
    std::fs::remove_file(repo.join("snapshots/a/0000000002.snap")).unwrap();
    // Any listing warns: of every image (ls), or of the one (restore).
    let out = okr(&["ls", "--repo", s(&repo)]);
    assert!(warns_vanished(&out, "a@2"), "{out:?}");
    let out = run(
        &mut c(),
        &[
            "restore",
            "-q",
            "--repo",
            s(&repo),
            "a",
            s(&dir.path().join("out")),
        ],
    );
    assert!(
        out.status.success() && warns_vanished(&out, "a@2"),
        "{out:?}"
    );
    // The whole image removed by hand: every snapshot of it.
    std::fs::remove_dir_all(repo.join("snapshots/b")).unwrap();
    let out = okr(&["ls", "--repo", s(&repo)]);
    assert!(
        warns_vanished(&out, "a@2") && warns_vanished(&out, "b@1"),
        "{out:?}"
    );
    let out = okr(&["verify", "--repo", s(&repo), "--accept-vanished"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("a@2, b@1"), "{said}");
    let out = okr(&["ls", "--repo", s(&repo)]);
    assert!(
        String::from_utf8_lossy(&out.stderr).trim().is_empty(),
        "{out:?}"
    );
    // The latest removed, the next backup takes the number after it
    // (before removal records it took the removed one's again).
    okr(&["rm", "--repo", s(&repo), "a@3"]);
    okr(&["backup", "-q", "--repo", s(&repo), "--name", "a", s(&data)]);
    assert_eq!(numbers(&okr(&["ls", "--repo", s(&repo), "--json"])), [1, 4]);
}

#[test]
fn a_machine_that_only_backs_up_notices_its_latest_snapshot_lost() {
    let (dir, state, repo, data) = seen_setup(64 << 10, 7);
    let c = || with_state(true, &state);
    let okr = |args: &[&str]| ok(run(&mut c(), args));
    okr(&["init", "--encryption", "none", s(&repo)]);
    let backup = || okr(&["backup", "-q", "--repo", s(&repo), "--name", "a", s(&data)]);
    backup();
    let before = dir.path().join("before");
    copy_tree(&repo.join("snapshots"), &before);
    // No listing between: the backup itself records its snapshot.
    backup();
    roll_back(&repo, &before);
    // The next backup warns, and does not take the lost number (which
    // would hide the loss).
    let out = backup();
    assert!(warns_vanished(&out, "a@2"), "{out:?}");
    assert_eq!(numbers(&okr(&["ls", "--repo", s(&repo), "--json"])), [1, 3]);
    let out = run(&mut c(), &["verify", "--repo", s(&repo), "--json"]);
    assert!(!out.status.success());
    assert!(
        json(&out)["problems"].to_string().contains("a@2"),
        "{out:?}"
    );
}

/// `init --from SRC --copy-chunker-params` cuts where SRC cuts (restic's
/// flag of that name): a snapshot copied from SRC adds no chunk to a
/// repository that already holds a backup of the same bytes. One made
/// without it has a chunker secret of its own and stores the copy again.
/// A plain repository cannot take a keyed chunker.
#[test]
fn init_can_cut_as_another_repository() {
    let dir = tempdir();
    let d = dir.path();
    let img = d.join("img");
    std::fs::write(&img, marked_image()).unwrap();
    let src = d.join("src");
    ok(run(&mut cairn(), &["init", s(&src)]));
    let backup = |repo: &Path, name: &str| {
        ok(run(
            &mut cairn(),
            &["backup", s(&img), "--repo", s(repo), "--name", name, "-q"],
        ));
    };
    backup(&src, "a");
    for shared in [true, false] {
        let dst = d.join(format!("dst-{shared}"));
        let mut args = vec!["init", s(&dst), "--json"];
        if shared {
            args.extend(["--from", s(&src), "--copy-chunker-params"]);
        }
        let init = json(&ok(run(
            cairn().env("CAIRN_FROM_PASSWORD", PASSWORD),
            &args,
        )));
        assert_eq!(init["chunker_table"], "keyed", "{init}");
        backup(&dst, "local");
        let copied = json(&ok(run(
            cairn().env("CAIRN_FROM_PASSWORD", PASSWORD),
            &["copy", "--from", s(&src), "--repo", s(&dst), "-q", "--json"],
        )));
        let new_chunks = copied["new_chunks"].as_u64().unwrap();
        if shared {
            assert_eq!(new_chunks, 0, "{copied}");
        } else {
            // 8 MiB in chunks of 32 KiB on average.
            assert!(new_chunks > 100, "{copied}");
        }
    }
    fails_with(
        &run(
            plain().env("CAIRN_FROM_PASSWORD", PASSWORD),
            &[
                "init",
                s(&d.join("plain")),
                "--encryption",
                "none",
                "--from",
                s(&src),
                "--copy-chunker-params",
            ],
        ),
        &format!(
            "--from {}: its chunker is keyed, and a repository that is not encrypted has \
             nowhere to keep the secret",
            src.display()
        ),
    );
    assert!(!d.join("plain").exists());
    // A password for a plain repository is refused before the source is
    // opened (no password of its own asked for).
    let pw = d.join("pw");
    std::fs::write(&pw, "x\n").unwrap();
    fails_with(
        &run(
            plain().env_remove("CAIRN_FROM_PASSWORD"),
            &[
                "init",
                s(&d.join("plain")),
                "--encryption",
                "none",
                "--password-file",
                s(&pw),
                "--from",
                s(&src),
                "--copy-chunker-params",
            ],
        ),
        "takes no password",
    );
    // Cutting as a plain repository (the public table) is allowed, and
    // warned of.
    let plain_src = d.join("plain-src");
    ok(run(
        &mut plain(),
        &["init", s(&plain_src), "--encryption", "none"],
    ));
    let out = ok(run(
        &mut cairn(),
        &[
            "init",
            s(&d.join("public")),
            "--from",
            s(&plain_src),
            "--copy-chunker-params",
            "--json",
        ],
    ));
    assert_eq!(json(&out)["chunker_table"], "public");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: --from") && err.contains("public table"),
        "{err}"
    );
    // Each flag needs the other.
    let x = d.join("x");
    for args in [vec!["--from", s(&src)], vec!["--copy-chunker-params"]] {
        let mut all = vec!["init", s(&x)];
        all.extend(args);
        let out = run(&mut cairn(), &all);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("required"), "{err}");
        assert!(!x.exists());
    }
}
