//! Chat Completions (`POST /v1/chat/completions`, streaming and not): the
//! same scenarios as the Messages API, answered in OpenAI's shapes.
//!
//! A request is translated to the Messages shape the engine plays
//! (`system`/`developer` messages → `system`; `tool` messages → `tool_result`
//! blocks of the next user turn; `tool_calls` → `tool_use` blocks), so role
//! matching, steps, branches, handoffs and faults behave alike. A tool
//! result whose text begins `[error] ` is an erroring one (the API has no
//! flag; flower's client writes that prefix).
//!
//! Shapes emitted, as OpenAI documents them:
//!
//! Non-streaming: `{"id":"chatcmpl-…","object":"chat.completion","created":…,
//! "model":…,"choices":[{"index":0,"message":{"role":"assistant","content":…,
//! "tool_calls":[{"id":…,"type":"function","function":{"name":…,"arguments":"…"}}]},
//! "finish_reason":"stop"|"tool_calls"}],"usage":{…}}`.
//!
//! Streaming (`text/event-stream`, `data: <json>\n\n` frames, no `event:`
//! lines): a first chunk with `delta.role`; text in `delta.content`
//! pieces; each tool call's first chunk with its `index`, `id`, `type` and
//! `function.name`, then `function.arguments` pieces by `index`; a chunk with
//! `finish_reason`; with `stream_options.include_usage`, a chunk with empty
//! `choices` and the `usage`; then `data: [DONE]`.
//!
//! Usage: `prompt_tokens` (cached included), `completion_tokens`,
//! `total_tokens`, `prompt_tokens_details.cached_tokens` from the automatic
//! prefix cache ([`crate::cache::AutomaticCache`]).
//!
//! Errors: `{"error":{"message":…,"type":…,"param":…,"code":…}}` — 400
//! `invalid_request_error`, a too-long prompt with code
//! `context_length_exceeded` and OpenAI's words, 429 `rate_limit_exceeded`,
//! 503 `server_error` for an overloaded provider, 500 `server_error`.

use serde_json::{Value, json};

use crate::engine::Planned;

/// The Messages-shaped body the engine plays for a Chat Completions request,
/// or the API's 400 message.
pub fn to_messages_body(chat: &Value) -> Result<Value, String> {
    let Some(model) = chat["model"].as_str() else { return Err("you must provide a model parameter".into()) };
    let Some(list) = chat["messages"].as_array() else {
        return Err("Missing required parameter: 'messages'.".into());
    };
    let max_tokens = chat["max_completion_tokens"].as_u64().or_else(|| chat["max_tokens"].as_u64()).unwrap_or(4096);
    let mut system = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    let push = |messages: &mut Vec<Value>, role: &str, block: Value| match messages.last_mut() {
        Some(last) if last["role"] == role => {
            if let Some(a) = last["content"].as_array_mut() {
                a.push(block)
            }
        }
        _ => messages.push(json!({"role": role, "content": [block]})),
    };
    for (i, m) in list.iter().enumerate() {
        match m["role"].as_str() {
            Some("system" | "developer") => system.push(text_of(&m["content"])),
            Some("user") => push(&mut messages, "user", json!({"type": "text", "text": text_of(&m["content"])})),
            Some("assistant") => {
                let text = text_of(&m["content"]);
                let calls = m["tool_calls"].as_array().cloned().unwrap_or_default();
                if !text.is_empty() || calls.is_empty() {
                    push(&mut messages, "assistant", json!({"type": "text", "text": text}));
                }
                for (k, c) in calls.iter().enumerate() {
                    let (Some(id), Some(name)) = (c["id"].as_str(), c["function"]["name"].as_str()) else {
                        return Err(format!("messages[{i}].tool_calls[{k}]: `id` and `function.name` are required"));
                    };
                    let raw = c["function"]["arguments"].as_str().unwrap_or("{}");
                    let input = serde_json::from_str::<Value>(raw).unwrap_or_else(|_| Value::String(raw.into()));
                    push(
                        &mut messages,
                        "assistant",
                        json!({"type": "tool_use", "id": id, "name": name, "input": input}),
                    );
                }
            }
            Some("tool") => {
                let Some(id) = m["tool_call_id"].as_str() else {
                    return Err(format!("messages[{i}]: missing required parameter 'tool_call_id'"));
                };
                let text = text_of(&m["content"]);
                let (is_error, text) = match text.strip_prefix("[error] ") {
                    Some(rest) => (true, rest.to_string()),
                    None => (false, text),
                };
                let block = json!({"type": "tool_result", "tool_use_id": id, "content": text, "is_error": is_error});
                push(&mut messages, "user", block);
            }
            other => {
                return Err(format!(
                    "Invalid value: '{}'. Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'. (messages[{i}].role)",
                    other.unwrap_or_default()
                ));
            }
        }
    }
    let mut tools = Vec::new();
    for (i, t) in chat["tools"].as_array().into_iter().flatten().enumerate() {
        if t["type"] != "function" {
            return Err(format!("Invalid value for 'tools[{i}].type': expected 'function'."));
        }
        let f = &t["function"];
        tools.push(json!({
            "name": f["name"], "description": f["description"].as_str().unwrap_or_default(),
            "input_schema": if f["parameters"].is_object() { f["parameters"].clone() } else { json!({"type": "object"}) },
        }));
    }
    let mut body = json!({
        "model": model, "max_tokens": max_tokens, "messages": messages,
        "stream": chat["stream"].as_bool().unwrap_or(false),
    });
    if !system.is_empty() {
        body["system"] = Value::String(system.join("\n\n"));
    }
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    Ok(body)
}

/// Text of a Chat Completions content: a string, parts (`text` parts
/// joined), or null.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(""),
        _ => String::new(),
    }
}

/// The error body and status for an engine error, in OpenAI's shape.
pub fn error(status: u16, kind: &str, message: &str) -> (u16, Value) {
    let (status, kind, code) = match (status, kind) {
        (_, "context_length_exceeded") => (400, "invalid_request_error", Some("context_length_exceeded")),
        (429, _) => (429, "requests", Some("rate_limit_exceeded")),
        (529, _) | (_, "overloaded_error") => (503, "server_error", None),
        (500..=599, _) => (status, "server_error", None),
        (401, _) => (401, "invalid_request_error", Some("invalid_api_key")),
        _ => (status, "invalid_request_error", None),
    };
    (status, json!({"error": {"message": message, "type": kind, "param": null, "code": code}}))
}

/// OpenAI's words for a prompt over the window.
pub fn too_long(window: u64, tokens: u64) -> String {
    format!(
        "This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."
    )
}

fn finish_reason(p: &Planned) -> &'static str {
    if p.stop_reason == "tool_use" { "tool_calls" } else { "stop" }
}

/// The usage object.
pub fn usage(p: &Planned) -> Value {
    let c = &p.cache;
    let prompt = p.input_tokens + c.cache_read + c.cache_write_5m + c.cache_write_1h;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": p.output_tokens,
        "total_tokens": prompt + p.output_tokens,
        "prompt_tokens_details": {"cached_tokens": c.cache_read, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    })
}

fn tool_calls(p: &Planned) -> Vec<Value> {
    p.content
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| json!({"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["input"].to_string()}}))
        .collect()
}

fn text(p: &Planned) -> String {
    p.content.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("")
}

fn created() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn completion_id(p: &Planned) -> String {
    format!("chatcmpl-{}", p.id.trim_start_matches("msg_"))
}

/// A non-streamed `chat.completion`.
pub fn completion(p: &Planned) -> Value {
    let calls = tool_calls(p);
    let text = text(p);
    let mut message = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) }, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": completion_id(p), "object": "chat.completion", "created": created(), "model": p.model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason(p)}],
        "usage": usage(p),
    })
}

/// The streamed chunks' payloads in order (without the final `[DONE]`),
/// each text or arguments piece about `piece` bytes.
pub fn chunks(p: &Planned, include_usage: bool, split: impl Fn(&str) -> Vec<String>) -> Vec<Value> {
    let (id, created) = (completion_id(p), created());
    let chunk = |choices: Value| json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": p.model, "choices": choices});
    let mut out =
        vec![chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]))];
    for piece in split(&text(p)) {
        out.push(chunk(json!([{"index": 0, "delta": {"content": piece}, "finish_reason": null}])));
    }
    for (k, call) in tool_calls(p).iter().enumerate() {
        let head = json!({"index": k, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}});
        out.push(chunk(json!([{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": null}])));
        for piece in split(call["function"]["arguments"].as_str().unwrap_or_default()) {
            let d = json!({"index": k, "function": {"arguments": piece}});
            out.push(chunk(json!([{"index": 0, "delta": {"tool_calls": [d]}, "finish_reason": null}])));
        }
    }
    out.push(chunk(json!([{"index": 0, "delta": {}, "finish_reason": finish_reason(p)}])));
    if include_usage {
        let mut last = chunk(json!([]));
        last["usage"] = usage(p);
        out.push(last);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_history_becomes_the_messages_shape() {
        let chat = json!({
            "model": "gpt-4.1", "max_completion_tokens": 50,
            "messages": [
                {"role": "system", "content": "you are the coordinator"},
                {"role": "user", "content": [{"type": "text", "text": "go"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "Read", "arguments": "{\"p\":1}"}},
                    {"id": "b", "type": "function", "function": {"name": "Bash", "arguments": "{"}}]},
                {"role": "tool", "tool_call_id": "a", "content": "one"},
                {"role": "tool", "tool_call_id": "b", "content": "[error] exit 1"},
                {"role": "user", "content": "note"},
            ],
            "tools": [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}],
        });
        let b = to_messages_body(&chat).unwrap();
        assert_eq!(b["system"], "you are the coordinator");
        assert_eq!(b["max_tokens"], 50);
        let m = b["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m[1]["content"][0], json!({"type": "tool_use", "id": "a", "name": "Read", "input": {"p": 1}}));
        assert_eq!(m[1]["content"][1]["input"], "{");
        assert_eq!(m[2]["content"][0]["is_error"], false);
        assert_eq!(
            m[2]["content"][1],
            json!({"type": "tool_result", "tool_use_id": "b", "content": "exit 1", "is_error": true})
        );
        assert_eq!(m[2]["content"][2], json!({"type": "text", "text": "note"}));
        assert_eq!(b["tools"][0]["name"], "Read");
        assert!(
            to_messages_body(&json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}))
                .unwrap_err()
                .contains("messages[0].role")
        );
        assert!(to_messages_body(&json!({"messages": []})).unwrap_err().contains("model"));
    }

    #[test]
    fn errors_take_openai_shapes() {
        let (s, v) = error(400, "context_length_exceeded", &too_long(8192, 9000));
        assert_eq!((s, v["error"]["code"].as_str()), (400, Some("context_length_exceeded")));
        assert!(v["error"]["message"].as_str().unwrap().contains("maximum context length is 8192 tokens"));
        assert_eq!(error(529, "overloaded_error", "Overloaded").0, 503);
        assert_eq!(error(429, "rate_limit_error", "slow down").1["error"]["code"], "rate_limit_exceeded");
    }
}
