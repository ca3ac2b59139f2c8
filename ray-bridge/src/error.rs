//! The crate's one error type.

/// Everything that can go wrong while planning a Ray placement.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument of `RayExecutor` is invalid (Horovod raises `ValueError` for these); the
    /// message says which and how to fix it.
    #[error("{0}")]
    InvalidArgument(String),

    /// This is a bug in kolo; please report it.
    #[error("internal error (this is a bug in kolo, please report it): {0}")]
    Internal(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
