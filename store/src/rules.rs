//! The rules both backends keep, written once: what a claim (with the end
//! offered to it), a finish, a heartbeat or a cancel of tasks decides, how a
//! job moves between states, when a lease is taken, renewed or given up, and
//! when a fenced write is refused (docs/design.md sections 2 to 4); and what
//! a group of claims written together decides, and how its numbered events
//! go back to each claim (Postgres writes claims in groups, SQLite one by
//! one, each through [`claim_ending`]).
//!
//! Every function here is pure: it takes the rows as the backend loaded them
//! (inside the writing transaction, locked where the backend locks) and the
//! request, and returns what to write — whole rows, with the events reporting
//! them — or what to answer without writing. A backend only runs SQL around
//! these decisions: load, decide, store the returned rows, number the events.
//! (An end offered to a claim is asked for through a closure, only once the
//! claim takes its task: asking closes the offer.)

use std::collections::{HashMap, HashSet, VecDeque};

use flower_model::{
    Entry, Event, EventKind, Job, JobId, JobState, Session, SessionId, Task, TaskId, TaskOutcome, TaskState, Usage,
};

use flower_model::quota::{Buckets, Claimant, Quota, Route, Wait};

use crate::{Batch, Claim, ClaimAnswer, ClaimRequest, Fence, Lease, OfferedEnd, StoreError, TaskEnd, Written};

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
    // A held task's message went out before its hold was decided (or is
    // stale): it is not run; its admission sends another.
    if attempt <= task.attempt || task.state == TaskState::Held {
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

/// What a claim decides together with the end its attempt offered
/// (docs/design.md section 3, "Claim and end in one write"); held for one
/// write: not worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum ClaimEnding {
    /// Answer without writing, as [`ClaimDecision::Answer`].
    Answer(Claim),
    /// Store the claim, then the end when one is taken along.
    Take { claim: TaskChange, end: Option<TakenEnd> },
}

/// An end taken in its claim's transaction: the row after it, with its
/// event, and the batch committed before it.
#[derive(Clone, Debug)]
pub struct TakenEnd {
    pub change: TaskChange,
    pub batch: Batch,
}

/// [`claim`], and when the claim takes the task, the end its attempt
/// offered: `offered` ([`crate::EndOffer::decide`], which closes the offer)
/// is asked then and only then — a claim that is not taken takes no end and
/// leaves the offer open. The end is taken when [`finish`] accepts it on
/// the claimed row; an end it refuses goes the ordinary way
/// ([`crate::Store::finish_task_with`]), where the refusal is handled.
pub fn claim_ending(
    task: &Task,
    attempt: u32,
    worker_id: &str,
    now: i64,
    offered: impl FnOnce() -> Option<OfferedEnd>,
) -> ClaimEnding {
    let taken = match claim(task, attempt, worker_id, now) {
        ClaimDecision::Answer(answer) => return ClaimEnding::Answer(answer),
        ClaimDecision::Take(change) => change,
    };
    let end = offered().and_then(|offer| {
        let change = finish(&taken.task, attempt, offer.outcome, offer.usage, now).ok()?;
        Some(TakenEnd { change, batch: offer.batch })
    });
    ClaimEnding::Take { claim: taken, end }
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

/// A worker's heartbeat for `attempt`: the row to store (only `updated_at`
/// moves on), or `None` when that attempt no longer holds a running task.
/// A heartbeat writes no event: it is not news, only a sign of life for the
/// sweeper.
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

/// One claim of a group, decided (held for one write, a group's worth: not
/// worth a box).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum GroupClaim {
    /// The task has no row: that claim's [`StoreError::NotFound`].
    Missing(TaskId),
    /// Answer without writing.
    Answered(Claim),
    /// The claim takes its task.
    Taken {
        claim: TaskChange,
        /// The claim's session when this claim opens it: the first claim
        /// of the group that takes a task names it.
        opens: Option<Session>,
        /// The end taken along, its batch's entries moved to
        /// [`GroupDecision::entries`].
        end: Option<TakenEnd>,
        /// How many of [`GroupDecision::entries`] are its end's.
        entries: usize,
    },
}

/// What a group of claims decides ([`crate::Store::claim_tasks_ending`]):
/// per claim, what it does; and what the group writes before its events.
#[derive(Clone, Debug, Default)]
pub struct GroupDecision {
    /// Per claim, in the order given.
    pub claims: Vec<GroupClaim>,
    /// The task rows to store: each task taken once, as the last claim of
    /// it left it, in the order first taken.
    pub rows: Vec<Task>,
    /// The fences of the ends taken, each once.
    pub fences: Vec<Fence>,
    /// The task ends the ends' batches require, in claim order.
    pub required: Vec<TaskEnd>,
    /// The entries of the ends' batches, end after end in claim order.
    pub entries: Vec<Entry>,
}

impl GroupDecision {
    /// The sessions the group opens, in claim order.
    pub fn sessions(&self) -> Vec<&Session> {
        self.claims
            .iter()
            .filter_map(|c| match c {
                GroupClaim::Taken { opens, .. } => opens.as_ref(),
                _ => None,
            })
            .collect()
    }

    /// The ends taken, in claim order.
    pub fn ends(&self) -> impl Iterator<Item = &TakenEnd> {
        self.claims.iter().filter_map(|c| match c {
            GroupClaim::Taken { end, .. } => end.as_ref(),
            _ => None,
        })
    }
}

/// Decide a group of claims (docs/design.md section 3, "Claims written
/// together") on `rows`, the tasks' rows as loaded (locked): each claim in
/// order, on its row as the claims before it left it, so a later claim of
/// the same task sees the earlier one's change — as that claim alone,
/// written after them, would have. `offered` is each claim's end offer, as
/// in [`claim_ending`]: asked only of a claim that takes its task.
pub fn claim_group(
    mut rows: HashMap<TaskId, Task>,
    claims: &[ClaimRequest],
    now: i64,
    mut offered: impl FnMut(&ClaimRequest) -> Option<OfferedEnd>,
) -> GroupDecision {
    let mut group = GroupDecision::default();
    let mut opened: HashSet<SessionId> = HashSet::new();
    for c in claims {
        let Some(task) = rows.get(&c.task) else {
            group.claims.push(GroupClaim::Missing(c.task));
            continue;
        };
        let (claim, mut end) = match claim_ending(task, c.attempt, &c.worker_id, now, || offered(c)) {
            ClaimEnding::Answer(answer) => {
                group.claims.push(GroupClaim::Answered(answer));
                continue;
            }
            ClaimEnding::Take { claim, end } => (claim, end),
        };
        let last = end.as_ref().map_or(&claim.task, |e| &e.change.task).clone();
        rows.insert(c.task, last.clone());
        match group.rows.iter_mut().find(|row| row.id == last.id) {
            Some(row) => *row = last,
            None => group.rows.push(last),
        }
        let opens = c.session.as_ref().filter(|s| opened.insert(s.id)).cloned();
        let mut entries = 0;
        if let Some(end) = &mut end {
            if let Some(fence) = end.batch.fence.filter(|f| !group.fences.contains(f)) {
                group.fences.push(fence);
            }
            group.required.extend(end.batch.requires.iter().copied());
            entries = end.batch.entries.len();
            group.entries.append(&mut end.batch.entries);
        }
        group.claims.push(GroupClaim::Taken { claim, opens, end, entries });
    }
    group
}

/// The task rows a taken end's batch inserted (each with whether it was
/// created then), and the `task_queued` events of those created.
#[derive(Clone, Debug, Default)]
pub struct EndTasks {
    pub tasks: Vec<(Task, bool)>,
    pub queued: Vec<(JobId, EventKind)>,
}

/// A group's claims stored but for their events: the events to number, the
/// usage to add, and per claim what its answer is made of.
#[derive(Clone, Debug, Default)]
pub struct GroupEvents {
    /// Every claim's events in one list, each claim's together, in the
    /// order its own write would have them.
    pub events: Vec<(JobId, EventKind)>,
    pub usage: Vec<(JobId, Usage)>,
    pub claims: Vec<Unnumbered>,
}

/// One claim of a group, written: what its answer is made of once its
/// events are numbered ([`answer_group`]).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Unnumbered {
    Missing(TaskId),
    Answered(Claim),
    Taken {
        task: Task,
        /// The job of each of its events, in order: the first `claimed`
        /// are the claim's, the rest its end's.
        jobs: Vec<JobId>,
        claimed: usize,
        end: Option<EndWritten>,
    },
}

/// An end written in a group: the ended row, its entries' numbers, the
/// task rows its batch created.
pub type EndWritten = (Task, Vec<i64>, Vec<(Task, bool)>);

/// The events of a group's claims, each claim's in the order its own write
/// would have them: the claim's, its session's start when the group's
/// insert created the session (`opened`) and this claim opens it, then its
/// end's batch events, the `task_queued` of the rows the batch created, and
/// the end's. `ends` holds what each taken end's batch inserted and
/// `entry_seqs` the numbers of [`GroupDecision::entries`], both in claim
/// order.
pub fn group_events(
    claims: Vec<GroupClaim>,
    opened: &HashSet<SessionId>,
    ends: Vec<EndTasks>,
    entry_seqs: Vec<i64>,
) -> GroupEvents {
    let (mut ends, mut seqs) = (ends.into_iter(), entry_seqs.into_iter());
    let mut out = GroupEvents::default();
    for decided in claims {
        let (claim, opens, end, entries) = match decided {
            GroupClaim::Missing(id) => {
                out.claims.push(Unnumbered::Missing(id));
                continue;
            }
            GroupClaim::Answered(answer) => {
                out.claims.push(Unnumbered::Answered(answer));
                continue;
            }
            GroupClaim::Taken { claim, opens, end, entries } => (claim, opens, end, entries),
        };
        let start = out.events.len();
        out.events.push((claim.task.job_id, claim.event));
        if let Some(session) = opens.filter(|s| opened.contains(&s.id)) {
            out.events.push((session.job_id, session_started(&session)));
        }
        let claimed = out.events.len() - start;
        let end = end.map(|TakenEnd { change, batch }| {
            let inserted = ends.next().unwrap_or_default();
            out.events.extend(batch.events);
            out.events.extend(inserted.queued);
            out.events.push((change.task.job_id, change.event));
            out.usage.extend(batch.usage);
            (change.task, seqs.by_ref().take(entries).collect(), inserted.tasks)
        });
        let jobs = out.events[start..].iter().map(|(job, _)| *job).collect();
        out.claims.push(Unnumbered::Taken { task: claim.task, jobs, claimed, end });
    }
    out
}

/// Each claim's answer, as that claim alone would have had it, from the
/// group's events as numbered: per job in the order of
/// [`GroupEvents::events`], so each claim takes its events from the front
/// of its jobs' queues. A task with no row is that claim's
/// [`StoreError::NotFound`].
pub fn answer_group(
    claims: Vec<Unnumbered>,
    mut numbered: Vec<Event>,
) -> Result<Vec<Result<ClaimAnswer, StoreError>>, StoreError> {
    numbered.sort_by_key(|e| (e.job_id, e.seq));
    let mut queues: HashMap<JobId, VecDeque<Event>> = HashMap::new();
    for event in numbered {
        queues.entry(event.job_id).or_default().push_back(event);
    }
    let mut answers = Vec::with_capacity(claims.len());
    for claim in claims {
        answers.push(match claim {
            Unnumbered::Missing(id) => Err(StoreError::NotFound(format!("task {id}"))),
            Unnumbered::Answered(answer) => Ok((answer, None)),
            Unnumbered::Taken { task, jobs, claimed, end } => {
                let mut events = Vec::with_capacity(jobs.len());
                for job in jobs {
                    let event = queues.get_mut(&job).and_then(VecDeque::pop_front);
                    events.push(event.ok_or_else(|| StoreError::backend(format!("job {job}: events lost")))?);
                }
                let ended = events.split_off(claimed.min(events.len()));
                let end = end.map(|(task, entry_seqs, tasks)| (task, Written { events: ended, entry_seqs, tasks }));
                Ok((Claim::Claimed { task, events }, end))
            }
        });
    }
    Ok(answers)
}

#[cfg(test)]
mod tests;

/// A change to a provider route's buckets ([`crate::Store::change_quota`]).
#[derive(Clone, Debug, PartialEq)]
pub enum QuotaChange {
    /// Take a request and its estimated input tokens for the call `ticket`
    /// of `claim`, or keep it in line and say how long until its turn.
    Admit { input_tokens: u64, claim: Claimant, ticket: u64 },
    /// What a request used beyond its admission.
    Charge { input_tokens: f64, output_tokens: f64 },
    /// Limits stated (or set), what is left, and a refusal's wait.
    Learn { limits: Quota, remaining: Option<Quota>, drain_ms: Option<i64> },
}

/// What `change` makes of a route's state (`current`, `None` when the
/// route has no row): the state to write (`None`: nothing), and, for an
/// admission refused, the wait. A route without limits admits and charges
/// nothing; an admission goes in its turn ([`Route::admit`]); learning
/// makes its buckets full of the limits, or relimits known ones (what was
/// used stays used), brings them down to what is left, and drains them
/// when asked.
pub fn quota_change(current: Option<Route>, change: QuotaChange, now: i64) -> (Option<Route>, Option<Wait>) {
    match (current, change) {
        (None, QuotaChange::Admit { .. } | QuotaChange::Charge { .. }) => (None, None),
        (Some(mut r), QuotaChange::Admit { input_tokens, claim, ticket }) => {
            let wait = r.admit(&claim, ticket, input_tokens, now).err();
            (Some(r), wait)
        }
        (Some(mut r), QuotaChange::Charge { input_tokens, output_tokens }) => {
            r.buckets.charge(input_tokens, output_tokens, now);
            (Some(r), None)
        }
        (current, QuotaChange::Learn { limits, remaining, drain_ms }) => {
            let mut r = current.unwrap_or_else(|| Route::new(Buckets::full(limits, now)));
            let b = &mut r.buckets;
            if b.quota != limits {
                b.relimit(limits, now);
            }
            if let Some(left) = remaining {
                b.observe(left, now);
            }
            if let Some(ms) = drain_ms {
                b.drain(ms, now);
            }
            (Some(r), None)
        }
    }
}
