//! `cairn serve`: export repository images and plain files or devices
//! over NBD until SIGINT or SIGTERM.

use anyhow::{bail, Context, Result};
use cairn_blockdev::{BlockDev, FaultDev, FileDev, FileOptions, RotationalModel};
use cairn_nbd::{Export, Listener, Server, ServerConfig};
use cairn_volume::WritableVolume;
use cairn_wbcache::{WbCache, WbConfig};
use clap::Args;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Repository whose images are exported (read-only), also from
    /// $CAIRN_REPO: a directory or s3://BUCKET/PREFIX.
    #[arg(long = "repo", env = "CAIRN_REPO", value_name = "REPO")]
    pub repo: Option<PathBuf>,
    #[command(flatten)]
    pub password: crate::key_cmd::PasswordArgs,
    /// Export this image (NAME: its latest snapshot; NAME@SNAPSHOT: that
    /// one, read-only), under that name; repeat for more. `rw` makes it
    /// writable: writes land in an overlay on local disk (`overlay=DIR`,
    /// default `overlays/NAME` under $CAIRN_STATE_DIR, $XDG_STATE_HOME/cairn
    /// or ~/.local/state/cairn, in a folder named by the repository id),
    /// where a flush makes them durable; they become the image's next
    /// snapshot every --commit-every seconds, on `cairn commit --control`,
    /// and when the server stops. `cache=CACHE` puts a write-back log cache
    /// in front (implies rw). A writable image holds the image's lock while
    /// served. Default with --repo: every image's latest snapshot,
    /// read-only, named NAME.
    #[arg(
        long = "image",
        value_name = "NAME[@SNAPSHOT][,rw][,cache=CACHE][,overlay=DIR]"
    )]
    pub images: Vec<String>,
    /// Seconds between commits of the writes to writable images as new
    /// snapshots (0: only on request and when the server stops).
    #[arg(long = "commit-every", value_name = "SECS", default_value_t = 600)]
    pub commit_every: u64,
    /// Export a file or block device: [NAME=]PATH[,ro][,direct][,cache=CACHE][,hdd].
    /// The export is named NAME, or the file's name; `ro` refuses writes,
    /// `direct` uses O_DIRECT, `cache=CACHE` puts a write-back log cache
    /// on the file or device CACHE in front of it (formatted if blank);
    /// `hdd` makes PATH as slow as a 7200 rpm disk (the rotational cost
    /// model of cairn-blockdev, for benchmarks).
    #[arg(
        long = "file",
        value_name = "[NAME=]PATH[,ro][,direct][,cache=CACHE][,hdd]"
    )]
    pub files: Vec<String>,
    /// TCP address to listen on (repeatable; default 127.0.0.1:10809
    /// unless --socket is given). Port 0 picks a free port.
    #[arg(long = "listen", value_name = "ADDR:PORT")]
    pub listen: Vec<String>,
    /// Unix socket to listen on (repeatable).
    #[arg(long = "socket", value_name = "PATH")]
    pub sockets: Vec<PathBuf>,
    /// Requests served at once per connection.
    #[arg(long = "workers", default_value_t = 8)]
    pub workers: usize,
    /// Clients served at once; more are refused with a message.
    #[arg(long = "max-connections", default_value_t = ServerConfig::default().max_connections,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,
    /// Bytes all clients' requests in flight may hold together (write
    /// payloads, read data); past it, requests wait (e.g. 256M). While
    /// another's requests wait, a client is disconnected that in 5 s took
    /// under 16 KiB of its reply (not with --io-timeout 5 or less) or
    /// sent under 16 KiB of a write's payload, or that takes a reply or
    /// sends a payload slower than the pace that moves all of it within
    /// 5 s + 30 s of its start (after 5 s, its length / 30 s every
    /// second: 32 MiB needs about 1.1 MB/s; --payload-time sets the 30 s).
    #[arg(long = "max-inflight", value_parser = crate::parse_size, default_value = "256M")]
    pub max_inflight: usize,
    /// Seconds, after the first 5, in which a write's payload or a read's
    /// reply must move whole while other clients wait for memory (see
    /// --max-inflight): raise it for clients on slow links that send or
    /// read large requests (32 MiB at 500 KB/s needs 70).
    #[arg(long = "payload-time", value_name = "SECS",
          default_value_t = ServerConfig::default().payload_time_under_pressure.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    pub payload_time: u64,
    /// Seconds a client may take to negotiate.
    #[arg(long = "handshake-timeout", value_name = "SECS", default_value_t = ServerConfig::default().handshake_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    pub handshake_timeout: u64,
    /// Seconds a request's bytes may stop arriving, or a reply stop being
    /// taken, before the connection is closed.
    #[arg(long = "io-timeout", value_name = "SECS", default_value_t = ServerConfig::default().io_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    pub io_timeout: u64,
    /// TLS: `off`; `on` (offered, clients choose); `require` (nothing is
    /// served before a client starts TLS). Default: `require` with
    /// --tls-verify-peer, `on` with --tls-certificates, else `off`.
    #[arg(long = "tls", value_enum, value_name = "MODE")]
    pub tls: Option<TlsMode>,
    /// Directory with server-cert.pem and server-key.pem (X.509, PEM; the
    /// layout of qemu-nbd's tls-creds-x509 and nbdkit's --tls-certificates).
    #[arg(long = "tls-certificates", value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Authenticate clients: each must show a certificate signed by a CA
    /// in DIR/ca-cert.pem (qemu-nbd's verify-peer, nbdkit's
    /// --tls-verify-peer); others fail the TLS handshake. Makes --tls
    /// default to `require`.
    #[arg(long = "tls-verify-peer", requires = "tls_certificates")]
    pub tls_verify_peer: bool,
    /// Close connections without a request for this many seconds (0:
    /// never, as qemu-nbd; kernel clients idle for hours).
    #[arg(long = "idle-timeout", value_name = "SECS", default_value_t = 0)]
    pub idle_timeout: u64,
    /// Cache of decompressed chunks per repository image (e.g. 256M; binary units: 256M = 256MiB).
    #[arg(long = "image-cache", value_parser = crate::parse_size, default_value = "256M")]
    pub cache: usize,
    /// Second cache tier per repository image: groups that random reads
    /// decoded are kept compressed with LZ4, chunk by chunk, once evicted
    /// from --image-cache, so a later 4K read decodes one chunk's head
    /// instead of a whole zstd group (0: off).
    #[arg(long = "image-compact-cache", value_name = "SIZE", value_parser = crate::parse_size_or_zero, default_value = "1G")]
    pub compact_cache: usize,
    /// Third tier per repository image: compact copies evicted from
    /// --image-compact-cache go on to an unlinked file in cairn's cache
    /// directory ($CAIRN_CACHE_DIR, $XDG_CACHE_HOME/cairn or
    /// ~/.cache/cairn), sealed under a key of its own, up to this size (at
    /// most about the image's size and, for all images together, half the
    /// space free there; allocated when the first copy is spilled), so
    /// random reads of an image past memory read one chunk's compact bytes
    /// from local disk instead of decoding a whole group (0: off).
    #[arg(long = "image-spill", value_name = "SIZE", value_parser = crate::parse_size_or_zero, default_value = "8G")]
    pub spill: usize,
    /// A repository in an object store (s3://): keep the pack ranges read
    /// in a local cache of this size (under $CAIRN_CACHE_DIR or
    /// ~/.cache/cairn), so random reads are fetched once.
    #[arg(long = "chunk-cache", value_parser = crate::parse_size, default_value = "1G")]
    pub chunk_cache: usize,
    /// Threads decoding ahead of sequential readers (default: cores).
    #[arg(short = 'T', long = "threads", value_parser = crate::parse_threads)]
    pub threads: Option<usize>,
    /// Write-back cache: segments written back per batch.
    #[arg(long = "cache-batch", default_value_t = WbConfig::default().batch)]
    pub cache_batch: usize,
    /// Write-back cache: writeback writes in flight to the backing device
    /// (issued in address order; a disk's command queue serves them in
    /// the order its head reaches them).
    #[arg(long = "cache-writeback-depth", default_value_t = WbConfig::default().writeback_depth)]
    pub cache_writeback_depth: usize,
    /// Write-back cache: start writeback when this fraction of the log is dirty.
    #[arg(long = "cache-dirty-high", default_value_t = WbConfig::default().dirty_high)]
    pub cache_dirty_high: f64,
    /// Write-back cache: write back after this many milliseconds without writes.
    #[arg(long = "cache-idle-ms", default_value_t = WbConfig::default().idle_writeback.as_millis() as u64)]
    pub cache_idle_ms: u64,
    /// Write-back cache: persistent-log mode (for loads that flush after
    /// nearly every write): a FLUSH appends the new blocks to a small log
    /// instead of sealing a whole segment.
    #[arg(long = "cache-plog")]
    pub cache_plog: bool,
    /// Write-back cache: block-aligned writes continuing a sequential
    /// stream of at least this many bytes go straight to the backing
    /// device (unless cached there); 0 turns this off.
    #[arg(long = "cache-seq-cutoff", value_parser = crate::parse_size_or_zero, default_value = "4M")]
    pub cache_seq_cutoff: usize,
    /// Write-back cache: writes whose blocks are not cached go straight to
    /// a backing device whose writes take less than this many
    /// microseconds (measured while serving; 0: never).
    #[arg(long = "cache-bypass-below-us", default_value_t = WbConfig::default().bypass_below.as_micros() as u64)]
    pub cache_bypass_below_us: u64,
    /// Write-back cache: seal the RAM segment into the log at most this
    /// many milliseconds after its first write, FLUSH or not (0: only
    /// when full or flushed).
    #[arg(long = "cache-flush-deadline-ms", default_value_t = WbConfig::default().flush_deadline.as_millis() as u64)]
    pub cache_flush_deadline_ms: u64,
    /// Write-back cache: open a cache whose log is damaged (writes that
    /// were flushed cannot be read back) anyway, without what is lost.
    /// Without it such a cache is refused, naming the damage.
    #[arg(long = "cache-accept-loss")]
    pub cache_accept_loss: bool,
    /// A unix socket where `cairn cache status|drain --control SOCK` reach
    /// the write-back caches of this server, and `cairn commit --control
    /// SOCK` its writable images.
    #[arg(long = "control", value_name = "SOCK")]
    pub control: Option<PathBuf>,
    /// Log connections and protocol errors on stderr.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
}

/// `--tls`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsMode {
    /// No TLS.
    Off,
    /// TLS offered; clients choose.
    On,
    /// TLS required before anything is served.
    Require,
}

/// The server's TLS settings from the arguments: (settings, required).
fn tls_settings(a: &ServeArgs) -> Result<(Option<Arc<cairn_nbd::TlsConfig>>, bool)> {
    // Asking clients for certificates means only they are served: a plain
    // client shows none (qemu-nbd with TLS credentials serves no plain
    // client either).
    let mode = a.tls.unwrap_or(if a.tls_verify_peer {
        TlsMode::Require
    } else if a.tls_certificates.is_some() {
        TlsMode::On
    } else {
        TlsMode::Off
    });
    if mode == TlsMode::On && a.tls_verify_peer {
        errln!(
            "cairn serve: warning: --tls on serves plain clients, without a certificate; \
             --tls-verify-peer authenticates only the TLS ones (--tls require: every client)"
        );
    }
    if mode == TlsMode::Off {
        if a.tls_verify_peer {
            bail!("--tls off --tls-verify-peer: clients are asked for certificates only over TLS");
        }
        return Ok((None, false));
    }
    let Some(dir) = &a.tls_certificates else {
        bail!("--tls on|require needs --tls-certificates DIR (server-cert.pem, server-key.pem)");
    };
    let config = cairn_nbd::tls_server_config(dir, a.tls_verify_peer).context("TLS")?;
    Ok((Some(config), mode == TlsMode::Require))
}

/// Whether a TCP listen address is on the loopback interface only.
fn is_loopback(addr: &str) -> bool {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()
        .map(|mut it| it.all(|a| a.ip().is_loopback()))
        .unwrap_or(false)
}

/// A parsed `--file`.
struct FileSpec {
    name: String,
    path: PathBuf,
    opts: FileOptions,
    cache: Option<PathBuf>,
    hdd: bool,
}

/// `[NAME=]PATH[,ro][,direct][,cache=CACHE]`.
fn parse_file_spec(spec: &str) -> Result<FileSpec> {
    let mut parts = spec.split(',');
    let first = parts.next().unwrap_or_default();
    // Locked while served, as qemu-nbd locks its images.
    let mut opts = FileOptions {
        lock: true,
        ..FileOptions::default()
    };
    let mut cache = None;
    let mut hdd = false;
    for p in parts {
        match p {
            "hdd" => hdd = true,
            "ro" => opts.read_only = true,
            "rw" => opts.read_only = false,
            "direct" => opts.direct = true,
            c if c.starts_with("cache=") && c.len() > 6 => cache = Some(PathBuf::from(&c[6..])),
            other => {
                bail!("--file {spec:?}: unknown option {other:?} (ro, rw, direct, cache=PATH, hdd)")
            }
        }
    }
    let (name, path) = match first.split_once('=') {
        Some((n, p)) => (n.to_string(), PathBuf::from(p)),
        None => {
            let path = PathBuf::from(first);
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, path)
        }
    };
    if path.as_os_str().is_empty() {
        bail!("--file {spec:?}: no path");
    }
    if name.is_empty() {
        bail!("--file {spec:?}: no export name");
    }
    Ok(FileSpec {
        name,
        path,
        opts,
        cache,
        hdd,
    })
}

/// A write-back cache in use: its path, the cache, its lock, the export.
type Cached = (PathBuf, Arc<WbCache>, String);

/// A writable repository image, and the write-back cache in front of it if
/// any. A commit drains the cache into the image first: a snapshot holds
/// every write acknowledged before it, those still in the cache's log too
/// (they were left out, and a later serve with the cache put them back
/// over newer snapshots), and none acknowledged after it.
#[derive(Clone)]
struct Writable {
    vol: Arc<WritableVolume>,
    cache: Option<Arc<WbCache>>,
    /// One commit at a time (the periodic one, `cairn commit --control`):
    /// a second would wait for the first's upload while holding the
    /// cache's writes back.
    committing: Arc<std::sync::Mutex<()>>,
}

impl Writable {
    fn name(&self) -> &str {
        self.vol.name()
    }

    /// Write everything the cache holds back into the image.
    fn drain(&self) -> Result<()> {
        if let Some(wb) = &self.cache {
            wb.drain()
                .with_context(|| format!("drain the cache of image {}", self.name()))?;
        }
        Ok(())
    }

    fn commit(&self) -> Result<Option<cairn_store::EditReport>> {
        let _one = self
            .committing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let context = || format!("commit of image {}", self.name());
        if let Some(wb) = &self.cache {
            // A generation an earlier commit sealed goes first (it was cut
            // at one moment when it was sealed).
            if let Some(report) = self.vol.commit_sealed().with_context(context)? {
                return Ok(Some(report));
            }
            // The cache writes back in address order, and some writes go
            // around it straight into the image: the image is one moment
            // of the device only once the cache is drained with no write
            // let in. Most of it is written back while the client writes
            // on; the rest with writes held back, and the image sealed
            // there (a commit's stall is that rest and the seal).
            self.drain()?;
            wb.quiesced(|| -> Result<()> {
                self.drain()?;
                self.vol.seal().with_context(context)?;
                Ok(())
            })?;
            // Only what was sealed there: `commit` would seal the writes
            // made since the hold ended (none were sealed when the image
            // was idle), which are no moment of the image.
            return self.vol.commit_sealed().with_context(context);
        }
        self.vol.commit().with_context(context)
    }
}

/// Put the write-back cache at `cache` in front of `export`; returns it.
fn attach_cache(
    a: &ServeArgs,
    export: &mut Export,
    cache: &std::path::Path,
    owner: Option<cairn_wbcache::Owner>,
    caches: &mut Vec<Cached>,
) -> Result<Arc<WbCache>> {
    if caches.iter().any(|(p, _, _)| p == cache) {
        bail!("cache {} is given twice", cache.display());
    }
    let cfg = WbConfig {
        batch: a.cache_batch,
        writeback_depth: a.cache_writeback_depth,
        dirty_high: a.cache_dirty_high,
        idle_writeback: std::time::Duration::from_millis(a.cache_idle_ms),
        plog: a.cache_plog,
        seq_cutoff: a.cache_seq_cutoff as u64,
        bypass_below: std::time::Duration::from_micros(a.cache_bypass_below_us),
        flush_deadline: std::time::Duration::from_millis(a.cache_flush_deadline_ms),
        accept_loss: a.cache_accept_loss,
        owner,
        ..WbConfig::default()
    };
    let wb = crate::cache_cmd::open_cached(export.dev.clone(), cache, cfg, true)?;
    let wb = Arc::new(wb);
    caches.push((cache.to_path_buf(), wb.clone(), export.name.clone()));
    export
        .description
        .push_str(&format!(", cached on {}", cache.display()));
    export.dev = wb.clone();
    Ok(wb)
}

/// For a long-running server: every allocation of 1 MiB or more gets a
/// mapping of its own, given back to the kernel when freed. glibc's default
/// raises that threshold to the size of the first such block freed, after
/// which a served image's decoded groups (2 MiB, decoded on one thread and
/// evicted on another) come from per-thread arenas that keep what is freed:
/// 520 MiB for a 255 MiB cache. The groups' own pool
/// (`cairn_store::GroupBuffers`) keeps the fresh mappings (a page fault per
/// 4 KiB) to the decodes it has no buffer for (docs/benchmarks.md, "Memory
/// of a served image").
pub(crate) fn map_big_allocations() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a tunable of the allocator (called before
    // the server's threads start); memory already handed out is untouched.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

pub(crate) fn serve(a: &ServeArgs) -> Result<()> {
    map_big_allocations();
    if a.workers == 0 || a.workers > 256 {
        bail!("--workers must be 1 to 256");
    }
    if a.cache_batch == 0
        || !(1..=1024).contains(&a.cache_writeback_depth)
        || !(0.0..=1.0).contains(&a.cache_dirty_high)
    {
        bail!("--cache-batch must be at least 1, --cache-writeback-depth 1 to 1024 and --cache-dirty-high between 0 and 1");
    }
    let mut exports: Vec<Export> = Vec::new();
    let mut caches: Vec<Cached> = Vec::new();
    let mut writable: Vec<Writable> = Vec::new();
    let mut served_images: Vec<(String, Arc<cairn_volume::Volume>)> = Vec::new();
    for spec in &a.files {
        let f = parse_file_spec(spec)?;
        let mut description = format!("file {}", f.path.display());
        let mut dev: Arc<dyn BlockDev> =
            Arc::new(FileDev::open(&f.path, f.opts).with_context(|| format!("--file {spec}"))?);
        if f.hdd {
            dev = Arc::new(FaultDev::with_rotational(dev, RotationalModel::default()));
            description.push_str(" (modelled as a 7200 rpm disk)");
        }
        let mut export = Export {
            description,
            name: f.name,
            dev,
            read_only: f.opts.read_only,
        };
        let owner = crate::cache_cmd::file_owner(&f.path);
        if let Some(o) = &owner {
            crate::cache_bind::check(&f.path, o, export.dev.size(), f.cache.as_deref())
                .with_context(|| format!("--file {spec}"))?;
        }
        if let Some(c) = &f.cache {
            if f.opts.read_only {
                bail!("--file {spec}: a cache needs a writable file: drop `ro`");
            }
            // (Else the export's own lock answers "in use", which it is
            // not.)
            let id = |p: &std::path::Path| {
                std::fs::metadata(p)
                    .ok()
                    .and_then(|m| cairn_blockdev::FileIdentity::of(&m))
            };
            if id(c).is_some() && id(c) == id(&f.path) {
                bail!("--file {spec}: the cache is the exported file itself");
            }
            let wb = attach_cache(a, &mut export, c, owner.clone(), &mut caches)
                .with_context(|| format!("--file {spec}"))?;
            if let Some(o) = &owner {
                crate::cache_bind::bind(o, &f.path, c, wb.cache_id());
            }
        }
        exports.push(export);
    }
    if let Some(repo) = &a.repo {
        let specs = a
            .images
            .iter()
            .map(|s| crate::serve_repo::parse_image_spec(s))
            .collect::<Result<Vec<_>>>()?;
        let opts =
            crate::serve_repo::volume_options(a.cache, a.compact_cache, a.spill as u64, a.threads);
        let opened = crate::serve_repo::add_images(
            repo,
            &a.password,
            &specs,
            &opts,
            a.chunk_cache as u64,
            &mut exports,
        )?;
        served_images = opened.read_only;
        let mut cache_of = std::collections::HashMap::new();
        for (i, c) in opened.cached {
            let e = &mut exports[i];
            let name = e.name.clone();
            let vol = opened
                .writable
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone());
            let owner = vol.as_deref().map(crate::cache_cmd::image_owner);
            let wb = attach_cache(a, e, &c, owner, &mut caches)
                .with_context(|| format!("--image {name}"))?;
            // Before the cache takes a write: the overlay names it, so no
            // one opens the image without it while it may hold writes.
            if let Some(vol) = vol {
                vol.bind_cache(&cairn_volume::CacheBinding {
                    cache_id: wb.cache_id(),
                    path: std::path::absolute(&c).unwrap_or_else(|_| c.clone()),
                })
                .with_context(|| format!("--image {name}"))?;
            }
            cache_of.insert(name, wb);
        }
        writable = opened
            .writable
            .into_iter()
            .map(|(export, vol)| Writable {
                cache: cache_of.remove(&export),
                vol,
                committing: Default::default(),
            })
            .collect();
    } else if !a.images.is_empty() {
        bail!("--image needs --repo (or CAIRN_REPO)");
    }
    if exports.is_empty() {
        bail!("nothing to export: give --file PATH or --repo REPO");
    }
    for (i, e) in exports.iter().enumerate() {
        if exports[..i].iter().any(|o| o.name == e.name) {
            bail!(
                "two exports are named {:?} (name files with --file NAME=PATH; give each --image once)",
                e.name
            );
        }
    }
    let mut listeners = Vec::new();
    for s in &a.sockets {
        listeners
            .push(Listener::unix(s.clone()).with_context(|| format!("listen on {}", s.display()))?);
    }
    let mut addrs = a.listen.clone();
    if addrs.is_empty() && a.sockets.is_empty() {
        addrs.push("127.0.0.1:10809".into());
    }
    let (tls, tls_required) = tls_settings(a)?;
    for addr in &addrs {
        listeners.push(Listener::tcp(addr).with_context(|| format!("listen on {addr}"))?);
    }
    let read_only = exports.iter().all(|e| e.is_read_only());
    for addr in addrs.iter().filter(|a| !tls_required && !is_loopback(a)) {
        errln!(
            "cairn serve: warning: {addr} is reachable from other hosts and TLS is not \
             required: anyone who can connect reads{} the exports (--tls require)",
            if read_only { "" } else { " and writes" }
        );
    }
    let stop = crate::signals::stop_flag();
    let names: Vec<String> = exports
        .iter()
        .map(|e| {
            format!(
                "{} ({} bytes{})",
                e.name,
                e.dev.size(),
                if e.is_read_only() { ", ro" } else { "" }
            )
        })
        .collect();
    let server = Server::new(
        exports,
        ServerConfig {
            workers: a.workers,
            max_connections: a.max_connections,
            server_budget: a.max_inflight as u64,
            payload_time_under_pressure: Duration::from_secs(a.payload_time),
            handshake_timeout: Duration::from_secs(a.handshake_timeout),
            io_timeout: Duration::from_secs(a.io_timeout),
            idle_timeout: (a.idle_timeout > 0).then(|| Duration::from_secs(a.idle_timeout)),
            tls,
            tls_required,
            verbose: a.verbose,
            ..ServerConfig::default()
        },
    );
    for l in &listeners {
        errln!("cairn serve: listening on {}", l.describe());
    }
    errln!("cairn serve: exports: {}", names.join(", "));
    let control = match &a.control {
        Some(path) => {
            // The Listener owns the socket file (removed when it drops),
            // so it lives in the thread.
            let l = Listener::unix(path.clone())
                .with_context(|| format!("control socket {}", path.display()))?;
            let cached: Vec<(String, String, Arc<WbCache>)> = caches
                .iter()
                .map(|(p, wb, name)| (name.clone(), p.display().to_string(), wb.clone()))
                .collect();
            let images = writable.clone();
            let mut stats: Vec<(String, ImageStats)> = served_images
                .iter()
                .map(|(name, v)| {
                    let v = v.clone();
                    (name.clone(), Box::new(move || v.stats()) as ImageStats)
                })
                .collect();
            for w in &writable {
                let w = w.vol.clone();
                stats.push((w.name().to_string(), Box::new(move || w.volume_stats())));
            }
            Some(std::thread::spawn(move || {
                control_loop(l, cached, images, &stats, stop)
            }))
        }
        None => None,
    };
    let committer = (a.commit_every > 0 && !writable.is_empty()).then(|| {
        let images = writable.clone();
        let every = Duration::from_secs(a.commit_every);
        std::thread::spawn(move || commit_loop(&images, every, stop))
    });
    let report = server.serve(&listeners, stop);
    // The server returns on a stop, or on an error of its accept loop
    // without one: the control and commit threads wait for the flag.
    stop.store(true, Ordering::Release);
    if let Some(t) = control {
        let _ = t.join();
    }
    if let Some(t) = committer {
        let _ = t.join();
    }
    let report = report?;
    // The server flushed every writable export (cached writes are durable
    // in their log). A writable image's cache is drained into it, so the
    // last commit holds every write; a file's cache keeps its log, as a
    // cache device does. Then the caches' threads stop.
    drop(server);
    for w in &writable {
        w.drain().with_context(|| {
            format!(
                "the writes still in the cache stay there for the next serve of image {}",
                w.name()
            )
        })?;
    }
    let writable: Vec<(Arc<WritableVolume>, bool)> = writable
        .into_iter()
        .map(|w| (w.vol, w.cache.is_some()))
        .collect();
    for (path, wb, _) in caches {
        // The server and the control thread are gone, so this is the last
        // reference; were it not, the cache's Drop would flush and stop it.
        if let Ok(wb) = Arc::try_unwrap(wb) {
            wb.close()
                .with_context(|| format!("close the cache {}", path.display()))?;
        }
    }
    // Every write is in the images now: their overlays no longer need
    // the caches, and the session's last commit.
    for (img, cached) in &writable {
        if *cached {
            img.unbind_cache()
                .with_context(|| format!("image {}", img.name()))?;
        }
        let reports = img.close().with_context(|| {
            format!(
                "commit image {}: its flushed writes stay in {} for the next serve or `cairn commit`",
                img.name(),
                img.overlay_dir().display()
            )
        })?;
        for r in reports {
            errln!(
                "cairn serve: committed image {} as snapshot {}",
                img.name(),
                r.snapshot
            );
        }
    }
    if a.verbose {
        errln!(
            "cairn serve: stopped after {} connections ({} protocol errors, {} refused, {} closed for replies not taken or payloads not sent while others waited, {} cut at the stop deadline)",
            report.connections, report.protocol_errors, report.refused, report.cut_stalled, report.cut_at_stop
        );
    }
    Ok(())
}

/// Commit every writable image each `every` until `stop`; a failed
/// commit is reported and tried again next time (the writes stay in the
/// overlay).
fn commit_loop(images: &[Writable], every: Duration, stop: &AtomicBool) {
    let mut next = std::time::Instant::now() + every;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        if std::time::Instant::now() < next {
            continue;
        }
        for img in images {
            if let Err(e) = img.commit() {
                errln!(
                    "cairn serve: {} failed (tried again in {} s): {e:#}",
                    img.name(),
                    every.as_secs()
                );
            }
        }
        next = std::time::Instant::now() + every;
    }
}

/// The reply to a `commit [NAME]` request: the images committed.
fn commit_request(images: &[Writable], name: Option<&str>) -> Result<serde_json::Value, String> {
    let chosen: Vec<&Writable> = images
        .iter()
        .filter(|i| name.is_none_or(|n| i.name() == n))
        .collect();
    if chosen.is_empty() {
        return Err(match name {
            Some(n) => format!("no writable image named {n:?}"),
            None => "no writable image".into(),
        });
    }
    let mut out = Vec::new();
    for img in chosen {
        let report = img.commit().map_err(|e| format!("{e:#}"))?;
        out.push(serde_json::json!({
            "image": img.name(),
            "committed": report.is_some(),
            "snapshot": img.vol.snapshot(),
            "new_raw": report.map_or(0, |r| r.new_raw),
        }));
    }
    Ok(serde_json::json!({ "images": out }))
}

/// Answer `cairn cache status|drain --control` and `cairn commit
/// --control` until `stop`: one request line ("status", "drain NAME" or
/// "commit [NAME]"), one JSON reply line.
/// Where a served repository image's cache figures come from.
type ImageStats = Box<dyn Fn() -> cairn_volume::VolumeStats + Send>;

fn control_loop(
    listener: Listener,
    caches: Vec<(String, String, Arc<WbCache>)>,
    images: Vec<Writable>,
    stats: &[(String, ImageStats)],
    stop: &AtomicBool,
) {
    use std::io::{BufRead, BufReader, Write};
    let Listener::Unix(l, _) = &listener else {
        return;
    };
    if l.set_nonblocking(true).is_err() {
        return;
    }
    while !stop.load(Ordering::Acquire) {
        let mut s = match l.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
            Err(_) => continue,
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let mut line = String::new();
        if BufReader::new(&s).read_line(&mut line).is_err() {
            continue;
        }
        let mut words = line.split_whitespace();
        let first = words.next();
        if first == Some("commit") {
            let v = commit_request(&images, words.next())
                .unwrap_or_else(|e| serde_json::json!({ "error": e }));
            let _ = writeln!(s, "{v}");
            continue;
        }
        let reply = match (first, words.next()) {
            (Some("status"), None) => Ok(()),
            (Some("drain"), Some(name)) => match caches.iter().find(|(n, _, _)| n == name) {
                Some((_, _, wb)) => wb.drain().map_err(|e| format!("drain of {name}: {e}")),
                None => Err(format!("no cached export named {name:?}")),
            },
            _ => Err(format!("unknown request {:?}", line.trim())),
        };
        let v = match reply {
            Ok(()) => serde_json::json!({
                "caches": caches
                    .iter()
                    .map(|(name, path, wb)| {
                        let st = wb.status();
                        let mut v = crate::cache_cmd::status_json(path, &st);
                        v["export"] = name.as_str().into();
                        v["line"] = crate::cache_cmd::status_line(path, &st).into();
                        v
                    })
                    .collect::<Vec<_>>(),
                "images": stats
                    .iter()
                    .map(|(name, f)| crate::serve_repo::image_stats_json(name, &f()))
                    .collect::<Vec<_>>(),
            }),
            Err(e) => serde_json::json!({ "error": e }),
        };
        let _ = writeln!(s, "{v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_specs() {
        let f = parse_file_spec("disk=/tmp/x.img,ro,direct").unwrap();
        assert_eq!(
            (f.name.as_str(), f.path.to_str().unwrap()),
            ("disk", "/tmp/x.img")
        );
        assert!(f.opts.read_only && f.opts.direct && f.cache.is_none());
        let f = parse_file_spec("/var/a.raw,cache=/dev/fast").unwrap();
        assert_eq!(f.name, "a.raw");
        assert!(!f.opts.read_only);
        assert_eq!(f.cache.unwrap().to_str(), Some("/dev/fast"));
        assert!(parse_file_spec("/a,cache=").is_err());
        assert!(parse_file_spec("/a,bogus").is_err());
        assert!(parse_file_spec("x=").is_err());
        assert!(parse_file_spec("=/a").is_err());
    }
}
