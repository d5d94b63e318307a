//! Going around the cache, straight to the backing device: the
//! sequential cutoff (bcache's: the ends of recent writes and how long a
//! stream each continues) and backing devices as fast as the log (see
//! the crate doc).

use super::*;

/// The ends of recent writes, each with the bytes of the sequential
/// stream it continues (bcache's detection, with slack: parallel requests
/// of one stream arrive slightly out of order).
pub(crate) struct SeqStreams {
    /// (end offset, stream bytes, last use); stream bytes 0: unused.
    pub(crate) recent: [(u64, u64, u64); SEQ_STREAMS],
    pub(crate) tick: u64,
}

/// Recent writes remembered for the sequential cutoff.
pub(crate) const SEQ_STREAMS: usize = 16;

impl SeqStreams {
    pub(crate) fn new() -> SeqStreams {
        SeqStreams {
            recent: [(0, 0, 0); SEQ_STREAMS],
            tick: 0,
        }
    }

    /// Forget the streams' lengths (at a FLUSH): a stream must write the
    /// cutoff's worth of bytes between two flushes to go around the cache.
    /// A sequential writer that flushes often (a filesystem journal, a
    /// database log) waits on every flush, so it stays in the cache, where
    /// a flush is a sequential log append instead of a flush of the
    /// backing device (bcache never bypasses sync writes, for the same
    /// reason); big copies flush rarely and still go around.
    pub(crate) fn flushed(&mut self) {
        for r in &mut self.recent {
            *r = (0, 0, 0);
        }
    }

    /// Note a write; the bytes of the stream it continues, itself included.
    /// A write continues a stream when it starts within four of its own
    /// lengths of where the stream got to.
    pub(crate) fn note(&mut self, offset: u64, len: u64) -> u64 {
        self.tick += 1;
        let slack = len.saturating_mul(4);
        let end = offset.saturating_add(len);
        let hit = self.recent.iter_mut().find(|(e, seq, _)| {
            *seq > 0 && offset.saturating_add(slack) >= *e && offset <= e.saturating_add(slack)
        });
        match hit {
            Some(r) => {
                r.0 = r.0.max(end);
                r.1 = r.1.saturating_add(len);
                r.2 = self.tick;
                r.1
            }
            None => {
                let tick = self.tick;
                if let Some(r) = self.recent.iter_mut().min_by_key(|r| r.2) {
                    *r = (end, len, tick);
                }
                len
            }
        }
    }
}

impl Inner {
    /// The sequential cutoff: write `buf` at `offset` straight to the
    /// backing device if it is whole blocks, continues a sequential stream
    /// of at least [`WbConfig::seq_cutoff`] bytes and none of its blocks
    /// is in the cache (a cached block's newer version must not be
    /// overtaken by its older one written back later, and refusing is
    /// simpler than logging an invalidation), and is not FUA. Returns
    /// whether it did.
    /// A writeback batch that would write one of these blocks holds it in
    /// the index until its backing writes are flushed, so it is seen here.
    pub(crate) fn bypass(&self, buf: &[u8], offset: u64, fua: bool) -> Result<bool> {
        let len = buf.len() as u64;
        if len == 0 || fua || offset % B != 0 || len % B != 0 {
            // A FUA write is a sync write: a log append serves it better.
            return Ok(false);
        }
        let fast = self.fast_backing();
        if !fast {
            if self.cfg.seq_cutoff == 0 {
                return Ok(false);
            }
            let seq = lock(&self.streams).note(offset, len);
            if seq < self.cfg.seq_cutoff {
                return Ok(false);
            }
        }
        {
            let mut st = lock(&self.state);
            Self::failed(&st)?;
            if st.stop {
                return Err(WbError::Closed);
            }
            if (offset / B..(offset + len) / B).any(|lba| st.index.contains_key(&lba)) {
                return Ok(false);
            }
            st.counters.bypassed_blocks += len / B;
        }
        let inflight = self.bypass_inflight.fetch_add(1, Ordering::Relaxed) + 1;
        let started = Instant::now();
        let r = self.backing.write_at(buf, offset, fua);
        self.bypass_inflight.fetch_sub(1, Ordering::Relaxed);
        r.map_err(|e| WbError::io(Place::Backing { offset }, e))?;
        self.note_backing(started.elapsed() / u32::try_from(inflight).unwrap_or(u32::MAX));
        self.bypass_done.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    /// Flush the backing device if the first `seen` writes that went
    /// straight to it are not all covered by a backing flush yet.
    pub(crate) fn flush_bypassed(&self, seen: u64) -> Result<()> {
        if seen > self.bypass_flushed.load(Ordering::Acquire) {
            self.backing
                .flush()
                .map_err(|e| WbError::io(Place::BackingFlush, e))?;
            self.bypass_flushed.fetch_max(seen, Ordering::AcqRel);
        }
        Ok(())
    }
}
