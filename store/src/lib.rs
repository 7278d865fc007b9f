//! Durable state: jobs, tasks, sessions, transcript entries and job events
//! behind one [`Store`] trait, and the per-job workbench and workspace on object
//! storage.
//!
//! # Layout
//! - [`Store`] (this file): the boundary trait every backend implements
//! - [`rules`]: the task, job, lease and fence rules both backends run, and
//!   the decisions of a group of claims written together
//! - [`sqlite`]: the embedded backend (one file under the run directory)
//! - [`postgres`]: the distributed backend, a module per table family
//! - [`migrations`]: each backend's versioned schema, applied in order at start
//! - [`workbench`]: `scripts/`, `artifacts/`, `notes/`, `spill/` of a job on object storage
//! - [`workspace`]: content-addressed workspace snapshots and task changesets
//! - [`prune`]: the pruning loader (layer 4): what a resumed session is fed
//! - `conformance` (feature `testsuite`): the one test suite every backend must pass
//!
//! Rules every backend keeps: entries are append-only (a stored row is never
//! rewritten); an event is written in the same transaction as the change it
//! reports, with the next per-job sequence number; a task attempt is claimed by
//! compare-and-set, and only the claimed attempt may finish the task. This crate
//! never notifies anyone: callers publish notices after a write commits.
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

use async_trait::async_trait;
use flower_model::access::{ApiKey, AuditRecord, Limits, Namespace};
use flower_model::quota;
use flower_model::{
    Entry, Event, EventKind, Job, JobId, JobState, Session, SessionId, Task, TaskId, TaskOutcome, TaskState, Usage,
};

#[cfg(any(test, feature = "testsuite"))]
pub mod conformance;
pub mod localfs;
pub mod migrations;
pub mod objects;
pub mod postgres;
pub mod prune;
pub mod rules;
#[cfg(feature = "s3-test-server")]
pub mod s3test;
pub mod sqlite;
pub mod workbench;
pub mod workspace;

pub use postgres::{PostgresStore, SchemaPolicy};
pub use sqlite::SqliteStore;
pub use workbench::Workbench;

/// Errors of this crate, each saying what happened (docs/design.md section 9). None
/// is retryable by blind repetition except [`StoreError::Backend`], which may
/// be transient (connection loss).
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The referenced job, task or session does not exist. Not retryable.
    #[error("{0} not found")]
    NotFound(String),
    /// A job id prefix matched several jobs. Not retryable: give more of the id.
    #[error("`{0}` matches several jobs; give more of the id")]
    Ambiguous(String),
    /// A later attempt holds the task: this attempt's write is refused. Not
    /// retryable; the stale attempt stops and its delivery settles.
    #[error("task {task} attempt {attempt} is superseded by attempt {current_attempt}")]
    Superseded { task: TaskId, attempt: u32, current_attempt: u32 },
    /// The attempt never claimed the task (no claim, or a newer attempt than
    /// the one claimed). Not retryable: only a claimed attempt may finish.
    #[error("task {task} attempt {attempt} has not claimed the task (attempt {current_attempt} holds it)")]
    NotClaimed { task: TaskId, attempt: u32, current_attempt: u32 },
    /// The task already ended; a task completes once. Not retryable.
    #[error("task {task} already {}", state.as_str())]
    AlreadyFinished { task: TaskId, state: TaskState },
    /// The job already ended; its first end stands. Not retryable.
    #[error("job {job} already {state}")]
    JobEnded { job: JobId, state: JobState },
    /// More bytes than a limit allows (a workspace over
    /// `runtime.workspace_limit`). Not retryable with the same input.
    #[error("{what} holds {size} bytes, more than the limit of {limit} ({setting})")]
    TooLarge { what: &'static str, size: u64, limit: u64, setting: &'static str },
    /// A workbench or workspace path that does not stay beneath its root
    /// (absolute, `..`, empty, or not a valid object key). Not retryable.
    #[error("`{path}`: {why}")]
    BadPath { path: String, why: String },
    /// The data can never be stored as given (a NUL byte in text, a value
    /// over a backend limit). Not retryable: the caller must fail what wrote it.
    #[error("cannot be stored: {0}")]
    Invalid(String),
    /// The database's schema is older than this build's and this process
    /// may not migrate it. Not retryable: run `flower migrate`.
    #[error("the database schema is at version {current}; this release needs {needed}: run `flower migrate`")]
    SchemaBehind { current: i32, needed: i32 },
    /// A write built on a task's end that is not stored as it required
    /// ([`Batch::requires`]): the task moved on (another attempt reports).
    /// Not an outage: the run that built the write resumes from what is
    /// stored, and the task's next attempt reports again.
    #[error("task {task} was not stored {} at attempt {attempt}, which this write was built on", state.as_str())]
    Unconfirmed { task: TaskId, state: TaskState, attempt: u32 },
    /// A key rotated or revoked meanwhile: a rotation's old key must still
    /// be live when the new one is stored. Not retryable.
    #[error("key `{0}` is revoked")]
    KeyRevoked(String),
    /// The database or object store failed; may be transient. `source` is
    /// the backend's own error, when there is one (for logs and callers that
    /// look deeper).
    #[error("storage backend: {message}")]
    Backend {
        message: String,
        #[source]
        source: Option<BackendSource>,
    },
    /// Stored data could not be decoded (written by an incompatible version).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// The write carried a lease epoch that no longer owns the job: another
    /// coordinator took it over. Not retryable; the writer must stop.
    #[error("fenced: job {job} is owned by epoch {current}, not {given}")]
    Fenced { job: JobId, given: i64, current: i64 },
}

/// A backend's own error, kept inside [`StoreError::Backend`].
pub type BackendSource = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

impl StoreError {
    /// A backend failure described in words (no underlying error to keep).
    pub fn backend(message: impl Into<String>) -> Self {
        StoreError::Backend { message: message.into(), source: None }
    }

    /// A backend failure, its own error kept as the source.
    pub fn backend_from(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Backend { message: e.to_string(), source: Some(std::sync::Arc::new(e)) }
    }

    /// A backend failure in `context` (a path, a URL), its own error kept as the source.
    pub fn backend_in(context: impl std::fmt::Display, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Backend { message: format!("{context}: {e}"), source: Some(std::sync::Arc::new(e)) }
    }
}

impl flower_model::Classify for StoreError {
    fn kind(&self) -> flower_model::ErrorKind {
        use flower_model::ErrorKind as K;
        match self {
            StoreError::NotFound(_) => K::NotFound,
            StoreError::Ambiguous(_) | StoreError::BadPath { .. } | StoreError::Invalid(_) => K::Invalid,
            StoreError::Superseded { .. }
            | StoreError::NotClaimed { .. }
            | StoreError::AlreadyFinished { .. }
            | StoreError::JobEnded { .. }
            | StoreError::KeyRevoked(_) => K::Precondition,
            StoreError::TooLarge { .. } => K::TooLarge,
            StoreError::Unconfirmed { .. } => K::Conflict,
            StoreError::Fenced { .. } => K::Fenced,
            StoreError::Backend { .. } => K::Unavailable,
            StoreError::SchemaBehind { .. } | StoreError::Corrupt(_) => K::Internal,
        }
    }
}

/// A coordinator's proof of ownership of a job: writes carrying it are
/// rejected once a newer epoch holds the job's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub job: JobId,
    pub epoch: i64,
}

/// A job's lease as held by one coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub job: JobId,
    pub owner: String,
    pub epoch: i64,
    /// Milliseconds since the epoch.
    pub expires_at: i64,
}

impl Lease {
    pub fn fence(&self) -> Fence {
        Fence { job: self.job, epoch: self.epoch }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What a submit creates.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub id: JobId,
    pub name: String,
    pub spec: serde_json::Value,
    pub idempotency_key: Option<String>,
    /// A continuation: the finished job it goes on from.
    pub continues: Option<flower_model::Lineage>,
    /// The namespace it belongs to (must exist); an idempotency key is
    /// unique within it.
    pub namespace: String,
    /// Who submitted it.
    pub submitted_by: Option<String>,
}

impl NewJob {
    /// A job of the default namespace, without key, lineage or submitter.
    pub fn new(id: JobId, name: impl Into<String>, spec: serde_json::Value) -> Self {
        Self {
            id,
            name: name.into(),
            spec,
            idempotency_key: None,
            continues: None,
            namespace: flower_model::access::DEFAULT_NAMESPACE.into(),
            submitted_by: None,
        }
    }
}

/// The stored form of an idempotency key: unique within its namespace
/// (`<namespace>/<key>`; a namespace name holds no `/`).
pub(crate) fn scoped_key(namespace: &str, key: &str) -> String {
    format!("{namespace}/{key}")
}

/// The key as given, from its stored form.
pub(crate) fn unscoped_key(stored: String) -> String {
    match stored.split_once('/') {
        Some((_, key)) => key.to_string(),
        None => stored,
    }
}

/// Writes that must land together, in one transaction: transcript entries, the
/// events reporting them, the usage they add to the job, and the task rows
/// of the calls they record.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub entries: Vec<Entry>,
    pub events: Vec<(JobId, EventKind)>,
    pub usage: Option<(JobId, Usage)>,
    /// Task rows created with the batch, as [`Store::create_tasks`] does (a
    /// row already there is left as it is); their `task_queued` events follow
    /// the batch's own.
    pub tasks: Vec<Task>,
    /// When set, the whole batch is rejected unless this epoch owns the job.
    pub fence: Option<Fence>,
    /// Task ends the batch's content was built on before they were known to
    /// be committed (a report heard in a worker's notice): the batch commits
    /// only if each task is stored ended so, after its writer's transaction
    /// (docs/design.md section 3); otherwise nothing is written and the
    /// write fails as [`StoreError::Backend`], so the run resumes from what
    /// is stored.
    pub requires: Vec<TaskEnd>,
    /// Called once, inside the batch's transaction, when a message naming its
    /// task rows (or its task's end) may go out before the commit: the
    /// transaction holds what readers of those rows wait on (see [`Staged`]).
    /// A backend that cannot offer that never calls it, and the caller
    /// publishes after the commit.
    pub staged: Option<Staged>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
            && self.events.is_empty()
            && self.usage.is_none()
            && self.tasks.is_empty()
            && self.requires.is_empty()
    }
}

/// A task's end as a batch requires it to be stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskEnd {
    pub task: TaskId,
    pub attempt: u32,
    pub state: TaskState,
}

/// A callback run when a batch's transaction is *staged*: on Postgres,
/// once the statement taking the advisory locks of the task rows it creates
/// is queued on the connection (a claim takes the same lock, shared, before
/// it reads the row, so it waits for this transaction's end and then sees
/// the row or its absence; a claim that reached the server before the lock
/// finds no row and is made again, by the worker, for a while), or, for a
/// task's end, after the row lock and the end's rules passed (a
/// batch that [`Batch::requires`] the end reads the row under a share lock,
/// so it waits for this transaction too). So a message may be published while
/// the commit is still being flushed: whoever acts on it waits for the
/// commit in the store, not for the message. docs/design.md section 3.
#[derive(Clone)]
pub struct Staged(std::sync::Arc<dyn Fn() + Send + Sync>);

impl Staged {
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(f))
    }

    pub fn fire(&self) {
        (self.0)()
    }
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Staged")
    }
}

/// What a committed write produced: the events written (with their sequence
/// numbers) and the entries' assigned per-session sequence numbers.
#[derive(Clone, Debug, Default)]
pub struct Written {
    pub events: Vec<Event>,
    pub entry_seqs: Vec<i64>,
    /// The batch's task rows as stored, each with whether this write created it.
    pub tasks: Vec<(Task, bool)>,
}

/// An attempt's end, with the batch committed with it (the final answer's
/// entries, events and usage), as [`Store::finish_task_with`] takes it.
#[derive(Clone, Debug)]
pub struct OfferedEnd {
    pub outcome: TaskOutcome,
    pub usage: Usage,
    pub batch: Batch,
}

/// An end an attempt may commit in its claim's transaction
/// ([`Store::claim_task_ending`]): the attempt's run offers it once its work
/// is done, while the claim is under way (a first model answer that was
/// final before the claim committed); the claim decides once, when it holds
/// the task's row, whether it takes it. An offer made after that decision is
/// refused, and the end goes the ordinary way ([`Store::finish_task_with`]).
#[derive(Clone, Debug, Default)]
pub struct EndOffer(std::sync::Arc<std::sync::Mutex<Offer>>);

#[derive(Debug, Default)]
enum Offer {
    #[default]
    Open,
    Made(Box<OfferedEnd>),
    Decided,
}

impl EndOffer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Offer> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Offer `end` to the claim: `false` when the claim already decided
    /// without it (the end then goes the ordinary way).
    pub fn offer(&self, end: OfferedEnd) -> bool {
        let mut state = self.lock();
        match &*state {
            Offer::Open => {
                *state = Offer::Made(Box::new(end));
                true
            }
            Offer::Made(_) | Offer::Decided => false,
        }
    }

    /// Whether an end is offered and the claim has not decided yet.
    pub fn is_made(&self) -> bool {
        matches!(*self.lock(), Offer::Made(_))
    }

    /// The claim's decision: the end offered so far (a copy: a claim whose
    /// transaction failed decides the same way when it is made again), or
    /// none — and no later offer is taken.
    pub fn decide(&self) -> Option<OfferedEnd> {
        let mut state = self.lock();
        match &*state {
            Offer::Made(end) => Some((**end).clone()),
            Offer::Open | Offer::Decided => {
                *state = Offer::Decided;
                None
            }
        }
    }
}

/// One claim of a group written together ([`Store::claim_tasks_ending`]):
/// the arguments of [`Store::claim_task_ending`].
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    pub task: TaskId,
    pub attempt: u32,
    pub worker_id: String,
    pub session: Option<Session>,
    pub end: EndOffer,
}

/// What [`Store::claim_task_ending`] answers: the claim, and the end when
/// the claim took it.
pub type ClaimAnswer = (Claim, Option<(Task, Written)>);

/// The outcome of claiming a task attempt.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// This attempt now owns the task.
    Claimed { task: Task, events: Vec<Event> },
    /// The task already ended; the delivery should be acked without running.
    AlreadyFinished(Task),
    /// A later attempt already holds the task; this delivery is stale.
    Superseded { current_attempt: u32 },
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    // ---- jobs
    /// Create a job (state `queued`, with its event). With an idempotency key
    /// already used, returns the existing job and `false`.
    async fn create_job(&self, job: NewJob) -> Result<(Job, bool)>;
    async fn get_job(&self, id: JobId) -> Result<Job>;
    /// A job by full id or unique id prefix (what humans type).
    async fn resolve_job(&self, id_or_prefix: &str) -> Result<JobId> {
        self.resolve_job_in(None, id_or_prefix).await
    }
    /// The same among the jobs of `namespace` only (`None`: every namespace),
    /// so that another namespace's job never makes a prefix ambiguous.
    async fn resolve_job_in(&self, namespace: Option<&str>, id_or_prefix: &str) -> Result<JobId>;
    /// Newest first; of one namespace, or of all.
    async fn list_jobs(&self, namespace: Option<&str>, limit: u32) -> Result<Vec<Job>>;
    /// The continuations of `job` (jobs created by `flower continue` from
    /// it), oldest first.
    async fn continuations(&self, job: JobId) -> Result<Vec<JobId>>;
    /// How many jobs are in each state (states without a job left out): one
    /// aggregate query, cheap enough for every metrics scrape.
    async fn job_counts(&self) -> Result<Vec<(String, JobState, u64)>>;
    /// Move a job to `state`, with its event, in one transaction (fenced when
    /// `fence` is given); an ended job refuses with [`StoreError::JobEnded`].
    async fn set_job_state(
        &self,
        id: JobId,
        state: JobState,
        reason: Option<String>,
        final_answer: Option<String>,
        fence: Option<Fence>,
    ) -> Result<Written>;
    /// Queued, running or waiting jobs whose lease is missing or expired at
    /// `now_ms` (what a coordinator replica should take over), oldest first.
    async fn orphaned_jobs(&self, now_ms: i64, limit: u32) -> Result<Vec<JobId>>;

    // ---- sessions and transcripts
    /// Register a session (idempotent), with its event when new.
    async fn create_session(&self, session: Session) -> Result<Written>;
    async fn sessions(&self, job: JobId) -> Result<Vec<Session>>;
    async fn get_session(&self, id: SessionId) -> Result<Session>;
    /// Commit a batch in one transaction.
    async fn append(&self, batch: Batch) -> Result<Written>;
    /// Entries of a session after `after_seq`, in order.
    async fn entries(&self, session: SessionId, after_seq: i64, limit: u32) -> Result<Vec<Entry>>;

    // ---- tasks
    /// Insert a task (state `queued`) with its event; an existing task with the
    /// same (derived) id is returned unchanged with `false`.
    async fn create_task(&self, task: Task, fence: Option<Fence>) -> Result<(Task, bool, Written)> {
        let (mut tasks, written) = self.create_tasks(vec![task], fence).await?;
        let (task, created) = tasks.pop().ok_or_else(|| StoreError::Corrupt("no task returned".into()))?;
        Ok((task, created, written))
    }
    /// [`Store::create_task`] for several tasks (a fan-out's), in one
    /// transaction: the stored rows in the order given, each with whether it
    /// was created now, and the `task_queued` events of the new ones in that order.
    async fn create_tasks(&self, tasks: Vec<Task>, fence: Option<Fence>) -> Result<(Vec<(Task, bool)>, Written)>;
    async fn get_task(&self, id: TaskId) -> Result<Task>;
    /// The task as stored once a transaction writing it in flight has ended
    /// (on Postgres a share lock waits for it: a task's end staged before its
    /// commit, see [`Staged`]); where writes are serialised, [`Store::get_task`].
    async fn settled_task(&self, id: TaskId) -> Result<Task>;
    async fn tasks(&self, job: JobId) -> Result<Vec<Task>>;
    /// Claim `attempt` of a task for `worker_id` (compare-and-set): succeeds only
    /// if the task has not ended and no later attempt holds it ([`rules::claim`]).
    async fn claim_task(&self, id: TaskId, attempt: u32, worker_id: &str) -> Result<Claim> {
        self.claim_task_opening(id, attempt, worker_id, None).await
    }
    /// [`Store::claim_task`], and when the attempt is claimed, register
    /// `session` (the attempt's transcript; idempotent, as
    /// [`Store::create_session`]) in the same transaction: the claim's events
    /// then end with the session's start when it is new.
    async fn claim_task_opening(
        &self,
        id: TaskId,
        attempt: u32,
        worker_id: &str,
        session: Option<Session>,
    ) -> Result<Claim> {
        Ok(self.claim_task_ending(id, attempt, worker_id, session, &EndOffer::default()).await?.0)
    }
    /// [`Store::claim_task_opening`], and when the attempt is claimed and an
    /// end was offered ([`EndOffer`]) by the time the transaction holds the
    /// task's row, that end as [`Store::finish_task_with`] makes it, in the
    /// same transaction: the attempt claims and ends in one commit. The end's
    /// batch is staged ([`Batch::staged`]) once its rules passed, as in
    /// [`Store::finish_task_with`]. Returns the claim (its events: the
    /// claim's and the session's) and, when the end was taken, the ended task
    /// and what its batch and end wrote. A claim that is not taken takes no
    /// end.
    async fn claim_task_ending(
        &self,
        id: TaskId,
        attempt: u32,
        worker_id: &str,
        session: Option<Session>,
        end: &EndOffer,
    ) -> Result<(Claim, Option<(Task, Written)>)>;
    /// [`Store::claim_task_ending`] for each of `claims`, in one transaction:
    /// one commit for the group (and, per job, one hold of its row), each
    /// answer as that claim alone would have had it, in order, the claims
    /// decided in order (a later claim of the same task sees the earlier
    /// one's change). A task not found is that claim's
    /// [`StoreError::NotFound`]; any other failure is the group's (`Err`:
    /// nothing of it is stored, and an end it refused — a fence, a required
    /// end — may be one claim's alone: ask each again by itself).
    async fn claim_tasks_ending(&self, claims: &[ClaimRequest]) -> Result<Vec<Result<ClaimAnswer>>>;
    /// End the task from `attempt`, recording its usage on the task (the job's
    /// total already counted it turn by turn). Rejected with
    /// [`StoreError::Superseded`] if a later attempt holds the task,
    /// [`StoreError::NotClaimed`] if this attempt never claimed it, and
    /// [`StoreError::AlreadyFinished`] if the task already ended
    /// ([`rules::finish`]).
    async fn finish_task(
        &self,
        id: TaskId,
        attempt: u32,
        outcome: TaskOutcome,
        usage: Usage,
    ) -> Result<(Task, Written)> {
        self.finish_task_with(id, attempt, outcome, usage, Batch::default()).await
    }
    /// Commit `batch` (the attempt's last entries, events and usage) and end
    /// the task as [`Store::finish_task`] does, in one transaction: both land
    /// or neither does (a refused end leaves the batch unstored). The batch's
    /// events come before the task's end; the entries' numbers are in the
    /// returned [`Written`].
    async fn finish_task_with(
        &self,
        id: TaskId,
        attempt: u32,
        outcome: TaskOutcome,
        usage: Usage,
        batch: Batch,
    ) -> Result<(Task, Written)>;
    /// Record that `attempt` is still running (a worker's heartbeat): the
    /// task's `updated_at` moves on. `false` when that attempt no longer holds
    /// a running task. The owning coordinator's sweeper requeues a running or
    /// queued task whose `updated_at` is too old: its message is gone.
    async fn heartbeat_task(&self, id: TaskId, attempt: u32) -> Result<bool>;
    /// Cancel every task of a job that has not ended; their events come in
    /// dispatch order ([`rules::cancel`]).
    async fn cancel_tasks(&self, job: JobId, reason: &str) -> Result<Written>;
    /// Queue as many of `tasks` (held tasks of `namespace`'s jobs) as the
    /// namespace's `max_tasks` admits now, oldest first — all of them when
    /// it has no such limit; the rows queued. The namespace's tasks queued
    /// or running count; its row is locked for the count, so admissions
    /// take turns (docs/design.md section 17, "Task limit").
    async fn admit_tasks(&self, namespace: &str, tasks: &[TaskId]) -> Result<Vec<Task>>;
    /// The namespace's tasks not ended: queued or running, and held.
    async fn task_counts(&self, namespace: &str) -> Result<TaskCounts>;

    // ---- leases
    /// Take the job's lease for `owner` if it is free, expired, or already
    /// `owner`'s; taking it from someone else (or anew) bumps the epoch.
    /// `None` while another owner's lease is live.
    async fn acquire_lease(&self, job: JobId, owner: &str, ttl_ms: i64) -> Result<Option<Lease>>;
    /// Extend a held lease; `false` if it was lost (expired and taken, or a newer epoch).
    async fn renew_lease(&self, lease: &Lease, ttl_ms: i64) -> Result<bool> {
        Ok(self.renew_leases(std::slice::from_ref(lease), ttl_ms).await?.first().copied().unwrap_or(false))
    }
    /// [`Store::renew_lease`] for every lease a replica holds, in one
    /// transaction: per lease, in order, whether it is still held.
    async fn renew_leases(&self, leases: &[Lease], ttl_ms: i64) -> Result<Vec<bool>>;
    /// Give the lease up (expires it at once), if still held.
    async fn release_lease(&self, lease: &Lease) -> Result<()>;

    // ---- events
    /// Events after `after_seq`, in order.
    async fn events(&self, job: JobId, after_seq: i64, limit: u32) -> Result<Vec<Event>>;

    // ---- namespaces, API keys and the audit log (docs/design.md, section 17)
    /// Create a namespace; `false` when it exists already.
    async fn create_namespace(&self, name: &str) -> Result<bool>;
    async fn namespaces(&self) -> Result<Vec<Namespace>>;
    /// One namespace, with its limits (`NotFound` when there is none).
    async fn namespace(&self, name: &str) -> Result<Namespace>;
    /// Replace a namespace's limits (`NotFound` when there is none).
    async fn set_limits(&self, name: &str, limits: &Limits) -> Result<Namespace>;
    /// What the namespace's jobs spent from UTC day `since_day` on, per day
    /// and job (a row per pair that spent anything).
    async fn spend(&self, namespace: &str, since_day: i64) -> Result<Vec<Spend>>;
    /// Store a new key (its namespace must exist: `NotFound` otherwise);
    /// with `replaces`, that key is revoked in the same transaction (a
    /// rotation), which stores nothing (`KeyRevoked`) when it was revoked
    /// before: one live successor per key, whatever races.
    async fn create_key(&self, key: ApiKey, replaces: Option<String>) -> Result<()>;
    async fn get_key(&self, id: &str) -> Result<ApiKey>;
    /// Keys of one namespace, or of all, oldest first.
    async fn keys(&self, namespace: Option<&str>) -> Result<Vec<ApiKey>>;
    /// Revoke a key at `at` (a key revoked before keeps its first time).
    async fn revoke_key(&self, id: &str, at: i64) -> Result<ApiKey>;
    /// Note that keys were used (their `last_used_at`, moved forward only).
    async fn touch_keys(&self, ids: Vec<String>, at: i64) -> Result<()>;
    /// Append records to the audit log, in one transaction.
    async fn append_audit(&self, records: Vec<AuditRecord>) -> Result<()>;
    /// The audit log after `after_seq`, oldest first; of one namespace, or of all.
    async fn audit_log(&self, namespace: Option<&str>, after_seq: i64, limit: u32) -> Result<Vec<AuditRecord>>;

    // ---- provider routes' rate limits, shared by every process (docs/design.md section 15)
    /// Apply `change` to `route`'s buckets at `now` (ms), in one transaction
    /// holding the route's row ([`rules::quota_change`] decides): for an
    /// admission, `None` when the request may go, else how long it waits.
    async fn change_quota(&self, route: &str, change: rules::QuotaChange, now: i64) -> Result<Option<quota::Wait>>;
    /// Admit the call `ticket` of `claim`, a request of `input_tokens`
    /// (estimated), on `route`: `None` when it may go (its request and input
    /// tokens taken, or no limit known for the route), else how long until
    /// its turn (nothing taken; its place in line kept while it comes back
    /// by then, [`quota::WAITER_LEASE_MS`] allowed).
    async fn admit_quota(
        &self,
        route: &str,
        claim: &quota::Claimant,
        ticket: u64,
        input_tokens: u64,
        now: i64,
    ) -> Result<Option<quota::Wait>> {
        let claim = claim.clone();
        self.change_quota(route, rules::QuotaChange::Admit { input_tokens, claim, ticket }, now).await
    }
    /// Charge what a request on `route` used beyond its admission: input
    /// tokens above its estimate (negative: given back) and its output.
    async fn charge_quota(&self, route: &str, input_tokens: f64, output_tokens: f64, now: i64) -> Result<()> {
        self.change_quota(route, rules::QuotaChange::Charge { input_tokens, output_tokens }, now).await.map(|_| ())
    }
    /// The route's limits as a provider stated them (or an operator set
    /// them), what it said is left (`remaining`: buckets holding more come
    /// down to it), and, after a refusal that asked for patience, how long
    /// every bucket stays empty (`drain_ms`).
    async fn learn_quota(
        &self,
        route: &str,
        limits: quota::Quota,
        remaining: Option<quota::Quota>,
        drain_ms: Option<i64>,
        now: i64,
    ) -> Result<()> {
        self.change_quota(route, rules::QuotaChange::Learn { limits, remaining, drain_ms }, now).await.map(|_| ())
    }
    /// Every route's buckets, as last written.
    async fn route_quotas(&self) -> Result<Vec<(String, quota::Route)>>;
}

/// A namespace's tasks not ended ([`Store::task_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskCounts {
    /// Queued for a worker or running: what `max_tasks` counts.
    pub live: u64,
    /// Waiting for `max_tasks` to admit them.
    pub held: u64,
}

/// What one job of a namespace spent on one UTC day ([`Store::spend`]).
/// Added to with every usage the job is charged, in the same transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct Spend {
    pub day: i64,
    pub job: JobId,
    pub usage: Usage,
}

/// A spend row's tokens (input, output, cache writes, cache reads, 1-hour
/// cache writes) as a [`Usage`].
pub(crate) fn spent_usage([input, output, writes, reads, writes_1h]: [u64; 5]) -> Usage {
    let mut u = Usage { input_tokens: input, output_tokens: output, ..Default::default() };
    u.cache_creation_input_tokens = writes;
    u.cache_read_input_tokens = reads;
    u.cache_creation.ephemeral_1h_input_tokens = writes_1h;
    u.cache_creation.ephemeral_5m_input_tokens = writes.saturating_sub(writes_1h);
    u
}

/// Events read by [`scan_events`] per round trip.
const SCAN_PAGE: u32 = 1_000;

/// Walk `job`'s events after `after_seq` in order, a page at a time (memory
/// bounded by the page, whatever the job's length); the last number seen
/// (`after_seq` when there were none).
pub async fn scan_events(store: &dyn Store, job: JobId, after_seq: i64, mut each: impl FnMut(&Event)) -> Result<i64> {
    let mut cursor = after_seq;
    loop {
        let page = store.events(job, cursor, SCAN_PAGE).await?;
        for e in &page {
            cursor = e.seq;
            each(e);
        }
        if page.len() < SCAN_PAGE as usize {
            return Ok(cursor);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_failure_keeps_its_source_and_kind() {
        let e = StoreError::backend_in("/var/lib/flower/objects", std::io::Error::other("disk full"));
        assert_eq!(e.to_string(), "storage backend: /var/lib/flower/objects: disk full");
        let source = std::error::Error::source(&e).expect("the io error is kept");
        assert_eq!(source.to_string(), "disk full");
        assert_eq!(flower_model::Classify::kind(&e), flower_model::ErrorKind::Unavailable);
        assert!(std::error::Error::source(&StoreError::backend("in words only")).is_none());
        // An unstored end a write was built on is a state that moved on, not an outage.
        let task = TaskId::derive(JobId::random(), flower_model::SessionId::random(), "t");
        let unconfirmed = StoreError::Unconfirmed { task, state: TaskState::Succeeded, attempt: 2 };
        assert_eq!(flower_model::Classify::kind(&unconfirmed), flower_model::ErrorKind::Conflict);
    }
}
