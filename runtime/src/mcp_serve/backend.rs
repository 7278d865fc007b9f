//! Where `flower mcp-serve`'s jobs live: the embedded store (jobs run in
//! this process, as `flower run` runs them) or a coordinator over gRPC (the
//! client is the CLI's, see `cli/src/cmd/mcp_serve.rs`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use flower_agent::Inbox;
use flower_coordinator::tools::ask::{AnswerError, Reply};
use flower_model::{Entry, JobId, JobSpec, JobState, Role};
use flower_store::{StoreError, Workbench};
use flower_worker::isolation::ToolSetup;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::EmbeddedRuntime;

/// Why a backend call failed, by kind (each becomes a tool error the client reads).
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// An unknown job, session or file.
    #[error("{0}")]
    NotFound(String),
    /// A bad value (a spec field, an id, a path), naming it.
    #[error("{0}")]
    Invalid(String),
    /// Not possible in the job's state (it ended; nothing waits for an answer).
    #[error("{0}")]
    Refused(String),
    /// The store or service cannot be reached now; a retry can help.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Other(String),
}

/// A job as the tools show it.
#[derive(Clone, Debug, Serialize)]
pub struct JobView {
    pub job_id: String,
    pub name: String,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_answer: Option<String>,
    pub usage: Value,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

impl JobView {
    pub fn ended(&self) -> bool {
        matches!(self.state.as_str(), "succeeded" | "failed" | "cancelled")
    }
}

/// One job event: its number, kind and payload (the stored shape, as `Watch` sends it).
#[derive(Clone, Debug, Serialize)]
pub struct EventView {
    pub seq: i64,
    pub at_ms: i64,
    pub kind: String,
    pub payload: Value,
}

/// One session of a job.
#[derive(Clone, Debug, Serialize)]
pub struct SessionView {
    pub session_id: String,
    pub role: String,
    pub label: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
}

/// What the tools need of a backend.
#[async_trait]
pub trait Jobs: Send + Sync + 'static {
    /// One line for the server's instructions ("the embedded store at …").
    fn describe(&self) -> String;
    /// Submit a validated spec; the job is queued (embedded: and started here).
    async fn submit(&self, spec: JobSpec) -> Result<JobView, BackendError>;
    async fn job(&self, job: &str) -> Result<JobView, BackendError>;
    /// Events after `after`, waiting up to `wait` for the first one.
    async fn events(&self, job: &str, after: i64, wait: Duration) -> Result<Vec<EventView>, BackendError>;
    async fn sessions(&self, job: &str) -> Result<Vec<SessionView>, BackendError>;
    /// Entries of a session after `after` (its per-session number), at most `limit`.
    async fn entries(&self, job: &str, session: &str, after: i64, limit: u32) -> Result<Vec<Entry>, BackendError>;
    /// The job's pruning policy (a service does not serve specs: the defaults).
    async fn pruning(&self, job: &str) -> flower_model::spec::PruningOptions;
    /// Workbench files (path, size).
    async fn files(&self, job: &str) -> Result<Vec<(String, u64)>, BackendError>;
    /// One workbench file (the path is checked by the caller and again by the store or service).
    async fn file(&self, job: &str, path: &str) -> Result<Vec<u8>, BackendError>;
    async fn cancel(&self, job: &str, reason: &str) -> Result<JobView, BackendError>;
    async fn interrupt(&self, job: &str, message: &str) -> Result<JobView, BackendError>;
    async fn answer(&self, job: &str, question: Option<&str>, reply: Reply) -> Result<JobView, BackendError>;
    /// Wait for what runs in this process (embedded jobs) before it exits.
    async fn drain(&self) {}
}

fn store_error(e: StoreError) -> BackendError {
    match e {
        StoreError::NotFound(what) => BackendError::NotFound(format!("{what} not found")),
        StoreError::Ambiguous(_) | StoreError::BadPath { .. } | StoreError::TooLarge { .. } => {
            BackendError::Invalid(e.to_string())
        }
        StoreError::JobEnded { .. } => BackendError::Refused(e.to_string()),
        StoreError::Backend(_) => BackendError::Unavailable(e.to_string()),
        other => BackendError::Other(other.to_string()),
    }
}

pub fn view(j: &flower_model::Job) -> JobView {
    JobView {
        job_id: j.id.to_string(),
        name: j.name.clone(),
        state: j.state.to_string(),
        reason: j.reason.clone(),
        final_answer: j.final_answer.clone(),
        usage: serde_json::to_value(j.usage).unwrap_or_default(),
        created_at_ms: j.created_at,
        updated_at_ms: j.updated_at,
    }
}

/// A job this process runs: how to stop it and reach its coordinator.
struct Running {
    runtime: Arc<EmbeddedRuntime>,
    cancel: CancellationToken,
    inbox: Inbox,
}

/// The embedded store of a home; submitted jobs run in this process, each
/// on its own [`EmbeddedRuntime`] (its own bus, worker pool and simulator),
/// exactly as `flower run` runs one.
pub struct EmbeddedJobs {
    home: PathBuf,
    runtime: EmbeddedRuntime,
    /// How the jobs' tools start, and the policy their specs are checked against.
    tools: ToolSetup,
    running: Arc<Mutex<HashMap<JobId, Running>>>,
    tasks: tokio::sync::Mutex<tokio::task::JoinSet<()>>,
}

impl EmbeddedJobs {
    /// Open (creating) the home; the jobs' tools start as `tools` says (set
    /// up by the caller, as for `flower run`).
    pub fn open(home: &std::path::Path, tools: ToolSetup) -> Result<Self, crate::embedded::RunError> {
        let runtime = EmbeddedRuntime::open(home)?;
        Ok(Self {
            home: runtime.home().to_path_buf(),
            runtime,
            tools,
            running: Default::default(),
            tasks: Default::default(),
        })
    }

    async fn resolve(&self, job: &str) -> Result<JobId, BackendError> {
        if job.len() > 64 || job.trim().is_empty() || !job.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(BackendError::Invalid(format!(
                "job_id: `{}` is not a job id (a UUID, or a unique prefix of one)",
                super::args::cut(job, 64)
            )));
        }
        self.runtime.store().resolve_job(job).await.map_err(|e| match e {
            StoreError::NotFound(_) => BackendError::NotFound(format!("no job `{job}` in {}", self.home.display())),
            e => store_error(e),
        })
    }

    fn running(&self, job: JobId) -> Option<(Arc<EmbeddedRuntime>, CancellationToken, Inbox)> {
        let map = self.running.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&job).map(|r| (r.runtime.clone(), r.cancel.clone(), r.inbox.clone()))
    }
}

#[async_trait]
impl Jobs for EmbeddedJobs {
    fn describe(&self) -> String {
        format!("the embedded store at {} (jobs run in this process)", self.home.display())
    }

    async fn submit(&self, spec: JobSpec) -> Result<JobView, BackendError> {
        self.tools.policy().check(&spec).map_err(|e| BackendError::Invalid(e.to_string()))?;
        if let Some(scenario) = &spec.scenario
            && let Err(e) = flower_sim::Scenario::load(scenario)
        {
            return Err(BackendError::Invalid(format!("scenario {}: {e}", scenario.display())));
        }
        // A runtime of its own: its bus, workers and simulator serve this job only.
        let runtime = Arc::new(EmbeddedRuntime::open(&self.home).map_err(|e| BackendError::Other(e.to_string()))?);
        let job = runtime.submit(&spec, None).await.map_err(|e| match e {
            crate::embedded::RunError::Store(e) => store_error(e),
            e => BackendError::Other(e.to_string()),
        })?;
        let cancel = CancellationToken::new();
        let inbox = Inbox::default();
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(job, Running { runtime: runtime.clone(), cancel: cancel.clone(), inbox: inbox.clone() });
        let running = self.running.clone();
        let tools = self.tools.clone();
        self.tasks.lock().await.spawn(async move {
            match runtime.run_with_inbox(job, &tools, cancel, inbox).await {
                Ok(s) => tracing::info!(job = %job, state = %s.state, "job ended"),
                Err(e) => tracing::warn!(job = %job, error = %e, "job run stopped"),
            }
            running.lock().unwrap_or_else(|p| p.into_inner()).remove(&job);
        });
        self.job(&job.to_string()).await
    }

    async fn job(&self, job: &str) -> Result<JobView, BackendError> {
        let id = self.resolve(job).await?;
        Ok(view(&self.runtime.store().get_job(id).await.map_err(store_error)?))
    }

    async fn events(&self, job: &str, after: i64, wait: Duration) -> Result<Vec<EventView>, BackendError> {
        let id = self.resolve(job).await?;
        let store = self.runtime.store();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let events = store.events(id, after, 500).await.map_err(store_error)?;
            if !events.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(events
                    .into_iter()
                    .map(|e| EventView {
                        seq: e.seq,
                        at_ms: e.at,
                        kind: e.kind.name().to_string(),
                        payload: serde_json::to_value(&e.kind).unwrap_or_default(),
                    })
                    .collect());
            }
            tokio::time::sleep(Duration::from_millis(200).min(deadline - tokio::time::Instant::now())).await;
        }
    }

    async fn sessions(&self, job: &str) -> Result<Vec<SessionView>, BackendError> {
        let id = self.resolve(job).await?;
        let sessions = self.runtime.store().sessions(id).await.map_err(store_error)?;
        Ok(sessions
            .into_iter()
            .map(|s| SessionView {
                session_id: s.id.to_string(),
                role: s.role.as_str().to_string(),
                label: s.label,
                task_id: s.task_id.map(|t| t.to_string()),
            })
            .collect())
    }

    async fn entries(&self, job: &str, session: &str, after: i64, limit: u32) -> Result<Vec<Entry>, BackendError> {
        let id = self.resolve(job).await?;
        let session: flower_model::SessionId =
            session.parse().map_err(|_| BackendError::Invalid(format!("session: `{session}` is not a session id")))?;
        let store = self.runtime.store();
        if !store.sessions(id).await.map_err(store_error)?.iter().any(|s| s.id == session) {
            return Err(BackendError::NotFound(format!("job {id} has no session {session}")));
        }
        store.entries(session, after, limit).await.map_err(store_error)
    }

    async fn pruning(&self, job: &str) -> flower_model::spec::PruningOptions {
        let Ok(id) = self.resolve(job).await else { return Default::default() };
        match self.runtime.store().get_job(id).await {
            Ok(j) => JobSpec::from_value(j.spec).map(|s| s.runtime.pruning).unwrap_or_default(),
            Err(_) => Default::default(),
        }
    }

    async fn files(&self, job: &str) -> Result<Vec<(String, u64)>, BackendError> {
        let id = self.resolve(job).await?;
        Workbench::new(self.runtime.objects(), id).list().await.map_err(store_error)
    }

    async fn file(&self, job: &str, path: &str) -> Result<Vec<u8>, BackendError> {
        let id = self.resolve(job).await?;
        match Workbench::new(self.runtime.objects(), id).get(path).await {
            Ok(b) => Ok(b.to_vec()),
            Err(StoreError::NotFound(_)) => Err(BackendError::NotFound(format!("job {id} has no file `{path}`"))),
            Err(e) => Err(store_error(e)),
        }
    }

    async fn cancel(&self, job: &str, reason: &str) -> Result<JobView, BackendError> {
        let id = self.resolve(job).await?;
        let here = self.running(id);
        let notifier = here.as_ref().map(|(r, _, _)| r.notifier());
        let store = self.runtime.store();
        let ended = flower_coordinator::actions::cancel(store.as_ref(), notifier.as_deref(), id, reason)
            .await
            .map_err(action_error)?;
        if let Some((_, cancel, _)) = here {
            cancel.cancel();
        }
        Ok(view(&ended))
    }

    async fn interrupt(&self, job: &str, message: &str) -> Result<JobView, BackendError> {
        let id = self.resolve(job).await?;
        let Some((runtime, _, inbox)) = self.running(id) else {
            let j = self.runtime.store().get_job(id).await.map_err(store_error)?;
            if j.state.is_terminal() {
                return Err(BackendError::Refused(format!("job {id} already {}", j.state)));
            }
            return Err(BackendError::Refused(format!(
                "job {id} is not running in this server: an embedded job hears messages only from the process running it"
            )));
        };
        let store = runtime.store();
        let notifier = runtime.notifier();
        let job = flower_coordinator::actions::interrupt(store.as_ref(), Some(notifier.as_ref()), id, message.into())
            .await
            .map_err(action_error)?;
        inbox.push(flower_coordinator::actions::inbox_text(message));
        flower_coordinator::qa_log::message(&Workbench::new(runtime.objects(), id), message).await;
        Ok(view(&job))
    }

    async fn answer(&self, job: &str, question: Option<&str>, reply: Reply) -> Result<JobView, BackendError> {
        let id = self.resolve(job).await?;
        let store = self.runtime.store();
        let written =
            flower_coordinator::tools::ask::answer(store.as_ref(), id, question, reply).await.map_err(|e| match e {
                AnswerError::Store(e) => store_error(e),
                AnswerError::UnknownQuestion(_) => BackendError::NotFound(e.to_string()),
                AnswerError::NoSuchOption { .. } | AnswerError::Empty | AnswerError::Ambiguous { .. } => {
                    BackendError::Invalid(e.to_string())
                }
                other => BackendError::Refused(other.to_string()),
            })?;
        if let Some((runtime, _, inbox)) = self.running(id) {
            flower_coordinator::actions::answered(runtime.notifier().as_ref(), id, &written).await;
            inbox.answer_arrived();
        }
        Ok(view(&store.get_job(id).await.map_err(store_error)?))
    }

    async fn drain(&self) {
        let mut tasks = self.tasks.lock().await;
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

fn action_error(e: flower_coordinator::actions::ActionError) -> BackendError {
    match e {
        flower_coordinator::actions::ActionError::Ended { .. } => BackendError::Refused(e.to_string()),
        flower_coordinator::actions::ActionError::Store(e) => store_error(e),
    }
}

/// The question a job waits on, from its events: the last `question_asked`
/// with no `question_answered` of its id.
pub fn pending_question(events: &[EventView]) -> Option<Value> {
    let mut open: Vec<&EventView> = Vec::new();
    for e in events {
        match e.kind.as_str() {
            "question_asked" => open.push(e),
            "question_answered" => open.retain(|q| q.payload["id"] != e.payload["id"]),
            _ => {}
        }
    }
    open.last().map(|q| {
        serde_json::json!({
            "question_id": q.payload["id"],
            "asked_by": q.payload["role"],
            "question": q.payload["question"],
            "options": q.payload.get("options").cloned().unwrap_or(Value::Array(vec![])),
        })
    })
}

/// The session a transcript shows by default: the coordinator's latest main thread.
pub fn main_session(sessions: &[SessionView]) -> Option<&SessionView> {
    sessions.iter().rev().find(|s| s.role == Role::Coordinator.as_str())
}

/// A session by id, unique id prefix, or label (`counter`, `judge-1`).
pub fn find_session<'a>(sessions: &'a [SessionView], want: &str) -> Result<&'a SessionView, String> {
    let want_lc = want.to_ascii_lowercase();
    let by_id: Vec<_> = sessions.iter().filter(|s| s.session_id.starts_with(&want_lc)).collect();
    let found: Vec<_> = if by_id.is_empty() { sessions.iter().filter(|s| s.label == want).collect() } else { by_id };
    match found.as_slice() {
        [one] => Ok(one),
        [] => Err(format!(
            "no session `{}` (sessions: {})",
            super::args::cut(want, 64),
            sessions
                .iter()
                .map(|s| format!("{} {}", &s.session_id[..8.min(s.session_id.len())], s.label))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        many => Err(format!("`{}` matches {} sessions; give more of the id", super::args::cut(want, 64), many.len())),
    }
}

/// Is `state` the end of a job?
pub fn is_end(state: &str) -> bool {
    state.parse::<JobState>().map(|s| s.is_terminal()).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(seq: i64, kind: &str, payload: Value) -> EventView {
        EventView { seq, at_ms: 0, kind: kind.into(), payload }
    }

    #[test]
    fn the_pending_question_is_the_last_unanswered_one() {
        let events = vec![
            ev(1, "question_asked", json!({"id": "q1", "question": "first?", "role": "coordinator"})),
            ev(2, "question_answered", json!({"id": "q1", "answer": "yes"})),
            ev(3, "question_asked", json!({"id": "q2", "question": "second?", "options": ["a", "b"], "role": "judge"})),
        ];
        let q = pending_question(&events).unwrap();
        assert_eq!(q["question_id"], "q2");
        assert_eq!(q["options"], json!(["a", "b"]));
        assert!(pending_question(&events[..2]).is_none());
    }

    #[test]
    fn sessions_are_found_by_id_prefix_or_label() {
        let s = |id: &str, role: &str, label: &str| SessionView {
            session_id: id.into(),
            role: role.into(),
            label: label.into(),
            task_id: None,
        };
        let all = vec![
            s("aaaa1111", "coordinator", "lead"),
            s("bbbb2222", "worker", "counter"),
            s("bbbc3333", "worker", "sizer"),
        ];
        assert_eq!(main_session(&all).unwrap().label, "lead");
        assert_eq!(find_session(&all, "counter").unwrap().session_id, "bbbb2222");
        assert_eq!(find_session(&all, "AAAA").unwrap().label, "lead");
        assert!(find_session(&all, "bbb").unwrap_err().contains("matches 2"));
        assert!(find_session(&all, "nope").unwrap_err().contains("no session"));
        assert!(is_end("succeeded") && is_end("cancelled") && !is_end("waiting_for_user") && !is_end("garbage"));
    }
}
