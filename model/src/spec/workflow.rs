//! `workflow:`: the steps around the coordinator's run.

use serde::{Deserialize, Serialize};

/// Steps around the coordinator's run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workflow {
    /// Before the coordinator starts: a clarifier writes a brief (asking the
    /// user what changes the approach), then a goal with checks.
    pub clarify: bool,
    /// After the coordinator's final answer, a judge session checks the
    /// result against the goal; "not yet" sends the failed checks back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judge: Option<JudgeOptions>,
}

impl Workflow {
    pub fn is_empty(&self) -> bool {
        !self.clarify && self.judge.is_none()
    }
}

/// `workflow.judge`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JudgeOptions {
    /// Verdicts before the job ends failed (default 3; 1 to 10).
    pub rounds: u32,
    /// Whether the judge may run commands to check the result (`Bash`, run
    /// as tool-only tasks by workers in the job's workspace, under the
    /// workers' sandbox); otherwise it reads the workbench and the workspace.
    pub can_run: bool,
}

impl Default for JudgeOptions {
    fn default() -> Self {
        Self { rounds: 3, can_run: false }
    }
}
