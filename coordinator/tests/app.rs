//! The application layer over a real store (SQLite in a temporary directory)
//! and real local objects: every front-end's checks, limits and error kinds
//! in one place, without a front-end.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::{Arc, Mutex};

use flower_bus::Notifier;
use flower_coordinator::app::{self, AnswerRequest, App, AppBackends, AppError, Ids, Runs, SubmitRequest};
use flower_model::{ErrorKind, JobId, JobSpec, JobState};
use flower_store::{SqliteStore, Store};

/// Runs that start nothing and remember what they were told.
#[derive(Default)]
struct Recorded {
    submitted: Mutex<Vec<JobId>>,
    cancelled: Mutex<Vec<JobId>>,
}

#[async_trait::async_trait]
impl Runs for Recorded {
    fn admit(&self, spec: &JobSpec) -> app::Result<()> {
        if spec.name == "refused-here" {
            return Err(AppError::invalid("spec", "provider: `x` is not configured on this service"));
        }
        Ok(())
    }
    fn submitted(&self, job: JobId) {
        self.submitted.lock().unwrap().push(job);
    }
    fn notifier(&self, _job: JobId) -> Option<Arc<dyn Notifier>> {
        None
    }
    async fn cancelled(&self, job: JobId) {
        self.cancelled.lock().unwrap().push(job);
    }
}

const SPEC: &str = "name: app-test\ngoal: count the files\nmodel: claude-sonnet-4-5\n\
coordinator:\n  name: lead\n  instructions: delegate\n\
workers:\n  counter:\n    description: Counts files.\n    instructions: Count.\n    tools: [Bash]\n";

fn app(dir: &tempfile::TempDir, ids: Ids) -> (App, Arc<Recorded>, Arc<dyn Store>) {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("flower.db")).unwrap());
    let objects = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let runs = Arc::new(Recorded::default());
    let backends = AppBackends {
        store: store.clone(),
        objects,
        providers: Arc::new(Default::default()),
        tool_policy: Arc::new(Default::default()),
        windows: Default::default(),
    };
    let app = App::new(backends, runs.clone()).with_ids(ids).with_max_request_bytes(64 << 10);
    (app, runs, store)
}

fn submit(spec: &str, key: &str) -> SubmitRequest {
    SubmitRequest { spec: spec.into(), idempotency_key: key.into(), ..Default::default() }
}

#[tokio::test]
async fn a_submit_is_checked_stored_and_started_once() {
    let dir = tempfile::tempdir().unwrap();
    let (app, runs, _) = app(&dir, Ids::Whole);
    let first = app.submit(submit(SPEC, "k1")).await.unwrap();
    assert!(first.created);
    assert_eq!(runs.submitted.lock().unwrap().as_slice(), &[first.job.id]);
    // A retry with the same key and spec is the same job, not started again.
    let again = app.submit(submit(SPEC, "k1")).await.unwrap();
    assert_eq!((again.job.id, again.created), (first.job.id, false));
    assert_eq!(runs.submitted.lock().unwrap().len(), 1);
    // The same key with another spec is a conflict naming the key.
    let other = app.submit(submit(&SPEC.replace("count", "list"), "k1")).await.unwrap_err();
    assert_eq!(other.kind, ErrorKind::AlreadyExists);
    assert!(other.message.starts_with("idempotency_key `k1`"), "{}", other.message);
}

#[tokio::test]
async fn bad_input_names_its_field_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (app, runs, store) = app(&dir, Ids::Whole);
    let cases: Vec<(SubmitRequest, ErrorKind, &str)> = vec![
        (submit("", ""), ErrorKind::Invalid, "spec: required"),
        (submit("name: x\n", ""), ErrorKind::Invalid, "spec: goal"),
        (submit(&SPEC.replace("app-test", "refused-here"), ""), ErrorKind::Invalid, "spec: provider"),
        (submit(SPEC, "a\0b"), ErrorKind::Invalid, "idempotency_key: control characters"),
        (submit(&format!("{SPEC}# {}\n", "x".repeat(70_000)), ""), ErrorKind::TooLarge, "the request is"),
        (
            SubmitRequest { workspace: vec![("../escape".into(), "x".into())], ..submit(SPEC, "") },
            ErrorKind::Invalid,
            "workspace[0].path:",
        ),
        (SubmitRequest { priority: 6, ..submit(SPEC, "") }, ErrorKind::Invalid, "priority: 6"),
        (submit(&format!("{SPEC}priority: 0\n"), ""), ErrorKind::Invalid, "spec: priority: 0"),
    ];
    for (request, kind, start) in cases {
        let e = app.submit(request).await.unwrap_err();
        assert_eq!(e.kind, kind, "{e}");
        assert!(e.message.starts_with(start), "{:?} should start with {start:?}", e.message);
    }
    assert!(runs.submitted.lock().unwrap().is_empty());
    assert!(store.list_jobs(None, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn actions_follow_the_jobs_state_with_one_error_each() {
    let dir = tempfile::tempdir().unwrap();
    let (app, runs, _) = app(&dir, Ids::Whole);
    let job = app.submit(submit(SPEC, "")).await.unwrap().job.id.to_string();
    let long = "r".repeat(5000);
    assert_eq!(app.cancel(&job, &long).await.unwrap_err().kind, ErrorKind::Invalid);
    assert_eq!(app.interrupt(&job, "  ").await.unwrap_err().message, "message: required");
    // Nothing waits for an answer yet.
    let answer = AnswerRequest { text: "yes".into(), ..Default::default() };
    assert_eq!(app.answer(&job, answer.clone()).await.unwrap_err().kind, ErrorKind::Precondition);
    let both = AnswerRequest { text: "yes".into(), option: 2, ..Default::default() };
    assert_eq!(app.answer(&job, both).await.unwrap_err().message, "option: give `text` or `option`, not both");
    let ended = app.cancel(&job, "").await.unwrap();
    assert_eq!(ended.state, JobState::Cancelled);
    assert_eq!(runs.cancelled.lock().unwrap().len(), 1);
    // An ended job takes no more actions.
    for e in [app.cancel(&job, "again").await.unwrap_err(), app.interrupt(&job, "hello").await.unwrap_err()] {
        assert_eq!(e.kind, ErrorKind::Precondition, "{e}");
        assert!(e.message.contains("already cancelled"), "{e}");
    }
}

#[tokio::test]
async fn ids_are_whole_or_unique_prefixes_as_the_front_end_says() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, _, _) = app(&dir, Ids::Whole);
    let job = whole.submit(submit(SPEC, "")).await.unwrap().job.id.to_string();
    let prefix = &job[..8];
    assert_eq!(whole.job("job_id", prefix).await.unwrap_err().kind, ErrorKind::Invalid);
    let (by_prefix, _, _) = app(&dir, Ids::Prefix);
    assert_eq!(by_prefix.job("job_id", prefix).await.unwrap().id.to_string(), job);
    let missing = by_prefix.job("job_id", "0123abcd-0000-0000-0000-000000000000").await.unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound);
    assert!(missing.message.contains("no job"), "{missing}");
    let long = by_prefix.job("job_id", &"a".repeat(10_000)).await.unwrap_err();
    assert!(long.message.len() < 100, "not echoed: {}", long.message);
}
