//! Every backend against the one conformance suite.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;

use flower_store::{SqliteStore, conformance};

#[tokio::test]
async fn sqlite_in_memory_passes_the_store_suite() {
    conformance::store_suite(&SqliteStore::in_memory().unwrap()).await;
}

#[tokio::test]
async fn sqlite_file_passes_the_store_suite() {
    let dir = tempfile::tempdir().unwrap();
    conformance::store_suite(&SqliteStore::open(&dir.path().join("flower.db")).unwrap()).await;
}

#[tokio::test]
async fn local_filesystem_passes_the_workbench_suite() {
    let dir = tempfile::tempdir().unwrap();
    let fs = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    conformance::workbench_suite(Arc::new(fs)).await;
}

#[tokio::test]
async fn in_memory_object_store_passes_the_workbench_suite() {
    conformance::workbench_suite(Arc::new(object_store::memory::InMemory::new())).await;
}

#[tokio::test]
async fn stored_entries_cannot_be_rewritten() {
    // The append-only rule is enforced by the database itself, not by convention.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flower.db");
    let _store = SqliteStore::open(&path).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "INSERT INTO jobs VALUES ('j','n','queued',NULL,'{}',NULL,NULL,'{}',0,0);
         INSERT INTO sessions VALUES ('s','j','worker','w',NULL,0);
         INSERT INTO entries VALUES ('s',1,'u','j','user','{}',0);",
    )
    .unwrap();
    let err = conn.execute("UPDATE entries SET body = 'x'", []).unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
}

/// The admin URL tests create scratch databases through.
fn pg_admin_url() -> String {
    std::env::var("FLOWER_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

#[tokio::test]
async fn postgres_passes_the_store_suite() {
    let db = flower_store::postgres::ScratchDatabase::create(&pg_admin_url()).await.unwrap();
    let store = flower_store::PostgresStore::connect(&db.url, 4).await.unwrap();
    conformance::store_suite(&store).await;
    // Migrations are idempotent: a second replica starting on the same database is fine.
    flower_store::PostgresStore::connect(&db.url, 1).await.unwrap();
    drop(store);
    db.drop_now().await.unwrap();
}

#[tokio::test]
async fn postgres_entries_cannot_be_rewritten() {
    let db = flower_store::postgres::ScratchDatabase::create(&pg_admin_url()).await.unwrap();
    let _store = flower_store::PostgresStore::connect(&db.url, 1).await.unwrap();
    let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(
            "INSERT INTO jobs (id, name, state, spec, usage, created_at, updated_at)
               VALUES ('00000000-0000-0000-0000-000000000001', 'n', 'queued', '{}', '{}', 0, 0);
             INSERT INTO sessions (id, job_id, role, label, created_at)
               VALUES ('00000000-0000-0000-0000-000000000002', '00000000-0000-0000-0000-000000000001', 'worker', 'w', 0);
             INSERT INTO entries VALUES ('00000000-0000-0000-0000-000000000002', 1, '00000000-0000-0000-0000-000000000003',
               '00000000-0000-0000-0000-000000000001', 'user', '{}', 0);",
        )
        .await
        .unwrap();
    let err = client.batch_execute("UPDATE entries SET body = 'x'").await.unwrap_err();
    assert!(format!("{err:?}").contains("append-only"), "{err:?}");
}

#[tokio::test]
async fn s3_passes_the_workbench_suite() {
    let server = flower_store::s3test::S3TestServer::start("flower-test").await.unwrap();
    let prefix = format!("run-{}", uuid::Uuid::new_v4().simple());
    let objects = flower_store::objects::open(&server.url(&prefix), &server.options()).unwrap();
    conformance::workbench_suite(objects).await;
}
