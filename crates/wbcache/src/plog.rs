//! The persistent log's FLUSH (dm-writeboost's "type 1", see the crate
//! doc): one record per group of flushes, one leader at a time.

use super::*;

impl Inner {
    /// FLUSH in plog mode: every block put before the call becomes durable,
    /// in a plog record or a sealed segment. One caller at a time leads
    /// (writes one record for everyone's blocks and flushes the cache
    /// device once); the others wait for it and are done if it covered
    /// them.
    pub(crate) fn flush_plog(&self) -> Result<()> {
        let mut st = lock(&self.state);
        let my = st.wgen;
        loop {
            Self::failed(&st)?;
            if st.synced_gen >= my {
                return Ok(());
            }
            if st.stop {
                return Err(WbError::Closed);
            }
            if !st.flushing {
                st.flushing = true;
                st = self.lead_plog(st);
                st.flushing = false;
                self.notify_done(&st);
                continue;
            }
            st = self.wait_done(st);
        }
    }

    /// One plog group commit (the caller set `flushing`): take the open
    /// segment's pending blocks into a record (or seal the segment when
    /// the plog cannot take the record), wait for the sealed segments to
    /// be written, write the record and flush the cache device. Failures
    /// are recorded in the state.
    fn lead_plog<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        struct Rec {
            pos: u64,
            seg: u64,
            seq: u64,
            restart: bool,
            image: Vec<u8>,
        }
        let rec = loop {
            if st.error.is_some() || st.stop {
                return st;
            }
            if st.open.pending.is_empty() {
                break None;
            }
            let restart = st.plog_seg != st.open.id;
            let pos = if restart { PLOG_OFFSET } else { st.plog_pos };
            let open = &st.open;
            let ndata = open
                .pending
                .iter()
                .filter(|&&i| open.entries[i].data.is_some())
                .count() as u64;
            if pos + (1 + ndata) * B <= RING_OFFSET {
                let mut entries = Vec::with_capacity(open.pending.len());
                let mut image = Vec::with_capacity((1 + ndata as usize) * BU);
                image.resize(BU, 0);
                for &i in &open.pending {
                    let m = open.entries[i];
                    if let Some(d) = m.data {
                        image.extend_from_slice(open.block(d));
                    }
                    entries.push(Entry {
                        lba: m.lba,
                        dirty: m.dirty,
                        zero: m.data.is_none(),
                    });
                }
                let seg = open.id;
                let seq = if restart { 1 } else { st.plog_seq + 1 };
                format::finish_plog_record(&self.cache_id, seg, seq, &entries, &mut image);
                st.open.pending.clear();
                st.plog_seg = seg;
                st.plog_seq = seq;
                st.plog_pos = pos + image.len() as u64;
                break Some(Rec {
                    pos,
                    seg,
                    seq,
                    restart,
                    image,
                });
            }
            // The plog is full: the segment goes to the ring instead.
            if self.can_seal(&st) {
                let busy = st.seg_writing;
                self.seal(&mut st, busy);
                break None;
            }
            st = self.wait_space(st);
        };
        // Every block put so far is in the record, an earlier record or a
        // sealed segment; wait until the sealed ones are written, so that
        // the device flush covers them.
        let gen = st.wgen;
        let target = st.last_sealed_id;
        loop {
            if st.error.is_some() {
                return st;
            }
            if st.last_written_id >= target {
                break;
            }
            if st.stop {
                return st;
            }
            if !st.seg_writing && !st.sealed.is_empty() {
                st = self.write_front(st);
                continue;
            }
            st = self.wait_done(st);
        }
        let behind = st.durable_id < target;
        if rec.is_none() && !behind {
            st.synced_gen = st.synced_gen.max(gen);
            return st;
        }
        let written = st.last_written_id;
        drop(st);
        let r = match &rec {
            Some(rec) => self.write_plog_record(
                &rec.image,
                rec.pos,
                Place::Plog {
                    segment: rec.seg,
                    seq: rec.seq,
                },
                // The first record of a segment id overwrites the records
                // of the previous one: that segment must be durable first.
                rec.restart && behind,
            ),
            None => self
                .cache
                .flush()
                .map_err(|e| WbError::io(Place::CacheFlush, e)),
        };
        let mut st = lock(&self.state);
        match r {
            Ok(()) => {
                st.durable_id = st.durable_id.max(written);
                st.synced_gen = st.synced_gen.max(gen);
                if let Some(rec) = &rec {
                    st.counters.plog_records += 1;
                    st.plog_durable = (rec.seg, rec.seq);
                }
                self.want_mark(&mut st);
            }
            Err(e) => self.fail(&mut st, e),
        }
        st
    }

    /// Write a plog record at `pos` and flush the cache device (first too
    /// when `flush_first`).
    fn write_plog_record(
        &self,
        image: &[u8],
        pos: u64,
        place: Place,
        flush_first: bool,
    ) -> Result<()> {
        let flush = || {
            self.cache
                .flush()
                .map_err(|e| WbError::io(Place::CacheFlush, e))
        };
        if flush_first {
            flush()?;
        }
        self.cache
            .write_at(image, pos, false)
            .map_err(|e| WbError::io(place, e))?;
        flush()
    }
}
