//! The `lzop` link: lzop's command line read as lzop reads it and said
//! in `cairn pack`'s flags, and `lzop -l`'s tables, which scripts parse.
//!
//! lzop's letters mean other things than cairn's (`-p` is lzop's output
//! directory, `-F` its `--no-checksum`, `-U` its delete-the-input, `-C`
//! a no-op), so every word is read by lzop's grammar here and nothing is
//! handed to cairn's parser as it came; an option lzop lacks is refused
//! as lzop refuses it (status 1).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// `--no-warn` without `-q`: warnings are hidden (as `-q` hides them),
/// but the `-l` and `-t` lines `-q` would drop are printed.
static LISTS_IN_FULL: AtomicBool = AtomicBool::new(false);

/// What lzop's `-l` and `-t` leave out under `-q` (not under `--no-warn`).
pub(crate) fn quiet_lists(quiet: bool) -> bool {
    quiet && !LISTS_IN_FULL.load(Ordering::Relaxed)
}

/// lzop's arguments (after the program's name) as `cairn pack`'s, after
/// the link's `pack -F lzop -k`; an error is lzop's line for a command
/// line it refuses.
pub(crate) fn arguments(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let mut out: Vec<OsString> = Vec::new();
    let (mut keep, mut unlink, mut stdout, mut force) = (false, false, false, false);
    let (mut quiet, mut no_warn, mut no_stdin, mut files) = (false, false, false, 0usize);
    let mut words = args.into_iter();
    let unsupported = |what: &str| format!("{what} is not supported by cairn's lzop");
    while let Some(word) = words.next() {
        let Some(text) = word.to_str().map(str::to_string) else {
            // A name that is no UTF-8 is a file (lzop's options are ASCII).
            files += 1;
            out.push(word);
            continue;
        };
        if text == "--" {
            files += words.len();
            out.push(word);
            out.extend(words.by_ref());
            break;
        }
        if let Some(long) = text.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let mut value_or_next = |name: &str| {
                value
                    .clone()
                    .or_else(|| words.next().and_then(|w| w.into_string().ok()))
                    .ok_or_else(|| format!("option '--{name}' requires an argument"))
            };
            let flag: &[&str] = match name {
                "decompress" | "uncompress" => &["-d"],
                "test" => &["-t"],
                "list" => &["-l"],
                "stdout" | "to-stdout" => {
                    stdout = true;
                    &["-c"]
                }
                "force" => {
                    force = true;
                    &["-f"]
                }
                "quiet" | "silent" => {
                    quiet = true;
                    &["-q"]
                }
                "verbose" => &["-v"],
                "name" => &["-N"],
                "no-name" => &["-n"],
                "no-time" => &["--no-time"],
                "fast" => &["-1"],
                "best" => &["-9"],
                "help" => &["--help"],
                "version" => &["--version"],
                "license" => &["--license"],
                "crc32" => &["--check=crc32"],
                "no-checksum" => &["--no-check"],
                "ignore-warn" => &["-Q"],
                "keep" => {
                    keep = true;
                    &[]
                }
                "unlink" | "delete" => {
                    unlink = true;
                    &[]
                }
                "no-warn" => {
                    no_warn = true;
                    &[]
                }
                "no-stdin" => {
                    no_stdin = true;
                    &[]
                }
                // The mode: cairn gives an output its input's, lzop the
                // one the header keeps; colours: no terminal screens here;
                // --checksum: lzop's default, deprecated.
                "no-mode" | "no-color" | "mono" | "color" | "checksum" => &[],
                "output" => {
                    out.push("-o".into());
                    out.push(value_or_next(name)?.into());
                    continue;
                }
                "suffix" => {
                    out.push(format!("--suffix={}", value_or_next(name)?).into());
                    continue;
                }
                "path" => {
                    let dir = value.clone().unwrap_or_else(|| ".".to_string());
                    out.push(format!("--output-dir-flat={dir}").into());
                    continue;
                }
                "extract" => return Err(unsupported("--extract (-x, which restores kept paths)")),
                "ls" | "info" | "sysinfo" | "filter" => {
                    return Err(unsupported(&format!("--{name}")))
                }
                _ => return Err(format!("unrecognized option '--{name}'")),
            };
            out.extend(flag.iter().map(OsString::from));
            continue;
        }
        if text == "-" || !text.starts_with('-') {
            files += 1;
            out.push(word);
            continue;
        }
        // A cluster of letters; -o and -S take the rest or the next word,
        // -p the rest only (a bare -p is the current directory).
        let letters: Vec<char> = text[1..].chars().collect();
        for (i, &c) in letters.iter().enumerate() {
            let rest: String = letters[i + 1..].iter().collect();
            match c {
                'd' | 'l' | 't' | 'v' | 'n' | 'N' | '1'..='9' => out.push(format!("-{c}").into()),
                'c' => {
                    stdout = true;
                    out.push("-c".into());
                }
                'f' => {
                    // -ff is lzop's stronger -f; cairn has one.
                    if !force {
                        out.push("-f".into());
                    }
                    force = true;
                }
                'q' => {
                    quiet = true;
                    out.push("-q".into());
                }
                'k' => keep = true,
                'U' => unlink = true,
                'F' => out.push("--no-check".into()),
                'C' => {}
                'h' | 'H' => out.push("--help".into()),
                'V' => out.push("--version".into()),
                'L' => out.push("--license".into()),
                'o' | 'S' => {
                    let value = match rest.is_empty() {
                        false => rest,
                        true => words
                            .next()
                            .and_then(|w| w.into_string().ok())
                            .ok_or_else(|| format!("option '-{c}' requires an argument"))?,
                    };
                    match c {
                        'o' => out.extend(["-o".into(), value.into()]),
                        _ => out.push(format!("--suffix={value}").into()),
                    }
                    break;
                }
                'p' => {
                    let dir = if rest.is_empty() {
                        ".".to_string()
                    } else {
                        rest
                    };
                    out.push(format!("--output-dir-flat={dir}").into());
                    break;
                }
                'x' => return Err(unsupported("-x (extract, which restores kept paths)")),
                'P' => return Err(unsupported("-P (paths kept in the header)")),
                'I' => return Err(unsupported("-I (system information)")),
                _ => return Err(format!("invalid option '-{c}'")),
            }
        }
    }
    // An explicit -k overrides -U; -U with -c removes the input only when
    // forced, as lzop.
    if unlink && !keep {
        if stdout && !force {
            return Err("both '-c' and '-U' given (use '-f' to force)".to_string());
        }
        out.push("--rm".into());
    }
    if no_stdin && files == 0 {
        return Err("nothing to do !".to_string());
    }
    if no_warn && !quiet {
        LISTS_IN_FULL.store(true, Ordering::Relaxed);
        out.push("-q".into());
    }
    Ok(out)
}

/// What lzop says of each input done: `-t` says "testing X OK" (not
/// under `-q`), `-v` what it packed or unpacked into what.
pub(crate) fn said_of(
    common: &crate::CommonArgs,
    testing: bool,
    summaries: &[cairn_filepack::Summary],
) {
    use cairn_filepack::Operation;
    for s in summaries {
        if testing {
            if !quiet_lists(common.quiet) {
                errln!("testing {} OK", s.input);
            }
        } else if common.verbose > 0 {
            let doing = match s.operation {
                Operation::Pack => "compressing",
                Operation::Unpack => "decompressing",
            };
            errln!("{doing} {} into {}", s.input, s.output);
        }
    }
}

/// The name `lzop -l` gives what `path` unpacks to: the path without
/// `.lzo` (`.tzo` gives `.tar`), else with `.raw` added; standard input
/// is `<stdout>`, as lzop names it.
fn unpacked_name(path: &Path) -> String {
    if path.as_os_str() == "-" {
        return "<stdout>".to_string();
    }
    let name = path.display().to_string();
    if let Some(stem) = name.strip_suffix(".lzo").filter(|s| !s.is_empty()) {
        return stem.to_string();
    }
    if let Some(stem) = name.strip_suffix(".tzo").filter(|s| !s.is_empty()) {
        return format!("{stem}.tar");
    }
    format!("{name}.raw")
}

/// A line of `lzop -l`'s table (or of `-lv`'s, where `when` holds the
/// date and time column).
fn line(method: &str, packed: u64, unpacked: u64, when: Option<&str>, name: &str) -> String {
    let ratio = match unpacked {
        0 => 0.0,
        n => packed as f64 * 100.0 / n as f64,
    };
    match when {
        None => format!("{method:<11} {packed:>9} {unpacked:>9} {ratio:>5.1}% {name}"),
        Some(when) => {
            format!("{method:<11} {unpacked:>9} {packed:>9} {ratio:>5.1}%  {when}  {name}")
        }
    }
}

/// `lzop -l` (`-lv` with dates, `-lq` without the header and totals,
/// `-lN` with the names the headers keep): a line per member of each
/// file, from its headers and block sizes without decoding, files
/// passed over where lzop seeks; the totals of several members. A file
/// that is no lzop is said and the status is 1; a file of several
/// members is listed with the names they keep and a warning (status 2),
/// as lzop.
pub(crate) fn list(
    files: &[PathBuf],
    verbose: bool,
    quiet: bool,
    kept_names: bool,
) -> anyhow::Result<()> {
    use cairn_codec::format::lzop::{members, Member, F_MULTIPART};
    use std::io::{BufReader, Read, Seek};
    let stdin = [PathBuf::from("-")];
    let files = if files.is_empty() { &stdin[..] } else { files };
    let quiet = quiet_lists(quiet);
    let (mut listed, mut packed, mut unpacked) = (0u64, 0u64, 0u64);
    let mut status = 0u8;
    for path in files {
        let shown = path.display().to_string();
        let read: Result<Vec<Member>, String> = if path.as_os_str() == "-" {
            let mut r = BufReader::new(std::io::stdin().lock());
            members(&mut r, |r, n| {
                let got = std::io::copy(&mut r.by_ref().take(n), &mut std::io::sink())?;
                match got == n {
                    true => Ok(()),
                    false => Err(std::io::ErrorKind::UnexpectedEof.into()),
                }
            })
            .map_err(|e| reason(&e, &shown))
        } else {
            match std::fs::metadata(path) {
                Err(e) => Err(format!(
                    "{shown}: can't open input file: {}",
                    crate::pack::io_reason(&e)
                )),
                Ok(m) if !m.is_file() => {
                    status = status.max(2);
                    if !quiet {
                        errln!(
                            "{}: {shown}: warning: not a regular file -- skipped",
                            crate::prog()
                        );
                    }
                    continue;
                }
                Ok(m) => match std::fs::File::open(path) {
                    Err(e) => Err(format!(
                        "{shown}: can't open input file: {}",
                        crate::pack::io_reason(&e)
                    )),
                    Ok(f) => {
                        let len = m.len();
                        let mut r = BufReader::new(f);
                        members(&mut r, |r, n| r.seek_relative(n as i64))
                            .map_err(|e| reason(&e, &shown))
                            .and_then(|m| match r.stream_position() {
                                // Blocks passed over past the end: cut.
                                Ok(at) if at > len => {
                                    Err(format!("unexpected end of file: {shown}"))
                                }
                                _ => Ok(m),
                            })
                    }
                },
            }
        };
        let members = match read {
            Ok(m) => m,
            Err(why) => {
                errln!("{}: {why}", crate::prog());
                status = 1;
                continue;
            }
        };
        // A file of several members is found at its second one, or at
        // its first when it says it is one (`lzop -c a b` marks them
        // all); from there lzop names them by the names they keep.
        let found_at = match members.first() {
            Some(m) if m.header.flags & F_MULTIPART != 0 => 0,
            _ => 1,
        };
        for (i, m) in members.iter().enumerate() {
            if i == found_at {
                status = status.max(2);
                if !quiet {
                    errln!(
                        "{}: {shown}: warning: multipart archive -- restoring file names",
                        crate::prog()
                    );
                }
            }
            let name = match (kept_names || i >= found_at) && !m.header.name.is_empty() {
                true => String::from_utf8_lossy(&m.header.name).into_owned(),
                false => unpacked_name(path),
            };
            if listed == 0 && !quiet {
                match verbose {
                    false => outln!("method      compressed  uncompr. ratio uncompressed_name"),
                    true => {
                        outln!("Method         Length    Packed  Ratio     Date    Time   Name");
                        outln!("------         ------    ------  -----     ----    ----   ----");
                    }
                }
            }
            let when = verbose.then(|| date_time(m.header.mtime));
            outln!(
                "{}",
                line(
                    &m.header.method_name(),
                    m.packed,
                    m.unpacked,
                    when.as_deref(),
                    &name
                )
            );
            listed += 1;
            packed += m.packed;
            unpacked += m.unpacked;
        }
    }
    if listed > 1 && !quiet {
        match verbose {
            false => outln!(
                "{}",
                line(
                    "",
                    packed,
                    unpacked,
                    None,
                    &format!("(totals -- {listed} files)")
                )
            ),
            true => {
                outln!("              -------   -------  -----                    ----");
                outln!(
                    "{}",
                    line(
                        "",
                        packed,
                        unpacked,
                        Some(&" ".repeat(16)),
                        &format!("{listed} files")
                    )
                );
            }
        }
    }
    match status {
        0 => Ok(()),
        s => Err(crate::Warned(s).into()),
    }
}

/// lzop's words for what stops a listing.
fn reason(e: &cairn_codec::CodecError, name: &str) -> String {
    use cairn_codec::CodecError;
    tracing::debug!(error = %e, "lzop -l");
    match e {
        CodecError::UnknownFormat => format!("{name}: not a lzop file"),
        CodecError::Truncated { .. } => format!("unexpected end of file: {name}"),
        CodecError::Io { source, .. } if source.kind() == std::io::ErrorKind::UnexpectedEof => {
            format!("unexpected end of file: {name}")
        }
        CodecError::Io { source, .. } => {
            format!("{name}: read error: {}", crate::pack::io_reason(source))
        }
        _ => format!("{name}: header corrupted"),
    }
}

/// A kept time as `lzop -lv` shows it (local time, to the minute).
fn date_time(secs: u64) -> String {
    let t = i64::try_from(secs).unwrap_or(i64::MAX);
    match chrono::DateTime::from_timestamp(t, 0) {
        Some(utc) => utc
            .with_timezone(&chrono::Local)
            .format("%Y-%m-%d %H:%M")
            .to_string(),
        None => "????-??-?? ??:??".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    fn said(s: &str) -> String {
        arguments(words(s))
            .map(|w| {
                w.join(std::ffi::OsStr::new(" "))
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_else(|e| format!("error: {e}"))
    }

    #[test]
    fn lzop_words_are_said_in_cairns() {
        assert_eq!(said("-dv x.lzo"), "-d -v x.lzo");
        assert_eq!(said("-9U a b"), "-9 a b --rm");
        assert_eq!(said("-U -k a"), "a");
        assert_eq!(
            said("-cU a"),
            "error: both '-c' and '-U' given (use '-f' to force)"
        );
        assert_eq!(said("-cUf a"), "-c -f a --rm");
        assert_eq!(said("-ff a.lzo"), "-f a.lzo");
        assert_eq!(said("-p a"), "--output-dir-flat=. a");
        assert_eq!(said("-pd b"), "--output-dir-flat=d b");
        assert_eq!(said("-dpout x.lzo"), "-d --output-dir-flat=out x.lzo");
        assert_eq!(said("--path=d b"), "--output-dir-flat=d b");
        assert_eq!(said("-oy.lzo a"), "-o y.lzo a");
        assert_eq!(said("-o y.lzo a"), "-o y.lzo a");
        assert_eq!(said("--output y.lzo a"), "-o y.lzo a");
        assert_eq!(said("-S.lz a"), "--suffix=.lz a");
        assert_eq!(said("-S .lz a"), "--suffix=.lz a");
        assert_eq!(said("-F --crc32 a"), "--no-check --check=crc32 a");
        assert_eq!(said("-C --no-mode --mono a"), "a");
        assert_eq!(said("-- -U"), "-- -U");
        assert_eq!(said("-r a"), "error: invalid option '-r'");
        assert_eq!(said("--foo a"), "error: unrecognized option '--foo'");
        assert_eq!(said("-o"), "error: option '-o' requires an argument");
        assert_eq!(said("--no-stdin"), "error: nothing to do !");
        assert_eq!(said("--no-stdin a"), "a");
        assert!(said("-x a.lzo").starts_with("error: -x"));
    }

    #[test]
    fn names_are_listed_as_lzop_lists_them() {
        assert_eq!(unpacked_name(Path::new("d/a.lzo")), "d/a");
        assert_eq!(unpacked_name(Path::new("a.tzo")), "a.tar");
        assert_eq!(unpacked_name(Path::new("qq")), "qq.raw");
        assert_eq!(unpacked_name(Path::new(".lzo")), ".lzo.raw");
        assert_eq!(unpacked_name(Path::new("-")), "<stdout>");
        assert_eq!(
            line("LZO1X-1", 3444, 300000, None, "a"),
            "LZO1X-1          3444    300000   1.1% a"
        );
        assert_eq!(
            line("LZO1X-1", 300000, 300000, None, "r"),
            "LZO1X-1        300000    300000 100.0% r"
        );
        assert_eq!(
            line("LZO1X-1", 3444, 300000, Some("2026-11-30 14:18"), "a"),
            "LZO1X-1        300000      3444   1.1%  2026-11-30 14:18  a"
        );
        assert_eq!(
            line("", 0, 0, None, "z"),
            "                    0         0   0.0% z"
        );
    }
}
