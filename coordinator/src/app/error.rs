//! The application layer's error: a kind (the one classification,
//! [`ErrorKind`]) and words a client may read. Backend words (paths, SQL,
//! hosts) never reach them: they go to the log where the error is made.

use flower_model::{Classify, ErrorKind};
use flower_store::StoreError;

/// Why a request was refused or failed, as every front-end shows it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AppError {
    pub kind: ErrorKind,
    /// Safe to show the caller; names the field when one is at fault.
    pub message: String,
}

impl Classify for AppError {
    fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl AppError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }

    /// A field that is missing, malformed or over its own limit, named.
    pub fn invalid(field: &str, message: impl std::fmt::Display) -> Self {
        Self::new(ErrorKind::Invalid, format!("{field}: {message}"))
    }

    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Self::new(ErrorKind::NotFound, format!("{what} not found"))
    }

    pub fn precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Precondition, message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::TooLarge, message)
    }

    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthenticated, message)
    }

    /// A valid caller whose role does not allow the call.
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }

    /// A fault of this service: `context` for the client, the error itself to the log.
    pub fn internal(context: &str, e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "{context}");
        Self::new(ErrorKind::Internal, context)
    }

    /// A job spec refused (parse, validation, the provider table, the tool policy).
    pub fn bad_spec(e: &flower_model::SpecError) -> Self {
        Self::invalid("spec", format_args!("{}: {}", e.field, e.message))
    }
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        let kind = e.kind();
        match e {
            StoreError::NotFound(what) => Self::not_found(what),
            StoreError::Ambiguous(what) => Self::new(kind, format!("`{what}` matches several jobs")),
            StoreError::Invalid(m) => {
                tracing::warn!(error = %m, "request refused by the store");
                Self::new(kind, "a field of this request cannot be stored (control characters or an oversized value)")
            }
            StoreError::Backend { message: m, .. } => {
                tracing::warn!(error = %m, "store unavailable");
                Self::new(kind, "the store is unavailable; retry later")
            }
            e @ StoreError::Unconfirmed { .. } => {
                tracing::warn!(error = %e, "write refused: a task end it was built on is not stored");
                Self::new(kind, "the job's state moved on while this request was handled; retry")
            }
            e @ StoreError::SchemaBehind { .. } => Self::internal("the database schema is behind this release", e),
            StoreError::Corrupt(m) => {
                tracing::error!(error = %m, "stored data could not be read");
                Self::new(kind, "stored data could not be read")
            }
            e @ (StoreError::Superseded { .. }
            | StoreError::NotClaimed { .. }
            | StoreError::AlreadyFinished { .. }
            | StoreError::JobEnded { .. }
            | StoreError::TooLarge { .. }
            | StoreError::BadPath { .. }
            | StoreError::KeyRevoked(_)
            | StoreError::Fenced { .. }) => Self::new(kind, e.to_string()),
        }
    }
}

impl From<crate::actions::ActionError> for AppError {
    fn from(e: crate::actions::ActionError) -> Self {
        match e {
            crate::actions::ActionError::Ended { .. } => Self::precondition(e.to_string()),
            crate::actions::ActionError::Store(e) => e.into(),
        }
    }
}

impl Classify for crate::actions::ActionError {
    fn kind(&self) -> ErrorKind {
        match self {
            crate::actions::ActionError::Ended { .. } => ErrorKind::Precondition,
            crate::actions::ActionError::Store(e) => e.kind(),
        }
    }
}

impl From<crate::tools::ask::AnswerError> for AppError {
    fn from(e: crate::tools::ask::AnswerError) -> Self {
        use crate::tools::ask::AnswerError as A;
        match e {
            A::Store(e) => e.into(),
            A::UnknownQuestion(_) => Self::new(ErrorKind::NotFound, e.to_string()),
            A::NoSuchOption { .. } => Self::invalid("option", &e),
            A::Empty => Self::invalid("text", &e),
            A::Ambiguous { .. } => Self::invalid("question_id", &e),
            A::NothingPending(_) | A::AlreadyAnswered { .. } | A::JobEnded { .. } => Self::precondition(e.to_string()),
        }
    }
}

impl From<crate::continuation::ContinueError> for AppError {
    fn from(e: crate::continuation::ContinueError) -> Self {
        use crate::continuation::ContinueError as C;
        match e {
            C::NotFinished { .. } => Self::precondition(e.to_string()),
            C::Empty | C::TooLong | C::Spec(_) => Self::invalid("instruction", &e),
            C::Store(e) => e.into(),
        }
    }
}

impl From<crate::aside::AsideError> for AppError {
    fn from(e: crate::aside::AsideError) -> Self {
        use crate::aside::AsideError as A;
        match e {
            A::Store(e) => e.into(),
            A::Empty | A::TooLong => Self::invalid("question", &e),
            A::NoAnswer(_) => Self::new(ErrorKind::Unavailable, e.to_string()),
        }
    }
}
