//! The crate's one error type.

use std::time::Duration;

use crate::abort::AbortCause;

/// Everything that can go wrong in the runtime, the driver service and the launcher.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting (environment variable, launcher flag, argument) is invalid; the message names
    /// the setting and how to fix it.
    #[error("{0}")]
    Config(String),

    /// An argument of a collective call is invalid (wrong buffer size, unsupported op for the
    /// dtype, root rank out of range, ...).
    #[error("{0}")]
    InvalidArgument(String),

    /// Joining the job failed: registration refused, not everyone registered in time, the
    /// driver could not be reached.
    #[error("{0}")]
    Rendezvous(String),

    /// A bounded wait ran out.
    #[error("timed out after {after:?} while {what}")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long it waited.
        after: Duration,
    },

    /// Ranks called different collectives (shape, dtype, op, root, name) at the same point.
    #[error("{0}")]
    Mismatch(String),

    /// The job was aborted because a rank failed; carries the cause the driver broadcast.
    #[error("{0}")]
    Aborted(AbortCause),

    /// Elastic jobs: the membership of this worker's round changed (a task failed or was
    /// removed) and the round is over; carries the driver's cause. Not an abort: the worker
    /// calls `shutdown()` and `init()` (as `hvd.elastic.run` does) to join the next round.
    #[error("{}", membership_changed(.0))]
    MembershipChanged(AbortCause),

    /// The connection to a peer rank broke or misbehaved in the middle of a collective.
    #[error("connection to rank {rank} failed during {during}: {source}")]
    Peer {
        /// The peer rank.
        rank: usize,
        /// The operation in progress.
        during: String,
        /// The I/O or protocol error.
        #[source]
        source: std::io::Error,
    },

    /// The communicator cannot run collectives any more: it was shut down, or an earlier failure
    /// (a broken peer connection, a timeout, an abort) left the data plane unusable. The message
    /// says which; the job has to be restarted.
    #[error("{0}")]
    Closed(String),

    /// Starting or supervising the ranks of a job (kolorun) failed.
    #[error("{0}")]
    Launch(String),

    /// A `--host-discovery-script` run gave no usable host list: it could not start, failed,
    /// ran past its time limit, printed too much, or printed a line that is not `host` or
    /// `host:slots`. Names the script and what to fix.
    #[error("kolorun: --host-discovery-script {script}: {problem}")]
    HostDiscovery {
        /// The script as given.
        script: String,
        /// What went wrong.
        problem: crate::launcher::discovery::DiscoveryProblem,
    },

    /// An I/O error outside a peer connection.
    #[error(transparent)]
    Io(#[from] std::io::Error),

    /// The process-global runtime cannot run: the process was forked after it started, or it
    /// could not be built.
    #[error(transparent)]
    Runtime(#[from] kolo_runtime::Error),

    /// The gRPC transport to the driver failed.
    #[error("driver connection failed: {0}")]
    Transport(#[from] tonic::transport::Error),

    /// The driver answered a call with an error status.
    #[error("driver refused the call: {}", .0.message())]
    Status(#[from] tonic::Status),

    /// A CUDA, NCCL or NVRTC call failed, or a library it needs could not be loaded; the
    /// message names the call (or library) and what to check.
    #[error("{0}")]
    Cuda(String),

    /// A shared-memory segment cannot be used safely: its directory lacks the space it needs,
    /// or a file already at its path is not this job's (another user's, a symlink, wrong
    /// mode). The message names the path or the sizes and how to fix it.
    #[error("{0}")]
    SharedMemory(String),

    /// This is a bug in kolo; please report it.
    #[error("internal error (this is a bug in kolo, please report it): {0}")]
    Internal(String),
}

fn membership_changed(cause: &AbortCause) -> String {
    let who = match (cause.rank, cause.host.is_empty()) {
        (Some(rank), false) => format!("rank {rank} on host {}: ", cause.host),
        (Some(rank), true) => format!("rank {rank}: "),
        (None, false) => format!("host {}: ", cause.host),
        (None, true) => String::new(),
    };
    format!(
        "the elastic job's membership changed ({who}{}); this round is over: call shutdown() and \
         init() (hvd.elastic.run does) to continue with the remaining workers",
        cause.message
    )
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An equal error for another waiter: the same variant and message (I/O sources are
    /// rebuilt from their kind and text). The engine fails every op of a batch with it.
    pub fn replicate(&self) -> Error {
        let io = |e: &std::io::Error| std::io::Error::new(e.kind(), e.to_string());
        match self {
            Error::Config(m) => Error::Config(m.clone()),
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::Rendezvous(m) => Error::Rendezvous(m.clone()),
            Error::Timeout { what, after } => Error::Timeout {
                what: what.clone(),
                after: *after,
            },
            Error::Mismatch(m) => Error::Mismatch(m.clone()),
            Error::Aborted(cause) => Error::Aborted(cause.clone()),
            Error::MembershipChanged(cause) => Error::MembershipChanged(cause.clone()),
            Error::Peer {
                rank,
                during,
                source,
            } => Error::Peer {
                rank: *rank,
                during: during.clone(),
                source: io(source),
            },
            Error::Closed(m) => Error::Closed(m.clone()),
            Error::Launch(m) => Error::Launch(m.clone()),
            Error::HostDiscovery { script, problem } => Error::HostDiscovery {
                script: script.clone(),
                problem: problem.clone(),
            },
            Error::Io(e) => Error::Io(io(e)),
            Error::Runtime(kolo_runtime::Error::Forked) => {
                Error::Runtime(kolo_runtime::Error::Forked)
            }
            Error::Runtime(kolo_runtime::Error::Build(e)) => {
                Error::Runtime(kolo_runtime::Error::Build(io(e)))
            }
            Error::Transport(e) => Error::Rendezvous(format!("driver connection failed: {e}")),
            Error::Status(status) => Error::Status(status.clone()),
            Error::Cuda(m) => Error::Cuda(m.clone()),
            Error::SharedMemory(m) => Error::SharedMemory(m.clone()),
            Error::Internal(m) => Error::Internal(m.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_error_replicates_with_its_variant_and_message() {
        let forked = Error::from(kolo_runtime::Error::Forked);
        let copy = forked.replicate();
        assert!(matches!(copy, Error::Runtime(kolo_runtime::Error::Forked)));
        assert_eq!(copy.to_string(), forked.to_string());
        assert!(copy.to_string().contains("'spawn' method"));

        let build = Error::from(kolo_runtime::Error::from(std::io::Error::other(
            "no threads",
        )));
        let copy = build.replicate();
        assert!(matches!(
            copy,
            Error::Runtime(kolo_runtime::Error::Build(_))
        ));
        assert_eq!(copy.to_string(), "no threads");
    }
}
