#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use flower_model::{SessionId, TaskOutcome};

use super::*;

fn task() -> Task {
    Task::queued(JobId::random(), SessionId::random(), "toolu_1", "w", "d", "m")
}

fn claimed(t: &Task, attempt: u32) -> Task {
    match claim(t, attempt, "w", 1) {
        ClaimDecision::Take(c) => c.task,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_claim_takes_a_newer_attempt_and_refuses_the_rest() {
    let t = task();
    let one = claimed(&t, 1);
    assert_eq!((one.state, one.attempt, one.claimed_by.as_deref()), (TaskState::Running, 1, Some("w")));
    assert_eq!(claim(&one, 1, "x", 2), ClaimDecision::Answer(Claim::Superseded { current_attempt: 1 }));
    let two = claimed(&one, 3);
    assert_eq!(claim(&two, 2, "x", 2), ClaimDecision::Answer(Claim::Superseded { current_attempt: 3 }));
    let done = finish(&two, 3, TaskOutcome::Succeeded { report: "r".into() }, Usage::default(), 3).unwrap().task;
    // Ended beats stale: even an older attempt hears that the task is done.
    for attempt in [1, 3, 4] {
        assert_eq!(claim(&done, attempt, "x", 4), ClaimDecision::Answer(Claim::AlreadyFinished(done.clone())));
    }
}

#[test]
fn only_the_holding_attempt_finishes_once() {
    let t = claimed(&claimed(&task(), 1), 2);
    let ok = TaskOutcome::Succeeded { report: "r".into() };
    assert!(matches!(
        finish(&t, 1, ok.clone(), Usage::default(), 5),
        Err(StoreError::Superseded { attempt: 1, current_attempt: 2, .. })
    ));
    assert!(matches!(finish(&t, 3, ok.clone(), Usage::default(), 5), Err(StoreError::NotClaimed { .. })));
    assert!(matches!(finish(&task(), 0, ok.clone(), Usage::default(), 5), Err(StoreError::NotClaimed { .. })));
    let usage = Usage { input_tokens: 3, ..Default::default() };
    let done = finish(&t, 2, TaskOutcome::Failed { error: "e".into() }, usage, 5).unwrap();
    assert_eq!((done.task.state, done.task.error.as_deref(), done.task.updated_at), (TaskState::Failed, Some("e"), 5));
    assert_eq!(done.event, EventKind::TaskFinished { task: t.id, attempt: 2, succeeded: false, usage });
    assert!(matches!(
        finish(&done.task, 2, ok, usage, 6),
        Err(StoreError::AlreadyFinished { state: TaskState::Failed, .. })
    ));
}

#[test]
fn heartbeats_only_from_the_running_attempt() {
    let t = claimed(&task(), 2);
    assert_eq!(heartbeat(&t, 2, 9).map(|t| t.updated_at), Some(9));
    assert!(heartbeat(&t, 1, 9).is_none());
    assert!(heartbeat(&task(), 0, 9).is_none(), "a queued task is not running");
}

#[test]
fn cancels_come_in_dispatch_order_and_skip_ended_tasks() {
    let job = JobId::random();
    let session = SessionId::random();
    let mut tasks: Vec<Task> =
        (0..6).map(|i| Task::queued(job, session, &format!("toolu_{i}"), "w", "d", "m")).collect();
    for (i, t) in tasks.iter_mut().enumerate() {
        t.created_at = 100 - (i as i64 % 3);
    }
    tasks[0] =
        finish(&claimed(&tasks[0], 1), 1, TaskOutcome::Failed { error: "x".into() }, Usage::default(), 1).unwrap().task;
    tasks[1] = claimed(&tasks[1], 4);
    let changes = cancel(&tasks, "stop", 7);
    let mut want: Vec<&Task> = tasks[1..].iter().collect();
    want.sort_by_key(|t| (t.created_at, t.id));
    assert_eq!(changes.iter().map(|c| c.task.id).collect::<Vec<_>>(), want.iter().map(|t| t.id).collect::<Vec<_>>());
    let mut reversed = tasks.clone();
    reversed.reverse();
    assert_eq!(cancel(&reversed, "stop", 7), changes, "the load order does not matter");
    let running = changes.iter().find(|c| c.task.id == tasks[1].id).unwrap();
    assert_eq!(
        running.event,
        EventKind::TaskFinished { task: tasks[1].id, attempt: 4, succeeded: false, usage: Usage::default() }
    );
    assert!(changes.iter().all(|c| c.task.state == TaskState::Cancelled && c.task.error.as_deref() == Some("stop")));
}

#[test]
fn leases_are_taken_kept_and_lost_by_epoch() {
    let job = JobId::random();
    let a = acquire_lease(None, job, "a", 10, 100).unwrap();
    assert_eq!((a.epoch, a.expires_at), (1, 110));
    assert!(acquire_lease(Some(&a), job, "b", 50, 100).is_none(), "a live lease is not taken");
    assert_eq!(acquire_lease(Some(&a), job, "a", 50, 100).map(|l| l.epoch), Some(1), "its owner keeps it");
    let b = acquire_lease(Some(&a), job, "b", 111, 100).unwrap();
    assert_eq!((b.owner.as_str(), b.epoch), ("b", 2));
    assert!(renew_lease(Some(&b), &a, 120, 100).is_none(), "the old owner lost it");
    assert_eq!(renew_lease(Some(&b), &b, 500, 100).map(|l| l.expires_at), Some(600), "even past expiry");
    assert_eq!(release_lease(Some(&b), &b).map(|l| l.expires_at), Some(0));
    assert!(release_lease(None, &b).is_none());
}

#[test]
fn an_ended_job_stays_ended_and_keeps_its_answer() {
    let mut job = Job {
        id: JobId::random(),
        name: "n".into(),
        state: JobState::Running,
        reason: None,
        spec: serde_json::json!({}),
        final_answer: Some("42".into()),
        idempotency_key: None,
        usage: Usage::default(),
        created_at: 0,
        updated_at: 0,
        continues: None,
        namespace: "default".into(),
        submitted_by: None,
    };
    let done = set_job_state(&job, JobState::Succeeded, None, None, 3).unwrap();
    assert_eq!(done.job.final_answer.as_deref(), Some("42"));
    job.state = JobState::Cancelled;
    assert!(matches!(
        set_job_state(&job, JobState::Running, None, None, 4),
        Err(StoreError::JobEnded { state: JobState::Cancelled, .. })
    ));
    let fence = Fence { job: job.id, epoch: 2 };
    assert!(check_fence(fence, 2).is_ok());
    assert!(matches!(check_fence(fence, 3), Err(StoreError::Fenced { given: 2, current: 3, .. })));
    assert!(matches!(check_fence(fence, 0), Err(StoreError::Fenced { current: 0, .. })), "no lease, no owner");
}

/// A claim of `task` by attempt `attempt`, naming `session`, with `end` offered.
fn request(task: &Task, attempt: u32, session: Option<&Session>, end: Option<OfferedEnd>) -> ClaimRequest {
    let offer = crate::EndOffer::default();
    if let Some(end) = end {
        assert!(offer.offer(end));
    }
    ClaimRequest { task: task.id, attempt, worker_id: "w".into(), session: session.cloned(), end: offer }
}

fn session(job: JobId) -> Session {
    Session {
        id: SessionId::random(),
        job_id: job,
        role: flower_model::Role::Worker,
        label: "x".into(),
        task_id: None,
        created_at: 1,
    }
}

fn entry(session: &Session) -> Entry {
    Entry::new(session.job_id, session.id, None, flower_model::EntryKind::Assistant, vec![])
}

/// A successful end, with a batch of `entries` entries of `session`, one event, some usage.
fn offered(session: &Session, entries: usize, fence: Option<Fence>) -> OfferedEnd {
    let usage = Usage { output_tokens: 3, ..Default::default() };
    let batch = Batch {
        entries: (0..entries).map(|_| entry(session)).collect(),
        events: vec![(session.job_id, EventKind::JobState { state: JobState::Running, reason: Some("turn".into()) })],
        usage: Some((session.job_id, usage)),
        fence,
        ..Default::default()
    };
    OfferedEnd { outcome: TaskOutcome::Succeeded { report: "r".into() }, usage, batch }
}

fn rows(tasks: &[&Task]) -> HashMap<TaskId, Task> {
    tasks.iter().map(|t| (t.id, (*t).clone())).collect()
}

/// The group's claims decided, each offer asked through [`crate::EndOffer::decide`].
fn decide(tasks: &[&Task], claims: &[ClaimRequest]) -> GroupDecision {
    claim_group(rows(tasks), claims, 7, |c| c.end.decide())
}

fn taken(claim: &GroupClaim) -> (&TaskChange, Option<&Session>, Option<&TakenEnd>, usize) {
    match claim {
        GroupClaim::Taken { claim, opens, end, entries } => (claim, opens.as_ref(), end.as_ref(), *entries),
        other => panic!("not taken: {other:?}"),
    }
}

#[test]
fn an_end_is_asked_for_only_once_the_claim_takes_the_task() {
    let t = task();
    let s = session(t.job_id);
    let asked = std::cell::Cell::new(0);
    let offer = || {
        asked.set(asked.get() + 1);
        Some(offered(&s, 1, None))
    };
    let running = claimed(&t, 2);
    assert!(matches!(claim_ending(&running, 2, "x", 5, offer), ClaimEnding::Answer(Claim::Superseded { .. })));
    let done = finish(&running, 2, TaskOutcome::Failed { error: "e".into() }, Usage::default(), 5).unwrap().task;
    assert!(matches!(claim_ending(&done, 3, "x", 5, offer), ClaimEnding::Answer(Claim::AlreadyFinished(_))));
    assert_eq!(asked.get(), 0, "a claim not taken leaves the offer alone");
    let ClaimEnding::Take { claim, end: Some(end) } = claim_ending(&t, 1, "x", 5, offer) else { panic!("taken") };
    assert_eq!(asked.get(), 1);
    assert_eq!((claim.task.state, claim.task.attempt), (TaskState::Running, 1));
    assert_eq!(
        (end.change.task.state, end.change.task.attempt, end.change.task.updated_at),
        (TaskState::Succeeded, 1, 5)
    );
    assert_eq!(
        end.change.event,
        EventKind::TaskFinished { task: t.id, attempt: 1, succeeded: true, usage: end.change.task.usage }
    );
    assert_eq!(end.batch.entries.len(), 1, "the batch goes with the end");
    assert!(matches!(claim_ending(&t, 1, "x", 5, || None), ClaimEnding::Take { end: None, .. }), "no offer, no end");
}

#[test]
fn a_group_decides_each_claim_on_the_row_the_claims_before_it_left() {
    let (a, b) = (task(), task());
    let s = session(a.job_id);
    let claims = [
        request(&a, 1, None, None),
        request(&a, 1, None, None),
        request(&a, 2, None, Some(offered(&s, 0, None))),
        request(&a, 3, None, None),
        request(&b, 1, None, None),
    ];
    let group = decide(&[&a, &b], &claims);
    assert_eq!(taken(&group.claims[0]).0.task.attempt, 1);
    assert!(
        matches!(group.claims[1], GroupClaim::Answered(Claim::Superseded { current_attempt: 1 })),
        "the same attempt again is stale: the first claim took it"
    );
    let (_, _, end, _) = taken(&group.claims[2]);
    let ended = end.expect("the end offered is taken").change.task.clone();
    assert_eq!(ended.state, TaskState::Succeeded);
    assert!(
        matches!(&group.claims[3], GroupClaim::Answered(Claim::AlreadyFinished(row)) if *row == ended),
        "a later attempt finds the task ended by the one before it"
    );
    assert_eq!(taken(&group.claims[4]).0.task.id, b.id);
    // Each row written once, as the last claim left it, in the order first taken.
    assert_eq!(group.rows, vec![ended, taken(&group.claims[4]).0.task.clone()]);
}

#[test]
fn a_group_finds_no_row_and_asks_no_end_of_a_missing_task() {
    let (a, gone) = (task(), task());
    let s = session(a.job_id);
    let claims = [request(&gone, 1, Some(&s), Some(offered(&s, 2, None))), request(&a, 1, None, None)];
    let group = decide(&[&a], &claims);
    assert!(matches!(group.claims[0], GroupClaim::Missing(id) if id == gone.id));
    assert!(claims[0].end.is_made(), "the missing task's offer is still open");
    assert!(group.sessions().is_empty() && group.entries.is_empty());
    assert_eq!(group.rows.len(), 1);
}

#[test]
fn a_session_is_opened_by_the_first_claim_taking_its_task() {
    let (a, b, c) = (task(), task(), task());
    let s = session(a.job_id);
    let stale = claimed(&a, 5);
    let claims = [request(&stale, 1, Some(&s), None), request(&b, 1, Some(&s), None), request(&c, 1, Some(&s), None)];
    let group = decide(&[&stale, &b, &c], &claims);
    assert!(matches!(group.claims[0], GroupClaim::Answered(_)), "a claim not taken opens nothing");
    assert_eq!(taken(&group.claims[1]).1, Some(&s));
    assert_eq!(taken(&group.claims[2]).1, None, "opened once");
    assert_eq!(group.sessions(), vec![&s]);
}

#[test]
fn a_group_gathers_its_ends_fences_required_ends_and_entries_in_claim_order() {
    let (a, b, c) = (task(), task(), task());
    let (s, t) = (session(a.job_id), session(a.job_id));
    let fence = Fence { job: a.job_id, epoch: 3 };
    let required = TaskEnd { task: c.id, attempt: 1, state: TaskState::Succeeded };
    let mut with_required = offered(&t, 1, Some(fence));
    with_required.batch.requires.push(required);
    let claims = [request(&a, 1, None, Some(offered(&s, 2, Some(fence)))), request(&b, 1, None, Some(with_required))];
    let group = decide(&[&a, &b], &claims);
    assert_eq!(group.fences, vec![fence], "each fence once");
    assert_eq!(group.required, vec![required]);
    let sessions: Vec<SessionId> = group.entries.iter().map(|e| e.session_id).collect();
    assert_eq!(sessions, vec![s.id, s.id, t.id], "the ends' entries, end after end");
    assert_eq!((taken(&group.claims[0]).3, taken(&group.claims[1]).3), (2, 1));
    assert!(group.ends().all(|end| end.batch.entries.is_empty()), "moved out of their batches");
    assert_eq!(group.ends().count(), 2);
}

/// Number `events` as the job rows' counters do (per job, in list order,
/// from `next`), handed back shuffled.
fn number(events: &[(JobId, EventKind)], next: &mut HashMap<JobId, i64>) -> Vec<Event> {
    let mut out: Vec<Event> = events
        .iter()
        .map(|(job, kind)| {
            let seq = next.entry(*job).or_insert(0);
            *seq += 1;
            Event { job_id: *job, seq: *seq, at: 0, kind: kind.clone() }
        })
        .collect();
    out.reverse();
    out
}

#[test]
fn each_claims_events_come_in_the_order_its_own_write_has_them() {
    let a = task();
    let other = Task::queued(JobId::random(), SessionId::random(), "toolu_2", "w", "d", "m");
    let (s, opened_elsewhere) = (session(a.job_id), session(other.job_id));
    let child = Task::queued(a.job_id, s.id, "toolu_child", "w", "d", "m");
    let mut end = offered(&s, 3, None);
    end.batch.tasks.push(child.clone());
    let claims = [request(&a, 1, Some(&s), Some(end)), request(&other, 1, Some(&opened_elsewhere), None)];
    let group = decide(&[&a, &other], &claims);
    let ended = group.ends().next().unwrap().change.clone();
    let inserted = EndTasks { tasks: vec![(child.clone(), true)], queued: vec![(a.job_id, task_queued(&child))] };
    // Only `s` was created by the group's insert: the other session was there.
    let opened: HashSet<SessionId> = [s.id].into();
    let written = group_events(group.claims, &opened, vec![inserted], vec![4, 5, 6]);
    let kinds: Vec<&str> = written.events.iter().map(|(_, k)| k.name()).collect();
    assert_eq!(
        kinds,
        ["task_started", "session_started", "job_state", "task_queued", "task_finished", "task_started"],
        "the claim's, its session's, its batch's, its new tasks', its end's; then the next claim's"
    );
    assert_eq!(written.events[4], (a.job_id, ended.event));
    assert_eq!(written.usage, vec![(a.job_id, Usage { output_tokens: 3, ..Default::default() })]);
    let Unnumbered::Taken { jobs, claimed, end: Some((task, seqs, tasks)), .. } = &written.claims[0] else {
        panic!("taken with its end")
    };
    assert_eq!((jobs.len(), *claimed), (5, 2));
    assert_eq!(
        (task.state, seqs.as_slice(), tasks.as_slice()),
        (TaskState::Succeeded, &[4, 5, 6][..], &[(child, true)][..])
    );
    assert!(
        matches!(&written.claims[1], Unnumbered::Taken { jobs, claimed: 1, end: None, .. } if jobs == &[other.job_id])
    );
}

#[test]
fn numbered_events_go_back_to_their_claims_as_each_alone_would_have_them() {
    let job = JobId::random();
    let (a, b, c) = (
        Task::queued(job, SessionId::random(), "toolu_a", "w", "d", "m"),
        Task::queued(job, SessionId::random(), "toolu_b", "w", "d", "m"),
        Task::queued(JobId::random(), SessionId::random(), "toolu_c", "w", "d", "m"),
    );
    let s = session(job);
    let gone = task();
    let claims = [
        request(&a, 1, None, Some(offered(&s, 1, None))),
        request(&gone, 1, None, None),
        request(&c, 1, None, None),
        request(&b, 1, None, None),
        request(&b, 1, None, None),
    ];
    let group = decide(&[&a, &b, &c], &claims);
    let written = group_events(group.claims, &HashSet::new(), vec![EndTasks::default()], vec![9]);
    let mut next: HashMap<JobId, i64> = [(job, 10)].into();
    let numbered = number(&written.events, &mut next);
    let answers = answer_group(written.claims, numbered).unwrap();
    assert_eq!(answers.len(), 5);
    let (claim, end) = answers[0].as_ref().unwrap();
    let Claim::Claimed { events, .. } = claim else { panic!("claimed") };
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [11]);
    let (_, end) = end.as_ref().unwrap();
    assert_eq!(
        end.events.iter().map(|e| (e.seq, e.kind.name())).collect::<Vec<_>>(),
        [(12, "job_state"), (13, "task_finished")]
    );
    assert_eq!(end.entry_seqs, [9]);
    assert!(matches!(&answers[1], Err(StoreError::NotFound(what)) if what == &format!("task {}", gone.id)));
    let seqs = |i: usize| match answers[i].as_ref().unwrap() {
        (Claim::Claimed { task, events }, None) => {
            (task.id, events.iter().map(|e| (e.job_id, e.seq)).collect::<Vec<_>>())
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(seqs(2), (c.id, vec![(c.job_id, 1)]), "another job numbers from its own counter");
    assert_eq!(seqs(3), (b.id, vec![(job, 14)]), "after the claims before it in the same job");
    assert!(matches!(answers[4].as_ref().unwrap(), (Claim::Superseded { current_attempt: 1 }, None)));
}

#[test]
fn a_claim_whose_events_were_not_numbered_fails_the_group() {
    let a = task();
    let group = decide(&[&a], &[request(&a, 1, None, None)]);
    let written = group_events(group.claims, &HashSet::new(), vec![], vec![]);
    assert!(matches!(answer_group(written.claims, vec![]), Err(StoreError::Backend { .. })));
}
