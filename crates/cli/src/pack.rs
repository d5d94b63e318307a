//! `cairn pack` and `cairn unpack`: flags into the file engine's options
//! (cairn-filepack does the work), progress bars, summaries and `-l`
//! tables out.

use crate::report::{summary_line, Progress};
use crate::{CommonArgs, DecodeArgs, PackArgs, UnpackArgs};
use anyhow::Result;
use cairn_filepack::{
    EmptyInput, Error, Hooks, Level, Links, MissingInput, Operation, Options, OutputDir,
    PackOptions, Run, SpecialModes, Summary, UnpackMode, UnpackOptions,
};
use serde::Serialize;
use std::path::Path;

/// The binary's side of the engine: progress bars on a terminal, the
/// signal handlers that remove a temporary output when cairn is killed,
/// and errors of a multi-file run printed as they happen.
pub(crate) struct EngineHooks {
    /// Draw a progress bar (on stderr, and only if it is a terminal).
    pub progress: bool,
    /// Draw it even where stderr is no terminal (`--progress`).
    pub force_progress: bool,
    /// Say no notes (`-q`).
    pub quiet: bool,
    /// The tool cairn runs as, if a link: what its `-q` hides
    /// ([`crate::Tool::quiet_hides`]) and what it passes over
    /// ([`crate::Tool::ignores`]).
    pub tool: Option<crate::Tool>,
}

impl EngineHooks {
    /// No bar, no notes: for a file written outside the pack engine
    /// (a restore's output, removed if cairn is killed).
    pub(crate) fn silent() -> Self {
        EngineHooks {
            progress: false,
            force_progress: false,
            quiet: true,
            tool: None,
        }
    }

    /// Whether what is said of `error` is hidden by `-q`.
    fn hides(&self, error: &Error) -> bool {
        self.quiet && self.tool.is_some_and(|t| t.quiet_hides(error))
    }

    /// Whether `error` is no failure at all.
    fn ignores(&self, error: &Error) -> bool {
        self.tool.is_some_and(|t| t.ignores(error, self.quiet))
    }
}

impl Hooks for EngineHooks {
    fn progress(
        &self,
        operation: Operation,
        total: Option<u64>,
    ) -> Box<dyn cairn_filepack::Progress + '_> {
        Box::new(Progress::with_force(
            operation.as_str(),
            total,
            self.progress,
            self.force_progress,
        ))
    }
    fn temp_created(&self, path: &Path) {
        crate::signals::register(path);
    }
    fn temp_gone(&self) {
        crate::signals::unregister();
    }
    fn input_mapped(&self) {
        crate::signals::guard_mapped_input();
    }
    fn input_failed(&self, error: &Error) {
        if !self.hides(error) {
            errln!("{}", crate::error_line(error));
        }
    }
    fn passes_over(&self, error: &Error) -> bool {
        self.ignores(error)
    }
    fn note_run(&self, message: &str) {
        if !self.quiet {
            errln!("{}: {message}", crate::prog());
        }
    }
    fn note(&self, input: &Path, message: &str) {
        if !self.quiet {
            errln!("{}: {}: {message}", crate::prog(), input.display());
        }
    }
}

/// The inputs named: on the command line, then in each --filelist.
fn inputs(common: &CommonArgs) -> Result<Vec<std::path::PathBuf>> {
    let mut files = common.files.clone();
    for list in &common.filelist {
        files.extend(names_in(list)?);
    }
    Ok(files)
}

fn options(common: &CommonArgs) -> Result<Options> {
    Ok(Options {
        files: inputs(common)?,
        output: common.output.clone(),
        stdout: common.stdout,
        keep: common.keep,
        force: common.force,
        threads: if common.single_thread {
            1
        } else {
            common.threads.unwrap_or(0)
        },
        suffix: common.suffix.clone(),
        recursive: common.recursive,
        synchronous: common.synchronous,
        // bzip2 unpacks a name it cannot guess from into NAME.out.
        unknown_suffix_out: crate::Tool::invoked() == crate::Tool::Bzip2,
        name_before_input: crate::Tool::invoked() == crate::Tool::Zstd,
        // gzip (and cairn) and pigz unpack x.gz for a missing x.
        missing_input: match crate::Tool::invoked() {
            crate::Tool::Gzip => MissingInput::AsGzip,
            crate::Tool::Pigz => MissingInput::LookedForAsGzip,
            _ => MissingInput::AsGiven,
        },
        // xz reads an input before it looks at its name.
        data_before_name: crate::Tool::invoked() == crate::Tool::Xz,
        // pigz, zstd, lz4 and lzop pack a file with other links (and
        // remove this name with --rm).
        allow_linked: matches!(
            crate::Tool::invoked(),
            crate::Tool::Pigz | crate::Tool::Zstd | crate::Tool::Lz4 | crate::Tool::Lzop
        ),
        // A set-ID or sticky file: gzip leaves it alone even with -f, xz
        // (and cairn) without; the others pack it (never their output's
        // mode).
        special_modes: match crate::Tool::link() {
            Some(crate::Tool::Gzip) => SpecialModes::Refused,
            None | Some(crate::Tool::Xz) => SpecialModes::RefusedUnlessForced,
            Some(_) => SpecialModes::Taken,
        },
        symlink_warns: crate::Tool::invoked() == crate::Tool::Xz,
        // zstd passes over a link even to stdout or tested; lz4 and
        // lzop read through one, named or met by -r.
        links: match crate::Tool::link() {
            Some(crate::Tool::Zstd) => Links::Never,
            Some(crate::Tool::Lz4 | crate::Tool::Lzop) => Links::Always,
            _ => Links::WhereNamed,
        },
        output_dir: match (&common.output_dir_flat, &common.output_dir_mirror) {
            (Some(dir), _) => Some(OutputDir::Flat(dir.clone())),
            (None, Some(dir)) => Some(OutputDir::Mirror(dir.clone())),
            (None, None) => None,
        },
        exclude_compressed: common.exclude_compressed,
        // zstd packs x.zst into x.zst.zst (and lz4 x.lz4, when told to
        // pack: it decodes a .lz4 by default); gzip leaves it alone.
        pack_suffixed: matches!(
            crate::Tool::link(),
            Some(crate::Tool::Zstd | crate::Tool::Lz4)
        ),
        // xz, bzip2 and lzop leave x.xz alone even with -f.
        suffixed_despite_force: matches!(
            crate::Tool::link(),
            Some(crate::Tool::Xz | crate::Tool::Bzip2 | crate::Tool::Lzop)
        ),
        // lzop -o writes several inputs into one output unforced.
        joins_unforced: crate::Tool::link() == Some(crate::Tool::Lzop),
        // zstd -dr says "unknown suffix" of a plain file in the tree.
        walk_reports_unnamed: crate::Tool::link() == Some(crate::Tool::Zstd),
        name: flag_pair(common.name, common.no_name),
        time: flag_pair(common.time, common.no_time),
    })
}

/// `--train`: a zstd dictionary of at most `--maxdict` bytes trained on
/// the files named (each file one sample, the files under a directory
/// with -r), written to -o or `dictionary`, as `zstd --train` does it
/// (zstd's trainer; status 14 where zstd's training fails).
fn train(args: &PackArgs) -> Result<()> {
    let common = &args.common;
    let mut files = inputs(common)?;
    files.reverse();
    let mut samples = Vec::new();
    while let Some(path) = files.pop() {
        let read = |e: std::io::Error| anyhow::anyhow!("--train {}: {e}", path.display());
        if common.recursive && std::fs::metadata(&path).map_err(read)?.is_dir() {
            for entry in std::fs::read_dir(&path).map_err(read)? {
                files.push(entry.map_err(read)?.path());
            }
            continue;
        }
        samples.push(std::fs::read(&path).map_err(read)?);
    }
    let dictionary = match cairn_codec::format::zstd::Dictionary::train(&samples, args.maxdict) {
        Ok(d) => d,
        Err(e) => {
            errln!("{}: {e}", crate::prog());
            return Err(crate::Warned(14).into());
        }
    };
    let dictionary = dictionary.bytes();
    let out = common
        .output
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("dictionary"));
    std::fs::write(&out, dictionary).map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))?;
    if !common.quiet {
        errln!(
            "Save dictionary of size {} into file {}",
            dictionary.len(),
            out.display()
        );
    }
    Ok(())
}

/// The zstd dictionary `-D` names, read whole.
fn dictionary(common: &CommonArgs) -> Result<Option<cairn_codec::format::zstd::Dictionary>> {
    let Some(path) = &common.dict else {
        return Ok(None);
    };
    let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("-D {}: {e}", path.display()))?;
    Ok(Some(cairn_codec::format::zstd::Dictionary::new(bytes)))
}

/// The file names in `list`, one per line, as zstd's --filelist reads
/// them: a line is a name as it is (bytes, spaces kept), an empty line
/// none.
fn names_in(list: &Path) -> Result<Vec<std::path::PathBuf>> {
    use std::os::unix::ffi::OsStrExt;
    let bytes =
        std::fs::read(list).map_err(|e| anyhow::anyhow!("--filelist {}: {e}", list.display()))?;
    Ok(bytes
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .filter(|line| !line.is_empty())
        .map(|line| std::ffi::OsStr::from_bytes(line).into())
        .collect())
}

/// A flag and its negation (`--sparse`, `--no-sparse`): which was given.
fn flag_pair(yes: bool, no: bool) -> Option<bool> {
    match (yes, no) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    }
}

fn hooks(common: &CommonArgs) -> EngineHooks {
    EngineHooks {
        // Under a tool's name, none (the tools draw none by default, and
        // a bar between the output lines a terminal shows was found to
        // erase them).
        progress: common.progress
            || !common.quiet && !common.no_progress && !common.json && !crate::invoked_as_link(),
        force_progress: common.progress,
        quiet: common.quiet,
        tool: crate::Tool::link(),
    }
}

pub fn pack(args: &PackArgs) -> Result<()> {
    if args.license {
        outln!(
            "cairn {}\nLicensed under the GNU General Public License, version 2 or later.\n\
             No warranty is provided or implied.",
            env!("CARGO_PKG_VERSION")
        );
        return Ok(());
    }
    if args.train {
        return train(args);
    }
    if args.decompress || args.decode.test || args.decode.list {
        return unpack_files(&args.decode, &args.common);
    }
    let level = if args.best {
        Level::Best
    } else if let Some(fast) = args.fast {
        // zstd's --fast=N is level -N; a bare --fast is level 1.
        // (A level past i32 is refused as the format's range says.)
        fast.map_or(Level::Fast, |n| {
            Level::Exactly(i32::try_from(n).map_or(i32::MIN, |n| -n))
        })
    } else {
        args.level.map_or(Level::Default, Level::Exactly)
    };
    let format = args.format.as_deref().map(str::parse).transpose()?;
    // bzip2's -s packs in 200k blocks (level 2) unless a level is given.
    let level = match (level, format) {
        (Level::Default, Some(cairn_codec::Format::Bzip2)) if args.small => Level::Exactly(2),
        (level, _) => level,
    };
    let level = zstd_level_as_zstd(level, args.ultra);
    let pack = PackOptions {
        format,
        level,
        // zstd raises a job size below its least (ZSTDMT_JOBSIZE_MIN) to
        // it: so does the zstd link (`cairn pack -B` takes any size).
        block: args.block.or(args.block_bytes.filter(|&b| b > 0).map(|b| {
            match crate::Tool::link() == Some(crate::Tool::Zstd) {
                true => b.max(ZSTD_JOB_SIZE_MIN),
                false => b,
            }
        })),
        encode: cairn_codec::EncodeOptions {
            long: args.decode.long,
            extreme: args.extreme,
            check: match args.check {
                _ if args.no_check => cairn_codec::IntegrityCheck::None,
                Some(Some(c)) => c,
                _ => cairn_codec::IntegrityCheck::Default,
            },
            legacy: args.legacy,
            favor_dec_speed: args.favor_dec_speed,
            filters: args.filters,
            zstd_dictionary: dictionary(&args.common)?,
            zstd_no_dict_id: args.common.no_dict_id,
            zstd_tuning: zstd_tuning(args)?,
            gzip_comment: args
                .comment
                .as_ref()
                .map(|c| std::os::unix::ffi::OsStrExt::as_bytes(c.as_os_str()).to_vec()),
        },
        rsyncable: args.rsyncable,
        memlimit: args.memlimit_compress.map(|m| m as u64),
        no_adjust: args.no_adjust,
    };
    let common = &args.common;
    let hooks = hooks(common);
    let mut options = options(common)?;
    // lzop keeps the name and time whatever -n and -N say (they are for
    // unpacking).
    if crate::Tool::link() == Some(crate::Tool::Lzop) {
        (options.name, options.time) = (None, None);
    }
    let run = cairn_filepack::pack(&options, &pack, &hooks)?;
    emit(common, &hooks, run, false)
}

/// The least job size zstd takes (`-B`; ZSTDMT_JOBSIZE_MIN): a smaller
/// one is raised to it, as `zstd -B1` is `zstd -B512K`.
const ZSTD_JOB_SIZE_MIN: usize = 512 << 10;

/// Under the zstd link, a level above zstd's highest is lowered to it with
/// zstd's warning: 19, or 22 with `--ultra` (`ZSTD_CLEVEL=100`, `zstd
/// -20`). cairn itself refuses a level a format lacks.
/// zstd's `--zstd=` parameters and frame options, as given.
fn zstd_tuning(args: &PackArgs) -> Result<cairn_codec::format::zstd::Tuning> {
    let mut tuning = cairn_codec::format::zstd::Tuning {
        no_content_size: args.no_content_size,
        row_match_finder: flag_pair(args.row_match_finder, args.no_row_match_finder),
        target_block: match args.target_compressed_block_size {
            Some(n) => u32::try_from(n).map_err(|_| {
                anyhow::anyhow!("--target-compressed-block-size={n}: too large for zstd")
            })?,
            None => 0,
        },
        ..Default::default()
    };
    for list in &args.zstd_params {
        tuning.add_params(list).map_err(anyhow::Error::msg)?;
    }
    Ok(tuning)
}

fn zstd_level_as_zstd(level: Level, ultra: bool) -> Level {
    let highest = if ultra { 22 } else { 19 };
    match level {
        Level::Exactly(n) if n > highest && crate::Tool::link() == Some(crate::Tool::Zstd) => {
            errln!("Warning : compression level higher than max, reduced to {highest} ");
            Level::Exactly(highest)
        }
        level => level,
    }
}

pub fn unpack(args: &UnpackArgs) -> Result<()> {
    unpack_files(&args.decode, &args.common)
}

/// `cairn unpack` and `cairn pack -d`: decode, test (`-t`) or list (`-l`).
fn unpack_files(decode: &DecodeArgs, common: &CommonArgs) -> Result<()> {
    let mode = if decode.list {
        UnpackMode::List
    } else if decode.test {
        UnpackMode::Test
    } else {
        UnpackMode::Write
    };
    // `zstd -l` reads the frames' headers, as zstd does.
    if mode == UnpackMode::List && !common.json && crate::Tool::link() == Some(crate::Tool::Zstd) {
        return list_as_zstd(&common.files);
    }
    // `lz4 --list` reads the frame and block headers, as lz4 does.
    if mode == UnpackMode::List && !common.json && crate::Tool::link() == Some(crate::Tool::Lz4) {
        return crate::lz4::list(&common.files, common.verbose > 0);
    }
    // `lzop -l` reads the headers and block sizes, as lzop does.
    if mode == UnpackMode::List && !common.json && crate::Tool::link() == Some(crate::Tool::Lzop) {
        return crate::lzop::list(common);
    }
    // `xz -l` reads the streams' indexes, as xz does (-v: each stream
    // and block; -vv's block headers are not read: -v's tables then).
    if mode == UnpackMode::List && !common.json && crate::Tool::link() == Some(crate::Tool::Xz) {
        return list_as_xz(&common.files, decode.robot, common.verbose > 0);
    }
    let memory = decode.memory.map(|m| m as u64);
    let unpack = UnpackOptions {
        mode,
        zstd_dictionary: dictionary(common)?,
        // As zstd: -M bounds the window too, --long sets it outright.
        zstd_window_log_max: decode.long.or(memory.map(window_log_within)),
        gzip_index: decode.index.clone(),
        range: decode.range,
        memory,
        single_stream: decode.single_stream,
        ignore_check: decode.ignore_check,
        // gzip's and pigz's -lv columns show it.
        list_crc: decode.list_as_gzip && common.verbose > 0,
        lzop_parts: crate::Tool::link() == Some(crate::Tool::Lzop),
        // xz's --format (and unlzma's and lzcat's .lzma) narrows the xz
        // link's formats, xz and .lzma; any other link reads its tool's.
        formats: match decode.xz_format {
            Some(f) => Some(f.formats()),
            None => crate::Tool::formats_of_link(),
        },
        sparse: flag_pair(decode.sparse, decode.no_sparse),
        // gzip -tf passes what gzip -dcf would copy (not pigz -tf).
        force_test_passes_unknown: matches!(crate::prog(), "gzip" | "gunzip" | "zcat"),
        pass_through: flag_pair(decode.pass_through, decode.no_pass_through),
        empty: match crate::Tool::link() {
            Some(crate::Tool::Zstd | crate::Tool::Bzip2) => EmptyInput::Truncated,
            Some(crate::Tool::Lz4) => EmptyInput::Nothing,
            _ => EmptyInput::Unknown,
        },
    };
    let hooks = hooks(common);
    let mut options = options(common)?;
    // lzop gives what it unpacks the time its header keeps, unless
    // --no-time (and the name it keeps with -N).
    if crate::Tool::link() == Some(crate::Tool::Lzop) {
        options.time = Some(!common.no_time);
    }
    let run = cairn_filepack::unpack(&options, &unpack, &hooks)?;
    if mode == UnpackMode::List {
        if decode.list_as_gzip && !common.json {
            match crate::Tool::invoked() {
                crate::Tool::Pigz => list_as_pigz(common, &run.summaries),
                _ => list_as_gzip(common, &run.summaries),
            }
        } else {
            list(common, &run.summaries)?;
        }
        return Ok(run.outcome?);
    }
    emit(common, &hooks, run, mode == UnpackMode::Test)
}

/// One summary as a JSON object, several as an array.
fn to_json<T: Serialize>(items: &[T]) -> Result<String> {
    Ok(match items {
        [one] => serde_json::to_string_pretty(one)?,
        _ => serde_json::to_string_pretty(items)?,
    })
}

/// Print the summaries `--json` and `-v` ask for, then the run's outcome.
fn emit(common: &CommonArgs, hooks: &EngineHooks, run: Run, testing: bool) -> Result<()> {
    if common.json {
        let text = to_json(&run.summaries)?;
        if run.data_on_stdout {
            errln!("{text}");
        } else {
            outln!("{text}");
        }
    }
    if crate::Tool::link() == Some(crate::Tool::Lzop) {
        crate::lzop::said_of(common, testing, &run.summaries);
    } else if common.verbose > 0 {
        for s in &run.summaries {
            errln!("{}", summary_line(s));
        }
    }
    // An input left alone (no known suffix, an output in the way...) is
    // said as an error is, with gzip's exit status 2 when that is all.
    let tool = crate::Tool::invoked();
    // Inputs passed over are no failure (gzip's names with the suffix
    // already, or with none under -q); zstd fails when that was all.
    if run.all_passed_over && tool.fails_when_all_ignored() && named_only_links(common) {
        return no_input_left();
    }
    match run.outcome {
        Err(e) if hooks.ignores(&e) => {
            if !hooks.hides(&e) {
                errln!("{}", crate::error_line(&e));
            }
            if tool.fails_when_all_ignored() && named_only_links(common) {
                return no_input_left();
            }
        }
        Err(e) if e.is_warning() => {
            if !hooks.hides(&e) {
                errln!("{}", crate::error_line(&e));
            }
            return warned(common, tool.warning_status(Some(&e)));
        }
        // pigz -q says nothing, not even of an error.
        Err(e) if hooks.hides(&e) => return Err(crate::Warned(tool.error_status(&e.into())).into()),
        outcome => outcome?,
    }
    // gzip's warnings: said unless -q, and the exit status is 2 (pigz
    // stops at trailing garbage without a word, status 0).
    let mut warned = false;
    for s in &run.summaries {
        for w in &s.warnings {
            warned = true;
            if !common.quiet && tool != crate::Tool::Pigz {
                errln!("{}: {}: {w}", crate::prog(), tool.input_name(&s.input));
            }
        }
    }
    if warned {
        return self::warned(common, crate::Tool::invoked().warning_status(None));
    }
    Ok(())
}

/// Whether every input named on the command line is a symbolic link:
/// zstd fails with no input left when those it counts, the names given
/// (not the files -r meets under a directory), were all passed over.
fn named_only_links(common: &CommonArgs) -> bool {
    !common.files.is_empty()
        && common
            .files
            .iter()
            .all(|f| std::fs::symlink_metadata(f).is_ok_and(|m| m.file_type().is_symlink()))
}

/// The end of a run whose every named input was passed over, where the
/// tool fails for it without another word (zstd: status 1; with -r, which
/// it counts before it walks the directories, 0).
fn no_input_left() -> Result<()> {
    Err(crate::Warned(1).into())
}

/// The end of a run that warned with exit status `status`: none with
/// -Q (xz's --no-warn) where the status is a warning's 2.
fn warned(common: &CommonArgs, status: u8) -> Result<()> {
    if common.no_warn && status == 2 {
        return Ok(());
    }
    Err(crate::Warned(status).into())
}

/// One input as `-l` lists it.
#[derive(Serialize)]
struct Listed<'a> {
    format: &'a str,
    compressed: u64,
    uncompressed: u64,
    /// Compressed size over uncompressed size, as in every summary.
    ratio: f64,
    name: &'a str,
}

/// `-l` as gzip prints it (cairn run as gzip, gunzip or zcat), for the
/// scripts that read its columns: compressed and uncompressed bytes, the
/// space saved and the name without its suffix (with -N, the name the
/// header keeps), a totals line for several inputs, no header and no
/// totals with -q; -v puts the method, the CRC and the input's date (with
/// -N, the date kept) in front. The uncompressed size is what the input decodes to, and the CRC
/// that of all of it (gzip takes the last member's fields, wrong for
/// several members and past 4 GiB).
fn list_as_gzip(common: &CommonArgs, summaries: &[Summary]) {
    // Nothing listed, no header and no totals (gzip prints its header
    // with the first input it lists).
    if summaries.is_empty() {
        return;
    }
    let verbose = common.verbose > 0;
    if !common.quiet {
        let columns = if verbose {
            "method  crc     date  time  "
        } else {
            ""
        };
        outln!("{columns}         compressed        uncompressed  ratio uncompressed_name");
    }
    // gzip's ratio leaves out the header and trailer (of the last file
    // listed, in the totals).
    let line = |front: &str, compressed: u64, uncompressed: u64, framing: u64, name: &str| {
        let saved = uncompressed as f64 - compressed.saturating_sub(framing) as f64;
        let ratio = if uncompressed == 0 {
            0.0
        } else {
            100.0 * saved / uncompressed as f64
        };
        outln!("{front}{compressed:>19} {uncompressed:>19} {ratio:>5.1}% {name}");
    };
    for s in summaries {
        // With -N, the name and time the header keeps (the name's last
        // part, in the input's directory).
        let kept = s.gzip.as_ref().filter(|_| common.name);
        let kept_name = kept
            .and_then(|g| g.name.as_deref())
            .and_then(|n| n.rsplit('/').next())
            .filter(|n| !n.is_empty());
        let name = match kept_name {
            Some(n) if s.input == STDIN => n.to_string(),
            Some(n) => Path::new(&s.input).with_file_name(n).display().to_string(),
            // Standard input is listed as gzip names it.
            None if s.input == STDIN => "stdout".to_string(),
            None => unpacked_name(common, s),
        };
        let front = match (&s.gzip, verbose) {
            (Some(g), true) => {
                // Else the input's own time, or now for a pipe.
                let secs = match kept.map(|g| g.mtime) {
                    Some(t) if t != 0 => i64::from(t),
                    _ => input_mtime(&s.input),
                };
                let crc = g.crc32.unwrap_or_default();
                format!("defla {crc:08x} {} ", listed_time(secs, false))
            }
            (None, true) => " ".repeat(GZIP_FRONT),
            (_, false) => String::new(),
        };
        line(&front, s.bytes_in, s.bytes_out, framing(s), &name);
    }
    // Totals of what was listed, when several inputs were named (even if
    // some could not be listed), not with -q: as gzip does.
    if common.files.len() > 1 && !common.quiet {
        let compressed = summaries.iter().map(|s| s.bytes_in).sum();
        let uncompressed = summaries.iter().map(|s| s.bytes_out).sum();
        let framing = summaries.last().map_or(0, framing);
        let front = " ".repeat(if verbose { GZIP_FRONT } else { 0 });
        line(&front, compressed, uncompressed, framing, "(totals)");
    }
}

/// `-l` as pigz prints it (cairn run as pigz): deflate bytes (the file
/// less its header and trailer), uncompressed bytes, the space saved and
/// the name the header keeps (else the input's without its suffix,
/// `<stdin>` for a pipe), cut to 48 characters; no totals, nothing at all
/// with -q; -v puts the method, the CRC and the time kept in front (and
/// cuts the name to 16, and prints the comment the header keeps after
/// its line). Sizes and CRC are of the whole output, as for gzip -l.
fn list_as_pigz(common: &CommonArgs, summaries: &[Summary]) {
    if common.quiet {
        return;
    }
    let verbose = common.verbose > 0;
    if !summaries.is_empty() {
        let columns = if verbose {
            "method    check    timestamp    "
        } else {
            ""
        };
        outln!("{columns}compressed   original reduced  name");
    }
    for s in summaries {
        let kept = s.gzip.as_ref().and_then(|g| g.name.clone());
        let name = match kept {
            Some(name) => name,
            None if s.input == STDIN => "<stdin>".to_string(),
            None => unpacked_name(common, s),
        };
        let most = if verbose { 16 } else { 48 };
        let name = match name.char_indices().nth(most) {
            Some(_) => format!("{}...", name.chars().take(most - 3).collect::<String>()),
            None => name,
        };
        let front = match (&s.gzip, verbose) {
            (Some(g), true) => {
                let time = match g.mtime {
                    0 => "------ -----".to_string(),
                    t => listed_time(i64::from(t), true),
                };
                let crc = g.crc32.unwrap_or_default();
                format!("gzip 8  {crc:08x}  {time}  ")
            }
            (None, true) => " ".repeat(PIGZ_FRONT),
            (_, false) => String::new(),
        };
        let compressed = s.bytes_in.saturating_sub(framing(s));
        let len = s.bytes_out;
        // pigz's test for deflate data that cannot be this input's.
        if compressed > len + (len >> 10) + 12 {
            outln!("{front}{compressed:>10} {len:>10}?  unk    {name}");
        } else {
            let reduced = 100.0 * (len as f64 - compressed as f64) / len as f64;
            outln!("{front}{compressed:>10} {len:>10} {reduced:>6.1}%  {name}");
        }
        // -v: the comment the header keeps, on a line of its own.
        if let Some(comment) = s
            .gzip
            .as_ref()
            .and_then(|g| g.comment.as_ref())
            .filter(|_| verbose)
        {
            outln!("{comment}");
        }
    }
}

/// How the engine names standard input.
const STDIN: &str = cairn_filepack::STDIN_NAME;

/// Width of the columns -v puts in front of gzip's and pigz's listings
/// ("method  crc     date  time  ", "method    check    timestamp    ").
const GZIP_FRONT: usize = 28;
const PIGZ_FRONT: usize = 32;

/// A listed input's name without its suffix, as gzip names its output;
/// the input's own name where it has no suffix gzip knows.
fn unpacked_name(common: &CommonArgs, s: &Summary) -> String {
    cairn_filepack::unpacked_name(Path::new(&s.input), common.suffix.as_deref())
        .map_or_else(|_| s.input.clone(), |p| p.display().to_string())
}

/// The bytes of a gzip input that are not deflate data (its first
/// member's header and the last's 8-byte trailer), which gzip's and
/// pigz's listings leave out; 0 when the header was not read whole.
fn framing(s: &Summary) -> u64 {
    s.gzip.as_ref().map_or(0, |g| g.header_bytes + 8)
}

/// The modification time of a listed input (of standard input's file,
/// or now for a pipe), as gzip -lv shows it.
fn input_mtime(input: &str) -> i64 {
    let path = if input == STDIN { "/dev/stdin" } else { input };
    let modified = std::fs::metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .and_then(|m| m.modified().ok())
        .unwrap_or_else(std::time::SystemTime::now);
    match modified.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

/// `secs` in local time as ctime(3) writes it from the month to the
/// minute, "Jun 30 21:49", as gzip -lv shows it; `year_if_old`: as
/// pigz -lv, "Jun 30  1993" for a time not in this year.
fn listed_time(secs: i64, year_if_old: bool) -> String {
    use chrono::{Datelike, Local, TimeZone};
    let Some(t) = Local.timestamp_opt(secs, 0).earliest() else {
        return "??? ?? ??:??".to_string();
    };
    if year_if_old && t.year() != Local::now().year() {
        t.format("%b %e  %Y").to_string()
    } else {
        t.format("%b %e %H:%M").to_string()
    }
}

/// `path` opened for a listing to read (again), with its length, if it
/// is a regular file: a FIFO is looked at, never opened (its open would
/// wait for a writer, and what it held was read already).
pub(crate) fn open_regular(path: &Path) -> Option<(std::fs::File, u64)> {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    Some((f, len))
}

/// `-l`: a line per input, as `gzip -l` and `zstd -l` print, or JSON.
fn list(common: &CommonArgs, summaries: &[Summary]) -> Result<()> {
    let listed: Vec<Listed> = summaries
        .iter()
        .map(|s| Listed {
            format: &s.format,
            compressed: s.bytes_in,
            uncompressed: s.bytes_out,
            ratio: s.ratio,
            name: &s.input,
        })
        .collect();
    if common.json {
        outln!("{}", to_json(&listed)?);
        return Ok(());
    }
    outln!(
        "{:<6} {:>15} {:>15} {:>6}  name",
        "format",
        "compressed",
        "uncompressed",
        "ratio"
    );
    let line = |l: &Listed| {
        outln!(
            "{:<6} {:>15} {:>15} {:>6.3}  {}",
            l.format,
            l.compressed,
            l.uncompressed,
            l.ratio,
            l.name
        )
    };
    listed.iter().for_each(line);
    // Several inputs end with their totals, as in gzip -l.
    if listed.len() > 1 {
        let compressed = listed.iter().map(|l| l.compressed).sum();
        let uncompressed: u64 = listed.iter().map(|l| l.uncompressed).sum();
        line(&Listed {
            format: "",
            compressed,
            uncompressed,
            ratio: if uncompressed == 0 {
                0.0
            } else {
                compressed as f64 / uncompressed as f64
            },
            name: "(totals)",
        });
    }
    Ok(())
}

/// What `zstd -l` counts in a file: frames, skippable frames among them,
/// whether a frame carries a checksum, the content sizes the headers
/// state (`None` if a frame states none), and the file's length.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct ZstdFrames {
    frames: u64,
    skips: u64,
    check: bool,
    content: Option<u64>,
    size: u64,
}

impl ZstdFrames {
    fn add(&mut self, other: &ZstdFrames) {
        self.frames += other.frames;
        self.skips += other.skips;
        self.check |= other.check;
        self.content = self.content.zip(other.content).map(|(a, b)| a + b);
        self.size += other.size;
    }
}

/// Walk the zstd frames of `r` (`size` bytes) by their headers and block
/// headers, as `zstd -l` does; `None` if it is not zstd frames throughout.
fn zstd_frames(r: &mut (impl std::io::Read + std::io::Seek), size: u64) -> Option<ZstdFrames> {
    use std::io::SeekFrom;
    let mut n = ZstdFrames {
        content: Some(0),
        size,
        ..ZstdFrames::default()
    };
    let mut at = 0u64;
    let read = |r: &mut _, len: usize| -> Option<Vec<u8>> {
        let mut b = vec![0; len];
        std::io::Read::read_exact(r, &mut b).ok()?;
        Some(b)
    };
    let le = |b: &[u8]| b.iter().rev().fold(0u64, |v, &x| v << 8 | u64::from(x));
    while at < size {
        let magic = le(&read(r, 4)?);
        if magic & !0xf == 0x184D_2A50 {
            let len = le(&read(r, 4)?);
            at = r.seek(SeekFrom::Current(i64::try_from(len).ok()?)).ok()?;
            n.frames += 1;
            n.skips += 1;
            continue;
        }
        if magic != 0xFD2F_B528 {
            return None;
        }
        let fhd = read(r, 1)?[0];
        let single = fhd & 0x20 != 0;
        let dict_len = [0, 1, 2, 4][usize::from(fhd & 3)];
        let fcs_len = match fhd >> 6 {
            0 => usize::from(single),
            1 => 2,
            2 => 4,
            _ => 8,
        };
        let rest = read(r, usize::from(!single) + dict_len + fcs_len)?;
        let fcs = &rest[rest.len() - fcs_len..];
        n.content = match fcs_len {
            0 => None,
            2 => n.content.map(|c| c + le(fcs) + 256),
            _ => n.content.map(|c| c + le(fcs)),
        };
        loop {
            let head = le(&read(r, 3)?);
            let len = match (head >> 1) & 3 {
                0 | 2 => head >> 3,
                1 => 1,
                _ => return None,
            };
            r.seek(SeekFrom::Current(i64::try_from(len).ok()?)).ok()?;
            if head & 1 != 0 {
                break;
            }
        }
        if fhd & 4 != 0 {
            r.seek(SeekFrom::Current(4)).ok()?;
            n.check = true;
        }
        at = r.stream_position().ok()?;
        n.frames += 1;
    }
    (at == size).then_some(n)
}

/// A size as zstd prints it (UTIL_makeHumanReadableSize): the largest
/// binary unit it reaches, 0 to 3 decimals as the value is large or small.
fn zstd_human(size: u64) -> String {
    let units = [" B", " KiB", " MiB", " GiB", " TiB", " PiB", " EiB"];
    let step = (size.max(1).ilog2() / 10).min(6) as usize;
    let value = size as f64 / (1u64 << (10 * step)) as f64;
    let precision = if value >= 100.0 || value as u64 == size {
        0
    } else if value >= 10.0 {
        1
    } else if value > 1.0 {
        2
    } else {
        3
    };
    format!("{value:>6.precision$}{:>4}", units[step])
}

/// One line of `zstd -l`'s table.
fn zstd_list_line(f: &ZstdFrames, name: &str) -> String {
    let check = if f.check { "XXH64" } else { "None" };
    let compressed = zstd_human(f.size);
    match f.content {
        Some(content) => {
            let ratio = if f.size == 0 {
                0.0
            } else {
                content as f64 / f.size as f64
            };
            let content = format!("{:>12}", zstd_human(content));
            format!(
                "{:>6}  {:>5}  {compressed}  {content}  {ratio:5.3}  {check:>5}  {name}",
                f.frames, f.skips
            )
        }
        None => format!(
            "{:>6}  {:>5}  {compressed}                       {check:>5}  {name}",
            f.frames, f.skips
        ),
    }
}

/// `zstd -l` as zstd prints it: frames and skippable frames, sizes as
/// the headers state them, ratio (uncompressed over compressed) and
/// check, from the frame and block headers of each file (not standard
/// input, which zstd refuses too); totals for several files.
fn list_as_zstd(files: &[std::path::PathBuf]) -> Result<()> {
    if files.is_empty() || files.iter().any(|f| f.as_os_str() == "-") {
        anyhow::bail!("--list does not support reading from standard input");
    }
    outln!("Frames  Skips  Compressed  Uncompressed  Ratio  Check  Filename");
    let mut total = ZstdFrames {
        content: Some(0),
        ..ZstdFrames::default()
    };
    let mut failed = 0;
    for path in files {
        // zstd lists regular files only.
        let walked = open_regular(path)
            .and_then(|(f, size)| zstd_frames(&mut std::io::BufReader::new(f), size));
        match walked {
            Some(f) => {
                outln!("{}", zstd_list_line(&f, &path.display().to_string()));
                total.add(&f);
            }
            // (On stdout, as zstd prints it.)
            None => {
                outln!(
                    "File {:?} not compressed by zstd ",
                    path.display().to_string()
                );
                failed += 1;
            }
        }
    }
    // Totals of the files listed, once several were named.
    if files.len() > 1 {
        outln!("----------------------------------------------------------------- ");
        let listed = files.len() - failed;
        outln!("{}", zstd_list_line(&total, &format!("{listed} files")));
    }
    if failed > 0 {
        return Err(crate::Warned(1).into());
    }
    Ok(())
}

/// `xz -l` (and `xz -l --robot`): a line per file from its streams'
/// indexes, as xz prints them, and the totals of several; with
/// `verbose` (-v), each file's streams and blocks as well.
fn list_as_xz(files: &[std::path::PathBuf], robot: bool, verbose: bool) -> Result<()> {
    use cairn_codec::format::xz::{file_streams, FileInfo};
    if files.is_empty() || files.iter().any(|f| f.as_os_str() == "-") {
        anyhow::bail!("--list does not support reading from standard input");
    }
    let mut total = FileInfo::default();
    let (mut listed, mut failed, mut skipped) = (0u64, 0, 0);
    for (n, path) in files.iter().enumerate() {
        let name = path.display().to_string();
        // -v names each file before it is read, one it cannot list too.
        if verbose && !robot {
            if n > 0 {
                outln!();
            }
            outln!("{name} ({}/{})", n + 1, files.len());
        }
        // xz's words for what it cannot list (the offset and the reason
        // with -vv: RUST_LOG=debug).
        let info = match std::fs::metadata(path) {
            Err(e) => Err(io_reason(&e)),
            Ok(m) if m.is_dir() => Err("Is a directory, skipping".to_string()),
            Ok(m) if !m.is_file() => Err("Not a regular file, skipping".to_string()),
            Ok(m) if m.len() == 0 => Err("File is empty".to_string()),
            Ok(m) => match std::fs::File::open(path) {
                Err(e) => Err(io_reason(&e)),
                Ok(mut f) => file_streams(&mut f, m.len()).map_err(|e| {
                    tracing::debug!(error = %e, "xz -l");
                    match e {
                        cairn_codec::CodecError::UnknownFormat => "File format not recognized",
                        cairn_codec::CodecError::Io { .. } => "Read error",
                        _ => "Compressed data is corrupt",
                    }
                    .to_string()
                }),
            },
        };
        let (info, streams) = match info {
            Ok(found) => found,
            Err(why) => {
                errln!("{}: {name}: {why}", crate::prog());
                // A directory is a warning (status 2), as in xz.
                match why.ends_with("skipping") {
                    true => skipped += 1,
                    false => failed += 1,
                }
                continue;
            }
        };
        match (robot, verbose) {
            (true, _) => {
                outln!("name\t{name}\n{}", xz_robot_line("file", &info));
                if verbose {
                    xz_robot_detail(&streams);
                }
            }
            (false, true) => {
                xz_summary(&info, None);
                xz_detail(&streams);
            }
            (false, false) => {
                if listed == 0 {
                    outln!("Strms  Blocks   Compressed Uncompressed  Ratio  Check   Filename");
                }
                outln!("{}", xz_list_line(&info, &name));
            }
        }
        total.add(&info);
        listed += 1;
    }
    // Totals: always in robot lines, of several listed files otherwise.
    if robot {
        outln!("{}\t{listed}", xz_robot_line("totals", &total));
    } else if listed > 1 && verbose {
        outln!("\nTotals:");
        xz_summary(&total, Some(listed));
    } else if listed > 1 {
        outln!("{}", "-".repeat(79));
        outln!("{}", xz_list_line(&total, &format!("{listed} files")));
    }
    if failed > 0 {
        return Err(crate::Warned(1).into());
    }
    if skipped > 0 {
        return Err(crate::Warned(2).into());
    }
    Ok(())
}

/// An I/O error as the tools say it: its reason, without Rust's
/// "(os error N)".
pub(crate) fn io_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    match (e.raw_os_error(), text.rsplit_once(" (os error ")) {
        (Some(_), Some((reason, code))) if code.ends_with(')') => reason.to_string(),
        _ => text,
    }
}

/// The counts `xz -lv` prints of a file (and of all, with the number of
/// files).
fn xz_summary(i: &cairn_codec::format::xz::FileInfo, files: Option<u64>) {
    // A size in xz's units, and in bytes where those are not bytes.
    let sized = |n: u64| match n < 10_000 {
        true => xz_human(n),
        false => format!("{} ({n} B)", xz_human(n)),
    };
    let mut lines = vec![];
    if let Some(n) = files {
        lines.push(("Number of files:", n.to_string()));
    }
    lines.extend([
        ("Streams:", i.streams.to_string()),
        ("Blocks:", i.blocks.to_string()),
        ("Compressed size:", sized(i.compressed)),
        ("Uncompressed size:", sized(i.uncompressed)),
        ("Ratio:", xz_ratio(i)),
        ("Check:", xz_checks_joined(i.checks, ", ")),
        ("Stream Padding:", sized(i.padding)),
    ]);
    for (label, value) in lines {
        outln!("  {label:<19}{value}");
    }
}

/// Compressed ÷ uncompressed as xz prints it ([`xz_ratio`]).
fn xz_part_ratio(compressed: u64, uncompressed: u64) -> String {
    xz_ratio(&cairn_codec::format::xz::FileInfo {
        compressed,
        uncompressed,
        ..Default::default()
    })
}

/// The columns of `xz -lv`'s line of stream `n` (from 0): its number,
/// blocks, offsets, sizes, ratio, check and padding after it.
fn xz_stream_cells(n: usize, s: &cairn_codec::format::xz::StreamInfo) -> [String; 9] {
    [
        (n + 1).to_string(),
        s.blocks.len().to_string(),
        s.offset.to_string(),
        s.uncompressed_offset.to_string(),
        s.compressed.to_string(),
        s.uncompressed.to_string(),
        xz_part_ratio(s.compressed, s.uncompressed),
        cairn_codec::format::xz::check_name(s.check),
        s.padding.to_string(),
    ]
}

/// Each block of `streams` with the columns of its `xz -lv` line: its
/// stream's number and its own in the stream, offsets, sizes, ratio and
/// check.
fn xz_block_cells(streams: &[cairn_codec::format::xz::StreamInfo]) -> Vec<[String; 8]> {
    let mut rows = Vec::new();
    for (n, s) in streams.iter().enumerate() {
        for (k, b) in s.blocks.iter().enumerate() {
            rows.push([
                (n + 1).to_string(),
                (k + 1).to_string(),
                b.offset.to_string(),
                b.uncompressed_offset.to_string(),
                b.total.to_string(),
                b.uncompressed.to_string(),
                xz_part_ratio(b.total, b.uncompressed),
                cairn_codec::format::xz::check_name(s.check),
            ]);
        }
    }
    rows
}

/// `xz -lv`'s tables of a file's streams and blocks.
fn xz_detail(streams: &[cairn_codec::format::xz::StreamInfo]) {
    outln!("  Streams:");
    outln!("    Stream    Blocks      CompOffset    UncompOffset        CompSize      UncompSize  Ratio  Check      Padding");
    for (n, s) in streams.iter().enumerate() {
        let [a, b, c, d, e, f, g, h, i] = xz_stream_cells(n, s);
        outln!("    {a:>6} {b:>9} {c:>15} {d:>15} {e:>15} {f:>15}  {g:>5}  {h:<10} {i:>7}");
    }
    let blocks = xz_block_cells(streams);
    // (No table of blocks where there are none.)
    if blocks.is_empty() {
        return;
    }
    outln!("  Blocks:");
    outln!("    Stream     Block      CompOffset    UncompOffset       TotalSize      UncompSize  Ratio  Check");
    for [a, b, c, d, e, f, g, h] in blocks {
        outln!("    {a:>6} {b:>9} {c:>15} {d:>15} {e:>15} {f:>15}  {g:>5}  {h}");
    }
}

/// `xz -lv --robot`'s stream and block lines of a file (blocks numbered
/// in their stream and in the file).
fn xz_robot_detail(streams: &[cairn_codec::format::xz::StreamInfo]) {
    for (n, s) in streams.iter().enumerate() {
        outln!("stream\t{}", xz_stream_cells(n, s).join("\t"));
    }
    for (i, [a, b, rest @ ..]) in xz_block_cells(streams).into_iter().enumerate() {
        outln!("block\t{a}\t{b}\t{}\t{}", i + 1, rest.join("\t"));
    }
}

/// A line of xz's `-l` table.
fn xz_list_line(i: &cairn_codec::format::xz::FileInfo, name: &str) -> String {
    format!(
        "{:>5} {:>7}  {:>11}  {:>11}  {:>5}  {:<7} {name}",
        i.streams,
        i.blocks,
        xz_human(i.compressed),
        xz_human(i.uncompressed),
        xz_ratio(i),
        xz_checks(i.checks),
    )
}

/// A line of xz's `-l --robot` output: `kind`, then tab-separated counts.
fn xz_robot_line(kind: &str, i: &cairn_codec::format::xz::FileInfo) -> String {
    format!(
        "{kind}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        i.streams,
        i.blocks,
        i.compressed,
        i.uncompressed,
        xz_ratio(i),
        xz_checks(i.checks),
        i.padding
    )
}

/// A size as xz's tables show it: bytes under 10000, else KiB, MiB, GiB
/// or TiB with one decimal, the first unit that keeps it at or under
/// 9999.9.
fn xz_human(n: u64) -> String {
    if n < 10_000 {
        return format!("{n} B");
    }
    let mut d = n as f64 / 1024.0;
    let mut unit = 0;
    while d > 9999.9 && unit < 3 {
        d /= 1024.0;
        unit += 1;
    }
    format!("{d:.1} {}", ["KiB", "MiB", "GiB", "TiB"][unit])
}

/// Compressed ÷ uncompressed with three decimals, as xz: `---` when
/// nothing is uncompressed or the ratio is over 9.999.
fn xz_ratio(i: &cairn_codec::format::xz::FileInfo) -> String {
    let ratio = i.compressed as f64 / i.uncompressed as f64;
    match i.uncompressed == 0 || ratio > 9.999 {
        true => "---".into(),
        false => format!("{ratio:.3}"),
    }
}

/// The names of the checks set in `checks`, joined by commas.
fn xz_checks(checks: u32) -> String {
    xz_checks_joined(checks, ",")
}

/// The names of the checks set in `checks`, joined by `sep` (`-lv`'s
/// counts: ", ").
fn xz_checks_joined(checks: u32, sep: &str) -> String {
    if checks == 0 {
        // (Totals of no file: xz says None.)
        return cairn_codec::format::xz::check_name(0);
    }
    (0..16)
        .filter(|id| checks & (1 << id) != 0)
        .map(cairn_codec::format::xz::check_name)
        .collect::<Vec<_>>()
        .join(sep)
}

/// The largest zstd window log that fits `memory` bytes (zstd's `-M`),
/// within what a frame may declare (2^10 to 2^31).
fn window_log_within(memory: u64) -> u32 {
    memory.max(1).ilog2().clamp(10, 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zstd_sizes_as_zstd_prints_them() {
        for (size, text) in [
            (13, "    13   B"),
            (0, "     0   B"),
            (26672, "  26.0 KiB"),
            (108_894, "   106 KiB"),
            (4_090_000, "  3.90 MiB"),
            // (1.0 is not above 1: three decimals, as zstd's.)
            (1024, " 1.000 KiB"),
        ] {
            assert_eq!(zstd_human(size), text, "{size}");
        }
    }

    #[test]
    fn zstd_frames_are_walked_and_garbage_refused() {
        let data = vec![7u8; 100_000];
        // A stream states no content size; a buffer compressed whole does.
        let streamed = zstd::encode_all(&data[..], 3).unwrap_or_default();
        let size = streamed.len() as u64;
        let f = zstd_frames(&mut std::io::Cursor::new(streamed), size);
        assert_eq!(f.map(|f| (f.frames, f.content)), Some((1, None)));
        let mut packed = zstd::bulk::compress(&data, 3).unwrap_or_default();
        let size = packed.len() as u64;
        let mut c = std::io::Cursor::new(packed.clone());
        let f = zstd_frames(&mut c, size);
        assert_eq!(
            f.map(|f| (f.frames, f.skips, f.content)),
            Some((1, 0, Some(100_000)))
        );
        // A skippable frame after it.
        packed.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18, 2, 0, 0, 0, 9, 9]);
        let size = packed.len() as u64;
        let f = zstd_frames(&mut std::io::Cursor::new(packed.clone()), size);
        assert_eq!(f.map(|f| (f.frames, f.skips)), Some((2, 1)));
        packed.push(0);
        let size = packed.len() as u64;
        assert!(zstd_frames(&mut std::io::Cursor::new(packed), size).is_none());
        assert!(zstd_frames(&mut std::io::Cursor::new(b"BZh9".to_vec()), 4).is_none());
    }
}
