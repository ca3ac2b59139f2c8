//! The crate's one error type.

/// Everything that can go wrong on either side of a Spark launch.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control plane failed (driver unreachable, registration refused, timeouts, aborts);
    /// carries the runtime's own error.
    #[error(transparent)]
    Collective(#[from] kolo_collective::Error),

    /// The process-global runtime cannot run (the process was forked after it started, or it
    /// could not be built); carries the runtime's own error.
    #[error(transparent)]
    Runtime(#[from] kolo_runtime::Error),

    /// The task runner could not start the child process.
    #[error("cannot start the rank process {program:?} on this Spark executor: {source}")]
    Spawn {
        /// The program that failed to start (`executable` of `kolo.spark.run`).
        program: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// A process was not started the way `kolo.spark.run` starts it (a `KOLO_*` variable is
    /// missing), or an argument is out of range; the message says which and how to fix it.
    #[error("{0}")]
    InvalidArgument(String),

    /// This is a bug in kolo; please report it.
    #[error("internal error (this is a bug in kolo, please report it): {0}")]
    Internal(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
