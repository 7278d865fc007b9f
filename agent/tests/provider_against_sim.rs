//! The Anthropic client against the simulator over real HTTP: streaming and
//! non-streaming assembly, retries of retryable failures, fast failure of
//! fatal ones.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flower_agent::provider::{
    AnthropicClient, AnthropicConfig, ErrorClass, Message, Provider, ProviderError, Request, StreamEvent, SystemBlock,
};
use flower_model::ContentBlock;
use flower_sim::Scenario;

const SCRIPT: &str = r#"
roles:
  - name: flaky
    match: {system: flaky}
    steps:
      - id: one
        text: "survived"
        fail: {status: 529, type: overloaded_error, message: Overloaded, times: 2}
  - name: dropper
    match: {system: dropper}
    steps:
      - id: one
        text: "a long enough text to be streamed in several pieces, so that the cut happens mid-block"
        drop_stream: {times: 1}
  - name: tooler
    match: {system: tooler}
    steps:
      - id: one
        text: "reading"
        tool_calls:
          - {name: Read, input: {file_path: "data/a.txt", limit: 10}}
"#;

async fn sim() -> flower_sim::SimHandle {
    flower_sim::start(Scenario::parse(SCRIPT).unwrap(), "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

fn client(base: String) -> AnthropicClient {
    AnthropicClient::new(AnthropicConfig {
        base_url: base,
        backoff_base: Duration::from_millis(5),
        backoff_cap: Duration::from_millis(20),
        max_attempts: 4,
        ..Default::default()
    })
    .unwrap()
}

fn request(system: &str, stream: bool) -> Request {
    Request {
        model: "claude-sonnet-4-5".into(),
        max_tokens: 256,
        system: vec![SystemBlock::text(system)],
        messages: vec![Message { role: "user".into(), content: vec![ContentBlock::text("go")] }],
        tools: vec![],
        stream,
        cache: None,
        ..Default::default()
    }
}

#[tokio::test]
async fn streamed_tool_use_is_assembled_with_usage() {
    let sim = sim().await;
    let c = client(sim.base_url());
    let heard = Arc::new(Mutex::new(Vec::new()));
    let h = heard.clone();
    let r = c.send(&request("tooler", true), Some(Arc::new(move |e| h.lock().unwrap().push(e)))).await.unwrap();
    assert_eq!(r.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(r.content[0], ContentBlock::text("reading"));
    let ContentBlock::ToolUse { id, name, input } = &r.content[1] else { panic!("{:?}", r.content) };
    assert!(id.starts_with("toolu_s000_0_"));
    assert_eq!(name, "Read");
    assert_eq!(input, &serde_json::json!({"file_path": "data/a.txt", "limit": 10}));
    assert!(r.usage.input_tokens > 0 && r.usage.output_tokens > 1, "{:?}", r.usage);
    assert_eq!(heard.lock().unwrap().first(), Some(&StreamEvent::Started));
}

#[tokio::test]
async fn non_streaming_gives_the_same_message() {
    let sim = sim().await;
    let c = client(sim.base_url());
    let r = c.send(&request("tooler", false), None).await.unwrap();
    assert_eq!(r.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(r.content.len(), 2);
}

#[tokio::test]
async fn overloaded_responses_are_retried_until_success() {
    let sim = sim().await;
    let c = client(sim.base_url());
    let retries = Arc::new(Mutex::new(0));
    let r2 = retries.clone();
    let obs = Arc::new(move |e| {
        if matches!(e, StreamEvent::Retrying { .. }) {
            *r2.lock().unwrap() += 1;
        }
    });
    let r = c.send(&request("flaky", true), Some(obs)).await.unwrap();
    assert_eq!(r.content, vec![ContentBlock::text("survived")]);
    assert_eq!(*retries.lock().unwrap(), 2);
}

#[tokio::test]
async fn a_dropped_stream_is_discarded_and_retried() {
    let sim = sim().await;
    let c = client(sim.base_url());
    let r = c.send(&request("dropper", true), None).await.unwrap();
    let ContentBlock::Text { text } = &r.content[0] else { panic!() };
    assert!(text.starts_with("a long enough text"), "the retry's full text, not the partial one");
    assert!(text.ends_with("mid-block"));
}

#[tokio::test]
async fn the_client_caps_concurrent_calls() {
    let slow =
        Scenario::parse("latency: {ttft_ms: 150}\nroles:\n  - name: s\n    steps: [{id: a, text: ok}]\n").unwrap();
    let sim = flower_sim::start(slow, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let capped =
        AnthropicClient::new(AnthropicConfig { base_url: sim.base_url(), max_concurrent: 1, ..Default::default() })
            .unwrap();
    let req = request("x", true);
    let started = std::time::Instant::now();
    let (a, b, c) = tokio::join!(capped.send(&req, None), capped.send(&req, None), capped.send(&req, None));
    assert!(a.is_ok() && b.is_ok() && c.is_ok());
    // One at a time: three first-token delays back to back, at least.
    assert!(started.elapsed() >= Duration::from_millis(450), "{:?}", started.elapsed());
}

#[tokio::test]
async fn fatal_errors_fail_fast_and_retries_run_out() {
    let sim = sim().await;
    let c = client(sim.base_url());
    let mut bad = request("tooler", true);
    bad.messages.clear();
    let err = c.send(&bad, None).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Fatal);
    assert!(matches!(err, ProviderError::Api { status: 400, .. }), "{err}");

    // Nothing listens here: connection errors are retried, then given up on.
    let dead = client("http://127.0.0.1:9".into());
    let err = dead.send(&request("x", true), None).await.unwrap_err();
    assert!(matches!(err, ProviderError::Exhausted { attempts: 4, .. }), "{err}");
}
