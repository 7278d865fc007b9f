//! Claims, alone or in groups ([`crate::Store::claim_tasks_ending`]): the rows
//! locked (waiting for a creator still committing), every decision made by
//! [`rules::claim_group`], then the group's writes — sessions, rows, entries,
//! ends' tasks, events — each one statement for the group, the events' with
//! the `COMMIT`.

use flower_model::{Event, EventKind, JobId, Session, Task, TaskId, now_ms};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::PostgresStore;
use super::creation::{TASK_LOCK_CLASS, task_lock_key};
use super::events::write_events_ending;
use super::leases::check_fence;
use super::tasks::{REQUIRED, TASK_COLS, WRITE_TASKS, check_required, decode_task, insert_tasks, write_tasks};
use super::transaction::{Tx, prepare_all};
use super::transcripts::{INSERT_SESSIONS, WRITE_PART, insert_sessions, write_entries};
use crate::rules::{self, ClaimDecision, TaskChange};
use crate::{Batch, Claim, ClaimAnswer, ClaimRequest, EndOffer, Result, StoreError, Written};

impl PostgresStore {
    /// [`Store::claim_tasks_ending`] (a single claim is a group of one):
    /// the rows locked, each claim decided in order on its row as the claims
    /// before it left it, then the group's writes — sessions, rows, entries,
    /// events — each one statement for the group, the events' with the
    /// `COMMIT`.
    async fn claim_group(&self, claims: Vec<ClaimRequest>) -> Result<Vec<Result<ClaimAnswer>>> {
        self.tx_ending(move |tx| {
            Box::pin(async move {
                let ids: Vec<Uuid> = claims.iter().map(|c| c.task.0).collect();
                let mut rows = claims_locked(tx, &ids).await?;
                // Each claim is decided on its row as the claims before it left it.
                let now = now_ms();
                let mut decided = Vec::with_capacity(claims.len());
                for c in &claims {
                    let Some(task) = rows.get(&c.task.0) else {
                        decided.push(Decided::Missing(c.task));
                        continue;
                    };
                    let change = match rules::claim(task, c.attempt, &c.worker_id, now) {
                        ClaimDecision::Answer(answer) => {
                            decided.push(Decided::Answered(answer));
                            continue;
                        }
                        ClaimDecision::Take(change) => change,
                    };
                    let ending = c.end.decide().and_then(|offered| {
                        let finish =
                            rules::finish(&change.task, c.attempt, offered.outcome, offered.usage, now).ok()?;
                        Some((finish, offered.batch))
                    });
                    let last = ending.as_ref().map_or(&change.task, |(finish, _)| &finish.task);
                    rows.insert(c.task.0, last.clone());
                    decided.push(Decided::Taken { change, ending });
                }
                let (mut fences, mut required, mut changed_ids) = (Vec::new(), Vec::new(), Vec::new());
                for d in &decided {
                    let Decided::Taken { change, ending } = d else { continue };
                    if !changed_ids.contains(&change.task.id.0) {
                        changed_ids.push(change.task.id.0);
                    }
                    if let Some((_, batch)) = ending {
                        fences.extend(batch.fence.filter(|f| !fences.contains(f)));
                        required.extend(batch.requires.iter().copied());
                    }
                }
                futures::future::try_join_all(fences.into_iter().map(|f| check_fence(tx, Some(f)))).await?;
                // The ends are decided and their rows locked to the commit
                // (see [`PostgresStore::finish_task_with`]).
                for d in &decided {
                    if let Decided::Taken { ending: Some((_, Batch { staged: Some(staged), .. })), .. } = d {
                        staged.fire();
                    }
                }
                // A session is opened by the first claim that takes it.
                let mut opening: Vec<&Session> = Vec::new();
                for (c, d) in claims.iter().zip(&decided) {
                    if let (Decided::Taken { .. }, Some(session)) = (d, &c.session)
                        && !opening.iter().any(|o| o.id == session.id)
                    {
                        opening.push(session);
                    }
                }
                let changed: Vec<&Task> = changed_ids.iter().filter_map(|id| rows.get(id)).collect();
                let (mut entries, mut counts) = (Vec::new(), Vec::new());
                for d in decided.iter_mut() {
                    if let Decided::Taken { ending: Some((_, batch)), .. } = d {
                        counts.push(batch.entries.len());
                        entries.append(&mut batch.entries);
                    }
                }
                // The sessions, the required ends, the rows and the entries
                // in one flight, in this order: the entries after their
                // session rows, whose counters number them. Each statement
                // is prepared first (one not yet prepared on the connection
                // goes out after its preparation, out of order).
                let mut flight: Vec<&str> = Vec::new();
                if !opening.is_empty() {
                    flight.push(INSERT_SESSIONS);
                }
                if !required.is_empty() {
                    flight.push(&REQUIRED);
                }
                if !changed.is_empty() {
                    flight.push(WRITE_TASKS);
                }
                if !entries.is_empty() {
                    flight.push(WRITE_PART);
                }
                prepare_all(tx, &flight).await?;
                let (mut opened, _, _, seqs) = futures::try_join!(
                    insert_sessions(tx, &opening),
                    check_required(tx, &required),
                    write_tasks(tx, &changed),
                    write_entries(tx, entries)
                )?;
                let mut seqs = seqs.into_iter();
                let mut counts = counts.into_iter();
                // Every claim's events in one list, each claim's in the order
                // its own write would have them; its part is cut out below.
                let mut events: Vec<(JobId, EventKind)> = Vec::new();
                let mut usages = Vec::new();
                let mut planned = Vec::with_capacity(decided.len());
                for (c, d) in claims.iter().zip(decided) {
                    let (change, ending) = match d {
                        Decided::Missing(id) => {
                            planned.push(Planned::Missing(id));
                            continue;
                        }
                        Decided::Answered(answer) => {
                            planned.push(Planned::Answered(answer));
                            continue;
                        }
                        Decided::Taken { change, ending } => (change, ending),
                    };
                    let start = events.len();
                    events.push((change.task.job_id, change.event));
                    if let Some(session) = c.session.as_ref().filter(|s| opened.remove(&s.id.0)) {
                        events.push((session.job_id, rules::session_started(session)));
                    }
                    let claimed = events.len() - start;
                    let end = match ending {
                        Some((finish, batch)) => {
                            events.extend(batch.events);
                            let tasks = insert_tasks(tx, &batch.tasks, &mut events).await?;
                            events.push((finish.task.job_id, finish.event));
                            usages.extend(batch.usage);
                            let entry_seqs: Vec<i64> = seqs.by_ref().take(counts.next().unwrap_or(0)).collect();
                            Some((finish.task, entry_seqs, tasks))
                        }
                        None => None,
                    };
                    let jobs = events[start..].iter().map(|(job, _)| *job).collect();
                    planned.push(Planned::Taken { task: change.task, jobs, claimed, end });
                }
                let (events, ending) = write_events_ending(tx, events, usages, false).await?;
                // Numbered per job in the list's order: each claim takes its
                // events from the front of its jobs' queues.
                let mut numbered: std::collections::HashMap<JobId, std::collections::VecDeque<Event>> =
                    Default::default();
                for event in events {
                    numbered.entry(event.job_id).or_default().push_back(event);
                }
                let mut answers = Vec::with_capacity(planned.len());
                for plan in planned {
                    answers.push(match plan {
                        Planned::Missing(id) => Err(StoreError::NotFound(format!("task {id}"))),
                        Planned::Answered(answer) => Ok((answer, None)),
                        Planned::Taken { task, jobs, claimed, end } => {
                            let mut events = Vec::with_capacity(jobs.len());
                            for job in jobs {
                                let event = numbered.get_mut(&job).and_then(|q| q.pop_front());
                                events
                                    .push(event.ok_or_else(|| StoreError::Backend(format!("job {job}: events lost")))?);
                            }
                            let ended = events.split_off(claimed.min(events.len()));
                            let end = end
                                .map(|(task, entry_seqs, tasks)| (task, Written { events: ended, entry_seqs, tasks }));
                            Ok((Claim::Claimed { task, events }, end))
                        }
                    });
                }
                Ok((answers, ending))
            })
        })
        .await
    }
}

/// The task row for a claim, locked. A row not visible yet may be one a
/// coordinator published the message of before its commit: then the task's
/// creation lock is taken, shared (that transaction holds it exclusively, so
/// this waits for its end), and the row read again under a fresh snapshot
/// (both statements in one round trip, in order). A visible row is
/// committed, its creator's lock long gone: one statement.
async fn claim_locked(tx: &Tx<'_>, id: TaskId) -> Result<Option<Task>> {
    let read = tx.prepare_cached(&format!("SELECT {TASK_COLS} FROM tasks WHERE id = $1 FOR UPDATE")).await?;
    if let Some(row) = tx.query_opt(&read, &[&id.0]).await? {
        return decode_task(&row).map(Some);
    }
    let wait = tx.prepare_cached("SELECT pg_advisory_xact_lock_shared($1, $2)").await?;
    let key = task_lock_key(id);
    let (lock_params, read_params): ([&(dyn ToSql + Sync); 2], [&(dyn ToSql + Sync); 1]) =
        ([&TASK_LOCK_CLASS, &key], [&id.0]);
    let (_, row) = futures::try_join!(tx.execute(&wait, &lock_params), tx.query_opt(&read, &read_params))?;
    row.as_ref().map(decode_task).transpose()
}

/// The task rows of a group of claims: those not ended locked (in id
/// order), the ended ones read (an end is final), both in one round trip;
/// then, for rows not visible yet (see [`claim_locked`]), their creation
/// locks taken, shared, and those rows read again, locked.
///
/// No ended row is held while the group waits for a creator: that creator
/// may be a coordinator's turn requiring that end (its read of the row
/// waits for this transaction), which would close a cycle. A row that ends
/// while this reads it is found by neither statement and is read again
/// with the missing ones, after the wait.
async fn claims_locked(tx: &Tx<'_>, ids: &[Uuid]) -> Result<std::collections::HashMap<Uuid, Task>> {
    if let [id] = ids {
        // One row: holding it while waiting for its own creator closes no cycle.
        let row = claim_locked(tx, TaskId(*id)).await?;
        return Ok(row.into_iter().map(|task| (task.id.0, task)).collect());
    }
    let open = tx
        .prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE id = ANY($1)
                 AND state NOT IN ('succeeded', 'failed', 'cancelled') ORDER BY id FOR UPDATE"
        ))
        .await?;
    let ended = tx
        .prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE id = ANY($1) AND state IN ('succeeded', 'failed', 'cancelled')"
        ))
        .await?;
    let params: [&(dyn ToSql + Sync); 1] = [&ids];
    let (open_rows, ended_rows) = futures::try_join!(tx.query(&open, &params), tx.query(&ended, &params))?;
    let mut found = std::collections::HashMap::new();
    for row in open_rows.iter().chain(&ended_rows) {
        let task = decode_task(row)?;
        found.insert(task.id.0, task);
    }
    let mut missing: Vec<Uuid> = ids.iter().filter(|id| !found.contains_key(*id)).copied().collect();
    if missing.is_empty() {
        return Ok(found);
    }
    missing.sort_unstable();
    missing.dedup();
    let mut keys: Vec<i32> = missing.iter().map(|id| task_lock_key(TaskId(*id))).collect();
    keys.sort_unstable();
    keys.dedup();
    let wait = tx.prepare_cached("SELECT pg_advisory_xact_lock_shared($1, k) FROM UNNEST($2::int4[]) AS k").await?;
    let read =
        tx.prepare_cached(&format!("SELECT {TASK_COLS} FROM tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE")).await?;
    let (lock_params, read_params): ([&(dyn ToSql + Sync); 2], [&(dyn ToSql + Sync); 1]) =
        ([&TASK_LOCK_CLASS, &keys], [&missing]);
    let (_, rows) = futures::try_join!(tx.execute(&wait, &lock_params), tx.query(&read, &read_params))?;
    for row in rows {
        let task = decode_task(&row)?;
        found.insert(task.id.0, task);
    }
    Ok(found)
}

/// One claim of a group, as decided on its locked row (held for one write,
/// a group's worth: not worth a box).
#[allow(clippy::large_enum_variant)]
enum Decided {
    Missing(TaskId),
    Answered(Claim),
    Taken { change: TaskChange, ending: Option<(TaskChange, Batch)> },
}

/// One claim of a group, written: what its answer is made of once its
/// events are numbered (`jobs`: the job of each of its events, in order;
/// the first `claimed` are the claim's, the rest its end's).
#[allow(clippy::large_enum_variant)]
enum Planned {
    Missing(TaskId),
    Answered(Claim),
    Taken { task: Task, jobs: Vec<JobId>, claimed: usize, end: Option<EndWritten> },
}

/// An end written in a group: the ended row, its entries' numbers, the
/// task rows its batch created.
type EndWritten = (Task, Vec<i64>, Vec<(Task, bool)>);

pub(super) async fn claim_task_ending(
    store: &PostgresStore,
    id: TaskId,
    attempt: u32,
    worker_id: &str,
    session: Option<Session>,
    end: &EndOffer,
) -> Result<(Claim, Option<(Task, Written)>)> {
    let claim = ClaimRequest { task: id, attempt, worker_id: worker_id.to_string(), session, end: end.clone() };
    let mut answers = store.claim_group(vec![claim]).await?;
    answers.pop().unwrap_or_else(|| Err(StoreError::Backend(format!("task {id}: no answer to its claim"))))
}

pub(super) async fn claim_tasks_ending(
    store: &PostgresStore,
    claims: &[ClaimRequest],
) -> Result<Vec<Result<ClaimAnswer>>> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    store.claim_group(claims.to_vec()).await
}
