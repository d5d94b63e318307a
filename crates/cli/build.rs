//! The commit cairn is built from, for `cairn --version`: benchmark runs
//! record which build they timed (`bench/*.py` print `--version`), and a
//! bug report names the code it ran. Outside a git checkout of cairn (a
//! crate tarball, also one unpacked inside another repository) the
//! version is the package's alone. Changes not committed are not marked:
//! the version names the commit they were made on.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let version = env!("CARGO_PKG_VERSION");
    // This file is tracked only in cairn's own checkout.
    let ours = git(&["ls-files", "--full-name", "build.rs"]).is_some();
    let commit = ours
        .then(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .flatten();
    let date = ours
        .then(|| git(&["log", "-1", "--format=%cd", "--date=short"]))
        .flatten();
    let full = match (commit, date) {
        (Some(c), Some(d)) => format!("{version} ({c} {d})"),
        (Some(c), None) => format!("{version} ({c})"),
        _ => version.to_string(),
    };
    println!("cargo:rustc-env=CAIRN_VERSION={full}");
    // Built again when HEAD moves: a commit, a checkout (HEAD itself, its
    // log, which every commit and checkout appends to, the branch's ref,
    // or packed refs after a gc, when the branch has no file of its own).
    if let Some(dir) = ours.then(|| git(&["rev-parse", "--git-dir"])).flatten() {
        let dir = PathBuf::from(dir);
        watch(&dir.join("HEAD"));
        watch(&dir.join("logs").join("HEAD"));
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let common = git(&["rev-parse", "--git-common-dir"]).map_or(dir.clone(), PathBuf::from);
            watch(&common.join(r));
            watch(&common.join("packed-refs"));
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

fn watch(p: &Path) {
    if p.exists() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
