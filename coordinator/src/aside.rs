//! Side questions (`flower aside`, gRPC `Aside`; docs/design.md section 12):
//! a read-only session answers a question about a job from its recent events
//! and its workbench. It is a session of its own (role `aside`, stored like
//! any other); nothing of it enters the job's main thread, and it changes
//! nothing.

use std::sync::Arc;

use flower_agent::provider::Provider;
use flower_agent::{AgentError, Journal, Outcome};
use flower_model::windows::Windows;
use flower_model::{ContentBlock, EventKind, JobId, JobSpec, Role, SessionId};
use flower_store::{StoreError, Workbench};
use object_store::ObjectStore;
use tokio_util::sync::CancellationToken;

use crate::side::{Side, Wiring};

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

/// Answer `question` about `job` in a session of its own (a window its
/// provider names is recorded in `windows`).
pub async fn aside(
    journal: &Journal,
    objects: Arc<dyn ObjectStore>,
    provider: Arc<dyn Provider>,
    windows: &Windows,
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
    // One pass, keeping the last lines only.
    let mut lines = std::collections::VecDeque::with_capacity(RECENT_EVENTS);
    flower_store::scan_events(store.as_ref(), job, 0, |e| {
        if lines.len() == RECENT_EVENTS {
            lines.pop_front();
        }
        lines.push_back(format!("#{} {} {}\n", e.seq, e.kind.name(), describe(&e.kind)));
    })
    .await?;
    let recent: String = lines.iter().map(String::as_str).collect();
    let index = Workbench::new(objects.clone(), job)
        .render_index(flower_store::workbench::INDEX_ENTRIES)
        .await
        .unwrap_or_default();
    let record = store.get_job(job).await?;
    let state = record.state;
    let claimant = flower_model::quota::Claimant::new(record.namespace, job.to_string(), spec.priority());
    let input = format!(
        "# The question\n{question}\n\n# The job\n`{}` ({state}): {}\n\n# Its last {} events\n{recent}\n{index}",
        spec.name,
        spec.goal.trim(),
        lines.len()
    );
    let side = Side { role: Role::Aside, label: "aside".into(), prompt: ASIDE_PROMPT, max_turns: 10 };
    let wiring = Wiring {
        journal,
        provider,
        objects,
        cancel: CancellationToken::new(),
        windows: Some(windows.clone()),
        claimant,
    };
    let (id, session) = crate::side::open(wiring, spec, job, side, Vec::new()).await?;
    match session.run(Vec::new(), Some(vec![ContentBlock::text(input)])).await {
        Ok(Outcome::Answered { text, .. }) => Ok(Aside { session: id, answer: text }),
        Ok(other) => Err(AsideError::NoAnswer(crate::judge::outcome_name(&other).into())),
        Err(AgentError::Store(e)) => Err(e.into()),
        Err(e) => Err(AsideError::NoAnswer(e.to_string())),
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
