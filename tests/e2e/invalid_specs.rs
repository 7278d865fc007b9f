//! Bad job specs fail before anything runs, naming the field.

use crate::support::{Home, repo};

fn run_spec(home: &Home, text: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(repo().join("examples/demo/scenario.yaml"), dir.path().join("scenario.yaml")).unwrap();
    let spec = dir.path().join("job.yaml");
    std::fs::write(&spec, text).unwrap();
    let out = home.run(&["run", spec.to_str().unwrap()]);
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn demo_spec() -> String {
    std::fs::read_to_string(repo().join("examples/demo/job.yaml")).unwrap().replace("workspace: .\n", "")
}

#[test]
fn a_nonexistent_worker_name_is_named() {
    let home = Home::new();
    let spec = demo_spec().replace("  name: lead\n", "  name: lead\n  workers: [counter, ghost]\n");
    let (code, err) = run_spec(&home, &spec);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("coordinator.workers[1]") && err.contains("no worker named `ghost`"), "{err}");
    assert!(!home.dir.path().join("flower.db").exists(), "nothing ran");
}

#[test]
fn a_missing_goal_is_named() {
    let home = Home::new();
    let spec = demo_spec();
    let start = spec.find("goal: |").unwrap();
    let end = spec.find("provider:").unwrap();
    let (code, err) = run_spec(&home, &format!("{}{}", &spec[..start], &spec[end..]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("goal: missing (required)"), "{err}");
}

#[test]
fn a_wrong_type_is_named() {
    let home = Home::new();
    let (code, err) = run_spec(&home, &demo_spec().replace("concurrency: 3", "concurrency: lots"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("runtime.concurrency") && err.contains("invalid type"), "{err}");
    let (code, err) = run_spec(&home, &demo_spec().replace("tools: [Bash, Glob]", "tools: [Bash, Glbo]"));
    assert_eq!(code, 2);
    assert!(err.contains("workers.counter.tools[1]") && err.contains("unknown tool `Glbo`"), "{err}");
}

#[test]
fn a_bad_scenario_is_named_before_running() {
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("scenario.yaml"), "roles:\n  - name: x\n    steps: [{id: 'a b'}]\n").unwrap();
    let spec = dir.path().join("job.yaml");
    std::fs::write(&spec, demo_spec()).unwrap();
    let out = home.run(&["run", spec.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("roles[0].steps[0].id"), "{err}");
}

/// `flower glance` gives every command of the table the verdict the guard gives it.
#[test]
fn flower_glance_agrees_with_the_table() {
    let home = Home::new();
    for (cmd, allowed) in flower_agent::glance::CASES {
        let out = home.run(&["glance", cmd]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.success(), *allowed, "{cmd:?}: {text}");
        assert!(text.starts_with(if *allowed { "allowed: " } else { "refused: " }), "{cmd:?}: {text}");
    }
    let out = home.run(&["glance", "git status && rm -rf x", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["segment"], "rm -rf x");
}

/// A Claude Code session file is imported with its markers mapped, and the
/// pruning loader treats it as it treats flower's own transcripts.
#[test]
fn a_claude_code_session_imports_and_prunes() {
    let home = Home::new();
    let file = repo().join("tests/fixtures/claude-code/session.jsonl");
    let out = home.run(&["transcript", "import", file.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let imported: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(imported["entries"], 9);
    assert_eq!(imported["skipped"][0]["line"], 1, "the summary line is not a chain entry");
    let job = imported["job_id"].as_str().unwrap();
    let out = home.run(&["transcript", "show", job, "--pruned", "--json"]);
    let t: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let main = &t["sessions"][0];
    let rules: Vec<&str> = main["pruning"].as_array().unwrap().iter().map(|c| c["rule"].as_str().unwrap()).collect();
    assert_eq!(rules, vec!["denial", "synthetic", "interrupted", "heal"]);
    let text = main["entries"].to_string();
    assert!(!text.contains("rm -rf logs"), "the older denied call left with its result");
    assert!(text.contains("rm logs/old.log"), "the most recent denial is kept");
    assert!(!text.contains("API Error"), "synthetic errors are not re-injected");

    // flower's own transcripts export in the same shape and come back the same.
    let exported = home.dir.path().join("export.jsonl");
    let out = home.run(&["transcript", "export", job, "-o", exported.to_str().unwrap()]);
    assert!(out.status.success());
    let again = home.run(&["transcript", "import", exported.to_str().unwrap(), "--json"]);
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["entries"], 9);
    let out = home.run(&["transcript", "show", again["job_id"].as_str().unwrap(), "--pruned", "--json"]);
    let t2: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rules2: Vec<&str> =
        t2["sessions"][0]["pruning"].as_array().unwrap().iter().map(|c| c["rule"].as_str().unwrap()).collect();
    assert_eq!(rules2, rules, "markers survive the round trip");
}

/// An imported session's glances carry no verdict: import records the one
/// the glance judge gives, so the pruning loader expires all but the latest six.
#[test]
fn an_imported_sessions_glances_expire_but_the_latest_six() {
    let home = Home::new();
    let file = repo().join("tests/fixtures/claude-code/glances.jsonl");
    let out = home.run(&["transcript", "import", file.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let imported: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let job = imported["job_id"].as_str().unwrap();

    let stored = home.transcripts(job);
    let verdicts: Vec<&serde_json::Value> = stored["sessions"][0]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .map(|e| &e["markers"]["ephemeral"])
        .collect();
    assert_eq!(verdicts.len(), 9);
    assert!(verdicts.iter().all(|v| **v == true), "each glance's verdict is recorded: {verdicts:?}");

    let out = home.run(&["transcript", "show", job, "--pruned", "--json"]);
    let t: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let main = &t["sessions"][0];
    let rules: Vec<&str> = main["pruning"].as_array().unwrap().iter().map(|c| c["rule"].as_str().unwrap()).collect();
    assert_eq!(rules, vec!["ephemeral"; 3]);
    let text = main["entries"].to_string();
    for i in 1..=3 {
        assert!(!text.contains(&format!("glance {i}:")), "glance {i} expired: {text}");
    }
    for i in 4..=9 {
        assert!(text.contains(&format!("glance {i}:")), "glance {i} kept: {text}");
    }
    assert_eq!(text.matches("`git status --short` result expired").count(), 3);
}

/// A job whose token budget runs out mid-run waits in `waiting_for_budget`
/// and asks its user; a raise from another process lets it finish; without
/// an answer it ends `failed` with the budget as its reason after
/// `runtime.budget.wait`; what ran is kept either way.
#[test]
fn a_spent_budget_asks_for_a_raise_then_finishes_or_ends_with_the_reason() {
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let demo = repo().join("examples/demo");
    let spec = |budget: &str| {
        std::fs::read_to_string(demo.join("job.yaml"))
            .unwrap()
            .replace("scenario: scenario.yaml", &format!("scenario: {}", demo.join("scenario.yaml").display()))
            .replace("workspace: .", &format!("workspace: {}", demo.display()))
            .replace("  bash_timeout: 30s", &format!("  bash_timeout: 30s\n  budget:\n{budget}"))
    };
    // Raised: the run waits, `flower answer` (another process) raises, it finishes.
    let path = dir.path().join("raised.yaml");
    std::fs::write(&path, spec("    max_tokens: 3000\n    wait: 5m\n")).unwrap();
    let run = home
        .cmd()
        .args(["run", path.to_str().unwrap(), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let job = crate::support::wait_state(&home, "waiting_for_budget");
    let status: serde_json::Value = serde_json::from_slice(&home.run(&["status", &job, "--json"]).stdout).unwrap();
    let asked = status["questions"][0]["question"].as_str().unwrap_or_default().to_string();
    assert!(asked.contains("token budget spent") && asked.contains("Raise the budget, or stop here?"), "{status}");
    let sent = home.run(&["answer", &job, "raise it to 10000000 tokens"]);
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    let out = run.wait_with_output().unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["state"], "succeeded", "{summary} {}", String::from_utf8_lossy(&out.stderr));

    // Not raised: "no answer" after the wait ends it, the budget as the reason.
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, spec("    max_tokens: 3000\n    wait: 1s\n")).unwrap();
    let out = home.run(&["run", path.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["state"], "failed");
    assert!(summary["reason"].as_str().unwrap().starts_with("budget: token budget spent:"), "{}", summary["reason"]);
    let id = summary["job_id"].as_str().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&home.run(&["status", id, "--json"]).stdout).unwrap();
    assert_eq!(status["questions"][0]["answered_by"], "timeout", "{status}");
    let t = home.transcripts(id);
    assert!(t["sessions"].as_array().unwrap().len() > 1, "the work done before the limit is kept");

    // `wait: 0s`: the job ends at once, as a budget without a user.
    std::fs::write(&path, spec("    max_tokens: 3000\n    wait: 0s\n")).unwrap();
    let summary: serde_json::Value =
        serde_json::from_slice(&home.run(&["run", path.to_str().unwrap(), "--json"]).stdout).unwrap();
    assert_eq!(summary["state"], "failed");
    let status: serde_json::Value =
        serde_json::from_slice(&home.run(&["status", summary["job_id"].as_str().unwrap(), "--json"]).stdout).unwrap();
    assert!(status["questions"].as_array().is_none_or(|q| q.is_empty()), "no question: {status}");

    // A deadline ends the job at the next model call.
    let deadline = std::fs::read_to_string(&path).unwrap().replace("max_tokens: 3000", "deadline: 1ms");
    let deadline_path = dir.path().join("deadline.yaml");
    std::fs::write(&deadline_path, deadline).unwrap();
    let out = home.run(&["run", deadline_path.to_str().unwrap(), "--json"]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["state"], "failed");
    assert!(
        summary["reason"].as_str().unwrap().starts_with("budget: deadline of 1 ms passed"),
        "{}",
        summary["reason"]
    );

    // A cost budget needs a price for every model the job uses.
    let spec = std::fs::read_to_string(&path)
        .unwrap()
        .replace("max_tokens: 3000", "max_cost_usd: 1.0")
        .replace("model: claude-sonnet-4-5", "model: my-local-model");
    std::fs::write(&path, spec).unwrap();
    let out = home.run(&["run", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("runtime.budget.prices: no price for model `my-local-model`")
    );
}
