//! The one place refusals and errors become HTTP statuses for the console:
//! an [`ErrorKind`] is one status; the console's own scheme adds two (no
//! token shown: 401 with the sign-in form; a form without the CSRF value:
//! 403). The words are the application layer's.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use flower_coordinator::app::AppError;
use flower_model::{Classify, ErrorKind};

use crate::views::layout;

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
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Why a route answers with something other than its page.
#[derive(Debug)]
pub enum Refusal {
    /// The request showed no credential: the sign-in form (which comes
    /// back to this path), and nothing of the jobs.
    SignIn(String),
    /// A form post without this console's CSRF value.
    StaleForm,
    /// The application layer refused the request, or a read failed.
    App(AppError),
}

impl From<AppError> for Refusal {
    fn from(e: AppError) -> Self {
        Self::App(e)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::SignIn(next) => layout::sign_in(status(ErrorKind::Unauthenticated), None, &next),
            Refusal::StaleForm => layout::respond(
                StatusCode::FORBIDDEN,
                layout::problem("this form is stale or not the console's (CSRF check): reload the page"),
            ),
            // A bad credential shown as a bearer: the sign-in form, saying so.
            Refusal::App(e) if e.kind() == ErrorKind::Unauthenticated => {
                layout::sign_in(status(e.kind()), Some(&e.message), "/")
            }
            Refusal::App(e) => layout::respond(status(e.kind()), layout::problem(&e.message)),
        }
    }
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

    #[test]
    fn the_console_s_own_refusals() {
        assert_eq!(Refusal::SignIn("/".into()).into_response().status(), StatusCode::UNAUTHORIZED);
        assert_eq!(Refusal::StaleForm.into_response().status(), StatusCode::FORBIDDEN);
        let gone = Refusal::from(AppError::from(flower_store::StoreError::NotFound("job x".into()))).into_response();
        assert_eq!(gone.status(), StatusCode::NOT_FOUND);
    }
}
