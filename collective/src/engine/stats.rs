//! The engine's counters (`kolo.engine_stats()`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Why a cycle started: a caller ran it while waiting for its handle, or the engine thread's
/// wait ended for one of these reasons (see `Shared::wait_for_next_cycle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CycleCause {
    /// A caller waiting for its handle ran it.
    Caller,
    /// The engine thread's first cycle, or one at shutdown.
    Start,
    /// Ops were submitted and the submit quiet time passed.
    Submitted,
    /// A peer started a cycle and this rank had ops waiting.
    PeerWaiting,
    /// A peer started a cycle, this rank had nothing waiting, and the join grace passed.
    PeerGrace,
    /// The cycle time after the oldest op not yet in a cycle.
    CycleTime,
    /// The stall inspector's re-check of ops negotiated earlier.
    Recheck,
}

impl CycleCause {
    /// How many causes there are (the last one's index plus one).
    const COUNT: usize = CycleCause::Recheck as usize + 1;
}

/// Counters since the engine started; read with [`Stats::snapshot`].
#[derive(Debug, Default)]
pub(crate) struct Stats {
    cycles: AtomicU64,
    tensors: AtomicU64,
    collectives: AtomicU64,
    shm_collectives: AtomicU64,
    fused_tensors: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    negotiation_ns: AtomicU64,
    /// Cycles by [`CycleCause`], in its order.
    causes: [AtomicU64; CycleCause::COUNT],
    /// Cycles in which no set decided anything (no op ran or failed, nobody joined).
    undecided: AtomicU64,
    /// Times the engine thread woke from its wait between cycles.
    wakeups: AtomicU64,
    /// Of those, the times a peer's start (its message, its phase counter) woke it.
    peer_wakeups: AtomicU64,
    /// Times the engine thread held back a start for its rank's ops while the rank computed.
    deferrals: AtomicU64,
}

impl Stats {
    pub(crate) fn cycle(&self, cause: CycleCause) {
        self.cycles.fetch_add(1, Relaxed);
        self.causes[cause as usize].fetch_add(1, Relaxed);
    }

    /// The cycle that just ran decided nothing in any set.
    pub(crate) fn undecided(&self) {
        self.undecided.fetch_add(1, Relaxed);
    }

    /// The engine thread woke; `by_peer`: a peer's start woke it.
    pub(crate) fn woke(&self, by_peer: bool) {
        self.wakeups.fetch_add(1, Relaxed);
        if by_peer {
            self.peer_wakeups.fetch_add(1, Relaxed);
        }
    }

    /// The engine thread deferred a start while its rank computed.
    pub(crate) fn deferred(&self) {
        self.deferrals.fetch_add(1, Relaxed);
    }

    /// A tensor of this rank was agreed, through the cache bits (`cached`) or in full.
    pub(crate) fn negotiated(&self, cached: bool) {
        let counter = if cached {
            &self.cache_hits
        } else {
            &self.cache_misses
        };
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn negotiation(&self, spent: Duration) {
        self.negotiation_ns
            .fetch_add(u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// One collective ran for `tensors` tensors, on a shared-memory plane when `shm`.
    pub(crate) fn ran(&self, tensors: usize, shm: bool) {
        self.collectives.fetch_add(1, Relaxed);
        if shm {
            self.shm_collectives.fetch_add(1, Relaxed);
        }
        self.tensors.fetch_add(tensors as u64, Relaxed);
        if tensors > 1 {
            self.fused_tensors.fetch_add(tensors as u64, Relaxed);
        }
    }

    /// `(name, value)` of every counter.
    pub(crate) fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let hits = self.cache_hits.load(Relaxed);
        let misses = self.cache_misses.load(Relaxed);
        vec![
            ("cycles", self.cycles.load(Relaxed)),
            ("tensors", self.tensors.load(Relaxed)),
            ("collectives", self.collectives.load(Relaxed)),
            ("shm_collectives", self.shm_collectives.load(Relaxed)),
            ("fused_tensors", self.fused_tensors.load(Relaxed)),
            ("cache_hits", hits),
            ("cache_misses", misses),
            ("negotiation_ns", self.negotiation_ns.load(Relaxed)),
            ("negotiated_tensors", hits + misses),
            ("cycles_by_caller", self.cause(CycleCause::Caller)),
            ("cycles_at_start", self.cause(CycleCause::Start)),
            ("cycles_submitted", self.cause(CycleCause::Submitted)),
            ("cycles_peer_waiting", self.cause(CycleCause::PeerWaiting)),
            ("cycles_peer_grace", self.cause(CycleCause::PeerGrace)),
            ("cycles_cycle_time", self.cause(CycleCause::CycleTime)),
            ("cycles_recheck", self.cause(CycleCause::Recheck)),
            ("cycles_undecided", self.undecided.load(Relaxed)),
            ("engine_wakeups", self.wakeups.load(Relaxed)),
            ("engine_wakeups_by_peers", self.peer_wakeups.load(Relaxed)),
            ("engine_deferrals", self.deferrals.load(Relaxed)),
        ]
    }

    fn cause(&self, cause: CycleCause) -> u64 {
        self.causes[cause as usize].load(Relaxed)
    }
}
