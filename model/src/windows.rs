//! Context windows learnt from providers. A model's window is configured
//! (`runtime.handoff.window`), else known from its name; when a provider
//! rejects a request as too long and names its real limit, that limit is
//! recorded in the process's [`Windows`] and every later threshold of the
//! model uses it (docs/design.md section 6).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The windows learnt in one process, by model. A handle: clones share one
/// table. Whoever wires a process makes one and hands it to the sessions
/// that may hear a window (they record it) and to what computes thresholds
/// or shows them (they read it); a process that makes two keeps two tables.
#[derive(Clone, Debug, Default)]
pub struct Windows {
    table: Arc<RwLock<HashMap<String, u64>>>,
}

impl Windows {
    /// Record `model`'s real window (the smallest one heard wins: a provider
    /// may serve a model with less than its nominal window).
    pub fn learn(&self, model: &str, window: u64) {
        if window == 0 {
            return;
        }
        let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
        let known = t.entry(model.to_string()).or_insert(window);
        *known = (*known).min(window);
    }

    /// The window learnt for `model`, if any.
    pub fn learnt(&self, model: &str) -> Option<u64> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).get(model).copied()
    }
}

/// The window a provider's overflow message names, in either provider's
/// words: Anthropic's `prompt is too long: 210000 tokens > 200000 maximum`,
/// OpenAI's `This model's maximum context length is 8192 tokens. However,
/// your messages resulted in 9000 tokens…` (and servers that copy it:
/// vLLM, llama.cpp's `the request exceeds the available context size (N
/// tokens)`).
pub fn from_message(message: &str) -> Option<u64> {
    let lower = message.to_ascii_lowercase();
    let number_after = |marker: &str| -> Option<u64> {
        let at = lower.find(marker)? + marker.len();
        let digits: String = lower[at..].trim_start().chars().take_while(|c| c.is_ascii_digit() || *c == ',').collect();
        digits.replace(',', "").parse().ok()
    };
    if let Some(gt) = lower.find(" > ") {
        // Anthropic: "<N> tokens > <W> maximum".
        let rest = &lower[gt + 3..];
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if rest[digits.len()..].trim_start().starts_with("maximum")
            && let Ok(w) = digits.parse()
        {
            return Some(w);
        }
    }
    number_after("maximum context length is")
        .or_else(|| number_after("context length of"))
        .or_else(|| number_after("available context size ("))
        .filter(|w| *w > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_providers_words_name_the_window() {
        assert_eq!(from_message("prompt is too long: 210000 tokens > 200000 maximum"), Some(200_000));
        assert_eq!(
            from_message(
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages."
            ),
            Some(8192)
        );
        assert_eq!(
            from_message("the request exceeds the available context size (4096 tokens), try increasing it"),
            Some(4096)
        );
        assert_eq!(from_message("Overloaded"), None);
        assert_eq!(from_message("prompt is too long"), None);
    }

    #[test]
    fn the_smallest_window_heard_wins() {
        let windows = Windows::default();
        windows.learn("m-windows-test", 9000);
        windows.learn("m-windows-test", 8000);
        windows.clone().learn("m-windows-test", 8500);
        windows.learn("m-windows-test", 0);
        assert_eq!(windows.learnt("m-windows-test"), Some(8000));
        assert_eq!(windows.learnt("m-windows-unknown"), None);
        assert_eq!(Windows::default().learnt("m-windows-test"), None, "each table is its own");
    }
}
