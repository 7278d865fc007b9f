//! The Chat Completions client (OpenAI, and the servers that speak its API:
//! vLLM, llama.cpp's server, Ollama). Requests are built from the same
//! [`Request`] as the Messages client's and answers come back in the same
//! [`Response`] shape, so the agent loop does not know which API it talks to.
//!
//! Mapping (docs/design.md section 15):
//! - system blocks → one `system` message; a user message's `tool_result`
//!   blocks → `tool` messages (in order) before the rest of its text; an
//!   assistant's `tool_use` blocks → `tool_calls` with JSON-string
//!   `arguments`. Chat Completions has no error flag on a tool result: an
//!   erroring result's text starts with [`ERROR_PREFIX`].
//! - No cache markers: the provider caches prefixes by itself, so a
//!   [`CachePlan`](super::CachePlan) is not sent; what makes its cache hit is
//!   the same append-only discipline. OpenAI's own endpoint also gets the
//!   session as `prompt_cache_key`, which keeps a session's requests on the
//!   machine holding its prefix.
//! - Streaming with `stream_options.include_usage`: text deltas, tool calls
//!   assembled by `index` from `id`/`name`/`arguments` pieces (parallel calls
//!   interleave), the finish reason, then a last chunk with `usage`.
//! - Usage: `prompt_tokens` includes `prompt_tokens_details.cached_tokens`;
//!   flower's `input_tokens` is the uncached part, `cache_read_input_tokens`
//!   the cached one; there are no cache writes to report.
//! - Finish reasons: `stop` → `end_turn`, `tool_calls` → `tool_use`,
//!   `length` → `max_tokens`, others kept.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use eventsource_stream::Eventsource;
use flower_model::{ContentBlock, ResultBlock, Usage};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::client::ClientConfig;
use super::error::ProviderError;
use super::{Observer, Provider, Request, Response, StreamEvent};

/// The public endpoint, used when nothing else is configured.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How an erroring tool result's text begins (the API has no flag for it).
pub const ERROR_PREFIX: &str = "[error] ";

impl ClientConfig {
    /// `OPENAI_BASE_URL` and `OPENAI_API_KEY` from the environment, where set.
    pub fn openai_from_env() -> Self {
        Self::from_env_named("OPENAI", DEFAULT_BASE_URL)
    }
}

pub struct OpenAiClient {
    config: ClientConfig,
    http: reqwest::Client,
    permits: Arc<Semaphore>,
}

impl OpenAiClient {
    pub fn new(config: ClientConfig) -> Result<Self, ProviderError> {
        let (http, permits) = super::client::http(&config)?;
        Ok(Self { config, http, permits })
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// `…/v1/chat/completions`: a base URL ending in `/v1` (the usual way
    /// these servers are named) gets only the rest.
    fn url(&self) -> String {
        let base = self.config.base_url.trim_end_matches('/');
        if base.ends_with("/v1") { format!("{base}/chat/completions") } else { format!("{base}/v1/chat/completions") }
    }

    async fn attempt(&self, request: &Request, observer: &Option<Observer>) -> Result<Response, ProviderError> {
        let mut body = body(request);
        // OpenAI routes requests with one key to the same cache; other
        // servers (Azure among them) may refuse a field they do not know.
        if let Some(session) = &request.session
            && self.config.base_url.contains("api.openai.com")
        {
            body["prompt_cache_key"] = serde_json::Value::String(session.clone());
        }
        let mut req = self.http.post(self.url()).header("content-type", "application/json").json(&body);
        if let Some(key) = &self.config.api_key {
            req = req.bearer_auth(key);
        }
        if let Some(session) = &request.session {
            req = req.header("x-flower-session", session);
        }
        let resp = req.send().await.map_err(|e| ProviderError::Connection(e.to_string()))?;
        super::client::heard(&self.config, &request.model, &resp).await;
        let resp = super::client::api_error(resp).await?;
        if !request.stream {
            let bytes = resp.bytes().await.map_err(|e| ProviderError::Connection(e.to_string()))?;
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| ProviderError::Malformed(e.to_string()))?;
            return complete(&v);
        }
        let mut events = resp.bytes_stream().eventsource();
        let mut acc = Chunks::default();
        loop {
            let next = tokio::time::timeout(self.config.idle_timeout, events.next())
                .await
                .map_err(|_| ProviderError::StreamDropped(format!("no data for {:?}", self.config.idle_timeout)))?;
            let Some(ev) = next else { break };
            let ev = ev.map_err(|e| ProviderError::StreamDropped(e.to_string()))?;
            if let Some(heard) = acc.push(&ev.data)?
                && let Some(obs) = observer
            {
                obs(heard);
            }
            if acc.done {
                break;
            }
        }
        acc.finish()
    }
}

#[async_trait]
impl Provider for OpenAiClient {
    #[tracing::instrument(name = "llm.call", skip_all, fields(model = %request.model, messages = request.messages.len()))]
    async fn send(&self, request: &Request, observer: Option<Observer>) -> Result<Response, ProviderError> {
        super::client::retrying(&self.config, &self.permits, &observer, request, || self.attempt(request, &observer))
            .await
    }
}

/// The Chat Completions body of a request.
pub fn body(request: &Request) -> Value {
    let mut messages = Vec::new();
    let system: Vec<&str> = request.system.iter().map(|b| b.text.as_str()).collect();
    if !system.is_empty() {
        messages.push(json!({"role": "system", "content": system.join("\n\n")}));
    }
    for m in &request.messages {
        if m.role == "assistant" {
            messages.push(assistant_message(&m.content));
            continue;
        }
        let mut text = Vec::new();
        for b in &m.content {
            match b {
                ContentBlock::ToolResult { tool_use_id, content, is_error } => {
                    let mut t = result_text(content);
                    if *is_error {
                        t.insert_str(0, ERROR_PREFIX);
                    }
                    messages.push(json!({"role": "tool", "tool_call_id": tool_use_id, "content": t}));
                }
                ContentBlock::Text { text: t } => text.push(t.as_str()),
                _ => {}
            }
        }
        if !text.is_empty() {
            messages.push(json!({"role": "user", "content": text.join("\n\n")}));
        }
    }
    let mut v = json!({
        "model": request.model,
        "messages": messages,
        "max_completion_tokens": request.max_tokens,
        "stream": request.stream,
    });
    if request.stream {
        v["stream_options"] = json!({"include_usage": true});
    }
    if !request.tools.is_empty() {
        v["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.input_schema,
                }})
            })
            .collect();
    }
    v
}

fn result_text(content: &[ResultBlock]) -> String {
    content
        .iter()
        .map(|b| match b {
            ResultBlock::Text { text } => text.as_str(),
            ResultBlock::Image { .. } => "[image]",
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn assistant_message(content: &[ContentBlock]) -> Value {
    let text: Vec<&str> = content
        .iter()
        .filter_map(|b| if let ContentBlock::Text { text } = b { Some(text.as_str()) } else { None })
        .collect();
    let calls: Vec<Value> = content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::ToolUse { id, name, input } => Some(json!({
                "id": id, "type": "function",
                // Arguments the model wrote as broken JSON are sent back as written.
                "function": {"name": name, "arguments": match input {
                    Value::String(raw) => raw.clone(),
                    other => other.to_string(),
                }},
            })),
            _ => None,
        })
        .collect();
    let mut m =
        json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text.join("")) }});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

/// A tool call's input from its arguments string (`{}` when empty; the raw
/// text when it is not JSON, so the tool answers with its own error).
fn arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return json!({});
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

fn stop_reason(finish: &str, has_calls: bool) -> String {
    match finish {
        _ if has_calls => "tool_use",
        "stop" => "end_turn",
        "tool_calls" | "function_call" => "tool_use",
        "length" => "max_tokens",
        other => other,
    }
    .to_string()
}

/// Usage in flower's terms (uncached input, cache reads).
pub fn usage_of(u: &Value) -> Usage {
    let prompt = u["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0).min(prompt);
    Usage {
        input_tokens: prompt - cached,
        output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
        cache_read_input_tokens: cached,
        ..Default::default()
    }
}

/// A non-streamed `chat.completion`.
fn complete(v: &Value) -> Result<Response, ProviderError> {
    let choice = v["choices"].get(0).ok_or_else(|| ProviderError::Malformed("no choices".into()))?;
    let message = &choice["message"];
    let mut content = Vec::new();
    if let Some(t) = message["content"].as_str()
        && !t.is_empty()
    {
        content.push(ContentBlock::text(t));
    }
    for c in message["tool_calls"].as_array().into_iter().flatten() {
        content.push(ContentBlock::ToolUse {
            id: c["id"].as_str().unwrap_or_default().to_string(),
            name: c["function"]["name"].as_str().unwrap_or_default().to_string(),
            input: arguments(c["function"]["arguments"].as_str().unwrap_or_default()),
        });
    }
    let has_calls = content.iter().any(|b| matches!(b, ContentBlock::ToolUse { .. }));
    Ok(Response {
        id: v["id"].as_str().unwrap_or_default().to_string(),
        model: v["model"].as_str().unwrap_or_default().to_string(),
        stop_reason: choice["finish_reason"].as_str().map(|f| stop_reason(f, has_calls)),
        content,
        usage: usage_of(&v["usage"]),
    })
}

/// A tool call being streamed.
#[derive(Default)]
struct Call {
    id: String,
    name: String,
    arguments: String,
}

/// Assembles a streamed answer from its `chat.completion.chunk`s.
#[derive(Default)]
pub struct Chunks {
    id: String,
    model: String,
    text: String,
    calls: BTreeMap<u64, Call>,
    finish: Option<String>,
    usage: Option<Usage>,
    started: bool,
    /// `[DONE]` arrived.
    pub done: bool,
}

impl Chunks {
    /// Feed one `data:` payload. Returns what observers should hear, if anything.
    pub fn push(&mut self, data: &str) -> Result<Option<StreamEvent>, ProviderError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(None);
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(None);
        }
        let v: Value =
            serde_json::from_str(data).map_err(|e| ProviderError::Malformed(format!("stream chunk: {e}")))?;
        if v.get("error").is_some_and(|e| e.is_object()) {
            // An error inside the stream: classified as the same error answered up front.
            let status = v["error"]["status"].as_u64().unwrap_or(500) as u16;
            return Err(super::client::error_of(status, &v["error"], data.to_string(), None));
        }
        if self.id.is_empty() {
            self.id = v["id"].as_str().unwrap_or_default().to_string();
            self.model = v["model"].as_str().unwrap_or_default().to_string();
        }
        if v["usage"].is_object() {
            self.usage = Some(usage_of(&v["usage"]));
        }
        let mut chars = 0;
        for choice in v["choices"].as_array().into_iter().flatten() {
            let delta = &choice["delta"];
            if let Some(t) = delta["content"].as_str() {
                self.text.push_str(t);
                chars += t.len();
            }
            for c in delta["tool_calls"].as_array().into_iter().flatten() {
                let index = c["index"].as_u64().unwrap_or(self.calls.len() as u64);
                let call = self.calls.entry(index).or_default();
                if let Some(id) = c["id"].as_str() {
                    call.id.push_str(id);
                }
                if let Some(name) = c["function"]["name"].as_str() {
                    call.name.push_str(name);
                }
                if let Some(a) = c["function"]["arguments"].as_str() {
                    call.arguments.push_str(a);
                    chars += a.len();
                }
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                self.finish = Some(f.to_string());
            }
        }
        if !self.started {
            self.started = true;
            return Ok(Some(StreamEvent::Started));
        }
        Ok((chars > 0).then_some(StreamEvent::Delta { chars }))
    }

    /// The complete response; a stream that ended before its finish reason
    /// (or, asked for, its usage) was dropped.
    pub fn finish(self) -> Result<Response, ProviderError> {
        let Some(finish) = self.finish else {
            return Err(ProviderError::StreamDropped("the stream ended before a finish reason".into()));
        };
        let Some(usage) = self.usage else {
            return Err(ProviderError::StreamDropped("the stream ended before its usage".into()));
        };
        let mut content = Vec::new();
        if !self.text.is_empty() {
            content.push(ContentBlock::text(self.text));
        }
        for (_, c) in self.calls {
            if c.id.is_empty() || c.name.is_empty() {
                return Err(ProviderError::Malformed("a streamed tool call without its id or name".into()));
            }
            content.push(ContentBlock::ToolUse { id: c.id, name: c.name, input: arguments(&c.arguments) });
        }
        let has_calls = content.iter().any(|b| matches!(b, ContentBlock::ToolUse { .. }));
        Ok(Response {
            id: self.id,
            model: self.model,
            stop_reason: Some(stop_reason(&finish, has_calls)),
            content,
            usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Message, SystemBlock, ToolDef};

    #[test]
    fn a_history_becomes_chat_messages() {
        let request = Request {
            model: "gpt-4.1".into(),
            max_tokens: 100,
            system: vec![SystemBlock::text("a"), SystemBlock::text("b")],
            messages: vec![
                Message { role: "user".into(), content: vec![ContentBlock::text("go")] },
                Message {
                    role: "assistant".into(),
                    content: vec![
                        ContentBlock::text("reading"),
                        ContentBlock::ToolUse { id: "c1".into(), name: "Read".into(), input: json!({"p": 1}) },
                        ContentBlock::ToolUse { id: "c2".into(), name: "Bash".into(), input: json!("{broken") },
                    ],
                },
                Message {
                    role: "user".into(),
                    content: vec![
                        ContentBlock::ToolResult {
                            tool_use_id: "c1".into(),
                            content: vec![ResultBlock::Text { text: "one".into() }],
                            is_error: false,
                        },
                        ContentBlock::ToolResult {
                            tool_use_id: "c2".into(),
                            content: vec![ResultBlock::Text { text: "bad".into() }],
                            is_error: true,
                        },
                        ContentBlock::text("and a note"),
                    ],
                },
            ],
            tools: vec![ToolDef { name: "Read".into(), description: "reads".into(), input_schema: json!({}) }],
            stream: true,
            cache: Some(Default::default()),
            ..Default::default()
        };
        let v = body(&request);
        assert_eq!(v["messages"][0], json!({"role": "system", "content": "a\n\nb"}));
        assert_eq!(v["messages"][1], json!({"role": "user", "content": "go"}));
        assert_eq!(v["messages"][2]["tool_calls"][0]["function"]["arguments"], "{\"p\":1}");
        assert_eq!(v["messages"][2]["tool_calls"][1]["function"]["arguments"], "{broken");
        assert_eq!(v["messages"][3], json!({"role": "tool", "tool_call_id": "c1", "content": "one"}));
        assert_eq!(v["messages"][4]["content"], "[error] bad");
        assert_eq!(v["messages"][5], json!({"role": "user", "content": "and a note"}));
        assert_eq!(v["tools"][0]["function"]["name"], "Read");
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert!(!v.to_string().contains("cache_control"), "no markers: the provider caches by itself");
    }

    #[test]
    fn parallel_tool_calls_are_assembled_from_interleaved_deltas() {
        let mut c = Chunks::default();
        let chunks = [
            r#"{"id":"x","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"id":"x","choices":[{"index":0,"delta":{"content":"two calls"}}]}"#,
            r#"{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"Read","arguments":""}}]}}]}"#,
            r#"{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"Glob","arguments":"{\"pat"}}]}}]}"#,
            r#"{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"file_path\":"}}]}}]}"#,
            r#"{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"tern\":\"*\"}"}}]}}]}"#,
            r#"{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"a\"}"}}]}}]}"#,
            r#"{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"id":"x","choices":[],"usage":{"prompt_tokens":2000,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":1536}}}"#,
            "[DONE]",
        ];
        let heard: Vec<_> = chunks.iter().map(|d| c.push(d).unwrap()).collect();
        assert_eq!(heard[0], Some(StreamEvent::Started));
        assert!(c.done);
        let r = c.finish().unwrap();
        assert_eq!(r.stop_reason.as_deref(), Some("tool_use"));
        assert_eq!(r.content[0], ContentBlock::text("two calls"));
        assert_eq!(
            r.content[1],
            ContentBlock::ToolUse { id: "a".into(), name: "Read".into(), input: json!({"file_path": "a"}) }
        );
        assert_eq!(
            r.content[2],
            ContentBlock::ToolUse { id: "b".into(), name: "Glob".into(), input: json!({"pattern": "*"}) }
        );
        assert_eq!((r.usage.input_tokens, r.usage.cache_read_input_tokens, r.usage.output_tokens), (464, 1536, 30));
        assert_eq!(r.usage.context_tokens(), 2000);
    }

    #[test]
    fn a_cut_stream_is_dropped_and_an_error_chunk_is_classified() {
        let mut c = Chunks::default();
        c.push(r#"{"id":"x","choices":[{"index":0,"delta":{"content":"hal"}}]}"#).unwrap();
        assert!(matches!(c.finish(), Err(ProviderError::StreamDropped(_))));
        let mut c = Chunks::default();
        let e = c.push(r#"{"error":{"message":"Overloaded","type":"server_error","code":null}}"#).unwrap_err();
        assert_eq!(e.class(), crate::provider::ErrorClass::Retryable);
    }
}
