//! The runs: every input planned (where its output goes, whether it is
//! removed), then packed or unpacked in turn on a reader thread, N workers
//! and an in-order writer.

use crate::files::{
    is_special, refuse_terminal_stdin, refuse_terminal_stdout, HoleWriter, PendingFile, Sink,
    Source,
};
use crate::naming::{format_of_name, missing_input, packed_name, unpacked_name};
use crate::{
    EmptyInput, Error, Hooks, Links, Options, OutputDir, PackOptions, Result, SpecialModes,
    UnpackMode, UnpackOptions, MAX_BLOCK, MAX_THREADS,
};
use cairn_blockdev::{is_zero, SparseFile, SparseRead};
use cairn_codec::format::gzip_range::read_range;
use cairn_codec::{
    BlockMeta, CodecError, ContentChecker, DecodeOptions, Format, GzipIndex, Input, Unit, UnitKind,
};
use cairn_pipeline::{Config, Fill, Slot};
use serde::Serialize;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Pack or unpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// Compress.
    Pack,
    /// Decompress (also test and list).
    Unpack,
}

impl Operation {
    /// `pack` or `unpack`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Pack => "pack",
            Operation::Unpack => "unpack",
        }
    }
}

/// What one input's pack or unpack did.
#[derive(Serialize, Debug, Clone)]
pub struct Summary {
    /// Pack or unpack.
    pub operation: Operation,
    /// The input's name.
    pub input: String,
    /// The output's name.
    pub output: String,
    /// The format written or read.
    pub format: String,
    /// The level, for a pack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<i32>,
    /// The block size, for a pack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<usize>,
    /// Threads: a pack's workers (at most one per block); for an unpack,
    /// the cores its decoding used (one for a single zstd frame or a gzip
    /// member inflated on one core).
    pub threads: usize,
    /// Bytes read.
    pub bytes_in: u64,
    /// Bytes written.
    pub bytes_out: u64,
    /// Compressed size over uncompressed size.
    pub ratio: f64,
    /// Wall time.
    pub seconds: f64,
    /// Uncompressed megabytes (10^6) per second.
    pub mb_per_s: f64,
    /// What went wrong without costing the output (gzip's warnings, which
    /// make its exit status 2): empty when nothing did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What `-l` says of a gzip input beyond its sizes (gzip's and pigz's
    /// `-lv` columns, the header their ratio leaves out); listings only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gzip: Option<GzipListing>,
    /// The members of an lzop file of parts (`lzop -c a b`), each a file
    /// of its own to lzop (`lzop -t` says "testing X OK" of each).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lzop_parts: Option<usize>,
}

/// A listed gzip input's first member header and its whole output's
/// CRC-32.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct GzipListing {
    /// Bytes of the first member's header (through FHCRC).
    pub header_bytes: u64,
    /// The name that header keeps (FNAME, as UTF-8 where it is not);
    /// none when it keeps none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its MTIME, seconds since the epoch (0: none).
    pub mtime: u32,
    /// Its comment (FCOMMENT, as UTF-8 where it is not); none when it
    /// keeps none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// CRC-32 of everything the input decodes to, when asked for
    /// ([`crate::UnpackOptions::list_crc`]): a one-member file's trailer
    /// CRC (gzip and pigz list the last member's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crc32: Option<u32>,
}

/// What a run did: a summary per input that succeeded, and the outcome.
#[derive(Debug)]
pub struct Run {
    /// One per input that succeeded, in order.
    pub summaries: Vec<Summary>,
    /// Whether any output went to standard output (a caller that prints
    /// reports puts them on stderr then).
    pub data_on_stdout: bool,
    /// `Ok`, the error of the one input, or [`Error::Failed`] naming every
    /// input of several that failed.
    pub outcome: Result<()>,
    /// Whether there were several inputs and every one was passed over
    /// ([`Hooks::passes_over`]): nothing was done, nothing failed.
    pub all_passed_over: bool,
}

/// The threads a run uses: 0 is one per core, as zstd's and xz's `-T0`.
fn threads(requested: usize) -> Result<usize> {
    match requested {
        n if n > MAX_THREADS => Err(Error::TooManyThreads(n)),
        0 => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        n => Ok(n),
    }
}

/// One input and where its output goes.
pub(crate) struct Plan {
    pub(crate) source: Source,
    pub(crate) dest: Dest,
    pub(crate) remove_input: bool,
    /// The output file was named with `-o`: a device or FIFO there is
    /// written in place (`-o /dev/null`). An output named from its input
    /// is always a new regular file: whatever is there (a symlink, a
    /// device) is refused without `-f` and replaced with it, never
    /// written through.
    pub(crate) named: bool,
    /// Make the output durable before the input goes (`--synchronous`).
    pub(crate) synchronous: bool,
    /// For [`Dest::Joined`]: the output, opened once by [`run_all`].
    pub(crate) joined: Option<Arc<std::fs::File>>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Dest {
    Stdout,
    File(PathBuf),
    /// The one output every input of the run is written into in turn
    /// (`-f -o OUT A B`, as zstd joins them): opened once for the run,
    /// each input's output written on at its end, no input removed.
    Joined(PathBuf),
    /// Decoded only to be checked (`-t`) or counted (`-l`).
    Nowhere,
}

/// Decide outputs for every input, gzip-style; `check_only` sends every
/// output nowhere and keeps the inputs. An input whose output cannot be
/// named is an error of its own (named by [`run_all`]), so the others run.
pub(crate) fn plan(
    opts: &Options,
    check_only: bool,
    name_output: impl Fn(&std::path::Path) -> Result<PathBuf>,
) -> Result<Vec<(String, Result<Plan>)>> {
    if let Some(suffix) = &opts.suffix {
        crate::naming::check_suffix(suffix)?;
    }
    // With -r, a directory's files whose output cannot be named are
    // skipped quietly, as gzip -r does (named on their own, they fail);
    // so are they by `gzip -rt` and `-rl` (files of no known suffix).
    // zstd -dr names them as failed inputs.
    let names_outputs = check_only || (opts.output.is_none() && !opts.stdout);
    let wanted = |p: &Path| !names_outputs || opts.walk_reports_unnamed || name_output(p).is_ok();
    // Outputs named from their inputs: a link is then left alone, as
    // when named (gzip -rc, -rt and -rl read through it).
    let outputs_named = !check_only && !opts.stdout && opts.output.is_none();
    let mut inputs: Vec<(String, Result<Source>)> = Vec::new();
    if opts.files.is_empty() {
        inputs.push((Source::Stdin.name(), Ok(Source::Stdin)));
    }
    for arg in &opts.files {
        let source = Source::from_arg(arg);
        match &source {
            Source::File(p) if opts.recursive && std::fs::metadata(p).is_ok_and(|m| m.is_dir()) => {
                // As gzip -r, a symbolic link to a directory is not
                // followed (without -f): it would leave the tree named.
                let link = std::fs::symlink_metadata(p).is_ok_and(|m| m.is_symlink());
                match link && !opts.force {
                    true => inputs.push((source.name(), Err(symlink_input(opts)))),
                    false => walk(p, &wanted, opts, outputs_named, &mut inputs),
                }
            }
            _ => inputs.push((source.name(), Ok(source))),
        }
    }
    // Several inputs into one output: their outputs are joined in it,
    // which keeps none of their names, so only when forced (as zstd) or
    // as lzop does it. Checked or listed, nothing is written (zstd -t
    // ignores -o).
    let joined = opts.output.is_some() && inputs.len() > 1 && !check_only;
    if joined && !opts.force && !opts.joins_unforced {
        return Err(Error::OneOutputManyInputs(inputs.len()));
    }
    // An input the joined output would replace (`-f -o a a b`) stops
    // the run: the output is renamed over it when all are done.
    if let (true, Some(out)) = (joined, &opts.output) {
        for (_, source) in &inputs {
            if let Ok(Source::File(src)) = source {
                if std::fs::metadata(src).is_ok_and(|m| m.is_file()) && same_file(src, out) {
                    return Err(Error::OutputIsInput(out.clone()));
                }
            }
        }
    }
    if opts.output.is_some() && opts.stdout {
        return Err(Error::OutputAndStdout);
    }
    Ok(inputs
        .into_iter()
        .map(|(name, source)| {
            let source = match source {
                Ok(source) => source,
                Err(e) => return (name, Err(e)),
            };
            let dest = match (&source, &opts.output) {
                // A link left alone whatever the output (zstd).
                (Source::File(p), _)
                    if leaves_link(opts, false)
                        && std::fs::symlink_metadata(p)
                            .is_ok_and(|m| m.file_type().is_symlink()) =>
                {
                    Err(symlink_input(opts))
                }
                _ if check_only => Ok((Dest::Nowhere, false)),
                (_, Some(out)) if out.as_os_str() == "-" => Ok((Dest::Stdout, false)),
                (_, Some(out)) if joined => Ok((Dest::Joined(out.clone()), false)),
                (Source::File(_), Some(out)) => Ok((Dest::File(out.clone()), !opts.keep)),
                (Source::Stdin, Some(out)) => Ok((Dest::File(out.clone()), false)),
                (Source::Stdin, None) => Ok((Dest::Stdout, false)),
                (Source::File(_), None) if opts.stdout => Ok((Dest::Stdout, false)),
                // A missing input is that, not a name without a suffix;
                // so is a symbolic link without -f (gzip, pigz and xz
                // look at it first, whatever it points to), a directory
                // or a special file (as gzip and xz say; and a FIFO is
                // never opened to look at its data).
                // (zstd names the output first: a missing input or a
                // directory is refused for its name where that has no
                // suffix to take off.)
                (Source::File(p), None)
                    if opts.name_before_input
                        && !matches!(std::fs::metadata(p), Ok(m) if !m.is_dir())
                        && name_output(p).is_err() =>
                {
                    name_output(p).map(|out| (Dest::File(out), false))
                }
                (Source::File(p), None) => match std::fs::symlink_metadata(p) {
                    Err(source) => Err(Error::Open {
                        path: p.clone(),
                        source,
                    }),
                    Ok(m) if m.file_type().is_symlink() && leaves_link(opts, true) => {
                        Err(symlink_input(opts))
                    }
                    Ok(_) if std::fs::metadata(p).is_ok_and(|m| m.is_dir()) => {
                        Err(Error::IsDirectory { path: p.clone() })
                    }
                    Ok(_) if is_special(p) => Err(Error::NotRegular),
                    Ok(_) => name_output(p)
                        .and_then(|out| placed(opts.output_dir.as_ref(), out))
                        .map(|out| (Dest::File(out), !opts.keep)),
                },
            };
            // A device, a FIFO or a socket is read as a stream, and never
            // removed: to standard output or to a file named with -o
            // (`-o disk.gz /dev/sdb`); an output named from it was refused
            // above, as gzip does.
            let special = match &source {
                Source::File(src) => is_special(src),
                Source::Stdin => false,
            };
            let dest = dest.and_then(
                |(dest, remove)| match (&source, &dest, remove && !special) {
                    // Writing the output would destroy the input (`-f -o x x`).
                    (Source::File(src), Dest::File(out) | Dest::Joined(out), _)
                        if std::fs::metadata(src).is_ok_and(|m| m.is_file())
                            && same_file(src, out) =>
                    {
                        Err(Error::OutputIsInput(out.clone()))
                    }
                    (Source::File(src), Dest::File(_), remove) if !opts.force => {
                        links_allow(opts, src, remove && !opts.allow_linked)
                            .map(|()| (dest, remove))
                    }
                    (Source::File(src), Dest::File(_), remove) => match std::fs::metadata(src) {
                        Ok(meta) => special_mode_allows(opts, &meta).map(|()| (dest, remove)),
                        Err(_) => Ok((dest, remove)),
                    },
                    (_, _, remove) => Ok((dest, remove)),
                },
            );
            let plan = dest.map(|(dest, remove_input)| Plan {
                source,
                dest,
                remove_input,
                named: opts.output.is_some(),
                synchronous: opts.synchronous,
                joined: None,
            });
            (name, plan)
        })
        .collect())
}

/// Whether a symbolic link input is left alone ([`Options::links`]),
/// where outputs are named from inputs if `outputs_named`.
fn leaves_link(opts: &Options, outputs_named: bool) -> bool {
    !opts.force
        && match opts.links {
            Links::WhereNamed => outputs_named,
            Links::Never => true,
            Links::Always => false,
        }
}

/// A symbolic link left alone ([`Options::symlink_warns`]).
fn symlink_input(opts: &Options) -> Error {
    Error::SymlinkInput {
        warning: opts.symlink_warns,
        read_by_stdout: opts.links == Links::WhereNamed,
    }
}

/// Where an output named from its input (`out`, beside it) goes under
/// `--output-dir-flat` or `--output-dir-mirror`: the directories it goes
/// into are made here.
fn placed(dir: Option<&OutputDir>, out: PathBuf) -> Result<PathBuf> {
    use std::path::Component;
    let (dir, under) = match dir {
        None => return Ok(out),
        Some(OutputDir::Flat(dir)) => match out.file_name() {
            Some(name) => (dir, PathBuf::from(name)),
            None => return Err(Error::NotAFileName { path: out }),
        },
        Some(OutputDir::Mirror(dir)) => {
            let mut under = PathBuf::new();
            for c in out.components() {
                match c {
                    Component::Normal(part) => under.push(part),
                    Component::ParentDir => return Err(Error::OutsideMirror { path: out }),
                    Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                }
            }
            (dir, under)
        }
    };
    let placed = dir.join(under);
    if let Some(parent) = placed.parent() {
        std::fs::create_dir_all(parent).map_err(|source| Error::CreateOutput {
            action: "make the directory",
            path: parent.to_path_buf(),
            source,
        })?;
    }
    Ok(placed)
}

/// As gzip and pigz, without `-f` an input that is a symbolic link is not
/// packed or unpacked into a file (`-c` reads through it); as gzip (not
/// pigz: [`Options::allow_linked`]), one with other hard links is not
/// removed once done (`-k` keeps it): the other names would still show
/// the old bytes; and one with a set-ID or sticky bit is left alone as
/// [`special_mode_allows`] says. (An input that cannot be examined fails
/// when it is opened.)
fn links_allow(opts: &Options, src: &Path, remove: bool) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(src) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() && opts.links != Links::Always {
        return Err(symlink_input(opts));
    }
    if remove && meta.is_file() && meta.nlink() > 1 {
        return Err(Error::OtherLinks(meta.nlink() - 1));
    }
    special_mode_allows(opts, &meta)
}

/// Whether `opts` lets an input of `meta` with set-user-ID, set-group-ID
/// or the sticky bit be packed or unpacked into a name of its own (gzip
/// and xz leave it alone, gzip even with -f).
fn special_mode_allows(opts: &Options, meta: &std::fs::Metadata) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let refused = match opts.special_modes {
        SpecialModes::Taken => false,
        SpecialModes::Refused => true,
        SpecialModes::RefusedUnlessForced => !opts.force,
    };
    if !refused {
        return Ok(());
    }
    let mode = meta.mode();
    for (bit, what) in [
        (libc::S_ISUID, "is set-user-ID on execution"),
        (libc::S_ISGID, "is set-group-ID on execution"),
        (libc::S_ISVTX, "has the sticky bit set"),
    ] {
        if meta.is_file() && mode & bit != 0 {
            return Err(Error::SpecialMode(what));
        }
    }
    Ok(())
}

/// The regular files under directory `dir` that `wanted` takes, in name
/// order, depth first, as inputs. As with gzip -r, where outputs are
/// named from inputs (`outputs_named`) a symbolic link is an input left
/// alone with its error, unless `-f`; else, or with `-f`, one to a
/// regular file is read through, one to a directory is never followed (a
/// tree may link to itself), one to anything else is a special file. A
/// special file is never read: a warning where outputs are named, passed
/// over without a word under -c, -t and -l. A directory that cannot be
/// read is an input that failed.
fn walk(
    dir: &Path,
    wanted: &dyn Fn(&Path) -> bool,
    opts: &Options,
    outputs_named: bool,
    inputs: &mut Vec<(String, Result<Source>)>,
) {
    let entries = std::fs::read_dir(dir).and_then(|rd| {
        rd.map(|e| e.and_then(|e| Ok((e.path(), e.file_type()?))))
            .collect::<std::io::Result<Vec<_>>>()
    });
    let mut entries = match entries {
        Ok(entries) => entries,
        Err(source) => {
            let name = dir.display().to_string();
            let error = Error::Open {
                path: dir.to_path_buf(),
                source,
            };
            inputs.push((name, Err(error)));
            return;
        }
    };
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (path, kind) in entries {
        let source = Source::File(path.clone());
        // What a link points to (`None`: nothing).
        let target = kind
            .is_symlink()
            .then(|| std::fs::metadata(&path).ok())
            .flatten();
        if kind.is_dir() {
            walk(&path, wanted, opts, outputs_named, inputs);
        } else if kind.is_symlink() && leaves_link(opts, outputs_named) {
            inputs.push((source.name(), Err(symlink_input(opts))));
        } else if target.as_ref().is_some_and(|m| m.is_dir()) {
            tracing::debug!(path = %path.display(), "-r follows no link to a directory");
        } else if target.as_ref().is_some_and(|m| !m.is_file())
            || !kind.is_file() && !kind.is_symlink()
        {
            // gzip -rc, -rt and -rl say nothing of it.
            match outputs_named {
                true => inputs.push((source.name(), Err(Error::NotRegularInTree))),
                false => tracing::debug!(path = %path.display(), "-r reads no special file"),
            }
        } else if wanted(&path) {
            inputs.push((source.name(), Ok(source)));
        } else {
            tracing::debug!(path = %path.display(), "skipped by -r: no output name");
        }
    }
}

/// Whether any input whose output could be named satisfies `f`.
fn any_planned(plans: &[(String, Result<Plan>)], f: impl Fn(&Plan) -> bool) -> bool {
    plans.iter().any(|(_, p)| p.as_ref().is_ok_and(&f))
}

/// Run `one` on every planned input in turn. As in gzip, a failed input
/// does not stop the others: in a run of several, its error goes to
/// [`Hooks::input_failed`] as it happens, and the run fails at the end
/// naming every input that failed.
fn run_all(
    plans: Vec<(String, Result<Plan>)>,
    data_on_stdout: bool,
    force: bool,
    hooks: &dyn Hooks,
    mut one: impl FnMut(&Plan) -> Result<Summary>,
) -> Run {
    let total = plans.len();
    let mut summaries = Vec::new();
    let mut failed: Vec<(String, Error)> = Vec::new();
    let mut passed_over = 0;
    let mut plans = plans;
    let joined = match JoinedOutput::open(&mut plans, force, hooks) {
        Ok(joined) => joined,
        Err(e) => {
            return Run {
                summaries,
                data_on_stdout,
                outcome: Err(e),
                all_passed_over: false,
            }
        }
    };
    for (name, plan) in plans {
        if let Ok(p) = &plan {
            tracing::debug!(input = %name, output = ?p.dest, remove_input = p.remove_input, "planned");
        }
        match plan.and_then(|plan| one(&plan)) {
            Ok(s) => summaries.push(s),
            Err(e) => {
                let e = Error::Input {
                    input: name.clone(),
                    source: Box::new(e),
                };
                if total == 1 {
                    // One input: its own error is the run's.
                    return Run {
                        summaries,
                        data_on_stdout,
                        outcome: Err(e),
                        all_passed_over: false,
                    };
                }
                hooks.input_failed(&e);
                if hooks.passes_over(&e) {
                    passed_over += 1;
                } else {
                    failed.push((name, e));
                }
            }
        }
    }
    // The joined output holds what the inputs gave, the failed ones' too
    // (as zstd writes them), unless none gave anything.
    let committed = match joined {
        Some(out) if !summaries.is_empty() => out.commit(),
        _ => Ok(()),
    };
    let outcome = match (failed.len(), committed) {
        (_, Err(e)) => Err(e),
        (0, Ok(())) => Ok(()),
        _ => {
            let (failed, causes) = failed.into_iter().unzip();
            Err(Error::Failed {
                failed,
                total,
                causes,
            })
        }
    };
    Run {
        summaries,
        data_on_stdout,
        outcome,
        all_passed_over: total > 1 && passed_over == total,
    }
}

/// The output of a run whose inputs are all written into it
/// ([`Dest::Joined`]): a new file, renamed into place when the run is done.
struct JoinedOutput<'h> {
    sink: Sink<'h>,
}

impl<'h> JoinedOutput<'h> {
    /// Open the joined output the plans name, if they name one, and give
    /// every plan that writes into it a handle on it.
    fn open(
        plans: &mut [(String, Result<Plan>)],
        force: bool,
        hooks: &'h dyn Hooks,
    ) -> Result<Option<Self>> {
        let Some(path) = plans.iter().find_map(|(_, p)| match p {
            Ok(Plan {
                dest: Dest::Joined(path),
                ..
            }) => Some(path.clone()),
            _ => None,
        }) else {
            return Ok(None);
        };
        // A file in the way is replaced only when forced (zstd joins only
        // then; lzop joins unforced and refuses it); a device or FIFO is
        // written in place.
        let mut sink = Sink::file(&path, force, true, hooks)?;
        tracing::debug!(output = %path.display(), "every input's output joined in one");
        let file = Arc::new(
            sink.writer()
                .try_clone()
                .map_err(|source| Error::CreateOutput {
                    action: "open",
                    path: path.clone(),
                    source,
                })?,
        );
        for plan in plans.iter_mut().filter_map(|(_, p)| p.as_mut().ok()) {
            if matches!(plan.dest, Dest::Joined(_)) {
                plan.joined = Some(file.clone());
            }
        }
        Ok(Some(JoinedOutput { sink }))
    }

    fn commit(self) -> Result<()> {
        self.sink.commit()
    }
}

fn open_sink<'h>(plan: &Plan, force: bool, binary: bool, hooks: &'h dyn Hooks) -> Result<Sink<'h>> {
    match &plan.dest {
        Dest::Stdout => Sink::stdout(force, binary),
        Dest::File(p) => Sink::file(p, force, plan.named, hooks),
        Dest::Joined(p) => match &plan.joined {
            Some(out) => Sink::joined(out, p),
            // Not opened for a run: a file of its own.
            None => Sink::file(p, force, plan.named, hooks),
        },
        Dest::Nowhere => Sink::nowhere(),
    }
}

/// The metadata of a named input, to give its output (stdin has none).
fn input_metadata(source: &Source, file: &std::fs::File) -> Option<std::fs::Metadata> {
    match source {
        Source::File(_) => file.metadata().ok(),
        Source::Stdin => None,
    }
}

/// Make the output final, then remove the input if the plan says so
/// (and `keep_input` does not).
fn finish(
    plan: &Plan,
    sink: Sink,
    input_meta: Option<&std::fs::Metadata>,
    keep_input: bool,
) -> Result<()> {
    if let Some(meta) = input_meta {
        sink.copy_metadata(meta);
    }
    // An output written in place (`-o /dev/null`) keeps nothing: its
    // input stays.
    let kept = matches!(sink, Sink::File(_));
    if plan.synchronous {
        sink.commit_durable()?;
    } else {
        sink.commit()?;
    }
    if kept && !keep_input {
        finish_input(plan)?;
    }
    Ok(())
}

/// Remove the input if the plan says so, its output being final.
fn finish_input(plan: &Plan) -> Result<()> {
    if let (Source::File(src), true) = (&plan.source, plan.remove_input) {
        std::fs::remove_file(src).map_err(|source| Error::Remove {
            path: src.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The counts and settings of one finished input.
struct Counts {
    /// The format's name (`none` for an input copied as it is).
    format: &'static str,
    level: Option<i32>,
    block_size: Option<usize>,
    threads: usize,
    bytes_in: u64,
    bytes_out: u64,
}

impl Summary {
    /// The summary of an unpack of `bytes` (in, out).
    fn unpacked(
        plan: &Plan,
        output: String,
        format: &'static str,
        threads: usize,
        bytes: (u64, u64),
        started: Instant,
    ) -> Summary {
        let counts = Counts {
            format,
            level: None,
            block_size: None,
            threads,
            bytes_in: bytes.0,
            bytes_out: bytes.1,
        };
        Summary::new(Operation::Unpack, plan, output, counts, started)
    }

    fn new(op: Operation, plan: &Plan, output: String, c: Counts, started: Instant) -> Summary {
        let seconds = started.elapsed().as_secs_f64();
        let (raw, packed) = match op {
            Operation::Pack => (c.bytes_in, c.bytes_out),
            Operation::Unpack => (c.bytes_out, c.bytes_in),
        };
        Summary {
            operation: op,
            input: plan.source.name(),
            output,
            format: c.format.to_string(),
            level: c.level,
            block_size: c.block_size,
            threads: c.threads,
            bytes_in: c.bytes_in,
            bytes_out: c.bytes_out,
            ratio: if raw == 0 {
                0.0
            } else {
                packed as f64 / raw as f64
            },
            seconds,
            mb_per_s: if seconds > 0.0 {
                raw as f64 / 1e6 / seconds
            } else {
                0.0
            },
            warnings: Vec::new(),
            gzip: None,
            lzop_parts: None,
        }
    }
}

/// Pack every input of `opts` (see [`Options`] for the rules).
///
/// `Err` is a run that could not start (conflicting options, a level the
/// format lacks); the errors of inputs are in [`Run::outcome`].
pub fn pack(opts: &Options, pack: &PackOptions, hooks: &dyn Hooks) -> Result<Run> {
    let format = match (pack.format, &opts.output) {
        (Some(f), _) => f,
        (None, Some(out)) => format_of_name(out).map_or(Format::Gzip, |(f, _)| f),
        (None, None) => Format::Gzip,
    };
    let level = pack.level.resolve(format)?;
    format.check_options(&pack.encode)?;
    // zstd --long=N reaches back 2^N bytes; a block is as far back as its
    // frame can reach, so by default blocks grow to the window (up to
    // the block limit).
    let block = pack.block.unwrap_or_else(|| {
        let default = format.default_block_size_with(level, &pack.encode);
        match pack.encode.long {
            Some(n) => default.max(
                1usize
                    .checked_shl(n)
                    .map_or(MAX_BLOCK, |w| w.min(MAX_BLOCK)),
            ),
            None => default,
        }
    });
    if block > MAX_BLOCK {
        return Err(Error::BlockTooLarge(block));
    }
    let mut threads = threads(opts.threads)?;
    let (mut block, mut encode) = (block, pack.encode.clone());
    if let Some(limit) = pack.memlimit {
        if !matches!(format, Format::Xz | Format::Lzma) {
            return Err(CodecError::Invalid(format!(
                "--memlimit-compress is xz's; {format} has no such limit"
            ))
            .into());
        }
        let asked = if format.is_one_stream() { 1 } else { threads };
        let within = |block: usize, encode: &cairn_codec::EncodeOptions| {
            cairn_codec::format::xz::threads_within(
                limit,
                level,
                encode.extreme,
                encode.filters.as_ref(),
                block,
                asked,
            )
        };
        let mut fits = within(block, &encode)?;
        if fits == 0 && !pack.no_adjust {
            // One thread is over: as xz, a smaller dictionary.
            let fitted = cairn_codec::format::xz::fit_dictionary(
                limit,
                level,
                encode.extreme,
                encode.filters.as_ref(),
                block,
                pack.block.is_some(),
                format == Format::Lzma,
            )?;
            hooks.note_run(&format!(
                "Adjusted LZMA{} dictionary size from {} MiB to {} MiB to not exceed the \
                 memory usage limit of {} MiB",
                if format == Format::Lzma { 1 } else { 2 },
                fitted.dict_from >> 20,
                fitted.dict_to >> 20,
                limit.div_ceil(1 << 20),
            ));
            (block, encode.filters) = (fitted.block, Some(fitted.chain));
            fits = within(block, &encode)?;
        }
        if fits == 0 {
            return Err(CodecError::Invalid(format!(
                "--memlimit-compress={limit}: one thread needs {} MiB with these settings, and \
                 --no-adjust keeps them",
                cairn_codec::format::xz::encoder_memusage(
                    1,
                    level,
                    encode.extreme,
                    encode.filters.as_ref(),
                    block
                )?
                .div_ceil(1 << 20)
            ))
            .into());
        }
        if fits < threads {
            tracing::debug!(
                threads,
                fits,
                limit,
                "fewer threads, for --memlimit-compress"
            );
            threads = fits;
        }
    }
    let suffix = opts.suffix.as_deref();
    let mut plans = plan(opts, false, |p| {
        let force = opts.force && !opts.suffixed_despite_force;
        packed_name(p, format, suffix, force || opts.pack_suffixed)
    })?;
    if opts.exclude_compressed {
        plans.retain(|(name, plan)| match plan {
            Ok(Plan {
                source: Source::File(p),
                ..
            }) if compressed_name(p) => {
                tracing::debug!(input = %name, "passed over: compressed already (--exclude-compressed)");
                false
            }
            _ => true,
        });
    }
    let data_on_stdout = any_planned(&plans, |p| p.dest == Dest::Stdout);
    if data_on_stdout {
        // Once for the run, not once per input.
        refuse_terminal_stdout(opts.force)?;
    }
    let settings = PackSettings {
        format,
        level,
        block,
        encode,
        rsyncable: pack.rsyncable,
        threads,
        force: opts.force,
        keep_name: opts.name != Some(false),
        keep_time: opts.time.unwrap_or(opts.name != Some(false)),
    };
    tracing::debug!(%format, level, block, encode = ?settings.encode, rsyncable = pack.rsyncable,
        threads, inputs = plans.len(), "pack");
    Ok(run_all(plans, data_on_stdout, opts.force, hooks, |plan| {
        pack_one(plan, &settings, hooks)
    }))
}

/// Whether a name says its file is compressed already, as zstd's
/// `--exclude-compressed` reads names: a suffix of zstd, gzip, xz, lzma
/// or lz4, or one of their tar forms.
fn compressed_name(path: &Path) -> bool {
    const SUFFIXES: [&str; 9] = [
        ".zst", ".tzst", ".gz", ".tgz", ".lzma", ".xz", ".txz", ".lz4", ".tlz4",
    ];
    use std::os::unix::ffi::OsStrExt;
    let name = path.as_os_str().as_bytes();
    SUFFIXES.iter().any(|s| name.ends_with(s.as_bytes()))
}

/// Why input `path`, whose name has no known suffix, is left alone when
/// its data is looked at first ([`Options::data_before_name`]): data in
/// no format read is refused as such, an input that cannot be read says
/// why (only regular files get here: see [`plan`]); else the name.
fn unnamed_input_error(path: &Path, unpack: &UnpackOptions) -> Error {
    let mut head = Vec::with_capacity(64);
    let read = std::fs::File::open(path).and_then(|f| f.take(64).read_to_end(&mut head));
    if let Err(source) = read {
        return Error::Open {
            path: path.to_path_buf(),
            source,
        };
    }
    match Format::detect(&head) {
        Some(f) if unpack.reads(f) => Error::UnknownSuffix,
        found => unpack.not_read(found),
    }
}

/// Unpack, test or list every input of `opts` (see [`Options`] for the
/// rules); the format of each is detected by its magic number.
pub fn unpack(opts: &Options, unpack: &UnpackOptions, hooks: &dyn Hooks) -> Result<Run> {
    let threads = threads(opts.threads)?;
    let check_only = unpack.mode != UnpackMode::Write;
    let suffix = opts.suffix.as_deref();
    // `gunzip x` for x.gz, as gzip and pigz find it (and the name gzip
    // says missing where there is none); gzip follows links where it
    // reads to standard output, tests, lists or is forced.
    let follows_links = check_only || opts.stdout || opts.force || opts.output.is_some();
    let found: Vec<PathBuf> = opts
        .files
        .iter()
        .map(|f| match f.as_os_str() == "-" {
            true => f.clone(),
            false => missing_input(f, suffix, opts.missing_input, follows_links)
                .unwrap_or_else(|| f.clone()),
        })
        .collect();
    let opts = &Options {
        files: found,
        ..opts.clone()
    };
    let out_fallback = opts.unknown_suffix_out && !opts.recursive;
    let plans = plan(opts, check_only, |p| match unpacked_name(p, suffix) {
        Err(Error::UnknownSuffix) if out_fallback => {
            let mut out = p.as_os_str().to_owned();
            out.push(".out");
            let out = PathBuf::from(out);
            hooks.note(
                p,
                &format!("can't guess original name -- using {}", out.display()),
            );
            Ok(out)
        }
        Err(Error::UnknownSuffix) if opts.data_before_name => Err(unnamed_input_error(p, unpack)),
        named => named,
    })?;
    if unpack.gzip_index.is_some() && plans.len() != 1 {
        return Err(Error::IndexManyInputs(plans.len()));
    }
    if any_planned(&plans, |p| matches!(p.source, Source::Stdin)) {
        refuse_terminal_stdin(opts.force)?;
    }
    let data_on_stdout = any_planned(&plans, |p| p.dest == Dest::Stdout);
    tracing::debug!(mode = ?unpack.mode, threads, inputs = plans.len(), "unpack");
    if let Some(range) = unpack.range {
        refuse_range(opts, unpack, plans.len())?;
        return Ok(run_all(plans, data_on_stdout, opts.force, hooks, |plan| {
            range_one(plan, threads, opts.force, unpack, range, hooks)
        }));
    }
    Ok(run_all(plans, data_on_stdout, opts.force, hooks, |plan| {
        unpack_one(
            plan,
            threads,
            opts.force,
            Restore {
                name: opts.name == Some(true),
                time: opts.time.unwrap_or(opts.name == Some(true)),
            },
            unpack,
            hooks,
        )
    }))
}

/// A pack's settings, resolved once for every input.
struct PackSettings {
    format: Format,
    level: i32,
    block: usize,
    encode: cairn_codec::EncodeOptions,
    rsyncable: bool,
    threads: usize,
    force: bool,
    /// Keep each input file's name in headers that hold one (not with
    /// `-n`).
    keep_name: bool,
    /// Keep its modification time there (not with `-n` or `-m`).
    keep_time: bool,
}

/// What a pack worker hands the writer: the encoded bytes and their meta.
#[derive(Default)]
struct Packed {
    bytes: Vec<u8>,
    meta: BlockMeta,
}

/// One block of input: `data[..len]` as read, or `zeros` bytes of a hole
/// that were not read. `data` stays initialised at the block size, so
/// reads fill it without zeroing it first.
#[derive(Default)]
struct Block {
    data: Vec<u8>,
    len: usize,
    zeros: usize,
}

impl Block {
    fn raw_len(&self) -> usize {
        self.len + self.zeros
    }
}

/// Fill `b` with the next `want` bytes of `r` (fewer at the end); a block
/// that lies wholly in a hole of a sparse file is skipped, not read.
fn fill_block(r: &mut dyn SparseRead, b: &mut Block, want: usize) -> std::io::Result<usize> {
    b.len = 0;
    b.zeros = 0;
    if r.zeros_ahead()? >= want as u64 {
        r.skip_zeros(want as u64)?;
        b.zeros = want;
        return Ok(want);
    }
    if b.data.len() < want {
        b.data.resize(want, 0);
    }
    while b.len < want {
        match r.read(&mut b.data[b.len..want]) {
            Ok(0) => break,
            Ok(n) => b.len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(b.len)
}

/// Where `--rsyncable` cuts an input into blocks: FastCDC cut points
/// (the `fastcdc` crate, as the repository's chunker) between a quarter
/// and four times the block size on average, within the crate's limits.
/// A cut depends only on the bytes since the previous cut, never on how
/// reads fell, so the same content is cut the same way wherever it lies.
struct ContentCuts {
    /// Read and not yet handed out: at most `max` bytes.
    carry: Vec<u8>,
    min: u32,
    avg: u32,
    max: u32,
    eof: bool,
}

impl ContentCuts {
    fn new(block: usize) -> Self {
        use fastcdc::v2020::{AVERAGE_MAX, AVERAGE_MIN, MAXIMUM_MAX, MINIMUM_MAX, MINIMUM_MIN};
        let avg = u32::try_from(block)
            .unwrap_or(u32::MAX)
            .clamp(AVERAGE_MIN, AVERAGE_MAX);
        ContentCuts {
            carry: Vec::new(),
            min: (avg / 4).clamp(MINIMUM_MIN, MINIMUM_MAX),
            avg,
            max: avg.saturating_mul(4).min(MAXIMUM_MAX),
            eof: false,
        }
    }

    /// Fill `b` with the next block: up to the first cut point of what
    /// is read ahead (everything left, at the end of the input).
    fn fill(&mut self, r: &mut dyn SparseRead, b: &mut Block) -> std::io::Result<usize> {
        let max = self.max as usize;
        while !self.eof && self.carry.len() < max {
            let have = self.carry.len();
            self.carry.resize(max, 0);
            let got = r.read(&mut self.carry[have..]);
            self.carry.truncate(have + *got.as_ref().unwrap_or(&0));
            match got {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let cut = fastcdc::v2020::FastCDC::new(&self.carry, self.min, self.avg, self.max)
            .next()
            .map_or(self.carry.len(), |c| c.length);
        b.data.clear();
        b.data.extend_from_slice(&self.carry[..cut]);
        b.len = cut;
        b.zeros = 0;
        self.carry.drain(..cut);
        Ok(cut)
    }
}

/// A worker's encoding of an all-zero block. Blocks are encoded
/// independently of each other, so a zero block of one length always
/// encodes to the same bytes: holes and zeroed free space of a disk image
/// are encoded once per worker, then copied.
struct ZeroBlock {
    len: usize,
    bytes: Vec<u8>,
    meta: BlockMeta,
}

/// A write error, named after the output.
fn write_error(name: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Write {
        name: name.to_string(),
        source,
    }
}

fn pack_one(plan: &Plan, s: &PackSettings, hooks: &dyn Hooks) -> Result<Summary> {
    let started = Instant::now();
    let (format, level, block) = (s.format, s.level, s.block);
    let (file, size) = plan.source.open()?;
    let input_meta = input_metadata(&plan.source, &file);
    let source_name = plan.source.name();
    let read_error = |source| Error::Read {
        name: source_name.clone(),
        source,
    };
    // A regular file is read by its data extents (size is known only for
    // those).
    let mut reader: Box<dyn SparseRead> = if size.is_some() {
        Box::new(SparseFile::new(file).map_err(|source| Error::Open {
            path: PathBuf::from(&source_name),
            source,
        })?)
    } else {
        Box::new(file)
    };
    let mut sink = open_sink(plan, s.force, true, hooks)?;
    let progress = hooks.progress(crate::Operation::Pack, size);
    // Build one encoder now so a bad level fails before any output.
    let mut one_stream = None;
    if format.is_one_stream() {
        one_stream = Some(format.lzma_encoder(level, &s.encode)?);
    } else {
        drop(format.encoder_with(level, block, &s.encode)?);
    }
    let mut framer = format.framer(level, &s.encode);
    if let (Source::File(path), Some(meta)) = (&plan.source, &input_meta) {
        if meta.is_file() && (s.keep_name || s.keep_time) {
            let mut origin = origin_of(path, meta);
            if !s.keep_name {
                origin.name.clear();
            }
            if !s.keep_time {
                origin.mtime = 0;
            }
            framer.origin(&origin);
        }
    }
    let mut head = Vec::new();
    framer.header(&mut head);
    let out_name = sink.name();
    let w = sink.writer();
    w.write_all(&head).map_err(write_error(&out_name))?;
    let mut bytes_out = head.len() as u64;
    let mut bytes_in = 0u64;
    let mut first = true;
    let mut read_total = 0u64;
    let mut blocks = 0usize;
    let mut cuts = s.rsyncable.then(|| ContentCuts::new(block));
    let result = if let Some(mut enc) = one_stream {
        // One stream through one encoder, read a block at a time.
        let mut input = Block::default();
        let mut out = Vec::new();
        loop {
            let n = fill_block(reader.as_mut(), &mut input, block).map_err(read_error)?;
            if n == 0 {
                enc.finish(&mut out)?;
            } else if input.zeros > 0 {
                // A hole, skipped rather than read.
                input.data.clear();
                input.data.resize(n, 0);
                enc.write(&input.data, &mut out)?;
            } else {
                enc.write(&input.data[..n], &mut out)?;
            }
            w.write_all(&out).map_err(write_error(&out_name))?;
            blocks += 1;
            bytes_in += n as u64;
            bytes_out += out.len() as u64;
            out.clear();
            progress.read_to(bytes_in);
            progress.ratio(bytes_in, bytes_out);
            if n == 0 {
                break Ok(());
            }
        }
    } else {
        cairn_pipeline::run(
            Config::new(s.threads),
            |input: &mut Block| {
                let n = match cuts.as_mut() {
                    Some(c) => c.fill(reader.as_mut(), input),
                    None => fill_block(reader.as_mut(), input, block),
                }
                .map_err(read_error)?;
                // An empty input still gets one (empty) block: every format's
                // tools expect at least a header and most a member or frame.
                if n == 0 && !first {
                    return Ok(Fill::End);
                }
                first = false;
                blocks += 1;
                read_total += n as u64;
                progress.read_to(read_total);
                Ok(Fill::Item)
            },
            || {
                let mut enc = format.encoder_with(level, block, &s.encode);
                let mut zero: Option<ZeroBlock> = None;
                move |input: &mut Block, out: &mut Packed| -> Result<()> {
                    // The first encoder was built above: one failing now is a
                    // library refusing the same parameters a second time.
                    let enc = enc
                        .as_mut()
                        .map_err(|e| CodecError::Invalid(e.to_string()))?;
                    let len = input.raw_len();
                    let data = &input.data[..input.len];
                    if len == 0 || (input.zeros == 0 && !is_zero(data)) {
                        out.meta = enc.encode(data, &mut out.bytes)?;
                        return Ok(());
                    }
                    let z = match zero.take() {
                        Some(z) if z.len == len => z,
                        _ => {
                            let mut bytes = Vec::new();
                            let meta = enc.encode(&vec![0u8; len], &mut bytes)?;
                            ZeroBlock { len, bytes, meta }
                        }
                    };
                    out.bytes.extend_from_slice(&z.bytes);
                    out.meta = z.meta;
                    zero = Some(z);
                    Ok(())
                }
            },
            |slot: &mut Slot<Block, Packed>| {
                w.write_all(&slot.output.bytes)
                    .map_err(write_error(&out_name))?;
                framer.block(&slot.output.meta);
                bytes_in += slot.input.raw_len() as u64;
                bytes_out += slot.output.bytes.len() as u64;
                progress.ratio(bytes_in, bytes_out);
                Ok(())
            },
            |slot| {
                slot.input.len = 0;
                slot.input.zeros = 0;
                slot.output.bytes.clear();
            },
        )
    };
    progress.finish();
    result?;
    let mut tail = Vec::new();
    framer.trailer(&mut tail)?;
    sink.writer()
        .write_all(&tail)
        .map_err(write_error(&out_name))?;
    bytes_out += tail.len() as u64;
    // A file written to while it was read was packed as neither its old
    // bytes nor its new ones: said (gzip's "file size changed while
    // zipping"), and the input kept.
    let changed = changed_while_read(plan, input_meta.as_ref(), bytes_in);
    finish(plan, sink, input_meta.as_ref(), changed)?;
    let counts = Counts {
        format: format.name(),
        level: Some(level),
        block_size: Some(block),
        // A worker per block at most: a small input uses one.
        threads: s.threads.min(blocks).max(1),
        bytes_in,
        bytes_out,
    };
    let mut summary = Summary::new(Operation::Pack, plan, out_name, counts, started);
    if changed {
        summary
            .warnings
            .push("file changed while it was packed; the input is kept".into());
    }
    Ok(summary)
}

/// What gzip and lzop keep of a file they pack: its base name and its
/// modification time in seconds (0, none, when it does not fit 32 bits).
fn origin_of(path: &Path, meta: &std::fs::Metadata) -> cairn_codec::Origin {
    use std::os::unix::ffi::OsStrExt;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| u32::try_from(d.as_secs()).ok())
        .unwrap_or(0);
    cairn_codec::Origin {
        name: path
            .file_name()
            .map(|n| n.as_bytes().to_vec())
            .unwrap_or_default(),
        mtime,
    }
}

/// The output `gunzip -N` (and `lzop -dN`) writes for `plan`, whose
/// gzip or lzop stream starts with `head`: named after the name its
/// first member keeps (its last path component, in the input's
/// directory), when the output is named from the input; and the time
/// that member keeps, when it keeps one.
fn restored_origin(
    plan: &Plan,
    format: Format,
    head: &[u8],
) -> (Option<PathBuf>, Option<std::time::SystemTime>) {
    let kept = match format {
        Format::Gzip => cairn_codec::format::gzip::kept(head)
            .map(|k| (k.origin.name, i64::from(k.origin.mtime))),
        // The members of `lzop -c a b` each keep their own name (lzop -d
        // writes each to its own): the first's would name all of them,
        // joined, so none is taken.
        Format::Lzop => cairn_codec::format::lzop::first_header(head)
            .filter(|h| h.flags & cairn_codec::format::lzop::F_MULTIPART == 0)
            .map(|h| (h.name, h.mtime)),
        _ => None,
    };
    let Some((kept_name, kept_time)) = kept else {
        return (None, None);
    };
    let mtime = time_kept(kept_time);
    let path = match (&plan.source, &plan.dest, kept_file_name(&kept_name)) {
        // In the directory the output was planned in (the input's, or
        // lzop's -p DIR); never the input itself: the output would
        // replace the input, which is then removed.
        (Source::File(src), Dest::File(planned), Some(name)) if !plan.named => {
            Some(planned.with_file_name(name)).filter(|p| !same_file(p, src))
        }
        _ => None,
    };
    (path, mtime)
}

/// The file name a gzip or lzop header keeps, as gunzip -N and lzop -d
/// take it: its last path component; `None` for none, `.` or `..`.
fn kept_file_name(kept: &[u8]) -> Option<&std::ffi::OsStr> {
    use std::os::unix::ffi::OsStrExt;
    let name = kept.rsplit(|&b| b == b'/').next().unwrap_or_default();
    (!matches!(name, b"" | b"." | b"..")).then(|| std::ffi::OsStr::from_bytes(name))
}

/// The time a gzip or lzop header keeps, in seconds from the epoch;
/// `None` for none (0). (Seconds either side of the epoch, as lzop keeps
/// 64 signed bits; a time no clock holds is not restored.)
fn time_kept(secs: i64) -> Option<std::time::SystemTime> {
    let from_epoch = std::time::Duration::from_secs(secs.unsigned_abs());
    match secs {
        0 => None,
        t if t > 0 => std::time::UNIX_EPOCH.checked_add(from_epoch),
        _ => std::time::UNIX_EPOCH.checked_sub(from_epoch),
    }
}

/// A file read by `pread` from `at` on, through a reference (`&File`,
/// `Arc<File>`): the offset of its handle, which the decoding of the
/// first member shares, is left alone.
struct ReadAt<F> {
    file: F,
    at: u64,
}

impl<F: std::ops::Deref<Target = std::fs::File>> Read for ReadAt<F> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

impl<F: std::ops::Deref<Target = std::fs::File>> std::io::Seek for ReadAt<F> {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        let to = match pos {
            std::io::SeekFrom::Start(n) => Some(n),
            std::io::SeekFrom::Current(d) => self.at.checked_add_signed(d),
            std::io::SeekFrom::End(d) => self.file.metadata()?.len().checked_add_signed(d),
        };
        self.at = to.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        Ok(self.at)
    }
}

/// The members of the lzop file `file` holds (a regular file: a FIFO
/// would lose the bytes read here), listed from their headers and block
/// sizes.
fn lzop_members(file: &std::fs::File) -> Result<cairn_codec::format::lzop::Listing> {
    let mut r = std::io::BufReader::new(ReadAt { file, at: 0 });
    Ok(cairn_codec::format::lzop::members(&mut r, |r, n| {
        r.seek_relative(n as i64)
    })?)
}

/// Where [`unpack_lzop_parts`] writes: beside the output planned for the
/// file, a member by the name it keeps (its last component) from the
/// second member on, or from the first where that is marked as a part or
/// `name` (-N), else (or where it keeps none) by the file's; with the
/// times the members keep if `time`, and the input's metadata.
struct PartsTo<'a> {
    planned: &'a Path,
    name: bool,
    time: bool,
    input_meta: Option<&'a std::fs::Metadata>,
    started: Instant,
}

/// The parts of a file of parts written before [`unpack_lzop_parts`]
/// goes on: the first, where it was decoded as a file of one member
/// until a second began.
#[derive(Default)]
struct PartsDone {
    names: Vec<String>,
    bytes_in: u64,
    bytes_out: u64,
}

/// `lzop -d` of a file of parts (`lzop -c a b > x.lzo`, or lzop files
/// joined), `file` (the input, open): each member into a file of its
/// own, named as [`PartsTo`] says, beside the output planned for the
/// file (the input's directory, or -p DIR), as lzop does ("multipart
/// archive -- restoring file names", status 2, unless -N), from the
/// first not `done`. A part whose output is in the way (or is the
/// input) is passed over without -f and the others written, then the
/// run fails naming it, as lzop's "not overwritten" (status 1); the
/// input goes (-U) only if every part was written.
#[allow(clippy::too_many_arguments)]
fn unpack_lzop_parts(
    plan: &Plan,
    file: &std::fs::File,
    listing: &cairn_codec::format::lzop::Listing,
    to: &PartsTo,
    done: PartsDone,
    threads: usize,
    force: bool,
    opts: &UnpackOptions,
    hooks: &dyn Hooks,
) -> Result<Summary> {
    let Source::File(src) = &plan.source else {
        return Err(Error::Read {
            name: plan.source.name(),
            source: std::io::ErrorKind::Unsupported.into(),
        });
    };
    let decode = DecodeOptions {
        threads,
        memory: opts.memory,
        ..DecodeOptions::default()
    };
    let PartsDone {
        mut names,
        mut bytes_in,
        mut bytes_out,
    } = done;
    // One handle for every part's reads, each from its own offset.
    let shared = std::sync::Arc::new(file.try_clone().map_err(|source| Error::Read {
        name: plan.source.name(),
        source,
    })?);
    let mut in_the_way = None;
    let first_named = match to.name {
        true => 0,
        false => listing.parts_named_from().unwrap_or(1),
    };
    for (i, m) in listing.members.iter().enumerate().skip(names.len()) {
        let out = match kept_file_name(&m.header.name) {
            Some(name) if i >= first_named => to.planned.with_file_name(name),
            // A part after the first that keeps no name would be written
            // over the first: lzop stops there, the input kept.
            None if i > 0 => return Err(Error::NamelessPart),
            _ => to.planned.to_path_buf(),
        };
        if same_file(&out, src) {
            in_the_way.get_or_insert(Error::Exists { path: out });
            continue;
        }
        let part = Plan {
            source: plan.source.clone(),
            dest: Dest::File(out),
            remove_input: false,
            named: false,
            synchronous: plan.synchronous,
            joined: None,
        };
        let mut sink = match open_sink(&part, force, false, hooks) {
            Err(e @ Error::Exists { .. }) => {
                in_the_way.get_or_insert(e);
                continue;
            }
            other => other?,
        };
        let read = ReadAt {
            file: shared.clone(),
            at: m.at,
        };
        let mut splitter =
            Format::Lzop.splitter_with(Input::new(Box::new(read.take(m.len))), &decode);
        let name = sink.name();
        let w = sink.writer();
        let (result, counts) = decode_stream(
            Format::Lzop,
            &mut *splitter,
            &decode,
            threads,
            &(),
            &mut |b: &[u8]| w.write_all(b).map_err(write_error(&name)),
        );
        result?;
        if let Some(meta) = to.input_meta {
            sink.copy_metadata(meta);
        }
        if let Some(t) = time_kept(m.header.mtime).filter(|_| to.time) {
            sink.set_modified(t);
        }
        finish(&part, sink, None, true)?;
        bytes_in += m.len;
        bytes_out += counts.bytes_out;
        names.push(name);
    }
    // (Not when told to, with -N.)
    let warning = (!to.name).then_some("warning: multipart archive -- restoring file names");
    if let Some(e) = in_the_way {
        // Said as lzop says it, before the error.
        if let Some(w) = warning {
            hooks.note(src, w);
        }
        return Err(e);
    }
    finish_input(plan)?;
    let mut summary = Summary::unpacked(
        plan,
        names.join(" "),
        Format::Lzop.name(),
        1,
        (bytes_in, bytes_out),
        to.started,
    );
    summary.lzop_parts = Some(listing.members.len());
    summary.warnings.extend(warning.map(String::from));
    if listing.garbage_at.is_some() {
        summary
            .warnings
            .push("warning: ignoring trailing garbage in lzop file".into());
    }
    Ok(summary)
}

/// Whether the regular file `plan` read changed while it was packed:
/// its size or modification time now differ from `before`, or it was
/// not `read` bytes long.
fn changed_while_read(plan: &Plan, before: Option<&std::fs::Metadata>, read: u64) -> bool {
    let (Source::File(path), Some(before)) = (&plan.source, before) else {
        return false;
    };
    if !before.is_file() {
        return false;
    }
    match std::fs::metadata(path) {
        Ok(now) => {
            now.len() != before.len()
                || read != before.len()
                || now.modified().ok() != before.modified().ok()
        }
        Err(_) => true,
    }
}

/// Copy an input in no known format to standard output unchanged (`-dcf`),
/// `head` being what was read of it already.
fn pass_through(
    plan: &Plan,
    head: &[u8],
    mut reader: std::fs::File,
    hooks: &dyn Hooks,
    started: Instant,
) -> Result<Summary> {
    tracing::debug!(input = %plan.source.name(), "no known format: copied as it is (-dcf)");
    let mut sink = open_sink(plan, true, false, hooks)?;
    let out_name = sink.name();
    let w = sink.writer();
    w.write_all(head).map_err(write_error(&out_name))?;
    let mut copied = head.len() as u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match Read::read(&mut reader, &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(Error::Read {
                    name: plan.source.name(),
                    source,
                })
            }
        };
        w.write_all(&buf[..n]).map_err(write_error(&out_name))?;
        copied += n as u64;
    }
    sink.commit()?;
    Ok(Summary::unpacked(
        plan,
        out_name,
        "none",
        1,
        (copied, copied),
        started,
    ))
}

/// What of a gzip header's name and time an unpack gives its output
/// (gzip's `-N`; pigz's `-M` is the time alone).
#[derive(Debug, Clone, Copy)]
struct Restore {
    name: bool,
    time: bool,
}

/// A worker's output for one unit: its bytes, and the error that stopped
/// its decoding after them (see `UnitDecoder::salvage`).
#[derive(Default)]
struct Decoded {
    bytes: Vec<u8>,
    error: Option<CodecError>,
}

/// What [`decode_stream`] decoded: bytes written, units the splitter
/// decoded itself, units with output the workers decoded.
#[derive(Default)]
struct StreamCounts {
    bytes_out: u64,
    plain: usize,
    coded: usize,
}

/// Decode the `format` stream `splitter` cuts, on `threads` workers,
/// handing its bytes in order to `write`, each unit's content checked.
/// What a unit decodes to before damage is written, then its error ends
/// the run, as the tools do.
fn decode_stream(
    format: Format,
    splitter: &mut dyn cairn_codec::Splitter,
    decode: &DecodeOptions,
    threads: usize,
    progress: &dyn crate::Progress,
    write: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> (Result<()>, StreamCounts) {
    let mut checker = ContentChecker::default();
    let mut counts = StreamCounts::default();
    let result = cairn_pipeline::run(
        Config::new(threads),
        |unit: &mut Unit| {
            let more = splitter.next_unit(unit)?;
            progress.read_to(splitter.offset());
            if more && unit.kind == UnitKind::Plain {
                counts.plain += 1;
            }
            Ok(if more { Fill::Item } else { Fill::End })
        },
        || {
            let mut dec = format.unit_decoder_with(decode);
            move |unit: &mut Unit, out: &mut Decoded| -> Result<()> {
                if let Err(e) = dec.decode(unit, &mut out.bytes) {
                    // What the unit decodes to before the damage is
                    // written, then the error reported, as by the tools.
                    out.bytes.clear();
                    dec.salvage(unit, &mut out.bytes);
                    out.error = Some(e);
                }
                Ok(())
            }
        },
        |slot: &mut Slot<Unit, Decoded>| {
            let failed = slot.output.error.take();
            let out = slot.input.decoded(&slot.output.bytes);
            // Not the empty members that mark a stream's ends.
            if slot.input.kind != UnitKind::Plain && !out.is_empty() {
                counts.coded += 1;
            }
            if failed.is_none() {
                checker.feed(format, slot.input.offset, slot.input.content, out)?;
            }
            write(out)?;
            counts.bytes_out += out.len() as u64;
            progress.ratio(counts.bytes_out, slot.input.offset);
            failed.map_or(Ok(()), |e| Err(e.into()))
        },
        |slot| {
            slot.input.clear();
            slot.output.bytes.clear();
            slot.output.error = None;
        },
    );
    progress.finish();
    (result, counts)
}

fn unpack_one(
    plan: &Plan,
    threads: usize,
    force: bool,
    restore: Restore,
    opts: &UnpackOptions,
    hooks: &dyn Hooks,
) -> Result<Summary> {
    let started = Instant::now();
    let (mut reader, size) = plan.source.open()?;
    let input_meta = input_metadata(&plan.source, &reader);
    // Enough for a gzip header that keeps a long name: with -N, from a
    // file; in a listing, which shows that name and the header's length,
    // from any input.
    let whole_header = opts.mode == UnpackMode::List
        || (matches!(plan.source, Source::File(_)) && (restore.name || restore.time));
    let head_len = if whole_header { 64 << 10 } else { 16 };
    let mut head = Vec::with_capacity(16);
    Read::by_ref(&mut reader)
        .take(head_len)
        .read_to_end(&mut head)
        .map_err(|source| Error::Read {
            name: plan.source.name(),
            source,
        })?;
    if head.is_empty() {
        match opts.empty {
            // zstd and bzip2 refuse an empty input even with -dcf.
            EmptyInput::Truncated => {
                let format = opts.formats.as_ref().and_then(|f| f.first());
                return Err(CodecError::Truncated {
                    format: format.map_or("input", |f| f.name()),
                    offset: 0,
                }
                .into());
            }
            // lz4 decodes it to nothing (but makes no file of it).
            EmptyInput::Nothing if plan.dest == Dest::Stdout || opts.mode != UnpackMode::Write => {
                let name = plan.source.name();
                return Ok(Summary::unpacked(plan, name, "none", 1, (0, 0), started));
            }
            _ => {}
        }
    }
    // The lzop link reads an lzop header whole (its flags say whether it
    // begins a file of parts), and no more: from a pipe, bytes not yet
    // written would hold the output back.
    while let (true, Some(n)) = (
        opts.lzop_parts,
        cairn_codec::format::lzop::first_header_needs(&head),
    ) {
        let before = head.len();
        Read::by_ref(&mut reader)
            .take((n - before) as u64)
            .read_to_end(&mut head)
            .map_err(|source| Error::Read {
                name: plan.source.name(),
                source,
            })?;
        if head.len() == before {
            break;
        }
    }
    let found = Format::detect(&head);
    let Some(format) = found.filter(|&f| opts.reads(f)) else {
        // gzip -dcf and zstd -dcf copy what is in no format they know
        // (so `zcat -f` reads logs whether or not they are compressed);
        // gzip -tf passes it (it would be copied).
        if opts.pass_through.unwrap_or(force)
            && plan.dest == Dest::Stdout
            && opts.mode == UnpackMode::Write
        {
            return pass_through(plan, &head, reader, hooks, started);
        }
        if force && opts.mode == UnpackMode::Test && opts.force_test_passes_unknown {
            let len = size.unwrap_or(head.len() as u64);
            let name = plan.source.name();
            return Ok(Summary::unpacked(
                plan,
                name,
                "none",
                1,
                (len, len),
                started,
            ));
        }
        return Err(opts.not_read(found));
    };
    tracing::debug!(input = %plan.source.name(), %format, "detected");
    // A file of several lzop members (`lzop -c a b`, or files joined):
    // lzop -d writes each to the name it keeps, and warns where it writes
    // them as one (-dc, -o) or tests them (-t). Looked for only in a
    // regular file, through a dup of its handle (a FIFO opened again
    // would lose its bytes, or wait for a writer gone).
    // Counted in any input, a pipe too, as lzop warns of them there.
    let lzop_counts = format == Format::Lzop && opts.lzop_parts;
    let regular = input_meta.as_ref().is_some_and(std::fs::Metadata::is_file);
    let lzop_file = (lzop_counts && regular)
        .then(|| reader.try_clone())
        .transpose()
        .map_err(|source| Error::Read {
            name: plan.source.name(),
            source,
        })?;
    let parts_to = match (&plan.dest, opts.mode) {
        (Dest::File(planned), UnpackMode::Write) if !plan.named => Some(PartsTo {
            planned,
            name: restore.name,
            time: restore.time,
            input_meta: input_meta.as_ref(),
            started,
        }),
        _ => None,
    };
    // Marked as a part from the first member (`lzop -c a b` marks them
    // all): listed now, every part named by the name it keeps. Else
    // found when a second member begins: with parts to write apart, the
    // first is decoded alone and the rest go on from its end (below);
    // else all are decoded and counted.
    let marked = lzop_counts
        && cairn_codec::format::lzop::first_header(&head)
            .is_some_and(|h| h.flags & cairn_codec::format::lzop::F_MULTIPART != 0);
    let mut parts_count = None;
    if let (Some(file), true) = (&lzop_file, marked) {
        if let Ok(listing) = lzop_members(file) {
            if let Some(to) = &parts_to {
                let done = PartsDone::default();
                return unpack_lzop_parts(
                    plan, file, &listing, to, done, threads, force, opts, hooks,
                );
            }
            parts_count = Some(listing.members.len());
        }
    }
    let first_alone = lzop_file.is_some() && parts_to.is_some() && !marked;
    let (renamed, restored_mtime) = match format {
        Format::Gzip | Format::Lzop if restore.name || restore.time => {
            let (name, time) = restored_origin(plan, format, &head);
            (name.filter(|_| restore.name), time.filter(|_| restore.time))
        }
        _ => (None, None),
    };
    let renamed_plan;
    let plan = match renamed {
        Some(out) => {
            tracing::debug!(output = %out.display(), "the name the header keeps (-N)");
            renamed_plan = Plan {
                source: plan.source.clone(),
                dest: Dest::File(out),
                remove_input: plan.remove_input,
                named: false,
                synchronous: plan.synchronous,
                joined: None,
            };
            &renamed_plan
        }
        None => plan,
    };
    // The input may be read through a memory map (incompressible zstd
    // frames, by the seek table).
    hooks.input_mapped();
    let gzip_index = match &opts.gzip_index {
        Some(path) => Some((path, open_index(path, plan, format, size)?)),
        None => None,
    };
    let input = Input::with_prefix_file(&head, reader);
    let decode = DecodeOptions {
        zstd_window_log_max: opts
            .zstd_window_log_max
            .unwrap_or(DecodeOptions::default().zstd_window_log_max),
        threads,
        gzip_index: gzip_index.as_ref().map(|(_, (i, _))| i.clone()),
        memory: opts.memory,
        single_stream: opts.single_stream,
        ignore_check: opts.ignore_check,
        lzop_first_member: first_alone,
        zstd_dictionary: opts.zstd_dictionary.clone(),
    };
    let mut splitter = format.splitter_with(input, &decode);
    let mut sink = match (open_sink(plan, force, false, hooks), &lzop_file, &parts_to) {
        // The first part in the way: the others are written, the run
        // fails naming it, as where all are marked as parts.
        (Err(e @ Error::Exists { .. }), Some(file), Some(to)) if first_alone => {
            return match lzop_members(file) {
                Ok(listing) if listing.parts_named_from().is_some() => {
                    let done = PartsDone::default();
                    unpack_lzop_parts(plan, file, &listing, to, done, threads, force, opts, hooks)
                }
                _ => Err(e),
            };
        }
        (sink, ..) => sink?,
    };
    let progress = hooks.progress(Operation::Unpack, size);
    let out_name = sink.name();
    // Zeros become holes in a new file (zstd's --sparse, its default for
    // files), and in standard output redirected to a file where a hole
    // reads as zeros for sure (its end, no O_APPEND: `HoleWriter::
    // at_end_of`; zstd leaves none there unless --sparse, but a hole
    // costs no write: gunzip -c of an OS image into a file took 1.15 s
    // against 1.72); with --no-sparse (zstd's, lz4's, xz's) nowhere.
    let mut holes = match opts.sparse {
        Some(false) => None,
        Some(true) | None if plan.dest == Dest::Stdout => HoleWriter::at_end_of(sink.writer()),
        _ => sink.is_new_file().then(HoleWriter::default),
    };
    let w = sink.writer();
    let listed_gzip = opts.mode == UnpackMode::List && format == Format::Gzip;
    let mut crc = (listed_gzip && opts.list_crc).then(crc32fast::Hasher::new);
    let (result, counts) = decode_stream(
        format,
        &mut *splitter,
        &decode,
        threads,
        &*progress,
        &mut |out: &[u8]| {
            if let Some(c) = crc.as_mut() {
                c.update(out);
            }
            match holes.as_mut() {
                Some(h) => h.write(w, out),
                None => w.write_all(out),
            }
            .map_err(write_error(&out_name))
        },
    );
    let StreamCounts {
        bytes_out,
        plain,
        coded,
    } = counts;
    // The zeros decoded last are passed over and the file given its
    // length whether or not the run failed: standard output's offset is
    // then after all that was decoded, as with plain writes, for what a
    // shell writes there next.
    let finished = holes.map(|h| h.finish(sink.writer()));
    // Bytes after the last gzip member that start no other: gzip says
    // "decompression OK, trailing garbage ignored" and exits 2, keeping
    // the output (errors travel in order: every member before them was
    // written and checked); bzip2 says "trailing garbage after EOF
    // ignored" (and exits 0); lzop "ignoring trailing garbage in lzop
    // file" (status 2). Other formats' tools refuse, and so does cairn.
    let mut warnings = Vec::new();
    match result {
        Err(Error::Codec(CodecError::TrailingGarbage { offset, .. })) if format == Format::Gzip => {
            warnings.push(format!(
                "decompression OK, trailing garbage ignored (from offset {offset})"
            ));
        }
        Err(Error::Codec(CodecError::TrailingGarbage { .. })) if format == Format::Bzip2 => {
            warnings.push("trailing garbage after EOF ignored".to_string());
        }
        // (lzop takes zeros there as nothing: the splitter passes them.)
        Err(Error::Codec(CodecError::TrailingGarbage { .. })) if format == Format::Lzop => {
            warnings.push("warning: ignoring trailing garbage in lzop file".to_string());
        }
        other => other?,
    }
    // Parts decoded as one (-dc, -o, -t; a pipe): lzop warns.
    let members = splitter.members().unwrap_or_default();
    if lzop_counts && (marked || members.begun > 1) {
        parts_count = parts_count.or(usize::try_from(members.begun).ok());
        // (lzop -tN tests parts it could each name without a word.)
        let tested_named = opts.mode == UnpackMode::Test && restore.name && !members.nameless_part;
        if opts.mode != UnpackMode::List && !tested_named {
            warnings.push("warning: this is a multipart archive (try option '-N')".into());
        }
    }
    if let Some(done) = finished {
        done.map_err(write_error(&out_name))?;
    }
    let bytes_in = splitter.offset();
    // An index that cannot be saved costs the output nothing: a warning
    // (gzip's exit status 2), the output kept, whole and checked (it was
    // an error, and a complete output was thrown away: found by a
    // black-box test, two runs given one index, the second refused as
    // "already exists").
    if let Some((path, (index, existed))) = gzip_index {
        if let Err(e) = save_index(path, &index, existed) {
            warnings.push(format!("warning: {e} (the output is whole)"));
        }
    }
    if let Some(meta) = &input_meta {
        sink.copy_metadata(meta);
    }
    if let Some(mtime) = restored_mtime {
        sink.set_modified(mtime);
    }
    // (The input goes only once every part is written.)
    finish(plan, sink, None, first_alone)?;
    if let (Some(at), Some(file), Some(to)) = (members.next_at, &lzop_file, &parts_to) {
        // A second member begins where the first, written, ended: a
        // file of parts, the rest of it written apart.
        let listing = lzop_members(file)?;
        let done = PartsDone {
            names: vec![out_name],
            bytes_in: at,
            bytes_out,
        };
        return unpack_lzop_parts(plan, file, &listing, to, done, threads, force, opts, hooks);
    }
    if first_alone {
        finish_input(plan)?;
    }
    // The cores the decoding used, not the pool's size: a single zstd
    // frame, or a gzip member inflated on one core, says one.
    let used = coded
        .min(threads)
        .max(if plain > 0 { splitter.cores() } else { 0 })
        .max(1);
    let mut summary = Summary::unpacked(
        plan,
        out_name,
        format.name(),
        used,
        (bytes_in, bytes_out),
        started,
    );
    summary.warnings = warnings;
    summary.lzop_parts = parts_count;
    let crc32 = crc.map(crc32fast::Hasher::finalize);
    let header = listed_gzip
        .then(|| cairn_codec::format::gzip::kept(&head))
        .flatten();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    summary.gzip = header.map(|k| GzipListing {
        header_bytes: k.header_len as u64,
        name: (!k.origin.name.is_empty()).then(|| text(&k.origin.name)),
        mtime: k.origin.mtime,
        comment: k.comment.as_deref().map(text),
        crc32,
    });
    Ok(summary)
}

/// Why `--range` cannot be read as asked, before anything is opened.
fn refuse_range(opts: &Options, unpack: &UnpackOptions, inputs: usize) -> Result<()> {
    let why = if inputs != 1 {
        format!("is for one input, but {inputs} were given")
    } else if unpack.mode != UnpackMode::Write {
        "writes bytes: it does not go with -t or -l".into()
    } else if !opts.stdout && opts.output.is_none() {
        "writes a part of the output: name where with -c or -o FILE".into()
    } else {
        return Ok(());
    };
    Err(Error::Range(why))
}

/// Write a byte range of one gzip input's decoded output; the input is
/// kept.
fn range_one(
    plan: &Plan,
    threads: usize,
    force: bool,
    opts: &UnpackOptions,
    range: crate::ByteRange,
    hooks: &dyn Hooks,
) -> Result<Summary> {
    let started = Instant::now();
    let refuse = |why: &str| Error::Range(why.into());
    if matches!(plan.source, Source::Stdin) {
        return Err(refuse("needs the input in a file, not a pipe"));
    }
    let (file, size) = plan.source.open()?;
    hooks.input_mapped();
    if size == Some(0) {
        return Err(CodecError::UnknownFormat.into());
    }
    let data = Input::with_prefix_file(&[], file)
        .mapped_rest()
        .filter(|_| size.is_some())
        .ok_or_else(|| refuse("needs the input in a regular file"))?;
    let format = Format::detect(data.as_slice()).ok_or(CodecError::UnknownFormat)?;
    if format != Format::Gzip {
        return Err(Error::Range(format!("reads gzip input, not {format}")));
    }
    let index = match &opts.gzip_index {
        Some(path) => {
            let (index, existed) = open_index(path, plan, format, size)?;
            let fail = |msg: &str| Error::Index {
                path: path.clone(),
                msg: msg.into(),
            };
            if !existed {
                return Err(fail(
                    "not found; make it first with `cairn unpack -t --index FILE INPUT`",
                ));
            }
            // A range read trusts the windows (docs/format/gzip-index.md):
            // an input changed since the index was made is not read by it.
            if !force && older_than_input(path, plan) {
                return Err(fail(
                    "is older than the input, which may have changed since: \
                     read the input whole with it (`cairn unpack -t --index FILE \
                     INPUT`) to check and renew it, or -f to use it anyway",
                ));
            }
            Some(index)
        }
        None => None,
    };
    let index = index
        .as_ref()
        .map(|i| i.lock().unwrap_or_else(|p| p.into_inner()));
    let mut sink = open_sink(plan, force, false, hooks)?;
    let out_name = sink.name();
    let w = sink.writer();
    let budget = cairn_codec::memlimit::budget(opts.memory);
    let workers = cairn_codec::inflate::Workers::within(threads, budget);
    let stats = read_range(&data, index.as_deref(), range, workers, |b| {
        w.write_all(b).map_err(write_error(&out_name))
    })?;
    sink.commit()?;
    let bytes = (stats.read_to, stats.written);
    Ok(Summary::unpacked(
        plan,
        out_name,
        format.name(),
        threads,
        bytes,
        started,
    ))
}

/// Whether the index at `path` was written before the input was last
/// modified.
fn older_than_input(path: &Path, plan: &Plan) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    match &plan.source {
        Source::File(src) => matches!((modified(src), modified(path)), (Some(i), Some(m)) if i > m),
        Source::Stdin => false,
    }
}

/// Whether two paths name the same file: the same inode if both exist,
/// else the same absolute path once their directories are resolved.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return x.dev() == y.dev() && x.ino() == y.ino();
    }
    let resolved = |p: &Path| -> Option<PathBuf> {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(dir).ok()?.join(p.file_name()?))
    };
    match (resolved(a), resolved(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The checkpoint index at `path` for a gzip input of `size` bytes: read
/// if the file exists, else a new empty one; the flag says whether it
/// existed (only then may saving it replace a file).
fn open_index(
    path: &Path,
    plan: &Plan,
    format: Format,
    size: Option<u64>,
) -> Result<(Arc<Mutex<GzipIndex>>, bool)> {
    let fail = |msg: String| Error::Index {
        path: path.to_path_buf(),
        msg,
    };
    let clash = match (&plan.source, &plan.dest) {
        (Source::File(src), _) if same_file(path, src) => Some("the input"),
        (_, Dest::File(out)) if same_file(path, out) => Some("the output"),
        _ => None,
    };
    if let Some(what) = clash {
        return Err(fail(format!("is {what}; name another file for the index")));
    }
    if format != Format::Gzip {
        return Err(fail(format!("an index is for gzip input, not {format}")));
    }
    let Some(size) = size else {
        return Err(fail(
            "an index needs the input in a file (a pipe is read on one core)".into(),
        ));
    };
    let (index, existed) = match std::fs::read(path) {
        Ok(bytes) => {
            let index = GzipIndex::decode(&bytes).map_err(|e| fail(e.to_string()))?;
            if index.input_len != size {
                return Err(fail(format!(
                    "made for a gzip file of {} bytes, this input has {size}",
                    index.input_len
                )));
            }
            tracing::debug!(path = %path.display(), members = index.members.len(), "index read");
            let mut index = index;
            // Rewritten after a whole read that checked it, so that it is
            // no longer older than the input (which range reads refuse).
            index.changed |= older_than_input(path, plan);
            (index, true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (GzipIndex::new(size), false),
        Err(e) => return Err(fail(e.to_string())),
    };
    Ok((Arc::new(Mutex::new(index)), existed))
}

/// Write the index if decoding added to it, or if there was none: an
/// input decoded on one core (too short to cut) adds nothing, and its
/// index, with no checkpoint, still says so to a range read (which then
/// inflates from the member's start). Whole under a temporary name,
/// synced, then renamed over `path`, which it replaces only if `existed`
/// (then it was read as an index).
fn save_index(path: &Path, index: &Mutex<GzipIndex>, existed: bool) -> Result<()> {
    let index = index.lock().unwrap_or_else(|p| p.into_inner());
    if existed && !index.changed {
        return Ok(());
    }
    let named = |e: Error| Error::Index {
        path: path.to_path_buf(),
        msg: format!("not saved: {e}"),
    };
    // The output's temporary file stays the one a signal removes.
    let file = PendingFile::create(path, existed, &crate::NoHooks).map_err(named)?;
    file.file().write_all(&index.encode()).map_err(|source| {
        named(Error::Write {
            name: path.display().to_string(),
            source,
        })
    })?;
    file.commit_durable().map_err(named)?;
    tracing::debug!(path = %path.display(), members = index.members.len(), "index written");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;
    use crate::{Level, NoHooks};
    use std::path::Path;

    /// The zero-block cache copies an earlier encoding of zeros: that is
    /// right only if an encoder's output depends on nothing but the block,
    /// whatever it encoded before.
    #[test]
    fn zero_blocks_encode_the_same_whatever_came_before() {
        let text: Vec<u8> = (0..300_000u32)
            .map(|i| b"cairn block zero "[(i % 17) as usize] ^ (i / 5000) as u8)
            .collect();
        for format in Format::ALL {
            let (lo, hi) = format.level_range();
            for level in [lo.max(1), format.default_level(), hi] {
                for len in [1usize, 4096, 200_000] {
                    let zeros = vec![0u8; len];
                    let mut fresh = Vec::new();
                    let m1 = format
                        .encoder(level, 256 << 10)
                        .unwrap()
                        .encode(&zeros, &mut fresh)
                        .unwrap();
                    let mut used = format.encoder(level, 256 << 10).unwrap();
                    let mut scratch = Vec::new();
                    used.encode(&text, &mut scratch).unwrap();
                    used.encode(&zeros[..len / 2], &mut scratch).unwrap();
                    let mut again = Vec::new();
                    let m2 = used.encode(&zeros, &mut again).unwrap();
                    assert!(fresh == again, "{format:?} -{level} {len}: bytes differ");
                    assert_eq!(m1, m2, "{format:?} -{level} {len}");
                }
            }
        }
    }

    fn opts(files: &[&Path]) -> Options {
        Options {
            files: files.iter().map(|p| p.to_path_buf()).collect(),
            threads: 2,
            ..Options::default()
        }
    }

    /// (output, input removed) of each input, as planned.
    fn planned(o: &Options, check_only: bool) -> Vec<(Dest, bool)> {
        plan(o, check_only, |p| {
            packed_name(p, Format::Gzip, None, o.force)
        })
        .unwrap()
        .into_iter()
        .map(|(_, p)| p.map(|p| (p.dest, p.remove_input)).unwrap())
        .collect()
    }

    /// Outside QA: a file truncated while it was packed gave a silent
    /// exit 0 and a stream of neither version; now a warning, input kept.
    #[test]
    fn a_file_that_changes_while_packed_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, vec![7u8; 10_000]).unwrap();
        let plan = Plan {
            source: Source::File(f.clone()),
            dest: Dest::Stdout,
            remove_input: true,
            named: false,
            synchronous: false,
            joined: None,
        };
        let before = std::fs::metadata(&f).unwrap();
        assert!(!changed_while_read(&plan, Some(&before), 10_000));
        // Read short (cut while read, then grown back).
        assert!(changed_while_read(&plan, Some(&before), 4_096));
        std::fs::write(&f, vec![7u8; 5_000]).unwrap();
        assert!(changed_while_read(&plan, Some(&before), 10_000));
        std::fs::remove_file(&f).unwrap();
        assert!(changed_while_read(&plan, Some(&before), 10_000));
        // Standard input has no size to compare.
        let stdin = Plan {
            source: Source::Stdin,
            ..plan
        };
        assert!(!changed_while_read(&stdin, None, 1));
    }

    #[test]
    fn inputs_are_removed_only_when_written_to_a_file_of_their_own() {
        // An input must exist for its output to be named.
        let dir = tempfile::tempdir().unwrap();
        let x = &dir.path().join("x");
        std::fs::write(x, b"x").unwrap();
        let file = |s: &str| Dest::File(PathBuf::from(s));
        let file = |s: &str| file(dir.path().join(s).to_str().unwrap_or_default());
        assert_eq!(planned(&opts(&[x]), false), [(file("x.gz"), true)]);
        let keep = Options {
            keep: true,
            ..opts(&[x])
        };
        assert_eq!(planned(&keep, false), [(file("x.gz"), false)]);
        let stdout = Options {
            stdout: true,
            ..opts(&[x])
        };
        assert_eq!(planned(&stdout, false), [(Dest::Stdout, false)]);
        let out = Options {
            output: Some(dir.path().join("y.gz")),
            ..opts(&[x])
        };
        assert_eq!(planned(&out, false), [(file("y.gz"), true)]);
        let dash = Options {
            output: Some("-".into()),
            ..opts(&[x])
        };
        assert_eq!(planned(&dash, false), [(Dest::Stdout, false)]);
        // -t and -l write nothing and keep everything.
        assert_eq!(planned(&opts(&[x]), true), [(Dest::Nowhere, false)]);
        // Stdin is never removed, and goes to stdout unless -o says.
        assert_eq!(planned(&opts(&[]), false), [(Dest::Stdout, false)]);
        let stdin_out = Options {
            output: Some(dir.path().join("y.gz")),
            ..opts(&[Path::new("-")])
        };
        assert_eq!(planned(&stdin_out, false), [(file("y.gz"), false)]);
    }

    #[test]
    fn outputs_are_placed_flat_or_mirrored_and_never_above_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let flat = OutputDir::Flat(d.join("flat"));
        let mirror = OutputDir::Mirror(d.join("mirror"));
        assert_eq!(
            placed(Some(&flat), PathBuf::from("a/b/x.zst")).unwrap(),
            d.join("flat/x.zst")
        );
        assert_eq!(
            placed(Some(&mirror), PathBuf::from("/a/./b/x.zst")).unwrap(),
            d.join("mirror/a/b/x.zst")
        );
        assert!(d.join("mirror/a/b").is_dir() && d.join("flat").is_dir());
        assert!(matches!(
            placed(Some(&mirror), PathBuf::from("a/../../x.zst")),
            Err(Error::OutsideMirror { .. })
        ));
        assert_eq!(
            placed(None, PathBuf::from("x.zst")).unwrap(),
            PathBuf::from("x.zst")
        );
        assert!(compressed_name(Path::new("a.tar.gz")) && !compressed_name(Path::new("a.tar")));
    }

    #[test]
    fn links_are_left_alone_without_force_as_gzip_does() {
        let dir = tempfile::tempdir().unwrap();
        let (file, other, link) = (
            dir.path().join("f"),
            dir.path().join("g"),
            dir.path().join("l"),
        );
        std::fs::write(&file, b"x").unwrap();
        std::fs::hard_link(&file, &other).unwrap();
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let refused = |o: &Options| -> Vec<Option<String>> {
            plan(o, false, |p| packed_name(p, Format::Gzip, None, o.force))
                .unwrap()
                .into_iter()
                .map(|(_, p)| p.err().map(|e| e.to_string()))
                .collect()
        };
        let both = opts(&[&file, &link]);
        let errs = refused(&both);
        assert!(
            errs[0].as_ref().is_some_and(|e| e.contains("1 other link")),
            "{errs:?}"
        );
        assert!(
            errs[1]
                .as_ref()
                .is_some_and(|e| e.contains("symbolic link")),
            "{errs:?}"
        );
        // -k keeps the linked file; a symbolic link stays refused.
        let keep = Options {
            keep: true,
            ..opts(&[&file, &link])
        };
        assert!(matches!(refused(&keep)[..], [None, Some(_)]));
        // -c reads through both, -f takes both.
        let stdout = Options {
            stdout: true,
            ..opts(&[&file, &link])
        };
        assert!(refused(&stdout).iter().all(Option::is_none));
        let force = Options {
            force: true,
            ..opts(&[&file, &link])
        };
        assert!(refused(&force).iter().all(Option::is_none));
    }

    #[test]
    fn conflicting_outputs_are_refused_before_anything_runs() {
        let two = Options {
            output: Some("y.gz".into()),
            ..opts(&[Path::new("a"), Path::new("b")])
        };
        assert!(matches!(
            plan(&two, false, |p| Ok(p.to_path_buf())),
            Err(Error::OneOutputManyInputs(2))
        ));
        let both = Options {
            output: Some("y.gz".into()),
            stdout: true,
            ..opts(&[Path::new("a")])
        };
        assert!(matches!(
            plan(&both, false, |p| Ok(p.to_path_buf())),
            Err(Error::OutputAndStdout)
        ));
    }

    #[test]
    fn levels_a_format_lacks_are_refused() {
        assert_eq!(Level::Best.resolve(Format::Gzip).unwrap(), 12);
        // zstd's bare --fast is its --fast=1.
        assert_eq!(Level::Fast.resolve(Format::Zstd).unwrap(), -1);
        assert_eq!(Level::Fast.resolve(Format::Gzip).unwrap(), 1);
        assert_eq!(Level::Exactly(-5).resolve(Format::Zstd).unwrap(), -5);
        let e = Level::Exactly(13).resolve(Format::Lz4).unwrap_err();
        assert!(e.to_string().contains("lz4 has no level 13"), "{e}");
        assert_eq!(Level::Best.resolve(Format::Lz4).unwrap(), 12);
        let e = Level::Exactly(10).resolve(Format::Xz).unwrap_err();
        assert!(e.to_string().contains("its levels are 0..=9"), "{e}");
    }

    #[test]
    fn a_multi_file_run_goes_on_after_a_bad_file_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        let data = b"cairn filepack test data ".repeat(10_000);
        for name in ["a", "c"] {
            std::fs::write(path(name), &data).unwrap();
        }
        let packed = pack(
            &opts(&[&path("a"), &path("c")]),
            &PackOptions {
                format: Some(Format::Zstd),
                ..PackOptions::default()
            },
            &NoHooks,
        )
        .unwrap();
        packed.outcome.unwrap();
        assert_eq!(packed.summaries.len(), 2);
        assert!(!path("a").exists() && path("a.zst").exists());
        // b.zst is not zstd; noext has no suffix to take off.
        std::fs::write(path("b.zst"), b"not compressed at all").unwrap();
        std::fs::write(path("noext"), b"x").unwrap();
        let inputs = ["a.zst", "b.zst", "noext", "c.zst"].map(path);
        let inputs: Vec<&Path> = inputs.iter().map(PathBuf::as_path).collect();

        /// Counts the failures reported as they happen.
        #[derive(Default)]
        struct Failures(std::sync::Mutex<Vec<String>>);
        impl Hooks for Failures {
            fn input_failed(&self, error: &Error) {
                self.0.lock().unwrap().push(error.to_string());
            }
        }
        let hooks = Failures::default();
        let run = unpack(&opts(&inputs), &UnpackOptions::default(), &hooks).unwrap();
        assert_eq!(run.summaries.len(), 2);
        assert_eq!(std::fs::read(path("a")).unwrap(), data);
        assert_eq!(std::fs::read(path("c")).unwrap(), data);
        // Bad inputs stay; good ones are removed.
        assert!(path("b.zst").exists() && path("noext").exists());
        assert!(!path("a.zst").exists() && !path("c.zst").exists());
        let reported = hooks.0.into_inner().unwrap();
        assert_eq!(reported.len(), 2, "{reported:?}");
        assert!(reported[1].contains("unknown suffix"), "{reported:?}");
        match run.outcome {
            Err(Error::Failed {
                failed, total: 4, ..
            }) => {
                assert_eq!(
                    failed,
                    [inputs[1], inputs[2]].map(|p| p.display().to_string())
                )
            }
            other => panic!("{other:?}"),
        }
        // Nothing half-written is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
    }

    #[test]
    fn inputs_the_hooks_pass_over_are_said_but_not_failed() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("a"), b"a").unwrap();
        std::fs::write(path("b"), b"b").unwrap();
        std::fs::write(path("c.zst"), b"not zstd").unwrap();

        /// Passes over names with no suffix to take off, and counts what
        /// it is told.
        #[derive(Default)]
        struct PassOver(std::sync::Mutex<usize>);
        impl Hooks for PassOver {
            fn input_failed(&self, _error: &Error) {
                *self.0.lock().unwrap() += 1;
            }
            fn passes_over(&self, error: &Error) -> bool {
                matches!(error.inner(), Error::UnknownSuffix)
            }
        }
        let unpack_all = |names: &[&str]| {
            let inputs: Vec<PathBuf> = names.iter().map(|n| path(n)).collect();
            let inputs: Vec<&Path> = inputs.iter().map(PathBuf::as_path).collect();
            let hooks = PassOver::default();
            let run = unpack(&opts(&inputs), &UnpackOptions::default(), &hooks).unwrap();
            (run, hooks.0.into_inner().unwrap())
        };
        // Every input passed over: said, nothing failed, and the run knows.
        let (run, said) = unpack_all(&["a", "b"]);
        assert_eq!(said, 2);
        assert!(run.outcome.is_ok() && run.all_passed_over, "{run:?}");
        // One passed over, one failed: only the failure is counted, and the
        // run is judged by it alone (an error, not a warning).
        let (run, said) = unpack_all(&["a", "c.zst"]);
        assert_eq!(said, 2);
        assert!(!run.all_passed_over);
        match run.outcome {
            Err(
                ref e @ Error::Failed {
                    ref failed,
                    total: 2,
                    ..
                },
            ) => {
                assert_eq!(*failed, [path("c.zst").display().to_string()]);
                assert!(!e.is_warning() && e.is_data_error(), "{e:?}");
            }
            other => panic!("{other:?}"),
        }
        // One input: its error is the run's, for the caller to judge.
        let (run, said) = unpack_all(&["a"]);
        assert_eq!(said, 0);
        assert!(!run.all_passed_over);
        assert!(matches!(run.outcome, Err(ref e) if matches!(e.inner(), Error::UnknownSuffix)));
        assert!(path("a").exists() && path("b").exists() && path("c.zst").exists());
    }

    #[test]
    fn an_existing_output_is_kept_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let (a, gz) = (dir.path().join("a"), dir.path().join("a.gz"));
        std::fs::write(&a, b"new").unwrap();
        std::fs::write(&gz, b"old").unwrap();
        let run = pack(&opts(&[&a]), &PackOptions::default(), &NoHooks).unwrap();
        assert!(matches!(
            run.outcome,
            Err(Error::Input { ref source, .. }) if matches!(**source, Error::Exists { .. })
        ));
        assert_eq!(std::fs::read(&gz).unwrap(), b"old");
        assert!(a.exists());
        let forced = Options {
            force: true,
            ..opts(&[&a])
        };
        pack(&forced, &PackOptions::default(), &NoHooks)
            .unwrap()
            .outcome
            .unwrap();
        assert!(!a.exists());
        assert_ne!(std::fs::read(&gz).unwrap(), b"old");
    }

    /// An input with no known suffix whose data cannot be read says why
    /// (as xz says "Permission denied", status 1), not that its suffix is
    /// unknown. A directory opens but fails to read.
    #[test]
    fn an_unreadable_unnamed_input_says_why() {
        let dir = tempfile::tempdir().unwrap();
        match unnamed_input_error(dir.path(), &UnpackOptions::default()) {
            Error::Open { path, source } => {
                assert_eq!(path, dir.path());
                assert_eq!(source.raw_os_error(), Some(libc::EISDIR), "{source}");
            }
            other => panic!("{other}"),
        }
    }
}
