//! The embedded backend: one SQLite file (WAL) under the run directory.
//!
//! rusqlite is blocking, so every call runs on the blocking pool
//! (`spawn_blocking`) holding the one connection: SQLite serialises writers
//! anyway, and a single connection makes the per-job sequence numbers trivially
//! gap-free. Stored entries are protected by a trigger: an UPDATE of a
//! transcript row aborts.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use flower_model::{
    Entry, Event, EventKind, Job, JobId, JobState, Role, Session, SessionId, Task, TaskId, TaskOutcome, TaskState,
    Usage, now_ms,
};
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};

use crate::{Batch, Claim, Fence, Lease, NewJob, Result, Store, StoreError, Written};

const SCHEMA: &str = r#"
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
PRAGMA foreign_keys = ON;
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    spec TEXT NOT NULL,
    final_answer TEXT,
    idempotency_key TEXT UNIQUE,
    usage TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES jobs(id),
    role TEXT NOT NULL,
    label TEXT NOT NULL,
    task_id TEXT,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_job ON sessions(job_id, created_at);
CREATE TABLE IF NOT EXISTS entries (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL,
    uuid TEXT NOT NULL UNIQUE,
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TRIGGER IF NOT EXISTS entries_append_only BEFORE UPDATE ON entries
BEGIN SELECT RAISE(ABORT, 'transcript entries are append-only'); END;
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES jobs(id),
    parent_session TEXT NOT NULL,
    tool_use_id TEXT NOT NULL,
    worker TEXT NOT NULL,
    mandate TEXT NOT NULL,
    description TEXT NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    claimed_by TEXT,
    report TEXT,
    error TEXT,
    usage TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_by_job ON tasks(job_id, created_at);
CREATE TABLE IF NOT EXISTS leases (
    job_id TEXT PRIMARY KEY REFERENCES jobs(id),
    owner TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL REFERENCES jobs(id),
    seq INTEGER NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
"#;

#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
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

    fn init(conn: Connection) -> Result<Self> {
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self { conn: Arc::new(Mutex::new(conn)) })
    }

    /// Run `f` with the connection on the blocking pool.
    async fn run<T: Send + 'static>(&self, f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static) -> Result<T> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().map_err(|_| backend("sqlite connection poisoned"))?;
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
    let seq: i64 = tx.query_row(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id = ?1",
        params![job.to_string()],
        |r| r.get(0),
    )?;
    let at = now_ms();
    tx.execute(
        "INSERT INTO events (job_id, seq, at, kind, payload) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![job.to_string(), seq, at, kind.name(), json(&kind)?],
    )?;
    Ok(Event { job_id: job, seq, at, kind })
}

/// Reject the transaction unless `fence` still owns its job.
fn check_fence(tx: &Transaction<'_>, fence: Option<Fence>) -> Result<()> {
    let Some(f) = fence else { return Ok(()) };
    let current: i64 = tx
        .query_row("SELECT epoch FROM leases WHERE job_id = ?1", params![f.job.to_string()], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    if current == f.epoch { Ok(()) } else { Err(StoreError::Fenced { job: f.job, given: f.epoch, current }) }
}

const JOB_COLS: &str = "id, name, state, reason, spec, final_answer, idempotency_key, usage, created_at, updated_at";

fn job_row(r: &Row<'_>) -> rusqlite::Result<[Option<String>; 8]> {
    Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?])
}

fn decode_job(cols: [Option<String>; 8], created_at: i64, updated_at: i64) -> Result<Job> {
    let [id, name, state, reason, spec, final_answer, idempotency_key, usage] = cols;
    let need = |v: Option<String>| v.ok_or_else(|| corrupt("null in a required job column"));
    Ok(Job {
        id: parse_id(&need(id)?)?,
        name: need(name)?,
        state: parse_id(&need(state)?)?,
        reason,
        spec: parse(&need(spec)?)?,
        final_answer,
        idempotency_key,
        usage: parse(&need(usage)?)?,
        created_at,
        updated_at,
    })
}

fn load_job(conn: &Connection, id: &str) -> Result<Option<Job>> {
    conn.query_row(&format!("SELECT {JOB_COLS} FROM jobs WHERE id = ?1"), params![id], |r| {
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

fn add_usage(tx: &Transaction<'_>, job: JobId, usage: &Usage) -> Result<()> {
    let id = job.to_string();
    let current: Option<String> =
        tx.query_row("SELECT usage FROM jobs WHERE id = ?1", params![id], |r| r.get(0)).optional()?;
    let mut total: Usage = parse(&current.ok_or_else(|| StoreError::NotFound(format!("job {job}")))?)?;
    total.add(usage);
    tx.execute("UPDATE jobs SET usage = ?2, updated_at = ?3 WHERE id = ?1", params![id, json(&total)?, now_ms()])?;
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_job(&self, job: NewJob) -> Result<(Job, bool)> {
        self.tx(move |tx| {
            if let Some(key) = &job.idempotency_key {
                let existing: Option<String> = tx
                    .query_row("SELECT id FROM jobs WHERE idempotency_key = ?1", params![key], |r| r.get(0))
                    .optional()?;
                if let Some(id) = existing {
                    let found = load_job(tx, &id)?.ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
                    return Ok((found, false));
                }
            }
            let now = now_ms();
            tx.execute(
                &format!("INSERT INTO jobs ({JOB_COLS}) VALUES (?1, ?2, 'queued', NULL, ?3, NULL, ?4, ?5, ?6, ?6)"),
                params![
                    job.id.to_string(),
                    job.name,
                    json(&job.spec)?,
                    job.idempotency_key,
                    json(&Usage::default())?,
                    now
                ],
            )?;
            write_event(tx, job.id, EventKind::JobState { state: JobState::Queued, reason: None })?;
            let created =
                load_job(tx, &job.id.to_string())?.ok_or_else(|| StoreError::NotFound(format!("job {}", job.id)))?;
            Ok((created, true))
        })
        .await
    }

    async fn get_job(&self, id: JobId) -> Result<Job> {
        self.run(move |c| load_job(c, &id.to_string())?.ok_or_else(|| StoreError::NotFound(format!("job {id}")))).await
    }

    async fn resolve_job(&self, id_or_prefix: &str) -> Result<JobId> {
        let needle = id_or_prefix.trim().to_lowercase();
        if needle.is_empty() || !needle.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(StoreError::NotFound(format!("job `{id_or_prefix}`")));
        }
        self.run(move |c| {
            let mut stmt = c.prepare("SELECT id FROM jobs WHERE id LIKE ?1 || '%' LIMIT 2")?;
            let ids: Vec<String> = stmt.query_map(params![needle], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
            match ids.as_slice() {
                [one] => parse_id(one),
                [] => Err(StoreError::NotFound(format!("job `{needle}`"))),
                _ => Err(StoreError::Ambiguous(needle)),
            }
        })
        .await
    }

    async fn list_jobs(&self, limit: u32) -> Result<Vec<Job>> {
        self.run(move |c| {
            let mut stmt = c.prepare(&format!("SELECT {JOB_COLS} FROM jobs ORDER BY created_at DESC, id LIMIT ?1"))?;
            let rows: Vec<_> = stmt
                .query_map(params![limit], |r| Ok((job_row(r)?, r.get::<_, i64>(8)?, r.get::<_, i64>(9)?)))?
                .collect::<rusqlite::Result<_>>()?;
            rows.into_iter().map(|(c, a, b)| decode_job(c, a, b)).collect()
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
            if current.state.is_terminal() {
                return Err(StoreError::Conflict(format!("job {id} already {}", current.state)));
            }
            tx.execute(
                "UPDATE jobs SET state = ?2, reason = ?3, final_answer = COALESCE(?4, final_answer), updated_at = ?5 WHERE id = ?1",
                params![id.to_string(), state.as_str(), reason, final_answer, now_ms()],
            )?;
            let ev = write_event(tx, id, EventKind::JobState { state, reason })?;
            Ok(Written { events: vec![ev], entry_seqs: vec![] })
        })
        .await
    }

    async fn orphaned_jobs(&self, now_ms: i64, limit: u32) -> Result<Vec<JobId>> {
        self.run(move |c| {
            let mut stmt = c.prepare(
                "SELECT j.id FROM jobs j LEFT JOIN leases l ON l.job_id = j.id
                 WHERE j.state IN ('queued', 'running', 'waiting') AND (l.job_id IS NULL OR l.expires_at < ?1)
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
            let n = tx.execute(
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
            let mut written = Written::default();
            if n == 1 {
                written.events.push(write_event(
                    tx,
                    session.job_id,
                    EventKind::SessionStarted { session: session.id, role: session.role.as_str().into(), label: session.label },
                )?);
            }
            Ok(written)
        })
        .await
    }

    async fn sessions(&self, job: JobId) -> Result<Vec<Session>> {
        self.run(move |c| {
            let mut stmt = c.prepare(
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
                c.prepare("SELECT id, job_id, role, label, task_id, created_at FROM sessions WHERE id = ?1")?;
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
            let mut written = Written::default();
            {
                let mut next_seq = tx.prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM entries WHERE session_id = ?1")?;
                let mut insert = tx.prepare_cached(
                    "INSERT INTO entries (session_id, seq, uuid, job_id, kind, body, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?;
                for mut entry in batch.entries {
                    let sid = entry.session_id.to_string();
                    let seq: i64 = next_seq.query_row(params![sid], |r| r.get(0))?;
                    entry.seq = seq;
                    let kind = json(&entry.kind)?;
                    insert.execute(params![
                        sid,
                        seq,
                        entry.uuid.to_string(),
                        entry.job_id.to_string(),
                        kind.trim_matches('"'),
                        json(&entry)?,
                        entry.created_at
                    ])?;
                    written.entry_seqs.push(seq);
                }
            }
            if let Some((job, usage)) = batch.usage {
                add_usage(tx, job, &usage)?;
            }
            for (job, kind) in batch.events {
                written.events.push(write_event(tx, job, kind)?);
            }
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

    async fn create_task(&self, task: Task, fence: Option<Fence>) -> Result<(Task, bool, Written)> {
        self.tx(move |tx| {
            check_fence(tx, fence)?;
            let id = task.id.to_string();
            if let Some(existing) = load_task(tx, &id)? {
                return Ok((existing, false, Written::default()));
            }
            tx.execute(
                &format!("INSERT INTO tasks ({TASK_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'queued', 0, NULL, NULL, NULL, ?8, ?9, ?9)"),
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
            let ev = write_event(
                tx,
                task.job_id,
                EventKind::TaskQueued { task: task.id, worker: task.worker.clone(), description: task.description.clone() },
            )?;
            let stored = load_task(tx, &id)?.ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
            Ok((stored, true, Written { events: vec![ev], entry_seqs: vec![] }))
        })
        .await
    }

    async fn get_task(&self, id: TaskId) -> Result<Task> {
        self.run(move |c| load_task(c, &id.to_string())?.ok_or_else(|| StoreError::NotFound(format!("task {id}"))))
            .await
    }

    async fn tasks(&self, job: JobId) -> Result<Vec<Task>> {
        self.run(move |c| {
            let mut stmt =
                c.prepare(&format!("SELECT {TASK_COLS} FROM tasks WHERE job_id = ?1 ORDER BY created_at, rowid"))?;
            let mut rows = stmt.query(params![job.to_string()])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(decode_task(r)?);
            }
            Ok(out)
        })
        .await
    }

    async fn claim_task(&self, id: TaskId, attempt: u32, worker_id: &str) -> Result<Claim> {
        let worker_id = worker_id.to_string();
        self.tx(move |tx| {
            let sid = id.to_string();
            let task = load_task(tx, &sid)?.ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
            if task.state.is_terminal() {
                return Ok(Claim::AlreadyFinished(task));
            }
            let n = tx.execute(
                "UPDATE tasks SET state = 'running', attempt = ?2, claimed_by = ?3, updated_at = ?4
                 WHERE id = ?1 AND attempt < ?2 AND state IN ('queued', 'running')",
                params![sid, attempt, worker_id, now_ms()],
            )?;
            if n == 0 {
                return Ok(Claim::Superseded { current_attempt: task.attempt });
            }
            let ev = write_event(tx, task.job_id, EventKind::TaskStarted { task: id, attempt, worker_id })?;
            let task = load_task(tx, &sid)?.ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
            Ok(Claim::Claimed { task, events: vec![ev] })
        })
        .await
    }

    async fn finish_task(
        &self,
        id: TaskId,
        attempt: u32,
        outcome: TaskOutcome,
        usage: Usage,
    ) -> Result<(Task, Written)> {
        self.tx(move |tx| {
            let sid = id.to_string();
            let (state, report, error) = match &outcome {
                TaskOutcome::Succeeded { report } => (TaskState::Succeeded, Some(report.clone()), None),
                TaskOutcome::Failed { error } => (TaskState::Failed, None, Some(error.clone())),
            };
            let n = tx.execute(
                "UPDATE tasks SET state = ?3, report = ?4, error = ?5, usage = ?6, updated_at = ?7
                 WHERE id = ?1 AND attempt = ?2 AND state = 'running'",
                params![sid, attempt, state.as_str(), report, error, json(&usage)?, now_ms()],
            )?;
            let task = load_task(tx, &sid)?.ok_or_else(|| StoreError::NotFound(format!("task {id}")))?;
            if n == 0 {
                return Err(StoreError::Conflict(format!(
                    "task {id} attempt {attempt} cannot finish: task is {} at attempt {}",
                    task.state.as_str(),
                    task.attempt
                )));
            }
            let ev = write_event(
                tx,
                task.job_id,
                EventKind::TaskFinished { task: id, attempt, succeeded: state == TaskState::Succeeded, usage },
            )?;
            Ok((task, Written { events: vec![ev], entry_seqs: vec![] }))
        })
        .await
    }

    async fn heartbeat_task(&self, id: TaskId, attempt: u32) -> Result<bool> {
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE tasks SET updated_at = ?3 WHERE id = ?1 AND attempt = ?2 AND state = 'running'",
                params![id.to_string(), attempt, now_ms()],
            )?;
            Ok(n == 1)
        })
        .await
    }

    async fn cancel_tasks(&self, job: JobId, reason: &str) -> Result<Written> {
        let reason = reason.to_string();
        self.tx(move |tx| {
            let ids: Vec<(String, u32)> = {
                let mut stmt =
                    tx.prepare("SELECT id, attempt FROM tasks WHERE job_id = ?1 AND state IN ('queued', 'running')")?;
                stmt.query_map(params![job.to_string()], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<rusqlite::Result<_>>()?
            };
            let mut written = Written::default();
            for (id, attempt) in ids {
                tx.execute(
                    "UPDATE tasks SET state = 'cancelled', error = ?2, updated_at = ?3 WHERE id = ?1",
                    params![id, reason, now_ms()],
                )?;
                written.events.push(write_event(
                    tx,
                    job,
                    EventKind::TaskFinished {
                        task: parse_id(&id)?,
                        attempt,
                        succeeded: false,
                        usage: Usage::default(),
                    },
                )?);
            }
            Ok(written)
        })
        .await
    }

    async fn acquire_lease(&self, job: JobId, owner: &str, ttl_ms: i64) -> Result<Option<Lease>> {
        let owner = owner.to_string();
        self.tx(move |tx| {
            let now = now_ms();
            let id = job.to_string();
            let current: Option<(String, i64, i64)> = tx
                .query_row("SELECT owner, epoch, expires_at FROM leases WHERE job_id = ?1", params![id], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()?;
            let epoch = match current {
                None => {
                    tx.execute(
                        "INSERT INTO leases (job_id, owner, epoch, expires_at) VALUES (?1, ?2, 1, ?3)",
                        params![id, owner, now + ttl_ms],
                    )?;
                    1
                }
                Some((held_by, epoch, _)) if held_by == owner => epoch,
                Some((_, epoch, expires)) if expires < now => epoch + 1,
                Some(_) => return Ok(None),
            };
            tx.execute(
                "UPDATE leases SET owner = ?2, epoch = ?3, expires_at = ?4 WHERE job_id = ?1",
                params![id, owner, epoch, now + ttl_ms],
            )?;
            Ok(Some(Lease { job, owner, epoch, expires_at: now + ttl_ms }))
        })
        .await
    }

    async fn renew_lease(&self, lease: &Lease, ttl_ms: i64) -> Result<bool> {
        let l = lease.clone();
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE leases SET expires_at = ?4 WHERE job_id = ?1 AND owner = ?2 AND epoch = ?3",
                params![l.job.to_string(), l.owner, l.epoch, now_ms() + ttl_ms],
            )?;
            Ok(n == 1)
        })
        .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let l = lease.clone();
        self.tx(move |tx| {
            tx.execute(
                "UPDATE leases SET expires_at = 0 WHERE job_id = ?1 AND owner = ?2 AND epoch = ?3",
                params![l.job.to_string(), l.owner, l.epoch],
            )?;
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
}
