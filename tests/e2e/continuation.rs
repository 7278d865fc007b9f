//! Continuing a finished job (`flower continue`) in the embedded mode: a new
//! job naming its parent, from the parent's workbench, its brief amended,
//! its goal set again, its coordinator told where the parent ended. (Over
//! gRPC: `distributed.rs`.)

use serde_json::Value;

use crate::support::{Home, repo, sessions, workbench_file};

#[test]
fn a_finished_job_continues_as_a_new_job_with_its_lineage() {
    let home = Home::new();
    let first = home.run_job(&repo().join("tests/fixtures/workflow/job.yaml"), &[]);
    let parent = first["job_id"].as_str().unwrap();
    let parent_brief = workbench_file(&first, "notes/brief.md");

    let out = home.run(&["continue", &parent[..8], "Also add a chart of the totals.", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["state"], "succeeded", "{summary}");
    let child = summary["job_id"].as_str().unwrap();
    assert_ne!(child, parent, "a new job");

    // The lineage, both ways, in `flower status`.
    let status = |job: &str| -> Value { serde_json::from_slice(&home.run(&["status", job, "--json"]).stdout).unwrap() };
    let c = status(child);
    assert_eq!(c["continues"]["parent"], parent, "{c}");
    assert_eq!(c["continues"]["instruction"], "Also add a chart of the totals.");
    assert_eq!(status(parent)["continued_by"], serde_json::json!([child]));
    let text = String::from_utf8_lossy(&home.run(&["status", child]).stdout).into_owned();
    assert!(text.contains(&format!("continues {parent} with: Also add a chart of the totals.")), "{text}");
    // Its steps: no clarifier (the brief carried over is complete), the goal set again, coordinator, judges.
    let steps: Vec<&str> = c["steps"].as_array().unwrap().iter().map(|s| s["label"].as_str().unwrap()).collect();
    assert_eq!(steps.first(), Some(&"goal"), "{steps:?}");
    assert!(!steps.contains(&"clarify"), "{steps:?}");

    // The brief carried over and amended in its goal section; the qa-log too.
    let brief = workbench_file(&summary, "notes/brief.md");
    assert!(brief.starts_with(parent_brief.split("## Acceptance criteria").next().unwrap().trim_end()));
    let (added, next) =
        (brief.find("> Also add a chart of the totals.").unwrap(), brief.find("## Acceptance").unwrap());
    assert!(added < next, "{brief}");
    assert!(workbench_file(&summary, "notes/goal.md").contains("## Checks"), "the goal step wrote the goal again");
    let log = workbench_file(&summary, "notes/qa-log.md");
    assert!(log.contains("Question from the clarifier"), "the parent's questions are kept: {log}");
    assert!(log.contains(&format!("(continuing job {parent}) Also add a chart")), "{log}");

    // The new coordinator starts from where the parent ended.
    let t = home.transcripts(child);
    let main = sessions(&t, "coordinator");
    assert_eq!(main.len(), 1);
    let first_message = main[0]["entries"][0].to_string();
    assert!(first_message.contains(&format!("This job continues job {parent} (succeeded)")), "{first_message}");
    assert!(first_message.contains("its final answer\\nReport fixed: report written"), "{first_message}");
    assert!(first_message.contains("# The new instruction\\nAlso add a chart of the totals."));
    assert!(first_message.contains("# The brief"), "and the amended brief and the new goal");

    // The parent is untouched.
    let p = status(parent);
    assert_eq!(
        (p["state"].as_str(), p["final_answer"].as_str()),
        (Some("succeeded"), Some("Report fixed: report written"))
    );
}

#[test]
fn only_a_finished_job_can_be_continued_and_an_instruction_is_required() {
    let home = Home::new();
    let first = home.run_job(&repo().join("tests/fixtures/judge/job.yaml"), &[]);
    let parent = first["job_id"].as_str().unwrap();
    let out = home.run(&["continue", parent, "   "]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("instruction: empty"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = home.run(&["continue", "ffffffff", "x"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"), "{}", String::from_utf8_lossy(&out.stderr));

    // A job that has not ended (here: waiting for its user) is not continued.
    let run = home
        .cmd()
        .args(["run", repo().join("tests/fixtures/ask/job.yaml").to_str().unwrap(), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let waiting = crate::support::wait_state(&home, "waiting_for_user");
    let out = home.run(&["continue", &waiting, "also this"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("is waiting_for_user: only a finished job can be continued"), "{said}");
    assert!(home.run(&["answer", &waiting, "CSV"]).status.success());
    assert!(run.wait_with_output().unwrap().status.success());
    let listed: Value = serde_json::from_slice(&home.run(&["status", "--json"]).stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "nothing was created by the refused continue: {listed}");
}
