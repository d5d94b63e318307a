//! Output names, as gzip, pigz and zstd choose them: a suffix added when
//! packing, the format's suffix taken off when unpacking (`x.tgz` gives
//! `x.tar`). Names are bytes, so a file name that is not UTF-8 keeps them.

use crate::{Error, Result};
use cairn_codec::Format;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The tar shorthands each format has besides its own suffix.
fn tar_suffixes(format: Format) -> &'static [&'static str] {
    match format {
        Format::Gzip => &[".tgz"],
        Format::Zstd => &[".tzst"],
        Format::Bzip2 => &[".tbz2", ".tbz"],
        Format::Xz => &[".txz"],
        _ => &[],
    }
}

/// The format a file name's suffix stands for, and the name without it
/// (`x.tgz` stands for `x.tar`). A bare suffix (`.gz`, `dir/.gz`) is a
/// hidden file's whole name, not a suffix.
pub fn format_of_name(path: &Path) -> Option<(Format, PathBuf)> {
    let name = path.as_os_str().as_bytes();
    let with_tail =
        |stem: &[u8], tail: &[u8]| PathBuf::from(OsString::from_vec([stem, tail].concat()));
    for f in Format::ALL {
        if let Some(stem) = name.strip_suffix(f.suffix().as_bytes()) {
            if !stem.is_empty() && !stem.ends_with(b"/") {
                return Some((f, with_tail(stem, b"")));
            }
        }
        for suffix in tar_suffixes(f) {
            if let Some(stem) = name.strip_suffix(suffix.as_bytes()) {
                return Some((f, with_tail(stem, b".tar")));
            }
        }
    }
    None
}

/// The name `path` packs into: the format's suffix added. As gzip and
/// pigz, a name that has that suffix already is refused unless `force`.
pub fn packed_name(path: &Path, format: Format, force: bool) -> Result<PathBuf> {
    if !force && format_of_name(path).is_some_and(|(f, _)| f == format) {
        return Err(Error::AlreadySuffixed { format });
    }
    let mut name = path.as_os_str().to_owned();
    name.push(format.suffix());
    Ok(PathBuf::from(name))
}

/// The name `path` unpacks into: its format's suffix taken off.
pub fn unpacked_name(path: &Path) -> Result<PathBuf> {
    format_of_name(path)
        .map(|(_, out)| out)
        .ok_or(Error::UnknownSuffix)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;

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
        ] {
            let (f, stem) = format_of_name(Path::new(name)).unwrap();
            assert_eq!((f, stem.as_path()), (format, Path::new(out)), "{name}");
            assert_eq!(unpacked_name(Path::new(name)).unwrap(), Path::new(out));
        }
        for name in ["x", "x.gzip", ".gz", "dir/.zst", "x.tar"] {
            assert!(format_of_name(Path::new(name)).is_none(), "{name}");
            assert!(matches!(
                unpacked_name(Path::new(name)),
                Err(Error::UnknownSuffix)
            ));
        }
    }

    #[test]
    fn packing_adds_the_suffix_once_unless_forced() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(
            packed_name(&p("x"), Format::Gzip, false).unwrap(),
            p("x.gz")
        );
        assert_eq!(
            packed_name(&p("x.gz"), Format::Zstd, false).unwrap(),
            p("x.gz.zst")
        );
        assert!(matches!(
            packed_name(&p("x.gz"), Format::Gzip, false),
            Err(Error::AlreadySuffixed {
                format: Format::Gzip
            })
        ));
        assert!(matches!(
            packed_name(&p("x.tgz"), Format::Gzip, false),
            Err(Error::AlreadySuffixed { .. })
        ));
        assert_eq!(
            packed_name(&p("x.gz"), Format::Gzip, true).unwrap(),
            p("x.gz.gz")
        );
    }

    #[test]
    fn names_are_bytes() {
        let raw = PathBuf::from(OsString::from_vec(b"caf\xe9.gz".to_vec()));
        let out = unpacked_name(&raw).unwrap();
        assert_eq!(out.as_os_str().as_bytes(), b"caf\xe9");
        let packed = packed_name(&out, Format::Xz, false).unwrap();
        assert_eq!(packed.as_os_str().as_bytes(), b"caf\xe9.xz");
    }
}
