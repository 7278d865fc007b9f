//! What every HTTP provider client shares: its settings, the HTTP client and
//! the cap on concurrent calls, the reading of an API error, and the retry
//! loop (capped exponential backoff with full jitter, honouring
//! `retry-after`). Each API's client only builds its request and reads its
//! response.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::Semaphore;

use super::error::{ErrorClass, ProviderError};
use super::{Observer, Response, StreamEvent};

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Without the API's path (`/v1/messages`, `/v1/chat/completions`).
    pub base_url: String,
    pub api_key: Option<String>,
    /// Attempts per request, the first included (default 6).
    pub max_attempts: u32,
    /// First backoff step (default 500 ms); doubles each retry.
    pub backoff_base: Duration,
    /// Longest wait between attempts (default 30 s); `retry-after` may ask for more, up to 5 min.
    pub backoff_cap: Duration,
    /// Concurrent requests allowed through this client (default 16).
    pub max_concurrent: usize,
    /// Time allowed to connect (default 10 s).
    pub connect_timeout: Duration,
    /// Longest silence between two stream chunks before the stream counts as dropped (default 120 s).
    pub idle_timeout: Duration,
    /// Where the client's routes' rate limits are kept (every process of a
    /// deployment draws from the same); `None`: each call goes at once.
    pub quota: Option<super::quota::RouteQuotas>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            base_url: super::anthropic::DEFAULT_BASE_URL.into(),
            api_key: None,
            max_attempts: 6,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(30),
            max_concurrent: 16,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            quota: None,
        }
    }
}

impl ClientConfig {
    /// `<PREFIX>_BASE_URL` (else `default_url`) and `<PREFIX>_API_KEY` from the environment.
    pub fn from_env_named(prefix: &str, default_url: &str) -> Self {
        let mut c = Self { base_url: default_url.to_string(), ..Self::default() };
        if let Ok(url) = std::env::var(format!("{prefix}_BASE_URL"))
            && !url.trim().is_empty()
        {
            c.base_url = url;
        }
        c.api_key = std::env::var(format!("{prefix}_API_KEY")).ok().filter(|k| !k.is_empty());
        c
    }

    /// The wait before retry number `attempt` (1 = first retry).
    pub fn backoff(&self, attempt: u32, err: &ProviderError) -> Duration {
        if let Some(after) = err.retry_after() {
            return after.min(Duration::from_secs(300));
        }
        let exp = self.backoff_base.saturating_mul(1u32 << (attempt - 1).min(16));
        let ceiling = exp.min(self.backoff_cap);
        // Full jitter: uniformly in [ceiling/2, ceiling], so a fan-out's retries spread.
        let ms = ceiling.as_millis() as u64;
        Duration::from_millis(rand::rng().random_range(ms / 2..=ms.max(1)))
    }
}

/// The HTTP client and the permits of a provider client.
pub(crate) fn http(config: &ClientConfig) -> Result<(reqwest::Client, Arc<Semaphore>), ProviderError> {
    let http = reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .build()
        .map_err(|e| ProviderError::Connection(e.to_string()))?;
    Ok((http, Arc::new(Semaphore::new(config.max_concurrent.max(1)))))
}

/// The response when it succeeded, else its API error. Both APIs answer an
/// error with `{"error": {"type": …, "message": …}}`; OpenAI's also carries
/// a `code` (`context_length_exceeded`, `rate_limit_exceeded`), which is the
/// more precise kind when present.
pub(crate) async fn api_error(resp: reqwest::Response) -> Result<reqwest::Response, ProviderError> {
    if resp.status().is_success() {
        return Ok(resp);
    }
    let status = resp.status().as_u16();
    // `retry-after-ms` (OpenAI's) when given, else `retry-after` (seconds).
    let retry_after = super::ratelimit::Stated::of(resp.headers()).retry_after;
    let body = resp.text().await.unwrap_or_default();
    let parsed: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    Err(error_of(status, &parsed["error"], body, retry_after))
}

/// An API error from its `error` object (`body` when it has no message).
pub(crate) fn error_of(
    status: u16,
    error: &serde_json::Value,
    body: String,
    retry_after: Option<Duration>,
) -> ProviderError {
    let kind = error["code"].as_str().or_else(|| error["type"].as_str()).unwrap_or("http_error").to_string();
    let message = error["message"].as_str().map(str::to_string).unwrap_or(body);
    ProviderError::Api { status, kind, message, retry_after }
}

/// What a response stated of its route's rate limits, for every process.
pub(crate) async fn heard(config: &ClientConfig, model: &str, resp: &reqwest::Response) {
    if let Some(q) = &config.quota {
        let refused = matches!(resp.status().as_u16(), 429 | 529);
        q.stated(model, &super::ratelimit::Stated::of(resp.headers()), refused).await;
    }
}

/// Send through `attempt` until it succeeds or fails for good: retryable
/// failures wait (observers hear each) and go again, at most
/// `config.max_attempts` times; each attempt holds one of the client's
/// permits — once its route's rate limits admit it (waiting for them holds
/// no permit), and what it used is charged to them.
pub(crate) async fn retrying<F, Fut>(
    config: &ClientConfig,
    permits: &Semaphore,
    observer: &Option<Observer>,
    request: &super::Request,
    attempt: F,
) -> Result<Response, ProviderError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Response, ProviderError>>,
{
    let mut n = 1;
    let model = request.model.as_str();
    // Input tokens as a route's admission counts them: from the body.
    let estimate = || flower_model::usage::estimate_tokens(request.body_bytes().len());
    loop {
        let taken = match &config.quota {
            Some(q) => q.admit(model, request.claimant.as_ref(), estimate, observer).await,
            None => 0,
        };
        let result = {
            let _permit = permits.acquire().await.map_err(|e| ProviderError::Connection(e.to_string()))?;
            attempt().await
        };
        let err = match result {
            Ok(r) => {
                if let Some(q) = &config.quota {
                    q.used(model, taken, &r.usage).await;
                }
                return Ok(r);
            }
            Err(e) => e,
        };
        if err.class() != ErrorClass::Retryable {
            return Err(err);
        }
        if n >= config.max_attempts {
            return Err(ProviderError::Exhausted { attempts: n, last: Box::new(err) });
        }
        let wait = config.backoff(n, &err);
        tracing::info!(attempt = n, wait_ms = wait.as_millis() as u64, error = %err, "provider request failed, retrying");
        if let Some(obs) = observer {
            obs(StreamEvent::Retrying { attempt: n, wait, error: err.to_string() });
        }
        tokio::time::sleep(wait).await;
        n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_jittered_and_honours_retry_after() {
        let c = ClientConfig {
            backoff_base: Duration::from_millis(100),
            backoff_cap: Duration::from_millis(1000),
            ..Default::default()
        };
        let e = ProviderError::Connection("x".into());
        for attempt in 1..20 {
            let w = c.backoff(attempt, &e);
            let ceiling = Duration::from_millis(100 * 2u64.pow((attempt - 1).min(16))).min(Duration::from_millis(1000));
            assert!(w <= ceiling && w >= ceiling / 2, "attempt {attempt}: {w:?}");
        }
        let limited = ProviderError::Api {
            status: 429,
            kind: "rate_limit_error".into(),
            message: String::new(),
            retry_after: Some(Duration::from_secs(7)),
        };
        assert_eq!(c.backoff(1, &limited), Duration::from_secs(7));
    }
}
