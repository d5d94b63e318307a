//! # cairn
//!
//! The command-line tool: parses arguments, wires the codec and pipeline
//! layers together, draws progress on a terminal and prints reports as
//! text or JSON. It is the only crate that knows every layer.

#[macro_use]
mod out;
mod cache_bind;
mod cache_cmd;
mod diff_copy;
mod generate;
mod key_cmd;
mod lz4;
mod lzop;
mod mount;
mod pack;
mod repo_cmd;
mod report;
mod serve;
mod serve_repo;
mod signals;

use clap::{Args, CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
use std::process::ExitCode;

/// cairn: a storage stack for big images and streams.
#[derive(Parser, Debug)]
#[command(name = "cairn", version = env!("CAIRN_VERSION"), about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compress files or stdin in parallel, in a standard format.
    ///
    /// Flags as in gzip, pigz and zstd: levels -1 .. -19 (also combined,
    /// -9c), --fast, --best or --level N; -d decompresses (so
    /// `tar -I 'cairn pack -F zstd'` creates and extracts), -t tests, -l lists.
    #[command(version)]
    Pack(Box<PackArgs>),
    /// Decompress files or stdin in parallel; the format is detected by magic.
    ///
    /// -t tests (decodes, writes nothing), -l lists sizes and ratios.
    #[command(version)]
    Unpack(UnpackArgs),
    /// Create a repository, its packs striped over one or more targets.
    Init(repo_cmd::InitArgs),
    /// Store a file, a block device or stdin as a new snapshot of an image.
    Backup(repo_cmd::BackupArgs),
    /// Write a snapshot back to a file, a block device or stdout.
    Restore(repo_cmd::RestoreArgs),
    /// List images and snapshots with their sizes and ratios.
    Ls(repo_cmd::ListArgs),
    /// Check the repository; name every image and offset a problem affects.
    Verify(repo_cmd::VerifyArgs),
    /// Drop damaged chunks from the index, so the next backup stores them again.
    ///
    /// Reads and checks every stored chunk (as `verify --read-data`), then
    /// takes out of the index every chunk whose pack is gone or whose
    /// record fails its checks, so that no backup deduplicates against it
    /// any more. Snapshots that use a dropped chunk are listed: they
    /// cannot be restored whole until a backup of the same data stores
    /// those chunks again (which heals them), or they are forgotten. Runs
    /// alone; a pack that cannot be read stops it without dropping
    /// anything. -n says what would be dropped.
    Repair(repo_cmd::RepairArgs),
    /// Remove a snapshot, or every snapshot of an image (--all).
    Rm(repo_cmd::RmArgs),
    /// Forget snapshots by a keep policy (restic's --keep-* rules).
    Forget(repo_cmd::ForgetArgs),
    /// Add, remove or set the tags of snapshots (forget --keep-tag and
    /// --tag select by them).
    Tag(repo_cmd::TagArgs),
    /// The byte ranges where two snapshots differ (of one image or two).
    ///
    /// `cairn diff NAME@A NAME@B` prints one `OFFSET LENGTH` line per
    /// range, in ascending order, and a summary on stderr (ranges, bytes
    /// in them, both sizes). The snapshots are compared at equal offsets:
    /// where both hold the same chunk at the same offset, or both a hole,
    /// they are equal without reading anything; elsewhere both sides'
    /// bytes are read (and checked against their chunk ids) and compared
    /// byte by byte. The ranges are exact, except that differing runs
    /// separated by fewer than 512 equal bytes are reported as one range.
    /// Where the sizes differ, the bytes from the shorter size to the
    /// longer one are a range. --json prints the same as one object.
    Diff(diff_copy::DiffArgs),
    /// Copy snapshots from another repository (--from) into --repo.
    ///
    /// Every snapshot of the images named (of every image if none) is
    /// copied without cutting it again: the copy has the same extents
    /// (chunk lengths and holes), name, creation time, chunker, codec and
    /// tags, and is numbered after the destination's latest snapshot of
    /// the image. Each chunk is read from the source (decrypted with its
    /// key, checked against its id), stored once in the destination under
    /// the destination's id (keyed if encrypted) with the source
    /// snapshot's codec, sealed with the destination's key. A copy
    /// records its origin (`copy of <source id> NAME@N (<source>)`), and a
    /// source snapshot the destination already holds is skipped: a copy
    /// of it, the original it was copied from, another copy of that
    /// original (same origin, name, creation time and size), so copying
    /// again, or both ways, copies only what is new. --from may be a copy
    /// of --repo (`cp -a`, the same repository id): what both hold is
    /// skipped; the same repository is refused. The source's password comes from
    /// --from-password-file, --from-password-command, their CAIRN_FROM_*
    /// variables or CAIRN_FROM_PASSWORD; the destination's as for any
    /// --repo.
    Copy(diff_copy::CopyArgs),
    /// Reclaim chunks no snapshot uses; repack half-empty packs, dropping
    /// the dead chunks of their records.
    Gc(repo_cmd::GcArgs),
    /// Repository totals: sizes, ratios, index memory per chunk, targets.
    Stats(repo_cmd::StatsArgs),
    /// Remove the sessions and image locks of processes that are gone.
    ///
    /// Every running backup, restore, verify, gc, rm, forget, mount and
    /// served image registers a session in the repository (gc deletes
    /// nothing a session may still use) and a writable image a lock (one
    /// writer at a time). In a directory each is a file its process keeps
    /// an flock on, which the kernel drops when it dies. In a bucket each
    /// is a lease its process writes again every minute: one left by a
    /// process killed on this machine is taken for dead at once, one left
    /// by a process on another machine only 15 minutes after its last
    /// write. Until then gc defers and the image cannot be opened
    /// writable. `cairn unlock` removes what is dead now; with
    /// --remove-all also what looks live (in a bucket: make sure its
    /// process is gone, or it loses its session and fails before its next
    /// commit). A directory's live ones are kernel locks of running
    /// processes and are kept even then (status 1).
    Unlock(repo_cmd::UnlockArgs),
    /// Keys of an encrypted repository: list, add, remove, passwd.
    Key(key_cmd::KeyArgs),
    /// Export repository images, files and devices over NBD.
    Serve(serve::ServeArgs),
    /// Mount the snapshots as read-only files (FUSE): DIR/NAME/N, DIR/NAME/latest.
    ///
    /// Each image is a directory DIR/NAME holding one regular file per
    /// snapshot, named by its number as `cairn ls` lists it, and `latest`,
    /// the newest snapshot under a second name. A file's size is the
    /// image's logical size and its times the snapshot's creation time, so
    /// any tool reads it: cp, dd, qemu-img, or `mount -o loop,ro` for a
    /// filesystem inside. The tree is the snapshots there are when the
    /// mount starts. A read that meets a damaged chunk fails with EIO (and
    /// a line on stderr naming image, offset and chunk): wrong bytes are
    /// never returned.
    ///
    /// Stays in the foreground until unmounted (`fusermount -u DIR` or
    /// `fusermount3 -u DIR`, or `umount DIR` as root) or stopped by Ctrl-C
    /// or SIGTERM, which unmount and exit 0 (a mount with files still open
    /// is detached, and they are served until closed). Needs /dev/fuse, and for a
    /// user other than root fusermount3 or fusermount (Debian: fuse3).
    /// While mounted, gc deletes nothing the mount may read.
    Mount(mount::MountArgs),
    /// Status, drain or detach of a write-back cache (of a running server: --control).
    Cache(cache_cmd::CacheArgs),
    /// Make the writes to a served writable image its next snapshot now.
    ///
    /// `cairn serve` commits writable images every --commit-every seconds
    /// and when it stops; `cairn commit --control SOCK [IMAGE]` asks a
    /// running server (started with --control SOCK) to commit at once.
    /// `cairn commit --repo REPO IMAGE` commits the writes a server that
    /// died (or was killed) left flushed in the image's overlay; the next
    /// `cairn serve` of the image would too.
    Commit(serve_repo::CommitArgs),
    /// Man pages and shell completions, made from these definitions.
    ///
    /// `cairn generate man DIR` writes cairn.1 and cairn-SUBCOMMAND.1 into
    /// DIR; `cairn generate completions SHELL` prints a completion script.
    #[command(hide = true)]
    Generate(generate::GenerateArgs),
}

/// Options shared by pack and unpack.
#[derive(Args, Debug, Clone)]
pub(crate) struct CommonArgs {
    /// Worker threads (default and 0: number of cores; 1 = exactly one
    /// thread); pigz's -p.
    #[arg(
        short = 'T',
        long = "threads",
        visible_short_alias = 'p',
        visible_alias = "processes",
        value_parser = parse_threads
    )]
    pub threads: Option<usize>,
    /// Keep input files (default: remove them after success, like gzip and pigz).
    #[arg(short = 'k', long = "keep", overrides_with = "rm")]
    pub keep: bool,
    /// Remove input files after success (the default, as gzip; zstd's flag).
    #[arg(long = "rm", overrides_with = "keep")]
    pub rm: bool,
    /// Use suffix SUF instead of the format's (gzip's and pigz's -S): added
    /// when packing; when unpacking, taken off a name that ends with it.
    #[arg(short = 'S', long = "suffix", value_name = "SUF")]
    pub suffix: Option<std::ffi::OsString>,
    /// Take the files in directories, and in their subdirectories, as
    /// gzip -r does (a symbolic link is left alone unless -f, -c, -t or -l
    /// reads through it, a FIFO or device is never read; when packing,
    /// names with the suffix already are skipped, when unpacking names
    /// without a known one).
    #[arg(short = 'r', long = "recursive")]
    pub recursive: bool,
    /// Overwrite existing output files; write compressed data to a terminal.
    #[arg(short = 'f', long = "force")]
    pub force: bool,
    /// Write to standard output, keep input files (-c and -o: the last
    /// given wins, as in zstd).
    #[arg(
        short = 'c',
        long = "stdout",
        visible_alias = "to-stdout",
        overrides_with = "output"
    )]
    pub stdout: bool,
    /// Write to this file (several inputs: with -f, all into it, one
    /// after another, as zstd does).
    #[arg(
        short = 'o',
        long = "output",
        value_name = "OUT",
        overrides_with = "stdout"
    )]
    pub output: Option<std::path::PathBuf>,
    /// Print a one-line summary per file (size, ratio, speed) on stderr,
    /// and how each stream is decoded (a gzip member in parallel or on one
    /// core, and why); -vv adds debugging diagnostics, -vvv traces
    /// (RUST_LOG overrides).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, overrides_with = "quiet")]
    pub verbose: u8,
    /// No progress bar, no notes (the last of -q and -v counts, as in
    /// gzip: `-lvq` lists without a header).
    #[arg(short = 'q', long = "quiet", overrides_with = "verbose")]
    pub quiet: bool,
    /// Draw the progress bar, also under a tool's name and when stderr
    /// is no terminal (zstd's --progress).
    #[arg(long = "progress", overrides_with = "no_progress")]
    pub progress: bool,
    /// No progress bar, notes still said (zstd's --no-progress).
    #[arg(long = "no-progress", overrides_with = "progress")]
    pub no_progress: bool,
    /// Store no file name or time when packing (gzip's and lzop's -n; by
    /// default a gzip or lzop header keeps the input's base name and
    /// modification time, as gzip and lzop write them); when unpacking,
    /// restore none (the default).
    #[arg(short = 'n', long = "no-name", overrides_with = "name")]
    pub no_name: bool,
    /// Unpacking a gzip file, name the output after the name its header
    /// keeps (in the input's directory) and give it the time kept there
    /// (gzip's -N); packing, keep both in the header (the default).
    #[arg(short = 'N', long = "name", overrides_with = "no_name")]
    pub name: bool,
    /// Warnings do not change the exit status (xz's -Q, --no-warn): 0
    /// where it would be 2.
    #[arg(short = 'Q', long = "no-warn")]
    pub no_warn: bool,
    /// Packing, keep the input's modification time in the gzip or lzop
    /// header even with -n; unpacking a gzip file, give the output the
    /// time kept there (pigz's -M).
    #[arg(long = "time", overrides_with = "no_time")]
    pub time: bool,
    /// Packing, keep no modification time in the header (the name still);
    /// unpacking, restore none even with -N (pigz's -m).
    #[arg(long = "no-time", overrides_with = "time")]
    pub no_time: bool,
    /// Print a JSON summary (on stdout, or on stderr when data goes to stdout).
    #[arg(long = "json")]
    pub json: bool,
    /// Make each output file durable (fsync it and its directory) before
    /// removing its input (gzip's --synchronous).
    #[arg(long = "synchronous")]
    pub synchronous: bool,
    /// One thread (zstd's --single-thread): as -T1.
    #[arg(long = "single-thread", conflicts_with = "threads")]
    pub single_thread: bool,
    /// Outputs named from their inputs go into DIR, by their base names
    /// (zstd's --output-dir-flat; DIR is made if missing).
    #[arg(
        long = "output-dir-flat",
        value_name = "DIR",
        conflicts_with = "output_dir_mirror"
    )]
    pub output_dir_flat: Option<std::path::PathBuf>,
    /// Outputs named from their inputs go into DIR under the inputs' own
    /// paths, directories made as needed (zstd's --output-dir-mirror;
    /// `a/x` packs into `DIR/a/x.zst`; a path with '..' is refused).
    #[arg(long = "output-dir-mirror", value_name = "DIR")]
    pub output_dir_mirror: Option<std::path::PathBuf>,
    /// Packing, pass over inputs whose names say they are compressed
    /// already (.zst, .tzst, .gz, .tgz, .lzma, .xz, .txz, .lz4, .tlz4), as
    /// zstd's --exclude-compressed.
    #[arg(long = "exclude-compressed")]
    pub exclude_compressed: bool,
    /// zstd: pack with, or decode frames packed with, this dictionary
    /// (zstd's -D; made by `zstd --train`, or any file, taken as raw
    /// content).
    #[arg(short = 'D', long = "dict", value_name = "DICT")]
    pub dict: Option<std::path::PathBuf>,
    /// zstd: frames packed with -D do not name the dictionary's ID
    /// (zstd's --no-dictID).
    #[arg(long = "no-dictID")]
    pub no_dict_id: bool,
    /// Also process the files named in FILE, one per line (zstd's
    /// --filelist; may be given more than once).
    #[arg(long = "filelist", value_name = "FILE")]
    pub filelist: Vec<std::path::PathBuf>,
    /// Files to process; none or "-" means standard input.
    #[arg(value_name = "FILES")]
    pub files: Vec<std::path::PathBuf>,
}

#[derive(Args, Debug)]
// A flag given twice is given once, as gzip and zstd read it (`-d -d`).
#[command(args_override_self = true)]
pub(crate) struct PackArgs {
    /// Output format: gzip, zstd, lz4, snappy, lzop, bzip2, xz (default: the
    /// one named by the -o suffix, else gzip).
    #[arg(short = 'F', long = "format")]
    pub format: Option<String>,
    /// Compression level; the format's range (gzip 0-12, zstd -50-22, xz 0-9,
    /// bzip2 1-9, lzop 1-9, lz4 -65536-12 (3 on: LZ4 HC; -N as lz4
    /// --fast=N), snappy 1 only). -1 .. -19 work too.
    #[arg(long = "level", value_name = "N", allow_negative_numbers = true,
          overrides_with_all = ["level", "fast", "best"])]
    pub level: Option<i32>,
    /// Level 1 (gzip's, pigz's; for zstd and lz4 -1, as their bare
    /// --fast); with a value, zstd's and lz4's --fast=N, level -N.
    #[arg(long = "fast", value_name = "N", num_args = 0..=1, require_equals = true,
          value_parser = clap::value_parser!(u32).range(1..),
          overrides_with_all = ["level", "fast", "best"])]
    pub fast: Option<Option<u32>>,
    /// Accepted for zstd's sake: levels up to 22 need no --ultra here.
    #[arg(long = "ultra")]
    pub ultra: bool,
    /// The format's highest level (gzip 12, zstd 22, xz 9, bzip2 9, lzop 9).
    #[arg(long = "best", overrides_with_all = ["level", "fast", "best"])]
    pub best: bool,
    /// Input block size per worker task, e.g. 1M, 4MiB, 512K (binary units);
    /// a bare number is KiB, as pigz's -b (-b 128 is 128 KiB).
    #[arg(short = 'b', long = "block", value_parser = parse_block,
          overrides_with = "block_bytes")]
    pub block: Option<usize>,
    /// As -b, in bytes (zstd's -B: 4M, 65536; -B0 is the default size,
    /// as zstd's automatic job size).
    #[arg(short = 'B', value_name = "SIZE", value_parser = parse_size_or_zero, overrides_with = "block")]
    pub block_bytes: Option<usize>,
    /// Compress blocks independently (pigz's -i): accepted because every
    /// cairn block is independent already; the output is the same.
    #[arg(short = 'i', long = "independent")]
    pub independent: bool,
    /// The check the stream carries: a bare -C/--check is zstd's (XXH64
    /// in every frame, as cairn always writes); --check=CHECK is xz's
    /// (none, crc32, crc64 (the default) or sha256; `xz -C CHECK` through
    /// the xz link); --check=none is also zstd's --no-check; for lzop,
    /// crc32 (lzop's --crc32) or none in place of Adler-32.
    #[arg(short = 'C', long = "check", value_name = "CHECK", num_args = 0..=1,
          require_equals = true, overrides_with = "no_check")]
    pub check: Option<Option<cairn_codec::IntegrityCheck>>,
    /// zstd frames without XXH64 of their content (zstd's --no-check;
    /// for xz, as --check=none; lzop blocks without Adler-32, lzop's -F,
    /// which levels 7-9 keep anyway, as lzop).
    #[arg(long = "no-check", overrides_with = "check")]
    pub no_check: bool,
    /// xz's extreme presets (xz's -e, -9e): slower, sometimes a little
    /// smaller.
    #[arg(short = 'e', long = "extreme")]
    pub extreme: bool,
    /// lz4's legacy frame format (lz4 -l, which the lz4 link takes): 8
    /// MiB blocks without checksums, as Linux kernel images and initramfs
    /// archives are packed (-F lz4 only).
    #[arg(long = "legacy")]
    pub legacy: bool,
    /// lz4's --favor-decSpeed: LZ4 HC at levels 10-12 prefers matches
    /// that decode faster, a little bigger (-F lz4 only; as lz4, not in
    /// legacy frames, whose blocks lz4 writes without it).
    #[arg(long = "favor-decSpeed")]
    pub favor_dec_speed: bool,
    /// A comment for the gzip header (FCOMMENT), as pigz -C keeps it
    /// (-F gzip only; `pigz -lv` prints it).
    #[arg(long = "comment", value_name = "TEXT")]
    pub comment: Option<OsString>,
    /// Cut blocks where the content says, not every -b bytes (gzip's,
    /// pigz's and zstd's --rsyncable; any format): a change to the input
    /// changes only the compressed bytes around it, so rsync sends little
    /// and a deduplicating backup stores little of the next version.
    #[arg(long = "rsyncable")]
    pub rsyncable: bool,
    /// Write each zstd frame's decompressed size in its header (zstd's
    /// --content-size): accepted because cairn always does; the output is
    /// the same.
    #[arg(long = "content-size", overrides_with = "no_content_size")]
    pub content_size: bool,
    /// zstd frames without their decompressed size in the header (zstd's
    /// --no-content-size; the seek table still has it).
    #[arg(long = "no-content-size", overrides_with = "content_size")]
    pub no_content_size: bool,
    /// zstd's advanced parameters, as `zstd --zstd=`: a comma-separated
    /// list of NAME=VALUE with windowLog (wlog), hashLog (hlog), chainLog
    /// (clog), searchLog (slog), minMatch (mml), targetLength (tlen),
    /// strategy (strat, 1-9), overlapLog (ovlog; no effect, cairn's frames
    /// are independent), ldmHashLog (lhlog), ldmMinMatch (lmml),
    /// ldmBucketSizeLog (lblog), ldmHashRateLog (lhrlog); after the level,
    /// which they override
    #[arg(long = "zstd", value_name = "PARAMS", require_equals = true)]
    pub zstd_params: Vec<String>,
    /// zstd's row-based match finder on (zstd's --row-match-finder; by
    /// default zstd chooses by level)
    #[arg(long = "row-match-finder", overrides_with = "no_row_match_finder")]
    pub row_match_finder: bool,
    /// zstd's row-based match finder off (zstd's --no-row-match-finder)
    #[arg(long = "no-row-match-finder", overrides_with = "row_match_finder")]
    pub no_row_match_finder: bool,
    /// zstd: aim at compressed blocks of about SIZE bytes, for streams read
    /// as they arrive (zstd's --target-compressed-block-size)
    #[arg(long = "target-compressed-block-size", value_name = "SIZE", value_parser = parse_size_or_zero)]
    pub target_compressed_block_size: Option<usize>,
    /// bzip2's -s, --small: packing bzip2 without a level, 200k blocks
    /// (level 2), as bzip2; unpacking, accepted (bzip2's slower decoder
    /// that needs less memory: cairn's decoder is the one it has, and the
    /// output is the same).
    #[arg(short = 's', long = "small")]
    pub small: bool,
    /// xz's custom filter chain, in place of the level's preset (-F xz,
    /// and LZMA1 alone for -F lzma): filters separated by spaces, each
    /// NAME or NAME:OPTIONS, as xz 5.6's --filters ("x86 lzma2:dict=32MiB";
    /// BCJ filters x86, arm, armthumb, arm64, powerpc, ia64, sparc, riscv
    /// with start=N, delta with dist=N, lzma1 or lzma2 last with preset,
    /// dict, lc, lp, pb, mode, nice, mf, depth). Through the xz link,
    /// xz's --x86, --lzma2=OPTS... build it.
    #[arg(long = "filters", value_name = "CHAIN",
          value_parser = |s: &str| cairn_codec::format::xz_filters::FilterChain::parse(s))]
    pub filters: Option<cairn_codec::format::xz_filters::FilterChain>,
    /// Most memory compressing may take (xz's --memlimit-compress): fewer
    /// threads are used where the settings need more on each (as
    /// liblzma counts it), and where one thread needs more, a smaller
    /// dictionary, as xz adjusts it (said unless -q).
    #[arg(long = "memlimit-compress", value_name = "SIZE", value_parser = parse_size)]
    pub memlimit_compress: Option<usize>,
    /// With --memlimit-compress, fail rather than shrink the dictionary
    /// (xz's --no-adjust).
    #[arg(long = "no-adjust")]
    pub no_adjust: bool,
    /// Print cairn's license and exit (pigz's -L).
    #[arg(long = "license")]
    pub license: bool,
    /// Train a zstd dictionary on the FILES (each a sample; directories
    /// with -r) and write it to -o, else `dictionary` (zstd's --train);
    /// use it with -D.
    #[arg(long = "train")]
    pub train: bool,
    /// The largest dictionary --train writes (zstd's --maxdict; default
    /// 110 KiB, as zstd's).
    #[arg(long = "maxdict", value_name = "SIZE", value_parser = parse_size, default_value = "112640")]
    pub maxdict: usize,
    /// Decompress instead, as `cairn unpack` (levels, -F and -b are ignored).
    #[arg(
        short = 'd',
        long = "decompress",
        visible_alias = "uncompress",
        overrides_with = "compress"
    )]
    pub decompress: bool,
    /// Compress (the default; zstd's, xz's and bzip2's -z undoes a -d).
    #[arg(short = 'z', long = "compress", overrides_with = "decompress")]
    pub compress: bool,
    #[command(flatten)]
    pub decode: DecodeArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Options of decompression, shared by `unpack` and `pack -d`.
#[derive(Args, Debug, Clone)]
pub(crate) struct DecodeArgs {
    /// Test: decode and check every input, write nothing, keep the inputs.
    #[arg(short = 't', long = "test")]
    pub test: bool,
    /// List each input's format, compressed and uncompressed size, ratio
    /// and name (decodes it all, so the sizes are exact); with --json as JSON.
    #[arg(short = 'l', long = "list", conflicts_with = "test")]
    pub list: bool,
    /// Accept zstd frames whose window is up to 2^N bytes (as `zstd -d
    /// --long=N`; default 27, 128 MiB, as zstd; at most 31). Such a frame
    /// without a stated size is decoded in a window of that size. When
    /// packing zstd: long-distance matching over a window of 2^N bytes,
    /// as `zstd --long=N`, within each block (blocks grow to the window,
    /// up to 64 MiB, unless -b says). A bare `--long` is `--long=27`, as
    /// in zstd.
    #[arg(
        long = "long",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(10..=31),
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "27"
    )]
    pub long: Option<u32>,
    /// A checkpoint index for one gzip input read from a file: if FILE
    /// exists, every core starts at a block boundary it lists (the second
    /// read of a one-member .gz skips the search); if not, it is written
    /// once the input has decoded with every CRC right.
    #[arg(long = "index", value_name = "FILE")]
    pub index: Option<std::path::PathBuf>,
    /// Most memory decoding may take, as zstd's -M (sizes take K, M, G):
    /// a one-member gzip decoded in parallel runs on as many workers, with
    /// as many whole-chunk buffers, as fit (-v says how many; one worker
    /// means one core, in about 16 MiB), a zstd frame whose window is
    /// larger is refused unless --long says otherwise, and so is an xz
    /// block whose dictionary is (as xz --memlimit). Default: half the
    /// memory cairn may use (the machine's, or its control group's limit
    /// when lower), and zstd's 128 MiB window.
    #[arg(short = 'M', long = "memory", value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<usize>,
    /// Write only bytes START up to END of one gzip input's decoded output
    /// (START..END, START.. or START+LENGTH; sizes take K, M, G, T), to -c
    /// or -o. With --index, a member is inflated from the checkpoint before
    /// START (trusting the index's windows); without, from its start.
    /// Reading stops at END, so a member's CRC is checked only when it is
    /// inflated whole.
    #[arg(long = "range", value_name = "RANGE", value_parser = parse_range)]
    pub range: Option<cairn_filepack::ByteRange>,
    /// xz and .lzma: decode only the first stream and ignore whatever
    /// follows it (xz's --single-stream).
    #[arg(long = "single-stream")]
    pub single_stream: bool,
    /// xz: do not verify the blocks' checks (xz's --ignore-check; the
    /// headers' and index's CRC32s still are).
    #[arg(long = "ignore-check")]
    pub ignore_check: bool,
    /// Copy what is in no format read to standard output as it is, even
    /// without -f (zstd's --pass-through; zstdcat does by default)
    #[arg(long = "pass-through", overrides_with = "no_pass_through")]
    pub pass_through: bool,
    /// Never copy what is in no format read, not even with -f or as
    /// zstdcat (zstd's --no-pass-through)
    #[arg(long = "no-pass-through", overrides_with = "pass_through")]
    pub no_pass_through: bool,
    /// Leave holes for runs of zeros in the output (the default where a
    /// hole is sure to read as zeros: a new file, or standard output
    /// redirected to the end of a regular file not opened to append;
    /// zstd's and lz4's --sparse).
    #[arg(long = "sparse", overrides_with = "no_sparse")]
    pub sparse: bool,
    /// Write every zero of the output, leave no holes (zstd's, lz4's and
    /// xz's --no-sparse).
    #[arg(long = "no-sparse", overrides_with = "sparse")]
    pub no_sparse: bool,
    /// Decoding through the xz link with --format=xz or lzma (and as
    /// unlzma and lzcat): an input in the other format is refused, as xz
    /// refuses it; auto (xz's default) reads both. The last one given wins.
    #[arg(long = "xz-format", hide = true, value_enum)]
    pub xz_format: Option<XzFormat>,
    /// -l prints gzip's table (set when cairn runs as gzip, gunzip, zcat,
    /// pigz or unpigz).
    #[arg(long = "list-as-gzip", hide = true)]
    pub list_as_gzip: bool,
    /// xz's --robot: -l prints xz's tab-separated lines for scripts
    /// (taken, and ignored elsewhere, when cairn runs as xz).
    #[arg(long = "robot", hide = true)]
    pub robot: bool,
}

#[derive(Args, Debug)]
#[command(args_override_self = true)]
pub(crate) struct UnpackArgs {
    /// Decompress (what unpack does anyway; taken so that `tar -I 'cairn
    /// unpack'`, which adds -d to extract, works as with gunzip or unzstd).
    #[arg(short = 'd', long = "decompress", visible_alias = "uncompress")]
    pub decompress: bool,
    #[command(flatten)]
    pub decode: DecodeArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Parse a size: bytes (`65536`), or a number with a binary unit, K, M,
/// G or T, alone or as KiB or KB (`64M` = `64MiB` = `64MB` = 64 * 2^20),
/// as pigz and zstd read them.
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => {
            return Err(format!(
                "bad size {s:?}: unknown unit {unit:?} (use K, M, G or T, powers of 1024)"
            ))
        }
    };
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    1usize
        .checked_shl(shift)
        .and_then(|unit| n.checked_mul(unit))
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("bad size {s:?}"))
}

/// Most worker threads `-T` takes: far more than cores is only memory
/// and start-up time (each worker holds its buffers), as zstd caps its
/// own at 256.
pub(crate) const MAX_THREADS: usize = 1024;

/// A `-T` count: 0 (every core) up to [`MAX_THREADS`].
pub(crate) fn parse_threads(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("bad thread count {s:?}"))?;
    if n > MAX_THREADS {
        return Err(format!("{n} threads: at most {MAX_THREADS}"));
    }
    Ok(n)
}

/// A block size: as [`parse_size`], but a bare number is KiB, as pigz's
/// `-b` reads it.
pub(crate) fn parse_block(s: &str) -> Result<usize, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return parse_size(&format!("{s}K"));
    }
    parse_size(s)
}

/// A size as [`parse_size`] reads it, or 0.
pub(crate) fn parse_size_or_zero(s: &str) -> Result<usize, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    parse_size(s)
}

/// Parse a byte range: `START..END`, `START..` or `START+LENGTH`, each a
/// size as [`parse_size`] reads it (or 0).
pub(crate) fn parse_range(s: &str) -> Result<cairn_filepack::ByteRange, String> {
    let size = |t: &str| -> Result<u64, String> {
        match t.trim() {
            "" | "0" => Ok(0),
            t => parse_size(t).map(|n| n as u64),
        }
    };
    let bad = || format!("bad range {s:?}: use START..END, START.. or START+LENGTH");
    let (start, end) = if let Some((a, b)) = s.split_once("..") {
        let end = (!b.trim().is_empty()).then(|| size(b)).transpose()?;
        (size(a)?, end)
    } else if let Some((a, n)) = s.split_once('+') {
        if a.trim().is_empty() || n.trim().is_empty() {
            return Err(bad());
        }
        let start = size(a)?;
        (start, Some(start.checked_add(size(n)?).ok_or_else(bad)?))
    } else {
        return Err(bad());
    };
    if end.is_some_and(|e| e < start) {
        return Err(format!("bad range {s:?}: it ends before it starts"));
    }
    Ok(cairn_filepack::ByteRange { start, end })
}

/// The `cairn pack` arguments a link named after a standard tool stands
/// for: `gzip`, `pigz`, `gunzip`, `unpigz`, `zcat`, `zstd`, `zstdmt`,
/// `unzstd`, `zstdcat`, `xz`, `unxz`, `xzcat`, `bzip2`, `bunzip2`,
/// `bzcat`, `lz4`, `unlz4`, `lz4cat` and `lzop`, each with that tool's
/// defaults (zstd keeps its inputs unless `--rm`; zstdcat copies what is
/// not zstd, as `zstd -dcf`; lzop's command line is read by lzop's
/// grammar, see the `lzop` module).
/// Any other name is `cairn` itself.
fn as_invoked(mut args: Vec<OsString>) -> Vec<OsString> {
    let name = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("cairn")
        .to_string();
    let name = name.as_str();
    let prefix: &[&str] = match name {
        "gzip" | "pigz" => &["pack"],
        "gunzip" | "unpigz" => &["pack", "-d"],
        "zcat" => &["pack", "-d", "-c"],
        "zstd" | "zstdmt" => &["pack", "-F", "zstd", "-k"],
        "unzstd" => &["pack", "-d", "-k"],
        "zstdcat" => &["pack", "-d", "-c", "-f"],
        "xz" => &["pack", "-F", "xz"],
        // xz-utils' names for xz --format=lzma.
        "lzma" => &["pack", "-F", "lzma", "--xz-format=lzma"],
        "unlzma" => &["pack", "-d", "--xz-format=lzma"],
        "lzcat" => &["pack", "-d", "-c", "--xz-format=lzma"],
        "bzip2" => &["pack", "-F", "bzip2"],
        "unxz" | "bunzip2" => &["pack", "-d"],
        "xzcat" | "bzcat" => &["pack", "-d", "-c"],
        "lz4" => &["pack", "-F", "lz4", "-k"],
        "unlz4" => &["pack", "-d", "-k"],
        // lz4cat is `lz4 -dcfm`: what is no lz4 passes through.
        "lz4cat" => &["pack", "-d", "-c", "-f"],
        // lzop keeps its inputs unless -U.
        "lzop" => &["pack", "-F", "lzop", "-k"],
        _ => return args,
    };
    let _ = INVOKED_AS.set(Tool::of(name));
    let _ = INVOKED_NAME.set(name.to_string());
    let pigz = matches!(name, "pigz" | "unpigz");
    let gzip_family = matches!(name, "gzip" | "pigz" | "gunzip" | "unpigz" | "zcat");
    let mut rest = args.split_off(1);
    // The tool's variables of default options, before the command line's
    // (which win): gzip's and pigz's GZIP (and PIGZ), xz's XZ_DEFAULTS and
    // XZ_OPT, bzip2's BZIP2 and BZIP, zstd's ZSTD_CLEVEL and ZSTD_NBTHREADS.
    // Arguments a tool would refuse: one line and status 1, as the tool.
    let or_exit = |r: Result<Vec<OsString>, String>| {
        r.unwrap_or_else(|e| {
            errln!("{}: {e}", prog());
            std::process::exit(1)
        })
    };
    if pigz {
        rest = or_exit(pigz_arguments(rest));
    }
    if matches!(Tool::of(name), Tool::Xz | Tool::Bzip2) {
        rest = or_exit(refuse_recursion(name, rest));
    }
    if Tool::of(name) == Tool::Zstd {
        rest = or_exit(refuse_zstd_options(rest));
        rest = or_exit(zstd_hints_dropped(rest));
    }
    let mut from_env = or_exit(tool_variables(name));
    if matches!(Tool::of(name), Tool::Xz | Tool::Bzip2) {
        from_env = or_exit(refuse_recursion(name, from_env));
    }
    if name == "lzop" {
        rest = or_exit(lzop::arguments(rest));
    }
    if matches!(name, "lz4" | "unlz4" | "lz4cat") {
        use std::io::IsTerminal;
        let cat = name == "lz4cat";
        rest = or_exit(lz4_arguments(rest, std::io::stdout().is_terminal(), cat));
    }
    // xz's -C CHECK (and --check CHECK) take a value where zstd's -C has
    // none: given as --check=CHECK, which cairn reads either way (in the
    // variables too: `XZ_OPT=-Cnone`).
    if Tool::of(name) == Tool::Xz {
        rest = xz_check_values(rest);
        from_env = xz_check_values(from_env);
        (from_env, rest) = xz_arguments(from_env, rest).unwrap_or_else(|e| {
            errln!("{}: {e}", prog());
            std::process::exit(1)
        });
    }
    let from_env = or_exit(no_files_from_variables(name, prefix, from_env));
    args.extend(prefix.iter().map(OsString::from));
    args.extend(from_env);
    // `gzip -l` prints gzip's table, which scripts parse.
    if gzip_family {
        args.push(OsString::from("--list-as-gzip"));
    }
    args.extend(rest);
    args
}

/// xz and bzip2 have no -r (`--recursive`): refused as they refuse it
/// (status 1), where cairn's flags would take it and walk directories.
fn refuse_recursion(name: &str, args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    // xz's options that take a value: the rest of a short cluster, or the
    // next word (`-S .r`, `--suffix -r`); bzip2 has none.
    let (value_shorts, value_longs): (&str, &[&str]) = match Tool::of(name) {
        Tool::Xz => (
            "FCMTS",
            &[
                "--suffix",
                "--format",
                "--check",
                "--threads",
                "--memlimit",
                "--memlimit-compress",
                "--memlimit-decompress",
                "--memlimit-mt-decompress",
                "--block-size",
                "--block-list",
                "--filters",
            ],
        ),
        _ => ("", &[]),
    };
    rewrite_words(args, |s, rest, out| {
        let (recursion, value_follows) = match s.strip_prefix('-') {
            Some("-recursive") => (true, false),
            Some(long) if long.starts_with('-') => (false, value_longs.contains(&s)),
            Some(cluster) if !cluster.is_empty() => {
                let before_value: String = cluster
                    .chars()
                    .take_while(|c| !value_shorts.contains(*c))
                    .collect();
                // A value option last in the cluster takes the next word.
                let last_takes = cluster.len() == before_value.len() + 1;
                (before_value.contains('r'), last_takes)
            }
            _ => (false, false),
        };
        if recursion {
            return Err(format!(
                "{s}: no such option ({name} does not recurse into directories)"
            ));
        }
        // A value is passed unchecked; a suffix as `--suffix=V`, so that
        // one like `-r` is taken as the value it is (`-S -r`, `-kS -r`,
        // `--suffix -r`), and one with a C is not read as xz's -C later.
        let value = value_follows.then(|| rest.next()).flatten();
        match (value, s.strip_suffix('S').filter(|_| !s.starts_with("--"))) {
            (Some(v), Some(flags)) => {
                if flags != "-" {
                    out.push(flags.into());
                }
                let mut word = OsString::from("--suffix=");
                word.push(v);
                out.push(word);
            }
            (Some(v), None) if s == "--suffix" => {
                let mut word = OsString::from("--suffix=");
                word.push(v);
                out.push(word);
            }
            (value, _) => {
                out.push(s.into());
                out.extend(value);
            }
        }
        Ok(())
    })
}

/// pigz's short options that cairn spells otherwise: `-m` and `-T` (`--no-time`),
/// `-M` (`--time`, not zstd's memory limit), `-R` (`--rsyncable`), `-L`
/// (`--license`), `-C TEXT` (`--comment TEXT`, not xz's check; last in
/// its cluster, its text the next word, as pigz takes it) and `-z`
/// (zlib's format, which cairn does not write: refused by its long name
/// rather than taken as zstd's and xz's -z), alone or in a cluster
/// (`-9m`, `-kC TEXT`); `-H`/`--huffman` and `-U`/`--rle` are
/// refused (libdeflate, cairn's deflate encoder, has no such strategies).
fn pigz_arguments(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    // pigz's short options that take a value: the rest of the cluster.
    const VALUE_SHORTS: &str = "bpSIJCA";
    let refuse = |what: &str| {
        Err(format!(
            "{what}: not supported (libdeflate, cairn's deflate encoder, has no such strategy)"
        ))
    };
    rewrite_words(args, |s, rest, out| {
        match s {
            "--huffman" => return refuse("--huffman (Huffman-only deflate, -H)"),
            "--rle" => return refuse("--rle (run-length deflate, -U)"),
            _ => {}
        }
        let Some(cluster) = s
            .strip_prefix('-')
            .filter(|c| !c.is_empty() && !c.starts_with('-'))
        else {
            out.push(s.into());
            return Ok(());
        };
        let mut kept = String::from("-");
        let mut longs = Vec::new();
        for (i, c) in cluster.char_indices() {
            match c {
                // -T: pigz's older spelling of -m (not zstd's threads).
                'm' | 'T' => longs.push("--no-time"),
                'M' => longs.push("--time"),
                'R' => longs.push("--rsyncable"),
                'L' => longs.push("--license"),
                'z' => longs.push("--zlib"),
                'H' => return refuse("-H (Huffman-only deflate, --huffman)"),
                'U' => return refuse("-U (run-length deflate, --rle)"),
                // The comment: the next word, which must be no option
                // (pigz's rules and words).
                'C' => {
                    if !cluster[i + 1..].is_empty() {
                        return Err("invalid usage: -C must be followed by space".into());
                    }
                    let text = rest
                        .next()
                        .filter(|t| !t.as_encoded_bytes().starts_with(b"-"))
                        .ok_or("missing parameter after -C")?;
                    if kept.len() > 1 {
                        out.push(std::mem::take(&mut kept).into());
                    }
                    out.extend([OsString::from("--comment"), text]);
                    break;
                }
                c if VALUE_SHORTS.contains(c) => {
                    kept.push_str(&cluster[i..]);
                    break;
                }
                c => kept.push(c),
            }
        }
        if kept.len() > 1 {
            out.push(kept.into());
        }
        out.extend(longs.into_iter().map(OsString::from));
        Ok(())
    })
}

/// zstd's options that tune how it runs, not what it writes, dropped
/// once checked: `--size-hint=N` and `--stream-size=N` (hints of the
/// input's size: cairn cuts blocks by -B whatever the size),
/// `--auto-threads=physical|logical` (-T0 is every core the process may
/// use), `--priority=rt` and `--asyncio`/`--no-asyncio`.
fn zstd_hints_dropped(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    rewrite_words(args, |s, _, out| {
        let (name, value) = s.split_once('=').unwrap_or((s, ""));
        let good = match name {
            "--size-hint" | "--stream-size" => cairn_codec::format::zstd::number(value).is_some(),
            "--auto-threads" => matches!(value, "physical" | "logical"),
            "--priority" => value == "rt",
            "--asyncio" | "--no-asyncio" => s == name,
            _ => {
                out.push(s.into());
                return Ok(());
            }
        };
        match good {
            true => Ok(()),
            false => Err(format!("{s}: not a value {name} takes")),
        }
    })
}

/// A tool's arguments rewritten word by word, as the links' option
/// translations do: `each` pushes to `out` what stands for word `s`,
/// taking an option's value from `rest` (the words after it) where it
/// has one; a word that is not UTF-8, a `--` and every word after it
/// (names, never options) pass unchanged.
fn rewrite_words<E>(
    args: Vec<OsString>,
    mut each: impl FnMut(&str, &mut std::vec::IntoIter<OsString>, &mut Vec<OsString>) -> Result<(), E>,
) -> Result<Vec<OsString>, E> {
    let mut out = Vec::with_capacity(args.len());
    let mut rest = args.into_iter();
    while let Some(a) = rest.next() {
        match a.to_str() {
            Some("--") => {
                out.push(a);
                out.extend(rest);
                break;
            }
            Some(s) => each(s, &mut rest, &mut out)?,
            None => out.push(a),
        }
    }
    Ok(out)
}

/// zstd's option cairn refuses in one line rather than take and ignore:
/// `--adapt` (a level that follows the speed of the output: cairn's
/// blocks are packed in parallel at one level).
fn refuse_zstd_options(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    // The word after -o (or a cluster ending in it) is its value.
    let mut value_next = false;
    for a in args
        .iter()
        .take_while(|a| *a != "--")
        .filter_map(|a| a.to_str())
    {
        if std::mem::replace(&mut value_next, false) {
            continue;
        }
        value_next = a.starts_with('-') && !a.starts_with("--") && a.ends_with('o');
        if a == "--adapt" || a.starts_with("--adapt=") {
            return Err(format!(
                "{a}: not supported (cairn packs every block at the one level given; choose a level)"
            ));
        }
    }
    Ok(args)
}

/// Words of a tool's variables that would be read as input files (`XZ_OPT
/// ="-9 notes"`): never taken as files, since a run would then pack and
/// remove a file the command line never named. As the tools: gzip and pigz
/// refuse them, xz ignores them (said here); bzip2 would pack the file, so
/// they are refused. Found by parsing `prefix` and the variables' words
/// alone, as the whole command line is parsed.
fn no_files_from_variables(
    name: &str,
    prefix: &[&str],
    mut from_env: Vec<OsString>,
) -> Result<Vec<OsString>, String> {
    if from_env.is_empty() {
        return Ok(from_env);
    }
    // The files `words` hold, parsed as the command line is.
    let files_of = |words: &[OsString]| {
        let alone = std::iter::once(OsString::from("cairn"))
            .chain(prefix.iter().map(OsString::from))
            .chain(words.iter().cloned());
        match Cli::try_parse_from(rewrite_level_flags(alone.collect())) {
            Ok(Cli {
                command: Command::Pack(p),
            }) => Some(p.common.files),
            _ => None,
        }
    };
    let Some(files) = files_of(&from_env) else {
        return Ok(from_env);
    };
    let Some(first) = files.first() else {
        return Ok(from_env);
    };
    let word = first.display();
    match name {
        "xz" | "unxz" | "xzcat" | "lzma" | "unlzma" | "lzcat" => {
            for (k, f) in files.iter().enumerate() {
                // The word that is this file, not an option's value of the
                // same text (`XZ_OPT="2 -T 2"`): the one whose removal
                // leaves the rest parsing to the other files.
                let rest = &files[k + 1..];
                let at = (0..from_env.len())
                    .filter(|&i| from_env[i] == f.as_os_str())
                    .find(|&i| {
                        let mut w = from_env.clone();
                        w.remove(i);
                        files_of(&w).as_deref() == Some(rest)
                    });
                if let Some(at) = at {
                    from_env.remove(at);
                }
                errln!(
                    "{}: {} in XZ_DEFAULTS or XZ_OPT is not an option: ignored, as xz does",
                    prog(),
                    f.display()
                );
            }
            Ok(from_env)
        }
        "pigz" | "unpigz" => Err(format!(
            "cannot provide files in the GZIP or PIGZ variable ({word}), as pigz says"
        )),
        "gzip" | "gunzip" | "zcat" => {
            Err(format!("{word}: non-option in GZIP environment variable"))
        }
        _ => Err(format!(
            "{word} in a variable of default options is not an option: refused (it would be \
             packed and removed as an input)"
        )),
    }
}

/// Long options gzip takes from its GZIP variable (gzip 1.12 refuses the
/// others there, as `--force`, `--stdout`: one would overwrite files
/// unseen); short ones are levels, `-n`, `-N`, `-q` and `-v`, also
/// combined (`-9N`).
const GZIP_VARIABLE_OPTIONS: [&str; 7] = [
    "--fast",
    "--best",
    "--rsyncable",
    "--no-name",
    "--name",
    "--quiet",
    "--verbose",
];

/// Whether gzip takes `word` from its GZIP variable.
fn gzip_variable_option(word: &std::ffi::OsStr) -> bool {
    let Some(w) = word.to_str() else {
        return false;
    };
    match w.strip_prefix('-') {
        Some(short) if !short.starts_with('-') => {
            !short.is_empty()
                && short
                    .chars()
                    .all(|c| c.is_ascii_digit() || "nNqv".contains(c))
        }
        _ => GZIP_VARIABLE_OPTIONS.contains(&w),
    }
}

/// The options the variables of tool `name` hold (see [`as_invoked`]),
/// split at white space; a zstd variable that is not a number is said
/// and left out, as zstd does; GZIP (not pigz's) holds only what gzip
/// takes there ([`gzip_variable_option`]), else it is an error, as gzip.
fn tool_variables(name: &str) -> Result<Vec<OsString>, String> {
    let words = |var: &str| -> Vec<OsString> {
        std::env::var(var)
            .map(|v| v.split_whitespace().map(OsString::from).collect())
            .unwrap_or_default()
    };
    let number = |var: &str, flag: &str| -> Vec<OsString> {
        match std::env::var(var) {
            Ok(v) if v.trim().parse::<i32>().is_ok() => {
                vec![format!("{flag}={}", v.trim()).into()]
            }
            Ok(v) if !v.is_empty() => {
                errln!("{}: {var}={v:?} is not a number: ignored", prog());
                Vec::new()
            }
            _ => Vec::new(),
        }
    };
    Ok(match name {
        "gzip" | "gunzip" | "zcat" => {
            let w = words("GZIP");
            // (A word that is no option at all is refused as a file name,
            // by `no_files_from_variables`.)
            if let Some(bad) = w
                .iter()
                .find(|o| o.to_string_lossy().starts_with('-') && !gzip_variable_option(o))
            {
                return Err(format!(
                    "{}: option not valid in GZIP environment variable (gzip takes levels, \
                     -n, -N, -q, -v and --rsyncable there)",
                    bad.to_string_lossy()
                ));
            }
            w
        }
        "pigz" | "unpigz" => [words("GZIP"), words("PIGZ")].concat(),
        "xz" | "unxz" | "xzcat" | "lzma" | "unlzma" | "lzcat" => {
            [words("XZ_DEFAULTS"), words("XZ_OPT")].concat()
        }
        "bzip2" | "bunzip2" | "bzcat" => [words("BZIP2"), words("BZIP")].concat(),
        "zstd" | "zstdmt" | "unzstd" | "zstdcat" => [
            number("ZSTD_CLEVEL", "--level"),
            number("ZSTD_NBTHREADS", "--threads"),
        ]
        .concat(),
        _ => Vec::new(),
    })
}

/// The lz4 tool's arguments as cairn's: without `-m` (or `-r`), a second
/// name is the output (`lz4 IN OUT`, `lz4 -d IN.lz4 OUT`), and one name
/// with standard output not a terminal writes to it, with lz4's warning;
/// `-B4`..`-B7` are blocks of 64K..4M, `-BD` and `-BX` are taken (cairn's
/// blocks are independent, its frames checked as a whole), `--sparse` and
/// `--no-sparse` are cairn's; `-l` writes
/// the legacy format (`--legacy`; its blocks are 8 MiB whatever `-B`
/// says, as lz4 has them); the names `stdin` and `stdout` are standard
/// input (as an input) and output (as the output), as lz4 reads them
/// (`lz4 -l -12 stdin stdout`, as Linux's build runs it).
fn lz4_arguments(
    args: Vec<OsString>,
    stdout_is_terminal: bool,
    cat: bool,
) -> Result<Vec<OsString>, String> {
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut names = Vec::new();
    // lz4cat writes to stdout anyway; -t and --list write nothing.
    let (mut multiple, mut to_stdout, mut rest) = (false, cat, false);
    // A mode given (-d, -z, -t, --list...): else lz4 decodes when the
    // first input's name ends in .lz4, and packs otherwise.
    let mut mode_given = cat;
    let mut listing = false;
    // -B's block size, dropped for a legacy frame (always 8 MiB blocks).
    let (mut legacy, mut block) = (false, None);
    for a in args {
        let Some(s) = a.to_str().filter(|_| !rest) else {
            names.push(a);
            continue;
        };
        match s {
            "--" => rest = true,
            "-m" | "--multiple" => multiple = true,
            // -r takes several inputs too, and the files under them.
            "-r" => {
                multiple = true;
                out.push(a);
            }
            "-BD" | "-BX" | "--no-frame-crc" => {}
            "-B4" => block = Some("64K"),
            "-B5" => block = Some("256K"),
            "-B6" => block = Some("1M"),
            "-B7" => block = Some("4M"),
            b if b.starts_with("-B") => return Err(format!("lz4 {b}: incorrect parameters")),
            "-" => names.push(a),
            "--test" | "--list" | "--stdout" | "--to-stdout" => {
                to_stdout = true;
                listing |= s == "--list";
                mode_given |= s != "--stdout" && s != "--to-stdout";
                out.push(a);
            }
            "--decompress" | "--uncompress" | "--compress" => {
                mode_given = true;
                out.push(a);
            }
            f if f.starts_with("--") => out.push(a),
            f if f.starts_with('-') => {
                // A cluster: -m in it is lz4's (several inputs); -c
                // writes to stdout and -t writes nothing.
                // -l (legacy frames) is lz4's too: it has no -l of
                // its own for --list.
                multiple |= f.contains(['m', 'r']);
                to_stdout |= f.contains('c') || f.contains('t');
                mode_given |= f.contains(['d', 'z', 't']);
                legacy |= f.contains('l');
                let rest: String = f.chars().filter(|&c| c != 'm' && c != 'l').collect();
                if rest != "-" {
                    out.push(rest.into());
                }
            }
            _ => names.push(a),
        }
    }
    if legacy {
        out.push("--legacy".into());
    } else if let Some(b) = block {
        out.extend(["-b".into(), b.into()]);
    }
    // lz4's own names of standard input and output: `stdin` as an input
    // (any of -m's), `stdout` as the output (the second name); `-`
    // stands for both below.
    let output_at = (!multiple && names.len() == 2).then_some(1);
    for (i, n) in names.iter_mut().enumerate() {
        let special = if Some(i) == output_at {
            "stdout"
        } else {
            "stdin"
        };
        if *n == special {
            *n = OsString::from("-");
        }
    }
    // `lz4 x.lz4` (also with -m: the first name decides for all).
    let first_is_lz4 = names
        .first()
        .is_some_and(|n| n != "-" && n != "stdin" && n.as_encoded_bytes().ends_with(b".lz4"));
    if !mode_given && first_is_lz4 {
        out.push("-d".into());
    }
    // `lz4 --list IN OUT` lists IN (OUT would be its output).
    if listing && !multiple && names.len() == 2 {
        names.pop();
    }
    if !multiple && names.len() > 2 {
        return Err(format!(
            "lz4: {} names: one input and one output, or -m for several inputs",
            names.len()
        ));
    }
    if !multiple && !to_stdout {
        match names.len() {
            2 => {
                let output = names.pop().unwrap_or_default();
                if output == "-" {
                    out.push("-c".into());
                } else {
                    out.push("-o".into());
                    out.push(output);
                }
            }
            1 if names[0] != "-" && !stdout_is_terminal => {
                errln!(
                    "Warning : using stdout as default output. Do not rely on this behavior: \
                     use explicit `-c` instead ! "
                );
                out.push("-c".into());
            }
            _ => {}
        }
    }
    out.push("--".into());
    out.extend(names);
    Ok(out)
}

/// A size as xz reads one (`--memlimit=`, `--block-size=`): bytes, with
/// a binary suffix (k, kB, Ki, KiB, K, KB, and so for M and G), or a
/// percentage of the machine's memory (`50%`).
fn xz_size(s: &str) -> Result<u64, String> {
    let bad = || format!("{s}: invalid size (a number with KiB, MiB or GiB, or N%)");
    if let Some(p) = s.strip_suffix('%') {
        let p: u64 = p
            .parse()
            .ok()
            .filter(|p| (1..=100).contains(p))
            .ok_or_else(|| format!("{s}: a percentage must be from 1 to 100"))?;
        let ram = cairn_codec::memlimit::physical()
            .ok_or_else(|| format!("{s}: the machine's memory cannot be read for a percentage"))?;
        return Ok(ram / 100 * p);
    }
    // "max": no limit, as 0.
    if s == "max" {
        return Ok(0);
    }
    cairn_codec::format::xz_filters::xz_number(s).ok_or_else(bad)
}

/// xz's options that cairn's flags spell otherwise, as those flags:
/// filter options (`--x86[=start=N]`, `--arm`, `--armthumb`, `--arm64`,
/// `--powerpc`, `--ia64`, `--sparc`, `--riscv`, `--delta[=dist=N]`,
/// `--lzma1=`, `--lzma2=`, in order, cleared by a later preset as xz
/// clears them) become one `--filters=CHAIN`; `--format=` (auto, xz,
/// lzma, alone) `-F` and `--xz-format` (which a decode holds to: auto
/// reads xz and .lzma, the last given wins, as in xz);
/// memory limits (`-M`, `--memlimit`, `--memlimit-compress`,
/// `--memlimit-decompress`, `--memlimit-mt-decompress`, 0 for none, N%
/// of the memory) `--memlimit-compress` and `--memory`; `--block-size`
/// `-B`; `--no-adjust` stays, cairn's flag of the same name. The variables' words
/// `env` come first, as xz reads them; both lists come back rewritten,
/// the chain at the end of the variables' (before the command line's
/// other words).
fn xz_arguments(
    env: Vec<OsString>,
    rest: Vec<OsString>,
) -> Result<(Vec<OsString>, Vec<OsString>), String> {
    use cairn_codec::format::xz_filters::{Filter, FilterChain};
    let mut chain: Vec<Filter> = Vec::new();
    let mut each = |s: &str,
                    words: &mut std::vec::IntoIter<OsString>,
                    out: &mut Vec<OsString>|
     -> Result<(), String> {
        let mem =
            |v: &str| -> Result<Option<u64>, String> { xz_size(v).map(|n| (n > 0).then_some(n)) };
        // Short -F and -M, alone (`-F lzma`) or with their value (`-Flzma`).
        let short = |c: char| {
            s.strip_prefix('-')
                .and_then(|r| r.strip_prefix(c))
                .filter(|_| !s.starts_with("--"))
                .map(str::to_string)
        };
        let (format, memlimit) = if let Some(v) = short('F') {
            (Some(v), None)
        } else if let Some(v) = short('M') {
            (None, Some(v))
        } else {
            (None, None)
        };
        let format = match format {
            Some(v) if v.is_empty() => Some(next_value(words, "-F")?),
            Some(v) => Some(v),
            None => long_value(s, "--format", words).transpose()?,
        };
        if let Some(f) = format {
            let f = match f.as_str() {
                "auto" => None,
                "xz" => Some("xz"),
                "lzma" | "alone" => Some("lzma"),
                "raw" => {
                    return Err("--format=raw: raw streams (no header, the filter chain \
                                given on the command line) are not supported: use \
                                --format=xz or --format=lzma"
                        .into())
                }
                "lzip" => return Err("--format=lzip: cairn reads and writes no .lz files".into()),
                other => return Err(format!("{other}: unknown file format type")),
            };
            out.extend(["-F".into(), f.unwrap_or("xz").into()]);
            out.push(format!("--xz-format={}", f.unwrap_or("auto")).into());
            return Ok(());
        }
        let memlimit = match memlimit {
            Some(v) if v.is_empty() => Some(next_value(words, "-M")?),
            Some(v) => Some(v),
            None => long_value(s, "--memlimit", words).transpose()?,
        };
        let (compress, decompress) = if let Some(v) = memlimit {
            (Some(mem(&v)?), Some(mem(&v)?))
        } else if let Some(v) = long_value(s, "--memlimit-compress", words) {
            (Some(mem(&v?)?), None)
        } else if let Some(v) = long_value(s, "--memlimit-decompress", words)
            .or_else(|| long_value(s, "--memlimit-mt-decompress", words))
        {
            (None, Some(mem(&v?)?))
        } else {
            (None, None)
        };
        if compress.is_some() || decompress.is_some() {
            // 0: no limit (xz's default when compressing and decoding).
            if let Some(c) = compress {
                out.push(match c {
                    Some(n) => format!("--memlimit-compress={n}").into(),
                    None => format!("--memlimit-compress={}", usize::MAX).into(),
                });
            }
            if let Some(d) = decompress {
                out.push(
                    format!("--memory={}", d.unwrap_or(u64::MAX).min(usize::MAX as u64)).into(),
                );
            }
            return Ok(());
        }
        if let Some(v) = long_value(s, "--block-size", words) {
            let n = xz_size(&v?)?;
            out.extend(["-B".into(), n.to_string().into()]);
            return Ok(());
        }
        if let Some(v) = long_value(s, "--filters", words) {
            chain = FilterChain::parse(&v?)
                .map_err(|e| format!("--filters: {e}"))?
                .filters()
                .copied()
                .collect();
            return Ok(());
        }
        if let Some(long) = s.strip_prefix("--") {
            let (name, opts) = match long.split_once('=') {
                Some((n, o)) => (n, Some(o)),
                None => (long, None),
            };
            if let Some(f) = Filter::from_option(name, opts) {
                chain.push(f?);
                if chain.len() > cairn_codec::format::xz_filters::MAX_FILTERS {
                    return Err("the maximum number of filters is four".into());
                }
                return Ok(());
            }
            if matches!(long, "fast" | "best") {
                chain.clear();
            }
        } else if xz_preset_in(s) {
            // A preset after filter options replaces the chain, as in xz.
            chain.clear();
        }
        out.push(s.into());
        Ok(())
    };
    let mut env = rewrite_words(env, &mut each)?;
    let rest = rewrite_words(rest, &mut each)?;
    if !chain.is_empty() {
        let c = FilterChain::new(&chain)?;
        env.push(format!("--filters={}", chain_words(&c)).into());
    }
    Ok((env, rest))
}

/// The next word, the value of option `name`.
fn next_value(words: &mut dyn Iterator<Item = OsString>, name: &str) -> Result<String, String> {
    words
        .next()
        .and_then(|n| n.into_string().ok())
        .ok_or_else(|| format!("option {name} requires an argument"))
}

/// The value of long option `long` if `s` is it: after `=`, or the next
/// word.
fn long_value(
    s: &str,
    long: &str,
    words: &mut dyn Iterator<Item = OsString>,
) -> Option<Result<String, String>> {
    let v = s.strip_prefix(long)?;
    if let Some(v) = v.strip_prefix('=') {
        return Some(Ok(v.to_string()));
    }
    v.is_empty().then(|| next_value(words, long))
}

/// A chain as `--filters` reads it back.
fn chain_words(c: &cairn_codec::format::xz_filters::FilterChain) -> String {
    c.to_string()
        .split(' ')
        .map(|w| w.trim_start_matches('-').replacen('=', ":", 1))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether short-option cluster `s` holds a preset digit (`-9`, `-9e`,
/// `-kv6`) before any option that takes a value (`-T0` is no preset).
fn xz_preset_in(s: &str) -> bool {
    let Some(cluster) = s.strip_prefix('-').filter(|c| !c.starts_with('-')) else {
        return false;
    };
    for c in cluster.chars() {
        if "CFMST".contains(c) {
            return false;
        }
        if c.is_ascii_digit() {
            return true;
        }
    }
    false
}

/// xz's `-C CHECK`, `-CCHECK` and `--check CHECK` as `--check=CHECK`
/// (up to a `--`; the last flag of a cluster may be `-C`, as `-kC crc32`).
fn xz_check_values(args: Vec<OsString>) -> Vec<OsString> {
    let check_of = |c: OsString| {
        let mut check = OsString::from("--check=");
        check.push(c);
        check
    };
    let rewritten = rewrite_words(
        args,
        |s, rest, out| -> Result<(), std::convert::Infallible> {
            if s == "--check" {
                out.push(rest.next().map_or_else(|| s.into(), check_of));
                return Ok(());
            }
            let cluster = s.strip_prefix('-').filter(|c| !c.starts_with('-'));
            match cluster.and_then(|c| c.split_once('C')) {
                // (A C inside the value of -F, -M, -S or -T is no -C.)
                Some((flags, value))
                    if flags.chars().all(|c| c.is_ascii_alphanumeric())
                        && !flags.contains(['F', 'M', 'S', 'T']) =>
                {
                    if !flags.is_empty() {
                        out.push(format!("-{flags}").into());
                    }
                    let value = match value {
                        "" => rest.next(),
                        v => Some(OsString::from(v)),
                    };
                    out.push(value.map_or_else(|| "-C".into(), check_of));
                }
                _ => out.push(s.into()),
            }
            Ok(())
        },
    );
    match rewritten {
        Ok(words) => words,
        Err(never) => match never {},
    }
}

/// Turn pigz-style levels into `--level=N` before clap sees them: `-9`,
/// `-19`, and digits within a cluster of short flags (`-9c`, `-c9`, `-kv9`;
/// the last run of digits wins, as in gzip). Only for `cairn pack`; the
/// value of an option (`-T0`, `-b 4M`, `--level -5`) is left alone.
fn rewrite_level_flags(args: Vec<OsString>) -> Vec<OsString> {
    if args.get(1).and_then(|a| a.to_str()) != Some("pack") {
        return args;
    }
    // Options that take a value, as clap knows them: the rest of their
    // cluster, or else the next argument, is that value.
    let mut value_shorts = Vec::new();
    let mut value_longs = Vec::new();
    if let Some(pack) = Cli::command().find_subcommand("pack") {
        for arg in pack.get_arguments() {
            // (A value after `=` only, as --fast=N, never takes the next.)
            if arg.is_positional()
                || !arg.get_action().takes_values()
                || arg.is_require_equals_set()
            {
                continue;
            }
            value_shorts.extend(arg.get_short());
            value_shorts.extend(arg.get_all_short_aliases().into_iter().flatten());
            value_longs.extend(arg.get_long().map(|l| format!("--{l}")));
            let aliases = arg.get_all_aliases().into_iter().flatten();
            value_longs.extend(aliases.map(|l| format!("--{l}")));
        }
    }
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut args = args.into_iter();
    out.extend(args.by_ref().take(2));
    let mut value_next = false;
    while let Some(arg) = args.next() {
        let Some(s) = arg.to_str().filter(|_| !value_next) else {
            value_next = false;
            out.push(arg);
            continue;
        };
        if s == "--" {
            out.push(arg);
            out.extend(args);
            break;
        }
        if s.starts_with("--") {
            value_next = value_longs.iter().any(|l| l == s);
            out.push(arg);
            continue;
        }
        let Some(cluster) = s.strip_prefix('-').filter(|c| !c.is_empty()) else {
            out.push(arg);
            continue;
        };
        let mut flags = String::new();
        let mut level = String::new();
        let mut after_digit = false;
        for (i, c) in cluster.char_indices() {
            if c.is_ascii_digit() {
                if !after_digit {
                    level.clear();
                }
                level.push(c);
                after_digit = true;
                continue;
            }
            after_digit = false;
            flags.push(c);
            if value_shorts.contains(&c) {
                let value = &cluster[i + c.len_utf8()..];
                flags.push_str(value);
                value_next = value.is_empty();
                break;
            }
        }
        if level.is_empty() {
            out.push(arg);
            continue;
        }
        out.push(format!("--level={level}").into());
        if !flags.is_empty() {
            out.push(format!("-{flags}").into());
        }
    }
    out
}

/// xz's `--format` when decoding (`--xz-format`): the formats an xz
/// decoder reads. xz, unxz and xzcat start at auto; lzma, unlzma and
/// lzcat at lzma, as xz-utils sets it by the name it runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum XzFormat {
    /// xz and .lzma (`--format=auto`).
    Auto,
    /// xz alone (`--format=xz`).
    Xz,
    /// .lzma alone (`--format=lzma` or `alone`).
    Lzma,
}

impl XzFormat {
    /// The formats read.
    pub(crate) fn formats(self) -> Vec<cairn_codec::Format> {
        use cairn_codec::Format;
        match self {
            XzFormat::Auto => vec![Format::Xz, Format::Lzma],
            XzFormat::Xz => vec![Format::Xz],
            XzFormat::Lzma => vec![Format::Lzma],
        }
    }
}

/// The tool cairn stands in for, by the name it was run as: its exit
/// statuses are that tool's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tool {
    /// cairn itself, and gzip, gunzip, zcat.
    Gzip,
    /// pigz and unpigz: gzip's formats, pigz's statuses and messages.
    Pigz,
    Zstd,
    Xz,
    Bzip2,
    Lz4,
    Lzop,
}

impl Tool {
    fn of(name: &str) -> Tool {
        match name {
            "zstd" | "zstdmt" | "unzstd" | "zstdcat" => Tool::Zstd,
            "xz" | "unxz" | "xzcat" | "lzma" | "unlzma" | "lzcat" => Tool::Xz,
            "bzip2" | "bunzip2" | "bzcat" => Tool::Bzip2,
            "lz4" | "unlz4" | "lz4cat" => Tool::Lz4,
            "lzop" => Tool::Lzop,
            "pigz" | "unpigz" => Tool::Pigz,
            _ => Tool::Gzip,
        }
    }

    /// An input's name as the tool says it in a warning: standard input
    /// (cairn's `(stdin)`) is gzip's `stdin` and lzop's `<stdin>`.
    pub(crate) fn input_name(self, name: &str) -> &str {
        match (self, name) {
            (Tool::Gzip, cairn_filepack::STDIN_NAME) if invoked_as_link() => "stdin",
            (Tool::Lzop, cairn_filepack::STDIN_NAME) => "<stdin>",
            _ => name,
        }
    }

    /// The tool cairn was run as.
    pub(crate) fn invoked() -> Tool {
        INVOKED_AS.get().copied().unwrap_or(Tool::Gzip)
    }

    /// The tool cairn runs as when run through a link, else `None`.
    pub(crate) fn link() -> Option<Tool> {
        INVOKED_AS.get().copied()
    }

    /// The formats the tool decodes, when cairn runs under its name
    /// (`None`, every format, as `cairn unpack`): gzip, bzip2 and lz4
    /// their own; xz its own and .lzma (xz's --format=auto; unlzma and
    /// lzcat hold to .lzma by their `--xz-format`, see [`XzFormat`]);
    /// zstd its own, gzip, xz, .lzma and lz4, as Debian's zstd is built
    /// to (`zstd -d x.gz`).
    pub(crate) fn formats_of_link() -> Option<Vec<cairn_codec::Format>> {
        use cairn_codec::Format;
        Some(match Tool::link()? {
            Tool::Gzip | Tool::Pigz => vec![Format::Gzip],
            Tool::Zstd => vec![
                Format::Zstd,
                Format::Gzip,
                Format::Xz,
                Format::Lzma,
                Format::Lz4,
            ],
            Tool::Xz => XzFormat::Auto.formats(),
            Tool::Bzip2 => vec![Format::Bzip2],
            Tool::Lz4 => vec![Format::Lz4],
            Tool::Lzop => vec![Format::Lzop],
        })
    }

    /// The exit status of a failed run: bzip2's 2 for data it cannot
    /// decode (damaged, cut short, not bzip2) and 1 for the rest; lz4's
    /// 44 for an input in no format it reads ("Unrecognized header"), 68
    /// for one cut short ("Unfinished stream") and 66 for damage
    /// ("Decompression error"); 1 otherwise (measured with Debian 12's
    /// tools).
    pub(crate) fn error_status(self, error: &anyhow::Error) -> u8 {
        let Some(e) = error.downcast_ref::<cairn_filepack::Error>() else {
            return 1;
        };
        match self {
            Tool::Bzip2 if e.is_data_error() => 2,
            Tool::Lz4 if e.is_unknown_format() => 44,
            Tool::Lz4 => match e.codec() {
                Some(cairn_codec::CodecError::Truncated { .. }) => 68,
                Some(_) if e.is_data_error() => 66,
                _ => 1,
            },
            _ => 1,
        }
    }

    /// Whether `-q` hides what is said of `error`, an input's failure:
    /// pigz -q says nothing at all; gzip and xz hide their warnings (an
    /// input left alone: [`cairn_filepack::Error::is_warning`]) but not
    /// an output in the way; zstd, bzip2 and lz4 say every error (zstd
    /// hides its warning of a symbolic link passed over).
    pub(crate) fn quiet_hides(self, error: &cairn_filepack::Error) -> bool {
        use cairn_filepack::Error;
        let inner = error.inner();
        match self {
            Tool::Pigz => true,
            Tool::Gzip | Tool::Xz | Tool::Lzop => {
                error.is_warning() && !matches!(inner, Error::Exists { .. })
            }
            Tool::Zstd => matches!(inner, Error::SymlinkInput { .. }),
            Tool::Bzip2 | Tool::Lz4 => false,
        }
    }

    /// Whether `error` is no failure at all (with `-q` if `quiet`): gzip
    /// -q passes over a name with no suffix to take off without a word
    /// and without status 2 (as `gunzip -q *` in a directory of mixed
    /// files); gzip says a name that has its suffix already is left
    /// unchanged, and exits 0 for it (`gzip *` where some are packed);
    /// zstd passes over a symbolic link with a warning (and fails only
    /// when no input is left: [`Tool::fails_when_all_ignored`]).
    pub(crate) fn ignores(self, error: &cairn_filepack::Error, quiet: bool) -> bool {
        use cairn_filepack::Error;
        match (self, error.inner()) {
            (Tool::Gzip, Error::UnknownSuffix) => quiet,
            (Tool::Gzip, Error::AlreadySuffixed { .. }) => true,
            (Tool::Zstd, Error::SymlinkInput { .. }) => true,
            _ => false,
        }
    }

    /// What the tool says, in a line of its own words, of an input it
    /// cannot open or that is a directory (`None`: cairn's words, with
    /// the link's name before them, are the tool's too).
    pub(crate) fn input_refusal(self, error: &cairn_filepack::Error) -> Option<String> {
        use cairn_filepack::Error;
        let name = prog();
        // A name with no suffix to take off, to unpack into a file.
        if let Error::Input { input, source } = error {
            if matches!(**source, Error::UnknownSuffix) {
                match self {
                    Tool::Gzip => {
                        return Some(format!("{name}: {input}: unknown suffix -- ignored"))
                    }
                    Tool::Pigz => {
                        return Some(format!(
                            "{name}: skipping: {input} does not have compressed suffix"
                        ))
                    }
                    Tool::Zstd => {
                        return Some(format!(
                            "{name}: {input}: unknown suffix (.zst/.tzst/.gz/.tgz/.lzma/.xz/\
                             .txz/.lz4/.tlz4 expected). Can't derive the output file name. \
                             Specify it with -o dstFileName. Ignoring."
                        ))
                    }
                    _ => {}
                }
            }
        }
        match error.inner() {
            Error::Open { path, source } => {
                let (path, why) = (path.display(), crate::pack::io_reason(source));
                let missing = source.kind() == std::io::ErrorKind::NotFound;
                match self {
                    Tool::Pigz if missing => {
                        Some(format!("{name}: skipping: {path} does not exist"))
                    }
                    Tool::Zstd if missing => {
                        Some(format!("{name}: can't stat {path} : {why} -- ignored "))
                    }
                    Tool::Lz4 => Some(format!("{path}: {why} ")),
                    Tool::Lzop => Some(format!("{name}: {path}: can't open input file: {why}")),
                    Tool::Bzip2 => Some(format!("{name}: Can't open input file {path}: {why}.")),
                    _ => None,
                }
            }
            Error::IsDirectory { path } => {
                let path = path.display();
                match self {
                    Tool::Gzip => Some(format!("{name}: {path} is a directory -- ignored")),
                    Tool::Pigz => Some(format!("{name}: skipping: {path} is a directory")),
                    Tool::Zstd => Some(format!("{name}: {path} is a directory -- ignored ")),
                    Tool::Xz => Some(format!("{name}: {path}: Is a directory, skipping")),
                    Tool::Lzop => Some(format!(
                        "{name}: {path}: warning: not a regular file -- skipped"
                    )),
                    Tool::Bzip2 => Some(format!("{name}: Input file {path} is a directory.")),
                    Tool::Lz4 => None,
                }
            }
            _ => None,
        }
    }

    /// Whether a run whose every input was passed over ([`Tool::ignores`])
    /// fails: zstd then says there was no input to take (status 1).
    pub(crate) fn fails_when_all_ignored(self) -> bool {
        self == Tool::Zstd
    }

    /// The exit status for an input left alone where gzip only warns
    /// (`error`: why, when one input was; `None`: a warning about data
    /// decoded, as trailing garbage): gzip's and xz's warnings are 2, but
    /// an output in the way is an error (1) for xz; bzip2's trailing
    /// garbage is 0; zstd, bzip2 and lz4 have no warning status otherwise
    /// (measured with Debian 12's tools).
    pub(crate) fn warning_status(self, error: Option<&cairn_filepack::Error>) -> u8 {
        use cairn_filepack::Error;
        // (One input's error, inside the input's name.)
        let error = error.map(Error::inner);
        match self {
            Tool::Gzip => 2,
            // pigz skips an input with status 1 and stops quietly at
            // trailing garbage (status 0); bzip2 warns of it and exits 0.
            Tool::Pigz | Tool::Bzip2 if error.is_none() => 0,
            Tool::Pigz => 1,
            Tool::Xz
                if error.is_some_and(|e| e.any_cause(|e| matches!(e, Error::Exists { .. }))) =>
            {
                1
            }
            Tool::Xz => 2,
            // lzop: an output in the way, a name it cannot unpack to
            // ("unknown suffix -- ignored") fail; a file passed over (not
            // regular, suffixed already) warns.
            Tool::Lzop
                if error.is_some_and(|e| {
                    e.any_cause(|e| matches!(e, Error::Exists { .. } | Error::UnknownSuffix))
                }) =>
            {
                1
            }
            Tool::Lzop => 2,
            Tool::Zstd | Tool::Bzip2 | Tool::Lz4 => 1,
        }
    }
}

/// The tool cairn runs as, when it runs under one's name (a link).
static INVOKED_AS: std::sync::OnceLock<Tool> = std::sync::OnceLock::new();
/// The name of that link (`gunzip`, `xz`...).
static INVOKED_NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The name messages begin with: the link's (`gzip: x: not in gzip
/// format`, as gzip says it), else `cairn`.
pub(crate) fn prog() -> &'static str {
    INVOKED_NAME.get().map_or("cairn", String::as_str)
}

/// Whether cairn runs under a tool's name: usage errors are then status 1,
/// as each of those tools gives, not clap's 2; and no progress bar is
/// drawn, as none of those tools draws one by default.
pub(crate) fn invoked_as_link() -> bool {
    INVOKED_AS.get().is_some()
}

/// The work is done but something was said about it (gzip's warnings,
/// as trailing garbage): the exit status of the tool cairn stands in for
/// ([`Tool::warning_status`]), and nothing more to print.
#[derive(Debug)]
pub(crate) struct Warned(pub u8);

impl std::fmt::Display for Warned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("finished with warnings")
    }
}

impl std::error::Error for Warned {}

/// Variables that stand for options (clap's `env`): one set to the empty
/// string counts as not set, as restic's do (`CAIRN_PASSWORD_FILE= cairn
/// ...` was "a value is required for --password-file").
const OPTION_VARIABLES: [&str; 6] = [
    "CAIRN_REPO",
    "CAIRN_PASSWORD_FILE",
    "CAIRN_PASSWORD_COMMAND",
    "CAIRN_FROM_PASSWORD_FILE",
    "CAIRN_FROM_PASSWORD_COMMAND",
    "CAIRN_NEW_PASSWORD_FILE",
];

fn unset_empty_option_variables() {
    for name in OPTION_VARIABLES {
        if std::env::var_os(name).is_some_and(|v| v.is_empty()) {
            // Before any thread starts (main's first steps).
            std::env::remove_var(name);
        }
    }
}

fn main() -> ExitCode {
    // Rust starts with SIGPIPE ignored, so a write to a closed pipe returns
    // EPIPE and `println!` panics. Like coreutils, end quietly instead: the
    // default action kills the process with SIGPIPE (status 141 in a shell).
    // Servers and socket clients ignore it again where they need EPIPE.
    signals::default_sigpipe();
    signals::fill_closed_std_streams();
    unset_empty_option_variables();
    let args = rewrite_level_flags(as_invoked(std::env::args_os().collect()));
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, &help_command(&args)),
    };
    init_logging(match &cli.command {
        Command::Pack(a) => log_verbosity(&a.common, &a.decode),
        Command::Unpack(a) => log_verbosity(&a.common, &a.decode),
        Command::Serve(a) => u8::from(a.verbose),
        _ => 0,
    });
    // Each machine keeps what it has seen of a repository, so that a
    // snapshot gone without a removal record is noticed (the library
    // keeps nothing unless asked).
    cairn_store::keep_seen_records();
    let result = match cli.command {
        Command::Pack(args) => pack::pack(&args),
        Command::Unpack(args) => pack::unpack(&args),
        Command::Init(args) => repo_cmd::init(&args),
        Command::Backup(args) => repo_cmd::backup(&args),
        Command::Restore(args) => repo_cmd::restore(&args),
        Command::Ls(args) => repo_cmd::ls(&args),
        Command::Verify(args) => repo_cmd::verify(&args),
        Command::Repair(args) => repo_cmd::repair(&args),
        Command::Rm(args) => repo_cmd::rm(&args),
        Command::Forget(args) => repo_cmd::forget(&args),
        Command::Tag(args) => repo_cmd::tag(&args),
        Command::Diff(args) => diff_copy::diff(&args),
        Command::Copy(args) => diff_copy::copy(&args),
        Command::Gc(args) => repo_cmd::gc(&args),
        Command::Stats(args) => repo_cmd::stats(&args),
        Command::Unlock(args) => repo_cmd::unlock(&args),
        Command::Key(args) => key_cmd::key(&args),
        Command::Serve(args) => serve::serve(&args),
        Command::Mount(args) => mount::mount(&args),
        Command::Cache(args) => cache_cmd::cache(&args),
        Command::Commit(args) => serve_repo::commit(&args),
        Command::Generate(args) => generate::generate(&args),
    };
    // The work's own error first; else a report that could not be printed.
    let unprinted = out::finish();
    match (result, unprinted) {
        (Ok(()), None) => ExitCode::SUCCESS,
        // Warnings were printed (or silenced by -q) where they arose.
        (Err(e), None) if e.is::<Warned>() => {
            ExitCode::from(e.downcast_ref::<Warned>().map_or(2, |w| w.0))
        }
        (Err(e), _) => {
            errln!("{}", error_line(e.as_ref()));
            ExitCode::from(Tool::invoked().error_status(&e))
        }
        (Ok(()), Some(e)) => {
            errln!(
                "{}: cannot write to standard output: {}",
                prog(),
                crate::pack::io_reason(&e)
            );
            ExitCode::FAILURE
        }
    }
}

/// The verbosity diagnostics are shown at: under gzip's and pigz's names,
/// the first -v of a listing asks for its columns (method, CRC, time),
/// not for the codec's notes.
fn log_verbosity(common: &CommonArgs, decode: &DecodeArgs) -> u8 {
    let columns = decode.list && decode.list_as_gzip;
    common.verbose.saturating_sub(u8::from(columns))
}

/// Diagnostics go through `tracing` to stderr. `RUST_LOG` (as
/// `RUST_LOG=cairn_filepack=debug`) decides what is shown when set;
/// otherwise warnings only, and each `-v` beyond the first one a level more
/// (the first `-v` is the summary line per file, which is output, not a
/// diagnostic, and is printed whatever the filter, and the codec's notes on
/// how a stream is decoded).
fn init_logging(verbosity: u8) {
    use std::io::IsTerminal;
    use tracing_subscriber::filter::{EnvFilter, LevelFilter};
    let level = match verbosity {
        0 | 1 => LevelFilter::WARN,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    let from_env = std::env::var_os(EnvFilter::DEFAULT_ENV).is_some_and(|v| !v.is_empty());
    let filter = if from_env {
        // A directive that does not parse is skipped, not fatal: logging
        // must never stop the data from flowing.
        EnvFilter::builder().from_env_lossy()
    } else {
        let filter = EnvFilter::default().add_directive(level.into());
        // The first -v also says how each stream is decoded (a gzip member
        // in parallel from a file or a pipe, or on one core, and why).
        match "cairn_codec=debug".parse() {
            Ok(d) if verbosity >= 1 => filter.add_directive(d),
            _ => filter,
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .init();
}

/// Help and version go out as clap prints them; a usage error becomes one
/// line, like every other error of cairn, with exit code 2.
fn usage_error(e: clap::Error, help: &str) -> ExitCode {
    use clap::error::ErrorKind;
    if e.kind() == ErrorKind::DisplayVersion {
        if let Some(line) = link_version() {
            outln!("{line}");
            return ExitCode::SUCCESS;
        }
    }
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return if e.use_stderr() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).skip_while(|l| l.is_empty());
    let mut msg = lines.next().unwrap_or("bad arguments").to_string();
    // "the following required arguments were not provided:" lists them below.
    if msg.ends_with(':') {
        let more: Vec<&str> = lines.take_while(|l| !l.is_empty()).collect();
        msg = format!("{} {}", msg, more.join(", "));
    }
    let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
    errln!("{}: {msg} (see {help} --help)", prog());
    ExitCode::from(if invoked_as_link() { 1 } else { 2 })
}

/// The command whose `--help` explains a usage error in `args`: the
/// subcommands named on the command line (`cairn cache status`), so that
/// an error in a subcommand's arguments does not send the user to the
/// top-level help, which lists only the subcommands. A tool's link is
/// its own command (`gzip --help`).
fn help_command(args: &[std::ffi::OsString]) -> String {
    if invoked_as_link() {
        return prog().to_string();
    }
    let mut words = vec![prog().to_string()];
    let mut cmd = Cli::command();
    for a in args.iter().skip(1) {
        let Some(a) = a.to_str() else { continue };
        if let Some(sub) = cmd.find_subcommand(a).cloned() {
            words.push(a.to_string());
            cmd = sub;
        }
    }
    words.join(" ")
}

/// `--version` under a tool's name: the link's name first and cairn's
/// version after the last space, as GNU's first line (`gzip (cairn)
/// 0.1.0`, as `xz (XZ Utils) 5.4.1`), and for zstd and lz4 in their
/// stars (`*** zstd (cairn) v0.1.0 ***`), so that a script that reads
/// the tool's name or version where the tool prints it still finds them.
fn link_version() -> Option<String> {
    let name = INVOKED_NAME.get()?;
    let version = env!("CARGO_PKG_VERSION");
    Some(match Tool::link()? {
        Tool::Zstd | Tool::Lz4 => format!("*** {name} (cairn) v{version} ***"),
        _ => format!("{name} (cairn) {version}"),
    })
}

/// The error and its causes on one line.
pub(crate) fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in std::iter::successors(Some(e), |e| e.source()) {
        let s = cause.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    said_as_tools_say_it(&parts.join(": "))
}

/// `line` with the operating system's reasons said as the tools say them:
/// without the " (os error N)" Rust puts after one ("No such file or
/// directory"), wherever an error's text was taken into another's. Only
/// where that follows the system's own words for N and ends the line or
/// a part of it (": " after), so a file name that holds such text is
/// changed only where it has ": " right after it.
fn said_as_tools_say_it(line: &str) -> String {
    const MARK: &str = " (os error ";
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find(MARK) {
        let after = &rest[at + MARK.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let code = after[..digits].parse::<i32>().ok();
        let tail = after.get(digits..).unwrap_or("");
        let ends_part = tail.starts_with(')') && (tail.len() == 1 || tail[1..].starts_with(": "));
        let system_words =
            code.map(|c| crate::pack::io_reason(&std::io::Error::from_raw_os_error(c)));
        match system_words {
            Some(words) if ends_part && rest[..at].ends_with(&words) => {
                out.push_str(&rest[..at]);
                rest = &tail[1..];
            }
            _ => {
                out.push_str(&rest[..at + 1]);
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The line that says `e` went wrong: the tool's own words where cairn
/// runs as a link and it has words of its own for it
/// ([`Tool::input_refusal`]), else the program's name and
/// [`one_line`].
pub(crate) fn error_line(e: &(dyn std::error::Error + 'static)) -> String {
    let own = e
        .downcast_ref::<cairn_filepack::Error>()
        .and_then(|fe| Tool::link()?.input_refusal(fe));
    own.unwrap_or_else(|| format!("{}: {}", prog(), one_line(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_error_codes_are_left_out_of_what_the_system_said_alone() {
        let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
        let e = cairn_filepack::Error::Open {
            path: "No such file or directory (os error 2).xz".into(),
            source: enoent,
        };
        assert_eq!(
            one_line(&e),
            "No such file or directory (os error 2).xz: No such file or directory"
        );
        // Taken into another error's text, and in the middle of a line.
        let eisdir = std::io::Error::from_raw_os_error(libc::EISDIR);
        let baked = std::io::Error::other(format!("index i: {eisdir}"));
        assert_eq!(one_line(&baked), "index i: Is a directory");
        assert_eq!(
            said_as_tools_say_it(&format!("a: {eisdir}: b")),
            "a: Is a directory: b"
        );
        // Not the system's words for that code, or not ending a part.
        for kept in [
            "a reason (os error 3)",
            "Is a directory (os error 2)",
            "Is a directory (os error 21) and more",
            "Is a directory (os error 21",
            "x (os error)",
            "x (os error 99999999999)",
        ] {
            assert_eq!(said_as_tools_say_it(kept), kept);
        }
        assert_eq!(
            crate::pack::io_reason(&std::io::Error::from_raw_os_error(libc::EACCES)),
            "Permission denied"
        );
    }

    /// Every variable an option is read from is in [`OPTION_VARIABLES`].
    #[test]
    fn every_option_variable_is_unset_when_empty() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = std::collections::BTreeSet::new();
        for e in std::fs::read_dir(&src).unwrap_or_else(|e| panic!("{e}")) {
            let path = e.unwrap_or_else(|e| panic!("{e}")).path();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for part in text.split("env = \"CAIRN_").skip(1) {
                if let Some(name) = part.split('"').next() {
                    found.insert(format!("CAIRN_{name}"));
                }
            }
        }
        let listed: std::collections::BTreeSet<String> =
            OPTION_VARIABLES.iter().map(|s| s.to_string()).collect();
        assert_eq!(found, listed);
    }

    #[test]
    fn sizes() {
        for (text, bytes) in [
            ("4M", 4 << 20),
            ("64M", 64 << 20),
            ("64MiB", 64 << 20),
            ("64MB", 64 << 20),
            ("64mb", 64 << 20),
            ("512K", 512 << 10),
            ("64KiB", 64 << 10),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
            ("65536", 65536),
            ("100B", 100),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
            if text.ends_with(|c: char| !c.is_ascii_digit()) {
                assert_eq!(parse_block(text), Ok(bytes), "{text}");
            }
        }
        for bad in [
            "0",
            "x",
            "",
            "M",
            "12Q",
            "1.5M",
            "-4M",
            "4 M",
            "99999999999999T",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    fn rewritten(args: &[&str]) -> Vec<String> {
        let args = args.iter().map(OsString::from).collect();
        rewrite_level_flags(args)
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn level_flags() {
        for (args, want) in [
            (&["pack", "-9"][..], &["pack", "--level=9"][..]),
            (
                &["pack", "-19", "-T", "2"],
                &["pack", "--level=19", "-T", "2"],
            ),
            (&["pack", "-9c"], &["pack", "--level=9", "-c"]),
            (&["pack", "-c9"], &["pack", "--level=9", "-c"]),
            (&["pack", "-1c9"], &["pack", "--level=9", "-c"]),
            (&["pack", "-kv"], &["pack", "-kv"]),
            (&["pack", "-dc"], &["pack", "-dc"]),
            (&["pack", "-T0"], &["pack", "-T0"]),
            (&["pack", "-9T2"], &["pack", "--level=9", "-T2"]),
            (&["pack", "-kT", "4"], &["pack", "-kT", "4"]),
            (&["pack", "-o", "-9"], &["pack", "-o", "-9"]),
            (&["pack", "--level", "-5"], &["pack", "--level", "-5"]),
            (&["pack", "-b64M"], &["pack", "-b64M"]),
            // pigz's -p and gzip's -S take values as -T does.
            (&["pack", "-9p2"], &["pack", "--level=9", "-p2"]),
            (
                &["pack", "-p", "2", "-6"],
                &["pack", "-p", "2", "--level=6"],
            ),
            (&["pack", "--processes", "3"], &["pack", "--processes", "3"]),
            (&["pack", "-rS.z9"], &["pack", "-rS.z9"]),
            (&["pack", "-9nr"], &["pack", "--level=9", "-nr"]),
            (&["pack", "--fast", "-9"], &["pack", "--fast", "--level=9"]),
            (&["pack", "-B4M", "-3"], &["pack", "-B4M", "--level=3"]),
            (&["pack", "--", "-3"], &["pack", "--", "-3"]),
            (&["unpack", "-9"], &["unpack", "-9"]),
            (&["restore", "-3"], &["restore", "-3"]),
        ] {
            let mut full = vec!["cairn"];
            full.extend(args);
            let mut expect = vec!["cairn"];
            expect.extend(want);
            assert_eq!(rewritten(&full), expect, "{args:?}");
        }
    }

    fn xz_args(env: &[&str], args: &[&str]) -> Result<(Vec<String>, Vec<String>), String> {
        let words = |a: &[&str]| a.iter().map(OsString::from).collect();
        let strings = |v: Vec<OsString>| -> Vec<String> {
            v.into_iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect()
        };
        xz_arguments(words(env), words(args)).map(|(e, r)| (strings(e), strings(r)))
    }

    #[test]
    fn xz_and_bzip2_links_refuse_r() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        for refused in [&["-r"][..], &["-kr", "x"], &["--recursive"], &["-9rv"]] {
            assert!(
                refuse_recursion("xz", args(refused)).is_err(),
                "{refused:?}"
            );
            assert!(
                refuse_recursion("bzip2", args(refused)).is_err(),
                "{refused:?}"
            );
        }
        // A value after xz's -C, -F, -M, -S or -T; a name
        // after --.
        for (taken, want) in [
            (&["-Ccrc32"][..], &["-Ccrc32"][..]),
            (&["-Fraw"], &["-Fraw"]),
            (&["-k", "--", "-r"], &["-k", "--", "-r"]),
            (&["-T2", "r"], &["-T2", "r"]),
            (&["-T", "2", "r"], &["-T", "2", "r"]),
            (&["-M", "1GiB", "-k"], &["-M", "1GiB", "-k"]),
            (&["-kS.tar", "a"], &["-kS.tar", "a"]),
            (&["-S", "-r", "a"], &["--suffix=-r", "a"]),
            (&["-kS", "-r"], &["-k", "--suffix=-r"]),
            (&["-S", "xCz", "a"], &["--suffix=xCz", "a"]),
            (&["--suffix", "-r", "a"], &["--suffix=-r", "a"]),
            (&["--suffix=.rr", "a"], &["--suffix=.rr", "a"]),
        ] {
            assert_eq!(
                refuse_recursion("xz", args(taken)),
                Ok(args(want)),
                "{taken:?}"
            );
        }
    }

    #[test]
    fn xz_options_as_cairn_flags() {
        let chain = |s: &str| format!("--filters={s}");
        for (env, args, want_env, want) in [
            (
                &[][..],
                &["--check=crc32", "--x86", "--lzma2=dict=32MiB", "f"][..],
                vec![chain("x86 lzma2:preset=6,dict=33554432")],
                &["--check=crc32", "f"][..],
            ),
            // A preset after the filters clears them; one before does not.
            (&[], &["--x86", "--lzma2", "-9e"], vec![], &["-9e"]),
            (
                &[],
                &["-T2", "--arm", "--lzma2"],
                vec![chain("arm lzma2:preset=6")],
                &["-T2"],
            ),
            // Every LZMA option reaches the chain (only dict= did).
            (
                &[],
                &["--lzma2=preset=9,mode=fast,lc=2,nice=64,mf=hc4,depth=4"],
                vec![chain(
                    "lzma2:preset=9,lc=2,nice=64,depth=4,mode=fast,mf=hc4",
                )],
                &[],
            ),
            (
                &["--delta=dist=2"],
                &["--lzma2=dict=1MiB"],
                vec![chain("delta:dist=2 lzma2:preset=6,dict=1048576")],
                &[],
            ),
            (
                &[],
                &["--format=lzma", "-F", "auto"],
                vec![],
                &[
                    "-F",
                    "lzma",
                    "--xz-format=lzma",
                    "-F",
                    "xz",
                    "--xz-format=auto",
                ],
            ),
            (
                &[],
                &["--block-size=1MiB", "-M", "0"],
                vec![],
                &[
                    "-B",
                    "1048576",
                    "--memlimit-compress=18446744073709551615",
                    "--memory=18446744073709551615",
                ],
            ),
            (
                &[],
                &["--memlimit-decompress=2KiB", "--no-adjust"],
                vec![],
                &["--memory=2048", "--no-adjust"],
            ),
            (&[], &["--", "--x86"], vec![], &["--", "--x86"]),
        ] {
            let (e, r) = xz_args(env, args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let mut env_want: Vec<String> = env
                .iter()
                .filter(|w| !w.starts_with("--delta"))
                .map(|s| s.to_string())
                .collect();
            env_want.extend(want_env);
            assert_eq!(
                (e, r),
                (
                    env_want,
                    want.iter().map(|s| s.to_string()).collect::<Vec<_>>()
                ),
                "{args:?}"
            );
        }
        for bad in [
            &["--format=raw"][..],
            &["--x86"],
            &["--lzma2=dict=1"],
            &["-M", "200%"],
            &["--block-size=1XB"],
            &["--x86", "--x86", "--x86", "--x86", "--lzma2"],
        ] {
            assert!(xz_args(&[], bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn zstd_options_refused_in_one_line() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        for refused in [&["--adapt"][..], &["--adapt=min=1", "f"]] {
            assert!(refuse_zstd_options(args(refused)).is_err(), "{refused:?}");
        }
        for taken in [
            &["-o", "--adapt"][..],
            &["-D", "dict", "f"],
            &["-oDIR"],
            &["-T2", "f"],
            &["--", "-D"],
            &["-d", "--long=31"],
        ] {
            assert!(refuse_zstd_options(args(taken)).is_ok(), "{taken:?}");
        }
    }

    #[test]
    fn zstd_hints_are_checked_and_dropped() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let dropped = zstd_hints_dropped(args(&[
            "--size-hint=10MiB",
            "-3",
            "--stream-size=123",
            "--auto-threads=logical",
            "--priority=rt",
            "--asyncio",
            "--no-asyncio",
            "f",
            "--",
            "--asyncio",
        ]));
        assert_eq!(dropped, Ok(args(&["-3", "f", "--", "--asyncio"])));
        for bad in [
            &["--size-hint=10XB"][..],
            &["--stream-size="],
            &["--auto-threads=all"],
            &["--priority=low"],
            &["--asyncio=1"],
        ] {
            assert!(zstd_hints_dropped(args(bad)).is_err(), "{bad:?}");
        }
        assert_eq!(cairn_codec::format::zstd::number("4K"), Some(4096));
        assert_eq!(cairn_codec::format::zstd::number("2MB"), Some(2 << 20));
        assert_eq!(
            cairn_codec::format::zstd::number("99999999999999999999"),
            None
        );
    }

    fn lz4_args(args: &[&str]) -> Vec<String> {
        let args = args.iter().map(OsString::from).collect();
        lz4_arguments(args, false, false)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn lz4_legacy_and_its_names_of_standard_input_and_output() {
        for (args, want) in [
            // Linux's arm64 Image.lz4 rule and Android's mkbootimg.
            (
                &["-l", "-12", "--favor-decSpeed", "stdin", "stdout"][..],
                &["-12", "--favor-decSpeed", "--legacy", "-c", "--", "-"][..],
            ),
            (
                &["-l9", "-B4", "x", "y"],
                &["-9", "--legacy", "-o", "y", "--", "x"],
            ),
            (&["-B4", "x", "y"], &["-b", "64K", "-o", "y", "--", "x"]),
            (&["stdin"], &["--", "-"]),
            // `stdin` as the output and `stdout` as the input are files.
            (&["stdout", "stdin"], &["-o", "stdin", "--", "stdout"]),
            (&["-d", "stdin", "stdout"], &["-d", "-c", "--", "-"]),
            (&["-m", "stdin", "x"], &["--", "-", "x"]),
        ] {
            assert_eq!(lz4_args(args), want, "{args:?}");
        }
    }
}
