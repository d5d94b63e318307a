//! Creating and opening repositories: a failed `init` leaves nothing
//! behind, and a repository's targets are its own.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

use cairn_store::Repository;
use std::fs;
use std::path::{Path, PathBuf};

/// Every path under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            if p.is_dir() && !p.is_symlink() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Regression: an `init` that failed part way (here: a target that
/// cannot be created, because a file is in its path) left the repository
/// directory half made, and the targets made before the failure marked
/// as targets, so that running init again failed too. Now init removes
/// what it made, and only that.
#[test]
fn failed_init_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("a-file"), b"not a directory").unwrap();
    // Another repository's target, which init must not touch.
    let other = Repository::init(&d.join("other"), &[d.join("theirs")], None).unwrap();
    let before = tree(d);

    let blocked = d.join("a-file").join("t");
    let cases: Vec<(&str, Vec<PathBuf>)> = vec![
        ("unmakeable target", vec![blocked.clone()]),
        (
            "new target (new parents too), then an unmakeable one",
            vec![d.join("new/parent/t0"), blocked.clone()],
        ),
        (
            "new target, then another repository's",
            vec![d.join("t0"), d.join("theirs")],
        ),
        ("target given twice", vec![d.join("t0"), d.join("t0")]),
    ];
    for (what, targets) in &cases {
        for existing_root in [false, true] {
            let root = d.join("repo");
            if existing_root {
                fs::create_dir(&root).unwrap();
            }
            let err = Repository::init(&root, targets, None).unwrap_err();
            assert!(!err.to_string().contains('\n'), "{what}: {err}");
            let mut want = before.clone();
            if existing_root {
                // An empty directory given as the repository stays.
                want.push(PathBuf::from("repo"));
                want.sort();
                assert!(tree(&root).is_empty(), "{what}: {:?}", tree(&root));
            }
            assert_eq!(tree(d), want, "{what} (root existed: {existing_root})");
            if existing_root {
                fs::remove_dir(&root).unwrap();
            }
        }
    }
    // The other repository is intact, and init works after the failures.
    Repository::open(other.local_root().unwrap()).unwrap();
    Repository::init(&d.join("repo"), &[d.join("t0"), d.join("new/t1")], None).unwrap();
}

/// `cp -a from to`, keeping everything (the way a user copies a
/// repository).
fn cp_a(from: &Path, to: &Path) {
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Store `data` as a new snapshot of `name`.
fn put(r: &Repository, name: &str, data: &[u8]) {
    // Waits: a child another test spawns (cp -a) holds a copy of every
    // descriptor, this lock's too, from fork until exec.
    let lock = r.session("test").unwrap();
    let opts = cairn_store::BackupOptions {
        name: name.into(),
        codec: "lz4".parse().unwrap(),
        chunker: cairn_store::DEFAULT_CHUNKER,
        threads: 1,
        group_size: cairn_store::DEFAULT_GROUP_SIZE,
        source: "test".into(),
        progress: None,
        time: None,
        tags: Vec::new(),
    };
    cairn_store::backup(r, &lock, &mut std::io::Cursor::new(data.to_vec()), &opts).unwrap();
}

fn data(seed: u8) -> Vec<u8> {
    (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
        .collect()
}

fn assert_refused(root: &Path, target: &Path, owner: &Path) {
    let e = Repository::open(root).unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(e.contains(target.to_str().unwrap()), "{e}");
    assert!(e.contains(owner.to_str().unwrap()), "{e}");
    assert!(e.contains("is a copy of it"), "{e}");
}

/// Regression: a copied repository (`cp -a`) whose targets are absolute
/// paths has the same id as the original and the same target paths, so
/// it opened, and its backups and gc wrote into (and deleted from) the
/// original's targets. A target's marker now names the repository
/// directory it belongs to, and a copy is refused at open.
#[test]
fn copied_repository_does_not_touch_the_originals_targets() {
    let dir = tempfile::tempdir().unwrap();
    let d = fs::canonicalize(dir.path()).unwrap();
    let (t0, t1) = (d.join("t0"), d.join("t1"));
    let orig = d.join("repo");
    let r = Repository::init(&orig, &[t0.clone(), t1.clone()], None).unwrap();
    put(&r, "a", &data(1));
    let targets_before = (tree(&t0), tree(&t1));

    let copy = d.join("copy");
    cp_a(&orig, &copy);
    assert_refused(&copy, &t0, &orig);
    assert_eq!((tree(&t0), tree(&t1)), targets_before);

    // The original is untouched and goes on working.
    let r = Repository::open(&orig).unwrap();
    put(&r, "a", &data(2));

    // A moved repository opens, and its first writer claims the targets:
    // a copy of it made afterwards is refused in turn.
    fs::remove_dir_all(&copy).unwrap();
    let moved = d.join("moved");
    fs::rename(&orig, &moved).unwrap();
    let r = Repository::open(&moved).unwrap();
    put(&r, "a", &data(3));
    let copy2 = d.join("copy2");
    cp_a(&moved, &copy2);
    assert_refused(&copy2, &t0, &moved);
    Repository::open(&moved).unwrap();
}

/// Markers written before they named their repository (version 1) still
/// open; the first writer claims the targets, after which a copy made
/// before the claim is refused.
#[test]
fn version_1_markers_are_claimed_by_the_first_writer() {
    use cairn_store::internals::{seal, Kind};
    let dir = tempfile::tempdir().unwrap();
    let d = fs::canonicalize(dir.path()).unwrap();
    let t0 = d.join("t0");
    let orig = d.join("repo");
    let r = Repository::init(&orig, std::slice::from_ref(&t0), None).unwrap();
    let marker = t0.join("cairn-target");
    assert_eq!(&fs::read(&marker).unwrap()[12..16], &2u32.to_le_bytes());
    // As version 1 wrote it.
    let v1 = format!(r#"{{"repository":"{}","target":0}}"#, r.id());
    fs::write(&marker, seal(Kind::TargetMarker, 1, v1.as_bytes())).unwrap();
    let copy = d.join("copy");
    cp_a(&orig, &copy);
    // Readers on both: nothing is written.
    Repository::open(&copy).unwrap();
    let r = Repository::open(&orig).unwrap();
    assert_eq!(
        fs::read(&marker).unwrap(),
        seal(Kind::TargetMarker, 1, v1.as_bytes())
    );
    put(&r, "a", &data(4));
    assert_eq!(&fs::read(&marker).unwrap()[12..16], &2u32.to_le_bytes());
    assert_refused(&copy, &t0, &orig);
}
