//! Token usage as the provider reports it, prompt-cache fields included.
//! Every threshold in flower is based on these reported figures, never on a
//! local tokenizer's estimate.

use serde::{Deserialize, Serialize};

/// Per-TTL split of cache writes (`usage.cache_creation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheCreation {
    #[serde(default)]
    pub ephemeral_5m_input_tokens: u64,
    #[serde(default)]
    pub ephemeral_1h_input_tokens: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens read without the cache.
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    #[serde(default)]
    pub cache_read_input_tokens: u64,
    #[serde(default)]
    pub cache_creation: CacheCreation,
}

impl Usage {
    /// The context the request occupied: uncached input + cache reads + cache writes.
    pub fn context_tokens(&self) -> u64 {
        self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens
    }

    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_creation_input_tokens += other.cache_creation_input_tokens;
        self.cache_read_input_tokens += other.cache_read_input_tokens;
        self.cache_creation.ephemeral_5m_input_tokens += other.cache_creation.ephemeral_5m_input_tokens;
        self.cache_creation.ephemeral_1h_input_tokens += other.cache_creation.ephemeral_1h_input_tokens;
    }

    /// Overlay a later cumulative report (`message_delta` counts are cumulative):
    /// a field the later report leaves at zero keeps its earlier value.
    pub fn merge_cumulative(&mut self, later: &Usage) {
        fn take(a: &mut u64, b: u64) {
            if b > 0 {
                *a = b;
            }
        }
        take(&mut self.input_tokens, later.input_tokens);
        take(&mut self.output_tokens, later.output_tokens);
        take(&mut self.cache_creation_input_tokens, later.cache_creation_input_tokens);
        take(&mut self.cache_read_input_tokens, later.cache_read_input_tokens);
        take(&mut self.cache_creation.ephemeral_5m_input_tokens, later.cache_creation.ephemeral_5m_input_tokens);
        take(&mut self.cache_creation.ephemeral_1h_input_tokens, later.cache_creation.ephemeral_1h_input_tokens);
    }

    /// Cache reads / (uncached input + cache reads + cache writes); `None` before any input.
    pub fn cache_rate(&self) -> Option<f64> {
        let total = self.context_tokens();
        (total > 0).then(|| self.cache_read_input_tokens as f64 / total as f64)
    }
}

/// A local estimate of the tokens of `chars` characters of JSON or prose
/// (4 characters a token). Only for what has not been sent yet; every
/// threshold uses the provider's reported counts.
pub fn estimate_tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_reports_overlay_non_zero_fields() {
        let mut u = Usage { input_tokens: 100, cache_read_input_tokens: 50, output_tokens: 1, ..Default::default() };
        u.merge_cumulative(&Usage { output_tokens: 42, ..Default::default() });
        assert_eq!(u.input_tokens, 100);
        assert_eq!(u.cache_read_input_tokens, 50);
        assert_eq!(u.output_tokens, 42);
        assert_eq!(u.context_tokens(), 150);
        assert_eq!(u.cache_rate(), Some(50.0 / 150.0));
        assert_eq!(Usage::default().cache_rate(), None);
    }
}
