//! Rate limits as the providers enforce them: a token bucket per API key
//! for requests, input tokens and output tokens per minute, each refilled
//! continuously at its limit per minute (as Anthropic describes its
//! limits). A request is admitted before it is played — the scenario's
//! state does not move for a refused one — with its estimated input tokens
//! (every input token counts, cached or not: stricter than Anthropic, which
//! leaves cache reads out for most models) and needs the output bucket not
//! to be in debt; its output is charged once played. A refused request gets
//! 429 with `retry-after` (whole seconds, rounded up; OpenAI's also
//! `retry-after-ms`) and every answer carries the provider's headers:
//! `anthropic-ratelimit-{requests,input-tokens,output-tokens}-{limit,remaining,reset}`
//! (reset: RFC 3339, when the bucket is full again) or
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (reset: a
//! duration, `1m0s`, `6s`, `20ms`; OpenAI's `tokens` is the input bucket,
//! charged input and output).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

pub use flower_model::quota::Quota;

/// Which API a request came through: the headers and error shapes differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Anthropic,
    OpenAi,
}

use flower_model::quota::{Buckets, Window, openai_duration};

/// Milliseconds of `now` since `epoch` (the buckets' clock).
fn ms(now: Instant, epoch: Instant) -> i64 {
    now.saturating_duration_since(epoch).as_millis() as i64
}

/// What the headers show of one key's buckets.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Readings {
    pub requests: Option<Window>,
    pub input: Option<Window>,
    pub output: Option<Window>,
}

/// A refused request: how long to wait, which limit, and the buckets.
#[derive(Clone, Debug, PartialEq)]
pub struct Refused {
    pub retry_after: Duration,
    /// `requests`, `input tokens` or `output tokens`.
    pub limit: &'static str,
    pub per_minute: u64,
    pub readings: Readings,
}

/// What the limits let through and refused, every key together (`GET
/// /v1/flower/quota`, for benchmarks): requests admitted, their estimated
/// input tokens and their output, requests refused, and when the first and
/// last were admitted (ms since the Unix epoch).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Tally {
    pub admitted: u64,
    pub refused: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub first_ms: Option<i64>,
    pub last_ms: Option<i64>,
}

/// The buckets of every key seen (in memory; a key is never logged).
#[derive(Debug)]
pub struct Quotas {
    quota: Quota,
    keys: Mutex<HashMap<String, Buckets>>,
    tally: Mutex<Tally>,
    /// The buckets' clock starts here.
    epoch: Instant,
}

impl Quotas {
    pub fn new(quota: Quota) -> Self {
        Self { quota, keys: Mutex::default(), tally: Mutex::default(), epoch: Instant::now() }
    }

    /// What every key was admitted and refused so far.
    pub fn tally(&self) -> Tally {
        *self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut Tally)) {
        f(&mut self.tally.lock().unwrap_or_else(|p| p.into_inner()));
    }

    pub fn quota(&self) -> Quota {
        self.quota
    }

    fn with<T>(&self, key: &str, now: Instant, f: impl FnOnce(&mut Buckets, i64) -> T) -> T {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let (q, now) = (self.quota, ms(now, self.epoch));
        f(keys.entry(key.to_string()).or_insert_with(|| Buckets::full(q, now)), now)
    }

    /// Admit a request of `input_tokens` (estimated) for `key`, taking one
    /// request and its input tokens — or refuse it, taking nothing.
    pub fn admit(&self, key: &str, input_tokens: u64, now: Instant) -> Result<Readings, Box<Refused>> {
        if !self.quota.is_set() {
            return Ok(Readings::default());
        }
        let admitted = self.with(key, now, |b, now| match b.admit(input_tokens, now) {
            Ok(()) => Ok(readings(b, now)),
            Err(wait) => Err(Box::new(Refused {
                retry_after: Duration::from_millis(wait.ms as u64),
                limit: wait.limit.words(),
                per_minute: wait.per_minute,
                readings: readings(b, now),
            })),
        });
        let at = flower_model::now_ms();
        self.count(|t| match &admitted {
            Ok(_) => {
                t.admitted += 1;
                t.input_tokens += input_tokens;
                t.first_ms = Some(t.first_ms.unwrap_or(at));
                t.last_ms = Some(at);
            }
            Err(_) => t.refused += 1,
        });
        admitted
    }

    /// Charge the output a request produced (on OpenAI's API, to the
    /// tokens bucket too).
    pub fn charge_output(&self, key: &str, api: Api, output_tokens: u64, now: Instant) {
        if !self.quota.is_set() {
            return;
        }
        self.count(|t| t.output_tokens += output_tokens);
        self.with(key, now, |b, now| {
            let input = if api == Api::OpenAi { output_tokens as f64 } else { 0.0 };
            b.charge(input, output_tokens as f64, now);
        });
    }
}

fn readings(b: &Buckets, now: i64) -> Readings {
    Readings {
        requests: b.requests.map(|r| r.window(now)),
        input: b.input.map(|r| r.window(now)),
        output: b.output.map(|r| r.window(now)),
    }
}

/// The API key of a request: `x-api-key`, else a bearer token; "" without.
pub fn key_of(headers: &HeaderMap) -> String {
    if let Some(k) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return k.to_string();
    }
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_string()
}

/// `retry-after` in whole seconds, rounded up (at least 1).
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs_f64().ceil() as u64).max(1)
}

/// The rate-limit headers of `api` for `readings` (none when no quota is set).
pub fn headers(api: Api, readings: &Readings, refused: Option<&Refused>) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::new();
    let mut put = |name: String, value: String| {
        if let (Ok(n), Ok(v)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            out.push((n, v));
        }
    };
    match api {
        Api::Anthropic => {
            for (kind, r) in
                [("requests", readings.requests), ("input-tokens", readings.input), ("output-tokens", readings.output)]
            {
                let Some(r) = r else { continue };
                let reset =
                    humantime::format_rfc3339_seconds(SystemTime::now() + r.reset_in + Duration::from_millis(999));
                put(format!("anthropic-ratelimit-{kind}-limit"), r.limit.to_string());
                put(format!("anthropic-ratelimit-{kind}-remaining"), r.remaining.to_string());
                put(format!("anthropic-ratelimit-{kind}-reset"), reset.to_string());
            }
        }
        Api::OpenAi => {
            for (kind, r) in [("requests", readings.requests), ("tokens", readings.input)] {
                let Some(r) = r else { continue };
                put(format!("x-ratelimit-limit-{kind}"), r.limit.to_string());
                put(format!("x-ratelimit-remaining-{kind}"), r.remaining.to_string());
                put(format!("x-ratelimit-reset-{kind}"), openai_duration(r.reset_in));
            }
        }
    }
    if let Some(refused) = refused {
        put("retry-after".into(), retry_after_secs(refused.retry_after).to_string());
        if api == Api::OpenAi {
            put("retry-after-ms".into(), (refused.retry_after.as_millis() as u64).max(1).to_string());
        }
    }
    out
}

/// The 429's words, as each provider words it.
pub fn message(api: Api, refused: &Refused) -> String {
    match api {
        Api::Anthropic => format!(
            "This request would exceed your organization's rate limit of {} {} per minute. Please try again later.",
            refused.per_minute, refused.limit
        ),
        Api::OpenAi => format!(
            "Rate limit reached on {} per min: Limit {}. Please try again in {}.",
            refused.limit,
            refused.per_minute,
            openai_duration(refused.retry_after)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(rpm: u64, itpm: u64, otpm: u64) -> Quotas {
        Quotas::new(Quota {
            requests_per_minute: Some(rpm),
            input_tokens_per_minute: Some(itpm),
            output_tokens_per_minute: Some(otpm),
        })
    }

    #[test]
    fn a_bucket_admits_its_limit_then_refills_at_its_rate() {
        let q = quota(60, 1_000_000, 1_000_000);
        let t0 = Instant::now();
        for i in 0..60 {
            assert!(q.admit("k", 10, t0).is_ok(), "request {i} of 60");
        }
        let refused = q.admit("k", 10, t0).unwrap_err();
        assert_eq!(refused.limit, "requests");
        // 60 a minute: one a second.
        assert!((refused.retry_after.as_secs_f64() - 1.0).abs() < 0.01, "{refused:?}");
        assert_eq!(retry_after_secs(refused.retry_after), 1);
        assert_eq!(refused.readings.requests.unwrap().remaining, 0);
        assert!(q.admit("k", 10, t0 + Duration::from_millis(1000)).is_ok(), "one more a second later");
        assert!(q.admit("other", 10, t0).is_ok(), "each key its own buckets");
    }

    #[test]
    fn tokens_in_and_out_are_counted_apart() {
        let q = quota(1000, 600, 120);
        let t0 = Instant::now();
        let r = q.admit("k", 500, t0).unwrap();
        assert_eq!(r.input.unwrap().remaining, 100);
        let refused = q.admit("k", 200, t0).unwrap_err();
        assert_eq!(refused.limit, "input tokens");
        // 100 missing at 600 a minute: 10 s.
        assert!((refused.retry_after.as_secs_f64() - 10.0).abs() < 0.01, "{refused:?}");
        // Output charged after the fact: a bucket in debt refuses the next request.
        q.charge_output("k", Api::Anthropic, 180, t0);
        let refused = q.admit("k", 1, t0).unwrap_err();
        assert_eq!(refused.limit, "output tokens");
        assert!((refused.retry_after.as_secs_f64() - 30.0).abs() < 0.01, "60 in debt at 120/min: {refused:?}");
        // A request larger than the bucket waits for a full one, then goes.
        let big = quota(1000, 100, 100);
        assert!(big.admit("k", 5_000, t0).is_ok(), "a full bucket takes it");
    }

    #[test]
    fn headers_speak_each_providers_dialect() {
        let q = quota(50, 40_000, 8_000);
        let t0 = Instant::now();
        let r = q.admit("k", 1_000, t0).unwrap();
        let named = |pairs: Vec<(HeaderName, HeaderValue)>| -> HashMap<String, String> {
            pairs.into_iter().map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string())).collect()
        };
        let h = named(headers(Api::Anthropic, &r, None));
        assert_eq!(h["anthropic-ratelimit-requests-limit"], "50");
        assert_eq!(h["anthropic-ratelimit-requests-remaining"], "49");
        assert_eq!(h["anthropic-ratelimit-input-tokens-remaining"], "39000");
        assert_eq!(h["anthropic-ratelimit-output-tokens-limit"], "8000");
        assert!(h["anthropic-ratelimit-input-tokens-reset"].ends_with('Z'), "{h:?}");
        assert!(!h.contains_key("retry-after"));
        let refused =
            Refused { retry_after: Duration::from_millis(1500), limit: "requests", per_minute: 50, readings: r };
        let h = named(headers(Api::OpenAi, &r, Some(&refused)));
        assert_eq!(h["x-ratelimit-limit-tokens"], "40000");
        assert_eq!(h["x-ratelimit-remaining-requests"], "49");
        assert_eq!((h["retry-after"].as_str(), h["retry-after-ms"].as_str()), ("2", "1500"));
        assert!(Quota { requests_per_minute: Some(0), ..Default::default() }.check().is_err());
    }
}
