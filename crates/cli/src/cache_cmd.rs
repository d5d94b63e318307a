//! The write-back cache from the command line: attaching one to a served
//! file (`cairn serve --file NAME=PATH,cache=CACHE`) and `cairn cache
//! status | drain | detach` on a cache that no server holds.

use anyhow::{bail, Context, Result};
use cairn_blockdev::{BlockDev, FaultDev, FileDev, FileOptions, RotationalModel};
use cairn_wbcache::{FormatOptions, WbCache, WbConfig, WbStatus};
use clap::{Args, Subcommand};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub(crate) struct CacheArgs {
    #[command(subcommand)]
    pub command: CacheCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum CacheCommand {
    /// Dirty data, segments and counters of a cache (recovers its log,
    /// writes nothing back).
    Status(CacheTarget),
    /// Write everything in the cache back to the backing file.
    Drain(CacheTarget),
    /// Drain, then wipe the cache's superblock: the backing file stands
    /// alone and the cache device can be reused.
    Detach(CacheTarget),
}

#[derive(Args, Debug)]
pub(crate) struct CacheTarget {
    /// The cache device or file.
    #[arg(long = "cache", value_name = "CACHE")]
    pub cache: PathBuf,
    /// The backing file or device it caches.
    #[arg(long = "backing", value_name = "BACKING")]
    pub backing: PathBuf,
    /// Segments written back per batch (drain, detach).
    #[arg(long = "batch", default_value_t = WbConfig::default().batch)]
    pub batch: usize,
    /// Model the backing file as a 7200 rpm disk (benchmarks).
    #[arg(long = "hdd")]
    pub hdd: bool,
    /// Print JSON.
    #[arg(long = "json")]
    pub json: bool,
}

/// An exclusive lock on the cache device for as long as it is used: two
/// processes replaying and appending to one log would destroy it.
pub(crate) struct CacheLock(#[allow(dead_code)] File);

fn lock_cache(path: &Path) -> Result<CacheLock> {
    let f =
        File::open(path).with_context(|| format!("cannot open the cache {}", path.display()))?;
    // SAFETY: flock only takes the descriptor, which `f` keeps open.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        bail!(
            "the cache {} is in use by another cairn process",
            path.display()
        );
    }
    Ok(CacheLock(f))
}

/// Whether the cache device holds no superblock yet (its first block is
/// all zero: a new file or a wiped device).
fn is_blank(dev: &dyn BlockDev) -> Result<bool> {
    let mut b = vec![0u8; 4096.min(dev.size() as usize)];
    dev.read_at(&mut b, 0)
        .map_err(|e| anyhow::anyhow!("cannot read the cache: {e}"))?;
    Ok(b.iter().all(|&x| x == 0))
}

/// Open the backing file at `path` (refusing `ro`: a cache writes back).
pub(crate) fn open_backing(path: &Path, opts: FileOptions) -> Result<Arc<dyn BlockDev>> {
    if opts.read_only {
        bail!("a cache needs a writable backing file: drop `ro`");
    }
    let back = FileDev::open(path, opts)
        .with_context(|| format!("cannot open the backing file {}", path.display()))?;
    Ok(Arc::new(back))
}

/// Put the cache at `cache` in front of `backing`, formatting a blank
/// cache.
pub(crate) fn open_cached(
    backing: Arc<dyn BlockDev>,
    cache: &Path,
    cfg: WbConfig,
) -> Result<(Arc<WbCache>, CacheLock)> {
    let lock = lock_cache(cache)?;
    let dev = FileDev::open(cache, FileOptions::default())
        .with_context(|| format!("cannot open the cache {}", cache.display()))?;
    if is_blank(&dev)? {
        WbCache::format(&dev, backing.size(), &FormatOptions::default())
            .with_context(|| format!("cannot format the cache {}", cache.display()))?;
    }
    let wb = WbCache::open(Arc::new(dev), backing, cfg)
        .with_context(|| format!("cache {}", cache.display()))?;
    Ok((Arc::new(wb), lock))
}

/// A configuration that writes nothing back on its own (for `status`).
fn quiet_config() -> WbConfig {
    WbConfig {
        dirty_high: 1.0,
        idle_writeback: Duration::from_secs(365 * 24 * 3600),
        ..WbConfig::default()
    }
}

pub(crate) fn cache(a: &CacheArgs) -> Result<()> {
    let (t, drain, detach) = match &a.command {
        CacheCommand::Status(t) => (t, false, false),
        CacheCommand::Drain(t) => (t, true, false),
        CacheCommand::Detach(t) => (t, true, true),
    };
    let probe = FileDev::open(&t.cache, FileOptions::default())
        .with_context(|| format!("cannot open the cache {}", t.cache.display()))?;
    if is_blank(&probe)? {
        bail!("{} is not a cairn cache (blank)", t.cache.display());
    }
    drop(probe);
    if t.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let cfg = if drain {
        WbConfig {
            batch: t.batch,
            ..WbConfig::default()
        }
    } else {
        quiet_config()
    };
    let mut backing = open_backing(&t.backing, FileOptions::default())?;
    if t.hdd {
        backing = Arc::new(FaultDev::with_rotational(
            backing,
            RotationalModel::default(),
        ));
    }
    let started = std::time::Instant::now();
    let (wb, lock) = open_cached(backing, &t.cache, cfg)?;
    if drain {
        wb.drain().context("drain")?;
    }
    let status = wb.status();
    let Ok(wb) = Arc::try_unwrap(wb) else {
        bail!("internal error: the cache is still shared");
    };
    wb.close().context("close the cache")?;
    if detach {
        let dev = FileDev::open(&t.cache, FileOptions::default())
            .with_context(|| format!("cannot open the cache {}", t.cache.display()))?;
        dev.write_at(&[0u8; 4096], 0, true)
            .map_err(|e| anyhow::anyhow!("cannot wipe the cache superblock: {e}"))?;
    }
    drop(lock);
    let seconds = started.elapsed().as_secs_f64();
    print_status(&t.cache, &status, t.json, drain, detach, seconds);
    Ok(())
}

fn print_status(
    cache: &Path,
    s: &WbStatus,
    json: bool,
    drained: bool,
    detached: bool,
    seconds: f64,
) {
    if json {
        let v = serde_json::json!({
            "cache": cache.display().to_string(),
            "segment_count": s.segment_count,
            "clean_id": s.clean_id,
            "last_written_id": s.last_written_id,
            "dirty_blocks": s.dirty_blocks,
            "dirty_bytes": s.dirty_blocks * 4096,
            "dirty_segments": s.dirty_segments,
            "read_hits_ram": s.read_hits_ram,
            "read_hits_log": s.read_hits_log,
            "read_misses": s.read_misses,
            "written_back_blocks": s.written_back_blocks,
            "writeback_batches": s.writeback_batches,
            "drained": drained,
            "detached": detached,
            "seconds": seconds,
        });
        println!("{v}");
        return;
    }
    println!(
        "{}: {} segments, log up to segment {}, written back up to {}; {} dirty blocks ({} MiB) in {} segments{}{}",
        cache.display(),
        s.segment_count,
        s.last_written_id,
        s.clean_id,
        s.dirty_blocks,
        (s.dirty_blocks * 4096) >> 20,
        s.dirty_segments,
        if drained {
            format!("; wrote back {} blocks", s.written_back_blocks)
        } else {
            String::new()
        },
        if detached { "; detached" } else { "" }
    );
}
