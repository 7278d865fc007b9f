//! `TodoWrite`: the coordinator's plan, kept in its own transcript (the call's
//! input is the list).

use async_trait::async_trait;
use flower_agent::tool::{args, schema_of};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

/// The arguments of `TodoWrite` (a field's doc comment would be its
/// description in the schema: these have none).
#[derive(Debug, Deserialize, JsonSchema)]
struct TodoArgs {
    todos: Vec<Todo>,
}

// One item of the list (no doc comment: it would be sent as the items'
// description).
#[derive(Debug, Deserialize, JsonSchema)]
struct Todo {
    content: String,
    status: Status,
    #[serde(rename = "activeForm")]
    #[allow(dead_code, reason = "the list lives in the call's input; only the counts are read")]
    active_form: Option<String>,
}

// Where an item stands (no doc comment, as above).
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Status {
    Pending,
    InProgress,
    Completed,
}

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
        schema_of::<TodoArgs>()
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let TodoArgs { todos } = args(input)?;
        let mut counts = [0usize; 3];
        for (i, t) in todos.iter().enumerate() {
            if t.content.trim().is_empty() {
                return Err(ToolError::RespondToModel(format!("todos[{i}].content is missing")));
            }
            let at = match t.status {
                Status::Pending => 0,
                Status::InProgress => 1,
                Status::Completed => 2,
            };
            counts[at] += 1;
        }
        Ok(ToolOutput::text(format!(
            "todo list updated: {} pending, {} in progress, {} completed",
            counts[0], counts[1], counts[2]
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_derived_schema_is_unchanged() {
        assert_eq!(
            schema_of::<TodoArgs>(),
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
        );
    }
}
