//! The one conformance suite every [`Store`] backend and every object store
//! behind the [`Workbench`] must pass (feature `testsuite`: tests only).
//!
//! Each check is a public function given a fresh, empty instance. A backend's
//! tests call [`store_conformance_tests!`](crate::store_conformance_tests) or
//! [`workbench_conformance_tests!`](crate::workbench_conformance_tests), which
//! make one test per check, so one failing check does not hide the others
//! (`store/tests/conformance.rs`). A new check is listed in its macro too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use flower_model::{
    ContentBlock, Entry, EntryKind, EventKind, JobId, JobState, Role, Session, SessionId, Task, TaskId, TaskState,
    Usage, now_ms,
};

use crate::{Batch, NewJob, Store, StoreError};

/// One `#[tokio::test]` per store check, for one backend. `$make` names an
/// async function returning `(store, guard)`: a fresh, empty store and what
/// must outlive it (a temporary directory, a scratch database), dropped after
/// the store. The calling crate needs `tokio` with its `macros` feature.
#[macro_export]
macro_rules! store_conformance_tests {
    ($make:path) => {
        $crate::store_conformance_tests!(@each $make;
            jobs_and_idempotency,
            continuations_name_their_parent,
            job_counts_by_state,
            transcripts_are_ordered_per_session,
            task_attempts_are_fenced,
            a_claim_after_a_finish_answers_already_finished,
            a_stale_claim_answers_superseded,
            a_claim_racing_a_finish_answers_consistently,
            cancelled_tasks_are_reported_in_dispatch_order,
            events_are_a_gapless_sequence,
            leases_fence_writes,
            a_fan_out_is_created_in_one_write,
            a_turn_and_its_calls_tasks_commit_together,
            a_fenced_turn_is_stored_whole_or_refused_whole,
            a_claim_waits_for_its_rows_commit,
            a_batch_commits_only_on_the_ends_it_requires,
            a_claim_opens_the_attempts_session,
            an_attempt_claims_and_ends_in_one_write,
            claims_are_written_together,
            a_final_batch_lands_with_the_end_or_not_at_all,
            a_large_batch_is_stored_whole_or_not_at_all,
            pages_of_a_transcript_cross_batches_whole,
            a_write_failing_at_its_last_statement_stores_nothing,
            rows_of_an_unknown_job_are_refused,
            jobs_belong_to_a_namespace,
            keys_are_stored_revoked_and_rotated,
            the_audit_log_is_append_only_and_scoped,
            namespaces_keep_limits_and_count_spend,
            a_namespaces_max_jobs_holds_its_queued_jobs,
            a_namespaces_max_tasks_admits_its_held_tasks_in_turn,
            routes_share_their_rate_limits,
        );
    };
    (@each $make:path; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let (store, guard) = $make().await;
                $crate::conformance::$check(&store).await;
                drop(store);
                drop(guard);
            }
        )*
    };
}

/// One `#[tokio::test]` per workbench check, for one object store. `$make`
/// names an async function returning `(objects, guard)`: an empty
/// `Arc<dyn ObjectStore>` and what must outlive it.
#[macro_export]
macro_rules! workbench_conformance_tests {
    ($make:path) => {
        $crate::workbench_conformance_tests!(@each $make;
            workbench_paths_sync_and_isolation,
            workspace_snapshots_and_changesets,
        );
    };
    (@each $make:path; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let (objects, guard) = $make().await;
                $crate::conformance::$check(objects).await;
                drop(guard);
            }
        )*
    };
}

async fn new_job(store: &dyn Store, key: Option<&str>) -> JobId {
    let (job, created) = store
        .create_job(NewJob {
            idempotency_key: key.map(str::to_string),
            ..NewJob::new(JobId::random(), "t", serde_json::json!({"name": "t"}))
        })
        .await
        .unwrap();
    assert!(created);
    job.id
}

fn task(job: JobId, session: SessionId, tool_use: &str) -> Task {
    Task::queued(job, session, tool_use, "w", "d", "do it")
}

/// A new coordinator session of `job`.
async fn coordinator_session(store: &dyn Store, job: JobId) -> SessionId {
    let id = SessionId::random();
    let session =
        Session { id, job_id: job, role: Role::Coordinator, label: "c".into(), task_id: None, created_at: now_ms() };
    store.create_session(session).await.unwrap();
    id
}

pub async fn jobs_and_idempotency(store: &dyn Store) {
    let id = new_job(store, Some("key-1")).await;
    let (again, created) = store
        .create_job(NewJob {
            idempotency_key: Some("key-1".into()),
            ..NewJob::new(JobId::random(), "t", serde_json::json!({}))
        })
        .await
        .unwrap();
    assert!(!created, "a repeated idempotency key returns the first job");
    assert_eq!(again.id, id);
    assert_eq!(store.get_job(id).await.unwrap().state, JobState::Queued);
    assert_eq!(store.resolve_job(&id.to_string()[..8]).await.unwrap(), id);
    assert!(matches!(store.resolve_job("zz").await, Err(StoreError::NotFound(_))));
    assert!(matches!(store.get_job(JobId::random()).await, Err(StoreError::NotFound(_))));

    store.set_job_state(id, JobState::Running, None, None, None).await.unwrap();
    store.set_job_state(id, JobState::Succeeded, None, Some("42".into()), None).await.unwrap();
    let job = store.get_job(id).await.unwrap();
    assert_eq!((job.state, job.final_answer.as_deref()), (JobState::Succeeded, Some("42")));
    assert!(
        matches!(
            store.set_job_state(id, JobState::Running, None, None, None).await,
            Err(StoreError::JobEnded { job, state: JobState::Succeeded }) if job == id
        ),
        "a finished job stays finished"
    );
    store.set_job_state(id, JobState::Failed, None, None, None).await.unwrap_err();
    assert_eq!(store.get_job(id).await.unwrap().final_answer.as_deref(), Some("42"), "the first end stands");
    assert!(store.list_jobs(None, 10).await.unwrap().iter().any(|j| j.id == id));
}

pub async fn continuations_name_their_parent(store: &dyn Store) {
    let parent = new_job(store, None).await;
    assert!(store.get_job(parent).await.unwrap().continues.is_none());
    let mut children = Vec::new();
    for n in 0..2 {
        let lineage = flower_model::Lineage { parent, instruction: format!("also do {n}: 'quoted' \\ \u{e9}") };
        let (child, created) = store
            .create_job(NewJob {
                continues: Some(lineage.clone()),
                ..NewJob::new(JobId::random(), "t", serde_json::json!({"name": "t"}))
            })
            .await
            .unwrap();
        assert!(created);
        assert_eq!(child.continues.as_ref(), Some(&lineage));
        assert_eq!(store.get_job(child.id).await.unwrap().continues, Some(lineage.clone()));
        children.push(child.id);
        // The next one is younger by at least a millisecond (ties go by id).
        let made = child.created_at;
        while now_ms() <= made {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(store.continuations(parent).await.unwrap(), children, "oldest first");
    assert!(store.continuations(children[0]).await.unwrap().is_empty());
    let listed = store.list_jobs(None, 10).await.unwrap();
    assert!(listed.iter().any(|j| j.continues.as_ref().map(|l| l.parent) == Some(parent)));
}

pub async fn job_counts_by_state(store: &dyn Store) {
    assert!(store.job_counts().await.unwrap().is_empty(), "an empty store counts no job");
    let a = new_job(store, None).await;
    new_job(store, None).await;
    new_job(store, None).await;
    store.set_job_state(a, JobState::Running, None, None, None).await.unwrap();
    let mut counts = store.job_counts().await.unwrap();
    counts.sort_by_key(|(_, s, _)| s.as_str());
    let d = || "default".to_string();
    assert_eq!(counts, vec![(d(), JobState::Queued, 2), (d(), JobState::Running, 1)]);
}

pub async fn transcripts_are_ordered_per_session(store: &dyn Store) {
    let job = new_job(store, None).await;
    let (a, b) = (SessionId::random(), SessionId::random());
    for (s, role) in [(a, Role::Coordinator), (b, Role::Worker)] {
        let session = Session { id: s, job_id: job, role, label: "x".into(), task_id: None, created_at: now_ms() };
        assert_eq!(store.create_session(session.clone()).await.unwrap().events.len(), 1);
        assert!(store.create_session(session).await.unwrap().events.is_empty(), "registering twice is a no-op");
    }
    let mut first = Entry::new(job, a, None, EntryKind::User, vec![ContentBlock::text("goal")]);
    first.markers.ephemeral = Some(true);
    let mut second =
        Entry::new(job, a, Some(first.uuid), EntryKind::ToolResult, vec![ContentBlock::tool_result("t1", "no", true)]);
    second.markers.denial_kind = Some("delegate_guard".into());
    second.markers.interrupted = true;
    let other = Entry::new(job, b, None, EntryKind::User, vec![ContentBlock::text("mandate")]);
    let usage = Usage { input_tokens: 10, output_tokens: 5, ..Default::default() };
    let written = store
        .append(Batch {
            entries: vec![first.clone(), other.clone(), second.clone()],
            events: vec![(job, EventKind::ToolCalled { session: a, tool: "Read".into(), tool_use_id: "t1".into() })],
            usage: Some((job, usage)),
            fence: None,
            tasks: vec![],
            requires: vec![],
            staged: None,
        })
        .await
        .unwrap();
    assert_eq!(written.entry_seqs, vec![1, 1, 2]);
    assert_eq!(written.events.len(), 1);
    let got = store.entries(a, 0, 100).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].uuid, first.uuid);
    assert_eq!(got[1].parent_uuid, Some(first.uuid));
    assert_eq!(got[1].markers, second.markers, "markers are stored as written");
    assert_eq!(got[0].markers.ephemeral, Some(true));
    assert_eq!(store.entries(a, 1, 100).await.unwrap().len(), 1);
    assert_eq!(store.entries(b, 0, 100).await.unwrap()[0].uuid, other.uuid);
    assert_eq!(store.get_job(job).await.unwrap().usage, usage);
    // Usage adds up field by field, the per-TTL split included.
    let more = Usage {
        input_tokens: 1,
        output_tokens: 2,
        cache_creation_input_tokens: 30,
        cache_read_input_tokens: 40,
        cache_creation: flower_model::usage::CacheCreation {
            ephemeral_5m_input_tokens: 10,
            ephemeral_1h_input_tokens: 20,
        },
    };
    store.append(Batch { usage: Some((job, more)), ..Default::default() }).await.unwrap();
    store.append(Batch { usage: Some((job, more)), ..Default::default() }).await.unwrap();
    let mut total = usage;
    total.add(&more);
    total.add(&more);
    assert_eq!(store.get_job(job).await.unwrap().usage, total);
    let sessions = store.sessions(job).await.unwrap();
    assert_eq!(sessions.iter().map(|s| s.id).collect::<Vec<_>>(), vec![a, b]);
    assert_eq!(store.get_session(b).await.unwrap().role, Role::Worker);
}

/// A batch far above any backend's bulk-path threshold, two sessions
/// interleaved, bodies with every escaping hazard: read back exactly as
/// written, numbered per session; and a large batch with one bad row (an
/// unknown session, a repeated uuid) stores none of its rows.
pub async fn a_large_batch_is_stored_whole_or_not_at_all(store: &dyn Store) {
    let job = new_job(store, None).await;
    let (a, b) = (SessionId::random(), SessionId::random());
    for s in [a, b] {
        let session =
            Session { id: s, job_id: job, role: Role::Worker, label: "x".into(), task_id: None, created_at: 1 };
        store.create_session(session).await.unwrap();
    }
    let hazards = ["plain", "quote \" backslash \\ tab \t", "nul \u{0} bell \u{7}", "é 漢字 🌸", "\r\n\\N"];
    let mut written = Vec::new();
    let mut parent = None;
    for n in 0..300usize {
        let session = if n % 3 == 0 { b } else { a };
        let text =
            format!("{} #{n}{}", hazards[n % hazards.len()], if n == 7 { "x".repeat(70_000) } else { String::new() });
        let mut e = Entry::new(
            job,
            session,
            parent,
            EntryKind::ToolResult,
            vec![ContentBlock::tool_result(format!("t{n}"), text, n % 2 == 0)],
        );
        e.markers.ephemeral = Some(n % 5 == 0);
        parent = Some(e.uuid);
        written.push(e);
    }
    let seqs = store.append(Batch { entries: written.clone(), ..Default::default() }).await.unwrap().entry_seqs;
    let (mut next_a, mut next_b) = (0, 0);
    for (e, seq) in written.iter_mut().zip(&seqs) {
        let next = if e.session_id == a { &mut next_a } else { &mut next_b };
        *next += 1;
        assert_eq!(*seq, *next, "numbered per session, in batch order");
        e.seq = *seq;
    }
    for s in [a, b] {
        let got = store.entries(s, 0, 1000).await.unwrap();
        let want: Vec<&Entry> = written.iter().filter(|e| e.session_id == s).collect();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert_eq!(
                serde_json::to_value(g).unwrap(),
                serde_json::to_value(w).unwrap(),
                "entry {} read back as written",
                w.seq
            );
        }
    }

    let fresh = |n: usize| -> Vec<Entry> {
        (0..n)
            .map(|i| Entry::new(job, a, None, EntryKind::User, vec![ContentBlock::text(format!("more {i}"))]))
            .collect()
    };
    // Both far enough into a batch to be past any backend's first statement of it.
    let mut unknown = fresh(400);
    unknown[350].session_id = SessionId::random();
    let err = store.append(Batch { entries: unknown, ..Default::default() }).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    let mut repeated = fresh(400);
    repeated[399].uuid = repeated[3].uuid;
    store.append(Batch { entries: repeated, ..Default::default() }).await.unwrap_err();
    assert_eq!(store.entries(a, 0, 1000).await.unwrap().len(), 200, "a refused batch stores none of its rows");
    let seqs = store.append(Batch { entries: fresh(100), ..Default::default() }).await.unwrap().entry_seqs;
    assert_eq!(seqs.first(), Some(&201), "a refused batch takes no numbers");
}

/// A transcript written in batches of very different sizes (one above any
/// backend's per-row limit for a stored chunk) reads back page by page from
/// any starting number and page size as one gapless sequence, each entry
/// with its number and its uuid.
pub async fn pages_of_a_transcript_cross_batches_whole(store: &dyn Store) {
    let job = new_job(store, None).await;
    let s = SessionId::random();
    let session =
        Session { id: s, job_id: job, role: Role::Coordinator, label: "x".into(), task_id: None, created_at: 1 };
    store.create_session(session).await.unwrap();
    let mut written: Vec<Entry> = Vec::new();
    for size in [1usize, 2_500, 3, 700, 1] {
        let batch: Vec<Entry> = (0..size)
            .map(|i| {
                Entry::new(job, s, None, EntryKind::User, vec![ContentBlock::text(format!("{} {i}", written.len()))])
            })
            .collect();
        let seqs = store.append(Batch { entries: batch.clone(), ..Default::default() }).await.unwrap().entry_seqs;
        let from = written.len() as i64 + 1;
        assert_eq!(seqs, (from..from + size as i64).collect::<Vec<_>>(), "numbered on from the last batch");
        written.extend(batch);
    }
    let total = written.len() as i64;
    for (after, limit) in
        [(0, u32::MAX), (0, 1), (1, 1), (2, 1024), (1000, 3000), (1025, 7), (2503, 2), (3204, 10), (3205, 5), (9999, 5)]
    {
        let got = store.entries(s, after, limit).await.unwrap();
        let want =
            &written[(after.min(total) as usize)..((after.saturating_add(i64::from(limit))).min(total) as usize)];
        assert_eq!(got.len(), want.len(), "entries after {after}, at most {limit}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!((g.seq, g.uuid, g.text()), (after + 1 + i as i64, w.uuid, w.text()), "after {after}, #{i}");
        }
    }
    assert!(store.entries(s, 5, 0).await.unwrap().is_empty(), "a page of none is empty");
}

pub async fn events_are_a_gapless_sequence(store: &dyn Store) {
    let job = new_job(store, None).await;
    store.set_job_state(job, JobState::Running, None, None, None).await.unwrap();
    store.create_task(task(job, SessionId::random(), "x"), None).await.unwrap();
    let events = store.events(job, 0, 100).await.unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert!(matches!(events[0].kind, EventKind::JobState { state: JobState::Queued, .. }));
    assert_eq!(store.events(job, 2, 100).await.unwrap().len(), 1, "reading from a cursor");
    assert_eq!(store.events(job, 0, 2).await.unwrap().len(), 2, "limit is honoured");
}

/// A write whose last statement fails (events of a job that does not
/// exist, numbered last) stores none of its rows and takes no event
/// numbers; the store's next write goes through (a backend that sends its
/// `COMMIT` with the last statement must roll back then).
pub async fn a_write_failing_at_its_last_statement_stores_nothing(store: &dyn Store) {
    let job = new_job(store, None).await;
    let session = coordinator_session(store, job).await;
    let before = store.events(job, 0, 100).await.unwrap().len();
    let entry = |text: &str| Entry::new(job, session, None, EntryKind::User, vec![ContentBlock::text(text)]);
    // Events are written per job in id order: the missing job's are last.
    let missing = JobId(uuid::Uuid::max());
    let note = |n: u64| EventKind::HandoffWarning { session, context_tokens: n, at: 1 };
    let usage = Usage { input_tokens: 7, ..Default::default() };
    let failing = Batch {
        entries: vec![entry("lost")],
        events: vec![(job, note(1)), (missing, note(2))],
        usage: Some((job, usage)),
        tasks: vec![task(job, session, "never")],
        ..Default::default()
    };
    store.append(failing).await.unwrap_err();
    assert!(store.entries(session, 0, 100).await.unwrap().is_empty(), "no entry of the failed write");
    assert_eq!(store.events(job, 0, 100).await.unwrap().len(), before, "no event of the failed write");
    assert!(store.tasks(job).await.unwrap().is_empty(), "no task row of the failed write");
    assert_eq!(store.get_job(job).await.unwrap().usage, Usage::default(), "no usage of the failed write");
    // The next writes (as many as a pool has connections) go through, numbered on.
    for n in 0..20 {
        let written = store
            .append(Batch { entries: vec![entry("kept")], events: vec![(job, note(n))], ..Default::default() })
            .await
            .unwrap();
        assert_eq!(written.events[0].seq, (before + 1 + n as usize) as i64, "numbered without a gap");
    }
    assert_eq!(store.entries(session, 0, 100).await.unwrap().len(), 20);
}

/// A session, a task row or a claim's session naming a job that does not
/// exist is refused and leaves nothing behind (whatever a backend checks it
/// with: a foreign key, or the job's event counter written in the same
/// transaction).
pub async fn rows_of_an_unknown_job_are_refused(store: &dyn Store) {
    let missing = JobId::random();
    let session = SessionId::random();
    let orphan = Session {
        id: session,
        job_id: missing,
        role: Role::Coordinator,
        label: "c".into(),
        task_id: None,
        created_at: 1,
    };
    store.create_session(orphan).await.unwrap_err();
    assert!(matches!(store.get_session(session).await, Err(StoreError::NotFound(_))), "no session row");
    let t = task(missing, session, "toolu_orphan");
    store.create_tasks(vec![t.clone()], None).await.unwrap_err();
    assert!(matches!(store.get_task(t.id).await, Err(StoreError::NotFound(_))), "no task row");
    assert!(store.tasks(missing).await.unwrap().is_empty());
    assert!(store.events(missing, 0, 100).await.unwrap().is_empty(), "no event");
    // The store goes on: the same rows under a job that exists are taken.
    let job = new_job(store, None).await;
    let t = task(job, session, "toolu_orphan");
    let (created, _) = store.create_tasks(vec![t.clone()], None).await.unwrap();
    assert!(created[0].1);
}

pub async fn a_fan_out_is_created_in_one_write(store: &dyn Store) {
    let job = new_job(store, None).await;
    let session = SessionId::random();
    let before = task(job, session, "toolu_0");
    store.create_task(before.clone(), None).await.unwrap();
    let tasks: Vec<Task> = (0..5).map(|i| task(job, session, &format!("toolu_{i}"))).collect();
    let (out, written) = store.create_tasks(tasks.clone(), None).await.unwrap();
    assert_eq!(out.iter().map(|(t, _)| t.id).collect::<Vec<_>>(), tasks.iter().map(|t| t.id).collect::<Vec<_>>());
    assert_eq!(out.iter().map(|(_, c)| *c).collect::<Vec<_>>(), vec![false, true, true, true, true], "toolu_0 existed");
    assert!(out.iter().all(|(t, _)| t.state == TaskState::Queued));
    let queued: Vec<TaskId> = written
        .events
        .iter()
        .map(|e| match &e.kind {
            EventKind::TaskQueued { task, .. } => *task,
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    assert_eq!(queued, tasks[1..].iter().map(|t| t.id).collect::<Vec<_>>(), "one event per new task, in order");
    let seqs: Vec<i64> = written.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![3, 4, 5, 6], "numbered after the job's and the first task's events");
    assert_eq!(store.tasks(job).await.unwrap().len(), 5);
    let (again, written) = store.create_tasks(tasks, None).await.unwrap();
    assert!(again.iter().all(|(_, c)| !c) && written.events.is_empty(), "a retried fan-out creates nothing");
    assert!(store.create_tasks(Vec::new(), None).await.unwrap().0.is_empty());
}

/// An assistant turn's entry and the task rows of its `Agent` calls land in
/// one write: the entry, the turn's event, then one `task_queued` per new
/// row; a row already there is reported as it is, and a fenced batch stores
/// neither.
mod access;
mod claims;
mod leases;

pub use access::*;
pub use claims::*;
pub use leases::*;
