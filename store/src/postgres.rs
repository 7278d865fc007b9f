//! The distributed backend: Postgres through a deadpool connection pool.
//!
//! Migrations are embedded and applied at start under an advisory lock (so
//! replicas starting together apply them once). Per-job event numbers and
//! per-session entry numbers come from counters on the job and session rows,
//! bumped with `UPDATE … RETURNING` inside the writing transaction: the row
//! lock serialises writers of one job without a table lock. A batch's entries
//! are stored as one chunk row per session (their bodies one JSON array, see
//! the design document's "Transcript chunks"), in one statement with their
//! uuids, never one round trip or one row per entry.
//! A fenced write takes the lease row `FOR SHARE`, so a takeover cannot commit
//! in the middle of it. Every decision about tasks, jobs and leases is
//! [`rules`]'s, made on rows loaded `FOR UPDATE` in the writing transaction, so
//! it still holds when its rows are stored.

use std::collections::BTreeMap;

use async_trait::async_trait;
use deadpool_postgres::ClientWrapper;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use flower_model::{
    Entry, Event, EventKind, Job, JobId, JobState, Role, Session, SessionId, Task, TaskId, TaskOutcome, Usage, now_ms,
};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};
use uuid::Uuid;

use crate::rules::{self, ClaimDecision, TaskChange};
use crate::{
    Batch, Claim, ClaimAnswer, ClaimRequest, EndOffer, Fence, Lease, NewJob, Result, Store, StoreError, TaskEnd,
    Written, migrations,
};

/// Advisory lock key serialising migrations across replicas.
const MIGRATION_LOCK: i64 = 0x666c_6f77_6572;

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        // The database's own message (e.g. the append-only trigger) is the useful part.
        match e.as_db_error() {
            // Class 22 (data exception: a NUL byte in text, an untranslatable
            // character) and 54 (program limit: an index row too large) say the
            // value itself cannot be stored: retrying cannot help.
            Some(db) if matches!(&db.code().code()[..2], "22" | "54") => StoreError::Invalid(db.message().to_string()),
            Some(db) => StoreError::Backend(db.message().to_string()),
            None => StoreError::Backend(e.to_string()),
        }
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        backend(e)
    }
}

/// What a process does with a database whose schema is older than its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchemaPolicy {
    /// Apply the missing migrations at start (one machine, tests, the default).
    #[default]
    Migrate,
    /// Refuse to run: `flower migrate` (a deployment's migration job) applies them.
    RequireCurrent,
    /// Connect only (`flower migrate` reads the version before applying).
    Leave,
}

/// The settings of every session of the store's pool: no sequential scan
/// where an index serves, and each prepared statement planned once. Each
/// statement flower sends is keyed (a primary key, a job, a session); a
/// pooled connection cached its generic plan after a few executions, and one
/// cached while a table was nearly empty (a fresh database, before its first
/// autoanalyze) scanned the whole table at every execution for the
/// connection's life, while a statement taking an array of keys was planned
/// again at every execution (its generic plan, costed for ten keys, never
/// beat the plan for the one it was given). No JIT compilation either:
/// flower's statements are small, and a plan that must still scan (no index
/// path: a job id's prefix, counts by state) carries the disabled scan's
/// cost, far past `jit_above_cost` — it was compiled at every execution
/// (~130 ms where the scan takes a fraction of one).
const SESSION_OPTIONS: &str = "-c enable_seqscan=off -c plan_cache_mode=force_generic_plan -c jit=off";

impl PostgresStore {
    /// Connect (`postgres://user@host:port/db`), with at most `max_connections`, and migrate.
    pub async fn connect(url: &str, max_connections: usize) -> Result<Self> {
        Self::connect_with(url, max_connections, SchemaPolicy::Migrate).await
    }

    /// Connect; an older schema is migrated, or refused, as `policy` says.
    pub async fn connect_with(url: &str, max_connections: usize, policy: SchemaPolicy) -> Result<Self> {
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e| StoreError::Backend(format!("database URL `{url}`: {e}")))?;
        // Every statement takes its index, whatever the planner's statistics
        // say (docs/design.md section 3, "Keyed statements take their index");
        // options in the URL come after, and win.
        let options = match config.get_options() {
            Some(theirs) if !theirs.is_empty() => format!("{SESSION_OPTIONS} {theirs}"),
            _ => SESSION_OPTIONS.to_string(),
        };
        config.options(&options);
        let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        // The connection used last goes out first: a sequential chain of
        // writes keeps to one warm backend (its caches, its prepared
        // statements) instead of going round every connection a burst opened.
        let pool = Pool::builder(manager)
            .max_size(max_connections.max(1))
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .build()
            .map_err(backend)?;
        let store = Self { pool };
        match policy {
            SchemaPolicy::Migrate => {
                store.migrate().await?;
            }
            SchemaPolicy::RequireCurrent => {
                let (current, needed) = (store.schema_version().await?, migrations::latest(migrations::POSTGRES));
                if current < needed {
                    return Err(StoreError::SchemaBehind { current, needed });
                }
                migrations::pending(migrations::POSTGRES, &[current])?;
            }
            SchemaPolicy::Leave => {}
        }
        Ok(store)
    }

    /// The database's schema version (0 for a database flower never touched).
    pub async fn schema_version(&self) -> Result<i32> {
        let client = self.pool.get().await?;
        let exists: bool =
            db_query_one(&client, "SELECT to_regclass('flower_migrations') IS NOT NULL", &[]).await?.get(0);
        if !exists {
            return Ok(0);
        }
        Ok(db_query_one(&client, "SELECT coalesce(max(version), 0) FROM flower_migrations", &[]).await?.get(0))
    }

    /// Apply what is pending (`flower migrate`): the versions before and after.
    pub async fn migrate_now(&self) -> Result<(i32, i32)> {
        let before = self.schema_version().await?;
        self.migrate().await?;
        Ok((before, self.schema_version().await?))
    }

    async fn migrate(&self) -> Result<()> {
        self.tx(|tx| {
            Box::pin(async move {
                db_execute(tx, "SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
                tx.batch_execute(migrations::VERSION_TABLE).await?;
                let applied: Vec<i32> = db_query(tx, "SELECT version FROM flower_migrations", &[])
                    .await?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                for (version, sql) in migrations::pending(migrations::POSTGRES, &applied)? {
                    tx.batch_execute(sql).await?;
                    db_execute(
                        tx,
                        "INSERT INTO flower_migrations (version, applied_at) VALUES ($1, $2)",
                        &[&version, &now_ms()],
                    )
                    .await?;
                    tracing::info!(version, "migration applied");
                }
                Ok(())
            })
        })
        .await
    }

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

    /// Run `f` in one transaction.
    async fn tx<T: Send + 'static>(
        &self,
        f: impl for<'a> FnOnce(&'a Tx<'a>) -> futures::future::BoxFuture<'a, Result<T>>,
    ) -> Result<T> {
        self.tx_ending(move |tx| {
            let work = f(tx);
            Box::pin(async move { Ok((work.await?, Ending::Open)) })
        })
        .await
    }

    /// Run `f` in one transaction, which `f` may end itself: its last
    /// statement carrying the `COMMIT` ([`write_events_ending`]).
    ///
    /// The `BEGIN` costs no round trip of its own: it is sent, and the
    /// statements of `f` queue behind it on the connection; its answer is
    /// read at the end. On an error the transaction is rolled back before
    /// the connection goes back to the pool; a connection whose state is
    /// unknown (the work dropped midway, a failed `BEGIN` or `ROLLBACK`)
    /// is closed instead, which ends its transaction on the server.
    async fn tx_ending<T>(
        &self,
        f: impl for<'a> FnOnce(&'a Tx<'a>) -> futures::future::BoxFuture<'a, Result<(T, Ending)>>,
    ) -> Result<T> {
        let mut held = Held(Some(self.pool.get().await?));
        let out = {
            let client = held.client()?;
            let mut begin = std::pin::pin!(client.batch_execute("BEGIN"));
            // The first poll sends it (the answer is read below).
            let sent = futures::poll!(begin.as_mut());
            let worked = f(&Tx(client)).await;
            let begun = match sent {
                std::task::Poll::Ready(begun) => begun,
                std::task::Poll::Pending => begin.await,
            };
            begun?;
            match worked {
                Ok((out, Ending::Sent)) => Ok(out),
                Ok((out, Ending::Open)) => {
                    client.batch_execute("COMMIT").await?;
                    Ok(out)
                }
                Err(e) => {
                    // After a `COMMIT` sent with a failed statement (which
                    // rolled back), this `ROLLBACK` finds no transaction: a
                    // warning, not an error.
                    client.batch_execute("ROLLBACK").await?;
                    Err(e)
                }
            }
        };
        held.release();
        out
    }
}

/// A pooled connection inside one transaction of [`PostgresStore::tx_ending`]:
/// statements go through its statement cache like any other.
struct Tx<'a>(&'a ClientWrapper);

impl std::ops::Deref for Tx<'_> {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        self.0
    }
}

/// A pooled connection that goes back to the pool only when released;
/// dropped otherwise, it is taken out of the pool and closed.
struct Held(Option<deadpool_postgres::Client>);

impl Held {
    fn client(&self) -> Result<&ClientWrapper> {
        self.0.as_deref().ok_or_else(|| StoreError::Backend("connection already released".into()))
    }

    /// The connection is outside any transaction: back to the pool.
    fn release(&mut self) {
        self.0.take();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

/// Every statement goes through the connection's statement cache: parsed and
/// planned once per connection, then one round trip per execution.
async fn db_query(c: &ClientWrapper, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
    let statement = c.prepare_cached(sql).await?;
    Ok(c.query(&statement, params).await?)
}

async fn db_query_opt(c: &ClientWrapper, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>> {
    let statement = c.prepare_cached(sql).await?;
    Ok(c.query_opt(&statement, params).await?)
}

async fn db_query_one(c: &ClientWrapper, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row> {
    let statement = c.prepare_cached(sql).await?;
    Ok(c.query_one(&statement, params).await?)
}

async fn db_execute(c: &ClientWrapper, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
    let statement = c.prepare_cached(sql).await?;
    Ok(c.execute(&statement, params).await?)
}

fn json<T: serde::Serialize>(v: &T) -> Result<serde_json::Value> {
    serde_json::to_value(v).map_err(corrupt)
}

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T> {
    serde_json::from_value(v).map_err(corrupt)
}

fn parse<T: std::str::FromStr>(s: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(corrupt)
}

/// [`check_fence`]'s statement.
const FENCE: &str = "SELECT epoch FROM leases WHERE job_id = $1 FOR SHARE";

/// Prepare `statements` on the connection (those not prepared yet, in one
/// round trip; none when all are), so that what is sent after goes out in
/// the order it is sent.
async fn prepare_all(c: &ClientWrapper, statements: &[&str]) -> Result<()> {
    futures::future::try_join_all(statements.iter().map(|sql| c.prepare_cached(sql))).await?;
    Ok(())
}

/// Reject the transaction unless `fence` still owns its job ([`rules::check_fence`]).
async fn check_fence(tx: &Tx<'_>, fence: Option<Fence>) -> Result<()> {
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

/// Store the mutable columns of task rows as [`rules`] decided them, in one statement.
async fn write_tasks(tx: &Tx<'_>, tasks: &[&Task]) -> Result<()> {
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
const WRITE_TASKS: &str =
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

/// Insert a session row (idempotent); its start event when it is new.
async fn insert_session(tx: &Tx<'_>, session: &Session) -> Result<Option<(JobId, EventKind)>> {
    let n = db_execute(
        tx,
        "INSERT INTO sessions (id, job_id, role, label, task_id, created_at) VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (id) DO NOTHING",
        &[
            &session.id.0,
            &session.job_id.0,
            &session.role.as_str(),
            &session.label,
            &session.task_id.map(|t| t.0),
            &session.created_at,
        ],
    )
    .await?;
    Ok((n == 1).then(|| (session.job_id, rules::session_started(session))))
}

/// Store entries as chunks (one row per session per batch, split at
/// [`CHUNK_ENTRIES`]) with their uuids, numbered from their session rows'
/// counters; their numbers, in order. The bodies are serialized before the
/// numbers are known, so they carry none: a chunk's entries are numbered by
/// their position from its `first_seq`. A batch goes out in parts of at
/// most [`PART_ENTRIES`], one statement each, pipelined: each part bumps the
/// counters by its own entries, and the statements run in order in this
/// transaction, so the numbers stay gapless across parts.
async fn write_entries(tx: &Tx<'_>, entries: Vec<Entry>) -> Result<Vec<i64>> {
    let mut parts = Vec::new();
    let mut rest = entries.into_iter().peekable();
    while rest.peek().is_some() {
        parts.push(Part::of(rest.by_ref().take(PART_ENTRIES))?);
    }
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    let statement = tx.prepare_cached(WRITE_PART).await?;
    let seqs = futures::future::try_join_all(parts.iter().map(|part| part.write(tx, &statement))).await?;
    Ok(seqs.concat())
}

/// Entries per statement (measured: one statement for a 1,000-entry batch
/// is no faster than four), so that no statement grows with a batch.
const PART_ENTRIES: usize = 256;

/// One part of a batch: the session counters bumped by the part's entries,
/// its uuids and its chunks (numbered from the counters); the counters'
/// bases and the chunks stored.
const WRITE_PART: &str = "WITH counter AS (
        UPDATE sessions s SET next_entry_seq = s.next_entry_seq + b.n
        FROM UNNEST($1::uuid[], $2::bigint[]) AS b(id, n)
        WHERE s.id = b.id AND s.id = ANY($1)
        RETURNING s.id, s.next_entry_seq - b.n AS base),
     unique_uuids AS (INSERT INTO entry_uuids (uuid) SELECT * FROM UNNEST($3::uuid[])),
     chunks AS (
        INSERT INTO entry_chunks (session_id, first_seq, last_seq, job_id, bodies)
        SELECT c.session, counter.base + c.first, counter.base + c.last, c.job, c.bodies
        FROM UNNEST($4::uuid[], $5::bigint[], $6::bigint[], $7::uuid[], $8::text[])
            AS c(session, first, last, job, bodies)
        JOIN counter ON counter.id = c.session
        RETURNING 1)
     SELECT id, base, (SELECT count(*) FROM chunks) FROM counter";

/// One statement's worth of a batch, serialized: its sessions with their
/// entry counts, per entry its session and number relative to the part,
/// its uuids, and its chunks as columns.
#[derive(Default)]
struct Part {
    sessions: Vec<Uuid>,
    counts: Vec<i64>,
    placed: Vec<(usize, i64)>,
    uuids: Vec<Uuid>,
    chunk_sessions: Vec<Uuid>,
    firsts: Vec<i64>,
    lasts: Vec<i64>,
    jobs: Vec<Uuid>,
    bodies: Vec<String>,
}

impl Part {
    fn of(entries: impl Iterator<Item = Entry>) -> Result<Self> {
        let mut part = Part::default();
        let mut index: BTreeMap<SessionId, usize> = BTreeMap::new();
        let mut chunks: Vec<Chunk> = Vec::new();
        // Each session's chunk still taking entries, as an index into `chunks`.
        let mut open: BTreeMap<usize, usize> = BTreeMap::new();
        for mut entry in entries {
            let s = *index.entry(entry.session_id).or_insert_with(|| {
                part.sessions.push(entry.session_id.0);
                part.counts.push(0);
                part.sessions.len() - 1
            });
            part.counts[s] += 1;
            let offset = part.counts[s];
            part.placed.push((s, offset));
            part.uuids.push(entry.uuid);
            entry.seq = 0;
            let at = match open.get(&s) {
                Some(&at) if chunks[at].takes(&entry, offset) => at,
                _ => {
                    chunks.push(Chunk::starting(&entry, offset));
                    open.insert(s, chunks.len() - 1);
                    chunks.len() - 1
                }
            };
            chunks[at].push(&entry, offset)?;
        }
        for chunk in chunks {
            part.chunk_sessions.push(chunk.session.0);
            part.firsts.push(chunk.first);
            part.lasts.push(chunk.last);
            part.jobs.push(chunk.job.0);
            part.bodies.push(chunk.finish()?);
        }
        Ok(part)
    }

    /// Store the part; its entries' numbers, in order.
    async fn write(&self, tx: &Tx<'_>, statement: &tokio_postgres::Statement) -> Result<Vec<i64>> {
        let params: [&(dyn ToSql + Sync); 8] = [
            &self.sessions,
            &self.counts,
            &self.uuids,
            &self.chunk_sessions,
            &self.firsts,
            &self.lasts,
            &self.jobs,
            &self.bodies,
        ];
        let rows = tx.query(statement, &params).await?;
        let base: BTreeMap<Uuid, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        if let Some(missing) = self.sessions.iter().find(|s| !base.contains_key(s)) {
            return Err(StoreError::NotFound(format!("session {missing}")));
        }
        let chunks = self.bodies.len() as i64;
        if rows.first().map(|r| r.get::<_, i64>(2)) != Some(chunks) {
            return Err(StoreError::Backend(format!("{chunks} transcript chunks written, fewer stored")));
        }
        Ok(self.placed.iter().map(|&(s, offset)| base[&self.sessions[s]] + offset).collect())
    }
}

/// At most this many entries in one stored chunk (the table's `CHECK` says
/// the same): the chunk holding a number starts at most this far before it.
pub const CHUNK_ENTRIES: i64 = 1024;

/// One `entry_chunks` row being built: consecutive entries of one session
/// (and job), their bodies as one JSON array; `first` and `last` relative
/// to the part until the session's counter answers.
struct Chunk {
    session: SessionId,
    job: JobId,
    first: i64,
    last: i64,
    body: Vec<u8>,
}

impl Chunk {
    fn starting(entry: &Entry, offset: i64) -> Self {
        Self { session: entry.session_id, job: entry.job_id, first: offset, last: offset - 1, body: vec![b'['] }
    }

    /// Whether `entry`, at `offset` in its session's part, continues this chunk.
    fn takes(&self, entry: &Entry, offset: i64) -> bool {
        entry.job_id == self.job && offset == self.last + 1 && offset - self.first < CHUNK_ENTRIES
    }

    fn push(&mut self, entry: &Entry, offset: i64) -> Result<()> {
        if self.last >= self.first {
            self.body.push(b',');
        }
        serde_json::to_writer(&mut self.body, entry).map_err(corrupt)?;
        self.last = offset;
        Ok(())
    }

    fn finish(mut self) -> Result<String> {
        self.body.push(b']');
        String::from_utf8(self.body).map_err(corrupt)
    }
}

/// Append events, numbering them from the job's counter, and add `usage` to
/// its job's total. The job row is locked last in every writing transaction,
/// and in one statement per job: the counter, the usage and the event rows
/// together, so the row — which every write of the job waits for — is held
/// for that one round trip and the commit, no longer.
async fn write_events(
    tx: &Tx<'_>,
    events: Vec<(JobId, EventKind)>,
    usage: impl IntoIterator<Item = (JobId, Usage)>,
) -> Result<Vec<Event>> {
    Ok(write_events_then(tx, events, usage, false, false).await?.0)
}

/// [`write_events`] as a transaction's last statements, its `COMMIT` sent
/// with the last one, in the same round trip: the job row is then held for
/// one round trip and the WAL flush, not a second round trip from the
/// client. Used through [`PostgresStore::tx_ending`].
///
/// `relaxed`: the commit does not wait for its WAL flush, and every job
/// written is marked (`jobs.unflushed_seq`) until a synchronous write of its
/// events, or a read that hands them out ([`flush_marked`]), makes it
/// durable. Only for a write whose dependents all commit synchronously
/// after it: see [`relaxed_turn`].
async fn write_events_ending(
    tx: &Tx<'_>,
    events: Vec<(JobId, EventKind)>,
    usage: impl IntoIterator<Item = (JobId, Usage)>,
    relaxed: bool,
) -> Result<(Vec<Event>, Ending)> {
    write_events_then(tx, events, usage, true, relaxed).await
}

/// Whether a batch may commit relaxed: a coordinator's turn (fenced) that
/// creates tasks, every row of it its own job's. Every write that depends on
/// the turn is a task's claim, which waits for the turn's commit and then
/// commits synchronously: a synchronous commit flushes the WAL up to its own
/// record, so the turn's with it. Until then nothing outside Postgres has
/// been told of the turn but task ids (a message whose task row a server
/// crash took away is dropped by its claim, as after a coordinator that died
/// before committing), and the reads that hand a job's events, tasks or
/// transcript to clients flush first ([`flush_marked`]). So a Postgres crash
/// can lose only a turn nobody has seen, which the coordinator then takes
/// again from what is stored, as after its own crash.
fn relaxed_turn(
    fence: Option<Fence>,
    tasks: &[(Task, bool)],
    events: &[(JobId, EventKind)],
    usage: Option<&(JobId, Usage)>,
) -> bool {
    let Some(fence) = fence else { return false };
    tasks.iter().any(|(_, created)| *created)
        && tasks.iter().all(|(t, _)| t.job_id == fence.job)
        && events.iter().all(|(job, _)| *job == fence.job)
        && usage.is_none_or(|(job, _)| *job == fence.job)
}

/// How long a read of a job's events holds back those of a relaxed commit
/// before it flushes them itself (see `events`).
const UNFLUSHED_HOLD: std::time::Duration = std::time::Duration::from_millis(100);

/// Makes every write committed so far durable: a synchronous commit of a
/// transaction that writes WAL (a transactional logical message, which
/// takes no lock and needs no privilege) flushes the WAL through its own
/// record. For a read about to hand out rows of a job marked with a relaxed
/// commit's writes (`jobs.unflushed_seq`).
async fn flush_marked(c: &ClientWrapper) -> Result<()> {
    c.batch_execute("SELECT pg_logical_emit_message(true, 'flower.flush', '')").await?;
    Ok(())
}

/// How a transaction's work left it: its `COMMIT` already sent (with its
/// last statement), or still to be sent.
enum Ending {
    Sent,
    Open,
}

/// The `COMMIT` sent with a transaction's last statement. After an error
/// in the transaction it rolls it back, as a `ROLLBACK` would.
const COMMIT_SENT: &str = "COMMIT";

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

async fn write_events_then(
    tx: &Tx<'_>,
    events: Vec<(JobId, EventKind)>,
    usage: impl IntoIterator<Item = (JobId, Usage)>,
    commit: bool,
    relaxed: bool,
) -> Result<(Vec<Event>, Ending)> {
    let mut by_job: BTreeMap<JobId, Vec<EventKind>> = BTreeMap::new();
    let mut usages: BTreeMap<JobId, Usage> = BTreeMap::new();
    for (job, u) in usage {
        by_job.entry(job).or_default();
        usages.entry(job).or_default().add(&u);
    }
    for (job, kind) in events {
        by_job.entry(job).or_default().push(kind);
    }
    // Every job's statement goes out at once, in job order (the order every
    // transaction locks job rows in). The COMMIT rides with them only when
    // each fails by itself whenever the write is wrong: with events, a
    // missing job row leaves their `seq` null, which the table refuses.
    let pipelined = commit && by_job.values().all(|kinds| !kinds.is_empty());
    if by_job.is_empty() {
        return Ok((Vec::new(), Ending::Open));
    }
    let statement = tx
        .prepare_cached(
            "WITH counter AS (
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
                RETURNING next_event_seq),
             inserted AS (
                INSERT INTO events (job_id, seq, at, kind, payload)
                SELECT $1, (SELECT next_event_seq FROM counter) - $2 + e.ord, $3, e.kind, e.payload
                FROM UNNEST($11::text[], $12::jsonb[]) WITH ORDINALITY AS e(kind, payload, ord)
                RETURNING 1),
             relaxed AS (SELECT set_config('synchronous_commit', 'off', true) WHERE $13)
             SELECT next_event_seq, (SELECT count(*) FROM inserted), (SELECT count(*) FROM relaxed) FROM counter",
        )
        .await?;
    let tokens = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
    let mut writes = Vec::with_capacity(by_job.len());
    for (job, kinds) in by_job {
        let (mut names, mut payloads) = (Vec::with_capacity(kinds.len()), Vec::with_capacity(kinds.len()));
        for kind in &kinds {
            names.push(kind.name().to_string());
            payloads.push(json(kind)?);
        }
        let add = usages.get(&job);
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
        writes.push(JobEvents { job, n, at, usage, added, names, payloads, kinds });
    }
    let params: Vec<[&(dyn ToSql + Sync); 13]> = writes
        .iter()
        .map(|w| {
            let [a, b, c, d, e, f] = &w.added;
            [&w.job.0 as &(dyn ToSql + Sync), &w.n, &w.at, &w.usage, a, b, c, d, e, f, &w.names, &w.payloads, &relaxed]
        })
        .collect();
    // Each statement is sent by its first poll (it is prepared already):
    // all of them in order, then the COMMIT, in one round trip.
    let queries = futures::future::try_join_all(params.iter().map(|p| tx.query_opt(&statement, p)));
    let rows = if pipelined { futures::try_join!(queries, tx.batch_execute(COMMIT_SENT))?.0 } else { queries.await? };
    let mut out = Vec::new();
    for (w, row) in writes.into_iter().zip(rows) {
        let row = row.ok_or_else(|| StoreError::NotFound(format!("job {}", w.job)))?;
        let (last, inserted): (i64, i64) = (row.get(0), row.get(1));
        if inserted != w.n {
            return Err(StoreError::Backend(format!("job {}: {inserted} of {} events stored", w.job, w.n)));
        }
        for (i, kind) in w.kinds.into_iter().enumerate() {
            out.push(Event { job_id: w.job, seq: last - w.n + 1 + i as i64, at: w.at, kind });
        }
    }
    out.sort_by_key(|e| (e.job_id, e.seq));
    Ok((out, if pipelined { Ending::Sent } else { Ending::Open }))
}

const JOB_COLS: &str =
    "id, name, state, reason, spec, final_answer, idempotency_key, usage, created_at, updated_at, parent, instruction";

fn decode_job(r: &Row) -> Result<Job> {
    Ok(Job {
        id: JobId(r.get(0)),
        name: r.get(1),
        state: parse(r.get::<_, &str>(2))?,
        reason: r.get(3),
        spec: r.get(4),
        final_answer: r.get(5),
        idempotency_key: r.get(6),
        usage: from_json(r.get(7))?,
        created_at: r.get(8),
        updated_at: r.get(9),
        continues: match (r.get::<_, Option<uuid::Uuid>>(10), r.get::<_, Option<String>>(11)) {
            (Some(parent), instruction) => {
                Some(flower_model::Lineage { parent: JobId(parent), instruction: instruction.unwrap_or_default() })
            }
            (None, _) => None,
        },
    })
}

async fn load_job(c: &ClientWrapper, id: JobId) -> Result<Job> {
    let row = db_query_opt(c, &format!("SELECT {JOB_COLS} FROM jobs WHERE id = $1"), &[&id.0])
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
    decode_job(&row)
}

const TASK_COLS: &str = "id, job_id, parent_session, tool_use_id, worker, mandate, description, state, attempt, claimed_by, report, error, usage, created_at, updated_at";

fn decode_task(r: &Row) -> Result<Task> {
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

/// The advisory-lock space of task rows being created (the two-key form,
/// which does not overlap the one-key space of [`MIGRATION_LOCK`]).
const TASK_LOCK_CLASS: i32 = 0x666c_7774;

/// A task id's advisory-lock key (a collision only makes a claim wait for
/// another task's creator).
fn task_lock_key(id: TaskId) -> i32 {
    let b = id.0.as_bytes();
    i32::from_le_bytes([b[0], b[1], b[2], b[3]]) ^ i32::from_le_bytes([b[12], b[13], b[14], b[15]])
}

/// Take the creation locks of `tasks` (exclusive, to the transaction's
/// end): a claim of one of them waits for this transaction (see
/// [`claim_locked`]), so its message may be published before the commit.
async fn lock_new_tasks(tx: &Tx<'_>, tasks: &[Task]) -> Result<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    db_execute(tx, LOCK_NEW_TASKS, &[&TASK_LOCK_CLASS, &lock_keys(tasks)]).await?;
    Ok(())
}

/// The creation-lock keys of `tasks`, in the one order every transaction
/// takes them in: two creators never wait on each other in a cycle.
fn lock_keys(tasks: &[Task]) -> Vec<i32> {
    let mut keys: Vec<i32> = tasks.iter().map(|t| task_lock_key(t.id)).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// [`lock_new_tasks`]'s statement.
const LOCK_NEW_TASKS: &str = "SELECT pg_advisory_xact_lock($1, k) FROM UNNEST($2::int4[]) AS k";

/// [`check_fence`] and [`lock_new_tasks`] in one statement (one statement's
/// work less for the server, on the path to a new task's message). Both
/// parts are evaluated whatever the other finds (each CTE is materialised:
/// one locks a row, the other calls a volatile function).
const FENCE_AND_LOCK: &str = "WITH fence AS (SELECT epoch FROM leases WHERE job_id = $1 FOR SHARE),
     locks AS (SELECT pg_advisory_xact_lock($2, k) FROM UNNEST($3::int4[]) AS k)
     SELECT (SELECT epoch FROM fence), (SELECT count(*) FROM locks)";

/// The statements [`fence_and_lock`] sends.
fn fence_and_lock_statements(fence: Option<Fence>, tasks: &[Task]) -> &'static [&'static str] {
    match (fence.is_some(), tasks.is_empty()) {
        (true, false) => &[FENCE_AND_LOCK],
        (true, true) => &[FENCE],
        (false, false) => &[LOCK_NEW_TASKS],
        (false, true) => &[],
    }
}

/// [`check_fence`] and [`lock_new_tasks`], in one statement when both apply.
async fn fence_and_lock(tx: &Tx<'_>, fence: Option<Fence>, tasks: &[Task]) -> Result<()> {
    match fence {
        Some(f) if !tasks.is_empty() => {
            let row = db_query_one(tx, FENCE_AND_LOCK, &[&f.job.0, &TASK_LOCK_CLASS, &lock_keys(tasks)]).await?;
            rules::check_fence(f, row.get::<_, Option<i64>>(0).unwrap_or(0))
        }
        _ => {
            futures::try_join!(check_fence(tx, fence), lock_new_tasks(tx, tasks))?;
            Ok(())
        }
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

/// Insert session rows in one statement (idempotent, as [`insert_session`]);
/// the ids of those this statement created.
async fn insert_sessions(tx: &Tx<'_>, sessions: &[&Session]) -> Result<std::collections::HashSet<Uuid>> {
    if sessions.is_empty() {
        return Ok(Default::default());
    }
    let (mut ids, mut jobs, mut roles, mut labels, mut tasks, mut ats) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for s in sessions {
        ids.push(s.id.0);
        jobs.push(s.job_id.0);
        roles.push(s.role.as_str());
        labels.push(s.label.as_str());
        tasks.push(s.task_id.map(|t| t.0));
        ats.push(s.created_at);
    }
    let rows = db_query(tx, INSERT_SESSIONS, &[&ids, &jobs, &roles, &labels, &tasks, &ats]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// [`insert_sessions`]'s statement.
const INSERT_SESSIONS: &str = "INSERT INTO sessions (id, job_id, role, label, task_id, created_at)
     SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::uuid[], $6::bigint[])
     ON CONFLICT (id) DO NOTHING RETURNING id";

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

/// [`check_required`]'s statement.
static REQUIRED: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("SELECT {TASK_COLS} FROM tasks WHERE id = ANY($1) FOR SHARE"));

/// Refuse the batch unless each required end is stored. The rows are read
/// under a share lock: a worker's end staged before its commit holds the row
/// lock, so this waits for that transaction and reads what it left.
async fn check_required(tx: &Tx<'_>, required: &[TaskEnd]) -> Result<()> {
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

fn decode_session(r: &Row) -> Result<Session> {
    Ok(Session {
        id: SessionId(r.get(0)),
        job_id: JobId(r.get(1)),
        role: parse::<Role>(r.get::<_, &str>(2))?,
        label: r.get(3),
        task_id: r.get::<_, Option<Uuid>>(4).map(TaskId),
        created_at: r.get(5),
    })
}

fn written(events: Vec<Event>) -> Written {
    Written { events, entry_seqs: vec![], tasks: vec![] }
}

/// Insert task rows (a row already there, a retried call, is left as it is
/// and reported as not created); the rows as stored. The `task_queued`
/// events of the created ones are added to `events`, to be numbered with
/// them.
///
/// One statement answers both: the rows it inserted (as inserted) and the
/// rows that were there before it (as its snapshot shows them). A row that
/// another transaction committed while this one waited on it is in
/// neither; those are read again in a statement of their own.
async fn insert_tasks(tx: &Tx<'_>, tasks: &[Task], events: &mut Vec<(JobId, EventKind)>) -> Result<Vec<(Task, bool)>> {
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
const TASK_COLUMNS: usize = 15;

/// [`insert_tasks`]'s statement: the rows inserted, then the rows its
/// snapshot holds of the others.
static INSERT_TASKS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH inserted AS (
            INSERT INTO tasks ({TASK_COLS})
            SELECT u.id, u.job_id, u.parent_session, u.tool_use_id, u.worker, u.mandate, u.description,
              'queued', 0, NULL, NULL, NULL, $8, $9, $9
            FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::text[])
              AS u (id, job_id, parent_session, tool_use_id, worker, mandate, description)
            ON CONFLICT (id) DO NOTHING
            RETURNING {TASK_COLS})
         SELECT *, true FROM inserted
         UNION ALL
         SELECT {TASK_COLS}, false FROM tasks WHERE id = ANY($1) AND id NOT IN (SELECT id FROM inserted)"
    )
});

#[async_trait]
impl Store for PostgresStore {
    async fn create_job(&self, job: NewJob) -> Result<(Job, bool)> {
        self.tx(move |tx| {
            Box::pin(async move {
                let now = now_ms();
                let inserted = db_query_opt(
                    tx,
                    "INSERT INTO jobs (id, name, state, spec, idempotency_key, usage, created_at, updated_at, parent, instruction)
                         VALUES ($1, $2, 'queued', $3, $4, $5, $6, $6, $7, $8)
                         ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
                    &[
                        &job.id.0,
                        &job.name,
                        &job.spec,
                        &job.idempotency_key,
                        &json(&Usage::default())?,
                        &now,
                        &job.continues.as_ref().map(|l| l.parent.0),
                        &job.continues.as_ref().map(|l| l.instruction.as_str()),
                    ],
                )
                .await?;
                if inserted.is_none() {
                    let row =
                        db_query_one(tx, "SELECT id FROM jobs WHERE idempotency_key = $1", &[&job.idempotency_key])
                            .await?;
                    return Ok((load_job(tx, JobId(row.get(0))).await?, false));
                }
                write_events(tx, vec![(job.id, rules::job_created())], None).await?;
                Ok((load_job(tx, job.id).await?, true))
            })
        })
        .await
    }

    async fn get_job(&self, id: JobId) -> Result<Job> {
        load_job(&*self.pool.get().await?, id).await
    }

    async fn resolve_job(&self, id_or_prefix: &str) -> Result<JobId> {
        let needle = id_or_prefix.trim().to_lowercase();
        if needle.is_empty() || !needle.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(StoreError::NotFound(format!("job `{id_or_prefix}`")));
        }
        let client = self.pool.get().await?;
        let rows = db_query(&client, "SELECT id FROM jobs WHERE id::text LIKE $1 || '%' LIMIT 2", &[&needle]).await?;
        match rows.as_slice() {
            [one] => Ok(JobId(one.get(0))),
            [] => Err(StoreError::NotFound(format!("job `{needle}`"))),
            _ => Err(StoreError::Ambiguous(needle)),
        }
    }

    async fn list_jobs(&self, limit: u32) -> Result<Vec<Job>> {
        let client = self.pool.get().await?;
        let rows = db_query(
            &client,
            &format!("SELECT {JOB_COLS} FROM jobs ORDER BY created_at DESC, id LIMIT $1"),
            &[&(limit as i64)],
        )
        .await?;
        rows.iter().map(decode_job).collect()
    }

    async fn continuations(&self, job: JobId) -> Result<Vec<JobId>> {
        let client = self.pool.get().await?;
        let rows =
            db_query(&client, "SELECT id FROM jobs WHERE parent = $1 ORDER BY created_at, id", &[&job.0]).await?;
        Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
    }

    async fn job_counts(&self) -> Result<Vec<(JobState, u64)>> {
        let client = self.pool.get().await?;
        let rows = db_query(&client, "SELECT state, count(*) FROM jobs GROUP BY state", &[]).await?;
        rows.iter()
            .map(|r| {
                let state: String = r.get(0);
                let n: i64 = r.get(1);
                let state = state.parse::<JobState>().map_err(corrupt)?;
                Ok((state, n.max(0) as u64))
            })
            .collect()
    }

    async fn set_job_state(
        &self,
        id: JobId,
        state: JobState,
        reason: Option<String>,
        final_answer: Option<String>,
        fence: Option<Fence>,
    ) -> Result<Written> {
        self.tx(move |tx| {
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

    async fn orphaned_jobs(&self, now_ms: i64, limit: u32) -> Result<Vec<JobId>> {
        let client = self.pool.get().await?;
        let rows = db_query(
            &client,
            "SELECT j.id FROM jobs j LEFT JOIN leases l ON l.job_id = j.id
                 WHERE j.state IN ('queued', 'running', 'waiting_for_user') AND (l.job_id IS NULL OR l.expires_at < $1)
                 ORDER BY j.created_at, j.id LIMIT $2",
            &[&now_ms, &(limit as i64)],
        )
        .await?;
        Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
    }

    async fn create_session(&self, session: Session) -> Result<Written> {
        self.tx(move |tx| {
            Box::pin(async move {
                let Some(event) = insert_session(tx, &session).await? else { return Ok(Written::default()) };
                Ok(written(write_events(tx, vec![event], None).await?))
            })
        })
        .await
    }

    async fn sessions(&self, job: JobId) -> Result<Vec<Session>> {
        let client = self.pool.get().await?;
        let rows = db_query(
            &client,
            "SELECT id, job_id, role, label, task_id, created_at FROM sessions WHERE job_id = $1
                 ORDER BY created_at, id",
            &[&job.0],
        )
        .await?;
        rows.iter().map(decode_session).collect()
    }

    async fn get_session(&self, id: SessionId) -> Result<Session> {
        let client = self.pool.get().await?;
        let row = db_query_opt(
            &client,
            "SELECT id, job_id, role, label, task_id, created_at FROM sessions WHERE id = $1",
            &[&id.0],
        )
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("session {id}")))?;
        decode_session(&row)
    }

    async fn append(&self, batch: Batch) -> Result<Written> {
        if batch.is_empty() {
            return Ok(Written::default());
        }
        self.tx_ending(move |tx| {
            Box::pin(async move {
                // Every statement before the events' goes out in one flight,
                // in this order: each is prepared first (a statement not yet
                // prepared on the connection goes out after its preparation,
                // out of order). The messages of new tasks are released with
                // the flight, whose first statement takes their creation
                // locks: a claim that reaches the server before it finds no
                // row and is made again (docs/design.md section 3, "A task's
                // message, with its creator's first flight"). The required
                // ends are read last: that read waits for their writers'
                // commits, and the writes before it are done meanwhile (none
                // of them takes a lock such a writer waits for: the job's row
                // is updated with the events, after it).
                let mut first: Vec<&str> = fence_and_lock_statements(batch.fence, &batch.tasks).to_vec();
                if !batch.tasks.is_empty() {
                    first.push(INSERT_TASKS.as_str());
                }
                if !batch.entries.is_empty() {
                    first.push(WRITE_PART);
                }
                if !batch.requires.is_empty() {
                    first.push(&REQUIRED);
                }
                prepare_all(tx, &first).await?;
                // Polled last, once the flight's statements are queued on
                // the connection ahead of the messages.
                let release = async {
                    if !batch.tasks.is_empty()
                        && let Some(staged) = &batch.staged
                    {
                        staged.fire();
                    }
                    Ok::<_, StoreError>(())
                };
                let mut events = batch.events;
                let (_, tasks, entry_seqs, _, _) = futures::try_join!(
                    fence_and_lock(tx, batch.fence, &batch.tasks),
                    insert_tasks(tx, &batch.tasks, &mut events),
                    write_entries(tx, batch.entries),
                    check_required(tx, &batch.requires),
                    release
                )?;
                let relaxed = relaxed_turn(batch.fence, &tasks, &events, batch.usage.as_ref());
                let (events, ending) = write_events_ending(tx, events, batch.usage, relaxed).await?;
                Ok((Written { events, entry_seqs, tasks }, ending))
            })
        })
        .await
    }

    async fn entries(&self, session: SessionId, after_seq: i64, limit: u32) -> Result<Vec<Entry>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let upto = after_seq.saturating_add(i64::from(limit));
        let client = self.pool.get().await?;
        // Both bounds on the key: the chunks holding (after_seq, upto].
        // With the mark of the session's job (see `events`).
        let rows = db_query(
            &client,
            "SELECT first_seq, bodies,
                (SELECT j.unflushed_seq FROM sessions s JOIN jobs j ON j.id = s.job_id WHERE s.id = $1)
             FROM entry_chunks
             WHERE session_id = $1 AND first_seq > $2 AND first_seq <= $3 AND last_seq > $4
             ORDER BY first_seq",
            &[&session.0, &after_seq.saturating_sub(CHUNK_ENTRIES), &upto, &after_seq],
        )
        .await?;
        if rows.first().is_some_and(|r| r.get::<_, Option<i64>>(2).is_some()) {
            flush_marked(&client).await?;
        }
        let mut out = Vec::new();
        for row in &rows {
            let first: i64 = row.get(0);
            let chunk: Vec<Entry> = serde_json::from_str(row.get::<_, &str>(1)).map_err(corrupt)?;
            for (i, mut entry) in chunk.into_iter().enumerate() {
                entry.seq = first + i as i64;
                if entry.seq > after_seq && entry.seq <= upto {
                    out.push(entry);
                }
            }
        }
        Ok(out)
    }

    async fn create_tasks(&self, tasks: Vec<Task>, fence: Option<Fence>) -> Result<(Vec<(Task, bool)>, Written)> {
        if tasks.is_empty() {
            return Ok((Vec::new(), Written::default()));
        }
        self.tx_ending(move |tx| {
            Box::pin(async move {
                fence_and_lock(tx, fence, &tasks).await?;
                let mut events = Vec::new();
                let out = insert_tasks(tx, &tasks, &mut events).await?;
                let (events, ending) = write_events_ending(tx, events, None, false).await?;
                Ok(((out, written(events)), ending))
            })
        })
        .await
    }

    async fn get_task(&self, id: TaskId) -> Result<Task> {
        load_task(&*self.pool.get().await?, id).await
    }

    async fn settled_task(&self, id: TaskId) -> Result<Task> {
        self.tx(move |tx| {
            Box::pin(async move {
                let row = db_query_opt(tx, &format!("SELECT {TASK_COLS} FROM tasks WHERE id = $1 FOR SHARE"), &[&id.0])
                    .await?
                    .ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
                decode_task(&row)
            })
        })
        .await
    }

    async fn tasks(&self, job: JobId) -> Result<Vec<Task>> {
        let client = self.pool.get().await?;
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

    async fn claim_task_ending(
        &self,
        id: TaskId,
        attempt: u32,
        worker_id: &str,
        session: Option<Session>,
        end: &EndOffer,
    ) -> Result<(Claim, Option<(Task, Written)>)> {
        let claim = ClaimRequest { task: id, attempt, worker_id: worker_id.to_string(), session, end: end.clone() };
        let mut answers = self.claim_group(vec![claim]).await?;
        answers.pop().unwrap_or_else(|| Err(StoreError::Backend(format!("task {id}: no answer to its claim"))))
    }

    async fn claim_tasks_ending(&self, claims: &[ClaimRequest]) -> Result<Vec<Result<ClaimAnswer>>> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        self.claim_group(claims.to_vec()).await
    }

    async fn finish_task_with(
        &self,
        id: TaskId,
        attempt: u32,
        outcome: TaskOutcome,
        usage: Usage,
        batch: Batch,
    ) -> Result<(Task, Written)> {
        self.tx_ending(move |tx| {
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
                let (events, ending) = write_events_ending(tx, events, batch.usage, false).await?;
                Ok(((change.task, Written { events, entry_seqs, tasks }), ending))
            })
        })
        .await
    }

    async fn heartbeat_task(&self, id: TaskId, attempt: u32) -> Result<bool> {
        self.tx(move |tx| {
            Box::pin(async move {
                let Some(task) = lock_task(tx, id).await? else { return Ok(false) };
                let Some(beat) = rules::heartbeat(&task, attempt, now_ms()) else { return Ok(false) };
                write_tasks(tx, &[&beat]).await?;
                Ok(true)
            })
        })
        .await
    }

    async fn cancel_tasks(&self, job: JobId, reason: &str) -> Result<Written> {
        let reason = reason.to_string();
        self.tx(move |tx| {
            Box::pin(async move {
                // Only unfinished rows are worth loading; which of them to
                // cancel, and in what order, is the rule's. Locked in id order,
                // so two cancels of one job cannot deadlock.
                let rows = db_query(
                    tx,
                    &format!(
                        "SELECT {TASK_COLS} FROM tasks WHERE job_id = $1 AND state IN ('queued', 'running')
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

    async fn acquire_lease(&self, job: JobId, owner: &str, ttl_ms: i64) -> Result<Option<Lease>> {
        let owner = owner.to_string();
        self.tx(move |tx| {
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
                Err(StoreError::Backend(format!("the lease of job {job} kept changing while being taken")))
            })
        })
        .await
    }

    async fn renew_leases(&self, leases: &[Lease], ttl_ms: i64) -> Result<Vec<bool>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let held = leases.to_vec();
        self.tx(move |tx| {
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

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let held = lease.clone();
        self.tx(move |tx| {
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

    async fn events(&self, job: JobId, after_seq: i64, limit: u32) -> Result<Vec<Event>> {
        let client = self.pool.get().await?;
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
        rows.iter()
            .map(|r| Ok(Event { job_id: job, seq: r.get(0), at: r.get(1), kind: from_json(r.get(2))? }))
            .collect()
    }
}

/// A throwaway database for one test or benchmark run, dropped afterwards.
pub struct ScratchDatabase {
    admin_url: String,
    pub name: String,
    pub url: String,
}

impl ScratchDatabase {
    /// Create `flower_scratch_<random>` through `admin_url` (a database URL with
    /// CREATE DATABASE rights). Fails loudly when Postgres is not there.
    pub async fn create(admin_url: &str) -> Result<Self> {
        let name = format!("flower_scratch_{}", Uuid::new_v4().simple());
        let (client, conn) = tokio_postgres::connect(admin_url, NoTls)
            .await
            .map_err(|e| StoreError::Backend(format!("cannot reach Postgres at {admin_url}: {e}")))?;
        let driver = tokio::spawn(conn);
        client.batch_execute(&format!("CREATE DATABASE {name}")).await?;
        drop(client);
        let _ = driver.await;
        let mut config: tokio_postgres::Config = admin_url.parse().map_err(backend)?;
        config.dbname(&name);
        let url = config_url(&config, &name);
        Ok(Self { admin_url: admin_url.to_string(), name, url })
    }

    /// Drop the database now (also done, best effort, on drop).
    pub async fn drop_now(&self) -> Result<()> {
        let (client, conn) = tokio_postgres::connect(&self.admin_url, NoTls).await?;
        let driver = tokio::spawn(conn);
        client.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)).await?;
        drop(client);
        let _ = driver.await;
        Ok(())
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let (admin, name) = (self.admin_url.clone(), self.name.clone());
        // Dropping needs async I/O; do it on a thread of its own so Drop works
        // inside and outside a runtime alike.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&admin, NoTls).await.ok()?;
                let driver = tokio::spawn(conn);
                let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
                drop(client);
                let _ = driver.await;
                Some(())
            })
        });
        let _ = done.join();
    }
}

/// A URL for `config` pointing at database `name` (host, port and user kept).
fn config_url(config: &tokio_postgres::Config, name: &str) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    format!("postgres://{user}@{host}:{port}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan an `EXPLAIN …` prints, its lines joined.
    async fn explained(c: &ClientWrapper, explain: &str) -> String {
        let lines: Vec<String> = c
            .simple_query(explain)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        lines.join("\n")
    }

    /// The task writes of a claim and of a turn, and the read of a required
    /// end, on the store's own connection of a fresh database (its tables
    /// empty, never analyzed): planned once, generic from the first
    /// execution, and keyed by the tasks' primary key, not a scan of the
    /// table; a statement that must scan is not JIT-compiled.
    #[tokio::test]
    async fn task_statements_are_keyed_on_a_fresh_database() {
        let admin = std::env::var("FLOWER_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let db = ScratchDatabase::create(&admin).await.expect("Postgres for the test");
        let store = PostgresStore::connect(&db.url, 1).await.unwrap();
        let c = store.pool.get().await.unwrap();
        let id = "'{0190c3a0-0000-7000-8000-000000000001}'";
        let statements = [
            (
                "write_tasks",
                WRITE_TASKS.to_string(),
                format!("({id}, '{{x}}', '{{1}}', '{{NULL}}', '{{NULL}}', '{{NULL}}', '{{\"{{}}\"}}', '{{0}}')"),
            ),
            (
                "insert_tasks",
                INSERT_TASKS.to_string(),
                format!("({id}, {id}, {id}, '{{x}}', '{{x}}', '{{x}}', '{{x}}', '{{}}', 0)"),
            ),
            ("required", REQUIRED.to_string(), format!("({id})")),
        ];
        for (name, sql, args) in statements {
            c.batch_execute(&format!("PREPARE {name} AS {sql}")).await.unwrap();
            let plan = explained(&c, &format!("EXPLAIN EXECUTE {name}{args}")).await;
            assert!(plan.contains("Index") && !plan.contains("Seq Scan on tasks"), "{name}:\n{plan}");
            // Planned once, generic from its first execution on.
            let planned = c
                .query_one("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1", &[&name])
                .await
                .unwrap();
            assert_eq!((planned.get::<_, i64>(0), planned.get::<_, i64>(1)), (1, 0), "{name}");
        }
        c.batch_execute("DEALLOCATE ALL").await.unwrap();
        // A statement with no index path still scans, and is not compiled.
        let counts = explained(&c, "EXPLAIN (ANALYZE) SELECT state, count(*) FROM jobs GROUP BY state").await;
        assert!(counts.contains("Seq Scan on jobs") && !counts.contains("JIT"), "{counts}");
        drop(c);
        drop(store);
        db.drop_now().await.unwrap();
    }

    #[test]
    fn inserted_tasks_answer_the_task_columns_and_whether_created() {
        assert_eq!(TASK_COLS.split(',').count(), TASK_COLUMNS);
        let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let cols = norm(TASK_COLS);
        // The insert's column list, its RETURNING and the snapshot's rows all name TASK_COLS.
        assert_eq!(norm(&INSERT_TASKS).matches(&cols).count(), 3, "{}", *INSERT_TASKS);
    }
}
