//! The one place errors become gRPC statuses, and the checks every handler
//! runs on the fields it reads.
//!
//! One status per kind of bad input: a NUL byte, an oversized field or an
//! undecodable message is `INVALID_ARGUMENT` naming the field; `UNAVAILABLE`
//! only when retrying can help (the store unreachable). Messages never carry
//! server paths or a backend's own words: those go to the log.

use flower_store::StoreError;
use tonic::Status;

/// Longest id a handler reads (a job or session id has 36 characters; a
/// prefix is shorter). Longer ones are refused without being echoed.
pub const MAX_ID_LEN: usize = 64;
/// Longest idempotency key.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;
/// Longest cancel reason.
pub const MAX_REASON: usize = 4096;
/// Longest workbench or workspace path, and one component of it (the usual
/// file-system limits: longer ones could never name a file).
pub const MAX_PATH: usize = 1024;
pub const MAX_PATH_COMPONENT: usize = 255;

pub fn from_store(e: StoreError) -> Status {
    match e {
        StoreError::NotFound(what) => not_found(what),
        StoreError::Ambiguous(what) => Status::invalid_argument(format!("`{what}` matches several jobs")),
        StoreError::Superseded { .. }
        | StoreError::NotClaimed { .. }
        | StoreError::AlreadyFinished { .. }
        | StoreError::JobEnded { .. } => Status::failed_precondition(e.to_string()),
        StoreError::TooLarge { .. } => Status::resource_exhausted(e.to_string()),
        StoreError::BadPath { .. } => Status::invalid_argument(e.to_string()),
        StoreError::Fenced { .. } => Status::aborted(e.to_string()),
        StoreError::Invalid(m) => {
            tracing::warn!(error = %m, "request refused by the store");
            Status::invalid_argument(
                "a field of this request cannot be stored (control characters or an oversized value)",
            )
        }
        StoreError::Backend(m) => {
            tracing::warn!(error = %m, "store unavailable");
            Status::unavailable("the store is unavailable; retry later")
        }
        StoreError::SchemaBehind { .. } => internal("the database schema is behind this release", e),
        StoreError::Corrupt(m) => {
            tracing::error!(error = %m, "stored data could not be read");
            Status::internal("stored data could not be read")
        }
    }
}

/// A field that is missing, malformed or over its own limit: `InvalidArgument` naming it.
pub fn invalid(field: &str, message: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {message}"))
}

/// A job spec refused (parse, validation, the provider table, the tool policy).
pub fn bad_spec(e: &flower_model::SpecError) -> Status {
    invalid("spec", format_args!("{}: {}", e.field, e.message))
}

/// The request is over this service's size limit.
pub fn too_large(message: impl Into<String>) -> Status {
    Status::resource_exhausted(message)
}

/// No token, or not the service's.
pub fn unauthenticated(message: &'static str) -> Status {
    Status::unauthenticated(message)
}

pub fn not_found(what: impl std::fmt::Display) -> Status {
    Status::not_found(format!("{what} not found"))
}

/// A fault of this service (logged; the client gets no internals).
pub fn internal(context: &str, e: impl std::fmt::Display) -> Status {
    tracing::error!(error = %e, "{context}");
    Status::internal(context.to_string())
}

/// A required id field, parsed, or `InvalidArgument` naming the field.
pub fn parse_id<T: std::str::FromStr>(field: &str, value: &str) -> Result<T, Status> {
    check_id(field, value)?;
    value.parse().map_err(|_| Status::invalid_argument(format!("{field}: `{value}` is not a valid id")))
}

/// An id or id prefix: present, short, printable. Refusals of a long or
/// unprintable one do not echo it.
pub fn check_id(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field}: required")));
    }
    if value.len() > MAX_ID_LEN {
        return Err(Status::invalid_argument(format!(
            "{field}: {} bytes is not an id (at most {MAX_ID_LEN})",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!("{field}: control characters are not allowed in an id")));
    }
    Ok(())
}

/// Free text of a request: no NUL or other control characters but newlines
/// and tabs, at most `max` bytes.
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), Status> {
    if value.len() > max {
        return Err(Status::invalid_argument(format!("{field}: {} bytes, over the limit of {max}", value.len())));
    }
    if value.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r')) {
        return Err(Status::invalid_argument(format!("{field}: control characters (such as NUL) are not allowed")));
    }
    Ok(())
}

/// A relative path in a job's workbench or workspace: no NUL, no `..`, no
/// absolute path, within the file-system's length limits. Refusals name the
/// field and echo the path only when it is short and printable.
pub fn check_path(field: &str, path: &str) -> Result<(), Status> {
    let printable = path.len() <= 200 && !path.chars().any(char::is_control);
    let shown = if printable { format!("`{path}`") } else { format!("the {}-byte path", path.len()) };
    if path.len() > MAX_PATH || path.split('/').any(|c| c.len() > MAX_PATH_COMPONENT) {
        return Err(Status::invalid_argument(format!(
            "{field}: {shown} is too long (at most {MAX_PATH} bytes, {MAX_PATH_COMPONENT} per component)"
        )));
    }
    if let Some((at, c)) = path.char_indices().find(|(_, c)| c.is_control()) {
        return Err(Status::invalid_argument(format!(
            "{field}: {shown} holds the control character {:?} at byte {at}",
            c
        )));
    }
    // One spelling per file: `a//b`, `./a` and `a/` are refused, so paths
    // compare as strings.
    if path.starts_with('/') {
        return Err(Status::invalid_argument(format!("{field}: {shown} is absolute: give a relative path")));
    }
    let bad = path.split('/').find(|c| c.is_empty() || *c == "." || *c == "..");
    if let Some(part) = bad {
        let why = match part {
            "" => "an empty component (`//`, or a trailing `/`)".to_string(),
            p => format!("a `{p}` component"),
        };
        return Err(Status::invalid_argument(format!("{field}: {shown} is not a relative path: it has {why}")));
    }
    if flower_store::localfs::check_relative(path).is_err() {
        return Err(Status::invalid_argument(format!("{field}: {shown} is not a relative path")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn ids_are_checked_without_echoing_long_ones() {
        let long = "a".repeat(10_000);
        let e = parse_id::<uuid::Uuid>("job_id", &long).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().len() < 100, "{}", e.message());
        let e = parse_id::<uuid::Uuid>("job_id", "a\0b").unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(!e.message().contains('\0'));
        assert_eq!(parse_id::<uuid::Uuid>("job_id", "").unwrap_err().message(), "job_id: required");
    }

    #[test]
    fn text_and_paths_name_their_field() {
        assert!(check_text("message", "line\nnext\ttab", 100).is_ok());
        assert_eq!(check_text("message", "a\0", 100).unwrap_err().code(), Code::InvalidArgument);
        assert!(check_text("message", &"x".repeat(101), 100).unwrap_err().message().starts_with("message: 101 bytes"));
        assert!(check_path("path", "artifacts/a.md").is_ok());
        for bad in
            ["../x", "/etc/passwd", "a\0b", "a//b", "./a", "a/", &"p".repeat(5000), &format!("a/{}", "c".repeat(300))]
        {
            let e = check_path("path", bad).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}");
            assert!(e.message().starts_with("path: "), "{}", e.message());
            assert!(e.message().len() < 300, "{}", e.message());
        }
        // The refusal says what is wrong, and where.
        let says = |p: &str| check_path("path", p).unwrap_err().message().to_string();
        assert_eq!(says("a\0b"), "path: the 3-byte path holds the control character '\\0' at byte 1");
        assert!(says("a//b").ends_with("an empty component (`//`, or a trailing `/`)"), "{}", says("a//b"));
        assert!(says("x/../y").ends_with("a `..` component"));
        assert!(says("/etc/passwd").contains("is absolute"));
    }

    #[test]
    fn only_a_backend_failure_is_unavailable_and_its_words_stay_in_the_log() {
        let e = from_store(StoreError::Backend("connection to /var/run/postgresql refused".into()));
        assert_eq!(e.code(), Code::Unavailable);
        assert!(!e.message().contains("/var/run"), "{}", e.message());
        assert_eq!(from_store(StoreError::Invalid("invalid byte sequence 0x00".into())).code(), Code::InvalidArgument);
        assert_eq!(from_store(StoreError::Corrupt("x".into())).code(), Code::Internal);
    }
}
