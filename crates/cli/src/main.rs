//! # cairn
//!
//! The command-line tool: parses arguments, wires the codec and pipeline
//! layers together, draws progress on a terminal and prints reports as
//! text or JSON. It is the only crate that knows every layer.

mod cache_cmd;
mod files;
mod pack;
mod repo_cmd;
mod report;
mod serve;
mod serve_repo;
mod signals;

use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;

/// cairn: a storage stack for big images and streams.
#[derive(Parser, Debug)]
#[command(name = "cairn", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compress files or stdin in parallel, in a standard format.
    ///
    /// Levels can be given pigz-style as -1 .. -19 or as -l LEVEL
    /// (zstd accepts negative levels: -l -5).
    Pack(PackArgs),
    /// Decompress files or stdin in parallel; the format is detected by magic.
    Unpack(UnpackArgs),
    /// Create a repository, its packs striped over one or more targets.
    Init(repo_cmd::InitArgs),
    /// Store a file, a block device or stdin as a new snapshot of an image.
    Backup(repo_cmd::BackupArgs),
    /// Write a snapshot back to a file, a block device or stdout.
    Restore(repo_cmd::RestoreArgs),
    /// List images and snapshots with their sizes and ratios.
    Ls(repo_cmd::ListArgs),
    /// Check the repository; name every image and offset a problem affects.
    Verify(repo_cmd::VerifyArgs),
    /// Remove a snapshot, or every snapshot of an image.
    Rm(repo_cmd::RmArgs),
    /// Reclaim chunks no snapshot uses; repack half-empty packs.
    Gc(repo_cmd::GcArgs),
    /// Repository totals: sizes, ratios, index memory per chunk, targets.
    Stats(repo_cmd::StatsArgs),
    /// Export repository images, files and devices over NBD.
    Serve(serve::ServeArgs),
    /// Status, drain or detach of a write-back cache (of a running server: --control).
    Cache(cache_cmd::CacheArgs),
}

/// Options shared by pack and unpack.
#[derive(Args, Debug, Clone)]
pub(crate) struct CommonArgs {
    /// Worker threads (default: number of cores; 1 = exactly one thread).
    #[arg(short = 'T', long = "threads")]
    pub threads: Option<usize>,
    /// Keep input files (default: remove them after success, like gzip).
    #[arg(short = 'k', long = "keep")]
    pub keep: bool,
    /// Overwrite existing output files; write compressed data to a terminal.
    #[arg(short = 'f', long = "force")]
    pub force: bool,
    /// Write to standard output, keep input files.
    #[arg(short = 'c', long = "stdout")]
    pub stdout: bool,
    /// Write to this file (one input only).
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: Option<std::path::PathBuf>,
    /// Print a one-line summary per file (size, ratio, speed) on stderr.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// No progress bar.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// Print a JSON summary (on stdout, or on stderr when data goes to stdout).
    #[arg(long = "json")]
    pub json: bool,
    /// Files to process; none or "-" means standard input.
    #[arg(value_name = "FILES")]
    pub files: Vec<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct PackArgs {
    /// Output format: gzip, zstd, lz4, snappy, lzop, bzip2, xz.
    #[arg(short = 'F', long = "format", default_value = "gzip")]
    pub format: String,
    /// Compression level (format-specific range; -1..-19 work too).
    #[arg(short = 'l', long = "level", allow_negative_numbers = true)]
    pub level: Option<i32>,
    /// Input block size per worker task, e.g. 1M, 4M, 512K.
    #[arg(short = 'b', long = "block", value_parser = parse_size)]
    pub block: Option<usize>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Args, Debug)]
pub(crate) struct UnpackArgs {
    /// Accept zstd frames whose window is up to 2^N bytes (as `zstd -d
    /// --long=N`; default 27, 128 MiB, as zstd; at most 31). Such a frame
    /// without a stated size is decoded in a window of that size.
    #[arg(long = "long", value_name = "N", value_parser = clap::value_parser!(u32).range(10..=31))]
    pub long: Option<u32>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Parse `4M`, `512K`, `1G`, `65536`.
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: usize = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("unknown size suffix in {s:?} (use K, M or G)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: usize = num
        .trim_end_matches(['i', 'B'])
        .parse()
        .map_err(|_| format!("bad size {s:?}"))?;
    n.checked_mul(mult)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("bad size {s:?}"))
}

/// Turn pigz-style `-9` / `-19` into `--level=9` before clap sees them.
fn rewrite_level_flags(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut after_dashdash = false;
    let mut prev_takes_value = false;
    for a in args {
        let rewritten = match a.to_str() {
            Some("--") => {
                after_dashdash = true;
                None
            }
            Some(s)
                if !after_dashdash
                    && !prev_takes_value
                    && s.len() >= 2
                    && s.len() <= 3
                    && s.starts_with('-')
                    && s[1..].bytes().all(|b| b.is_ascii_digit()) =>
            {
                Some(format!("--level={}", &s[1..]).into())
            }
            _ => None,
        };
        prev_takes_value = matches!(
            a.to_str(),
            Some(
                "-l" | "--level"
                    | "-T"
                    | "--threads"
                    | "-b"
                    | "--block"
                    | "-o"
                    | "--output"
                    | "-F"
                    | "--format"
            )
        );
        out.push(rewritten.unwrap_or(a));
    }
    out
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(rewrite_level_flags(std::env::args_os())) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let result = match cli.command {
        Command::Pack(args) => pack::pack(&args),
        Command::Unpack(args) => pack::unpack(&args),
        Command::Init(args) => repo_cmd::init(&args),
        Command::Backup(args) => repo_cmd::backup(&args),
        Command::Restore(args) => repo_cmd::restore(&args),
        Command::Ls(args) => repo_cmd::ls(&args),
        Command::Verify(args) => repo_cmd::verify(&args),
        Command::Rm(args) => repo_cmd::rm(&args),
        Command::Gc(args) => repo_cmd::gc(&args),
        Command::Stats(args) => repo_cmd::stats(&args),
        Command::Serve(args) => serve::serve(&args),
        Command::Cache(args) => cache_cmd::cache(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// Help and version go out as clap prints them; a usage error becomes one
/// line, like every other error of cairn, with exit code 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return if e.use_stderr() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).skip_while(|l| l.is_empty());
    let mut msg = lines.next().unwrap_or("bad arguments").to_string();
    // "the following required arguments were not provided:" lists them below.
    if msg.ends_with(':') {
        let more: Vec<&str> = lines.take_while(|l| !l.is_empty()).collect();
        msg = format!("{} {}", msg, more.join(", "));
    }
    let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
    eprintln!("cairn: {msg} (see cairn --help)");
    ExitCode::from(2)
}

/// The error and its causes on one line.
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(
            parse_size("1GiB"),
            Err("unknown size suffix in \"1GiB\" (use K, M or G)".into())
        );
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn level_flags() {
        let args = ["cairn", "pack", "-9", "-T", "2", "-l", "-5", "--", "-3"]
            .iter()
            .map(std::ffi::OsString::from);
        let got = rewrite_level_flags(args);
        let got: Vec<&str> = got.iter().filter_map(|s| s.to_str()).collect();
        assert_eq!(
            got,
            [
                "cairn",
                "pack",
                "--level=9",
                "-T",
                "2",
                "-l",
                "-5",
                "--",
                "-3"
            ]
        );
    }
}
