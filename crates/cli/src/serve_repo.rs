//! Repository images as exports of `cairn serve`.

use anyhow::{bail, Context, Result};
use cairn_blockdev::BlockDev;
use cairn_nbd::Export;
use cairn_store::Repository;
use cairn_volume::{RepoView, Volume, VolumeOptions, VolumeStats, WritableVolume};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A parsed `--image NAME[@SNAPSHOT][,rw][,cache=CACHE][,overlay=DIR]`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ImageSpec {
    /// `NAME` or `NAME@SNAPSHOT`.
    pub spec: String,
    /// Writes allowed: flushed into the overlay, committed as snapshots
    /// on a schedule, on request and at the end.
    pub writable: bool,
    /// The write-back cache in front of it.
    pub cache: Option<PathBuf>,
    /// Where its overlay lives (default: [`overlay_dir`]).
    pub overlay: Option<PathBuf>,
}

/// Parse `NAME[@SNAPSHOT][,rw][,cache=CACHE][,overlay=DIR]` (`cache=` and
/// `overlay=` imply `rw`).
pub(crate) fn parse_image_spec(text: &str) -> Result<ImageSpec> {
    let mut parts = text.split(',');
    let spec = parts.next().unwrap_or_default().to_string();
    let (mut writable, mut cache, mut overlay) = (false, None, None);
    for p in parts {
        match p {
            "rw" => writable = true,
            "ro" => writable = false,
            c if c.starts_with("cache=") && c.len() > 6 => {
                cache = Some(PathBuf::from(&c[6..]));
                writable = true;
            }
            o if o.starts_with("overlay=") && o.len() > 8 => {
                overlay = Some(PathBuf::from(&o[8..]));
                writable = true;
            }
            other => bail!(
                "--image {text:?}: unknown option {other:?} (rw, ro, cache=PATH, overlay=DIR)"
            ),
        }
    }
    if spec.is_empty() {
        bail!("--image {text:?}: no image name");
    }
    if writable && spec.contains('@') {
        bail!("--image {text:?}: a writable image starts from its latest snapshot; give NAME, not NAME@SNAPSHOT");
    }
    Ok(ImageSpec {
        spec,
        writable,
        cache,
        overlay,
    })
}

/// How volumes cache and read ahead, from the command line.
pub(crate) fn volume_options(
    cache: usize,
    compact: usize,
    spill: u64,
    threads: Option<usize>,
) -> VolumeOptions {
    let mut opts = VolumeOptions {
        cache_bytes: cache,
        compact_bytes: compact,
        spill_bytes: spill,
        ..VolumeOptions::default()
    };
    if let Some(t) = threads {
        opts.threads = t;
    }
    opts
}

/// Where the overlay of writable image `name` of `repo` lives unless
/// `overlay=DIR` says: `overlays/NAME` in the repository's state
/// directory ([`cairn_store::state_dir`]), on local disk and never
/// inside the repository, which may be remote or encrypted.
pub(crate) fn overlay_dir(repo: &Repository, name: &str) -> Result<PathBuf> {
    match cairn_store::state_dir(repo.id()) {
        Some(d) => Ok(d.join("overlays").join(name)),
        None => bail!(
            "image {name}: no place for its overlay: set CAIRN_STATE_DIR (or HOME), or give overlay=DIR"
        ),
    }
}

/// Open image `name` of `repo` for writing, its overlay in `overlay` or
/// the default place (the image's lock is held until it is dropped).
pub(crate) fn open_writable(
    repo: &Arc<Repository>,
    name: &str,
    opts: &VolumeOptions,
    overlay: Option<&Path>,
) -> Result<Arc<WritableVolume>> {
    let dir = match overlay {
        Some(d) => d.to_path_buf(),
        None => overlay_dir(repo, name)?,
    };
    let vol = WritableVolume::open(repo.clone(), name, opts, &dir)
        .with_context(|| format!("image {name} of {}", repo.location()))?;
    Ok(Arc::new(vol))
}

/// Refuse an image whose overlay is bound to a write-back cache other
/// than `cache` (or to any, when `cache` is None): that cache may hold
/// writes not yet in the image (a server with it in front died), which a
/// commit would leave out and a later serve with the cache would put over
/// newer writes.
///
/// A drain (`draining`) goes on past a damaged binding: the cache's own
/// owner block refuses it in front of an image it holds no writes for,
/// and once drained the binding is removed.
pub(crate) fn check_cache_binding(
    repo: &Repository,
    vol: &WritableVolume,
    cache: Option<&Path>,
    draining: bool,
) -> Result<()> {
    let b = match vol.cache_binding() {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(()),
        Err(_) if draining && cache.is_some() => return Ok(()),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("image {}", vol.name()))),
    };
    let name = vol.name();
    // The overlay option only where the overlay is not in its default place.
    let overlay = match overlay_dir(repo, name) {
        Ok(d) if d == vol.overlay_dir() => String::new(),
        _ => format!(" --overlay {}", vol.overlay_dir().display()),
    };
    let drain = format!(
        "`cairn cache drain --repo {} --image {name}{overlay} --cache {}` writes them back and \
         commits",
        repo.location(),
        b.path.display()
    );
    match cache {
        Some(c) => {
            let id = cairn_wbcache::WbCache::id_at(c)
                .with_context(|| format!("cache {}", c.display()))?;
            if id == Some(b.cache_id) {
                return Ok(());
            }
            bail!(
                "image {name}: its overlay is bound to the write-back cache {} (id {}), not to \
                 {}: that cache may hold writes not yet in the image; serve the image with it, \
                 or {drain}",
                b.path.display(),
                b.id_hex(),
                c.display()
            )
        }
        None => bail!(
            "image {name}: its overlay is bound to the write-back cache {} (id {}), which may \
             hold writes not yet in the image (its server stopped without writing them back): \
             {drain}; or serve the image with that cache",
            b.path.display(),
            b.id_hex()
        ),
    }
}

/// What [`add_images`] opened beside the exports.
#[derive(Default)]
pub(crate) struct Opened {
    /// The writable exports that want a cache: export number and cache.
    pub cached: Vec<(usize, PathBuf)>,
    /// Every writable image with its export name, to commit.
    pub writable: Vec<(String, Arc<WritableVolume>)>,
    /// Every read-only image with its export name, for its cache figures.
    pub read_only: Vec<(String, Arc<Volume>)>,
}

/// Open `images` of the repository at `root` (every image's latest
/// snapshot, read-only, when none is named) and add them to `exports`.
/// Returns the writable ones, and those that want a cache with their
/// export number, for the caller to put the cache in front.
pub(crate) fn add_images(
    root: &Path,
    password: &crate::key_cmd::PasswordArgs,
    images: &[ImageSpec],
    opts: &VolumeOptions,
    pack_cache: u64,
    exports: &mut Vec<Export>,
) -> Result<Opened> {
    let repo = Arc::new(Repository::open_location_with(
        crate::repo_cmd::location(root)?,
        pack_cache,
        password,
    )?);
    let view = RepoView::open(repo.clone())
        .with_context(|| format!("cannot read the repository {}", root.display()))?;
    let all: Vec<ImageSpec>;
    let specs = if images.is_empty() {
        all = repo
            .images()?
            .into_iter()
            .map(|(name, _)| ImageSpec {
                spec: name,
                writable: false,
                cache: None,
                overlay: None,
            })
            .collect();
        &all
    } else {
        images
    };
    let mut opened = Opened::default();
    for s in specs {
        if s.writable {
            let vol = open_writable(&repo, &s.spec, opts, s.overlay.as_deref())?;
            check_cache_binding(&repo, &vol, s.cache.as_deref(), false)?;
            opened.writable.push((s.spec.clone(), vol.clone()));
            let description = format!(
                "{} (writable from snapshot {}) of {}",
                vol.name(),
                vol.snapshot(),
                root.display()
            );
            if let Some(c) = &s.cache {
                opened.cached.push((exports.len(), c.clone()));
            }
            exports.push(Export {
                description,
                name: s.spec.clone(),
                dev: vol as Arc<dyn BlockDev>,
                read_only: false,
            });
            continue;
        }
        let vol = Arc::new(
            view.volume(&s.spec, opts)
                .with_context(|| format!("image {}", s.spec))?,
        );
        opened.read_only.push((s.spec.clone(), vol.clone()));
        exports.push(Export {
            description: format!("{}@{} of {}", vol.name(), vol.snapshot(), root.display()),
            name: s.spec.clone(),
            dev: vol as Arc<dyn BlockDev>,
            read_only: true,
        });
    }
    Ok(opened)
}

/// `cairn commit`.
#[derive(clap::Args, Debug)]
pub(crate) struct CommitArgs {
    /// Ask a running `cairn serve --control SOCK` to commit its writable
    /// images (or IMAGE) now.
    #[arg(long = "control", value_name = "SOCK", conflicts_with_all = ["repo", "overlay"])]
    pub control: Option<PathBuf>,
    /// Without a server: the repository whose IMAGE's overlay holds writes
    /// left by a server that did not stop cleanly (also from $CAIRN_REPO).
    #[arg(long = "repo", env = "CAIRN_REPO", value_name = "REPO")]
    pub repo: Option<PathBuf>,
    #[command(flatten)]
    pub password: crate::key_cmd::PasswordArgs,
    /// Without a server: the overlay, if not in the default place.
    #[arg(long = "overlay", value_name = "DIR")]
    pub overlay: Option<PathBuf>,
    /// The image (with --control: default every writable image).
    #[arg(value_name = "IMAGE")]
    pub image: Option<String>,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress bar (without a server; it shows only on a terminal).
    #[arg(short, long)]
    pub quiet: bool,
}

/// Make the writes to a writable image its next snapshot now: through a
/// running server, or from the overlay a stopped one left.
pub(crate) fn commit(a: &CommitArgs) -> Result<()> {
    let v = if let Some(sock) = &a.control {
        let request = match &a.image {
            Some(n) => format!("commit {n}"),
            None => "commit".into(),
        };
        crate::cache_cmd::control_request(sock, &request)?
    } else {
        let (Some(root), Some(name)) = (&a.repo, &a.image) else {
            bail!("name a server with --control SOCK, or an image with --repo REPO IMAGE");
        };
        let repo = Arc::new(Repository::open_location_with(
            crate::repo_cmd::location(root)?,
            0,
            &a.password,
        )?);
        let dir = match &a.overlay {
            Some(d) => d.clone(),
            None => overlay_dir(&repo, name)?,
        };
        if !dir.is_dir() {
            bail!(
                "image {name}: no overlay at {}: nothing to commit",
                dir.display()
            );
        }
        let opts = volume_options(64 << 20, 0, 0, None);
        let vol = open_writable(&repo, name, &opts, Some(&dir))?;
        check_cache_binding(&repo, &vol, None, false)?;
        let bar = crate::report::Progress::new("commit", None, !a.quiet);
        let reports = vol
            .close_with(&|done, total| {
                bar.total(total);
                bar.read_to(done);
            })
            .with_context(|| format!("commit image {name}"))?;
        bar.finish();
        serde_json::json!({ "images": [{
            "image": name,
            // The open commits what a killed server sealed; the close,
            // the rest.
            "committed": !reports.is_empty() || vol.stats().commits > 0,
            "snapshot": vol.snapshot(),
            "new_raw": vol.stats().new_raw,
        }]})
    };
    if a.json {
        outln!("{v}");
        return Ok(());
    }
    for i in v["images"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let name = i["image"].as_str().unwrap_or("?");
        if i["committed"].as_bool() == Some(true) {
            outln!(
                "image {name}: committed as snapshot {} ({} bytes of new chunks)",
                i["snapshot"],
                i["new_raw"]
            );
        } else {
            outln!("image {name}: nothing new since snapshot {}", i["snapshot"]);
        }
    }
    Ok(())
}

/// A served repository image's cache figures, for `cairn cache status
/// --control` (JSON, and the one line printed without `--json`).
pub(crate) fn image_stats_json(export: &str, st: &VolumeStats) -> serde_json::Value {
    let copy_hits = st.compact_hits + st.spill_hits;
    let reads = st.hits + st.misses + copy_hits;
    let line = format!(
        "decoded {} MiB ({} hits, {} decodes, {} ahead, {} evicted), compact {} MiB ({} hits, {} copies){}{}",
        st.cached_bytes >> 20,
        st.hits,
        st.misses,
        st.readahead,
        st.evictions,
        st.compact_bytes >> 20,
        st.compact_hits,
        st.compacted,
        if st.spill_capacity > 0 {
            format!(
                ", spilled {} of {} MiB on disk ({} hits, {} copies{})",
                st.spill_bytes >> 20,
                st.spill_capacity >> 20,
                st.spill_hits,
                st.spilled,
                match (st.spill_damaged, st.spill_failed) {
                    (0, false) => String::new(),
                    (n, false) => format!(", {n} damaged"),
                    (n, true) => format!(", {n} damaged, stopped after an I/O error"),
                }
            )
        } else {
            String::new()
        },
        if reads > 0 {
            format!(
                "; {:.1} % of reads decoded nothing",
                100.0 * (st.hits + copy_hits) as f64 / reads as f64
            )
        } else {
            String::new()
        },
    );
    serde_json::json!({
        "export": export,
        "decoded": {
            "bytes": st.cached_bytes,
            "hits": st.hits,
            "decodes": st.misses,
            "queued": st.queued,
            "readahead": st.readahead,
            "evictions": st.evictions,
        },
        "compact": {
            "bytes": st.compact_bytes,
            "hits": st.compact_hits,
            "copies": st.compacted,
        },
        "spill": {
            "capacity": st.spill_capacity,
            "bytes": st.spill_bytes,
            "memory": st.spill_memory,
            "hits": st.spill_hits,
            "copies": st.spilled,
            "damaged": st.spill_damaged,
            "skipped": st.spill_skipped,
            "failed": st.spill_failed,
        },
        "line": line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_specs() {
        let s = parse_image_spec("vm").unwrap();
        assert_eq!((s.spec.as_str(), s.writable, s.cache), ("vm", false, None));
        let s = parse_image_spec("vm@3").unwrap();
        assert!(!s.writable && s.spec == "vm@3");
        let s = parse_image_spec("vm,rw").unwrap();
        assert!(s.writable && s.cache.is_none());
        let s = parse_image_spec("vm,cache=/dev/fast").unwrap();
        assert!(s.writable);
        assert_eq!(s.cache.unwrap().to_str(), Some("/dev/fast"));
        assert!(parse_image_spec("vm@2,rw").is_err());
        assert!(parse_image_spec("vm,cache=").is_err());
        let s = parse_image_spec("vm,overlay=/var/o").unwrap();
        assert!(s.writable && s.overlay.as_deref() == Some(Path::new("/var/o")));
        assert!(parse_image_spec("vm,overlay=").is_err());
        assert!(parse_image_spec("vm,bogus").is_err());
        assert!(parse_image_spec(",rw").is_err());
    }
}
