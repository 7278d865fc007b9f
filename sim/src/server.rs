//! The HTTP shell: `POST /v1/messages` and `POST /v1/chat/completions`
//! (its shapes are in [`crate::chat`]), streaming and not.
//!
//! Shapes emitted, exactly as the Anthropic Messages API does:
//!
//! Non-streaming (`200`, `application/json`):
//! `{"id":"msg_…","type":"message","role":"assistant","model":…,"content":[…],
//!   "stop_reason":"end_turn"|"tool_use","stop_sequence":null,"usage":{…}}`
//!
//! Streaming (`text/event-stream`), each frame `event: <type>\ndata: <json>\n\n`:
//! 1. `message_start` `{"type":"message_start","message":{…, "content":[], "stop_reason":null, "usage":{input…, "output_tokens":1}}}`
//! 2. `ping` `{"type":"ping"}`
//! 3. per block *i*: `content_block_start` `{"type":"content_block_start","index":i,"content_block":{"type":"text","text":""}}`
//!    (or `{"type":"tool_use","id":…,"name":…,"input":{}}`), then `content_block_delta`s
//!    (`{"type":"text_delta","text":…}` / `{"type":"input_json_delta","partial_json":…}`),
//!    then `content_block_stop` `{"type":"content_block_stop","index":i}`
//! 4. `message_delta` `{"type":"message_delta","delta":{"stop_reason":…,"stop_sequence":null},"usage":{…,"output_tokens":N}}` (cumulative counts)
//! 5. `message_stop` `{"type":"message_stop"}`
//!
//! Errors: HTTP status with `{"type":"error","error":{"type":…,"message":…}}`
//! (400 `invalid_request_error`, 429 `rate_limit_error`, 529 `overloaded_error`, …);
//! inside a stream, `event: error` with the same body.
//!
//! Usage always carries `input_tokens`, `output_tokens`,
//! `cache_creation_input_tokens`, `cache_read_input_tokens` and the
//! `cache_creation` per-TTL split.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use crate::engine::{Engine, Planned, Reply};
use crate::quota::{self, Api};
use crate::scenario::{Latency, Scenario};

/// A running simulator.
pub struct SimHandle {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    engine: Arc<Engine>,
}

impl SimHandle {
    /// `http://ADDR`, what a client's base URL should be.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The rate limits enforced per API key.
    pub fn quota(&self) -> crate::quota::Quota {
        self.engine.quotas().quota()
    }

    /// Every session's cache audit so far (see [`crate::engine::AuditRecord`]).
    pub fn audit(&self) -> std::collections::HashMap<String, Vec<crate::engine::AuditRecord>> {
        self.engine.audit()
    }

    /// Stop accepting and wait for the server task.
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
        if let Some(t) = self.engine.timeline() {
            t.close();
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Start a simulator on `addr` (`127.0.0.1:0` for an ephemeral port).
pub async fn start(scenario: Scenario, addr: SocketAddr) -> std::io::Result<SimHandle> {
    start_with(Engine::new(scenario), addr).await
}

/// Start a simulator playing `engine` (a scenario, and perhaps a timeline).
pub async fn start_with(engine: Engine, addr: SocketAddr) -> std::io::Result<SimHandle> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = oneshot::channel::<()>();
    let engine = Arc::new(engine);
    let app = router(engine.clone());
    // Streamed events are small writes: without TCP_NODELAY, Nagle's
    // algorithm holds each behind the client's delayed ACK (~40 ms a turn).
    let listener = axum::serve::ListenerExt::tap_io(listener, |s: &mut tokio::net::TcpStream| {
        let _ = s.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(async {
            let _ = rx.await;
        });
        if let Err(e) = served.await {
            tracing::error!(error = %e, "simulator stopped");
        }
    });
    Ok(SimHandle { addr, stop: Some(tx), task, engine })
}

pub fn router(engine: Arc<Engine>) -> Router {
    Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/flower/audit", get(audit))
        .route("/v1/flower/quota", get(quota_tally))
        .route("/", get(|| async { "flower sim: POST /v1/messages, POST /v1/chat/completions\n" }))
        .with_state(engine)
}

fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn error_response(status: u16, kind: &str, message: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (code, axum::Json(error_body(kind, message))).into_response();
    if status == 429 || status == 529 {
        resp.headers_mut().insert("retry-after", header::HeaderValue::from_static("0"));
    }
    resp
}

/// A request admitted by its key's rate limits — its key, and what the
/// headers will show — or the 429 that refuses it. Without a quota nothing
/// is read or estimated.
fn admitted(
    engine: &Engine,
    headers: &HeaderMap,
    api: Api,
    estimate: impl FnOnce() -> u64,
) -> Result<(String, quota::Readings), Box<Response>> {
    if !engine.quotas().quota().is_set() {
        return Ok((String::new(), quota::Readings::default()));
    }
    let key = quota::key_of(headers);
    match engine.quotas().admit(&key, estimate(), Instant::now()) {
        Ok(readings) => Ok((key, readings)),
        Err(refused) => Err(Box::new(rate_limited(api, &refused))),
    }
}

/// A request over its key's rate limit: 429 in the provider's words, with
/// `retry-after` and the rate-limit headers.
fn rate_limited(api: Api, refused: &quota::Refused) -> Response {
    let message = quota::message(api, refused);
    let mut resp = match api {
        Api::Anthropic => error_response(429, "rate_limit_error", &message),
        Api::OpenAi => {
            let kind = if refused.limit == "requests" { "requests" } else { "tokens" };
            let body =
                json!({"error": {"message": message, "type": kind, "param": null, "code": "rate_limit_exceeded"}});
            (StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response()
        }
    };
    for (name, value) in quota::headers(api, &refused.readings, Some(refused)) {
        resp.headers_mut().insert(name, value);
    }
    resp
}

/// `resp` with the key's rate-limit headers, when a quota is set.
fn rated(mut resp: Response, api: Api, readings: &quota::Readings) -> Response {
    for (name, value) in quota::headers(api, readings, None) {
        resp.headers_mut().insert(name, value);
    }
    resp
}

fn usage(p: &Planned, output_tokens: u64) -> Value {
    let c = &p.cache;
    json!({
        "input_tokens": p.input_tokens,
        "cache_creation_input_tokens": c.cache_write_5m + c.cache_write_1h,
        "cache_read_input_tokens": c.cache_read,
        "cache_creation": {"ephemeral_5m_input_tokens": c.cache_write_5m, "ephemeral_1h_input_tokens": c.cache_write_1h},
        "output_tokens": output_tokens,
    })
}

async fn messages(State(engine): State<Arc<Engine>>, headers: HeaderMap, body: Bytes) -> Response {
    let arrived = crate::timeline::now_us();
    if !headers.contains_key("anthropic-version") {
        return error_response(400, "invalid_request_error", "anthropic-version: header is required");
    }
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error_response(400, "invalid_request_error", &format!("There was an error parsing the body: {e}"));
        }
    };
    // Admitted by the key's rate limits before it is played (a refused
    // request moves no scenario state).
    let (key, readings) = match admitted(&engine, &headers, Api::Anthropic, || crate::engine::request_tokens(&body)) {
        Ok(admitted) => admitted,
        Err(refused) => return *refused,
    };
    let resp = play_message(&engine, &headers, body, arrived, &key).await;
    rated(resp, Api::Anthropic, &readings)
}

/// An admitted Messages request, played.
async fn play_message(engine: &Engine, headers: &HeaderMap, body: Value, arrived: u64, key: &str) -> Response {
    let stream = body["stream"].as_bool().unwrap_or(false);
    let latency = engine.scenario().latency;
    let session = headers.get("x-flower-session").and_then(|v| v.to_str().ok());
    let planned = match engine.reply_for(&body, session) {
        Reply::Error { status, kind, message } => {
            sleep_ms(latency.ttft_ms).await;
            return error_response(status, &kind, &message);
        }
        Reply::Message(p) => p,
    };
    engine.quotas().charge_output(key, Api::Anthropic, planned.output_tokens, Instant::now());
    if let Some(t) = engine.timeline() {
        t.record(arrived, &body, &planned.content);
    }
    if !stream {
        sleep_ms(latency.ttft_ms).await;
        let body = json!({
            "id": planned.id,
            "type": "message",
            "role": "assistant",
            "model": planned.model,
            "content": planned.content,
            "stop_reason": planned.stop_reason,
            "stop_sequence": null,
            "usage": usage(&planned, planned.output_tokens),
        });
        return axum::Json(body).into_response();
    }
    let (frames, cut) = message_frames(&planned, latency);
    if let Some(whole) = written_whole(&frames, cut, latency, b"", body) {
        return whole;
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(stream_message(frames, cut, latency, tx));
    event_stream(rx)
}

/// A stream's frames, each rendered with the pause before it (ms, at the
/// scenario's pace).
type Frames = Vec<(Bytes, u64)>;

/// A stream with nothing to wait for (no first-token delay, no pacing, no
/// cut) as one response of known length, `tail` after its frames: no task
/// and no channel between the answer and its first write. The request (a
/// long history, maybe) is freed after the answer is written: a task
/// spawned here runs on this thread once it yields. `None`: it streams.
fn written_whole(frames: &Frames, cut: bool, latency: Latency, tail: &[u8], request: Value) -> Option<Response> {
    if latency.ttft_ms > 0 || cut || frames.iter().any(|(_, pause)| *pause > 0) {
        return None;
    }
    let mut whole = Vec::with_capacity(frames.iter().map(|(f, _)| f.len()).sum::<usize>() + tail.len());
    for (f, _) in frames {
        whole.extend_from_slice(f);
    }
    whole.extend_from_slice(tail);
    tokio::spawn(async move { drop(request) });
    Some(event_response(Body::from(whole)))
}

/// A `text/event-stream` response of what the channel carries.
fn event_stream(rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Response {
    event_response(Body::from_stream(tokio_stream_from(rx)))
}

/// A `text/event-stream` response of `body`.
fn event_response(body: Body) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
    resp
}

fn chat_error(status: u16, kind: &str, message: &str) -> Response {
    let (status, body) = crate::chat::error(status, kind, message);
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (code, axum::Json(body)).into_response();
    if status == 429 || status == 503 {
        resp.headers_mut().insert("retry-after", header::HeaderValue::from_static("0"));
    }
    resp
}

async fn chat_completions(State(engine): State<Arc<Engine>>, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return chat_error(
                400,
                "invalid_request_error",
                &format!("We could not parse the JSON body of your request: {e}"),
            );
        }
    };
    // Estimated on the request as the engine reads it (a request it cannot
    // read is refused by the engine, not counted).
    let estimate = || crate::chat::to_messages_body(&body).map_or(0, |b| crate::engine::request_tokens(&b));
    let (key, readings) = match admitted(&engine, &headers, Api::OpenAi, estimate) {
        Ok(admitted) => admitted,
        Err(refused) => return *refused,
    };
    let resp = play_chat(&engine, &headers, body, &key).await;
    rated(resp, Api::OpenAi, &readings)
}

/// An admitted Chat Completions request, played.
async fn play_chat(engine: &Engine, headers: &HeaderMap, body: Value, key: &str) -> Response {
    let stream = body["stream"].as_bool().unwrap_or(false);
    let include_usage = body["stream_options"]["include_usage"].as_bool().unwrap_or(false);
    let latency = engine.scenario().latency;
    let session = headers.get("x-flower-session").and_then(|v| v.to_str().ok());
    let planned = match engine.reply_chat(&body, session) {
        Reply::Error { status, kind, message } => {
            sleep_ms(latency.ttft_ms).await;
            return chat_error(status, &kind, &message);
        }
        Reply::Message(p) => p,
    };
    engine.quotas().charge_output(key, Api::OpenAi, planned.output_tokens, Instant::now());
    if !stream {
        sleep_ms(latency.ttft_ms).await;
        return axum::Json(crate::chat::completion(&planned)).into_response();
    }
    let frames = chat_frames(&planned, include_usage, latency);
    if let Some(whole) = written_whole(&frames, planned.drop_stream, latency, CHAT_DONE, body) {
        return whole;
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(stream_chat(frames, planned.drop_stream, latency, tx));
    event_stream(rx)
}

/// The last line of a streamed chat completion.
const CHAT_DONE: &[u8] = b"data: [DONE]\n\n";

/// The lines of a streamed chat completion, each with the pause before it
/// (ms, paced like the Messages stream).
fn chat_frames(p: &Planned, include_usage: bool, latency: Latency) -> Frames {
    let chunks = crate::chat::chunks(p, include_usage, |s| chunks(s, 48).into_iter().map(str::to_string).collect());
    chunks
        .iter()
        .map(|c| {
            let piece = c["choices"][0]["delta"]["content"]
                .as_str()
                .or_else(|| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
                .unwrap_or_default();
            let ms = (piece.len().div_ceil(4) as u64 * 1000).checked_div(latency.tokens_per_sec).unwrap_or(0);
            (Bytes::from(format!("data: {c}\n\n")), ms)
        })
        .collect()
}

/// A streamed chat completion's lines, paced; with `drop_stream`, cut after the second.
async fn stream_chat(
    frames: Frames,
    drop_stream: bool,
    latency: Latency,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    sleep_ms(latency.ttft_ms).await;
    for (i, (line, pause)) in frames.into_iter().enumerate() {
        sleep_ms(pause).await;
        if tx.send(Ok(line)).await.is_err() {
            return;
        }
        if drop_stream && i >= 1 {
            let _ = tx.send(Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "simulated drop"))).await;
            return;
        }
    }
    let _ = tx.send(Ok(Bytes::from_static(CHAT_DONE))).await;
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn sleep_ms(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

fn frame(event: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// Split into pieces of about `n` bytes on char boundaries.
fn chunks(s: &str, n: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < s.len() {
        let mut end = (start + n).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        out.push(&s[start..end]);
        start = end;
    }
    out
}

/// A Messages stream's frames in order, and whether it is cut after the
/// last one (`drop_stream`: at the first delta).
fn message_frames(p: &Planned, latency: Latency) -> (Frames, bool) {
    let pace = |piece: &str| {
        let tokens = piece.len().div_ceil(4) as u64;
        (tokens * 1000).checked_div(latency.tokens_per_sec).unwrap_or(0)
    };
    let mut frames = Vec::new();
    let mut push = |event: &str, data: Value, pause_ms: u64| frames.push((frame(event, &data), pause_ms));
    let start = json!({"type": "message_start", "message": {
        "id": p.id, "type": "message", "role": "assistant", "model": p.model, "content": [],
        "stop_reason": null, "stop_sequence": null, "usage": usage(p, 1),
    }});
    push("message_start", start, 0);
    push("ping", json!({"type": "ping"}), 0);
    for (i, block) in p.content.iter().enumerate() {
        let (start_block, pieces, delta_kind, field) = match block["type"].as_str() {
            Some("tool_use") => (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                block["input"].to_string(),
                "input_json_delta",
                "partial_json",
            ),
            _ => (
                json!({"type": "text", "text": ""}),
                block["text"].as_str().unwrap_or_default().to_string(),
                "text_delta",
                "text",
            ),
        };
        push(
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": start_block}),
            0,
        );
        for piece in chunks(&pieces, 48) {
            let delta = json!({"type": "content_block_delta", "index": i, "delta": {"type": delta_kind, field: piece}});
            push("content_block_delta", delta, pace(piece));
            if p.drop_stream {
                return (frames, true);
            }
        }
        push("content_block_stop", json!({"type": "content_block_stop", "index": i}), 0);
    }
    let delta = json!({
        "type": "message_delta",
        "delta": {"stop_reason": p.stop_reason, "stop_sequence": null},
        "usage": usage(p, p.output_tokens),
    });
    push("message_delta", delta, 0);
    push("message_stop", json!({"type": "message_stop"}), 0);
    (frames, false)
}

async fn stream_message(
    frames: Frames,
    cut: bool,
    latency: Latency,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) -> Result<(), Infallible> {
    sleep_ms(latency.ttft_ms).await;
    // Frames ready at once go out together (one write, not one per event);
    // a pause sends what is ready first.
    let mut out = Outbox { tx, ready: Vec::new() };
    for (f, pause) in frames {
        if pause > 0 {
            if !out.flush().await {
                return Ok(());
            }
            sleep_ms(pause).await;
        }
        out.ready.extend_from_slice(&f);
    }
    if cut {
        // Cut the connection mid-stream: the body ends in an error, not a clean close.
        if out.flush().await {
            let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "simulated drop");
            let _ = out.tx.send(Err(reset)).await;
        }
        return Ok(());
    }
    out.flush().await;
    Ok(())
}

/// Server-sent events ready to go, sent together.
struct Outbox {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    ready: Vec<u8>,
}

impl Outbox {
    /// Send what is ready; `false` when the client went away.
    async fn flush(&mut self) -> bool {
        if self.ready.is_empty() {
            return true;
        }
        let ready = Bytes::from(std::mem::take(&mut self.ready));
        self.tx.send(Ok(ready)).await.is_ok()
    }
}

/// `GET /v1/flower/audit`: per session, what each request read versus what
/// the previous one left cached (see [`crate::engine::AuditRecord`]).
/// The limits and what they let through and refused so far.
async fn quota_tally(State(engine): State<Arc<Engine>>) -> Response {
    let q = engine.quotas();
    axum::Json(json!({"quota": q.quota(), "tally": q.tally()})).into_response()
}

async fn audit(State(engine): State<Arc<Engine>>) -> Response {
    axum::Json(json!({"sessions": engine.audit()})).into_response()
}
