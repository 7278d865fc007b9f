//! The simulator's HTTP responses, read raw: event order and field shapes of
//! the Anthropic Messages API.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use serde_json::{Value, json};

async fn post(base: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn body(stream: bool) -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": stream, "system": "you are tooler",
           "messages": [{"role": "user", "content": "hi"}]})
}

async fn sim() -> flower_sim::SimHandle {
    let s = flower_sim::Scenario::parse(
        "roles:\n  - name: t\n    match: {system: tooler}\n    steps:\n      - id: a\n        text: hello\n        tool_calls: [{name: Read, input: {file_path: x}}]\n",
    )
    .unwrap();
    flower_sim::start(s, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

#[tokio::test]
async fn streaming_events_follow_the_messages_api() {
    let sim = sim().await;
    let resp = post(&sim.base_url(), body(true)).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    let frames: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let mut lines = f.lines();
            let event = lines.next().unwrap().strip_prefix("event: ").unwrap().to_string();
            let data: Value = serde_json::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], event.as_str(), "data.type repeats the event name");
            (event, data)
        })
        .collect();
    let names: Vec<&str> = frames.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    assert_eq!(names[names.len() - 2], "message_delta");
    let start = &frames[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["role"], "assistant");
    assert!(start["stop_reason"].is_null());
    for field in ["input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"] {
        assert!(start["usage"][field].is_u64(), "usage.{field}");
    }
    assert!(start["usage"]["cache_creation"]["ephemeral_5m_input_tokens"].is_u64());
    let block_starts: Vec<&Value> = frames.iter().filter(|(e, _)| e == "content_block_start").map(|(_, d)| d).collect();
    assert_eq!(block_starts[0]["content_block"], json!({"type": "text", "text": ""}));
    assert_eq!(block_starts[1]["index"], 1);
    assert_eq!(block_starts[1]["content_block"]["type"], "tool_use");
    assert_eq!(block_starts[1]["content_block"]["input"], json!({}));
    let partial: String = frames
        .iter()
        .filter(|(e, d)| e == "content_block_delta" && d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&partial).unwrap(), json!({"file_path": "x"}));
    let delta = &frames[frames.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert!(delta["usage"]["output_tokens"].as_u64().unwrap() > 1);
    assert_eq!(frames.iter().filter(|(e, _)| e == "content_block_stop").count(), 2);
}

#[tokio::test]
async fn non_streaming_and_error_bodies() {
    let sim = sim().await;
    let resp = post(&sim.base_url(), body(false)).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["stop_reason"], "tool_use");
    assert!(v["stop_sequence"].is_null());
    assert_eq!(v["content"][1]["input"], json!({"file_path": "x"}));

    let resp = post(&sim.base_url(), json!({"model": "m", "max_tokens": 1, "messages": []})).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].is_string());

    let no_version =
        reqwest::Client::new().post(format!("{}/v1/messages", sim.base_url())).json(&body(false)).send().await.unwrap();
    assert_eq!(no_version.status(), 400);
}

#[tokio::test]
async fn cache_fields_follow_the_providers_rules_over_http() {
    let sim = sim().await;
    let system = json!([{"type": "text", "text": "cached rules ".repeat(600), "cache_control": {"type": "ephemeral", "ttl": "1h"}}]);
    let body = |q: &str| json!({"model": "claude-sonnet-4-5", "max_tokens": 8, "system": system, "messages": [{"role": "user", "content": q}]});
    let first: Value = post(&sim.base_url(), body("one")).await.json().await.unwrap();
    let u = &first["usage"];
    assert!(u["cache_creation"]["ephemeral_1h_input_tokens"].as_u64().unwrap() > 1024, "{u}");
    assert_eq!(u["cache_read_input_tokens"], 0);
    let second: Value = post(&sim.base_url(), body("two")).await.json().await.unwrap();
    let u2 = &second["usage"];
    assert!(u2["cache_read_input_tokens"].as_u64().unwrap() > 1024, "{u2}");
    assert_eq!(u2["cache_creation_input_tokens"], 0);

    let five: Vec<Value> = (0..5)
        .map(|i| json!({"type": "text", "text": format!("b{i}"), "cache_control": {"type": "ephemeral"}}))
        .collect();
    let resp = post(
        &sim.base_url(),
        json!({"model": "m", "max_tokens": 1, "system": five, "messages": [{"role": "user", "content": "q"}]}),
    )
    .await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["message"], "A maximum of 4 blocks with cache_control may be provided. Found 5.");
}

/// The event names of a Messages stream, in order, and whether the response
/// said its length up front (one body) rather than streaming in chunks.
async fn stream_shape(scenario_latency: &str) -> (Vec<String>, bool) {
    let s = flower_sim::Scenario::parse(&format!(
        "{scenario_latency}roles:\n  - name: t\n    match: {{system: tooler}}\n    steps:\n      - id: a\n        text: hello there, a text long enough for two pieces of the stream at least\n        tool_calls: [{{name: Read, input: {{file_path: x}}}}]\n"
    ))
    .unwrap();
    let sim = flower_sim::start(s, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let resp = post(&sim.base_url(), body(true)).await;
    let whole = resp.headers().contains_key("content-length");
    let text = resp.text().await.unwrap();
    let names =
        text.split("\n\n").filter_map(|f| f.strip_prefix("event: ")).map(|f| f.lines().next().unwrap().to_string());
    (names.collect(), whole)
}

#[tokio::test]
async fn a_stream_with_nothing_to_wait_for_is_written_whole_and_a_paced_one_in_pieces() {
    let (instant, instant_whole) = stream_shape("").await;
    let (paced, paced_whole) = stream_shape("latency: {tokens_per_sec: 2000}\n").await;
    let (late, late_whole) = stream_shape("latency: {ttft_ms: 5}\n").await;
    assert!(instant_whole, "no delay, no pacing: one body of known length");
    assert!(!paced_whole && !late_whole, "a paced or delayed answer streams");
    assert!(instant.iter().filter(|e| *e == "content_block_delta").count() >= 3, "{instant:?}");
    assert_eq!(instant, paced, "the same events either way");
    assert_eq!(instant, late);
}

#[tokio::test]
async fn a_chat_stream_with_nothing_to_wait_for_is_written_whole_and_a_paced_one_in_pieces() {
    async fn shape(latency: &str) -> (usize, bool, String) {
        let s = flower_sim::Scenario::parse(&format!(
            "{latency}roles:\n  - name: t\n    match: {{system: tooler}}\n    steps:\n      - id: a\n        text: hello there, a text long enough for two pieces of the stream at least\n"
        ))
        .unwrap();
        let sim = flower_sim::start(s, "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", sim.base_url()))
            .json(&json!({"model": "gpt-4o", "stream": true, "messages": [
                {"role": "system", "content": "you are tooler"}, {"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        let whole = resp.headers().contains_key("content-length");
        let text = resp.text().await.unwrap();
        let lines: Vec<&str> = text.split("\n\n").filter(|l| !l.is_empty()).collect();
        (lines.len(), whole, lines.last().unwrap().to_string())
    }
    let (instant, instant_whole, instant_last) = shape("").await;
    let (paced, paced_whole, paced_last) = shape("latency: {tokens_per_sec: 2000}\n").await;
    assert!(instant_whole && !paced_whole, "one body without pacing, pieces with it");
    assert!(instant >= 4, "{instant} lines");
    assert_eq!(instant, paced, "the same lines either way");
    assert_eq!((instant_last.as_str(), paced_last.as_str()), ("data: [DONE]", "data: [DONE]"));
}

#[tokio::test]
async fn a_quota_is_enforced_per_key_with_each_providers_429_and_headers() {
    let s = flower_sim::Scenario::parse(
        "quota: {requests_per_minute: 2, input_tokens_per_minute: 100000}\nroles:\n  - name: t\n    match: {system: tooler}\n    steps:\n      - id: a\n        text: hello\n        tool_calls: [{name: Read, input: {file_path: x}}]\n",
    )
    .unwrap();
    let limited = flower_sim::start(s, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = limited.base_url();
    let keyed = |key: &'static str| {
        let base = base.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/messages"))
                .header("anthropic-version", "2023-06-01")
                .header("x-api-key", key)
                .json(&body(false))
                .send()
                .await
                .unwrap()
        }
    };
    let first = keyed("key-a").await;
    assert_eq!(first.status(), 200);
    let h = first.headers();
    assert_eq!(h["anthropic-ratelimit-requests-limit"], "2");
    assert_eq!(h["anthropic-ratelimit-requests-remaining"], "1");
    assert_eq!(h["anthropic-ratelimit-input-tokens-limit"], "100000");
    assert!(h["anthropic-ratelimit-requests-reset"].to_str().unwrap().ends_with('Z'), "RFC 3339: {h:?}");
    assert_eq!(keyed("key-a").await.status(), 200);
    let refused = keyed("key-a").await;
    assert_eq!(refused.status(), 429);
    let wait: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=30).contains(&wait), "2 a minute: the next within 30 s, said in whole seconds: {wait}");
    assert_eq!(refused.headers()["anthropic-ratelimit-requests-remaining"], "0");
    let e: Value = refused.json().await.unwrap();
    assert_eq!(e["error"]["type"], "rate_limit_error", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("2 requests per minute"), "{e}");
    // Another key has its own buckets; a refused request played nothing:
    // the scenario's first step is still what the next request gets.
    let other = keyed("key-b").await;
    assert_eq!(other.status(), 200);
    let v: Value = other.json().await.unwrap();
    assert_eq!(v["content"][0]["text"], "hello", "{v}");

    // OpenAI's dialect: bearer key, x-ratelimit-*, retry-after-ms, `requests`.
    let chat = |key: &'static str| {
        let base = base.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(key)
                .json(&json!({"model": "m", "messages": [{"role": "system", "content": "you are tooler"},
                                                          {"role": "user", "content": "hi"}]}))
                .send()
                .await
                .unwrap()
        }
    };
    let ok = chat("key-c").await;
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["x-ratelimit-limit-requests"], "2");
    assert_eq!(ok.headers()["x-ratelimit-remaining-requests"], "1");
    assert_eq!(ok.headers()["x-ratelimit-limit-tokens"], "100000");
    assert_eq!(chat("key-c").await.status(), 200);
    let refused = chat("key-c").await;
    assert_eq!(refused.status(), 429);
    let ms: u64 = refused.headers()["retry-after-ms"].to_str().unwrap().parse().unwrap();
    assert!(ms > 0 && ms <= 30_000, "{ms}");
    let reset = refused.headers()["x-ratelimit-reset-requests"].to_str().unwrap().to_string();
    assert!(reset.ends_with('s'), "a duration: {reset}");
    let e: Value = refused.json().await.unwrap();
    assert_eq!(
        (e["error"]["code"].as_str(), e["error"]["type"].as_str()),
        (Some("rate_limit_exceeded"), Some("requests"))
    );
    // What the limits let through and refused, every key together.
    let tally: Value = reqwest::get(format!("{base}/v1/flower/quota")).await.unwrap().json().await.unwrap();
    assert_eq!(
        (tally["tally"]["admitted"].as_u64(), tally["tally"]["refused"].as_u64()),
        (Some(5), Some(2)),
        "{tally}"
    );
    assert!(tally["tally"]["input_tokens"].as_u64().unwrap() > 0, "{tally}");
    assert_eq!(tally["quota"]["requests_per_minute"], 2, "{tally}");

    // No quota: no rate-limit headers.
    let unlimited = sim().await;
    let plain = post(&unlimited.base_url(), body(false)).await;
    assert!(!plain.headers().contains_key("anthropic-ratelimit-requests-limit"));
}
