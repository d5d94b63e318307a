//! Helpers shared by the CLI integration tests: the built binary, peers
//! that must exist under CI, deterministic test data.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The password of the repositories the tests make: `cairn init` encrypts
/// by default, so every test runs on encrypted repositories unless it
/// asks for `--encryption none` (and drops the password, [`plain`]).
pub const PASSWORD: &str = "cairn test password";

/// The cairn binary built for this test run, with [`PASSWORD`] in its
/// environment (and no password source of the user's), and the overlays
/// of writable images under the temporary directory, not the user's
/// state directory (each repository has its own folder there).
pub fn cairn() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    c.env(
        "CAIRN_STATE_DIR",
        std::env::temp_dir().join("cairn-test-state"),
    )
    // Served images spill compact copies here, not into the home
    // directory (tests that need their own set it again).
    .env(
        "CAIRN_CACHE_DIR",
        std::env::temp_dir().join("cairn-test-cache"),
    )
    .env_remove("CAIRN_PASSWORD_FILE")
    .env_remove("CAIRN_PASSWORD_COMMAND")
    .env_remove("CAIRN_NEW_PASSWORD")
    .env_remove("CAIRN_NEW_PASSWORD_FILE")
    .env("CAIRN_PASSWORD", PASSWORD);
    c
}

/// Where the tests' cairn keeps the overlays of writable images.
pub fn state_dir() -> PathBuf {
    std::env::temp_dir().join("cairn-test-state")
}

/// [`cairn`] without a password: for plain repositories
/// (`--encryption none`), which refuse a password.
pub fn plain() -> Command {
    let mut c = cairn();
    c.env_remove("CAIRN_PASSWORD");
    c
}

/// A link named `tool` in `dir` to the cairn binary (which then acts as
/// that tool); its path.
pub fn cairn_link(dir: &Path, tool: &str) -> PathBuf {
    let link = dir.join(tool);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cairn"), &link).unwrap();
    link
}

/// The tool `tool` and cairn's link of that name (in `dir`), each with the
/// name of its side.
pub fn tool_and_link(dir: &Path, tool: &str) -> [(&'static str, PathBuf); 2] {
    [
        ("peer", PathBuf::from(tool)),
        ("link", cairn_link(dir, tool)),
    ]
}

/// The JSON `out` printed on stdout.
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// Run cairn (without a CAIRN_REPO from the caller's environment).
pub fn run(args: &[&str]) -> Output {
    cairn()
        .env_remove("CAIRN_REPO")
        .args(args)
        .output()
        .expect("run cairn")
}

/// Run cairn in directory `dir` (names relative to it).
pub fn run_in(dir: &Path, args: &[&str]) -> Output {
    cairn()
        .env_remove("CAIRN_REPO")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run cairn")
}

/// `out`, asserting success (with both streams in the message).
pub fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run a peer tool to completion.
pub fn tool(name: &str, args: &[&str]) -> Output {
    Command::new(name)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name}: {e}"))
}

/// A path as an argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A requirement other than a tool on PATH: under `CI=true` a missing one
/// fails the test; elsewhere the caller skips with a message.
pub fn need(cond: bool, what: &str) -> bool {
    if !cond {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{what} is missing; .ci/run must provide it");
        }
        eprintln!("skipping: {what} is missing");
    }
    cond
}

/// Is a peer tool on PATH? Under `CI=true` a missing peer fails the test;
/// elsewhere the caller skips with a message.
pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("peer tool {tool} is missing; .ci/run must install it");
        }
        eprintln!("skipping: {tool} not installed");
    }
    found
}

/// A Python with the `snappy` module (python-snappy), for the snappy
/// framing interop: `CAIRN_SNAPPY_PYTHON` or the venv `.ci/run` makes.
pub fn snappy_python() -> Option<PathBuf> {
    let candidates = [
        std::env::var("CAIRN_SNAPPY_PYTHON").ok().map(PathBuf::from),
        Some(PathBuf::from("/opt/cairn-venv/bin/python")),
    ];
    for c in candidates.into_iter().flatten() {
        let ok = Command::new(&c)
            .args(["-c", "import snappy"])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return Some(c);
        }
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("python-snappy is missing; .ci/run must install it");
    }
    eprintln!("skipping: no python with the snappy module");
    None
}

/// Run `cmd` with `input` on stdin; returns the output.
pub fn pipe(cmd: &mut Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        // The child may exit early on bad input; a broken pipe is fine.
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait");
    writer.join().expect("writer thread");
    out
}

/// Run `tool args` on stdin input and return stdout, asserting success.
pub fn run_ok(tool: &str, args: &[&str], input: &[u8]) -> Vec<u8> {
    let out = pipe(Command::new(tool).args(args), input);
    assert!(
        out.status.success(),
        "{tool} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Run cairn with args on stdin input; returns the whole output.
pub fn cairn_pipe(args: &[&str], input: &[u8]) -> Output {
    pipe(cairn().args(args), input)
}

/// Run cairn and assert success, returning stdout.
pub fn cairn_ok(args: &[&str], input: &[u8]) -> Vec<u8> {
    let out = cairn_pipe(args, input);
    assert!(
        out.status.success(),
        "cairn {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Random bytes (incompressible), from a seed.
#[allow(unused_imports)] // Each test binary uses a different subset.
pub use cairn_testkit::noise;

/// Deterministic mixed data: text-like runs, zero pages, random bytes, so
/// every codec has something to do and blocks differ.
pub fn mixed(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n);
    let words: [&[u8]; 6] = [b"kernel ", b"page ", b"cairn ", b"0000 ", b"\n", b"block "];
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        match x % 8 {
            0 => out.extend(std::iter::repeat_n(0u8, (x >> 8) as usize % 5000)),
            1 | 2 => out.extend((0..(x >> 8) as usize % 300).map(|i| (x >> (i % 56)) as u8)),
            _ => {
                for i in 0..((x >> 8) % 40) {
                    out.extend_from_slice(words[((x >> (i % 60)) % 6) as usize]);
                }
            }
        }
    }
    out.truncate(n);
    out
}

/// `mkfifo PATH`.
pub fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("no NUL in a path");
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
}

/// A fresh temporary directory.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Names in a directory, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Files under `root` (not directories), relative, sorted; an ext4
/// `lost+found` is left out.
pub fn tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let e = e.expect("entry");
            let p = e.path();
            let rel = p.strip_prefix(root).expect("under root").to_path_buf();
            if rel == Path::new("lost+found") {
                continue;
            }
            if e.file_type().expect("file type").is_dir() {
                todo.push(p);
            } else {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// Words for text-like test data (compressible, with repeats).
pub const WORDS: [&[u8]; 12] = [
    b"cairn ",
    b"stores ",
    b"images ",
    b"kernel ",
    b"page ",
    b"block ",
    b"\n",
    b"0000 ",
    b"snapshot ",
    b"of ",
    b"the ",
    b"disk ",
];
