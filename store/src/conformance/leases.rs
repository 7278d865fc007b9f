//! Conformance checks of leases and of the object stores behind the
//! workbench and the workspace.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use flower_model::{ContentBlock, Entry, EntryKind, EventKind, JobId, JobState, now_ms};
use object_store::ObjectStore;

use crate::{Batch, Lease, Store, StoreError, Workbench};

use super::{coordinator_session, new_job, task};

pub async fn leases_fence_writes(store: &dyn Store) {
    let job = new_job(store, None).await;
    assert!(store.orphaned_jobs(now_ms(), 1000).await.unwrap().contains(&job), "a queued job without an owner");
    let a = store.acquire_lease(job, "coordinator-a", 60_000).await.unwrap().expect("a free lease is taken");
    assert_eq!(a.epoch, 1);
    assert!(store.acquire_lease(job, "coordinator-b", 60_000).await.unwrap().is_none(), "a live lease is not taken");
    assert!(!store.orphaned_jobs(now_ms(), 1000).await.unwrap().contains(&job));
    assert_eq!(
        store.acquire_lease(job, "coordinator-a", 60_000).await.unwrap().map(|l| l.epoch),
        Some(1),
        "re-acquiring keeps the epoch"
    );
    assert!(store.renew_lease(&a, 60_000).await.unwrap());
    store.set_job_state(job, JobState::Running, None, None, Some(a.fence())).await.unwrap();

    // a dies: its lease expires, b takes the job over with a new epoch.
    let expired = store.acquire_lease(job, "coordinator-a", -1).await.unwrap().unwrap();
    assert!(store.orphaned_jobs(now_ms(), 1000).await.unwrap().contains(&job), "an expired lease orphans the job");
    let b = store.acquire_lease(job, "coordinator-b", 60_000).await.unwrap().expect("an expired lease is taken over");
    assert_eq!(b.epoch, expired.epoch + 1);
    assert!(!store.renew_lease(&a, 60_000).await.unwrap(), "the old owner's lease is gone");
    // Renewed together: per lease, in order, whether it is still held.
    let other = new_job(store, None).await;
    let c = store.acquire_lease(other, "coordinator-b", 1).await.unwrap().unwrap();
    let never = Lease { job: JobId::random(), owner: "coordinator-b".into(), epoch: 1, expires_at: 0 };
    assert_eq!(
        store.renew_leases(&[a.clone(), c.clone(), never, b.clone()], 60_000).await.unwrap(),
        vec![false, true, false, true]
    );
    assert!(!store.orphaned_jobs(now_ms() + 30_000, 1000).await.unwrap().contains(&other), "renewed for the TTL");
    assert!(store.renew_leases(&[], 60_000).await.unwrap().is_empty());

    let session = coordinator_session(store, job).await;
    let stale = |fence| Batch {
        entries: vec![Entry::new(job, session, None, EntryKind::User, vec![ContentBlock::text("x")])],
        events: vec![(job, EventKind::JobState { state: JobState::Running, reason: None })],
        usage: None,
        fence,
        tasks: vec![],
        requires: vec![],
        staged: None,
    };
    let events_before = store.events(job, 0, 1000).await.unwrap().len();
    for err in [
        store.append(stale(Some(a.fence()))).await.err(),
        store.set_job_state(job, JobState::Failed, None, None, Some(a.fence())).await.err(),
        store.create_task(task(job, session, "late"), Some(a.fence())).await.err(),
    ] {
        assert!(matches!(err, Some(StoreError::Fenced { given: 1, current: 2, .. })), "{err:?}");
    }
    assert!(store.entries(session, 0, 100).await.unwrap().is_empty(), "a fenced batch writes nothing");
    assert_eq!(store.events(job, 0, 1000).await.unwrap().len(), events_before);
    assert_eq!(store.get_job(job).await.unwrap().state, JobState::Running);
    store.append(stale(Some(b.fence()))).await.unwrap();
    store.create_task(task(job, session, "new"), Some(b.fence())).await.unwrap();
    store.release_lease(&b).await.unwrap();
    assert!(store.orphaned_jobs(now_ms(), 1000).await.unwrap().contains(&job), "a released lease orphans the job");
}

/// Workbench paths, materialising and syncing a task directory, one
/// workbench per job.
pub async fn workbench_paths_sync_and_isolation(objects: Arc<dyn ObjectStore>) {
    let job = JobId::random();
    let wb = Workbench::new(objects.clone(), job);
    wb.put("notes/a.md", "decided".as_bytes().to_vec()).await.unwrap();
    assert_eq!(&wb.get("notes/a.md").await.unwrap()[..], b"decided");
    assert!(matches!(wb.get("notes/none.md").await, Err(StoreError::NotFound(_))));
    let escape = wb.put("../escape", Vec::new()).await;
    assert!(matches!(escape, Err(StoreError::BadPath { .. })), "paths stay beneath the workbench: {escape:?}");
    assert!(matches!(wb.put("/abs", Vec::new()).await, Err(StoreError::BadPath { .. })));

    let dir = tempfile::tempdir().unwrap();
    let mut base = wb.materialize(dir.path()).await.unwrap();
    assert!(dir.path().join("artifacts").is_dir());
    assert_eq!(std::fs::read_to_string(dir.path().join("notes/a.md")).unwrap(), "decided");
    std::fs::write(dir.path().join("artifacts/report.md"), "# r").unwrap();
    std::fs::remove_file(dir.path().join("notes/a.md")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("artifacts/leak")).unwrap();
    let report = wb.sync(dir.path(), &mut base).await.unwrap();
    assert_eq!(report.uploaded, vec!["artifacts/report.md".to_string()], "symlinks are never uploaded");
    assert_eq!(report.deleted, vec!["notes/a.md".to_string()]);
    assert_eq!(wb.list().await.unwrap(), vec![("artifacts/report.md".to_string(), 3)]);
    assert!(wb.sync(dir.path(), &mut base).await.unwrap() == Default::default(), "nothing changed, nothing sent");
    let other = Workbench::new(objects.clone(), JobId::random());
    assert!(other.list().await.unwrap().is_empty(), "workbenches are per job");
}

/// Workspace snapshots and changesets on an object store.
pub async fn workspace_snapshots_and_changesets(objects: Arc<dyn ObjectStore>) {
    use crate::workspace::{Workspace, apply};
    let job = JobId::random();
    let ws = Workspace::new(objects, job);
    assert!(ws.load().await.unwrap().is_empty(), "no workspace yet");
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("d")).unwrap();
    std::fs::write(src.path().join("d/a.txt"), "alpha").unwrap();
    std::fs::write(src.path().join("b.txt"), "beta").unwrap();
    std::fs::create_dir_all(src.path().join(".flower")).unwrap();
    std::fs::write(src.path().join(".flower/x"), "never uploaded").unwrap();
    let over = ws.upload_dir(src.path(), 3).await;
    assert!(
        matches!(over, Err(StoreError::TooLarge { size: 9, limit: 3, .. })),
        "the size limit is enforced: {over:?}"
    );
    assert!(ws.load().await.unwrap().is_empty(), "nothing is uploaded past the limit");
    let files = vec![("../x".to_string(), bytes::Bytes::from_static(b"x"))];
    assert!(matches!(ws.upload_files(files, 1 << 20).await, Err(StoreError::BadPath { .. })));
    let base = ws.upload_dir(src.path(), 1 << 20).await.unwrap();
    assert_eq!(base.keys().cloned().collect::<Vec<_>>(), vec!["b.txt".to_string(), "d/a.txt".to_string()]);
    assert_eq!(&ws.read("d/a.txt").await.unwrap()[..], b"alpha");

    let task_dir = tempfile::tempdir().unwrap();
    ws.checkout(&base, task_dir.path()).await.unwrap();
    assert_eq!(std::fs::read_to_string(task_dir.path().join("d/a.txt")).unwrap(), "alpha");
    std::fs::write(task_dir.path().join("d/a.txt"), "ALPHA").unwrap();
    std::fs::remove_file(task_dir.path().join("b.txt")).unwrap();
    std::fs::write(task_dir.path().join("c.txt"), "new").unwrap();
    let grown = ws.diff(&base, task_dir.path(), 5).await.unwrap_err();
    assert!(
        matches!(grown, StoreError::TooLarge { size: 8, limit: 5, setting: "runtime.workspace_limit", .. }),
        "{grown}"
    );
    let cs = ws.diff(&base, task_dir.path(), 1 << 20).await.unwrap();
    assert_eq!(cs.changes.len(), 3);
    let task = flower_model::TaskId::random();
    ws.put_changeset(task, 1, &cs).await.unwrap();
    assert_eq!(ws.changeset(task, 1).await.unwrap(), Some(cs.clone()));
    assert_eq!(ws.changeset(task, 2).await.unwrap(), None);
    let mut current = ws.load().await.unwrap();
    assert!(apply(&mut current, &cs).is_empty());
    ws.save(&current).await.unwrap();
    assert_eq!(&ws.read("d/a.txt").await.unwrap()[..], b"ALPHA", "new content travels by blob");
    assert_eq!(&ws.read("c.txt").await.unwrap()[..], b"new");
    assert!(matches!(ws.read("b.txt").await, Err(StoreError::NotFound(_))));

    // A file larger than one upload part goes up in parts and comes back whole.
    let big: Vec<u8> = (0..crate::objects::PART * 2 + 12_345).map(|i| (i % 251) as u8).collect();
    std::fs::write(task_dir.path().join("big.bin"), &big).unwrap();
    let current = ws.load().await.unwrap();
    let cs = ws.diff(&current, task_dir.path(), 64 << 20).await.unwrap();
    let mut after = current.clone();
    apply(&mut after, &cs);
    ws.save(&after).await.unwrap();
    assert!(ws.read("big.bin").await.unwrap()[..] == big[..], "a large file travels whole");
}
