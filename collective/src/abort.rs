//! The job-wide abort flag: set once (by the driver's abort broadcast or a local failure),
//! read by every blocking wait so a failure anywhere stops every rank quickly.
//!
//! In an elastic job the driver does not abort the job when a task fails: it tells the
//! survivors that their round's membership changed ([`AbortSignal::interrupt`]). The signal
//! stops every wait the same way, but the error is [`crate::Error::MembershipChanged`] (a
//! recoverable `InternalError` in Python: `shutdown()` + `init()` joins the next round) instead
//! of [`crate::Error::Aborted`].

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::error::Error;

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
    /// Set with the cause when the signal is an elastic interruption, not a job abort.
    interrupted: AtomicBool,
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

    /// Stops this worker's round of an elastic job: every wait ends as for an abort, but the
    /// error is [`Error::MembershipChanged`] (the worker may `shutdown()` and `init()` into the
    /// next round). Ignored if the signal is already set (the first cause wins).
    pub fn interrupt(&self, cause: AbortCause) {
        if self.0.cause.set(cause).is_ok() {
            self.0.interrupted.store(true, Ordering::Release);
        }
        self.0.flag.store(true, Ordering::Release);
    }

    /// True when the signal was set by [`AbortSignal::interrupt`] (an elastic membership
    /// change), false when not set or set by [`AbortSignal::abort`].
    pub fn is_interrupted(&self) -> bool {
        self.is_aborted() && self.0.interrupted.load(Ordering::Acquire)
    }

    /// The error a stopped wait reports: [`Error::MembershipChanged`] after
    /// [`AbortSignal::interrupt`], [`Error::Aborted`] after [`AbortSignal::abort`]; `None`
    /// while the signal is not set.
    pub fn error(&self) -> Option<Error> {
        let cause = self.cause()?;
        Some(if self.is_interrupted() {
            Error::MembershipChanged(cause)
        } else {
            Error::Aborted(cause)
        })
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
        assert!(matches!(signal.error(), Some(Error::Aborted(_))));
    }

    #[test]
    fn an_interruption_is_a_membership_change_and_the_first_cause_still_wins() {
        let signal = AbortSignal::new();
        assert!(signal.error().is_none());
        signal.interrupt(AbortCause {
            rank: Some(2),
            host: "h2".into(),
            message: "exited with code 1".into(),
        });
        signal.abort(AbortCause {
            rank: None,
            host: String::new(),
            message: "later".into(),
        });
        assert!(signal.is_aborted() && signal.is_interrupted());
        let err = signal.error().expect("set");
        assert!(matches!(err, Error::MembershipChanged(_)), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("rank 2 on host h2: exited with code 1"),
            "{text}"
        );
        assert!(!text.contains("job aborted"), "{text}");

        let aborted = AbortSignal::new();
        aborted.abort(AbortCause {
            rank: None,
            host: String::new(),
            message: "first".into(),
        });
        aborted.interrupt(AbortCause {
            rank: None,
            host: String::new(),
            message: "second".into(),
        });
        assert!(!aborted.is_interrupted());
    }
}
