//! A database written by the last release (the schema as it shipped, under
//! `tests/fixtures/`, with rows in that release's encoding) migrates forward
//! to the latest version, its rows intact and usable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use flower_model::{
    ContentBlock, Entry, EntryKind, EventKind, JobId, JobState, Role, SessionId, Task, TaskOutcome, TaskState, Usage,
    now_ms,
};
use flower_store::{
    Batch, Claim, PostgresStore, SqliteStore, Store, StoreError, migrations, postgres::ScratchDatabase,
};

/// The rows the old release left behind: a running job with a coordinator
/// session (two entries), a running task, a live lease, and four events.
struct Release {
    job: JobId,
    session: SessionId,
    entries: Vec<Entry>,
    task: Task,
    usage: Usage,
    events: Vec<EventKind>,
}

impl Release {
    fn new() -> Self {
        let job = JobId::random();
        let session = SessionId::random();
        let mut first = Entry::new(job, session, None, EntryKind::User, vec![ContentBlock::text("the goal")]);
        first.seq = 1;
        let mut second =
            Entry::new(job, session, Some(first.uuid), EntryKind::Assistant, vec![ContentBlock::text("delegating")]);
        second.seq = 2;
        second.usage = Some(Usage { input_tokens: 11, output_tokens: 3, ..Default::default() });
        let mut task = Task::queued(job, session, "toolu_1", "w", "describe", "do it");
        task.state = TaskState::Running;
        task.attempt = 1;
        task.claimed_by = Some("worker-1".into());
        let events = vec![
            EventKind::JobState { state: JobState::Queued, reason: None },
            EventKind::JobState { state: JobState::Running, reason: None },
            EventKind::TaskQueued { task: task.id, worker: "w".into(), description: "describe".into() },
            EventKind::TaskStarted { task: task.id, attempt: 1, worker_id: "worker-1".into() },
        ];
        Self {
            job,
            session,
            entries: vec![first, second],
            task,
            usage: Usage { input_tokens: 11, output_tokens: 3, ..Default::default() },
            events,
        }
    }
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap()
}

fn kind_name(e: &Entry) -> String {
    json(&e.kind).trim_matches('"').to_string()
}

/// What a migrated database must still do with the old rows.
async fn check_usable(store: &dyn Store, old: &Release) {
    let job = store.get_job(old.job).await.unwrap();
    assert_eq!((job.state, job.name.as_str(), job.usage), (JobState::Running, "old", old.usage));
    assert_eq!(store.resolve_job(&old.job.to_string()[..8]).await.unwrap(), old.job);
    assert!(store.list_jobs(None, 10).await.unwrap().iter().any(|j| j.id == old.job));
    assert_eq!(store.entries(old.session, 0, 10).await.unwrap(), old.entries, "entries read back as written");
    assert_eq!(store.get_session(old.session).await.unwrap().role, Role::Coordinator);
    let events: Vec<EventKind> = store.events(old.job, 0, 10).await.unwrap().into_iter().map(|e| e.kind).collect();
    assert_eq!(events, old.events);
    assert_eq!(store.get_task(old.task.id).await.unwrap(), old.task);

    // The live lease still fences; its owner keeps the job at its epoch.
    let lease = store.acquire_lease(old.job, "coordinator-a", 60_000).await.unwrap().unwrap();
    assert_eq!(lease.epoch, 1);
    assert!(store.acquire_lease(old.job, "coordinator-b", 60_000).await.unwrap().is_none());

    // Writes go on from where the old release stopped.
    let next =
        Entry::new(old.job, old.session, Some(old.entries[1].uuid), EntryKind::User, vec![ContentBlock::text("go")]);
    let written = store
        .append(Batch {
            entries: vec![next],
            events: vec![],
            usage: Some((old.job, old.usage)),
            fence: Some(lease.fence()),
            tasks: vec![],
            requires: vec![],
            staged: None,
        })
        .await
        .unwrap();
    assert_eq!(written.entry_seqs, vec![3]);
    assert_eq!(store.get_job(old.job).await.unwrap().usage.input_tokens, 22);
    assert_eq!(store.claim_task(old.task.id, 1, "late").await.unwrap(), Claim::Superseded { current_attempt: 1 });
    let Claim::Claimed { events, .. } = store.claim_task(old.task.id, 2, "worker-2").await.unwrap() else {
        panic!("a redelivery claims the old task")
    };
    assert_eq!(events[0].seq, 5, "event numbers continue the old sequence");
    let (done, _) = store
        .finish_task(old.task.id, 2, TaskOutcome::Succeeded { report: "r".into() }, Usage::default())
        .await
        .unwrap();
    assert_eq!(done.state, TaskState::Succeeded);
    store.set_job_state(old.job, JobState::Succeeded, None, Some("42".into()), Some(lease.fence())).await.unwrap();
    assert!(matches!(
        store.set_job_state(old.job, JobState::Running, None, None, None).await,
        Err(StoreError::JobEnded { .. })
    ));
    assert_eq!(
        store.events(old.job, 0, 100).await.unwrap().iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=7).collect::<Vec<i64>>()
    );
}

fn sqlite_versions(path: &std::path::Path) -> Vec<i32> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn.prepare("SELECT version FROM flower_migrations ORDER BY version").unwrap();
    stmt.query_map([], |r| r.get(0)).unwrap().collect::<rusqlite::Result<_>>().unwrap()
}

#[tokio::test]
async fn a_sqlite_database_of_the_last_release_migrates_forward() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flower.db");
    let old = Release::new();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(include_str!("fixtures/sqlite_release_schema.sql")).unwrap();
        let (job, session, task) = (old.job.to_string(), old.session.to_string(), &old.task);
        conn.execute(
            "INSERT INTO jobs VALUES (?1, 'old', 'running', NULL, '{\"name\":\"old\"}', NULL, 'key-1', ?2, 1, 2)",
            rusqlite::params![job, json(&old.usage)],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO sessions VALUES (?1, ?2, 'coordinator', 'main', NULL, 1)",
            rusqlite::params![session, job],
        )
        .unwrap();
        for e in &old.entries {
            conn.execute(
                "INSERT INTO entries VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                rusqlite::params![session, e.seq, e.uuid.to_string(), job, kind_name(e), json(e), e.created_at],
            )
            .unwrap();
        }
        conn.execute(
            "INSERT INTO tasks VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', 1, ?8, NULL, NULL, ?9, ?10, ?11)",
            rusqlite::params![
                task.id.to_string(),
                job,
                session,
                task.tool_use_id,
                task.worker,
                task.mandate,
                task.description,
                task.claimed_by,
                json(&task.usage),
                task.created_at,
                task.updated_at
            ],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO leases VALUES (?1, 'coordinator-a', 1, ?2)",
            rusqlite::params![job, now_ms() + 60_000],
        )
        .unwrap();
        for (i, kind) in old.events.iter().enumerate() {
            conn.execute(
                "INSERT INTO events VALUES (?1, ?2, ?3, ?4, ?5)",
                rusqlite::params![job, i as i64 + 1, now_ms(), kind.name(), json(kind)],
            )
            .unwrap();
        }
    }

    let store = SqliteStore::open(&path).unwrap();
    let latest: Vec<i32> = (1..=migrations::latest(migrations::SQLITE)).collect();
    assert_eq!(sqlite_versions(&path), latest, "every version recorded, the shipped one included");
    check_usable(&store, &old).await;
    drop(store);

    // Opening again applies nothing, and the append-only rule still holds.
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(sqlite_versions(&path), latest);
    assert_eq!(store.get_job(old.job).await.unwrap().final_answer.as_deref(), Some("42"));
    let conn = rusqlite::Connection::open(&path).unwrap();
    let err = conn.execute("UPDATE entries SET body = 'x'", []).unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
    let indexes: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name IN ('jobs_by_created', 'jobs_live')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(indexes, 2, "version 2's indexes exist");
}

#[tokio::test]
async fn a_sqlite_database_of_a_newer_release_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flower.db");
    drop(SqliteStore::open(&path).unwrap());
    rusqlite::Connection::open(&path).unwrap().execute("INSERT INTO flower_migrations VALUES (999, 0)", []).unwrap();
    assert!(matches!(SqliteStore::open(&path), Err(StoreError::Corrupt(_))));
}

/// The admin URL tests create scratch databases through.
fn pg_admin_url() -> String {
    std::env::var("FLOWER_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

#[tokio::test]
#[allow(clippy::too_many_lines)]
async fn a_postgres_database_of_the_last_release_migrates_forward() {
    let db = ScratchDatabase::create(&pg_admin_url()).await.unwrap();
    let old = Release::new();
    let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
    let driver = tokio::spawn(conn);
    // What the last release's start left: its version table, version 1 applied.
    client
        .batch_execute(&format!(
            "CREATE TABLE flower_migrations (version integer PRIMARY KEY, applied_at bigint NOT NULL);
             INSERT INTO flower_migrations VALUES (1, 0);
             {}",
            include_str!("fixtures/postgres_release_schema.sql")
        ))
        .await
        .unwrap();
    let (job, session, task) = (old.job.0, old.session.0, &old.task);
    let value = |s: String| serde_json::from_str::<serde_json::Value>(&s).unwrap();
    client
        .execute(
            "INSERT INTO jobs (id, name, state, spec, idempotency_key, usage, next_event_seq, created_at, updated_at)
             VALUES ($1, 'old', 'running', '{\"name\":\"old\"}', 'key-1', $2, 4, 1, 2)",
            &[&job, &value(json(&old.usage))],
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO sessions (id, job_id, role, label, next_entry_seq, created_at)
             VALUES ($1, $2, 'coordinator', 'main', 2, 1)",
            &[&session, &job],
        )
        .await
        .unwrap();
    for e in &old.entries {
        client
            .execute(
                "INSERT INTO entries VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[&session, &e.seq, &e.uuid, &job, &kind_name(e), &json(e), &e.created_at],
            )
            .await
            .unwrap();
    }
    client
        .execute(
            "INSERT INTO tasks VALUES ($1, $2, $3, $4, $5, $6, $7, 'running', 1, $8, NULL, NULL, $9, $10, $11)",
            &[
                &task.id.0,
                &job,
                &session,
                &task.tool_use_id,
                &task.worker,
                &task.mandate,
                &task.description,
                &task.claimed_by,
                &value(json(&task.usage)),
                &task.created_at,
                &task.updated_at,
            ],
        )
        .await
        .unwrap();
    client
        .execute("INSERT INTO leases VALUES ($1, 'coordinator-a', 1, $2)", &[&job, &(now_ms() + 60_000)])
        .await
        .unwrap();
    for (i, kind) in old.events.iter().enumerate() {
        client
            .execute(
                "INSERT INTO events VALUES ($1, $2, $3, $4, $5)",
                &[&job, &(i as i64 + 1), &now_ms(), &kind.name(), &value(json(kind))],
            )
            .await
            .unwrap();
    }

    let store = PostgresStore::connect(&db.url, 2).await.unwrap();
    let versions: Vec<i32> = client
        .query("SELECT version FROM flower_migrations ORDER BY version", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, (1..=migrations::latest(migrations::POSTGRES)).collect::<Vec<_>>());
    check_usable(&store, &old).await;
    let err = client.batch_execute("UPDATE entries SET body = 'x'").await.unwrap_err();
    assert!(format!("{err:?}").contains("append-only"), "{err:?}");
    drop(client);
    let _ = driver.await;
    drop(store);
    db.drop_now().await.unwrap();
}

#[tokio::test]
async fn a_postgres_database_of_a_newer_release_is_refused() {
    let db = ScratchDatabase::create(&pg_admin_url()).await.unwrap();
    drop(PostgresStore::connect(&db.url, 1).await.unwrap());
    let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
    let driver = tokio::spawn(conn);
    client.batch_execute("INSERT INTO flower_migrations VALUES (999, 0)").await.unwrap();
    drop(client);
    let _ = driver.await;
    assert!(matches!(PostgresStore::connect(&db.url, 1).await, Err(StoreError::Corrupt(_))));
    db.drop_now().await.unwrap();
}
