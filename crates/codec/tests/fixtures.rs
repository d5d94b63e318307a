//! Committed fixtures:
//!
//! - `tests/fixtures/streams-v1/sample.*`: small files written by cairn's
//!   first stream layout, one per format. Every later cairn must still read
//!   them to the same bytes (readers never drop a layout they once wrote);
//!   they are never written again.
//! - `tests/fixtures/streams-v2/sample.{gz,zst,sz}`: the second layout of
//!   gzip (start and end members), zstd (a start frame) and snappy (start
//!   and end chunks), see
//!   docs/format/streams.md, and `cut.*`, the same cut where a member or
//!   frame ends, as a killed writer leaves it, which must be refused.
//! - `tests/fixtures/sizes.tsv`: the compressed size of a fixed corpus for
//!   every format and level, so that a ratio regression (or gain) shows up
//!   as a diff in review, as zstd does with its results table.
//!
//! `CAIRN_BLESS=1 cargo test -p cairn-codec --test fixtures` rewrites both
//! after an intended change; commit the result with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

use cairn_codec::{decode_all, encode_all, Format};
use std::fmt::Write as _;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn bless() -> bool {
    std::env::var("CAIRN_BLESS").as_deref() == Ok("1")
}

/// The fixed corpus: text, zero runs and noise, 300 000 bytes.
fn corpus() -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut out = Vec::with_capacity(300_000);
    let words: [&[u8]; 5] = [b"cairn ", b"stores ", b"images ", b"\n", b"0000 "];
    while out.len() < 300_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        match x % 6 {
            0 => out.extend(std::iter::repeat_n(0u8, (x >> 8) as usize % 3000)),
            1 => out.extend((0..(x >> 8) as usize % 200).map(|i| (x >> (i % 56)) as u8)),
            _ => out.extend_from_slice(words[((x >> 16) % 5) as usize]),
        }
    }
    out.truncate(300_000);
    out
}

#[test]
fn version_1_streams_still_decode() {
    let dir = root().join("streams-v1");
    let data = corpus();
    for format in Format::ALL {
        let path = dir.join(format!("sample{}", format.suffix()));
        let packed = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with CAIRN_BLESS=1)", path.display()));
        let back = decode_all(&packed).unwrap_or_else(|e| panic!("{format}: {e}"));
        assert!(back == data, "{format}: fixture decodes to other bytes");
    }
}

/// The second layout of gzip and zstd: the sample decodes; cut after its
/// first three pieces (gzip: the start member and two blocks; zstd: an
/// empty frame, the start frame and a block; snappy: the identifier, the
/// start chunk and a block's first chunk), it is refused as truncated,
/// where the first layout made a valid shorter file (which gzip and zstd
/// still take).
#[test]
fn version_2_streams_decode_and_their_cut_is_refused() {
    let dir = root().join("streams-v2");
    let data = corpus();
    for (format, says) in [
        (Format::Gzip, "without its end member"),
        (Format::Zstd, "without its seek table"),
        (Format::Snappy, "without its end chunk"),
    ] {
        let path = dir.join(format!("sample{}", format.suffix()));
        let cut = dir.join(format!("cut{}", format.suffix()));
        if bless() {
            std::fs::create_dir_all(&dir).unwrap();
            let packed = encode_all(format, format.default_level(), 64 << 10, &data).unwrap();
            // The first three pieces: gzip members say their length
            // at bytes 16-19; zstd's seek table lists the frames' sizes.
            let at = match format {
                Format::Gzip => (0..3).fold(0, |at, _| at + le32(&packed, at + 16)),
                // Chunks: type, then a 3-byte length.
                Format::Snappy => (0..3).fold(0, |at, _| at + 4 + (le32(&packed, at) >> 8)),
                _ => {
                    let count = le32(&packed, packed.len() - 9);
                    let first = packed.len() - 9 - 12 * count;
                    (0..3).map(|i| le32(&packed, first + 12 * i)).sum()
                }
            };
            std::fs::write(&path, &packed).unwrap();
            std::fs::write(&cut, &packed[..at]).unwrap();
        }
        let packed = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with CAIRN_BLESS=1)", path.display()));
        assert!(decode_all(&packed).unwrap() == data, "{format}");
        let cut = std::fs::read(&cut).unwrap();
        let e = decode_all(&cut).unwrap_err().to_string();
        assert!(e.contains(says), "{format}: {e}");
        let tool = match format {
            Format::Gzip => "gzip",
            Format::Zstd => "zstd",
            _ => continue,
        };
        assert!(
            decode_with(tool, &cut)
                .is_some_and(|out| data.starts_with(&out) && out.len() < data.len()),
            "{tool} takes the cut file as whole (why the end piece is there)"
        );
    }
}

/// Bytes 0-3 after `at`, little-endian.
fn le32(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

/// `TOOL -dc` of `data` (`None` when it fails or is not installed).
fn decode_with(tool: &str, data: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write;
    let mut child = std::process::Command::new(tool)
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(data).ok()?;
    let out = child.wait_with_output().ok()?;
    out.status.success().then_some(out.stdout)
}

#[test]
fn compressed_sizes_match_the_committed_table() {
    let data = corpus();
    let mut table =
        String::from("# format\tlevel\tbytes (corpus of 300000 bytes, 64 KiB blocks)\n");
    for format in Format::ALL {
        let (lo, hi) = format.level_range();
        let levels: Vec<i32> = match format {
            Format::Zstd => vec![-5, 1, 3, 9, 19],
            Format::Lz4 => [lo, -1].into_iter().chain(1..=hi).collect(),
            _ => (lo..=hi).collect(),
        };
        for level in levels {
            let n = encode_all(format, level, 64 << 10, &data).unwrap().len();
            writeln!(table, "{format}\t{level}\t{n}").unwrap();
        }
    }
    let path = root().join("sizes.tsv");
    if bless() {
        std::fs::write(&path, &table).unwrap();
    }
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with CAIRN_BLESS=1)", path.display()));
    if committed != table {
        let diff: Vec<String> = committed
            .lines()
            .zip(table.lines())
            .filter(|(a, b)| a != b)
            .map(|(a, b)| format!("  committed {a:<24} now {b}"))
            .collect();
        panic!(
            "compressed sizes changed (CAIRN_BLESS=1 to accept):\n{}",
            diff.join("\n")
        );
    }
}
