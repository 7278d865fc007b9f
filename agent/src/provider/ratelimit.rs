//! A provider's rate limits as its responses state them: Anthropic's
//! `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`
//! (reset: an RFC 3339 instant), OpenAI's
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (reset: a
//! duration, `6s`, `1m0s`, `20ms`), and `retry-after` (seconds) or
//! `retry-after-ms` on a 429 or 529. Local servers send none: nothing is
//! learnt from them.

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

pub use flower_model::quota::Window;
use flower_model::quota::parse_openai_duration;

/// What one response said of its key's limits (each `None` when not stated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stated {
    pub requests: Option<Window>,
    /// Input tokens (Anthropic's `input-tokens`; OpenAI states one `tokens`
    /// limit for input and output together, read here).
    pub input_tokens: Option<Window>,
    pub output_tokens: Option<Window>,
    pub retry_after: Option<Duration>,
}

impl Stated {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Read `headers` (either provider's: the names do not overlap).
    pub fn of(headers: &HeaderMap) -> Self {
        Self::at(headers, SystemTime::now())
    }

    fn at(headers: &HeaderMap, now: SystemTime) -> Self {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        let number = |name: &str| text(name).and_then(|v| v.parse::<u64>().ok());
        let anthropic = |kind: &str| {
            let limit = number(&format!("anthropic-ratelimit-{kind}-limit"))?;
            let remaining = number(&format!("anthropic-ratelimit-{kind}-remaining")).unwrap_or(limit);
            let reset_in = text(&format!("anthropic-ratelimit-{kind}-reset"))
                .and_then(|r| humantime::parse_rfc3339_weak(r).ok())
                .and_then(|at| at.duration_since(now).ok())
                .unwrap_or_default();
            Some(Window { limit, remaining, reset_in })
        };
        let openai = |kind: &str| {
            let limit = number(&format!("x-ratelimit-limit-{kind}"))?;
            let remaining = number(&format!("x-ratelimit-remaining-{kind}")).unwrap_or(limit);
            let reset_in =
                text(&format!("x-ratelimit-reset-{kind}")).and_then(parse_openai_duration).unwrap_or_default();
            Some(Window { limit, remaining, reset_in })
        };
        let retry_after = text("retry-after-ms")
            .and_then(|v| v.parse::<f64>().ok())
            .map(|ms| ms / 1000.0)
            .or_else(|| text("retry-after").and_then(|v| v.parse::<f64>().ok()))
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64);
        Self {
            requests: anthropic("requests").or_else(|| openai("requests")),
            input_tokens: anthropic("input-tokens").or_else(|| anthropic("tokens")).or_else(|| openai("tokens")),
            output_tokens: anthropic("output-tokens"),
            retry_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs.iter().map(|(n, v)| (HeaderName::try_from(*n).unwrap(), HeaderValue::try_from(*v).unwrap())).collect()
    }

    #[test]
    fn anthropics_headers_are_read_with_their_reset_instants() {
        let now = humantime::parse_rfc3339("2026-12-07T12:00:00Z").unwrap();
        let h = headers(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", "2026-12-07T12:00:02Z"),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "39000"),
            ("anthropic-ratelimit-input-tokens-reset", "2026-12-07T12:00:01Z"),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "7990"),
            ("anthropic-ratelimit-output-tokens-reset", "2026-12-07T11:59:00Z"),
            ("retry-after", "7"),
        ]);
        let s = Stated::at(&h, now);
        assert_eq!(s.requests, Some(Window { limit: 50, remaining: 49, reset_in: Duration::from_secs(2) }));
        assert_eq!(s.input_tokens.unwrap().remaining, 39_000);
        assert_eq!(s.input_tokens.unwrap().reset_in, Duration::from_secs(1));
        assert_eq!(s.output_tokens.unwrap().reset_in, Duration::ZERO, "a reset in the past: whole now");
        assert_eq!(s.retry_after, Some(Duration::from_secs(7)));
    }

    #[test]
    fn openais_headers_and_durations_are_read() {
        let h = headers(&[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-reset-requests", "120ms"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "29000"),
            ("x-ratelimit-reset-tokens", "1m0.5s"),
            ("retry-after-ms", "1500"),
            ("retry-after", "2"),
        ]);
        let s = Stated::of(&h);
        assert_eq!(s.requests, Some(Window { limit: 500, remaining: 499, reset_in: Duration::from_millis(120) }));
        assert_eq!(s.input_tokens.unwrap().reset_in, Duration::from_millis(60_500));
        assert_eq!(s.output_tokens, None);
        assert_eq!(s.retry_after, Some(Duration::from_millis(1500)), "the finer one");
        assert!(Stated::of(&HeaderMap::new()).is_empty(), "a local server states nothing");
    }
}
