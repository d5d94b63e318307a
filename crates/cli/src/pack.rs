//! `cairn pack` and `cairn unpack`: a reader thread, N workers and an
//! in-order writer on the pipeline crate, with the codec crate's formats.

use crate::files::{refuse_terminal_stdin, refuse_terminal_stdout, HoleWriter, Sink, Source};
use crate::report::{Progress, Summary};
use crate::{CommonArgs, DecodeArgs, PackArgs, UnpackArgs};
use anyhow::{anyhow, bail, Context, Result};
use cairn_blockdev::{is_zero, SparseFile, SparseRead};
use cairn_codec::{BlockMeta, ContentChecker, DecodeOptions, Format, Input, Unit};
use cairn_pipeline::{Config, Fill, Slot};
use serde::Serialize;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Largest block size accepted on the command line.
const MAX_BLOCK: usize = 64 << 20;

fn threads(common: &CommonArgs) -> Result<usize> {
    match common.threads {
        Some(n) if n > 1024 => bail!("-T {n}: too many threads (at most 1024)"),
        // -T0 means every core, as in zstd and xz.
        Some(0) | None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        Some(n) => Ok(n),
    }
}

/// One input and where its output goes.
struct Plan {
    source: Source,
    dest: Dest,
    remove_input: bool,
}

enum Dest {
    Stdout,
    File(PathBuf),
    /// Decoded only to be checked (`-t`) or counted (`-l`).
    Nowhere,
}

/// Decide outputs for every input, gzip-style; `check_only` sends every
/// output nowhere and keeps the inputs. An input whose output cannot be
/// named is an error of its own (named by [`run_all`]), so the others run.
fn plan(
    common: &CommonArgs,
    check_only: bool,
    name_output: impl Fn(&Path) -> Result<PathBuf>,
) -> Result<Vec<(String, Result<Plan>)>> {
    let inputs: Vec<Source> = if common.files.is_empty() {
        vec![Source::Stdin]
    } else {
        common.files.iter().map(|p| Source::from_arg(p)).collect()
    };
    if common.output.is_some() && inputs.len() > 1 {
        bail!(
            "-o names one output, but {} inputs were given",
            inputs.len()
        );
    }
    if common.output.is_some() && common.stdout {
        bail!("-o and -c both name the output; choose one");
    }
    Ok(inputs
        .into_iter()
        .map(|source| {
            let dest = match (&source, &common.output) {
                _ if check_only => Ok((Dest::Nowhere, false)),
                (_, Some(out)) if out.as_os_str() == "-" => Ok((Dest::Stdout, false)),
                (Source::File(_), Some(out)) => Ok((Dest::File(out.clone()), !common.keep)),
                (Source::Stdin, Some(out)) => Ok((Dest::File(out.clone()), false)),
                (Source::Stdin, None) => Ok((Dest::Stdout, false)),
                (Source::File(_), None) if common.stdout => Ok((Dest::Stdout, false)),
                (Source::File(p), None) => {
                    name_output(p).map(|out| (Dest::File(out), !common.keep))
                }
            };
            let name = source.name();
            let plan = dest.map(|(dest, remove_input)| Plan {
                source,
                dest,
                remove_input,
            });
            (name, plan)
        })
        .collect())
}

/// Whether any input whose output could be named satisfies `f`.
fn any_planned(plans: &[(String, Result<Plan>)], f: impl Fn(&Plan) -> bool) -> bool {
    plans.iter().any(|(_, p)| p.as_ref().is_ok_and(&f))
}

/// Run `one` on every planned input in turn. As in gzip, a failed input
/// does not stop the others: its error is printed as it happens, and the
/// run fails at the end naming every input that failed. Returns the
/// summaries of the inputs that succeeded, and the run's result.
fn run_all(
    plans: Vec<(String, Result<Plan>)>,
    mut one: impl FnMut(&Plan) -> Result<Summary>,
) -> (Vec<Summary>, Result<()>) {
    let total = plans.len();
    let mut summaries = Vec::new();
    let mut failed: Vec<(String, anyhow::Error)> = Vec::new();
    for (name, plan) in plans {
        match plan.and_then(|plan| one(&plan)) {
            Ok(s) => summaries.push(s),
            Err(e) => {
                let e = e.context(name.clone());
                if total > 1 {
                    eprintln!("cairn: {}", crate::one_line(&e));
                }
                failed.push((name, e));
            }
        }
    }
    let result = match failed.len() {
        0 => Ok(()),
        // One input: its own error is the run's, printed once.
        _ if total == 1 => Err(failed.remove(0).1),
        n => {
            let names: Vec<&str> = failed.iter().map(|(name, _)| name.as_str()).collect();
            Err(anyhow!(
                "{n} of {total} inputs failed: {}",
                names.join(", ")
            ))
        }
    };
    (summaries, result)
}

/// The format a file name's suffix stands for, and the name without it
/// (`x.tgz` stands for `x.tar`). Names are bytes: any file name works.
fn format_of_name(path: &Path) -> Option<(Format, PathBuf)> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let name = path.as_os_str().as_bytes();
    let with_tail =
        |stem: &[u8], tail: &[u8]| PathBuf::from(OsString::from_vec([stem, tail].concat()));
    for f in Format::ALL {
        if let Some(stem) = name.strip_suffix(f.suffix().as_bytes()) {
            if !stem.is_empty() && !stem.ends_with(b"/") {
                return Some((f, with_tail(stem, b"")));
            }
        }
        let tar_suffixes: &[&str] = match f {
            Format::Gzip => &[".tgz"],
            Format::Zstd => &[".tzst"],
            Format::Bzip2 => &[".tbz2", ".tbz"],
            Format::Xz => &[".txz"],
            _ => &[],
        };
        for suffix in tar_suffixes {
            if let Some(stem) = name.strip_suffix(suffix.as_bytes()) {
                return Some((f, with_tail(stem, b".tar")));
            }
        }
    }
    None
}

fn open_sink(dest: &Dest, force: bool, binary: bool) -> Result<Sink> {
    match dest {
        Dest::Stdout => Sink::stdout(force, binary),
        Dest::File(p) => Sink::file(p, force),
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

fn finish(plan: &Plan, sink: Sink, input_meta: Option<&std::fs::Metadata>) -> Result<()> {
    if let Some(meta) = input_meta {
        sink.copy_metadata(meta);
    }
    sink.commit()?;
    if let (Source::File(src), true) = (&plan.source, plan.remove_input) {
        std::fs::remove_file(src).with_context(|| format!("remove {}", src.display()))?;
    }
    Ok(())
}

/// One summary as a JSON object, several as an array.
fn to_json<T: Serialize>(items: &[T]) -> Result<String> {
    Ok(match items {
        [one] => serde_json::to_string_pretty(one)?,
        _ => serde_json::to_string_pretty(items)?,
    })
}

fn emit(common: &CommonArgs, summaries: &[Summary], data_on_stdout: bool) -> Result<()> {
    if common.json {
        let text = to_json(summaries)?;
        if data_on_stdout {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }
    if common.verbose {
        for s in summaries {
            eprintln!("{}", s.line());
        }
    }
    Ok(())
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
        println!("{}", to_json(&listed)?);
        return Ok(());
    }
    println!(
        "{:<6} {:>15} {:>15} {:>6}  name",
        "format", "compressed", "uncompressed", "ratio"
    );
    let line = |l: &Listed| {
        println!(
            "{:<6} {:>15} {:>15} {:>6.3}  {}",
            l.format, l.compressed, l.uncompressed, l.ratio, l.name
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

/// The level asked for, checked against the levels the format's encoder
/// really has: a level it lacks is refused, never quietly replaced.
fn level(args: &PackArgs, format: Format) -> Result<i32> {
    let (lo, hi) = format.level_range();
    let level = if args.best {
        hi
    } else if args.fast {
        1
    } else {
        args.level.unwrap_or_else(|| format.default_level())
    };
    if (lo..=hi).contains(&level) {
        Ok(level)
    } else if lo == hi {
        bail!("{format} has no level {level}: cairn writes {format} at level {lo} only")
    } else {
        bail!("{format} has no level {level} (its levels are {lo}..={hi})")
    }
}

pub fn pack(args: &PackArgs) -> Result<()> {
    if args.decompress || args.decode.test || args.decode.list {
        return unpack_files(&args.decode, &args.common);
    }
    let common = &args.common;
    let format = match (&args.format, &common.output) {
        (Some(name), _) => name.parse()?,
        (None, Some(out)) => format_of_name(out).map_or(Format::Gzip, |(f, _)| f),
        (None, None) => Format::Gzip,
    };
    let level = level(args, format)?;
    let block = args
        .block
        .unwrap_or_else(|| format.default_block_size(level));
    if block > MAX_BLOCK {
        bail!("-b {block}: block size over the 64 MiB limit");
    }
    let threads = threads(common)?;
    let plans = plan(common, false, |p| {
        // As gzip and pigz: x.gz is not packed again into x.gz.gz.
        if !common.force && format_of_name(p).is_some_and(|(f, _)| f == format) {
            bail!("already has a {format} suffix; unchanged (-f packs it anyway)");
        }
        let mut name = p.as_os_str().to_owned();
        name.push(format.suffix());
        Ok(PathBuf::from(name))
    })?;
    let data_on_stdout = any_planned(&plans, |p| matches!(p.dest, Dest::Stdout));
    if data_on_stdout {
        // Once for the run, not once per input.
        refuse_terminal_stdout(common.force)?;
    }
    let (summaries, result) = run_all(plans, |plan| {
        pack_one(plan, format, level, block, threads, common)
    });
    emit(common, &summaries, data_on_stdout)?;
    result
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

/// A worker's encoding of an all-zero block. Blocks are encoded
/// independently of each other, so a zero block of one length always
/// encodes to the same bytes: holes and zeroed free space of a disk image
/// are encoded once per worker, then copied.
struct ZeroBlock {
    len: usize,
    bytes: Vec<u8>,
    meta: BlockMeta,
}

fn pack_one(
    plan: &Plan,
    format: Format,
    level: i32,
    block: usize,
    threads: usize,
    common: &CommonArgs,
) -> Result<Summary> {
    let started = Instant::now();
    let (file, size) = plan.source.open()?;
    let input_meta = input_metadata(&plan.source, &file);
    // A regular file is read by its data extents (size is known only for
    // those).
    let mut reader: Box<dyn SparseRead> = if size.is_some() {
        Box::new(SparseFile::new(file).with_context(|| plan.source.name())?)
    } else {
        Box::new(file)
    };
    let mut sink = open_sink(&plan.dest, common.force, true)?;
    let progress = Progress::new("pack", size, !common.quiet && !common.json);
    // Build one encoder now so a bad level fails before any output.
    drop(format.encoder(level, block)?);
    let mut framer = format.framer(level);
    let mut head = Vec::new();
    framer.header(&mut head);
    let out_name = sink.name();
    let w = sink.writer();
    w.write_all(&head).with_context(|| out_name.clone())?;
    let mut bytes_out = head.len() as u64;
    let mut bytes_in = 0u64;
    let mut blocks = 0u64;
    let mut first = true;
    let mut read_total = 0u64;
    let source_name = plan.source.name();
    let result = cairn_pipeline::run(
        Config::new(threads),
        |input: &mut Block| {
            let n = fill_block(reader.as_mut(), input, block)
                .map_err(|e| anyhow!(e).context(format!("read {source_name}")))?;
            // An empty input still gets one (empty) block: every format's
            // tools expect at least a header and most a member or frame.
            if n == 0 && !first {
                return Ok(Fill::End);
            }
            first = false;
            read_total += n as u64;
            progress.read_to(read_total);
            Ok(Fill::Item)
        },
        || {
            let mut enc = format.encoder(level, block);
            let mut zero: Option<ZeroBlock> = None;
            move |input: &mut Block, out: &mut Packed| -> Result<()> {
                let enc = enc.as_mut().map_err(|e| anyhow!("{e}"))?;
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
                .with_context(|| out_name.clone())?;
            framer.block(&slot.output.meta);
            bytes_in += slot.input.raw_len() as u64;
            bytes_out += slot.output.bytes.len() as u64;
            blocks += 1;
            progress.ratio(bytes_in, bytes_out);
            Ok(())
        },
        |slot| {
            slot.input.len = 0;
            slot.input.zeros = 0;
            slot.output.bytes.clear();
        },
    );
    progress.finish();
    result?;
    let mut tail = Vec::new();
    framer.trailer(&mut tail)?;
    sink.writer()
        .write_all(&tail)
        .with_context(|| out_name.clone())?;
    bytes_out += tail.len() as u64;
    finish(plan, sink, input_meta.as_ref())?;
    Ok(Summary::new(
        "pack",
        plan.source.name(),
        out_name,
        format.name().to_string(),
        Some(level),
        Some(block),
        threads,
        bytes_in,
        bytes_out,
        started,
    ))
}

pub fn unpack(args: &UnpackArgs) -> Result<()> {
    unpack_files(&args.decode, &args.common)
}

/// `cairn unpack` and `cairn pack -d`: decode, test (`-t`) or list (`-l`).
fn unpack_files(decode: &DecodeArgs, common: &CommonArgs) -> Result<()> {
    let threads = threads(common)?;
    let check_only = decode.test || decode.list;
    let plans = plan(common, check_only, |p| match format_of_name(p) {
        Some((_, out)) => Ok(out),
        None => bail!("unknown suffix; use -c or -o to name the output"),
    })?;
    if any_planned(&plans, |p| matches!(p.source, Source::Stdin)) {
        refuse_terminal_stdin(common.force)?;
    }
    let data_on_stdout = any_planned(&plans, |p| matches!(p.dest, Dest::Stdout));
    let (summaries, result) = run_all(plans, |plan| unpack_one(plan, threads, common, decode.long));
    if decode.list {
        list(common, &summaries)?;
    } else {
        emit(common, &summaries, data_on_stdout)?;
    }
    result
}

fn unpack_one(
    plan: &Plan,
    threads: usize,
    common: &CommonArgs,
    long: Option<u32>,
) -> Result<Summary> {
    let started = Instant::now();
    let (mut reader, size) = plan.source.open()?;
    let input_meta = input_metadata(&plan.source, &reader);
    let mut head = Vec::with_capacity(16);
    Read::by_ref(&mut reader)
        .take(16)
        .read_to_end(&mut head)
        .context("read")?;
    let format = Format::detect(&head).ok_or(cairn_codec::CodecError::UnknownFormat)?;
    // The input may be read through a memory map (incompressible zstd
    // frames, by the seek table).
    crate::signals::guard_mapped_input();
    let input = Input::with_prefix_file(&head, reader);
    let mut splitter = format.splitter_with(
        input,
        &DecodeOptions {
            zstd_window_log_max: long.unwrap_or(DecodeOptions::default().zstd_window_log_max),
        },
    );
    let mut sink = open_sink(&plan.dest, common.force, false)?;
    let progress = Progress::new("unpack", size, !common.quiet && !common.json);
    let out_name = sink.name();
    // Into a new file, zeros become holes.
    let mut holes = sink.is_new_file().then(HoleWriter::default);
    let w = sink.writer();
    let mut checker = ContentChecker::default();
    let mut bytes_out = 0u64;
    let result = cairn_pipeline::run(
        Config::new(threads),
        |unit: &mut Unit| {
            let more = splitter.next_unit(unit)?;
            progress.read_to(splitter.offset());
            Ok(if more { Fill::Item } else { Fill::End })
        },
        || {
            let mut dec = format.unit_decoder();
            move |unit: &mut Unit, out: &mut Vec<u8>| -> Result<()> {
                dec.decode(unit, out)?;
                Ok(())
            }
        },
        |slot: &mut Slot<Unit, Vec<u8>>| {
            checker.feed(format, slot.input.offset, slot.input.content, &slot.output)?;
            match holes.as_mut() {
                Some(h) => h.write(w, &slot.output),
                None => w.write_all(&slot.output),
            }
            .with_context(|| out_name.clone())?;
            bytes_out += slot.output.len() as u64;
            progress.ratio(bytes_out, slot.input.offset);
            Ok(())
        },
        |slot| {
            slot.input.clear();
            slot.output.clear();
        },
    );
    progress.finish();
    result?;
    if let Some(h) = holes {
        h.finish(sink.writer()).with_context(|| sink.name())?;
    }
    let bytes_in = splitter.offset();
    finish(plan, sink, input_meta.as_ref())?;
    Ok(Summary::new(
        "unpack",
        plan.source.name(),
        out_name,
        format.name().to_string(),
        None,
        None,
        threads,
        bytes_in,
        bytes_out,
        started,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;

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
}
