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

    // The context report counts the judges apart from the subagents.
    let out = home.run(&["context", job, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["workflow"]["sessions"], 2, "two judge rounds");
    assert_eq!(report["workflow"]["turns"], 4);
    assert_eq!(report["subagents"]["sessions"], 2, "only the workers");
    // Every turn timed its model call.
    let (latency, ttft) = (report["latency_ms_p50"].as_u64(), report["ttft_ms_p50"].as_u64());
    assert!(latency.is_some() && ttft.is_some() && ttft <= latency, "{latency:?} {ttft:?}");
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

/// `flower run` of the unreachable fixture in the background; the job id
/// once its judge's question waits.
fn run_until_the_judge_asks(home: &Home) -> (std::process::Child, String) {
    let run = home
        .cmd()
        .args(["run", repo().join("tests/fixtures/judge/unreachable.yaml").to_str().unwrap(), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let job = crate::support::wait_state(home, "waiting_for_user");
    (run, job)
}

fn summary_of(run: std::process::Child) -> Value {
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn unreachable_asks_the_user_who_accepts_the_result() {
    let home = Home::new();
    let (run, job) = run_until_the_judge_asks(&home);
    let sent = home.run(&["answer", &job, "--option", "1"]);
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    let summary = summary_of(run);
    assert_eq!(summary["state"], "succeeded", "{summary}");
    assert_eq!(summary["final_answer"], "Report delivered: report written", "the answer judged is the one kept");

    let status: Value = serde_json::from_slice(&home.run(&["status", &job, "--json"]).stdout).unwrap();
    assert_eq!(status["verdicts"][0]["verdict"], "unreachable", "{status}");
    let q = &status["questions"][0];
    assert_eq!((q["id"].as_str(), q["role"].as_str()), (Some("judge-1-unreachable"), Some("judge")));
    assert!(q["question"].as_str().unwrap().contains("No data source has totals."), "{q}");
    assert_eq!((q["answer"].as_str(), q["answered_by"].as_str()), (Some(UNREACHABLE_ACCEPT), Some("user")));
    let log = workbench_file(&summary, "notes/qa-log.md");
    assert!(log.contains("Question from the judge") && log.contains("option 1: accept the result"), "{log}");
    // The question went to the user, not into a context.
    let t = home.transcripts(&job);
    assert!(!sessions(&t, "coordinator")[0].to_string().contains("No data source has totals"));
}

const UNREACHABLE_ACCEPT: &str = "accept the result as it is (the job succeeds with it)";

#[test]
fn unreachable_answered_in_words_goes_back_to_the_coordinator_and_the_next_judge() {
    let home = Home::new();
    let (run, job) = run_until_the_judge_asks(&home);
    let sent = home.run(&["answer", &job, "Totals are optional: the data has none."]);
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    let summary = summary_of(run);
    assert_eq!(summary["state"], "succeeded", "{summary}");
    assert_eq!(summary["final_answer"], "Report amended: report written");

    let status: Value = serde_json::from_slice(&home.run(&["status", &job, "--json"]).stdout).unwrap();
    let verdicts: Vec<&str> =
        status["verdicts"].as_array().unwrap().iter().map(|v| v["verdict"].as_str().unwrap()).collect();
    assert_eq!(verdicts, vec!["unreachable", "achieved"], "the user's word earned a round past rounds: 1");
    let t = home.transcripts(&job);
    let main = sessions(&t, "coordinator");
    assert_eq!(main.len(), 1, "the same coordinator session");
    assert!(main[0].to_string().contains("The user answered: Totals are optional: the data has none."));
    let judges = sessions(&t, "judge");
    assert_eq!(judges.len(), 2);
    let second = judges[1].to_string();
    assert!(
        second.contains("The user's word on earlier verdicts") && second.contains("Totals are optional"),
        "the next judge weighs the user's word"
    );
}

#[test]
fn unreachable_with_the_user_agreeing_fails_the_job() {
    let home = Home::new();
    let (run, job) = run_until_the_judge_asks(&home);
    assert!(home.run(&["answer", &job, "--option", "2"]).status.success());
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["state"], "failed");
    assert_eq!(
        summary["reason"],
        "the judge found the goal unreachable (round 1): No data source has totals. (the user agreed: the job ends)"
    );
}

#[test]
fn a_judge_that_can_run_checks_with_commands_run_by_workers() {
    let home = Home::new();
    let summary = home.run_job(&repo().join("tests/fixtures/judge/can-run.yaml"), &[]);
    assert_eq!(summary["state"], "succeeded", "{summary}");
    let job = summary["job_id"].as_str().unwrap();
    let t = home.transcripts(job);
    let judge = sessions(&t, "judge")[0];
    let uses = crate::support::tool_uses(judge);
    assert!(uses.iter().any(|(name, input)| name == "Bash" && input["command"] == "grep -c , sales.csv"), "{uses:?}");
    // The command ran in the job's workspace as a task: its result is the file's row count.
    let results: Vec<String> = judge["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .filter(|e| e["tool_name"] == "Bash")
        .flat_map(|e| e["content"].as_array().unwrap().iter())
        .flat_map(|b| b["content"].as_array().unwrap().iter())
        .filter_map(|b| b["text"].as_str().map(str::to_string))
        .collect();
    assert!(results.iter().any(|r| r.lines().any(|l| l.trim() == "4")), "four lines with a comma: {results:?}");
    assert_eq!(summary["tasks"], 2, "the scribe's task and the judge's command");
}
