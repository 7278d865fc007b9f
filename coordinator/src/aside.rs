//! Side questions (`flower aside`, gRPC `Aside`; docs/design.md section 12):
//! a read-only session answers a question about a job from its recent events
//! and its workbench. It is a session of its own (role `aside`, stored like
//! any other); nothing of it enters the job's main thread, and it changes
//! nothing.

use std::sync::Arc;

use flower_agent::provider::{Provider, SystemBlock};
use flower_agent::{AgentError, AgentSession, Journal, Outcome, SessionConfig, ToolSet};
use flower_model::{ContentBlock, EventKind, JobId, JobSpec, Role, Session, SessionId, now_ms};
use flower_store::workspace::Workspace;
use flower_store::{StoreError, Workbench};
use object_store::ObjectStore;
use tokio_util::sync::CancellationToken;

use crate::tools::read::CoordinatorRead;

/// Events shown to an aside, the most recent.
pub const RECENT_EVENTS: usize = 60;
pub const MAX_QUESTION_BYTES: usize = 4_000;

pub const ASIDE_PROMPT: &str = "You answer a side question about a flower job from its recent events and its \
workbench (`Read` `.flower/…` paths and workspace files). You change nothing, and nothing you say reaches the \
job's coordinator. Answer briefly, and say what you could not tell from what you see.";

/// What an aside answered, and the session that holds it.
#[derive(Debug)]
pub struct Aside {
    pub session: SessionId,
    pub answer: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AsideError {
    #[error("the question is empty")]
    Empty,
    #[error("the question is over {MAX_QUESTION_BYTES} bytes")]
    TooLong,
    #[error("the aside session ended without an answer ({0})")]
    NoAnswer(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Answer `question` about `job` in a session of its own.
pub async fn aside(
    journal: &Journal,
    objects: Arc<dyn ObjectStore>,
    provider: Arc<dyn Provider>,
    spec: &JobSpec,
    job: JobId,
    question: &str,
) -> Result<Aside, AsideError> {
    let question = question.trim();
    if question.is_empty() {
        return Err(AsideError::Empty);
    }
    if question.len() > MAX_QUESTION_BYTES {
        return Err(AsideError::TooLong);
    }
    let store = journal.store();
    let last = last_seq(store.as_ref(), job).await?;
    let events = store.events(job, (last - RECENT_EVENTS as i64).max(0), RECENT_EVENTS as u32).await?;
    let mut recent = String::new();
    for e in &events {
        recent.push_str(&format!("#{} {} {}\n", e.seq, e.kind.name(), describe(&e.kind)));
    }
    let workbench = Workbench::new(objects.clone(), job);
    let index = workbench.render_index(flower_store::workbench::INDEX_ENTRIES).await.unwrap_or_default();
    let state = store.get_job(job).await?.state;
    let input = format!(
        "# The question\n{question}\n\n# The job\n`{}` ({state}): {}\n\n# Its last {} events\n{recent}\n{index}",
        spec.name,
        spec.goal.trim(),
        events.len()
    );
    let id = SessionId::random();
    let written = store
        .create_session(Session {
            id,
            job_id: job,
            role: Role::Aside,
            label: "aside".into(),
            task_id: None,
            created_at: now_ms(),
        })
        .await?;
    journal.announce(&written).await;
    let mut tools = ToolSet::new();
    tools.add(Arc::new(CoordinatorRead::new(workbench, Workspace::new(objects, job))));
    let config = SessionConfig {
        job_id: job,
        session_id: id,
        role: Role::Aside,
        main_thread: false,
        model: spec.model.clone(),
        system: vec![SystemBlock::text(ASIDE_PROMPT.to_string())],
        max_turns: 10,
        max_tokens: spec.runtime.max_output_tokens.min(4096),
        cache: spec.runtime.prompt_cache,
        prune_uneventful: false,
    };
    let session = AgentSession::new(
        config,
        provider,
        Arc::new(tools),
        flower_agent::hooks::Hooks::default(),
        journal.clone(),
        CancellationToken::new(),
    );
    match session.run(Vec::new(), Some(vec![ContentBlock::text(input)])).await {
        Ok(Outcome::Answered { text, .. }) => Ok(Aside { session: id, answer: text }),
        Ok(other) => Err(AsideError::NoAnswer(crate::judge::outcome_name(&other).into())),
        Err(AgentError::Store(e)) => Err(e.into()),
        Err(e) => Err(AsideError::NoAnswer(e.to_string())),
    }
}

/// The job's last event number (0 without events), a page at a time.
async fn last_seq(store: &dyn flower_store::Store, job: JobId) -> Result<i64, StoreError> {
    let mut cursor = 0;
    loop {
        let page = store.events(job, cursor, 1_000).await?;
        if let Some(e) = page.last() {
            cursor = e.seq;
        }
        if page.len() < 1_000 {
            return Ok(cursor);
        }
    }
}

/// One event in a line: the fields a reader needs, not every id.
fn describe(kind: &EventKind) -> String {
    match kind {
        EventKind::JobState { state, reason } => {
            format!("{state}{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())
        }
        EventKind::TaskQueued { worker, description, .. } => format!("to {worker}: {description}"),
        EventKind::TaskFinished { succeeded, .. } => if *succeeded { "succeeded" } else { "failed" }.into(),
        EventKind::ToolCalled { tool, .. } => tool.clone(),
        EventKind::QuestionAsked { question, .. } => question.clone(),
        EventKind::QuestionAnswered { answer, by, .. } => format!("{answer} ({by})"),
        EventKind::JudgeVerdict { round, verdict, reason, .. } => format!("round {round}: {verdict}: {reason}"),
        EventKind::UserMessage { text } => text.clone(),
        _ => String::new(),
    }
}
