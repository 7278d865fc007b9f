//! Token buckets, as providers describe their rate limits: a level that
//! refills continuously at its limit per minute, up to the limit; a key's
//! three ([`Buckets`]: requests, input tokens, output tokens) admit a
//! request or say how long it waits. Shared by the simulator (which
//! enforces limits) and the store (which keeps a route's buckets for every
//! process). Times are milliseconds on any clock the caller keeps.

use std::time::Duration;

mod queue;
pub use queue::{Claimant, DEFAULT_PRIORITY, Route, Shares, WAITER_LEASE_MS, Waiter};

use serde::{Deserialize, Serialize};

/// One bucket. Its level may go below zero (usage charged after the
/// fact): it is in debt until refilled.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Per minute.
    pub limit: f64,
    pub level: f64,
    /// When `level` was read (ms).
    pub at: i64,
}

impl Bucket {
    /// A full bucket of `limit` per minute at `now`.
    pub fn full(limit: u64, now: i64) -> Self {
        Self { limit: limit as f64, level: limit as f64, at: now }
    }

    /// Refilled up to `now` (a clock that went back refills nothing).
    pub fn refill(&mut self, now: i64) {
        let dt = (now - self.at).max(0) as f64;
        self.level = (self.level + self.limit * dt / 60_000.0).min(self.limit);
        self.at = self.at.max(now);
    }

    /// How long (ms) until `need` is there; 0 if it is now. A need above the
    /// limit waits for a full bucket (and is then taken whole).
    pub fn wait_for(&self, need: f64) -> i64 {
        self.refilled_to(need.min(self.limit))
    }

    /// How long (ms) until the level reaches `level` (above the limit too:
    /// what several requests in line need together).
    pub fn refilled_to(&self, level: f64) -> i64 {
        if self.level >= level || self.limit <= 0.0 {
            return 0;
        }
        ((level - self.level) * 60_000.0 / self.limit).ceil() as i64
    }

    /// How long (ms) until full again.
    pub fn full_in(&self) -> i64 {
        if self.limit <= 0.0 {
            return 0;
        }
        ((self.limit - self.level).max(0.0) * 60_000.0 / self.limit).ceil() as i64
    }

    /// Take `n` (at most the limit: a request larger than the bucket takes it whole).
    pub fn take(&mut self, n: f64) {
        self.level -= n.min(self.limit);
    }

    /// Charge `n` after the fact (it may put the bucket in debt).
    pub fn charge(&mut self, n: f64) {
        self.level -= n;
    }

    /// The bucket as a provider's headers state it at `now`.
    pub fn window(&self, now: i64) -> Window {
        let mut b = *self;
        b.refill(now);
        Window {
            limit: b.limit as u64,
            remaining: b.level.max(0.0) as u64,
            reset_in: Duration::from_millis(b.full_in().max(0) as u64),
        }
    }

    /// A new limit learnt or set: the level keeps what was used of the old one.
    pub fn relimit(&mut self, limit: u64) {
        let used = self.limit - self.level;
        self.limit = limit as f64;
        self.level = self.limit - used;
    }
}

/// One limit as a provider's headers state it (the simulator writes them,
/// the clients read them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Per minute (both providers state their limits per minute).
    pub limit: u64,
    pub remaining: u64,
    /// Until the limit is whole again (zero when no reset was stated).
    pub reset_in: Duration,
}

/// OpenAI's duration format, as its `x-ratelimit-reset-*` headers write
/// it: `1m0s`, `6s`, `1.500s`, `20ms`.
pub fn openai_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (m, rest_ms) = (ms / 60_000, ms % 60_000);
    let secs =
        if rest_ms % 1000 == 0 { format!("{}s", rest_ms / 1000) } else { format!("{:.3}s", rest_ms as f64 / 1000.0) };
    if m > 0 { format!("{m}m{secs}") } else { secs }
}

/// [`openai_duration`] read back: a sequence of number-and-unit parts
/// (`h`, `m`, `s`, `ms`), e.g. `1m0s`, `6s`, `1.5s`, `20ms`, `2h3m`.
pub fn parse_openai_duration(text: &str) -> Option<Duration> {
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

/// Rate limits per minute (each unset: no limit of that kind).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_minute: Option<u64>,
}

impl Quota {
    pub fn is_unset(&self) -> bool {
        !self.is_set()
    }

    pub fn is_set(&self) -> bool {
        self.requests_per_minute.is_some()
            || self.input_tokens_per_minute.is_some()
            || self.output_tokens_per_minute.is_some()
    }

    /// A limit of 0 could admit nothing: refused, naming the field.
    pub fn check(&self) -> Result<(), &'static str> {
        for (field, v) in [
            ("quota.requests_per_minute", self.requests_per_minute),
            ("quota.input_tokens_per_minute", self.input_tokens_per_minute),
            ("quota.output_tokens_per_minute", self.output_tokens_per_minute),
        ] {
            if v == Some(0) {
                return Err(field);
            }
        }
        Ok(())
    }
}

/// Which of a key's limits keeps a request waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    Requests,
    InputTokens,
    OutputTokens,
}

impl Limit {
    /// In words: `requests`, `input tokens`, `output tokens`.
    pub fn words(self) -> &'static str {
        match self {
            Limit::Requests => "requests",
            Limit::InputTokens => "input tokens",
            Limit::OutputTokens => "output tokens",
        }
    }
}

/// A request that must wait: for how long (ms), for which limit, of how
/// much per minute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    pub ms: i64,
    pub limit: Limit,
    pub per_minute: u64,
}

/// One key's (or route's) buckets under `quota`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buckets {
    pub quota: Quota,
    pub requests: Option<Bucket>,
    pub input: Option<Bucket>,
    pub output: Option<Bucket>,
}

impl Buckets {
    /// Full buckets of `quota` at `now`.
    pub fn full(quota: Quota, now: i64) -> Self {
        Self {
            quota,
            requests: quota.requests_per_minute.map(|l| Bucket::full(l, now)),
            input: quota.input_tokens_per_minute.map(|l| Bucket::full(l, now)),
            output: quota.output_tokens_per_minute.map(|l| Bucket::full(l, now)),
        }
    }

    fn each(&mut self) -> impl Iterator<Item = &mut Bucket> {
        [&mut self.requests, &mut self.input, &mut self.output].into_iter().flatten()
    }

    pub fn refill(&mut self, now: i64) {
        self.each().for_each(|b| b.refill(now));
    }

    /// Admit a request of `input_tokens` (estimated) at `now`: one request
    /// and its input tokens taken — or, taking nothing, the longest wait
    /// (output is charged after the fact: a bucket in debt keeps requests
    /// waiting until it is refilled).
    pub fn admit(&mut self, input_tokens: u64, now: i64) -> Result<(), Wait> {
        self.refill(now);
        if let Some(wait) = self.longest_wait(1.0, input_tokens as f64, Bucket::wait_for) {
            return Err(wait);
        }
        if let Some(r) = &mut self.requests {
            r.take(1.0);
        }
        if let Some(i) = &mut self.input {
            i.take(input_tokens as f64);
        }
        Ok(())
    }

    /// The longest wait of the three buckets for `requests` and `tokens`
    /// input tokens (and no output debt), each bucket's by `wait` (`None`:
    /// none waits).
    pub(crate) fn longest_wait(&self, requests: f64, tokens: f64, wait: fn(&Bucket, f64) -> i64) -> Option<Wait> {
        [
            (Limit::Requests, self.requests, requests),
            (Limit::InputTokens, self.input, tokens),
            (Limit::OutputTokens, self.output, 0.0),
        ]
        .into_iter()
        .filter_map(|(limit, b, need)| b.map(|b| Wait { ms: wait(&b, need), limit, per_minute: b.limit as u64 }))
        .filter(|w| w.ms > 0)
        .max_by_key(|w| w.ms)
    }

    /// Charge what a request used beyond what its admission took: input
    /// tokens above the estimate (negative: given back) and its output.
    pub fn charge(&mut self, input_tokens: f64, output_tokens: f64, now: i64) {
        self.refill(now);
        if let Some(i) = &mut self.input {
            i.charge(input_tokens);
        }
        if let Some(o) = &mut self.output {
            o.charge(output_tokens);
        }
    }

    /// Limits learnt or set: each bucket keeps what was used of the old
    /// limit; a limit new here starts full, one gone goes.
    pub fn relimit(&mut self, quota: Quota, now: i64) {
        self.refill(now);
        let each = |b: &mut Option<Bucket>, limit: Option<u64>| match (b.as_mut(), limit) {
            (Some(b), Some(l)) => b.relimit(l),
            (None, Some(l)) => *b = Some(Bucket::full(l, now)),
            (_, None) => *b = None,
        };
        each(&mut self.requests, quota.requests_per_minute);
        each(&mut self.input, quota.input_tokens_per_minute);
        each(&mut self.output, quota.output_tokens_per_minute);
        self.quota = quota;
    }

    /// What a provider said is left (`remaining`, per bucket): a bucket
    /// holding more is brought down to it (never up: requests of other
    /// processes may be under way that the provider has not counted yet).
    pub fn observe(&mut self, remaining: Quota, now: i64) {
        self.refill(now);
        let each = |b: &mut Option<Bucket>, left: Option<u64>| {
            if let (Some(b), Some(left)) = (b.as_mut(), left) {
                b.level = b.level.min(left as f64);
            }
        };
        each(&mut self.requests, remaining.requests_per_minute);
        each(&mut self.input, remaining.input_tokens_per_minute);
        each(&mut self.output, remaining.output_tokens_per_minute);
    }

    /// The provider refused a request and asked for `ms` of patience: every
    /// bucket is empty for that long.
    pub fn drain(&mut self, ms: i64, now: i64) {
        self.refill(now);
        self.each().for_each(|b| b.level = b.level.min(0.0) - b.limit * ms.max(0) as f64 / 60_000.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openais_durations_are_written_and_read_back() {
        for (text, ms) in [("6s", 6000), ("1m0s", 60_000), ("20ms", 20), ("1.500s", 1500), ("2m3.250s", 123_250)] {
            assert_eq!(openai_duration(Duration::from_millis(ms)), text);
            assert_eq!(parse_openai_duration(text), Some(Duration::from_millis(ms)), "{text}");
        }
        assert_eq!(parse_openai_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_openai_duration("2h3m"), Some(Duration::from_millis(7_380_000)));
        for bad in ["", "s", "5x", "1..2s"] {
            assert_eq!(parse_openai_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn buckets_admit_wait_for_the_longest_and_learn_new_limits() {
        let quota = Quota {
            requests_per_minute: Some(2),
            input_tokens_per_minute: Some(600),
            output_tokens_per_minute: Some(120),
        };
        let mut b = Buckets::full(quota, 0);
        assert_eq!(b.admit(500, 0), Ok(()));
        let w = b.admit(200, 0).unwrap_err();
        assert_eq!((w.limit, w.ms, w.per_minute), (Limit::InputTokens, 10_000, 600), "100 missing at 600/min");
        assert_eq!(b.requests.unwrap().level, 1.0, "a refused request takes nothing");
        b.charge(-400.0, 180.0, 0);
        let w = b.admit(1, 0).unwrap_err();
        assert_eq!((w.limit, w.ms), (Limit::OutputTokens, 30_000), "60 in debt at 120/min");
        b.relimit(Quota { output_tokens_per_minute: Some(1200), ..quota }, 0);
        assert_eq!(b.output.unwrap().level, 1020.0, "what was used stays used");
        assert_eq!(b.admit(1, 0), Ok(()));
        b.drain(3_000, 0);
        let w = b.admit(1, 0).unwrap_err();
        assert!(w.ms >= 3_000, "a provider's retry-after holds every bucket: {w:?}");
        let mut fresh = Buckets::full(quota, 0);
        fresh.observe(
            Quota { requests_per_minute: Some(0), input_tokens_per_minute: Some(5_000), ..Quota::default() },
            0,
        );
        assert_eq!(fresh.requests.unwrap().level, 0.0, "brought down to what the provider said is left");
        assert_eq!(fresh.input.unwrap().level, 600.0, "never up");
        b.relimit(Quota::default(), 0);
        assert_eq!(b.admit(1_000_000, 0), Ok(()), "no limits: nothing waits");
    }

    #[test]
    fn a_bucket_refills_at_its_rate_and_waits_for_what_is_missing() {
        let mut b = Bucket::full(60, 0);
        for _ in 0..60 {
            assert_eq!(b.wait_for(1.0), 0);
            b.take(1.0);
        }
        assert_eq!(b.wait_for(1.0), 1000, "60 a minute: one a second");
        b.refill(500);
        assert_eq!(b.wait_for(1.0), 500);
        b.refill(100);
        assert_eq!(b.at, 500, "a clock that went back refills nothing");
        b.refill(60_500);
        assert_eq!((b.level, b.full_in()), (60.0, 0), "full, not more");
        b.charge(90.0);
        assert_eq!(b.wait_for(0.0), 30_000, "30 in debt at 60 a minute");
        let mut big = Bucket::full(100, 0);
        assert_eq!(big.wait_for(5_000.0), 0, "larger than the bucket: a full one takes it");
        big.take(5_000.0);
        assert_eq!(big.level, 0.0);
        big.relimit(200);
        assert_eq!(big.level, 100.0, "what was used of the old limit stays used");
    }
}
