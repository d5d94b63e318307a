//! `cairn diff` (the byte ranges where two snapshots differ) and `cairn
//! copy` (snapshots from another repository, without cutting them again).
//! The work is the store's (`cairn_store::diff`, `cairn_store::copy`);
//! this prints it.

use crate::key_cmd::FromPasswordArgs;
use crate::repo_cmd::{location, open_repo, print_json, threads, RepoArg};
use crate::report::Progress;
use anyhow::{bail, Context, Result};
use cairn_store::{CopyOptions, CopyProgress};
use cairn_store::{Repository, StoreError};
use clap::Args;
use indicatif::HumanBytes;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub(crate) struct DiffArgs {
    /// The first snapshot: NAME, NAME@SNAPSHOT or NAME@latest.
    #[arg(value_name = "A")]
    pub a: String,
    /// The second, of the same image or another one.
    #[arg(value_name = "B")]
    pub b: String,
    #[command(flatten)]
    pub repo: RepoArg,
    /// Print {"a", "b", "size_a", "size_b", "ranges": [{"offset",
    /// "len"}], "changed_bytes"} instead of lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct CopyArgs {
    /// Images to copy, each with all its snapshots (default: every image).
    #[arg(value_name = "NAME")]
    pub names: Vec<String>,
    /// The repository to copy from: a directory or s3://BUCKET/PREFIX.
    #[arg(long = "from", value_name = "SRC_REPO")]
    pub from: PathBuf,
    #[command(flatten)]
    pub from_password: FromPasswordArgs,
    // --repo: the repository to copy into.
    #[command(flatten)]
    pub repo: RepoArg,
    /// Worker threads hashing and compressing (default: number of cores).
    #[arg(short = 'T', long = "threads", value_parser = crate::parse_threads)]
    pub threads: Option<usize>,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A write to standard output that failed, as the store's error.
fn stdout_error(e: std::io::Error) -> StoreError {
    StoreError::Io {
        path: PathBuf::from("standard output"),
        what: "write",
        source: e,
    }
}

pub(crate) fn diff(a: &DiffArgs) -> Result<()> {
    let repo = open_repo(&a.repo)?;
    let _session = repo.session("cairn diff")?;
    let (na, sa) = repo.resolve(&a.a)?;
    let (nb, sb) = repo.resolve(&a.b)?;
    let ma = repo.read_manifest(&na, sa)?;
    let mb = repo.read_manifest(&nb, sb)?;
    let loaded = repo.load_index()?;
    loaded.check_read()?;
    for e in &loaded.damaged {
        errln!("cairn: warning: {e}");
    }
    let (la, lb) = (format!("{na}@{sa}"), format!("{nb}@{sb}"));
    // A File of its own, not std's stdout, which takes EBADF for success.
    let mut out = std::io::BufWriter::new(cairn_filepack::stdout_file()?);
    // Ranges are printed as they are found: a diff never holds them all.
    if a.json {
        write!(
            out,
            "{{\"a\":{},\"b\":{},\"size_a\":{},\"size_b\":{},\"ranges\":[",
            json!(la),
            json!(lb),
            ma.size,
            mb.size
        )?;
    }
    let mut first = true;
    let json_out = a.json;
    let report = cairn_store::diff(&repo, &loaded.index, &ma, &mb, &mut |offset, len| {
        let r = if json_out {
            let sep = if first { "" } else { "," };
            write!(out, "{sep}\n{{\"offset\":{offset},\"len\":{len}}}")
        } else {
            writeln!(out, "{offset} {len}")
        };
        first = false;
        r.map_err(stdout_error)
    })
    .with_context(|| format!("diff {la} {lb}"))?;
    if a.json {
        writeln!(
            out,
            "{}],\"changed_bytes\":{}}}",
            if first { "" } else { "\n" },
            report.changed_bytes
        )?;
    }
    out.flush()?;
    errln!(
        "cairn: {la} -> {lb}: {} range(s), {} byte(s) differ ({}); sizes {} and {} ({} compared by reading, {} read from packs)",
        report.ranges,
        report.changed_bytes,
        HumanBytes(report.changed_bytes),
        report.size_a,
        report.size_b,
        HumanBytes(report.compared_bytes),
        HumanBytes(report.stored_read),
    );
    Ok(())
}

/// The repository given as `--from` (of `copy`, and of `init
/// --copy-chunker-params`), opened with its own password.
pub(crate) fn open_from(from: &Path, password: &FromPasswordArgs) -> Result<Repository> {
    let from = location(from)?;
    Ok(match Repository::open_location_with(from, 0, password) {
        Err(StoreError::KeyNeeded(_)) => bail!(
            "--from {from}: the repository is encrypted; give its password \
             (--from-password-file, --from-password-command, CAIRN_FROM_PASSWORD_FILE \
             or CAIRN_FROM_PASSWORD)"
        ),
        r => r.with_context(|| format!("--from {from}"))?,
    })
}

pub(crate) fn copy(a: &CopyArgs) -> Result<()> {
    let from = location(&a.from)?;
    let src = open_from(&a.from, &a.from_password)?;
    let dest = open_repo(&a.repo)?;
    let same = match (src.local_root(), dest.local_root()) {
        (Some(x), Some(y)) => std::fs::canonicalize(x).ok() == std::fs::canonicalize(y).ok(),
        _ => src.location() == dest.location(),
    };
    if same {
        bail!("--from and --repo are the same repository ({from})");
    }
    // The same id elsewhere: a copy of the repository (`cp -a`), whose
    // snapshots are the destination's own (same origin, same numbers);
    // copy skips them and brings what only the copy holds.
    let clone = src.id() == dest.id();
    if clone && !a.quiet && !a.json {
        errln!(
            "cairn: --from {from} is a copy of this repository (id {}): \
             copying only the snapshots it alone holds",
            dest.id()
        );
    }
    let session = dest.session("cairn copy")?;
    let bar = Progress::new("copy", Some(0), !a.quiet && !a.json);
    let progress = |p: &CopyProgress| {
        bar.total(p.bytes_total);
        bar.read_to(p.bytes_done);
        bar.message(format!(
            "new {} stored {}",
            HumanBytes(p.new_raw),
            HumanBytes(p.new_stored)
        ));
    };
    let r = cairn_store::copy(
        &src,
        &dest,
        &session,
        &CopyOptions {
            names: a.names.clone(),
            threads: threads(a.threads),
            group_size: cairn_store::DEFAULT_GROUP_SIZE,
            progress: Some(&progress),
        },
    );
    bar.finish();
    let r = r?;
    if a.json {
        print_json(&json!({
            "from": src.location(),
            "to": dest.location(),
            "snapshots_copied": r.copied.len(),
            "snapshots_skipped": r.skipped.len(),
            "same_repository_id": clone,
            "copied": r.copied.iter().map(|c| json!({
                "name": c.name, "from": c.from, "to": c.to, "size": c.size,
                "new_chunks": c.new_chunks, "new_raw_bytes": c.new_raw,
                "new_stored_bytes": c.new_stored,
            })).collect::<Vec<_>>(),
            "skipped": r.skipped.iter().map(|s| json!({
                "name": s.name, "from": s.from, "to": s.to,
            })).collect::<Vec<_>>(),
            "new_chunks": r.new_chunks,
            "new_raw_bytes": r.new_raw,
            "new_stored_bytes": r.new_stored,
            "seconds": r.seconds,
        }));
    } else if !a.quiet {
        for c in &r.copied {
            errln!(
                "cairn: copied {}@{} as {}@{}: {}, new {} stored as {}",
                c.name,
                c.from,
                c.name,
                c.to,
                HumanBytes(c.size),
                HumanBytes(c.new_raw),
                HumanBytes(c.new_stored)
            );
        }
        for s in &r.skipped {
            errln!(
                "cairn: skipped {}@{}: the destination has it as {}@{}",
                s.name,
                s.from,
                s.name,
                s.to
            );
        }
        errln!(
            "cairn: {} snapshot(s) copied, {} skipped; {} chunk(s) new, {} stored, in {:.2} s",
            r.copied.len(),
            r.skipped.len(),
            r.new_chunks,
            HumanBytes(r.new_stored),
            r.seconds
        );
    }
    Ok(())
}
