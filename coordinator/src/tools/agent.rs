//! `Agent`: delegate a task to a worker. The call becomes a task; the
//! worker's report becomes this call's result. Calls of one turn run in
//! parallel.

use std::sync::Arc;

use async_trait::async_trait;
use flower_agent::tool::{args, schema_of};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use flower_model::{JobSpec, Task, TaskState};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::dispatch::{Delegation, DispatchError, Dispatcher};

/// The arguments of `Agent`.
#[derive(Debug, Deserialize, JsonSchema)]
struct AgentArgs {
    /// The worker to delegate to
    subagent_type: String,
    /// A short (3-5 words) description of the task
    #[schemars(required)]
    description: Option<String>,
    /// The task for the worker
    prompt: String,
}

/// The schema of `Agent`: its arguments', with the job's workers as the
/// values `subagent_type` takes.
fn agent_schema(workers: &[&str]) -> Value {
    let mut schema = schema_of::<AgentArgs>();
    schema["properties"]["subagent_type"]["enum"] = workers.into();
    schema
}

pub struct AgentTool {
    dispatcher: Arc<Dispatcher>,
    /// (name, description) of the workers this coordinator may use.
    workers: Vec<(String, String)>,
    /// Each worker's shape (role, provider, model), when siblings are staggered.
    shapes: std::collections::HashMap<String, String>,
}

impl AgentTool {
    pub fn new(dispatcher: Arc<Dispatcher>, spec: &JobSpec) -> Self {
        let workers =
            spec.delegable_workers().iter().map(|(n, w)| (n.to_string(), w.description.trim().to_string())).collect();
        let shapes = if spec.runtime.fanout_stagger {
            spec.delegable_workers()
                .iter()
                .map(|(n, w)| (n.to_string(), format!("worker/{}/{}", spec.provider.name(), spec.worker_model(w))))
                .collect()
        } else {
            Default::default()
        };
        Self { dispatcher, workers, shapes }
    }
}

#[async_trait]
impl Tool for AgentTool {
    fn name(&self) -> &str {
        "Agent"
    }
    fn description(&self) -> String {
        let list: Vec<String> = self.workers.iter().map(|(n, d)| format!("- {n}: {d}")).collect();
        format!(
            "Delegate a task to a worker (a subagent with its own context and tools). Give the worker's name as \
             `subagent_type`, a 3–5 word `description`, and the task itself as `prompt`: the goal, what counts as done, \
             where long outputs go. The worker's report comes back as the result. Several calls in one turn run in parallel.\n\
             Workers:\n{}",
            list.join("\n")
        )
    }
    fn input_schema(&self) -> Value {
        let names: Vec<&str> = self.workers.iter().map(|(n, _)| n.as_str()).collect();
        agent_schema(&names)
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    fn resumable(&self) -> bool {
        true
    }
    fn row_for_call(&self, input: &Value, ctx: &ToolContext) -> Option<Task> {
        let a = self.checked(input.clone()).ok()?;
        let task = Task::queued(ctx.job_id, ctx.session_id, &ctx.tool_use_id, &a.worker, &a.description, &a.prompt);
        self.dispatcher.row_pending(&task);
        Some(task)
    }
    fn row_committed(&self, task: Task, created: bool) {
        self.dispatcher.row_committed(task, created);
    }
    fn row_staged(&self, task: &Task) {
        // A staggered sibling's message waits for its shape's first child,
        // until that child's stream has begun. In a namespace that limits
        // its tasks (as last read), it waits for the limit to admit it: the
        // store holds the row (a message sent anyway is refused by its claim).
        if !self.dispatcher.holds_tasks()
            && self.shapes.get(&task.worker).is_none_or(|shape| self.dispatcher.shape_released(shape))
        {
            self.dispatcher.row_staged(task);
        }
    }
    async fn call(&self, input: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a = self.checked(input)?;
        let worker = a.worker.as_str();
        let d = Delegation {
            job: ctx.job_id,
            session: ctx.session_id,
            tool_use_id: &ctx.tool_use_id,
            worker,
            description: &a.description,
            mandate: &a.prompt,
            shape: self.shapes.get(worker).cloned(),
        };
        let fatal = |e: DispatchError| ToolError::from(e);
        let Some(ended) = self.dispatcher.delegate(d, &ctx.cancel).await.map_err(fatal)? else {
            return Ok(ToolOutput::error("[cancelled before the worker reported]"));
        };
        let task = ended.task.clone();
        let out = match task.state {
            TaskState::Succeeded => Ok(ToolOutput::text(task.report.unwrap_or_default())),
            TaskState::Cancelled => Ok(ToolOutput::error(format!(
                "task cancelled: {}",
                task.error.unwrap_or_else(|| "no reason given".into())
            ))),
            _ => Ok(ToolOutput::error(format!(
                "worker `{worker}` failed: {}",
                task.error.unwrap_or_else(|| "no reason given".into())
            ))),
        };
        out.map(|out| ended.result(out))
    }
}

impl AgentTool {
    /// The call's worker, prompt and description, or what is wrong with it.
    fn checked(&self, input: Value) -> Result<Checked, ToolError> {
        let AgentArgs { subagent_type: worker, description, prompt } = args(input)?;
        if !self.workers.iter().any(|(n, _)| *n == worker) {
            let names: Vec<&str> = self.workers.iter().map(|(n, _)| n.as_str()).collect();
            return Err(ToolError::RespondToModel(format!(
                "no worker named `{worker}`; this job's workers are: {}",
                names.join(", ")
            )));
        }
        if prompt.trim().is_empty() {
            return Err(ToolError::RespondToModel("`prompt` is empty: say what the worker should do".into()));
        }
        Ok(Checked { worker, prompt, description: description.unwrap_or_default() })
    }
}

/// A delegation as checked: a worker of the job, and a prompt that says something.
struct Checked {
    worker: String,
    prompt: String,
    description: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_derived_schema_is_unchanged() {
        let names = vec!["scribe", "counter"];
        assert_eq!(
            agent_schema(&names),
            json!({
                "type": "object",
                "properties": {
                    "subagent_type": {"type": "string", "enum": names, "description": "The worker to delegate to"},
                    "description": {"type": "string", "description": "A short (3-5 words) description of the task"},
                    "prompt": {"type": "string", "description": "The task for the worker"}
                },
                "required": ["subagent_type", "description", "prompt"]
            })
        );
    }
}
