//! Provider errors, classified once so every caller agrees on what is retried.

use std::time::Duration;

/// How a failure is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// 429, 5xx, 529, timeouts, connection loss, a dropped stream: retry with backoff.
    Retryable,
    /// The prompt no longer fits the window: retrying cannot help (a handoff can).
    PromptTooLong,
    /// 400/401/403/404/413 and the like: fail fast with the reason.
    Fatal,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The API answered with an error (`{"type":"error","error":{…}}`).
    #[error("{status} {kind}: {message}")]
    Api {
        status: u16,
        kind: String,
        message: String,
        /// From `retry-after`, when the server sent one.
        retry_after: Option<Duration>,
    },
    /// The connection failed or timed out before a complete response (retryable).
    #[error("connection: {0}")]
    Connection(String),
    /// The stream ended or broke before `message_stop` (retryable; partial
    /// output is discarded).
    #[error("stream dropped: {0}")]
    StreamDropped(String),
    /// The response could not be understood (fatal).
    #[error("malformed response: {0}")]
    Malformed(String),
    /// Retries ran out; the last error is kept.
    #[error("gave up after {attempts} attempts: {last}")]
    Exhausted { attempts: u32, last: Box<ProviderError> },
}

impl ProviderError {
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Api { status, kind, message, .. } => classify(*status, kind, message),
            Self::Connection(_) | Self::StreamDropped(_) => ErrorClass::Retryable,
            Self::Malformed(_) => ErrorClass::Fatal,
            Self::Exhausted { last, .. } => match last.class() {
                ErrorClass::PromptTooLong => ErrorClass::PromptTooLong,
                _ => ErrorClass::Fatal,
            },
        }
    }

    /// The context window an overflow error names (either provider's words).
    pub fn window(&self) -> Option<u64> {
        match self {
            Self::Api { message, .. } if self.class() == ErrorClass::PromptTooLong => {
                flower_model::windows::from_message(message)
            }
            Self::Exhausted { last, .. } => last.window(),
            _ => None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// Classify an API error by status and error type.
pub fn classify(status: u16, kind: &str, message: &str) -> ErrorClass {
    let lower = message.to_ascii_lowercase();
    // Anthropic: `prompt is too long`; OpenAI: code `context_length_exceeded`
    // and `maximum context length`; llama.cpp: `exceed_context_size_error`.
    if (status == 400 || status == 413)
        && (lower.contains("prompt is too long")
            || lower.contains("context length")
            || lower.contains("context window")
            || lower.contains("context size")
            || kind == "context_length_exceeded"
            || kind == "exceed_context_size_error")
    {
        return ErrorClass::PromptTooLong;
    }
    match (status, kind) {
        (429, _) | (529, _) | (_, "overloaded_error" | "rate_limit_error" | "api_error") => ErrorClass::Retryable,
        (500..=599, _) => ErrorClass::Retryable,
        (408, _) => ErrorClass::Retryable,
        _ => ErrorClass::Fatal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        assert_eq!(classify(429, "rate_limit_error", ""), ErrorClass::Retryable);
        assert_eq!(classify(529, "overloaded_error", "Overloaded"), ErrorClass::Retryable);
        assert_eq!(classify(500, "api_error", ""), ErrorClass::Retryable);
        assert_eq!(classify(503, "", ""), ErrorClass::Retryable);
        assert_eq!(classify(400, "invalid_request_error", "bad"), ErrorClass::Fatal);
        assert_eq!(classify(401, "authentication_error", ""), ErrorClass::Fatal);
        assert_eq!(classify(403, "permission_error", ""), ErrorClass::Fatal);
        assert_eq!(classify(404, "not_found_error", ""), ErrorClass::Fatal);
        assert_eq!(
            classify(400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
            ErrorClass::PromptTooLong
        );
        assert_eq!(
            classify(
                400,
                "context_length_exceeded",
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
            ),
            ErrorClass::PromptTooLong
        );
        let e = ProviderError::Api {
            status: 400,
            kind: "context_length_exceeded".into(),
            message:
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
                    .into(),
            retry_after: None,
        };
        assert_eq!(e.window(), Some(8192));
        // An in-stream error event carries the type but no HTTP status of its own.
        assert_eq!(classify(200, "overloaded_error", "Overloaded"), ErrorClass::Retryable);
        assert_eq!(ProviderError::StreamDropped("eof".into()).class(), ErrorClass::Retryable);
    }
}
