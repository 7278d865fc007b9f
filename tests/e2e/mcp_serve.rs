//! `flower mcp-serve` driven by a real MCP client: the Python SDK from PyPI
//! (`mcp`, in the venv `scripts/test` makes; `FLOWER_TEST_MCP_PYTHON` names
//! its python). The client (tests/fixtures/mcp_serve/client.py) lists the
//! tools, ranks them with `search_tool_bm25`, checks argument errors,
//! submits the demo through its template with a goal of its own, follows it
//! with `watch_job` (progress notifications), downloads its artifact and
//! reads its transcript; this side checks the report against what is stored.
//! Over stdio on the embedded store, over streamable HTTP with a token, and
//! over stdio against a coordinator (gRPC, with its token).

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

use crate::cluster::{Cluster, Options, Proc};
use crate::support::{FLOWER, Home, repo};

const GOAL: &str = "How big is data/? Count its files by type, their sizes and lines; keep the size table.";

/// The venv's python; never a silent skip.
fn python() -> PathBuf {
    let python = std::env::var_os("FLOWER_TEST_MCP_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "FLOWER_TEST_MCP_PYTHON is not set: this test drives flower mcp-serve with the Python MCP SDK; \
             run it through ./scripts/test, which installs the SDK (scripts/services.sh, ensure_python_mcp) \
             and exports the variable"
        )
    });
    assert!(python.is_file(), "FLOWER_TEST_MCP_PYTHON={}: no such file (run ./scripts/test once)", python.display());
    python
}

fn client(args: &[&str]) -> Value {
    let script = repo().join("tests/fixtures/mcp_serve/client.py");
    let out: Output =
        Command::new(python()).arg(script).args(["--goal", GOAL]).args(args).env_remove("RUST_LOG").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the MCP client failed ({}):\n{stderr}", out.status);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("the client's report: {e}\n{}", String::from_utf8_lossy(&out.stdout)))
}

fn template() -> String {
    format!("demo={}", repo().join("examples/demo/job.yaml").display())
}

/// What every variant checks: the demo's answer and its artifact, as the client got them.
fn check_report(r: &Value) -> (String, String) {
    assert_eq!(r["final"]["state"], "succeeded", "{r}");
    let answer = r["final"]["final_answer"].as_str().unwrap();
    assert!(answer.contains("data/ holds 15 files"), "{answer}");
    let artifact = r["artifact"].as_str().unwrap().to_string();
    assert!(artifact.starts_with("# desc: per-file sizes of data/"), "{artifact}");
    assert_eq!(artifact.lines().filter(|l| l.contains("\tdata/")).count(), 15, "one row per file");
    assert_eq!(r["ranking"]["download an artifact file"][0], "get_artifact");
    assert!(r["progress"].as_array().unwrap().iter().any(|p| p["message"] == "job succeeded"), "{}", r["progress"]);
    let sessions: Vec<&str> = r["sessions"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    for label in ["lead", "counter", "sizer", "liner"] {
        assert!(sessions.contains(&label), "{sessions:?}");
    }
    (r["job_id"].as_str().unwrap().to_string(), artifact)
}

/// The workbench file on disk under an embedded home.
fn stored_artifact(home: &Home, job: &str) -> String {
    let mut stack = vec![home.dir.path().join("objects")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.ends_with("artifacts/sizes.md") && p.to_string_lossy().contains(job) {
                return std::fs::read_to_string(p).unwrap();
            }
        }
    }
    panic!("no artifacts/sizes.md of job {job} under {}", home.dir.path().display());
}

/// The goal given to submit_job replaced the template's: it is what the coordinator was told.
fn coordinator_was_given_the_goal(home: &Home, job: &str) {
    let t = home.transcripts(job);
    let lead = t["sessions"].as_array().unwrap().iter().find(|s| s["role"] == "coordinator").unwrap();
    let first = lead["entries"][0]["content"][0]["text"].as_str().unwrap();
    assert!(first.contains(GOAL), "{first}");
}

#[test]
fn mcp_serve_over_stdio_runs_the_demo_on_the_embedded_store() {
    let home = Home::new();
    let h = home.dir.path().to_str().unwrap();
    let t = template();
    let ask = repo().join("tests/fixtures/ask/job.yaml");
    let ask = ask.to_str().unwrap();
    let root = repo().join("tests/fixtures");
    let r = client(&[
        "--ask-spec",
        ask,
        "--stdio",
        FLOWER,
        "--home",
        h,
        "mcp-serve",
        "--template",
        &t,
        "--spec-root",
        root.to_str().unwrap(),
    ]);
    let (job, artifact) = check_report(&r);
    assert_eq!(artifact, stored_artifact(&home, &job), "get_artifact returns the stored bytes");
    coordinator_was_given_the_goal(&home, &job);
    let status = home.run(&["status", &job, "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["state"], "succeeded");
    // The asking job got the answer given through answer_question; the other ended as cancelled.
    assert_eq!(r["ask"]["final_answer"], "asked: The user answered: CSV, with a header row / wrote: report written");
    assert!(r["ask"]["bad_option"].as_str().unwrap().contains("2 options"), "{}", r["ask"]);
    let other = home.run(&["status", r["ask"]["cancelled"].as_str().unwrap(), "--json"]);
    let other: Value = serde_json::from_slice(&other.stdout).unwrap();
    assert_eq!(other["state"], "cancelled");
    let errors = r["errors"].to_string();
    for field in ["job_id", "spec", "template", "goal", "timeout_seconds"] {
        assert!(errors.contains(field), "errors name {field}: {errors}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_serve_over_http_requires_its_token() {
    let home = Home::new();
    let h = home.dir.path().to_str().unwrap().to_string();
    let env = vec![("FLOWER_HOME".to_string(), h), ("MCP_TEST_TOKEN".to_string(), "mcp-s3cret".to_string())];
    let server = Proc::spawn(
        &["mcp-serve", "--http", "127.0.0.1:0", "--token-env", "MCP_TEST_TOKEN", "--template", &template()],
        &env,
    );
    let url = server.url();
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"), "{url}");
    assert!(server.first_line.contains("bearer token required"), "{}", server.first_line);

    // Without the token, or with another, nothing is served.
    let http = reqwest::Client::new();
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}});
    for auth in [None, Some("Bearer wrong"), Some("mcp-s3cret"), Some("Bearer mcp-s3cret2")] {
        let mut req = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(&init);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401, "{auth:?}");
        assert!(!resp.text().await.unwrap().contains("flower"), "a refusal says nothing of the server");
    }

    // Garbage with the right token is refused by the protocol layer; the server goes on.
    for body in ["{not json", "[]", "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"tools/call\"}", "\u{0}\u{ff}"] {
        let resp = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", "Bearer mcp-s3cret")
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_client_error(), "{body:?}: {}", resp.status());
    }

    let url2 = url.clone();
    let r = tokio::task::spawn_blocking(move || client(&["--url", &url2, "--token", "mcp-s3cret"])).await.unwrap();
    let (job, artifact) = check_report(&r);
    assert_eq!(artifact, stored_artifact(&home, &job));
    coordinator_was_given_the_goal(&home, &job);
    drop(server);
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_serve_against_a_coordinator_over_grpc() {
    let mut c = Cluster::start(Options { workers: 2, token: Some("grpc-s3cret"), ..Default::default() }).await;
    let server = c.server();
    let t = template();
    let r = tokio::task::spawn_blocking(move || {
        client(&["--stdio", FLOWER, "mcp-serve", "--server", &server, "--token", "grpc-s3cret", "--template", &t])
    })
    .await
    .unwrap();
    let (job, artifact) = check_report(&r);
    // The same bytes as the CLI downloads from the service.
    let got = c.flower(&["artifacts", &job, "get", "artifacts/sizes.md"]);
    assert!(got.status.success());
    assert_eq!(String::from_utf8_lossy(&got.stdout), artifact);
    c.wait_job(&job, "succeeded").await;
    c.stop().await;
}
