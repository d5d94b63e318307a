//! # cairn-filepack
//!
//! `cairn pack` and `cairn unpack` as a library: the file-level rules of
//! gzip, pigz and zstd (which name an output gets, when an input is kept or
//! removed, what happens to a multi-file run with a bad file, how an output
//! appears on disk) over the codec crate's formats and the pipeline crate's
//! ordered parallel map. The binary parses flags into [`Options`], calls
//! [`pack`] or [`unpack`], and prints what comes back; tests call the same
//! functions directly.
//!
//! ## Design decisions
//!
//! - **Named `filepack`, not `archive`**: it packs files one by one into
//!   standard streams, as gzip does; it writes no container of many files
//!   (tar, zip), which "archive" would promise.
//! - **Outputs appear only when complete.** A new file is written under a
//!   temporary name in its directory ([`PendingFile`]) and renamed when
//!   complete; an error removes it. Its mode, times and owner are set
//!   through the open descriptor before the rename, never by path, so a
//!   symlink put at the destination is replaced, never followed.
//! - **Signals stay in the binary.** Removing a temporary file when the
//!   process is killed needs a process-wide signal handler, which a library
//!   must not install; the engine tells the caller through [`Hooks`] when a
//!   temporary file exists and when it is gone, and when an input is about
//!   to be memory-mapped (a file cut short under a map raises SIGBUS).
//! - **Progress and printing stay in the binary** too: the engine reports
//!   progress through [`Progress`] and returns a [`Summary`] per input; it
//!   prints nothing, except what a caller's hooks print.
//! - **A bad input does not stop a run.** As in gzip, every input is tried;
//!   the run's [`Run::outcome`] fails at the end naming each input that
//!   failed ([`Error::Failed`]), and with one input it is that input's error.
//! - **Sparse both ways.** A regular input is read by its data extents and
//!   an all-zero block is encoded once per worker, then copied; an output
//!   that is a new file gets holes where whole 4 KiB blocks are zero
//!   ([`HoleWriter`]), as `zstd -d` leaves them.
//! - **Typed errors** ([`Error`]) that name the file; `anyhow` is for the
//!   binary only.
//!
//! Layers: this crate uses codec, pipeline and blockdev, and nothing above
//! them (store, volume, nbd, wbcache).

mod engine;
mod error;
mod files;
mod naming;

pub use engine::{pack, unpack, GzipListing, Operation, Run, Summary};
pub use error::{Error, Result};
pub use files::{
    is_special, open_special, refuse_terminal_stdin, refuse_terminal_stdout, stdout_file,
    HoleWriter, PendingFile, Sink, Source, STDIN_NAME,
};
pub use naming::{check_suffix, format_of_name, packed_name, unpacked_name};

pub use cairn_codec::format::gzip_range::ByteRange;
use cairn_codec::Format;
use std::path::{Path, PathBuf};

/// Largest block size a pack accepts.
pub const MAX_BLOCK: usize = 64 << 20;
/// Most worker threads a run accepts.
pub const MAX_THREADS: usize = 1024;

/// What an input whose mode has set-user-ID, set-group-ID or the sticky
/// bit gets (its output never has them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SpecialModes {
    /// Left alone unless `force` (xz's rule, and cairn's own).
    #[default]
    RefusedUnlessForced,
    /// Left alone even with `force` (gzip's rule).
    Refused,
    /// Packed and unpacked as any file (zstd, pigz, bzip2, lz4).
    Taken,
}

/// What a symbolic link given as an input (named, or met by `-r`) gets,
/// unless `force` reads it through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Links {
    /// Left alone where outputs are named from inputs (their output
    /// would be named from the link); read through under `-c`, `-t`,
    /// `-l` and `-o` (gzip, pigz and xz; cairn's own rule).
    #[default]
    WhereNamed,
    /// Left alone wherever it is, even to standard output or tested
    /// (zstd: "is a symbolic link, ignoring").
    Never,
    /// Read through, named or met by `-r` (lz4).
    Always,
}

/// What to do with which files: the flags gzip, pigz and zstd share.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Inputs; none, or `-`, is standard input.
    pub files: Vec<PathBuf>,
    /// The one output file (`-o`); `-` is standard output.
    pub output: Option<PathBuf>,
    /// Write to standard output and keep the inputs (`-c`).
    pub stdout: bool,
    /// Keep inputs once their output is complete (`-k`).
    pub keep: bool,
    /// Overwrite outputs; pack a name that has the suffix already; write
    /// compressed data to, or read it from, a terminal (`-f`).
    pub force: bool,
    /// Worker threads; 0 is one per core (`-T0`).
    pub threads: usize,
    /// The suffix to add when packing and take off when unpacking, in
    /// place of the format's (`-S`, as gzip and pigz).
    pub suffix: Option<std::ffi::OsString>,
    /// Directories among the inputs stand for the files in them, and in
    /// their subdirectories (`-r`, as gzip and pigz): in name order,
    /// symbolic links not followed, and, where an output is named from
    /// its input, only the files that name one (packing skips names that
    /// have the suffix already; unpacking, names without a known one).
    pub recursive: bool,
    /// Make each output file durable (fsync it and its directory) before
    /// its input is removed (gzip's `--synchronous`): a crash right after
    /// then cannot lose both.
    pub synchronous: bool,
    /// Unpacking, an input whose name has no known suffix unpacks into
    /// NAME.out, said through [`Hooks::note`], as bzip2 does (gzip, xz
    /// and zstd leave it alone). Not with `-r`.
    pub unknown_suffix_out: bool,
    /// Unpacking, how a name that is not there is taken (gzip looks for
    /// NAME.gz).
    pub missing_input: MissingInput,
    /// An output is named from its input before the input is looked for:
    /// a missing input whose name has no known suffix is refused for its
    /// name, as zstd does (gzip, xz and cairn say it is missing).
    pub name_before_input: bool,
    /// Unpacking, an input whose name has no known suffix is first looked
    /// at: one in no format read is refused as such (an error, as xz
    /// says "File format not recognized"), and only one in a format read
    /// is left alone for its name (a warning). gzip and zstd look at the
    /// name alone.
    pub data_before_name: bool,
    /// An input with other hard links is packed or unpacked, and its name
    /// removed after, as pigz does: the other names keep the old bytes.
    /// Without it (gzip, xz, bzip2) such an input is left alone unless
    /// `force` or `keep`.
    pub allow_linked: bool,
    /// What an input whose mode has set-user-ID, set-group-ID or the
    /// sticky bit gets, when its output would be named from it.
    pub special_modes: SpecialModes,
    /// A symbolic link left alone is a warning (xz: status 2, nothing said
    /// under `-q`), not an error (gzip and pigz: status 1).
    pub symlink_warns: bool,
    /// Where a symbolic link input is read through.
    pub links: Links,
    /// Outputs named from their inputs go into a directory instead of
    /// beside them (zstd's `--output-dir-flat` and `--output-dir-mirror`).
    pub output_dir: Option<OutputDir>,
    /// Packing, an input whose name says it is compressed already (a
    /// suffix of zstd, gzip, xz, lzma or lz4, or their tar forms) is
    /// passed over without a word (zstd's `--exclude-compressed`).
    pub exclude_compressed: bool,
    /// Packing, a name that has the suffix already is packed all the
    /// same (`x.zst` into `x.zst.zst`), as zstd does; gzip and pigz leave
    /// it alone without `force`.
    pub pack_suffixed: bool,
    /// Packing, a name that has the suffix already is left alone even
    /// with `force`, as xz and bzip2 leave it (gzip and pigz pack
    /// `x.gz` into `x.gz.gz` with -f).
    pub suffixed_despite_force: bool,
    /// Several inputs with one `output` are written into it one after
    /// another without `force` (lzop -o); else only when forced (zstd).
    pub joins_unforced: bool,
    /// With `recursive`, a file under a directory whose output cannot be
    /// named (unpacking, a name with no known suffix) is an input that
    /// fails, as zstd -dr says of it; gzip and pigz pass over it without
    /// a word.
    pub walk_reports_unnamed: bool,
    /// gzip's `-N` (`Some(true)`) and `-n` (`Some(false)`). Packing, the
    /// input file's base name and modification time go into the header
    /// of formats that keep them (gzip, lzop) unless `-n`; unpacking a
    /// gzip file, `-N` names the output after the name its first member
    /// keeps, in the input's directory, and gives it that member's time.
    /// `None` is each direction's default, as gzip's: kept when packing,
    /// not restored when unpacking.
    pub name: Option<bool>,
    /// pigz's `-M` (`Some(true)`) and `-m` (`Some(false)`): the
    /// modification time alone, kept or not when packing, restored or not
    /// when unpacking; `None` follows `name`.
    pub time: Option<bool>,
}

/// Where outputs named from their inputs go ([`Options::output_dir`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputDir {
    /// Into this directory, by their base names (zstd's
    /// `--output-dir-flat`).
    Flat(PathBuf),
    /// Into this directory, under the input's own path (zstd's
    /// `--output-dir-mirror`: `a/b/x` packs into `DIR/a/b/x.zst`, `/a/x`
    /// into `DIR/a/x.zst`); the directories are made as needed. A path
    /// with `..` in it would leave the directory: refused.
    Mirror(PathBuf),
}

/// The level of a pack, as asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Level {
    /// The format's default.
    #[default]
    Default,
    /// Level 1 (`--fast`; for zstd -1, its `--fast=1`).
    Fast,
    /// The format's highest (`--best`).
    Best,
    /// This level, which the format must have: never quietly replaced.
    Exactly(i32),
}

impl Level {
    /// The level `format` is written at, or the refusal of one it lacks.
    pub fn resolve(self, format: Format) -> Result<i32> {
        let (lo, hi) = format.level_range();
        let level = match self {
            Level::Default => format.default_level(),
            // zstd's and lz4's bare --fast is --fast=1, level -1; gzip's
            // is level 1.
            Level::Fast if matches!(format, Format::Zstd | Format::Lz4) => -1,
            Level::Fast => 1,
            Level::Best => hi,
            Level::Exactly(n) => n,
        };
        if (lo..=hi).contains(&level) {
            Ok(level)
        } else {
            Err(Error::NoSuchLevel {
                format,
                level,
                lo,
                hi,
            })
        }
    }
}

/// How to pack.
#[derive(Debug, Clone, Default)]
pub struct PackOptions {
    /// The format; `None` is the one the output's suffix names, else gzip.
    pub format: Option<Format>,
    /// The level.
    pub level: Level,
    /// Input bytes per worker task; `None` is the format's default (or,
    /// with `long`, the window up to [`MAX_BLOCK`]).
    pub block: Option<usize>,
    /// What the encoder is asked beyond format and level: zstd's
    /// long-distance matching over a window of `2^N` bytes (`zstd
    /// --long=N`), within each block, blocks being frames of their own;
    /// xz's extreme presets; the check the stream carries.
    pub encode: cairn_codec::EncodeOptions,
    /// Cut blocks where the content says, not every `block` bytes
    /// (`--rsyncable`): a change to the input changes only the blocks
    /// around it, so the compressed stream after them is the same bytes
    /// again, for rsync and for deduplicating backups.
    pub rsyncable: bool,
    /// Most memory compressing may take (`xz --memlimit-compress`), xz
    /// and `.lzma` only: fewer threads where each needs more.
    pub memlimit: Option<u64>,
    /// Keep the settings asked for when one thread is over
    /// [`PackOptions::memlimit`] (xz's `--no-adjust`): the run fails
    /// instead of compressing with a smaller dictionary.
    pub no_adjust: bool,
}

/// What an unpack does with the decoded data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnpackMode {
    /// Write it out.
    #[default]
    Write,
    /// Only check it (`-t`): nothing is written, inputs are kept.
    Test,
    /// Only count it (`-l`): nothing is written, inputs are kept.
    List,
}

/// How to unpack.
#[derive(Debug, Clone, Default)]
pub struct UnpackOptions {
    /// Write, test or list.
    pub mode: UnpackMode,
    /// The largest zstd window accepted, as a power of two (`--long=N`);
    /// `None` is the codec's default (zstd's own, 2^27).
    pub zstd_window_log_max: Option<u32>,
    /// The dictionary zstd frames were packed with (`zstd -d -D DICT`).
    pub zstd_dictionary: Option<cairn_codec::format::zstd::Dictionary>,
    /// Most bytes the decoders' buffers may take (`-M`); `None`: the
    /// codec's default share of the memory this process may use.
    pub memory: Option<u64>,
    /// A checkpoint index for one gzip input read from a file (`--index
    /// FILE`): used if the file exists, else written once the input has
    /// been decoded and its CRCs checked, so the next read of that input
    /// starts every core at a known block boundary.
    pub gzip_index: Option<PathBuf>,
    /// Write only these bytes of the decoded output (`--range`), of one
    /// gzip input in a file, to the one output named (`-c` or `-o`); the
    /// input is kept. Members are inflated from `gzip_index`'s checkpoint
    /// before the range where it has one
    /// ([`cairn_codec::format::gzip_range`]).
    pub range: Option<ByteRange>,
    /// xz and `.lzma`: decode only the first stream, ignoring whatever
    /// follows it (`xz --single-stream`).
    pub single_stream: bool,
    /// xz: verify no block's check (`xz --ignore-check`).
    pub ignore_check: bool,
    /// The formats read (`None`: every format cairn knows): an input in
    /// another is refused as one in no known format is ([`Error::OtherFormat`]),
    /// or copied by `-dcf`, as `gzip -d` refuses a zstd file and `xz -d
    /// --format=lzma` (or `unlzma`) an xz file.
    pub formats: Option<Vec<Format>>,
    /// With `-f`, `-t` passes an input in no format read, which `-dcf`
    /// would copy (gzip's `-tf`; zstd, bzip2 and lz4 refuse it).
    pub force_test_passes_unknown: bool,
    /// What is in no format read is copied to standard output as it is:
    /// `Some(true)` even without `force` (zstd's `--pass-through`),
    /// `Some(false)` not even with it (`--no-pass-through`); `None`:
    /// with `force`, as `gzip -dcf` and `zstd -dcf`.
    pub pass_through: Option<bool>,
    /// What an empty input is.
    pub empty: EmptyInput,
    /// Leave holes for the zeros of the output (zstd's and lz4's
    /// `--sparse`): `None` in a new file only, `Some(true)` also in
    /// standard output redirected to a regular file, `Some(false)`
    /// nowhere (zstd's, lz4's and xz's `--no-sparse`).
    pub sparse: Option<bool>,
    /// Listing gzip, also the CRC-32 of each input's output
    /// ([`GzipListing::crc32`]: gzip's and pigz's `-lv` column); a pass
    /// over the output no other listing needs.
    pub list_crc: bool,
    /// lzop's files of parts (`lzop -c a b > x.lzo`, or lzop files
    /// joined), in a regular file: unpacked to outputs named from the
    /// input, each member goes to a file of its own, as `lzop -d` names
    /// them (the name it keeps from the second member on, or from the
    /// first where marked as a part or with -N); to standard output, to
    /// `-o`, or tested, the parts are joined with lzop's warning (status 2).
    pub lzop_parts: bool,
}

impl UnpackOptions {
    /// Whether inputs in format `f` are read ([`UnpackOptions::formats`]).
    pub(crate) fn reads(&self, f: Format) -> bool {
        self.formats.as_ref().is_none_or(|a| a.contains(&f))
    }

    /// The error of an input in `found`, a format not read (`None`: in no
    /// format cairn knows).
    pub(crate) fn not_read(&self, found: Option<Format>) -> Error {
        match &self.formats {
            Some(accepted) => Error::OtherFormat {
                found,
                accepted: accepted.clone(),
            },
            None => cairn_codec::CodecError::UnknownFormat.into(),
        }
    }
}

/// What an unpack makes of an empty input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EmptyInput {
    /// Data in no known format, as gzip reads it (refused, or copied by
    /// `-dcf`).
    #[default]
    Unknown,
    /// A stream cut short: zstd's and bzip2's "unexpected end of file",
    /// even with `-dcf`.
    Truncated,
    /// Nothing to decode, to standard output or for `-t` (lz4's).
    Nothing,
}

/// Progress of one input, for a caller that draws it. Called from the
/// reading thread and the writing thread, hence `Sync`.
pub trait Progress: Sync {
    /// Input has been read up to `position` bytes.
    fn read_to(&self, _position: u64) {}
    /// Uncompressed and compressed bytes written so far.
    fn ratio(&self, _raw: u64, _packed: u64) {}
    /// The input is done (or failed).
    fn finish(&self) {}
}

/// No progress to show.
impl Progress for () {}

/// What the engine tells its caller while it runs. Every method does
/// nothing by default.
pub trait Hooks: Sync {
    /// Progress of one input, `total` bytes long when known.
    fn progress(&self, _operation: Operation, _total: Option<u64>) -> Box<dyn Progress + '_> {
        Box::new(())
    }
    /// A temporary output file now exists at `path`: remove it if the
    /// process is killed before [`Hooks::temp_gone`].
    fn temp_created(&self, _path: &Path) {}
    /// The temporary output is renamed into place or removed.
    fn temp_gone(&self) {}
    /// An input may now be read through a memory map, which raises SIGBUS
    /// if the file is cut short meanwhile.
    fn input_mapped(&self) {}
    /// An input of a run of several failed; the run goes on. (With one
    /// input, its error is the run's outcome and is not reported here.)
    fn input_failed(&self, _error: &Error) {}
    /// Whether an input that failed with `error` is passed over rather
    /// than failed: said through [`Hooks::input_failed`] as any failure,
    /// but not counted in [`Error::Failed`] (gzip leaves a name that has
    /// its suffix already and exits 0; zstd passes over a symbolic link).
    /// With one input its error is still the run's outcome, for the
    /// caller to judge.
    fn passes_over(&self, _error: &Error) -> bool {
        false
    }
    /// Something to say about input `input` that changes nothing in the
    /// outcome (bzip2's "using NAME.out").
    fn note(&self, _input: &Path, _message: &str) {}
    /// Something to say about the whole run that changes nothing in its
    /// outcome (xz's "Adjusted LZMA2 dictionary size ...").
    fn note_run(&self, _message: &str) {}
}

/// How a name to unpack that is not there is taken
/// ([`Options::missing_input`]; `naming::missing_input` lists the names
/// each looks for, in its order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MissingInput {
    /// As gzip: NAME.gz and its kin are looked for, and where none is
    /// there, NAME.gz is the one said missing. cairn's own rule.
    #[default]
    AsGzip,
    /// As pigz: looked for (another list), said missing by the name given.
    LookedForAsGzip,
    /// As given (xz, zstd, bzip2, lz4 and lzop look for no other name).
    AsGiven,
}

/// Hooks that do nothing: for tests and callers that show nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {}
