//! The shared-memory data plane among the ranks of one host.
//!
//! Every local rank creates one segment, `/dev/shm/kolo-<name>-<rank>` (`<name>` is derived
//! from the job secret, so nobody without it can predict or pre-create it; the directory is
//! [`SHM_DIR_ENV`] when set): a header page with
//! its phase counter (and a count of waiters sleeping on it), then two data *halves* of
//! [`half_bytes`] each. The ranks map each other's segments during init, agree over TCP
//! that all have, and unlink them at once: from then on nothing is left in `/dev/shm`
//! whatever happens to any process (the mappings die with the processes).
//!
//! Segments are created exclusively (`O_EXCL|O_NOFOLLOW`, mode 0600) and fully reserved
//! (`posix_fallocate`), and others' segments are opened without following symlinks and only
//! when owned by this user with mode 0600. A rank killed between creating and unlinking its
//! segment leaves it behind: the next setup on the host reclaims every kolo segment of this
//! user whose creator (recorded in its header, with its pid namespace, written before the
//! segment's memory is reserved) is dead.
//!
//! Collectives run as a sequence of *phases*. In phase `p` every local rank writes into its
//! own half `p % 2`, publishes `p` in its counter (a release store), waits until every other
//! rank published `p` too, then reads the others' halves `p % 2`. A rank publishes `p + 1`
//! only after it finished reading phase `p`, so a half is never overwritten (phase `p + 2`)
//! while someone still reads it: two halves make the protocol safe with a single wait per
//! phase.
//!
//! Waiting spins briefly, then yields, then sleeps on a futex on the counter (the poster wakes
//! sleepers). The engine's background thread, on a host without a spare core for it beside
//! every local rank's own, spins only a moment and does not yield: it shares a core with a rank
//! that computes, and every microsecond it spins is taken from that computation (see
//! [`spin_budget`]). Every sleep is at most [`SLEEP_SLICE`], after which the wait checks the job's
//! abort signal, the communicator's shutdown and whether the awaited peer is still alive (its
//! TCP connection, idle while shm carries the data, delivers end-of-stream when the process
//! dies or a `Fail` frame when it gives up). A peer that makes no progress for the collective
//! timeout is reported like a TCP timeout.

mod segment;
mod stores;

use std::cell::Cell;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

pub(crate) use segment::Segment;
pub(crate) use stores::{copy_into_half, publish_fence, TUNED_MIN};

use super::Failure;
use crate::control::mac::MacKey;
use crate::error::Error;

/// Environment variable: bytes of each of a segment's two data halves (default 4 MiB).
pub const SHM_HALF_BYTES: &str = "KOLO_SHM_CHUNK_BYTES";
/// Default of [`SHM_HALF_BYTES`].
pub const DEFAULT_HALF_BYTES: usize = 4 << 20;
/// Where segments live unless [`SHM_DIR_ENV`] says otherwise.
pub const SHM_DIR: &str = "/dev/shm";
/// Environment variable: the directory (a tmpfs) holding the segments.
pub const SHM_DIR_ENV: &str = "KOLO_SHM_DIR";
/// Offsets of the creator's pid and pid-namespace inode in a segment's header.
const PID_OFFSET: usize = 8;
const PIDNS_OFFSET: usize = 16;
/// A segment without a kolo header (its creator died between creating the file and writing
/// the header's few bytes, or it is not kolo's) is reclaimed once it is this old.
const HEADERLESS_AGE: Duration = Duration::from_secs(600);

/// The segment directory: [`SHM_DIR_ENV`] or [`SHM_DIR`].
pub fn dir() -> PathBuf {
    match std::env::var_os(SHM_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(SHM_DIR),
    }
}

/// The pid namespace of this process (its inode), so stale segments are only judged by
/// creators in the same namespace (a pid means nothing across namespaces).
fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// The start of a segment's header: the magic, then the creator's pid and pid namespace (which
/// [`reclaim_stale`] reads to tell whether the creator is dead).
fn creator_header() -> [u8; PIDNS_OFFSET + 8] {
    let mut header = [0u8; PIDNS_OFFSET + 8];
    header[..8].copy_from_slice(&MAGIC.to_le_bytes());
    header[PID_OFFSET..PID_OFFSET + 4].copy_from_slice(&std::process::id().to_le_bytes());
    header[PIDNS_OFFSET..].copy_from_slice(&pid_namespace().to_le_bytes());
    header
}

/// Removes the kolo segments in `dir` that belong to this user and whose creators are dead
/// (same pid namespace, pid gone), or that never got a header and are old. Returns how many.
pub(crate) fn reclaim_stale(dir: &std::path::Path) -> usize {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let ns = pid_namespace();
    let mut reclaimed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("kolo-") {
            continue;
        }
        let path = entry.path();
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        let Ok(meta) = file.metadata() else { continue };
        if segment::check_private(&path, &meta).is_err() {
            continue;
        }
        let mut header = [0u8; 24];
        let stale = match file.read_exact_at(&mut header, 0) {
            Ok(()) if u64::from_le_bytes(header[..8].try_into().unwrap()) == MAGIC => {
                let pid =
                    u32::from_le_bytes(header[PID_OFFSET..PID_OFFSET + 4].try_into().unwrap());
                let their_ns =
                    u64::from_le_bytes(header[PIDNS_OFFSET..PIDNS_OFFSET + 8].try_into().unwrap());
                their_ns == ns && !process_alive(pid)
            }
            _ => meta
                .modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > HEADERLESS_AGE),
        };
        if stale && std::fs::remove_file(&path).is_ok() {
            log::info!(
                "reclaimed the stale shared-memory segment {} of a dead kolo process",
                path.display()
            );
            reclaimed += 1;
        }
    }
    reclaimed
}

fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Offset of the data halves in a segment (the header takes the first page).
const DATA_OFFSET: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"KOLOSHM1");
const POSTED_OFFSET: usize = 64;
const WAITERS_OFFSET: usize = 128;
/// In the first local rank's header: bit `c` set when copies into halves stream in
/// collectives of size class `c` (see [`stores`]).
const STORES_OFFSET: usize = 192;
/// The longest a waiter sleeps before checking abort, shutdown and the peer's liveness.
pub(crate) const SLEEP_SLICE: Duration = Duration::from_millis(5);
/// How long a waiter spins before it yields, and yields before it sleeps.
const SPIN_FOR: Duration = Duration::from_micros(20);
const YIELD_FOR: Duration = Duration::from_micros(200);
/// How long a background waiter spins when it has no core of its own (and it never yields).
const BACKGROUND_SPIN_FOR: Duration = Duration::from_micros(2);

thread_local! {
    /// Set on the engine's background thread (see [`wait_in_background`]).
    static BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as a background waiter: it runs collectives beside its rank's
/// computation (the engine thread), not for a caller that blocks on them.
pub(crate) fn wait_in_background() {
    BACKGROUND.set(true);
}

/// How long a wait spins and then yields before it sleeps. Spinning buys a wake-up without the
/// scheduler's latency, but only a thread with a core to itself gets it for free. A background
/// thread on a host with fewer than two cores per local rank (the rank's computation and its
/// engine thread) takes the cycles it spins from a computation, its own rank's or another's:
/// with two ranks training on two cores it spun and yielded ~0.5 ms of every 60 ms step.
fn spin_budget(background: bool, cores: usize, local_ranks: usize) -> (Duration, Duration) {
    if background && no_spare_core(cores, local_ranks) {
        (BACKGROUND_SPIN_FOR, Duration::ZERO)
    } else {
        (SPIN_FOR, YIELD_FOR)
    }
}

/// Whether a host where this process may use `cores` cores, running `local_ranks` ranks, has
/// fewer than two cores per rank: no core for a rank's engine thread beside its computation.
pub(crate) fn no_spare_core(cores: usize, local_ranks: usize) -> bool {
    cores < 2 * local_ranks
}

/// The cores this process may run on (its affinity and CPU quota), at least one.
pub(crate) fn usable_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Bytes of each data half: [`SHM_HALF_BYTES`] or the default, rounded to whole pages.
pub fn half_bytes() -> Result<usize, Error> {
    let Ok(text) = std::env::var(SHM_HALF_BYTES) else {
        return Ok(DEFAULT_HALF_BYTES);
    };
    let bytes: usize = text.trim().parse().map_err(|_| {
        Error::Config(format!(
            "{SHM_HALF_BYTES}={text:?} is not a byte count; pass e.g. 4194304"
        ))
    })?;
    if !(4096..=(1 << 30)).contains(&bytes) {
        return Err(Error::Config(format!(
            "{SHM_HALF_BYTES}={bytes} is out of range; pass 4096 to 1073741824 bytes"
        )));
    }
    Ok(bytes.next_multiple_of(4096))
}

/// Where a node's segments live and what they are called: `dir`, the job's key and the
/// process set (0: the whole job's node).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SegmentNames<'a> {
    pub dir: &'a std::path::Path,
    pub key: &'a MacKey,
    pub set: u32,
}

impl SegmentNames<'_> {
    /// The segment path of global rank `rank`: its name part is derived from the job secret.
    pub(crate) fn path(&self, rank: usize) -> PathBuf {
        let hex = self.key.name(b"shared-memory segments", 32);
        match self.set {
            0 => self.dir.join(format!("kolo-{hex}-{rank}")),
            set => self.dir.join(format!("kolo-{hex}-set{set}-{rank}")),
        }
    }
}

/// The local ranks' segments, mapped, and this rank's phase counter.
#[derive(Debug)]
pub(crate) struct ShmNode {
    /// This rank's index among the local ranks.
    me: usize,
    /// Global rank of each local rank (ascending).
    members: Vec<usize>,
    /// Every local rank's segment, indexed like `members`.
    segments: Vec<Segment>,
    half: usize,
    /// The last phase this rank published (only the thread running a collective, which holds
    /// the communicator's lock, touches it).
    phase: AtomicU32,
    op_timeout: Duration,
    /// [`usable_cores`] when the node was set up.
    cores: usize,
    /// The first local rank's choice of stores into halves, per size class (unused on the
    /// others).
    stores: Mutex<[stores::StoreTuner; stores::SIZE_CLASSES]>,
    /// The way [`SHM_STORES`] forces on this rank, if any.
    forced_stores: Option<bool>,
}

/// Read access to every local rank's half of the current phase.
pub(crate) struct Halves<'a> {
    node: &'a ShmNode,
    index: usize,
}

impl Halves<'_> {
    /// The number of local ranks (of halves).
    pub(crate) fn len(&self) -> usize {
        self.node.len()
    }

    /// Local rank `j`'s half of this phase.
    pub(crate) fn get(&self, j: usize) -> &[u8] {
        // SAFETY: the half lies inside the mapping; its owner wrote it before publishing this
        // phase (acquire-loaded by the wait) and does not write it again before this rank
        // publishes the next phase.
        unsafe { std::slice::from_raw_parts(self.node.half_ptr(j, self.index), self.node.half) }
    }
}

impl ShmNode {
    /// Creates this rank's segment (named by `names`), then calls `sync` (which returns once every
    /// local rank created its own), maps the others', calls `sync` again, unlinks its own and
    /// calls `sync` a last time, so no rank returns before every segment is unlinked.
    pub(crate) fn setup(
        names: SegmentNames<'_>,
        members: Vec<usize>,
        me: usize,
        half: usize,
        op_timeout: Duration,
        mut sync: impl FnMut(u32) -> Result<(), Error>,
    ) -> Result<ShmNode, Error> {
        let len = DATA_OFFSET + 2 * half;
        let forced_stores = stores::forced_way()?;
        let mine_path = names.path(members[me]);
        if names.set == 0 {
            // Once per job start, not again for every process set's node.
            reclaim_stale(names.dir);
        }
        let mut mine = Segment::create(&mine_path, len, &creator_header())?;
        sync(0)?;
        let mut segments = Vec::with_capacity(members.len());
        for (j, &rank) in members.iter().enumerate() {
            if j == me {
                segments.push(None);
                continue;
            }
            let path = names.path(rank);
            let segment = Segment::open(&path, len)?;
            // SAFETY: the header lies in the mapping; its creator wrote it before `sync`.
            let magic = unsafe { segment.ptr().cast::<u64>().read() };
            if magic != MAGIC {
                return Err(Error::Internal(format!(
                    "shared-memory segment {} has no kolo header",
                    path.display()
                )));
            }
            segments.push(Some(segment));
        }
        sync(1)?;
        mine.unlink().map_err(|e| shm_error(&mine_path, e))?;
        // Once every rank passed this, no segment of the job is left in the directory.
        sync(2)?;
        segments[me] = Some(mine);
        let segments = segments.into_iter().flatten().collect();
        Ok(ShmNode {
            me,
            members,
            segments,
            half,
            phase: AtomicU32::new(0),
            op_timeout,
            cores: usable_cores(),
            stores: Mutex::default(),
            forced_stores,
        })
    }

    /// This rank's index among the local ranks.
    pub(crate) fn me(&self) -> usize {
        self.me
    }

    /// The number of local ranks.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// Global rank of each local rank.
    pub(crate) fn members(&self) -> &[usize] {
        &self.members
    }

    /// Bytes of one data half.
    pub(crate) fn half(&self) -> usize {
        self.half
    }

    /// Whether the copies into halves of a collective of `bytes` stream: the first local
    /// rank's choice for that size (see [`stores`]).
    pub(crate) fn streaming(&self, bytes: usize) -> bool {
        if let Some(way) = self.forced_stores {
            return way;
        }
        let mask = self.word(0, STORES_OFFSET).load(Ordering::Relaxed);
        mask & (1 << stores::size_class(bytes)) != 0
    }

    /// On the first local rank: records the work (copies and reduction, not waits) of an
    /// allreduce of `bytes` done with `streaming` stores, and publishes the way of the next
    /// one of its size.
    pub(crate) fn tune_stores(&self, streaming: bool, bytes: usize, work: Duration) {
        if self.me != 0 || bytes < TUNED_MIN || self.forced_stores.is_some() {
            return;
        }
        let class = stores::size_class(bytes);
        let mut tuners = self.stores.lock().unwrap_or_else(PoisonError::into_inner);
        let tuner = &mut tuners[class];
        tuner.record(streaming, bytes, work);
        let next = tuner.next(Instant::now());
        // Stored only when it changes: the other ranks read this line at every collective.
        let word = self.word(0, STORES_OFFSET);
        let old = word.load(Ordering::Relaxed);
        let new = old & !(1 << class) | (u32::from(next) << class);
        if new != old {
            word.store(new, Ordering::Relaxed);
        }
    }

    fn half_ptr(&self, j: usize, index: usize) -> *mut u8 {
        // SAFETY: DATA_OFFSET + 2 * half is the segment's length, so both halves are inside.
        unsafe { self.segments[j].ptr().add(DATA_OFFSET + index * self.half) }
    }

    fn word(&self, j: usize, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= self.segments[j].len());
        // SAFETY: the word is inside the mapping, 4-byte aligned (page-aligned base), and only
        // ever accessed atomically by every process.
        unsafe { AtomicU32::from_ptr(self.segments[j].ptr().add(offset).cast::<u32>()) }
    }

    /// True when local rank `j` published a phase after this rank's last one (it started a
    /// collective this rank has not joined yet).
    pub(crate) fn peer_ahead(&self) -> bool {
        let mine = self.phase.load(Ordering::Relaxed);
        (0..self.len()).filter(|&j| j != self.me).any(|j| {
            reached(
                self.word(j, POSTED_OFFSET).load(Ordering::Acquire),
                mine.wrapping_add(1),
            )
        })
    }

    /// Sleeps up to `timeout` until a peer publishes a phase past this rank's or `local`
    /// no longer holds `local_seen`. False when the kernel lacks `futex_waitv` (Linux < 5.16):
    /// then it returned at once.
    pub(crate) fn sleep_until_peer_ahead(
        &self,
        local: &AtomicU32,
        local_seen: u32,
        timeout: Duration,
    ) -> bool {
        if WAITV_MISSING.load(Ordering::Relaxed) {
            return false;
        }
        let next = self.phase.load(Ordering::Relaxed).wrapping_add(1);
        let peers: Vec<usize> = (0..self.len()).filter(|&j| j != self.me).collect();
        let mut waiters = vec![FutexWaitv::new(local, local_seen)];
        for &j in &peers {
            self.word(j, WAITERS_OFFSET).fetch_add(1, Ordering::SeqCst);
        }
        let mut ahead = false;
        for &j in &peers {
            let posted = self.word(j, POSTED_OFFSET);
            let seen = posted.load(Ordering::SeqCst);
            ahead |= reached(seen, next);
            waiters.push(FutexWaitv::new(posted, seen));
        }
        let mut supported = true;
        if !ahead {
            supported = futex_waitv(&waiters, timeout);
        }
        for &j in &peers {
            self.word(j, WAITERS_OFFSET).fetch_sub(1, Ordering::SeqCst);
        }
        if !supported {
            WAITV_MISSING.store(true, Ordering::Relaxed);
        }
        supported
    }

    /// Runs one phase: `write` fills this rank's half, then this rank waits until every
    /// other rank wrote its half too. The returned [`Halves`] show every rank's half until
    /// this rank runs its next phase. `alive(j)` is called while waiting for local rank `j`
    /// (at least every [`SLEEP_SLICE`]) and fails when the wait must stop.
    pub(crate) fn phase(
        &self,
        alive: &dyn Fn(usize) -> Result<(), Failure>,
        write: impl FnOnce(&mut [u8]) -> Result<(), Error>,
    ) -> Result<Halves<'_>, Failure> {
        let phase = self.phase.load(Ordering::Relaxed).wrapping_add(1);
        let index = (phase % 2) as usize;
        {
            // SAFETY: this rank's own half of this phase: nobody reads it until this rank
            // publishes `phase`, and every reader of phase - 2 finished (it published
            // phase - 1, which this rank waited for).
            let mine =
                unsafe { std::slice::from_raw_parts_mut(self.half_ptr(self.me, index), self.half) };
            write(mine).map_err(Failure::Other)?;
        }
        stores::publish_fence();
        self.phase.store(phase, Ordering::Relaxed);
        let posted = self.word(self.me, POSTED_OFFSET);
        posted.store(phase, Ordering::SeqCst);
        if self.word(self.me, WAITERS_OFFSET).load(Ordering::SeqCst) > 0 {
            futex_wake(posted);
        }
        for j in 0..self.len() {
            if j != self.me {
                self.wait_for(j, phase, alive)?;
            }
        }
        Ok(Halves { node: self, index })
    }

    fn wait_for(
        &self,
        j: usize,
        phase: u32,
        alive: &dyn Fn(usize) -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        let posted = self.word(j, POSTED_OFFSET);
        if reached(posted.load(Ordering::Acquire), phase) {
            return Ok(());
        }
        let (spin_for, yield_for) = spin_budget(BACKGROUND.get(), self.cores, self.len());
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            for _ in 0..64 {
                if reached(posted.load(Ordering::Acquire), phase) {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
            spins += 1;
            let waited = start.elapsed();
            if waited >= spin_for {
                break;
            }
            if spins > 100_000 {
                break;
            }
        }
        while start.elapsed() < yield_for {
            if reached(posted.load(Ordering::Acquire), phase) {
                return Ok(());
            }
            std::thread::yield_now();
        }
        let waiters = self.word(j, WAITERS_OFFSET);
        let mut last_progress = Instant::now();
        loop {
            if let Err(failure) = alive(j) {
                // A peer posts before it can leave: one that posted this phase, read it and
                // then shut down (a reset's last cycle) did its part, however long this rank
                // was descheduled since it last looked.
                if reached(posted.load(Ordering::SeqCst), phase) {
                    return Ok(());
                }
                return Err(failure);
            }
            waiters.fetch_add(1, Ordering::SeqCst);
            let seen = posted.load(Ordering::SeqCst);
            if !reached(seen, phase) {
                futex_wait(posted, seen, SLEEP_SLICE);
            }
            waiters.fetch_sub(1, Ordering::SeqCst);
            let now_seen = posted.load(Ordering::Acquire);
            if reached(now_seen, phase) {
                return Ok(());
            }
            let now = Instant::now();
            if now_seen != seen {
                last_progress = now;
            } else if now.duration_since(last_progress) >= self.op_timeout {
                return Err(Failure::Timeout {
                    peers: vec![self.members[j]],
                });
            }
        }
    }
}

/// Set once `futex_waitv` turned out to be missing.
static WAITV_MISSING: AtomicBool = AtomicBool::new(false);

/// One entry of `futex_waitv(2)`'s array (`struct futex_waitv`).
#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

/// `FUTEX2_SIZE_U32`: a 32-bit futex (shared, so it matches `FUTEX_WAKE` from any process).
const FUTEX2_SIZE_U32: u32 = 0x02;

impl FutexWaitv {
    fn new(word: &AtomicU32, expected: u32) -> Self {
        FutexWaitv {
            val: u64::from(expected),
            uaddr: word.as_ptr() as u64,
            flags: FUTEX2_SIZE_U32,
            reserved: 0,
        }
    }
}

/// Sleeps until one of `waiters` is woken or no longer holds its value, or `timeout` passed;
/// false when the kernel has no `futex_waitv`.
fn futex_waitv(waiters: &[FutexWaitv], timeout: Duration) -> bool {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a live timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let nanos = now.tv_nsec as u64 + u64::from(timeout.subsec_nanos());
    let until = libc::timespec {
        tv_sec: now.tv_sec
            + timeout.as_secs() as libc::time_t
            + (nanos / 1_000_000_000) as libc::time_t,
        tv_nsec: (nanos % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `waiters` is a live array of initialized `futex_waitv` entries pointing at
    // aligned u32 words that outlive the call; `until` is a valid absolute timespec on
    // CLOCK_MONOTONIC. Spurious returns (EAGAIN, EINTR, ETIMEDOUT) are fine: callers re-check.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            waiters.as_ptr(),
            waiters.len() as libc::c_uint,
            0 as libc::c_uint,
            &until as *const libc::timespec,
            libc::CLOCK_MONOTONIC,
        )
    };
    !(rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
}

/// True when counter value `seen` is at or past `target` (wrapping).
fn reached(seen: u32, target: u32) -> bool {
    (seen.wrapping_sub(target) as i32) >= 0
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned, shared u32 with a relative timeout; spurious
    // returns (EAGAIN, EINTR, ETIMEDOUT) are fine, the caller re-checks the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every thread sleeping on `word` (in any process that maps it).
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned, shared u32; wakes every sleeper.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

fn shm_error(path: &std::path::Path, source: io::Error) -> Error {
    Error::Io(io::Error::new(
        source.kind(),
        format!(
            "shared-memory segment {}: {source} (is {SHM_DIR} mounted and large enough? set \
             KOLO_TRANSPORT=tcp to avoid shared memory)",
            path.display()
        ),
    ))
}

#[cfg(test)]
mod tests;
