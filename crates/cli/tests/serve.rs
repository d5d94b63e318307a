//! `cairn serve` end to end with the real binary and real NBD clients:
//! nbdinfo, qemu-img, qemu-io, nbdcopy, fio's nbd engine, a filesystem
//! read through nbdfuse + fuse2fs, clean shutdown, clients that break the
//! protocol, and bad arguments.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------
// Helpers

/// Every tool, via [`have`] (so each missing one is named).
fn have_all(tools: &[&str]) -> bool {
    tools.iter().all(|t| have(t))
}

/// Where two buffers first differ, for messages.
fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

#[track_caller]
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        panic!(
            "{what}: {} bytes, want {}; first difference at {:?}",
            got.len(),
            want.len(),
            first_diff(got, want)
        );
    }
}

/// A repository at `dir/repo` with `images`: (name, contents of each
/// snapshot in order).
fn repo_with(dir: &Path, images: &[(&str, &[&[u8]])]) -> PathBuf {
    let repo = dir.join("repo");
    ok(run(&["init", s(&repo)]));
    back_up_into(dir, &repo, images);
    repo
}

/// [`repo_with`], the repository cutting with the public gear table (as a
/// plain one does): where its chunks are cut is the same on every run,
/// not drawn with its secret.
fn repo_with_public_cuts(dir: &Path, images: &[(&str, &[&[u8]])]) -> PathBuf {
    let public = dir.join("public");
    ok(plain()
        .args(["init", s(&public), "--encryption", "none"])
        .output()
        .unwrap());
    let repo = dir.join("repo");
    ok(run(&[
        "init",
        s(&repo),
        "--from",
        s(&public),
        "--copy-chunker-params",
    ]));
    back_up_into(dir, &repo, images);
    repo
}

/// Back up `images` (each a list of snapshots) into `repo`.
fn back_up_into(dir: &Path, repo: &Path, images: &[(&str, &[&[u8]])]) {
    for (name, snaps) in images {
        for (i, data) in snaps.iter().enumerate() {
            let f = dir.join(format!("{name}.{i}.src"));
            std::fs::write(&f, data).unwrap();
            ok(run(&[
                "backup",
                s(&f),
                "--repo",
                s(repo),
                "--name",
                name,
                "-q",
            ]));
            std::fs::remove_file(&f).unwrap();
        }
    }
}

/// A running `cairn serve`, stopped (SIGTERM, then SIGKILL) on drop.
struct Serve {
    child: Option<Child>,
    stderr: Arc<Mutex<Vec<String>>>,
    sock: Option<PathBuf>,
    port: Option<u16>,
}

impl Serve {
    /// Start `cairn serve args` and wait until it lists its exports.
    fn start(args: &[&str]) -> Serve {
        let mut child = cairn()
            .env_remove("CAIRN_REPO")
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cairn serve");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        let lines = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let mut serve = Serve {
            child: Some(child),
            stderr,
            sock: None,
            port: None,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("cairn serve: listening on ") {
                        if let Some(p) = rest.strip_prefix("nbd+unix:///?socket=") {
                            serve.sock = Some(PathBuf::from(p));
                        } else if let Some(a) = rest.strip_prefix("nbd://") {
                            let port = a.rsplit(':').next().unwrap();
                            serve.port = Some(port.parse().expect("port"));
                        }
                    }
                    if line.starts_with("cairn serve: exports:") {
                        return serve;
                    }
                }
                Err(e) => {
                    let status = serve.child.as_mut().unwrap().try_wait().unwrap();
                    panic!(
                        "cairn serve {args:?} not ready ({e}, status {status:?}): {}",
                        serve.stderr_text()
                    );
                }
            }
        }
    }

    fn stderr_text(&self) -> String {
        // The reader thread may lag the process's exit a little.
        std::thread::sleep(Duration::from_millis(50));
        self.stderr.lock().unwrap().join("\n")
    }

    /// `nbd+unix:///NAME?socket=SOCK`.
    fn uri(&self, name: &str) -> String {
        format!(
            "nbd+unix:///{name}?socket={}",
            self.sock.as_ref().expect("no unix socket").display()
        )
    }

    /// `nbd://127.0.0.1:PORT/NAME`.
    fn tcp_uri(&self, name: &str) -> String {
        format!("nbd://127.0.0.1:{}/{name}", self.port.expect("no TCP port"))
    }

    /// Still running?
    fn alive(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    /// Send `sig` and wait up to `timeout` for the exit.
    fn signal_and_wait(&mut self, sig: i32, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        // SAFETY: kill(2) on the pid of our own child, not yet reaped.
        unsafe {
            libc::kill(child.id() as i32, sig);
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(st) = child.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// SIGTERM: the exit status and how long it took, or a panic if it
    /// does not exit within `timeout`.
    fn stop(mut self, timeout: Duration) -> (ExitStatus, Duration) {
        let t = Instant::now();
        let st = self.signal_and_wait(libc::SIGTERM, timeout);
        let took = t.elapsed();
        match st {
            Some(st) => {
                self.child = None;
                (st, took)
            }
            None => panic!(
                "cairn serve did not exit within {timeout:?} of SIGTERM: {}",
                self.stderr_text()
            ),
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if self
            .signal_and_wait(libc::SIGTERM, Duration::from_secs(5))
            .is_none()
        {
            if let Some(c) = self.child.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// A peer process killed on drop (nbdfuse, qemu-io in a session).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Wait for `cond` up to `timeout`.
fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

// A minimal NBD client, for what the real clients refuse to do.

const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const EPERM: u32 = 1;

/// Read the server's greeting; returns its handshake flags.
fn greeting(s: &mut impl Read) -> u16 {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).expect("greeting");
    assert_eq!(&g[..8], b"NBDMAGIC");
    assert_eq!(&g[8..16], b"IHAVEOPT");
    u16::from_be_bytes([g[16], g[17]])
}

/// Fixed newstyle handshake with NBD_OPT_EXPORT_NAME; returns the size
/// and transmission flags.
fn attach<S: Read + Write>(s: &mut S, name: &str) -> (u64, u16) {
    let flags = greeting(s);
    let no_zeroes = flags & 2 != 0;
    let client: u32 = 1 | if no_zeroes { 2 } else { 0 };
    s.write_all(&client.to_be_bytes()).unwrap();
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    opt.extend_from_slice(&(name.len() as u32).to_be_bytes());
    opt.extend_from_slice(name.as_bytes());
    s.write_all(&opt).unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).expect("export info");
    if !no_zeroes {
        let mut z = [0u8; 124];
        s.read_exact(&mut z).unwrap();
    }
    (
        u64::from_be_bytes(r[..8].try_into().unwrap()),
        u16::from_be_bytes([r[8], r[9]]),
    )
}

fn request(s: &mut impl Write, cmd: u16, handle: u64, offset: u64, len: u32, data: &[u8]) {
    request_flagged(s, 0, cmd, handle, offset, len, data)
}

/// [`request`] with command flags.
fn request_flagged(
    s: &mut impl Write,
    flags: u16,
    cmd: u16,
    handle: u64,
    offset: u64,
    len: u32,
    data: &[u8],
) {
    let mut m = Vec::with_capacity(28 + data.len());
    m.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    m.extend_from_slice(&flags.to_be_bytes());
    m.extend_from_slice(&cmd.to_be_bytes());
    m.extend_from_slice(&handle.to_be_bytes());
    m.extend_from_slice(&offset.to_be_bytes());
    m.extend_from_slice(&len.to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
}

/// A simple reply: (error, handle).
fn simple_reply(s: &mut impl Read) -> (u32, u64) {
    let mut r = [0u8; 16];
    s.read_exact(&mut r).expect("reply");
    assert_eq!(
        u32::from_be_bytes(r[..4].try_into().unwrap()),
        SIMPLE_REPLY_MAGIC
    );
    (
        u32::from_be_bytes(r[4..8].try_into().unwrap()),
        u64::from_be_bytes(r[8..].try_into().unwrap()),
    )
}

/// One option request during the handshake.
fn option(s: &mut impl Write, opt: u32, data: &[u8]) {
    let mut m = b"IHAVEOPT".to_vec();
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
}

/// One option reply: (reply type, payload).
fn option_reply(s: &mut impl Read, opt: u32) -> (u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).expect("option reply");
    assert_eq!(
        u64::from_be_bytes(h[..8].try_into().unwrap()),
        0x0003_e889_0455_65a9
    );
    assert_eq!(u32::from_be_bytes(h[8..12].try_into().unwrap()), opt);
    let ty = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let mut p = vec![0u8; u32::from_be_bytes(h[16..].try_into().unwrap()) as usize];
    s.read_exact(&mut p).unwrap();
    (ty, p)
}

/// Fixed newstyle with NBD_OPT_STRUCTURED_REPLY and NBD_OPT_GO; returns
/// the size.
fn attach_structured<S: Read + Write>(s: &mut S, name: &str) -> u64 {
    let flags = greeting(s);
    let client: u32 = 1 | if flags & 2 != 0 { 2 } else { 0 };
    s.write_all(&client.to_be_bytes()).unwrap();
    option(s, 8, &[]); // NBD_OPT_STRUCTURED_REPLY
    assert_eq!(option_reply(s, 8).0, 1, "structured replies refused");
    let mut go = (name.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(name.as_bytes());
    go.extend_from_slice(&0u16.to_be_bytes());
    option(s, 7, &go); // NBD_OPT_GO
    let mut size = None;
    loop {
        match option_reply(s, 7) {
            (1, _) => break, // NBD_REP_ACK
            (3, p) => {
                // NBD_REP_INFO; NBD_INFO_EXPORT is type 0.
                if p[..2] == [0, 0] {
                    size = Some(u64::from_be_bytes(p[2..10].try_into().unwrap()));
                }
            }
            (ty, p) => panic!("NBD_OPT_GO: reply {ty:#x} {p:?}"),
        }
    }
    size.expect("no NBD_INFO_EXPORT")
}

/// The structured reply chunks to one request, up to NBD_REPLY_FLAG_DONE:
/// (type, cookie, payload).
fn chunks(s: &mut impl Read) -> Vec<(u16, u64, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).expect("structured reply");
        assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x668e_33ef);
        let flags = u16::from_be_bytes([h[4], h[5]]);
        let ty = u16::from_be_bytes([h[6], h[7]]);
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let mut p = vec![0u8; u32::from_be_bytes(h[16..].try_into().unwrap()) as usize];
        s.read_exact(&mut p).unwrap();
        out.push((ty, cookie, p));
        if flags & 1 != 0 {
            return out;
        }
    }
}

fn unix(sock: &Path) -> UnixStream {
    let s = UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn nbdinfo_json(args: &[&str]) -> serde_json::Value {
    let out = ok(tool("nbdinfo", args));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "nbdinfo {args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

// ---------------------------------------------------------------------
// 1. Listing

#[test]
fn nbdinfo_lists_every_export() {
    if !have("nbdinfo") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let v1 = noise(1_000_003, 1);
    let mut v2 = v1.clone();
    v2.extend_from_slice(&noise(4101, 2));
    let other = mixed(300_001, 3);
    let repo = repo_with(d, &[("img", &[&v1, &v2]), ("other", &[&other])]);
    std::fs::write(d.join("a.raw"), noise(65_536 + 7, 4)).unwrap();
    std::fs::write(d.join("b.img"), noise(12_288, 5)).unwrap();
    let sock = d.join("s.sock");
    let srv = Serve::start(&[
        "--file",
        s(&d.join("a.raw")),
        "--file",
        &format!("bee={},ro", s(&d.join("b.img"))),
        "--repo",
        s(&repo),
        "--image",
        "img@1",
        "--image",
        "other",
        "--socket",
        s(&sock),
    ]);
    let j = nbdinfo_json(&["--list", "--json", &srv.uri("")]);
    let mut got: Vec<(String, u64, bool)> = j["exports"]
        .as_array()
        .unwrap_or_else(|| panic!("no exports: {j}"))
        .iter()
        .map(|e| {
            (
                e["export-name"].as_str().unwrap().to_string(),
                e["export-size"].as_u64().unwrap(),
                e["is_read_only"].as_bool().unwrap(),
            )
        })
        .collect();
    got.sort();
    let mut want = vec![
        ("a.raw".to_string(), 65_543, false),
        ("bee".to_string(), 12_288, true),
        ("img@1".to_string(), v1.len() as u64, true),
        ("other".to_string(), other.len() as u64, true),
    ];
    want.sort();
    assert_eq!(got, want, "{j}");
    drop(srv);

    // Without --image: every image's latest snapshot, named NAME.
    let srv = Serve::start(&["--repo", s(&repo), "--socket", s(&sock)]);
    let j = nbdinfo_json(&["--list", "--json", &srv.uri("")]);
    let mut got: Vec<(String, u64)> = j["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["export-name"].as_str().unwrap().to_string(),
                e["export-size"].as_u64().unwrap(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("img".to_string(), v2.len() as u64),
            ("other".to_string(), other.len() as u64)
        ],
        "{j}"
    );
}

// ---------------------------------------------------------------------
// 2. and 3. Reading an image: bytes and map

const BIG: usize = 17_000_003;
const ZERO_AT: usize = 4 << 20;
const ZERO_LEN: usize = 8 << 20;

/// Random data with an 8 MiB run of zeros and an odd size; the second
/// snapshot changes a few bytes.
fn big_image() -> (Vec<u8>, Vec<u8>) {
    let mut v1 = noise(BIG, 21);
    v1[ZERO_AT..ZERO_AT + ZERO_LEN].fill(0);
    let mut v2 = v1.clone();
    v2[15_000_000..15_000_100].fill(0x5a);
    v2[1000..1003].copy_from_slice(b"two");
    (v1, v2)
}

#[test]
fn image_export_reads_like_restore() {
    if !have_all(&["qemu-img", "nbdcopy", "nbdinfo"]) {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let (v1, v2) = big_image();
    let repo = repo_with(d, &[("disk", &[&v1, &v2])]);
    let restored = |spec: &str| {
        let out = d.join(format!("restore-{spec}"));
        ok(run(&["restore", spec, s(&out), "--repo", s(&repo), "-q"]));
        let bytes = std::fs::read(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        bytes
    };
    let r1 = restored("disk@1");
    let r2 = restored("disk");
    assert_same(&r1, &v1, "restore disk@1");
    assert_same(&r2, &v2, "restore disk");

    let srv = Serve::start(&[
        "--repo",
        s(&repo),
        "--image",
        "disk",
        "--image",
        "disk@1",
        "--socket",
        s(&d.join("s.sock")),
        "--listen",
        "127.0.0.1:0",
    ]);
    for (name, want) in [("disk", &r2), ("disk@1", &r1)] {
        // qemu-img over the unix socket; it rounds the size up to 512.
        let out = d.join("qemu.raw");
        ok(tool(
            "qemu-img",
            &["convert", "-f", "raw", "-O", "raw", &srv.uri(name), s(&out)],
        ));
        let got = std::fs::read(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        assert!(
            got.len() >= BIG && got.len() < BIG + 512,
            "{name}: qemu-img wrote {} bytes",
            got.len()
        );
        assert!(got[BIG..].iter().all(|&b| b == 0), "{name}: tail");
        assert_same(&got[..BIG], want, &format!("qemu-img convert {name}"));

        // nbdcopy, over unix and over TCP.
        for uri in [srv.uri(name), srv.tcp_uri(name)] {
            let out = d.join("copy.raw");
            ok(tool("nbdcopy", &[&uri, s(&out)]));
            let got = std::fs::read(&out).unwrap();
            std::fs::remove_file(&out).unwrap();
            assert_same(&got, want, &format!("nbdcopy {uri}"));
        }
    }
    // The size over TCP too.
    let j = nbdinfo_json(&["--json", &srv.tcp_uri("disk")]);
    assert_eq!(j["exports"][0]["export-size"], BIG as u64, "{j}");
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "{st:?}");
}

#[test]
fn image_export_map_reports_holes() {
    if !have("nbdinfo") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let (v1, _) = big_image();
    let repo = repo_with(d, &[("disk", &[&v1])]);
    let srv = Serve::start(&["--repo", s(&repo), "--socket", s(&d.join("s.sock"))]);
    let j = nbdinfo_json(&["--map", "--json", &srv.uri("disk")]);
    let extents = j.as_array().unwrap_or_else(|| panic!("not a list: {j}"));
    let mut at = 0u64;
    let mut hole_in_run = 0u64;
    let mut data = 0u64;
    for e in extents {
        let off = e["offset"].as_u64().unwrap();
        let len = e["length"].as_u64().unwrap();
        let ty = e["type"].as_u64().unwrap();
        assert_eq!(off, at, "extents not contiguous: {j}");
        assert!(len > 0, "{j}");
        at += len;
        let range = &v1[off as usize..(off + len) as usize];
        if ty & 3 != 0 {
            // Hole or zero: the source must be all zeros there.
            assert!(
                range.iter().all(|&b| b == 0),
                "type {ty} over non-zero bytes at {off}+{len}: {j}"
            );
        } else {
            data += len;
        }
        if ty == 3 {
            let lo = off.max(ZERO_AT as u64);
            let hi = (off + len).min((ZERO_AT + ZERO_LEN) as u64);
            hole_in_run += hi.saturating_sub(lo);
        }
    }
    assert_eq!(at, BIG as u64, "map does not cover the image: {j}");
    assert!(
        hole_in_run >= (ZERO_LEN as u64) * 3 / 4,
        "only {hole_in_run} of the {ZERO_LEN} zero bytes reported as holes: {j}"
    );
    assert!(data >= (BIG - ZERO_LEN) as u64, "{j}");
}

// ---------------------------------------------------------------------
// 4. Writing with qemu-io, and read-only exports

fn qemu_io(uri: &str, cmds: &[&str]) -> Output {
    qemu_io_with(&[], uri, cmds)
}

/// qemu-io with options `opts` (e.g. `-t writeback`) before the commands.
fn qemu_io_with(opts: &[&str], uri: &str, cmds: &[&str]) -> Output {
    let mut args = vec!["-f", "raw"];
    args.extend_from_slice(opts);
    for c in cmds {
        args.push("-c");
        args.push(c);
    }
    args.push(uri);
    tool("qemu-io", &args)
}

/// `--file PATH,direct` of a file whose size is no multiple of 4096 said
/// a minimum block size of 4096, and qemu refused to open it for
/// writing: "Image size is not a multiple of request alignment".
#[test]
fn qemu_io_writes_the_tail_of_an_odd_sized_direct_file() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    const SIZE: usize = 1_000_001;
    let w = d.join("w.raw");
    std::fs::write(&w, vec![0x11u8; SIZE]).unwrap();
    let srv = Serve::start(&[
        "--file",
        &format!("{},direct", s(&w)),
        "--socket",
        s(&d.join("s.sock")),
    ]);
    let out = qemu_io(
        &srv.uri("w.raw"),
        &["write -P 0xab 999990 11", "flush", "read -P 0xab 999990 11"],
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "qemu-io failed: {text}");
    assert!(!text.contains("Pattern verification failed"), "{text}");
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
    let mut want = vec![0x11u8; SIZE];
    want[999_990..].fill(0xab);
    assert_same(&std::fs::read(&w).unwrap(), &want, "w.raw after qemu-io");
}

#[test]
fn qemu_io_writes_and_read_only_refuses() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    const SIZE: usize = 4 << 20;
    const K: usize = 1024;
    const M: usize = 1 << 20;
    let w = d.join("w.raw");
    std::fs::write(&w, vec![0x11u8; SIZE]).unwrap();
    let ro = d.join("ro.raw");
    let ro_data = noise(SIZE, 31);
    std::fs::write(&ro, &ro_data).unwrap();
    let img = noise(500_000, 32);
    let repo = repo_with(d, &[("img", &[&img])]);
    let srv = Serve::start(&[
        "--file",
        s(&w),
        "--file",
        &format!("{},ro", s(&ro)),
        "--repo",
        s(&repo),
        "--socket",
        s(&d.join("s.sock")),
    ]);

    let out = qemu_io(
        &srv.uri("w.raw"),
        &[
            "write -P 0xab 0 64k",
            "read -P 0xab 0 64k",
            "write -z 1M 64k",
            "read -P 0 1M 64k",
            "discard 2M 64k",
            "flush",
            // -f: FUA.
            "write -P 0xcd -f 3M 4k",
            "read -P 0xcd 3M 4k",
            "read -P 0x11 64k 4k",
        ],
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "qemu-io failed: {text}");
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert_eq!(text.matches("wrote ").count(), 3, "{text}");
    assert_eq!(text.matches("read ").count(), 4, "{text}");

    let got = std::fs::read(&w).unwrap();
    assert_eq!(got.len(), SIZE);
    let mut want = vec![0x11u8; SIZE];
    want[..64 * K].fill(0xab);
    want[M..M + 64 * K].fill(0);
    want[3 * M..3 * M + 4 * K].fill(0xcd);
    // Trimmed bytes may read as zeros or as before; nothing else changes.
    let trimmed = &got[2 * M..2 * M + 64 * K];
    assert!(
        trimmed.iter().all(|&b| b == 0) || trimmed.iter().all(|&b| b == 0x11),
        "trimmed range is neither zeros nor what it was"
    );
    want[2 * M..2 * M + 64 * K].copy_from_slice(trimmed);
    assert_same(&got, &want, "w.raw after qemu-io");

    // Read-only: the file export and the image refuse writes, but read.
    for name in ["ro.raw", "img"] {
        let out = qemu_io(&srv.uri(name), &["write -P 0x77 0 4k"]);
        assert!(
            !out.status.success(),
            "qemu-io wrote to read-only {name}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let out = tool(
        "qemu-io",
        &[
            "-r",
            "-f",
            "raw",
            "-c",
            &format!("read -P {:#x} 0 1", ro_data[0]),
            &srv.uri("ro.raw"),
        ],
    );
    assert!(
        out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("failed"),
        "read-only export does not read: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // A client that ignores the read-only flag gets EPERM, not a write.
    for name in ["ro.raw", "img"] {
        let mut c = unix(srv.sock.as_ref().unwrap());
        let (size, flags) = attach(&mut c, name);
        assert!(flags & 2 != 0, "{name}: NBD_FLAG_READ_ONLY not set");
        assert!(size > 4096);
        request(&mut c, CMD_WRITE, 7, 0, 4096, &[0x77u8; 4096]);
        let (err, handle) = simple_reply(&mut c);
        assert_eq!(
            (err, handle),
            (EPERM, 7),
            "{name}: write to a read-only export"
        );
        // The connection goes on: read what is there.
        request(&mut c, CMD_READ, 8, 0, 4096, &[]);
        let (err, handle) = simple_reply(&mut c);
        assert_eq!((err, handle), (0, 8));
        let mut buf = vec![0u8; 4096];
        c.read_exact(&mut buf).unwrap();
        let want = if name == "img" { &img } else { &ro_data };
        assert_same(&buf, &want[..4096], name);
        request(&mut c, CMD_DISC, 9, 0, 0, &[]);
    }
    assert_same(&std::fs::read(&ro).unwrap(), &ro_data, "ro.raw");
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "{st:?}");
    let out = ok(run(&["restore", "img", "-", "--repo", s(&repo), "-q"]));
    assert_same(&out.stdout, &img, "img after the write attempts");
}

/// `img` of `repo` served writable on `d`/s.sock, committed only on
/// request through the control socket `ctl` (or at the stop).
fn serve_rw_img(repo: &Path, d: &Path, ctl: &Path) -> Serve {
    Serve::start(&[
        "--repo",
        s(repo),
        "--image",
        "img,rw",
        "--socket",
        s(&d.join("s.sock")),
        "--control",
        s(ctl),
        "--commit-every",
        "0",
    ])
}

/// 4 KiB reads far apart (random), twice, of 6 MiB of noise served with
/// `tiers` (options of `cairn serve`; `spills`: copies are spilled, so
/// wait for them between the passes); what `cairn cache status
/// --control` then says of the image, as JSON and as its line.
fn tiers_after_random_reads(tiers: &[&str], spills: bool) -> (serde_json::Value, String) {
    let dir = tempdir();
    let d = dir.path();
    let img = noise(6 << 20, 17);
    let repo = repo_with(d, &[("img", &[&img])]);
    let (ctl, sock) = (d.join("ctl.sock"), d.join("s.sock"));
    let mut args = vec![
        "--repo",
        s(&repo),
        "--socket",
        s(&sock),
        "--control",
        s(&ctl),
        "--image-cache",
        "1M",
    ];
    args.extend_from_slice(tiers);
    let srv = Serve::start(&args);
    let places = ["0", "3M", "5M", "1500k"];
    let reads: Vec<String> = places.iter().map(|p| format!("read {p} 4k")).collect();
    let reads: Vec<&str> = reads.iter().map(String::as_str).collect();
    let status = || {
        json(&ok(run(&[
            "cache",
            "status",
            "--control",
            s(&ctl),
            "--json",
        ])))
    };
    for pass in 0..2 {
        let out = qemu_io_with(&["-r"], &srv.uri("img"), &reads);
        assert!(out.status.success(), "{out:?}");
        // Where there is a spill tier, its thread writes the three
        // groups' copies behind the reads: wait for them.
        let t = Instant::now();
        while spills && pass == 0 && status()["images"][0]["spill"]["copies"].as_u64() < Some(3) {
            assert!(t.elapsed() < Duration::from_secs(30), "{}", status());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let v = status();
    let text =
        String::from_utf8(ok(run(&["cache", "status", "--control", s(&ctl)])).stdout).unwrap();
    assert_eq!(v["images"][0]["export"], "img", "{v}");
    assert!(text.starts_with("img: decoded "), "{text}");
    (v["images"][0].clone(), text)
}

/// `cairn cache status --control` reports a served image's cache
/// tiers: 4 KiB reads far apart (random) past a decoded cache smaller
/// than one group leave compact copies, and reading the same places
/// again is served from them, decoding nothing.
#[test]
fn cache_status_reports_a_served_images_tiers() {
    if !have("qemu-io") {
        return;
    }
    let (im, text) = tiers_after_random_reads(&["--image-compact-cache", "64M"], false);
    let n = |k: &str, f: &str| im[k][f].as_u64().unwrap_or_else(|| panic!("{k}.{f}: {im}"));
    assert!(n("decoded", "decodes") >= 3, "{im}");
    assert!(n("compact", "copies") >= 2, "{im}");
    assert!(n("compact", "hits") >= 2, "the second pass: {im}");
    assert!(n("compact", "bytes") >= 2 << 20, "{im}");
    assert!(
        text.contains("compact") && text.contains("% of reads decoded nothing"),
        "{text}"
    );
}

/// With a compact tier smaller than one copy, the copies go on to the
/// spill tier on disk, and the second pass is served from there.
#[test]
fn cache_status_reports_spilled_copies() {
    if !have("qemu-io") {
        return;
    }
    let (im, text) = tiers_after_random_reads(
        &["--image-compact-cache", "1M", "--image-spill", "64M"],
        true,
    );
    let n = |k: &str, f: &str| im[k][f].as_u64().unwrap_or_else(|| panic!("{k}.{f}: {im}"));
    // No more than the 6 MiB image's copies can take.
    assert_eq!(
        n("spill", "capacity"),
        (6 << 20) + (6 << 14) + (1 << 20),
        "{im}"
    );
    assert!(n("spill", "copies") >= 2, "{im}");
    assert!(n("spill", "hits") >= 2, "the second pass: {im}");
    assert!(n("spill", "bytes") >= 4 << 20, "{im}");
    assert_eq!(n("spill", "damaged"), 0, "{im}");
    assert!(
        text.contains(", spilled ") && text.contains("of 7 MiB on disk"),
        "{text}"
    );
}

/// `--image NAME,rw`: a FLUSH makes writes durable in the overlay, not a
/// snapshot; `cairn commit --control` makes one on request; a SIGKILL
/// loses no flushed write (`cairn commit --repo` commits what the dead
/// server left); a clean stop commits the rest. Earlier snapshots never
/// change; the image's lock keeps a second writer out meanwhile.
#[test]
fn writable_image_flushes_durably_and_commits_on_request_and_at_stop() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    const M: usize = 1 << 20;
    let mut img = noise(3 * M + 12_345, 41);
    img[2 * M..2 * M + M / 2].fill(0);
    let repo = repo_with(d, &[("img", &[&img])]);
    let ctl = d.join("ctl.sock");
    let start = || serve_rw_img(&repo, d, &ctl);
    let qemu = |srv: &Serve, cmds: &[&str]| {
        // Write-back caching in qemu: no flush after each write.
        let out = qemu_io_with(&["-t", "writeback"], &srv.uri("img"), cmds);
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "qemu-io failed: {text}");
        assert!(!text.contains("Pattern verification failed"), "{text}");
    };
    let restore = |spec: &str| ok(run(&["restore", spec, "-", "--repo", s(&repo), "-q"])).stdout;
    let mut srv = start();
    qemu(
        &srv,
        &["write -P 0xab 100k 8k", "read -P 0xab 100k 8k", "flush"],
    );
    let mut v1 = img.clone();
    v1[100 * 1024..108 * 1024].fill(0xab);
    assert_same(&restore("img"), &img, "a flush is not a snapshot");
    let c = json(&ok(run(&["commit", "--control", s(&ctl), "img", "--json"])));
    assert_eq!(c["images"][0]["snapshot"], 2, "{c}");
    assert_eq!(c["images"][0]["committed"], true, "{c}");
    assert_same(&restore("img@2"), &v1, "img@2 while served");

    // While served: another writer is refused, readers are not.
    let out = run(&[
        "serve",
        "--repo",
        s(&repo),
        "--image",
        "img,rw",
        "--socket",
        s(&d.join("t.sock")),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lock"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    qemu(
        &srv,
        &[
            "write -z 1M 512k",
            "write -P 0xcd 2200k 4k",
            "discard 3M 12k",
            "flush",
            "read -P 0 1M 512k",
        ],
    );
    let mut v2 = v1.clone();
    v2[M..M + M / 2].fill(0);
    v2[2200 * 1024..2204 * 1024].fill(0xcd);
    v2[3 * M..3 * M + 12 * 1024].fill(0);
    // Killed: the flushed writes are in the overlay only.
    srv.signal_and_wait(libc::SIGKILL, Duration::from_secs(10))
        .expect("killed");
    drop(srv);
    assert_same(&restore("img"), &v1, "not committed before the kill");
    let c = json(&ok(run(&["commit", "--repo", s(&repo), "img", "--json"])));
    assert_eq!(c["images"][0]["snapshot"], 3, "{c}");
    assert_same(&restore("img@3"), &v2, "committed after the kill");

    // Killed again with flushed writes, then served again: they read
    // back, and the clean stop commits them.
    let mut srv = start();
    qemu(&srv, &["write -P 0xee 0 4k", "flush"]);
    srv.signal_and_wait(libc::SIGKILL, Duration::from_secs(10))
        .expect("killed");
    drop(srv);
    let srv = start();
    qemu(&srv, &["read -P 0xee 0 4k", "read -P 0xcd 2200k 4k"]);
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "{st:?}");
    let mut v3 = v2.clone();
    v3[..4096].fill(0xee);
    for (spec, want) in [
        ("img@1", &img),
        ("img@2", &v1),
        ("img@3", &v2),
        ("img@4", &v3),
        ("img", &v3),
    ] {
        assert_same(&restore(spec), want, spec);
    }
    let out = run(&["restore", "img@5", "-", "--repo", s(&repo), "-q"]);
    assert!(
        !out.status.success(),
        "a snapshot with no change was committed"
    );
    // Nothing left to commit.
    let out = run(&["commit", "--repo", s(&repo), "img"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing to commit"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok(run(&["verify", "--read-data", "--repo", s(&repo)]));
}

/// A writable image with a write-back cache in front: a commit (on
/// request, and at the clean stop) holds the writes still in the cache's
/// log. They were left out, and a later serve with the cache put them
/// back over the newer snapshots.
#[test]
fn a_cached_writable_image_commits_what_its_cache_holds() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    const M: usize = 1 << 20;
    let img = noise(4 * M, 42);
    let repo = repo_with(d, &[("img", &[&img])]);
    let ctl = d.join("ctl.sock");
    let cache = d.join("cache.dev");
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(16 * M as u64)
        .unwrap();
    let spec = format!("img,cache={}", s(&cache));
    // Writes stay in the cache's log: no idle writeback, none bypassed.
    let start = || {
        Serve::start(&[
            "--repo",
            s(&repo),
            "--image",
            &spec,
            "--socket",
            s(&d.join("s.sock")),
            "--control",
            s(&ctl),
            "--commit-every",
            "0",
            "--cache-bypass-below-us",
            "0",
            "--cache-idle-ms",
            "3600000",
        ])
    };
    let qemu = |srv: &Serve, cmds: &[&str]| {
        let out = qemu_io_with(&["-t", "writeback"], &srv.uri("img"), cmds);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let restore = |spec: &str| ok(run(&["restore", spec, "-", "--repo", s(&repo), "-q"])).stdout;
    let srv = start();
    qemu(&srv, &["write -P 0x58 1M 64k", "flush"]);
    let mut v2 = img.clone();
    v2[M..M + 64 * 1024].fill(0x58);
    let c = json(&ok(run(&["commit", "--control", s(&ctl), "img", "--json"])));
    assert_eq!(c["images"][0]["snapshot"], 2, "{c}");
    assert_same(&restore("img@2"), &v2, "a commit holds the cached write");
    qemu(&srv, &["write -P 0x59 2M 64k", "flush"]);
    let (st, _) = srv.stop(Duration::from_secs(20));
    assert!(st.success(), "{st:?}");
    let mut v3 = v2.clone();
    v3[2 * M..2 * M + 64 * 1024].fill(0x59);
    assert_same(&restore("img"), &v3, "the stop commits the cached write");
    // Served again with its cache, the image reads as committed.
    let srv = start();
    qemu(&srv, &["read -P 0x58 1M 64k", "read -P 0x59 2M 64k"]);
    let (st, _) = srv.stop(Duration::from_secs(20));
    assert!(st.success(), "{st:?}");
    // `cache status` of the image only reads: it made an overlay in the
    // default place, which refused a later writable serve there once a
    // snapshot was committed through another overlay.
    let status = ok(run(&[
        "cache",
        "status",
        "--repo",
        s(&repo),
        "--image",
        "img",
        "--cache",
        s(&cache),
    ]));
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("0 dirty"),
        "{status:?}"
    );
    let spec2 = format!("img,rw,overlay={}", s(&d.join("ov2")));
    let srv = Serve::start(&[
        "--repo",
        s(&repo),
        "--image",
        &spec2,
        "--socket",
        s(&d.join("s2.sock")),
    ]);
    qemu(&srv, &["write -P 0x5a 3M 4k", "flush"]);
    let (st, _) = srv.stop(Duration::from_secs(20));
    assert!(st.success(), "{st:?}");
    let srv = Serve::start(&[
        "--repo",
        s(&repo),
        "--image",
        "img,rw",
        "--socket",
        s(&d.join("s3.sock")),
    ]);
    qemu(&srv, &["read -P 0x5a 3M 4k"]);
    let (st, _) = srv.stop(Duration::from_secs(20));
    assert!(st.success(), "{st:?}");
}

/// Every snapshot a cached writable image commits while a client writes
/// is one moment of the image: a client writing 4 KiB blocks one at a
/// time (each acknowledged before the next), in falling address order so
/// the cache's write-back (in address order) takes the newest first, and
/// commits requested meanwhile: each snapshot is the image after some
/// number of those writes, never a later write without an earlier one.
#[test]
fn a_cached_commit_while_writes_go_on_is_one_moment_of_the_image() {
    const BS: usize = 4096;
    const BLOCKS: usize = 512;
    const COMMITS: usize = 12;
    let dir = tempdir();
    let d = dir.path();
    let img = vec![0u8; BLOCKS * BS];
    let repo = repo_with(d, &[("img", &[&img])]);
    let ctl = d.join("ctl.sock");
    let cache = d.join("cache.dev");
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let sock = d.join("s.sock");
    let spec = format!("img,cache={}", s(&cache));
    // Every write into the cache, written back all the time.
    let srv = Serve::start(&[
        "--repo",
        s(&repo),
        "--image",
        &spec,
        "--socket",
        s(&sock),
        "--control",
        s(&ctl),
        "--commit-every",
        "0",
        "--cache-idle-ms",
        "1",
        "--cache-bypass-below-us",
        "0",
    ]);
    // Write number i (from 1) goes to block BLOCKS - 1 - (i - 1) % BLOCKS,
    // and holds i.
    let block_of = |i: u64| BLOCKS - 1 - ((i - 1) as usize % BLOCKS);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let mut c = unix(&sock);
        std::thread::spawn(move || {
            attach(&mut c, "img");
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let data: Vec<u8> = i.to_le_bytes().repeat(BS / 8);
                let off = (block_of(i) * BS) as u64;
                request(&mut c, CMD_WRITE, i, off, BS as u32, &data);
                assert_eq!(simple_reply(&mut c), (0, i), "write {i}");
            }
            request(&mut c, CMD_DISC, 0, 0, 0, &[]);
            i
        })
    };
    let mut snapshots = Vec::new();
    for _ in 0..COMMITS {
        std::thread::sleep(Duration::from_millis(60));
        let c = json(&ok(run(&["commit", "--control", s(&ctl), "img", "--json"])));
        if let Some(n) = c["images"][0]["snapshot"].as_u64() {
            snapshots.push(n);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.join().unwrap();
    let (st, _) = srv.stop(Duration::from_secs(30));
    assert!(st.success(), "{st:?}");
    snapshots.sort_unstable();
    snapshots.dedup();
    assert!(snapshots.len() >= COMMITS / 2, "{snapshots:?}");
    assert!(writes > 1000, "only {writes} writes");
    let mut seen_writes = Vec::new();
    for n in snapshots.iter().copied().chain([0]) {
        let spec = if n == 0 {
            "img".to_string()
        } else {
            format!("img@{n}")
        };
        let got = ok(run(&["restore", &spec, "-", "--repo", s(&repo), "-q"])).stdout;
        assert_eq!(got.len(), BLOCKS * BS);
        let held = |b: usize| u64::from_le_bytes(got[b * BS..b * BS + 8].try_into().unwrap());
        let m = (0..BLOCKS).map(held).max().unwrap();
        // The image after writes 1..=m.
        for b in 0..BLOCKS {
            let want = (1..=m).rev().find(|&i| block_of(i) == b).unwrap_or(0);
            assert_eq!(
                held(b),
                want,
                "snapshot {spec}: block {b} after {m} writes (a write without an earlier one)"
            );
            assert!(
                got[b * BS..(b + 1) * BS] == want.to_le_bytes().repeat(BS / 8)[..],
                "snapshot {spec}: block {b} torn"
            );
        }
        seen_writes.push(m);
    }
    // The stop's commit holds every write.
    assert_eq!(seen_writes.last(), Some(&writes), "{seen_writes:?}");
}

/// A served writable image whose chunks hold zero pages (holes inside
/// chunks since zero runs are left out): qemu-img reads it whole through
/// block status after writes next to and over the holes, and the commit
/// stores the written zero pages as holes too.
#[test]
fn writable_image_with_zero_pages_inside_chunks() {
    if !have_all(&["qemu-io", "qemu-img"]) {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    const PAGE: usize = 4096;
    // A dump: two data pages, then a zero page, 512 times; the data pages
    // end on non-zero bytes, so each zero page is a run of exactly 4 KiB.
    let mut img = noise(512 * 3 * PAGE, 7);
    for (k, page) in img.chunks_mut(PAGE).enumerate() {
        if k % 3 == 2 {
            page.fill(0);
        } else {
            page[0] |= 1;
            page[PAGE - 1] |= 1;
        }
    }
    // Public cuts: how many zero pages a cut splits is then the same on
    // every run (with a secret table it varies).
    let repo = repo_with_public_cuts(d, &[("img", &[&img])]);
    let ctl = d.join("ctl.sock");
    let srv = serve_rw_img(&repo, d, &ctl);
    // Data over a zero page (8k); then, in eight pairs of data pages, the
    // first written with data and the second with zeros (plain writes,
    // not write-zeroes): the commit cuts each pair into a chunk of data
    // and a zero run that must be left out.
    let mut cmds = vec!["write -P 0x5a 8k 4k".to_string()];
    let mut want = img.clone();
    want[8 * 1024..12 * 1024].fill(0x5a);
    for k in 20..28 {
        let at = 3 * k * PAGE;
        cmds.push(format!("write -P 0x6b {at} 4096"));
        cmds.push(format!("write -P 0 {} 4096", at + PAGE));
        want[at..at + PAGE].fill(0x6b);
        want[at + PAGE..at + 2 * PAGE].fill(0);
    }
    cmds.push("flush".into());
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    let out = qemu_io(&srv.uri("img"), &cmds);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw = d.join("qemu.raw");
    ok(tool(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &srv.uri("img"),
            s(&raw),
        ],
    ));
    assert_same(&std::fs::read(&raw).unwrap(), &want, "qemu-img convert");
    let c = json(&ok(run(&["commit", "--control", s(&ctl), "img", "--json"])));
    assert_eq!(c["images"][0]["snapshot"], 2, "{c}");
    drop(srv);
    let got = ok(run(&["restore", "img@2", "-", "--repo", s(&repo), "-q"])).stdout;
    assert_same(&got, &want, "img@2");
    // The zero pages are holes after the commit: 512, less the one
    // written over, and the eight written as zeros. The commit cuts the
    // chunks it writes anew, and a cut may split a zero page (whose
    // halves, shorter than a run, are stored as data).
    let ls = json(&ok(run(&["ls", "--repo", s(&repo), "img", "--json"])));
    let zero = ls["snapshots"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["snapshot"] == 2))
        .and_then(|e| e["zero_bytes"].as_u64())
        .unwrap_or(0) as usize;
    let holes = (512 - 1 + 8) * PAGE;
    assert!(
        (holes - PAGE..=holes).contains(&zero),
        "{zero} zero bytes, want {holes}: {ls}"
    );
}

// ---------------------------------------------------------------------
// 5. nbdcopy between exports, fio

#[test]
fn nbdcopy_between_exports_and_fio_verify() {
    if !have_all(&["nbdcopy", "fio"]) {
        return;
    }
    let enghelp = tool("fio", &["--enghelp=nbd"]);
    let has_nbd =
        enghelp.status.success() && String::from_utf8_lossy(&enghelp.stdout).contains("uri");
    if !need(has_nbd, "fio's nbd engine (fio >= 3.19 built with libnbd)") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    const SIZE: usize = 16 << 20;
    // A sparse source: data, a hole, more data, an odd tail.
    let src = d.join("src.raw");
    let mut want = vec![0u8; SIZE];
    want[..3 << 20].copy_from_slice(&noise(3 << 20, 41));
    want[9 << 20..(9 << 20) + 1_234_567].copy_from_slice(&noise(1_234_567, 42));
    want[SIZE - 999..].copy_from_slice(&noise(999, 43));
    {
        let f = std::fs::File::create(&src).unwrap();
        f.set_len(SIZE as u64).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&want[..3 << 20], 0).unwrap();
        f.write_all_at(&want[9 << 20..(9 << 20) + 1_234_567], 9 << 20)
            .unwrap();
        f.write_all_at(&want[SIZE - 999..], (SIZE - 999) as u64)
            .unwrap();
    }
    // Destinations full of garbage, so holes must be written as zeros.
    let dst = d.join("dst.raw");
    let back = d.join("back.raw");
    std::fs::write(&dst, vec![0xeeu8; SIZE]).unwrap();
    std::fs::write(&back, vec![0xddu8; SIZE]).unwrap();
    let f1 = d.join("fio1.raw");
    let f2 = d.join("fio2.raw");
    for f in [&f1, &f2] {
        std::fs::File::create(f)
            .unwrap()
            .set_len(SIZE as u64)
            .unwrap();
    }
    let srv = Serve::start(&[
        "--file",
        &format!("src={},ro", s(&src)),
        "--file",
        &format!("dst={}", s(&dst)),
        "--file",
        &format!("back={}", s(&back)),
        "--file",
        &format!("fio1={}", s(&f1)),
        "--file",
        &format!("fio2={}", s(&f2)),
        "--socket",
        s(&d.join("s.sock")),
    ]);
    ok(tool("nbdcopy", &[&srv.uri("src"), &srv.uri("dst")]));
    assert_same(&std::fs::read(&dst).unwrap(), &want, "src -> dst");
    ok(tool("nbdcopy", &[&srv.uri("dst"), &srv.uri("back")]));
    assert_same(&std::fs::read(&back).unwrap(), &want, "dst -> back");

    for (name, rw) in [("fio1", "randwrite"), ("fio2", "randrw")] {
        let uri = srv.uri(name);
        let out = tool(
            "fio",
            &[
                "--name=serve",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                &format!("--rw={rw}"),
                "--bs=4k",
                "--size=16M",
                "--verify=crc32c",
                "--do_verify=1",
                "--iodepth=8",
                "--randseed=7",
                // fio would leave its verify state file in the crate.
                "--verify_state_save=0",
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "fio {rw}: {text}");
        assert!(text.contains("err= 0"), "fio {rw}: {text}");
        assert!(!text.contains("verify: bad"), "fio {rw}: {text}");
    }
    // fio wrote through the server into the files.
    let written = std::fs::read(&f1).unwrap();
    assert!(
        written
            .chunks(4096)
            .filter(|c| c.iter().any(|&b| b != 0))
            .count()
            > 3000,
        "fio's writes are not in fio1.raw"
    );
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "{st:?}");
}

// ---------------------------------------------------------------------
// 6. A filesystem inside an image, through nbdfuse and fuse2fs

/// Mounts to undo, innermost first, and the nbdfuse process.
struct Mounts {
    points: Vec<PathBuf>,
    nbdfuse: Option<Reap>,
}

fn unmount(p: &Path) -> bool {
    for (cmd, args) in [
        ("fusermount3", vec!["-u"]),
        ("fusermount", vec!["-u"]),
        ("umount", vec![]),
        ("umount", vec!["-l"]),
    ] {
        let st = Command::new(cmd)
            .args(&args)
            .arg(p)
            .stderr(Stdio::null())
            .status();
        if st.is_ok_and(|s| s.success()) {
            return true;
        }
    }
    false
}

impl Drop for Mounts {
    fn drop(&mut self) {
        while let Some(p) = self.points.pop() {
            if !unmount(&p) {
                eprintln!("could not unmount {}", p.display());
            }
        }
        if let Some(mut r) = self.nbdfuse.take() {
            // nbdfuse exits once its mount is gone.
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) {
                if r.0.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn filesystem_in_an_image_reads_through_nbdfuse() {
    if !have_all(&["mkfs.ext4", "nbdfuse", "fuse2fs"]) {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !need(Path::new("/dev/fuse").exists(), "/dev/fuse") || !need(root, "root (for FUSE mounts)")
    {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let src = d.join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    let mut zeros_and_data = vec![0u8; 300_000];
    zeros_and_data[150_000..150_100].fill(7);
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("a.bin", noise(1_500_000, 51)),
        ("b.bin", noise(700_001, 52)),
        ("sub/c.txt", mixed(12_345, 53)),
        ("sub/deeper/d.bin", noise(2 << 20, 54)),
        ("sub/empty", Vec::new()),
        ("sparse-ish", zeros_and_data),
    ];
    for (name, data) in &files {
        std::fs::write(src.join(name), data).unwrap();
    }
    let img = d.join("fs.img");
    ok(tool(
        "mkfs.ext4",
        &["-F", "-q", "-d", s(&src), s(&img), "32M"],
    ));
    let repo = d.join("repo");
    ok(run(&["init", s(&repo)]));
    ok(run(&[
        "backup",
        s(&img),
        "--repo",
        s(&repo),
        "--name",
        "fs",
        "-q",
    ]));
    std::fs::remove_file(&img).unwrap();
    let srv = Serve::start(&["--repo", s(&repo), "--socket", s(&d.join("s.sock"))]);

    let nbdmnt = d.join("nbdmnt");
    let fsmnt = d.join("fsmnt");
    std::fs::create_dir(&nbdmnt).unwrap();
    std::fs::create_dir(&fsmnt).unwrap();
    let mut mounts = Mounts {
        points: Vec::new(),
        nbdfuse: None,
    };
    let child = Command::new("nbdfuse")
        .arg(&nbdmnt)
        .arg(srv.uri("fs"))
        .stdin(Stdio::null())
        .spawn()
        .expect("nbdfuse");
    mounts.nbdfuse = Some(Reap(child));
    mounts.points.push(nbdmnt.clone());
    let dev = nbdmnt.join("nbd");
    assert!(
        wait_for(Duration::from_secs(15), || dev.exists()),
        "nbdfuse did not expose {}",
        dev.display()
    );
    assert_eq!(std::fs::metadata(&dev).unwrap().len(), 32 << 20);
    ok(tool("fuse2fs", &["-o", "ro,fakeroot", s(&dev), s(&fsmnt)]));
    mounts.points.push(fsmnt.clone());

    let mut want: Vec<PathBuf> = files.iter().map(|(n, _)| PathBuf::from(n)).collect();
    want.sort();
    assert_eq!(tree(&fsmnt), want, "files in the mounted image");
    for (name, data) in &files {
        let got = std::fs::read(fsmnt.join(name)).unwrap();
        assert_same(&got, data, name);
    }
    drop(mounts);
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "{st:?}");
}

// ---------------------------------------------------------------------
// 7. Clean shutdown

#[test]
fn sigterm_finishes_and_keeps_written_data() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    const SIZE: usize = 8 << 20;
    let w = d.join("w.raw");
    std::fs::write(&w, vec![0u8; SIZE]).unwrap();
    let sock = d.join("s.sock");
    let srv = Serve::start(&["--file", s(&w), "--socket", s(&sock), "-v"]);

    // An interactive qemu-io that writes and stays connected.
    let mut qio = Reap(
        Command::new("qemu-io")
            .args(["-f", "raw", &srv.uri("w.raw")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qemu-io"),
    );
    let mut stdin = qio.0.stdin.take().unwrap();
    let stdout = qio.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        // qemu-io prompts without a newline: read bytes, report text.
        let mut b = [0u8; 4096];
        while let Ok(n) = r.read(&mut b) {
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&b[..n]);
            let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
        }
    });
    // One command at a time: qemu-io reads stdin when the last is done.
    let mut seen = String::new();
    for (i, cmd) in ["write -P 0x5a 1M 2M", "write -P 0xa5 7M 4k"]
        .iter()
        .enumerate()
    {
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while seen.matches("wrote ").count() <= i {
            let left = deadline.saturating_duration_since(Instant::now());
            seen = rx
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("qemu-io did not {cmd} ({e}): {seen}"));
        }
    }
    // Also an idle raw client in the middle of transmission.
    let mut idle = unix(&sock);
    attach(&mut idle, "w.raw");

    let (st, took) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?} after SIGTERM");
    assert!(took < Duration::from_secs(5), "took {took:?} to stop");
    assert!(!sock.exists(), "the unix socket is left behind");
    let mut want = vec![0u8; SIZE];
    want[1 << 20..3 << 20].fill(0x5a);
    want[7 << 20..(7 << 20) + 4096].fill(0xa5);
    assert_same(&std::fs::read(&w).unwrap(), &want, "w.raw after SIGTERM");
    // The idle client sees the connection closed.
    let mut b = [0u8; 1];
    assert!(matches!(idle.read(&mut b), Ok(0) | Err(_)));
    drop(stdin);
}

// ---------------------------------------------------------------------
// 8. Clients that break the protocol

#[test]
fn garbage_clients_do_not_hurt_others() {
    if !have_all(&["qemu-img", "nbdinfo"]) {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let data = noise(6_000_001, 61);
    let repo = repo_with(d, &[("img", &[&data])]);
    let sock = d.join("s.sock");
    let mut srv = Serve::start(&[
        "--repo",
        s(&repo),
        "--socket",
        s(&sock),
        "--listen",
        "127.0.0.1:0",
    ]);
    let port = srv.port.unwrap();

    // The good client runs while the bad ones misbehave.
    let good_uri = srv.uri("img");
    let out = d.join("good.raw");
    let good_out = out.clone();
    let good = std::thread::spawn(move || {
        let mut v = Vec::new();
        for _ in 0..3 {
            let _ = std::fs::remove_file(&good_out);
            let o = tool(
                "qemu-img",
                &["convert", "-f", "raw", "-O", "raw", &good_uri, s(&good_out)],
            );
            v.push(o);
        }
        v
    });

    let junk = noise(64 << 10, 62);
    let mut held = Vec::new();
    for round in 0..3 {
        // Garbage right after the greeting, over unix and TCP.
        let mut u = unix(&sock);
        greeting(&mut u);
        let _ = u.write_all(&junk[round * 1000..]);
        held.push(u);
        let mut t = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        greeting(&mut t);
        let _ = t.write_all(&junk[..5000 + round]);
        drop(t);
        // An option with a huge length, then nothing.
        let mut u = unix(&sock);
        greeting(&mut u);
        let mut m = 3u32.to_be_bytes().to_vec();
        m.extend_from_slice(b"IHAVEOPT");
        m.extend_from_slice(&1u32.to_be_bytes());
        m.extend_from_slice(&u32::MAX.to_be_bytes());
        let _ = u.write_all(&m);
        held.push(u);
        // Garbage instead of a request after a good handshake.
        let mut u = unix(&sock);
        attach(&mut u, "img");
        let _ = u.write_all(&junk[..4096]);
        held.push(u);
        // A read request cut short, then gone.
        let mut u = unix(&sock);
        attach(&mut u, "img");
        let _ = u.write_all(&REQUEST_MAGIC.to_be_bytes());
        let _ = u.write_all(&[0, 0, 0]);
        drop(u);
        // A request past the end and an enormous one: errors, not hangs.
        let mut u = unix(&sock);
        let (size, _) = attach(&mut u, "img");
        request(&mut u, CMD_READ, 1, size - 10, 4096, &[]);
        let (err, h) = simple_reply(&mut u);
        assert!(err != 0 && h == 1, "read past the end: error {err}");
        // A flag the protocol does not define: EINVAL, as qemu-nbd and
        // nbdkit answer (it was served).
        request_flagged(&mut u, 0x4000, CMD_READ, 3, 0, 4096, &[]);
        assert_eq!(simple_reply(&mut u), (22, 3), "unknown flag");
        request(&mut u, CMD_READ, 2, 0, 4096, &[]);
        let (err, h) = simple_reply(&mut u);
        assert_eq!((err, h), (0, 2));
        let mut buf = vec![0u8; 4096];
        u.read_exact(&mut buf).unwrap();
        assert_same(&buf, &data[..4096], "read after an error");
        held.push(u);
    }
    // Idle connections stuck in the handshake do not block anyone.
    for _ in 0..4 {
        held.push(unix(&sock));
    }

    for o in good.join().unwrap() {
        ok(o);
    }
    let got = std::fs::read(&out).unwrap();
    assert_same(
        &got[..data.len()],
        &data,
        "qemu-img convert next to garbage",
    );
    assert!(srv.alive(), "cairn serve died: {}", srv.stderr_text());
    let j = nbdinfo_json(&["--json", &srv.tcp_uri("img")]);
    assert_eq!(j["exports"][0]["export-size"], data.len() as u64, "{j}");
    let (st, took) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
    assert!(
        took < Duration::from_secs(5),
        "took {took:?} with bad clients"
    );
    drop(held);
}

// ---------------------------------------------------------------------
// 9. Hostile clients: bounded memory, a connection limit, a stop that
// no client can hold up

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("VmRSS");
    kb << 10
}

/// A 4 KiB read at `off` on a fresh connection: its data.
fn first_read(sock: &Path, name: &str, off: u64) -> Vec<u8> {
    let mut u = unix(sock);
    attach(&mut u, name);
    request(&mut u, CMD_READ, 7, off, 4096, &[]);
    assert_eq!(simple_reply(&mut u), (0, 7), "read on a fresh connection");
    let mut buf = vec![0u8; 4096];
    u.read_exact(&mut buf).unwrap();
    buf
}

/// Issue 19: 100 clients that each announce a 32 MiB write and then
/// trickle its payload made the server allocate (and zero) 32 MiB each as
/// soon as the header arrived: 3.2 GB here, and a few hundred such
/// clients exhaust any machine.
#[test]
fn trickling_32mib_write_headers_hold_little_memory() {
    let dir = tempdir();
    let d = dir.path();
    let w = d.join("w.raw");
    let data = noise(1 << 20, 91);
    // 1 MiB of data, then a hole up to 64 MiB.
    std::fs::write(&w, &data).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&w)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let sock = d.join("s.sock");
    let srv = Serve::start(&["--file", s(&w), "--socket", s(&sock)]);
    let pid = srv.child.as_ref().unwrap().id();
    let base = rss(pid);
    let junk = noise(64 << 10, 92);
    let mut held = Vec::new();
    for i in 0..100u64 {
        let mut u = unix(&sock);
        attach(&mut u, "w.raw");
        request(&mut u, CMD_WRITE, i, 0, 32 << 20, &junk[..4096]);
        held.push(u);
    }
    // Trickle: more of every payload, a little at a time.
    for round in 0..4 {
        for u in &mut held {
            u.write_all(&junk[round * 1024..(round + 1) * 1024])
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let peak = rss(pid);
    let t = Instant::now();
    let got = first_read(&sock, "w.raw", 0);
    let took = t.elapsed();
    eprintln!(
        "100 trickling 32 MiB writes: server RSS {} MiB (idle {} MiB); a new client's first read took {:?}",
        peak >> 20,
        base >> 20,
        took
    );
    assert_same(&got, &data[..4096], "a new client's read");
    assert!(
        peak < 512 << 20,
        "server RSS {} MiB with 100 trickling write headers",
        peak >> 20
    );
    // SIGTERM with all of them mid-request: exits in time.
    let (st, took) = srv.stop(Duration::from_secs(20));
    assert!(st.success(), "exit {st:?}");
    assert!(took < Duration::from_secs(5), "took {took:?} to stop");
    // Nothing of the unfinished writes reached the file.
    assert_same(&std::fs::read(&w).unwrap()[..data.len()], &data, "w.raw");
    drop(held);
}

/// Issue 19: SIGTERM with a client that sends reads and never takes the
/// replies hung the server (its workers blocked writing replies, and the
/// stop waited for them); new clients hung too.
#[test]
fn a_client_that_never_reads_cannot_hold_the_stop() {
    let dir = tempdir();
    let d = dir.path();
    let w = d.join("w.raw");
    std::fs::write(&w, vec![0u8; 16 << 20]).unwrap();
    let sock = d.join("s.sock");
    let srv = Serve::start(&["--file", s(&w), "--socket", s(&sock), "-v"]);
    // An acknowledged write must survive the stop.
    let pattern = noise(1 << 20, 93);
    let mut a = unix(&sock);
    attach(&mut a, "w.raw");
    request(&mut a, CMD_WRITE, 1, 4 << 20, 1 << 20, &pattern);
    assert_eq!(simple_reply(&mut a), (0, 1), "write acknowledged");
    // The stalled client: 1 MiB reads, replies never read.
    let mut b = unix(&sock);
    attach(&mut b, "w.raw");
    let flood = flood_unread_reads(&b);
    std::thread::sleep(Duration::from_millis(500));
    // Others are still served meanwhile.
    assert_eq!(
        first_read(&sock, "w.raw", 4 << 20),
        pattern[..4096].to_vec()
    );
    let (st, took) = srv.stop(Duration::from_secs(20));
    assert!(st.success(), "exit {st:?}");
    assert!(took < Duration::from_secs(5), "took {took:?} to stop");
    let file = std::fs::read(&w).unwrap();
    assert_same(&file[4 << 20..5 << 20], &pattern, "acknowledged write");
    drop(b);
    let _ = flood.join();
}

/// Send 256 reads of 1 MiB over a clone of `conn` from a thread, and
/// never read their replies: a client that stops taking replies.
fn flood_unread_reads(conn: &UnixStream) -> std::thread::JoinHandle<()> {
    let mut b2 = conn.try_clone().unwrap();
    std::thread::spawn(move || {
        for i in 0..256u64 {
            let mut m = Vec::new();
            request(&mut m, CMD_READ, i, (i % 16) << 20, 1 << 20, &[]);
            if b2.write_all(&m).is_err() {
                break;
            }
        }
    })
}

/// A new client's NBD_OPT_GO for `name`: false if refused as busy
/// (NBD_REP_ERR_POLICY, over --max-connections).
fn go_is_served(sock: &Path, name: &str) -> bool {
    let mut go = (name.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(name.as_bytes());
    go.extend_from_slice(&0u16.to_be_bytes());
    let mut u = unix(sock);
    let flags = greeting(&mut u);
    u.write_all(&(1u32 | u32::from(flags & 2)).to_be_bytes())
        .unwrap();
    option(&mut u, 7, &go);
    option_reply(&mut u, 7).0 != (1 << 31) + 2
}

/// A client that stops taking replies is closed one --io-timeout after
/// its reply stalled. Before, each of the connection's workers queued on
/// the writer waited out its own timeout after the first had failed, so
/// the connection (and the memory its requests were granted, and its
/// place under --max-connections) was held workers x io-timeout: 9
/// minutes at the defaults, found with 2000 pipelined 32 MiB reads.
#[test]
fn a_client_that_stops_taking_replies_is_closed_after_one_timeout() {
    let dir = tempdir();
    let d = dir.path();
    let w = d.join("w.raw");
    std::fs::write(&w, vec![0u8; 16 << 20]).unwrap();
    let sock = d.join("s.sock");
    let srv = Serve::start(&[
        "--file",
        s(&w),
        "--socket",
        s(&sock),
        "--io-timeout",
        "1",
        "--workers",
        "8",
        "--max-connections",
        "1",
    ]);
    let mut b = unix(&sock);
    attach(&mut b, "w.raw");
    let flood = flood_unread_reads(&b);
    let start = Instant::now();
    let mut served = None;
    while start.elapsed() < Duration::from_secs(20) {
        if go_is_served(&sock, "w.raw") {
            served = Some(start.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = served.expect("the stalled connection was never closed");
    assert!(
        took < Duration::from_secs(4),
        "the stalled connection held its place for {took:?} (io-timeout 1 s)"
    );
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
    drop(b);
    let _ = flood.join();
}

/// Issue 19: connections were unlimited. Over --max-connections a client
/// is told why in the handshake, and served again once one leaves.
#[test]
fn clients_over_the_limit_are_refused_with_a_message() {
    let dir = tempdir();
    let d = dir.path();
    let w = d.join("w.raw");
    std::fs::write(&w, noise(1 << 20, 94)).unwrap();
    let sock = d.join("s.sock");
    let srv = Serve::start(&[
        "--file",
        s(&w),
        "--socket",
        s(&sock),
        "--max-connections",
        "2",
    ]);
    let mut first = unix(&sock);
    attach(&mut first, "w.raw");
    let mut second = unix(&sock);
    attach(&mut second, "w.raw");
    let mut third = unix(&sock);
    let flags = greeting(&mut third);
    third
        .write_all(&(1u32 | u32::from(flags & 2)).to_be_bytes())
        .unwrap();
    let mut go = 5u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"w.raw");
    go.extend_from_slice(&0u16.to_be_bytes());
    option(&mut third, 7, &go);
    let (ty, msg) = option_reply(&mut third, 7);
    let msg = String::from_utf8_lossy(&msg);
    assert_eq!(ty, (1 << 31) + 2, "NBD_REP_ERR_POLICY expected: {msg}");
    assert!(msg.contains("busy"), "refusal says why: {msg}");
    drop(third);
    // One leaves: the next client is served.
    request(&mut first, CMD_DISC, 9, 0, 0, &[]);
    drop(first);
    let mut served = false;
    for _ in 0..50 {
        if go_is_served(&sock, "w.raw") {
            served = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(served, "a client is served after another left");
    drop(second);
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
}

/// Run `openssl ARGS` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    ok(Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap());
}

/// `cairn serve --file W` on `sock` and a TCP port, TLS required with the
/// certificates in `certs`, and `extra` arguments.
fn serve_tls(w: &Path, sock: &Path, certs: &Path, extra: &[&str]) -> Serve {
    let mut args = vec![
        "--file",
        s(w),
        "--socket",
        s(sock),
        "--listen",
        "127.0.0.1:0",
        "--tls",
        "require",
        "--tls-certificates",
        s(certs),
    ];
    args.extend_from_slice(extra);
    Serve::start(&args)
}

/// libnbd's URI of export w.raw on `sock` over TLS, with the client's
/// certificate directory `pki`.
fn tls_uri(sock: &Path, pki: &Path) -> String {
    format!(
        "nbds+unix:///w.raw?socket={}&tls-certificates={}",
        sock.display(),
        pki.display()
    )
}

/// qemu-io over TCP with TLS (certificates from `pki`) on export w.raw of
/// the server on `port`, running `cmds` (each a `-c`).
fn qemu_io_tls(pki: &Path, port: u16, cmds: &[&str]) -> Output {
    let creds = format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        pki.display()
    );
    let opts = format!(
        "driver=nbd,server.type=inet,server.host=localhost,server.port={port},export=w.raw,tls-creds=tls0"
    );
    let mut args = vec!["--object", &creds, "--image-opts", &opts];
    for c in cmds {
        args.extend(["-c", c]);
    }
    tool("qemu-io", &args)
}

/// A new CA in `dir` (ca-cert.pem, ca-key.pem).
fn make_ca(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let subj = format!("/CN={name}");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca-cert.pem",
            "-days",
            "2",
            "-subj",
            &subj,
        ],
    );
}

/// `dir/WHO-cert.pem` and `dir/WHO-key.pem` (WHO: server or client),
/// signed by the CA in `dir`.
fn issue_certificate(dir: &Path, who: &str) {
    let (key, csr, cert) = (
        format!("{who}-key.pem"),
        format!("{who}.csr"),
        format!("{who}-cert.pem"),
    );
    let (cn, ext) = match who {
        "server" => (
            "/CN=localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             extendedKeyUsage=serverAuth\n",
        ),
        _ => (
            "/CN=cairn test client",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        ),
    };
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", cn,
        ],
    );
    let extfile = format!("{who}-ext.cnf");
    std::fs::write(dir.join(&extfile), ext).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &extfile,
        ],
    );
}

/// A CA and a server certificate for localhost and 127.0.0.1 in `dir`,
/// in the layout of qemu's tls-creds-x509 and libnbd's tls-certificates
/// (ca-cert.pem for clients; server-cert.pem, server-key.pem for the server).
fn make_certificates(dir: &Path) {
    make_ca(dir, "cairn test CA");
    issue_certificate(dir, "server");
}

/// Issue 19: any local user could read and write an export over TCP. With
/// `--tls require`, libnbd (nbdinfo, nbdcopy) and qemu connect with TLS
/// and X.509 certificates, and a plain client is refused.
#[test]
fn tls_clients_are_served_and_plain_ones_refused_when_required() {
    if !have_all(&["openssl", "nbdinfo", "nbdcopy", "qemu-io"]) {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let certs = d.join("pki");
    make_certificates(&certs);
    let w = d.join("w.raw");
    let data = noise(3 << 20, 95);
    std::fs::write(&w, &data).unwrap();
    let sock = d.join("s.sock");
    let srv = serve_tls(&w, &sock, &certs, &[]);
    let tls_uri = tls_uri(&sock, &certs);
    let j = nbdinfo_json(&["--json", &tls_uri]);
    assert_eq!(j["exports"][0]["export-size"], data.len() as u64, "{j}");
    assert_eq!(j["TLS"], true, "{j}");
    // A plain client gets nothing.
    let plain = tool("nbdinfo", &[&srv.uri("w.raw")]);
    assert!(
        !plain.status.success(),
        "a plain client was served under --tls require"
    );
    // qemu writes over TCP with TLS; nbdcopy reads it all back.
    ok(qemu_io_tls(
        &certs,
        srv.port.unwrap(),
        &["write -P 0x5a 1M 64k", "flush"],
    ));
    let copy = d.join("copy.raw");
    ok(tool("nbdcopy", &[&tls_uri, s(&copy)]));
    let mut want = data.clone();
    want[1 << 20..(1 << 20) + (64 << 10)].fill(0x5a);
    assert_same(&std::fs::read(&copy).unwrap(), &want, "read back over TLS");
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
}

/// Issue 19: TLS alone encrypts but does not say who the client is. With
/// `--tls-verify-peer` only a client showing a certificate from the CA in
/// ca-cert.pem is served (libnbd and qemu read client-cert.pem and
/// client-key.pem from their certificate directory); one without a
/// certificate, or with one from another CA, fails the handshake.
#[test]
fn tls_verify_peer_serves_only_clients_with_a_certificate_from_the_ca() {
    if !have_all(&["openssl", "nbdinfo", "qemu-io"]) {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let certs = d.join("pki");
    make_certificates(&certs);
    issue_certificate(&certs, "client");
    // Trusts the server, shows no certificate.
    let anonymous = d.join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), anonymous.join("ca-cert.pem")).unwrap();
    // Trusts the server, shows a certificate from a CA of its own.
    let stranger = d.join("stranger");
    make_ca(&stranger, "some other CA");
    issue_certificate(&stranger, "client");
    std::fs::copy(certs.join("ca-cert.pem"), stranger.join("ca-cert.pem")).unwrap();

    let w = d.join("w.raw");
    let data = noise(1 << 20, 96);
    std::fs::write(&w, &data).unwrap();
    let sock = d.join("s.sock");
    let srv = serve_tls(&w, &sock, &certs, &["--tls-verify-peer"]);
    let j = nbdinfo_json(&["--json", &tls_uri(&sock, &certs)]);
    assert_eq!(j["exports"][0]["export-size"], data.len() as u64, "{j}");
    for (who, pki) in [("no certificate", &anonymous), ("another CA's", &stranger)] {
        let o = tool("nbdinfo", &[&tls_uri(&sock, pki)]);
        assert!(
            !o.status.success(),
            "a client with {who} was served under --tls-verify-peer"
        );
    }
    // qemu shows its certificate over TCP and writes.
    let port = srv.port.unwrap();
    let write = ["write -P 0x33 0 64k", "flush"];
    ok(qemu_io_tls(&certs, port, &write));
    assert!(
        !qemu_io_tls(&stranger, port, &write).status.success(),
        "qemu with another CA's certificate was served"
    );
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
    let mut want = data;
    want[..64 << 10].fill(0x33);
    assert_same(
        &std::fs::read(&w).unwrap(),
        &want,
        "what the authenticated client wrote",
    );
    // --tls-verify-peer without --tls requires TLS: a plain client shows
    // no certificate, so it is not served (under `on` it was).
    let sock2 = d.join("s2.sock");
    let srv = Serve::start(&[
        "--file",
        s(&w),
        "--socket",
        s(&sock2),
        "--tls-certificates",
        s(&certs),
        "--tls-verify-peer",
    ]);
    let plain = tool("nbdinfo", &[&srv.uri("w.raw")]);
    assert!(
        !plain.status.success(),
        "a plain client was served under --tls-verify-peer"
    );
    let j = nbdinfo_json(&["--json", &tls_uri(&sock2, &certs)]);
    assert_eq!(j["TLS"], true, "{j}");
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
}

/// `--tls on` offers TLS and still serves plain clients; a listener off
/// the loopback without required TLS is warned about.
#[test]
fn tls_on_serves_both_and_open_listeners_are_warned_about() {
    if !have_all(&["openssl", "nbdinfo"]) {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let certs = d.join("pki");
    make_certificates(&certs);
    let w = d.join("w.raw");
    std::fs::write(&w, noise(1 << 20, 96)).unwrap();
    let sock = d.join("s.sock");
    let srv = Serve::start(&[
        "--file",
        &format!("{},ro", s(&w)),
        "--socket",
        s(&sock),
        "--listen",
        "0.0.0.0:0",
        "--tls-certificates",
        s(&certs),
    ]);
    let tls_uri = format!(
        "nbds+unix:///w.raw?socket={}&tls-certificates={}",
        sock.display(),
        certs.display()
    );
    assert_eq!(nbdinfo_json(&["--json", &tls_uri])["TLS"], true);
    assert_eq!(nbdinfo_json(&["--json", &srv.uri("w.raw")])["TLS"], false);
    let err = srv.stderr_text();
    assert!(
        err.contains("warning: 0.0.0.0:0 is reachable from other hosts"),
        "no warning for an open listener: {err}"
    );
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
}

/// nbdcopy into a TLS export with 64 requests in flight per connection
/// (libnbd sends them back to back; gnutls cuts them into 16 KiB
/// records): every byte lands. Writes pipelined like this used to end
/// the connection ("received plaintext buffer full": the server fed
/// rustls whole socket reads without taking the plaintext out between).
#[test]
fn tls_pipelined_nbdcopy_writes_every_byte() {
    if !have_all(&["openssl", "nbdcopy"]) {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let certs = d.join("pki");
    make_certificates(&certs);
    let data = noise(16 << 20, 97);
    let src = d.join("src.raw");
    std::fs::write(&src, &data).unwrap();
    let w = d.join("w.raw");
    std::fs::File::create(&w)
        .unwrap()
        .set_len(data.len() as u64)
        .unwrap();
    let sock = d.join("s.sock");
    let srv = serve_tls(&w, &sock, &certs, &[]);
    ok(tool(
        "nbdcopy",
        &[
            "--connections",
            "4",
            "--requests",
            "64",
            s(&src),
            &tls_uri(&sock, &certs),
        ],
    ));
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
    assert_same(
        &std::fs::read(&w).unwrap(),
        &data,
        "what nbdcopy wrote over TLS",
    );
}

/// A zero-length read with structured replies: the spec forbids an
/// empty NBD_REPLY_TYPE_OFFSET_DATA chunk (libnbd drops the connection as
/// "a bug in the NBD server"); a NONE chunk or an error is what may come.
#[test]
fn zero_length_structured_read_is_well_formed() {
    let dir = tempdir();
    let d = dir.path();
    let data = noise(100_000, 81);
    let f = d.join("f.raw");
    std::fs::write(&f, &data).unwrap();
    let repo = repo_with(d, &[("img", &[&data])]);
    let sock = d.join("s.sock");
    let srv = Serve::start(&["--file", s(&f), "--repo", s(&repo), "--socket", s(&sock)]);
    for name in ["f.raw", "img"] {
        for at in [0, 4096, data.len() as u64] {
            let mut c = unix(srv.sock.as_ref().unwrap());
            assert_eq!(attach_structured(&mut c, name), data.len() as u64);
            request(&mut c, CMD_READ, 5, at, 0, &[]);
            for (ty, cookie, p) in chunks(&mut c) {
                assert_eq!(cookie, 5);
                assert!(
                    !(ty == 1 && p.len() <= 8),
                    "{name}: empty OFFSET_DATA chunk for a zero-length read at {at}"
                );
                assert!(ty == 0 || ty & 0x8000 != 0, "{name}: chunk type {ty}");
            }
            // The connection goes on.
            request(&mut c, CMD_READ, 6, 1000, 3000, &[]);
            let mut got = Vec::new();
            for (ty, cookie, p) in chunks(&mut c) {
                assert_eq!((ty, cookie), (1, 6), "{name}");
                assert_eq!(u64::from_be_bytes(p[..8].try_into().unwrap()), 1000);
                got.extend_from_slice(&p[8..]);
            }
            assert_same(&got, &data[1000..4000], name);
            request(&mut c, CMD_DISC, 7, 0, 0, &[]);
        }
    }
}

// ---------------------------------------------------------------------
// 9. Bad arguments

/// Run `cairn serve args`: it must fail quickly with one line.
fn serve_fails(args: &[&str], expect: &str) {
    let mut child = cairn()
        .env_remove("CAIRN_REPO")
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = wait_for(Duration::from_secs(10), || {
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
        panic!("cairn serve {args:?} is still running");
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "cairn serve {args:?} succeeded");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line: {err}");
    assert!(lines[0].starts_with("cairn: "), "{args:?}: {err}");
    assert!(
        lines[0].to_lowercase().contains(&expect.to_lowercase()),
        "{args:?}: {err} (expected {expect:?})"
    );
}

#[test]
fn bad_arguments_fail_with_one_line() {
    let dir = tempdir();
    let d = dir.path();
    let repo = repo_with(d, &[("img", &[&noise(10_000, 71)])]);
    let repo = s(&repo);
    let f = d.join("f.raw");
    std::fs::write(&f, [1u8; 4096]).unwrap();
    let f = s(&f);
    let sock = d.join("s.sock");
    let sock = s(&sock);
    let missing = d.join("nope");
    let missing = s(&missing);
    serve_fails(&["--socket", sock], "nothing to export");
    serve_fails(&[], "nothing to export");
    // A usage error points at the subcommand's help, which lists its
    // options, not the top level's, which lists only subcommands.
    serve_fails(&["--workers", "x"], "(see cairn serve --help)");
    // A zero that would mean "never" or "none" is refused, not made 1.
    for zero in ["--io-timeout", "--handshake-timeout", "--max-connections"] {
        serve_fails(
            &[zero, "0", "--file", f, "--socket", sock],
            "0 is not in 1..",
        );
    }
    let out = run(&["cache", "status", "bogus"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "cairn: unexpected argument 'bogus' found (see cairn cache status --help)\n"
    );
    serve_fails(
        &["--file", "/nonexistent", "--socket", sock],
        "/nonexistent",
    );
    serve_fails(&["--image", "x", "--socket", sock], "--repo");
    serve_fails(
        &["--repo", missing, "--socket", sock],
        "not a cairn repository",
    );
    serve_fails(
        &["--repo", repo, "--image", "nosuch", "--socket", sock],
        "nosuch",
    );
    serve_fails(
        &["--repo", repo, "--image", "img@99", "--socket", sock],
        "img@99",
    );
    serve_fails(
        &[
            "--file",
            &format!("a={f},ro"),
            "--file",
            &format!("a={f},ro"),
            "--socket",
            sock,
        ],
        "\"a\"",
    );
    // A file named like an image.
    serve_fails(
        &[
            "--repo",
            repo,
            "--file",
            &format!("img={f}"),
            "--socket",
            sock,
        ],
        "\"img\"",
    );
    serve_fails(
        &[
            "--repo", repo, "--image", "img", "--image", "img", "--socket", sock,
        ],
        "\"img\"",
    );
    serve_fails(
        &["--file", &format!("{f},bogus"), "--socket", sock],
        "bogus",
    );
    serve_fails(
        &["--repo", repo, "--image", "img,bogus", "--socket", sock],
        "bogus",
    );
    serve_fails(
        &["--repo", repo, "--image", "img@1,rw", "--socket", sock],
        "latest snapshot",
    );
    serve_fails(
        &["--file", f, "--workers", "0", "--socket", sock],
        "workers",
    );
    serve_fails(
        &["--file", f, "--socket", &format!("{missing}/dir/s.sock")],
        "listen",
    );
    serve_fails(&["--file", f, "--listen", "not-an-address"], "listen");
    assert!(!Path::new(sock).exists(), "a failed start left its socket");
}

// ---------------------------------------------------------------------
// 10. Extended headers (64-bit lengths) and multi-conn

const OPT_EXTENDED_HEADERS: u32 = 11;
const OPT_SET_META_CONTEXT: u32 = 10;
const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;
const CMD_FLUSH: u16 = 3;
const CMD_BLOCK_STATUS: u16 = 7;
const FLAG_PAYLOAD_LEN: u16 = 1 << 5;
const REPLY_NONE: u16 = 0;
const REPLY_OFFSET_DATA: u16 = 1;
const REPLY_BLOCK_STATUS_EXT: u16 = 6;

/// Fixed newstyle with NBD_OPT_EXTENDED_HEADERS, `base:allocation` and
/// NBD_OPT_GO, by hand; returns the size. Panics if the server does not
/// take extended headers.
fn attach_extended<S: Read + Write>(s: &mut S, name: &str) -> u64 {
    let flags = greeting(s);
    let client: u32 = 1 | if flags & 2 != 0 { 2 } else { 0 };
    s.write_all(&client.to_be_bytes()).unwrap();
    option(s, OPT_EXTENDED_HEADERS, &[]);
    let (ty, p) = option_reply(s, OPT_EXTENDED_HEADERS);
    assert_eq!(
        ty,
        1,
        "NBD_OPT_EXTENDED_HEADERS refused: {:#x} {}",
        ty,
        String::from_utf8_lossy(&p)
    );
    let ctx = b"base:allocation";
    let mut m = (name.len() as u32).to_be_bytes().to_vec();
    m.extend_from_slice(name.as_bytes());
    m.extend_from_slice(&1u32.to_be_bytes());
    m.extend_from_slice(&(ctx.len() as u32).to_be_bytes());
    m.extend_from_slice(ctx);
    option(s, OPT_SET_META_CONTEXT, &m);
    let (ty, p) = option_reply(s, OPT_SET_META_CONTEXT);
    assert_eq!(ty, 4, "no meta context"); // NBD_REP_META_CONTEXT
    assert_eq!(&p[4..], ctx);
    assert_eq!(option_reply(s, OPT_SET_META_CONTEXT).0, 1);
    let mut go = (name.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(name.as_bytes());
    go.extend_from_slice(&0u16.to_be_bytes());
    option(s, 7, &go);
    let mut size = None;
    loop {
        match option_reply(s, 7) {
            (1, _) => break,
            (3, p) if p[..2] == [0, 0] => {
                size = Some(u64::from_be_bytes(p[2..10].try_into().unwrap()));
            }
            (3, _) => {}
            (ty, p) => panic!("NBD_OPT_GO: reply {ty:#x} {p:?}"),
        }
    }
    size.expect("no NBD_INFO_EXPORT")
}

/// A 32-byte extended request header with a 64-bit length, then `data`.
fn ext_request(
    s: &mut impl Write,
    cmd: u16,
    flags: u16,
    cookie: u64,
    offset: u64,
    len: u64,
    data: &[u8],
) {
    let mut m = Vec::with_capacity(32 + data.len());
    m.extend_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
    m.extend_from_slice(&flags.to_be_bytes());
    m.extend_from_slice(&cmd.to_be_bytes());
    m.extend_from_slice(&cookie.to_be_bytes());
    m.extend_from_slice(&offset.to_be_bytes());
    m.extend_from_slice(&len.to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
}

/// Extended reply chunks up to NBD_REPLY_FLAG_DONE: (type, cookie,
/// header offset, payload).
fn ext_chunks(s: &mut impl Read) -> Vec<(u16, u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let mut h = [0u8; 32];
        s.read_exact(&mut h).expect("extended reply");
        let be64 = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap());
        assert_eq!(
            u32::from_be_bytes(h[..4].try_into().unwrap()),
            EXTENDED_REPLY_MAGIC,
            "not an extended reply header: {h:?}"
        );
        let flags = u16::from_be_bytes([h[4], h[5]]);
        let ty = u16::from_be_bytes([h[6], h[7]]);
        let len = be64(&h[24..32]);
        assert!(len < 64 << 20, "reply length {len}");
        let mut p = vec![0u8; len as usize];
        s.read_exact(&mut p).unwrap();
        out.push((ty, be64(&h[8..16]), be64(&h[16..24]), p));
        if flags & 1 != 0 {
            return out;
        }
    }
}

/// By hand over the unix socket: extended headers negotiated, a write
/// and a read with 32-byte headers, a flush answered with a chunk (no
/// simple replies), and block status with 64-bit extents.
#[test]
fn raw_client_speaks_extended_headers() {
    let dir = tempdir();
    let d = dir.path();
    const SIZE: u64 = 6 << 30;
    let f = d.join("big.raw");
    let file = std::fs::File::create(&f).unwrap();
    file.set_len(SIZE).unwrap();
    drop(file);
    let sock = d.join("s.sock");
    let srv = Serve::start(&["--file", s(&f), "--socket", s(&sock)]);
    let mut c = unix(srv.sock.as_ref().unwrap());
    assert_eq!(attach_extended(&mut c, "big.raw"), SIZE);

    let data = noise(8192, 101);
    ext_request(&mut c, CMD_WRITE, FLAG_PAYLOAD_LEN, 1, 1 << 20, 8192, &data);
    let r = ext_chunks(&mut c);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].0, r[0].1, r[0].2), (REPLY_NONE, 1, 1 << 20), "{r:?}");
    ext_request(&mut c, CMD_FLUSH, 0, 2, 0, 0, &[]);
    let r = ext_chunks(&mut c);
    assert_eq!((r[0].0, r[0].1), (REPLY_NONE, 2), "{r:?}");

    ext_request(&mut c, CMD_READ, 0, 3, (1 << 20) + 100, 5000, &[]);
    let mut got = Vec::new();
    for (ty, cookie, at, p) in ext_chunks(&mut c) {
        assert_eq!((ty, cookie, at), (REPLY_OFFSET_DATA, 3, (1 << 20) + 100));
        assert_eq!(
            u64::from_be_bytes(p[..8].try_into().unwrap()),
            (1 << 20) + 100
        );
        got.extend_from_slice(&p[8..]);
    }
    assert_same(&got, &data[100..5100], "read with an extended header");

    // Block status from 2 MiB over 5 GiB: the file is a hole there, and
    // the hole is reported as one extent longer than 32 bits can say.
    ext_request(&mut c, CMD_BLOCK_STATUS, 0, 4, 2 << 20, 5 << 30, &[]);
    let r = ext_chunks(&mut c);
    assert_eq!(r.len(), 1, "{r:?}");
    let (ty, cookie, at, p) = &r[0];
    assert_eq!((*ty, *cookie, *at), (REPLY_BLOCK_STATUS_EXT, 4, 2 << 20));
    assert!(p.len() >= 24 && (p.len() - 8) % 16 == 0, "{p:?}");
    let first = u64::from_be_bytes(p[8..16].try_into().unwrap());
    let state = u64::from_be_bytes(p[16..24].try_into().unwrap());
    assert_eq!(state & 3, 3, "not a hole: {p:?}");
    assert!(first > u64::from(u32::MAX), "first extent {first} bytes");
    request_ext_disc(&mut c);
    assert_same(
        &std::fs::read(&f).unwrap()[1 << 20..(1 << 20) + 8192],
        &data,
        "big.raw after the extended write",
    );
}

fn request_ext_disc(c: &mut UnixStream) {
    ext_request(c, CMD_DISC, 0, 99, 0, 0, &[]);
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");
}

/// qemu 10 asks for extended headers and gets them: one 5 GiB
/// write-zeroes request (more than a compact header can carry), data
/// written and read back, and the bytes on disk.
#[test]
fn qemu_uses_extended_headers() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    const G: u64 = 1 << 30;
    let f = d.join("big.raw");
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::create(&f).unwrap();
        file.set_len(6 * G).unwrap();
        // Data the big zeroing must clear.
        file.write_all_at(&[0x77; 4096], 4 * G + 12_288).unwrap();
    }
    let srv = Serve::start(&["--file", s(&f), "--socket", s(&d.join("s.sock"))]);
    if have("qemu-img") {
        // The map comes as 64-bit block status chunks.
        let out = tool(
            "qemu-img",
            &[
                "--trace",
                "nbd_receive_reply_chunk_header",
                "map",
                "--output=json",
                "-f",
                "raw",
                &srv.uri("big.raw"),
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "qemu-img map: {err}");
        assert!(err.contains("type = 6 (block status (64-bit))"), "{err}");
        let map: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(map[0]["length"], 4 * G + 12_288, "{map}");
        assert_eq!(map[1]["data"], true, "{map}");
    }
    let out = qemu_io_with(
        &[
            "--trace",
            "nbd_receive_option_reply",
            "--trace",
            "nbd_send_request",
        ],
        &srv.uri("big.raw"),
        &[
            "write -P 0xab 0 64k",
            // -n: one request (FAST_ZERO), not qemu-io's 2 GiB split;
            // -u: the zeroing may punch a hole, so the test needs no
            // 5 GiB of free disk (NO_HOLE would make the file allocate it).
            "write -z -u -n 1G 5G",
            "read -P 0xab 0 64k",
            "read -P 0 4G 64k",
            "flush",
        ],
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "qemu-io failed: {text}");
    assert!(!text.contains("Pattern verification failed"), "{text}");
    let ext = text
        .lines()
        .find(|l| l.contains("nbd_receive_option_reply") && l.contains("reply 11 "))
        .unwrap_or_else(|| panic!("qemu did not ask for extended headers: {text}"));
    assert!(
        ext.contains("type 1 (ack)"),
        "extended headers refused: {ext}"
    );
    let len = format!(".len = {},", 5 * G);
    assert!(
        text.lines()
            .any(|l| l.contains("nbd_send_request") && l.contains(&len)),
        "no single 5 GiB request: {text}"
    );
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "{st:?}");
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(&f).unwrap();
    let mut b = vec![0u8; 65536];
    file.read_exact_at(&mut b, 0).unwrap();
    assert!(b.iter().all(|&x| x == 0xab), "written data");
    file.read_exact_at(&mut b[..4096], 4 * G + 12_288).unwrap();
    assert!(
        b[..4096].iter().all(|&x| x == 0),
        "the 5 GiB zeroing missed"
    );
    use std::os::unix::fs::MetadataExt;
    let allocated = file.metadata().unwrap().blocks() * 512;
    assert!(allocated < G, "the zeroing allocated {allocated} bytes");
}

/// Debian 12's libnbd (1.14) predates extended headers: nbdinfo and
/// nbdcopy still work with compact headers and structured replies.
#[test]
fn libnbd_without_extended_headers_still_works() {
    if !have_all(&["nbdinfo", "nbdcopy"]) {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    let data = noise(3 << 20, 103);
    let f = d.join("f.raw");
    std::fs::write(&f, &data).unwrap();
    let srv = Serve::start(&["--file", s(&f), "--socket", s(&d.join("s.sock"))]);
    let j = nbdinfo_json(&["--json", &srv.uri("f.raw")]);
    assert_eq!(j["exports"][0]["export-size"], data.len() as u64, "{j}");
    let copy = d.join("copy.raw");
    ok(tool("nbdcopy", &[&srv.uri("f.raw"), s(&copy)]));
    assert_same(&std::fs::read(&copy).unwrap(), &data, "nbdcopy out");
    let back = noise(3 << 20, 104);
    let src = d.join("src.raw");
    std::fs::write(&src, &back).unwrap();
    ok(tool("nbdcopy", &[s(&src), &srv.uri("f.raw")]));
    let (st, _) = srv.stop(Duration::from_secs(10));
    assert!(st.success(), "{st:?}");
    assert_same(&std::fs::read(&f).unwrap(), &back, "nbdcopy in");
}

/// A writable file with a write-back cache in front advertises
/// multi-conn, and may: one cache serves every connection, so a write
/// acknowledged on one connection is read on another, and a flush on
/// the second makes the first's write durable (it survives SIGKILL,
/// replayed from the cache's log).
#[test]
fn writeback_cache_is_coherent_across_connections() {
    let dir = tempdir();
    let d = dir.path();
    let back = d.join("back.raw");
    std::fs::write(&back, vec![0u8; 8 << 20]).unwrap();
    std::fs::write(d.join("cache.dev"), vec![0u8; 9 << 20]).unwrap();
    let spec = format!("d={},cache={}", s(&back), s(&d.join("cache.dev")));
    let sock = d.join("s.sock");
    let args = [
        "--file",
        &spec,
        "--cache-idle-ms",
        "3600000",
        "--cache-flush-deadline-ms",
        "3600000",
        "--socket",
        s(&sock),
    ];
    let mut srv = Serve::start(&args);
    if have("nbdinfo") {
        let j = nbdinfo_json(&["--json", &srv.uri("d")]);
        assert_eq!(j["exports"][0]["can_multi_conn"], true, "{j}");
    }
    let mut a = unix(&sock);
    let (_, flags) = attach(&mut a, "d");
    assert!(flags & (1 << 8) != 0, "NBD_FLAG_CAN_MULTI_CONN not set");
    let mut b = unix(&sock);
    attach(&mut b, "d");
    let data = noise(65536, 105);
    request(&mut a, CMD_WRITE, 1, 1 << 20, 65536, &data);
    assert_eq!(simple_reply(&mut a), (0, 1));
    // Seen on the other connection before any flush.
    request(&mut b, CMD_READ, 2, 1 << 20, 65536, &[]);
    assert_eq!(simple_reply(&mut b), (0, 2));
    let mut got = vec![0u8; 65536];
    b.read_exact(&mut got).unwrap();
    assert_same(&got, &data, "read on the second connection");
    // A flush on the second connection covers the first's write.
    request(&mut b, CMD_FLUSH, 3, 0, 0, &[]);
    assert_eq!(simple_reply(&mut b), (0, 3));
    drop((a, b));
    srv.signal_and_wait(libc::SIGKILL, Duration::from_secs(10))
        .expect("SIGKILL");
    srv.child = None;
    let srv = Serve::start(&args);
    let mut c = unix(srv.sock.as_ref().unwrap());
    attach(&mut c, "d");
    request(&mut c, CMD_READ, 4, 1 << 20, 65536, &[]);
    assert_eq!(simple_reply(&mut c), (0, 4));
    c.read_exact(&mut got).unwrap();
    assert_same(&got, &data, "after SIGKILL and recovery");
    request(&mut c, CMD_DISC, 5, 0, 0, &[]);
}

/// The memory bounds hold with 64-bit lengths: 100 clients on extended
/// headers announce 32 MiB writes and trickle; a read of 1 TiB is
/// refused without a buffer; a write announcing 1 TiB of payload is hung
/// up on, not drained or allocated.
#[test]
fn extended_headers_keep_the_memory_bounds() {
    let dir = tempdir();
    let d = dir.path();
    let w = d.join("w.raw");
    let data = noise(1 << 20, 106);
    std::fs::write(&w, &data).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&w)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let sock = d.join("s.sock");
    let srv = Serve::start(&["--file", s(&w), "--socket", s(&sock)]);
    let pid = srv.child.as_ref().unwrap().id();
    let junk = noise(8192, 107);

    let mut c = unix(&sock);
    attach_extended(&mut c, "w.raw");
    ext_request(&mut c, CMD_READ, 0, 1, 0, 1 << 40, &[]);
    let r = ext_chunks(&mut c);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].0, r[0].1), (0x8001, 1), "1 TiB read: {r:?}");
    assert_eq!(u32::from_be_bytes(r[0].3[..4].try_into().unwrap()), 22);
    ext_request(&mut c, CMD_WRITE, FLAG_PAYLOAD_LEN, 2, 0, 1 << 40, &junk);
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert!(rest.is_empty(), "1 TiB write header: not hung up on");

    let mut held = Vec::new();
    for i in 0..100u64 {
        let mut u = unix(&sock);
        attach_extended(&mut u, "w.raw");
        ext_request(
            &mut u,
            CMD_WRITE,
            FLAG_PAYLOAD_LEN,
            i,
            0,
            32 << 20,
            &junk[..4096],
        );
        held.push(u);
    }
    for round in 0..4 {
        for u in &mut held {
            u.write_all(&junk[round * 1024..(round + 1) * 1024])
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let peak = rss(pid);
    assert_same(
        &first_read(&sock, "w.raw", 0),
        &data[..4096],
        "a new client's read",
    );
    assert!(
        peak < 512 << 20,
        "server RSS {} MiB with 100 trickling extended write headers",
        peak >> 20
    );
    let (st, took) = srv.stop(Duration::from_secs(20));
    assert!(st.success(), "exit {st:?}");
    assert!(took < Duration::from_secs(5), "took {took:?} to stop");
    assert_same(&std::fs::read(&w).unwrap()[..data.len()], &data, "w.raw");
    drop(held);
}

/// Regression (outside QA): nothing kept a second process from writing
/// the file a server serves through a write-back cache, or the cache
/// itself: a second export of the backing file read stale data and its
/// writes would be overwritten by the writeback, and an export of the
/// cache file wrote over a log of flushed writes. Exports are locked as
/// qemu-nbd locks its images: writable ones exclusively, read-only ones
/// shared.
#[test]
fn an_exported_file_and_its_cache_are_locked() {
    let dir = tempdir();
    let d = dir.path();
    let backing = d.join("b.img");
    let file = std::fs::File::create(&backing).unwrap();
    file.set_len(8 << 20).unwrap();
    for c in ["c.cache", "c2.cache"] {
        std::fs::File::create(d.join(c))
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
    }
    let server = Serve::start(&[
        "--file",
        &format!("d={},cache={}", s(&backing), s(&d.join("c.cache"))),
        "--socket",
        s(&d.join("s.sock")),
    ]);
    let refused = |spec: String| {
        let out = run(&["serve", "--file", &spec, "--socket", s(&d.join("t.sock"))]);
        assert_eq!(out.status.code(), Some(1), "{spec}");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(err.contains("in use"), "{spec}: {err}");
    };
    refused(format!("d={}", s(&backing)));
    refused(format!("d={},ro", s(&backing)));
    refused(format!("d={}", s(&d.join("c.cache"))));
    refused(format!(
        "d={},cache={}",
        s(&backing),
        s(&d.join("c2.cache"))
    ));
    drop(server);
    // Read-only exports share: the same file twice, in one server.
    let ro = format!("a={},ro", s(&backing));
    let ro2 = format!("b={},ro", s(&backing));
    let server = Serve::start(&[
        "--file",
        &ro,
        "--file",
        &ro2,
        "--socket",
        s(&d.join("s.sock")),
    ]);
    drop(server);
    // Writable, the same file twice is refused.
    let out = run(&[
        "serve",
        "--file",
        &format!("d={}", s(&backing)),
        "--file",
        &format!("e={}", s(&backing)),
        "--socket",
        s(&d.join("t.sock")),
    ]);
    assert_eq!(out.status.code(), Some(1));
}
