//! The one place errors become MCP tool errors: a tool result with
//! `isError`, its text the application layer's words, with what a client
//! can do about its kind.

use flower_coordinator::app::AppError;
use flower_model::{Classify, ErrorKind};

/// The text of a failed tool call.
pub fn text(e: &AppError) -> String {
    match e.kind() {
        ErrorKind::Unavailable => format!("{} (try again)", e.message),
        _ => e.message.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_outage_says_try_again() {
        let down = AppError::new(ErrorKind::Unavailable, "the store is unavailable");
        assert_eq!(text(&down), "the store is unavailable (try again)");
        assert_eq!(text(&AppError::invalid("job_id", "required")), "job_id: required");
    }
}
