//! The rules both backends keep, written once: what a claim, a finish, a
//! heartbeat or a cancel of tasks decides, how a job moves between states,
//! when a lease is taken, renewed or given up, and when a fenced write is
//! refused (docs/design.md sections 2 to 4).
//!
//! Every function here is pure: it takes the rows as the backend loaded them
//! (inside the writing transaction, locked where the backend locks) and the
//! request, and returns what to write — whole rows, with the events reporting
//! them — or what to answer without writing. A backend only runs SQL around
//! these decisions: load, decide, store the returned rows, number the events.

use flower_model::{EventKind, Job, JobId, JobState, Session, Task, TaskOutcome, TaskState, Usage};

use crate::{Claim, Fence, Lease, StoreError, TaskEnd};

/// A task row to store and the event reporting it, written in one transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskChange {
    /// The whole row after the change; a backend writes its mutable columns
    /// (state, attempt, claimed_by, report, error, usage, updated_at).
    pub task: Task,
    pub event: EventKind,
}

/// What a claim decides.
#[derive(Clone, Debug, PartialEq)]
pub enum ClaimDecision {
    /// This attempt takes the task: store the change, answer
    /// [`Claim::Claimed`] with the stored row and its numbered event.
    Take(TaskChange),
    /// Answer without writing.
    Answer(Claim),
}

/// Claim `attempt` of `task` for `worker_id` (docs/design.md section 3). A task that
/// ended answers [`Claim::AlreadyFinished`], whatever the attempt; otherwise
/// an attempt not newer than the one holding the task is stale and answers
/// [`Claim::Superseded`]. The order matters: a delivery of an ended task is
/// acked as done, not as stale.
pub fn claim(task: &Task, attempt: u32, worker_id: &str, now: i64) -> ClaimDecision {
    if task.state.is_terminal() {
        return ClaimDecision::Answer(Claim::AlreadyFinished(task.clone()));
    }
    if attempt <= task.attempt {
        return ClaimDecision::Answer(Claim::Superseded { current_attempt: task.attempt });
    }
    let mut next = task.clone();
    next.state = TaskState::Running;
    next.attempt = attempt;
    next.claimed_by = Some(worker_id.to_string());
    next.updated_at = now;
    let event = EventKind::TaskStarted { task: task.id, attempt, worker_id: worker_id.to_string() };
    ClaimDecision::Take(TaskChange { task: next, event })
}

/// End `task` from `attempt` with `outcome`. Only the attempt holding a
/// running task may finish it, once: an ended task refuses with
/// [`StoreError::AlreadyFinished`], an older attempt with
/// [`StoreError::Superseded`], an attempt that never claimed the task with
/// [`StoreError::NotClaimed`]. The usage is the task's own; the job's total
/// already counted it turn by turn.
pub fn finish(
    task: &Task,
    attempt: u32,
    outcome: TaskOutcome,
    usage: Usage,
    now: i64,
) -> Result<TaskChange, StoreError> {
    if task.state.is_terminal() {
        return Err(StoreError::AlreadyFinished { task: task.id, state: task.state });
    }
    if attempt < task.attempt {
        return Err(StoreError::Superseded { task: task.id, attempt, current_attempt: task.attempt });
    }
    if attempt > task.attempt || task.state != TaskState::Running {
        return Err(StoreError::NotClaimed { task: task.id, attempt, current_attempt: task.attempt });
    }
    let mut next = task.clone();
    let succeeded = match outcome {
        TaskOutcome::Succeeded { report } => {
            next.state = TaskState::Succeeded;
            next.report = Some(report);
            true
        }
        TaskOutcome::Failed { error } => {
            next.state = TaskState::Failed;
            next.error = Some(error);
            false
        }
    };
    next.usage = usage;
    next.updated_at = now;
    let event = EventKind::TaskFinished { task: task.id, attempt, succeeded, usage };
    Ok(TaskChange { task: next, event })
}

/// A worker's heartbeat for `attempt`: the row to store (only `updated_at`
/// moves on), or `None` when that attempt no longer holds a running task.
/// A heartbeat writes no event: it is not news, only a sign of life for the
/// sweeper.
/// Whether `task` is stored ended as `required` says ([`crate::Batch::requires`]).
pub fn ended_as(task: &Task, required: &TaskEnd) -> bool {
    task.state == required.state && task.attempt == required.attempt
}

/// The refusal of a batch whose required end is not stored: not an outage
/// but a state that moved on, so the run that built the batch on a report not stored resumes from
/// what is (the task's next attempt reports again).
pub fn unconfirmed(required: &TaskEnd) -> StoreError {
    StoreError::Unconfirmed { task: required.task, state: required.state, attempt: required.attempt }
}

pub fn heartbeat(task: &Task, attempt: u32, now: i64) -> Option<Task> {
    if task.state != TaskState::Running || task.attempt != attempt {
        return None;
    }
    let mut next = task.clone();
    next.updated_at = now;
    Some(next)
}

/// Cancel every task of `tasks` that has not ended, with `reason` as its
/// error. The changes (and so their events) come in dispatch order:
/// creation time, then task id — the same on every backend, whatever order
/// the rows were loaded in.
pub fn cancel(tasks: &[Task], reason: &str, now: i64) -> Vec<TaskChange> {
    let mut open: Vec<&Task> = tasks.iter().filter(|t| !t.state.is_terminal()).collect();
    open.sort_by_key(|t| (t.created_at, t.id));
    open.into_iter()
        .map(|t| {
            let mut next = t.clone();
            next.state = TaskState::Cancelled;
            next.error = Some(reason.to_string());
            next.updated_at = now;
            let event =
                EventKind::TaskFinished { task: t.id, attempt: t.attempt, succeeded: false, usage: Usage::default() };
            TaskChange { task: next, event }
        })
        .collect()
}

/// The event a new task is reported by.
pub fn task_queued(task: &Task) -> EventKind {
    EventKind::TaskQueued { task: task.id, worker: task.worker.clone(), description: task.description.clone() }
}

/// The event a new job is reported by (it starts `queued`).
pub fn job_created() -> EventKind {
    EventKind::JobState { state: JobState::Queued, reason: None }
}

/// The event a newly registered session is reported by.
pub fn session_started(session: &Session) -> EventKind {
    EventKind::SessionStarted { session: session.id, role: session.role.as_str().into(), label: session.label.clone() }
}

/// A job row to store and the event reporting it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobChange {
    /// The whole row after the change; a backend writes state, reason,
    /// final_answer and updated_at.
    pub job: Job,
    pub event: EventKind,
}

/// Move `job` to `state`. An ended job stays ended ([`StoreError::JobEnded`]):
/// the first end (a user's cancel, the run's own answer) stands. A final
/// answer, once given, is kept when a later move gives none.
pub fn set_job_state(
    job: &Job,
    state: JobState,
    reason: Option<String>,
    final_answer: Option<String>,
    now: i64,
) -> Result<JobChange, StoreError> {
    if job.state.is_terminal() {
        return Err(StoreError::JobEnded { job: job.id, state: job.state });
    }
    let mut next = job.clone();
    next.state = state;
    next.reason = reason.clone();
    next.final_answer = final_answer.or_else(|| job.final_answer.clone());
    next.updated_at = now;
    Ok(JobChange { job: next, event: EventKind::JobState { state, reason } })
}

/// A fenced write goes ahead only while its epoch owns the job; `current` is
/// the lease's epoch as stored, 0 when the job has no lease (docs/design.md section 4).
pub fn check_fence(fence: Fence, current: i64) -> Result<(), StoreError> {
    if current == fence.epoch {
        Ok(())
    } else {
        Err(StoreError::Fenced { job: fence.job, given: fence.epoch, current })
    }
}

/// Take `job`'s lease for `owner` at `now` for `ttl_ms` (docs/design.md section 4):
/// a missing lease is taken at epoch 1; `owner`'s own lease is extended at
/// its epoch (a restart of the same replica keeps its writes valid); an
/// expired lease of someone else's is taken over at the next epoch, fencing
/// the old owner out; a live one of someone else's is not taken (`None`).
pub fn acquire_lease(current: Option<&Lease>, job: JobId, owner: &str, now: i64, ttl_ms: i64) -> Option<Lease> {
    let epoch = match current {
        None => 1,
        Some(held) if held.owner == owner => held.epoch,
        Some(held) if held.expires_at < now => held.epoch + 1,
        Some(_) => return None,
    };
    Some(Lease { job, owner: owner.to_string(), epoch, expires_at: now + ttl_ms })
}

/// Extend `lease` while it is still the stored one (same owner, same
/// epoch), even past its expiry as long as no one took it over: a store
/// outage does not lose a lease nobody else claimed. `None` when lost.
pub fn renew_lease(current: Option<&Lease>, lease: &Lease, now: i64, ttl_ms: i64) -> Option<Lease> {
    holds(current, lease).then(|| Lease { expires_at: now + ttl_ms, ..lease.clone() })
}

/// Give `lease` up: expire it at once, if it is still the stored one, so
/// another replica may take the job over without waiting for the TTL.
pub fn release_lease(current: Option<&Lease>, lease: &Lease) -> Option<Lease> {
    holds(current, lease).then(|| Lease { expires_at: 0, ..lease.clone() })
}

fn holds(current: Option<&Lease>, lease: &Lease) -> bool {
    current.is_some_and(|c| c.owner == lease.owner && c.epoch == lease.epoch)
}

#[cfg(test)]
mod tests {
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
        assert_eq!(
            (done.task.state, done.task.error.as_deref(), done.task.updated_at),
            (TaskState::Failed, Some("e"), 5)
        );
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
        tasks[0] = finish(&claimed(&tasks[0], 1), 1, TaskOutcome::Failed { error: "x".into() }, Usage::default(), 1)
            .unwrap()
            .task;
        tasks[1] = claimed(&tasks[1], 4);
        let changes = cancel(&tasks, "stop", 7);
        let mut want: Vec<&Task> = tasks[1..].iter().collect();
        want.sort_by_key(|t| (t.created_at, t.id));
        assert_eq!(
            changes.iter().map(|c| c.task.id).collect::<Vec<_>>(),
            want.iter().map(|t| t.id).collect::<Vec<_>>()
        );
        let mut reversed = tasks.clone();
        reversed.reverse();
        assert_eq!(cancel(&reversed, "stop", 7), changes, "the load order does not matter");
        let running = changes.iter().find(|c| c.task.id == tasks[1].id).unwrap();
        assert_eq!(
            running.event,
            EventKind::TaskFinished { task: tasks[1].id, attempt: 4, succeeded: false, usage: Usage::default() }
        );
        assert!(
            changes.iter().all(|c| c.task.state == TaskState::Cancelled && c.task.error.as_deref() == Some("stop"))
        );
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
}
