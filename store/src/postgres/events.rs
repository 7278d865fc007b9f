//! Job events: numbered from the job row's counter in one statement per job
//! with the usage they add, the job row taken last in every writing
//! transaction; the `COMMIT` sent with that statement when it fails by
//! itself on a wrong write; a coordinator's turn committed relaxed and
//! flushed by its claims or by the reads that hand out its rows.

use std::collections::BTreeMap;

use deadpool_postgres::ClientWrapper;
use flower_model::{Event, EventKind, JobId, Task, Usage, now_ms};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::transaction::{COMMIT_SENT, Ending, Tx, db_query};
use super::{PostgresStore, from_json, json};
use crate::{Fence, Result, StoreError};

/// Append events, numbering them from the job's counter, and add `usage` to
/// its job's total. The job row is locked last in every writing transaction,
/// and in one statement per job: the counter, the usage and the event rows
/// together, so the row — which every write of the job waits for — is held
/// for that one round trip and the commit, no longer.
pub(super) async fn write_events(
    tx: &Tx<'_>,
    events: Vec<(JobId, EventKind)>,
    usage: impl IntoIterator<Item = (JobId, Usage)>,
) -> Result<Vec<Event>> {
    Ok(write_events_then(tx, events, usage, Commit::Later, Durability::Synchronous).await?.0)
}

/// [`write_events`] as a transaction's last statements, its `COMMIT` sent
/// with the last one, in the same round trip: the job row is then held for
/// one round trip and the WAL flush, not a second round trip from the
/// client. Used through [`PostgresStore::tx_ending`].
pub(super) async fn write_events_ending(
    tx: &Tx<'_>,
    events: Vec<(JobId, EventKind)>,
    usage: impl IntoIterator<Item = (JobId, Usage)>,
    durability: Durability,
) -> Result<(Vec<Event>, Ending)> {
    write_events_then(tx, events, usage, Commit::WithEvents, durability).await
}

/// Whether a write's events may carry its transaction's `COMMIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Commit {
    /// The transaction goes on after them: its `COMMIT` is sent later.
    Later,
    /// They are the transaction's last statements: the `COMMIT` goes with
    /// them when each fails by itself whenever the write is wrong.
    WithEvents,
}

/// Whether a transaction's commit waits for its WAL flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Durability {
    /// It does: every write but a relaxed turn.
    Synchronous,
    /// It does not, and every job written is marked (`jobs.unflushed_seq`)
    /// until a synchronous write of its events, or a read that hands them
    /// out ([`flush_marked`]), makes it durable. Only for a write whose
    /// dependents all commit synchronously after it: see [`batch_durability`].
    Relaxed,
}

/// How a batch commits: relaxed when it is a coordinator's turn (fenced)
/// that creates tasks, every row of it its own job's. Every write that
/// depends on the turn is a task's claim, which waits for the turn's commit
/// and then commits synchronously: a synchronous commit flushes the WAL up
/// to its own record, so the turn's with it. Until then nothing outside
/// Postgres has been told of the turn but task ids (a message whose task row
/// a server crash took away is dropped by its claim, as after a coordinator
/// that died before committing), and the reads that hand a job's events,
/// tasks or transcript to clients flush first ([`flush_marked`]). So a
/// Postgres crash can lose only a turn nobody has seen, which the
/// coordinator then takes again from what is stored, as after its own crash.
pub(super) fn batch_durability(
    fence: Option<Fence>,
    tasks: &[(Task, bool)],
    events: &[(JobId, EventKind)],
    usage: Option<&(JobId, Usage)>,
) -> Durability {
    let Some(fence) = fence else { return Durability::Synchronous };
    let turn = tasks.iter().any(|(_, created)| *created)
        && tasks.iter().all(|(t, _)| t.job_id == fence.job)
        && events.iter().all(|(job, _)| *job == fence.job)
        && usage.is_none_or(|(job, _)| *job == fence.job);
    if turn { Durability::Relaxed } else { Durability::Synchronous }
}

/// How long a read of a job's events holds back those of a relaxed commit
/// before it flushes them itself (see `events`).
const UNFLUSHED_HOLD: std::time::Duration = std::time::Duration::from_millis(100);

/// Makes every write committed so far durable: a synchronous commit of a
/// transaction that writes WAL (a transactional logical message, which
/// takes no lock and needs no privilege) flushes the WAL through its own
/// record. For a read about to hand out rows of a job marked with a relaxed
/// commit's writes (`jobs.unflushed_seq`).
pub(super) async fn flush_marked(c: &ClientWrapper) -> Result<()> {
    c.batch_execute("SELECT pg_logical_emit_message(true, 'flower.flush', '')").await?;
    Ok(())
}

/// [`write_events_then`]'s statement, one per job: the job's counter bumped
/// by its events ($2), its usage added ($4: whether any, $5 to $10 the
/// tokens) to the job and to its namespace's spend of the day, its events inserted numbered from the counter ($11, $12), and,
/// relaxed ($13), the job marked and the commit made not to wait for its
/// flush; the counter and how many events were inserted.
const WRITE_JOB_EVENTS: &str = "WITH counter AS (
        UPDATE jobs SET next_event_seq = next_event_seq + $2,
            usage = CASE WHEN $4 THEN jsonb_build_object(
                'input_tokens', COALESCE((usage->>'input_tokens')::bigint, 0) + $5,
                'output_tokens', COALESCE((usage->>'output_tokens')::bigint, 0) + $6,
                'cache_creation_input_tokens',
                    COALESCE((usage->>'cache_creation_input_tokens')::bigint, 0) + $7,
                'cache_read_input_tokens', COALESCE((usage->>'cache_read_input_tokens')::bigint, 0) + $8,
                'cache_creation', jsonb_build_object(
                    'ephemeral_5m_input_tokens',
                        COALESCE((usage->'cache_creation'->>'ephemeral_5m_input_tokens')::bigint, 0) + $9,
                    'ephemeral_1h_input_tokens',
                        COALESCE((usage->'cache_creation'->>'ephemeral_1h_input_tokens')::bigint, 0) + $10))
                ELSE usage END,
            updated_at = CASE WHEN $4 THEN $3 ELSE updated_at END,
            unflushed_seq = CASE WHEN $13 THEN COALESCE(unflushed_seq, next_event_seq + 1) END,
            unflushed_since = CASE WHEN $13 THEN COALESCE(unflushed_since, now()) END
        WHERE id = $1
        RETURNING next_event_seq, namespace),
     spent AS (
        INSERT INTO spend (namespace, day, job_id, input_tokens, output_tokens, cache_creation_input_tokens,
                           cache_read_input_tokens, ephemeral_1h_input_tokens)
        SELECT namespace, $3 / 86400000, $1, $5, $6, $7, $8, $10 FROM counter WHERE $4
        ON CONFLICT (namespace, day, job_id) DO UPDATE SET
            input_tokens = spend.input_tokens + EXCLUDED.input_tokens,
            output_tokens = spend.output_tokens + EXCLUDED.output_tokens,
            cache_creation_input_tokens = spend.cache_creation_input_tokens + EXCLUDED.cache_creation_input_tokens,
            cache_read_input_tokens = spend.cache_read_input_tokens + EXCLUDED.cache_read_input_tokens,
            ephemeral_1h_input_tokens = spend.ephemeral_1h_input_tokens + EXCLUDED.ephemeral_1h_input_tokens),
     inserted AS (
        INSERT INTO events (job_id, seq, at, kind, payload)
        SELECT $1, (SELECT next_event_seq FROM counter) - $2 + e.ord, $3, e.kind, e.payload
        FROM UNNEST($11::text[], $12::jsonb[]) WITH ORDINALITY AS e(kind, payload, ord)
        RETURNING 1),
     relaxed AS (SELECT set_config('synchronous_commit', 'off', true) WHERE $13)
     SELECT next_event_seq, (SELECT count(*) FROM inserted), (SELECT count(*) FROM relaxed) FROM counter";

/// One job's part of [`write_events_then`]: its statement's arguments,
/// owned, and the events they number.
struct JobEvents {
    job: JobId,
    n: i64,
    at: i64,
    usage: bool,
    added: [i64; 6],
    names: Vec<String>,
    payloads: Vec<serde_json::Value>,
    kinds: Vec<EventKind>,
}

impl JobEvents {
    /// The events and usage of a write, per job, in job order (the order
    /// every transaction locks job rows in); a job with usage but no event
    /// has no event to number.
    fn per_job(
        events: Vec<(JobId, EventKind)>,
        usage: impl IntoIterator<Item = (JobId, Usage)>,
    ) -> Result<Vec<JobEvents>> {
        let mut by_job: BTreeMap<JobId, Vec<EventKind>> = BTreeMap::new();
        let mut usages: BTreeMap<JobId, Usage> = BTreeMap::new();
        for (job, u) in usage {
            by_job.entry(job).or_default();
            usages.entry(job).or_default().add(&u);
        }
        for (job, kind) in events {
            by_job.entry(job).or_default().push(kind);
        }
        by_job.into_iter().map(|(job, kinds)| Self::of(job, kinds, usages.get(&job))).collect()
    }

    fn of(job: JobId, kinds: Vec<EventKind>, add: Option<&Usage>) -> Result<Self> {
        let (mut names, mut payloads) = (Vec::with_capacity(kinds.len()), Vec::with_capacity(kinds.len()));
        for kind in &kinds {
            names.push(kind.name().to_string());
            payloads.push(json(kind)?);
        }
        let tokens = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
        let u = add.copied().unwrap_or_default();
        let added = [
            u.input_tokens,
            u.output_tokens,
            u.cache_creation_input_tokens,
            u.cache_read_input_tokens,
            u.cache_creation.ephemeral_5m_input_tokens,
            u.cache_creation.ephemeral_1h_input_tokens,
        ]
        .map(tokens);
        let (n, at, usage) = (kinds.len() as i64, now_ms(), add.is_some());
        Ok(JobEvents { job, n, at, usage, added, names, payloads, kinds })
    }

    /// [`WRITE_JOB_EVENTS`]'s arguments.
    fn params<'a>(&'a self, relaxed: &'a bool) -> [&'a (dyn ToSql + Sync); 13] {
        let [a, b, c, d, e, f] = &self.added;
        [&self.job.0, &self.n, &self.at, &self.usage, a, b, c, d, e, f, &self.names, &self.payloads, relaxed]
    }

    /// The events as the statement's answer numbered them; a job with no
    /// row is not found, and an event not stored fails the write.
    fn numbered(self, row: Option<Row>) -> Result<Vec<Event>> {
        let row = row.ok_or_else(|| StoreError::NotFound(format!("job {}", self.job)))?;
        let (last, inserted): (i64, i64) = (row.get(0), row.get(1));
        if inserted != self.n {
            return Err(StoreError::backend(format!("job {}: {inserted} of {} events stored", self.job, self.n)));
        }
        let (job_id, first, at) = (self.job, last - self.n + 1, self.at);
        Ok(self.kinds.into_iter().zip(first..).map(|(kind, seq)| Event { job_id, seq, at, kind }).collect())
    }
}

/// [`write_events`] and [`write_events_ending`]: every job's statement goes
/// out at once, in job order, and the `COMMIT` with them when `commit` says
/// so and each fails by itself whenever the write is wrong — with events, a
/// missing job row leaves their `seq` null, which the table refuses.
async fn write_events_then(
    tx: &Tx<'_>,
    events: Vec<(JobId, EventKind)>,
    usage: impl IntoIterator<Item = (JobId, Usage)>,
    commit: Commit,
    durability: Durability,
) -> Result<(Vec<Event>, Ending)> {
    let writes = JobEvents::per_job(events, usage)?;
    if writes.is_empty() {
        return Ok((Vec::new(), Ending::Open));
    }
    let pipelined = commit == Commit::WithEvents && writes.iter().all(|w| w.n > 0);
    let statement = tx.prepare_cached(WRITE_JOB_EVENTS).await?;
    let relaxed = durability == Durability::Relaxed;
    // Each statement is sent by its first poll (it is prepared already):
    // all of them in order, then the COMMIT, in one round trip.
    let params: Vec<[&(dyn ToSql + Sync); 13]> = writes.iter().map(|w| w.params(&relaxed)).collect();
    let queries = futures::future::try_join_all(params.iter().map(|p| tx.query_opt(&statement, p)));
    let rows = if pipelined { futures::try_join!(queries, tx.batch_execute(COMMIT_SENT))?.0 } else { queries.await? };
    let mut out = Vec::new();
    for (w, row) in writes.into_iter().zip(rows) {
        out.extend(w.numbered(row)?);
    }
    out.sort_by_key(|e| (e.job_id, e.seq));
    Ok((out, if pipelined { Ending::Sent } else { Ending::Open }))
}

pub(super) async fn events(store: &PostgresStore, job: JobId, after_seq: i64, limit: u32) -> Result<Vec<Event>> {
    let client = store.pool.get().await?;
    // With the job's mark of writes not yet known flushed, read in the
    // same snapshot: no reader sees an event a server crash could take
    // back. A page reaching the mark stops before it while the mark is
    // young (the claim that flushes it comes within milliseconds, and
    // its notice wakes the watchers again); past `UNFLUSHED_HOLD`, the
    // read flushes, then hands out the whole page.
    let rows = db_query(
        &client,
        "SELECT e.seq, e.at, e.payload, mark.seq, mark.young
         FROM events e LEFT JOIN (
            SELECT unflushed_seq AS seq, now() - unflushed_since < make_interval(secs => $4) AS young
            FROM jobs WHERE id = $1) AS mark ON true
         WHERE e.job_id = $1 AND e.seq > $2 ORDER BY e.seq LIMIT $3",
        &[&job.0, &after_seq, &(limit as i64), &UNFLUSHED_HOLD.as_secs_f64()],
    )
    .await?;
    let mut rows = rows.as_slice();
    if let Some(last) = rows.last()
        && let Some(mark) = last.get::<_, Option<i64>>(3)
        && last.get::<_, i64>(0) >= mark
    {
        if last.get::<_, Option<bool>>(4).unwrap_or(false) {
            rows = &rows[..rows.partition_point(|r| r.get::<_, i64>(0) < mark)];
        } else {
            flush_marked(&client).await?;
        }
    }
    rows.iter().map(|r| Ok(Event { job_id: job, seq: r.get(0), at: r.get(1), kind: from_json(r.get(2))? })).collect()
}
