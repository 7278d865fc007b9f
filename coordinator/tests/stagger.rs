//! Fan-out staggering's messages: only a shape's first child asks its worker
//! to announce the first model response's stream; once that notice came,
//! the shape is released and a later child's message asks for nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use std::sync::Arc;
use std::time::Duration;

use flower_agent::Journal;
use flower_bus::{MemoryBus, Notice, Notifier, TaskQueue};
use flower_coordinator::dispatch::{Delegation, Dispatcher, Sweep};
use flower_model::{JobId, Role, Session, SessionId, now_ms};
use flower_store::workspace::Workspace;
use flower_store::{NewJob, SqliteStore, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_shapes_first_child_asks_for_its_stream_notice() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().unwrap());
    let bus = Arc::new(MemoryBus::new());
    let job = JobId::random();
    let new = NewJob::new(job, "stagger", serde_json::json!({}));
    store.create_job(new).await.unwrap();
    let coordinator = SessionId::random();
    let session = Session {
        id: coordinator,
        job_id: job,
        role: Role::Coordinator,
        label: "c".into(),
        task_id: None,
        created_at: now_ms(),
    };
    store.create_session(session).await.unwrap();
    let journal = Journal::new(store.clone(), bus.clone());
    let objects: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let dispatcher = Arc::new(Dispatcher::new(journal, bus.clone(), Workspace::new(objects, job), 1, Sweep::default()));
    let shape = "worker/sim/m".to_string();
    let delegate = |call: &'static str| {
        let (dispatcher, shape) = (dispatcher.clone(), shape.clone());
        tokio::spawn(async move {
            let d = Delegation {
                job,
                session: coordinator,
                tool_use_id: call,
                worker: "w",
                description: "d",
                mandate: "do it",
                shape: Some(shape),
            };
            dispatcher.delegate(d, &tokio_util::sync::CancellationToken::new()).await
        })
    };

    // The first child goes alone, asking for the notice its siblings wait for.
    let first = delegate("toolu_1");
    let leader = bus.next().await.unwrap();
    assert!(leader.message().stream_notice, "the first child asks for its stream's notice");
    assert!(!dispatcher.shape_released(&shape), "released before its first child streamed");

    // A sibling waits; the notice releases the shape and the sibling.
    let second = delegate("toolu_2");
    let notice = Notice::TaskStreaming { job, task: leader.message().task_id };
    bus.notify(notice).await.unwrap();
    let sibling = tokio::time::timeout(Duration::from_secs(5), bus.next())
        .await
        .expect("the sibling is published once the first child streamed")
        .unwrap();
    assert_ne!(sibling.message().task_id, leader.message().task_id);
    assert!(!sibling.message().stream_notice, "nobody waits for a sibling's stream");
    assert!(dispatcher.shape_released(&shape), "released by the first child's notice");
    first.abort();
    second.abort();
}
