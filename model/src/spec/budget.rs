//! `runtime.budget`: the job's limits (tokens, cost, deadline) and the prices
//! a cost is counted in: the spec's own table, else the published list prices.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits of a job (all off by default).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    /// Tokens across every session: input + cache reads + cache writes + output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Cost in US dollars, priced per model from `prices` (else the built-in table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Time from submission after which the job ends.
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde::option")]
    pub deadline: Option<Duration>,
    /// Prices per million tokens, by model name (overrides the built-in table).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
    /// When tokens or cost run out, how long the job waits
    /// (`waiting_for_budget`) for its user to raise the budget before it
    /// ends `failed` (default [`DEFAULT_RAISE_WAIT`]; `0s`: it ends at once).
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde::option")]
    pub wait: Option<Duration>,
}

/// How long a job whose budget ran out waits for a raise, by default.
pub const DEFAULT_RAISE_WAIT: Duration = Duration::from_secs(15 * 60);

impl Budget {
    /// How long a job whose tokens or cost ran out waits for a raise (zero: not at all).
    pub fn raise_wait(&self) -> Duration {
        self.wait.unwrap_or(DEFAULT_RAISE_WAIT)
    }
}

/// US dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    pub cache_write_5m: f64,
    pub cache_write_1h: f64,
    pub cache_read: f64,
}

/// Published list prices (USD per MTok) of the models flower knows by name.
pub fn builtin_price(model: &str) -> Option<Price> {
    let p = |input: f64, output: f64| Price {
        input,
        output,
        cache_write_5m: input * 1.25,
        cache_write_1h: input * 2.0,
        cache_read: input * 0.1,
    };
    let m = model.to_ascii_lowercase();
    if m.contains("opus-4-5") || m.contains("opus-4.5") {
        Some(p(5.0, 25.0))
    } else if m.contains("opus") {
        Some(p(15.0, 75.0))
    } else if m.contains("sonnet") {
        Some(p(3.0, 15.0))
    } else if m.contains("haiku-4-5") || m.contains("haiku-4.5") {
        Some(p(1.0, 5.0))
    } else if m.contains("haiku") {
        Some(p(0.8, 4.0))
    } else {
        openai_price(&m)
    }
}

/// OpenAI's list prices: automatic caching writes at the input price and
/// reads at the model's cached-input price.
fn openai_price(m: &str) -> Option<Price> {
    let p = |input: f64, cached: f64, output: f64| Price {
        input,
        output,
        cache_write_5m: input,
        cache_write_1h: input,
        cache_read: cached,
    };
    // Longest names first: `gpt-4.1-mini` before `gpt-4.1`.
    let table: &[(&str, Price)] = &[
        ("gpt-5-nano", p(0.05, 0.005, 0.4)),
        ("gpt-5-mini", p(0.25, 0.025, 2.0)),
        ("gpt-5", p(1.25, 0.125, 10.0)),
        ("gpt-4.1-nano", p(0.1, 0.025, 0.4)),
        ("gpt-4.1-mini", p(0.4, 0.1, 1.6)),
        ("gpt-4.1", p(2.0, 0.5, 8.0)),
        ("gpt-4o-mini", p(0.15, 0.075, 0.6)),
        ("gpt-4o", p(2.5, 1.25, 10.0)),
    ];
    table.iter().find(|(name, _)| m.contains(name)).map(|(_, price)| *price)
}

impl Budget {
    /// The price of `model`: the spec's table first, then the built-in one.
    pub fn price(&self, model: &str) -> Option<Price> {
        self.prices.get(model).copied().or_else(|| builtin_price(model))
    }
}

impl Price {
    /// The cost of `usage` at this price.
    pub fn cost(&self, u: &crate::usage::Usage) -> f64 {
        let w1h = u.cache_creation.ephemeral_1h_input_tokens as f64;
        let w5m = (u.cache_creation_input_tokens as f64 - w1h).max(0.0);
        (u.input_tokens as f64 * self.input
            + u.output_tokens as f64 * self.output
            + w5m * self.cache_write_5m
            + w1h * self.cache_write_1h
            + u.cache_read_input_tokens as f64 * self.cache_read)
            / 1e6
    }
}
