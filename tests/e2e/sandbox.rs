//! A worker trying to leave its working directory or read the service's
//! secrets gets clear tool errors; the job goes on.

use crate::support::{Home, repo, sessions, tool_results};

#[test]
fn file_tools_stay_beneath_the_working_directory_and_bash_sees_no_secrets() {
    let home = Home::new();
    let secret = "sk-ant-test-do-not-leak-4242";
    let summary = home.run_job(
        &repo().join("tests/fixtures/sandbox/job.yaml"),
        &[("ANTHROPIC_API_KEY", secret), ("FLOWER_TEST_SECRET", "hunter2")],
    );
    assert_eq!(summary["state"], "succeeded", "the job goes on after refusals");
    let t = home.transcripts(summary["job_id"].as_str().unwrap());
    let delegations = tool_results(sessions(&t, "coordinator")[0]);
    let (ghost, is_error) = &delegations[1];
    assert!(*is_error && ghost.contains("no worker named `ghost`; this job's workers are: prober"), "{ghost}");
    assert!(delegations[0].0.starts_with("probe done."), "the other delegation still ran: {:?}", delegations[0]);
    let prober = sessions(&t, "worker")[0];
    let results = tool_results(prober);
    let refused = |i: usize| {
        let (text, is_error) = &results[i];
        assert!(*is_error, "call {i} should be an error: {text}");
        assert!(text.contains("outside the task's working directory"), "call {i}: {text}");
    };
    refused(0); // Read ../outside.txt
    refused(1); // Read /etc/passwd
    refused(2); // Write ../escaped.txt
    assert_eq!(results[3].0.trim(), "linked");
    refused(4); // Read through a symlink to /etc/passwd
    refused(5); // Write through a symlink to ..
    refused(6); // Glob through a symlink to ..
    let env_line = &results[7].0;
    assert!(env_line.contains("key=[]") && env_line.contains("token=[]"), "{env_line}");
    assert!(!env_line.contains(secret));
    assert!(!results[8].1 && results[8].0.contains("inside the sandbox"), "reads inside still work: {:?}", results[8]);
    assert!(!summary["final_answer"].as_str().unwrap().contains("root:x:0"), "no /etc/passwd content anywhere");
    let escaped: Vec<_> = walk(home.dir.path()).into_iter().filter(|p| p.ends_with("escaped.txt")).collect();
    assert!(escaped.is_empty(), "nothing was written outside: {escaped:?}");
    for s in t["sessions"].as_array().unwrap() {
        assert!(!s.to_string().contains(secret), "the key is in no transcript");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

/// Parallel tasks changing one workspace file: the later change is kept and
/// the conflict is reported; the user's directory is never touched.
#[test]
fn parallel_changes_to_one_file_are_applied_in_completion_order_with_a_conflict() {
    let home = Home::new();
    let spec = repo().join("tests/fixtures/conflict/job.yaml");
    let out = home.run(&["run", spec.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("workspace conflict on shared.txt (later change kept)"), "{stderr}\n{stdout}");
    assert!(
        stdout.contains("shared.txt now reads:      1\tversion A")
            || stdout.contains("shared.txt now reads:      1\tversion B"),
        "the coordinator reads the job's workspace state: {stdout}"
    );
    let original = std::fs::read_to_string(repo().join("tests/fixtures/conflict/workspace/shared.txt")).unwrap();
    assert_eq!(original, "base\n", "the submitted directory is a snapshot, never written");
}

/// Layers 1 and 3 end to end: hands-on calls on the main thread are denied
/// with the structural marker (a glance runs), a large worker output is
/// spilled, and reading the spilled file returns it whole.
#[test]
fn the_guards_deny_hands_on_work_and_spill_large_output() {
    let home = Home::new();
    let summary = home.run_job(&repo().join("tests/fixtures/economy/job.yaml"), &[]);
    assert_eq!(summary["state"], "succeeded");
    let t = home.transcripts(summary["job_id"].as_str().unwrap());
    let coordinator = sessions(&t, "coordinator")[0];
    let results: Vec<&serde_json::Value> =
        coordinator["entries"].as_array().unwrap().iter().filter(|e| e["kind"] == "tool_result").collect();
    let text = |e: &serde_json::Value| e["content"][0]["content"][0]["text"].as_str().unwrap_or_default().to_string();
    // Write and `rm -rf` denied, with the marker; the glance ran (on a worker) and is ephemeral.
    assert_eq!(results[0]["markers"]["denial_kind"], "delegate_guard");
    assert!(text(results[0]).starts_with("Denied by delegate_guard:"), "{}", text(results[0]));
    assert_eq!(results[1]["markers"]["denial_kind"], "delegate_guard");
    assert!(text(results[1]).contains("`rm` is not a read-only command"), "{}", text(results[1]));
    assert!(results[2]["markers"].get("denial_kind").is_none());
    assert_eq!(results[2]["markers"]["ephemeral"], true);
    assert_eq!(text(results[2]).trim(), "1", "the glance ran in the job's workspace: {}", text(results[2]));
    assert!(
        sessions(&t, "worker").iter().all(|w| w["entries"].to_string().find("delegate_guard").is_none()),
        "subagents are never denied"
    );

    let reader = sessions(&t, "worker").into_iter().find(|w| w["label"] == "reader").unwrap();
    let synthetic: Vec<&serde_json::Value> =
        reader["entries"].as_array().unwrap().iter().filter(|e| e["markers"]["synthetic_error"] == true).collect();
    assert_eq!(synthetic.len(), 1, "the dropped stream left one marked entry");
    assert!(synthetic[0]["content"][0]["text"].as_str().unwrap().starts_with("[stream dropped"));
    let outputs = tool_results(reader);
    assert!(
        outputs[0].0.starts_with("[16092 characters spilled to .flower/spill/"),
        "{}",
        &outputs[0].0[..120.min(outputs[0].0.len())]
    );
    assert!(outputs[0].0.len() < 700, "only the pointer and 400 characters entered the context");
    assert!(
        outputs[1].0.contains("line 300: the quick brown fox") && outputs[1].0.len() > 16092,
        "the spilled file is read back whole, not spilled again"
    );
    assert!(summary["final_answer"].as_str().unwrap().contains("line 300"));
    // On resume the older denial is pruned by its marker (keep_denials = 1); the stored rows keep both.
    let job = summary["job_id"].as_str().unwrap();
    let out = home.run(&["transcript", "show", job, "--pruned", "--json"]);
    let pruned: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let main = &sessions(&pruned, "coordinator")[0];
    assert_eq!(main["pruning"][0]["rule"], "denial", "{}", main["pruning"]);
    let denials = |s: &serde_json::Value| s["entries"].to_string().matches("\"denial_kind\"").count();
    assert_eq!(denials(main), 1);
    assert_eq!(denials(coordinator), 2, "stored rows are never rewritten");
    let spilled: Vec<_> = std::fs::read_dir(std::path::Path::new(summary["workbench"].as_str().unwrap()).join("spill"))
        .unwrap()
        .collect();
    assert_eq!(spilled.len(), 1);
}

/// `flower run --resume`: a job whose process was killed mid-task continues
/// from what was stored — the subagent resumes its turns, the task runs as a
/// new attempt, the job succeeds.
#[test]
fn a_killed_embedded_run_resumes() {
    let home = Home::new();
    let spec = repo().join("tests/fixtures/resume/job.yaml");
    let mut child = home
        .cmd()
        .args(["run", spec.to_str().unwrap(), "--json"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait (on the stored state) for the worker's `sleep` to be under way.
    let started = std::time::Instant::now();
    let job = loop {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "the sleep never started");
        let out = home.run(&["status", "--json"]);
        if let Ok(jobs) = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            && let Some(id) = jobs[0]["id"].as_str()
        {
            let t = home.run(&["transcript", "show", id, "--json"]);
            if String::from_utf8_lossy(&t.stdout).contains("sleep 5") {
                break id.to_string();
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let out = home.run(&["run", "--resume", &job[..8], "--json"]);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["final_answer"], "slow task said: rested");
    assert_eq!(summary["tasks"], 1, "the Agent call found its task again");
    let t = home.transcripts(&job);
    let sleeper = sessions(&t, "worker")[0];
    let entries = sleeper["entries"].as_array().unwrap();
    assert!(
        entries.iter().any(|e| e["markers"]["interrupted"] == true),
        "the killed call is marked, not re-run blindly"
    );
    assert_eq!(entries[0]["content"][0]["text"], "Take your time.", "the same session continues its earlier turns");
    let again = home.run(&["run", "--resume", &job]);
    assert_eq!(again.status.code(), Some(2), "a finished job cannot be resumed");
}
