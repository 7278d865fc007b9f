//! The judge loop (`workflow.judge`): a verdict of "not yet" goes back to the
//! coordinator's own session as its next instruction; the next round's judge
//! accepts; every verdict is stored and shown. Clarifier-free: the judge
//! checks against the goal as stated.

use serde_json::Value;

use crate::support::{Home, repo, sessions, workbench_file};

#[test]
fn a_rejected_result_goes_back_to_the_coordinator_and_the_second_round_passes() {
    let home = Home::new();
    let summary = home.run_job(&repo().join("tests/fixtures/judge/job.yaml"), &[]);
    assert_eq!(summary["state"], "succeeded", "{summary}");
    assert_eq!(summary["final_answer"], "Report fixed: report written");
    let job = summary["job_id"].as_str().unwrap();

    let out = home.run(&["status", job, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdicts = status["verdicts"].as_array().unwrap();
    assert_eq!(verdicts.len(), 2, "{status}");
    assert_eq!((verdicts[0]["round"].as_u64(), verdicts[0]["verdict"].as_str()), (Some(1), Some("not_yet")));
    assert_eq!(verdicts[0]["failed"][0], "artifacts/report.md has no totals row");
    assert_eq!((verdicts[1]["round"].as_u64(), verdicts[1]["verdict"].as_str()), (Some(2), Some("achieved")));
    let text = String::from_utf8_lossy(&home.run(&["status", job]).stdout).into_owned();
    assert!(text.contains("judge round 1: not_yet (1 checks failed)") && text.contains("judge round 2: achieved"));

    // Coordinator and judges are separate sessions; the verdict went back
    // into the one coordinator session, between its two answers.
    let t = home.transcripts(job);
    let main = sessions(&t, "coordinator");
    assert_eq!(main.len(), 1, "one coordinator session across the rounds");
    assert_eq!(sessions(&t, "judge").len(), 2, "one judge session per round");
    let main = main[0].to_string();
    let (first, told, second) = (
        main.find("Report delivered").unwrap(),
        main.find("Checks that failed:\\n- artifacts/report.md has no totals row").unwrap(),
        main.find("Report fixed").unwrap(),
    );
    assert!(first < told && told < second, "answer, verdict, new answer in order");
    assert_eq!(sessions(&t, "worker").len(), 2, "the fix was delegated");
}

#[test]
fn a_goal_still_not_met_when_the_rounds_run_out_fails_the_job() {
    let home = Home::new();
    let out = home
        .cmd()
        .args(["run", repo().join("tests/fixtures/judge/one-round.yaml").to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a failed job: {}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["state"], "failed");
    let reason = summary["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("the goal is not achieved after 1 judge round(s): The report is there but incomplete."),
        "{reason}"
    );
    assert!(reason.contains("no totals row"), "{reason}");
}

/// Acceptance (workflow): clarify → goal → coordinator → judge, rejected once
/// and accepted the second round; the clarifier's question unanswered (the
/// user is away), its assumption in the brief; each step its own session.
#[test]
fn clarify_then_goal_then_a_judged_run() {
    let home = Home::new();
    let summary = home.run_job(&repo().join("tests/fixtures/workflow/job.yaml"), &[]);
    assert_eq!(summary["final_answer"], "Report fixed: report written", "{summary}");
    let brief = workbench_file(&summary, "notes/brief.md");
    for section in ["## Goal", "## Acceptance criteria", "## Boundaries", "## Unknowns and assumptions"] {
        assert!(brief.contains(section), "{section} in {brief}");
    }
    assert!(brief.contains("no answer within 1s") && brief.contains("Assumed: last month"), "{brief}");
    let goal = workbench_file(&summary, "notes/goal.md");
    assert!(goal.contains("## Checks\n- open .flower/artifacts/report.md, see a totals row"), "{goal}");
    let log = workbench_file(&summary, "notes/qa-log.md");
    assert!(log.contains("Question from the clarifier") && log.contains("no answer (timeout)"), "{log}");

    let job = summary["job_id"].as_str().unwrap();
    let t = home.transcripts(job);
    let clarifiers = sessions(&t, "clarifier");
    assert_eq!(clarifiers.len(), 2, "the clarify and goal steps, each a session");
    assert_eq!(sessions(&t, "judge").len(), 2);
    let main = sessions(&t, "coordinator");
    assert_eq!(main.len(), 1);
    let main = main[0].to_string();
    assert!(
        main.contains("# The brief") && main.contains("see last month's dates only"),
        "the coordinator starts from both"
    );
    assert!(!main.contains("Should the report cover"), "the clarifier's question is not the coordinator's");
    let status: Value = serde_json::from_slice(&home.run(&["status", job, "--json"]).stdout).unwrap();
    let verdicts: Vec<&str> =
        status["verdicts"].as_array().unwrap().iter().map(|v| v["verdict"].as_str().unwrap()).collect();
    assert_eq!(verdicts, vec!["not_yet", "achieved"]);
    assert_eq!(status["questions"][0]["answered_by"], "timeout");
}

#[test]
fn a_brief_missing_a_section_is_asked_for_again_then_the_job_fails_naming_it() {
    let home = Home::new();
    let out = home
        .cmd()
        .args(["run", repo().join("tests/fixtures/workflow/sloppy.yaml").to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        summary["reason"], "the clarify step's brief: sections missing: Boundaries, Unknowns and assumptions",
        "the second answer was checked, and the reason names what it lacks"
    );
    let t = home.transcripts(summary["job_id"].as_str().unwrap());
    let clarify = sessions(&t, "clarifier")[0].to_string();
    assert!(clarify.contains("Your answer is incomplete (sections missing: Boundaries)"), "asked again once");
    assert!(sessions(&t, "coordinator").is_empty(), "the coordinator never started");
}
