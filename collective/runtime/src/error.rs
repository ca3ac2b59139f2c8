//! The crate's one error type.

/// Why the process-global runtime cannot run a future.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime was started before this process was forked: the child's copy has no worker
    /// threads, so it cannot be used. The message says how to start child processes instead.
    #[error(
        "kolo's runtime was started before this process was forked; a forked child cannot use \
         it. Start child processes with the 'spawn' method, or call kolo only in the child"
    )]
    Forked,

    /// The operating system refused what the runtime needs to start (threads, the I/O driver).
    #[error(transparent)]
    Build(#[from] std::io::Error),
}

/// `Result` with kolo-runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
