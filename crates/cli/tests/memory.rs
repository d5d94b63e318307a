//! Bounded memory: peak RSS of `cairn pack` and `cairn unpack` on a 4 GiB
//! stream stays below 64 MiB + threads x 4 x block size, whatever the
//! stream's length. Measured with GNU time's maximum resident set size.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

mod common;
use common::{have, ok, run, s, tool};
use std::process::Command;

const GIB4: u64 = 4 << 30;

/// Run a shell pipeline in which `time -f %M -o FILE cairn ...` records the
/// peak RSS (KiB) of each cairn; returns (pack KiB, unpack KiB, bytes out).
fn pipeline_rss(format: &str, level: &str, threads: usize, block: &str) -> (u64, u64, u64) {
    let dir = common::tempdir();
    let bin = env!("CARGO_BIN_EXE_cairn");
    let p = dir.path().join("pack.rss");
    let u = dir.path().join("unpack.rss");
    // A repeating text pattern compresses like real data would, but costs
    // nothing to generate; `yes` writes it at several GB/s.
    let script = format!(
        "set -o pipefail; (yes 'cairn keeps memory bounded on endless streams 0123456789' || true) \
         | head -c {GIB4} \
         | /usr/bin/time -f %M -o {p} {bin} pack -q -F {format} {level} -T {threads} -b {block} \
         | /usr/bin/time -f %M -o {u} {bin} unpack -q -T {threads} | wc -c",
        p = p.display(),
        u = u.display(),
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    (peak_kib(&p), peak_kib(&u), bytes)
}

/// The peak RSS (KiB) GNU time wrote to `f` with `-f %M -o f`.
fn peak_kib(f: &std::path::Path) -> u64 {
    std::fs::read_to_string(f)
        .unwrap()
        .trim()
        .lines()
        .last()
        .unwrap()
        .parse()
        .unwrap()
}

fn bound_kib(threads: u64, block: u64) -> u64 {
    (64 << 10) + threads * 4 * block / 1024
}

#[test]
fn peak_rss_is_bounded_on_a_4_gib_stream() {
    if !have("/usr/bin/time") {
        return;
    }
    for (format, level, block, block_bytes) in [
        ("lz4", "-1", "4M", 4u64 << 20),
        ("zstd", "-1", "4M", 4 << 20),
        ("gzip", "-1", "1M", 1 << 20),
    ] {
        let threads = 2;
        let (pack, unpack, bytes) = pipeline_rss(format, level, threads, block);
        assert_eq!(bytes, GIB4, "{format}: round trip lost bytes");
        let bound = bound_kib(threads as u64, block_bytes);
        eprintln!("{format}: pack {pack} KiB, unpack {unpack} KiB, bound {bound} KiB");
        assert!(
            pack < bound,
            "{format}: pack peak RSS {pack} KiB >= {bound} KiB"
        );
        assert!(
            unpack < bound,
            "{format}: unpack peak RSS {unpack} KiB >= {bound} KiB"
        );
    }
}

/// One gzip member decoded in parallel from a file, under `-M`: the
/// workers and their whole-chunk buffers fit the limit, whose peak RSS
/// stays under it (beside the mapped input); a limit with room for one
/// worker only decodes on one core, and `-v` says why. Output as gzip's.
#[test]
fn parallel_gunzip_fits_its_buffers_to_the_memory_limit() {
    if !have("/usr/bin/time") || !have("gzip") {
        return;
    }
    // Text, noise and zero runs: each 8 MiB chunk decodes to about 90
    // MiB, the size of the whole-chunk buffers four threads would fill
    // (unbounded, the peak here was about 380 MiB).
    let mut data = Vec::new();
    for i in 0..48 {
        data.extend(common::mixed(2 << 20, i));
        data.extend(common::noise(512 << 10, i));
        data.extend(std::iter::repeat_n(0u8, 4 << 20));
    }
    let gz = common::run_ok("gzip", &["-6", "-c"], &data);
    assert!(gz.len() > 16 << 20, "only {} compressed bytes", gz.len());
    let dir = common::tempdir();
    let file = dir.path().join("big.gz");
    std::fs::write(&file, &gz).unwrap();
    let bin = env!("CARGO_BIN_EXE_cairn");
    let rss = dir.path().join("rss");
    let unpack = |memory: &str| {
        let out = ok(Command::new("/usr/bin/time")
            .args(["-f", "%M", "-o", s(&rss), bin, "unpack", "-T", "4", "-v"])
            .args(["-M", memory, "-c", s(&file)])
            .output()
            .unwrap());
        assert!(out.stdout == data, "-M {memory}: output differs");
        (
            String::from_utf8_lossy(&out.stderr).into_owned(),
            peak_kib(&rss),
        )
    };
    let limit_kib: u64 = 200 << 10;
    let (log, kib) = unpack("200M");
    assert!(log.contains("inflating in parallel"), "{log}");
    // The summary line counts the cores the decode used.
    assert!(!log.contains("gzip 1 thread"), "{log}");
    let input_kib = gz.len() as u64 / 1024;
    eprintln!("-M 200M: peak {kib} KiB, limit {limit_kib} KiB, mapped input {input_kib} KiB");
    assert!(
        kib < limit_kib + input_kib,
        "peak RSS {kib} KiB over -M 200M"
    );
    // Without a limit that binds, the same decode takes more than it.
    let (_, big) = unpack("64G");
    eprintln!("-M 64G: peak {big} KiB");
    assert!(
        big > limit_kib + input_kib,
        "the test's data fits any limit"
    );
    let (log, kib) = unpack("100M");
    assert!(
        log.contains("on one core")
            && log.contains("memory limit")
            && log.contains("gzip 1 thread\n"),
        "{log}"
    );
    assert!(
        kib < (100 << 10) + input_kib,
        "one core: peak RSS {kib} KiB"
    );
    // A range read far into the member is held to the same limit.
    for (memory, parallel) in [("100M", "parallel=0"), ("64G", "parallel=1")] {
        let out = ok(run(&[
            "unpack",
            "-v",
            "-M",
            memory,
            "--range",
            "200M+1M",
            "-c",
            s(&file),
        ]));
        assert!(
            out.stdout == data[200 << 20..201 << 20],
            "-M {memory}: range"
        );
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(log.contains(parallel), "-M {memory}: {log}");
    }
}

/// A commit of a writable image's overlay streams: `cairn commit` of
/// 512 MiB of flushed random writes (every chunk of the image changed)
/// peaks far below what it commits, since the store is given one span
/// and writes one pack at a time.
#[test]
fn committing_a_big_overlay_holds_little_memory() {
    if !have("/usr/bin/time") || !have("nbdcopy") {
        return;
    }
    const SIZE: u64 = 512 << 20;
    let dir = common::tempdir();
    let d = dir.path();
    let (repo, img, new, sock) = (
        d.join("repo"),
        d.join("img"),
        d.join("new"),
        d.join("s.sock"),
    );
    let (repo_s, new_s) = (s(&repo), s(&new));
    std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
    ok(run(&["init", repo_s]));
    ok(run(&[
        "backup",
        s(&img),
        "--repo",
        repo_s,
        "--name",
        "img",
        "-q",
    ]));
    ok(tool(
        "bash",
        &["-c", &format!("head -c {SIZE} /dev/urandom > {new_s}")],
    ));
    let mut srv = common::cairn()
        .args([
            "serve",
            "--repo",
            repo_s,
            "--image",
            "img,rw",
            "--socket",
            s(&sock),
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !sock.exists() {
        assert!(t.elapsed().as_secs() < 30, "cairn serve did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // nbdcopy --flush flushes the destination at its end; then the server
    // dies without committing, leaving everything in the overlay.
    let uri = format!("nbd+unix:///img?socket={}", s(&sock));
    ok(tool("nbdcopy", &["--flush", new_s, &uri]));
    srv.kill().unwrap();
    srv.wait().unwrap();
    let rss = d.join("commit.rss");
    let bin = env!("CARGO_BIN_EXE_cairn");
    let out = ok(Command::new("/usr/bin/time")
        .args([
            "-f",
            "%M",
            "-o",
            s(&rss),
            bin,
            "commit",
            "--repo",
            repo_s,
            "img",
            "--json",
        ])
        .env("CAIRN_PASSWORD", common::PASSWORD)
        .env("CAIRN_STATE_DIR", common::state_dir())
        .output()
        .unwrap());
    assert_eq!(
        common::json(&out)["images"][0]["new_raw"],
        SIZE,
        "every chunk new"
    );
    let kib = peak_kib(&rss);
    eprintln!("commit of {} MiB: peak RSS {kib} KiB", SIZE >> 20);
    assert!(
        kib < 256 << 10,
        "commit peak RSS {kib} KiB for {} MiB",
        SIZE >> 20
    );
    let back = ok(run(&["restore", "img", "-", "--repo", repo_s, "-q"])).stdout;
    assert!(
        back == std::fs::read(&new).unwrap(),
        "the commit differs from what was written"
    );
}
