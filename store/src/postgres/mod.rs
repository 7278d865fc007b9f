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
//! [`crate::rules`]'s, made on rows loaded `FOR UPDATE` in the writing
//! transaction, so it still holds when its rows are stored.
//!
//! # Layout
//! - this file: the pool and its session settings, the schema check and
//!   migrations, and the [`Store`] impl, which hands each call to its
//!   table's module
//! - `transaction`: the store's own transactions on a pooled connection, the statement helpers
//! - `jobs`: job rows (create, read, state, orphans)
//! - `tasks`: task rows (insert, update, read, the required ends), ends, heartbeats, cancels
//! - `creation`: the advisory locks a task row's creator holds, with the fence check
//! - `claims`: claims, alone or in groups, with their sessions and ends
//! - `transcripts`: sessions, transcript entries stored as chunks, and batches
//! - `events`: job events numbered from the job row's counter, the commit sent with them, relaxed turns
//! - `leases`: job leases and the fence check
//! - `access`: namespaces, API keys and the audit log
//! - `scratch`: throwaway databases for tests and benchmarks

mod access;
mod claims;
mod creation;
mod events;
mod jobs;
mod leases;
mod scratch;
mod tasks;
#[cfg(test)]
mod tests;
mod transaction;
mod transcripts;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use flower_model::{Entry, Event, Job, JobId, JobState, Session, SessionId, Task, TaskId, TaskOutcome, Usage, now_ms};
use tokio_postgres::NoTls;

use crate::{
    Batch, Claim, ClaimAnswer, ClaimRequest, EndOffer, Fence, Lease, NewJob, Result, Store, StoreError, Written,
    migrations,
};
use transaction::{db_execute, db_query, db_query_one};

pub use scratch::ScratchDatabase;
pub use transcripts::CHUNK_ENTRIES;

/// Advisory lock key serialising migrations across replicas.
const MIGRATION_LOCK: i64 = 0x666c_6f77_6572;

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
}

fn backend(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::backend_from(e)
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
            Some(db) => {
                let message = db.message().to_string();
                StoreError::Backend { message, source: Some(std::sync::Arc::new(e)) }
            }
            None => StoreError::backend_from(e),
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
            url.parse().map_err(|e| StoreError::backend(format!("database URL `{url}`: {e}")))?;
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

fn written(events: Vec<Event>) -> Written {
    Written { events, entry_seqs: vec![], tasks: vec![] }
}

#[async_trait]
impl Store for PostgresStore {
    async fn create_job(&self, job: NewJob) -> Result<(Job, bool)> {
        jobs::create_job(self, job).await
    }

    async fn get_job(&self, id: JobId) -> Result<Job> {
        jobs::get_job(self, id).await
    }

    async fn resolve_job_in(&self, namespace: Option<&str>, id_or_prefix: &str) -> Result<JobId> {
        jobs::resolve_job(self, namespace, id_or_prefix).await
    }

    async fn list_jobs(&self, namespace: Option<&str>, limit: u32) -> Result<Vec<Job>> {
        jobs::list_jobs(self, namespace, limit).await
    }

    async fn continuations(&self, job: JobId) -> Result<Vec<JobId>> {
        jobs::continuations(self, job).await
    }

    async fn job_counts(&self) -> Result<Vec<(String, JobState, u64)>> {
        jobs::job_counts(self).await
    }

    async fn set_job_state(
        &self,
        id: JobId,
        state: JobState,
        reason: Option<String>,
        final_answer: Option<String>,
        fence: Option<Fence>,
    ) -> Result<Written> {
        jobs::set_job_state(self, id, state, reason, final_answer, fence).await
    }

    async fn orphaned_jobs(&self, now_ms: i64, limit: u32) -> Result<Vec<JobId>> {
        jobs::orphaned_jobs(self, now_ms, limit).await
    }

    async fn create_session(&self, session: Session) -> Result<Written> {
        transcripts::create_session(self, session).await
    }

    async fn sessions(&self, job: JobId) -> Result<Vec<Session>> {
        transcripts::sessions(self, job).await
    }

    async fn get_session(&self, id: SessionId) -> Result<Session> {
        transcripts::get_session(self, id).await
    }

    async fn append(&self, batch: Batch) -> Result<Written> {
        transcripts::append(self, batch).await
    }

    async fn entries(&self, session: SessionId, after_seq: i64, limit: u32) -> Result<Vec<Entry>> {
        transcripts::entries(self, session, after_seq, limit).await
    }

    async fn create_tasks(&self, tasks: Vec<Task>, fence: Option<Fence>) -> Result<(Vec<(Task, bool)>, Written)> {
        tasks::create_tasks(self, tasks, fence).await
    }

    async fn get_task(&self, id: TaskId) -> Result<Task> {
        tasks::get_task(self, id).await
    }

    async fn settled_task(&self, id: TaskId) -> Result<Task> {
        tasks::settled_task(self, id).await
    }

    async fn tasks(&self, job: JobId) -> Result<Vec<Task>> {
        tasks::tasks(self, job).await
    }

    async fn claim_task_ending(
        &self,
        id: TaskId,
        attempt: u32,
        worker_id: &str,
        session: Option<Session>,
        end: &EndOffer,
    ) -> Result<(Claim, Option<(Task, Written)>)> {
        claims::claim_task_ending(self, id, attempt, worker_id, session, end).await
    }

    async fn claim_tasks_ending(&self, claims: &[ClaimRequest]) -> Result<Vec<Result<ClaimAnswer>>> {
        claims::claim_tasks_ending(self, claims).await
    }

    async fn finish_task_with(
        &self,
        id: TaskId,
        attempt: u32,
        outcome: TaskOutcome,
        usage: Usage,
        batch: Batch,
    ) -> Result<(Task, Written)> {
        tasks::finish_task_with(self, id, attempt, outcome, usage, batch).await
    }

    async fn heartbeat_task(&self, id: TaskId, attempt: u32) -> Result<bool> {
        tasks::heartbeat_task(self, id, attempt).await
    }

    async fn cancel_tasks(&self, job: JobId, reason: &str) -> Result<Written> {
        tasks::cancel_tasks(self, job, reason).await
    }

    async fn admit_tasks(&self, namespace: &str, tasks: &[TaskId]) -> Result<Vec<Task>> {
        tasks::admit_tasks(self, namespace, tasks).await
    }

    async fn task_counts(&self, namespace: &str) -> Result<crate::TaskCounts> {
        tasks::task_counts(self, namespace).await
    }

    async fn acquire_lease(&self, job: JobId, owner: &str, ttl_ms: i64) -> Result<Option<Lease>> {
        leases::acquire_lease(self, job, owner, ttl_ms).await
    }

    async fn renew_leases(&self, leases: &[Lease], ttl_ms: i64) -> Result<Vec<bool>> {
        leases::renew_leases(self, leases, ttl_ms).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        leases::release_lease(self, lease).await
    }

    async fn events(&self, job: JobId, after_seq: i64, limit: u32) -> Result<Vec<Event>> {
        events::events(self, job, after_seq, limit).await
    }

    async fn create_namespace(&self, name: &str) -> Result<bool> {
        access::create_namespace(self, name).await
    }

    async fn namespaces(&self) -> Result<Vec<flower_model::access::Namespace>> {
        access::namespaces(self).await
    }

    async fn namespace(&self, name: &str) -> Result<flower_model::access::Namespace> {
        access::namespace(self, name).await
    }

    async fn set_limits(
        &self,
        name: &str,
        limits: &flower_model::access::Limits,
    ) -> Result<flower_model::access::Namespace> {
        access::set_limits(self, name, limits).await
    }

    async fn spend(&self, namespace: &str, since_day: i64) -> Result<Vec<crate::Spend>> {
        access::spend(self, namespace, since_day).await
    }

    async fn change_quota(
        &self,
        route: &str,
        change: crate::rules::QuotaChange,
        now: i64,
    ) -> Result<Option<flower_model::quota::Wait>> {
        access::change_quota(self, route, change, now).await
    }

    async fn route_quotas(&self) -> Result<Vec<(String, flower_model::quota::Route)>> {
        access::route_quotas(self).await
    }

    async fn create_key(&self, key: flower_model::access::ApiKey, replaces: Option<String>) -> Result<()> {
        access::create_key(self, key, replaces).await
    }

    async fn get_key(&self, id: &str) -> Result<flower_model::access::ApiKey> {
        access::get_key(self, id).await
    }

    async fn keys(&self, namespace: Option<&str>) -> Result<Vec<flower_model::access::ApiKey>> {
        access::keys(self, namespace).await
    }

    async fn revoke_key(&self, id: &str, at: i64) -> Result<flower_model::access::ApiKey> {
        access::revoke_key(self, id, at).await
    }

    async fn touch_keys(&self, ids: Vec<String>, at: i64) -> Result<()> {
        access::touch_keys(self, ids, at).await
    }

    async fn append_audit(&self, records: Vec<flower_model::access::AuditRecord>) -> Result<()> {
        access::append_audit(self, records).await
    }

    async fn audit_log(
        &self,
        namespace: Option<&str>,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<flower_model::access::AuditRecord>> {
        access::audit_log(self, namespace, after_seq, limit).await
    }
}
