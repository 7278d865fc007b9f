//! LLM providers. One trait, [`Provider`]; the Anthropic Messages API client
//! ([`anthropic`]) is the first implementation. Requests and responses use the
//! Messages API shapes (`flower_model::ContentBlock` is that shape).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flower_model::{ContentBlock, Usage};
use serde::{Deserialize, Serialize};

pub mod anthropic;
pub mod error;
pub mod sse;

pub use anthropic::{AnthropicClient, AnthropicConfig};
pub use error::{ErrorClass, ProviderError};

/// A tool definition as sent to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub input_schema: serde_json::Value,
}

/// One message of a request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Vec<ContentBlock>,
}

/// A Messages API request (the fields flower uses).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub model: String,
    pub max_tokens: u32,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub system: Vec<SystemBlock>,
    pub messages: Vec<Message>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub tools: Vec<ToolDef>,
    #[serde(default)]
    pub stream: bool,
}

/// A block of the system prompt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SystemBlock {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

impl SystemBlock {
    pub fn text(text: impl Into<String>) -> Self {
        Self { kind: "text".into(), text: text.into() }
    }
}

/// A complete response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub id: String,
    pub model: String,
    pub content: Vec<ContentBlock>,
    pub stop_reason: Option<String>,
    pub usage: Usage,
}

/// Progress of a streamed response, for observers (progress bars, fan-out release).
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// `message_start` arrived: the response began.
    Started,
    /// Some text or tool input arrived.
    Delta { chars: usize },
    /// A retryable failure; the request will be sent again after `wait`.
    Retrying { attempt: u32, wait: Duration, error: String },
}

/// Receives [`StreamEvent`]s while a request runs.
pub type Observer = Arc<dyn Fn(StreamEvent) + Send + Sync>;

/// Where a job's model calls go: the provider its spec names, as configured
/// on this process (an in-process simulator, an endpoint, …).
pub trait ProviderSource: Send + Sync + 'static {
    fn for_job(
        &self,
        job: flower_model::JobId,
        spec: &flower_model::JobSpec,
    ) -> Result<Arc<dyn Provider>, ProviderError>;
}

/// One provider for every job (embedded mode: the run's own provider).
pub struct SingleProvider(pub Arc<dyn Provider>);

impl ProviderSource for SingleProvider {
    fn for_job(
        &self,
        _job: flower_model::JobId,
        _spec: &flower_model::JobSpec,
    ) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(self.0.clone())
    }
}

#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// Send a request and return the complete response. Retryable failures
    /// are retried inside (capped backoff with jitter); what comes out is final.
    async fn send(&self, request: &Request, observer: Option<Observer>) -> Result<Response, ProviderError>;
}
