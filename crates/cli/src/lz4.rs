//! `lz4 --list` through the lz4 link, as lz4 1.9.4 prints it: a line per
//! file (frames, their type and block kind if all share one, sizes, the
//! ratio where every frame states its content size), or with `-v` each
//! file's frames on standard error, from the frame and block headers
//! (`cairn_codec::format::lz4::frames`). The first file that cannot be
//! listed ends the run, as in lz4.

use anyhow::Result;
use cairn_codec::format::lz4::{frames, HeaderCut, ListedFrame, ListedKind, Tail};
use cairn_codec::CodecError;
use std::io::{BufReader, Seek};
use std::os::fd::AsFd;
use std::path::PathBuf;

/// lz4's human size: 1024s, two decimals, a unit letter past bytes.
fn human(n: u64) -> String {
    let mut size = n as f64;
    let mut unit = 0;
    while size >= 1024.0 && unit < 8 {
        size /= 1024.0;
        unit += 1;
    }
    let letter = ["", "K", "M", "G", "T", "P", "E", "Z", "Y"][unit];
    format!("{size:.2}{letter}")
}

fn type_name(kind: &ListedKind) -> &'static str {
    match kind {
        ListedKind::Frame { .. } => "LZ4Frame",
        ListedKind::Legacy => "LegacyFrame",
        ListedKind::Skippable => "SkippableFrame",
    }
}

/// A frame's block size id and whether its blocks are independent, for
/// frames with blocks of that kind.
fn blocks_of(kind: &ListedKind) -> Option<(u8, bool)> {
    match kind {
        ListedKind::Frame {
            block_id,
            independent,
            ..
        } => Some((*block_id, *independent)),
        _ => None,
    }
}

/// "B7I": the block size id and whether blocks are independent (or
/// linked, D); `-` for frames without blocks of that kind.
fn block_kind(blocks: Option<(u8, bool)>) -> String {
    match blocks {
        Some((id, independent)) => format!("B{id}{}", if independent { 'I' } else { 'D' }),
        None => "-".into(),
    }
}

fn content_size(kind: &ListedKind) -> Option<u64> {
    match kind {
        ListedKind::Frame { content_size, .. } => *content_size,
        _ => None,
    }
}

/// `lz4 -v --list`'s line of one frame.
fn frame_line(n: usize, f: &ListedFrame) -> String {
    let head = format!(
        "{n:>10} {:>14} {:>5} {:>8} {:>20}",
        type_name(&f.kind),
        block_kind(blocks_of(&f.kind)),
        match f.kind {
            ListedKind::Frame {
                content_check: true,
                ..
            } => "XXH32",
            _ => "-",
        },
        f.len
    );
    match (&f.kind, content_size(&f.kind)) {
        (_, Some(c)) => format!("{head} {c:>20} {:>9.2}%", f.len as f64 / c as f64 * 100.0),
        // (lz4 leaves a space after a frame of unknown size.)
        (ListedKind::Frame { .. }, None) => format!("{head} {:>20} {:>9} ", "-", "-"),
        _ => format!("{head} {:>20} {:>9}", "-", "-"),
    }
}

/// What every frame so far has in common: nothing seen yet, one value,
/// or two that differ (shown as `-`).
#[derive(Default)]
enum Shared<T> {
    #[default]
    Unseen,
    All(T),
    Mixed,
}

impl<T: PartialEq> Shared<T> {
    fn add(&mut self, this: T) {
        match self {
            Shared::Unseen => *self = Shared::All(this),
            Shared::All(seen) if *seen != this => *self = Shared::Mixed,
            Shared::All(_) | Shared::Mixed => {}
        }
    }

    fn all(&self) -> Option<&T> {
        match self {
            Shared::All(v) => Some(v),
            Shared::Unseen | Shared::Mixed => None,
        }
    }
}

/// What `lz4 --list` says of a file's frames together, kept as they
/// are found.
#[derive(Default)]
struct Summary {
    frames: u64,
    /// The type all share.
    kind: Shared<&'static str>,
    /// The block kind all share.
    blocks: Shared<Option<(u8, bool)>>,
    /// The content sizes summed while every frame states one.
    content: Option<u64>,
}

impl Summary {
    fn add(&mut self, f: &ListedFrame) {
        self.kind.add(type_name(&f.kind));
        self.blocks.add(blocks_of(&f.kind));
        let sum = if self.frames == 0 {
            Some(0)
        } else {
            self.content
        };
        self.content = sum
            .zip(content_size(&f.kind))
            .and_then(|(a, b)| a.checked_add(b));
        self.frames += 1;
    }

    /// `lz4 --list`'s line of a file of `size` bytes.
    fn line(&self, size: u64, name: &str) -> String {
        let head = format!(
            "{:>10} {:>14} {:>5} {:>11}",
            self.frames,
            self.kind.all().copied().unwrap_or("-"),
            block_kind(self.blocks.all().copied().flatten()),
            human(size)
        );
        match self.content.filter(|&c| c > 0) {
            Some(c) => format!(
                "{head} {:>13} {:>9.2}%  {name} ",
                human(c),
                size as f64 / c as f64 * 100.0
            ),
            None => format!("{head} {:>13} {:>9}   {name}", "-", "-"),
        }
    }
}

/// Pass over `n` bytes of a file by seeking (its size is checked apart).
fn seek_past(r: &mut BufReader<std::fs::File>, n: u64) -> std::io::Result<u64> {
    let by =
        i64::try_from(n).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    r.seek_relative(by)?;
    Ok(n)
}

/// The input opened to be listed, if it is a regular file (lz4 lists
/// nothing else, standard input (`None`) only where it is a file): the
/// file, its length and where it is read from (standard input may be
/// open past its start; lz4 counts from the file's start).
fn open_input(path: Option<&PathBuf>) -> Option<(std::fs::File, u64, u64)> {
    let Some(path) = path else {
        let mut file = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned().ok()?);
        let meta = file.metadata().ok().filter(|m| m.is_file())?;
        let at = file.stream_position().ok()?;
        return Some((file, meta.len(), at.min(meta.len())));
    };
    crate::pack::open_regular(path).map(|(f, len)| (f, len, 0))
}

/// lz4's words for a walk that failed, and its status.
fn failure(e: CodecError, name: &str, from: u64) -> (String, u8) {
    tracing::debug!(error = %e, "lz4 --list");
    let why = match e {
        CodecError::Truncated { offset, .. } => format!(
            "unexpected end of input at offset {} (truncated file?)",
            from + offset
        ),
        CodecError::Io { offset, source } => format!(
            "read error at offset {}: {}",
            from + offset,
            crate::pack::io_reason(&source)
        ),
        _ => "File format not recognized ".into(),
    };
    (format!("lz4: {name}: {why}"), 1)
}

/// `lz4 --list [-v] FILES` (no file, or `-`: standard input, named
/// `stdin`). Files are named by their last component, as lz4 names them
/// in its tables (in its errors, as given).
pub(crate) fn list(files: &[PathBuf], verbose: bool) -> Result<()> {
    let inputs: Vec<Option<&PathBuf>> = match files.is_empty() {
        true => vec![None],
        false => files
            .iter()
            .map(|f| (f.as_os_str() != "-").then_some(f))
            .collect(),
    };
    let table = "    Frames           Type Block  Compressed  Uncompressed     Ratio   Filename";
    let frames_table = "     Frame           Type Block Checksum           Compressed         Uncompressed     Ratio";
    if !verbose {
        outln!("{table}");
    }
    for (i, path) in inputs.iter().enumerate() {
        let name = path.map_or("stdin".to_string(), |p| p.display().to_string());
        let shown = path
            .and_then(|p| p.file_name())
            .map_or(name.clone(), |n| n.to_string_lossy().into_owned());
        let Some((file, size, from)) = open_input(*path) else {
            errln!("lz4: {name} is not a regular file ");
            return Err(crate::Warned(1).into());
        };
        if verbose {
            errln!("{shown}({}/{})", i + 1, inputs.len());
            errln!("{frames_table}");
        }
        let mut summary = Summary::default();
        // -v: each frame's line as it is found, as lz4 prints them
        // before any damage after them.
        let mut each = |f: ListedFrame| {
            summary.add(&f);
            if verbose {
                errln!("{}", frame_line(summary.frames as usize, &f));
            }
        };
        let mut r = BufReader::new(file);
        let walked = frames(&mut r, Some(size - from), seek_past, &mut each);
        let tail = match walked {
            Ok(w) => w.tail,
            Err(e) => {
                let (why, status) = failure(e, &name, from);
                errln!("{why}");
                return Err(crate::Warned(status).into());
            }
        };
        match tail {
            Tail::End => {}
            // What follows the frames but begins none: lz4 names where
            // (after the 4 bytes it read) and fails.
            Tail::Garbage { at, len: 4 } => {
                if verbose {
                    errln!(
                        "Stream followed by undecodable data at position {} ",
                        from + at + 4
                    );
                }
                errln!("lz4: {name}: File format not recognized ");
                return Err(crate::Warned(1).into());
            }
            Tail::Garbage { .. } => {
                errln!("Error 40 : Unrecognized header : Magic Number unreadable ");
                return Err(crate::Warned(40).into());
            }
            Tail::CutHeader { cut, .. } => {
                let (why, status) = match cut {
                    // One line; the status says where lz4's reads of the
                    // header end.
                    HeaderCut::AfterMagic | HeaderCut::BeforeContentSize => {
                        let status = if cut == HeaderCut::AfterMagic { 71 } else { 72 };
                        (format!("Error reading {name}"), status)
                    }
                    HeaderCut::SkippableSize => {
                        ("Stream error : skippable size unreadable".to_string(), 42)
                    }
                };
                errln!("Error {status} : {why} ");
                return Err(crate::Warned(status).into());
            }
            Tail::BadLegacyBlock { .. } => {
                errln!("Corrupted legacy frame ");
                errln!("lz4: {name}: File format not recognized ");
                return Err(crate::Warned(1).into());
            }
        }
        match verbose {
            true => errln!(),
            false => outln!("{}", summary.line(size, &shown)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_put_as_lz4_puts_them() {
        assert_eq!(human(0), "0.00");
        assert_eq!(human(1000), "1000.00");
        assert_eq!(human(1024), "1.00K");
        assert_eq!(human(220_963), "215.78K");
        assert_eq!(human(3_000_000), "2.86M");
    }
}
