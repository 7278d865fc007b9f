//! The application layer: what a user does to jobs — submit, continue,
//! cancel, send a message, answer a question, ask aside, read — in one
//! place for every front-end (docs/design.md, section 1). The gRPC API, the
//! web console and the MCP server translate their requests into these calls
//! and render what comes back; the checks on input, the limits and the error
//! classification ([`AppError`]) live here, once.
//!
//! What differs between a service and one process running its own jobs
//! (how a new job starts, who hears a notice, how a message reaches a run in
//! this process) is behind [`Runs`].
//!
//! # Layout
//! - [`access`]: who may do what — roles, actions, principals, API keys
//! - [`auth`]: who is calling — a bearer credential made a [`access::Caller`]
//! - [`jwt`]: signed tokens verified against a JWKS
//! - [`keys`]: namespaces, API keys and the audit log, as calls
//! - [`audit`]: checking a call against the caller, and recording it
//! - [`error`]: [`AppError`], a kind and words a client may read
//! - [`input`]: checks on ids, text and paths, and their limits
//! - [`commands`]: the calls that change a job
//! - [`views`]: the calls that read one

use std::sync::Arc;

use flower_agent::provider::ConfiguredProviders;
use flower_bus::Notifier;
use flower_model::policy::ToolPolicy;
use flower_model::{Job, JobId, JobSpec};
use flower_store::Store;
use object_store::ObjectStore;

pub mod access;
pub mod audit;
pub mod auth;
pub mod commands;
pub mod error;
pub mod input;
pub mod jwt;
pub mod keys;
pub mod limits;
pub mod views;

pub use commands::{AnswerRequest, SubmitRequest, Submitted};
pub use error::AppError;

pub type Result<T, E = AppError> = std::result::Result<T, E>;

/// How jobs run behind this application: a service's owner, or the runs of
/// one process (`flower mcp-serve` on the embedded store).
#[async_trait::async_trait]
pub trait Runs: Send + Sync + 'static {
    /// Whether this deployment can run `spec` (its providers configured,
    /// its scenario readable): `Invalid` naming the field when not.
    fn admit(&self, spec: &JobSpec) -> Result<()>;
    /// A new job is stored and queued: start it.
    fn submitted(&self, job: JobId);
    /// Who tells `job`'s watchers and its run what changed, if anyone.
    fn notifier(&self, job: JobId) -> Option<Arc<dyn Notifier>>;
    /// Whether a message to `job` (not ended) can reach its run from here.
    fn reachable(&self, _job: JobId) -> Result<()> {
        Ok(())
    }
    /// A user's message to `job` is stored: hand it to the run when it runs
    /// here (a service's owner reads it from the job's events).
    async fn message_stored(&self, _job: JobId, _message: &str) {}
    /// An answer to `job`'s question is stored.
    async fn answer_stored(&self, _job: JobId) {}
    /// `job` was cancelled.
    async fn cancelled(&self, _job: JobId) {}
}

/// Where a spec's `workspace:` directory is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workspaces {
    /// Only the files a request carries (a service: the directory is on the client's machine).
    Sent,
    /// Also a spec's own `workspace:` directory, on this machine (one process on its own store).
    Local,
}

/// How ids are given: a whole id, or also a unique prefix of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ids {
    Whole,
    Prefix,
}

/// The backends and settings the application works on.
#[derive(Clone)]
pub struct AppBackends {
    pub store: Arc<dyn Store>,
    pub objects: Arc<dyn ObjectStore>,
    /// The providers of this deployment (asides).
    pub providers: Arc<ConfiguredProviders>,
    /// MCP servers, credential variables and egress a spec may name.
    pub tool_policy: Arc<ToolPolicy>,
    /// The context windows learnt in this process (asides learn; the
    /// console's meter reads).
    pub windows: flower_model::windows::Windows,
}

/// The application: cheap to clone, shared by the front-ends of a process.
#[derive(Clone)]
pub struct App {
    b: AppBackends,
    runs: Arc<dyn Runs>,
    ids: Ids,
    workspaces: Workspaces,
    /// Largest request accepted (spec and workspace together).
    max_request_bytes: usize,
    auth: Arc<auth::Authenticator>,
    /// Who this application acts for ([`App::acting_as`]); `None`: the
    /// local admin of an open deployment, or no one.
    caller: Option<Arc<access::Caller>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").field("caller", &self.caller).field("ids", &self.ids).finish_non_exhaustive()
    }
}

impl App {
    pub fn new(b: AppBackends, runs: Arc<dyn Runs>) -> Self {
        Self {
            b,
            runs,
            ids: Ids::Whole,
            workspaces: Workspaces::Sent,
            max_request_bytes: 16 << 20,
            auth: Arc::new(auth::Authenticator::new(auth::AuthConfig::default())),
            caller: None,
        }
    }

    /// The credentials this deployment accepts (default: none, an open deployment).
    pub fn with_auth(mut self, config: auth::AuthConfig) -> Self {
        self.auth = Arc::new(auth::Authenticator::new(config));
        self
    }

    /// Accept unique id prefixes where an id is asked for.
    pub fn with_ids(mut self, ids: Ids) -> Self {
        self.ids = ids;
        self
    }

    /// Read a spec's `workspace:` directory on this machine.
    pub fn with_workspaces(mut self, workspaces: Workspaces) -> Self {
        self.workspaces = workspaces;
        self
    }

    pub fn with_max_request_bytes(mut self, max: usize) -> Self {
        self.max_request_bytes = max;
        self
    }

    pub fn max_request_bytes(&self) -> usize {
        self.max_request_bytes
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.b.store
    }

    pub fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.b.objects
    }

    pub fn windows(&self) -> &flower_model::windows::Windows {
        &self.b.windows
    }

    pub fn runs(&self) -> &Arc<dyn Runs> {
        &self.runs
    }

    /// The job `field` names: a whole id (or, with [`Ids::Prefix`], a unique
    /// prefix), of a namespace the caller sees (another's is `NOT_FOUND`,
    /// in the same words as a job that does not exist).
    pub async fn job(&self, field: &str, id: &str) -> Result<Job> {
        let caller = self.caller()?;
        let job = self.find_job(field, id).await?;
        if !caller.principal.sees(&job.namespace) {
            return Err(not_found(id));
        }
        Ok(job)
    }

    async fn find_job(&self, field: &str, id: &str) -> Result<Job> {
        input::check_id(field, id)?;
        let found = match (id.parse::<JobId>(), self.ids) {
            (Ok(whole), _) => self.b.store.get_job(whole).await,
            (Err(_), Ids::Prefix) if id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') => {
                let scope = self.caller()?.principal;
                let scope = (scope.role != access::Role::Admin).then_some(scope.namespace);
                match self.b.store.resolve_job_in(scope.as_deref(), &id.to_ascii_lowercase()).await {
                    Ok(whole) => self.b.store.get_job(whole).await,
                    Err(e) => Err(e),
                }
            }
            (Err(_), _) => return Err(AppError::invalid(field, format_args!("`{id}` is not a valid id"))),
        };
        found.map_err(|e| match e {
            flower_store::StoreError::NotFound(_) => not_found(id),
            e => e.into(),
        })
    }

    /// The id of the job `field` names, checked to exist.
    pub async fn job_id(&self, field: &str, id: &str) -> Result<JobId> {
        Ok(self.job(field, id).await?.id)
    }
}

/// A job the caller may not know of, in the words of one that does not exist.
pub(crate) fn not_found(id: impl std::fmt::Display) -> AppError {
    AppError::new(flower_model::ErrorKind::NotFound, format!("job `{id}` not found: no job has this id"))
}
