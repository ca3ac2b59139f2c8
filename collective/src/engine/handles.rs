//! Handles: the caller's side of a submitted op, completed by the engine thread.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::request::Output;
use crate::error::{Error, Result};

#[derive(Debug)]
enum Slot {
    Pending {
        set: u32,
        name: String,
        region: Option<Region>,
    },
    Done(Result<Output>),
}

/// The memory a pending op works on: bytes `start..end` of the caller's address space (a
/// device address for CUDA tensors), and whether the op writes there (allreduce, broadcast).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    pub start: u64,
    pub end: u64,
    pub writes: bool,
}

impl Region {
    /// True when two ops on `self` and `other` at once would race: the ranges overlap and at
    /// least one of them writes.
    fn conflicts(&self, other: &Region) -> bool {
        (self.writes || other.writes) && self.start < other.end && other.start < self.end
    }
}

/// The last handle number given out in this process. Numbers are unique across engines, so a
/// handle kept from before a `shutdown()` never names an op of the engine a later `init()`
/// started.
static LAST_HANDLE: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Default)]
struct Table {
    slots: HashMap<u64, Slot>,
    /// (process set, name) of every pending op: a name may be outstanding once per set.
    outstanding: HashSet<(u32, String)>,
    /// Counts finished cycles (see [`Handles::wait_for_cycle_end`]).
    cycles_ended: u64,
    /// How many slots are pending.
    pending: usize,
}

/// Every handle of the process.
#[derive(Debug, Default)]
pub(crate) struct Handles {
    table: Mutex<Table>,
    done: Condvar,
}

impl Handles {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new pending handle for `name` in `set` working on `region`, or an error when that name
    /// is already outstanding there (Horovod's rule: "a tensor with the same name was already
    /// submitted"), or when a pending op works on memory overlapping `region` and either of
    /// them writes it (the engine would alias it mutably).
    pub(crate) fn open(&self, set: u32, name: &str, region: Option<Region>) -> Result<u64> {
        let mut table = self.lock();
        if let Some(region) = region.filter(|r| r.start < r.end) {
            let busy = table.slots.values().any(|slot| {
                matches!(slot, Slot::Pending { region: Some(other), .. } if region.conflicts(other))
            });
            if busy {
                return Err(Error::InvalidArgument(format!(
                    "the tensor of '{name}' (bytes {:#x}..{:#x}) overlaps the memory of a collective still in \
                     progress on this rank, and one of them writes it; synchronize the first one before \
                     submitting the same tensor again, or pass a copy",
                    region.start, region.end
                )));
            }
        }
        if !name.is_empty() && !table.outstanding.insert((set, name.to_owned())) {
            return Err(Error::InvalidArgument(format!(
                "a collective named '{name}' is already in progress on this rank (process set {set}); every \
                 outstanding op needs its own name — synchronize the first one or pick another name"
            )));
        }
        let id = LAST_HANDLE.fetch_add(1, Ordering::Relaxed) + 1;
        table.pending += 1;
        table.slots.insert(
            id,
            Slot::Pending {
                set,
                name: name.to_owned(),
                region,
            },
        );
        Ok(id)
    }

    /// Completes handle `id` (no-op when it is unknown or already complete).
    pub(crate) fn complete(&self, id: u64, result: Result<Output>) {
        let mut table = self.lock();
        // A done slot keeps its first result (removing it first would lose that result).
        if !matches!(table.slots.get(&id), Some(Slot::Pending { .. })) {
            return;
        }
        if let Some(Slot::Pending { set, name, .. }) = table.slots.insert(id, Slot::Done(result)) {
            table.outstanding.remove(&(set, name));
            table.pending -= 1;
            drop(table);
            self.done.notify_all();
        }
    }

    /// Forgets pending handle `id`, opened for an op that was then never submitted.
    pub(crate) fn discard(&self, id: u64) {
        let mut table = self.lock();
        if let Some(Slot::Pending { set, name, .. }) = table.slots.remove(&id) {
            table.outstanding.remove(&(set, name));
            table.pending -= 1;
        }
    }

    /// Fails every pending handle with a replica of `error`.
    pub(crate) fn fail_all(&self, error: &Error) {
        let mut table = self.lock();
        let pending: Vec<u64> = table
            .slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Pending { .. }))
            .map(|(id, _)| *id)
            .collect();
        for id in pending {
            table.slots.insert(id, Slot::Done(Err(error.replicate())));
        }
        table.outstanding.clear();
        table.pending = 0;
        drop(table);
        self.done.notify_all();
    }

    /// Whether any op of this process (or its join) still waits for its result.
    pub(crate) fn any_pending(&self) -> bool {
        self.lock().pending > 0
    }

    /// Records that a cycle ended and wakes the callers waiting for that.
    pub(crate) fn cycle_ended(&self) {
        self.lock().cycles_ended += 1;
        self.done.notify_all();
    }

    /// How many cycles ended so far.
    pub(crate) fn cycles_ended(&self) -> u64 {
        self.lock().cycles_ended
    }

    /// Waits up to `timeout` until more than `seen` cycles ended or handle `id` completed.
    pub(crate) fn wait_for_cycle_end(&self, id: u64, seen: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut table = self.lock();
        while table.cycles_ended == seen
            && matches!(table.slots.get(&id), Some(Slot::Pending { .. }))
        {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            table = self
                .done
                .wait_timeout(table, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// True once `id` completed; an error for an unknown handle.
    pub(crate) fn poll(&self, id: u64) -> Result<bool> {
        match self.lock().slots.get(&id) {
            Some(Slot::Done(_)) => Ok(true),
            Some(Slot::Pending { .. }) => Ok(false),
            None => Err(unknown(id)),
        }
    }

    /// Waits up to `timeout` for `id`; its result (consuming the handle), or `None` if it is
    /// still pending.
    pub(crate) fn wait(&self, id: u64, timeout: Duration) -> Option<Result<Output>> {
        let deadline = Instant::now() + timeout;
        let mut table = self.lock();
        loop {
            match table.slots.get(&id) {
                Some(Slot::Done(_)) => match table.slots.remove(&id) {
                    Some(Slot::Done(result)) => return Some(result),
                    _ => unreachable!("the slot was just seen done"),
                },
                Some(Slot::Pending { .. }) => {}
                None => return Some(Err(unknown(id))),
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            table = self
                .done
                .wait_timeout(table, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn unknown(id: u64) -> Error {
    Error::InvalidArgument(format!(
        "handle {id} is unknown or was already synchronized; each handle can be synchronized once"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Handles {
        fn open_named(&self, set: u32, name: &str) -> Result<u64> {
            self.open(set, name, None)
        }
    }

    #[test]
    fn overlapping_memory_is_refused_while_one_op_writes_it() {
        let h = Handles::default();
        let region = |start, end, writes| Some(Region { start, end, writes });
        let a = h.open(0, "a", region(100, 200, true)).unwrap();
        for (start, end, writes) in [(150, 160, false), (199, 300, true), (0, 101, false)] {
            assert!(
                matches!(h.open(0, "b", region(start, end, writes)), Err(Error::InvalidArgument(m)) if m.contains("overlaps")),
                "{start}..{end}"
            );
        }
        // Adjacent memory, and a second reader of read-only memory, are fine.
        h.open(0, "c", region(200, 300, true)).unwrap();
        let d = h.open(0, "d", region(400, 500, false)).unwrap();
        h.open(0, "e", region(450, 460, false)).unwrap();
        assert!(h.open(0, "f", region(450, 460, true)).is_err());
        // Once the writer completed, its memory is free again.
        h.complete(a, Ok(Output::Done));
        h.open(0, "g", region(100, 200, true)).unwrap();
        h.complete(d, Ok(Output::Done));
        h.open(0, "h", region(0, 0, true)).unwrap();
    }

    #[test]
    fn a_name_is_outstanding_once_per_set() {
        let h = Handles::default();
        let a = h.open_named(0, "x").unwrap();
        assert!(
            matches!(h.open_named(0, "x"), Err(Error::InvalidArgument(m)) if m.contains("'x'"))
        );
        let b = h.open_named(1, "x").unwrap();
        assert!(!h.poll(a).unwrap());
        h.complete(a, Ok(Output::Done));
        assert!(h.poll(a).unwrap());
        h.open_named(0, "x").unwrap();
        assert_eq!(h.wait(a, Duration::ZERO).unwrap().unwrap(), Output::Done);
        assert!(h.poll(a).is_err(), "a handle is consumed by wait");
        assert!(h.wait(b, Duration::from_millis(1)).is_none());
        h.fail_all(&Error::Closed("gone".into()));
        assert!(matches!(h.wait(b, Duration::ZERO), Some(Err(Error::Closed(m))) if m == "gone"));
    }

    #[test]
    fn any_pending_counts_ops_until_completed_or_failed() {
        let h = Handles::default();
        assert!(!h.any_pending());
        let a = h.open_named(0, "a").unwrap();
        let join = h.open(0, "", None).unwrap();
        assert!(h.any_pending());
        h.complete(a, Ok(Output::Done));
        // A second completion changes nothing (and keeps the first result).
        h.complete(a, Err(Error::Closed("late".into())));
        assert!(h.any_pending(), "the join still waits");
        h.complete(join, Ok(Output::LastJoined(0)));
        assert!(!h.any_pending());
        // A done but unconsumed result is not pending; a consumed one neither.
        assert_eq!(h.wait(a, Duration::ZERO).unwrap().unwrap(), Output::Done);
        assert!(!h.any_pending());
        h.open_named(0, "b").unwrap();
        h.open_named(0, "c").unwrap();
        h.fail_all(&Error::Closed("gone".into()));
        assert!(!h.any_pending());
        // A discarded handle (held, never submitted) is not pending, and its name is free.
        let held = h.open_named(0, "d").unwrap();
        h.discard(held);
        assert!(!h.any_pending());
        h.open_named(0, "d").unwrap();
    }

    #[test]
    fn handle_numbers_are_unique_across_tables() {
        let first = Handles::default().open_named(0, "x").unwrap();
        let later = Handles::default();
        let second = later.open_named(0, "x").unwrap();
        assert_ne!(first, second);
        assert!(
            later.poll(first).is_err(),
            "an earlier engine's handle is unknown here"
        );
    }
}
