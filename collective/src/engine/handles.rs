//! Handles: the caller's side of a submitted op, completed by the engine thread.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::request::Output;
use crate::error::{Error, Result};

#[derive(Debug)]
enum Slot {
    Pending { set: u32, name: String },
    Done(Result<Output>),
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

    /// A new pending handle for `name` in `set`, or an error when that name is already
    /// outstanding there.
    pub(crate) fn open(&self, set: u32, name: &str) -> Result<u64> {
        let mut table = self.lock();
        if !name.is_empty() && !table.outstanding.insert((set, name.to_owned())) {
            return Err(Error::InvalidArgument(format!(
                "a collective named '{name}' is already in progress on this rank (process set {set}); every \
                 outstanding op needs its own name — synchronize the first one or pick another name"
            )));
        }
        let id = LAST_HANDLE.fetch_add(1, Ordering::Relaxed) + 1;
        table.slots.insert(
            id,
            Slot::Pending {
                set,
                name: name.to_owned(),
            },
        );
        Ok(id)
    }

    /// Completes handle `id` (no-op when it is unknown or already complete).
    pub(crate) fn complete(&self, id: u64, result: Result<Output>) {
        let mut table = self.lock();
        if let Some(Slot::Pending { set, name }) = table.slots.remove(&id) {
            table.outstanding.remove(&(set, name));
            table.slots.insert(id, Slot::Done(result));
            drop(table);
            self.done.notify_all();
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
        drop(table);
        self.done.notify_all();
    }

    /// True once `id` completed; an error for an unknown handle.
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

    #[test]
    fn a_name_is_outstanding_once_per_set() {
        let h = Handles::default();
        let a = h.open(0, "x").unwrap();
        assert!(matches!(h.open(0, "x"), Err(Error::InvalidArgument(m)) if m.contains("'x'")));
        let b = h.open(1, "x").unwrap();
        assert!(!h.poll(a).unwrap());
        h.complete(a, Ok(Output::Done));
        assert!(h.poll(a).unwrap());
        h.open(0, "x").unwrap();
        assert_eq!(h.wait(a, Duration::ZERO).unwrap().unwrap(), Output::Done);
        assert!(h.poll(a).is_err(), "a handle is consumed by wait");
        assert!(h.wait(b, Duration::from_millis(1)).is_none());
        h.fail_all(&Error::Closed("gone".into()));
        assert!(matches!(h.wait(b, Duration::ZERO), Some(Err(Error::Closed(m))) if m == "gone"));
    }

    #[test]
    fn handle_numbers_are_unique_across_tables() {
        let first = Handles::default().open(0, "x").unwrap();
        let later = Handles::default();
        let second = later.open(0, "x").unwrap();
        assert_ne!(first, second);
        assert!(
            later.poll(first).is_err(),
            "an earlier engine's handle is unknown here"
        );
    }
}
