//! Claims, alone or in groups ([`crate::Store::claim_tasks_ending`]): the rows
//! locked (waiting for a creator still committing), every decision made by
//! [`rules::claim_group`], then the group's writes — sessions, rows, entries,
//! ends' tasks, events — each one statement for the group, the events' with
//! the `COMMIT`.

use std::collections::HashMap;

use flower_model::{Session, Task, TaskId, now_ms};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::PostgresStore;
use super::creation::{TASK_LOCK_CLASS, task_lock_key};
use super::events::{Durability, write_events_ending};
use super::leases::check_fence;
use super::tasks::{REQUIRED, TASK_COLS, WRITE_TASKS, check_required, decode_task, insert_tasks, write_tasks};
use super::transaction::{Tx, prepare_all};
use super::transcripts::{INSERT_SESSIONS, WRITE_PART, insert_sessions, write_entries};
use crate::rules::{self, EndTasks, GroupDecision, GroupEvents};
use crate::{Claim, ClaimAnswer, ClaimRequest, EndOffer, Result, StoreError, Written};

/// [`crate::Store::claim_tasks_ending`] (a single claim is a group of one):
/// the rows locked, the group decided ([`rules::claim_group`]), its writes
/// made ([`write_group`]), then its events numbered with the `COMMIT` and
/// handed back to the claims ([`rules::answer_group`]).
async fn claim_group(store: &PostgresStore, claims: Vec<ClaimRequest>) -> Result<Vec<Result<ClaimAnswer>>> {
    store
        .tx_ending(move |tx| {
            Box::pin(async move {
                let ids: Vec<Uuid> = claims.iter().map(|c| c.task.0).collect();
                let rows = claims_locked(tx, &ids).await?;
                let group = rules::claim_group(rows, &claims, now_ms(), |c| c.end.decide());
                let written = write_group(tx, group).await?;
                let (events, ending) =
                    write_events_ending(tx, written.events, written.usage, Durability::Synchronous).await?;
                Ok((rules::answer_group(written.claims, events)?, ending))
            })
        })
        .await
}

/// Store a group's decisions but for its events: the ends' fences checked
/// and the ends staged; then the sessions, the required ends, the rows and
/// the entries in one flight, in this order (the entries after their
/// session rows, whose counters number them); then the task rows of the
/// ends' batches. Each statement of the flight is prepared first (one not
/// yet prepared on the connection goes out after its preparation, out of
/// order).
async fn write_group(tx: &Tx<'_>, mut group: GroupDecision) -> Result<GroupEvents> {
    futures::future::try_join_all(group.fences.iter().map(|f| check_fence(tx, Some(*f)))).await?;
    // The ends are decided and their rows locked to the commit
    // (see [`super::tasks::finish_task_with`]).
    for end in group.ends() {
        if let Some(staged) = &end.batch.staged {
            staged.fire();
        }
    }
    let entries = std::mem::take(&mut group.entries);
    let sessions = group.sessions();
    let rows: Vec<&Task> = group.rows.iter().collect();
    let mut flight: Vec<&str> = Vec::new();
    if !sessions.is_empty() {
        flight.push(INSERT_SESSIONS);
    }
    if !group.required.is_empty() {
        flight.push(&REQUIRED);
    }
    if !rows.is_empty() {
        flight.push(WRITE_TASKS);
    }
    if !entries.is_empty() {
        flight.push(WRITE_PART);
    }
    prepare_all(tx, &flight).await?;
    let (opened, _, _, seqs) = futures::try_join!(
        insert_sessions(tx, &sessions),
        check_required(tx, &group.required),
        write_tasks(tx, &rows),
        write_entries(tx, entries)
    )?;
    let mut ends = Vec::new();
    for end in group.ends() {
        let mut inserted = EndTasks::default();
        inserted.tasks = insert_tasks(tx, &end.batch.tasks, &mut inserted.queued).await?;
        ends.push(inserted);
    }
    Ok(rules::group_events(group.claims, &opened, ends, seqs))
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
async fn claims_locked(tx: &Tx<'_>, ids: &[Uuid]) -> Result<HashMap<TaskId, Task>> {
    if let [id] = ids {
        // One row: holding it while waiting for its own creator closes no cycle.
        let row = claim_locked(tx, TaskId(*id)).await?;
        return Ok(row.into_iter().map(|task| (task.id, task)).collect());
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
    let mut found = HashMap::new();
    for row in open_rows.iter().chain(&ended_rows) {
        let task = decode_task(row)?;
        found.insert(task.id, task);
    }
    let mut missing: Vec<Uuid> = ids.iter().filter(|id| !found.contains_key(&TaskId(**id))).copied().collect();
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
        found.insert(task.id, task);
    }
    Ok(found)
}

pub(super) async fn claim_task_ending(
    store: &PostgresStore,
    id: TaskId,
    attempt: u32,
    worker_id: &str,
    session: Option<Session>,
    end: &EndOffer,
) -> Result<(Claim, Option<(Task, Written)>)> {
    let claim = ClaimRequest { task: id, attempt, worker_id: worker_id.to_string(), session, end: end.clone() };
    let mut answers = claim_group(store, vec![claim]).await?;
    answers.pop().unwrap_or_else(|| Err(StoreError::backend(format!("task {id}: no answer to its claim"))))
}

pub(super) async fn claim_tasks_ending(
    store: &PostgresStore,
    claims: &[ClaimRequest],
) -> Result<Vec<Result<ClaimAnswer>>> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    claim_group(store, claims.to_vec()).await
}
