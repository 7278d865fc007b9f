//! One classification of errors for every front-end (docs/design.md,
//! section 9). Each crate keeps its own error enum, with the words that help
//! its own callers; every one of them also says which [`ErrorKind`] it is, and
//! the front-ends (gRPC, the console's HTTP, MCP, the CLI reading a status
//! back) render a kind one way each, in one place.

/// What kind of failure an error is, as a client must act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The job, session, task or file does not exist (or the caller may not know it does).
    NotFound,
    /// A field of the request is missing, malformed or over its own limit.
    Invalid,
    /// The request as a whole is over a size limit of this service.
    TooLarge,
    /// The request collides with what exists (an idempotency key reused for another spec).
    AlreadyExists,
    /// A concurrent change won (a write built on a state that moved on): re-read and retry.
    Conflict,
    /// Not possible in the target's present state (the job ended; nothing waits for an answer).
    Precondition,
    /// Another owner holds the job now: the writer must stop. Not retryable.
    Fenced,
    /// No credential, or not a valid one.
    Unauthenticated,
    /// A valid credential whose role does not allow the call.
    PermissionDenied,
    /// A dependency (store, queue, provider) cannot be reached now: a retry can help.
    Unavailable,
    /// A fault of the service itself; the client gets no internals.
    Internal,
}

impl ErrorKind {
    /// Whether a client may retry the same request later and expect another outcome.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorKind::Unavailable)
    }

    /// The kind's stable name (logs, MCP tool errors, JSON output).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Invalid => "invalid",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Precondition => "precondition",
            ErrorKind::Fenced => "fenced",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error that knows its kind. Implemented by every error type a
/// front-end may have to show.
pub trait Classify {
    fn kind(&self) -> ErrorKind;
}

impl Classify for crate::SpecError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Invalid
    }
}
