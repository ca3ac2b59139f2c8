//! Whether a commit must raise `HostsUpdatedInterrupt`, agreed by every rank without a
//! collective of its own.
//!
//! Horovod broadcasts rank 0's view of the host updates at every commit, because the ranks
//! receive the driver's notices at different moments. Here group rank 0 of the global process
//! set puts its [`HostNews`] in every cycle message instead, and each rank keeps the copy from
//! the latest cycle that decided one of the global set's ops. Every rank sees the same messages
//! in the same cycles, and a commit first waits until every global op this rank submitted
//! before it was decided (normally already so: the step waited for its gradients). Ranks run
//! the same ops before the same commit, so the latest such cycle is the same one on every rank,
//! and so is the answer. A commit with no global op since the previous one sees the same copy
//! again: an update that reached rank 0 meanwhile is raised at a later commit.

use crate::control::host_updates::HostNews;

/// One round's agreement state (it starts empty with each engine, that is each round).
#[derive(Debug, Default)]
pub(crate) struct Agreement {
    /// Rank 0's news in the latest cycle that decided a global op.
    agreed: HostNews,
    /// The newest update this round already raised for (the same on every rank).
    raised: f64,
}

/// What a commit raises: the newest update's timestamp, and whether the reset may skip the
/// state sync (hosts were only removed since the last handled update).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostsUpdated {
    /// The newest update's timestamp (seconds since the Unix epoch).
    pub timestamp: f64,
    /// True when no host was added since the last handled update.
    pub skip_sync: bool,
}

impl Agreement {
    /// Takes rank 0's news from a cycle that decided at least one global op.
    pub(crate) fn observe(&mut self, rank0: HostNews) {
        self.agreed = rank0;
    }

    /// The interrupt a commit raises now, if any (Horovod's rule: an update newer than the last
    /// handled one; skip the sync when all of them removed hosts). Raises once per update.
    pub(crate) fn check(&mut self) -> Option<HostsUpdated> {
        let since = self.agreed.handled.max(self.raised);
        let newest = self.agreed.newest();
        if newest <= since {
            return None;
        }
        self.raised = newest;
        Some(HostsUpdated {
            timestamp: newest,
            skip_sync: self.agreed.added <= since,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn news(removed: f64, added: f64, handled: f64) -> HostNews {
        HostNews {
            removed,
            added,
            handled,
        }
    }

    #[test]
    fn nothing_new_raises_nothing() {
        let mut agreement = Agreement::default();
        assert_eq!(agreement.check(), None);
        agreement.observe(news(5.0, 3.0, 5.0));
        assert_eq!(agreement.check(), None);
    }

    #[test]
    fn removals_alone_skip_the_sync_and_additions_do_not() {
        let mut agreement = Agreement::default();
        agreement.observe(news(10.0, 3.0, 5.0));
        let raised = agreement
            .check()
            .expect("a removal newer than the handled update");
        assert_eq!((raised.timestamp, raised.skip_sync), (10.0, true));
        let mut agreement = Agreement::default();
        agreement.observe(news(10.0, 7.0, 5.0));
        assert_eq!(agreement.check().map(|r| r.skip_sync), Some(false));
    }

    #[test]
    fn an_update_is_raised_once_even_when_the_agreed_copy_is_not_refreshed() {
        let mut agreement = Agreement::default();
        agreement.observe(news(0.0, 9.0, 1.0));
        assert!(agreement.check().is_some());
        assert_eq!(
            agreement.check(),
            None,
            "no op ran since: the same copy again"
        );
        agreement.observe(news(0.0, 9.0, 1.0));
        assert_eq!(
            agreement.check(),
            None,
            "rank 0 had not marked it handled yet"
        );
        agreement.observe(news(12.0, 9.0, 9.0));
        assert_eq!(agreement.check().map(|r| r.skip_sync), Some(true));
    }
}
