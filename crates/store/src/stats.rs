//! `ls` and `stats`: what the repository holds, from the manifests and the
//! pack files (no chunk is read).

use crate::error::Result;
use crate::manifest::SnapshotStats;
use crate::repo::Repository;
use std::path::PathBuf;

/// One snapshot as `ls` shows it.
#[derive(Debug, Clone)]
pub struct SnapshotInfo {
    /// Image name.
    pub name: String,
    /// Snapshot number.
    pub snapshot: u64,
    /// When it was made (Unix seconds).
    pub created: i64,
    /// Logical size.
    pub size: u64,
    /// What was backed up.
    pub source: String,
    /// Chunker used.
    pub chunker: String,
    /// Codec used.
    pub codec: String,
    /// The backup's figures.
    pub stats: SnapshotStats,
    /// Its tags.
    pub tags: Vec<String>,
    /// Raw bytes compressed together per record (0: each chunk alone);
    /// `None` when the snapshot predates manifest version 3.
    pub group: Option<u32>,
}

/// Every snapshot of every image, by name then number. A manifest that
/// cannot be read is returned as an error string in its place; one removed
/// while listing is left out.
pub fn list(repo: &Repository) -> Result<Vec<std::result::Result<SnapshotInfo, String>>> {
    let mut out = Vec::new();
    for (name, snaps) in repo.images()? {
        for snap in snaps {
            let m = match repo.read_manifest_if_present(&name, snap) {
                Ok(None) => continue,
                Ok(Some(m)) => Ok(m),
                Err(e) => Err(e),
            };
            out.push(
                m.map(|m| SnapshotInfo {
                    name: m.name,
                    snapshot: m.snapshot,
                    created: m.created,
                    size: m.size,
                    source: m.source,
                    chunker: m.chunker,
                    codec: m.codec,
                    stats: m.stats,
                    tags: m.tags,
                    group: m.group,
                })
                .map_err(|e| format!("{name}@{snap}: {e}")),
            );
        }
    }
    Ok(out)
}

/// One target's share.
#[derive(Debug, Clone)]
pub struct TargetStats {
    /// The directory.
    pub path: PathBuf,
    /// Pack files on it.
    pub packs: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Repository totals.
#[derive(Debug, Clone, Default)]
pub struct RepoStats {
    /// Images.
    pub images: u64,
    /// Snapshots.
    pub snapshots: u64,
    /// Sum of the snapshots' sizes.
    pub logical_bytes: u64,
    /// Of which all-zero chunks (never stored).
    pub zero_bytes: u64,
    /// Distinct chunks in the index.
    pub chunks: u64,
    /// Uncompressed bytes of the distinct chunks the snapshots use (each
    /// chunk once, whichever snapshots share it).
    pub unique_raw_bytes: u64,
    /// Stored (compressed) bytes those chunks take: each record holding
    /// one counts by its share of used chunks (in chunks, not bytes: the
    /// index holds no chunk's length). The rest of the pack bytes is what
    /// gc can reclaim, headers aside (it reclaims a pack once under
    /// `--repack-below` of it is used).
    pub live_stored_bytes: u64,
    /// Index files.
    pub index_files: u64,
    /// Bytes of pack files on all targets.
    pub pack_bytes: u64,
    /// Per target.
    pub targets: Vec<TargetStats>,
    /// Pack files no index names.
    pub unindexed_packs: u64,
    /// Heap bytes of the in-memory index's entry table.
    pub index_entry_bytes: u64,
    /// Snapshots whose manifest cannot be read (not counted above).
    pub unreadable_snapshots: Vec<String>,
    /// Index files that cannot be read.
    pub damaged_index_files: Vec<String>,
}

/// Compute the totals (loads the index; reads each manifest once).
pub fn stats(repo: &Repository) -> Result<RepoStats> {
    let mut s = RepoStats::default();
    let loaded = repo.load_index()?;
    loaded.check_read()?;
    let index = &loaded.index;
    s.chunks = index.len() as u64;
    // The chunks the snapshots use, each once (one bit per index entry),
    // and the records holding them. Summing what each backup stored new
    // went wrong once the snapshot that stored a chunk was removed and
    // another still used it.
    let mut seen = vec![0u64; index.len().div_ceil(64)];
    let images = repo.images()?;
    s.images = images.len() as u64;
    for (name, snaps) in &images {
        for &snap in snaps {
            let m = match repo.read_manifest_if_present(name, snap) {
                // Removed while listing.
                Ok(None) => continue,
                Ok(Some(m)) => m,
                Err(e) => {
                    s.unreadable_snapshots.push(format!("{name}@{snap}: {e}"));
                    continue;
                }
            };
            s.snapshots += 1;
            s.logical_bytes += m.size;
            s.zero_bytes += m.stats.zero_bytes;
            for e in &m.extents {
                let crate::manifest::Extent::Data { id, len } = e else {
                    continue;
                };
                let Some(i) = index.position(id) else {
                    continue;
                };
                if seen[i / 64] >> (i % 64) & 1 == 0 {
                    seen[i / 64] |= 1 << (i % 64);
                    s.unique_raw_bytes += u64::from(*len);
                }
            }
        }
    }
    s.live_stored_bytes =
        crate::gc::live_bytes_per_pack(index, |i| seen[i / 64] >> (i % 64) & 1 == 1)
            .iter()
            .sum();
    s.damaged_index_files = loaded.damaged.iter().map(|e| e.to_string()).collect();
    s.index_entry_bytes = loaded.index.entry_bytes() as u64;
    s.index_files = repo.index_files()?.len() as u64;
    s.targets = repo
        .target_locations()
        .into_iter()
        .map(|p| TargetStats {
            path: PathBuf::from(p),
            packs: 0,
            bytes: 0,
        })
        .collect();
    for f in repo.pack_files()? {
        s.pack_bytes += f.len;
        if let Some(t) = s.targets.get_mut(usize::from(f.target)) {
            t.packs += 1;
            t.bytes += f.len;
        }
        if loaded.index.pack_number(&f.id).is_none() {
            s.unindexed_packs += 1;
        }
    }
    Ok(s)
}
