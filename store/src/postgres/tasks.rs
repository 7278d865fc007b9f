//! Task rows: inserted (a retried insert left as it is), their mutable
//! columns stored as [`rules`] decided them, read (settled, locked), the
//! ends a batch requires checked; and the writes of an end, a heartbeat and
//! a job's cancel.

use deadpool_postgres::ClientWrapper;
use flower_model::{Event, EventKind, JobId, SessionId, Task, TaskId, TaskOutcome, Usage, now_ms};
use tokio_postgres::Row;
use uuid::Uuid;

use super::creation::fence_and_lock;
use super::events::{Durability, flush_marked, write_events, write_events_ending};
use super::leases::check_fence;
use super::transaction::{Tx, db_execute, db_query, db_query_opt};
use super::transcripts::write_entries;
use super::{PostgresStore, from_json, json, parse, written};
use crate::rules::{self, TaskChange};
use crate::{Batch, Fence, Result, StoreError, TaskEnd, Written};

/// A task row's columns, in [`decode_task`]'s order.
pub(super) const TASK_COLS: &str = "id, job_id, parent_session, tool_use_id, worker, mandate, description, state, attempt, claimed_by, report, error, usage, created_at, updated_at";

pub(super) fn decode_task(r: &Row) -> Result<Task> {
    Ok(Task {
        id: TaskId(r.get(0)),
        job_id: JobId(r.get(1)),
        parent_session: SessionId(r.get(2)),
        tool_use_id: r.get(3),
        worker: r.get(4),
        mandate: r.get(5),
        description: r.get(6),
        state: parse(r.get::<_, &str>(7))?,
        attempt: r.get::<_, i32>(8) as u32,
        claimed_by: r.get(9),
        report: r.get(10),
        error: r.get(11),
        usage: from_json(r.get(12))?,
        created_at: r.get(13),
        updated_at: r.get(14),
    })
}

/// Store the mutable columns of task rows as [`rules`] decided them, in one statement.
pub(super) async fn write_tasks(tx: &Tx<'_>, tasks: &[&Task]) -> Result<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    let (mut ids, mut states, mut attempts, mut claimed, mut reports, mut errors, mut usages, mut ats) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for t in tasks {
        ids.push(t.id.0);
        states.push(t.state.as_str());
        attempts.push(i32::try_from(t.attempt).map_err(|_| StoreError::Invalid(format!("attempt {}", t.attempt)))?);
        claimed.push(t.claimed_by.as_deref());
        reports.push(t.report.as_deref());
        errors.push(t.error.as_deref());
        usages.push(json(&t.usage)?);
        ats.push(t.updated_at);
    }
    db_execute(tx, WRITE_TASKS, &[&ids, &states, &attempts, &claimed, &reports, &errors, &usages, &ats]).await?;
    Ok(())
}

/// [`write_tasks`]'s statement.
pub(super) const WRITE_TASKS: &str =
    "UPDATE tasks AS t SET state = u.state, attempt = u.attempt, claimed_by = u.claimed_by, report = u.report,
       error = u.error, usage = u.usage, updated_at = u.updated_at
     FROM UNNEST($1::uuid[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::text[], $7::jsonb[], $8::bigint[])
       AS u (id, state, attempt, claimed_by, report, error, usage, updated_at)
     WHERE t.id = u.id AND t.id = ANY($1)";

/// Store task changes and number their events, in the changes' order.
async fn apply_task_changes(tx: &Tx<'_>, changes: Vec<TaskChange>) -> Result<Vec<Event>> {
    write_tasks(tx, &changes.iter().map(|c| &c.task).collect::<Vec<_>>()).await?;
    write_events(tx, changes.into_iter().map(|c| (c.task.job_id, c.event)).collect(), None).await
}

async fn load_task(c: &ClientWrapper, id: TaskId) -> Result<Task> {
    let row = db_query_opt(c, &format!("SELECT {TASK_COLS} FROM tasks WHERE id = $1"), &[&id.0])
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
    decode_task(&row)
}

/// A task row, locked until the transaction ends: the decision made on it
/// stands until it is stored.
async fn lock_task(tx: &Tx<'_>, id: TaskId) -> Result<Option<Task>> {
    let row = db_query_opt(tx, &format!("SELECT {TASK_COLS} FROM tasks WHERE id = $1 FOR UPDATE"), &[&id.0]).await?;
    row.as_ref().map(decode_task).transpose()
}

/// [`check_required`]'s statement.
pub(super) static REQUIRED: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("SELECT {TASK_COLS} FROM tasks WHERE id = ANY($1) FOR SHARE"));

/// Refuse the batch unless each required end is stored. The rows are read
/// under a share lock: a worker's end staged before its commit holds the row
/// lock, so this waits for that transaction and reads what it left.
pub(super) async fn check_required(tx: &Tx<'_>, required: &[TaskEnd]) -> Result<()> {
    if required.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = required.iter().map(|r| r.task.0).collect();
    let rows = db_query(tx, &REQUIRED, &[&ids]).await?;
    let stored: std::collections::HashMap<Uuid, Task> =
        rows.iter().map(|r| decode_task(r).map(|t| (t.id.0, t))).collect::<Result<_>>()?;
    match required.iter().find(|r| !stored.get(&r.task.0).is_some_and(|t| rules::ended_as(t, r))) {
        Some(missing) => Err(rules::unconfirmed(missing)),
        None => Ok(()),
    }
}

/// Insert task rows (a row already there, a retried call, is left as it is
/// and reported as not created); the rows as stored. The `task_queued`
/// events of the created ones are added to `events`, to be numbered with
/// them.
///
/// Rows are inserted queued, or held when their job's namespace limits its
/// tasks (the store decides, as of the insert: docs/design.md section 17).
/// One statement answers both: the rows it inserted (as inserted) and the
/// rows that were there before it (as its snapshot shows them). A row that
/// another transaction committed while this one waited on it is in
/// neither; those are read again in a statement of their own.
pub(super) async fn insert_tasks(
    tx: &Tx<'_>,
    tasks: &[Task],
    events: &mut Vec<(JobId, EventKind)>,
) -> Result<Vec<(Task, bool)>> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let now = now_ms();
    let no_usage = json(&Usage::default())?;
    let (mut ids, mut jobs, mut parents, mut calls, mut workers, mut mandates, mut descriptions) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for t in tasks {
        ids.push(t.id.0);
        jobs.push(t.job_id.0);
        parents.push(t.parent_session.0);
        calls.push(t.tool_use_id.as_str());
        workers.push(t.worker.as_str());
        mandates.push(t.mandate.as_str());
        descriptions.push(t.description.as_str());
    }
    let rows = db_query(
        tx,
        &INSERT_TASKS,
        &[&ids, &jobs, &parents, &calls, &workers, &mandates, &descriptions, &no_usage, &now],
    )
    .await?;
    let mut stored = std::collections::HashMap::with_capacity(rows.len());
    let mut created = std::collections::HashSet::new();
    for r in &rows {
        let task = decode_task(r)?;
        if r.get::<_, bool>(TASK_COLUMNS) {
            created.insert(task.id.0);
        }
        stored.insert(task.id.0, task);
    }
    let unseen: Vec<Uuid> = ids.iter().filter(|id| !stored.contains_key(*id)).copied().collect();
    if !unseen.is_empty() {
        for r in db_query(tx, &format!("SELECT {TASK_COLS} FROM tasks WHERE id = ANY($1)"), &[&unseen]).await? {
            let task = decode_task(&r)?;
            stored.insert(task.id.0, task);
        }
    }
    let mut out = Vec::with_capacity(tasks.len());
    let mut seen = std::collections::HashSet::new();
    for t in tasks {
        let row = stored.get(&t.id.0).cloned().ok_or_else(|| StoreError::NotFound(format!("task {}", t.id)))?;
        let new = created.contains(&t.id.0) && seen.insert(t.id.0);
        if new {
            events.push((t.job_id, rules::task_queued(t)));
        }
        out.push((row, new));
    }
    Ok(out)
}

/// Columns of [`TASK_COLS`]: [`INSERT_TASKS`] answers one more, whether
/// the row is one it created.
pub(super) const TASK_COLUMNS: usize = 15;

/// [`insert_tasks`]'s statement: the rows inserted, then the rows its
/// snapshot holds of the others.
pub(super) static INSERT_TASKS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH inserted AS (
            INSERT INTO tasks ({TASK_COLS})
            SELECT u.id, u.job_id, u.parent_session, u.tool_use_id, u.worker, u.mandate, u.description,
              CASE WHEN EXISTS (SELECT 1 FROM jobs j JOIN namespaces n ON n.name = j.namespace
                                WHERE j.id = u.job_id AND n.limits ? 'max_tasks')
                   THEN 'held' ELSE 'queued' END,
              0, NULL, NULL, NULL, $8, $9, $9
            FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::text[])
              AS u (id, job_id, parent_session, tool_use_id, worker, mandate, description)
            ON CONFLICT (id) DO NOTHING
            RETURNING {TASK_COLS})
         SELECT *, true FROM inserted
         UNION ALL
         SELECT {TASK_COLS}, false FROM tasks WHERE id = ANY($1) AND id NOT IN (SELECT id FROM inserted)"
    )
});

pub(super) async fn create_tasks(
    store: &PostgresStore,
    tasks: Vec<Task>,
    fence: Option<Fence>,
) -> Result<(Vec<(Task, bool)>, Written)> {
    if tasks.is_empty() {
        return Ok((Vec::new(), Written::default()));
    }
    store
        .tx_ending(move |tx| {
            Box::pin(async move {
                fence_and_lock(tx, fence, &tasks).await?;
                let mut events = Vec::new();
                let out = insert_tasks(tx, &tasks, &mut events).await?;
                let (events, ending) = write_events_ending(tx, events, None, Durability::Synchronous).await?;
                Ok(((out, written(events)), ending))
            })
        })
        .await
}

pub(super) async fn get_task(store: &PostgresStore, id: TaskId) -> Result<Task> {
    load_task(&*store.pool.get().await?, id).await
}

pub(super) async fn settled_task(store: &PostgresStore, id: TaskId) -> Result<Task> {
    store
        .tx(move |tx| {
            Box::pin(async move {
                let row = db_query_opt(tx, &format!("SELECT {TASK_COLS} FROM tasks WHERE id = $1 FOR SHARE"), &[&id.0])
                    .await?
                    .ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
                decode_task(&row)
            })
        })
        .await
}

pub(super) async fn tasks(store: &PostgresStore, job: JobId) -> Result<Vec<Task>> {
    let client = store.pool.get().await?;
    let rows = db_query(
        &client,
        &format!(
            "SELECT {TASK_COLS}, (SELECT unflushed_seq FROM jobs WHERE id = $1) AS unflushed
             FROM tasks WHERE job_id = $1 ORDER BY created_at, id"
        ),
        &[&job.0],
    )
    .await?;
    // With the job's mark (see `events`).
    if rows.first().is_some_and(|r| r.get::<_, Option<i64>>("unflushed").is_some()) {
        flush_marked(&client).await?;
    }
    rows.iter().map(decode_task).collect()
}

pub(super) async fn finish_task_with(
    store: &PostgresStore,
    id: TaskId,
    attempt: u32,
    outcome: TaskOutcome,
    usage: Usage,
    batch: Batch,
) -> Result<(Task, Written)> {
    store
        .tx_ending(move |tx| {
            Box::pin(async move {
                check_fence(tx, batch.fence).await?;
                let task = lock_task(tx, id).await?.ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
                let change = rules::finish(&task, attempt, outcome, usage, now_ms())?;
                // The end is decided and the row is locked to the commit: a
                // batch requiring this end waits for it (see [`check_required`]).
                if let Some(staged) = &batch.staged {
                    staged.fire();
                }
                let mut events = batch.events;
                let changed = [&change.task];
                let (_, entry_seqs, _, tasks) = futures::try_join!(
                    check_required(tx, &batch.requires),
                    write_entries(tx, batch.entries),
                    write_tasks(tx, &changed),
                    insert_tasks(tx, &batch.tasks, &mut events)
                )?;
                events.push((change.task.job_id, change.event));
                let (events, ending) = write_events_ending(tx, events, batch.usage, Durability::Synchronous).await?;
                Ok(((change.task, Written { events, entry_seqs, tasks }), ending))
            })
        })
        .await
}

pub(super) async fn heartbeat_task(store: &PostgresStore, id: TaskId, attempt: u32) -> Result<bool> {
    store
        .tx(move |tx| {
            Box::pin(async move {
                let Some(task) = lock_task(tx, id).await? else { return Ok(false) };
                let Some(beat) = rules::heartbeat(&task, attempt, now_ms()) else { return Ok(false) };
                write_tasks(tx, &[&beat]).await?;
                Ok(true)
            })
        })
        .await
}

pub(super) async fn cancel_tasks(store: &PostgresStore, job: JobId, reason: &str) -> Result<Written> {
    let reason = reason.to_string();
    store
        .tx(move |tx| {
            Box::pin(async move {
                // Only unfinished rows are worth loading; which of them to
                // cancel, and in what order, is the rule's. Locked in id order,
                // so two cancels of one job cannot deadlock.
                let rows = db_query(
                    tx,
                    &format!(
                        "SELECT {TASK_COLS} FROM tasks WHERE job_id = $1 AND state IN ('held', 'queued', 'running')
                         ORDER BY id FOR UPDATE"
                    ),
                    &[&job.0],
                )
                .await?;
                let open = rows.iter().map(decode_task).collect::<Result<Vec<_>>>()?;
                Ok(written(apply_task_changes(tx, rules::cancel(&open, &reason, now_ms())).await?))
            })
        })
        .await
}

/// A namespace's tasks of live jobs by state: (queued or running, held).
const TASK_COUNTS: &str = "SELECT count(*) FILTER (WHERE t.state IN ('queued', 'running')),
            count(*) FILTER (WHERE t.state = 'held')
     FROM jobs j JOIN tasks t ON t.job_id = j.id
     WHERE j.namespace = $1 AND j.state IN ('queued', 'running', 'waiting_for_user', 'waiting_for_budget')";

async fn counts(c: &ClientWrapper, namespace: &str) -> Result<crate::TaskCounts> {
    let r = db_query_opt(c, TASK_COUNTS, &[&namespace]).await?;
    let n = |i: usize| r.as_ref().map_or(0, |r| r.get::<_, i64>(i).max(0) as u64);
    Ok(crate::TaskCounts { live: n(0), held: n(1) })
}

pub(super) async fn task_counts(store: &PostgresStore, namespace: &str) -> Result<crate::TaskCounts> {
    counts(&*store.pool.get().await?, namespace).await
}

pub(super) async fn admit_tasks(store: &PostgresStore, namespace: &str, tasks: &[TaskId]) -> Result<Vec<Task>> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let (namespace, ids) = (namespace.to_string(), tasks.iter().map(|t| t.0).collect::<Vec<Uuid>>());
    store
        .tx(move |tx| {
            Box::pin(async move {
                // NO KEY UPDATE, as admissions of jobs: they take turns, and
                // the count, a statement of its own, sees the last one's.
                let max = db_query_opt(
                    tx,
                    "SELECT (limits->>'max_tasks')::bigint FROM namespaces WHERE name = $1 FOR NO KEY UPDATE",
                    &[&namespace],
                )
                .await?
                .and_then(|r| r.get::<_, Option<i64>>(0));
                let free = match max {
                    Some(max) => max - counts(tx, &namespace).await?.live as i64,
                    None => i64::MAX,
                };
                if free <= 0 {
                    return Ok(Vec::new());
                }
                // The oldest first; their rows locked in id order, as a
                // job's cancel locks them.
                let rows = db_query(
                    tx,
                    &format!(
                        "WITH picked AS (SELECT id FROM tasks WHERE id = ANY($1) AND state = 'held'
                                         ORDER BY created_at, id LIMIT $2),
                              locked AS (SELECT id FROM tasks WHERE id IN (SELECT id FROM picked)
                                         ORDER BY id FOR UPDATE)
                         UPDATE tasks SET state = 'queued', updated_at = $3
                         WHERE id IN (SELECT id FROM locked) AND state = 'held'
                         RETURNING {TASK_COLS}"
                    ),
                    &[&ids, &free, &now_ms()],
                )
                .await?;
                rows.iter().map(decode_task).collect()
            })
        })
        .await
}
