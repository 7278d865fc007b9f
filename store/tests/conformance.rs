//! Every backend against the one conformance suite: one test per check per
//! backend (`store_conformance_tests!`), so one failure hides no other.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use std::sync::Arc;

use flower_store::{PostgresStore, SqliteStore, postgres::ScratchDatabase};
use object_store::ObjectStore;

/// The admin URL tests create scratch databases through.
fn pg_admin_url() -> String {
    std::env::var("FLOWER_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A scratch database, the store on it (`connections` pooled), and a
/// connection of the test's own beside the store's.
async fn pg_with_raw(connections: usize) -> (ScratchDatabase, PostgresStore, tokio_postgres::Client) {
    let db = ScratchDatabase::create(&pg_admin_url()).await.unwrap();
    let store = PostgresStore::connect(&db.url, connections).await.unwrap();
    let (raw, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    (db, store, raw)
}

mod sqlite_in_memory {
    async fn store() -> (flower_store::SqliteStore, ()) {
        (super::SqliteStore::in_memory().unwrap(), ())
    }
    flower_store::store_conformance_tests!(store);
}

mod sqlite_file {
    async fn store() -> (flower_store::SqliteStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        (super::SqliteStore::open(&dir.path().join("flower.db")).unwrap(), dir)
    }
    flower_store::store_conformance_tests!(store);
}

mod postgres {
    async fn store() -> (super::PostgresStore, super::ScratchDatabase) {
        let db = super::ScratchDatabase::create(&super::pg_admin_url()).await.unwrap();
        (super::PostgresStore::connect(&db.url, 4).await.unwrap(), db)
    }
    flower_store::store_conformance_tests!(store);
}

mod local_filesystem {
    async fn objects() -> (std::sync::Arc<dyn super::ObjectStore>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let fs = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        (super::Arc::new(fs), dir)
    }
    flower_store::workbench_conformance_tests!(objects);
}

mod in_memory_objects {
    async fn objects() -> (std::sync::Arc<dyn super::ObjectStore>, ()) {
        (super::Arc::new(object_store::memory::InMemory::new()), ())
    }
    flower_store::workbench_conformance_tests!(objects);
}

mod s3 {
    async fn objects() -> (std::sync::Arc<dyn super::ObjectStore>, flower_store::s3test::S3TestServer) {
        let server = flower_store::s3test::S3TestServer::start("flower-test").await.unwrap();
        let prefix = format!("run-{}", uuid::Uuid::new_v4().simple());
        (flower_store::objects::open(&server.url(&prefix), &server.options()).unwrap(), server)
    }
    flower_store::workbench_conformance_tests!(objects);
}

#[tokio::test]
async fn postgres_migrations_are_idempotent() {
    // A second replica starting on the same database is fine.
    let db = ScratchDatabase::create(&pg_admin_url()).await.unwrap();
    let store = PostgresStore::connect(&db.url, 1).await.unwrap();
    PostgresStore::connect(&db.url, 1).await.unwrap();
    drop(store);
    db.drop_now().await.unwrap();
}

#[tokio::test]
async fn stored_entries_cannot_be_rewritten() {
    // The append-only rule is enforced by the database itself, not by convention.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flower.db");
    let _store = SqliteStore::open(&path).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "INSERT INTO jobs (id, name, state, reason, spec, final_answer, idempotency_key, usage, created_at, updated_at)
           VALUES ('j','n','queued',NULL,'{}',NULL,NULL,'{}',0,0);
         INSERT INTO sessions VALUES ('s','j','worker','w',NULL,0);
         INSERT INTO entries VALUES ('s',1,'u','j','user','{}',0);",
    )
    .unwrap();
    let err = conn.execute("UPDATE entries SET body = 'x'", []).unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
}

#[tokio::test]
async fn postgres_entries_cannot_be_rewritten() {
    let (_db, _store, client) = pg_with_raw(1).await;
    client
        .batch_execute(
            "INSERT INTO jobs (id, name, state, spec, usage, created_at, updated_at)
               VALUES ('00000000-0000-0000-0000-000000000001', 'n', 'queued', '{}', '{}', 0, 0);
             INSERT INTO sessions (id, job_id, role, label, created_at)
               VALUES ('00000000-0000-0000-0000-000000000002', '00000000-0000-0000-0000-000000000001', 'worker', 'w', 0);
             INSERT INTO entry_chunks VALUES ('00000000-0000-0000-0000-000000000002', 1, 1,
               '00000000-0000-0000-0000-000000000001', '[{\"kind\":\"user\"}]');",
        )
        .await
        .unwrap();
    let err = client.batch_execute("UPDATE entry_chunks SET bodies = '[]'").await.unwrap_err();
    assert!(format!("{err:?}").contains("append-only"), "{err:?}");
    // The old table's name is a view over the chunks, append-only too.
    let kind: String = client.query_one("SELECT kind FROM entries", &[]).await.unwrap().get(0);
    assert_eq!(kind, "user");
    let err = client.batch_execute("UPDATE entries SET body = 'x'").await.unwrap_err();
    assert!(format!("{err:?}").contains("append-only"), "{err:?}");
}

#[tokio::test]
async fn postgres_work_dropped_midway_leaves_no_transaction_open() {
    use flower_store::{Claim, NewJob, Store};
    // One connection: what the dropped claim leaves is what the next write gets.
    let db = ScratchDatabase::create(&pg_admin_url()).await.unwrap();
    let store = PostgresStore::connect(&db.url, 1).await.unwrap();
    let job = flower_model::JobId::random();
    let new = NewJob::new(job, "j", serde_json::json!({}));
    store.create_job(new).await.unwrap();
    let task = flower_model::Task::queued(job, flower_model::SessionId::random(), "toolu_1", "w", "d", "m");
    store.create_task(task.clone(), None).await.unwrap();

    // Another connection holds the task row: the claim's transaction waits on it.
    let (other, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    other.batch_execute("BEGIN").await.unwrap();
    other.execute("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE", &[&task.id.0]).await.unwrap();
    let waiting = async {
        loop {
            let n: i64 = other
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if n > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::select! {
        claimed = store.claim_task(task.id, 1, "w1") => panic!("the claim did not wait: {claimed:?}"),
        () = waiting => {}
    }
    // The claim was dropped inside its transaction; the row is released.
    other.batch_execute("COMMIT").await.unwrap();

    // The next write runs on a connection outside any transaction, and
    // commits: another connection sees it.
    assert!(matches!(store.claim_task(task.id, 1, "w2").await.unwrap(), Claim::Claimed { .. }));
    let claimed_by: Option<String> =
        other.query_one("SELECT claimed_by FROM tasks WHERE id = $1", &[&task.id.0]).await.unwrap().get(0);
    assert_eq!(claimed_by.as_deref(), Some("w2"));
    let open: i64 = other
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0, "no connection left inside a transaction");
    drop(store);
    drop(other);
    db.drop_now().await.unwrap();
}

/// A coordinator's turn that creates tasks commits without waiting for its
/// WAL flush, and marks its job; a read of the job's events holds them back
/// while the mark is young, and past that flushes first (a transactional
/// logical message, seen in the WAL with `pg_walinspect`); the task's claim
/// (a synchronous commit, which flushes the turn with it) clears the mark.
/// Writes that are not such a turn leave nothing marked.
#[tokio::test]
async fn postgres_a_turn_creating_tasks_is_flushed_before_anyone_reads_it() {
    use flower_store::{Batch, NewJob, Store};
    let (db, store, raw) = pg_with_raw(2).await;
    raw.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect").await.unwrap();
    let mark = |job: flower_model::JobId| {
        let raw = &raw;
        async move {
            raw.query_one("SELECT unflushed_seq FROM jobs WHERE id = $1", &[&job.0])
                .await
                .unwrap()
                .get::<_, Option<i64>>(0)
        }
    };
    let lsn = || {
        let raw = &raw;
        async move { raw.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).await.unwrap().get::<_, String>(0) }
    };
    // The flushes' messages written between two positions of the WAL.
    let flushes = |from: String, to: String| {
        let raw = &raw;
        async move {
            raw.query_one(
                "SELECT count(*) FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
                 WHERE resource_manager = 'LogicalMessage' AND description LIKE '%flower.flush%'",
                &[&from, &to],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
        }
    };
    let job = flower_model::JobId::random();
    let new = NewJob::new(job, "j", serde_json::json!({}));
    store.create_job(new).await.unwrap();
    assert_eq!(mark(job).await, None, "a job's creation is synchronous");
    let lease = store.acquire_lease(job, "coordinator", 60_000).await.unwrap().unwrap();
    let session = flower_model::SessionId::random();

    // Unfenced, a batch creating a task is synchronous.
    let first = flower_model::Task::queued(job, session, "toolu_1", "w", "d", "m");
    store.append(Batch { tasks: vec![first], ..Default::default() }).await.unwrap();
    assert_eq!(mark(job).await, None, "an unfenced batch commits synchronously");

    let before: i64 = raw.query_one("SELECT next_event_seq FROM jobs WHERE id = $1", &[&job.0]).await.unwrap().get(0);
    let task = flower_model::Task::queued(job, session, "toolu_2", "w", "d", "m");
    let turn = Batch { tasks: vec![task.clone()], fence: Some(lease.fence()), ..Default::default() };
    let written = store.append(turn).await.unwrap();
    assert_eq!(written.events.first().map(|e| e.seq), Some(before + 1));
    assert_eq!(mark(job).await, Some(before + 1), "the turn marks its first event");

    // The mark's age is set from here, without a flush of this test's own.
    raw.batch_execute("SET synchronous_commit TO off").await.unwrap();
    let age = |by: &'static str| {
        let raw = &raw;
        async move {
            let sql = format!("UPDATE jobs SET unflushed_since = now() - interval '{by}' WHERE id = $1");
            raw.execute(&sql, &[&job.0]).await.unwrap();
        }
    };
    // While the mark is young, a page stops before it (the claim that
    // flushes it is on its way); the events before it are read as ever.
    age("-1 hour").await;
    assert!(store.events(job, before, 100).await.unwrap().is_empty(), "a young mark holds its events back");
    assert_eq!(store.events(job, 0, 100).await.unwrap().last().map(|e| e.seq), Some(before));
    // Past the hold, the read flushes, then hands the page out.
    age("1 hour").await;
    let from = lsn().await;
    let page = store.events(job, before, 100).await.unwrap();
    let to: String = raw.query_one("SELECT pg_current_wal_flush_lsn()::text", &[]).await.unwrap().get(0);
    assert_eq!(page.first().map(|e| e.seq), Some(before + 1));
    let durable: bool =
        raw.query_one("SELECT $1::text::pg_lsn >= $2::text::pg_lsn", &[&to, &from]).await.unwrap().get(0);
    assert!(durable, "the turn is flushed before its events are handed out");
    assert!(flushes(from, to).await >= 1, "the read flushed the WAL");

    // The claim commits synchronously and clears the mark.
    store.claim_task(task.id, 1, "w1").await.unwrap();
    assert_eq!(mark(job).await, None, "a synchronous write of the job's events clears the mark");
    assert_eq!(store.tasks(job).await.unwrap().len(), 2);
    drop(store);
    drop(raw);
    db.drop_now().await.unwrap();
}
