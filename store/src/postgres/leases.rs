//! Job leases: taken, renewed and given up as [`rules`] decides on the
//! locked lease row, and the fence check of a fenced write (the lease row
//! read `FOR SHARE`, so a takeover cannot commit in the middle of the write).

use flower_model::{JobId, now_ms};
use uuid::Uuid;

use super::PostgresStore;
use super::transaction::{Tx, db_execute, db_query, db_query_opt};
use crate::rules;
use crate::{Fence, Lease, Result, StoreError};

/// [`check_fence`]'s statement.
pub(super) const FENCE: &str = "SELECT epoch FROM leases WHERE job_id = $1 FOR SHARE";

/// Reject the transaction unless `fence` still owns its job ([`rules::check_fence`]).
pub(super) async fn check_fence(tx: &Tx<'_>, fence: Option<Fence>) -> Result<()> {
    let Some(f) = fence else { return Ok(()) };
    let row = db_query_opt(tx, FENCE, &[&f.job.0]).await?;
    rules::check_fence(f, row.map_or(0, |r| r.get(0)))
}

/// The job's lease row, locked for the decision about it.
async fn lock_lease(tx: &Tx<'_>, job: JobId) -> Result<Option<Lease>> {
    let row =
        db_query_opt(tx, "SELECT owner, epoch, expires_at FROM leases WHERE job_id = $1 FOR UPDATE", &[&job.0]).await?;
    Ok(row.map(|r| Lease { job, owner: r.get(0), epoch: r.get(1), expires_at: r.get(2) }))
}

/// Store a lease row over the one [`lock_lease`] found.
async fn update_lease(tx: &Tx<'_>, lease: &Lease) -> Result<()> {
    db_execute(
        tx,
        "UPDATE leases SET owner = $2, epoch = $3, expires_at = $4 WHERE job_id = $1",
        &[&lease.job.0, &lease.owner, &lease.epoch, &lease.expires_at],
    )
    .await?;
    Ok(())
}

/// Whether a job never run before may start: its namespace has no
/// `max_jobs`, or fewer jobs started and not ended. The namespace's row is
/// locked for the count, so two replicas starting jobs of one namespace
/// take turns.
async fn admitted(tx: &Tx<'_>, job: JobId) -> Result<bool> {
    let row = db_query_opt(
        tx,
        "SELECT n.name, (n.limits->>'max_jobs')::bigint FROM jobs j JOIN namespaces n ON n.name = j.namespace
         WHERE j.id = $1",
        &[&job.0],
    )
    .await?;
    let Some((namespace, Some(max))) = row.map(|r| (r.get::<_, String>(0), r.get::<_, Option<i64>>(1))) else {
        return Ok(true);
    };
    // NO KEY UPDATE: admissions take turns, while inserts of jobs and keys
    // of the namespace (their foreign keys take KEY SHARE) go on.
    db_query_opt(tx, "SELECT 1 FROM namespaces WHERE name = $1 FOR NO KEY UPDATE", &[&namespace]).await?;
    let live = db_query_opt(tx, LIVE_IN_NAMESPACE, &[&namespace, &job.0]).await?.map_or(0, |r| r.get::<_, i64>(0));
    Ok(live < max)
}

/// Jobs of a namespace ($1) started and not ended, but $2: running,
/// waiting, or queued with a lease (taken, its state not yet written).
const LIVE_IN_NAMESPACE: &str = "SELECT count(*) FROM jobs j
     WHERE j.namespace = $1 AND j.id <> $2
       AND j.state IN ('queued', 'running', 'waiting_for_user', 'waiting_for_budget')
       AND (j.state <> 'queued' OR EXISTS (SELECT 1 FROM leases l WHERE l.job_id = j.id))";

pub(super) async fn acquire_lease(
    store: &PostgresStore,
    job: JobId,
    owner: &str,
    ttl_ms: i64,
) -> Result<Option<Lease>> {
    let owner = owner.to_string();
    store
        .tx(move |tx| {
            Box::pin(async move {
                // Two replicas may both find no lease row; the second insert
                // then waits for the first and finds its row, and the decision
                // is made again on that row, locked.
                for _ in 0..2 {
                    let current = lock_lease(tx, job).await?;
                    let Some(lease) = rules::acquire_lease(current.as_ref(), job, &owner, now_ms(), ttl_ms) else {
                        return Ok(None);
                    };
                    if current.is_some() {
                        update_lease(tx, &lease).await?;
                        return Ok(Some(lease));
                    }
                    if !admitted(tx, job).await? {
                        return Ok(None);
                    }
                    let inserted = db_execute(
                        tx,
                        "INSERT INTO leases (job_id, owner, epoch, expires_at) VALUES ($1, $2, $3, $4)
                         ON CONFLICT (job_id) DO NOTHING",
                        &[&job.0, &lease.owner, &lease.epoch, &lease.expires_at],
                    )
                    .await?;
                    if inserted == 1 {
                        return Ok(Some(lease));
                    }
                }
                Err(StoreError::backend(format!("the lease of job {job} kept changing while being taken")))
            })
        })
        .await
}

pub(super) async fn renew_leases(store: &PostgresStore, leases: &[Lease], ttl_ms: i64) -> Result<Vec<bool>> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let held = leases.to_vec();
    store
        .tx(move |tx| {
            Box::pin(async move {
                // Every row locked in one statement, in job order (two replicas
                // renewing overlapping sets cannot deadlock), decided, and the
                // renewed ones written in one statement.
                let jobs: Vec<Uuid> = held.iter().map(|l| l.job.0).collect();
                let rows = db_query(
                    tx,
                    "SELECT job_id, owner, epoch, expires_at FROM leases WHERE job_id = ANY($1)
                 ORDER BY job_id FOR UPDATE",
                    &[&jobs],
                )
                .await?;
                let current: std::collections::HashMap<Uuid, Lease> = rows
                    .iter()
                    .map(|r| {
                        let job = JobId(r.get(0));
                        (job.0, Lease { job, owner: r.get(1), epoch: r.get(2), expires_at: r.get(3) })
                    })
                    .collect();
                let now = now_ms();
                let renewed: Vec<Option<Lease>> =
                    held.iter().map(|l| rules::renew_lease(current.get(&l.job.0), l, now, ttl_ms)).collect();
                let (ids, expiries): (Vec<Uuid>, Vec<i64>) =
                    renewed.iter().flatten().map(|l| (l.job.0, l.expires_at)).unzip();
                if !ids.is_empty() {
                    db_execute(
                        tx,
                        "UPDATE leases SET expires_at = u.expires_at
                     FROM UNNEST($1::uuid[], $2::bigint[]) AS u(job_id, expires_at)
                     WHERE leases.job_id = u.job_id AND leases.job_id = ANY($1)",
                        &[&ids, &expiries],
                    )
                    .await?;
                }
                Ok(renewed.iter().map(Option::is_some).collect())
            })
        })
        .await
}

pub(super) async fn release_lease(store: &PostgresStore, lease: &Lease) -> Result<()> {
    let held = lease.clone();
    store
        .tx(move |tx| {
            Box::pin(async move {
                let current = lock_lease(tx, held.job).await?;
                if let Some(released) = rules::release_lease(current.as_ref(), &held) {
                    update_lease(tx, &released).await?;
                }
                Ok(())
            })
        })
        .await
}
