//! LLM providers. One trait, [`Provider`], two clients: the Anthropic
//! Messages API ([`anthropic`]) and Chat Completions ([`openai`]), sharing
//! settings and retries ([`client`]); [`table`] is the name → provider table
//! a process is configured with. Requests and responses use the Messages API
//! shapes (`flower_model::ContentBlock` is that shape); the Chat Completions
//! client translates both ways.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flower_model::{ContentBlock, Usage};
use serde::{Deserialize, Serialize};

pub mod anthropic;
pub mod client;
pub mod error;
pub mod openai;
pub mod quota;
pub mod ratelimit;
pub mod sse;
pub mod table;

pub use anthropic::{AnthropicClient, AnthropicConfig};
pub use client::ClientConfig;
pub use error::{ErrorClass, ProviderError};
pub use openai::OpenAiClient;
pub use table::{ConfiguredProviders, ProviderConfigError};

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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// Where the prompt-cache breakpoints go (not serialised as such: the
    /// client writes `cache_control` markers from it).
    #[serde(skip)]
    pub cache: Option<CachePlan>,
    /// How many of `tools` are resident (the rest were loaded); all when unset.
    #[serde(skip)]
    pub resident_tools: Option<usize>,
    /// The session the request belongs to (sent as a header, not in the body).
    #[serde(skip)]
    pub session: Option<String>,
    /// Whose call it is: its place in a rate-limited route's line.
    #[serde(skip)]
    pub claimant: Option<flower_model::quota::Claimant>,
    /// The first messages as already encoded by an earlier request of the
    /// session ([`Encoded`]): written as they are, not encoded again.
    #[serde(skip)]
    pub encoded: Encoded,
}

/// The unmarked JSON of a request's first messages, carried from one request
/// of a session to the next: a long history is encoded once, not once per
/// turn. It holds only messages that no longer change and carry no
/// breakpoint: those before the previous request's last message (that one
/// may still be extended, and the next request marks it). A cache, not
/// content: requests compare equal whatever it holds.
#[derive(Clone, Debug, Default)]
pub struct Encoded {
    messages: std::sync::Arc<Vec<Box<serde_json::value::RawValue>>>,
    /// Their encoded lengths, summed.
    bytes: usize,
    /// The length of the last body written with the session's encoded
    /// messages (shared by the requests that carry them on): the next body's
    /// buffer is allocated at its size at once, where a long history's body
    /// would be copied again at every doubling of a growing buffer.
    last_body: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl PartialEq for Encoded {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Encoded {
    /// How many messages it holds.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The buffer a body carrying these messages is written into: the size
    /// of the last one written, or of the messages themselves, and room to
    /// grow by a turn.
    fn buffer(&self) -> Vec<u8> {
        let size = self.bytes.max(self.last_body.load(std::sync::atomic::Ordering::Relaxed));
        Vec::with_capacity(size + size / 8 + 1024)
    }

    /// This one, extended with `messages[self.len()..upto]` encoded
    /// unmarked (`messages` starting with the ones it holds).
    pub fn extended(mut self, messages: &[Message], upto: usize) -> Self {
        let upto = upto.min(messages.len());
        if upto > self.messages.len() {
            let more = std::sync::Arc::make_mut(&mut self.messages);
            for message in &messages[more.len()..upto] {
                let plain = MarkedMessage { message, marked: [None, None], mark: &serde_json::Value::Null };
                // Into memory, of serializable values: nothing to fail.
                match serde_json::value::to_raw_value(&plain) {
                    Ok(raw) => {
                        self.bytes += raw.get().len();
                        more.push(raw);
                    }
                    Err(_) => break,
                }
            }
        }
        self
    }
}

/// The cache breakpoints (docs/design.md section 6): the last tool (1 h),
/// the last system block (1 h), the previous request's tail (5 min), the
/// current tail (5 min) — never more than 4, longer TTLs first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachePlan {
    /// (message index, block index) of the previous request's last block,
    /// when the history since then was only appended to.
    pub previous_tail: Option<(usize, usize)>,
    /// A naive builder's plan, for comparison: one marker on the current tail.
    pub tail_only: bool,
}

impl Request {
    /// The request body with the cache plan's `cache_control` markers, as a
    /// value tree: the plain statement of the rule, which the body sent
    /// ([`Request::body_bytes`]) is checked against.
    #[cfg(test)]
    pub fn body(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        let Some(plan) = self.cache else { return v };
        let one_hour = serde_json::json!({"type": "ephemeral", "ttl": "1h"});
        let five_min = serde_json::json!({"type": "ephemeral"});
        // The tool block's marker goes on the last *resident* tool: loaded
        // schemas come after it and the block before them still hits.
        let resident = self.resident_tools.unwrap_or(self.tools.len());
        if !plan.tail_only
            && let Some(last) = resident.checked_sub(1).and_then(|i| v.get_mut("tools")?.as_array_mut()?.get_mut(i))
        {
            last["cache_control"] = one_hour.clone();
        }
        if !plan.tail_only
            && let Some(last) = v.get_mut("system").and_then(|s| s.as_array_mut()?.last_mut())
        {
            last["cache_control"] = one_hour;
        }
        let current = self.messages.len().checked_sub(1).map(|m| (m, self.messages[m].content.len().saturating_sub(1)));
        let previous = if plan.tail_only { None } else { plan.previous_tail };
        for (m, b) in [previous, current].into_iter().flatten() {
            if let Some(block) = v["messages"][m]["content"].get_mut(b)
                && block.is_object()
            {
                block["cache_control"] = five_min.clone();
            }
        }
        v
    }

    /// The request body as JSON, with the cache plan's `cache_control`
    /// markers (the last resident tool and the last system block 1 h, the
    /// previous request's tail and the current one 5 min), written straight
    /// from the request: no value tree of the whole history is built (a long
    /// main thread's request is megabytes of blocks, most of them unmarked).
    pub fn body_bytes(&self) -> Vec<u8> {
        let mut body = self.encoded.buffer();
        // Into memory, of serializable values: nothing to fail.
        if serde_json::to_writer(&mut body, &Marked(self)).is_err() {
            body.clear();
        }
        self.encoded.last_body.store(body.len(), std::sync::atomic::Ordering::Relaxed);
        body
    }

    /// Where this request's tail is: the next request's `previous_tail`.
    pub fn tail(&self) -> Option<(usize, usize)> {
        self.messages.len().checked_sub(1).map(|m| (m, self.messages[m].content.len().saturating_sub(1)))
    }
}

/// A request as its body, with the cache plan's markers ([`Request::body_bytes`]).
struct Marked<'a>(&'a Request);

/// A value serialized as itself, or with a `cache_control` marker added
/// when it is an object.
struct WithMark<'a, T>(&'a T, Option<&'a serde_json::Value>);

impl<T: Serialize> Serialize for WithMark<'_, T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(mark) = self.1 else { return self.0.serialize(s) };
        let mut v = serde_json::to_value(self.0).map_err(serde::ser::Error::custom)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("cache_control".into(), mark.clone());
        }
        v.serialize(s)
    }
}

/// One message, its blocks at `marked` carrying `mark`.
struct MarkedMessage<'a> {
    message: &'a Message,
    marked: [Option<usize>; 2],
    mark: &'a serde_json::Value,
}

impl Serialize for MarkedMessage<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let blocks = self.message.content.iter().enumerate().map(|(i, b)| {
            let mark = self.marked.contains(&Some(i)).then_some(self.mark);
            WithMark(b, mark)
        });
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("role", &self.message.role)?;
        m.serialize_entry("content", &Seq(std::cell::Cell::new(Some(blocks))))?;
        m.end()
    }
}

/// A message encoded before, or encoded now.
enum Either<'a> {
    Encoded(&'a serde_json::value::RawValue),
    Fresh(MarkedMessage<'a>),
}

impl Serialize for Either<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Either::Encoded(raw) => raw.serialize(s),
            Either::Fresh(m) => m.serialize(s),
        }
    }
}

/// An iterator serialized as a sequence (once).
struct Seq<I>(std::cell::Cell<Option<I>>);

impl<I: Iterator<Item = T>, T: Serialize> Serialize for Seq<I> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.take().into_iter().flatten())
    }
}

impl Serialize for Marked<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let r = self.0;
        let one_hour = serde_json::json!({"type": "ephemeral", "ttl": "1h"});
        let five_min = serde_json::json!({"type": "ephemeral"});
        let long = r.cache.filter(|plan| !plan.tail_only);
        // The last resident tool, the last system
        // block, the previous request's tail and the current one.
        let tool_mark = long.and_then(|_| r.resident_tools.unwrap_or(r.tools.len()).checked_sub(1));
        let system_mark = long.and_then(|_| r.system.len().checked_sub(1));
        let tails = match r.cache {
            Some(plan) => [if plan.tail_only { None } else { plan.previous_tail }, r.tail()],
            None => [None, None],
        };
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("model", &r.model)?;
        m.serialize_entry("max_tokens", &r.max_tokens)?;
        if !r.system.is_empty() {
            let blocks =
                r.system.iter().enumerate().map(|(i, b)| WithMark(b, (system_mark == Some(i)).then_some(&one_hour)));
            m.serialize_entry("system", &Seq(std::cell::Cell::new(Some(blocks))))?;
        }
        let messages = r.messages.iter().enumerate().map(|(i, message)| {
            let marked = tails.map(|t| t.filter(|(m, _)| *m == i).map(|(_, b)| b));
            match r.encoded.messages.get(i) {
                Some(raw) if marked == [None, None] => Either::Encoded(raw),
                _ => Either::Fresh(MarkedMessage { message, marked, mark: &five_min }),
            }
        });
        m.serialize_entry("messages", &Seq(std::cell::Cell::new(Some(messages))))?;
        if !r.tools.is_empty() {
            let tools =
                r.tools.iter().enumerate().map(|(i, t)| WithMark(t, (tool_mark == Some(i)).then_some(&one_hour)));
            m.serialize_entry("tools", &Seq(std::cell::Cell::new(Some(tools))))?;
        }
        m.serialize_entry("stream", &r.stream)?;
        m.end()
    }
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
    /// The request waits `wait` for its route's rate limits (`limit`:
    /// `requests`, `input tokens` or `output tokens`) before it is sent.
    WaitingForQuota { route: String, wait: Duration, limit: &'static str },
}

/// Receives [`StreamEvent`]s while a request runs.
pub type Observer = Arc<dyn Fn(StreamEvent) + Send + Sync>;

/// Where a job's model calls go: the provider a role's route names, as
/// configured on this process (an in-process simulator, an endpoint, …).
pub trait ProviderSource: Send + Sync + 'static {
    fn for_job(
        &self,
        job: flower_model::JobId,
        spec: &flower_model::JobSpec,
        route: flower_model::spec::Route,
    ) -> Result<Arc<dyn Provider>, ProviderError>;
}

/// One run's providers by route (embedded mode: the run's own clients).
pub struct RunProviders(pub Vec<(flower_model::spec::Route, Arc<dyn Provider>)>);

impl ProviderSource for RunProviders {
    fn for_job(
        &self,
        _job: flower_model::JobId,
        _spec: &flower_model::JobSpec,
        route: flower_model::spec::Route,
    ) -> Result<Arc<dyn Provider>, ProviderError> {
        self.0.iter().find(|(r, _)| *r == route).map(|(_, p)| p.clone()).ok_or_else(|| ProviderError::Api {
            status: 400,
            kind: "not_configured".into(),
            message: format!("no client for provider `{}` ({}) in this run", route.entry.name(), route.api.name()),
            retry_after: None,
        })
    }
}

#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// Send a request and return the complete response. Retryable failures
    /// are retried inside (capped backoff with jitter); what comes out is final.
    async fn send(&self, request: &Request, observer: Option<Observer>) -> Result<Response, ProviderError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_written_straight_is_the_body() {
        let block = |t: &str| ContentBlock::text(t);
        let base = Request {
            model: "m".into(),
            max_tokens: 100,
            system: vec![SystemBlock::text("a"), SystemBlock::text("b")],
            messages: vec![
                Message { role: "user".into(), content: vec![block("one"), block("two")] },
                Message { role: "assistant".into(), content: vec![block("three")] },
                Message { role: "user".into(), content: vec![block("four"), block("five")] },
            ],
            tools: (0..3)
                .map(|i| ToolDef {
                    name: format!("t{i}"),
                    description: "d".into(),
                    input_schema: serde_json::json!({"type": "object"}),
                })
                .collect(),
            stream: true,
            ..Default::default()
        };
        let plans = [
            None,
            Some(CachePlan::default()),
            Some(CachePlan { previous_tail: Some((0, 1)), tail_only: false }),
            Some(CachePlan { previous_tail: Some((0, 1)), tail_only: true }),
        ];
        for plan in plans {
            for resident in [None, Some(2), Some(0)] {
                for bare in [false, true] {
                    let mut r = Request { cache: plan, resident_tools: resident, ..base.clone() };
                    if bare {
                        (r.system, r.tools) = (Vec::new(), Vec::new());
                    }
                    let bytes = r.body_bytes();
                    let written: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                    assert_eq!(written, r.body(), "plan {plan:?}, resident {resident:?}, bare {bare}");
                    // Messages encoded before are written as they were:
                    // the same bytes, marked ones encoded again.
                    for upto in 0..=r.messages.len() {
                        let encoded = Encoded::default().extended(&r.messages, upto);
                        assert_eq!(encoded.len(), upto);
                        let again = Request { encoded, ..r.clone() };
                        assert_eq!(again.body_bytes(), bytes, "plan {plan:?}, {upto} encoded");
                    }
                }
            }
        }
        let marked = Request { cache: plans[2], ..base };
        let body = marked.body();
        assert!(body["messages"][0]["content"][1]["cache_control"].is_object(), "the test covers markers");
    }

    #[test]
    fn a_body_is_written_into_a_buffer_of_the_last_ones_size() {
        let message = |i: usize| Message { role: "user".into(), content: vec![ContentBlock::text(format!("m{i}"))] };
        let messages: Vec<Message> = (0..200).map(message).collect();
        let encoded = Encoded::default().extended(&messages, 199);
        let plain: usize = messages[..199]
            .iter()
            .map(|m| {
                serde_json::to_vec(&MarkedMessage { message: m, marked: [None, None], mark: &serde_json::Value::Null })
                    .unwrap()
                    .len()
            })
            .sum();
        assert_eq!(encoded.bytes, plain, "the encoded messages' lengths, summed");
        let request = Request { model: "m".into(), max_tokens: 1, messages, encoded, ..Default::default() };
        let planned = request.encoded.buffer().capacity();
        let first = request.body_bytes();
        assert_eq!(first.capacity(), planned, "written without growing its buffer ({} bytes)", first.len());
        // The next request of the session (a turn more) starts from it.
        let mut messages = request.messages.clone();
        messages.push(message(200));
        let encoded = request.encoded.clone().extended(&request.messages, 200);
        let next = Request { messages, encoded, ..request };
        let planned = next.encoded.buffer().capacity();
        assert!(planned > first.len() + first.len() / 8, "sized from the last body");
        let body = next.body_bytes();
        assert_eq!(body.capacity(), planned);
        let written: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(written["messages"].as_array().map(Vec::len), Some(201));
    }
}
