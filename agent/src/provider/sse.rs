//! Assembling a streamed Messages API response from its SSE events.
//!
//! Event order: `message_start` → per block `content_block_start`,
//! `content_block_delta`…, `content_block_stop` → `message_delta` (stop reason,
//! cumulative usage) → `message_stop`. `ping` and unknown events are ignored;
//! an `error` event ends the stream with that error.

use flower_model::{ContentBlock, Usage};
use serde_json::Value;

use super::error::ProviderError;
use super::{Response, StreamEvent};

/// A block being streamed.
enum Partial {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    /// A block type flower does not interpret; kept as the start payload.
    Other(Value),
}

#[derive(Default)]
pub struct Accumulator {
    id: String,
    model: String,
    blocks: Vec<Option<Partial>>,
    stop_reason: Option<String>,
    usage: Usage,
    started: bool,
    stopped: bool,
}

fn malformed(what: impl std::fmt::Display) -> ProviderError {
    ProviderError::Malformed(what.to_string())
}

fn usage_of(v: &Value) -> Result<Usage, ProviderError> {
    serde_json::from_value(v.clone()).map_err(|e| malformed(format!("usage: {e}")))
}

impl Accumulator {
    /// Feed one SSE event. Returns what observers should hear, if anything.
    pub fn push(&mut self, event: &str, data: &str) -> Result<Option<StreamEvent>, ProviderError> {
        if event == "ping" || data.trim().is_empty() {
            return Ok(None);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| malformed(format!("event `{event}`: {e}")))?;
        let kind = v.get("type").and_then(Value::as_str).unwrap_or(event);
        match kind {
            "message_start" => return self.message_start(&v).map(Some),
            "content_block_start" => self.block_start(&v)?,
            "content_block_delta" => return self.block_delta(&v).map(Some),
            "message_delta" => {
                if let Some(r) = v["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(r.to_string());
                }
                if v.get("usage").is_some() {
                    // Counts in message_delta are cumulative.
                    self.usage.merge_cumulative(&usage_of(&v["usage"])?);
                }
            }
            "message_stop" => self.stopped = true,
            "error" => {
                let e = &v["error"];
                return Err(ProviderError::Api {
                    status: 200,
                    kind: e["type"].as_str().unwrap_or("error").to_string(),
                    message: e["message"].as_str().unwrap_or_default().to_string(),
                    retry_after: None,
                });
            }
            // content_block_stop, and event types added after this was written.
            _ => {}
        }
        Ok(None)
    }

    /// `message_start`: the response's id, model and first usage.
    fn message_start(&mut self, v: &Value) -> Result<StreamEvent, ProviderError> {
        let m = &v["message"];
        self.id = m["id"].as_str().unwrap_or_default().to_string();
        self.model = m["model"].as_str().unwrap_or_default().to_string();
        self.usage = usage_of(&m["usage"])?;
        self.started = true;
        Ok(StreamEvent::Started)
    }

    /// `content_block_start`: a new block at its index.
    fn block_start(&mut self, v: &Value) -> Result<(), ProviderError> {
        let index = index_of(v)?;
        let b = &v["content_block"];
        let partial = match b["type"].as_str() {
            Some("text") => Partial::Text(b["text"].as_str().unwrap_or_default().to_string()),
            Some("tool_use") => Partial::ToolUse {
                id: b["id"].as_str().ok_or_else(|| malformed("tool_use without id"))?.to_string(),
                name: b["name"].as_str().ok_or_else(|| malformed("tool_use without name"))?.to_string(),
                json: String::new(),
            },
            Some("thinking") => Partial::Thinking {
                thinking: b["thinking"].as_str().unwrap_or_default().to_string(),
                signature: String::new(),
            },
            _ => Partial::Other(b.clone()),
        };
        if self.blocks.len() <= index {
            self.blocks.resize_with(index + 1, || None);
        }
        self.blocks[index] = Some(partial);
        Ok(())
    }

    /// `content_block_delta`: a piece of a started block; observers hear how
    /// many characters arrived.
    fn block_delta(&mut self, v: &Value) -> Result<StreamEvent, ProviderError> {
        let index = index_of(v)?;
        let d = &v["delta"];
        let block = self
            .blocks
            .get_mut(index)
            .and_then(Option::as_mut)
            .ok_or_else(|| malformed("delta for an unknown block"))?;
        let piece = |k: &str| d[k].as_str().unwrap_or_default();
        let chars = match (d["type"].as_str(), block) {
            (Some("text_delta"), Partial::Text(t)) => {
                t.push_str(piece("text"));
                piece("text").len()
            }
            (Some("input_json_delta"), Partial::ToolUse { json, .. }) => {
                json.push_str(piece("partial_json"));
                piece("partial_json").len()
            }
            (Some("thinking_delta"), Partial::Thinking { thinking, .. }) => {
                thinking.push_str(piece("thinking"));
                piece("thinking").len()
            }
            (Some("signature_delta"), Partial::Thinking { signature, .. }) => {
                signature.push_str(piece("signature"));
                0
            }
            // citations_delta and future delta types: nothing to assemble.
            _ => 0,
        };
        Ok(StreamEvent::Delta { chars })
    }

    /// The assembled response; a stream that never reached `message_stop` was dropped.
    pub fn finish(self) -> Result<Response, ProviderError> {
        if !self.started || !self.stopped {
            return Err(ProviderError::StreamDropped("the stream ended before message_stop".into()));
        }
        let mut content = Vec::with_capacity(self.blocks.len());
        for block in self.blocks.into_iter().flatten() {
            content.push(match block {
                Partial::Text(text) => ContentBlock::Text { text },
                Partial::ToolUse { id, name, json } => {
                    let input = if json.trim().is_empty() {
                        Value::Object(Default::default())
                    } else {
                        serde_json::from_str(&json).map_err(|e| malformed(format!("tool input of {name}: {e}")))?
                    };
                    ContentBlock::ToolUse { id, name, input }
                }
                Partial::Thinking { thinking, signature } => ContentBlock::Thinking { thinking, signature },
                Partial::Other(v) => {
                    serde_json::from_value(v.clone()).map_err(|_| malformed(format!("unsupported block {v}")))?
                }
            });
        }
        Ok(Response { id: self.id, model: self.model, content, stop_reason: self.stop_reason, usage: self.usage })
    }
}

fn index_of(v: &Value) -> Result<usize, ProviderError> {
    v["index"].as_u64().map(|i| i as usize).ok_or_else(|| malformed("event without index"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn assembles_text_and_tool_use_with_cumulative_usage() {
        let mut acc = Accumulator::default();
        let events = [
            (
                "message_start",
                json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"usage":{"input_tokens":10,"output_tokens":1,"cache_read_input_tokens":5}}}),
            ),
            ("ping", json!({"type":"ping"})),
            (
                "content_block_start",
                json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}),
            ),
            ("content_block_stop", json!({"type":"content_block_stop","index":0})),
            (
                "content_block_start",
                json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"Read","input":{}}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"file_"}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"path\": \"a\"}"}}),
            ),
            ("content_block_stop", json!({"type":"content_block_stop","index":1})),
            ("some_future_event", json!({"type":"some_future_event"})),
            (
                "message_delta",
                json!({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42}}),
            ),
            ("message_stop", json!({"type":"message_stop"})),
        ];
        for (e, d) in events {
            acc.push(e, &d.to_string()).unwrap();
        }
        let r = acc.finish().unwrap();
        assert_eq!(
            r.content,
            vec![
                ContentBlock::text("Hello"),
                ContentBlock::ToolUse { id: "toolu_1".into(), name: "Read".into(), input: json!({"file_path": "a"}) },
            ]
        );
        assert_eq!(r.stop_reason.as_deref(), Some("tool_use"));
        assert_eq!((r.usage.input_tokens, r.usage.output_tokens, r.usage.cache_read_input_tokens), (10, 42, 5));
    }

    #[test]
    fn a_stream_without_message_stop_was_dropped() {
        let mut acc = Accumulator::default();
        acc.push(
            "message_start",
            &json!({"type":"message_start","message":{"id":"m","model":"m","usage":{}}}).to_string(),
        )
        .unwrap();
        assert!(matches!(acc.finish(), Err(ProviderError::StreamDropped(_))));
    }

    #[test]
    fn an_error_event_is_an_api_error() {
        let mut acc = Accumulator::default();
        let err = acc
            .push("error", r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#)
            .unwrap_err();
        assert_eq!(err.class(), super::super::ErrorClass::Retryable);
    }
}
