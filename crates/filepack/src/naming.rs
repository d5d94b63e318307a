//! Output names, as gzip, pigz and zstd choose them: a suffix added when
//! packing, the format's suffix taken off when unpacking (`x.tgz` gives
//! `x.tar`), or the suffix `-S` names, as gzip and pigz take it. Names are
//! bytes, so a file name that is not UTF-8 keeps them.

use crate::{Error, MissingInput, Result};
use cairn_codec::Format;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The tar shorthands each format has besides its own suffix.
fn tar_suffixes(format: Format) -> &'static [&'static str] {
    match format {
        Format::Gzip => &[".tgz"],
        Format::Zstd => &[".tzst"],
        Format::Bzip2 => &[".tbz2", ".tbz"],
        Format::Xz => &[".txz"],
        Format::Lzma => &[".tlz"],
        _ => &[],
    }
}

/// The suffixes gzip also takes off when it decompresses, in any case
/// (`x.GZ`, `x-gz`, `x.z`, `x_z`), with what stands in their place.
const GZIP_OTHER_SUFFIXES: [(&str, &str); 6] = [
    (".gz", ""),
    ("-gz", ""),
    (".z", ""),
    ("-z", ""),
    ("_z", ""),
    (".taz", ".tar"),
];

/// The format a file name's suffix stands for, and the name without it
/// (`x.tgz` stands for `x.tar`). A bare suffix (`.gz`, `dir/.gz`) is a
/// hidden file's whole name, not a suffix.
pub fn format_of_name(path: &Path) -> Option<(Format, PathBuf)> {
    let name = path.as_os_str().as_bytes();
    let with_tail =
        |stem: &[u8], tail: &[u8]| PathBuf::from(OsString::from_vec([stem, tail].concat()));
    let lower = name.to_ascii_lowercase();
    for (suffix, tail) in GZIP_OTHER_SUFFIXES {
        if strip_suffix(&lower, suffix.as_bytes()).is_some() {
            let stem = &name[..name.len() - suffix.len()];
            return Some((Format::Gzip, with_tail(stem, tail.as_bytes())));
        }
    }
    for f in Format::EVERY {
        if let Some(stem) = strip_suffix(name, f.suffix().as_bytes()) {
            return Some((f, with_tail(stem, b"")));
        }
        for suffix in tar_suffixes(f) {
            if let Some(stem) = name.strip_suffix(suffix.as_bytes()) {
                return Some((f, with_tail(stem, b".tar")));
            }
        }
    }
    None
}

/// `name` without its suffix `suffix`, if it has it and something is
/// left of the file name (a bare suffix is a hidden file's whole name).
fn strip_suffix<'a>(name: &'a [u8], suffix: &[u8]) -> Option<&'a [u8]> {
    name.strip_suffix(suffix)
        .filter(|stem| !stem.is_empty() && !stem.ends_with(b"/"))
}

/// Check a suffix given with `-S`: something, and no directory in it.
pub fn check_suffix(suffix: &OsStr) -> Result<()> {
    let bytes = suffix.as_bytes();
    if bytes.is_empty() || bytes.contains(&b'/') {
        return Err(Error::BadSuffix(suffix.to_string_lossy().into_owned()));
    }
    Ok(())
}

/// The name `path` packs into: `suffix` (`-S`) added, else the format's.
/// As gzip and pigz, a name that has that suffix already, or the format's
/// own, is refused unless `force`.
pub fn packed_name(
    path: &Path,
    format: Format,
    suffix: Option<&OsStr>,
    force: bool,
) -> Result<PathBuf> {
    let name = path.as_os_str();
    let suffix = suffix.unwrap_or_else(|| OsStr::new(format.suffix()));
    let formats_own = format_of_name(path).is_some_and(|(f, _)| f == format);
    if !force && (formats_own || strip_suffix(name.as_bytes(), suffix.as_bytes()).is_some()) {
        return Err(Error::AlreadySuffixed {
            suffix: match formats_own {
                true => format.to_string(),
                false => suffix.to_string_lossy().into_owned(),
            },
        });
    }
    let mut name = name.to_owned();
    name.push(suffix);
    Ok(PathBuf::from(name))
}

/// The input read for a name to unpack that is not there, as `how` says
/// the tool looks for one (`None`: the name as given). Only a name the
/// system says does not exist is looked for, and a candidate that cannot
/// be looked at ends the search as the one read (its error is then
/// said), as in gzip. A link to nothing is there (read, it is refused as
/// a link), except to gzip where it follows links (`follows_links`: it
/// reads to standard output, tests, lists or is forced).
///
/// - gzip 1.12 ([`MissingInput::AsGzip`]): a name that ends in none of
///   gzip's suffixes (`.gz`, `.z`, `-gz`, `-z`, `_z`, `.tgz`, `.taz` in
///   any case, and `-S`'s; a suffix only with something other than `/`
///   before it): the first of NAME and `-S`'s suffix (else `.gz`),
///   NAME.gz, NAME.z, NAME-z and NAME.Z that is there; where none is,
///   NAME and that first suffix, the name then said missing (`gzip -d x`:
///   "x.gz: No such file or directory").
/// - pigz 2.6 ([`MissingInput::LookedForAsGzip`]): the first of NAME.z,
///   NAME-z, NAME_z, NAME.Z, NAME.gz, NAME-gz, NAME.zz, NAME-zz,
///   NAME.zip, NAME.ZIP and NAME.tgz that is there (`-S` plays no part);
///   where none is, the name as given.
pub fn missing_input(
    path: &Path,
    suffix: Option<&OsStr>,
    how: MissingInput,
    follows_links: bool,
) -> Option<PathBuf> {
    let follow = follows_links && how == MissingInput::AsGzip;
    let missing = |p: &Path| {
        let looked = if follow {
            p.metadata()
        } else {
            p.symlink_metadata()
        };
        looked.is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    };
    if how == MissingInput::AsGiven || !missing(path) {
        return None;
    }
    let with = |suffix: &[u8]| {
        let mut name = path.as_os_str().to_owned();
        name.push(OsStr::from_bytes(suffix));
        PathBuf::from(name)
    };
    let first_there = |tried: &[&[u8]]| tried.iter().map(|s| with(s)).find(|p| !missing(p));
    match how {
        MissingInput::AsGiven => None,
        MissingInput::AsGzip => {
            if has_gzip_suffix(path, suffix) {
                return None;
            }
            let first = suffix.map_or(&b".gz"[..], |s| s.as_bytes());
            Some(first_there(&[first, b".gz", b".z", b"-z", b".Z"]).unwrap_or_else(|| with(first)))
        }
        MissingInput::LookedForAsGzip => first_there(&[
            b".z", b"-z", b"_z", b".Z", b".gz", b"-gz", b".zz", b"-zz", b".zip", b".ZIP", b".tgz",
        ]),
    }
}

/// Whether `path` ends in one of gzip's suffixes or `suffix` (`-S`), in
/// any case, with something other than `/` before it.
fn has_gzip_suffix(path: &Path, suffix: Option<&OsStr>) -> bool {
    let lower = path.as_os_str().as_bytes().to_ascii_lowercase();
    let given = suffix.map(|s| s.as_bytes().to_ascii_lowercase());
    let own: [&[u8]; 7] = [b".gz", b".z", b"-gz", b"-z", b"_z", b".tgz", b".taz"];
    let ends_in = |s: &[u8]| strip_suffix(&lower, s).is_some();
    own.into_iter().any(ends_in) || given.as_deref().is_some_and(ends_in)
}

/// The name `path` unpacks into: `suffix` (`-S`) taken off if it ends
/// with it, else its format's suffix.
pub fn unpacked_name(path: &Path, suffix: Option<&OsStr>) -> Result<PathBuf> {
    let name = path.as_os_str().as_bytes();
    if let Some(stem) = suffix.and_then(|s| strip_suffix(name, s.as_bytes())) {
        return Ok(PathBuf::from(OsString::from_vec(stem.to_vec())));
    }
    format_of_name(path)
        .map(|(_, out)| out)
        .ok_or(Error::UnknownSuffix)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;

    #[test]
    fn a_missing_name_is_looked_for_as_gzip_and_pigz_look() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let at = |n: &str| d.join(n);
        let name = |p: PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
        let gzip = |n: &str, s: Option<&str>| {
            missing_input(&at(n), s.map(OsStr::new), MissingInput::AsGzip, false).map(name)
        };
        // gzip -c, -t, -l and -f follow links.
        let gzip_c = |n: &str| missing_input(&at(n), None, MissingInput::AsGzip, true).map(name);
        let pigz =
            |n: &str| missing_input(&at(n), None, MissingInput::LookedForAsGzip, true).map(name);
        // None there: gzip names NAME and its first suffix missing.
        assert_eq!(gzip("x", None).as_deref(), Some("x.gz"));
        assert_eq!(gzip("x.xz", None).as_deref(), Some("x.xz.gz"));
        assert_eq!(gzip("x", Some(".foo")).as_deref(), Some("x.foo"));
        assert_eq!(gzip(".gz", None).as_deref(), Some(".gz.gz"));
        for own in [
            "x.gz", "x.GZ", "x.z", "x-gz", "x-z", "x_z", "x.tgz", "x.taz",
        ] {
            assert_eq!(gzip(own, None), None, "{own}");
        }
        assert_eq!(gzip("x.foo", Some(".foo")), None);
        assert_eq!(pigz("x"), None);
        assert_eq!(
            missing_input(&at("x"), None, MissingInput::AsGiven, false),
            None
        );
        // Each finds the first of its list that is there: all of the
        // candidates made, the first of the list goes each time.
        let gzip_order = ["x.gz", "x.z", "x-z", "x.Z"];
        let pigz_order = [
            "x.z", "x-z", "x_z", "x.Z", "x.gz", "x-gz", "x.zz", "x-zz", "x.zip", "x.ZIP", "x.tgz",
        ];
        for n in pigz_order {
            std::fs::write(at(n), b"").unwrap();
        }
        for want in gzip_order {
            assert_eq!(gzip("x", None).as_deref(), Some(want));
            std::fs::remove_file(at(want)).unwrap();
        }
        for n in gzip_order {
            std::fs::write(at(n), b"").unwrap();
        }
        for want in pigz_order {
            assert_eq!(pigz("x").as_deref(), Some(want));
            std::fs::remove_file(at(want)).unwrap();
        }
        // Only what gzip looks for: x-gz, x_z and the rest are not.
        for n in ["x-gz", "x_z", "x.zz", "x.tgz"] {
            std::fs::write(at(n), b"").unwrap();
        }
        assert_eq!(gzip("x", None).as_deref(), Some("x.gz"));
        // -S's suffix first, then gzip's; a name with another format's
        // suffix is looked for too.
        std::fs::write(at("x.gz"), b"").unwrap();
        assert_eq!(gzip("x", Some(".foo")).as_deref(), Some("x.gz"));
        std::fs::write(at("x.foo"), b"").unwrap();
        assert_eq!(gzip("x", Some(".foo")).as_deref(), Some("x.foo"));
        std::fs::write(at("y.zst.gz"), b"").unwrap();
        assert_eq!(gzip("y.zst", None).as_deref(), Some("y.zst.gz"));
        assert_eq!(pigz("y.zst").as_deref(), Some("y.zst.gz"));
        // A link to nothing is there (read, it fails as a link), and so
        // is a candidate that is one: the search stops at it; but not
        // where gzip follows links, and pigz never follows them.
        std::os::unix::fs::symlink(at("nowhere"), at("dangle")).unwrap();
        std::fs::write(at("dangle.gz"), b"").unwrap();
        assert_eq!(gzip("dangle", None), None);
        assert_eq!(gzip_c("dangle").as_deref(), Some("dangle.gz"));
        assert_eq!(pigz("dangle"), None);
        std::os::unix::fs::symlink(at("nowhere"), at("w.gz")).unwrap();
        std::fs::write(at("w.z"), b"").unwrap();
        assert_eq!(gzip("w", None).as_deref(), Some("w.gz"));
        assert_eq!(gzip_c("w").as_deref(), Some("w.z"));
        assert_eq!(pigz("w").as_deref(), Some("w.z"));
        // A name the system cannot look at for another reason is not
        // looked for (x.foo is a file, so x.foo/x is no name).
        assert_eq!(gzip("x.foo/x", None), None);
        // A name that is there is read as it is.
        assert_eq!(gzip("x.foo", None), None);
        assert_eq!(pigz("x.foo"), None);
    }

    #[test]
    fn suffixes_name_formats_and_come_off() {
        for (name, format, out) in [
            ("x.gz", Format::Gzip, "x"),
            ("dir/x.tar.zst", Format::Zstd, "dir/x.tar"),
            ("x.tgz", Format::Gzip, "x.tar"),
            ("x.tzst", Format::Zstd, "x.tar"),
            ("x.tbz2", Format::Bzip2, "x.tar"),
            ("x.tbz", Format::Bzip2, "x.tar"),
            ("x.txz", Format::Xz, "x.tar"),
            ("x.lz4", Format::Lz4, "x"),
            ("x.sz", Format::Snappy, "x"),
            ("x.lzo", Format::Lzop, "x"),
            ("x.bz2", Format::Bzip2, "x"),
            ("x.xz", Format::Xz, "x"),
            // gzip's others, in any case.
            ("x.GZ", Format::Gzip, "x"),
            ("x-gz", Format::Gzip, "x"),
            ("x.z", Format::Gzip, "x"),
            ("x_Z", Format::Gzip, "x"),
            ("x-z", Format::Gzip, "x"),
            ("x.TAZ", Format::Gzip, "x.tar"),
        ] {
            let (f, stem) = format_of_name(Path::new(name)).unwrap();
            assert_eq!((f, stem.as_path()), (format, Path::new(out)), "{name}");
            assert_eq!(
                unpacked_name(Path::new(name), None).unwrap(),
                Path::new(out)
            );
        }
        for name in ["x", "x.gzip", ".gz", "dir/.zst", "x.tar"] {
            assert!(format_of_name(Path::new(name)).is_none(), "{name}");
            assert!(matches!(
                unpacked_name(Path::new(name), None),
                Err(Error::UnknownSuffix)
            ));
        }
    }

    #[test]
    fn packing_adds_the_suffix_once_unless_forced() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(
            packed_name(&p("x"), Format::Gzip, None, false).unwrap(),
            p("x.gz")
        );
        assert_eq!(
            packed_name(&p("x.gz"), Format::Zstd, None, false).unwrap(),
            p("x.gz.zst")
        );
        assert!(matches!(
            packed_name(&p("x.gz"), Format::Gzip, None, false),
            Err(Error::AlreadySuffixed { ref suffix }) if suffix == "gzip"
        ));
        assert!(matches!(
            packed_name(&p("x.tgz"), Format::Gzip, None, false),
            Err(Error::AlreadySuffixed { .. })
        ));
        assert_eq!(
            packed_name(&p("x.gz"), Format::Gzip, None, true).unwrap(),
            p("x.gz.gz")
        );
    }

    #[test]
    fn names_are_bytes() {
        let raw = PathBuf::from(OsString::from_vec(b"caf\xe9.gz".to_vec()));
        let out = unpacked_name(&raw, None).unwrap();
        assert_eq!(out.as_os_str().as_bytes(), b"caf\xe9");
        let packed = packed_name(&out, Format::Xz, None, false).unwrap();
        assert_eq!(packed.as_os_str().as_bytes(), b"caf\xe9.xz");
    }

    #[test]
    fn a_suffix_of_ones_own_is_added_and_taken_off() {
        let p = |s: &str| PathBuf::from(s);
        let z = Some(OsStr::new(".z"));
        assert_eq!(
            packed_name(&p("x"), Format::Gzip, z, false).unwrap(),
            p("x.z")
        );
        // Its own suffix, or the format's, is there already (as gzip -S).
        for name in ["x.z", "x.gz"] {
            assert!(matches!(
                packed_name(&p(name), Format::Gzip, z, false),
                Err(Error::AlreadySuffixed { .. })
            ));
        }
        assert_eq!(unpacked_name(&p("d/x.z"), z).unwrap(), p("d/x"));
        // The known suffixes still come off; a bare suffix is a name.
        assert_eq!(unpacked_name(&p("x.gz"), z).unwrap(), p("x"));
        assert!(unpacked_name(&p("d/.z"), z).is_err());
        for bad in ["", "a/b"] {
            assert!(matches!(
                check_suffix(OsStr::new(bad)),
                Err(Error::BadSuffix(_))
            ));
        }
        check_suffix(OsStr::new("_packed")).unwrap();
    }
}
