//! The human channel in the embedded mode: a job asks its user and waits in
//! `waiting_for_user`; `flower answer` from another process answers it; an
//! absent user's silence becomes "no answer" after `runtime.ask.timeout`.
//! (Over gRPC with a killed coordinator: `distributed.rs`.)

use std::process::Stdio;

use serde_json::Value;

use crate::support::{Home, repo, sessions, wait_state, workbench_file};

#[test]
fn a_question_waits_for_the_users_answer_from_another_process() {
    let home = Home::new();
    let run = home
        .cmd()
        .args(["run", repo().join("tests/fixtures/ask/job.yaml").to_str().unwrap(), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let job = wait_state(&home, "waiting_for_user");

    let refused = home.run(&["answer", &job, "--option", "5"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("2 options"));
    let sent = home.run(&["answer", &job, "CSV, with a header row"]);
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    let again = home.run(&["answer", &job, "Markdown"]);
    assert!(!again.status.success(), "a second answer to the same question is refused");

    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        summary["final_answer"], "asked: The user answered: CSV, with a header row / wrote: report written",
        "{summary}"
    );
    let log = workbench_file(&summary, "notes/qa-log.md");
    assert!(log.contains("Which format should the report use?\n1. Markdown\n2. CSV"), "{log}");
    assert!(log.contains("> CSV, with a header row"), "{log}");

    // Only the asking session saw the answer; the log entered no context.
    let t = home.transcripts(&job);
    let main = sessions(&t, "coordinator")[0].to_string();
    assert!(main.contains("The user answered: CSV, with a header row"));
    assert!(!t.to_string().contains("Questions, answers and messages"), "the qa-log is in no transcript");
    let worker = sessions(&t, "worker")[0].to_string();
    assert!(!worker.contains("Which format should the report use?"), "the question is not the worker's business");
}

#[test]
fn an_absent_users_silence_is_no_answer_and_the_job_goes_on() {
    let home = Home::new();
    let summary = home.run_job(&repo().join("tests/fixtures/ask/absent.yaml"), &[]);
    let answer = summary["final_answer"].as_str().unwrap();
    assert!(answer.starts_with("asked: [no answer within 1s (the user may be away)] Go on without it"), "{answer}");
    assert!(answer.contains("record the assumption"), "{answer}");
    let log = workbench_file(&summary, "notes/qa-log.md");
    assert!(log.contains("no answer (timeout)"), "{log}");
    let job = summary["job_id"].as_str().unwrap();
    let status: Value = serde_json::from_slice(&home.run(&["status", job, "--json"]).stdout).unwrap();
    assert_eq!(status["questions"][0]["answered_by"], "timeout", "{status}");

    // A side question: answered by a session of its own, the job untouched.
    let before = home.transcripts(job);
    let out = home.run(&["aside", job, "what is it doing?", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let aside: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(aside["answer"], "It asked which format to use, then had the report written.");
    let after = home.transcripts(job);
    let asides = sessions(&after, "aside");
    assert_eq!(asides.len(), 1);
    assert!(asides[0].to_string().contains("what is it doing?") && asides[0].to_string().contains("question_asked"));
    assert_eq!(sessions(&after, "coordinator"), sessions(&before, "coordinator"), "the main thread is untouched");
    let empty = home.run(&["aside", job, "  "]);
    assert!(!empty.status.success() && String::from_utf8_lossy(&empty.stderr).contains("empty"));
}
