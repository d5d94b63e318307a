//! Command-line behaviour in the manner of gzip and pigz: names, -k, -f,
//! -c, -o, --json, threads, errors for bad arguments.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

mod common;
use common::*;

#[test]
fn file_in_place_like_gzip() {
    let dir = tempdir();
    let data = mixed(300_000, 31);
    std::fs::write(dir.path().join("a.img"), &data).unwrap();
    let st = cairn()
        .args(["pack", "-q", "a.img"])
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(listing(dir.path()), ["a.img.gz"]);
    let st = cairn()
        .args(["unpack", "-q", "a.img.gz"])
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(listing(dir.path()), ["a.img"]);
    assert!(std::fs::read(dir.path().join("a.img")).unwrap() == data);
    // -k keeps the input; a second run refuses to overwrite without -f.
    for args in [
        &["pack", "-k", "-F", "zstd", "a.img"][..],
        &["pack", "-k", "-F", "zstd", "a.img"],
    ] {
        let _ = cairn().args(args).current_dir(dir.path()).output().unwrap();
    }
    assert_eq!(listing(dir.path()), ["a.img", "a.img.zst"]);
    let out = cairn()
        .args(["pack", "-k", "-F", "zstd", "a.img"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    let out = cairn()
        .args(["pack", "-k", "-f", "-F", "zstd", "a.img"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
}

#[test]
fn several_files_and_stdout() {
    let dir = tempdir();
    let a = mixed(100_000, 32);
    let b = mixed(150_000, 33);
    std::fs::write(dir.path().join("a"), &a).unwrap();
    std::fs::write(dir.path().join("b"), &b).unwrap();
    let out = cairn()
        .args(["pack", "-c", "-F", "xz", "a", "b"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(listing(dir.path()), ["a", "b"], "-c keeps inputs");
    assert!(cairn_ok(&["unpack"], &out.stdout) == [a, b].concat());
}

#[test]
fn output_option_and_json_summary() {
    let dir = tempdir();
    let data = mixed(2_000_000, 34);
    std::fs::write(dir.path().join("in"), &data).unwrap();
    let out = cairn()
        .args([
            "pack", "-F", "lz4", "-T", "2", "-b", "256K", "-k", "--json", "-o", "out.lz4", "in",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["bytes_in"], 2_000_000);
    assert_eq!(v["format"], "lz4");
    assert_eq!(v["threads"], 2);
    let packed_len = std::fs::metadata(dir.path().join("out.lz4")).unwrap().len();
    assert_eq!(v["bytes_out"], packed_len);
    assert!(v["ratio"].as_f64().unwrap() > 0.0 && v["mb_per_s"].as_f64().unwrap() > 0.0);
    // With data on stdout, the JSON goes to stderr.
    let out = cairn()
        .args(["unpack", "--json", "-c", "out.lz4"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stdout == data);
    let v: serde_json::Value = serde_json::from_slice(&out.stderr).expect("JSON on stderr");
    assert_eq!(v["bytes_out"], 2_000_000);
    assert_eq!(v["operation"], "unpack");
}

#[test]
fn single_thread_mode_gives_identical_output() {
    let data = mixed(1_500_000, 35);
    for format in ["gzip", "zstd", "lz4", "snappy", "lzop", "bzip2", "xz"] {
        let one = cairn_ok(&["pack", "-F", format, "-T1", "-b", "200K"], &data);
        let two = cairn_ok(&["pack", "-F", format, "-T2", "-b", "200K"], &data);
        let many = cairn_ok(&["pack", "-F", format, "-T7", "-b", "200K"], &data);
        assert!(
            one == two && two == many,
            "{format}: output depends on thread count"
        );
    }
}

#[test]
fn levels_pigz_style_and_errors() {
    let data = mixed(200_000, 36);
    let fast = cairn_ok(&["pack", "-1"], &data);
    let best = cairn_ok(&["pack", "-9"], &data);
    assert!(best.len() < fast.len());
    let z19 = cairn_ok(&["pack", "-F", "zstd", "-19"], &data);
    let zneg = cairn_ok(&["pack", "-F", "zstd", "-l", "-5"], &data);
    assert!(z19.len() < zneg.len());
    for bad in [
        &["pack", "-F", "gzip", "-l", "30"][..],
        &["pack", "-F", "rar"],
        &["pack", "-T", "0"],
        &["pack", "-b", "1G"],
        &["pack", "-b", "12Q"],
        &["unpack", "/nonexistent/file.gz"],
    ] {
        let out = cairn_pipe(bad, &data);
        assert!(!out.status.success(), "{bad:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{bad:?}: {err}");
        assert!(err.lines().count() <= 3, "{bad:?}: {err}");
    }
}

#[test]
fn unknown_suffix_is_refused_without_touching_the_file() {
    let dir = tempdir();
    let packed = cairn_ok(&["pack"], b"hello");
    std::fs::write(dir.path().join("noext"), &packed).unwrap();
    let out = cairn()
        .args(["unpack", "noext"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown suffix"));
    assert_eq!(listing(dir.path()), ["noext"]);
}
