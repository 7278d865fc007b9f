//! A provider's rate limits as its responses state them: Anthropic's
//! `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`
//! (reset: an RFC 3339 instant), OpenAI's
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (reset: a
//! duration, `6s`, `1m0s`, `20ms`), and `retry-after` (seconds) or
//! `retry-after-ms` on a 429 or 529. Local servers send none: nothing is
//! learnt from them.

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

/// One limit as a response states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Per minute (both providers state their limits per minute).
    pub limit: u64,
    pub remaining: u64,
    /// Until the limit is whole again (zero when the server gave no reset).
    pub reset_in: Duration,
}

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
            let reset_in = text(&format!("x-ratelimit-reset-{kind}")).and_then(parse_duration).unwrap_or_default();
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

/// OpenAI's reset durations: a sequence of number-and-unit parts (`h`, `m`,
/// `s`, `ms`), e.g. `1m0s`, `6s`, `1.5s`, `20ms`, `2h3m`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = 0.0_f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let secs = match &rest[..unit] {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            _ => return None,
        };
        total += secs;
        rest = &rest[unit..];
    }
    total.is_finite().then(|| Duration::from_secs_f64(total))
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
        for (text, ms) in [("6s", 6000), ("1m0s", 60_000), ("20ms", 20), ("1.5s", 1500), ("2h3m", 7_380_000)] {
            assert_eq!(parse_duration(text), Some(Duration::from_millis(ms)), "{text}");
        }
        for bad in ["", "s", "5x", "1..2s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert!(Stated::of(&HeaderMap::new()).is_empty(), "a local server states nothing");
    }
}
