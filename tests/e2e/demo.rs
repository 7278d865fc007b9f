//! The bundled demo, as a new user runs it.

use crate::support::{Home, repo, sessions, tool_results, tool_uses};

#[test]
fn the_demo_delegates_in_parallel_and_answers_with_real_figures() {
    let home = Home::new();
    let summary = home.run_job(&repo().join("examples/demo/job.yaml"), &[]);
    assert_eq!(summary["state"], "succeeded");
    assert_eq!(summary["tasks"], 3);
    assert_eq!(summary["tasks_succeeded"], 3);
    let answer = summary["final_answer"].as_str().unwrap();
    // Real figures from the bundled data (15 files; its largest is the 3rd log).
    let files = walk_count(&repo().join("examples/demo/data"));
    assert!(answer.contains(&format!("data/ holds {files} files")), "{answer}");
    assert!(answer.contains("data/logs/app-2026-11-03.log"), "{answer}");
    assert!(answer.contains(".flower/artifacts/sizes.md"), "the answer cites the artifact: {answer}");
    assert_eq!(summary["artifacts"][0][0], "artifacts/sizes.md");
    let table = std::fs::read_to_string(
        std::path::Path::new(summary["workbench"].as_str().unwrap()).join("artifacts/sizes.md"),
    )
    .unwrap();
    assert!(table.starts_with("# desc: "));
    assert_eq!(table.lines().filter(|l| l.contains("\tdata/")).count(), files, "one row per file");

    let job = summary["job_id"].as_str().unwrap();
    let t = home.transcripts(job);
    let coordinator = sessions(&t, "coordinator");
    assert_eq!(coordinator.len(), 1);
    let calls = tool_uses(coordinator[0]);
    // The main thread holds only its own turns: delegations and one workbench read.
    assert_eq!(calls.iter().filter(|(n, _)| n == "Agent").count(), 3);
    assert!(calls.iter().all(|(n, _)| n == "Agent" || n == "Read"), "{calls:?}");
    let entries = coordinator[0]["entries"].as_array().unwrap();
    assert_eq!(entries[1]["kind"], "notice", "the workbench index arrives as a notice after the goal");
    assert!(entries[1]["content"][0]["text"].as_str().unwrap().contains("# Workbench index"));
    let later: Vec<_> = entries.iter().filter(|e| e["kind"] == "notice").skip(1).collect();
    assert!(
        later.iter().all(|e| e["content"][0]["text"].as_str().unwrap().contains("The workbench index changed")),
        "later index notices are diffs, never a resend"
    );
    assert!(!later.is_empty(), "the sizer's artifact changed the index");
    let first_assistant = entries.iter().find(|e| e["kind"] == "assistant").unwrap();
    let first_turn: Vec<_> =
        first_assistant["content"].as_array().unwrap().iter().filter(|b| b["type"] == "tool_use").collect();
    assert_eq!(first_turn.len(), 3, "the three delegations are one turn (parallel)");
    let reports = tool_results(coordinator[0]);
    assert!(reports.iter().any(|(r, _)| r.starts_with("Files: data/ holds")));
    assert!(reports.iter().all(|(r, _)| !r.contains("find data")), "no worker tool call leaks into the main thread");

    let workers = sessions(&t, "worker");
    assert_eq!(workers.len(), 3, "each worker session is stored separately");
    for w in &workers {
        assert!(w["task_id"].is_string());
        let uses = tool_uses(w);
        assert!(!uses.is_empty(), "{} made real tool calls", w["label"]);
        assert_eq!(w["entries"][0]["parent_uuid"], serde_json::Value::Null);
        let entries = w["entries"].as_array().unwrap();
        for pair in entries.windows(2) {
            assert_eq!(pair[1]["parent_uuid"], pair[0]["uuid"], "entries form one chain");
        }
    }
    let counter = workers.iter().find(|w| w["label"] == "counter").unwrap();
    let outputs = tool_results(counter);
    assert_eq!(outputs[0].0.trim(), files.to_string(), "the real `find | wc -l` output is stored");
    let sizer = workers.iter().find(|w| w["label"] == "sizer").unwrap();
    assert!(tool_uses(sizer).iter().any(|(n, i)| n == "Write" && i["file_path"] == ".flower/artifacts/sizes.md"));

    // Events were written as rows; usage was counted.
    // (Every input token is a cache read or write once the tail marker covers the whole request.)
    let u = &summary["usage"];
    let input = ["input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"];
    assert!(input.iter().map(|k| u[k].as_u64().unwrap()).sum::<u64>() > 1000, "{u}");
    assert!(u["output_tokens"].as_u64().unwrap() > 0);
    let status = home.run(&["status", job, "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["state"], "succeeded");
}

#[test]
fn flower_demo_prints_progress_and_the_final_answer() {
    let home = Home::new();
    let out = home.run(&["demo"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("→ task") && stderr.contains("to sizer"), "task progress on stderr: {stderr}");
    assert!(stdout.contains("succeeded"), "{stdout}");
    assert!(stdout.contains("Final answer:"), "{stdout}");
    assert!(stdout.contains(".flower/artifacts/sizes.md"), "{stdout}");
}

fn walk_count(dir: &std::path::Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            n += walk_count(&e.path());
        } else {
            n += 1;
        }
    }
    n
}

/// With every request answered once by a 529 and once by a dropped stream,
/// the demo still succeeds; each drop leaves a marked entry.
#[test]
fn the_demo_survives_overloads_and_dropped_streams() {
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let demo = repo().join("examples/demo");
    let scenario = std::fs::read_to_string(demo.join("scenario.yaml")).unwrap().replace(
        "latency: {ttft_ms: 60, tokens_per_sec: 0}",
        "latency: {ttft_ms: 0, tokens_per_sec: 0}\nfaults: {overloaded: 1.0, dropped: 1.0}",
    );
    std::fs::write(dir.path().join("scenario.yaml"), scenario).unwrap();
    let spec = std::fs::read_to_string(demo.join("job.yaml"))
        .unwrap()
        .replace("workspace: .", &format!("workspace: {}", demo.display()));
    std::fs::write(dir.path().join("job.yaml"), spec).unwrap();
    let summary = home.run_job(&dir.path().join("job.yaml"), &[]);
    assert_eq!(summary["state"], "succeeded");
    assert!(summary["final_answer"].as_str().unwrap().contains("data/ holds 15 files"));
    let t = home.transcripts(summary["job_id"].as_str().unwrap());
    for s in t["sessions"].as_array().unwrap() {
        let entries = s["entries"].as_array().unwrap();
        let real =
            entries.iter().filter(|e| e["kind"] == "assistant" && e["markers"]["synthetic_error"] != true).count();
        let synthetic = entries.iter().filter(|e| e["markers"]["synthetic_error"] == true).count();
        assert_eq!(synthetic, real, "{}: one dropped stream recorded per model call", s["label"]);
    }
}
