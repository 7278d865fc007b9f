//! Where `flower mcp-serve`'s jobs live: an application layer in this
//! process ([`AppJobs`]: the embedded store, its jobs run here) or a
//! coordinator over gRPC (the client is the CLI's, see
//! `cli/src/cmd/mcp_serve.rs`). Both fail with the application layer's
//! [`AppError`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flower_coordinator::app::{AnswerRequest, App, AppError};
use flower_coordinator::tools::ask::Reply;
use flower_model::{Entry, JobSpec, JobState, Role};
use serde::Serialize;
use serde_json::Value;

pub type BackendResult<T> = Result<T, AppError>;

/// A job as the tools show it.
#[derive(Clone, Debug, Serialize)]
pub struct JobView {
    pub job_id: String,
    pub name: String,
    pub state: JobState,
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
        self.state.is_terminal()
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
    async fn submit(&self, spec: JobSpec) -> BackendResult<JobView>;
    async fn job(&self, job: &str) -> BackendResult<JobView>;
    /// Events after `after`, waiting up to `wait` for the first one.
    async fn events(&self, job: &str, after: i64, wait: Duration) -> BackendResult<Vec<EventView>>;
    async fn sessions(&self, job: &str) -> BackendResult<Vec<SessionView>>;
    /// Entries of a session after `after` (its per-session number), at most `limit`.
    async fn entries(&self, job: &str, session: &str, after: i64, limit: u32) -> BackendResult<Vec<Entry>>;
    /// The job's pruning policy (a service does not serve specs: the defaults).
    async fn pruning(&self, job: &str) -> flower_model::spec::PruningOptions;
    /// Workbench files (path, size).
    async fn files(&self, job: &str) -> BackendResult<Vec<(String, u64)>>;
    /// One workbench file (the path is checked by the caller and again by the store or service).
    async fn file(&self, job: &str, path: &str) -> BackendResult<Vec<u8>>;
    async fn cancel(&self, job: &str, reason: &str) -> BackendResult<JobView>;
    async fn interrupt(&self, job: &str, message: &str) -> BackendResult<JobView>;
    async fn answer(&self, job: &str, question: Option<&str>, reply: Reply) -> BackendResult<JobView>;
    /// This backend acting for the caller `bearer` names (`None`: none
    /// shown), from `origin`: `UNAUTHENTICATED` when it is refused.
    async fn acting(self: Arc<Self>, bearer: Option<&str>, origin: &str) -> BackendResult<Arc<dyn Jobs>>;
}

pub fn view(j: &flower_model::Job) -> JobView {
    JobView {
        job_id: j.id.to_string(),
        name: j.name.clone(),
        state: j.state,
        reason: j.reason.clone(),
        final_answer: j.final_answer.clone(),
        usage: serde_json::to_value(j.usage).unwrap_or_default(),
        created_at_ms: j.created_at,
        updated_at_ms: j.updated_at,
    }
}

/// The tools over an application layer in this process.
pub struct AppJobs {
    app: App,
    describe: String,
}

impl AppJobs {
    pub fn new(app: App, describe: String) -> Self {
        Self { app, describe }
    }
}

/// An answer as the application layer takes it.
pub fn answer_request(question: Option<&str>, reply: Reply) -> AnswerRequest {
    let question_id = question.unwrap_or_default().to_string();
    match reply {
        Reply::Text(text) => AnswerRequest { question_id, text, option: 0 },
        Reply::Option(option) => AnswerRequest { question_id, text: String::new(), option },
    }
}

#[async_trait]
impl Jobs for AppJobs {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    async fn acting(self: Arc<Self>, bearer: Option<&str>, origin: &str) -> BackendResult<Arc<dyn Jobs>> {
        let app = self.app.authenticate(bearer, origin).await?;
        Ok(Arc::new(AppJobs { app, describe: self.describe.clone() }))
    }

    async fn submit(&self, spec: JobSpec) -> BackendResult<JobView> {
        Ok(view(&self.app.submit_spec(spec, Vec::new(), String::new()).await?.job))
    }

    async fn job(&self, job: &str) -> BackendResult<JobView> {
        Ok(view(&self.app.job("job_id", job).await?))
    }

    async fn events(&self, job: &str, after: i64, wait: Duration) -> BackendResult<Vec<EventView>> {
        let id = self.app.job_id("job_id", job).await?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let events = self.app.events(id, after, 500).await?;
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

    async fn sessions(&self, job: &str) -> BackendResult<Vec<SessionView>> {
        let id = self.app.job_id("job_id", job).await?;
        Ok(self
            .app
            .sessions(id)
            .await?
            .into_iter()
            .map(|s| SessionView {
                session_id: s.id.to_string(),
                role: s.role.as_str().to_string(),
                label: s.label,
                task_id: s.task_id.map(|t| t.to_string()),
            })
            .collect())
    }

    async fn entries(&self, job: &str, session: &str, after: i64, limit: u32) -> BackendResult<Vec<Entry>> {
        let id = self.app.job_id("job_id", job).await?;
        self.app.entries(id, session, after, limit).await
    }

    async fn pruning(&self, job: &str) -> flower_model::spec::PruningOptions {
        match self.app.job("job_id", job).await {
            Ok(j) => JobSpec::from_value(j.spec).map(|s| s.runtime.pruning).unwrap_or_default(),
            Err(_) => Default::default(),
        }
    }

    async fn files(&self, job: &str) -> BackendResult<Vec<(String, u64)>> {
        let id = self.app.job_id("job_id", job).await?;
        self.app.artifacts(id).await
    }

    async fn file(&self, job: &str, path: &str) -> BackendResult<Vec<u8>> {
        let id = self.app.job_id("job_id", job).await?;
        Ok(self.app.artifact(id, path).await?.to_vec())
    }

    async fn cancel(&self, job: &str, reason: &str) -> BackendResult<JobView> {
        Ok(view(&self.app.cancel(job, reason).await?))
    }

    async fn interrupt(&self, job: &str, message: &str) -> BackendResult<JobView> {
        Ok(view(&self.app.interrupt(job, message).await?))
    }

    async fn answer(&self, job: &str, question: Option<&str>, reply: Reply) -> BackendResult<JobView> {
        Ok(view(&self.app.answer(job, answer_request(question, reply)).await?))
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
