//! Sessions beside the main thread — the clarifier, the goal step, the
//! judge, an aside: each a stored session of its own role, on the job's
//! model, reading the workbench and the workspace, never the main thread.

use std::sync::Arc;

use flower_agent::provider::{Provider, SystemBlock};
use flower_agent::{AgentSession, Journal, SessionConfig, Tool, ToolSet};
use flower_model::windows::Windows;
use flower_model::{JobId, JobSpec, Role, Session, SessionId, now_ms};
use flower_store::StoreError;
use flower_store::Workbench;
use flower_store::workspace::Workspace;
use object_store::ObjectStore;
use tokio_util::sync::CancellationToken;

use crate::tools::read::CoordinatorRead;

/// Who a side session is.
pub struct Side<'a> {
    pub role: Role,
    pub label: String,
    pub prompt: &'a str,
    pub max_turns: u32,
}

/// What a side session runs with.
pub struct Wiring<'a> {
    pub journal: &'a Journal,
    pub provider: Arc<dyn Provider>,
    pub objects: Arc<dyn ObjectStore>,
    pub cancel: CancellationToken,
    /// Where a window the provider names is recorded (the process's table).
    pub windows: Option<Windows>,
    /// Whose calls the side session's are (the job's).
    pub claimant: flower_model::quota::Claimant,
}

/// Store (and announce) the session, and build it: `Read` over the
/// workbench and the workspace, then `extra` tools; no hooks.
pub async fn open(
    w: Wiring<'_>,
    spec: &JobSpec,
    job: JobId,
    side: Side<'_>,
    extra: Vec<Arc<dyn Tool>>,
) -> Result<(SessionId, AgentSession), StoreError> {
    let id = SessionId::random();
    let written = w
        .journal
        .store()
        .create_session(Session {
            id,
            job_id: job,
            role: side.role,
            label: side.label,
            task_id: None,
            created_at: now_ms(),
        })
        .await?;
    w.journal.announce(&written).await;
    let mut tools = ToolSet::new();
    let workbench = Workbench::new(w.objects.clone(), job);
    tools.add(Arc::new(CoordinatorRead::new(workbench, Workspace::new(w.objects, job))));
    for t in extra {
        tools.add(t);
    }
    let config = SessionConfig {
        job_id: job,
        session_id: id,
        role: side.role,
        main_thread: false,
        model: spec.model.clone(),
        system: vec![SystemBlock::text(side.prompt.to_string())],
        max_turns: side.max_turns,
        max_tokens: spec.runtime.max_output_tokens,
        cache: spec.runtime.prompt_cache,
        prune_uneventful: false,
        claimant: w.claimant,
    };
    let mut session = AgentSession::new(
        config,
        w.provider,
        Arc::new(tools),
        flower_agent::hooks::Hooks::default(),
        w.journal.clone(),
        w.cancel,
    );
    if let Some(windows) = w.windows {
        session = session.with_windows(windows);
    }
    Ok((id, session))
}
