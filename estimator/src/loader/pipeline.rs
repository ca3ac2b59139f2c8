//! The loader's threads: decode workers turn pieces (file, row group, row range) into chunks in
//! parallel; one assembler thread puts them back in plan order, permutes shuffle windows,
//! gathers batches and queues them for the caller.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::loader::assemble::{allocate, whole_views, Batch, Group, Segment, Window};
use crate::loader::decode::{Chunk, ColumnSpec};
use crate::loader::memory::BufferPool;
use crate::loader::queue::{Pop, Queue};
use crate::loader::source::FileReader;
use crate::loader::state::Position;
use crate::loader::workers::{Pending, Workers};
use crate::metadata::RowGroupRef;
use crate::plan::{EpochPlan, PlanConfig, RankPlan};

/// How often blocked threads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// At most this many bytes of shuffle windows are gathered ahead of the one being handed
/// out, and at most [`WINDOWS_AHEAD_PER_THREAD`] windows per `kolo-gather` thread. (Three
/// windows ahead on three threads left 2 cores idle 15-20 % of an epoch at batch 4096:
/// finished windows waited for the one before them while the others shared the cores; eight
/// ahead on two threads keep them busy, about 6.3 -> 7.2 GB/s.)
const AHEAD_BYTES: usize = 256 << 20;
/// The most shuffle windows gathered ahead per gather thread.
const WINDOWS_AHEAD_PER_THREAD: usize = 4;
/// The most batches of one shuffle window queued at once (small batches of a large window).
const MAX_QUEUED_WINDOW_BATCHES: usize = 1024;
/// How long dropping a loader waits for its threads.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything the threads share about the dataset and the loader's settings.
#[derive(Debug)]
pub struct Context {
    /// One reader per data file (the dataset's, shared).
    pub readers: Arc<[FileReader]>,
    /// Row groups in the global row index space.
    pub row_groups: Vec<RowGroupRef>,
    /// The selected columns.
    pub specs: Vec<ColumnSpec>,
    /// The output buffers.
    pub groups: Vec<Group>,
    /// The group handed out row-major (`[rows, columns]`), if any.
    pub stack_group: Option<usize>,
    /// The plan settings.
    pub config: PlanConfig,
    /// This rank.
    pub rank: u32,
    /// Epochs to run (`None`: no end).
    pub num_epochs: Option<u64>,
    /// Most rows per piece when a file's offset index lets a row group be read in parts.
    pub piece_rows: usize,
    /// Per file, the top-level indices of the selected columns (found once).
    pub roots: Vec<OnceLock<Vec<usize>>>,
    /// Threads that gather the columns of a shuffle window.
    pub assemble_threads: usize,
    /// Shuffle windows the assembler gathered itself while batches waited for them (see
    /// [`crate::loader::Loader::windows_gathered_inline`]).
    pub windows_gathered_inline: AtomicU64,
    /// Bytes the loader has written (see [`crate::loader::Loader::bytes_copied`]).
    pub bytes_copied: AtomicU64,
}

impl Context {
    /// The global row ranges of the row groups.
    pub fn row_group_ranges(&self) -> Vec<Range<u64>> {
        self.row_groups.iter().map(|g| g.rows.clone()).collect()
    }

    fn roots(&self, file: usize) -> Result<&[usize]> {
        if let Some(roots) = self.roots[file].get() {
            return Ok(roots);
        }
        let reader = &self.readers[file];
        let schema = reader.metadata()?.schema().clone();
        let roots = self
            .specs
            .iter()
            .map(|spec| {
                schema
                    .index_of(&spec.name)
                    .map_err(|_| Error::SchemaDiffers {
                        column: spec.name.clone(),
                        file: reader.file().url.clone(),
                        expected: spec.dtype.name().to_string(),
                        found: "missing".into(),
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.roots[file].get_or_init(|| roots))
    }

    /// Counts `bytes` written.
    pub fn copied(&self, bytes: usize) {
        self.bytes_copied.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Decodes one piece into chunks, counting the bytes that do not lie in the mapped file
    /// (decoded, decompressed or fetched) as written.
    fn decode(&self, piece: &Piece) -> Result<Vec<Arc<Chunk>>> {
        let reader = &self.readers[piece.file];
        let chunks = self.decode_chunks(piece)?;
        let written: usize = chunks
            .iter()
            .flat_map(|chunk| &chunk.columns)
            .filter(|values| !reader.is_mapped(values.as_slice()))
            .map(|values| values.len())
            .sum();
        self.copied(written);
        Ok(chunks)
    }

    fn decode_chunks(&self, piece: &Piece) -> Result<Vec<Arc<Chunk>>> {
        let reader = &self.readers[piece.file];
        let roots = self.roots(piece.file)?;
        let want = piece.rows.len();
        if let Some(chunks) = reader.read_plain(roots, &self.specs, piece.row_group, &piece.rows)? {
            return Ok(chunks.into_iter().map(Arc::new).collect());
        }
        let batches = reader.read(roots, piece.row_group, piece.rows.clone(), want)?;
        let mut chunks = Vec::with_capacity(batches.len());
        let mut got = 0;
        for batch in &batches {
            if batch.num_rows() > 0 {
                got += batch.num_rows();
                chunks.push(Arc::new(Chunk::from_batch(
                    batch,
                    &self.specs,
                    &reader.file().url,
                )?));
            }
        }
        if got != want {
            return Err(Error::Internal(format!(
                "read {got} rows instead of {want} from row group {} of {}",
                piece.row_group,
                reader.file().url
            )));
        }
        Ok(chunks)
    }

    /// Splits global `rows` into pieces along row groups (and, where the file has an offset
    /// index, into parts of at most `piece_rows`).
    fn pieces(&self, rows: &Range<u64>, out: &mut VecDeque<Piece>) -> Result<()> {
        let mut at = rows.start;
        while at < rows.end {
            let g = self.row_groups.partition_point(|g| g.rows.end <= at);
            let group = self.row_groups.get(g).ok_or_else(|| {
                Error::Internal(format!("row {at} is past the dataset's row groups"))
            })?;
            let end = rows.end.min(group.rows.end);
            let local = (at - group.rows.start) as usize..(end - group.rows.start) as usize;
            let reader = &self.readers[group.file];
            let split = reader.metadata()?.metadata().offset_index().is_some();
            let step = if split {
                self.piece_rows.max(1)
            } else {
                usize::MAX
            };
            let mut start = local.start;
            while start < local.end {
                let stop = local.end.min(start.saturating_add(step));
                out.push_back(Piece {
                    file: group.file,
                    row_group: group.row_group,
                    rows: start..stop,
                });
                start = stop;
            }
            at = end;
        }
        Ok(())
    }
}

/// Rows of one row group to decode.
#[derive(Debug, Clone)]
struct Piece {
    file: usize,
    row_group: usize,
    rows: Range<usize>,
}

/// What the assembler hands to the caller.
#[derive(Debug)]
pub enum Item {
    /// A batch.
    Batch(Batch),
    /// The epoch ended (after its last batch).
    EndOfEpoch(u64),
    /// The last epoch (`num_epochs`) ended.
    Finished,
    /// Reading failed; the threads have stopped.
    Failed(Error),
}

type Decoded = Result<Vec<Arc<Chunk>>>;

/// The decode queue and the results waiting to be put in order.
#[derive(Debug, Default)]
struct Work {
    state: Mutex<WorkState>,
    work_ready: Condvar,
    result_ready: Condvar,
    stop: AtomicBool,
}

#[derive(Debug, Default)]
struct WorkState {
    queue: VecDeque<(u64, Piece)>,
    done: HashMap<u64, Decoded>,
}

impl Work {
    fn lock(&self) -> MutexGuard<'_, WorkState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _guard = self.lock();
        self.work_ready.notify_all();
        self.result_ready.notify_all();
    }

    /// Decode worker: takes pieces until stopped.
    fn run_worker(&self, context: &Context) {
        loop {
            let (seq, piece) = {
                let mut state = self.lock();
                loop {
                    if self.stopped() {
                        return;
                    }
                    if let Some(job) = state.queue.pop_front() {
                        break job;
                    }
                    state = self
                        .work_ready
                        .wait_timeout(state, POLL)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            };
            let result = context.decode(&piece);
            self.lock().done.insert(seq, result);
            self.result_ready.notify_all();
        }
    }

    /// The result of piece `seq`, waiting for it; `None` once stopped.
    fn result(&self, seq: u64) -> Option<Decoded> {
        let mut state = self.lock();
        loop {
            if let Some(result) = state.done.remove(&seq) {
                return Some(result);
            }
            if self.stopped() {
                return None;
            }
            state = self
                .result_ready
                .wait_timeout(state, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A shuffle window of a run: (epoch, window index in the epoch's rank plan).
type WindowKey = (u64, u64);

/// One epoch as the assembler runs it.
#[derive(Debug, Clone)]
struct EpochJob {
    epoch: u64,
    plan: Arc<RankPlan>,
    /// Output position to start at.
    start: u64,
    /// Output position to stop at (rows handed out in the epoch).
    end: u64,
}

/// Generates the pieces to read, epoch after epoch, ahead of the assembler.
#[derive(Debug)]
struct Feed {
    context: Arc<Context>,
    next: Option<Position>,
    pieces: VecDeque<Piece>,
    jobs: VecDeque<EpochJob>,
}

impl Feed {
    /// Plans the next epoch: queues its job and its pieces. `false` when there is none.
    fn advance(&mut self) -> Result<bool> {
        let Some(position) = self.next.take() else {
            return Ok(false);
        };
        let context = &self.context;
        if context.num_epochs.is_some_and(|n| position.epoch >= n) {
            return Ok(false);
        }
        let plan = EpochPlan::new(
            &context.row_group_ranges(),
            &context.config,
            position.epoch,
            &position.history,
        )
        .rank(context.rank);
        let end = plan.delivered_rows();
        let start = position.offset.min(end);
        if start < end {
            let window = plan.window();
            let first = start / window * window;
            let last = plan.window_bounds((end - 1) / window).end;
            for range in plan.rows().slice(first, last) {
                context.pieces(&range, &mut self.pieces)?;
            }
        }
        self.jobs.push_back(EpochJob {
            epoch: position.epoch,
            plan: Arc::new(plan),
            start,
            end,
        });
        self.next = Some(Position {
            epoch: position.epoch + 1,
            offset: 0,
            history: Vec::new(),
        });
        Ok(true)
    }
}

/// The assembler's state.
struct Assembler {
    context: Arc<Context>,
    work: Arc<Work>,
    out: Arc<Queue<Item>>,
    feed: Feed,
    issued: u64,
    consumed: u64,
    lookahead: u64,
    /// Decoded chunks not used up yet, with the first unused row of the front one.
    stream: VecDeque<Arc<Chunk>>,
    stream_row: usize,
    pool: Arc<BufferPool>,
    /// Windows being gathered by `workers`, in order, keyed by (epoch, window index): the
    /// rest of the current epoch's, then the next epoch's first ones, so an epoch starts
    /// on a window gathered while the last one was handed out.
    ahead: VecDeque<(WindowKey, Pending<Window>)>,
    /// The threads that gather windows ahead.
    workers: Workers,
    /// How many windows may be gathered ahead at once.
    ahead_depth: usize,
}

impl Assembler {
    fn run(mut self) {
        let item = match self.run_epochs() {
            Ok(true) => Item::Finished,
            Ok(false) => return,
            Err(err) => Item::Failed(err),
        };
        let _ = self.out.push(item, POLL);
        self.work.stop();
    }

    /// Runs epochs until `num_epochs` (`Ok(true)`) or a stop (`Ok(false)`).
    fn run_epochs(&mut self) -> Result<bool> {
        loop {
            if self.feed.jobs.is_empty() && !self.feed.advance()? {
                return Ok(true);
            }
            let job = self
                .feed
                .jobs
                .pop_front()
                .ok_or_else(|| Error::Internal("no epoch planned".into()))?;
            if !self.run_epoch(&job)? || !self.send(Item::EndOfEpoch(job.epoch)) {
                return Ok(false);
            }
        }
    }

    /// Hands out one epoch's batches; `false` when stopped.
    fn run_epoch(&mut self, job: &EpochJob) -> Result<bool> {
        let context = Arc::clone(&self.context);
        let groups = &context.groups;
        let batch_size = self.context.config.batch_size;
        let plan = &*job.plan;
        let width = plan.window();
        let mut window: Option<(u64, Window)> = None;
        let mut position = job.start;
        while position < job.end {
            let rows = batch_size.min(job.end - position) as usize;
            let index = position / width;
            self.load_window(&mut window, job, index)?;
            let Some((_, current)) = window.as_ref() else {
                return Ok(false);
            };
            let bounds = plan.window_bounds(index);
            let buffers = if position + rows as u64 <= bounds.end {
                // The batch lies inside the window: hand out views of it.
                let from = (position - bounds.start) as usize;
                position += rows as u64;
                current.view(groups, from, rows)
            } else {
                let mut buffers = allocate(groups, rows, &self.pool);
                let mut filled = 0;
                while filled < rows {
                    let index = position / width;
                    self.load_window(&mut window, job, index)?;
                    let Some((_, current)) = window.as_ref() else {
                        return Ok(false);
                    };
                    let bounds = plan.window_bounds(index);
                    let from = (position - bounds.start) as usize;
                    let n = (rows - filled).min((bounds.end - position) as usize);
                    let copied = current.copy_out(groups, &mut buffers, from, n, filled);
                    self.context.copied(copied);
                    filled += n;
                    position += n as u64;
                }
                whole_views(groups, buffers)
            };
            let batch = Batch {
                epoch: job.epoch,
                rows,
                end_offset: position,
                last: position == job.end,
                buffers,
            };
            if !self.send(Item::Batch(batch)) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Hands the workers the windows after window `index` of `job` (the one being loaded),
    /// up to the depth: the rest of the epoch's rows before its end (so every one is handed
    /// out in it), then the next epoch's first windows. The rows come off the stream in that
    /// order (the next epoch's pieces follow this one's), so `load_window` finds each in turn.
    fn gather_ahead(&mut self, job: &EpochJob, index: u64) -> Result<()> {
        loop {
            if self.ahead.len() >= self.ahead_depth {
                return Ok(());
            }
            let last = self
                .ahead
                .back()
                .map_or((job.epoch, index), |(key, _)| *key);
            let Some((key, plan)) = self.window_after(job, last)? else {
                return Ok(());
            };
            let bounds = plan.window_bounds(key.1);
            let Some(segments) = self.take_rows((bounds.end - bounds.start) as usize)? else {
                return Ok(());
            };
            let (context, pool) = (Arc::clone(&self.context), Arc::clone(&self.pool));
            let pending = self.workers.submit(move || {
                let permutation = plan.window_permutation(key.1);
                let window = Window::new(&segments, &permutation, &context.groups, &pool, 1);
                context.copied(window.bytes_written());
                window
            })?;
            self.ahead.push_back((key, pending));
        }
    }

    /// The window after `(epoch, index)` (in `job`, the current epoch, or the epoch after it,
    /// planned here if it is not yet) with its epoch's plan; `None` past the next epoch's
    /// rows or the last epoch.
    fn window_after(
        &mut self,
        job: &EpochJob,
        (epoch, index): WindowKey,
    ) -> Result<Option<(WindowKey, Arc<RankPlan>)>> {
        let following = |job: &EpochJob| {
            let next = index + 1;
            (job.plan.window_bounds(next).start < job.end)
                .then(|| ((job.epoch, next), Arc::clone(&job.plan)))
        };
        if epoch != job.epoch {
            let after = self.feed.jobs.front().filter(|next| next.epoch == epoch);
            return Ok(after.and_then(following));
        }
        if let Some(found) = following(job) {
            return Ok(Some(found));
        }
        if self.feed.jobs.is_empty() && !self.feed.advance()? {
            return Ok(None);
        }
        Ok(self
            .feed
            .jobs
            .front()
            .filter(|next| next.epoch == job.epoch + 1 && next.start < next.end)
            .map(|next| {
                let first = next.start / next.plan.window();
                ((next.epoch, first), Arc::clone(&next.plan))
            }))
    }

    /// Makes `window` the shuffle window `index` of `job`: the one gathered ahead for it, or
    /// one gathered here; leaves `None` there once stopped. Either way, the windows after it
    /// are handed to the workers first, so they gather while this thread waits for `index`
    /// or for room in the queue.
    fn load_window(
        &mut self,
        window: &mut Option<(u64, Window)>,
        job: &EpochJob,
        index: u64,
    ) -> Result<()> {
        if window.as_ref().is_some_and(|(i, _)| *i == index) {
            return Ok(());
        }
        *window = None;
        if let Some((ahead, pending)) = self.ahead.pop_front() {
            if ahead != (job.epoch, index) {
                return Err(Error::Internal(format!(
                    "shuffle window {index} of epoch {} was asked for while window {} of \
                     epoch {} was gathered ahead",
                    job.epoch, ahead.1, ahead.0
                )));
            }
            self.gather_ahead(job, index)?;
            let work = &self.work;
            *window = pending.wait(POLL, || work.stopped())?.map(|w| (index, w));
            return Ok(());
        }
        let bounds = job.plan.window_bounds(index);
        let Some(segments) = self.take_rows((bounds.end - bounds.start) as usize)? else {
            return Ok(());
        };
        self.gather_ahead(job, index)?;
        let permutation = job.plan.window_permutation(index);
        let context = &self.context;
        context
            .windows_gathered_inline
            .fetch_add(1, Ordering::Relaxed);
        let gathered = Window::new(
            &segments,
            &permutation,
            &context.groups,
            &self.pool,
            context.assemble_threads,
        );
        context.copied(gathered.bytes_written());
        *window = Some((index, gathered));
        Ok(())
    }

    fn send(&self, item: Item) -> bool {
        !self.work.stopped() && self.out.push(item, POLL).is_ok()
    }

    /// Queues pieces for the decoders up to the lookahead.
    fn top_up(&mut self) -> Result<()> {
        let mut queued = Vec::new();
        while self.issued + (queued.len() as u64) < self.consumed + self.lookahead {
            match self.feed.pieces.pop_front() {
                Some(piece) => queued.push(piece),
                None => {
                    if self.feed.jobs.len() >= 2 || !self.feed.advance()? {
                        break;
                    }
                }
            }
        }
        if !queued.is_empty() {
            let mut state = self.work.lock();
            for piece in queued {
                state.queue.push_back((self.issued, piece));
                self.issued += 1;
            }
            drop(state);
            self.work.work_ready.notify_all();
        }
        Ok(())
    }

    /// The next `n` rows of the stream, as segments; `None` once stopped.
    fn take_rows(&mut self, mut n: usize) -> Result<Option<Vec<Segment>>> {
        let mut segments = Vec::new();
        while n > 0 {
            let Some(front) = self.stream.front() else {
                self.top_up()?;
                if self.consumed >= self.issued {
                    return Err(Error::Internal(
                        "the plan asked for more rows than it scheduled".into(),
                    ));
                }
                let Some(result) = self.work.result(self.consumed) else {
                    return Ok(None);
                };
                self.consumed += 1;
                self.stream.extend(result?);
                self.stream_row = 0;
                self.top_up()?;
                continue;
            };
            let take = n.min(front.rows - self.stream_row);
            segments.push(Segment {
                chunk: Arc::clone(front),
                start: self.stream_row,
                len: take,
            });
            n -= take;
            self.stream_row += take;
            if self.stream_row == front.rows {
                self.stream.pop_front();
                self.stream_row = 0;
            }
        }
        Ok(Some(segments))
    }
}

/// The running threads of a loader, from one position on. Dropping it stops them.
#[derive(Debug)]
pub struct Pipeline {
    out: Arc<Queue<Item>>,
    work: Arc<Work>,
    threads: Vec<JoinHandle<()>>,
}

impl Pipeline {
    /// Starts `decoders` decode threads and the assembler at `position`, keeping up to
    /// `prefetch` batches ready beyond those of the shuffle window gathered last.
    ///
    /// A window's batches are views of its buffers, so queueing all of them costs no memory,
    /// and it lets the assembler gather the next window while the caller takes them (with
    /// room for `prefetch` only, it waited for the caller after two batches, and the caller
    /// then waited for the whole next window).
    pub fn start(
        context: Arc<Context>,
        position: Position,
        prefetch: usize,
        decoders: usize,
    ) -> Result<Pipeline> {
        let config = &context.config;
        let per_window = config.window.max(1).div_ceil(config.batch_size.max(1));
        let per_window = usize::try_from(per_window).unwrap_or(usize::MAX);
        let queued = prefetch.saturating_add(per_window.min(MAX_QUEUED_WINDOW_BATCHES));
        let out = Arc::new(Queue::new(queued));
        let row_bytes: usize = context.specs.iter().map(ColumnSpec::row_bytes).sum();
        let window_bytes = usize::try_from(config.window)
            .unwrap_or(usize::MAX)
            .saturating_mul(row_bytes)
            .max(1);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        // One gather thread per decode thread (the loader's thread budget), at most one per CPU.
        let gatherers = decoders.clamp(1, cpus);
        let ahead_depth = (AHEAD_BYTES / window_bytes).min(WINDOWS_AHEAD_PER_THREAD * gatherers);
        // Windows alive at once: those ahead, the current one, the queued batches' and the
        // caller's; the pool keeps that many, so no epoch after the first allocates.
        let windows_alive = ahead_depth + queued.div_ceil(per_window.max(1)) + 2;
        let work = Arc::new(Work::default());
        let mut pipeline = Pipeline {
            out: Arc::clone(&out),
            work: Arc::clone(&work),
            threads: Vec::new(),
        };
        for i in 0..decoders.max(1) {
            let work = Arc::clone(&work);
            let context = Arc::clone(&context);
            pipeline.spawn(format!("kolo-decode-{i}"), move || {
                work.run_worker(&context)
            })?;
        }
        let assembler = Assembler {
            feed: Feed {
                context: Arc::clone(&context),
                next: Some(position),
                pieces: VecDeque::new(),
                jobs: VecDeque::new(),
            },
            context,
            work,
            out,
            issued: 0,
            consumed: 0,
            lookahead: (2 * decoders.max(1) + 1) as u64,
            stream: VecDeque::new(),
            stream_row: 0,
            pool: Arc::new(BufferPool::new(windows_alive)),
            ahead: VecDeque::new(),
            workers: Workers::start("kolo-gather", gatherers.min(ahead_depth))?,
            ahead_depth,
        };
        pipeline.spawn("kolo-assemble".into(), move || assembler.run())?;
        Ok(pipeline)
    }

    fn spawn(&mut self, name: String, body: impl FnOnce() + Send + 'static) -> Result<()> {
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(body)
            .map_err(Error::LoaderThread)?;
        self.threads.push(handle);
        Ok(())
    }

    /// The next item, waiting at most `timeout`.
    pub fn pop(&self, timeout: Duration) -> Pop<Item> {
        self.out.pop(timeout)
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.work.stop();
        self.out.close();
        let deadline = Instant::now() + JOIN_TIMEOUT;
        for handle in self.threads.drain(..) {
            while !handle.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            if handle.is_finished() {
                let _ = handle.join();
            } else {
                log::warn!(
                    "loader thread {:?} did not stop within {JOIN_TIMEOUT:?}; leaving it to end \
                     after its current read",
                    handle.thread().name()
                );
            }
        }
    }
}
