//! Repository images as exports of `cairn serve`.

use anyhow::{bail, Context, Result};
use cairn_blockdev::BlockDev;
use cairn_nbd::Export;
use cairn_store::Repository;
use cairn_volume::{RepoView, VolumeOptions, WritableVolume};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A parsed `--image NAME[@SNAPSHOT][,rw][,cache=CACHE]`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ImageSpec {
    /// `NAME` or `NAME@SNAPSHOT`.
    pub spec: String,
    /// Writes allowed: each flush (or each writeback of the cache) is a
    /// new snapshot.
    pub writable: bool,
    /// The write-back cache in front of it.
    pub cache: Option<PathBuf>,
}

/// Parse `NAME[@SNAPSHOT][,rw][,cache=CACHE]` (`cache=` implies `rw`).
pub(crate) fn parse_image_spec(text: &str) -> Result<ImageSpec> {
    let mut parts = text.split(',');
    let spec = parts.next().unwrap_or_default().to_string();
    let (mut writable, mut cache) = (false, None);
    for p in parts {
        match p {
            "rw" => writable = true,
            "ro" => writable = false,
            c if c.starts_with("cache=") && c.len() > 6 => {
                cache = Some(PathBuf::from(&c[6..]));
                writable = true;
            }
            other => bail!("--image {text:?}: unknown option {other:?} (rw, ro, cache=PATH)"),
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
    })
}

/// How volumes cache and read ahead, from the command line.
pub(crate) fn volume_options(cache: usize, threads: Option<usize>) -> VolumeOptions {
    let mut opts = VolumeOptions {
        cache_bytes: cache,
        ..VolumeOptions::default()
    };
    if let Some(t) = threads {
        opts.threads = t;
    }
    opts
}

/// Open image `name` of `repo` for writing (the image's lock
/// is held until it is dropped).
pub(crate) fn open_writable(
    repo: &Arc<Repository>,
    name: &str,
    opts: &VolumeOptions,
) -> Result<Arc<WritableVolume>> {
    let vol = WritableVolume::open(repo.clone(), name, opts)
        .with_context(|| format!("image {name} of {}", repo.location()))?;
    Ok(Arc::new(vol))
}

/// Open `images` of the repository at `root` (every image's latest
/// snapshot, read-only, when none is named) and add them to `exports`.
/// Returns the writable ones that want a cache, with their export
/// number, for the caller to put the cache in front.
pub(crate) fn add_images(
    root: &Path,
    password: &crate::key_cmd::PasswordArgs,
    images: &[ImageSpec],
    opts: &VolumeOptions,
    pack_cache: u64,
    exports: &mut Vec<Export>,
) -> Result<Vec<(usize, PathBuf)>> {
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
            })
            .collect();
        &all
    } else {
        images
    };
    let mut cached = Vec::new();
    for s in specs {
        if s.writable {
            let vol = open_writable(&repo, &s.spec, opts)?;
            let description = format!(
                "{} (writable from snapshot {}) of {}",
                vol.name(),
                vol.snapshot(),
                root.display()
            );
            if let Some(c) = &s.cache {
                cached.push((exports.len(), c.clone()));
            }
            exports.push(Export {
                description,
                name: s.spec.clone(),
                dev: vol as Arc<dyn BlockDev>,
                read_only: false,
            });
            continue;
        }
        let vol = view
            .volume(&s.spec, opts)
            .with_context(|| format!("image {}", s.spec))?;
        exports.push(Export {
            description: format!("{}@{} of {}", vol.name(), vol.snapshot(), root.display()),
            name: s.spec.clone(),
            dev: Arc::new(vol) as Arc<dyn BlockDev>,
            read_only: true,
        });
    }
    Ok(cached)
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
        assert!(parse_image_spec("vm,bogus").is_err());
        assert!(parse_image_spec(",rw").is_err());
    }
}
