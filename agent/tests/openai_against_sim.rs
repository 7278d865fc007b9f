//! The Chat Completions client against the simulator's `/v1/chat/completions`
//! over real HTTP: streamed parallel tool calls assembled, usage with the
//! automatic prefix cache's `cached_tokens`, retries of an overloaded
//! server and of a dropped stream, fast failure of a bad request, and the
//! overflow error's class and window.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flower_agent::provider::{
    ClientConfig, ErrorClass, Message, OpenAiClient, Provider, Request, StreamEvent, SystemBlock, ToolDef,
};
use flower_model::{ContentBlock, ResultBlock};
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
        text: "a long enough text to be streamed in several pieces, so that the cut happens mid-stream"
        drop_stream: {times: 1}
  - name: tooler
    match: {system: tooler}
    steps:
      - id: look
        text: "reading two files"
        tool_calls:
          - {name: Read, input: {file_path: "data/a.txt", limit: 10}}
          - {name: Read, input: {file_path: "data/b.txt"}}
      - id: answer
        text: "a: {{result:look}}"
"#;

async fn sim(script: &str) -> flower_sim::SimHandle {
    flower_sim::start(Scenario::parse(script).unwrap(), "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

fn client(base: String) -> OpenAiClient {
    OpenAiClient::new(ClientConfig {
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
        model: "gpt-4.1-mini".into(),
        max_tokens: 256,
        // Long enough for the automatic cache (1,024 tokens at least).
        system: vec![SystemBlock::text(format!("{system}\n{}", "background ".repeat(600)))],
        messages: vec![Message { role: "user".into(), content: vec![ContentBlock::text("go")] }],
        tools: vec![ToolDef {
            name: "Read".into(),
            description: "Read a file".into(),
            input_schema: serde_json::json!({"type": "object", "properties": {"file_path": {"type": "string"}}}),
        }],
        stream,
        cache: Some(Default::default()),
        session: Some("s-openai".into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn parallel_tool_calls_stream_and_the_next_turn_reads_the_prefix_cache() {
    let sim = sim(SCRIPT).await;
    let c = client(format!("{}/v1", sim.base_url()));
    let heard = Arc::new(Mutex::new(Vec::new()));
    let h = heard.clone();
    let first = c.send(&request("tooler", true), Some(Arc::new(move |e| h.lock().unwrap().push(e)))).await.unwrap();
    assert_eq!(heard.lock().unwrap().first(), Some(&StreamEvent::Started));
    assert_eq!(first.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(first.content[0], ContentBlock::text("reading two files"));
    let calls: Vec<(String, serde_json::Value)> = first
        .content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::ToolUse { id, input, .. } => Some((id.clone(), input.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 2, "parallel calls: {:?}", first.content);
    assert_eq!(calls[0].1, serde_json::json!({"file_path": "data/a.txt", "limit": 10}));
    assert_eq!(calls[1].1, serde_json::json!({"file_path": "data/b.txt"}));
    assert_eq!(first.usage.cache_read_input_tokens, 0, "nothing cached before the first request");
    assert!(first.usage.input_tokens > 1024);

    let mut next = request("tooler", true);
    next.messages.push(Message { role: "assistant".into(), content: first.content.clone() });
    next.messages.push(Message {
        role: "user".into(),
        content: calls
            .iter()
            .enumerate()
            .map(|(i, (id, _))| ContentBlock::ToolResult {
                tool_use_id: id.clone(),
                content: vec![ResultBlock::Text { text: format!("content {i}") }],
                is_error: false,
            })
            .collect(),
    });
    let second = c.send(&next, None).await.unwrap();
    assert_eq!(second.content, vec![ContentBlock::text("a: content 0\n\ncontent 1")]);
    let read = second.usage.cache_read_input_tokens;
    assert!(read >= 1024 && read % 128 == 0, "the first request's prefix, in 128-token steps: {:?}", second.usage);
    assert_eq!(second.usage.cache_creation_input_tokens, 0);
    // Not streamed: the same message.
    let mut plain = next.clone();
    plain.stream = false;
    let third = c.send(&plain, None).await.unwrap();
    assert_eq!(third.content, second.content);
    assert_eq!(third.stop_reason.as_deref(), Some("end_turn"));
    // The simulator audited the session's requests as append-only.
    let audit = sim.audit();
    let records = &audit["s-openai"];
    assert!(records.len() >= 2 && records.iter().all(|r| r.append_only && !r.miss), "{records:?}");
}

#[tokio::test]
async fn an_overloaded_server_and_a_dropped_stream_are_retried() {
    let sim = sim(SCRIPT).await;
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
    let r = c.send(&request("dropper", true), None).await.unwrap();
    let ContentBlock::Text { text } = &r.content[0] else { panic!() };
    assert!(text.starts_with("a long enough") && text.ends_with("mid-stream"), "{text}");
}

#[tokio::test]
async fn a_bad_request_fails_fast_and_an_overflow_names_the_window() {
    let server = sim(SCRIPT).await;
    let c = client(server.base_url());
    let mut bad = request("tooler", true);
    bad.messages.clear();
    let err = c.send(&bad, None).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Fatal, "{err}");

    let small = sim(&format!("window_tokens: 500\n{SCRIPT}")).await;
    let c = client(small.base_url());
    let err = c.send(&request("tooler", true), None).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::PromptTooLong, "{err}");
    assert_eq!(err.window(), Some(500), "{err}");
    assert!(err.to_string().contains("context_length_exceeded"), "{err}");
}
