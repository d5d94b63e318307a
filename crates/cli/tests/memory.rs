//! Bounded memory: peak RSS of `cairn pack` and `cairn unpack` on a 4 GiB
//! stream stays below 64 MiB + threads x 4 x block size, whatever the
//! stream's length. Measured with GNU time's maximum resident set size.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

mod common;
use common::have;
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
    let read = |f: &std::path::Path| -> u64 {
        std::fs::read_to_string(f)
            .unwrap()
            .trim()
            .lines()
            .last()
            .unwrap()
            .parse()
            .unwrap()
    };
    (read(&p), read(&u), bytes)
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
