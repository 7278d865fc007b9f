//! The one place errors become HTTP statuses for the console: an
//! [`ErrorKind`] is one status. The words are the application layer's.

use axum::http::StatusCode;
use axum::response::Response;
use flower_coordinator::app::AppError;
use flower_model::{Classify, ErrorKind};

/// The HTTP status of a kind of error.
pub fn status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::AlreadyExists | ErrorKind::Conflict | ErrorKind::Fenced | ErrorKind::Precondition => {
            StatusCode::CONFLICT
        }
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The page for a refused or failed request.
pub fn page(e: impl Into<AppError>) -> Response {
    let e = e.into();
    crate::problem(status(e.kind()), &e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_outage_is_a_503_and_a_state_refusal_is_a_409() {
        assert_eq!(status(ErrorKind::Unavailable), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status(ErrorKind::Precondition), StatusCode::CONFLICT);
        assert_eq!(status(ErrorKind::Fenced), StatusCode::CONFLICT);
        assert_eq!(status(ErrorKind::Invalid), StatusCode::BAD_REQUEST);
    }
}
