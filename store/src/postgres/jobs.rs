//! Job rows: created (idempotent by key), read, resolved from an id prefix,
//! counted, moved between states as [`rules::set_job_state`] decides, and
//! found orphaned (no live lease).

use deadpool_postgres::ClientWrapper;
use flower_model::{Job, JobId, JobState, Usage, now_ms};
use tokio_postgres::Row;

use super::events::write_events;
use super::leases::check_fence;
use super::transaction::{db_execute, db_query, db_query_one, db_query_opt};
use super::{PostgresStore, corrupt, from_json, json, parse, written};
use crate::rules;
use crate::{Fence, NewJob, Result, StoreError, Written};

const JOB_COLS: &str = "id, name, state, reason, spec, final_answer, idempotency_key, usage, created_at, updated_at, parent, instruction, namespace, submitted_by";

fn decode_job(r: &Row) -> Result<Job> {
    Ok(Job {
        id: JobId(r.get(0)),
        name: r.get(1),
        state: parse(r.get::<_, &str>(2))?,
        reason: r.get(3),
        spec: r.get(4),
        final_answer: r.get(5),
        idempotency_key: r.get::<_, Option<String>>(6).map(crate::unscoped_key),
        usage: from_json(r.get(7))?,
        created_at: r.get(8),
        updated_at: r.get(9),
        continues: match (r.get::<_, Option<uuid::Uuid>>(10), r.get::<_, Option<String>>(11)) {
            (Some(parent), instruction) => {
                Some(flower_model::Lineage { parent: JobId(parent), instruction: instruction.unwrap_or_default() })
            }
            (None, _) => None,
        },
        namespace: r.get(12),
        submitted_by: r.get(13),
    })
}

async fn load_job(c: &ClientWrapper, id: JobId) -> Result<Job> {
    let row = db_query_opt(c, &format!("SELECT {JOB_COLS} FROM jobs WHERE id = $1"), &[&id.0])
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
    decode_job(&row)
}

pub(super) async fn create_job(store: &PostgresStore, job: NewJob) -> Result<(Job, bool)> {
    store.tx(move |tx| {
        Box::pin(async move {
            let now = now_ms();
            let key = job.idempotency_key.as_deref().map(|k| crate::scoped_key(&job.namespace, k));
            let inserted = db_query_opt(
                tx,
                "INSERT INTO jobs (id, name, state, spec, idempotency_key, usage, created_at, updated_at, parent, instruction, namespace, submitted_by)
                     VALUES ($1, $2, 'queued', $3, $4, $5, $6, $6, $7, $8, $9, $10)
                     ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
                &[
                    &job.id.0,
                    &job.name,
                    &job.spec,
                    &key,
                    &json(&Usage::default())?,
                    &now,
                    &job.continues.as_ref().map(|l| l.parent.0),
                    &job.continues.as_ref().map(|l| l.instruction.as_str()),
                    &job.namespace,
                    &job.submitted_by,
                ],
            )
            .await?;
            if inserted.is_none() {
                let row =
                    db_query_one(tx, "SELECT id FROM jobs WHERE idempotency_key = $1", &[&key]).await?;
                return Ok((load_job(tx, JobId(row.get(0))).await?, false));
            }
            write_events(tx, vec![(job.id, rules::job_created())], None).await?;
            Ok((load_job(tx, job.id).await?, true))
        })
    })
    .await
}

pub(super) async fn get_job(store: &PostgresStore, id: JobId) -> Result<Job> {
    load_job(&*store.pool.get().await?, id).await
}

pub(super) async fn resolve_job(store: &PostgresStore, namespace: Option<&str>, id_or_prefix: &str) -> Result<JobId> {
    let needle = id_or_prefix.trim().to_lowercase();
    if needle.is_empty() || !needle.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(StoreError::NotFound(format!("job `{id_or_prefix}`")));
    }
    let client = store.pool.get().await?;
    let rows = db_query(
        &client,
        "SELECT id FROM jobs WHERE id::text LIKE $1 || '%' AND ($2::text IS NULL OR namespace = $2) LIMIT 2",
        &[&needle, &namespace],
    )
    .await?;
    match rows.as_slice() {
        [one] => Ok(JobId(one.get(0))),
        [] => Err(StoreError::NotFound(format!("job `{needle}`"))),
        _ => Err(StoreError::Ambiguous(needle)),
    }
}

pub(super) async fn list_jobs(store: &PostgresStore, namespace: Option<&str>, limit: u32) -> Result<Vec<Job>> {
    let client = store.pool.get().await?;
    let limit = limit as i64;
    let rows = match namespace {
        Some(ns) => {
            let sql = format!("SELECT {JOB_COLS} FROM jobs WHERE namespace = $1 ORDER BY created_at DESC, id LIMIT $2");
            db_query(&client, &sql, &[&ns, &limit]).await?
        }
        None => {
            let sql = format!("SELECT {JOB_COLS} FROM jobs ORDER BY created_at DESC, id LIMIT $1");
            db_query(&client, &sql, &[&limit]).await?
        }
    };
    rows.iter().map(decode_job).collect()
}

pub(super) async fn continuations(store: &PostgresStore, job: JobId) -> Result<Vec<JobId>> {
    let client = store.pool.get().await?;
    let rows = db_query(&client, "SELECT id FROM jobs WHERE parent = $1 ORDER BY created_at, id", &[&job.0]).await?;
    Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
}

pub(super) async fn job_counts(store: &PostgresStore) -> Result<Vec<(String, JobState, u64)>> {
    let client = store.pool.get().await?;
    let rows = db_query(&client, "SELECT namespace, state, count(*) FROM jobs GROUP BY namespace, state", &[]).await?;
    rows.iter()
        .map(|r| {
            let state: String = r.get(1);
            let n: i64 = r.get(2);
            let state = state.parse::<JobState>().map_err(corrupt)?;
            Ok((r.get(0), state, n.max(0) as u64))
        })
        .collect()
}

pub(super) async fn set_job_state(
    store: &PostgresStore,
    id: JobId,
    state: JobState,
    reason: Option<String>,
    final_answer: Option<String>,
    fence: Option<Fence>,
) -> Result<Written> {
    store
        .tx(move |tx| {
            Box::pin(async move {
                check_fence(tx, fence).await?;
                let row =
                    db_query_opt(tx, &format!("SELECT {JOB_COLS} FROM jobs WHERE id = $1 FOR NO KEY UPDATE"), &[&id.0])
                        .await?
                        .ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
                let change = rules::set_job_state(&decode_job(&row)?, state, reason, final_answer, now_ms())?;
                let job = &change.job;
                db_execute(
                    tx,
                    "UPDATE jobs SET state = $2, reason = $3, final_answer = $4, updated_at = $5 WHERE id = $1",
                    &[&id.0, &job.state.as_str(), &job.reason, &job.final_answer, &job.updated_at],
                )
                .await?;
                Ok(written(write_events(tx, vec![(id, change.event)], None).await?))
            })
        })
        .await
}

pub(super) async fn orphaned_jobs(store: &PostgresStore, now_ms: i64, limit: u32) -> Result<Vec<JobId>> {
    let client = store.pool.get().await?;
    let rows = db_query(
        &client,
        "SELECT j.id FROM jobs j LEFT JOIN leases l ON l.job_id = j.id
             WHERE j.state IN ('queued', 'running', 'waiting_for_user', 'waiting_for_budget') AND (l.job_id IS NULL OR l.expires_at < $1)
               AND (l.job_id IS NOT NULL OR j.state <> 'queued' OR NOT EXISTS (
                    SELECT 1 FROM namespaces n WHERE n.name = j.namespace AND n.limits ? 'max_jobs'
                      AND (SELECT count(*) FROM jobs k WHERE k.namespace = n.name
                             AND k.state IN ('running', 'waiting_for_user', 'waiting_for_budget'))
                          >= (n.limits->>'max_jobs')::bigint))
             ORDER BY j.created_at, j.id LIMIT $2",
        &[&now_ms, &(limit as i64)],
    )
    .await?;
    Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
}
