//! Conformance checks of tasks: attempts and their fencing, claims, ends,
//! the writes that create tasks with the turn that calls them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use flower_model::{
    ContentBlock, Entry, EntryKind, EventKind, Role, Session, SessionId, Task, TaskId, TaskOutcome, TaskState, Usage,
    now_ms,
};

use crate::{Batch, Claim, EndOffer, OfferedEnd, Store, StoreError};

use super::{coordinator_session, new_job, task};

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
