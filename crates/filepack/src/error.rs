//! Errors of the file engine: each names the file it is about, and its
//! text is one line a user can act on (the CLI prints it as it is).

use cairn_codec::{CodecError, Format};
use std::io;
use std::path::PathBuf;

/// What went wrong in a pack or unpack run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An input could not be opened or examined.
    #[error("{}: {source}", path.display())]
    Open {
        /// The input.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A directory was named as an input.
    #[error("{}: is a directory (-r takes the files in it)", path.display())]
    IsDirectory {
        /// The input.
        path: PathBuf,
    },
    /// Standard input or output could not be duplicated as a file.
    #[error("cannot duplicate {stream}: {source}")]
    Duplicate {
        /// `stdin` or `stdout`.
        stream: &'static str,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Reading an input failed.
    #[error("read {name}: {source}")]
    Read {
        /// The input's name.
        name: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Writing an output failed.
    #[error("{name}: {source}")]
    Write {
        /// The output's name.
        name: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The output exists and `force` was not given.
    #[error("{} already exists; use -f to overwrite", path.display())]
    Exists {
        /// The output.
        path: PathBuf,
    },
    /// An output path that names no file (`/`, `..`).
    #[error("{}: not a file name", path.display())]
    NotAFileName {
        /// The output.
        path: PathBuf,
    },
    /// `--output-dir-mirror` of a path that goes up (`../x`): its output
    /// would be outside the directory.
    #[error("{}: a path with '..' in it has no place under --output-dir-mirror", path.display())]
    OutsideMirror {
        /// The input's output name.
        path: PathBuf,
    },
    /// An output (its temporary file, or a special file) could not be opened.
    #[error("cannot {action} {}: {source}", path.display())]
    CreateOutput {
        /// `create` or `open`.
        action: &'static str,
        /// The output.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Making a complete output final failed (fsync, rename).
    #[error("{action} {}: {source}", path.display())]
    Commit {
        /// What failed, with its object: `fsync`, `rename X to`.
        action: String,
        /// The output.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// An input could not be removed after its output was complete.
    #[error("remove {}: {source}", path.display())]
    Remove {
        /// The input.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Compressed data would go to a terminal, without `force`.
    #[error("compressed data not written to a terminal; use -f to force, or redirect")]
    TerminalOutput,
    /// Compressed data would be read from a terminal, without `force`.
    #[error("compressed data not read from a terminal; use -f to force, or redirect")]
    TerminalInput,
    /// The input already has the suffix it would be given (`x.gz` into
    /// `x.gz.gz`), or its format's, without `force`.
    #[error("has the {suffix} suffix already; unchanged")]
    AlreadySuffixed {
        /// The format's name, or the suffix `-S` gave.
        suffix: String,
    },
    /// A device, FIFO or socket given as an input whose output would be
    /// named from it (gzip refuses it too, even with `-f`).
    #[error("not a regular file; unchanged (-c or -o reads it as a stream)")]
    NotRegular,
    /// A device, FIFO or socket met in a directory `-r` walks: never read
    /// (a FIFO would wait for a writer), and said, as gzip -r says it.
    #[error("is not a directory or a regular file; ignored by -r")]
    NotRegularInTree,
    /// The input is a symbolic link left alone ([`crate::Options::links`]),
    /// without `force`.
    #[error("is a symbolic link; unchanged (-f follows it{})", if *.read_by_stdout { ", -c reads it" } else { "" })]
    SymlinkInput {
        /// Said as a warning ([`crate::Options::symlink_warns`]).
        warning: bool,
        /// Whether `-c` would read it ([`crate::Links::WhereNamed`]).
        read_by_stdout: bool,
    },
    /// The input has other hard links and would be removed, without
    /// `force`.
    #[error("has {0} other link(s); unchanged (-k keeps the input, -f removes this name)")]
    OtherLinks(u64),
    /// The input's mode has a set-user-ID, set-group-ID or sticky bit
    /// (gzip refuses it even with `force`, xz and cairn without;
    /// [`crate::SpecialModes`]).
    #[error("{0}; unchanged (-c reads it)")]
    SpecialMode(&'static str),
    /// A suffix (`-S`) that is empty or names a directory.
    #[error("-S {0:?}: a suffix must be non-empty and have no '/'")]
    BadSuffix(String),
    /// An input to unpack whose name has no known suffix, and no output
    /// was named.
    #[error("unknown suffix; use -c or -o to name the output")]
    UnknownSuffix,
    /// A level the format's encoder does not have.
    #[error("{format} has no level {level}{}", level_range(*lo, *hi, *format))]
    NoSuchLevel {
        /// The format.
        format: Format,
        /// The level asked for.
        level: i32,
        /// The format's lowest level.
        lo: i32,
        /// The format's highest level.
        hi: i32,
    },
    /// A block size over [`crate::MAX_BLOCK`].
    #[error("-b {0}: block size over the 64 MiB limit")]
    BlockTooLarge(usize),
    /// More threads than [`crate::MAX_THREADS`].
    #[error("-T {0}: too many threads (at most 1024)")]
    TooManyThreads(usize),
    /// One output was named for several inputs, without `-f` to join
    /// their outputs in it.
    #[error("-o names one output for {0} inputs: -f writes them all into it, one after another, keeping none of their names")]
    OneOutputManyInputs(usize),
    /// Both an output file and stdout were asked for.
    #[error("-o and -c both name the output; choose one")]
    OutputAndStdout,
    /// A gzip checkpoint index (`--index`) could not be read, used or
    /// written.
    #[error("index {}: {msg}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong, one line.
        msg: String,
    },
    /// `--index` with several inputs.
    #[error("--index is for one input, but {0} were given")]
    IndexManyInputs(usize),
    /// The output named is the input: writing it would destroy the input.
    #[error("{}: the output is the input; name another output", .0.display())]
    OutputIsInput(PathBuf),
    /// `--range` asked for where it cannot be read.
    #[error("--range {0}")]
    Range(String),
    /// The codec layer's error: damaged data, a bad parameter.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// An input in a format the tool cairn stands in for does not read
    /// (`gzip -d x.zst`): [`UnpackOptions::formats`](crate::UnpackOptions).
    #[error("not in {} format{}", names(accepted), found.map_or_else(String::new, |f| format!(" (it is {f}: `cairn unpack` decodes it)")))]
    OtherFormat {
        /// The format the input is in, if cairn knows it.
        found: Option<Format>,
        /// The formats that were accepted.
        accepted: Vec<Format>,
    },
    /// A part of an lzop file of parts, past its first, keeps no name to
    /// write it to (lzop's words).
    #[error("multipart archive, but no filename stored (use option '-o')")]
    NamelessPart,
    /// The error of one input of a run.
    #[error("{}", prefixed(input, source))]
    Input {
        /// The input's name.
        input: String,
        /// What went wrong with it.
        #[source]
        source: Box<Error>,
    },
    /// Several inputs, some of which failed (each was reported as it
    /// failed, through [`crate::Hooks::input_failed`]).
    #[error("{} of {total} inputs failed: {}", failed.len(), failed.join(", "))]
    Failed {
        /// The names of the inputs that failed, in order.
        failed: Vec<String>,
        /// How many inputs the run had.
        total: usize,
        /// What each of them failed on, in the same order (a tool judges
        /// the run by them: xz and lzop count an output in the way as an
        /// error where their other refusals are warnings).
        causes: Vec<Error>,
    },
}

impl Error {
    /// The error itself, without the name of the input it is of
    /// ([`Error::Input`]).
    pub fn inner(&self) -> &Error {
        match self {
            Error::Input { source, .. } => source,
            other => other,
        }
    }

    /// Whether `is` holds of this error (without its input's name), or
    /// of any input's in a run of several ([`Error::Failed`]).
    pub fn any_cause(&self, is: impl Fn(&Error) -> bool) -> bool {
        match self.inner() {
            Error::Failed { causes, .. } => causes.iter().any(|e| is(e.inner())),
            one => is(one),
        }
    }

    /// An input gzip leaves alone with a warning and exit status 2 rather
    /// than an error and 1: a name with no known suffix to take off, an
    /// output that exists, an input that is a directory (without `-r`),
    /// is not a regular file or has other links, a name that has the
    /// suffix already (which gzip leaves at status 0: see the CLI's
    /// `Tool::ignores`).
    pub fn is_warning(&self) -> bool {
        match self {
            Error::Input { source, .. } => source.is_warning(),
            Error::Failed { causes, .. } => causes.iter().all(Error::is_warning),
            Error::SymlinkInput { warning, .. } => *warning,
            Error::UnknownSuffix
            | Error::AlreadySuffixed { .. }
            | Error::Exists { .. }
            | Error::IsDirectory { .. }
            | Error::NotRegular
            | Error::NotRegularInTree
            | Error::SpecialMode(_)
            | Error::OtherLinks(_) => true,
            _ => false,
        }
    }
}

impl Error {
    /// The input was read but its data is not what it should be: damaged,
    /// cut short, in no format the run reads (bzip2 exits 2 on these,
    /// where it exits 1 on a file it cannot open).
    pub fn is_data_error(&self) -> bool {
        match self {
            Error::Input { source, .. } => source.is_data_error(),
            Error::Failed { causes, .. } => causes.iter().any(Error::is_data_error),
            Error::OtherFormat { .. } => true,
            Error::Codec(e) => !matches!(
                e,
                CodecError::Io { .. } | CodecError::Compress { .. } | CodecError::Invalid(_)
            ),
            _ => false,
        }
    }

    /// The codec's error this is, inside an input's name.
    pub fn codec(&self) -> Option<&CodecError> {
        match self {
            Error::Input { source, .. } => source.codec(),
            Error::Codec(e) => Some(e),
            _ => None,
        }
    }

    /// The input is in no format the run reads ([`Error::OtherFormat`],
    /// or no known format at all).
    pub fn is_unknown_format(&self) -> bool {
        match self {
            Error::Input { source, .. } => source.is_unknown_format(),
            Error::OtherFormat { .. } | Error::Codec(CodecError::UnknownFormat) => true,
            _ => false,
        }
    }
}

/// Formats named as a list: `gzip`, `zstd or gzip`, `zstd, gzip or xz`.
fn names(formats: &[Format]) -> String {
    let names: Vec<String> = formats.iter().map(ToString::to_string).collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

fn level_range(lo: i32, hi: i32, format: Format) -> String {
    if lo == hi {
        format!(": cairn writes {format} at level {lo} only")
    } else {
        format!(" (its levels are {lo}..={hi})")
    }
}

/// `input: error`, unless the error names the input first already.
fn prefixed(input: &str, error: &Error) -> String {
    let text = error.to_string();
    match text.strip_prefix(input) {
        Some(rest) if rest.starts_with(':') => text,
        _ => format!("{input}: {text}"),
    }
}

/// Result alias of the file engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;
