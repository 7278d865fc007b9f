//! Every backend against the one conformance suite: one test per check per
//! backend (`store_conformance_tests!`), so one failure hides no other.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;

use flower_store::{PostgresStore, SqliteStore, postgres::ScratchDatabase};
use object_store::ObjectStore;

/// The admin URL tests create scratch databases through.
fn pg_admin_url() -> String {
    std::env::var("FLOWER_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
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
    let db = ScratchDatabase::create(&pg_admin_url()).await.unwrap();
    let _store = PostgresStore::connect(&db.url, 1).await.unwrap();
    let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
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
    let new = NewJob { id: job, name: "j".into(), spec: serde_json::json!({}), idempotency_key: None, continues: None };
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
