//! The commit cairn is built from, for `cairn --version`: benchmark runs
//! record which build they timed (`bench/*.py` print `--version`), and a
//! bug report names the code it ran. Outside a git checkout of cairn (a
//! crate tarball, also one unpacked inside another repository) the
//! version is the package's alone. A build with changes not committed to
//! the sources (`crates/*/src`, the manifests and build scripts,
//! `Cargo.lock`) names its
//! commit with `-dirty` after it, as `git describe --dirty` does.

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
    let top = ours
        .then(|| git(&["rev-parse", "--show-toplevel"]))
        .flatten()
        .map(PathBuf::from);
    let sources = top.as_deref().map(sources).unwrap_or_default();
    let commit = ours
        .then(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .flatten()
        .map(|c| match &top {
            Some(t) if dirty(t, &sources) => format!("{c}-dirty"),
            _ => c,
        });
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
    // And when a source changes (a directory is watched for any file in it).
    for p in &sources {
        watch(p);
    }
    println!("cargo:rerun-if-changed=build.rs");
}

/// What the binary is built from, under the checkout's top `top`: each
/// crate's `src` and manifest, the workspace's manifest and lock file.
fn sources(top: &Path) -> Vec<PathBuf> {
    let mut out = vec![top.join("Cargo.toml"), top.join("Cargo.lock")];
    if let Ok(dir) = std::fs::read_dir(top.join("crates")) {
        let mut crates: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        crates.sort();
        for c in crates {
            out.push(c.join("src"));
            out.push(c.join("Cargo.toml"));
            out.push(c.join("build.rs"));
        }
    }
    out.retain(|p| p.exists());
    out
}

/// Whether a tracked file among `sources` differs from HEAD (staged or
/// not). Untracked files are left out, as `git describe --dirty` does.
fn dirty(top: &Path, sources: &[PathBuf]) -> bool {
    let mut args: Vec<String> = ["status", "--porcelain", "--untracked-files=no", "--"]
        .map(String::from)
        .to_vec();
    args.extend(sources.iter().map(|p| p.display().to_string()));
    let out = Command::new("git").arg("-C").arg(top).args(&args).output();
    matches!(out, Ok(o) if o.status.success() && !o.stdout.is_empty())
}

fn watch(p: &Path) {
    if p.exists() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
