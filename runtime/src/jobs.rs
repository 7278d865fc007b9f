//! The application layer over the embedded store of a home, its jobs run in
//! this process (`flower mcp-serve`, `flower ui`): each submitted job on its
//! own [`EmbeddedRuntime`] (its own bus, worker pool and simulator), exactly
//! as `flower run` runs one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use flower_agent::Inbox;
use flower_bus::Notifier;
use flower_coordinator::app::{self, App, AppBackends, AppError, Ids, Runs, Workspaces};
use flower_coordinator::qa_log::QaLog;
use flower_model::windows::Windows;
use flower_model::{JobId, JobSpec};
use flower_worker::isolation::ToolSetup;
use tokio_util::sync::CancellationToken;

use crate::EmbeddedRuntime;

/// A job this process runs: how to stop it and reach its coordinator.
struct Running {
    runtime: Arc<EmbeddedRuntime>,
    cancel: CancellationToken,
    inbox: Inbox,
    /// The job's questions and messages log, shared with its run.
    qa_log: QaLog,
}

/// What reaches a running job: its runtime, stop, inbox and log.
#[derive(Clone)]
struct Handle {
    runtime: Arc<EmbeddedRuntime>,
    cancel: CancellationToken,
    inbox: Inbox,
    qa_log: QaLog,
}

/// The runs of this process.
pub struct EmbeddedRuns {
    home: PathBuf,
    /// How the jobs' tools start (made at start: isolation probed).
    tools: ToolSetup,
    /// The context windows learnt by every job of this process.
    windows: Windows,
    running: Arc<Mutex<HashMap<JobId, Running>>>,
    tasks: Mutex<tokio::task::JoinSet<()>>,
}

/// The application over the home at `home`, its jobs run here; and the runs,
/// to wait for at exit ([`EmbeddedRuns::drain`]); the jobs' tools start as
/// `tools` says (set up by the caller, as for `flower run`).
pub fn embedded_app(home: &Path, tools: ToolSetup) -> Result<(App, Arc<EmbeddedRuns>), crate::RunError> {
    let runtime = EmbeddedRuntime::open(home)?;
    let windows = runtime.windows();
    let policy = tools.policy().clone();
    let runs = Arc::new(EmbeddedRuns {
        home: runtime.home().to_path_buf(),
        tools,
        windows: windows.clone(),
        running: Default::default(),
        tasks: Default::default(),
    });
    let backends = AppBackends {
        store: runtime.store(),
        objects: runtime.objects(),
        providers: Arc::new(Default::default()),
        tool_policy: Arc::new(policy),
        windows,
    };
    let app = App::new(backends, runs.clone()).with_ids(Ids::Prefix).with_workspaces(Workspaces::Local);
    Ok((app, runs))
}

impl EmbeddedRuns {
    pub fn home(&self) -> &Path {
        &self.home
    }

    fn running(&self, job: JobId) -> Option<Handle> {
        let map = self.running.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&job).map(|r| Handle {
            runtime: r.runtime.clone(),
            cancel: r.cancel.clone(),
            inbox: r.inbox.clone(),
            qa_log: r.qa_log.clone(),
        })
    }

    /// Start `job` on a runtime of its own.
    fn start(&self, job: JobId) -> Result<(), crate::RunError> {
        // A runtime of its own: its bus, workers and simulator serve this job
        // only (the windows learnt are the process's, whichever job heard them).
        let runtime = Arc::new(EmbeddedRuntime::open(&self.home)?.with_windows(self.windows.clone()));
        let cancel = CancellationToken::new();
        let inbox = Inbox::default();
        let qa_log = QaLog::new(runtime.objects(), job);
        let run =
            Running { runtime: runtime.clone(), cancel: cancel.clone(), inbox: inbox.clone(), qa_log: qa_log.clone() };
        self.running.lock().unwrap_or_else(|p| p.into_inner()).insert(job, run);
        let running = self.running.clone();
        let tools = self.tools.clone();
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).spawn(async move {
            match runtime.run_with_inbox(job, &tools, cancel, inbox, qa_log).await {
                Ok(s) => tracing::info!(job = %job, state = %s.state, "job ended"),
                Err(e) => tracing::warn!(job = %job, error = %e, "job run stopped"),
            }
            running.lock().unwrap_or_else(|p| p.into_inner()).remove(&job);
        });
        Ok(())
    }

    /// Wait for the runs of this process before it exits.
    pub async fn drain(&self) {
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        while tasks.try_join_next().is_some() {} // the runs that already ended
        if !tasks.is_empty() {
            eprintln!(
                "flower mcp-serve: {} job(s) still running here; waiting for them to end (Ctrl-C leaves them for `flower run --resume JOB`)",
                tasks.len()
            );
        }
        while tasks.join_next().await.is_some() {}
    }
}

#[async_trait::async_trait]
impl Runs for EmbeddedRuns {
    fn admit(&self, spec: &JobSpec) -> app::Result<()> {
        if let Some(scenario) = &spec.scenario
            && let Err(e) = flower_sim::Scenario::load(scenario)
        {
            return Err(AppError::invalid("spec", format_args!("scenario {}: {e}", scenario.display())));
        }
        Ok(())
    }

    fn submitted(&self, job: JobId) {
        if let Err(e) = self.start(job) {
            tracing::error!(job = %job, error = %e, "the job could not be started here; `flower run --resume` runs it");
        }
    }

    fn notifier(&self, job: JobId) -> Option<Arc<dyn Notifier>> {
        self.running(job).map(|h| h.runtime.notifier())
    }

    fn reachable(&self, job: JobId) -> app::Result<()> {
        match self.running(job) {
            Some(_) => Ok(()),
            None => Err(AppError::precondition(format!(
                "job {job} is not running in this server: an embedded job hears messages only from the process running it"
            ))),
        }
    }

    async fn message_stored(&self, job: JobId, message: &str) {
        if let Some(h) = self.running(job) {
            h.inbox.push(flower_coordinator::actions::inbox_text(message));
            h.qa_log.message(message).await;
        }
    }

    async fn answer_stored(&self, job: JobId) {
        if let Some(h) = self.running(job) {
            h.inbox.answer_arrived();
        }
    }

    async fn cancelled(&self, job: JobId) {
        if let Some(h) = self.running(job) {
            h.cancel.cancel();
        }
    }
}

/// Jobs run by other processes (`flower run` in the same home, or a
/// benchmark's store): nothing starts here, and no notice reaches a run.
struct Elsewhere;

#[async_trait::async_trait]
impl Runs for Elsewhere {
    fn admit(&self, _spec: &JobSpec) -> app::Result<()> {
        Err(AppError::precondition("this process runs no jobs: submit with `flower run` or to a service"))
    }

    fn submitted(&self, _job: JobId) {}

    fn notifier(&self, _job: JobId) -> Option<Arc<dyn Notifier>> {
        None
    }
}

/// The application over a store whose jobs run in other processes (`flower ui`).
pub fn reader_app(store: Arc<dyn flower_store::Store>, objects: Arc<dyn object_store::ObjectStore>) -> App {
    let backends = AppBackends {
        store,
        objects,
        providers: Arc::new(Default::default()),
        tool_policy: Arc::new(Default::default()),
        windows: Default::default(),
    };
    App::new(backends, Arc::new(Elsewhere)).with_ids(Ids::Prefix)
}
