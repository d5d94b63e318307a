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
    Repository::open(other.root()).unwrap();
    Repository::init(&d.join("repo"), &[d.join("t0"), d.join("new/t1")], None).unwrap();
}
