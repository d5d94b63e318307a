//! `cairn pack` and `cairn unpack`: flags into the file engine's options
//! (cairn-filepack does the work), progress bars, summaries and `-l`
//! tables out.

use crate::report::{summary_line, Progress};
use crate::{CommonArgs, DecodeArgs, PackArgs, UnpackArgs};
use anyhow::Result;
use cairn_filepack::{
    Error, Hooks, Level, Operation, Options, PackOptions, Run, Summary, UnpackMode, UnpackOptions,
};
use serde::Serialize;
use std::path::Path;

/// The binary's side of the engine: progress bars on a terminal, the
/// signal handlers that remove a temporary output when cairn is killed,
/// and errors of a multi-file run printed as they happen.
pub(crate) struct EngineHooks {
    /// Draw a progress bar (on stderr, and only if it is a terminal).
    pub progress: bool,
    /// Say no notes (`-q`).
    pub quiet: bool,
}

impl Hooks for EngineHooks {
    fn progress(
        &self,
        operation: Operation,
        total: Option<u64>,
    ) -> Box<dyn cairn_filepack::Progress + '_> {
        Box::new(Progress::new(operation.as_str(), total, self.progress))
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
        errln!("{}: {}", crate::prog(), crate::one_line(error));
    }
    fn note(&self, input: &Path, message: &str) {
        if !self.quiet {
            errln!("{}: {}: {message}", crate::prog(), input.display());
        }
    }
}

fn options(common: &CommonArgs) -> Options {
    Options {
        files: common.files.clone(),
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
        name: match (common.name, common.no_name) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
    }
}

fn hooks(common: &CommonArgs) -> EngineHooks {
    EngineHooks {
        // Under a tool's name, none (the tools draw none by default, and
        // a bar between the output lines a terminal shows was found to
        // erase them).
        progress: !common.quiet && !common.json && !crate::invoked_as_link(),
        quiet: common.quiet,
    }
}

pub fn pack(args: &PackArgs) -> Result<()> {
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
    let pack = PackOptions {
        format,
        level,
        block: args.block.or(args.block_bytes),
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
        },
        rsyncable: args.rsyncable,
        memlimit: args.memlimit_compress.map(|m| m as u64),
    };
    let common = &args.common;
    let run = cairn_filepack::pack(&options(common), &pack, &hooks(common))?;
    emit(common, run)
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
    let memory = decode.memory.map(|m| m as u64);
    let unpack = UnpackOptions {
        mode,
        // As zstd: -M bounds the window too, --long sets it outright.
        zstd_window_log_max: decode.long.or(memory.map(window_log_within)),
        gzip_index: decode.index.clone(),
        range: decode.range,
        memory,
        single_stream: decode.single_stream,
        ignore_check: decode.ignore_check,
        no_sparse: decode.no_sparse,
        format: decode.xz_format.as_deref().map(str::parse).transpose()?,
    };
    let run = cairn_filepack::unpack(&options(common), &unpack, &hooks(common))?;
    if mode == UnpackMode::List {
        if decode.list_as_gzip && !common.json {
            list_as_gzip(common, &run.summaries);
        } else {
            list(common, &run.summaries)?;
        }
        return Ok(run.outcome?);
    }
    emit(common, run)
}

/// One summary as a JSON object, several as an array.
fn to_json<T: Serialize>(items: &[T]) -> Result<String> {
    Ok(match items {
        [one] => serde_json::to_string_pretty(one)?,
        _ => serde_json::to_string_pretty(items)?,
    })
}

/// Print the summaries `--json` and `-v` ask for, then the run's outcome.
fn emit(common: &CommonArgs, run: Run) -> Result<()> {
    if common.json {
        let text = to_json(&run.summaries)?;
        if run.data_on_stdout {
            errln!("{text}");
        } else {
            outln!("{text}");
        }
    }
    if common.verbose > 0 {
        for s in &run.summaries {
            errln!("{}", summary_line(s));
        }
    }
    // An input left alone (no known suffix, an output in the way...) is
    // said as an error is, with gzip's exit status 2 when that is all.
    match run.outcome {
        Err(e) if e.is_warning() => {
            errln!("{}: {}", crate::prog(), crate::one_line(&e));
            let status = crate::Tool::invoked().warning_status(Some(&e));
            return warned(common, status);
        }
        outcome => outcome?,
    }
    // gzip's warnings: said unless -q, and the exit status is 2.
    let mut warned = false;
    for s in &run.summaries {
        for w in &s.warnings {
            warned = true;
            if !common.quiet {
                errln!("{}: {}: {w}", crate::prog(), s.input);
            }
        }
    }
    if warned {
        return self::warned(common, crate::Tool::invoked().warning_status(None));
    }
    Ok(())
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

/// `-l` as gzip prints it (cairn run as gzip, gunzip, zcat or pigz), for
/// the scripts that read its columns: compressed and uncompressed bytes,
/// the space saved and the name without its suffix, a totals line for
/// several inputs, no header with -q. The uncompressed size is what the
/// input decodes to (gzip takes the last member's length field, wrong for
/// several members and past 4 GiB).
fn list_as_gzip(common: &CommonArgs, summaries: &[Summary]) {
    if !common.quiet {
        outln!("         compressed        uncompressed  ratio uncompressed_name");
    }
    let line = |compressed: u64, uncompressed: u64, name: &str| {
        let saved = if uncompressed == 0 {
            0.0
        } else {
            100.0 * (1.0 - compressed as f64 / uncompressed as f64)
        };
        outln!("{compressed:>19} {uncompressed:>19} {saved:>5.1}% {name}");
    };
    for s in summaries {
        let input = std::path::Path::new(&s.input);
        let name = cairn_filepack::unpacked_name(input, common.suffix.as_deref())
            .map_or_else(|_| s.input.clone(), |p| p.display().to_string());
        line(s.bytes_in, s.bytes_out, &name);
    }
    if summaries.len() > 1 {
        let compressed = summaries.iter().map(|s| s.bytes_in).sum();
        let uncompressed = summaries.iter().map(|s| s.bytes_out).sum();
        line(compressed, uncompressed, "(totals)");
    }
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

/// The largest zstd window log that fits `memory` bytes (zstd's `-M`),
/// within what a frame may declare (2^10 to 2^31).
fn window_log_within(memory: u64) -> u32 {
    memory.max(1).ilog2().clamp(10, 31)
}
