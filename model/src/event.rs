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
        /// The model call's wall time, retries included (ms).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        latency_ms: Option<u64>,
        /// From the request to the response's start (`message_start`) (ms).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttft_ms: Option<u64>,
        /// The model the request named (priced by it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
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
    /// A model call waits for its route's rate limits before it is sent
    /// (the first wait of a call: a call may wait again as others draw).
    WaitingForQuota {
        session: SessionId,
        /// API, endpoint, key fingerprint and model.
        route: String,
        wait_ms: u64,
        /// `requests`, `input tokens` or `output tokens`.
        limit: String,
    },
    /// A large tool result was written to the workbench and replaced by a pointer.
    Spill {
        session: SessionId,
        tool: String,
        path: String,
        chars: usize,
    },
    /// A session's tool surface as its first request showed it
    /// (docs/design.md section 6): resident tools with their schema tokens,
    /// the deferred ones with what each withheld schema would cost, the index
    /// and system prompt sizes.
    /// Token figures are local estimates (4 characters a token).
    ToolSurface {
        session: SessionId,
        role: String,
        deferral: bool,
        resident: Vec<ToolCost>,
        deferred: Vec<ToolCost>,
        /// Tokens of the resident schemas.
        tool_tokens: u64,
        /// Tokens of the deferred tools' index (part of the system prompt).
        index_tokens: u64,
        /// Tokens of the whole system prompt (index included).
        system_tokens: u64,
    },
    /// Deferred tools whose schemas were loaded, and why (`direct_call` or
    /// `search_tools`); appended after the cached tool block.
    ToolsLoaded {
        session: SessionId,
        trigger: String,
        tools: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        query: Option<String>,
    },
    /// A `search_tools` call that matched nothing (a recorded miss).
    ToolSearchMiss {
        session: SessionId,
        query: String,
        limit: u32,
    },
    /// A request that deliberately did not extend the previous one (tool
    /// schemas loaded, uneventful output pruned): what it wrote to the cache
    /// again, as the provider reported it. `turn` counts the session's
    /// requests in this run, from 1.
    CacheRewrite {
        session: SessionId,
        turn: u32,
        reason: String,
        cache_write_tokens: u64,
        cache_read_tokens: u64,
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
        /// The model's real context window, when a provider's overflow error
        /// named it (it forced this handoff).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u64>,
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
    /// A session asked the user (the `ask` tool); the job waits for the
    /// answer. `id` is the call's `tool_use_id`: one question per call, found
    /// again by a resumed run.
    QuestionAsked {
        id: String,
        session: SessionId,
        role: String,
        question: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        options: Vec<String>,
    },
    /// A judge's verdict on the coordinator's answer (`workflow.judge`):
    /// `achieved`, `not_yet` (the failed checks go back to the coordinator)
    /// or `unreachable`; `round` counts from 1.
    JudgeVerdict {
        round: u32,
        session: SessionId,
        verdict: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        failed: Vec<String>,
        reason: String,
    },
    /// The answer to question `id`: the user's (`by: user`, with the chosen
    /// option's number from 1 when one was picked), or "no answer" after the
    /// timeout (`by: timeout`) or over the limit (`by: limit`). The first
    /// answer stored for a question is the one that counts.
    QuestionAnswered {
        id: String,
        answer: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        option: Option<u32>,
        by: String,
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
            Self::WaitingForQuota { .. } => "waiting_for_quota",
            Self::WorkspaceConflict { .. } => "workspace_conflict",
            Self::QuestionAsked { .. } => "question_asked",
            Self::QuestionAnswered { .. } => "question_answered",
            Self::JudgeVerdict { .. } => "judge_verdict",
            Self::UserMessage { .. } => "user_message",
            Self::Spill { .. } => "spill",
            Self::HandoffWarning { .. } => "handoff_warning",
            Self::Handoff { .. } => "handoff",
            Self::ToolDenied { .. } => "tool_denied",
            Self::ToolSurface { .. } => "tool_surface",
            Self::ToolsLoaded { .. } => "tools_loaded",
            Self::ToolSearchMiss { .. } => "tool_search_miss",
            Self::CacheRewrite { .. } => "cache_rewrite",
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

/// A tool and the tokens its schema costs (an estimate).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCost {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub category: String,
    pub tokens: u64,
}
