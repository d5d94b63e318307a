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

/// lzop's long options, each a unique prefix of which is taken as it
/// (as lzop's getopt takes `--decomp`).
const LONG_OPTIONS: [&str; 38] = [
    "decompress",
    "uncompress",
    "test",
    "list",
    "stdout",
    "to-stdout",
    "force",
    "quiet",
    "silent",
    "verbose",
    "name",
    "no-name",
    "no-time",
    "fast",
    "best",
    "help",
    "version",
    "license",
    "crc32",
    "no-checksum",
    "ignore-warn",
    "keep",
    "unlink",
    "delete",
    "no-warn",
    "no-stdin",
    "no-mode",
    "no-color",
    "mono",
    "color",
    "checksum",
    "output",
    "suffix",
    "path",
    "extract",
    "ls",
    "info",
    "sysinfo",
];

/// The long option `given` names: itself, or the one it is a unique
/// prefix of.
fn long_option(given: &str) -> Result<&'static str, String> {
    if let Some(exact) = LONG_OPTIONS.iter().find(|&&o| o == given) {
        return Ok(exact);
    }
    if given == "filter" || given.starts_with("filter") {
        return Ok("filter");
    }
    let mut starting = LONG_OPTIONS.iter().filter(|o| o.starts_with(given));
    match (starting.next(), starting.next()) {
        (Some(one), None) if !given.is_empty() => Ok(one),
        (Some(_), Some(_)) => Err(format!("option '--{given}' is ambiguous")),
        _ => Err(format!("unrecognized option '--{given}'")),
    }
}

/// lzop's `-S` value: a dot put in front if missing; more than one dot,
/// or a '/', refused as lzop refuses it.
fn lzop_suffix(value: &str) -> Result<String, String> {
    let suffix = match value.starts_with('.') {
        true => value.to_string(),
        false => format!(".{value}"),
    };
    if suffix.len() < 2 || suffix[1..].contains(['.', '/']) {
        return Err(format!("invalid suffix '{suffix}'"));
    }
    Ok(suffix)
}

/// lzop's arguments (after the program's name) as `cairn pack`'s, after
/// the link's `pack -F lzop -k`; an error is lzop's line for a command
/// line it refuses.
pub(crate) fn arguments(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let mut out: Vec<OsString> = Vec::new();
    let mut names: Vec<OsString> = Vec::new();
    let (mut keep, mut unlink, mut stdout, mut force) = (false, false, false, false);
    let (mut quiet, mut no_warn, mut no_stdin) = (false, false, false);
    let (mut output, mut suffix, mut dir) = (None::<String>, None::<String>, None::<String>);
    let mut words = args.into_iter();
    let unsupported = |what: &str| format!("{what} is not supported by cairn's lzop");
    // A value: the rest of the word, else the next word.
    let value_of = |given: Option<String>, words: &mut std::vec::IntoIter<OsString>, what: &str| {
        given
            .or_else(|| words.next().and_then(|w| w.into_string().ok()))
            .ok_or_else(|| format!("option '{what}' requires an argument"))
    };
    let set_once = |slot: &mut Option<String>, value: String, what: &str| match slot {
        Some(_) => Err(format!("option '{what}' more than once given")),
        None => {
            *slot = Some(value);
            Ok(())
        }
    };
    while let Some(word) = words.next() {
        let Some(text) = word.to_str().map(str::to_string) else {
            // A name that is no UTF-8 is a file (lzop's options are ASCII).
            names.push(word);
            continue;
        };
        if text == "--" {
            names.extend(words.by_ref());
            break;
        }
        if let Some(long) = text.strip_prefix("--") {
            let (given, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let name = long_option(given)?;
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
                "ignore-warn" => {
                    no_warn = true;
                    &["-Q"]
                }
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
                    let v = value_of(value, &mut words, "--output")?;
                    set_once(&mut output, v, "-o")?;
                    continue;
                }
                "suffix" => {
                    let v = value_of(value, &mut words, "--suffix")?;
                    set_once(&mut suffix, lzop_suffix(&v)?, "-S")?;
                    continue;
                }
                "path" => {
                    let v = value_of(value, &mut words, "--path")?;
                    dir = Some(v);
                    continue;
                }
                "extract" => return Err(unsupported("--extract (-x, which restores kept paths)")),
                _ => return Err(unsupported(&format!("--{name}"))),
            };
            out.extend(flag.iter().map(OsString::from));
            continue;
        }
        if text == "-" || !text.starts_with('-') {
            names.push(word);
            continue;
        }
        // A cluster of letters; -o and -S take the rest or the next word,
        // -p the rest only (a bare -p is the current directory).
        let letters: Vec<char> = text[1..].chars().collect();
        for (i, &c) in letters.iter().enumerate() {
            let rest: String = letters[i + 1..].iter().collect();
            let rest = (!rest.is_empty()).then_some(rest);
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
                'o' => {
                    let v = value_of(rest, &mut words, "-o")?;
                    set_once(&mut output, v, "-o")?;
                    break;
                }
                'S' => {
                    let v = value_of(rest, &mut words, "-S")?;
                    set_once(&mut suffix, lzop_suffix(&v)?, "-S")?;
                    break;
                }
                'p' => {
                    dir = Some(rest.unwrap_or_else(|| ".".to_string()));
                    break;
                }
                'x' => return Err(unsupported("-x (extract, which restores kept paths)")),
                'P' => return Err(unsupported("-P (paths kept in the header)")),
                'I' => return Err(unsupported("-I (system information)")),
                _ => return Err(format!("invalid option '-{c}'")),
            }
        }
    }
    if stdout && output.is_some() {
        return Err("cannot use both '-c' and '-o'".to_string());
    }
    if stdout && suffix.is_some() {
        return Err("cannot use both '-c' and '-S'".to_string());
    }
    if let Some(o) = output {
        out.extend(["-o".into(), o.into()]);
    }
    if let Some(s) = suffix {
        out.push(format!("--suffix={s}").into());
    }
    if let Some(d) = dir {
        // lzop makes no directory: one that is not there is refused.
        if !Path::new(&d).is_dir() {
            return Err(format!("{d}: invalid path: No such file or directory"));
        }
        out.push(format!("--output-dir-flat={d}").into());
    }
    // An explicit -k overrides -U; -U with -c removes the input only when
    // forced, as lzop (cairn keeps an input written to standard output).
    if unlink && !keep {
        if stdout && !force {
            return Err("both '-c' and '-U' given (use '-f' to force)".to_string());
        }
        out.push("--rm".into());
    }
    if no_stdin && names.is_empty() {
        return Err("nothing to do !".to_string());
    }
    // --no-warn and --ignore-warn hide warnings as -q does, but not the
    // -l and -t lines -q drops.
    if no_warn && !quiet {
        LISTS_IN_FULL.store(true, Ordering::Relaxed);
        out.push("-q".into());
    }
    out.push("--".into());
    out.extend(names);
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
            // (Of each part of a file of parts.)
            for _ in 0..s.lzop_parts.unwrap_or(1) {
                if !quiet_lists(common.quiet) {
                    errln!("testing {} OK", crate::Tool::Lzop.input_name(&s.input));
                }
            }
        } else if common.verbose > 0 {
            let doing = match s.operation {
                Operation::Pack => "compressing",
                Operation::Unpack => "decompressing",
            };
            // lzop's names for the standard streams.
            let named = |n: &str| match n {
                "(stdout)" => "<stdout>".to_string(),
                n => crate::Tool::Lzop.input_name(n).to_string(),
            };
            errln!("{doing} {} into {}", named(&s.input), named(&s.output));
        }
    }
}

/// The name `lzop -l` gives what `path` unpacks to: the path without
/// its suffix (`-S`'s, `.lzo` or `.lzop`, in any case; `.tzo` gives
/// `.tar`), else with `.raw` added; standard input is `<stdout>`, as
/// lzop names it.
fn unpacked_name(path: &Path, suffix: Option<&str>) -> String {
    if path.as_os_str() == "-" {
        return "<stdout>".to_string();
    }
    let name = path.display().to_string();
    let ends_with = |suf: &str| {
        let cut = name.len().checked_sub(suf.len())?;
        let (stem, end) = (name.get(..cut)?, name.get(cut..)?);
        (end.eq_ignore_ascii_case(suf) && !stem.is_empty() && !stem.ends_with('/')).then_some(stem)
    };
    for suf in suffix.into_iter().chain([".lzo", ".lzop"]) {
        if let Some(stem) = ends_with(suf) {
            return stem.to_string();
        }
    }
    match ends_with(".tzo") {
        Some(stem) => format!("{stem}.tar"),
        None => format!("{name}.raw"),
    }
}

/// A line of `lzop -l`'s table (or of `-lv`'s, where `when` holds the
/// date and time column).
fn line(method: &str, packed: u64, unpacked: u64, when: Option<&str>, name: &str) -> String {
    // Tenths of a percent, rounded half up in integers as lzop does.
    let tenths = match unpacked {
        0 => 0,
        n => (u128::from(packed) * 1_000_000 / u128::from(n) + 500) / 1000,
    };
    let ratio = format!("{}.{}", tenths / 10, tenths % 10);
    match when {
        None => format!("{method:<11} {packed:>9} {unpacked:>9} {ratio:>5}% {name}"),
        Some(when) => {
            format!("{method:<11} {unpacked:>9} {packed:>9} {ratio:>5}%  {when}  {name}")
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
pub(crate) fn list(common: &crate::CommonArgs) -> anyhow::Result<()> {
    use cairn_codec::format::lzop::{members, Listing};
    use std::io::{BufReader, Read};
    let stdin = [PathBuf::from("-")];
    let files = match common.files.is_empty() {
        true => &stdin[..],
        false => &common.files[..],
    };
    let (verbose, kept_names) = (common.verbose > 0, common.name);
    let suffix = common.suffix.as_deref().and_then(std::ffi::OsStr::to_str);
    // -q drops the header and totals and hides warnings; --no-warn and
    // --ignore-warn only hide the warnings.
    let (quiet, hide_warnings) = (quiet_lists(common.quiet), common.quiet);
    let (mut listed, mut packed, mut unpacked) = (0u64, 0u64, 0u64);
    let mut status = 0u8;
    for path in files {
        let shown = path.display().to_string();
        let read: Result<Listing, String> = if path.as_os_str() == "-" {
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
                    if !hide_warnings {
                        errln!(
                            "{}: {shown}: warning: not a regular file -- skipped",
                            crate::prog()
                        );
                    }
                    continue;
                }
                Ok(_) => match std::fs::File::open(path) {
                    Err(e) => Err(format!(
                        "{shown}: can't open input file: {}",
                        crate::pack::io_reason(&e)
                    )),
                    Ok(f) => {
                        let mut r = BufReader::new(f);
                        // (Blocks passed over past the end are found
                        // by the read of the next block's sizes: cut.)
                        members(&mut r, |r, n| r.seek_relative(n as i64))
                            .map_err(|e| reason(&e, &shown))
                    }
                },
            }
        };
        let listing = match read {
            Ok(m) => m,
            Err(why) => {
                errln!("{}: {why}", crate::prog());
                status = 1;
                continue;
            }
        };
        // In a file of parts, lzop names members from one on by the
        // names they keep (and says so, but not when told to with -N).
        let found_at = listing.parts_named_from();
        let Listing {
            members,
            garbage_at,
        } = listing;
        for (i, m) in members.iter().enumerate() {
            if Some(i) == found_at && !kept_names {
                status = status.max(2);
                if !hide_warnings {
                    errln!(
                        "{}: {shown}: warning: multipart archive -- restoring file names",
                        crate::prog()
                    );
                }
            }
            let by_kept = kept_names || found_at.is_some_and(|from| i >= from);
            let name = match by_kept && !m.header.name.is_empty() {
                true => String::from_utf8_lossy(&m.header.name).into_owned(),
                false => unpacked_name(path, suffix),
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
        if garbage_at.is_some() {
            status = status.max(2);
            if !hide_warnings {
                errln!(
                    "{}: {shown}: warning: ignoring trailing garbage in lzop file",
                    crate::prog()
                );
            }
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
        // --ignore-warn: warnings do not change the status.
        2 if common.no_warn => Ok(()),
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
        CodecError::Corrupt { reason, .. } if reason.contains("header checksum") => {
            format!("{name}: header corrupted (checksum error)")
        }
        CodecError::Corrupt { reason, .. } if reason.starts_with("block sizes") => {
            format!("{name}: lzop file corrupted")
        }
        _ => format!("{name}: header corrupted"),
    }
}

/// A kept time as `lzop -lv` shows it (local time, to the minute).
fn date_time(secs: i64) -> String {
    match chrono::DateTime::from_timestamp(secs, 0) {
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
        assert_eq!(said("-dv x.lzo"), "-d -v -- x.lzo");
        assert_eq!(said("-9U a b"), "-9 --rm -- a b");
        assert_eq!(said("-U -k a"), "-- a");
        assert_eq!(
            said("-cU a"),
            "error: both '-c' and '-U' given (use '-f' to force)"
        );
        assert_eq!(said("-cUf a"), "-c -f --rm -- a");
        assert_eq!(said("-ff a.lzo"), "-f -- a.lzo");
        // Flags said at the end come before the names, -- or not.
        assert_eq!(said("-U -- a"), "--rm -- a");
        assert_eq!(said("--no-warn -- -U"), "-q -- -U");
        assert_eq!(said("-p a"), "--output-dir-flat=. -- a");
        assert_eq!(said("-p/ b"), "--output-dir-flat=/ -- b");
        assert_eq!(said("--path=/ b"), "--output-dir-flat=/ -- b");
        assert_eq!(said("--path / b"), "--output-dir-flat=/ -- b");
        assert_eq!(
            said("-p/no/such/dir a"),
            "error: /no/such/dir: invalid path: No such file or directory"
        );
        assert_eq!(said("-oy.lzo a"), "-o y.lzo -- a");
        assert_eq!(said("-o y.lzo a"), "-o y.lzo -- a");
        assert_eq!(said("--output y.lzo a"), "-o y.lzo -- a");
        assert_eq!(said("--out=y.lzo a"), "-o y.lzo -- a");
        assert_eq!(
            said("-o x -o y a"),
            "error: option '-o' more than once given"
        );
        assert_eq!(said("-c -o x a"), "error: cannot use both '-c' and '-o'");
        assert_eq!(said("-S.lz a"), "--suffix=.lz -- a");
        assert_eq!(said("-S lz a"), "--suffix=.lz -- a");
        assert_eq!(said("-S .a.b a"), "error: invalid suffix '.a.b'");
        assert_eq!(said("-F --crc32 a"), "--no-check --check=crc32 -- a");
        assert_eq!(said("-C --no-mode --mono a"), "-- a");
        assert_eq!(said("--decomp --verb x.lzo"), "-d -v -- x.lzo");
        assert_eq!(said("--no a"), "error: option '--no' is ambiguous");
        assert_eq!(said("-r a"), "error: invalid option '-r'");
        assert_eq!(said("--foo a"), "error: unrecognized option '--foo'");
        assert_eq!(said("-o"), "error: option '-o' requires an argument");
        assert_eq!(said("--no-stdin"), "error: nothing to do !");
        assert_eq!(said("--no-stdin a"), "-- a");
        assert!(said("-x a.lzo").starts_with("error: -x"));
        assert!(said("--filter=1 a").starts_with("error: --filter"));
    }

    #[test]
    fn names_are_listed_as_lzop_lists_them() {
        let name = |p: &str, suffix: Option<&str>| unpacked_name(Path::new(p), suffix);
        assert_eq!(name("d/a.lzo", None), "d/a");
        assert_eq!(name("X.LZO", None), "X");
        assert_eq!(name("x.lzop", None), "x");
        assert_eq!(name("a.Tzo", None), "a.tar");
        assert_eq!(name("a.xx", Some(".xx")), "a");
        assert_eq!(name("qq", None), "qq.raw");
        assert_eq!(name(".lzo", None), ".lzo.raw");
        assert_eq!(name("d/.lzo", None), "d/.lzo.raw");
        assert_eq!(name("-", None), "<stdout>");
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
        // Halves round up, as lzop's integers do.
        assert!(line("", 49, 400, None, "r").ends_with(" 12.3% r"));
        assert!(line("", 3, 2000, None, "r").ends_with("  0.2% r"));
        assert!(line("", 2, 3, None, "r").ends_with(" 66.7% r"));
    }
}
