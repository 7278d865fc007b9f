//! The Anthropic Messages API client: streaming SSE, tool use, usage with the
//! cache fields, retries of one request with capped exponential backoff and
//! full jitter (honouring `retry-after`), and a cap on concurrent calls.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use rand::Rng;
use tokio::sync::Semaphore;

use super::error::{ErrorClass, ProviderError};
use super::sse::Accumulator;
use super::{Observer, Provider, Request, Response, StreamEvent};

/// The public endpoint, used when nothing else is configured.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const API_VERSION: &str = "2023-06-01";

#[derive(Clone, Debug)]
pub struct AnthropicConfig {
    /// Without the `/v1/messages` path.
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
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.into(),
            api_key: None,
            max_attempts: 6,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(30),
            max_concurrent: 16,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

impl AnthropicConfig {
    /// `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` from the environment, where set.
    pub fn from_env() -> Self {
        let mut c = Self::default();
        if let Ok(url) = std::env::var("ANTHROPIC_BASE_URL")
            && !url.trim().is_empty()
        {
            c.base_url = url;
        }
        c.api_key = std::env::var("ANTHROPIC_API_KEY").ok().filter(|k| !k.is_empty());
        c
    }
}

pub struct AnthropicClient {
    config: AnthropicConfig,
    http: reqwest::Client,
    permits: Arc<Semaphore>,
}

impl AnthropicClient {
    pub fn new(config: AnthropicConfig) -> Result<Self, ProviderError> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| ProviderError::Connection(e.to_string()))?;
        let permits = Arc::new(Semaphore::new(config.max_concurrent.max(1)));
        Ok(Self { config, http, permits })
    }

    pub fn config(&self) -> &AnthropicConfig {
        &self.config
    }

    fn url(&self) -> String {
        format!("{}/v1/messages", self.config.base_url.trim_end_matches('/'))
    }

    /// The wait before retry number `attempt` (1 = first retry).
    fn backoff(&self, attempt: u32, err: &ProviderError) -> Duration {
        if let Some(after) = err.retry_after() {
            return after.min(Duration::from_secs(300));
        }
        let exp = self.config.backoff_base.saturating_mul(1u32 << (attempt - 1).min(16));
        let ceiling = exp.min(self.config.backoff_cap);
        // Full jitter: uniformly in [ceiling/2, ceiling], so a fan-out's retries spread.
        let ms = ceiling.as_millis() as u64;
        Duration::from_millis(rand::rng().random_range(ms / 2..=ms.max(1)))
    }

    async fn attempt(&self, request: &Request, observer: &Option<Observer>) -> Result<Response, ProviderError> {
        let mut req = self
            .http
            .post(self.url())
            .header("anthropic-version", API_VERSION)
            .header("content-type", "application/json")
            .json(&request.body());
        if let Some(key) = &self.config.api_key {
            req = req.header("x-api-key", key);
        }
        // Lets a simulator audit each session's requests; providers ignore it.
        if let Some(session) = &request.session {
            req = req.header("x-flower-session", session);
        }
        let resp = req.send().await.map_err(|e| ProviderError::Connection(e.to_string()))?;
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64);
            let body = resp.text().await.unwrap_or_default();
            let parsed: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            return Err(ProviderError::Api {
                status,
                kind: parsed["error"]["type"].as_str().unwrap_or("http_error").to_string(),
                message: parsed["error"]["message"].as_str().map(str::to_string).unwrap_or(body),
                retry_after,
            });
        }
        if !request.stream {
            let body = resp.bytes().await.map_err(|e| ProviderError::Connection(e.to_string()))?;
            return serde_json::from_slice(&body).map_err(|e| ProviderError::Malformed(e.to_string()));
        }
        let mut events = resp.bytes_stream().eventsource();
        let mut acc = Accumulator::default();
        loop {
            let next = tokio::time::timeout(self.config.idle_timeout, events.next())
                .await
                .map_err(|_| ProviderError::StreamDropped(format!("no data for {:?}", self.config.idle_timeout)))?;
            let Some(ev) = next else { break };
            let ev = ev.map_err(|e| ProviderError::StreamDropped(e.to_string()))?;
            if let Some(heard) = acc.push(&ev.event, &ev.data)?
                && let Some(obs) = observer
            {
                obs(heard);
            }
        }
        acc.finish()
    }
}

#[async_trait]
impl Provider for AnthropicClient {
    #[tracing::instrument(name = "llm.call", skip_all, fields(model = %request.model, messages = request.messages.len()))]
    async fn send(&self, request: &Request, observer: Option<Observer>) -> Result<Response, ProviderError> {
        let mut attempt = 1;
        loop {
            let result = {
                let _permit = self.permits.acquire().await.map_err(|e| ProviderError::Connection(e.to_string()))?;
                self.attempt(request, &observer).await
            };
            let err = match result {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            if err.class() != ErrorClass::Retryable {
                return Err(err);
            }
            if attempt >= self.config.max_attempts {
                return Err(ProviderError::Exhausted { attempts: attempt, last: Box::new(err) });
            }
            let wait = self.backoff(attempt, &err);
            tracing::info!(attempt, wait_ms = wait.as_millis() as u64, error = %err, "provider request failed, retrying");
            if let Some(obs) = &observer {
                obs(StreamEvent::Retrying { attempt, wait, error: err.to_string() });
            }
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_jittered_and_honours_retry_after() {
        let c = AnthropicClient::new(AnthropicConfig {
            backoff_base: Duration::from_millis(100),
            backoff_cap: Duration::from_millis(1000),
            ..Default::default()
        })
        .unwrap();
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
