//! The coordinator's `Bash`: a command run by a worker in the job's
//! workspace as a tool-only task (no model call). With `delegate_only`, the
//! guard lets only read-only glances through; the verdict is recorded on the
//! result entry either way, so the result can expire later.

use std::sync::Arc;

use async_trait::async_trait;
use flower_agent::glance::is_ephemeral;
use flower_agent::tool::{args, schema_of};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use flower_model::TaskState;
use flower_model::job::COMMAND_TASK;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::dispatch::{Delegation, DispatchError, Dispatcher};

/// The arguments of the coordinator's `Bash` (a field's doc comment would
/// be its description in the schema: these have none).
#[derive(Debug, Deserialize, JsonSchema)]
struct CommandArgs {
    command: String,
    #[allow(dead_code, reason = "asked of the model for its own sake; the command is what runs")]
    description: Option<String>,
}

pub struct CommandTool {
    dispatcher: Arc<Dispatcher>,
    glance_only: bool,
}

impl CommandTool {
    pub fn new(dispatcher: Arc<Dispatcher>, glance_only: bool) -> Self {
        Self { dispatcher, glance_only }
    }
}

#[async_trait]
impl Tool for CommandTool {
    fn name(&self) -> &str {
        "Bash"
    }
    fn description(&self) -> String {
        if self.glance_only {
            "Run a read-only command yourself (a glance: ls, git status, wc -l, head, grep, …) in the job's workspace. \
             Its result may expire later. Anything that writes or takes work must be delegated with Agent."
                .into()
        } else {
            "Run a shell command in the job's workspace.".into()
        }
    }
    fn input_schema(&self) -> Value {
        schema_of::<CommandArgs>()
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    fn resumable(&self) -> bool {
        true
    }
    async fn call(&self, input: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let CommandArgs { command, .. } = args(input)?;
        let d = Delegation {
            job: ctx.job_id,
            session: ctx.session_id,
            tool_use_id: &ctx.tool_use_id,
            worker: COMMAND_TASK,
            description: "command",
            mandate: &command,
            shape: None,
        };
        let fatal = |e: DispatchError| ToolError::from(e);
        let Some(ended) = self.dispatcher.delegate(d, &ctx.cancel).await.map_err(fatal)? else {
            return Ok(ToolOutput::error("[cancelled before the command ran]"));
        };
        let task = &ended.task;
        let mut out = match task.state {
            TaskState::Succeeded => ToolOutput::text(task.report.clone().unwrap_or_default()),
            _ => ToolOutput::error(task.error.clone().unwrap_or_else(|| "the command did not run".into())),
        };
        out.markers.ephemeral = Some(is_ephemeral(&command).allowed);
        Ok(ended.result(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_derived_schema_is_unchanged() {
        assert_eq!(
            schema_of::<CommandArgs>(),
            json!({
                "type": "object",
                "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
                "required": ["command"]
            })
        );
    }
}
