//! The two-tier tool surface over a real MCP server (the 132-tool fixture,
//! started by the worker over stdio or reached over streamable HTTP): the
//! tool block with deferral on versus off, measured by the context explorer;
//! a direct call to a deferred tool in one step; a search miss with its hint;
//! the role filter; credentials from the worker's environment; and the
//! simulator's cache audit (append-only requests, no unexplained miss).

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde_json::Value;

use crate::support::{FLOWER, Home, repo, sessions, tool_results, tool_uses};

const TOKEN: (&str, &str) = ("MCP_FIXTURE_TOKEN", "s3cret");
/// The worker's policy: the fixture with its token flag may start, and its
/// token variable may be named by the spec.
const ALLOW_MCP: (&str, &str) = ("FLOWER_MCP_ALLOW", "fixture=flower mcp-fixture --token-env FIXTURE_TOKEN");
const ALLOW_ENV: (&str, &str) = ("FLOWER_ENV_ALLOW", "MCP_FIXTURE_TOKEN");

fn context(home: &Home, job: &str) -> Value {
    let out = home.run(&["context", job, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn session<'a>(ctx: &'a Value, role: &str) -> &'a Value {
    ctx["sessions"].as_array().unwrap().iter().find(|s| s["role"] == role).unwrap()
}

fn result_texts(session: &Value) -> Vec<String> {
    tool_results(session).into_iter().map(|(text, _)| text).collect()
}

#[test]
fn deferral_shrinks_the_tool_block_and_deferred_tools_work_in_one_step() {
    let spec = repo().join("tests/fixtures/tools/job.yaml");
    let home = Home::new();
    let on = home.run_job(&spec, &[TOKEN, ALLOW_MCP, ALLOW_ENV]);
    let off = home.run_job(&spec, &[TOKEN, ALLOW_MCP, ALLOW_ENV, ("FLOWER_TOOL_DEFERRAL", "off")]);
    for run in [&on, &off] {
        assert_eq!(run["state"], "succeeded", "{run}");
        let answer = run["final_answer"].as_str().unwrap();
        assert!(answer.contains("TCK-1") && answer.contains(r#""value":"TCK-1""#), "{answer}");
    }

    // Acceptance 1, measured by the context explorer.
    let (c_on, c_off) =
        (context(&home, on["job_id"].as_str().unwrap()), context(&home, off["job_id"].as_str().unwrap()));
    let (w_on, w_off) = (session(&c_on, "worker"), session(&c_off, "worker"));
    let block = |w: &Value| w["tool_tokens"].as_u64().unwrap() + w["index_tokens"].as_u64().unwrap();
    let (b_on, b_off) = (block(w_on), block(w_off));
    println!("worker tool block: deferral on {b_on} tokens, off {b_off} tokens (estimates)");
    assert!(b_on * 100 <= b_off * 22, "≥ 78% smaller: {b_on} vs {b_off}");
    assert!(w_off["resident"].as_array().unwrap().len() >= 120 && w_off["index_tokens"] == 0);
    assert!(
        w_off["resident"].as_array().unwrap().iter().all(|t| t["name"] != "search_tools"),
        "off: no discovery tool"
    );
    assert!(w_on["deferred"].as_array().unwrap().len() >= 120);
    let resident: Vec<&str> =
        w_on["resident"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(resident, ["Read", "Bash", "search_tools"]);
    // What each withheld schema would cost is shown.
    assert!(w_on["deferred"].as_array().unwrap().iter().all(|t| t["tokens"].as_u64().unwrap() > 50));

    // Acceptance 5: a direct call to a deferred tool succeeds in one step; the miss is recorded with its hint.
    let loaded: Vec<(String, String)> = serde_json::from_value(w_on["loaded"].clone()).unwrap();
    assert_eq!(loaded[0], ("mcp__fixture__ticket_create".into(), "direct_call".into()));
    assert!(loaded[1..].iter().all(|(_, t)| t == "search_tools") && loaded.len() >= 3, "{loaded:?}");
    assert!(loaded.iter().any(|(n, _)| n == "mcp__fixture__memory_store"));
    assert_eq!(w_on["search_misses"], serde_json::json!(["quantum zebra"]));
    let t = home.transcripts(on["job_id"].as_str().unwrap());
    let worker = sessions(&t, "worker")[0];
    let calls = tool_uses(worker);
    assert_eq!(calls[0].0, "mcp__fixture__ticket_create", "the first model turn called it");
    assert!(!tool_results(worker)[0].1, "and it ran in that step");
    let texts = result_texts(worker);
    assert!(texts[0].contains("TCK-1"), "{}", texts[0]);
    assert!(texts[1].contains("nothing matched") && texts[1].contains("try other words"), "{}", texts[1]);

    // The role filter: the coordinator reaches no MCP tool, by direct call or by search.
    let coord = session(&c_on, "coordinator");
    assert!(coord["loaded"].as_array().unwrap().is_empty() && coord["deferred"].as_array().unwrap().is_empty());
    let boss = sessions(&t, "coordinator")[0];
    let texts = result_texts(boss);
    assert!(texts[0].contains("no tool named `mcp__fixture__ticket_create`"), "{}", texts[0]);
    assert!(!texts[1].contains("mcp__"), "a search cannot reveal a tool outside the role: {}", texts[1]);

    // Acceptance 2: every request extends the previous one except at a recorded rewrite; no unexplained miss.
    let audit = &on["cache_audit"];
    println!("cache audit, deferral on: {audit}");
    assert_eq!(audit["unexplained"], serde_json::json!([]), "{audit}");
    let rewrites = c_on["cache_rewrites"].as_array().unwrap();
    assert!(rewrites.len() >= 2 && rewrites.iter().all(|r| r["reason"] == "tools_loaded"));
    assert_eq!(audit["explained"].as_u64().unwrap(), audit["misses"].as_u64().unwrap());
    assert!(audit["misses"].as_u64().unwrap() >= 2, "the loads were rewrites the audit saw: {audit}");
    assert!(rewrites.iter().all(|r| r["cache_write_tokens"].as_u64().unwrap() > 0), "each with its measured cost");
    let audit = &off["cache_audit"];
    assert_eq!(audit["misses"], 0, "without loads, nothing is rewritten: {audit}");
    assert_eq!(audit["append_only"], audit["requests"]);
}

#[test]
fn mcp_credentials_come_from_the_worker_environment() {
    let home = Home::new();
    // Over stdio: without the variable the worker refuses before starting the server.
    let out = home
        .cmd()
        .envs([ALLOW_MCP, ALLOW_ENV])
        .args(["run", repo().join("tests/fixtures/tools/job.yaml").to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let answer = summary["final_answer"].as_str().unwrap_or_default();
    assert!(answer.contains("MCP_FIXTURE_TOKEN") && answer.contains("not set"), "{summary}");

    // Over streamable HTTP with a bearer token: the right one works, a wrong one is refused.
    let mut server = std::process::Command::new(FLOWER)
        .args(["mcp-fixture", "--http", "127.0.0.1:0", "--token-env", "FIXTURE_SERVER_TOKEN"])
        .env("FIXTURE_SERVER_TOKEN", TOKEN.1)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let server = KillOnDrop(server);
    let url = line.trim().rsplit(' ').next().unwrap().to_string();
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"), "{line}");
    let dir = repo().join("tests/fixtures/tools");
    let spec = std::fs::read_to_string(dir.join("job.yaml"))
        .unwrap()
        .replace("scenario: scenario.yaml", &format!("scenario: {}", dir.join("scenario.yaml").display()))
        .replace("workspace: workspace", &format!("workspace: {}", dir.join("workspace").display()))
        .replace(
            "    command: [flower, mcp-fixture, --token-env, FIXTURE_TOKEN]\n    env_from: {FIXTURE_TOKEN: MCP_FIXTURE_TOKEN}",
            &format!("    url: {url}\n    token_env: MCP_FIXTURE_TOKEN"),
        );
    assert!(spec.contains("token_env"));
    let path = home.dir.path().join("http.yaml");
    std::fs::write(&path, spec).unwrap();
    // The token may be sent only beneath the URL the operator bound it to.
    let elsewhere = home
        .cmd()
        .envs([TOKEN, ("FLOWER_ENV_ALLOW", "MCP_FIXTURE_TOKEN=https://tickets.example.com/mcp")])
        .args(["run", path.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&elsewhere.stderr);
    assert_eq!(elsewhere.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("mcp_servers.fixture.token_env") && stderr.contains("beneath https://tickets.example.com/mcp"),
        "{stderr}"
    );
    let bound = format!("MCP_FIXTURE_TOKEN={url}");
    let allow = ("FLOWER_ENV_ALLOW", bound.as_str());
    let good = home.run_job(&path, &[TOKEN, allow]);
    assert!(good["final_answer"].as_str().unwrap().contains("TCK-1"), "{good}");
    let out = home
        .cmd()
        .envs([("MCP_FIXTURE_TOKEN", "wrong"), allow])
        .args(["run", path.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let bad: Value = serde_json::from_slice(&out.stdout).unwrap();
    let answer = bad["final_answer"].as_str().unwrap_or_default();
    assert!(answer.contains("MCP server `fixture`") && !answer.contains("TCK-1"), "{bad}");
    drop(server);
}

/// A child process killed when the test ends, pass or fail.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn staggering_a_fan_out_writes_the_shared_prefix_once_and_the_moving_pair_survives_a_wide_turn() {
    let spec = repo().join("tests/fixtures/fanout/job.yaml");
    let home = Home::new();
    let run = |extra: &[(&str, &str)]| {
        let run = home.run_job(&spec, extra);
        assert_eq!(run["state"], "succeeded", "{run}");
        assert_eq!(run["tasks_succeeded"], 12);
        run
    };
    let writes = |run: &Value| {
        let sub = &run["context"]["subagents"];
        (sub["usage"]["cache_creation_input_tokens"].as_u64().unwrap(), sub["cache_rate"].as_f64().unwrap())
    };
    let (off, on) = (run(&[("FLOWER_FANOUT_STAGGER", "off")]), run(&[]));
    let ((w_off, r_off), (w_on, r_on)) = (writes(&off), writes(&on));
    println!(
        "12 same-shape subagents: cache writes {w_off} tokens staggering off, {w_on} on; rate {r_off:.3} vs {r_on:.3}"
    );
    assert!(w_on < w_off, "staggering writes less: {w_on} vs {w_off}");
    assert!(r_on > r_off);
    assert_eq!(on["cache_audit"]["unexplained"], serde_json::json!([]), "{}", on["cache_audit"]);

    // The fan-out turn adds 24 blocks: a lone tail marker cannot find the
    // previous request's entry within 20 blocks; the previous-tail marker can.
    let naive = run(&[("FLOWER_PROMPT_CACHE", "tail-only")]);
    let main_rate = |r: &Value| r["context"]["main"]["cache_rate"].as_f64().unwrap();
    println!(
        "main thread across a 24-block turn: {:.3} with 4 breakpoints, {:.3} with the tail marker only",
        main_rate(&on),
        main_rate(&naive)
    );
    assert!(main_rate(&on) > main_rate(&naive));
    assert!(
        naive["cache_audit"]["misses"].as_u64().unwrap() >= 1,
        "the naive builder's silent miss is visible: {}",
        naive["cache_audit"]
    );
}

#[test]
fn uneventful_old_output_is_pruned_from_the_view_in_one_recorded_rewrite() {
    let home = Home::new();
    let run = home.run_job(&repo().join("tests/fixtures/uneventful/job.yaml"), &[]);
    assert_eq!(run["state"], "succeeded", "{run}");
    let rewrites: Vec<&Value> = run["context"]["cache_rewrites"].as_array().unwrap().iter().collect();
    assert_eq!(rewrites.len(), 1, "batched: one deep rewrite, not one per turn: {rewrites:?}");
    assert_eq!(rewrites[0]["reason"], "pruned_uneventful");
    let audit = &run["cache_audit"];
    assert_eq!(audit["unexplained"], serde_json::json!([]), "{audit}");
    assert_eq!(audit["explained"], 1, "{audit}");
    // Only the request view changed: the stored transcript keeps every byte.
    let t = home.transcripts(run["job_id"].as_str().unwrap());
    let results = tool_results(sessions(&t, "coordinator")[0]);
    assert!(results[..3].iter().all(|(text, _)| text.len() > 3000 && text.contains("heartbeat ok")));
}
