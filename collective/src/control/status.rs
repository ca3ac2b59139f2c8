//! The one mapping from the crate's [`Error`] to a gRPC [`Status`] at the service edge.

use tonic::Status;

use crate::error::Error;

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let message = err.to_string();
        match err {
            Error::Status(status) => status,
            Error::Config(_)
            | Error::InvalidArgument(_)
            | Error::Runtime(kolo_runtime::Error::Forked) => Status::invalid_argument(message),
            Error::Rendezvous(_) | Error::Mismatch(_) => Status::failed_precondition(message),
            Error::Timeout { .. } => Status::deadline_exceeded(message),
            Error::Aborted(_) => Status::aborted(message),
            Error::Peer { .. } | Error::Transport(_) => Status::unavailable(message),
            _ => Status::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic::Code;

    use super::*;
    use crate::abort::AbortCause;

    #[test]
    fn errors_map_to_codes() {
        let cases = [
            (Error::Config("c".into()), Code::InvalidArgument),
            (Error::InvalidArgument("i".into()), Code::InvalidArgument),
            (Error::Rendezvous("r".into()), Code::FailedPrecondition),
            (
                Error::Timeout {
                    what: "w".into(),
                    after: Duration::from_secs(1),
                },
                Code::DeadlineExceeded,
            ),
            (
                Error::Aborted(AbortCause {
                    rank: Some(1),
                    host: "h".into(),
                    message: "m".into(),
                }),
                Code::Aborted,
            ),
            (
                Error::Runtime(kolo_runtime::Error::Forked),
                Code::InvalidArgument,
            ),
            (
                Error::Runtime(kolo_runtime::Error::Build(std::io::Error::other(
                    "no threads",
                ))),
                Code::Internal,
            ),
            (Error::Internal("bug".into()), Code::Internal),
        ];
        for (err, code) in cases {
            let text = err.to_string();
            let status = Status::from(err);
            assert_eq!(status.code(), code, "{text}");
            assert_eq!(status.message(), text);
        }
        let status = Status::from(Error::Status(Status::not_found("k")));
        assert_eq!((status.code(), status.message()), (Code::NotFound, "k"));
    }
}
