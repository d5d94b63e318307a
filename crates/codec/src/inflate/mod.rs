//! Inflating one DEFLATE stream (a gzip member written by gzip or pigz) on
//! every core.
//!
//! The stream is cut into chunks of [`CHUNK`] compressed bytes. Each chunk's
//! first block is searched for once ([`marker::find_block`]), by whichever
//! worker needs it first: chunk `k`'s worker to start there, chunk
//! `k - 1`'s to know where to stop. A worker decodes its chunk from that
//! block without the window before it, writing markers for the bytes it
//! cannot know ([`marker::MarkerDecoder`]). As soon as the last 32 KiB it
//! decoded hold no marker, it knows everything the rest of the chunk can
//! refer to: libdeflate inflates the rest, up to the next chunk's first
//! block, in one call (`whole::rebase` makes those blocks a stream of
//! their own, with the 32 KiB as a stored block in front); the last chunk
//! is inflated to the stream's end. Where that cannot be done (an output
//! too big for the buffer, no buffer free in the pool, a wrong guess of the
//! next start), zlib-rs streams it instead, from the same bit and window
//! (`inflatePrime`, a dictionary), stopping at the first block of a kind
//! the search finds ([`marker::place`]: dynamic, or stored) at or after the
//! next chunk's first bit.
//!
//! The reader of the output (the splitter's thread) takes the chunks in
//! order. A chunk whose start is where the one before ended is stitched
//! on: its markers are replaced by the bytes of the 32 KiB before it, and
//! its bytes pass through. A chunk that starts elsewhere (a false guess, a
//! stretch with no block the search finds) is thrown away and its part decoded again
//! from where the output stands, with the window known. The CRC and size
//! are checked over the whole member by the caller, so neither a guess nor
//! damage can go unnoticed.
//!
//! Why hand-written: no crate decodes DEFLATE without its window, and the
//! libraries cannot be started at a guessed block. What is written here is
//! that first stage, the chunking and the re-framing; the bulk of the bytes
//! goes through libdeflate. The design is rapidgzip's (Knespel and Brunst,
//! 2023), which hands the rest of a chunk to ISA-L the same way.

pub mod index;
pub mod marker;
pub mod segmented;
pub(crate) mod whole;
pub(crate) mod zstream;

use crate::error::{CodecError, Result};
use crate::input::SharedBytes;
use crossbeam_channel::{bounded, Receiver, Sender};
use index::{Checkpoint, MemberIndex};
use marker::{Bits, BlockEnd, MarkerDecoder};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use whole::{Outcome, Whole};
use zstream::ZInflate;

const NAME: &str = "gzip";

/// Compressed bytes per chunk.
pub const CHUNK: usize = 8 << 20;

/// Bytes of output per piece handed to the writer.
const PIECE: usize = 2 << 20;

/// Marker-stage output at which a chunk gives up waiting for a clean window
/// and leaves the rest to a restart from where the output stands (which
/// also bounds its memory). Where data copies the same old bytes from block
/// to block, unknown bytes stay in the window for millions of symbols: a
/// chunk of os2.img's `gzip -6` went 32 Mi symbols without a clean window
/// and another needed 11 Mi. Paired with 32 Mi (farm-bench, 7 pairs,
/// `cairn unpack -T 2 -c F > /dev/null`): os2.img's `gzip -6` 0.438 s
/// against 0.471, a 512 MiB memory dump's 0.448 against 0.530, peak RSS
/// 351 against 462 MiB. Lower caps (4 Mi, 2 Mi) gave up on chunks that
/// would have cleared (0.42-0.46 s, 3 runs each, an earlier build).
const MARKER_CAP: usize = 8 << 20;

/// Windows at chunk boundaries kept for the workers (see
/// `Shared::windows`): a few chunks' worth, 32 KiB each.
const WINDOWS_KEPT: usize = 8;

/// Block boundaries (bits) and the output's last [`marker::WINDOW`] bytes
/// before each.
type KnownWindows = VecDeque<(usize, Arc<Vec<u8>>)>;

/// Output room a whole-chunk inflate is given, per compressed byte; a chunk
/// that decodes to more (long zero runs) is streamed instead.
const WHOLE_RATIO: usize = 16;

/// Most output room a whole-chunk inflate is given.
const WHOLE_MAX: usize = 256 << 20;

/// Most chunks a stream read with an index may be cut into.
pub const MAX_INDEXED_CHUNKS: usize = 1 << 20;

/// Bits before `stop` from which a chunk's inflate stops at every block
/// to look for the end (longer than any block zlib writes).
const NEAR: usize = (256 << 10) * 8;

/// Pieces a chunk may have decoded ahead of the reader.
const AHEAD: usize = 8;

/// Chunks after its own in which a chunk's worker looks for where its
/// output ends. In a stream with no block the search finds (only
/// fixed-code blocks: zlib's `Z_FIXED`, some other encoders), one worker
/// searched every chunk to the end of the stream, at about 40 MB/s.
const END_LOOKAHEAD: usize = 2;

/// How far into a chunk its first block is searched for: blocks zlib
/// writes are far shorter (a stored one 64 KiB at most, a compressed one
/// ends once 16-64 Ki symbols are buffered), and in a stream of fixed-code
/// blocks, which the search cannot find, it took 0.2 s per 8 MiB chunk
/// (40 MB/s). A chunk whose block is further in is decoded as part of the
/// one before it.
const SEARCH_SPAN: usize = 1 << 20;

/// Chunks in a row without a block found after which the reader stops
/// waiting for the next one's search and decodes on from where the output
/// stands (streamed up to the first block found after the next chunk's
/// start, or the end): before, it waited on every chunk's search first.
const BLOCKLESS_WAIT: usize = 2;

/// The workers a stream is inflated on and the whole-chunk buffers they
/// may hold at once: one per worker and two more (the reader's, and a
/// finished chunk's) unless a memory budget allows fewer
/// ([`Workers::within`]). A chunk that finds no buffer free is streamed
/// through small pieces instead, more slowly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workers {
    /// Worker threads (at least one).
    pub threads: usize,
    /// Whole-chunk output buffers.
    pub whole_buffers: usize,
}

impl From<usize> for Workers {
    fn from(threads: usize) -> Self {
        let threads = threads.max(1);
        Workers {
            threads,
            whole_buffers: threads + 2,
        }
    }
}

/// Bytes of one whole-chunk buffer.
const WHOLE_BYTES: u64 = (marker::WINDOW + CHUNK * WHOLE_RATIO) as u64;

/// The other buffers a crew may hold: for each worker, two marker-stage
/// outputs (the pool holds two per worker and two more), its pieces ahead
/// of the reader and its rebased copy of the compressed bytes; beside
/// them, two more marker outputs and a restart's rebased copy.
const PER_WORKER_BYTES: u64 = (2 * MARKER_CAP * 2 + AHEAD * PIECE + 2 * CHUNK) as u64;
const FIXED_BYTES: u64 = (2 * MARKER_CAP * 2 + 2 * CHUNK) as u64;

impl Workers {
    /// The most memory these workers' buffers can take (with chunks of
    /// [`CHUNK`] bytes).
    pub fn peak_bytes(&self) -> u64 {
        FIXED_BYTES
            + self.threads as u64 * PER_WORKER_BYTES
            + self.whole_buffers as u64 * WHOLE_BYTES
    }

    /// At most `threads` workers and their whole-chunk buffers, as many as
    /// fit in `budget` bytes: first fewer whole-chunk buffers (their chunks
    /// are streamed), then fewer workers. One worker means the stream is
    /// better inflated on one core, in a few MiB. No budget: no bound.
    pub fn within(threads: usize, budget: Option<u64>) -> Workers {
        let full = Workers::from(threads);
        let Some(budget) = budget else {
            return full;
        };
        let mut threads = full.threads;
        while threads > 1 && FIXED_BYTES + threads as u64 * PER_WORKER_BYTES > budget {
            threads -= 1;
        }
        let left = budget.saturating_sub(FIXED_BYTES + threads as u64 * PER_WORKER_BYTES);
        let whole_buffers = usize::try_from(left / WHOLE_BYTES)
            .unwrap_or(usize::MAX)
            .min(threads + 2);
        Workers {
            threads,
            whole_buffers,
        }
    }

    /// [`Self::within`] for a stream read from a pipe, whose segments
    /// ([`segmented::segment_bytes`]: the one read, the one being read
    /// ahead, a spare) take memory of their own beside the crew's.
    pub fn within_piped(threads: usize, budget: Option<u64>) -> Workers {
        let Some(budget) = budget else {
            return Workers::from(threads);
        };
        let mut threads = threads.max(1);
        loop {
            let segments = 3 * segmented::segment_bytes(threads, CHUNK) as u64;
            let w = Workers::within(threads, Some(budget.saturating_sub(segments)));
            if threads == 1 || (w.threads == threads && segments < budget) {
                return w;
            }
            threads -= 1;
        }
    }
}

/// Where a chunk's decoding starts.
enum Start {
    /// At this bit, with this window: chunk 0 (`chunk` set), an index's
    /// checkpoint (the same), or a restart by the reader.
    Known {
        bit: usize,
        window: Vec<u8>,
        chunk: Option<usize>,
        /// The chunk's output length, when an index says it.
        out_len: Option<usize>,
        /// For a restart: the block it ends at when that is known (the
        /// next chunk's first, found by the search) and near; the stretch
        /// is then inflated whole by libdeflate, as a chunk's rest is.
        to: Option<usize>,
    },
    /// At the first block found in chunk `k`.
    Find { k: usize },
}

/// What the workers share: the stream, and where each chunk's first block
/// is, found once by whichever worker needs it first (chunk `k`'s worker
/// for its start, chunk `k - 1`'s for its end).
struct Shared {
    data: SharedBytes,
    chunk_bits: usize,
    finds: Mutex<HashMap<usize, Arc<OnceLock<Option<usize>>>>>,
    /// With an index, its checkpoint of each chunk that has one: a chunk
    /// without one has no first block and none is searched for; one with
    /// a checkpoint has it checked as the search checks what it finds.
    indexed: Option<HashMap<usize, Checkpoint>>,
    /// Block searches run (each costs a scan of the chunk's bits).
    searches: AtomicUsize,
    /// The crew's buffers.
    pools: Arc<Pools>,
    /// A segment's cut ([`Cut`]): any chunk stops at the first block
    /// boundary at or after it, of any kind (the next segment goes on from
    /// where the output stands), so that a cut the search got wrong is
    /// passed at the next boundary, not run past into the end of the
    /// segment's data.
    cut_bit: Option<usize>,
    /// Windows known at block boundaries: the bit and the output's last
    /// [`marker::WINDOW`] bytes before it, published by a worker whose
    /// chunk ended there inflated whole, and by the reader when it starts
    /// waiting on a chunk. A worker still decoding markers from such a bit
    /// then knows what they stand for and goes on with libdeflate at its
    /// next block (see [`Worker::run`]). The last [`WINDOWS_KEPT`]; `None`
    /// when the crew shares none.
    windows: Option<Mutex<KnownWindows>>,
    /// Chunks whose markers were resolved from a published window.
    windows_used: AtomicUsize,
    /// Restarts inflated whole ([`Start::Known`]'s `to`).
    whole_restarts: AtomicUsize,
}

/// Buffers the workers and the reader hand back and forth, kept from one
/// segment of a stream to the next (see [`Crew`]).
struct Pools {
    /// Whole-chunk output buffers handed back by the reader, for reuse (no
    /// page faults on fresh memory); room for all of them.
    spare: (Sender<Vec<u8>>, Receiver<Vec<u8>>),
    /// Whole-chunk buffers that may still be made: with the reader's and
    /// each worker's, and one finished chunk waiting, memory is bounded.
    whole_left: AtomicUsize,
    /// The same for the marker decoder's output.
    spare16: (Sender<Vec<u16>>, Receiver<Vec<u16>>),
    /// Buffers for streamed pieces, handed back by the reader (the
    /// pipeline's buffers it swapped them for), so a long streamed chunk
    /// does not fault in fresh pages for every piece.
    spare_pieces: (Sender<Vec<u8>>, Receiver<Vec<u8>>),
}

/// A whole chunk's output buffer lent out in pieces: it goes back to the
/// pool (warm, no page faults for the next chunk) when the last piece is
/// dropped, by the writer, after the reader has moved on.
struct Lent {
    buf: Vec<u8>,
    home: Sender<Vec<u8>>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let _ = self.home.try_send(std::mem::take(&mut self.buf));
    }
}

/// The worker threads and their buffers: made once for a stream and, when
/// it is inflated a segment at a time, shared by each segment's
/// [`ParallelInflate`] in turn (two at once while one segment ends and the
/// next begins). A task carries its segment's shared state.
pub struct Crew {
    work: Option<Sender<(Arc<Shared>, Task)>>,
    workers: Vec<JoinHandle<()>>,
    pools: Arc<Pools>,
    threads: usize,
    chunk: usize,
    /// Whether windows known at chunk boundaries are shared with the
    /// workers (see `Shared::windows`); off only in tests of the restart.
    share_windows: bool,
}

impl Crew {
    /// Workers for chunks of `chunk` compressed bytes.
    pub fn new(workers: impl Into<Workers>, chunk: usize) -> Arc<Crew> {
        Crew::with_marker_cap(workers, chunk, MARKER_CAP, true)
    }

    /// [`Crew::new`] whose workers give up on a clean window after
    /// `marker_cap` symbols, and are told windows at chunk boundaries only
    /// if `share_windows` (tests reach the restart with small data).
    fn with_marker_cap(
        workers: impl Into<Workers>,
        chunk: usize,
        marker_cap: usize,
        share_windows: bool,
    ) -> Arc<Crew> {
        let workers = workers.into();
        let threads = workers.threads.max(1);
        let chunk = chunk.max(1);
        let pools = Arc::new(Pools {
            spare: bounded(workers.whole_buffers.max(1)),
            whole_left: AtomicUsize::new(workers.whole_buffers),
            // Each worker's decoder holds one, and each chunk queued or
            // being resolved: none handed back is dropped, so none is
            // made again (its pages faulted in afresh).
            spare16: bounded(2 * threads + 2),
            spare_pieces: bounded(threads * AHEAD),
        });
        // Room for the tasks of two segments' readers.
        let (work, rx) = bounded::<(Arc<Shared>, Task)>(threads * 4);
        let workers = (0..threads)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || {
                    let mut w = Worker::new(chunk, marker_cap);
                    for (shared, task) in rx {
                        w.run(&shared, task);
                    }
                })
            })
            .collect();
        Arc::new(Crew {
            work: Some(work),
            workers,
            pools,
            threads,
            chunk,
            share_windows,
        })
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        // Closing the channel ends each worker's loop once its task is
        // done (a task whose reader has gone ends at its next send).
        self.work = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Shared {
    /// The window before block boundary `first`, once published.
    fn window_before(&self, first: usize) -> Option<Arc<Vec<u8>>> {
        let windows = self.windows.as_ref()?;
        let windows = windows.lock().unwrap_or_else(|e| e.into_inner());
        windows
            .iter()
            .find(|(bit, _)| *bit == first)
            .map(|(_, w)| w.clone())
    }

    /// Publish `window`, the output's last [`marker::WINDOW`] bytes before
    /// block boundary `bit`.
    fn publish_window(&self, bit: usize, window: &[u8]) {
        let Some(windows) = &self.windows else {
            return;
        };
        let mut windows = windows.lock().unwrap_or_else(|e| e.into_inner());
        if windows.iter().any(|(b, _)| *b == bit) {
            return;
        }
        if windows.len() >= WINDOWS_KEPT {
            windows.pop_front();
        }
        windows.push_back((bit, Arc::new(window.to_vec())));
    }

    /// Block boundary `bit` is at or past the segment's cut.
    fn past_cut(&self, bit: usize) -> bool {
        self.cut_bit.is_some_and(|c| bit >= c)
    }

    fn bits(&self) -> usize {
        self.data.as_slice().len() * 8
    }

    /// The first block of chunk `k`.
    fn find(&self, k: usize, dec: &mut MarkerDecoder) -> Option<usize> {
        let known = match &self.indexed {
            Some(points) => Some(points.get(&k)?.bit as usize),
            None => None,
        };
        let cell = {
            let mut finds = self.finds.lock().unwrap_or_else(|e| e.into_inner());
            finds.entry(k).or_default().clone()
        };
        *cell.get_or_init(|| {
            if let Some(bit) = known {
                // A block that decodes, and three after it, exactly there.
                let found = marker::find_block(dec, self.data.as_slice(), bit, bit + 1);
                if found.is_none() {
                    tracing::debug!(bit, "the index's checkpoint is no block start: not used");
                }
                return found.map(|(s, _, _)| s);
            }
            self.searches.fetch_add(1, Ordering::Relaxed);
            let from = k * self.chunk_bits;
            let span = self.chunk_bits.min(SEARCH_SPAN * 8);
            marker::find_block(dec, self.data.as_slice(), from, from + span).map(|(s, _, _)| s)
        })
    }

    /// Where chunk `k`'s output ends: the first block found in the
    /// [`END_LOOKAHEAD`] chunks after it; `None` past them (the chunk is
    /// then streamed up to the first block it meets).
    fn end_of(&self, k: usize, dec: &mut MarkerDecoder) -> Option<usize> {
        let mut j = k + 1;
        while j * self.chunk_bits < self.bits() && j <= k + END_LOOKAHEAD {
            if let Some(s) = self.find(j, dec) {
                return Some(s);
            }
            j += 1;
        }
        None
    }

    /// A buffer of the pool for a whole chunk; `None` when all of them are
    /// in use (the chunk is then streamed: memory stays bounded, and no
    /// worker waits on the reader, which may wait on it).
    ///
    /// No huge pages are asked for (`MADV_HUGEPAGE`; an earlier build did):
    /// they cut page faults when memory is warm, but a run that starts
    /// after a few idle seconds finds the machine's free memory handed
    /// back to the host, and faulting it in 2 MiB at a time cost more
    /// system time than 4 KiB pages (os2.img's `gzip -6`, `cairn unpack -c
    /// -T 2`, 3 s apart, alternating, 5 each: 0.48-0.61 s, 0.22-0.39 s of
    /// system time with the advice, 0.42-0.45 s, 0.12-0.18 s, one outlier
    /// of 0.73 s, without).
    fn buffer(&self, capacity: usize) -> Option<Vec<u8>> {
        let mut v = match self.pools.spare.1.try_recv() {
            Ok(v) => v,
            Err(_) => {
                self.pools
                    .whole_left
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                    .ok()?;
                Vec::new()
            }
        };
        v.clear();
        if v.capacity() < capacity {
            v = Vec::with_capacity(capacity);
        }
        Some(v)
    }
}

/// A worker's reusable state.
struct Worker {
    chunk_bytes: usize,
    /// Marker-stage output at which the chunk is given up ([`MARKER_CAP`]).
    marker_cap: usize,
    dec: MarkerDecoder,
    whole: Option<Whole>,
    rebased: Vec<u8>,
}

struct Task {
    start: Start,
    /// The chunk ends at the first dynamic block starting at or after this
    /// bit, or at this bit exactly if a block starts there.
    stop: usize,
    tx: Sender<Piece>,
}

/// What a chunk sends the reader, in order: `Start`, at most one
/// `Markers`, `Bytes`, then `End`.
enum Piece {
    /// Where the chunk's first block starts; `None` when none was found.
    Start(Option<usize>),
    /// Output with markers, to resolve against the window.
    Markers(Vec<u16>),
    /// Output bytes, with their CRC.
    Bytes(Vec<u8>, crc32fast::Hasher),
    /// A whole chunk's output from `.1` on (a buffer of the shared pool),
    /// with its CRC.
    Whole(Vec<u8>, usize, crc32fast::Hasher),
    End(End),
}

enum End {
    /// The chunk's output ends at this bit, a block boundary.
    Boundary(usize),
    /// The stream's final block ends at this bit.
    Last(usize),
    /// The data is not valid DEFLATE at about this bit.
    Failed(usize, &'static str),
    /// The data ends inside the stream.
    Truncated(usize),
}

/// Where a stretch of a stream starts when the stream is inflated stretch
/// by stretch (read from a pipe, [`ParallelInflate::segment`]): the bit in
/// the stretch's first byte where a block starts, the output before it (the
/// last 32 KiB, or fewer), and the CRC-32 and size of all output so far.
#[derive(Clone, Debug, Default)]
pub struct Resume {
    /// The bit of the stretch's data where its first block starts.
    pub bit: usize,
    /// The last 32 KiB (or fewer) of output before it.
    pub window: Vec<u8>,
    /// CRC-32 of all output before it.
    pub crc: crc32fast::Hasher,
    /// Bytes of output before it.
    pub size: u64,
}

/// Bytes a segment keeps after the block it is cut at (or a chunk's
/// worth, when less), so that the block search's checks (that block and
/// the next one decode) have their data.
const CUT_MARGIN: usize = 1 << 20;

/// Where a segment ends: the first block of its chunk `chunk`, at `bit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The chunk whose first block the cut is.
    pub chunk: usize,
    /// The bit of the segment's data where that block starts.
    pub bit: usize,
}

/// A member being inflated by the workers; the reader side.
pub struct ParallelInflate {
    shared: Arc<Shared>,
    crew: Arc<Crew>,
    /// Chunks handed out, in order: their first bit and their output.
    queue: VecDeque<(usize, Receiver<Piece>)>,
    /// A chunk taken from the queue whose output starts past where the
    /// output stands (a restart fills the gap, then it is read): its first
    /// bit, its output and the bit its output starts at.
    peeked: Option<(usize, Receiver<Piece>, usize)>,
    /// Restarts from where the output stood, and chunks kept across one
    /// (read once the restart reached them).
    restarts: usize,
    kept_across: usize,
    /// Their bits and output offsets, in order of bit.
    known_bits: Vec<(usize, u64)>,
    /// The member's output length, from the index.
    member_len: Option<u64>,
    /// Checkpoints reached: chunks that started where the output stood.
    reached: Vec<Checkpoint>,
    /// Next chunk to hand out.
    next_chunk: usize,
    /// The chunk being read.
    current: Option<Receiver<Piece>>,
    /// A whole chunk's output being handed out piece by piece, and how far.
    draining: Option<(SharedBytes, usize)>,
    /// The same for a chunk's output with markers, with the window before
    /// the chunk that they stand for.
    resolving: Option<(Vec<u16>, usize, marker::Resolver)>,
    /// Bit where the output read so far ends.
    pos: usize,
    /// The last 32 KiB (or fewer) of output.
    window: Vec<u8>,
    crc: crc32fast::Hasher,
    size: u64,
    end: Option<usize>,
    depth: usize,
    /// Most bytes handed out at once.
    piece: usize,
    /// With more of the stream after `data` (a segment): the chunk whose
    /// first block ends this segment, and that block's bit. No chunk from
    /// it on is handed out; the output stops at the first block boundary
    /// at or after the bit.
    cut: Option<Cut>,
    /// Made ahead of its output: the window before `data` is not known
    /// yet ([`Self::begin`] gives it).
    waiting: bool,
}

/// Where a segment's output starts ([`ParallelInflate::segment`]).
pub enum SegmentStart {
    /// At `bit`, after the output it describes.
    Known(Resume),
    /// At this bit, with the output before it not known yet: the segment
    /// is made ahead, so the workers can begin on its chunks while the one
    /// before it ends, and its first chunk is decoded as any other, with
    /// markers. [`ParallelInflate::begin`] says what came before.
    Ahead(usize),
}

impl ParallelInflate {
    /// Inflate the raw DEFLATE stream at the start of `data` on `threads`
    /// workers.
    pub fn new(data: SharedBytes, workers: impl Into<Workers>) -> Self {
        Self::with_chunk(data, workers, CHUNK, PIECE)
    }

    /// Like [`Self::new`] with chunks of `chunk` compressed bytes, handing
    /// out output in pieces of at most `piece` bytes.
    pub fn with_chunk(
        data: SharedBytes,
        workers: impl Into<Workers>,
        chunk: usize,
        piece: usize,
    ) -> Self {
        let crew = Crew::new(workers, chunk);
        Self::start(data, crew, piece, None, Resume::default(), true, None)
    }

    /// Inflate a segment of a stream that is read stretch by stretch (from
    /// a pipe) on `crew`, which chunks it: `data` starts where `start`
    /// says. With a `cut` ([`find_cut`]: the stream goes on past `data`),
    /// no chunk from the cut's on is handed out, [`Self::next_piece`] says
    /// `false` at the first block boundary at or after the cut's bit, and
    /// [`Self::resume`] says where the next segment starts.
    pub fn segment(
        data: SharedBytes,
        crew: &Arc<Crew>,
        start: SegmentStart,
        cut: Option<Cut>,
    ) -> Self {
        let (from, known) = match start {
            SegmentStart::Known(from) => (from, true),
            SegmentStart::Ahead(bit) => (
                Resume {
                    bit,
                    ..Resume::default()
                },
                false,
            ),
        };
        Self::start(data, crew.clone(), PIECE, None, from, known, cut)
    }

    /// For a segment made [`SegmentStart::Ahead`]: the output reached it,
    /// at `from` (its bit may be past the one it was made for, should the
    /// segment before have ended past its cut).
    pub fn begin(&mut self, from: Resume) {
        self.pos = from.bit;
        self.window = from.window;
        self.window.reserve(marker::WINDOW);
        self.crc = from.crc;
        self.size = from.size;
        self.waiting = false;
    }

    /// Like [`Self::new`], starting chunks at the checkpoints of `index`
    /// (made by an earlier read of this stream, [`Self::checkpoints`]):
    /// no chunk then searches for its first block or decodes with
    /// markers. A checkpoint is used only where the data passes the
    /// checks a found block passes, and kept only if the output reaches
    /// it with the same window; any other is decoded again from where the
    /// output stands.
    /// An index whose chunks are so small that the stream would have
    /// more than [`MAX_INDEXED_CHUNKS`] (not one cairn wrote) is not used.
    pub fn with_index(data: SharedBytes, workers: impl Into<Workers>, index: MemberIndex) -> Self {
        let workers = workers.into();
        let chunk = usize::try_from(index.chunk_bits / 8).unwrap_or(0);
        if chunk == 0 || chunk > WHOLE_MAX || data.as_slice().len() / chunk > MAX_INDEXED_CHUNKS {
            tracing::debug!(chunk, "an index with chunks this small is not used");
            return Self::new(data, workers);
        }
        let crew = Crew::new(workers, chunk);
        Self::start(
            data,
            crew,
            PIECE,
            Some(index),
            Resume::default(),
            true,
            None,
        )
    }

    /// `known`: the window before `from.bit` is `from.window`; else chunk 0
    /// starts with markers at `from.bit` and [`Self::begin`] follows.
    fn start(
        data: SharedBytes,
        crew: Arc<Crew>,
        piece: usize,
        index: Option<MemberIndex>,
        from: Resume,
        known_start: bool,
        cut: Option<Cut>,
    ) -> Self {
        let threads = crew.threads;
        let chunk_bits = crew.chunk * 8;
        let mut known = HashMap::new();
        let member_len = index.as_ref().map(|i| i.out_len);
        let indexed = index.is_some();
        if let Some(index) = index {
            // Every chunk's first block is known: where the index has none
            // (see `Shared::indexed`), the earlier read found none the
            // output reached.
            let bits = data.as_slice().len() * 8;
            for p in index.points {
                let Ok(k) = usize::try_from(p.chunk) else {
                    continue;
                };
                let Ok(bit) = usize::try_from(p.bit) else {
                    continue;
                };
                if k == 0 || bit / chunk_bits != k || bit >= bits {
                    continue;
                }
                known.insert(k, p);
            }
        }
        let mut known_bits: Vec<(usize, u64)> =
            known.values().map(|p| (p.bit as usize, p.out)).collect();
        known_bits.sort_unstable();
        // The block a segment is cut at was found as its chunk's first, as
        // was the one a segment made ahead starts at.
        let ahead = (!known_start).then_some(Cut {
            chunk: 0,
            bit: from.bit,
        });
        let cut_bit = cut.map(|c| c.bit);
        let finds = cut
            .into_iter()
            .chain(ahead)
            .map(|c| (c.chunk, Arc::new(OnceLock::from(Some(c.bit)))))
            .collect();
        let shared = Arc::new(Shared {
            data,
            chunk_bits,
            finds: Mutex::new(finds),
            indexed: indexed.then_some(known),
            searches: AtomicUsize::new(0),
            pools: crew.pools.clone(),
            cut_bit,
            windows: crew.share_windows.then(|| Mutex::new(VecDeque::new())),
            windows_used: AtomicUsize::new(0),
            whole_restarts: AtomicUsize::new(0),
        });
        let mut p = ParallelInflate {
            shared,
            crew,
            queue: VecDeque::new(),
            peeked: None,
            restarts: 0,
            kept_across: 0,
            known_bits,
            member_len,
            reached: Vec::new(),
            next_chunk: 0,
            current: None,
            draining: None,
            resolving: None,
            pos: from.bit,
            window: from.window,
            crc: from.crc,
            size: from.size,
            end: None,
            depth: threads,
            piece: piece.max(1),
            cut,
            waiting: !known_start,
        };
        p.window.reserve(marker::WINDOW);
        p.fill_queue();
        p
    }

    fn bits(&self) -> usize {
        self.shared.bits()
    }

    /// The index's checkpoint of chunk `k`.
    fn checkpoint(&self, k: usize) -> Option<&Checkpoint> {
        self.shared.indexed.as_ref()?.get(&k)
    }

    /// Where a chunk that reaches the chunk bound `bound` stops: without
    /// an index, at the first dynamic block from `bound` on (see
    /// [`Task::stop`]); with one, at its first checkpoint from `bound` on,
    /// exactly, the start of a chunk to come.
    fn next_known(&self, bound: usize) -> usize {
        if let Some(c) = self.cut {
            if bound >= c.chunk * self.shared.chunk_bits {
                return c.bit;
            }
        }
        if self.known_bits.is_empty() {
            return bound;
        }
        let i = self.known_bits.partition_point(|&(b, _)| b < bound);
        self.known_bits.get(i).map_or(self.bits() + 1, |&(b, _)| b)
    }

    /// With an index: the output from the checkpoint at `bit` (`out` bytes
    /// into the member) to the next one, or to the member's end.
    fn out_len_from(&self, bit: usize, out: u64) -> Option<usize> {
        let i = self.known_bits.partition_point(|&(b, _)| b <= bit);
        let next = match self.known_bits.get(i) {
            Some(&(_, out)) => Some(out),
            None => self.member_len,
        }?;
        usize::try_from(next.checked_sub(out)?).ok()
    }

    /// Hand out chunks until `depth` are waiting.
    fn fill_queue(&mut self) {
        let Some(work) = &self.crew.work else { return };
        while self.queue.len() < self.depth {
            let from = self.next_chunk * self.shared.chunk_bits;
            if from >= self.bits() {
                return;
            }
            if self.cut.is_some_and(|c| self.next_chunk >= c.chunk) {
                return;
            }
            let (tx, rx) = bounded(AHEAD);
            let start = if self.next_chunk == 0 && !self.waiting {
                // Handed out before any output: where the stream (or a
                // segment of it) starts.
                Start::Known {
                    bit: self.pos,
                    window: self.window.clone(),
                    chunk: Some(0),
                    out_len: self.out_len_from(0, 0),
                    to: None,
                }
            } else if let Some(p) = self.checkpoint(self.next_chunk) {
                Start::Known {
                    bit: p.bit as usize,
                    window: p.window.clone(),
                    chunk: Some(self.next_chunk),
                    out_len: self.out_len_from(p.bit as usize, p.out),
                    to: None,
                }
            } else {
                Start::Find { k: self.next_chunk }
            };
            let task = Task {
                start,
                stop: self.next_known(from + self.shared.chunk_bits),
                tx,
            };
            if work.send((self.shared.clone(), task)).is_err() {
                return;
            }
            self.queue.push_back((from, rx));
            self.next_chunk += 1;
        }
    }

    /// Bytes of the data the output read so far was inflated from (to
    /// the bit where it ends, rounded down): how far a reader has come,
    /// for progress.
    pub fn input_read(&self) -> u64 {
        (self.pos / 8) as u64
    }

    /// Decode the next piece of output into `out` (empty on entry);
    /// `false` once the final block has been read.
    pub fn next_piece(&mut self, out: &mut Vec<u8>) -> Result<bool> {
        let mut lent = None;
        let more = self.next_piece_lent(out, &mut lent)?;
        if let Some(bytes) = lent {
            out.extend_from_slice(bytes.as_slice());
        }
        Ok(more)
    }

    /// [`Self::next_piece`], where a piece of a chunk inflated whole is
    /// not copied: it is lent as a share of the chunk's buffer in `lent`
    /// (`out` left empty), and the buffer goes back to the pool when the
    /// last share is dropped. The reader's copy was a twentieth of a
    /// decode's CPU.
    pub fn next_piece_lent(
        &mut self,
        out: &mut Vec<u8>,
        lent: &mut Option<SharedBytes>,
    ) -> Result<bool> {
        if self.waiting {
            return Err(CodecError::corrupt(
                NAME,
                (self.pos / 8) as u64,
                "internal: a segment read before the one before it ended",
            ));
        }
        loop {
            if let Some((b, at)) = &mut self.draining {
                let len = b.as_slice().len();
                let n = (len - *at).min(self.piece);
                let piece = b.slice(*at, n);
                *at += n;
                if *at == len {
                    self.draining = None;
                }
                let Some(piece) = piece else {
                    return Err(self.lost());
                };
                self.took(piece.as_slice());
                *lent = Some(piece);
                return Ok(true);
            }
            if let Some((m, at, resolver)) = &mut self.resolving {
                let n = (m.len() - *at).min(self.piece);
                let off = (self.pos / 8) as u64;
                resolver.resolve(&m[*at..*at + n], out, off)?;
                *at += n;
                if *at == m.len() {
                    if let Some((m, _, _)) = self.resolving.take() {
                        let _ = self.shared.pools.spare16.0.try_send(m);
                    }
                }
                self.crc.update(out);
                self.took(out);
                return Ok(true);
            }
            if self.end.is_some() || self.cut_reached() {
                return Ok(false);
            }
            let Some(rx) = &self.current else {
                self.next_chunk_in_order()?;
                continue;
            };
            let piece = rx.recv().map_err(|_| self.lost())?;
            match piece {
                Piece::Start(_) => return Err(self.lost()),
                Piece::Markers(m) => {
                    self.resolving = Some((m, 0, marker::Resolver::new(&self.window)));
                }
                Piece::Bytes(mut b, crc) => {
                    self.crc.combine(&crc);
                    std::mem::swap(out, &mut b);
                    if b.capacity() >= PIECE {
                        let _ = self.shared.pools.spare_pieces.0.try_send(b);
                    }
                    self.took(out);
                    return Ok(true);
                }
                Piece::Whole(b, skip, crc) => {
                    // Lent out in pieces, back to the pool once the last
                    // is dropped.
                    self.crc.combine(&crc);
                    let home = self.shared.pools.spare.0.clone();
                    let b = SharedBytes::from_owner(Arc::new(Lent { buf: b, home }));
                    self.draining = Some((b, skip));
                }
                Piece::End(End::Boundary(bit)) => {
                    self.pos = bit;
                    self.current = None;
                }
                Piece::End(End::Last(bit)) => {
                    self.pos = bit;
                    self.current = None;
                    self.end = Some(bit);
                }
                Piece::End(End::Failed(bit, reason)) => {
                    return Err(CodecError::corrupt(NAME, (bit / 8) as u64, reason));
                }
                Piece::End(End::Truncated(bit)) => {
                    return Err(CodecError::Truncated {
                        format: NAME,
                        offset: (bit / 8) as u64,
                    });
                }
            }
        }
    }

    /// Account for output handed out: size and window.
    fn took(&mut self, out: &[u8]) {
        self.size += out.len() as u64;
        if out.len() >= marker::WINDOW {
            self.window.clear();
            self.window
                .extend_from_slice(&out[out.len() - marker::WINDOW..]);
        } else {
            let keep = (marker::WINDOW - out.len()).min(self.window.len());
            self.window.drain(..self.window.len() - keep);
            self.window.extend_from_slice(out);
        }
    }

    /// Make the chunk that continues at `pos` current: the next handed-out
    /// chunk if it starts there, else a restart from `pos` on a thread of
    /// its own (the pool keeps working ahead).
    fn next_chunk_in_order(&mut self) -> Result<()> {
        self.fill_queue();
        let mut blockless = 0;
        loop {
            let (from, rx, start) = match self.peeked.take() {
                Some((from, rx, s)) => {
                    self.kept_across += usize::from(s == self.pos);
                    (from, rx, Some(s))
                }
                None => {
                    let Some((from, rx)) = self.queue.pop_front() else {
                        break;
                    };
                    let start = match rx.recv() {
                        Ok(Piece::Start(s)) => s,
                        _ => return Err(self.lost()),
                    };
                    self.fill_queue();
                    (from, rx, start)
                }
            };
            let k = from / self.shared.chunk_bits;
            match start {
                Some(s) if s == self.pos => {
                    if let Some(p) = self.checkpoint(k) {
                        if p.window != self.window || p.out != self.size {
                            tracing::debug!(
                                bit = s,
                                "the index's window does not match the output: decoding again"
                            );
                            break;
                        }
                    }
                    if k > 0 {
                        self.reached.push(Checkpoint {
                            chunk: k as u64,
                            bit: s as u64,
                            out: self.size,
                            window: self.window.clone(),
                        });
                    }
                    // Its worker may still be waiting for a clean window:
                    // this one is known now.
                    self.shared.publish_window(s, &self.window);
                    self.current = Some(rx);
                    return Ok(());
                }
                // Kept: a restart decodes up to it, then it is read.
                Some(s) if s > self.pos => {
                    self.peeked = Some((from, rx, s));
                    break;
                }
                // Found nothing, or a block the output has passed.
                None => {
                    blockless += 1;
                    if blockless >= BLOCKLESS_WAIT {
                        tracing::debug!(
                            pos = self.pos,
                            chunks = blockless,
                            "no block found in chunks in a row: decoding on from the output"
                        );
                        break;
                    }
                }
                Some(_) => blockless = 0,
            }
        }
        // Decode from `pos`, with the window known, up to where the next
        // handed-out chunk begins its search.
        tracing::trace!(pos = self.pos, "restarting from where the output stands");
        self.restarts += 1;
        let stop = match (&self.peeked, self.queue.front(), self.cut) {
            (Some((_, _, s)), _, _) => *s,
            (None, Some((from, _)), _) => self.next_known(*from),
            (None, None, Some(c)) => c.bit,
            (None, None, None) => self.bits() + 1,
        };
        // Where the output stands is a block boundary with its window: a
        // checkpoint for its chunk if that has none.
        let k = self.pos / self.shared.chunk_bits;
        if k > 0 && self.reached.last().is_none_or(|p| (p.chunk as usize) < k) {
            self.reached.push(Checkpoint {
                chunk: k as u64,
                bit: self.pos as u64,
                out: self.size,
                window: self.window.clone(),
            });
        }
        // Inflated whole up to the next chunk's first block: where markers
        // never clear (log lines, each copying from the ones before), every
        // chunk's rest is a restart, and libdeflate took a log's `gzip -6`
        // (`bench/datasets/make-log`, 527 MB) in 0.39-0.47 s against
        // 0.56-0.58 s streamed by zlib-rs (2 threads, 3 runs each, 3 s
        // apart, alternating). A restart to the stream's
        // end is still streamed: os2.img's last one, 115 MB of mostly
        // zeros into fresh memory whole, gave 0.51-0.59 s against
        // 0.49-0.57 s.
        let to = self
            .peeked
            .as_ref()
            .map(|(_, _, s)| *s)
            .filter(|&s| s > self.pos && s - self.pos <= 2 * self.shared.chunk_bits);
        let (tx, rx) = bounded(AHEAD);
        let task = Task {
            start: Start::Known {
                bit: self.pos,
                window: self.window.clone(),
                chunk: None,
                out_len: None,
                to,
            },
            stop: stop.max(self.pos + 1),
            tx,
        };
        let shared = self.shared.clone();
        std::thread::spawn(move || {
            Worker::new(shared.chunk_bits / 8, MARKER_CAP).run(&shared, task)
        });
        match rx.recv() {
            Ok(Piece::Start(Some(_))) => {}
            _ => return Err(self.lost()),
        }
        self.current = Some(rx);
        Ok(())
    }

    fn lost(&self) -> CodecError {
        CodecError::corrupt(
            NAME,
            (self.pos / 8) as u64,
            "internal: a parallel inflate worker stopped",
        )
    }

    /// Whether a segment has handed out every chunk before its cut to the
    /// workers (the next segment can be made ahead from then on).
    pub fn handed_out_all(&self) -> bool {
        self.cut.is_some_and(|c| self.next_chunk >= c.chunk)
    }

    /// Whether a segment's output has reached its cut.
    fn cut_reached(&self) -> bool {
        self.end.is_none() && self.current.is_none() && self.cut.is_some_and(|c| self.pos >= c.bit)
    }

    /// Once [`Self::next_piece`] said `false` at a segment's cut (not at
    /// the stream's end): where the next segment starts, as a bit of this
    /// one's data, with the output so far.
    pub fn resume(&self) -> Option<Resume> {
        self.cut_reached().then(|| Resume {
            bit: self.pos,
            window: self.window.clone(),
            crc: self.crc.clone(),
            size: self.size,
        })
    }

    /// The checkpoints the output reached so far: an index for a later
    /// read of this stream ([`Self::with_index`]).
    pub fn checkpoints(&self) -> MemberIndex {
        MemberIndex {
            chunk_bits: self.shared.chunk_bits as u64,
            out_len: self.size,
            points: self.reached.clone(),
        }
    }

    /// Once [`Self::next_piece`] said `false`: the bytes the DEFLATE
    /// stream took (through its last byte), the CRC-32 and the size of the
    /// output.
    pub fn finish(&self) -> (usize, u32, u64) {
        let end = self.end.unwrap_or(self.pos);
        (end.div_ceil(8), self.crc.clone().finalize(), self.size)
    }
}

impl Drop for ParallelInflate {
    fn drop(&mut self) {
        // Closing the chunks' channels makes every worker's next send for
        // them fail; the crew ends with its last reader.
        self.draining = None;
        self.resolving = None;
        self.queue.clear();
        self.peeked = None;
        self.current = None;
    }
}

impl Worker {
    fn new(chunk_bytes: usize, marker_cap: usize) -> Self {
        Worker {
            chunk_bytes,
            marker_cap,
            dec: MarkerDecoder::default(),
            whole: Whole::new(),
            rebased: Vec::new(),
        }
    }

    /// Decode one chunk, sending its pieces; returns early when the reader
    /// has gone (a send fails).
    fn run(&mut self, shared: &Shared, task: Task) {
        let Task { start, stop, tx } = task;
        let data = shared.data.as_slice();
        let (first, k) = match start {
            Start::Known {
                bit,
                window,
                chunk,
                out_len,
                to,
            } => {
                // A checkpoint of an index is used only where it passes
                // the checks a found block passes.
                if let Some(k) = chunk.filter(|&k| k > 0) {
                    if shared.find(k, &mut self.dec) != Some(bit) {
                        let _ = tx.send(Piece::Start(None));
                        return;
                    }
                }
                if tx.send(Piece::Start(Some(bit))).is_ok() {
                    if to.is_some() && self.send_whole(shared, bit, to, &window, None, &tx) {
                        shared.whole_restarts.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    let chunk = chunk.map(|k| (k, out_len));
                    self.finish(shared, chunk, bit, &window, stop, &tx);
                }
                return;
            }
            Start::Find { k } => match shared.find(k, &mut self.dec) {
                Some(first) => (first, k),
                None => {
                    let _ = tx.send(Piece::Start(None));
                    return;
                }
            },
        };
        if tx.send(Piece::Start(Some(first))).is_err() {
            return;
        }
        let dec = &mut self.dec;
        dec.clear();
        // Most chunks' first stage fits; growing past it copies. Capacity
        // only: a decoder that zeroed the whole room faulted in 8 MiB of
        // fresh pages per chunk, most of them never written.
        dec.reserve_capacity(4 << 20);
        let mut pos = first;
        let mut last = false;
        let end = loop {
            if last {
                break End::Last(pos);
            }
            if pos > first {
                let (here, found_kind) = marker::place(data, pos);
                if (here >= stop && found_kind) || shared.past_cut(here) {
                    break End::Boundary(here);
                }
            }
            // The window is clean, or the one before the chunk has been
            // published (by the chunk before, or the reader) and its
            // markers resolve now: a chunk whose unknown bytes are copied
            // on for millions of symbols stops decoding them as soon as
            // the output before it is known.
            let resolved = match dec.window_known() {
                true => Some(dec.window()),
                false if pos > first => {
                    let w = shared
                        .window_before(first)
                        .and_then(|before| resolved_window(dec.output(), &before));
                    if w.is_some() {
                        shared.windows_used.fetch_add(1, Ordering::Relaxed);
                    }
                    w
                }
                false => None,
            };
            if let Some(window) = resolved {
                tracing::trace!(first, pos, symbols = dec.output().len(), "window known");
                let spare = shared.pools.spare16.1.try_recv().unwrap_or_default();
                if tx.send(Piece::Markers(dec.take_out(spare))).is_ok() {
                    self.finish(shared, Some((k, None)), pos, &window, stop, &tx);
                }
                return;
            }
            if dec.output().len() >= self.marker_cap {
                tracing::trace!(first, pos, "markers did not clear; leaving the rest");
                break End::Boundary(pos);
            }
            let mark = dec.output().len();
            let mut bits = Bits::new(data, pos);
            match dec.block(&mut bits) {
                Ok(e) => {
                    pos = bits.pos();
                    last = e == BlockEnd::Last;
                }
                Err(e) => {
                    dec.truncate(mark);
                    break match e {
                        marker::Stop::OutOfData => End::Truncated(pos),
                        marker::Stop::Invalid(r) => End::Failed(pos, r),
                    };
                }
            }
        };
        let spare = shared.pools.spare16.1.try_recv().unwrap_or_default();
        if tx.send(Piece::Markers(dec.take_out(spare))).is_ok() {
            let _ = tx.send(Piece::End(end));
        }
    }

    /// The rest of a chunk from `bit`, with the window known: whole by
    /// libdeflate when the chunk's end is known (the next chunk's first
    /// block), else (or when that fails) streamed by zlib-rs. `chunk`: the
    /// chunk's number and, from an index, its output length (`None` for a
    /// restart, which is streamed here: the reader takes its pieces as
    /// they come. A restart that knows the block it ends at, near, was
    /// inflated whole before this, in [`Worker::run`]; one to the
    /// stream's end, inflated whole, kept the reader waiting for all of
    /// it).
    fn finish(
        &mut self,
        shared: &Shared,
        chunk: Option<(usize, Option<usize>)>,
        bit: usize,
        window: &[u8],
        stop: usize,
        tx: &Sender<Piece>,
    ) {
        if let Some((k, out_len)) = chunk {
            // Up to the next chunk's first block; when no chunk after this
            // one has a block, to the stream's end.
            let end = shared.end_of(k, &mut self.dec);
            // With no end found, only a last chunk is inflated whole (the
            // stream ends in it, or the attempt fails at the data's end);
            // before, a chunk in a stream without blocks the search finds
            // was inflated whole over two chunks' bytes, and failed.
            let last = (k + 1) * shared.chunk_bits >= shared.bits();
            if end.map_or(last, |e| e > bit)
                && self.send_whole(shared, bit, end, window, out_len, tx)
            {
                return;
            }
        }
        inflate_known(shared, bit, window, stop, tx);
    }

    /// Inflate the whole blocks `bit..end` with libdeflate and send the
    /// output; `false` (nothing sent) when the output does not fit a
    /// generous guess, or the bits are not whole blocks (a wrong guess of
    /// the next chunk's start, or damage: the streaming path then says
    /// which).
    fn send_whole(
        &mut self,
        shared: &Shared,
        bit: usize,
        end: Option<usize>,
        window: &[u8],
        out_len: Option<usize>,
        tx: &Sender<Piece>,
    ) -> bool {
        let Some(whole) = self.whole.as_mut() else {
            return false;
        };
        let data = shared.data.as_slice();
        // A stream that ends in the last chunk: at most two chunks' bytes.
        let data = match end {
            Some(_) => data,
            None => &data[..data.len().min(bit / 8 + 2 * self.chunk_bytes)],
        };
        let base = whole::rebase(data, bit, end, window, &mut self.rebased);
        // One size for every chunk, so buffers are reused whole, unless an
        // index says the chunk needs more.
        let guess = out_len
            .unwrap_or(0)
            .max(self.chunk_bytes.saturating_mul(WHOLE_RATIO))
            .min(WHOLE_MAX);
        // Room for a whole window whether or not this chunk has one (the
        // first has none): buffers of one size are reused by any chunk,
        // where a buffer a byte too small was dropped and a fresh one's
        // pages faulted in again.
        let Some(mut out) = shared.buffer(marker::WINDOW + guess) else {
            return false;
        };
        let outcome = whole.inflate(&self.rebased, &mut out);
        let done = match (outcome, end) {
            (Outcome::Done { used }, Some(e)) if used == self.rebased.len() => {
                Some(End::Boundary(e))
            }
            (Outcome::Done { used }, None) if used >= base => {
                Some(End::Last((bit / 8 + used - base) * 8))
            }
            _ => None,
        };
        match done {
            Some(end) if out.len() >= window.len() => {
                // The next chunk may still be decoding markers from here.
                if let (End::Boundary(e), true) = (&end, out.len() >= marker::WINDOW) {
                    shared.publish_window(*e, &out[out.len() - marker::WINDOW..]);
                }
                let mut crc = crc32fast::Hasher::new();
                crc.update(&out[window.len()..]);
                if tx.send(Piece::Whole(out, window.len(), crc)).is_ok() {
                    let _ = tx.send(Piece::End(end));
                }
                true
            }
            _ => {
                tracing::trace!(?outcome, bit, ?end, "whole inflate failed; streaming");
                let _ = shared.pools.spare.0.try_send(out);
                false
            }
        }
    }
}

/// The last [`marker::WINDOW`] bytes of `before` followed by marker
/// output `out`, resolved against `before`; `None` where a marker reaches
/// before the stream's start (damage, which the reader reports).
fn resolved_window(out: &[u16], before: &[u8]) -> Option<Vec<u8>> {
    let tail = &out[out.len().saturating_sub(marker::WINDOW)..];
    let mut window = Vec::with_capacity(marker::WINDOW);
    let keep = (marker::WINDOW - tail.len()).min(before.len());
    window.extend_from_slice(&before[before.len() - keep..]);
    marker::resolve(tail, before, &mut window, 0).ok()?;
    Some(window)
}

/// Where to cut a segment of a stream read stretch by stretch, when more
/// of the stream follows `data`: the first block of the last chunk (of
/// `chunk` bytes, counted from the start of `data`) that has one starting
/// a margin (1 MiB, or a chunk when that is less) before the end
/// of `data`; `None` when no chunk after the first has one (the caller
/// reads more, or inflates on one core). `first`: the bit where the
/// segment's output starts.
pub fn find_cut(data: &[u8], chunk: usize, first: usize) -> Option<Cut> {
    let chunk = chunk.max(1);
    let chunk_bits = chunk * 8;
    let to = data.len().checked_sub(CUT_MARGIN.min(chunk))? * 8;
    let mut dec = MarkerDecoder::default();
    let mut k = to / chunk_bits;
    while k > 0 {
        let from = k * chunk_bits;
        if from > first {
            let end = to.min(from + chunk_bits);
            if let Some((bit, _, _)) = marker::find_block(&mut dec, data, from, end) {
                return Some(Cut { chunk: k, bit });
            }
        }
        k -= 1;
    }
    None
}

/// Inflate from bit `bit` with `window` before it, with zlib-rs, sending
/// pieces of bytes, until the first dynamic block at or after `stop`, or
/// the final block's end.
fn inflate_known(shared: &Shared, bit: usize, window: &[u8], stop: usize, tx: &Sender<Piece>) {
    let end = match inflate_known_inner(shared, bit, window, stop, tx) {
        Ok(Some(end)) => end,
        Ok(None) => return,
        Err(e) => e,
    };
    let _ = tx.send(Piece::End(end));
}

fn inflate_known_inner(
    shared: &Shared,
    bit: usize,
    window: &[u8],
    stop: usize,
    tx: &Sender<Piece>,
) -> std::result::Result<Option<End>, End> {
    let data = shared.data.as_slice();
    let fresh = || match shared.pools.spare_pieces.1.try_recv() {
        Ok(mut v) => {
            v.clear();
            v.reserve(PIECE);
            v
        }
        Err(_) => Vec::with_capacity(PIECE),
    };
    if bit / 8 >= data.len() {
        return Err(End::Truncated(bit));
    }
    let (mut z, mut at) =
        ZInflate::starting_at(data, bit, window).map_err(|reason| End::Failed(bit, reason))?;
    let mut piece: Vec<u8> = fresh();
    let mut crc = crc32fast::Hasher::new();
    let mut crc_done = 0;
    let send = |piece: &mut Vec<u8>, crc: &mut crc32fast::Hasher, crc_done: &mut usize| {
        crc.update(&piece[*crc_done..]);
        *crc_done = 0;
        let full = std::mem::replace(piece, fresh());
        let c = std::mem::replace(crc, crc32fast::Hasher::new());
        tx.send(Piece::Bytes(full, c)).is_ok()
    };
    let end = loop {
        if piece.len() >= PIECE {
            if !send(&mut piece, &mut crc, &mut crc_done) {
                return Ok(None);
            }
        } else if piece.capacity() - piece.len() < 64 << 10 {
            // A long block: hash what is there, then grow.
            crc.update(&piece[crc_done..]);
            crc_done = piece.len();
            piece.reserve(PIECE);
        }
        // Far from `stop`, inflate without stopping at each block (zlib
        // then updates its window once per call, not once per block).
        let near = (stop.saturating_sub(NEAR) / 8).min(data.len());
        let (input, block) = if at < near {
            (&data[at..near], false)
        } else {
            (&data[at.min(data.len())..], true)
        };
        let step = match z.inflate(input, &mut piece, block) {
            Ok(step) => step,
            Err(reason) => break End::Failed(at * 8, reason),
        };
        at += step.consumed;
        let here = at * 8 - step.unused_bits as usize;
        if step.end {
            if !piece.is_empty() && !send(&mut piece, &mut crc, &mut crc_done) {
                return Ok(None);
            }
            return Ok(Some(End::Last(here)));
        }
        // A known boundary (an index's checkpoint) is stopped at exactly.
        if block && step.at_block_end {
            let (place, found_kind) = marker::place(data, here);
            if (place >= stop && (place == stop || found_kind)) || shared.past_cut(place) {
                if !piece.is_empty() && !send(&mut piece, &mut crc, &mut crc_done) {
                    return Ok(None);
                }
                return Ok(Some(End::Boundary(place)));
            }
        }
        if block && step.consumed == 0 && step.produced == 0 && at >= data.len() {
            break End::Truncated(at * 8);
        }
    };
    // What was inflated before the damage or the cut goes out first, as
    // gzip writes it (the window is known: these are the stream's bytes).
    if !piece.is_empty() && !send(&mut piece, &mut crc, &mut crc_done) {
        return Ok(None);
    }
    Err(end)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

    use super::*;
    use crate::testutil::image_like;
    use proptest::prelude::*;
    use std::io::{Read, Write};

    fn deflate(data: &[u8], level: u32) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(level));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// Every block boundary of a stream as (bit, output offset), by zlib.
    fn boundaries(stream: &[u8]) -> Vec<(usize, usize)> {
        let mut z = ZInflate::new().unwrap();
        let mut out = Vec::with_capacity(1 << 20);
        let mut at = 0;
        let mut total = 0;
        let mut v = Vec::new();
        loop {
            out.clear();
            let step = z.inflate(&stream[at..], &mut out, true).unwrap();
            at += step.consumed;
            total += step.produced;
            if step.end {
                return v;
            }
            if step.at_block_end {
                v.push((at * 8 - step.unused_bits as usize, total));
            }
        }
    }

    /// How far the output has come in the input (a progress bar's
    /// measure): it grows chunk by chunk while pieces are read, never
    /// past the stream, and ends at its end. (A gzip member inflated in
    /// parallel was shown at its header's offset until it ended.)
    #[test]
    fn input_read_grows_with_the_output() {
        let data = crate::testutil::image_like(3 << 20, 4);
        let stream = deflate(&data, 6);
        let mut p =
            ParallelInflate::with_chunk(SharedBytes::from_vec(stream.clone()), 2, 100_000, 65536);
        let (mut piece, mut seen) = (Vec::new(), Vec::new());
        while p.next_piece(&mut piece).unwrap() {
            piece.clear();
            seen.push(p.input_read());
        }
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
        let distinct = seen.iter().collect::<std::collections::BTreeSet<_>>().len();
        assert!(distinct > 3, "{distinct} steps: {seen:?}");
        assert!(p.input_read() <= stream.len() as u64);
        assert!(
            p.input_read() + 1 >= stream.len() as u64,
            "{}",
            p.input_read()
        );
    }

    /// Random bytes are stored blocks, one after another: each chunk starts
    /// at one (a byte boundary, where the one before ended) and none is
    /// decoded again. Before, the search knew only dynamic blocks, found
    /// none, and one worker searched the whole stream (600 MB of such a
    /// `gzip -6` took 17 s).
    #[test]
    fn incompressible_data_is_cut_at_its_stored_blocks() {
        let data = crate::testutil::noise(3 << 20, 9);
        let stream = deflate(&data, 6);
        let mut dec = MarkerDecoder::default();
        let (bit, _, _) = marker::find_block(&mut dec, &stream, 8 << 20, usize::MAX).unwrap();
        assert!(marker::stored_at(&stream, bit), "a stored block");
        assert_eq!(bit % 8, 5, "at the place that stands for its start");
        for (threads, chunk) in [(2, 100_000), (3, 1 << 20)] {
            let mut p = ParallelInflate::with_chunk(
                SharedBytes::from_vec(stream.clone()),
                threads,
                chunk,
                65536,
            );
            let (out, used, _) = drain(&mut p).unwrap();
            assert!(out == data, "threads {threads} chunk {chunk}");
            assert_eq!(used, stream.len());
            assert_eq!(p.restarts, 0, "threads {threads} chunk {chunk}");
        }
    }

    /// A compressed file stored whole in a member (a `.gz` in a tar): its
    /// DEFLATE stream lies in the member's stored blocks, and its blocks
    /// decode, the last one final. The search takes none of them for a
    /// block of the member: the final block is followed by neither the
    /// member's end nor another member. Before, a stream of two to four
    /// blocks passed every check.
    /// A DEFLATE stream of one stored block per piece (the last final),
    /// checked to decode to `payload`: the stream, the [`marker::place`]
    /// of each block, and where each block's data starts.
    fn stored_blocks(pieces: Vec<&[u8]>, payload: &[u8]) -> (Vec<u8>, Vec<usize>, Vec<usize>) {
        let (mut member, mut starts, mut data_at) = (Vec::new(), Vec::new(), Vec::new());
        for (i, piece) in pieces.iter().enumerate() {
            starts.push(member.len() * 8);
            member.push(u8::from(i + 1 == pieces.len()));
            let len = piece.len() as u16;
            member.extend_from_slice(&len.to_le_bytes());
            member.extend_from_slice(&(!len).to_le_bytes());
            data_at.push(member.len());
            member.extend_from_slice(piece);
        }
        let mut out = Vec::new();
        flate2::read::DeflateDecoder::new(&member[..])
            .read_to_end(&mut out)
            .unwrap();
        assert!(out == payload, "the member is valid DEFLATE");
        let real = starts
            .iter()
            .map(|&b| marker::place(&member, b).0)
            .collect();
        (member, real, data_at)
    }

    #[test]
    fn a_deflate_stream_stored_inside_is_no_block_start() {
        let inner = deflate(&image_like(160 << 10, 3), 6);
        let blocks = boundaries(&inner).len() + 1;
        assert!(
            (2..=4).contains(&blocks) && inner.len() < 60 << 10,
            "{blocks} blocks, {} bytes",
            inner.len()
        );
        // Stored blocks of 64 KiB, as an encoder writes for data that does
        // not compress, the inner stream inside the second.
        let mut payload = crate::testutil::noise(256 << 10, 1);
        let inner_in = 65535 + 1000;
        payload[inner_in..inner_in + inner.len()].copy_from_slice(&inner);
        let (mut member, real, _) = stored_blocks(payload.chunks(65535).collect(), &payload);
        let inner_at = 65535 + 5 + 5 + 1000;
        assert_eq!(member[inner_at..inner_at + inner.len()], inner[..]);
        member.extend_from_slice(&[0; 8]); // the trailer
        member.extend_from_slice(b"tar padding");
        let mut dec = MarkerDecoder::default();
        let mut from = inner_at * 8;
        while let Some((bit, _, _)) =
            marker::find_block(&mut dec, &member, from, (inner_at + inner.len()) * 8)
        {
            assert!(
                real.contains(&bit),
                "bit {bit} is no block of the member: {real:?}"
            );
            from = bit + 1;
        }
    }

    /// No real block start is taken for a place inside a run of stored
    /// blocks: in zlib's output of data that compresses in parts and in
    /// parts does not (runs of stored blocks between compressed ones), at
    /// every level, none of the block boundaries is.
    #[test]
    fn no_real_block_start_is_inside_a_stored_run() {
        let mut data = Vec::new();
        for i in 0..12 {
            data.extend_from_slice(&image_like(100_000 + i * 7_000, i as u64));
            data.extend_from_slice(&crate::testutil::noise(50_000 + i * 11_000, i as u64));
        }
        for level in [4, 6, 9] {
            let stream = deflate(&data, level);
            let blocks = boundaries(&stream);
            let stored = blocks
                .iter()
                .filter(|&&(b, _)| marker::stored_at(&stream, b))
                .count();
            assert!(stored > 20, "level {level}: {stored} stored blocks");
            for &(b, _) in &blocks {
                let place = marker::place(&stream, b).0;
                assert!(
                    !marker::inside_stored_run(&stream, b)
                        && !marker::inside_stored_run(&stream, place),
                    "level {level}: the block at bit {b} taken for one inside a stored run"
                );
            }
        }
    }

    /// A long DEFLATE stream inside a run of stored blocks (a `.gz` in a
    /// tar, which the outer gzip stored: its bytes do not compress), with
    /// its first blocks inside one stored block: each of them decodes, so
    /// the checks after a candidate pass, but no place inside a run of
    /// stored blocks is a block start. In a tar of /usr, such starts had
    /// the chunk before decoded again on one core.
    #[test]
    fn a_long_deflate_stream_inside_stored_blocks_is_no_block_start() {
        // Flushed every 16 KiB, as pigz writes: small blocks.
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
        for piece in image_like(1 << 20, 5).chunks(16 << 10) {
            e.write_all(piece).unwrap();
            e.flush().unwrap();
        }
        let inner = e.finish().unwrap();
        let inner_blocks = boundaries(&inner);
        assert!(
            inner_blocks.len() > 8 && inner_blocks[4].0 / 8 < 40_000,
            "{} blocks, the fifth at bit {}",
            inner_blocks.len(),
            inner_blocks.get(4).map_or(0, |b| b.0)
        );
        // Stored blocks of 16 KiB (zlib's for data that does not
        // compress), then of 64 KiB, the inner stream from inside the
        // fifth on.
        let mut payload = crate::testutil::noise(6 * 65535, 2);
        let inner_in = 4 * 16384 + 100;
        let n = inner.len().min(payload.len() - inner_in);
        payload[inner_in..inner_in + n].copy_from_slice(&inner[..n]);
        let (small, big) = payload.split_at(4 * 16384 + 60_000);
        let pieces = small.chunks(16384).chain(big.chunks(65535)).collect();
        let (mut member, real, in_member) = stored_blocks(pieces, &payload);
        // The inner stream's first bytes, where the fifth stored block's
        // data starts plus 100.
        let inner_at = in_member[4] + 100;
        assert_eq!(member[inner_at..inner_at + 1000], inner[..1000]);
        member.extend_from_slice(&[0; 8]); // the trailer
        let mut dec = MarkerDecoder::default();
        let mut from = in_member[3] * 8;
        let mut found = 0;
        while let Some((bit, _, _)) = marker::find_block(&mut dec, &member, from, member.len() * 8)
        {
            assert!(
                real.contains(&bit),
                "bit {bit} (byte {}) is no block of the member: {real:?}",
                bit / 8
            );
            found += 1;
            from = bit + 1;
        }
        assert!(
            found >= 2,
            "the stored blocks after the inner stream's start are found"
        );
    }

    /// Fixed-code blocks (zlib's `Z_FIXED`, simple encoders), which the
    /// block search cannot find, after stored ones, with bytes after the
    /// stream that read as a dynamic block header: inflated whole and
    /// right. Before, the boundary zlib reports after the final block was
    /// taken for a block there and the stream was refused as corrupt.
    #[test]
    fn fixed_code_blocks_inflate_on_any_number_of_threads() {
        let (data, mut stream) = crate::testutil::stored_then_fixed(1 << 20, 3 << 20, 21);
        let len = stream.len();
        stream.extend_from_slice(&[0x84; 8]);
        for (threads, chunk) in [(2, 64 << 10), (3, 300_000), (1, 1 << 20)] {
            let (out, used, _) = parallel(&stream, threads, chunk).unwrap();
            assert!(out == data, "threads {threads} chunk {chunk}");
            assert_eq!(used, len);
        }
    }

    /// zlib stops after the final block's end-of-block code too (with
    /// `Z_BLOCK`), before it says the stream ended: that is no boundary.
    /// Followed by bytes whose bits look like a dynamic block header, it
    /// was taken for one, and a chunk ended in the trailer.
    #[test]
    fn no_block_boundary_is_reported_after_the_final_block() {
        let data = image_like(1 << 20, 11);
        for level in [4, 6, 9] {
            let mut stream = deflate(&data, level);
            let bits = stream.len() * 8;
            stream.extend_from_slice(&[0x84; 8]);
            let mut z = ZInflate::new().unwrap();
            let mut out = Vec::with_capacity(data.len());
            let mut at = 0;
            let mut boundaries = 0;
            loop {
                out.reserve(1 << 16);
                let step = z.inflate(&stream[at..], &mut out, true).unwrap();
                at += step.consumed;
                if step.end {
                    break;
                }
                if step.at_block_end {
                    // The final block takes 10 bits at least.
                    let here = at * 8 - step.unused_bits as usize;
                    assert!(
                        here + 10 <= bits,
                        "level {level}: a boundary at {here} of {bits}"
                    );
                    boundaries += 1;
                }
            }
            assert!(out == data, "level {level}");
            assert!(boundaries > 0, "level {level}: no boundary");
        }
    }

    #[test]
    fn the_marker_decoder_reads_a_whole_stream_from_its_start() {
        let data = image_like(3 << 20, 7);
        let stream = deflate(&data, 6);
        let mut dec = MarkerDecoder::default();
        let mut bits = Bits::new(&stream, 0);
        while dec.block(&mut bits).unwrap() == BlockEnd::More {}
        let mut got = Vec::new();
        marker::resolve(dec.output(), &[], &mut got, 0).unwrap();
        assert!(got == data);
    }

    #[test]
    fn zlib_resumes_at_every_block_boundary_with_the_window() {
        let data = image_like(2 << 20, 11);
        let stream = deflate(&data, 6);
        let b = boundaries(&stream);
        assert!(b.len() > 10, "{} blocks", b.len());
        for &(bit, off) in b.iter().step_by(3) {
            let mut z = ZInflate::new().unwrap();
            let mut at = bit / 8;
            if bit % 8 != 0 {
                assert!(z.prime(8 - (bit % 8) as u32, u32::from(stream[at] >> (bit % 8))));
                at += 1;
            }
            assert!(z.set_dictionary(&data[off.saturating_sub(marker::WINDOW)..off]));
            let mut out = Vec::with_capacity(data.len() - off + 1);
            let step = z.inflate(&stream[at..], &mut out, false).unwrap();
            assert!(step.end, "stream did not end from bit {bit}");
            assert!(out == data[off..], "output differs from bit {bit}");
        }
    }

    #[test]
    fn libdeflate_inflates_whole_stretches_between_any_two_boundaries() {
        let data = image_like(3 << 20, 17);
        let stream = deflate(&data, 6);
        let b = boundaries(&stream);
        let mut w = Whole::new().unwrap();
        let mut buf = Vec::new();
        for i in (0..b.len() - 3).step_by(2) {
            let ((from, a), (to, z)) = (b[i], b[i + 3]);
            let window = &data[a.saturating_sub(marker::WINDOW)..a];
            whole::rebase(&stream, from, Some(to), window, &mut buf);
            let mut out = Vec::with_capacity(window.len() + z - a);
            assert_eq!(w.inflate(&buf, &mut out), Outcome::Done { used: buf.len() });
            assert!(out[window.len()..] == data[a..z], "bits {from}..{to}");
        }
    }

    /// Stored blocks after compressed ones: a stretch starts and ends at
    /// the places that stand for their stored blocks (`marker::place`,
    /// a few bits after the true boundary where the block before ended in
    /// zero bits) and inflates to the same bytes.
    #[test]
    fn stretches_between_stored_blocks_inflate_from_the_places_that_stand_for_them() {
        let mut data = Vec::new();
        for k in 0..12 {
            data.extend(image_like(100_000 + k * 7919, k as u64));
            data.extend(crate::testutil::noise(70_000 + k * 101, k as u64));
        }
        let stream = deflate(&data, 6);
        let b = boundaries(&stream);
        let mut w = Whole::new().unwrap();
        let mut buf = Vec::new();
        let mut moved = 0;
        for i in 0..b.len() - 2 {
            let ((from, a), (to, z)) = (b[i], b[i + 2]);
            let (from, to) = (marker::place(&stream, from).0, marker::place(&stream, to).0);
            moved += usize::from(to != b[i + 2].0);
            let window = &data[a.saturating_sub(marker::WINDOW)..a];
            whole::rebase(&stream, from, Some(to), window, &mut buf);
            let mut out = Vec::with_capacity(window.len() + z - a);
            assert_eq!(
                w.inflate(&buf, &mut out),
                Outcome::Done { used: buf.len() },
                "bits {from}..{to}"
            );
            assert!(out[window.len()..] == data[a..z], "bits {from}..{to}");
            // zlib-rs, streamed from the same place, too.
            let (mut zi, mut at) = ZInflate::starting_at(&stream, from, window).unwrap();
            let mut got = Vec::with_capacity(z - a + (1 << 16));
            while got.len() < z - a {
                let step = zi.inflate(&stream[at..], &mut got, false).unwrap();
                at += step.consumed;
                assert!(step.consumed + step.produced > 0, "bits {from}..: stalled");
                got.reserve(1 << 16);
            }
            assert!(got[..z - a] == data[a..z], "bits {from}..: streamed");
        }
        assert!(
            moved > 0,
            "no stored block's boundary moved: the test tests nothing"
        );
    }

    #[test]
    fn found_blocks_are_true_boundaries_and_their_markers_resolve() {
        let data = image_like(4 << 20, 3);
        let stream = deflate(&data, 6);
        let b = boundaries(&stream);
        let mut dec = MarkerDecoder::default();
        let mut found = 0;
        for from in (1..8).map(|k| k * stream.len() * 8 / 8) {
            let Some((bit, _, next)) = marker::find_block(&mut dec, &stream, from, usize::MAX)
            else {
                continue;
            };
            found += 1;
            // A stored block is found at the place that stands for its
            // start (`marker::place`).
            let off = b
                .iter()
                .find(|x| marker::place(&stream, x.0).0 == bit)
                .expect("a true boundary")
                .1;
            let end = b
                .iter()
                .find(|x| x.0 == next)
                .map(|x| x.1)
                .unwrap_or(data.len());
            let mut got = Vec::new();
            let window = &data[off.saturating_sub(marker::WINDOW)..off];
            marker::resolve(dec.output(), window, &mut got, 0).unwrap();
            assert!(got == data[off..end]);
        }
        assert!(found >= 5);
    }

    fn parallel(stream: &[u8], threads: usize, chunk: usize) -> Result<(Vec<u8>, usize, u32)> {
        // Small pieces, so a chunk's output is handed out in many.
        let piece = 4096 + chunk % 10_000;
        let mut p = ParallelInflate::with_chunk(
            SharedBytes::from_vec(stream.to_vec()),
            threads,
            chunk,
            piece,
        );
        drain(&mut p)
    }

    /// The output of `p`, checked against its size.
    fn drain(p: &mut ParallelInflate) -> Result<(Vec<u8>, usize, u32)> {
        let mut out = Vec::new();
        let mut piece = Vec::new();
        while p.next_piece(&mut piece)? {
            out.extend_from_slice(&piece);
            piece.clear();
        }
        let (used, crc, size) = p.finish();
        assert_eq!(size, out.len() as u64);
        Ok((out, used, crc))
    }

    /// `stream` inflated from its start by `crew`, in pieces of 8 KiB.
    fn started(crew: Arc<Crew>, stream: &[u8]) -> ParallelInflate {
        ParallelInflate::start(
            SharedBytes::from_vec(stream.to_vec()),
            crew,
            8192,
            None,
            Resume::default(),
            true,
            None,
        )
    }

    /// Inflate all of `stream` with `crew`, checking it gives `data` and
    /// reads the stream to its end; the inflate, for its counters.
    fn inflate_all_with(crew: Arc<Crew>, stream: &[u8], data: &[u8]) -> ParallelInflate {
        let mut p = started(crew, stream);
        let (out, used, _) = drain(&mut p).unwrap();
        assert!(out == data);
        assert_eq!(used, stream.len());
        p
    }

    #[test]
    fn lent_pieces_give_their_chunk_buffer_back_when_the_last_is_dropped() {
        let data = image_like(4 << 20, 11);
        let stream = deflate(&data, 6);
        let crew = Crew::with_marker_cap(2, 256 << 10, MARKER_CAP, true);
        let pools = crew.pools.clone();
        let may_make = pools.whole_left.load(Ordering::Acquire);
        let mut p = started(crew, &stream);
        let (mut out, mut piece, mut held) = (Vec::new(), Vec::new(), Vec::new());
        loop {
            let mut lent = None;
            if !p.next_piece_lent(&mut piece, &mut lent).unwrap() {
                break;
            }
            match lent {
                Some(l) => {
                    assert!(piece.is_empty(), "a piece both copied and lent");
                    out.extend_from_slice(l.as_slice());
                    held.push(l);
                }
                None => out.extend_from_slice(&piece),
            }
            piece.clear();
        }
        assert!(out == data);
        assert!(!held.is_empty(), "no chunk's output was lent");
        let made = may_make - pools.whole_left.load(Ordering::Acquire);
        assert!(pools.spare.1.len() < made, "a buffer came back while lent");
        drop(held);
        assert_eq!(pools.spare.1.len(), made, "a lent buffer did not come back");
    }

    /// Blocks of random bytes, each a copy of the one before it with a few
    /// bytes changed: a chunk that starts inside copies bytes of the
    /// window it does not know, and they stay unknown, copied from block
    /// to block, long after the chunk's start.
    fn unknown_for_long(len: usize) -> Vec<u8> {
        let mut block = image_like(16 << 10, 7);
        let mut v = Vec::with_capacity(len);
        let mut x = 1u64;
        while v.len() < len {
            v.extend_from_slice(&block);
            for _ in 0..4 {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let at = (x >> 33) as usize % block.len();
                block[at] = (x >> 20) as u8;
            }
        }
        v.truncate(len);
        v
    }

    #[test]
    fn a_window_resolves_from_the_output_before_and_the_markers_after() {
        use marker::{MARKER, WINDOW};
        let before: Vec<u8> = (0..WINDOW + 100).map(|i| (i * 7 % 251) as u8).collect();
        let window_of_before = &before[before.len() - WINDOW..];
        // Markers name bytes of the 32 KiB before the chunk by place.
        let out: Vec<u16> = (0..WINDOW + 10)
            .map(|i| match i % 3 {
                0 => (i % 256) as u16,
                _ => MARKER + (i * 13 % WINDOW) as u16,
            })
            .collect();
        let want: Vec<u8> = out
            .iter()
            .map(|&v| match v.checked_sub(MARKER) {
                Some(m) => window_of_before[usize::from(m)],
                None => v as u8,
            })
            .collect();
        let w = resolved_window(&out, &before).unwrap();
        assert!(w == want[want.len() - WINDOW..]);
        // Less output than a window: the bytes before it make up the rest.
        let short = resolved_window(&out[..100], &before).unwrap();
        assert_eq!(short.len(), WINDOW);
        assert!(short[..WINDOW - 100] == before[before.len() - (WINDOW - 100)..]);
        assert!(short[WINDOW - 100..] == want[..100]);
        // A marker into bytes before the stream's start is damage.
        assert!(resolved_window(&out, &before[..1000]).is_none());
    }

    #[test]
    fn a_chunk_whose_window_never_clears_resolves_from_the_window_before_it() {
        // The second chunk starts inside copies of copies of bytes it does
        // not know. On one worker the first chunk is done, and its window
        // published, before the second starts, which then resolves its
        // markers from it: deterministic. On two, whether the window comes
        // before the chunk's end is timing; the output is right either way.
        let mut data = image_like(256 << 10, 5);
        data.extend(unknown_for_long(1 << 20));
        let stream = deflate(&data, 6);
        for (threads, share) in [(1, true), (1, false), (2, true)] {
            let crew = Crew::with_marker_cap(threads, stream.len() / 2 + 1, usize::MAX, share);
            let p = inflate_all_with(crew, &stream, &data);
            assert_eq!(p.restarts, 0);
            let used = p.shared.windows_used.load(Ordering::Relaxed);
            if threads == 1 {
                assert_eq!(used > 0, share, "threads 1, share {share}");
            }
        }
    }

    #[test]
    fn chunks_whose_window_never_clears_restart_and_keep_the_next_chunk() {
        let mut data = image_like(1 << 20, 3);
        data.extend(unknown_for_long(3 << 20));
        data.extend(image_like(1 << 20, 4));
        let stream = deflate(&data, 6);
        for threads in [1, 2, 3] {
            let crew = Crew::with_marker_cap(threads, 64 << 10, 30_000, false);
            let p = inflate_all_with(crew, &stream, &data);
            assert!(p.restarts > 0, "no chunk gave up its markers");
            assert!(p.kept_across > 0, "every chunk after a restart was dropped");
            // Each restart up to a chunk kept across it ends at that
            // chunk's first block: inflated whole by libdeflate.
            let whole = p.shared.whole_restarts.load(Ordering::Relaxed);
            assert!(
                whole > 0,
                "threads {threads}: no restart was inflated whole"
            );
        }
    }

    #[test]
    fn workers_fit_a_memory_budget_buffers_first_then_threads() {
        assert_eq!(Workers::within(4, None), Workers::from(4));
        assert_eq!(
            Workers::from(0),
            Workers {
                threads: 1,
                whole_buffers: 3
            }
        );
        let full = Workers::from(4);
        assert_eq!(Workers::within(4, Some(full.peak_bytes())), full);
        // A byte less: one whole-chunk buffer fewer, all four workers.
        let less = Workers::within(4, Some(full.peak_bytes() - 1));
        assert_eq!(
            less,
            Workers {
                threads: 4,
                whole_buffers: 5
            }
        );
        assert!(less.peak_bytes() < full.peak_bytes());
        for budget in [
            0u64,
            1 << 20,
            100 << 20,
            300 << 20,
            700 << 20,
            2 << 30,
            64 << 30,
        ] {
            for threads in [1, 2, 3, 8, 64] {
                let w = Workers::within(threads, Some(budget));
                assert!(w.threads >= 1 && w.threads <= threads.max(1));
                assert!(w.whole_buffers <= w.threads + 2);
                // Fits, unless even one worker without buffers does not.
                assert!(
                    w.peak_bytes() <= budget
                        || w == Workers {
                            threads: 1,
                            whole_buffers: 0
                        },
                    "{threads} threads, budget {budget}: {w:?}"
                );
                let p = Workers::within_piped(threads, Some(budget));
                assert!(p.threads <= w.threads, "{p:?} {w:?}");
            }
        }
        // Buffers go before workers: a budget that holds two workers but
        // not one whole-chunk buffer keeps both, streaming.
        let two = Workers {
            threads: 2,
            whole_buffers: 0,
        };
        assert_eq!(Workers::within(2, Some(two.peak_bytes())), two);
        assert_eq!(Workers::within(2, Some(two.peak_bytes() - 1)).threads, 1);
    }

    #[test]
    fn fewer_or_no_whole_chunk_buffers_stream_chunks_to_the_same_output() {
        let data = image_like(3 << 20, 21);
        let stream = deflate(&data, 6);
        for whole_buffers in [0, 1, 2] {
            let workers = Workers {
                threads: 2,
                whole_buffers,
            };
            let crew = Crew::with_marker_cap(workers, 64 << 10, MARKER_CAP, true);
            let pools = crew.pools.clone();
            let p = inflate_all_with(crew, &stream, &data);
            drop(p);
            // Every buffer made came back to the pool once the reader and
            // its pieces were gone; none was made past the bound.
            let made = whole_buffers - pools.whole_left.load(Ordering::Acquire);
            assert_eq!(pools.spare.1.len(), made, "{whole_buffers} allowed");
            match whole_buffers {
                0 => assert_eq!(made, 0),
                _ => assert!(made > 0, "no chunk inflated whole with {whole_buffers}"),
            }
        }
    }

    #[test]
    fn parallel_inflate_equals_the_stream_for_chunk_sizes_and_levels() {
        let data = image_like(6 << 20, 5);
        for level in [4, 6, 9] {
            let mut stream = deflate(&data, level);
            let len = stream.len();
            // What follows the stream (a trailer, the next member's stream,
            // which chunks may start in) is not read.
            stream.extend_from_slice(b"trailer!");
            stream.extend(deflate(&image_like(2 << 20, 99), 6));
            for (threads, chunk) in [(2, 64 << 10), (3, 200_000), (2, 1 << 20), (1, 300_000)] {
                let (out, used, crc) = parallel(&stream, threads, chunk).unwrap();
                assert!(out == data, "level {level} threads {threads} chunk {chunk}");
                assert_eq!(used, len);
                assert_eq!(crc, crc32fast::hash(&data));
            }
        }
    }

    #[test]
    fn parallel_inflate_reads_libdeflate_streams() {
        // libdeflate writes much longer blocks than zlib.
        let data = image_like(3 << 20, 9);
        let mut c = libdeflater::Compressor::new(libdeflater::CompressionLvl::new(9).unwrap());
        let mut stream = vec![0; c.deflate_compress_bound(data.len())];
        let n = c.deflate_compress(&data, &mut stream).unwrap();
        stream.truncate(n);
        let (out, used, _) = parallel(&stream, 2, 64 << 10).unwrap();
        assert!(out == data);
        assert_eq!(used, n);
    }

    #[test]
    fn damage_and_truncation_are_errors_or_a_wrong_crc_never_a_hang() {
        let data = image_like(3 << 20, 13);
        let stream = deflate(&data, 6);
        let good = crc32fast::hash(&data);
        let cut = &stream[..stream.len() * 2 / 3];
        assert!(matches!(
            parallel(cut, 2, 100_000),
            Err(CodecError::Truncated { .. })
        ));
        for k in 1..12 {
            let mut bad = stream.clone();
            let at = bad.len() * k / 12;
            bad[at] ^= 0x5a;
            if let Ok((out, _, crc)) = parallel(&bad, 2, 100_000) {
                assert!(crc != good || out == data, "damage at {at} went unnoticed");
            }
        }
    }

    /// Every checkpoint of `index` is a true one: a block boundary of
    /// `stream` at its output offset, with the data before it as window.
    fn check_points(index: &MemberIndex, stream: &[u8], data: &[u8]) {
        assert_eq!(index.out_len, data.len() as u64);
        // (A stored block's boundary is kept at the place that stands for
        // it: `marker::place`.)
        let truth: HashMap<usize, usize> = boundaries(stream)
            .into_iter()
            .map(|(bit, out)| (marker::place(stream, bit).0, out))
            .collect();
        for p in &index.points {
            assert_eq!(
                truth.get(&(p.bit as usize)),
                Some(&(p.out as usize)),
                "{}",
                p.bit
            );
            let out = p.out as usize;
            assert_eq!(p.window.len(), out.min(marker::WINDOW));
            assert!(
                p.window == data[out - p.window.len()..out],
                "window at {}",
                p.bit
            );
            assert_eq!(
                p.bit as usize / (index.chunk_bits as usize),
                p.chunk as usize
            );
        }
    }

    #[test]
    fn an_index_starts_every_chunk_and_a_wrong_one_costs_only_time() {
        let data = image_like(4 << 20, 21);
        let stream = deflate(&data, 6);
        let bytes = || SharedBytes::from_vec(stream.clone());
        let mut p = ParallelInflate::with_chunk(bytes(), 2, 100_000, PIECE);
        assert!(drain(&mut p).unwrap().0 == data);
        let index = p.checkpoints();
        let chunks = stream.len().div_ceil(100_000);
        assert!(
            index.points.len() * 4 >= chunks * 3,
            "{} of {chunks} chunks",
            index.points.len()
        );
        check_points(&index, &stream, &data);
        // The next read searches nothing and finds the same checkpoints.
        let mut q = ParallelInflate::with_index(bytes(), 2, index.clone());
        let (out, used, crc) = drain(&mut q).unwrap();
        assert!(out == data);
        assert_eq!((used, crc), (stream.len(), crc32fast::hash(&data)));
        assert_eq!(q.shared.searches.load(Ordering::Relaxed), 0);
        assert_eq!(q.checkpoints(), index);
        // Wrong windows, bits (inside blocks and the final one), offsets
        // and lengths give the right output.
        let spoil: [fn(&mut Checkpoint); 7] = [
            |p| p.window.iter_mut().rev().take(1).for_each(|b| *b ^= 1),
            |p| p.bit += 1,
            |p| p.bit += 13,
            |p| p.bit += 4099,
            |p| p.bit = p.bit.saturating_sub(700),
            |p| p.out += 1,
            |p| p.window.truncate(10),
        ];
        let last = boundaries(&stream).last().map_or(0, |b| b.0 as u64);
        for (i, f) in spoil.iter().enumerate() {
            let mut bad = index.clone();
            for p in bad.points.iter_mut().skip(i % 3).step_by(3) {
                f(p);
            }
            if i == 6 {
                bad.out_len = 5;
            }
            // One checkpoint in the final block.
            if let Some(p) = bad.points.last_mut().filter(|_| i == 1) {
                p.bit = last + 40;
                p.chunk = p.bit / bad.chunk_bits;
            }
            let mut q = ParallelInflate::with_index(bytes(), 2, bad);
            let (out, used, crc) = drain(&mut q).unwrap();
            assert!(out == data, "spoiled by {i}");
            assert_eq!((used, crc), (stream.len(), crc32fast::hash(&data)));
            check_points(&q.checkpoints(), &stream, &data);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn parallel_inflate_round_trips(seed in 1u64.., len in 0usize..600_000, chunk in 2_000usize..80_000, level in 0u32..10) {
            let data = image_like(len, seed);
            let stream = deflate(&data, level);
            let mut p = ParallelInflate::with_chunk(SharedBytes::from_vec(stream.clone()), 2, chunk, 4096 + chunk % 10_000);
            let (out, used, crc) = drain(&mut p).unwrap();
            prop_assert!(out == data);
            prop_assert_eq!(used, stream.len());
            prop_assert_eq!(crc, crc32fast::hash(&data));
            // Read again from its checkpoints.
            let index = p.checkpoints();
            check_points(&index, &stream, &data);
            let mut q = ParallelInflate::with_index(SharedBytes::from_vec(stream.clone()), 2, index);
            let (out, used, crc) = drain(&mut q).unwrap();
            prop_assert!(out == data);
            prop_assert_eq!(used, stream.len());
            prop_assert_eq!(crc, crc32fast::hash(&data));
        }

        /// Every kind of copy the marker decoder moves in its own way
        /// (short or long, overlapping at every period, reaching into the
        /// window): decoded from the start, and from each later block with
        /// the window before it, the markers resolve to the data.
        #[test]
        fn the_marker_decoder_copies_every_period_and_length(
            runs in proptest::collection::vec((1usize..48, 1usize..700, any::<u8>()), 1..300),
            level in 1u32..10,
        ) {
            let mut data = Vec::new();
            for (period, len, seed) in runs {
                let pattern: Vec<u8> = (0..period).map(|i| seed.wrapping_mul(i as u8 | 1) ^ i as u8).collect();
                data.extend(pattern.iter().cycle().take(len));
            }
            let stream = deflate(&data, level);
            let mut dec = MarkerDecoder::default();
            let mut bits = Bits::new(&stream, 0);
            let mut starts = vec![];
            loop {
                starts.push((bits.pos(), dec.output().len()));
                if dec.block(&mut bits).unwrap() == BlockEnd::Last {
                    break;
                }
            }
            let mut got = Vec::new();
            marker::resolve(dec.output(), &[], &mut got, 0).unwrap();
            prop_assert!(got == data);
            for &(bit, out) in &starts[1..] {
                dec.clear();
                let mut bits = Bits::new(&stream, bit);
                while dec.block(&mut bits).unwrap() == BlockEnd::More {}
                let window = &data[out.saturating_sub(marker::WINDOW)..out];
                let mut got = Vec::new();
                marker::resolve(dec.output(), window, &mut got, 0).unwrap();
                prop_assert!(got == data[out..]);
            }
        }
    }
}
