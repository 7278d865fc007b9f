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
