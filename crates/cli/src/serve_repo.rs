//! Repository images as exports of `cairn serve`.

use anyhow::{Context, Result};
use cairn_blockdev::BlockDev;
use cairn_nbd::Export;
use cairn_store::Repository;
use cairn_volume::{RepoView, VolumeOptions};
use std::path::Path;
use std::sync::Arc;

/// Open `images` of the repository at `root` (every image's latest
/// snapshot when none is named) and add them to `exports`, read-only.
pub(crate) fn add_images(
    root: &Path,
    images: &[String],
    cache: usize,
    threads: Option<usize>,
    exports: &mut Vec<Export>,
) -> Result<()> {
    let repo = Arc::new(Repository::open(root)?);
    let view = RepoView::open(repo.clone())
        .with_context(|| format!("cannot read the repository {}", root.display()))?;
    let specs: Vec<String> = if images.is_empty() {
        repo.images()?.into_iter().map(|(name, _)| name).collect()
    } else {
        images.to_vec()
    };
    let mut opts = VolumeOptions {
        cache_bytes: cache,
        ..VolumeOptions::default()
    };
    if let Some(t) = threads {
        opts.threads = t;
    }
    for spec in specs {
        let vol = view
            .volume(&spec, &opts)
            .with_context(|| format!("image {spec}"))?;
        exports.push(Export {
            description: format!("{}@{} of {}", vol.name(), vol.snapshot(), root.display()),
            name: spec,
            dev: Arc::new(vol) as Arc<dyn BlockDev>,
            read_only: true,
        });
    }
    Ok(())
}
