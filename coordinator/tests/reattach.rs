//! A run that re-attaches to a task (a new owner after a hand-over) and
//! starts listening while the task's end is being committed — its notice
//! went out, staged, before the run listened — reads that end once it
//! commits, not at its next recheck. Real Postgres (a scratch database).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use std::sync::Arc;
use std::time::Duration;

use flower_agent::Journal;
use flower_coordinator::dispatch::{Dispatcher, Sweep};
use flower_model::{Role, Session, SessionId, Task, TaskOutcome, TaskState, Usage, now_ms};
use flower_store::postgres::ScratchDatabase;
use flower_store::workspace::Workspace;
use flower_store::{Batch, NewJob, PostgresStore, Staged, Store};

fn pg_admin_url() -> String {
    std::env::var("FLOWER_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Whether a backend of `db` waits on a lock (a row lock here).
async fn someone_waits_on_a_lock(client: &tokio_postgres::Client, db: &str) -> bool {
    let row = client
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'", &[&db])
        .await
        .unwrap();
    row.get::<_, i64>(0) > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reattached_wait_reads_an_end_committing_as_it_starts() {
    let db = ScratchDatabase::create(&pg_admin_url()).await.unwrap();
    let store: Arc<dyn Store> = Arc::new(PostgresStore::connect(&db.url, 4).await.unwrap());
    let bus = Arc::new(flower_bus::MemoryBus::new());
    let (job, _) = store
        .create_job(NewJob::new(flower_model::JobId::random(), "reattach", serde_json::json!({"name": "reattach"})))
        .await
        .unwrap();
    let coordinator = SessionId::random();
    let session = Session {
        id: coordinator,
        job_id: job.id,
        role: Role::Coordinator,
        label: "c".into(),
        task_id: None,
        created_at: now_ms(),
    };
    store.create_session(session).await.unwrap();
    let queued = Task::queued(job.id, coordinator, "toolu_reattach", "w", "d", "do it");
    store.create_task(queued.clone(), None).await.unwrap();
    store.claim_task(queued.id, 1, "w1").await.unwrap();

    // The worker's end: staged (its notice would go out now) and held open
    // until the new owner waits on it.
    let (fired_tx, fired) = tokio::sync::oneshot::channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let fired_tx = std::sync::Mutex::new(Some(fired_tx));
    let released = std::sync::Mutex::new(released);
    let staged = Staged::new(move || {
        if let Some(tx) = fired_tx.lock().unwrap().take() {
            let _ = tx.send(());
            // Blocks this runtime thread only (a multi-thread runtime): the
            // transaction stays open, holding the row, until released.
            let _ = released.lock().unwrap().recv();
        }
    });
    let end = {
        let store = store.clone();
        let id = queued.id;
        tokio::spawn(async move {
            let outcome = TaskOutcome::Succeeded { report: "done".into() };
            let batch = Batch { staged: Some(staged), ..Default::default() };
            store.finish_task_with(id, 1, outcome, Usage::default(), batch).await
        })
    };
    fired.await.expect("the end was staged");

    // A new owner re-attaches: a fresh dispatcher, which heard nothing.
    let journal = Journal::new(store.clone(), bus.clone());
    let objects: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let dispatcher = Dispatcher::new(journal, bus.clone(), Workspace::new(objects, job.id), 1, Sweep::default());
    let cancel = tokio_util::sync::CancellationToken::new();
    let waited = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let ended = dispatcher.wait(&queued, &cancel).await;
        (ended, started.elapsed())
    });

    // Once its read waits on the row, the end commits.
    let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !someone_waits_on_a_lock(&client, &db.name).await {
        assert!(tokio::time::Instant::now() < deadline, "the re-attached wait never waited on the row");
        tokio::task::yield_now().await;
    }
    release.send(()).unwrap();
    end.await.unwrap().expect("the end commits");
    let (ended, took) = waited.await.unwrap();
    let ended = ended.expect("the wait ends with the task");
    assert_eq!(ended.task.state, TaskState::Succeeded);
    assert_eq!(ended.task.report.as_deref(), Some("done"));
    assert!(ended.requires.is_none(), "read from the store, not from a notice");
    // The recheck is 5 s: the end was read as it committed, not then.
    assert!(took < Duration::from_secs(4), "the wait took {took:?}: it missed the end");
    drop((client, store));
    drop(db);
}
