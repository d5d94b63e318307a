//! `cairn pack` and `cairn unpack`: a reader thread, N workers and an
//! in-order writer on the pipeline crate, with the codec crate's formats.

use crate::files::{copy_metadata, HoleWriter, Sink, Source};
use crate::report::{Progress, Summary};
use crate::{CommonArgs, PackArgs, UnpackArgs};
use anyhow::{anyhow, bail, Context, Result};
use cairn_blockdev::{is_zero, SparseFile, SparseRead};
use cairn_codec::{BlockMeta, ContentChecker, DecodeOptions, Format, Input, Unit};
use cairn_pipeline::{Config, Fill, Slot};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Largest block size accepted on the command line.
const MAX_BLOCK: usize = 64 << 20;

fn threads(common: &CommonArgs) -> Result<usize> {
    match common.threads {
        Some(0) => bail!("-T needs at least 1 thread"),
        Some(n) if n > 1024 => bail!("-T {n}: too many threads (at most 1024)"),
        Some(n) => Ok(n),
        None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
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
}

/// Decide outputs for every input, gzip-style.
fn plan(common: &CommonArgs, name_output: impl Fn(&Path) -> Result<PathBuf>) -> Result<Vec<Plan>> {
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
    inputs
        .into_iter()
        .map(|source| {
            let (dest, remove_input) = match (&source, &common.output) {
                (_, Some(out)) if out.as_os_str() == "-" => (Dest::Stdout, false),
                (Source::File(_), Some(out)) => (Dest::File(out.clone()), !common.keep),
                (Source::Stdin, Some(out)) => (Dest::File(out.clone()), false),
                (Source::Stdin, None) => (Dest::Stdout, false),
                (Source::File(_), None) if common.stdout => (Dest::Stdout, false),
                (Source::File(p), None) => (Dest::File(name_output(p)?), !common.keep),
            };
            Ok(Plan {
                source,
                dest,
                remove_input,
            })
        })
        .collect()
}

fn open_sink(dest: &Dest, force: bool, binary: bool) -> Result<Sink> {
    match dest {
        Dest::Stdout => Sink::stdout(force, binary),
        Dest::File(p) => Sink::file(p, force),
    }
}

fn finish(plan: &Plan, sink: Sink) -> Result<()> {
    sink.commit()?;
    if let (Source::File(src), Dest::File(dst)) = (&plan.source, &plan.dest) {
        copy_metadata(src, dst);
        if plan.remove_input {
            std::fs::remove_file(src).with_context(|| format!("remove {}", src.display()))?;
        }
    }
    Ok(())
}

fn emit(common: &CommonArgs, summaries: &[Summary], data_on_stdout: bool) -> Result<()> {
    if common.json {
        let text = if summaries.len() == 1 {
            serde_json::to_string_pretty(&summaries[0])?
        } else {
            serde_json::to_string_pretty(summaries)?
        };
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

pub fn pack(args: &PackArgs) -> Result<()> {
    let format: Format = args.format.parse()?;
    let common = &args.common;
    let level = match args.level {
        Some(l) => {
            let (lo, hi) = format.level_range();
            if l < lo || l > hi {
                // lz4 and snappy have one speed here; accept any level the
                // standard tool accepts, like `lz4 -9` would, by clamping.
                if matches!(format, Format::Lz4 | Format::Snappy) && (1..=12).contains(&l) {
                    lo
                } else {
                    bail!("{format}: level {l} is out of range {lo}..={hi}");
                }
            } else {
                l
            }
        }
        None => format.default_level(),
    };
    let block = args
        .block
        .unwrap_or_else(|| format.default_block_size(level));
    if block > MAX_BLOCK {
        bail!("-b {block}: block size over the 64 MiB limit");
    }
    let threads = threads(common)?;
    let plans = plan(common, |p| {
        let mut name = p.as_os_str().to_owned();
        name.push(format.suffix());
        Ok(PathBuf::from(name))
    })?;
    let mut summaries = Vec::new();
    let data_on_stdout = plans.iter().any(|p| matches!(p.dest, Dest::Stdout));
    for plan in &plans {
        let s = pack_one(plan, format, level, block, threads, common)
            .with_context(|| plan.source.name())?;
        summaries.push(s);
    }
    emit(common, &summaries, data_on_stdout)
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
    finish(plan, sink)?;
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
    let common = &args.common;
    let threads = threads(common)?;
    let plans = plan(common, |p| {
        let name = p.to_string_lossy();
        for f in Format::ALL {
            let extra: &[&str] = match f {
                Format::Gzip => &[".tgz"],
                Format::Zstd => &[".tzst"],
                Format::Bzip2 => &[".tbz2", ".tbz"],
                Format::Xz => &[".txz"],
                _ => &[],
            };
            if let Some(stem) = name.strip_suffix(f.suffix()) {
                if !stem.is_empty() && !stem.ends_with('/') {
                    return Ok(PathBuf::from(stem));
                }
            }
            for e in extra {
                if let Some(stem) = name.strip_suffix(e) {
                    return Ok(PathBuf::from(format!("{stem}.tar")));
                }
            }
        }
        bail!("{name}: unknown suffix; use -c or -o to name the output")
    })?;
    let data_on_stdout = plans.iter().any(|p| matches!(p.dest, Dest::Stdout));
    let mut summaries = Vec::new();
    for plan in &plans {
        let s = unpack_one(plan, threads, common, args.long).with_context(|| plan.source.name())?;
        summaries.push(s);
    }
    emit(common, &summaries, data_on_stdout)
}

fn unpack_one(
    plan: &Plan,
    threads: usize,
    common: &CommonArgs,
    long: Option<u32>,
) -> Result<Summary> {
    let started = Instant::now();
    let (mut reader, size) = plan.source.open()?;
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
    finish(plan, sink)?;
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
