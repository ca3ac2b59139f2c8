//! The engine's counters (`kolo.engine_stats()`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

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
}

impl Stats {
    pub(crate) fn cycle(&self) {
        self.cycles.fetch_add(1, Relaxed);
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
        ]
    }
}
