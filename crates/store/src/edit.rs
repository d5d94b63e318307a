//! `edit`: new snapshots of an image made from its latest one with some
//! ranges replaced, copy-on-write. This is how an image becomes writable
//! (`cairn serve --image NAME,rw`: each commit of its overlay is one
//! snapshot).
//!
//! ```text
//! ImageEditor::open   image lock and session (held until dropped), writer index,
//!                     the image's latest manifest
//! commit(spans, fill) fetch each span's new bytes (one span in RAM at a
//!                     time), chunk them with the image's chunker, skip
//!                     zero chunks (holes) and chunks already stored,
//!                     compress the rest in groups into packs on the
//!                     least full target (each written out once full, so
//!                     a commit holds one pack and one span in RAM, not
//!                     all it writes), fsync them, write their index
//!                     file, then the new manifest (the commit point)
//! ```
//!
//! A span replaces whole extents of the base: it starts and ends at an
//! extent boundary, or inside a hole (holes can be cut anywhere; chunks
//! cannot, because a manifest names whole chunks). The caller widens its
//! writes to the chunks they touch and supplies their full new bytes.
//! Unchanged parts of a rewritten chunk dedup against what is stored: the
//! span is cut by the same chunker, so the cuts after a small change fall
//! back on the old ones.
//!
//! Crash semantics are a backup's: before the manifest is renamed into
//! place there is no new snapshot, only a pack that the next writer
//! salvages.

use crate::backup::{append_blob, group_for_packs, stored_per_target, Blob, Group, Progress};
use crate::chunker::{Chunker, ChunkerSpec};
use crate::error::{Result, StoreError};
use crate::id::{ChunkId, PackId, PREFIX_LEN};
use crate::index::{ChunkIndex, IdHash, IndexFile, Location, PackInfo};
use crate::manifest::{Extent, ExtentList, Manifest, SnapshotStats};
use crate::pack::PackWriter;
use crate::repo::{now_secs, ImageLock, Repository, Session};
use cairn_codec::{BlockCodec, CodecSpec};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

/// A range of the image a commit replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Where it starts in the image.
    pub offset: u64,
    /// How long it is.
    pub len: u64,
    /// Zeroes (a hole); else the commit asks for its new bytes.
    pub zero: bool,
}

impl Span {
    /// Where it ends.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// What one commit stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EditReport {
    /// The new snapshot's number.
    pub snapshot: u64,
    /// Bytes of the spans.
    pub bytes: u64,
    /// Chunks stored for the first time.
    pub new_chunks: u64,
    /// Their uncompressed bytes.
    pub new_raw: u64,
    /// What they take in the pack.
    pub new_stored: u64,
    /// Bytes of span chunks the repository already had.
    pub dedup: u64,
    /// Bytes of spans that are zeros (holes).
    pub zero: u64,
}

/// The writer of new snapshots of one image.
pub struct ImageEditor {
    repo: Arc<Repository>,
    session: Session,
    _lock: ImageLock,
    index: ChunkIndex,
    base: Manifest,
    chunker: Chunker,
    codec: Box<dyn BlockCodec>,
    codec_spec: CodecSpec,
    group_size: usize,
}

impl ImageEditor {
    /// Take image `name` for writing (one writer of an image at a time;
    /// backups and other images go on) and register a session for as long
    /// as the editor lives, load the writer index and the latest snapshot
    /// of `name`. New chunks use the codec `codec`, or the one the latest
    /// snapshot was made with.
    pub fn open(
        repo: Arc<Repository>,
        name: &str,
        codec: Option<CodecSpec>,
    ) -> Result<ImageEditor> {
        let what = format!("writing image {name}");
        let lock = repo.lock_image(name, &what)?;
        let session = repo.session(&what)?;
        let index = repo.writer_index(&session)?.index;
        let latest = repo
            .snapshots(name)?
            .last()
            .copied()
            .ok_or_else(|| StoreError::Invalid(format!("image {name} has no snapshot")))?;
        let base = repo.read_manifest(name, latest)?;
        let path = repo.manifest_path(name, latest);
        let bad = |what: &str, e: String| StoreError::Corrupt {
            path: path.clone(),
            offset: 0,
            reason: format!("{what}: {e}"),
        };
        let spec: ChunkerSpec = base
            .chunker
            .parse()
            .map_err(|e: StoreError| bad("chunker", e.to_string()))?;
        let codec_spec = match codec {
            Some(c) => c,
            None => base
                .codec
                .parse()
                .map_err(|e: cairn_codec::CodecError| bad("codec", e.to_string()))?,
        };
        // The snapshot's own trade of size against random reads, kept.
        let group = base
            .group
            .map_or(crate::backup::DEFAULT_GROUP_SIZE, |g| g as usize);
        let group_size = group_for_packs(group, repo.pack_size());
        let chunker = spec.validate()?.build(&repo.gear_table());
        Ok(ImageEditor {
            repo,
            session,
            _lock: lock,
            index,
            chunker,
            codec: codec_spec.build(),
            codec_spec,
            base,
            group_size,
        })
    }

    /// The latest snapshot (the base of the next commit).
    pub fn base(&self) -> &Manifest {
        &self.base
    }

    /// The repository's chunk index, including every commit so far.
    pub fn index(&self) -> &ChunkIndex {
        &self.index
    }

    /// The repository.
    pub fn repository(&self) -> &Arc<Repository> {
        &self.repo
    }

    /// Commit `spans` (sorted, not overlapping, each starting and ending
    /// at an extent boundary of the base or inside a hole) as the next
    /// snapshot, which becomes the base; `fill` writes the new bytes of a
    /// span that is not zero into the buffer it is given (of the span's
    /// length). With no spans nothing is written.
    pub fn commit(
        &mut self,
        spans: &[Span],
        fill: &mut dyn FnMut(&Span, &mut [u8]) -> Result<()>,
        source: &str,
    ) -> Result<EditReport> {
        let started = Instant::now();
        if spans.is_empty() {
            return Ok(EditReport {
                snapshot: self.base.snapshot,
                ..EditReport::default()
            });
        }
        self.check_spans(spans)?;
        let mut report = EditReport::default();
        let mut blob = Blob::default();
        let mut totals = Progress::default();
        let mut group = Group::new(&self.repo, self.group_size);
        let mut claimed: HashSet<[u8; PREFIX_LEN], IdHash> = HashSet::default();
        let mut packs = PackOut::new(self.least_full_target());
        let pack_size = self.repo.pack_size();

        // The new chunks of each data span, in span order.
        let mut pieces: Vec<Vec<Extent>> = Vec::with_capacity(spans.len());
        let mut ends = Vec::new();
        let mut data = Vec::new();
        for span in spans {
            report.bytes += span.len;
            let mut out = Vec::new();
            if span.zero {
                out.push(Extent::Hole { len: span.len });
                report.zero += span.len;
                pieces.push(out);
                continue;
            }
            data.clear();
            data.resize(span.len as usize, 0);
            fill(span, &mut data)?;
            ends.clear();
            self.chunker.cut(&data, true, &mut ends);
            let mut prev = 0usize;
            for &end in &ends {
                let chunk = &data[prev..end as usize];
                prev = end as usize;
                let index = &self.index;
                group.add(
                    chunk,
                    self.codec.as_mut(),
                    &mut blob,
                    &mut |id| Ok(!index.contains(id) && claimed.insert(id.prefix())),
                    &mut out,
                    &mut totals,
                )?;
                if blob.bytes.len() as u64 >= pack_size {
                    self.write_records(&mut blob, &mut packs)?;
                }
            }
            pieces.push(out);
        }
        group.flush(&mut blob, self.codec.as_mut(), &mut totals)?;
        report.new_stored = totals.new_stored;
        report.new_chunks = totals.new_chunks;
        report.new_raw = totals.new_raw;
        report.dedup = totals.dedup;
        report.zero += totals.zero;

        self.write_records(&mut blob, &mut packs)?;
        let file = packs.finish()?;
        self.repo.write_index(&self.session, &file)?;
        self.index.add_file(&file)?;
        self.index.seal();

        let extents = splice(&self.base, spans, pieces)?;
        let mut manifest = Manifest {
            name: self.base.name.clone(),
            snapshot: 0,
            created: now_secs(),
            size: extents.size,
            chunker: self.chunker.spec().to_string(),
            codec: self.codec_spec.to_string(),
            source: source.to_string(),
            stats: SnapshotStats {
                chunks: extents
                    .extents
                    .iter()
                    .filter(|e| matches!(e, Extent::Data { .. }))
                    .count() as u64,
                new_chunks: report.new_chunks,
                zero_bytes: extents
                    .extents
                    .iter()
                    .filter(|e| matches!(e, Extent::Hole { .. }))
                    .map(Extent::len)
                    .sum(),
                new_raw: report.new_raw,
                new_stored: report.new_stored,
                millis: started.elapsed().as_millis() as u64,
            },
            extents: extents.extents,
            // Tags label what a backup took; writes through a served
            // image are not that backup any more.
            tags: Vec::new(),
            group: u32::try_from(self.group_size).ok(),
        };
        // After the latest, which a backup of the same image may have
        // added since the base.
        report.snapshot = self.repo.commit_manifest(&self.session, &mut manifest)?;
        self.base = manifest;
        Ok(report)
    }

    /// Spans sorted, apart, inside the image, of the length they say.
    fn check_spans(&self, spans: &[Span]) -> Result<()> {
        let mut at = 0u64;
        for s in spans {
            let bad = |why: &str| {
                StoreError::Invalid(format!(
                    "image {}: span {}..{}: {why}",
                    self.base.name,
                    s.offset,
                    s.offset.saturating_add(s.len)
                ))
            };
            if s.len == 0 {
                return Err(bad("empty"));
            }
            if s.offset < at {
                return Err(bad("overlaps the previous span or is out of order"));
            }
            if s.offset
                .checked_add(s.len)
                .is_none_or(|e| e > self.base.size)
            {
                return Err(bad(&format!("beyond the image's {} bytes", self.base.size)));
            }
            if usize::try_from(s.len).is_err() {
                return Err(bad("longer than memory can hold"));
            }
            at = s.end();
        }
        Ok(())
    }

    /// The target holding the least of the repository's packs, where a
    /// commit writes its packs.
    fn least_full_target(&self) -> u16 {
        let stored = stored_per_target(&self.index, self.repo.target_count());
        (0..stored.len()).min_by_key(|&t| stored[t]).unwrap_or(0) as u16
    }

    /// Write the records in `blob` to the commit's packs (of the
    /// repository's pack size), sealing each when full, and empty `blob`.
    fn write_records(&self, blob: &mut Blob, out: &mut PackOut) -> Result<()> {
        if blob.records.is_empty() {
            return Ok(());
        }
        let dir = self.repo.target(out.target)?;
        let (made, sealed) = (&mut out.made, &mut out.sealed);
        // One pack is open at a time, so packs are sealed in the order
        // they are made: a pack's slot is its place in `sealed`.
        let create = || {
            *made += 1;
            Ok((
                PackWriter::create(&**dir, self.repo.id(), self.repo.sealed())?,
                *made - 1,
            ))
        };
        let seal = |(w, _): (PackWriter, u32)| {
            sealed.push(w.finish()?);
            Ok(())
        };
        append_blob(
            blob,
            self.repo.pack_size(),
            &mut out.current,
            create,
            seal,
            &mut out.entries,
        )?;
        blob.records.clear();
        blob.bytes.clear();
        Ok(())
    }
}

/// The packs one commit writes: the open one, those sealed, and where
/// each new chunk went.
struct PackOut {
    target: u16,
    current: Option<(PackWriter, u32)>,
    sealed: Vec<(PackId, u64)>,
    entries: Vec<(ChunkId, Location)>,
    made: u32,
}

impl PackOut {
    fn new(target: u16) -> PackOut {
        PackOut {
            target,
            current: None,
            sealed: Vec::new(),
            entries: Vec::new(),
            made: 0,
        }
    }

    /// Seal the open pack; the index file of them all (empty if no chunk
    /// was new).
    fn finish(mut self) -> Result<IndexFile> {
        if let Some((w, _)) = self.current.take() {
            self.sealed.push(w.finish()?);
        }
        Ok(IndexFile {
            packs: self
                .sealed
                .into_iter()
                .map(|(id, len)| PackInfo {
                    id,
                    target: self.target,
                    len,
                })
                .collect(),
            entries: self.entries,
        })
    }
}

/// The base's extents with each span's range replaced by `pieces` (one
/// list per span). Fails if a span cuts a data extent.
fn splice(base: &Manifest, spans: &[Span], pieces: Vec<Vec<Extent>>) -> Result<ExtentList> {
    let mut out = ExtentList::default();
    let mut pieces = pieces.into_iter();
    let mut k = 0usize;
    let cut = |s: u64, ext: &Extent| {
        StoreError::Invalid(format!(
            "image {}: an edit cuts the chunk at {s}..{} (edits must cover whole chunks)",
            base.name,
            s + ext.len()
        ))
    };
    for (s, ext) in base.with_offsets() {
        let e = s + ext.len();
        let mut at = s;
        while at < e {
            match spans.get(k) {
                Some(sp) if sp.offset <= at => {
                    if at == sp.offset {
                        for p in pieces.next().into_iter().flatten() {
                            out.push(p);
                        }
                    }
                    if sp.end() < e && matches!(ext, Extent::Data { .. }) {
                        return Err(cut(s, ext));
                    }
                    if sp.end() <= e {
                        at = sp.end();
                        k += 1;
                    } else {
                        at = e;
                    }
                }
                next => {
                    let stop = next.map_or(e, |sp| sp.offset.min(e));
                    if at == s && stop == e {
                        out.push(*ext);
                    } else if matches!(ext, Extent::Hole { .. }) {
                        out.push(Extent::Hole { len: stop - at });
                    } else {
                        return Err(cut(s, ext));
                    }
                    at = stop;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::ChunkId;

    fn manifest(extents: Vec<Extent>) -> Manifest {
        let size = extents.iter().map(Extent::len).sum();
        Manifest {
            name: "t".into(),
            snapshot: 1,
            created: 0,
            size,
            chunker: "fixed:4096".into(),
            codec: "none".into(),
            source: String::new(),
            stats: SnapshotStats::default(),
            extents,
            tags: Vec::new(),
            group: Some(0),
        }
    }

    fn data(len: u32, b: u8) -> Extent {
        Extent::Data {
            len,
            id: ChunkId::of(&[b]),
        }
    }

    fn hole(len: u64) -> Extent {
        Extent::Hole { len }
    }

    fn span(offset: u64, len: u64) -> Span {
        Span {
            offset,
            len,
            zero: true,
        }
    }

    #[test]
    fn splice_replaces_whole_extents_and_cuts_holes() {
        let base = manifest(vec![data(10, 1), hole(100), data(10, 2), data(10, 3)]);
        // A span over the first chunk, one inside the hole, one over the
        // last two chunks.
        let spans = [span(0, 10), span(40, 20), span(110, 20)];
        let pieces = vec![vec![data(10, 9)], vec![data(20, 8)], vec![hole(20)]];
        let got = splice(&base, &spans, pieces).unwrap();
        assert_eq!(
            got.extents,
            vec![data(10, 9), hole(30), data(20, 8), hole(70)],
            "holes on either side merge with the zero span"
        );
        assert_eq!(got.size, base.size);
    }

    #[test]
    fn splice_spans_reaching_over_several_extents_and_across_holes() {
        let base = manifest(vec![hole(50), data(10, 1), hole(50)]);
        let spans = [span(45, 20)];
        let got = splice(&base, &spans, vec![vec![data(20, 7)]]).unwrap();
        assert_eq!(got.extents, vec![hole(45), data(20, 7), hole(45)]);
    }

    #[test]
    fn splice_refuses_to_cut_a_chunk() {
        let base = manifest(vec![data(10, 1), data(10, 2)]);
        for s in [span(0, 5), span(5, 10), span(12, 8)] {
            let err = splice(&base, std::slice::from_ref(&s), vec![vec![hole(s.len)]]).unwrap_err();
            assert!(err.to_string().contains("cuts the chunk"), "{s:?}: {err}");
        }
        assert!(splice(&base, &[span(0, 20)], vec![vec![hole(20)]]).is_ok());
    }
}
