//! The write-back cache from the command line: attaching one to a served
//! file (`cairn serve --file NAME=PATH,cache=CACHE`) and `cairn cache
//! status | drain | detach` on a cache that no server holds.

use anyhow::{bail, Context, Result};
use cairn_blockdev::{BlockDev, FaultDev, FileDev, FileOptions, RotationalModel};
use cairn_wbcache::{Inspection, WbCache, WbConfig, WbStatus};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug)]
pub(crate) struct CacheArgs {
    #[command(subcommand)]
    pub command: CacheCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum CacheCommand {
    /// Dirty data and segments of a cache, and any damage (reads its log,
    /// writes nothing; exits non-zero naming damage if there is any).
    Status(CacheTarget),
    /// Write everything in the cache back to the backing file.
    Drain(CacheTarget),
    /// Drain, then wipe the cache's superblock: the backing file stands
    /// alone and the cache device can be reused.
    Detach(CacheTarget),
    /// Forget which cache a file or device is bound to, once that cache
    /// holds nothing for it or is lost for good (refused while the cache
    /// is there and holds its blocks).
    Unbind(UnbindArgs),
}

#[derive(Args, Debug)]
pub(crate) struct UnbindArgs {
    /// The backing file or device.
    #[arg(long = "backing", value_name = "BACKING")]
    pub backing: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct CacheTarget {
    /// The cache device or file (with --backing or --image: a cache no
    /// server holds).
    #[arg(long = "cache", value_name = "CACHE")]
    pub cache: Option<PathBuf>,
    /// The backing file or device it caches.
    #[arg(long = "backing", value_name = "BACKING", requires = "cache")]
    pub backing: Option<PathBuf>,
    /// The repository image it caches (instead of --backing; with --repo):
    /// a drain or detach ends with a commit of the image's new snapshot.
    #[arg(
        long = "image",
        value_name = "NAME",
        requires = "cache",
        conflicts_with = "backing"
    )]
    pub image: Option<String>,
    /// The repository of --image, also from $CAIRN_REPO.
    #[arg(long = "repo", env = "CAIRN_REPO", value_name = "REPO")]
    pub repo: Option<PathBuf>,
    /// The overlay of --image, if `serve` had it elsewhere than the default
    /// place (`--image NAME,overlay=DIR`).
    #[arg(long = "overlay", value_name = "DIR", requires = "image")]
    pub overlay: Option<PathBuf>,
    #[command(flatten)]
    pub password: crate::key_cmd::PasswordArgs,
    /// Ask a running `cairn serve --control SOCK` instead (status, drain).
    #[arg(long = "control", value_name = "SOCK", conflicts_with_all = ["cache", "backing", "image"])]
    pub control: Option<PathBuf>,
    /// With --control: the export whose cache to drain.
    #[arg(long = "export", value_name = "NAME")]
    pub export: Option<String>,
    /// Segments written back per batch (drain, detach).
    #[arg(long = "batch", default_value_t = WbConfig::default().batch)]
    pub batch: usize,
    /// Model the backing file as a 7200 rpm disk (benchmarks).
    #[arg(long = "hdd")]
    pub hdd: bool,
    /// Drain or detach a cache whose log is damaged anyway, without the
    /// writes that cannot be read back.
    #[arg(long = "accept-loss")]
    pub accept_loss: bool,
    /// Print JSON.
    #[arg(long = "json")]
    pub json: bool,
}

/// What a cache in front of the file or device at `path` is in front of
/// (its device and inode, or device number: the same after a rename).
pub(crate) fn file_owner(path: &Path) -> Option<cairn_wbcache::Owner> {
    let meta = std::fs::metadata(path).ok()?;
    let key = match cairn_blockdev::FileIdentity::of(&meta)? {
        cairn_blockdev::FileIdentity::File(dev, ino) => format!("file:{dev}:{ino}"),
        cairn_blockdev::FileIdentity::Device(rdev) => device_key(rdev),
    };
    let shown = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let description = match key.split_once('@') {
        // What the device number stands for now, to tell two apart.
        Some((base, _)) => format!("the device {} ({base})", shown.display()),
        None => format!("the file {}", shown.display()),
    };
    Some(cairn_wbcache::Owner { key, description })
}

/// A block device's key: what it stands for, where the kernel says (a
/// loop device: its backing file, as that file's own key; a device-mapper
/// device: its uuid; a disk or partition: the disk's WWID or serial and
/// the partition's number), then `@device:RDEV`. The number alone, which
/// another disk may have after a reboot or `losetup -d`, only where none
/// of those is known (outside QA: a cache drained into a loop device
/// number that had been given to another file wrote that file).
fn device_key(rdev: u64) -> String {
    use std::os::unix::fs::MetadataExt;
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let stable = if let Some(file) = read(&sys.join("loop/backing_file")) {
        std::fs::metadata(&file)
            .ok()
            .map(|m| format!("file:{}:{}", m.dev(), m.ino()))
    } else if let Some(uuid) = read(&sys.join("dm/uuid")) {
        Some(format!("device:dm:{uuid}"))
    } else {
        // A partition's directory is inside its disk's.
        let part = read(&sys.join("partition"));
        let disk = if part.is_some() {
            sys.join("..")
        } else {
            sys.clone()
        };
        ["device/wwid", "wwid", "device/serial", "serial"]
            .iter()
            .find_map(|p| read(&disk.join(p)))
            .map(|id| match &part {
                Some(n) => format!("device:id:{id}:{n}"),
                None => format!("device:id:{id}"),
            })
    };
    match stable {
        Some(s) => format!("{s}@device:{rdev}"),
        None => format!("device:{rdev}"),
    }
}

/// What a cache in front of the writable image `vol` is in front of: the
/// image through its overlay (another overlay is another image).
pub(crate) fn image_owner(vol: &cairn_volume::WritableVolume) -> cairn_wbcache::Owner {
    let dir = std::fs::canonicalize(vol.overlay_dir())
        .unwrap_or_else(|_| vol.overlay_dir().to_path_buf());
    cairn_wbcache::Owner {
        key: format!("image:{}:{}", vol.name(), dir.display()),
        description: format!("image {} (overlay {})", vol.name(), dir.display()),
    }
}

/// Put the cache at `cache` in front of `backing`, locked while it is
/// open. A blank cache device is formatted when `format_blank`, refused
/// otherwise.
pub(crate) fn open_cached(
    backing: Arc<dyn BlockDev>,
    cache: &Path,
    cfg: WbConfig,
    format_blank: bool,
) -> Result<WbCache> {
    // What accepting the loss gives up is said, one line each, as
    // dm-writeboost logs it (the open drops it without a word).
    if cfg.accept_loss {
        if let Ok(i) = WbCache::inspect_path(cache, backing.size()) {
            for d in &i.damage {
                errln!("cairn: cache {}: accepting the loss: {d}", cache.display());
            }
        }
    }
    WbCache::open_path(cache, backing, cfg, format_blank)
        .with_context(|| format!("cache {}", cache.display()))
}

pub(crate) fn cache(a: &CacheArgs) -> Result<()> {
    let (t, drain, detach) = match &a.command {
        CacheCommand::Unbind(u) => {
            let path = &u.backing;
            let Some(owner) = file_owner(path) else {
                bail!("{}: not a file or block device", path.display());
            };
            let read_only = FileOptions {
                read_only: true,
                ..FileOptions::default()
            };
            let size = FileDev::open(path, read_only)
                .with_context(|| format!("cannot open {}", path.display()))?
                .size();
            outln!("cairn: {}", crate::cache_bind::release(path, &owner, size)?);
            return Ok(());
        }
        CacheCommand::Status(t) => (t, false, false),
        CacheCommand::Drain(t) => (t, true, false),
        CacheCommand::Detach(t) => (t, true, true),
    };
    if let Some(sock) = &t.control {
        if detach {
            bail!("detach works on a cache no server holds: stop the server, then use --cache and --backing");
        }
        return ask_server(sock, drain, t);
    }
    let Some(cache) = &t.cache else {
        bail!("name the cache with --cache CACHE and --backing FILE or --image NAME, or a server with --control SOCK");
    };
    if t.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let cfg = WbConfig {
        batch: t.batch,
        accept_loss: t.accept_loss,
        ..WbConfig::default()
    };
    let open_repo = || -> Result<Arc<cairn_store::Repository>> {
        let Some(repo) = &t.repo else {
            bail!("--image needs --repo (or CAIRN_REPO)");
        };
        Ok(Arc::new(cairn_store::Repository::open_location_with(
            crate::repo_cmd::location(repo)?,
            0,
            &t.password,
        )?))
    };
    let mut image = None;
    let owner;
    let mut backing: Arc<dyn BlockDev> = match (&t.backing, &t.image) {
        (Some(path), None) => {
            owner = file_owner(path);
            Arc::new(
                // Locked as a writable export locks it: not drained into
                // while a server writes it.
                FileDev::open(
                    path,
                    FileOptions {
                        lock: true,
                        ..FileOptions::default()
                    },
                )
                .with_context(|| format!("cannot open the backing file {}", path.display()))?,
            )
        }
        (None, Some(name)) if !drain => {
            // Status reads the cache only: the image's size is its latest
            // snapshot's (opening it writable, as before, made an overlay
            // for it, and with it a later serve's refusal).
            let repo = open_repo()?;
            let snaps = repo.snapshots(name)?;
            let Some(&last) = snaps.last() else {
                bail!("no image named {name:?} in {}", repo.location());
            };
            return inspect(cache, repo.read_manifest(name, last)?.size, t.json);
        }
        (None, Some(name)) => {
            let opts = crate::serve_repo::volume_options(64 << 20, 0, 0, None);
            let repo = open_repo()?;
            let vol = crate::serve_repo::open_writable(&repo, name, &opts, t.overlay.as_deref())?;
            crate::serve_repo::check_cache_binding(&repo, &vol, Some(cache), true)?;
            owner = Some(image_owner(&vol));
            image = Some(vol.clone());
            vol
        }
        _ => bail!(
            "name what the cache {} caches: --backing FILE or --image NAME",
            cache.display()
        ),
    };
    if t.hdd {
        backing = Arc::new(FaultDev::with_rotational(
            backing,
            RotationalModel::default(),
        ));
    }
    if !drain {
        return inspect(cache, backing.size(), t.json);
    }
    let started = std::time::Instant::now();
    // A file bound to another cache with dirty blocks is not drained into.
    let bound = owner.as_ref().zip(t.backing.as_deref());
    if let Some((o, path)) = bound {
        crate::cache_bind::check(path, o, backing.size(), Some(cache))?;
    }
    let bound = owner.clone();
    let wb = open_cached(backing, cache, WbConfig { owner, ..cfg }, false)?;
    let cache_id = wb.cache_id();
    let status = if detach {
        wb.detach()
            .with_context(|| format!("detach the cache {}", cache.display()))?
    } else {
        wb.drain().context("drain")?;
        let status = wb.status();
        wb.close().context("close the cache")?;
        status
    };
    if let (Some(o), Some(path)) = (&bound, &t.backing) {
        // Detached, the file stands alone; drained, the cache is still
        // in front of it (clean).
        if detach {
            crate::cache_bind::unbind(o);
        } else {
            crate::cache_bind::bind(o, path, cache, cache_id);
        }
    }
    if let Some(img) = &image {
        // Everything the cache held is in the image's overlay: it no
        // longer needs the cache; make it the image's next snapshot.
        img.unbind_cache()
            .with_context(|| format!("image {}", img.name()))?;
        img.close().with_context(|| {
            format!(
                "commit image {}: its writes stay in {} for the next serve or `cairn commit`",
                img.name(),
                img.overlay_dir().display()
            )
        })?;
    }
    let seconds = started.elapsed().as_secs_f64();
    if t.json {
        let mut v = status_json(&cache.display().to_string(), &status);
        v["drained"] = drain.into();
        v["detached"] = detach.into();
        v["seconds"] = seconds.into();
        if let Some(img) = &image {
            let st = img.stats();
            v["image"] = serde_json::json!({
                "name": img.name(),
                "snapshot": st.snapshot,
                "commits": st.commits,
                "new_raw": st.new_raw,
            });
        }
        outln!("{v}");
    } else {
        let mut line = status_line(&cache.display().to_string(), &status);
        if drain {
            line.push_str(&format!(
                "; wrote back {} blocks",
                status.written_back_blocks
            ));
        }
        if detach {
            line.push_str("; detached");
        }
        if let Some(img) = &image {
            let st = img.stats();
            line.push_str(&format!(
                "; image {} at snapshot {} ({} new)",
                img.name(),
                st.snapshot,
                st.commits
            ));
        }
        outln!("{line}");
    }
    Ok(())
}

/// `cache status` of a cache no server holds: read its log without
/// writing anything; damage is printed and makes the exit status non-zero.
fn inspect(cache: &Path, backing_size: u64, json: bool) -> Result<()> {
    let i = WbCache::inspect_path(cache, backing_size)
        .with_context(|| format!("cache {}", cache.display()))?;
    let name = cache.display().to_string();
    if json {
        outln!("{}", inspection_json(&name, &i));
    } else {
        outln!("{}", inspection_line(&name, &i));
        for n in &i.notes {
            errln!("cairn: cache {name}: note: {n}");
        }
    }
    if let Some(first) = i.damage.first() {
        for d in &i.damage[1..] {
            errln!("cairn: cache {name}: damaged {d}");
        }
        bail!(
            "cache {name}: damaged {first} (serve and drain refuse it; --accept-loss goes on \
             without the lost writes)"
        );
    }
    Ok(())
}

fn inspection_json(cache: &str, i: &Inspection) -> serde_json::Value {
    serde_json::json!({
        "cache": cache,
        "format_version": i.version,
        "segment_count": i.segment_count,
        "clean_id": i.clean_id,
        "last_written_id": i.last_id,
        "dirty_blocks": i.dirty_blocks,
        "dirty_bytes": i.dirty_blocks * 4096,
        "dirty_segments": i.dirty_segments,
        "plog_records": i.plog_records,
        "flush_marked_id": i.marked_id,
        "owner": i.owner.as_ref().map(|o| o.description.clone()),
        "stale_headers": i.stale_headers,
        "damage": i.damage.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
        "notes": i.notes,
    })
}

fn inspection_line(cache: &str, i: &Inspection) -> String {
    format!(
        "{cache}: format {}, {} segments, log up to segment {}, written back up to {}; {} dirty \
         blocks ({:.1} MiB) in {} segments and {} plog records{}; {}",
        i.version,
        i.segment_count,
        i.last_id,
        i.clean_id,
        i.dirty_blocks,
        (i.dirty_blocks * 4096) as f64 / f64::from(1 << 20),
        i.dirty_segments,
        i.plog_records,
        i.owner.as_ref().map_or(String::new(), |o| format!(
            "; in front of {}",
            o.description
        )),
        if i.damage.is_empty() {
            "no damage".to_string()
        } else {
            format!("DAMAGED ({} places)", i.damage.len())
        }
    )
}

/// A cache's status as JSON.
pub(crate) fn status_json(cache: &str, s: &WbStatus) -> serde_json::Value {
    serde_json::json!({
        "cache": cache,
        "segment_count": s.segment_count,
        "clean_id": s.clean_id,
        "last_written_id": s.last_written_id,
        "open_blocks": s.open_blocks,
        "dirty_blocks": s.dirty_blocks,
        "dirty_bytes": s.dirty_blocks * 4096,
        "dirty_segments": s.dirty_segments,
        "read_hits_ram": s.read_hits_ram,
        "read_hits_log": s.read_hits_log,
        "read_misses": s.read_misses,
        "written_back_blocks": s.written_back_blocks,
        "writeback_batches": s.writeback_batches,
        "plog_records": s.plog_records,
        "bypassed_blocks": s.bypassed_blocks,
        "flush_marks": s.flush_marks,
        "flush_marked_id": s.marked_id,
    })
}

/// A cache's status on one line.
pub(crate) fn status_line(cache: &str, s: &WbStatus) -> String {
    let reads = s.read_hits_ram + s.read_hits_log + s.read_misses;
    let hits = s.read_hits_ram + s.read_hits_log;
    format!(
        "{cache}: {} segments, log up to segment {}, written back up to {}; {} dirty blocks ({} MiB) in {} segments; read hits {} of {} blocks{}; {} blocks written back in {} batches; {} written around the cache",
        s.segment_count,
        s.last_written_id,
        s.clean_id,
        s.dirty_blocks,
        (s.dirty_blocks * 4096) >> 20,
        s.dirty_segments,
        hits,
        reads,
        if reads > 0 {
            format!(" ({:.1} %)", 100.0 * hits as f64 / reads as f64)
        } else {
            String::new()
        },
        s.written_back_blocks,
        s.writeback_batches,
        s.bypassed_blocks,
    )
}

/// One request to a running `cairn serve --control SOCK`: one request
/// line out, one JSON reply line back (an `error` in it is an error).
pub(crate) fn control_request(sock: &Path, request: &str) -> Result<serde_json::Value> {
    use std::io::{BufRead, BufReader, Write};
    // A server that goes away mid-request is an error to name, not a
    // silent death by SIGPIPE.
    crate::signals::ignore_sigpipe();
    let mut s = std::os::unix::net::UnixStream::connect(sock)
        .with_context(|| format!("cannot reach the server at {}", sock.display()))?;
    s.write_all(format!("{request}\n").as_bytes())
        .with_context(|| format!("write to {}", sock.display()))?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .with_context(|| format!("read from {}", sock.display()))?;
    // What follows goes to stdout, which may be a pipe closed early.
    crate::signals::default_sigpipe();
    let v: serde_json::Value = serde_json::from_str(&line)
        .with_context(|| format!("bad reply from {}", sock.display()))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        bail!("{e}");
    }
    Ok(v)
}

/// `status` or `drain` of a running server's caches, through its control
/// socket.
fn ask_server(sock: &Path, drain: bool, t: &CacheTarget) -> Result<()> {
    let request = if drain {
        let Some(name) = &t.export else {
            bail!("--control with drain needs --export NAME");
        };
        format!("drain {name}")
    } else {
        "status".to_string()
    };
    let v = control_request(sock, &request)?;
    if t.json {
        outln!("{v}");
        return Ok(());
    }
    for c in v["caches"]
        .as_array()
        .into_iter()
        .chain(v["images"].as_array())
        .flatten()
    {
        outln!(
            "{}: {}",
            c["export"].as_str().unwrap_or("?"),
            c["line"].as_str().unwrap_or("")
        );
    }
    Ok(())
}
