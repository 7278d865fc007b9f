//! The one place errors become gRPC statuses: an [`ErrorKind`] is one code.
//! `UNAVAILABLE` only when retrying can help (the store unreachable).
//! Messages are the application layer's, which never carry server paths or
//! a backend's own words (those go to the log).

use flower_model::{Classify, ErrorKind};
use flower_store::StoreError;
use tonic::{Code, Status};

use crate::app::AppError;

/// The gRPC code of a kind of error.
pub fn code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Invalid => Code::InvalidArgument,
        ErrorKind::TooLarge => Code::ResourceExhausted,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::Conflict | ErrorKind::Fenced => Code::Aborted,
        ErrorKind::Precondition => Code::FailedPrecondition,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Internal => Code::Internal,
    }
}

/// The kind a status code says (a client reading an error back).
pub fn kind(code: Code) -> ErrorKind {
    match code {
        Code::NotFound => ErrorKind::NotFound,
        Code::InvalidArgument | Code::OutOfRange => ErrorKind::Invalid,
        Code::ResourceExhausted => ErrorKind::TooLarge,
        Code::AlreadyExists => ErrorKind::AlreadyExists,
        Code::Aborted => ErrorKind::Conflict,
        Code::FailedPrecondition => ErrorKind::Precondition,
        Code::Unauthenticated => ErrorKind::Unauthenticated,
        Code::PermissionDenied => ErrorKind::PermissionDenied,
        Code::Unavailable | Code::DeadlineExceeded => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    }
}

impl From<AppError> for Status {
    fn from(e: AppError) -> Self {
        Status::new(code(e.kind()), e.message)
    }
}

/// A store error as a status (through the application layer's words).
pub fn from_store(e: StoreError) -> Status {
    AppError::from(e).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_backend_failure_is_unavailable_and_its_words_stay_in_the_log() {
        let e = from_store(StoreError::backend("connection to /var/run/postgresql refused"));
        assert_eq!(e.code(), Code::Unavailable);
        assert!(!e.message().contains("/var/run"), "{}", e.message());
        assert_eq!(from_store(StoreError::Invalid("invalid byte sequence 0x00".into())).code(), Code::InvalidArgument);
        assert_eq!(from_store(StoreError::Corrupt("x".into())).code(), Code::Internal);
    }

    #[test]
    fn every_kind_reads_back_as_itself() {
        use ErrorKind::*;
        for k in [
            NotFound,
            Invalid,
            TooLarge,
            AlreadyExists,
            Conflict,
            Precondition,
            Unauthenticated,
            PermissionDenied,
            Unavailable,
            Internal,
        ] {
            assert_eq!(kind(code(k)), k);
        }
        // Fenced is rendered as a conflict: a client cannot tell them apart, nor needs to.
        assert_eq!(kind(code(Fenced)), Conflict);
    }
}
