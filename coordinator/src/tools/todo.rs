//! `TodoWrite`: the coordinator's plan, kept in its own transcript (the call's
//! input is the list).

use async_trait::async_trait;
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use serde_json::{Value, json};

pub struct TodoTool;

#[async_trait]
impl Tool for TodoTool {
    fn name(&self) -> &str {
        "TodoWrite"
    }
    fn description(&self) -> String {
        "Replace your todo list: each item has `content` and `status` (pending, in_progress, completed). \
         Use it to track the plan across many delegations."
            .into()
    }
    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "content": {"type": "string"},
                            "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                            "activeForm": {"type": "string"}
                        },
                        "required": ["content", "status"]
                    }
                }
            },
            "required": ["todos"]
        })
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let todos = input
            .get("todos")
            .and_then(Value::as_array)
            .ok_or_else(|| ToolError::RespondToModel("`todos` must be a list".into()))?;
        let mut counts = [0usize; 3];
        for (i, t) in todos.iter().enumerate() {
            if t.get("content").and_then(Value::as_str).is_none_or(|c| c.trim().is_empty()) {
                return Err(ToolError::RespondToModel(format!("todos[{i}].content is missing")));
            }
            match t.get("status").and_then(Value::as_str) {
                Some("pending") => counts[0] += 1,
                Some("in_progress") => counts[1] += 1,
                Some("completed") => counts[2] += 1,
                other => {
                    return Err(ToolError::RespondToModel(format!(
                        "todos[{i}].status is {other:?}; use pending, in_progress or completed"
                    )));
                }
            }
        }
        Ok(ToolOutput::text(format!(
            "todo list updated: {} pending, {} in progress, {} completed",
            counts[0], counts[1], counts[2]
        )))
    }
}
