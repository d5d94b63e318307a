//! The repository commands: init, backup, restore, ls, verify, rm, gc,
//! stats. Each parses its arguments, opens what it needs, calls the store
//! and prints a table or `--json`.

use crate::key_cmd::{FromPasswordArgs, KdfArgs, PasswordArgs};
use crate::report::Progress;
use anyhow::{bail, Context, Result};
use cairn_codec::CodecSpec;
use cairn_filepack::PendingFile;
use cairn_store::{
    BackupProgress, ChunkerSpec, Destination, GcOptions, InitOptions, Repository, RestoreOptions,
    VerifyOptions,
};
use clap::Args;
use indicatif::HumanBytes;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// `--repo`, shared by every repository command.
#[derive(Args, Debug, Clone)]
pub(crate) struct RepoArg {
    /// The repository: a directory, or s3://BUCKET/PREFIX (endpoint and
    /// keys from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_REGION); or set CAIRN_REPO.
    #[arg(long = "repo", short = 'r', env = "CAIRN_REPO", value_name = "REPO")]
    pub repo: PathBuf,
    #[command(flatten)]
    pub password: PasswordArgs,
}

/// `--tag`, selecting snapshots by their tags (restic's rule).
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct TagFilter {
    /// Only snapshots with every tag of T (a,b: both a and b); repeated,
    /// snapshots matching any of them (--tag a --tag b: a or b).
    #[arg(long = "tag", value_name = "T[,T...]")]
    pub tag: Vec<String>,
}

impl TagFilter {
    /// The groups of tags: a snapshot matches if it has all of one.
    pub(crate) fn groups(&self) -> Result<Vec<Vec<String>>> {
        tag_groups(&self.tag)
    }
}

/// Repeated `T[,T...]` values: one list of tags each.
fn tag_groups(values: &[String]) -> Result<Vec<Vec<String>>> {
    Ok(values
        .iter()
        .map(|v| cairn_store::parse_tags(&[v]))
        .collect::<Result<_, _>>()?)
}

#[derive(Args, Debug)]
pub(crate) struct InitArgs {
    /// Where the repository lives: a directory, or s3://BUCKET/PREFIX
    /// (or give it as --repo, or set CAIRN_REPO, as for the other verbs).
    #[arg(value_name = "REPO")]
    pub repo: Option<PathBuf>,
    /// The same as REPO.
    #[arg(
        long = "repo",
        short = 'r',
        value_name = "REPO",
        conflicts_with = "repo"
    )]
    pub repo_flag: Option<PathBuf>,
    /// A directory for packs, on its own disk ideally; repeat for more
    /// (default: REPO/data).
    #[arg(long = "target", value_name = "DIR")]
    pub targets: Vec<PathBuf>,
    /// Seal packs at this size (1M to 2G; default 32M; binary units: 32M = 32MiB).
    #[arg(long, value_parser = crate::parse_size)]
    pub pack_size: Option<usize>,
    /// Keep this much space allocated in REPO (file `reserve`), so that
    /// rm, forget and gc can still free space once backups fill the disk
    /// (they release it; gc refills it). 0: none. Not for s3://.
    #[arg(long, value_parser = crate::parse_size_or_zero, default_value = "16M")]
    pub reserve: usize,
    /// Encrypt packs, index and snapshots (aes-256-gcm, the default,
    /// with a password), or not (none).
    #[arg(long, default_value = "aes-256-gcm", value_parser = ["aes-256-gcm", "none"])]
    pub encryption: String,
    #[command(flatten)]
    pub password: PasswordArgs,
    #[command(flatten)]
    pub kdf: KdfArgs,
    /// Cut chunks where the repository --from cuts them (restic's
    /// --copy-chunker-params): backups into both, and snapshots copied
    /// from one to the other, then dedup. Without it an encrypted
    /// repository gets a chunker secret of its own.
    #[arg(long, requires = "from")]
    pub copy_chunker_params: bool,
    /// The repository whose chunker --copy-chunker-params copies: a
    /// directory or s3://BUCKET/PREFIX (its password from
    /// --from-password-file, --from-password-command, CAIRN_FROM_*).
    #[arg(
        long = "from",
        value_name = "SRC_REPO",
        requires = "copy_chunker_params"
    )]
    pub from: Option<PathBuf>,
    #[command(flatten)]
    pub from_password: FromPasswordArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct BackupArgs {
    /// A file, a block device, or - for standard input.
    #[arg(value_name = "SRC")]
    pub source: PathBuf,
    #[command(flatten)]
    pub repo: RepoArg,
    /// Image name; each backup adds a snapshot of it.
    #[arg(long, short = 'n')]
    pub name: String,
    /// Codec for new chunks: none, lz4, snappy, lzo, zstd, deflate, bzip2,
    /// xz, with an optional :LEVEL.
    #[arg(long = "codec", short = 'c', default_value = "zstd:3")]
    pub codec: String,
    /// cdc[:MIN,AVG,MAX] | cdc:AVG | fixed[:SIZE] (sizes take K and M).
    #[arg(long, default_value_t = cairn_store::DEFAULT_CHUNKER.to_string())]
    pub chunker: String,
    /// Worker threads hashing and compressing (default: number of cores).
    #[arg(short = 'T', long = "threads", value_parser = crate::parse_threads)]
    pub threads: Option<usize>,
    /// Compress new chunks together in groups of about this size (up to
    /// 8M and a quarter of the pack size; 0: each chunk alone, for the
    /// fastest random reads).
    #[arg(long, value_parser = parse_group, default_value = "2M")]
    pub group: usize,
    /// Read the source with O_DIRECT (bypass the page cache), with reads
    /// queued ahead (io_uring where the kernel has it).
    #[arg(long)]
    pub direct: bool,
    /// With --direct: reads queued ahead of the chunker (1-256). By
    /// default as many as keep 256M in flight (32 of 8M), what a fast disk
    /// needed to stream at full speed (docs/benchmarks.md); fewer use
    /// less memory.
    #[arg(long, requires = "direct", value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub read_depth: Option<u16>,
    /// With --direct: bytes of each read (a multiple of 4K, up to 64M).
    /// A block at least a batch long (8M, or twice the chunker's largest
    /// chunk if that is more) is cut where it was read, and is then a
    /// batch (so the workers hold that much each); smaller blocks are
    /// copied out into 8M batches.
    #[arg(long, requires = "direct", value_name = "SIZE", default_value = "8M",
          value_parser = parse_read_block)]
    pub read_block: usize,
    /// Label the snapshot with TAG (repeat, or a,b, for several); `ls
    /// --tag` and `forget --tag` select by them.
    #[arg(long = "tag", value_name = "TAG")]
    pub tags: Vec<String>,
    /// The snapshot's time instead of now: 2026-11-25T12:00:00Z,
    /// "2026-11-25 12:00:00" (UTC), 2026-11-25 or @UNIXSECONDS (imports;
    /// what retention sorts by).
    #[arg(long = "time", value_name = "TIME")]
    pub time: Option<String>,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct RestoreArgs {
    /// NAME, NAME@SNAPSHOT or NAME@latest.
    #[arg(value_name = "NAME[@SNAPSHOT]")]
    pub image: String,
    /// A file, a block device, or - for standard output.
    #[arg(value_name = "DEST")]
    pub dest: PathBuf,
    #[command(flatten)]
    pub repo: RepoArg,
    /// Worker threads reading and decompressing (default: number of cores).
    #[arg(short = 'T', long = "threads", value_parser = crate::parse_threads)]
    pub threads: Option<usize>,
    /// Overwrite an existing file or a block device (not one in use);
    /// write to a terminal.
    #[arg(short = 'f', long)]
    pub force: bool,
    /// Where a chunk is damaged or missing, write zeros and list the
    /// ranges instead of failing.
    #[arg(long)]
    pub zero_damaged: bool,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Print the result as JSON (on stderr when the image goes to stdout).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub repo: RepoArg,
    /// Only this image.
    #[arg(value_name = "NAME")]
    pub name: Option<String>,
    #[command(flatten)]
    pub tags: TagFilter,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct VerifyArgs {
    #[command(flatten)]
    pub repo: RepoArg,
    /// Read every stored chunk, check and decode it.
    #[arg(long)]
    pub read_data: bool,
    /// Read and check only some packs, as restic's check: N/M (part N of
    /// M, by pack id: runs of 1/M..M/M read every pack once), P% (that
    /// share of the packs, at random), or a size (500M, 2G: packs at
    /// random up to it). Implies --read-data.
    #[arg(long, value_name = "SUBSET", value_parser = parse_subset)]
    pub read_data_subset: Option<cairn_store::DataSubset>,
    /// Threads reading packs (default: number of cores).
    #[arg(short = 'T', long = "threads", value_parser = crate::parse_threads)]
    pub threads: Option<usize>,
    /// Forget, on this machine, the snapshots it saw that are gone with no
    /// removal record (`vanished-snapshot` problems: lost, deleted by
    /// hand, or the repository rolled back), once you know they cannot be
    /// got back: they are named, no longer reported, and gc runs again.
    #[arg(long)]
    pub accept_vanished: bool,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct RepairArgs {
    #[command(flatten)]
    pub repo: RepoArg,
    /// Only check and say what would be dropped.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Threads reading packs (default: number of cores).
    #[arg(short = 'T', long = "threads", value_parser = crate::parse_threads)]
    pub threads: Option<usize>,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct RmArgs {
    /// NAME@SNAPSHOT removes one snapshot; NAME removes an image's only
    /// snapshot, or all of them with --all.
    #[arg(value_name = "NAME[@SNAPSHOT]")]
    pub image: String,
    #[command(flatten)]
    pub repo: RepoArg,
    /// Remove every snapshot of NAME.
    #[arg(long)]
    pub all: bool,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct TagArgs {
    /// Snapshots: NAME@SNAPSHOT, NAME@latest, or NAME (its latest; every
    /// snapshot of it with --all).
    #[arg(value_name = "NAME[@SNAPSHOT]", required = true)]
    pub snapshots: Vec<String>,
    #[command(flatten)]
    pub repo: RepoArg,
    /// Add the tags T (a,b or repeated).
    #[arg(long, value_name = "T[,T...]")]
    pub add: Vec<String>,
    /// Remove the tags T.
    #[arg(long, value_name = "T[,T...]")]
    pub remove: Vec<String>,
    /// Replace the tags with T (`--set ''`: no tags).
    #[arg(long, value_name = "T[,T...]", conflicts_with_all = ["add", "remove"])]
    pub set: Option<Vec<String>>,
    /// Every snapshot of each NAME given without @.
    #[arg(long)]
    pub all: bool,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ForgetArgs {
    /// Images to apply the policy to (default: every image); each image's
    /// snapshots are a group of their own.
    #[arg(value_name = "NAME")]
    pub images: Vec<String>,
    #[command(flatten)]
    pub repo: RepoArg,
    /// Keep the N newest snapshots (`unlimited` or -1: all, as restic
    /// 0.16 takes it; so for the rules below).
    #[arg(long, value_name = "N", value_parser = parse_keep_count, allow_negative_numbers = true)]
    pub keep_last: Option<u32>,
    /// Keep the newest snapshot of each of the N newest hours that have one.
    #[arg(long, value_name = "N", value_parser = parse_keep_count, allow_negative_numbers = true)]
    pub keep_hourly: Option<u32>,
    /// ... of each of the N newest days (UTC).
    #[arg(long, value_name = "N", value_parser = parse_keep_count, allow_negative_numbers = true)]
    pub keep_daily: Option<u32>,
    /// ... of each of the N newest ISO weeks.
    #[arg(long, value_name = "N", value_parser = parse_keep_count, allow_negative_numbers = true)]
    pub keep_weekly: Option<u32>,
    /// ... of each of the N newest months.
    #[arg(long, value_name = "N", value_parser = parse_keep_count, allow_negative_numbers = true)]
    pub keep_monthly: Option<u32>,
    /// ... of each of the N newest years.
    #[arg(long, value_name = "N", value_parser = parse_keep_count, allow_negative_numbers = true)]
    pub keep_yearly: Option<u32>,
    /// Keep every snapshot less than DURATION older than the image's
    /// newest (1y6m, 14d, 36h; counted back on the calendar, as restic).
    #[arg(long, value_name = "DURATION")]
    pub keep_within: Option<String>,
    /// Keep the newest snapshot of each hour among those --keep-within
    /// DURATION would keep.
    #[arg(long, value_name = "DURATION")]
    pub keep_within_hourly: Option<String>,
    /// ... of each day (UTC).
    #[arg(long, value_name = "DURATION")]
    pub keep_within_daily: Option<String>,
    /// ... of each ISO week.
    #[arg(long, value_name = "DURATION")]
    pub keep_within_weekly: Option<String>,
    /// ... of each month.
    #[arg(long, value_name = "DURATION")]
    pub keep_within_monthly: Option<String>,
    /// ... of each year.
    #[arg(long, value_name = "DURATION")]
    pub keep_within_yearly: Option<String>,
    /// Keep every snapshot that has all the tags of T (a,b: both);
    /// repeated, any of them (`cairn tag` sets tags after a backup).
    #[arg(long = "keep-tag", value_name = "T[,T...]")]
    pub keep_tag: Vec<String>,
    #[command(flatten)]
    pub tags: TagFilter,
    /// Say what would be forgotten, change nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Then reclaim the space (cairn gc).
    #[arg(long)]
    pub prune: bool,
    /// No progress for --prune's gc.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct GcArgs {
    #[command(flatten)]
    pub repo: RepoArg,
    /// Repack packs whose live data is below this fraction of their size
    /// (a record's live data: its share of live chunks). Records of a
    /// repacked pack that hold dead chunks are compressed again without
    /// them, with the codec and level the newest snapshot used.
    #[arg(long, default_value_t = 0.5)]
    pub repack_below: f64,
    /// No progress (the step gc is at, on a terminal's stderr).
    #[arg(short, long)]
    pub quiet: bool,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct StatsArgs {
    #[command(flatten)]
    pub repo: RepoArg,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct UnlockArgs {
    #[command(flatten)]
    pub repo: RepoArg,
    /// Also remove sessions and locks that look live (a bucket's lease
    /// left by a process killed on another machine, within its 15
    /// minutes).
    #[arg(long)]
    pub remove_all: bool,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_read_block(s: &str) -> Result<usize, String> {
    let n = crate::parse_size(s)?;
    let align = cairn_blockdev::DIRECT_ALIGN;
    if n == 0 || n % align != 0 || n > 64 << 20 {
        return Err(format!(
            "{s}: must be a multiple of {align} bytes, up to 64M"
        ));
    }
    Ok(n)
}

fn parse_group(s: &str) -> Result<usize, String> {
    if s.trim() == "0" {
        Ok(0)
    } else {
        crate::parse_size(s)
    }
}

pub(crate) fn threads(t: Option<usize>) -> usize {
    t.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

/// Open the repository `--repo` names, with its password if it is
/// encrypted (every repository command, and `cairn mount`, opens it here).
pub(crate) fn open_repo(r: &RepoArg) -> Result<Repository> {
    Ok(Repository::open_location_with(
        location(&r.repo)?,
        0,
        &r.password,
    )?)
}

/// [`open_repo`] without the local cache of a remote repository, for the
/// commands that judge what the store holds (`verify`, `repair`).
pub(crate) fn open_repo_uncached(r: &RepoArg) -> Result<Repository> {
    Ok(Repository::open_location_uncached(
        location(&r.repo)?,
        &r.password,
    )?)
}

/// A repository's location as given: a directory or `s3://BUCKET/PREFIX`.
pub(crate) fn location(p: &Path) -> Result<&str> {
    p.to_str()
        .ok_or_else(|| anyhow::anyhow!("{}: a repository path must be UTF-8", p.display()))
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// A ratio for a table: "-" when there is nothing to divide by.
fn ratio_text(a: u64, b: u64) -> String {
    if b == 0 {
        "-".to_string()
    } else {
        format!("{:.2}x", a as f64 / b as f64)
    }
}

/// A ratio for JSON: null when there is nothing to divide by.
fn ratio_json(a: u64, b: u64) -> serde_json::Value {
    if b == 0 {
        serde_json::Value::Null
    } else {
        json!(a as f64 / b as f64)
    }
}

pub(crate) fn print_json(v: &serde_json::Value) {
    outln!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

pub(crate) fn init(a: &InitArgs) -> Result<()> {
    // CAIRN_REPO last: a command-line REPO is never refused for it.
    let from_env = std::env::var_os("CAIRN_REPO")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let Some(repo) = a
        .repo
        .as_ref()
        .or(a.repo_flag.as_ref())
        .or(from_env.as_ref())
    else {
        bail!("no repository given: cairn init REPO (or --repo REPO, or CAIRN_REPO)");
    };
    // Refused places are refused before a password is asked for.
    Repository::check_init_location(location(repo)?)?;
    if a.encryption == "none"
        && (a.password.password_file.is_some() || a.password.password_command.is_some())
    {
        bail!("--encryption none takes no password");
    }
    // The source first: a wrong password there wastes no new one.
    let chunker = match &a.from {
        Some(from) => {
            let params = crate::diff_copy::open_from(from, &a.from_password)?.chunker_params();
            Repository::check_chunker_copy(&params, a.encryption != "none")
                .with_context(|| format!("--from {}", from.display()))?;
            Some(params)
        }
        None => None,
    };
    let encryption = match a.encryption.as_str() {
        "none" => None,
        _ => Some((a.password.new_password()?, a.kdf.params())),
    };
    let repo = Repository::init_location_with(
        location(repo)?,
        &InitOptions {
            targets: a.targets.clone(),
            pack_size: a.pack_size.map(|s| s as u64),
            encryption,
            reserve: a.reserve as u64,
            chunker,
        },
    )?;
    if let (Some(from), Some(_), false) = (&a.from, repo.encryption(), repo.chunker_keyed()) {
        errln!(
            "cairn: warning: --from {} cuts chunks with the public table, and so does this \
             encrypted repository: where its chunks are cut can be computed from a file \
             (docs/format/encryption.md)",
            from.display()
        );
    }
    if a.json {
        print_json(&json!({
            "repository": repo.location(),
            "id": repo.id().to_string(),
            "targets": repo.target_locations(),
            "encryption": repo.encryption().unwrap_or("none"),
            "chunker_table": repo.chunker_table(),
        }));
    } else {
        errln!(
            "cairn: created repository {} with {} target(s), {}",
            repo.location(),
            repo.target_count(),
            match repo.encryption() {
                Some(e) =>
                    format!("encrypted ({e}); keep its password safe: without it the data is lost"),
                None => "not encrypted".to_string(),
            }
        );
    }
    Ok(())
}

/// Open a backup source: the reader, its size when known, its label.
///
/// A regular file read without `--direct` is read by its data extents
/// (its holes are skipped, not read).
fn open_source(
    path: &Path,
    direct: Option<(usize, usize)>,
) -> Result<(Box<dyn cairn_store::SparseRead>, Option<u64>, String)> {
    if path.as_os_str() == "-" {
        if direct.is_some() {
            bail!("--direct needs a file or device, not standard input");
        }
        // Redirected from a regular file (`< disk.img`), stdin is read by
        // its data extents too.
        let (file, size) = cairn_filepack::Source::Stdin.open()?;
        let reader: Box<dyn cairn_store::SparseRead> = if size.is_some() {
            Box::new(cairn_store::SparseFile::new(file).context("standard input")?)
        } else {
            Box::new(file)
        };
        return Ok((reader, size, "-".into()));
    }
    let input = cairn_blockdev::open_input(path, direct).map_err(|e| {
        if e.raw_os_error() == Some(libc::EISDIR) {
            anyhow::anyhow!(
                "{}: is a directory (back up a stream: tar -cf - DIR | cairn backup - ...)",
                path.display()
            )
        } else if direct.is_some() {
            anyhow::Error::new(e).context(format!("{} (with O_DIRECT)", path.display()))
        } else {
            anyhow::Error::new(e).context(path.display().to_string())
        }
    })?;
    if let (Some((block, depth)), Some(engine)) = (direct, input.engine) {
        tracing::debug!(
            "{}: {depth} reads of {block} bytes queued ahead, by {}",
            path.display(),
            engine.name()
        );
    }
    let (reader, size) = (input.reader, input.size);
    Ok((reader, size, path.display().to_string()))
}

/// Bytes a `--direct` backup keeps in flight by default: fio's best
/// setting on this project's test disk kept 256 MiB (64 x 4M), and
/// `--read-depth` 8 / 16 / 32 of 8M reached 0.75x / 0.87x / 1.03x of it
/// (docs/benchmarks.md, "A deeper read queue").
const READ_AHEAD: usize = 256 << 20;

pub(crate) fn backup(a: &BackupArgs) -> Result<()> {
    let codec: CodecSpec = a.codec.parse()?;
    let chunker: ChunkerSpec = a.chunker.parse()?;
    let tags = cairn_store::parse_tags(&a.tags)?;
    let repo = open_repo(&a.repo)?;
    let depth = a
        .read_depth
        .map_or(READ_AHEAD / a.read_block, usize::from)
        .clamp(1, 256);
    let direct = a.direct.then_some((a.read_block, depth));
    let (mut source, size, label) = open_source(&a.source, direct)?;
    let named = a.source.as_os_str() != "-";
    // A regular file's size and time when the read began (see below).
    let stamp = |m: std::fs::Metadata| (m.len(), m.modified().ok());
    let began = named
        .then(|| std::fs::metadata(&a.source).ok())
        .flatten()
        .filter(|m| m.is_file())
        .map(stamp);
    if let (true, Some(o), Some(size)) = (named, crate::cache_cmd::file_owner(&a.source), size) {
        // Not what a write-back cache in front of it still holds.
        crate::cache_bind::check(&a.source, &o, size, None)?;
    }
    let lock = repo.session(&format!("cairn backup {}", a.name))?;
    let bar = Progress::new("backup", size, !a.quiet);
    let progress = |p: &BackupProgress| {
        bar.read_to(p.bytes_in);
        bar.message(format!(
            "new {} stored {} dedup {} zero {}",
            HumanBytes(p.new_raw),
            HumanBytes(p.new_stored),
            HumanBytes(p.dedup),
            HumanBytes(p.zero)
        ));
    };
    let time = a.time.as_deref().map(cairn_store::parse_time).transpose()?;
    let opts = cairn_store::BackupOptions {
        name: a.name.clone(),
        codec,
        chunker,
        threads: threads(a.threads),
        group_size: a.group,
        source: label,
        progress: Some(&progress),
        time,
        tags,
    };
    let r = cairn_store::backup(&repo, &lock, source.as_mut(), &opts);
    bar.finish();
    // A read error names the offset only: say what was read.
    let r = r.map_err(|e| match e {
        cairn_store::StoreError::Source { .. } => {
            anyhow::Error::new(e).context(format!("backup of {}", a.source.display()))
        }
        // The repository stays sound; say what frees space.
        e if e.is_no_space() => anyhow::Error::new(e).context(format!(
            "the disk of {} is full (the repository is sound; `cairn forget` or `cairn rm`, \
             then `cairn gc`, free space)",
            repo.location()
        )),
        e => e.into(),
    })?;
    let t = &r.totals;
    warn_writer_repairs(&r.quarantined, &r.lost_packs);
    // A file written to while it is read is stored as it was read, which
    // may be no state it ever was in (tar and borg warn of it too): a
    // regular file whose size or modification time moved meanwhile, a
    // device that read other than its size. (Not a file's size against
    // the bytes read: /proc and /sys files say 0 or 4096 bytes.)
    let changed = match began {
        Some(before) => {
            let now = std::fs::metadata(&a.source).ok().map(stamp);
            (now != Some(before)).then_some(before.0)
        }
        None => size.filter(|&s| named && s != t.bytes_in),
    };
    if let Some(s) = changed {
        errln!(
            "cairn: warning: {} changed during the backup ({s} bytes when it began, {} bytes \
             read): {}@{} holds what was read",
            a.source.display(),
            t.bytes_in,
            r.name,
            r.snapshot
        );
    }
    let mbs = t.bytes_in as f64 / 1e6 / r.seconds.max(1e-9);
    if a.json {
        print_json(&json!({
            "name": r.name,
            "snapshot": r.snapshot,
            "bytes_in": t.bytes_in,
            "chunks": t.chunks,
            "new_chunks": t.new_chunks,
            "bytes_new_raw": t.new_raw,
            "bytes_stored_new": t.new_stored,
            "bytes_dedup": t.dedup,
            "bytes_zero": t.zero,
            "bytes_skipped": t.skipped,
            "packs": r.packs,
            "salvaged_packs": r.salvaged.packs,
            "salvaged_chunks": r.salvaged.chunks,
            "seconds": r.seconds,
            "mb_per_s": mbs,
            "threads": opts.threads,
            "codec": codec.to_string(),
            "chunker": chunker.to_string(),
            "source_size_changed": changed.is_some(),
        }));
    } else if !a.quiet {
        if r.salvaged.packs > 0 {
            errln!(
                "cairn: reused {} chunk(s) from {} pack(s) of an interrupted run",
                r.salvaged.chunks,
                r.salvaged.packs
            );
        }
        errln!(
            "cairn: {}@{}: {} in {:.2} s ({:.0} MB/s): new {} stored as {}, dedup {}, zero {}",
            r.name,
            r.snapshot,
            HumanBytes(t.bytes_in),
            r.seconds,
            mbs,
            HumanBytes(t.new_raw),
            HumanBytes(t.new_stored),
            HumanBytes(t.dedup),
            HumanBytes(t.zero)
        );
    }
    Ok(())
}

/// What a writer repaired on its way in, said once on stderr.
fn warn_writer_repairs(quarantined: &[PathBuf], lost: &[String]) {
    for q in quarantined {
        errln!(
            "cairn: warning: damaged index file set aside as {} (its packs were indexed again from their records)",
            q.display()
        );
    }
    for l in lost {
        errln!("cairn: warning: {l}: its chunks are no longer used, and are stored again when backed up again (run `cairn verify` to see the snapshots that lost data)");
    }
}

/// Where a restore streams into `out`: a pipe is handed the decoded
/// groups by reference where that pays (huge pages), anything else is
/// written. `CAIRN_NO_SPLICE` in the environment writes to a pipe too (to
/// compare, or where a sandbox refuses `vmsplice`).
fn stream_destination(out: &mut std::fs::File) -> Destination<'_> {
    if std::env::var_os("CAIRN_NO_SPLICE").is_none() && cairn_blockdev::splice_pays(out) {
        Destination::Pipe(out)
    } else {
        Destination::Stream(out)
    }
}

pub(crate) fn restore(a: &RestoreArgs) -> Result<()> {
    let repo = open_repo(&a.repo)?;
    let _session = repo.session("cairn restore")?;
    let (name, snap) = repo.resolve(&a.image)?;
    let manifest = repo.read_manifest(&name, snap)?;
    let loaded = repo.load_index()?;
    loaded.check_read()?;
    for e in &loaded.damaged {
        errln!("cairn: warning: {e}");
    }
    let to_stdout = a.dest.as_os_str() == "-";
    let bar = Progress::new("restore", Some(manifest.size), !a.quiet);
    let progress = |done: u64| bar.read_to(done);
    let opts = RestoreOptions {
        threads: threads(a.threads),
        zero_damaged: a.zero_damaged,
        progress: Some(&progress),
    };
    let report = if to_stdout {
        let out = std::io::stdout();
        if out.is_terminal() && !a.force {
            bail!("image data not written to a terminal; use -f to force, or redirect");
        }
        // Not std's stdout, a LineWriter that looks for a newline in every
        // write (2 % of a restore's CPU).
        let mut raw = cairn_filepack::stdout_file()?;
        cairn_store::restore(
            &repo,
            &loaded.index,
            &manifest,
            stream_destination(&mut raw),
            &opts,
        )
    } else {
        let is_device = std::fs::metadata(&a.dest)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        if !is_device && cairn_filepack::is_special(&a.dest) {
            // A character device (/dev/null) or a FIFO: written in order,
            // in place; never replaced by a file.
            let mut out = cairn_filepack::open_special(&a.dest)?;
            cairn_store::restore(
                &repo,
                &loaded.index,
                &manifest,
                stream_destination(&mut out),
                &opts,
            )
        } else if is_device {
            // As an existing file: replaced only with -f. O_EXCL on a block
            // device fails (EBUSY) while it is mounted or held by another
            // program, as mkfs finds out.
            if !a.force {
                bail!(
                    "{} is a block device: restoring replaces what it holds; use -f to write it",
                    a.dest.display()
                );
            }
            let dev = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_EXCL)
                .open(&a.dest)
                .map_err(|e| match e.raw_os_error() {
                    Some(libc::EBUSY) => anyhow::anyhow!(
                        "{}: the device is in use (mounted, or held by another program); not written",
                        a.dest.display()
                    ),
                    _ => anyhow::Error::new(e).context(a.dest.display().to_string()),
                })?;
            let size = cairn_blockdev::device_size(&dev)
                .with_context(|| format!("{}: BLKGETSIZE64", a.dest.display()))?;
            if size < manifest.size {
                bail!(
                    "{}: device has {} bytes, the image needs {}",
                    a.dest.display(),
                    size,
                    manifest.size
                );
            }
            let r = cairn_store::restore(
                &repo,
                &loaded.index,
                &manifest,
                Destination::At {
                    file: &dev,
                    zeroed: false,
                },
                &opts,
            );
            if r.is_ok() {
                dev.sync_all()
                    .with_context(|| format!("fsync {}", a.dest.display()))?;
            }
            r
        } else {
            // A symlink to a file is written through, as cp and dd do (it
            // was replaced by the image, and /dev/stdout with it: found by
            // a black-box test); a directory is refused before anything
            // is read (it failed at the end, the image written and
            // thrown away).
            let dest = match std::fs::symlink_metadata(&a.dest) {
                Ok(m) if m.file_type().is_symlink() => {
                    std::fs::canonicalize(&a.dest).unwrap_or_else(|_| a.dest.clone())
                }
                _ => a.dest.clone(),
            };
            if dest.is_dir() {
                bail!(
                    "{} is a directory: restore writes the image to a file (name one inside it)",
                    a.dest.display()
                );
            }
            let hooks = crate::pack::EngineHooks::silent();
            let pending = PendingFile::create(&dest, a.force, &hooks)?;
            pending
                .file()
                .set_len(manifest.size)
                .with_context(|| dest.display().to_string())?;
            let r = cairn_store::restore(
                &repo,
                &loaded.index,
                &manifest,
                Destination::At {
                    file: pending.file(),
                    zeroed: true,
                },
                &opts,
            );
            if r.is_ok() {
                pending.commit_durable()?;
            }
            r
        }
    };
    bar.finish();
    // A write error names the offset only: say where it went.
    let r = report.map_err(|e| match e {
        cairn_store::StoreError::Dest { .. } => {
            anyhow::Error::new(e).context(format!("restore to {}", a.dest.display()))
        }
        e => e.into(),
    })?;
    for d in &r.damaged {
        errln!(
            "cairn: damaged: image offset {} length {} ({} chunk(s) from {}) written as zeros: {}",
            d.offset,
            d.len,
            d.chunks.len(),
            d.chunks.first().map(|c| c.to_string()).unwrap_or_default(),
            d.reason
        );
    }
    let mbs = r.size as f64 / 1e6 / r.seconds.max(1e-9);
    let summary = json!({
        "name": name,
        "snapshot": snap,
        "bytes": r.size,
        "bytes_read": r.stored_read,
        "seconds": r.seconds,
        "mb_per_s": mbs,
        "threads": opts.threads,
        "chunks_from_other_copies": r.recovered,
        "damaged": r.damaged.iter().map(|d| json!({
            "offset": d.offset, "length": d.len, "reason": d.reason,
            "chunks": d.chunks.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    if a.json {
        let text = serde_json::to_string_pretty(&summary).unwrap_or_default();
        if to_stdout {
            errln!("{text}");
        } else {
            outln!("{text}");
        }
    } else if !a.quiet {
        errln!(
            "cairn: {name}@{snap}: {} restored in {:.2} s ({mbs:.0} MB/s)",
            HumanBytes(r.size),
            r.seconds
        );
    }
    // (Each damaged record was named in a warning as it was met.)
    if r.recovered > 0 && !a.json {
        errln!(
            "cairn: warning: {} chunk(s) were read from another copy, theirs being damaged; \
             `cairn verify --read-data` names the damage, `cairn repair` has the index use the \
             sound copies",
            r.recovered
        );
    }
    if !r.damaged.is_empty() {
        bail!("{} damaged range(s) were written as zeros", r.damaged.len());
    }
    Ok(())
}

pub(crate) fn ls(a: &ListArgs) -> Result<()> {
    let groups = a.tags.groups()?;
    let repo = open_repo(&a.repo)?;
    let mut rows = Vec::new();
    let mut bad = Vec::new();
    let mut named = false;
    for item in cairn_store::list_snapshots(&repo)? {
        match item {
            Ok(s) if a.name.as_ref().is_none_or(|n| *n == s.name) => {
                named = true;
                if cairn_store::tags_match(&s.tags, &groups) {
                    rows.push(s)
                }
            }
            Ok(_) => {}
            Err(e) => bad.push(e),
        }
    }
    // A name no snapshot has is an error, as in restore and rm (an
    // unreadable snapshot might have been it: then the table says so).
    if let (Some(n), false, true) = (&a.name, named, bad.is_empty()) {
        bail!("no image named {n:?} in {}", repo.location());
    }
    if a.json {
        print_json(&json!({
            "snapshots": rows.iter().map(|s| json!({
                "name": s.name,
                "snapshot": s.snapshot,
                "created": s.created,
                "size": s.size,
                "source": s.source,
                "chunker": s.chunker,
                "codec": s.codec,
                "chunks": s.stats.chunks,
                "new_chunks": s.stats.new_chunks,
                "zero_bytes": s.stats.zero_bytes,
                "new_raw_bytes": s.stats.new_raw,
                "stored_bytes": s.stats.new_stored,
                "dedup_ratio": ratio_json(s.size - s.stats.zero_bytes.min(s.size), s.stats.new_raw),
                "compression_ratio": ratio_json(s.stats.new_raw, s.stats.new_stored),
                "seconds": s.stats.millis as f64 / 1000.0,
                "tags": s.tags,
                "group": s.group,
            })).collect::<Vec<_>>(),
            "unreadable": bad,
        }));
    } else {
        outln!(
            "{:<24} {:>5} {:>20} {:>11} {:>11} {:>11} {:>7} {:>7} {:>6}  TAGS",
            "IMAGE",
            "SNAP",
            "CREATED (UTC)",
            "SIZE",
            "ZERO",
            "STORED",
            "DEDUP",
            "COMPR",
            "GROUP"
        );
        for s in &rows {
            outln!(
                "{:<24} {:>5} {:>20} {:>11} {:>11} {:>11} {:>7} {:>7} {:>6}  {}",
                s.name,
                s.snapshot,
                utc(s.created),
                HumanBytes(s.size).to_string(),
                HumanBytes(s.stats.zero_bytes).to_string(),
                HumanBytes(s.stats.new_stored).to_string(),
                ratio_text(s.size - s.stats.zero_bytes.min(s.size), s.stats.new_raw),
                ratio_text(s.stats.new_raw, s.stats.new_stored),
                group_text(s.group),
                s.tags.join(",")
            );
        }
        for e in &bad {
            errln!("cairn: unreadable snapshot: {e}");
        }
    }
    if !bad.is_empty() {
        bail!(
            "{} snapshot(s) could not be read; run `cairn verify`",
            bad.len()
        );
    }
    Ok(())
}

/// `2026-11-22 08:00:00` from Unix seconds (UTC), without a date crate.
fn utc(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A `--keep-*` count: N, or `unlimited` (`-1`), as restic 0.16 and
/// later take it, which keeps every period (a count no repository
/// reaches).
fn parse_keep_count(s: &str) -> Result<u32, String> {
    match s {
        "unlimited" | "-1" => Ok(u32::MAX),
        _ => s
            .parse::<u32>()
            .map_err(|_| format!("{s:?} is not a count: give N (0 or more), or unlimited (-1)")),
    }
}

/// `--read-data-subset`: `N/M`, `P%` or a size.
fn parse_subset(s: &str) -> Result<cairn_store::DataSubset, String> {
    use cairn_store::DataSubset;
    if let Some((n, m)) = s.split_once('/') {
        let (n, of) = (n.trim().parse::<u32>(), m.trim().parse::<u32>());
        return match (n, of) {
            (Ok(n), Ok(of)) if n >= 1 && n <= of => Ok(DataSubset::Part { n, of }),
            _ => Err(format!(
                "{s:?}: N/M takes whole numbers with 1 <= N <= M, as 2/5"
            )),
        };
    }
    if let Some(p) = s.strip_suffix('%') {
        return match p.trim().parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => Ok(DataSubset::Fraction(p / 100.0)),
            _ => Err(format!(
                "{s:?}: P% takes a number over 0 and at most 100, as 10%"
            )),
        };
    }
    match crate::parse_size(s) {
        Ok(n) if n > 0 => Ok(DataSubset::Bytes(n as u64)),
        _ => Err(format!(
            "{s:?}: give N/M (a part, as 2/5), P% (a share, as 10%) or a size (as 500M)"
        )),
    }
}

pub(crate) fn verify(a: &VerifyArgs) -> Result<()> {
    let repo = open_repo_uncached(&a.repo)?;
    let accepted = if a.accept_vanished {
        repo.accept_vanished()?
    } else {
        Vec::new()
    };
    let accepted: Vec<String> = accepted.iter().map(|(n, s)| format!("{n}@{s}")).collect();
    if !accepted.is_empty() && !a.json {
        outln!(
            "forgotten as gone ({} snapshot(s) with no removal record): {}",
            accepted.len(),
            accepted.join(", ")
        );
    }
    let read_data = a.read_data || a.read_data_subset.is_some();
    let bar = Progress::new("verify", None, !a.quiet && read_data);
    let progress = |done: u64, _total: u64| bar.read_to(done);
    let r = cairn_store::verify(
        &repo,
        &VerifyOptions {
            read_data,
            subset: a.read_data_subset.unwrap_or_default(),
            threads: threads(a.threads),
            progress: Some(&progress),
        },
    );
    bar.finish();
    let r = r?;
    if a.json {
        print_json(&json!({
            "ok": r.problems.is_empty(),
            "verdict": verdict(&r),
            "unread_packs": r.unread_packs.len(),
            "images": r.images,
            "snapshots": r.snapshots,
            "chunks": r.chunks,
            "packs": r.packs,
            "bytes_read": r.bytes_read,
            "packs_read": r.packs_read,
            "unindexed_packs": r.unindexed_packs,
            "problems": problems_json(&r.problems),
            "accepted_vanished": accepted,
        }));
    } else {
        print_problems(&r.problems);
        if !r.unindexed_packs.is_empty() {
            outln!(
                "note: {} pack(s) no index file names (left by an interrupted run, or their index file was lost): the next backup, gc or repair run alone indexes them again from their records",
                r.unindexed_packs.len()
            );
        }
        outln!(
            "{}: {} image(s), {} snapshot(s), {} chunk(s) in {} pack(s){}",
            verdict(&r),
            r.images,
            r.snapshots,
            r.chunks,
            r.packs,
            if a.read_data_subset.is_some() {
                format!(
                    ", {} of them ({}) read and checked",
                    r.packs_read,
                    HumanBytes(r.bytes_read)
                )
            } else if read_data {
                format!(", {} read and checked", HumanBytes(r.bytes_read))
            } else {
                String::new()
            }
        );
    }
    if !r.problems.is_empty() {
        bail!("verify found {} problem(s)", r.problems.len());
    }
    Ok(())
}

/// Verify's problems as JSON.
fn problems_json(problems: &[cairn_store::Problem]) -> serde_json::Value {
    json!(problems
        .iter()
        .map(|p| json!({
            "kind": p.kind,
            "message": p.message,
            "chunk": p.chunk.map(|c| c.to_string()),
            "affected": p.affected.iter().map(|x| json!({
                "image": x.image, "snapshot": x.snapshot, "offset": x.offset,
            })).collect::<Vec<_>>(),
        }))
        .collect::<Vec<_>>())
}

/// Problems of one kind printed whole; the rest are counted (a lost
/// index file makes one problem per chunk it listed: thousands).
const PROBLEMS_SHOWN: usize = 20;

/// Verify's problems, a line each and the places they affect; past
/// [`PROBLEMS_SHOWN`] of a kind, a count, and then how many places each
/// snapshot has damaged (`--json` lists every problem).
fn print_problems(problems: &[cairn_store::Problem]) {
    let mut shown: BTreeMap<&str, usize> = BTreeMap::new();
    let mut hidden: BTreeMap<&str, usize> = BTreeMap::new();
    for p in problems {
        let n = shown.entry(p.kind).or_default();
        if *n == PROBLEMS_SHOWN {
            *hidden.entry(p.kind).or_default() += 1;
            continue;
        }
        *n += 1;
        outln!("{}: {}", p.kind, p.message);
        for x in p.affected.iter().take(20) {
            outln!(
                "    affects {}@{} at offset {}",
                x.image,
                x.snapshot,
                x.offset
            );
        }
        if p.affected.len() > 20 {
            outln!("    ... and {} more places", p.affected.len() - 20);
        }
    }
    if hidden.is_empty() {
        return;
    }
    for (kind, n) in &hidden {
        outln!("{kind}: ... and {n} more (`--json` lists every one)");
    }
    let mut places: BTreeMap<(&str, u64), usize> = BTreeMap::new();
    for x in problems.iter().flat_map(|p| &p.affected) {
        *places.entry((&x.image, x.snapshot)).or_default() += 1;
    }
    for ((image, snapshot), n) in places {
        outln!("{image}@{snapshot}: {n} place(s) affected in all");
    }
}

pub(crate) fn repair(a: &RepairArgs) -> Result<()> {
    let repo = open_repo_uncached(&a.repo)?;
    let lock = session_freeing(&repo, "cairn repair")?;
    let bar = Progress::new("repair", None, !a.quiet);
    let progress = |done: u64, _total: u64| bar.read_to(done);
    let r = cairn_store::repair(
        &repo,
        &lock,
        &cairn_store::RepairOptions {
            dry_run: a.dry_run,
            threads: threads(a.threads),
            progress: Some(&progress),
        },
    );
    bar.finish();
    let r = r?;
    // What the check found that repair does not mend (a damaged index
    // file or manifest, a key): still problems.
    let left: Vec<&cairn_store::Problem> = r
        .found
        .problems
        .iter()
        .filter(|p| {
            !matches!(
                p.kind,
                "damaged-chunk"
                    | "unread-chunk"
                    | "damaged-copy"
                    | "unread-copy"
                    | "pack"
                    | "missing-chunk"
                    | "pack-header"
                    | "pack-tail"
                    | "garbage"
                    | "index-entry"
            )
        })
        .collect();
    // Chunks no longer in the index (dropped by an earlier repair, or in
    // packs lost before): nothing to drop, a backup of the same data
    // stores them again.
    let missing = r
        .found
        .problems
        .iter()
        .filter(|p| p.kind == "missing-chunk")
        .count();
    let snapshots: Vec<String> = r.affected.iter().map(|(n, s)| format!("{n}@{s}")).collect();
    if a.json {
        print_json(&json!({
            "dry_run": a.dry_run,
            "dropped_entries": r.dropped,
            "entries_moved_to_sound_copies": r.switched,
            "rewritten_packs": r.rewritten,
            "corrected_entries": r.corrected,
            "trash_lists_removed": r.trash_removed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "affected_snapshots": snapshots,
            "found": problems_json(&r.found.problems),
            "bytes_read": r.found.bytes_read,
            "packs_removed": r.gc.as_ref().map_or(0, |g| g.packs_deleted + g.packs_repacked),
            "missing_chunks": missing,
            "other_problems": left.len(),
            "reindexed_packs": r.salvaged.as_ref().map_or(0, |s| s.packs),
            "reindexed_chunks": r.salvaged.as_ref().map_or(0, |s| s.chunks),
            "deferred": r.gc.as_ref().is_some_and(|g| g.deferred),
        }));
    } else {
        for p in &r.trash_removed {
            outln!(
                "repair: removed the damaged trash list {} (it named only objects to delete)",
                p.display()
            );
        }
        if let Some(s) = r.salvaged.as_ref().filter(|s| s.packs > 0) {
            outln!(
                "repair: indexed {} pack(s) again ({} chunks) that no index file named (a lost \
                 or damaged index file, or an interrupted run)",
                s.packs,
                s.chunks
            );
        }
        print_problems(&r.found.problems);
        let unnamed = r.found.unindexed_packs.len();
        if missing > 0 && a.dry_run && unnamed > 0 {
            outln!(
                "repair: {missing} chunk(s) snapshots use are not in the index, and {unnamed} \
                 pack(s) no index file names may hold them: repair (without -n) indexes those \
                 packs again first, then says what is still missing"
            );
        } else if missing > 0 {
            outln!(
                "repair: {missing} chunk(s) snapshots use are not stored (dropped as damaged, \
                 or lost with their pack): back up the same data again to store them, or \
                 forget the snapshots listed above"
            );
        }
        if r.rewritten > 0 {
            outln!(
                "repair: {} {} pack(s) whose header is damaged or that have bytes past their \
                 end (their sound records copied into new packs)",
                if a.dry_run {
                    "would rewrite"
                } else {
                    "rewrote"
                },
                r.rewritten
            );
        }
        if r.corrected > 0 {
            outln!(
                "repair: {} {} index entr{} whose record length was wrong (the records are \
                 sound, no chunk is lost)",
                if a.dry_run {
                    "would correct"
                } else {
                    "corrected"
                },
                r.corrected,
                if r.corrected == 1 { "y" } else { "ies" }
            );
        }
        if r.dropped == 0 {
            outln!(
                "repair: no damaged chunk found ({} read and checked)",
                HumanBytes(r.found.bytes_read)
            );
        } else {
            outln!(
                "repair: {} {} damaged chunk(s) from the index{}",
                if a.dry_run { "would drop" } else { "dropped" },
                r.dropped,
                r.gc.as_ref().map_or(String::new(), |g| format!(
                    ", {} damaged pack(s) removed (their sound records copied out first)",
                    g.packs_deleted + g.packs_repacked
                ))
            );
            if r.switched > 0 {
                outln!(
                    "repair: for {} of them the index {} another copy that is sound (the \
                     chunk was stored twice): no snapshot loses those",
                    r.switched,
                    if a.dry_run { "would use" } else { "uses" }
                );
            }
            if !snapshots.is_empty() {
                outln!(
                    "repair: {} snapshot(s) use them and cannot be restored whole: {}; back up \
                     the same data again to store those chunks anew (that heals them), or \
                     forget them",
                    snapshots.len(),
                    snapshots.join(", ")
                );
            }
        }
        if r.gc.as_ref().is_some_and(|g| g.deferred) {
            outln!(
                "repair: a command that started during the repair still runs: the old index \
                 files (which still name what was repaired) are deleted once it ends, by the \
                 next command that writes (the damaged records stay out)"
            );
        }
    }
    if !left.is_empty() {
        bail!(
            "{} problem(s) that repair does not mend are left (see above)",
            left.len()
        );
    }
    // -n is a check: damage found is a failure, as verify's.
    if a.dry_run && r.dropped > 0 {
        bail!("{} damaged chunk(s) would be dropped", r.dropped);
    }
    if a.dry_run && r.corrected > 0 {
        bail!(
            "{} index entr{} would be corrected",
            r.corrected,
            if r.corrected == 1 { "y" } else { "ies" }
        );
    }
    if a.dry_run && missing > 0 {
        bail!("{missing} chunk(s) snapshots use are not in the index");
    }
    if a.dry_run && r.rewritten > 0 {
        bail!(
            "{} pack(s) have a damaged header or bytes past their end",
            r.rewritten
        );
    }
    if a.dry_run && r.found.problems.iter().any(|p| p.kind == "garbage") {
        bail!("a trash list is damaged (repair without -n removes it, losing nothing)");
    }
    // The index is sound again, but snapshots that use what was dropped
    // or lost are not whole: a script's `repair && ...` must not take the
    // repository for healthy (verify fails the same way).
    if !snapshots.is_empty() || missing > 0 {
        bail!(
            "the repository is consistent again, but {} cannot be restored whole until the \
             same data is backed up again or {} forgotten",
            if snapshots.is_empty() {
                format!("snapshots using {missing} missing chunk(s)")
            } else {
                format!("{} snapshot(s)", snapshots.len())
            },
            if snapshots.len() == 1 {
                "it is"
            } else {
                "they are"
            }
        );
    }
    Ok(())
}

pub(crate) fn tag(a: &TagArgs) -> Result<()> {
    let tags = |v: &[String]| -> Result<Vec<String>> {
        let given: Vec<&String> = v.iter().filter(|t| !t.is_empty()).collect();
        Ok(cairn_store::parse_tags(&given)?)
    };
    let (add, remove) = (tags(&a.add)?, tags(&a.remove)?);
    let set = a.set.as_deref().map(tags).transpose()?;
    if set.is_none() && add.is_empty() && remove.is_empty() {
        bail!("give --add, --remove or --set, with a tag (an empty one is no tag)");
    }
    let repo = open_repo(&a.repo)?;
    let lock = repo.session("cairn tag")?;
    let mut targets: Vec<(String, u64)> = Vec::new();
    for spec in &a.snapshots {
        if a.all && !spec.contains('@') {
            cairn_store::validate_name(spec)?;
            let snaps = repo.snapshots(spec)?;
            if snaps.is_empty() {
                bail!("no image named {spec:?} in {}", repo.location());
            }
            targets.extend(snaps.into_iter().map(|n| (spec.clone(), n)));
        } else {
            targets.push(repo.resolve(spec)?);
        }
    }
    // Each snapshot once, in the order first named (`tag vm@1 vm@2 vm@1`).
    let mut seen = std::collections::HashSet::new();
    targets.retain(|t| seen.insert(t.clone()));
    let mut done = Vec::new();
    for (name, snap) in targets {
        let (before, after) = repo
            .retag(&lock, &name, snap, |t| {
                if let Some(set) = &set {
                    t.clone_from(set);
                }
                // restic's order: set, add, then remove.
                for x in &add {
                    if !t.contains(x) {
                        t.push(x.clone());
                    }
                }
                t.retain(|x| !remove.contains(x));
            })
            .with_context(|| format!("{name}@{snap}"))?;
        done.push((name, snap, before, after));
    }
    if a.json {
        print_json(&json!({
            "snapshots": done.iter().map(|(n, s, b, t)| json!({
                "name": n, "snapshot": s, "tags": t, "before": b, "changed": b != t,
            })).collect::<Vec<_>>(),
        }));
    } else {
        for (n, s, b, t) in &done {
            let list = |v: &[String]| {
                if v.is_empty() {
                    "(none)".to_string()
                } else {
                    v.join(",")
                }
            };
            if b == t {
                errln!("cairn: {n}@{s}: tags {} (unchanged)", list(t));
            } else {
                errln!("cairn: {n}@{s}: tags {} (were {})", list(t), list(b));
            }
        }
    }
    Ok(())
}

pub(crate) fn rm(a: &RmArgs) -> Result<()> {
    let repo = open_repo(&a.repo)?;
    let lock = session_freeing(&repo, "cairn rm")?;
    let removed: Vec<(String, u64)> = if a.image.contains('@') {
        vec![repo.resolve(&a.image)?]
    } else {
        // `#DIR`: how ls names an encrypted image none of whose manifests
        // can be read.
        if !a.image.starts_with(cairn_store::UNNAMED) {
            cairn_store::validate_name(&a.image)?;
        }
        let snaps = repo.snapshots(&a.image)?;
        if snaps.is_empty() {
            bail!("no image named {:?}", a.image);
        }
        if snaps.len() > 1 && !a.all {
            bail!(
                "{} has {} snapshots: name one ({}@{}), or remove them all with --all \
                 (or keep some with cairn forget)",
                a.image,
                snaps.len(),
                a.image,
                snaps[snaps.len() - 1]
            );
        }
        snaps.into_iter().map(|s| (a.image.clone(), s)).collect()
    };
    for (name, snap) in &removed {
        let released = repo.remove_snapshot_freeing(&lock, name, *snap)?;
        note_released(&repo, released);
    }
    if a.json {
        print_json(&json!({
            "removed": removed.iter().map(|(n, s)| json!({"name": n, "snapshot": s})).collect::<Vec<_>>(),
        }));
    } else {
        for (n, s) in &removed {
            errln!("cairn: removed {n}@{s} (run `cairn gc` to reclaim its space)");
        }
    }
    Ok(())
}

pub(crate) fn forget(a: &ForgetArgs) -> Result<()> {
    use cairn_store::{apply_retention as apply, parse_span, Dated, KeepPolicy};
    let span = |s: &Option<String>| s.as_deref().map(parse_span).transpose();
    let policy = KeepPolicy {
        last: a.keep_last,
        hourly: a.keep_hourly,
        daily: a.keep_daily,
        weekly: a.keep_weekly,
        monthly: a.keep_monthly,
        yearly: a.keep_yearly,
        within: span(&a.keep_within)?,
        within_hourly: span(&a.keep_within_hourly)?,
        within_daily: span(&a.keep_within_daily)?,
        within_weekly: span(&a.keep_within_weekly)?,
        within_monthly: span(&a.keep_within_monthly)?,
        within_yearly: span(&a.keep_within_yearly)?,
        tags: tag_groups(&a.keep_tag)?,
    };
    if policy.is_empty() {
        bail!("no --keep-* rule given: that would forget every snapshot (use cairn rm NAME --all for that)");
    }
    let groups = a.tags.groups()?;
    let repo = open_repo(&a.repo)?;
    let lock = if a.dry_run {
        None
    } else {
        Some(session_freeing(&repo, "cairn forget")?)
    };
    let all = repo.images()?;
    let names: Vec<String> = if a.images.is_empty() {
        all.iter().map(|(n, _)| n.clone()).collect()
    } else {
        for n in &a.images {
            if !all.iter().any(|(m, _)| m == n) {
                bail!("no image named {n:?} in {}", repo.location());
            }
        }
        // Each image once (`forget a a` judged and counted it twice).
        let mut seen = std::collections::HashSet::new();
        a.images
            .iter()
            .filter(|n| seen.insert(*n))
            .cloned()
            .collect()
    };
    let mut report = Vec::new();
    let mut unreadable = Vec::new();
    for name in &names {
        let mut dated = Vec::new();
        for snap in repo.snapshots(name)? {
            // Gone since it was listed: another forget or rm took it. One
            // that cannot be read is kept, out of the policy's count (its
            // time is unknown), and said; the others are still sorted.
            let m = match repo.read_manifest_if_present(name, snap) {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    unreadable.push(format!("{name}@{snap}: {e}"));
                    continue;
                }
            };
            // With --tag, the policy sees only the snapshots that match:
            // the others are neither kept by it nor forgotten.
            if !m.has_tags(&groups) {
                continue;
            }
            dated.push(Dated {
                snapshot: snap,
                created: m.created,
                tags: m.tags,
            });
        }
        for v in apply(&policy, &dated) {
            if !v.keep() {
                if let Some(lock) = &lock {
                    // Another forget run at once may have removed it first:
                    // forgotten either way.
                    match repo.remove_snapshot_freeing(lock, name, v.snapshot.snapshot) {
                        Err(cairn_store::StoreError::Io { source, .. })
                            if source.kind() == std::io::ErrorKind::NotFound => {}
                        r => note_released(&repo, r?),
                    }
                }
            }
            report.push((name.clone(), v));
        }
    }
    let forgotten = report.iter().filter(|(_, v)| !v.keep()).count();
    if a.json {
        print_json(&json!({
            "dry_run": a.dry_run,
            "snapshots": report.iter().map(|(n, v)| json!({
                "name": n,
                "snapshot": v.snapshot.snapshot,
                "time": v.snapshot.created,
                "keep": v.keep(),
                "reasons": v.reasons,
            })).collect::<Vec<_>>(),
            "forgotten": forgotten,
            "unreadable": unreadable,
        }));
    } else {
        for (n, v) in &report {
            let when = cairn_store::format_time(v.snapshot.created);
            if v.keep() {
                outln!(
                    "keep   {n}@{} {when} ({})",
                    v.snapshot.snapshot,
                    v.reasons.join(", ")
                );
            } else {
                outln!("forget {n}@{} {when}", v.snapshot.snapshot);
            }
        }
        errln!(
            "cairn: {} {forgotten} of {} snapshots",
            if a.dry_run { "would forget" } else { "forgot" },
            report.len()
        );
    }
    for u in &unreadable {
        errln!("cairn: unreadable snapshot kept: {u}");
    }
    drop(lock);
    if a.prune && !a.dry_run && forgotten > 0 {
        gc(&GcArgs {
            repo: a.repo.clone(),
            repack_below: 0.5,
            quiet: a.quiet || a.json,
            json: false,
        })?;
    }
    if !unreadable.is_empty() {
        bail!(
            "{} snapshot(s) could not be read and were kept; run `cairn verify`",
            unreadable.len()
        );
    }
    Ok(())
}

/// Say that the reserve was released for this command.
fn note_released(repo: &Repository, bytes: u64) {
    if bytes > 0 {
        errln!(
            "cairn: the disk of {} is full: released the repository's reserve ({}) so that \
             this command can free space (gc refills it)",
            repo.location(),
            HumanBytes(bytes)
        );
    }
}

/// A session for a command that frees space, registered on a full disk
/// by releasing the reserve.
fn session_freeing(repo: &Repository, what: &str) -> Result<cairn_store::Session> {
    let (session, released) = repo.session_freeing(what)?;
    note_released(repo, released);
    Ok(session)
}

/// Run `op` (gc's work: crash-safe, so safe to run again); if it fails
/// on a full disk, release the reserve and run it once more.
fn on_a_full_disk_release_the_reserve<T>(
    repo: &Repository,
    op: impl Fn() -> cairn_store::Result<T>,
) -> Result<T> {
    match op() {
        Err(e) if e.is_no_space() => {
            let released = repo.release_reserve().unwrap_or(0);
            if released == 0 {
                return Err(e.into());
            }
            note_released(repo, released);
            Ok(op()?)
        }
        r => Ok(r?),
    }
}

pub(crate) fn gc(a: &GcArgs) -> Result<()> {
    if !(0.0..=1.0).contains(&a.repack_below) {
        bail!("--repack-below must be between 0 and 1");
    }
    let repo = open_repo(&a.repo)?;
    let lock = session_freeing(&repo, "cairn gc")?;
    // On a nearly full disk the reserve goes first, so that gc's work does
    // not fail midway (a second run would report only what was left).
    note_released(&repo, repo.release_reserve_if_short()?);
    let bar = Progress::steps("gc", !a.quiet && !a.json);
    let step = |s: &str| bar.message(s.to_string());
    let r = on_a_full_disk_release_the_reserve(&repo, || {
        cairn_store::gc(
            &repo,
            &lock,
            &GcOptions {
                repack_below: a.repack_below,
                progress: Some(&step),
                ..GcOptions::default()
            },
        )
    });
    bar.finish();
    let r = r?;
    match repo.refill_reserve() {
        Ok(true) => {}
        Ok(false) => errln!(
            "cairn: warning: the disk of {} has no room yet to refill the repository's reserve; \
             free space (forget snapshots), then run gc again",
            repo.location()
        ),
        Err(e) => errln!("cairn: warning: the repository's reserve: {e}"),
    }
    warn_writer_repairs(&r.quarantined, &r.lost_packs);
    for d in &r.damaged {
        errln!("cairn: warning: {d} (its pack is kept as it is; `cairn repair` drops it)");
    }
    for m in &r.missing {
        errln!(
            "cairn: warning: snapshot {m} uses chunks that no pack holds: it cannot be \
             restored whole (`cairn verify` names them; back its source up again, or `cairn \
             forget` it)"
        );
    }
    if a.json {
        print_json(&json!({
            "damaged_records": r.damaged,
            "snapshots_missing_chunks": r.missing,
            "chunks_before": r.chunks_before,
            "chunks_after": r.chunks_after,
            "packs_deleted": r.packs_deleted,
            "packs_repacked": r.packs_repacked,
            "chunks_rewritten": r.chunks_rewritten,
            "packs_written": r.packs_written,
            "bytes_before": r.bytes_before,
            "bytes_after": r.bytes_after,
            "salvaged_packs": r.salvaged.packs,
            "deferred": r.deferred,
            "packs_kept": r.packs_kept,
            "earlier_packs_deleted": r.earlier_packs_deleted,
            "earlier_bytes_deleted": r.earlier_bytes_deleted,
            "temporaries_removed": r.temporaries_removed,
        }));
    } else {
        errln!(
            "cairn: gc: {} -> {} chunks, {} pack(s) {}, {} repacked into {}{}, {} -> {}{}{}",
            r.chunks_before,
            r.chunks_after,
            r.packs_deleted,
            if r.deferred { "to delete" } else { "deleted" },
            r.packs_repacked,
            r.packs_written,
            if r.chunks_rewritten > 0 {
                format!(
                    " ({} chunk(s) compressed again apart from dead ones)",
                    r.chunks_rewritten
                )
            } else {
                String::new()
            },
            HumanBytes(r.bytes_before),
            HumanBytes(r.bytes_after),
            if r.earlier_packs_deleted > 0 {
                format!(
                    " ({} pack(s), {}, that an earlier gc left deleted)",
                    r.earlier_packs_deleted,
                    HumanBytes(r.earlier_bytes_deleted)
                )
            } else {
                String::new()
            },
            if r.deferred {
                " (a backup or reader that began before is still running: the next writer deletes the packs)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// Resident memory of this process, from /proc/self/statm.
fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

pub(crate) fn stats(a: &StatsArgs) -> Result<()> {
    let repo = open_repo(&a.repo)?;
    let s = cairn_store::stats(&repo)?;
    let running: Vec<serde_json::Value> = repo
        .running()?
        .into_iter()
        .map(|i| json!({"what": i.what, "pid": i.pid, "host": i.host, "started": i.started}))
        .collect();
    // Measured, not computed: load the index once more and see what the
    // process grew by.
    let before = rss_bytes();
    let loaded = repo.load_index()?;
    let after = rss_bytes();
    let grown = match (before, after) {
        (Some(b), Some(a)) => a.saturating_sub(b),
        _ => 0,
    };
    let per_chunk_rss = ratio(grown, loaded.index.len() as u64);
    drop(loaded);
    let per_chunk_heap = ratio(s.index_entry_bytes, s.chunks);
    for e in s.unreadable_snapshots.iter().chain(&s.damaged_index_files) {
        errln!("cairn: warning: {e}");
    }
    if a.json {
        print_json(&json!({
            "repository": repo.location(),
            "encryption": repo.encryption().unwrap_or("none"),
            "chunker_table": repo.chunker_table(),
            "images": s.images,
            "snapshots": s.snapshots,
            "logical_bytes": s.logical_bytes,
            "zero_bytes": s.zero_bytes,
            "chunks": s.chunks,
            "unique_raw_bytes": s.unique_raw_bytes,
            "pack_bytes": s.pack_bytes,
            "index_files": s.index_files,
            "unindexed_packs": s.unindexed_packs,
            "dedup_ratio": ratio_json(s.logical_bytes - s.zero_bytes.min(s.logical_bytes), s.unique_raw_bytes),
            "compression_ratio": ratio_json(s.unique_raw_bytes, s.live_stored_bytes),
            "live_stored_bytes": s.live_stored_bytes,
            "reclaimable_bytes": s.pack_bytes.saturating_sub(s.live_stored_bytes),
            "total_ratio": ratio_json(s.logical_bytes, s.pack_bytes),
            "index_heap_bytes_per_chunk": per_chunk_heap,
            "index_rss_bytes_per_chunk": per_chunk_rss,
            "targets": s.targets.iter().map(|t| json!({
                "path": t.path, "packs": t.packs, "bytes": t.bytes,
            })).collect::<Vec<_>>(),
            "unreadable_snapshots": s.unreadable_snapshots,
            "damaged_index_files": s.damaged_index_files,
            "sessions": running,
        }));
    } else {
        outln!("repository     {}", repo.location());
        outln!(
            "encryption     {}",
            repo.encryption().unwrap_or("none (not encrypted)")
        );
        outln!(
            "chunker table  {}",
            match (repo.chunker_keyed(), repo.encryption().is_some()) {
                (true, _) => "keyed (where chunks are cut is secret)",
                (false, true) => "public (made before 2026-12-02, or cutting as a plain or older repository: where chunks are cut can be computed from a file)",
                (false, false) => "public (not encrypted)",
            }
        );
        outln!("images         {} ({} snapshots)", s.images, s.snapshots);
        outln!(
            "logical        {} (of which zero {})",
            HumanBytes(s.logical_bytes),
            HumanBytes(s.zero_bytes)
        );
        outln!(
            "chunks         {} holding {}",
            s.chunks,
            HumanBytes(s.unique_raw_bytes)
        );
        outln!(
            "stored         {} in packs ({:.2}x overall); {} in use, the rest gc can reclaim",
            HumanBytes(s.pack_bytes),
            ratio(s.logical_bytes, s.pack_bytes),
            HumanBytes(s.live_stored_bytes)
        );
        outln!("index          {per_chunk_heap:.1} bytes/chunk in memory (heap), {per_chunk_rss:.1} measured (RSS growth)");
        for t in &s.targets {
            outln!(
                "target         {}  {} packs, {}",
                t.path.display(),
                t.packs,
                HumanBytes(t.bytes)
            );
        }
        if s.unindexed_packs > 0 {
            outln!(
                "unindexed      {} pack(s) from an interrupted run",
                s.unindexed_packs
            );
        }
        for r in &running {
            outln!(
                "running        {} (pid {} on {}, since {})",
                r["what"].as_str().unwrap_or(""),
                r["pid"],
                r["host"].as_str().unwrap_or(""),
                cairn_store::format_time(r["started"].as_i64().unwrap_or(0))
            );
        }
    }
    let damaged = s.unreadable_snapshots.len() + s.damaged_index_files.len();
    if damaged > 0 {
        bail!("{damaged} metadata file(s) could not be read; the totals leave them out (run `cairn verify`)");
    }
    Ok(())
}

pub(crate) fn unlock(a: &UnlockArgs) -> Result<()> {
    let repo = open_repo(&a.repo)?;
    let done = repo.unlock_holds(a.remove_all)?;
    if a.json {
        print_json(&json!({
            "repository": repo.location(),
            "removed": done.removed,
            "kept": done.kept,
        }));
    } else {
        let holder = |e: &cairn_store::HoldEntry| match &e.info {
            Some(i) => format!(
                "{} (pid {} on {}, since {})",
                i.what,
                i.pid,
                i.host,
                cairn_store::format_time(i.started)
            ),
            None => "(holder unreadable)".into(),
        };
        for e in &done.removed {
            let state = if e.live { "live" } else { "dead" };
            outln!("removed  {}  {} [{state}]", e.key, holder(e));
        }
        for e in &done.kept {
            outln!(
                "kept     {}  {} [{}]",
                e.key,
                holder(e),
                e.kept.as_deref().unwrap_or("")
            );
        }
        outln!("{} removed, {} kept", done.removed.len(), done.kept.len());
    }
    // With --remove-all, only what running processes lock is kept.
    if a.remove_all && !done.kept.is_empty() {
        bail!(
            "{} held by running processes were kept: stop them first",
            done.kept.len()
        );
    }
    Ok(())
}

/// A snapshot's group size as `ls` shows it: `2M`, `64K`, `chunk` (each
/// chunk alone), `-` (written before manifests recorded it).
fn group_text(group: Option<u32>) -> String {
    match group {
        None => "-".into(),
        Some(0) => "chunk".into(),
        Some(g) if g % (1 << 20) == 0 => format!("{}M", g >> 20),
        Some(g) if g % (1 << 10) == 0 => format!("{}K", g >> 10),
        Some(g) => g.to_string(),
    }
}

/// verify's verdict: `ok`, `DAMAGED`, or, where the only problems are
/// objects that could not be read (an I/O or network error: packs and
/// their chunks, removal records), which are not known to be damaged,
/// `NOT VERIFIED`.
fn verdict(r: &cairn_store::VerifyReport) -> String {
    let unread = |p: &cairn_store::Problem| match p.kind {
        "unread-chunk" | "unread-copy" | "unreadable-removal-record" => true,
        "pack" => r.unread_packs.contains(&p.message),
        _ => false,
    };
    if r.problems.is_empty() {
        "ok".into()
    } else if r.problems.iter().all(unread) {
        let records = r
            .problems
            .iter()
            .filter(|p| p.kind == "unreadable-removal-record")
            .count();
        let unread: Vec<String> = [
            (r.unread_packs.len(), "pack(s)"),
            (records, "removal record(s)"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        format!("NOT VERIFIED ({} could not be read)", unread.join(" and "))
    } else if r.unread_packs.is_empty() {
        "DAMAGED".into()
    } else {
        // (repair stops until every pack can be read: say so here.)
        format!(
            "DAMAGED, and {} pack(s) could not be read",
            r.unread_packs.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_counts_take_unlimited_as_restic_does() {
        assert_eq!(parse_keep_count("3"), Ok(3));
        assert_eq!(parse_keep_count("0"), Ok(0));
        assert_eq!(parse_keep_count("unlimited"), Ok(u32::MAX));
        assert_eq!(parse_keep_count("-1"), Ok(u32::MAX));
        for bad in ["-2", "x", "", "1.5"] {
            assert!(parse_keep_count(bad).is_err(), "{bad}");
        }
    }

    /// Packs that could not be read, alone, are no damage: NOT VERIFIED;
    /// with any other problem, DAMAGED.
    #[test]
    fn verify_verdicts() {
        let problem = |kind: &'static str, message: &str| cairn_store::Problem {
            kind,
            message: message.into(),
            chunk: None,
            affected: Vec::new(),
        };
        let mut r = cairn_store::VerifyReport::default();
        assert_eq!(verdict(&r), "ok");
        r.unread_packs = vec!["p: read: EIO".into()];
        r.problems = vec![
            problem("pack", "p: read: EIO"),
            problem("unread-chunk", "chunk c"),
            problem("unread-copy", "chunk d"),
        ];
        assert_eq!(verdict(&r), "NOT VERIFIED (1 pack(s) could not be read)");
        r.problems.push(problem("pack", "pack q is missing"));
        assert_eq!(verdict(&r), "DAMAGED, and 1 pack(s) could not be read");
        r.problems.pop();
        r.problems.push(problem("damaged-chunk", "chunk e"));
        assert_eq!(verdict(&r), "DAMAGED, and 1 pack(s) could not be read");
        r.unread_packs.clear();
        r.problems = vec![problem("damaged-chunk", "chunk e")];
        assert_eq!(verdict(&r), "DAMAGED");
        // A removal record that could not be read is no damage either.
        r.problems = vec![problem("unreadable-removal-record", "a@1")];
        assert_eq!(
            verdict(&r),
            "NOT VERIFIED (1 removal record(s) could not be read)"
        );
        r.unread_packs = vec!["p: read: EIO".into()];
        r.problems.push(problem("pack", "p: read: EIO"));
        assert_eq!(
            verdict(&r),
            "NOT VERIFIED (1 pack(s) and 1 removal record(s) could not be read)"
        );
        r.problems.push(problem("vanished-snapshot", "b@2"));
        assert_eq!(verdict(&r), "DAMAGED, and 1 pack(s) could not be read");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00");
    }
}
