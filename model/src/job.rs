//! Job, task and session records and their state machines.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ids::{JobId, SessionId, TaskId};
use crate::usage::Usage;

/// queued → running → (waiting) → succeeded | failed | cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    /// Running, with a session waiting on a user's answer to its question
    /// (the `ask` tool): no model call and no worker slot is held meanwhile.
    WaitingForUser,
    /// Running, its next model call held back because it would cross its
    /// budget: the user is asked to raise it or stop (no model call and no
    /// worker slot is held meanwhile).
    WaitingForBudget,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::WaitingForUser => "waiting_for_user",
            Self::WaitingForBudget => "waiting_for_budget",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Unknown state names (a store written by a newer version).
#[derive(Debug, thiserror::Error)]
#[error("unknown state `{0}`")]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "waiting_for_user" => Self::WaitingForUser,
            "waiting_for_budget" => Self::WaitingForBudget,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            other => return Err(UnknownState(other.to_string())),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub name: String,
    pub state: JobState,
    /// Why the job is in its state (failure reason, cancel reason, …).
    pub reason: Option<String>,
    /// The spec as submitted (JSON form).
    pub spec: serde_json::Value,
    pub final_answer: Option<String>,
    pub idempotency_key: Option<String>,
    pub usage: Usage,
    pub created_at: i64,
    pub updated_at: i64,
    /// Set on a continuation (`flower continue`): the job it continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues: Option<Lineage>,
    /// The namespace the job belongs to (docs/design.md, section 17).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Who submitted it (a key's id, a token's subject), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
}

fn default_namespace() -> String {
    crate::access::DEFAULT_NAMESPACE.to_string()
}

/// Where a continuation comes from: the finished job it goes on from and the
/// user's new instruction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    pub parent: JobId,
    pub instruction: String,
}

/// The worker name of a tool-only task: the coordinator's own `Bash` call,
/// run by a worker in the job's workspace with no model call. The mandate is
/// the command.
pub const COMMAND_TASK: &str = "__command";

/// A task's life: queued → running (attempt n) → succeeded | failed | cancelled.
/// A task of a namespace with a task limit starts `held` (no message sent,
/// no worker slot taken) and is queued once the limit admits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Held,
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl TaskState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl FromStr for TaskState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "held" => Self::Held,
            "queued" => Self::Queued,
            "running" => Self::Running,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            other => return Err(UnknownState(other.to_string())),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: TaskId,
    pub job_id: JobId,
    /// The coordinator session whose `Agent` call created the task.
    pub parent_session: SessionId,
    pub tool_use_id: String,
    /// The worker spec name.
    pub worker: String,
    /// The task text the coordinator wrote.
    pub mandate: String,
    pub description: String,
    pub state: TaskState,
    /// The attempt currently (or last) claimed; 0 before the first claim.
    pub attempt: u32,
    pub claimed_by: Option<String>,
    /// The worker's final report (the `tool_result` of the `Agent` call).
    pub report: Option<String>,
    pub error: Option<String>,
    pub usage: Usage,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Task {
    /// A new task for the delegation `tool_use_id` of `session` (its id derived from them).
    pub fn queued(
        job_id: JobId,
        parent_session: SessionId,
        tool_use_id: &str,
        worker: &str,
        description: &str,
        mandate: &str,
    ) -> Self {
        let now = crate::now_ms();
        Self {
            id: TaskId::derive(job_id, parent_session, tool_use_id),
            job_id,
            parent_session,
            tool_use_id: tool_use_id.to_string(),
            worker: worker.to_string(),
            mandate: mandate.to_string(),
            description: description.to_string(),
            state: TaskState::Queued,
            attempt: 0,
            claimed_by: None,
            report: None,
            error: None,
            usage: Usage::default(),
            created_at: now,
            updated_at: now,
        }
    }
}

/// How an attempt ended, as the worker reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum TaskOutcome {
    Succeeded { report: String },
    Failed { error: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Coordinator,
    Worker,
    /// Checks the coordinator's result against the goal (`workflow.judge`).
    Judge,
    /// Turns the request into a brief and a goal before the coordinator
    /// starts (`workflow.clarify`).
    Clarifier,
    /// Answers a side question about a job (`flower aside`), read-only.
    Aside,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Coordinator => "coordinator",
            Self::Worker => "worker",
            Self::Judge => "judge",
            Self::Clarifier => "clarifier",
            Self::Aside => "aside",
        }
    }
}

impl FromStr for Role {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "coordinator" => Ok(Self::Coordinator),
            "worker" => Ok(Self::Worker),
            "judge" => Ok(Self::Judge),
            "clarifier" => Ok(Self::Clarifier),
            "aside" => Ok(Self::Aside),
            other => Err(UnknownState(other.to_string())),
        }
    }
}

/// One agent conversation of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub id: SessionId,
    pub job_id: JobId,
    pub role: Role,
    /// The coordinator's name, or the worker spec name.
    pub label: String,
    /// For subagents: the task they serve.
    pub task_id: Option<TaskId>,
    pub created_at: i64,
}
