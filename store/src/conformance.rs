//! The one conformance suite every [`Store`] backend and every object store
//! behind the [`Workbench`] must pass (feature `testsuite`: tests only).
//!
//! Each check is a public function given a fresh, empty instance. A backend's
//! tests call [`store_conformance_tests!`](crate::store_conformance_tests) or
//! [`workbench_conformance_tests!`](crate::workbench_conformance_tests), which
//! make one test per check, so one failing check does not hide the others
//! (`store/tests/conformance.rs`). A new check is listed in its macro too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use flower_model::{
    ContentBlock, Entry, EntryKind, EventKind, JobId, JobState, Role, Session, SessionId, Task, TaskId, TaskOutcome,
    TaskState, Usage, now_ms,
};
use object_store::ObjectStore;

use crate::{Batch, Claim, EndOffer, Lease, NewJob, OfferedEnd, Store, StoreError, Workbench};

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
            id: JobId::random(),
            name: "t".into(),
            spec: serde_json::json!({"name": "t"}),
            idempotency_key: key.map(str::to_string),
            continues: None,
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
            id: JobId::random(),
            name: "t".into(),
            spec: serde_json::json!({}),
            idempotency_key: Some("key-1".into()),
            continues: None,
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
    assert!(store.list_jobs(10).await.unwrap().iter().any(|j| j.id == id));
}

pub async fn continuations_name_their_parent(store: &dyn Store) {
    let parent = new_job(store, None).await;
    assert!(store.get_job(parent).await.unwrap().continues.is_none());
    let mut children = Vec::new();
    for n in 0..2 {
        let lineage = flower_model::Lineage { parent, instruction: format!("also do {n}: 'quoted' \\ \u{e9}") };
        let (child, created) = store
            .create_job(NewJob {
                id: JobId::random(),
                name: "t".into(),
                spec: serde_json::json!({"name": "t"}),
                idempotency_key: None,
                continues: Some(lineage.clone()),
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
    let listed = store.list_jobs(10).await.unwrap();
    assert!(listed.iter().any(|j| j.continues.as_ref().map(|l| l.parent) == Some(parent)));
}

pub async fn job_counts_by_state(store: &dyn Store) {
    assert!(store.job_counts().await.unwrap().is_empty(), "an empty store counts no job");
    let a = new_job(store, None).await;
    new_job(store, None).await;
    new_job(store, None).await;
    store.set_job_state(a, JobState::Running, None, None, None).await.unwrap();
    let mut counts = store.job_counts().await.unwrap();
    counts.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(counts, vec![(JobState::Queued, 2), (JobState::Running, 1)]);
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

pub async fn task_attempts_are_fenced(store: &dyn Store) {
    let job = new_job(store, None).await;
    let session = SessionId::random();
    let t = task(job, session, "toolu_a");
    let (stored, created, written) = store.create_task(t.clone(), None).await.unwrap();
    assert!(created);
    assert_eq!(written.events.len(), 1);
    assert_eq!(stored.state, TaskState::Queued);
    let (_, created, _) = store.create_task(t.clone(), None).await.unwrap();
    assert!(!created, "the derived id finds the existing task");

    let Claim::Claimed { task: claimed, .. } = store.claim_task(t.id, 1, "w1").await.unwrap() else {
        panic!("first claim")
    };
    assert_eq!((claimed.state, claimed.attempt, claimed.claimed_by.as_deref()), (TaskState::Running, 1, Some("w1")));
    assert_eq!(
        store.claim_task(t.id, 1, "w2").await.unwrap(),
        Claim::Superseded { current_attempt: 1 },
        "an attempt is claimed once"
    );
    assert!(matches!(store.claim_task(t.id, 2, "w2").await.unwrap(), Claim::Claimed { .. }), "a redelivery takes over");
    let before = store.get_task(t.id).await.unwrap().updated_at;
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    assert!(store.heartbeat_task(t.id, 2).await.unwrap(), "the running attempt beats");
    assert!(store.get_task(t.id).await.unwrap().updated_at > before, "a heartbeat moves updated_at on");
    assert!(!store.heartbeat_task(t.id, 1).await.unwrap(), "a superseded attempt's heartbeat is refused");
    let stale = store.finish_task(t.id, 1, TaskOutcome::Succeeded { report: "old".into() }, Usage::default()).await;
    assert!(
        matches!(stale, Err(StoreError::Superseded { task, attempt: 1, current_attempt: 2 }) if task == t.id),
        "a superseded attempt cannot finish: {stale:?}"
    );
    let usage = Usage { input_tokens: 7, ..Default::default() };
    let (done, _) = store.finish_task(t.id, 2, TaskOutcome::Succeeded { report: "ok".into() }, usage).await.unwrap();
    assert_eq!((done.state, done.report.as_deref()), (TaskState::Succeeded, Some("ok")));
    let twice = store.finish_task(t.id, 2, TaskOutcome::Succeeded { report: "again".into() }, usage).await;
    assert!(
        matches!(twice, Err(StoreError::AlreadyFinished { state: TaskState::Succeeded, .. })),
        "a task completes once: {twice:?}"
    );
    assert!(matches!(store.claim_task(t.id, 3, "w3").await.unwrap(), Claim::AlreadyFinished(_)));
    assert!(!store.heartbeat_task(t.id, 2).await.unwrap(), "a finished task does not beat");
    assert_eq!(store.get_task(t.id).await.unwrap().report.as_deref(), Some("ok"));
    assert_eq!(store.get_task(t.id).await.unwrap().usage.input_tokens, 7);
    assert_eq!(
        store.get_job(job).await.unwrap().usage.input_tokens,
        0,
        "turn usage is counted per turn, not again per task"
    );

    let pending = task(job, session, "toolu_b");
    store.create_task(pending.clone(), None).await.unwrap();
    let cancelled = store.cancel_tasks(job, "user cancelled").await.unwrap();
    assert_eq!(cancelled.events.len(), 1, "only unfinished tasks are cancelled");
    let p = store.get_task(pending.id).await.unwrap();
    assert_eq!((p.state, p.error.as_deref()), (TaskState::Cancelled, Some("user cancelled")));
    assert_eq!(store.tasks(job).await.unwrap().len(), 2);
}

/// Ended beats stale: a delivery of an ended task, of any attempt, hears
/// that the task is done (and is acked as such), whether it succeeded,
/// failed or was cancelled.
pub async fn a_claim_after_a_finish_answers_already_finished(store: &dyn Store) {
    let job = new_job(store, None).await;
    let session = SessionId::random();
    let outcomes = [TaskOutcome::Succeeded { report: "ok".into() }, TaskOutcome::Failed { error: "no".into() }];
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let t = task(job, session, &format!("toolu_{i}"));
        store.create_task(t.clone(), None).await.unwrap();
        assert!(matches!(store.claim_task(t.id, 1, "w1").await.unwrap(), Claim::Claimed { .. }));
        assert!(matches!(store.claim_task(t.id, 2, "w2").await.unwrap(), Claim::Claimed { .. }));
        let (done, _) = store.finish_task(t.id, 2, outcome, Usage::default()).await.unwrap();
        for attempt in [1, 2, 3] {
            assert_eq!(
                store.claim_task(t.id, attempt, "late").await.unwrap(),
                Claim::AlreadyFinished(done.clone()),
                "attempt {attempt} after a finish"
            );
        }
        let stale = store.finish_task(t.id, 1, TaskOutcome::Failed { error: "late".into() }, Usage::default()).await;
        assert!(matches!(stale, Err(StoreError::AlreadyFinished { .. })), "{stale:?}");
    }
    let pending = task(job, session, "toolu_cancelled");
    store.create_task(pending.clone(), None).await.unwrap();
    store.cancel_tasks(job, "stop").await.unwrap();
    let cancelled = store.get_task(pending.id).await.unwrap();
    assert_eq!(store.claim_task(pending.id, 1, "w").await.unwrap(), Claim::AlreadyFinished(cancelled));
    let events = store.events(job, 0, 1000).await.unwrap().len();
    store.claim_task(pending.id, 5, "w").await.unwrap();
    assert_eq!(store.events(job, 0, 1000).await.unwrap().len(), events, "a refused claim writes nothing");
}

/// A claim of an attempt not newer than the one holding the task is stale,
/// and says which attempt holds it; so is a finish or heartbeat from it.
pub async fn a_stale_claim_answers_superseded(store: &dyn Store) {
    let job = new_job(store, None).await;
    let t = task(job, SessionId::random(), "toolu_s");
    store.create_task(t.clone(), None).await.unwrap();
    let Claim::Claimed { task: held, events } = store.claim_task(t.id, 3, "w3").await.unwrap() else {
        panic!("a first claim may start past attempt 1 (a requeued task's base)")
    };
    assert_eq!((held.attempt, held.claimed_by.as_deref()), (3, Some("w3")));
    assert_eq!(held, store.get_task(t.id).await.unwrap(), "the claim answers the row as stored");
    assert!(matches!(&events[..], [e] if matches!(&e.kind, EventKind::TaskStarted { attempt: 3, .. })));
    for attempt in [1, 2, 3] {
        assert_eq!(
            store.claim_task(t.id, attempt, "late").await.unwrap(),
            Claim::Superseded { current_attempt: 3 },
            "attempt {attempt} after attempt 3"
        );
    }
    let after = store.get_task(t.id).await.unwrap();
    assert_eq!((after.attempt, after.claimed_by.as_deref()), (3, Some("w3")), "a refused claim changes nothing");
    let finish = store.finish_task(t.id, 2, TaskOutcome::Failed { error: "x".into() }, Usage::default()).await;
    assert!(matches!(finish, Err(StoreError::Superseded { attempt: 2, current_attempt: 3, .. })), "{finish:?}");
    let unclaimed = store.finish_task(t.id, 4, TaskOutcome::Failed { error: "x".into() }, Usage::default()).await;
    assert!(matches!(unclaimed, Err(StoreError::NotClaimed { attempt: 4, current_attempt: 3, .. })), "{unclaimed:?}");
    let queued = task(job, SessionId::random(), "toolu_q");
    store.create_task(queued.clone(), None).await.unwrap();
    let never = store.finish_task(queued.id, 0, TaskOutcome::Failed { error: "x".into() }, Usage::default()).await;
    assert!(matches!(never, Err(StoreError::NotClaimed { attempt: 0, current_attempt: 0, .. })), "{never:?}");
    assert!(!store.heartbeat_task(queued.id, 0).await.unwrap(), "a queued task does not beat");
    assert!(!store.heartbeat_task(TaskId::random(), 1).await.unwrap(), "nor does an unknown one");
    assert!(matches!(store.claim_task(TaskId::random(), 1, "w").await, Err(StoreError::NotFound(_))));
}

/// A claim and a finish racing on one task: whichever commits first, the
/// answers agree — the claim wins and the finish is superseded, or the finish
/// wins and the claim hears the task is done. A claim never answers
/// "superseded" because of a finish.
pub async fn a_claim_racing_a_finish_answers_consistently(store: &dyn Store) {
    let job = new_job(store, None).await;
    let session = SessionId::random();
    for i in 0..12 {
        let t = task(job, session, &format!("toolu_race_{i}"));
        store.create_task(t.clone(), None).await.unwrap();
        assert!(matches!(store.claim_task(t.id, 1, "w1").await.unwrap(), Claim::Claimed { .. }));
        let finish = store.finish_task(t.id, 1, TaskOutcome::Succeeded { report: "r".into() }, Usage::default());
        let claim = store.claim_task(t.id, 2, "w2");
        let (finished, claimed) = futures::join!(finish, claim);
        match (finished, claimed.unwrap()) {
            (Err(StoreError::Superseded { current_attempt: 2, .. }), Claim::Claimed { .. }) => {
                assert_eq!(store.get_task(t.id).await.unwrap().state, TaskState::Running);
            }
            (Ok((done, _)), Claim::AlreadyFinished(seen)) => {
                assert_eq!(done, seen);
                assert_eq!(store.get_task(t.id).await.unwrap().state, TaskState::Succeeded);
            }
            other => panic!("inconsistent answers: {other:?}"),
        }
    }
}

/// Cancelling a job's tasks ends every unfinished one, and reports them in
/// dispatch order (creation time, then task id) on every backend, with the
/// attempt each had reached.
pub async fn cancelled_tasks_are_reported_in_dispatch_order(store: &dyn Store) {
    let job = new_job(store, None).await;
    let session = SessionId::random();
    let mut ids = Vec::new();
    for i in 0..8 {
        let t = task(job, session, &format!("toolu_{i}"));
        store.create_task(t.clone(), None).await.unwrap();
        ids.push(t.id);
        if i % 3 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
    store.claim_task(ids[2], 2, "w").await.unwrap();
    store.claim_task(ids[5], 1, "w").await.unwrap();
    store.finish_task(ids[5], 1, TaskOutcome::Succeeded { report: "r".into() }, Usage::default()).await.unwrap();
    let mut open: Vec<Task> = store.tasks(job).await.unwrap().into_iter().filter(|t| !t.state.is_terminal()).collect();
    open.sort_by_key(|t| (t.created_at, t.id));
    let before = store.events(job, 0, 1000).await.unwrap().len();

    let written = store.cancel_tasks(job, "stop").await.unwrap();
    let reported: Vec<(TaskId, u32)> = written
        .events
        .iter()
        .map(|e| match &e.kind {
            EventKind::TaskFinished { task, attempt, succeeded: false, .. } => (*task, *attempt),
            other => panic!("not a cancelled task's event: {other:?}"),
        })
        .collect();
    assert_eq!(reported, open.iter().map(|t| (t.id, t.attempt)).collect::<Vec<_>>());
    let stored = store.events(job, before as i64, 1000).await.unwrap();
    assert_eq!(stored, written.events, "the events are stored as answered, in order");
    for t in store.tasks(job).await.unwrap() {
        let want = if t.id == ids[5] { TaskState::Succeeded } else { TaskState::Cancelled };
        assert_eq!(t.state, want, "{}", t.id);
    }
    assert!(store.cancel_tasks(job, "again").await.unwrap().events.is_empty(), "cancelling twice is a no-op");
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
pub async fn a_turn_and_its_calls_tasks_commit_together(store: &dyn Store) {
    let job = new_job(store, None).await;
    let session = coordinator_session(store, job).await;
    let existing = task(job, session, "toolu_0");
    store.create_task(existing.clone(), None).await.unwrap();
    let tasks: Vec<Task> = (0..3).map(|i| task(job, session, &format!("toolu_{i}"))).collect();
    let turn = Entry::new(job, session, None, EntryKind::Assistant, vec![ContentBlock::text("delegating")]);
    let event = EventKind::ToolCalled { session, tool: "Agent".into(), tool_use_id: "toolu_1".into() };
    let written = store
        .append(Batch { entries: vec![turn], events: vec![(job, event)], tasks: tasks.clone(), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(written.entry_seqs, vec![1]);
    assert_eq!(
        written.tasks.iter().map(|(t, c)| (t.id, *c)).collect::<Vec<_>>(),
        vec![(tasks[0].id, false), (tasks[1].id, true), (tasks[2].id, true)]
    );
    let kinds: Vec<String> = written
        .events
        .iter()
        .map(|e| match &e.kind {
            EventKind::ToolCalled { .. } => "called".to_string(),
            EventKind::TaskQueued { task, .. } => format!("queued {task}"),
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    assert_eq!(kinds, vec!["called".to_string(), format!("queued {}", tasks[1].id), format!("queued {}", tasks[2].id)]);
    let seqs: Vec<i64> = written.events.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "gapless: {seqs:?}");
    assert_eq!(store.tasks(job).await.unwrap().len(), 3);
    // A batch its fence refuses stores no row.
    let late = task(job, session, "toolu_9");
    let stale = crate::Fence { job, epoch: 99 };
    let refused = store.append(Batch { tasks: vec![late.clone()], fence: Some(stale), ..Default::default() }).await;
    assert!(matches!(refused, Err(StoreError::Fenced { .. })), "{refused:?}");
    assert!(matches!(store.get_task(late.id).await, Err(StoreError::NotFound(_))));
}

/// A coordinator's turn that creates tasks — fenced, with an entry, an
/// event, usage and the end of a task it was built on — is stored whole, or,
/// on a stale epoch, an end not stored as required or an entry of a session
/// that does not exist, not at all, with the error that says why; a row
/// already there (a turn written again) is reported as it is and not queued
/// again.
#[allow(clippy::too_many_lines)]
pub async fn a_fenced_turn_is_stored_whole_or_refused_whole(store: &dyn Store) {
    let job = new_job(store, None).await;
    let lease = store.acquire_lease(job, "coordinator-a", 60_000).await.unwrap().expect("a free lease");
    let session = coordinator_session(store, job).await;
    let done = task(job, session, "toolu_done");
    store.create_task(done.clone(), None).await.unwrap();
    store.claim_task(done.id, 1, "w1").await.unwrap();
    let report = TaskOutcome::Succeeded { report: "done".into() };
    store.finish_task(done.id, 1, report, Usage::default()).await.unwrap();
    let end = crate::TaskEnd { task: done.id, attempt: 1, state: TaskState::Succeeded };
    let usage = Usage { input_tokens: 5, output_tokens: 2, ..Default::default() };
    let turn = |fence: crate::Fence, tasks: Vec<Task>, requires: Vec<crate::TaskEnd>, session: SessionId| Batch {
        entries: vec![Entry::new(job, session, None, EntryKind::Assistant, vec![ContentBlock::text("delegating")])],
        events: vec![(job, EventKind::ToolCalled { session, tool: "Agent".into(), tool_use_id: "toolu_a".into() })],
        usage: Some((job, usage)),
        tasks,
        fence: Some(fence),
        requires,
        staged: None,
    };
    let events_before = store.events(job, 0, 1000).await.unwrap();
    let usage_before = store.get_job(job).await.unwrap().usage;
    let stale = crate::Fence { job, epoch: lease.epoch + 1 };
    let other_end = crate::TaskEnd { attempt: 2, ..end };
    for (batch, why) in [
        (turn(stale, vec![task(job, session, "toolu_a")], vec![end], session), "a stale epoch"),
        (turn(lease.fence(), vec![task(job, session, "toolu_a")], vec![other_end], session), "another end"),
        (turn(lease.fence(), vec![task(job, session, "toolu_a")], vec![end], SessionId::random()), "no session"),
    ] {
        let id = batch.tasks[0].id;
        let refused = store.append(batch).await;
        let said = match why {
            "a stale epoch" => {
                matches!(refused, Err(StoreError::Fenced { given, current, .. }) if given == current + 1)
            }
            "another end" => matches!(refused, Err(StoreError::Unconfirmed { .. })),
            _ => matches!(refused, Err(StoreError::NotFound(_))),
        };
        assert!(said, "{why}: {refused:?}");
        assert!(matches!(store.get_task(id).await, Err(StoreError::NotFound(_))), "{why}: no task row");
    }
    assert_eq!(store.events(job, 0, 1000).await.unwrap().len(), events_before.len(), "no event of a refused turn");
    assert!(store.entries(session, 0, 10).await.unwrap().is_empty(), "no entry of a refused turn");
    assert_eq!(store.get_job(job).await.unwrap().usage, usage_before, "no usage of a refused turn");

    let (first, second) = (task(job, session, "toolu_a"), task(job, session, "toolu_b"));
    let written = store.append(turn(lease.fence(), vec![first.clone(), second.clone()], vec![end], session)).await;
    let written = written.unwrap();
    assert_eq!(written.entry_seqs, vec![1]);
    assert_eq!(
        written.tasks.iter().map(|(t, created)| (t.id, t.state, *created)).collect::<Vec<_>>(),
        vec![(first.id, TaskState::Queued, true), (second.id, TaskState::Queued, true)]
    );
    let last = events_before.last().map_or(0, |e| e.seq);
    let kinds = |written: &crate::Written| -> Vec<(i64, String)> {
        written
            .events
            .iter()
            .map(|e| match &e.kind {
                EventKind::ToolCalled { .. } => (e.seq, "called".to_string()),
                EventKind::TaskQueued { task, .. } => (e.seq, format!("queued {task}")),
                other => panic!("unexpected event {other:?}"),
            })
            .collect()
    };
    assert_eq!(
        kinds(&written),
        vec![
            (last + 1, "called".to_string()),
            (last + 2, format!("queued {}", first.id)),
            (last + 3, format!("queued {}", second.id))
        ]
    );
    let total = store.get_job(job).await.unwrap().usage;
    assert_eq!(
        (total.input_tokens, total.output_tokens),
        (usage_before.input_tokens + 5, usage_before.output_tokens + 2)
    );

    // Written again with one more call: the row already there is reported
    // as it is and not queued again.
    let third = task(job, session, "toolu_c");
    let again = store.append(turn(lease.fence(), vec![first.clone(), third.clone()], vec![], session)).await.unwrap();
    assert_eq!(
        again.tasks.iter().map(|(t, created)| (t.id, *created)).collect::<Vec<_>>(),
        vec![(first.id, false), (third.id, true)]
    );
    assert_eq!(kinds(&again), vec![(last + 4, "called".to_string()), (last + 5, format!("queued {}", third.id))]);
    assert_eq!(again.entry_seqs, vec![2]);
    assert_eq!(store.tasks(job).await.unwrap().len(), 4);
}

/// A signal for a batch's [`crate::Staged`] callback, and its receiver: it
/// resolves when the backend stages the batch, or fails once the batch is
/// gone unstaged (a backend that never stages: the caller goes on after the
/// write).
fn staged_signal() -> (crate::Staged, tokio::sync::oneshot::Receiver<()>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tx = std::sync::Mutex::new(Some(tx));
    let staged = crate::Staged::new(move || {
        if let Some(tx) = tx.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(());
        }
    });
    (staged, rx)
}

/// A message may name a turn's task rows once the turn's write is staged:
/// a claim made then waits for that write and finds the row — never a
/// missing task. Its events follow the turn's.
pub async fn a_claim_waits_for_its_rows_commit(store: &dyn Store) {
    let job = new_job(store, None).await;
    let session = coordinator_session(store, job).await;
    let t = task(job, session, "toolu_early");
    let turn = Entry::new(job, session, None, EntryKind::Assistant, vec![ContentBlock::text("delegating")]);
    let events: Vec<_> = (0..20)
        .map(|i| (job, EventKind::ToolCalled { session, tool: "Agent".into(), tool_use_id: format!("toolu_{i}") }))
        .collect();
    let (staged, fired) = staged_signal();
    let batch =
        Batch { entries: vec![turn], events, tasks: vec![t.clone()], staged: Some(staged), ..Default::default() };
    let claim = async {
        let _ = fired.await;
        store.claim_task(t.id, 1, "w1").await
    };
    let (written, claim) = tokio::join!(store.append(batch), claim);
    let written = written.unwrap();
    let Ok(Claim::Claimed { events: started, .. }) = claim else { panic!("the claim found no row: {claim:?}") };
    let queued = written.events.iter().find(|e| matches!(e.kind, EventKind::TaskQueued { .. })).unwrap();
    assert!(started[0].seq > queued.seq, "the claim's event follows the turn's: {started:?}");
    // A staged write that does not commit leaves no row: the claim says so.
    let lost = task(job, session, "toolu_lost");
    let (staged, fired) = staged_signal();
    let stale = crate::Fence { job, epoch: 99 };
    let refused = store.append(Batch {
        tasks: vec![lost.clone()],
        fence: Some(stale),
        staged: Some(staged),
        ..Default::default()
    });
    let claim = async {
        let _ = fired.await;
        store.claim_task(lost.id, 1, "w1").await
    };
    let (refused, claim) = tokio::join!(refused, claim);
    assert!(matches!(refused, Err(StoreError::Fenced { .. })), "{refused:?}");
    assert!(matches!(claim, Err(StoreError::NotFound(_))), "{claim:?}");
}

/// A batch built on a task's end heard before its commit commits only if
/// the store holds that end — after the end's own write, when it is in
/// flight — and otherwise stores nothing and fails as retryable.
pub async fn a_batch_commits_only_on_the_ends_it_requires(store: &dyn Store) {
    // Without events, and with them: on Postgres the events statement is
    // the one that carries the `COMMIT`, so the refusal must come before it.
    for with_events in [false, true] {
        let job = new_job(store, None).await;
        let session = coordinator_session(store, job).await;
        let t = task(job, session, "toolu_req");
        store.create_task(t.clone(), None).await.unwrap();
        store.claim_task(t.id, 1, "w1").await.unwrap();
        let end = crate::TaskEnd { task: t.id, attempt: 1, state: TaskState::Succeeded };
        let result = |text: &str, requires: crate::TaskEnd| Batch {
            entries: vec![Entry::new(job, session, None, EntryKind::ToolResult, vec![ContentBlock::text(text)])],
            events: if with_events {
                vec![(job, EventKind::ToolCalled { session, tool: "Agent".into(), tool_use_id: text.into() })]
            } else {
                vec![]
            },
            requires: vec![requires],
            ..Default::default()
        };
        let events_before = store.events(job, 0, 1000).await.unwrap().len();
        let early = store.append(result("too early", end));
        assert!(matches!(early.await, Err(StoreError::Unconfirmed { .. })), "an end not stored is refused");
        assert!(store.entries(session, 0, 10).await.unwrap().is_empty(), "and nothing of the batch is stored");
        assert_eq!(store.events(job, 0, 1000).await.unwrap().len(), events_before);
        let (staged, fired) = staged_signal();
        let report = TaskOutcome::Succeeded { report: "done".into() };
        let finish = store.finish_task_with(
            t.id,
            1,
            report,
            Usage::default(),
            Batch { staged: Some(staged), ..Default::default() },
        );
        let after = async {
            let _ = fired.await;
            store.append(result("the report", end)).await
        };
        let (finished, after) = tokio::join!(finish, after);
        finished.unwrap();
        after.unwrap();
        assert_eq!(store.entries(session, 0, 10).await.unwrap().len(), 1);
        // Another attempt, or another end, is not the one required.
        for wrong in [
            crate::TaskEnd { attempt: 2, ..end },
            crate::TaskEnd { state: TaskState::Failed, ..end },
            crate::TaskEnd { task: TaskId::random(), ..end },
        ] {
            let refused = store.append(result("no", wrong));
            assert!(matches!(refused.await, Err(StoreError::Unconfirmed { .. })), "{wrong:?}");
        }
        assert_eq!(store.entries(session, 0, 10).await.unwrap().len(), 1);
        assert_eq!(store.settled_task(t.id).await.unwrap().state, TaskState::Succeeded);
    }
}

pub async fn a_claim_opens_the_attempts_session(store: &dyn Store) {
    let job = new_job(store, None).await;
    let t = task(job, SessionId::random(), "toolu_a");
    store.create_task(t.clone(), None).await.unwrap();
    let session = Session {
        id: t.id.session(),
        job_id: job,
        role: Role::Worker,
        label: "w".into(),
        task_id: Some(t.id),
        created_at: now_ms(),
    };
    let Claim::Claimed { events, .. } = store.claim_task_opening(t.id, 1, "w1", Some(session.clone())).await.unwrap()
    else {
        panic!("first claim")
    };
    assert!(matches!(events[0].kind, EventKind::TaskStarted { .. }), "{events:?}");
    assert!(matches!(events[1].kind, EventKind::SessionStarted { .. }), "{events:?}");
    assert_eq!(events[1].seq, events[0].seq + 1);
    assert_eq!(store.get_session(session.id).await.unwrap().task_id, Some(t.id));
    let Claim::Claimed { events, .. } = store.claim_task_opening(t.id, 2, "w2", Some(session.clone())).await.unwrap()
    else {
        panic!("redelivery")
    };
    assert_eq!(events.len(), 1, "the session exists already: only the claim's event");
    let other = task(job, SessionId::random(), "toolu_b");
    store.create_task(other.clone(), None).await.unwrap();
    store.claim_task(other.id, 2, "w").await.unwrap();
    let stale = Session { id: other.id.session(), task_id: Some(other.id), ..session };
    assert_eq!(
        store.claim_task_opening(other.id, 1, "late", Some(stale.clone())).await.unwrap(),
        Claim::Superseded { current_attempt: 2 }
    );
    assert!(matches!(store.get_session(stale.id).await, Err(StoreError::NotFound(_))), "a refused claim opens nothing");

    // A session stored before any claim of its task (flower opens one only
    // with a claim, but a store may hold one): the first claim, ending too,
    // finds it there and starts none.
    let early = task(job, SessionId::random(), "toolu_c");
    store.create_task(early.clone(), None).await.unwrap();
    store.create_session(worker_session(&early)).await.unwrap();
    let offer = EndOffer::default();
    let entry = Entry::new(job, early.id.session(), None, EntryKind::Assistant, vec![ContentBlock::text("done")]);
    let batch = Batch { entries: vec![entry], ..Default::default() };
    assert!(offer.offer(OfferedEnd {
        outcome: TaskOutcome::Succeeded { report: "done".into() },
        usage: Usage::default(),
        batch
    }));
    let (Claim::Claimed { events, .. }, Some((ended, written))) =
        store.claim_task_ending(early.id, 1, "w", Some(worker_session(&early)), &offer).await.unwrap()
    else {
        panic!("the first claim of a task whose session is there")
    };
    assert_eq!(events.len(), 1, "the claim's event only: {events:?}");
    assert_eq!((ended.state, written.entry_seqs.len()), (TaskState::Succeeded, 1));
    assert_eq!(store.entries(early.id.session(), 0, 10).await.unwrap().len(), 1);
}

fn worker_session(t: &Task) -> Session {
    Session {
        id: t.id.session(),
        job_id: t.job_id,
        role: Role::Worker,
        label: "w".into(),
        task_id: Some(t.id),
        created_at: now_ms(),
    }
}

/// An attempt whose end was offered before its claim held the row claims
/// and ends in one write (session, batch, end; events in that order, gapless),
/// and a batch requiring that end, heard once staged, commits after it. An
/// offer made after the claim decided is refused; a refused claim takes no end.
pub async fn an_attempt_claims_and_ends_in_one_write(store: &dyn Store) {
    let job = new_job(store, None).await;
    let coordinator = coordinator_session(store, job).await;
    let t = task(job, coordinator, "toolu_one");
    store.create_task(t.clone(), None).await.unwrap();
    let session = worker_session(&t);
    let sid = session.id;
    let usage = Usage { output_tokens: 7, ..Default::default() };
    let offered = |session: SessionId, staged: Option<crate::Staged>| OfferedEnd {
        outcome: TaskOutcome::Succeeded { report: "done".into() },
        usage,
        batch: Batch {
            entries: vec![Entry::new(job, session, None, EntryKind::Assistant, vec![ContentBlock::text("done")])],
            usage: Some((job, usage)),
            staged,
            ..Default::default()
        },
    };
    let (staged, fired) = staged_signal();
    let offer = EndOffer::default();
    assert!(offer.offer(offered(sid, Some(staged))));
    let claim = async move {
        let claimed = store.claim_task_ending(t.id, 1, "w1", Some(session), &offer).await;
        // The staged signal goes with the offer: a backend that never stages
        // lets the requiring batch go once the claim is over.
        drop(offer);
        claimed
    };
    let end = crate::TaskEnd { task: t.id, attempt: 1, state: TaskState::Succeeded };
    let result = Entry::new(job, coordinator, None, EntryKind::ToolResult, vec![ContentBlock::text("done")]);
    let requiring = async {
        let _ = fired.await;
        store.append(Batch { entries: vec![result], requires: vec![end], ..Default::default() }).await
    };
    let (claim, requiring) = tokio::join!(claim, requiring);
    let (Claim::Claimed { events: opened, .. }, Some((ended, written))) = claim.unwrap() else {
        panic!("the offered end was not taken")
    };
    requiring.expect("a batch requiring the end commits after it");
    assert!(matches!(opened[0].kind, EventKind::TaskStarted { .. }), "{opened:?}");
    assert!(matches!(opened[1].kind, EventKind::SessionStarted { .. }), "{opened:?}");
    assert!(matches!(written.events.last().unwrap().kind, EventKind::TaskFinished { .. }), "{written:?}");
    let seqs: Vec<i64> = opened.iter().chain(&written.events).map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "gapless, claim first: {seqs:?}");
    assert_eq!((ended.state, ended.attempt, ended.report.as_deref()), (TaskState::Succeeded, 1, Some("done")));
    assert_eq!(store.get_task(t.id).await.unwrap(), ended);
    let entries = store.entries(sid, 0, 10).await.unwrap();
    assert_eq!((entries.len(), written.entry_seqs.len()), (1, 1), "{entries:?}");
    assert_eq!(store.get_job(job).await.unwrap().usage.output_tokens, 7);

    // Decided before the offer: the claim alone; the offer is refused.
    let u = task(job, coordinator, "toolu_two");
    store.create_task(u.clone(), None).await.unwrap();
    let offer = EndOffer::default();
    let (claim, none) = store.claim_task_ending(u.id, 1, "w1", Some(worker_session(&u)), &offer).await.unwrap();
    assert!(matches!(claim, Claim::Claimed { .. }) && none.is_none(), "{claim:?}");
    assert!(!offer.offer(offered(u.id.session(), None)), "an offer after the decision is refused");
    assert_eq!(store.get_task(u.id).await.unwrap().state, TaskState::Running);

    // A refused claim takes no end.
    let v = task(job, coordinator, "toolu_three");
    store.create_task(v.clone(), None).await.unwrap();
    store.claim_task(v.id, 2, "w2").await.unwrap();
    let offer = EndOffer::default();
    assert!(offer.offer(offered(v.id.session(), None)));
    let (claim, none) = store.claim_task_ending(v.id, 1, "late", Some(worker_session(&v)), &offer).await.unwrap();
    assert_eq!((claim, none.is_none()), (Claim::Superseded { current_attempt: 2 }, true));
    let stored = store.get_task(v.id).await.unwrap();
    assert_eq!((stored.state, stored.attempt), (TaskState::Running, 2));
    assert!(matches!(store.get_session(v.id.session()).await, Err(StoreError::NotFound(_))), "nor its session");

    // Many attempts of one job claim and end at once: each write opens a
    // session before it adds usage to the job; none deadlocks with another.
    let many: Vec<Task> = (0..16).map(|i| task(job, coordinator, &format!("toolu_many_{i}"))).collect();
    store.create_tasks(many.clone(), None).await.unwrap();
    let ends = many.iter().map(|t| async move {
        let offer = EndOffer::default();
        assert!(offer.offer(offered(t.id.session(), None)));
        store.claim_task_ending(t.id, 1, "w1", Some(worker_session(t)), &offer).await
    });
    for (t, end) in many.iter().zip(futures::future::join_all(ends).await) {
        let (claim, ended) = end.unwrap_or_else(|e| panic!("task {}: {e}", t.id));
        assert!(matches!(claim, Claim::Claimed { .. }) && ended.is_some(), "{claim:?}");
    }
    assert_eq!(store.get_job(job).await.unwrap().usage.output_tokens, 7 * 17);
}

#[allow(clippy::too_many_lines)]
pub async fn claims_are_written_together(store: &dyn Store) {
    let (job, other) = (new_job(store, None).await, new_job(store, None).await);
    let coordinator = coordinator_session(store, job).await;
    let offered = |t: &Task, tokens: u64, staged: Option<crate::Staged>| {
        let usage = Usage { output_tokens: tokens, ..Default::default() };
        let offer = EndOffer::default();
        assert!(offer.offer(OfferedEnd {
            outcome: TaskOutcome::Succeeded { report: format!("report of {}", t.tool_use_id) },
            usage,
            batch: Batch {
                entries: vec![
                    Entry::new(t.job_id, t.id.session(), None, EntryKind::User, vec![ContentBlock::text("go")]),
                    Entry::new(t.job_id, t.id.session(), None, EntryKind::Assistant, vec![ContentBlock::text("ok")]),
                ],
                usage: Some((t.job_id, usage)),
                staged,
                ..Default::default()
            },
        }));
        offer
    };
    let claim = |t: &Task, attempt: u32, end: EndOffer| crate::ClaimRequest {
        task: t.id,
        attempt,
        worker_id: "w1".into(),
        session: Some(worker_session(t)),
        end,
    };
    let (a, b, c, e) = (
        task(job, coordinator, "toolu_a"),
        task(job, coordinator, "toolu_b"),
        task(job, coordinator, "toolu_c"),
        task(other, SessionId::random(), "toolu_e"),
    );
    store.create_tasks(vec![a.clone(), b.clone(), c.clone()], None).await.unwrap();
    store.create_task(e.clone(), None).await.unwrap();
    store.claim_task(c.id, 2, "w2").await.unwrap();
    let missing = task(job, coordinator, "toolu_missing");
    let (staged, fired) = staged_signal();
    let b_offer = EndOffer::default();
    let group = [
        claim(&a, 1, offered(&a, 5, Some(staged))),
        claim(&b, 1, b_offer.clone()),
        claim(&c, 1, offered(&c, 100, None)),
        claim(&missing, 1, EndOffer::default()),
        claim(&e, 1, offered(&e, 11, None)),
        // The same delivery twice: the second finds the first's end.
        claim(&a, 1, offered(&a, 1000, None)),
    ];
    let answers = store.claim_tasks_ending(&group).await.expect("the group's write");
    assert_eq!(answers.len(), group.len());
    // The staged signal fired, or went with the offers (a backend that never stages).
    drop(group);
    let _ = fired.await;
    let mut answers = answers.into_iter();
    let mut next = || answers.next().unwrap();

    let (Claim::Claimed { events: a_claim, .. }, Some((a_ended, a_written))) = next().unwrap() else {
        panic!("a: its end was not taken")
    };
    assert_eq!((a_ended.state, a_ended.report.as_deref()), (TaskState::Succeeded, Some("report of toolu_a")));
    assert_eq!(a_written.entry_seqs, vec![1, 2]);
    assert!(matches!(a_claim[0].kind, EventKind::TaskStarted { .. }), "{a_claim:?}");
    assert!(matches!(a_claim[1].kind, EventKind::SessionStarted { .. }), "{a_claim:?}");
    assert!(matches!(a_written.events.last().unwrap().kind, EventKind::TaskFinished { .. }), "{a_written:?}");

    let (Claim::Claimed { task: b_task, events: b_claim }, None) = next().unwrap() else { panic!("b: not claimed") };
    assert_eq!(b_task.state, TaskState::Running);
    assert_eq!(b_claim.len(), 2, "its start and its session's: {b_claim:?}");
    assert!(!b_offer.offer(offered(&b, 1, None).decide().unwrap()), "decided without an end");

    let (superseded, none) = next().unwrap();
    assert_eq!((superseded, none.is_none()), (Claim::Superseded { current_attempt: 2 }, true));
    assert!(matches!(next(), Err(StoreError::NotFound(_))), "a task with no row is that claim's answer");

    let (Claim::Claimed { events: e_claim, .. }, Some((_, e_written))) = next().unwrap() else {
        panic!("e: its end was not taken")
    };
    assert_eq!(next().unwrap().0, Claim::AlreadyFinished(a_ended.clone()));

    // Each job's events as stored: gapless, each claim's in its own order.
    let stored = store.events(job, 0, 100).await.unwrap();
    let mine: Vec<&flower_model::Event> = stored.iter().filter(|ev| ev.seq > a_claim[0].seq - 1).collect();
    let ours: Vec<&flower_model::Event> = a_claim.iter().chain(&a_written.events).chain(&b_claim).collect();
    assert_eq!(mine, ours, "the job's events are the group's, claim by claim");
    let theirs = store.events(other, 0, 100).await.unwrap();
    assert_eq!(theirs[theirs.len() - e_claim.len() - e_written.events.len()..].to_vec(), {
        let mut v = e_claim.clone();
        v.extend(e_written.events.clone());
        v
    });
    assert_eq!(store.get_job(job).await.unwrap().usage.output_tokens, 5);
    assert_eq!(store.get_job(other).await.unwrap().usage.output_tokens, 11);
    assert_eq!(store.entries(a.id.session(), 0, 10).await.unwrap().len(), 2);
    assert_eq!(store.entries(e.id.session(), 0, 10).await.unwrap().len(), 2);
    assert_eq!(store.get_task(a.id).await.unwrap(), a_ended);
    assert_eq!(store.get_task(b.id).await.unwrap(), b_task);
    let c_stored = store.get_task(c.id).await.unwrap();
    assert_eq!((c_stored.state, c_stored.attempt), (TaskState::Running, 2));

    // A refusal of one end fails the group: nothing of it is stored.
    let (f, g) = (task(job, coordinator, "toolu_f"), task(job, coordinator, "toolu_g"));
    store.create_tasks(vec![f.clone(), g.clone()], None).await.unwrap();
    let fenced = offered(&g, 1, None);
    let mut end = fenced.decide().unwrap();
    end.batch.fence = Some(crate::Fence { job, epoch: 99 });
    let fenced = EndOffer::default();
    assert!(fenced.offer(end));
    let before = store.events(job, 0, 1000).await.unwrap().len();
    let group = [claim(&f, 1, EndOffer::default()), claim(&g, 1, fenced)];
    assert!(store.claim_tasks_ending(&group).await.is_err(), "a fenced end fails the group");
    assert_eq!(store.events(job, 0, 1000).await.unwrap().len(), before);
    assert_eq!(store.get_task(f.id).await.unwrap().state, TaskState::Queued, "f's claim went with it");
}

pub async fn a_final_batch_lands_with_the_end_or_not_at_all(store: &dyn Store) {
    let job = new_job(store, None).await;
    let t = task(job, SessionId::random(), "toolu_a");
    store.create_task(t.clone(), None).await.unwrap();
    let sid = t.id.session();
    let session = Session {
        id: sid,
        job_id: job,
        role: Role::Worker,
        label: "w".into(),
        task_id: Some(t.id),
        created_at: now_ms(),
    };
    store.claim_task_opening(t.id, 1, "w1", Some(session)).await.unwrap();
    store.claim_task(t.id, 2, "w2").await.unwrap();
    let answer = |text: &str| Entry::new(job, sid, None, EntryKind::Assistant, vec![ContentBlock::text(text)]);
    let usage = Usage { output_tokens: 5, ..Default::default() };
    // A row made by the final turn's call lands with the end too.
    let child = task(job, sid, "toolu_child");
    let batch = |text: &str| Batch {
        entries: vec![answer(text)],
        events: vec![(job, EventKind::Spill { session: sid, tool: "Bash".into(), path: "p".into(), chars: 1 })],
        usage: Some((job, usage)),
        fence: None,
        tasks: vec![child.clone()],
        requires: vec![],
        staged: None,
    };
    let stale =
        store.finish_task_with(t.id, 1, TaskOutcome::Succeeded { report: "old".into() }, usage, batch("old")).await;
    assert!(matches!(stale, Err(StoreError::Superseded { .. })), "{stale:?}");
    assert!(store.entries(sid, 0, 10).await.unwrap().is_empty(), "a refused end stores none of its batch");
    assert_eq!(store.get_job(job).await.unwrap().usage.output_tokens, 0, "nor its usage");
    assert!(matches!(store.get_task(child.id).await, Err(StoreError::NotFound(_))), "nor its task rows");
    let (done, written) = store
        .finish_task_with(t.id, 2, TaskOutcome::Succeeded { report: "new".into() }, usage, batch("new"))
        .await
        .unwrap();
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(written.entry_seqs, vec![1]);
    assert!(matches!(written.events[0].kind, EventKind::Spill { .. }), "the batch's events first");
    assert!(matches!(written.events[1].kind, EventKind::TaskQueued { task, .. } if task == child.id), "its rows'");
    assert!(matches!(written.events[2].kind, EventKind::TaskFinished { .. }), "then the end");
    assert_eq!(written.events[2].seq, written.events[0].seq + 2);
    assert_eq!(written.tasks.iter().map(|(t, c)| (t.id, *c)).collect::<Vec<_>>(), vec![(child.id, true)]);
    let stored = store.entries(sid, 0, 10).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].text(), "new");
    assert_eq!(store.get_job(job).await.unwrap().usage.output_tokens, 5, "the turn's usage counted once");
    assert_eq!(store.get_task(t.id).await.unwrap().usage.output_tokens, 5);
}

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
