//! The Anthropic Messages API client: streaming SSE, tool use, usage with the
//! cache fields, retries of one request with capped exponential backoff and
//! full jitter (honouring `retry-after`), and a cap on concurrent calls.

use std::sync::Arc;

use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use tokio::sync::Semaphore;

use super::client::ClientConfig;
use super::error::ProviderError;
use super::sse::Accumulator;
use super::{Observer, Provider, Request, Response};

/// The public endpoint, used when nothing else is configured.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const API_VERSION: &str = "2023-06-01";

/// The Messages API client's settings (the shared [`ClientConfig`]).
pub type AnthropicConfig = ClientConfig;

impl ClientConfig {
    /// `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` from the environment, where set.
    pub fn from_env() -> Self {
        Self::from_env_named("ANTHROPIC", DEFAULT_BASE_URL)
    }
}

pub struct AnthropicClient {
    config: AnthropicConfig,
    http: reqwest::Client,
    permits: Arc<Semaphore>,
}

impl AnthropicClient {
    pub fn new(config: AnthropicConfig) -> Result<Self, ProviderError> {
        let (http, permits) = super::client::http(&config)?;
        Ok(Self { config, http, permits })
    }

    pub fn config(&self) -> &AnthropicConfig {
        &self.config
    }

    fn url(&self) -> String {
        format!("{}/v1/messages", self.config.base_url.trim_end_matches('/'))
    }

    async fn attempt(&self, request: &Request, observer: &Option<Observer>) -> Result<Response, ProviderError> {
        let mut req = self
            .http
            .post(self.url())
            .header("anthropic-version", API_VERSION)
            .header("content-type", "application/json")
            .body(request.body_bytes());
        if let Some(key) = &self.config.api_key {
            req = req.header("x-api-key", key);
        }
        // Lets a simulator audit each session's requests; providers ignore it.
        if let Some(session) = &request.session {
            req = req.header("x-flower-session", session);
        }
        let resp = req.send().await.map_err(|e| ProviderError::Connection(e.to_string()))?;
        super::client::heard(&self.config, &request.model, &resp).await;
        let resp = super::client::api_error(resp).await?;
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
        super::client::retrying(&self.config, &self.permits, &observer, request, || self.attempt(request, &observer))
            .await
    }
}
