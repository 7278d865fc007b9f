//! Two providers in one job: the coordinator on the Messages API, the
//! workers on Chat Completions, each answered by the simulator with its own
//! prompt-cache rule (explicit breakpoints; automatic prefix caching from
//! 1,024 tokens in 128-token steps).

use crate::support::{Home, repo, sessions, tool_uses};

/// `flower context JOB --json`'s providers lines, by API.
fn providers(home: &Home, job: &str) -> (serde_json::Value, serde_json::Value, serde_json::Value) {
    let out = home.run(&["context", job, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let line = |api: &str| {
        report["providers"].as_array().unwrap().iter().find(|p| p["api"] == api).cloned().unwrap_or_else(|| {
            panic!("no {api} line: {}", report["providers"]);
        })
    };
    (line("messages"), line("chat_completions"), report)
}

#[test]
fn workers_on_chat_completions_and_the_coordinator_on_messages_each_cache_by_their_rule() {
    let home = Home::new();
    let summary = home.run_job(&repo().join("tests/fixtures/providers/job.yaml"), &[]);
    assert_eq!(summary["state"], "succeeded", "{summary}");
    assert_eq!(summary["tasks_succeeded"], 3);
    let answer = summary["final_answer"].as_str().unwrap();
    assert!(answer.contains("data/ holds") && answer.contains(".flower/artifacts/sizes.md"), "{answer}");
    let job = summary["job_id"].as_str().unwrap();

    // The workers' calls went through Chat Completions and came back as real tool calls.
    let t = home.transcripts(job);
    let workers = sessions(&t, "worker");
    assert_eq!(workers.len(), 3);
    for w in &workers {
        assert!(!tool_uses(w).is_empty(), "{} made real tool calls", w["label"]);
    }

    let (messages, chat, report) = providers(&home, job);
    assert_eq!((messages["provider"].as_str(), messages["sessions"].as_u64()), (Some("sim"), Some(1)), "{messages}");
    assert_eq!(chat["sessions"], 3, "{chat}");
    // Messages: breakpoints write the cache and later turns read it.
    assert!(messages["usage"]["cache_creation_input_tokens"].as_u64().unwrap() > 0, "{messages}");
    assert!(messages["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0, "{messages}");
    // Chat Completions: nothing is written (no charge for it), reads come in 128-token steps.
    assert_eq!(chat["usage"]["cache_creation_input_tokens"], 0, "{chat}");
    let read = chat["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(read >= 1024 && read % 128 == 0, "automatic prefix reads: {chat}");
    assert!(chat["cache_rule"].as_str().unwrap().contains("automatic"), "{chat}");
    for s in report["sessions"].as_array().unwrap() {
        let want = if s["role"] == "worker" { "chat_completions" } else { "messages" };
        assert_eq!(s["api"], want, "{s}");
        if s["role"] == "worker" {
            let r = s["usage"]["cache_read_input_tokens"].as_u64().unwrap();
            assert_eq!(r % 128, 0, "each request's read is a multiple of 128: {s}");
        }
    }
    // The text report shows both lines.
    let text = home.run(&["context", job]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("chat_completions") && text.contains("automatic prefix cache"), "{text}");
}

#[test]
fn a_role_cannot_name_the_simulator_and_unknown_providers_are_refused() {
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(repo().join("tests/fixtures/providers/job.yaml")).unwrap();
    let spec = src
        .replacen("provider: openai", "provider: sim", 1)
        .replace("../../../examples", &repo().join("examples").display().to_string());
    std::fs::write(dir.path().join("job.yaml"), spec).unwrap();
    std::fs::copy(repo().join("examples/demo/scenario.yaml"), dir.path().join("scenario.yaml")).unwrap();
    let out = home.run(&["run", dir.path().join("job.yaml").to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("workers.counter.provider"), "the field is named: {err}");

    let spec = src
        .replacen("provider: openai", "provider: mistral", 1)
        .replace("../../../examples", &repo().join("examples").display().to_string());
    std::fs::write(dir.path().join("job.yaml"), spec).unwrap();
    let out = home.run(&["run", dir.path().join("job.yaml").to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("workers") && err.contains("mistral"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_keep_under_a_rate_limit_learnt_from_the_simulators_headers() {
    // Anthropic's anthropic-ratelimit-* headers, on the Messages API.
    keeps_under_a_learnt_limit("tests/fixtures/quota/job.yaml", "messages|").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_on_chat_completions_keep_under_a_limit_learnt_from_openais_headers() {
    // OpenAI's x-ratelimit-* headers (reset as a duration), every call on Chat Completions.
    keeps_under_a_learnt_limit("tests/fixtures/quota/chat.yaml", "chat|").await;
}

/// Six model calls of `fixture` against five requests a minute: the limit
/// learnt from the first answer's headers on the `api` route, and the sixth
/// call waiting for its turn instead of being refused.
async fn keeps_under_a_learnt_limit(fixture: &str, api: &str) {
    use flower_store::Store;

    let home = Home::new();
    let started = std::time::Instant::now();
    let summary = home.run_job(&repo().join(fixture), &[]);
    assert_eq!(summary["state"], "succeeded", "{summary}");
    let job: flower_model::JobId = summary["job_id"].as_str().unwrap().parse().unwrap();
    let store = flower_store::SqliteStore::open(&home.dir.path().join("flower.db")).unwrap();
    // The limit was learnt from the first answer's headers...
    let routes = store.route_quotas().await.unwrap();
    assert_eq!(routes.len(), 1, "{routes:?}");
    assert!(
        routes[0].0.starts_with(&format!("{api}http://127.0.0.1:"))
            && routes[0].0.ends_with("|k:none|claude-sonnet-4-5"),
        "{}",
        routes[0].0
    );
    assert_eq!(routes[0].1.buckets.quota.requests_per_minute, Some(5), "{routes:?}");
    // ...and every later call waited for it instead of being refused: no
    // retry of a 429 (the sixth call waited ~12 s for its request).
    let events = store.events(job, 0, 10_000).await.unwrap();
    let retries: Vec<_> =
        events.iter().filter(|e| matches!(e.kind, flower_model::EventKind::ProviderRetry { .. })).collect();
    assert!(retries.is_empty(), "no call was refused: {retries:?}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(10), "six calls at five a minute wait");
    // The wait is told: an event names the route and the limit (unless the
    // first five calls took the refill's 12 s by themselves).
    let waited = events.iter().find_map(|e| match &e.kind {
        flower_model::EventKind::WaitingForQuota { route, limit, wait_ms, .. } => Some((route, limit, *wait_ms)),
        _ => None,
    });
    match waited {
        Some((route, limit, wait_ms)) => {
            assert_eq!((route, limit.as_str()), (&routes[0].0, "requests"));
            assert!(wait_ms > 0 && wait_ms <= 12_250, "{wait_ms}");
        }
        None => assert!(started.elapsed() >= std::time::Duration::from_secs(12), "no wait told, yet no refusal"),
    }
}
