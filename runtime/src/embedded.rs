//! The embedded mode: a whole job in one process, on SQLite + a local object
//! store + the in-process bus, with an in-process simulator when the spec
//! names `sim`. The same coordinator and worker code as the distributed mode;
//! only the backends differ.
//!
//! Layout of the home directory (`FLOWER_HOME`):
//! `flower.db` (jobs, tasks, transcripts, events), `objects/` (workbenches,
//! workspace blobs), `work/` (per-task working directories while they run).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flower_agent::provider::{AnthropicClient, ClientConfig, OpenAiClient, Provider, RunProviders};
use flower_agent::{Inbox, Journal};
use flower_bus::{MemoryBus, Notifier};
use flower_model::spec::{Api, ProviderKind, Route};
use flower_model::windows::Windows;
use flower_model::{JobId, JobSpec, JobState, SessionId, TaskState, Usage};
use flower_sim::{Scenario, SimHandle};
use flower_store::workspace::Workspace;
use flower_store::{NewJob, SqliteStore, Store, StoreError, Workbench};
use flower_worker::isolation::ToolSetup;
use flower_worker::{Worker, WorkerOptions};
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use flower_coordinator::qa_log::QaLog;
use flower_coordinator::runner::{JobContext, run_job};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Spec(#[from] flower_model::SpecError),
    #[error(transparent)]
    Scenario(#[from] flower_sim::ScenarioError),
    #[error("cannot start the simulator: {0}")]
    Simulator(std::io::Error),
    #[error("provider: {0}")]
    Provider(#[from] flower_agent::provider::ProviderError),
    #[error("the run stopped before the job ended")]
    HandedOver,
    #[error("home directory {path}: {source}")]
    Home { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Aside(#[from] flower_coordinator::aside::AsideError),
    #[error(transparent)]
    Continue(#[from] flower_coordinator::continuation::ContinueError),
}

/// What a finished run reports.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub job_id: JobId,
    pub name: String,
    pub state: JobState,
    pub reason: Option<String>,
    pub final_answer: Option<String>,
    pub coordinator_session: SessionId,
    pub coordinator_turns: u32,
    pub tasks: usize,
    pub tasks_succeeded: usize,
    pub tasks_failed: usize,
    pub usage: Usage,
    pub database: PathBuf,
    pub workbench: PathBuf,
    pub artifacts: Vec<(String, u64)>,
    /// What entered the main thread versus the subagents (`flower context`).
    pub context: flower_coordinator::context::ContextReport,
    /// With the in-process simulator: its cache audit against the recorded rewrites.
    pub cache_audit: Option<flower_sim::audit::CacheAudit>,
}

pub struct EmbeddedRuntime {
    home: PathBuf,
    store: Arc<SqliteStore>,
    objects: Arc<dyn ObjectStore>,
    bus: MemoryBus,
    /// The context windows learnt by this runtime's sessions (its own
    /// unless [`EmbeddedRuntime::with_windows`] shares another's).
    windows: Windows,
}

impl EmbeddedRuntime {
    /// Open (creating) the home directory and its database.
    pub fn open(home: &Path) -> Result<Self, RunError> {
        let home_err = |source| RunError::Home { path: home.to_path_buf(), source };
        std::fs::create_dir_all(home.join("objects")).map_err(home_err)?;
        let home = home.canonicalize().map_err(home_err)?;
        let store = Arc::new(SqliteStore::open(&home.join("flower.db"))?);
        let objects: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(home.join("objects")).map_err(StoreError::backend_from)?);
        Ok(Self { home, store, objects, bus: MemoryBus::new(), windows: Windows::default() })
    }

    /// Learn and read context windows in `windows` (another runtime's of the
    /// same process: what one job's sessions learn, the next one's use).
    pub fn with_windows(mut self, windows: Windows) -> Self {
        self.windows = windows;
        self
    }

    /// The context windows learnt by this runtime's sessions.
    pub fn windows(&self) -> Windows {
        self.windows.clone()
    }

    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// The objects (workbenches, workspaces) under the home.
    pub fn objects(&self) -> Arc<dyn ObjectStore> {
        self.objects.clone()
    }

    pub fn notifier(&self) -> Arc<dyn Notifier> {
        Arc::new(self.bus.clone())
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// Where a job's workbench lives on disk.
    pub fn workbench_dir(&self, job: JobId) -> PathBuf {
        self.home.join("objects").join(Workbench::new(self.objects.clone(), job).location())
    }

    /// Record a job (state `queued`) and upload its workspace snapshot.
    pub async fn submit(&self, spec: &JobSpec, workspace: Option<&Path>) -> Result<JobId, RunError> {
        let value = serde_json::to_value(spec).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let (job, _) = self.store.create_job(NewJob::new(JobId::random(), spec.name.clone(), value)).await?;
        if let Some(dir) = workspace.or(spec.workspace.as_deref()) {
            Workspace::new(self.objects.clone(), job.id).upload_dir(dir, spec.runtime.workspace_limit.as_u64()).await?;
        }
        Ok(job.id)
    }

    /// Record the continuation of the finished job `parent` (`flower
    /// continue`): a new queued job starting from its workbench and
    /// workspace, with `instruction`. Run it with [`Self::run`].
    pub async fn continue_job(&self, parent: JobId, instruction: &str) -> Result<JobId, RunError> {
        let (job, _) = flower_coordinator::continuation::create(
            self.store.as_ref(),
            self.objects.clone(),
            parent,
            instruction,
            None,
            Some("local".into()),
        )
        .await?;
        Ok(job.id)
    }

    /// Continue a job whose process died: its unfinished tasks go back on the
    /// queue as new attempts, and the coordinator resumes its stored main
    /// thread through the pruning loader.
    pub async fn resume(
        &self,
        job_id: JobId,
        tools: &ToolSetup,
        cancel: CancellationToken,
    ) -> Result<RunSummary, RunError> {
        let job = self.store.get_job(job_id).await?;
        if job.state.is_terminal() {
            return Err(RunError::Store(StoreError::JobEnded { job: job_id, state: job.state }));
        }
        for t in self.store.tasks(job_id).await? {
            if !t.state.is_terminal() {
                let msg = flower_bus::TaskMessage {
                    job_id,
                    task_id: t.id,
                    worker: t.worker.clone(),
                    epoch: 1,
                    base_attempt: 0,
                    trace: None,
                    body: None,
                    republish: 0,
                    stream_notice: false,
                };
                self.bus.publish_resumed(msg, t.attempt);
            }
        }
        self.run(job_id, tools, cancel).await
    }

    /// Run a submitted job to its end, its tools started as `tools` says.
    /// `cancel` stops it cleanly (state `cancelled`).
    pub async fn run(
        &self,
        job_id: JobId,
        tools: &ToolSetup,
        cancel: CancellationToken,
    ) -> Result<RunSummary, RunError> {
        self.run_with_inbox(job_id, tools, cancel, Inbox::default(), QaLog::new(self.objects.clone(), job_id)).await
    }

    /// [`Self::run`], with the coordinator's `inbox` held by the caller (a
    /// user's message pushed there reaches the running coordinator at once),
    /// and the job's `qa_log`, where the caller logs that message.
    pub async fn run_with_inbox(
        &self,
        job_id: JobId,
        tools: &ToolSetup,
        cancel: CancellationToken,
        inbox: Inbox,
        qa_log: QaLog,
    ) -> Result<RunSummary, RunError> {
        let store: Arc<dyn Store> = self.store.clone();
        let job = store.get_job(job_id).await?;
        let spec = JobSpec::from_value(job.spec.clone())?;
        let journal = Journal::new(store.clone(), self.notifier());
        let (providers, sim) = match self.providers(&spec).await {
            Ok(p) => p,
            Err(e) => {
                self.end(&journal, job_id, JobState::Failed, Some(e.to_string()), None).await?;
                return Err(e);
            }
        };
        self.end(&journal, job_id, JobState::Running, None, None).await?;

        let shutdown = CancellationToken::new();
        let mut options =
            WorkerOptions::new(format!("embedded-{}", std::process::id()), self.home.join("work"), tools.clone());
        options.windows = self.windows.clone();
        let worker = Worker::new(
            options,
            journal.clone(),
            Arc::new(self.bus.clone()),
            self.objects.clone(),
            Arc::new(RunProviders(providers.clone())),
        );
        let workers = tokio::spawn(worker.run(spec.runtime.concurrency as usize, shutdown.clone()));

        let ctx = JobContext {
            sweep: Default::default(),
            journal: journal.clone(),
            queue: Arc::new(self.bus.clone()),
            objects: self.objects.clone(),
            provider: coordinator_provider(&spec, &providers),
            epoch: 1,
            inbox,
            // Ctrl-C in a local run is the user's cancel.
            stop: flower_coordinator::stop::Stop::from_token(cancel),
            qa_log,
            windows: self.windows.clone(),
            budgets: flower_agent::spend::NamespaceBudgets::new(self.store.clone()),
            // A local run's jobs are the default namespace's.
            namespace: flower_model::access::DEFAULT_NAMESPACE.to_string(),
            priority: spec.priority(),
        };
        let finished = run_job(&ctx, job_id).await;
        shutdown.cancel();
        if let Err(e) = workers.await {
            tracing::error!(error = %e, "worker pool ended abnormally");
        }
        let records = sim.as_ref().map(|s| s.audit());
        if let Some(sim) = sim {
            sim.shutdown().await;
        }
        let finished = finished?.ok_or(RunError::HandedOver)?;
        let mut summary = self.summary(job_id, finished.session, finished.turns).await?;
        summary.cache_audit = records.map(|r| flower_sim::audit::join(&r, &summary.context.rewrites()));
        if let Some(audit) = &summary.cache_audit {
            // Kept beside the job (not in its workbench) for the console.
            let put = match serde_json::to_vec(audit) {
                Ok(body) => self
                    .objects
                    .put(&flower_coordinator::context::audit_key(job_id), object_store::PutPayload::from(body))
                    .await
                    .err()
                    .map(|e| e.to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(e) = put {
                tracing::warn!(error = %e, "the cache audit was not kept");
            }
        }
        Ok(summary)
    }

    /// A side question about `job` (`flower aside`), answered by a read-only
    /// session of its own with the job's provider; the job is not touched.
    pub async fn aside(&self, job: JobId, question: &str) -> Result<flower_coordinator::aside::Aside, RunError> {
        let store: Arc<dyn Store> = self.store.clone();
        let spec = JobSpec::from_value(store.get_job(job).await?.spec)?;
        let (providers, sim) = self.providers(&spec).await?;
        let provider = coordinator_provider(&spec, &providers);
        let journal = Journal::new(store, self.notifier());
        let answered = flower_coordinator::aside::aside(
            &journal,
            self.objects.clone(),
            provider,
            &self.windows,
            &spec,
            job,
            question,
        )
        .await;
        if let Some(sim) = sim {
            sim.shutdown().await;
        }
        Ok(answered?)
    }

    /// A client for each route of a spec's roles; for `sim`, a simulator
    /// started here on an ephemeral loopback port answers every API (the
    /// clients still speak real HTTP to it).
    async fn providers(&self, spec: &JobSpec) -> Result<(Providers, Option<SimHandle>), RunError> {
        let mut sim = None;
        if spec.provider == ProviderKind::Sim {
            let path = spec.scenario.as_deref().ok_or_else(|| flower_model::SpecError {
                field: "scenario".into(),
                message: "required with provider `sim`".into(),
            })?;
            let scenario = Scenario::load(path)?;
            sim = Some(flower_sim::start(scenario, ([127, 0, 0, 1], 0).into()).await.map_err(RunError::Simulator)?);
        }
        let mut out: Providers = Vec::new();
        for route in spec.routes() {
            let mut config = match route.api {
                Api::Messages => ClientConfig::from_env(),
                Api::ChatCompletions => ClientConfig::openai_from_env(),
            };
            if let Some(sim) = &sim {
                config.base_url = sim.base_url();
                config.api_key = None;
            } else if let Some(url) = spec.base_url.as_ref().filter(|_| route.entry == spec.provider) {
                // The spec's endpoint is its own provider's; a role naming another uses that one's environment.
                config.base_url = url.clone();
            }
            // The routes' rate limits, learnt and kept in the home's store.
            let api = if route.api == Api::Messages { "messages" } else { "chat" };
            config.quota = Some(flower_agent::provider::quota::RouteQuotas::new(
                self.store.clone(),
                api,
                &config.base_url,
                config.api_key.as_deref(),
            ));
            let client: Arc<dyn Provider> = match route.api {
                Api::Messages => Arc::new(AnthropicClient::new(config)?),
                Api::ChatCompletions => Arc::new(OpenAiClient::new(config)?),
            };
            out.push((route, client));
        }
        Ok((out, sim))
    }

    /// Move the job to `state`, with its event.
    async fn end(
        &self,
        journal: &Journal,
        job: JobId,
        state: JobState,
        reason: Option<String>,
        answer: Option<String>,
    ) -> Result<(), RunError> {
        let written = journal.store().set_job_state(job, state, reason, answer, journal.fence()).await?;
        journal.announce(&written).await;
        Ok(())
    }

    async fn summary(&self, job_id: JobId, session: SessionId, turns: u32) -> Result<RunSummary, RunError> {
        let job = self.store.get_job(job_id).await?;
        let tasks = self.store.tasks(job_id).await?;
        let artifacts = Workbench::new(self.objects.clone(), job_id)
            .list()
            .await?
            .into_iter()
            .filter(|(p, _)| p.starts_with("artifacts/"))
            .collect();
        Ok(RunSummary {
            job_id,
            name: job.name,
            state: job.state,
            reason: job.reason,
            final_answer: job.final_answer,
            coordinator_session: session,
            coordinator_turns: turns,
            tasks: tasks.len(),
            tasks_succeeded: tasks.iter().filter(|t| t.state == TaskState::Succeeded).count(),
            tasks_failed: tasks.iter().filter(|t| matches!(t.state, TaskState::Failed | TaskState::Cancelled)).count(),
            usage: job.usage,
            database: self.home.join("flower.db"),
            workbench: self.workbench_dir(job_id),
            artifacts,
            context: flower_coordinator::context::report(self.store.as_ref(), job_id).await?,
            cache_audit: None,
        })
    }
}

/// One run's clients, by route.
type Providers = Vec<(Route, Arc<dyn Provider>)>;

/// The coordinator's client among a run's (its route is always there).
fn coordinator_provider(spec: &JobSpec, providers: &Providers) -> Arc<dyn Provider> {
    let route = spec.coordinator_route();
    providers.iter().find(|(r, _)| *r == route).map(|(_, p)| p.clone()).unwrap_or_else(|| providers[0].1.clone())
}
