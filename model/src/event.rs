//! Job events. Each is a store row with a per-job sequence number, written in
//! the same transaction as the change it reports; the bus only notifies that
//! rows exist, so `Watch` from a cursor never misses one.

use serde::{Deserialize, Serialize};

use crate::ids::{JobId, SessionId, TaskId};
use crate::job::JobState;
use crate::usage::Usage;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    JobState {
        state: JobState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    SessionStarted {
        session: SessionId,
        role: String,
        label: String,
    },
    /// A model call finished (one assistant entry).
    TurnCompleted {
        session: SessionId,
        role: String,
        turn: u32,
        usage: Usage,
        stop_reason: String,
    },
    ToolCalled {
        session: SessionId,
        tool: String,
        tool_use_id: String,
    },
    ToolFinished {
        session: SessionId,
        tool: String,
        tool_use_id: String,
        is_error: bool,
        chars: usize,
    },
    TaskQueued {
        task: TaskId,
        worker: String,
        description: String,
    },
    TaskStarted {
        task: TaskId,
        attempt: u32,
        worker_id: String,
    },
    TaskFinished {
        task: TaskId,
        attempt: u32,
        succeeded: bool,
        usage: Usage,
    },
    /// A retryable provider error; the request is being retried.
    ProviderRetry {
        session: SessionId,
        attempt: u32,
        error: String,
    },
    /// A large tool result was written to the workbench and replaced by a pointer.
    Spill {
        session: SessionId,
        tool: String,
        path: String,
        chars: usize,
    },
    /// A guard refused a call (the result entry carries the structural marker).
    ToolDenied {
        session: SessionId,
        tool: String,
        denial_kind: String,
    },
    /// The main thread's context nears the handoff threshold.
    HandoffWarning {
        session: SessionId,
        context_tokens: u64,
        at: u64,
    },
    /// A new coordinator session continues from a handoff document.
    Handoff {
        from: SessionId,
        to: SessionId,
        generation: u32,
        degraded: bool,
        forced: bool,
        document: String,
    },
    /// A user's message to the running coordinator (`Interrupt`).
    UserMessage {
        text: String,
    },
    /// Two parallel tasks changed the same workspace file; the later one won.
    WorkspaceConflict {
        path: String,
        task: TaskId,
    },
}

impl EventKind {
    /// The kind's name, as stored in its own column.
    pub fn name(&self) -> &'static str {
        match self {
            Self::JobState { .. } => "job_state",
            Self::SessionStarted { .. } => "session_started",
            Self::TurnCompleted { .. } => "turn_completed",
            Self::ToolCalled { .. } => "tool_called",
            Self::ToolFinished { .. } => "tool_finished",
            Self::TaskQueued { .. } => "task_queued",
            Self::TaskStarted { .. } => "task_started",
            Self::TaskFinished { .. } => "task_finished",
            Self::ProviderRetry { .. } => "provider_retry",
            Self::WorkspaceConflict { .. } => "workspace_conflict",
            Self::UserMessage { .. } => "user_message",
            Self::Spill { .. } => "spill",
            Self::HandoffWarning { .. } => "handoff_warning",
            Self::Handoff { .. } => "handoff",
            Self::ToolDenied { .. } => "tool_denied",
        }
    }
}

/// A stored event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub job_id: JobId,
    pub seq: i64,
    pub at: i64,
    #[serde(flatten)]
    pub kind: EventKind,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_match_the_serde_tag() {
        let k = EventKind::TaskQueued { task: TaskId::random(), worker: "w".into(), description: "d".into() };
        let v = serde_json::to_value(&k).unwrap();
        assert_eq!(v["kind"], k.name());
        let k = EventKind::JobState { state: JobState::Running, reason: None };
        assert_eq!(serde_json::to_value(&k).unwrap()["kind"], k.name());
    }
}
