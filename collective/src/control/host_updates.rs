//! Host updates of an elastic job (Horovod's `HostsUpdated(timestamp, HostUpdateResult)`): the
//! driver's bounded log of them, and a worker's bounded queue of the ones it received.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// The most updates the driver's log and a worker's queue hold; older ones are merged (so
/// nothing a peer drives grows without bound).
pub const MAX_HOST_UPDATES: usize = 1024;

/// Horovod's `HostUpdateResult` flag: no update.
pub const NO_UPDATE: u32 = 0;
/// Horovod's `HostUpdateResult` flag: hosts (tasks) were removed.
pub const REMOVED: u32 = 1;
/// Horovod's `HostUpdateResult` flag: hosts (tasks) were added.
pub const ADDED: u32 = 2;
/// Horovod's `HostUpdateResult`: both (`removed | added`).
pub const MIXED: u32 = REMOVED | ADDED;

/// One host update: when the driver recorded it (seconds since the Unix epoch) and what changed
/// (a `HostUpdateResult` value: [`REMOVED`], [`ADDED`] or [`MIXED`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostUpdate {
    /// Seconds since the Unix epoch.
    pub timestamp: f64,
    /// The `HostUpdateResult` flags.
    pub result: u32,
}

impl HostUpdate {
    /// An update of `result` stamped now.
    pub fn now(result: u32) -> Self {
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|since| since.as_secs_f64())
            .unwrap_or(0.0);
        Self { timestamp, result }
    }

    fn merge(self, newer: HostUpdate) -> HostUpdate {
        HostUpdate {
            timestamp: self.timestamp.max(newer.timestamp),
            result: self.result | newer.result,
        }
    }
}

/// A bounded FIFO of updates: past [`MAX_HOST_UPDATES`], the two oldest merge into one (the
/// later timestamp, the union of the flags), so a reader still learns that something changed.
#[derive(Debug, Default, Clone)]
pub struct HostUpdateQueue {
    updates: VecDeque<HostUpdate>,
}

impl HostUpdateQueue {
    /// Appends `update`, merging the oldest two when full.
    pub fn push(&mut self, update: HostUpdate) {
        if self.updates.len() >= MAX_HOST_UPDATES {
            if let (Some(first), Some(second)) =
                (self.updates.pop_front(), self.updates.pop_front())
            {
                self.updates.push_front(first.merge(second));
            }
        }
        self.updates.push_back(update);
    }

    /// Takes every queued update, oldest first.
    pub fn drain(&mut self) -> Vec<HostUpdate> {
        self.updates.drain(..).collect()
    }

    /// How many updates are queued.
    pub fn len(&self) -> usize {
        self.updates.len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.updates.is_empty()
    }
}

/// What this process knows of host updates, as timestamps (seconds since the Unix epoch, 0 for
/// none): the newest removal, the newest addition, and the newest update its elastic state
/// handled. Rank 0 sends its copy in every engine cycle message, so the ranks agree on whether a
/// commit must raise `HostsUpdatedInterrupt` without a collective of their own
/// (see `crate::engine::host_news`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostNews {
    /// When hosts were last removed.
    pub removed: f64,
    /// When hosts were last added.
    pub added: f64,
    /// The newest update the elastic state already handled.
    pub handled: f64,
}

impl HostNews {
    /// The newest update of either kind.
    pub fn newest(&self) -> f64 {
        self.removed.max(self.added)
    }

    /// Takes `update` in (only newer timestamps move a field).
    pub fn record(&mut self, update: HostUpdate) {
        if update.result & REMOVED != 0 {
            self.removed = self.removed.max(update.timestamp);
        }
        if update.result & ADDED != 0 {
            self.added = self.added.max(update.timestamp);
        }
    }

    /// Marks every update up to `timestamp` handled.
    pub fn mark_handled(&mut self, timestamp: f64) {
        self.handled = self.handled.max(timestamp);
    }
}

/// The process's [`HostNews`], written by the driver client as notices arrive and by the elastic
/// state, read by the engine at every cycle.
pub fn process_news() -> &'static Mutex<HostNews> {
    static NEWS: OnceLock<Mutex<HostNews>> = OnceLock::new();
    NEWS.get_or_init(Mutex::default)
}

/// Records `update` in [`process_news`].
pub fn record_news(update: HostUpdate) {
    process_news()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .record(update);
}

/// A copy of [`process_news`].
pub fn news_snapshot() -> HostNews {
    *process_news().lock().unwrap_or_else(|p| p.into_inner())
}

/// Marks everything this process heard of so far handled: a new round of the job already
/// includes those changes (Horovod drops the queued notices at a reset too).
pub fn mark_all_news_handled() {
    let mut news = process_news().lock().unwrap_or_else(|p| p.into_inner());
    let newest = news.newest();
    news.mark_handled(newest);
}

/// The driver's log: updates numbered in order, the newest [`MAX_HOST_UPDATES`] kept (a watcher
/// whose cursor fell behind gets the oldest kept ones, merged into one).
#[derive(Debug, Default)]
pub(crate) struct HostUpdateLog {
    /// `(sequence number, update)`, oldest first.
    entries: VecDeque<(u64, HostUpdate)>,
    next: u64,
}

impl HostUpdateLog {
    /// Records `update`; returns its sequence number.
    pub(crate) fn record(&mut self, update: HostUpdate) -> u64 {
        if self.entries.len() >= MAX_HOST_UPDATES {
            self.entries.pop_front();
        }
        let seq = self.next;
        self.entries.push_back((seq, update));
        self.next += 1;
        seq
    }

    /// The sequence number the next update will get.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next
    }

    /// The updates numbered `from` or later (at most [`MAX_HOST_UPDATES`]; when some between
    /// `from` and the oldest kept were dropped, the oldest kept carries their flags too), and
    /// the cursor after them.
    pub(crate) fn since(&self, from: u64) -> (Vec<HostUpdate>, u64) {
        let mut out: Vec<HostUpdate> = self
            .entries
            .iter()
            .filter(|(seq, _)| *seq >= from)
            .map(|(_, update)| *update)
            .collect();
        let lost = self
            .entries
            .front()
            .is_some_and(|(oldest, _)| *oldest > from);
        if lost {
            if let Some(first) = out.first_mut() {
                first.result = MIXED;
            }
        }
        (out, self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_bounded_and_merges_the_oldest() {
        let mut queue = HostUpdateQueue::default();
        queue.push(HostUpdate {
            timestamp: 1.0,
            result: REMOVED,
        });
        queue.push(HostUpdate {
            timestamp: 2.0,
            result: ADDED,
        });
        for i in 0..(MAX_HOST_UPDATES + 10) {
            queue.push(HostUpdate {
                timestamp: 10.0 + i as f64,
                result: ADDED,
            });
        }
        assert_eq!(queue.len(), MAX_HOST_UPDATES);
        let drained = queue.drain();
        assert!(queue.is_empty());
        assert_eq!(
            drained[0].result, MIXED,
            "the early removal survives the merge"
        );
        let last = drained.last().unwrap();
        assert_eq!(last.timestamp, 10.0 + (MAX_HOST_UPDATES + 9) as f64);
    }

    #[test]
    fn the_log_hands_out_updates_after_a_cursor_and_stays_bounded() {
        let mut log = HostUpdateLog::default();
        let first = log.record(HostUpdate::now(REMOVED));
        log.record(HostUpdate::now(ADDED));
        let (updates, cursor) = log.since(first + 1);
        assert_eq!(updates.len(), 1);
        assert_eq!(updates[0].result, ADDED);
        assert_eq!(cursor, 2);
        assert!(log.since(cursor).0.is_empty());
        for _ in 0..(2 * MAX_HOST_UPDATES) {
            log.record(HostUpdate::now(ADDED));
        }
        let (updates, _) = log.since(0);
        assert_eq!(updates.len(), MAX_HOST_UPDATES);
        assert_eq!(
            updates[0].result, MIXED,
            "dropped removals are not forgotten"
        );
    }
}
