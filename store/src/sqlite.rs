//! The embedded backend: one SQLite file (WAL) under the run directory.
//!
//! rusqlite is blocking, so every call runs on the blocking pool
//! (`spawn_blocking`) holding the one connection: SQLite serialises writers
//! anyway, and a single connection makes the per-job sequence numbers trivially
//! gap-free. Stored entries are protected by a trigger: an UPDATE of a
//! transcript row aborts. The schema is [`migrations::SQLITE`], applied in
//! order in one transaction at open. Every decision about tasks, jobs and
//! leases is [`rules`]'s: this file loads rows, asks, and stores the answer.

mod access;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use flower_model::{
    Entry, Event, EventKind, Job, JobId, JobState, Role, Session, SessionId, Task, TaskId, TaskOutcome, TaskState,
    Usage, now_ms,
};
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};

use crate::rules::{self, ClaimEnding, TaskChange};
use crate::{
    Batch, Claim, ClaimAnswer, ClaimRequest, EndOffer, Fence, Lease, NewJob, Result, Store, StoreError, Written,
    migrations,
};

/// Connection settings, set before the migrations run (`foreign_keys` has no
/// effect inside a transaction, `journal_mode` cannot change inside one).
const PRAGMAS: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;";

#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

fn backend(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::backend_from(e)
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

/// Statements go through the connection's statement cache: parsed once, not
/// on every call (parsing was most of a write's instructions).
fn exec(c: &Connection, sql: &str, p: impl rusqlite::Params) -> rusqlite::Result<usize> {
    c.prepare_cached(sql)?.execute(p)
}

fn row<T>(
    c: &Connection,
    sql: &str,
    p: impl rusqlite::Params,
    f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    c.prepare_cached(sql)?.query_row(p, f)
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        backend(e)
    }
}

impl SqliteStore {
    /// Open (creating if needed) the database file and apply the schema.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)?;
        Self::init(conn)
    }

    /// A private in-memory database (tests).
    pub fn in_memory() -> Result<Self> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<Self> {
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.execute_batch(PRAGMAS)?;
        conn.set_prepared_statement_cache_capacity(64);
        // The query planner stability guarantee: a cached statement keeps its
        // plan whatever values are bound (without it, SQLite's STAT4 build
        // re-parses a statement whenever an indexed column's bound value changes).
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        migrate(&mut conn)?;
        Ok(Self { conn: Arc::new(Mutex::new(conn)) })
    }

    /// Run `f` with the connection on the blocking pool.
    async fn run<T: Send + 'static>(&self, f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static) -> Result<T> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().map_err(|_| StoreError::backend("sqlite connection poisoned"))?;
            f(&mut guard)
        })
        .await
        .map_err(backend)?
    }

    /// Run `f` in one write transaction.
    async fn tx<T: Send + 'static>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static) -> Result<T> {
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }
}

/// Apply the migrations this database lacks, in order, in one transaction
/// (an immediate one: two processes opening the same file apply them once).
fn migrate(conn: &mut Connection) -> Result<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(migrations::VERSION_TABLE)?;
    let applied: Vec<i32> = {
        let mut stmt = tx.prepare("SELECT version FROM flower_migrations")?;
        stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?
    };
    for (version, sql) in migrations::pending(migrations::SQLITE, &applied)? {
        tx.execute_batch(sql)?;
        tx.execute("INSERT INTO flower_migrations (version, applied_at) VALUES (?1, ?2)", params![version, now_ms()])?;
        tracing::info!(version, "sqlite migration applied");
    }
    tx.commit()?;
    Ok(())
}

fn json<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(corrupt)
}

fn parse<T: serde::de::DeserializeOwned>(s: &str) -> Result<T> {
    serde_json::from_str(s).map_err(corrupt)
}

fn parse_id<T: std::str::FromStr>(s: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(corrupt)
}

/// Append one event with the job's next sequence number.
fn write_event(tx: &Transaction<'_>, job: JobId, kind: EventKind) -> Result<Event> {
    let seq: i64 =
        row(tx, "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id = ?1", params![job.to_string()], |r| {
            r.get(0)
        })?;
    let at = now_ms();
    exec(
        tx,
        "INSERT INTO events (job_id, seq, at, kind, payload) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![job.to_string(), seq, at, kind.name(), json(&kind)?],
    )?;
    Ok(Event { job_id: job, seq, at, kind })
}

/// Reject the transaction unless `fence` still owns its job ([`rules::check_fence`]).
fn check_fence(tx: &Transaction<'_>, fence: Option<Fence>) -> Result<()> {
    let Some(f) = fence else { return Ok(()) };
    let current = load_lease(tx, f.job)?.map_or(0, |l| l.epoch);
    rules::check_fence(f, current)
}

fn load_lease(conn: &Connection, job: JobId) -> Result<Option<Lease>> {
    Ok(row(conn, "SELECT owner, epoch, expires_at FROM leases WHERE job_id = ?1", params![job.to_string()], |r| {
        Ok(Lease { job, owner: r.get(0)?, epoch: r.get(1)?, expires_at: r.get(2)? })
    })
    .optional()?)
}

/// Store a lease row as [`rules`] decided it.
fn write_lease(tx: &Transaction<'_>, lease: &Lease) -> Result<()> {
    exec(tx,
        "INSERT INTO leases (job_id, owner, epoch, expires_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (job_id) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch, expires_at = excluded.expires_at",
        params![lease.job.to_string(), lease.owner, lease.epoch, lease.expires_at],
    )?;
    Ok(())
}

/// Store the mutable columns of a task row as [`rules`] decided them.
fn write_task(tx: &Transaction<'_>, task: &Task) -> Result<()> {
    let mut stmt = tx.prepare_cached(
        "UPDATE tasks SET state = ?2, attempt = ?3, claimed_by = ?4, report = ?5, error = ?6, usage = ?7, updated_at = ?8
         WHERE id = ?1",
    )?;
    stmt.execute(params![
        task.id.to_string(),
        task.state.as_str(),
        task.attempt,
        task.claimed_by,
        task.report,
        task.error,
        json(&task.usage)?,
        task.updated_at
    ])?;
    Ok(())
}

/// End `task` (as loaded in this transaction) from `attempt`, with `batch`
/// committed before the end: [`Store::finish_task_with`]'s writes.
fn finish_loaded(
    tx: &Transaction<'_>,
    task: &Task,
    attempt: u32,
    outcome: TaskOutcome,
    usage: Usage,
    batch: Batch,
) -> Result<(Task, Written)> {
    check_fence(tx, batch.fence)?;
    let change = rules::finish(task, attempt, outcome, usage, now_ms())?;
    store_end(tx, change, batch)
}

/// Store an end [`rules`] decided, with `batch` committed before it (its
/// fence already checked).
fn store_end(tx: &Transaction<'_>, change: TaskChange, batch: Batch) -> Result<(Task, Written)> {
    check_required(tx, &batch.requires)?;
    let entry_seqs = write_entries(tx, batch.entries)?;
    if let Some((job, usage)) = batch.usage {
        add_usage(tx, job, &usage)?;
    }
    let mut written = Written { entry_seqs, ..Default::default() };
    for (job, kind) in batch.events {
        written.events.push(write_event(tx, job, kind)?);
    }
    written.tasks = insert_tasks(tx, batch.tasks, &mut written)?;
    let (task, event) = apply_task_change(tx, change)?;
    written.events.push(event);
    Ok((task, written))
}

/// Store a task change and number its event.
fn apply_task_change(tx: &Transaction<'_>, change: TaskChange) -> Result<(Task, Event)> {
    write_task(tx, &change.task)?;
    let event = write_event(tx, change.task.job_id, change.event)?;
    Ok((change.task, event))
}

const JOB_COLS: &str = "id, name, state, reason, spec, final_answer, idempotency_key, usage, created_at, updated_at, parent, instruction, namespace, submitted_by";

/// [`Store::claim_task_ending`] inside `tx`.
fn claim_in(tx: &Transaction<'_>, claim: &ClaimRequest) -> Result<ClaimAnswer> {
    let id = claim.task;
    let task = load_task(tx, &id.to_string())?.ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
    let (change, end) =
        match rules::claim_ending(&task, claim.attempt, &claim.worker_id, now_ms(), || claim.end.decide()) {
            ClaimEnding::Answer(answer) => return Ok((answer, None)),
            ClaimEnding::Take { claim: change, end } => (change, end),
        };
    let (task, event) = apply_task_change(tx, change)?;
    let mut events = vec![event];
    if let Some(session) = &claim.session {
        events.extend(insert_session(tx, session)?);
    }
    // The end is never staged here: this backend publishes after the commit.
    let ended = match end {
        Some(end) => {
            check_fence(tx, end.batch.fence)?;
            Some(store_end(tx, end.change, end.batch)?)
        }
        None => None,
    };
    Ok((Claim::Claimed { task, events }, ended))
}

/// Insert a session row (idempotent); its start event when it is new.
fn insert_session(tx: &Transaction<'_>, session: &Session) -> Result<Option<Event>> {
    let n = exec(
        tx,
        "INSERT OR IGNORE INTO sessions (id, job_id, role, label, task_id, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            session.id.to_string(),
            session.job_id.to_string(),
            session.role.as_str(),
            session.label,
            session.task_id.map(|t| t.to_string()),
            session.created_at
        ],
    )?;
    if n == 1 { Ok(Some(write_event(tx, session.job_id, rules::session_started(session))?)) } else { Ok(None) }
}

/// Number entries per session and insert them; their numbers, in order.
fn write_entries(tx: &Transaction<'_>, entries: Vec<Entry>) -> Result<Vec<i64>> {
    let mut seqs = Vec::with_capacity(entries.len());
    // Each session's last number, read once per batch; an unknown session is named.
    let mut last = tx.prepare_cached(
        "SELECT (SELECT COALESCE(MAX(seq), 0) FROM entries WHERE session_id = ?1) FROM sessions WHERE id = ?1",
    )?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO entries (session_id, seq, uuid, job_id, kind, body, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let mut next: HashMap<SessionId, i64> = HashMap::new();
    for mut entry in entries {
        let sid = entry.session_id.to_string();
        let seq = match next.get_mut(&entry.session_id) {
            Some(seq) => seq,
            None => {
                let found: Option<i64> = last.query_row(params![sid], |r| r.get(0)).optional()?;
                let found = found.ok_or_else(|| StoreError::NotFound(format!("session {sid}")))?;
                next.entry(entry.session_id).or_insert(found)
            }
        };
        *seq += 1;
        entry.seq = *seq;
        insert.execute(params![
            sid,
            entry.seq,
            entry.uuid.to_string(),
            entry.job_id.to_string(),
            entry.kind.as_str(),
            json(&entry)?,
            entry.created_at
        ])?;
        seqs.push(entry.seq);
    }
    Ok(seqs)
}

/// A job row's text columns (in `JOB_COLS` order, the two times left out).
type JobRow = [Option<String>; 12];

fn job_row(r: &Row<'_>) -> rusqlite::Result<JobRow> {
    Ok([
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(10)?,
        r.get(11)?,
        r.get(12)?,
        r.get(13)?,
    ])
}

fn decode_job(cols: JobRow, created_at: i64, updated_at: i64) -> Result<Job> {
    let [
        id,
        name,
        state,
        reason,
        spec,
        final_answer,
        idempotency_key,
        usage,
        parent,
        instruction,
        namespace,
        submitted_by,
    ] = cols;
    let need = |v: Option<String>| v.ok_or_else(|| corrupt("null in a required job column"));
    Ok(Job {
        id: parse_id(&need(id)?)?,
        name: need(name)?,
        state: parse_id(&need(state)?)?,
        reason,
        spec: parse(&need(spec)?)?,
        final_answer,
        idempotency_key: idempotency_key.map(crate::unscoped_key),
        usage: parse(&need(usage)?)?,
        created_at,
        updated_at,
        continues: match parent {
            Some(p) => {
                Some(flower_model::Lineage { parent: parse_id(&p)?, instruction: instruction.unwrap_or_default() })
            }
            None => None,
        },
        namespace: need(namespace)?,
        submitted_by,
    })
}

fn load_job(conn: &Connection, id: &str) -> Result<Option<Job>> {
    row(conn, &format!("SELECT {JOB_COLS} FROM jobs WHERE id = ?1"), params![id], |r| {
        Ok((job_row(r)?, r.get::<_, i64>(8)?, r.get::<_, i64>(9)?))
    })
    .optional()?
    .map(|(c, a, b)| decode_job(c, a, b))
    .transpose()
}

const TASK_COLS: &str = "id, job_id, parent_session, tool_use_id, worker, mandate, description, state, attempt, claimed_by, report, error, usage, created_at, updated_at";

fn load_task(conn: &Connection, id: &str) -> Result<Option<Task>> {
    let mut stmt = conn.prepare_cached(&format!("SELECT {TASK_COLS} FROM tasks WHERE id = ?1"))?;
    let mut rows = stmt.query(params![id])?;
    match rows.next()? {
        Some(r) => Ok(Some(decode_task(r)?)),
        None => Ok(None),
    }
}

/// Refuse the batch unless each required end is stored ([`crate::Batch::requires`]).
fn check_required(tx: &Connection, required: &[crate::TaskEnd]) -> Result<()> {
    for r in required {
        let ok = load_task(tx, &r.task.to_string())?.is_some_and(|t| rules::ended_as(&t, r));
        if !ok {
            return Err(rules::unconfirmed(r));
        }
    }
    Ok(())
}

fn decode_task(r: &Row<'_>) -> Result<Task> {
    Ok(Task {
        id: parse_id(&r.get::<_, String>(0)?)?,
        job_id: parse_id(&r.get::<_, String>(1)?)?,
        parent_session: parse_id(&r.get::<_, String>(2)?)?,
        tool_use_id: r.get(3)?,
        worker: r.get(4)?,
        mandate: r.get(5)?,
        description: r.get(6)?,
        state: parse_id(&r.get::<_, String>(7)?)?,
        attempt: r.get(8)?,
        claimed_by: r.get(9)?,
        report: r.get(10)?,
        error: r.get(11)?,
        usage: parse(&r.get::<_, String>(12)?)?,
        created_at: r.get(13)?,
        updated_at: r.get(14)?,
    })
}

fn decode_session(r: &Row<'_>) -> Result<Session> {
    Ok(Session {
        id: parse_id(&r.get::<_, String>(0)?)?,
        job_id: parse_id(&r.get::<_, String>(1)?)?,
        role: parse_id::<Role>(&r.get::<_, String>(2)?)?,
        label: r.get(3)?,
        task_id: r.get::<_, Option<String>>(4)?.map(|s| parse_id(&s)).transpose()?,
        created_at: r.get(5)?,
    })
}

/// A namespace's tasks of live jobs: (queued or running, held).
fn task_counts(c: &Connection, namespace: &str) -> Result<crate::TaskCounts> {
    let (live, held): (i64, i64) = row(
        c,
        "SELECT coalesce(sum(t.state IN ('queued', 'running')), 0), coalesce(sum(t.state = 'held'), 0)
         FROM jobs j JOIN tasks t ON t.job_id = j.id
         WHERE j.namespace = ?1 AND j.state IN ('queued', 'running', 'waiting_for_user', 'waiting_for_budget')",
        params![namespace],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(crate::TaskCounts { live: live.max(0) as u64, held: held.max(0) as u64 })
}

/// [`Store::admit_tasks`]: one writer at a time, so the count holds.
fn admit_tasks(tx: &Transaction<'_>, namespace: &str, tasks: &[TaskId]) -> Result<Vec<Task>> {
    let max: Option<i64> = row(
        tx,
        "SELECT json_extract(limits, '$.max_tasks') FROM namespaces WHERE name = ?1",
        params![namespace],
        |r| r.get(0),
    )
    .optional()?
    .flatten();
    let mut free = match max {
        Some(max) => max - task_counts(tx, namespace)?.live as i64,
        None => i64::MAX,
    };
    let mut held = Vec::new();
    for id in tasks {
        if let Some(t) = load_task(tx, &id.to_string())?.filter(|t| t.state == TaskState::Held) {
            held.push(t);
        }
    }
    held.sort_by_key(|t| (t.created_at, t.id.0));
    let now = now_ms();
    let mut out = Vec::new();
    for mut t in held {
        if free <= 0 {
            break;
        }
        exec(tx, "UPDATE tasks SET state = 'queued', updated_at = ?2 WHERE id = ?1", params![t.id.to_string(), now])?;
        (t.state, t.updated_at) = (TaskState::Queued, now);
        out.push(t);
        free -= 1;
    }
    Ok(out)
}

/// Whether a job never run before may start: its namespace has no
/// `max_jobs`, or fewer jobs started and not ended (running, waiting, or
/// queued with a lease). One writer at a time: the count holds.
fn admitted(tx: &Transaction<'_>, job: JobId) -> Result<bool> {
    let id = job.to_string();
    let max: Option<i64> = row(
        tx,
        "SELECT json_extract(n.limits, '$.max_jobs') FROM jobs j JOIN namespaces n ON n.name = j.namespace
         WHERE j.id = ?1",
        params![id],
        |r| r.get(0),
    )
    .optional()?
    .flatten();
    let Some(max) = max else { return Ok(true) };
    let live: i64 = row(
        tx,
        "SELECT count(*) FROM jobs j
         WHERE j.namespace = (SELECT namespace FROM jobs WHERE id = ?1) AND j.id <> ?1
           AND j.state IN ('queued', 'running', 'waiting_for_user', 'waiting_for_budget')
           AND (j.state <> 'queued' OR EXISTS (SELECT 1 FROM leases l WHERE l.job_id = j.id))",
        params![id],
        |r| r.get(0),
    )?;
    Ok(live < max)
}

fn add_usage(tx: &Transaction<'_>, job: JobId, usage: &Usage) -> Result<()> {
    let id = job.to_string();
    let current: Option<(String, String)> =
        row(tx, "SELECT usage, namespace FROM jobs WHERE id = ?1", params![id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
    let (current, namespace) = current.ok_or_else(|| StoreError::NotFound(format!("job {job}")))?;
    let mut total: Usage = parse(&current)?;
    total.add(usage);
    let at = now_ms();
    exec(tx, "UPDATE jobs SET usage = ?2, updated_at = ?3 WHERE id = ?1", params![id, json(&total)?, at])?;
    // The namespace's spend of the day (docs/design.md, section 17).
    let n = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
    exec(
        tx,
        "INSERT INTO spend (namespace, day, job_id, input_tokens, output_tokens, cache_creation_input_tokens,
                            cache_read_input_tokens, ephemeral_1h_input_tokens)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (namespace, day, job_id) DO UPDATE SET
            input_tokens = input_tokens + excluded.input_tokens,
            output_tokens = output_tokens + excluded.output_tokens,
            cache_creation_input_tokens = cache_creation_input_tokens + excluded.cache_creation_input_tokens,
            cache_read_input_tokens = cache_read_input_tokens + excluded.cache_read_input_tokens,
            ephemeral_1h_input_tokens = ephemeral_1h_input_tokens + excluded.ephemeral_1h_input_tokens",
        params![
            namespace,
            flower_model::access::day_of(at),
            id,
            n(usage.input_tokens),
            n(usage.output_tokens),
            n(usage.cache_creation_input_tokens),
            n(usage.cache_read_input_tokens),
            n(usage.cache_creation.ephemeral_1h_input_tokens)
        ],
    )?;
    Ok(())
}

/// Insert task rows, queued — held when their job's namespace limits its
/// tasks (a row already there, a retried call, is left as it
/// is and reported as not created), numbering the created ones'
/// `task_queued` events into `written`; the rows as stored.
fn insert_tasks(tx: &Transaction<'_>, tasks: Vec<Task>, written: &mut Written) -> Result<Vec<(Task, bool)>> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        let id = task.id.to_string();
        if let Some(existing) = load_task(tx, &id)? {
            out.push((existing, false));
            continue;
        }
        exec(
            tx,
            &format!(
                "INSERT INTO tasks ({TASK_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7,
                   CASE WHEN EXISTS (SELECT 1 FROM jobs j JOIN namespaces n ON n.name = j.namespace
                                     WHERE j.id = ?2 AND json_extract(n.limits, '$.max_tasks') IS NOT NULL)
                        THEN 'held' ELSE 'queued' END,
                   0, NULL, NULL, NULL, ?8, ?9, ?9)"
            ),
            params![
                id,
                task.job_id.to_string(),
                task.parent_session.to_string(),
                task.tool_use_id,
                task.worker,
                task.mandate,
                task.description,
                json(&Usage::default())?,
                now_ms()
            ],
        )?;
        written.events.push(write_event(tx, task.job_id, rules::task_queued(&task))?);
        let stored = load_task(tx, &id)?.ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
        out.push((stored, true));
    }
    Ok(out)
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_job(&self, job: NewJob) -> Result<(Job, bool)> {
        self.tx(move |tx| {
            let key = job.idempotency_key.as_deref().map(|k| crate::scoped_key(&job.namespace, k));
            if let Some(key) = &key {
                let existing: Option<String> =
                    row(tx, "SELECT id FROM jobs WHERE idempotency_key = ?1", params![key], |r| r.get(0)).optional()?;
                if let Some(id) = existing {
                    let found = load_job(tx, &id)?.ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
                    return Ok((found, false));
                }
            }
            let now = now_ms();
            exec(
                tx,
                &format!(
                    "INSERT INTO jobs ({JOB_COLS}) VALUES (?1, ?2, 'queued', NULL, ?3, NULL, ?4, ?5, ?6, ?6, ?7, ?8, ?9, ?10)"
                ),
                params![
                    job.id.to_string(),
                    job.name,
                    json(&job.spec)?,
                    key,
                    json(&Usage::default())?,
                    now,
                    job.continues.as_ref().map(|l| l.parent.to_string()),
                    job.continues.as_ref().map(|l| l.instruction.clone()),
                    job.namespace,
                    job.submitted_by,
                ],
            )?;
            write_event(tx, job.id, rules::job_created())?;
            let created =
                load_job(tx, &job.id.to_string())?.ok_or_else(|| StoreError::NotFound(format!("job {}", job.id)))?;
            Ok((created, true))
        })
        .await
    }

    async fn get_job(&self, id: JobId) -> Result<Job> {
        self.run(move |c| load_job(c, &id.to_string())?.ok_or_else(|| StoreError::NotFound(format!("job {id}")))).await
    }

    async fn resolve_job_in(&self, namespace: Option<&str>, id_or_prefix: &str) -> Result<JobId> {
        let needle = id_or_prefix.trim().to_lowercase();
        if needle.is_empty() || !needle.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(StoreError::NotFound(format!("job `{id_or_prefix}`")));
        }
        let namespace = namespace.map(str::to_string);
        self.run(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT id FROM jobs WHERE id LIKE ?1 || '%' AND (?2 IS NULL OR namespace = ?2) LIMIT 2",
            )?;
            let ids: Vec<String> =
                stmt.query_map(params![needle, namespace], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
            match ids.as_slice() {
                [one] => parse_id(one),
                [] => Err(StoreError::NotFound(format!("job `{needle}`"))),
                _ => Err(StoreError::Ambiguous(needle)),
            }
        })
        .await
    }

    async fn list_jobs(&self, namespace: Option<&str>, limit: u32) -> Result<Vec<Job>> {
        let namespace = namespace.map(str::to_string);
        self.run(move |c| {
            let decoded = |r: &Row<'_>| Ok((job_row(r)?, r.get::<_, i64>(8)?, r.get::<_, i64>(9)?));
            let rows: Vec<_> = match &namespace {
                Some(ns) => c
                    .prepare_cached(&format!(
                        "SELECT {JOB_COLS} FROM jobs WHERE namespace = ?1 ORDER BY created_at DESC, id LIMIT ?2"
                    ))?
                    .query_map(params![ns, limit], decoded)?
                    .collect::<rusqlite::Result<_>>()?,
                None => c
                    .prepare_cached(&format!("SELECT {JOB_COLS} FROM jobs ORDER BY created_at DESC, id LIMIT ?1"))?
                    .query_map(params![limit], decoded)?
                    .collect::<rusqlite::Result<_>>()?,
            };
            rows.into_iter().map(|(c, a, b)| decode_job(c, a, b)).collect()
        })
        .await
    }

    async fn continuations(&self, job: JobId) -> Result<Vec<JobId>> {
        self.run(move |c| {
            let mut stmt = c.prepare_cached("SELECT id FROM jobs WHERE parent = ?1 ORDER BY created_at, id")?;
            let ids: Vec<String> =
                stmt.query_map(params![job.to_string()], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
            ids.iter().map(|id| parse_id(id)).collect()
        })
        .await
    }

    async fn job_counts(&self) -> Result<Vec<(String, JobState, u64)>> {
        self.run(move |c| {
            let mut stmt = c.prepare_cached("SELECT namespace, state, count(*) FROM jobs GROUP BY namespace, state")?;
            let rows: Vec<(String, String, i64)> =
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect::<rusqlite::Result<_>>()?;
            rows.into_iter()
                .map(|(namespace, state, n)| {
                    let state = state.parse::<JobState>().map_err(corrupt)?;
                    Ok((namespace, state, n.max(0) as u64))
                })
                .collect()
        })
        .await
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
            check_fence(tx, fence)?;
            let current = load_job(tx, &id.to_string())?.ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
            let change = rules::set_job_state(&current, state, reason, final_answer, now_ms())?;
            let job = &change.job;
            exec(
                tx,
                "UPDATE jobs SET state = ?2, reason = ?3, final_answer = ?4, updated_at = ?5 WHERE id = ?1",
                params![id.to_string(), job.state.as_str(), job.reason, job.final_answer, job.updated_at],
            )?;
            let ev = write_event(tx, id, change.event)?;
            Ok(Written { events: vec![ev], ..Default::default() })
        })
        .await
    }

    async fn orphaned_jobs(&self, now_ms: i64, limit: u32) -> Result<Vec<JobId>> {
        self.run(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT j.id FROM jobs j LEFT JOIN leases l ON l.job_id = j.id
                 WHERE j.state IN ('queued', 'running', 'waiting_for_user', 'waiting_for_budget') AND (l.job_id IS NULL OR l.expires_at < ?1)
                   AND (l.job_id IS NOT NULL OR j.state <> 'queued' OR NOT EXISTS (
                        SELECT 1 FROM namespaces n WHERE n.name = j.namespace
                          AND json_extract(n.limits, '$.max_jobs') IS NOT NULL
                          AND (SELECT count(*) FROM jobs k WHERE k.namespace = n.name
                                 AND k.state IN ('running', 'waiting_for_user', 'waiting_for_budget'))
                              >= json_extract(n.limits, '$.max_jobs')))
                 ORDER BY j.created_at, j.id LIMIT ?2",
            )?;
            let ids: Vec<String> =
                stmt.query_map(params![now_ms, limit], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
            ids.iter().map(|i| parse_id(i)).collect()
        })
        .await
    }

    async fn create_session(&self, session: Session) -> Result<Written> {
        self.tx(move |tx| {
            Ok(Written { events: insert_session(tx, &session)?.into_iter().collect(), ..Default::default() })
        })
        .await
    }

    async fn sessions(&self, job: JobId) -> Result<Vec<Session>> {
        self.run(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, job_id, role, label, task_id, created_at FROM sessions WHERE job_id = ?1 ORDER BY created_at, rowid",
            )?;
            let mut rows = stmt.query(params![job.to_string()])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(decode_session(r)?);
            }
            Ok(out)
        })
        .await
    }

    async fn get_session(&self, id: SessionId) -> Result<Session> {
        self.run(move |c| {
            let mut stmt =
                c.prepare_cached("SELECT id, job_id, role, label, task_id, created_at FROM sessions WHERE id = ?1")?;
            let mut rows = stmt.query(params![id.to_string()])?;
            match rows.next()? {
                Some(r) => decode_session(r),
                None => Err(StoreError::NotFound(format!("session {id}"))),
            }
        })
        .await
    }

    async fn append(&self, batch: Batch) -> Result<Written> {
        if batch.is_empty() {
            return Ok(Written::default());
        }
        self.tx(move |tx| {
            check_fence(tx, batch.fence)?;
            check_required(tx, &batch.requires)?;
            let mut written = Written { entry_seqs: write_entries(tx, batch.entries)?, ..Default::default() };
            if let Some((job, usage)) = batch.usage {
                add_usage(tx, job, &usage)?;
            }
            for (job, kind) in batch.events {
                written.events.push(write_event(tx, job, kind)?);
            }
            written.tasks = insert_tasks(tx, batch.tasks, &mut written)?;
            Ok(written)
        })
        .await
    }

    async fn entries(&self, session: SessionId, after_seq: i64, limit: u32) -> Result<Vec<Entry>> {
        self.run(move |c| {
            let mut stmt =
                c.prepare_cached("SELECT body FROM entries WHERE session_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3")?;
            let bodies: Vec<String> = stmt
                .query_map(params![session.to_string(), after_seq, limit], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            bodies.iter().map(|b| parse(b)).collect()
        })
        .await
    }

    async fn create_tasks(&self, tasks: Vec<Task>, fence: Option<Fence>) -> Result<(Vec<(Task, bool)>, Written)> {
        self.tx(move |tx| {
            check_fence(tx, fence)?;
            let mut written = Written::default();
            let out = insert_tasks(tx, tasks, &mut written)?;
            Ok((out, written))
        })
        .await
    }

    async fn get_task(&self, id: TaskId) -> Result<Task> {
        self.run(move |c| load_task(c, &id.to_string())?.ok_or_else(|| StoreError::NotFound(format!("task {id}"))))
            .await
    }

    /// Writes are serialised and a batch's messages go out after its commit
    /// (this backend never fires [`crate::Staged`]): what is read has settled.
    async fn settled_task(&self, id: TaskId) -> Result<Task> {
        self.get_task(id).await
    }

    async fn tasks(&self, job: JobId) -> Result<Vec<Task>> {
        self.run(move |c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {TASK_COLS} FROM tasks WHERE job_id = ?1 ORDER BY created_at, rowid"
            ))?;
            let mut rows = stmt.query(params![job.to_string()])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(decode_task(r)?);
            }
            Ok(out)
        })
        .await
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
        // The immediate transaction holds the write lock from the load on, so
        // the decision stands until it is stored.
        self.tx(move |tx| claim_in(tx, &claim)).await
    }

    async fn claim_tasks_ending(&self, claims: &[ClaimRequest]) -> Result<Vec<Result<ClaimAnswer>>> {
        let claims = claims.to_vec();
        self.tx(move |tx| {
            claims
                .iter()
                .map(|claim| match claim_in(tx, claim) {
                    // Found before anything was written for it: that claim's answer.
                    Err(StoreError::NotFound(what)) => Ok(Err(StoreError::NotFound(what))),
                    Err(e) => Err(e),
                    Ok(answer) => Ok(Ok(answer)),
                })
                .collect()
        })
        .await
    }

    async fn finish_task_with(
        &self,
        id: TaskId,
        attempt: u32,
        outcome: TaskOutcome,
        usage: Usage,
        batch: Batch,
    ) -> Result<(Task, Written)> {
        self.tx(move |tx| {
            let task = load_task(tx, &id.to_string())?.ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
            finish_loaded(tx, &task, attempt, outcome, usage, batch)
        })
        .await
    }

    async fn heartbeat_task(&self, id: TaskId, attempt: u32) -> Result<bool> {
        self.tx(move |tx| {
            let Some(task) = load_task(tx, &id.to_string())? else { return Ok(false) };
            let Some(beat) = rules::heartbeat(&task, attempt, now_ms()) else { return Ok(false) };
            write_task(tx, &beat)?;
            Ok(true)
        })
        .await
    }

    async fn cancel_tasks(&self, job: JobId, reason: &str) -> Result<Written> {
        let reason = reason.to_string();
        self.tx(move |tx| {
            // Only unfinished rows are worth loading; which of them to cancel,
            // and in what order, is the rule's.
            let open: Vec<Task> = {
                let mut stmt = tx.prepare_cached(&format!(
                    "SELECT {TASK_COLS} FROM tasks WHERE job_id = ?1 AND state IN ('held', 'queued', 'running')"
                ))?;
                let mut rows = stmt.query(params![job.to_string()])?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    out.push(decode_task(r)?);
                }
                out
            };
            let mut written = Written::default();
            for change in rules::cancel(&open, &reason, now_ms()) {
                written.events.push(apply_task_change(tx, change)?.1);
            }
            Ok(written)
        })
        .await
    }

    async fn acquire_lease(&self, job: JobId, owner: &str, ttl_ms: i64) -> Result<Option<Lease>> {
        let owner = owner.to_string();
        self.tx(move |tx| {
            let current = load_lease(tx, job)?;
            let Some(lease) = rules::acquire_lease(current.as_ref(), job, &owner, now_ms(), ttl_ms) else {
                return Ok(None);
            };
            if current.is_none() && !admitted(tx, job)? {
                return Ok(None);
            }
            write_lease(tx, &lease)?;
            Ok(Some(lease))
        })
        .await
    }

    async fn renew_leases(&self, leases: &[Lease], ttl_ms: i64) -> Result<Vec<bool>> {
        let held = leases.to_vec();
        self.tx(move |tx| {
            let now = now_ms();
            let mut out = Vec::with_capacity(held.len());
            for lease in &held {
                let current = load_lease(tx, lease.job)?;
                let renewed = rules::renew_lease(current.as_ref(), lease, now, ttl_ms);
                if let Some(r) = &renewed {
                    write_lease(tx, r)?;
                }
                out.push(renewed.is_some());
            }
            Ok(out)
        })
        .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let held = lease.clone();
        self.tx(move |tx| {
            let current = load_lease(tx, held.job)?;
            if let Some(released) = rules::release_lease(current.as_ref(), &held) {
                write_lease(tx, &released)?;
            }
            Ok(())
        })
        .await
    }

    async fn events(&self, job: JobId, after_seq: i64, limit: u32) -> Result<Vec<Event>> {
        self.run(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT seq, at, payload FROM events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            )?;
            let rows: Vec<(i64, i64, String)> = stmt
                .query_map(params![job.to_string(), after_seq, limit], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<_>>()?;
            rows.into_iter().map(|(seq, at, p)| Ok(Event { job_id: job, seq, at, kind: parse(&p)? })).collect()
        })
        .await
    }

    async fn create_namespace(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.tx(move |tx| access::create_namespace(tx, &name)).await
    }

    async fn namespaces(&self) -> Result<Vec<flower_model::access::Namespace>> {
        self.run(|c| access::namespaces(c)).await
    }

    async fn namespace(&self, name: &str) -> Result<flower_model::access::Namespace> {
        let name = name.to_string();
        self.run(move |c| access::namespace(c, &name)).await
    }

    async fn set_limits(
        &self,
        name: &str,
        limits: &flower_model::access::Limits,
    ) -> Result<flower_model::access::Namespace> {
        let (name, limits) = (name.to_string(), limits.clone());
        self.tx(move |tx| access::set_limits(tx, &name, &limits)).await
    }

    async fn admit_tasks(&self, namespace: &str, tasks: &[TaskId]) -> Result<Vec<Task>> {
        let (namespace, tasks) = (namespace.to_string(), tasks.to_vec());
        self.tx(move |tx| admit_tasks(tx, &namespace, &tasks)).await
    }

    async fn task_counts(&self, namespace: &str) -> Result<crate::TaskCounts> {
        let namespace = namespace.to_string();
        self.run(move |c| task_counts(c, &namespace)).await
    }

    async fn spend(&self, namespace: &str, since_day: i64) -> Result<Vec<crate::Spend>> {
        let namespace = namespace.to_string();
        self.run(move |c| access::spend(c, &namespace, since_day)).await
    }

    async fn change_quota(
        &self,
        route: &str,
        change: crate::rules::QuotaChange,
        now: i64,
    ) -> Result<Option<flower_model::quota::Wait>> {
        let route = route.to_string();
        self.tx(move |tx| access::change_quota(tx, &route, change, now)).await
    }

    async fn route_quotas(&self) -> Result<Vec<(String, flower_model::quota::Route)>> {
        self.run(|c| access::route_quotas(c)).await
    }

    async fn create_key(&self, key: flower_model::access::ApiKey, replaces: Option<String>) -> Result<()> {
        self.tx(move |tx| access::create_key(tx, &key, replaces.as_deref())).await
    }

    async fn get_key(&self, id: &str) -> Result<flower_model::access::ApiKey> {
        let id = id.to_string();
        self.run(move |c| access::get_key(c, &id)).await
    }

    async fn keys(&self, namespace: Option<&str>) -> Result<Vec<flower_model::access::ApiKey>> {
        let namespace = namespace.map(str::to_string);
        self.run(move |c| access::keys(c, namespace.as_deref())).await
    }

    async fn revoke_key(&self, id: &str, at: i64) -> Result<flower_model::access::ApiKey> {
        let id = id.to_string();
        self.tx(move |tx| access::revoke_key(tx, &id, at)).await
    }

    async fn touch_keys(&self, ids: Vec<String>, at: i64) -> Result<()> {
        self.tx(move |tx| access::touch_keys(tx, &ids, at)).await
    }

    async fn append_audit(&self, records: Vec<flower_model::access::AuditRecord>) -> Result<()> {
        self.tx(move |tx| access::append_audit(tx, &records)).await
    }

    async fn audit_log(
        &self,
        namespace: Option<&str>,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<flower_model::access::AuditRecord>> {
        let namespace = namespace.map(str::to_string);
        self.run(move |c| access::audit_log(c, namespace.as_deref(), after_seq, limit)).await
    }
}
