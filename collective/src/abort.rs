//! The job-wide abort flag: set once (by the driver's abort broadcast or a local failure),
//! read by every blocking wait so a failure anywhere stops every rank quickly.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Why the job was aborted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbortCause {
    /// The rank whose failure caused the abort, when known.
    pub rank: Option<u32>,
    /// The host of that rank, when known (may be empty).
    pub host: String,
    /// What happened, for people.
    pub message: String,
}

impl fmt::Display for AbortCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job aborted: ")?;
        match (self.rank, self.host.is_empty()) {
            (Some(rank), false) => write!(f, "rank {rank} on host {}: ", self.host)?,
            (Some(rank), true) => write!(f, "rank {rank}: ")?,
            (None, false) => write!(f, "host {}: ", self.host)?,
            (None, true) => {}
        }
        write!(f, "{}", self.message)
    }
}

#[derive(Debug, Default)]
struct Inner {
    flag: AtomicBool,
    cause: OnceLock<AbortCause>,
}

/// A cloneable handle on one job's abort state. The first cause set wins.
#[derive(Debug, Clone, Default)]
pub struct AbortSignal(Arc<Inner>);

impl AbortSignal {
    /// A fresh, not-aborted signal.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the job aborted with `cause` (ignored if already aborted).
    pub fn abort(&self, cause: AbortCause) {
        let _ = self.0.cause.set(cause);
        self.0.flag.store(true, Ordering::Release);
    }

    /// True once aborted. Cheap enough to call in every wait loop.
    pub fn is_aborted(&self) -> bool {
        self.0.flag.load(Ordering::Acquire)
    }

    /// The cause, once aborted.
    pub fn cause(&self) -> Option<AbortCause> {
        if self.is_aborted() {
            self.0.cause.get().cloned()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_cause_wins_and_display_names_rank_and_host() {
        let signal = AbortSignal::new();
        assert!(!signal.is_aborted());
        let clone = signal.clone();
        clone.abort(AbortCause {
            rank: Some(1),
            host: "h1".into(),
            message: "killed by signal 9 (SIGKILL)".into(),
        });
        signal.abort(AbortCause {
            rank: Some(0),
            host: "h0".into(),
            message: "later".into(),
        });
        let cause = signal.cause().expect("aborted");
        assert_eq!(cause.rank, Some(1));
        assert_eq!(
            cause.to_string(),
            "job aborted: rank 1 on host h1: killed by signal 9 (SIGKILL)"
        );
    }
}
