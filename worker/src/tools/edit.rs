//! `Edit`: replace an exact string in a file beneath the working directory.

use async_trait::async_trait;
use flower_agent::tool::{args, schema_of};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::sandbox::Sandbox;
use crate::tools::write::write_beneath;

/// The arguments of `Edit` (a field's doc comment would be its description
/// in the schema: these have none).
#[derive(Debug, Deserialize, JsonSchema)]
struct EditArgs {
    file_path: String,
    old_string: String,
    new_string: String,
    #[schemars(extend("default" = false))]
    replace_all: Option<bool>,
}

pub struct EditTool {
    sandbox: Sandbox,
}

impl EditTool {
    pub fn new(sandbox: Sandbox) -> Self {
        Self { sandbox }
    }
}

/// Which occurrences of `old_string` an edit replaces (its `replace_all`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Occurrences {
    /// The only one: an `old_string` found more than once is refused.
    One,
    /// Every one.
    All,
}

/// The edited text and how many occurrences were replaced, or why the edit
/// cannot be made.
pub fn apply_edit(text: &str, old: &str, new: &str, which: Occurrences) -> Result<(String, usize), String> {
    if old.is_empty() {
        return Err("old_string is empty; use Write to create a file".into());
    }
    if old == new {
        return Err("old_string and new_string are the same; nothing to change".into());
    }
    let n = text.matches(old).count();
    match (n, which) {
        (0, _) => Err("old_string was not found in the file (it must match exactly, whitespace included)".into()),
        (1, _) | (_, Occurrences::All) => Ok((text.replace(old, new), n)),
        (n, Occurrences::One) => Err(format!(
            "old_string occurs {n} times; give more surrounding context to make it unique, or set replace_all"
        )),
    }
}

#[async_trait]
impl Tool for EditTool {
    fn name(&self) -> &str {
        "Edit"
    }
    fn description(&self) -> String {
        "Replace `old_string` with `new_string` in a file beneath the working directory. \
         `old_string` must occur exactly once unless `replace_all` is true."
            .into()
    }
    fn input_schema(&self) -> Value {
        schema_of::<EditArgs>()
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let EditArgs { file_path: given, old_string: old, new_string: new, replace_all } = args(input)?;
        let which = if replace_all == Some(true) { Occurrences::All } else { Occurrences::One };
        let rel = self.sandbox.relative(&given)?;
        let sb = self.sandbox.clone();
        tokio::task::spawn_blocking(move || {
            let text = sb.dir().read_to_string(&rel).map_err(|e| sb.io_error(&given, e))?;
            let (edited, n) =
                apply_edit(&text, &old, &new, which).map_err(|m| ToolError::RespondToModel(format!("{given}: {m}")))?;
            write_beneath(&sb, &given, &rel, &edited)?;
            Ok(ToolOutput::text(format!("edited {given}: {n} replacement(s)")))
        })
        .await
        .map_err(|e| ToolError::fatal(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_derived_schema_is_unchanged() {
        assert_eq!(
            schema_of::<EditArgs>(),
            json!({
                "type": "object",
                "properties": {
                    "file_path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"},
                    "replace_all": {"type": "boolean", "default": false}
                },
                "required": ["file_path", "old_string", "new_string"]
            })
        );
    }

    #[test]
    fn edits_must_be_unique_unless_replace_all() {
        assert_eq!(apply_edit("a b a", "b", "c", Occurrences::One).unwrap(), ("a c a".to_string(), 1));
        assert!(apply_edit("a b a", "a", "c", Occurrences::One).unwrap_err().contains("occurs 2 times"));
        assert_eq!(apply_edit("a b a", "a", "c", Occurrences::All).unwrap(), ("c b c".to_string(), 2));
        assert!(apply_edit("a", "z", "c", Occurrences::One).is_err());
        assert!(apply_edit("a", "", "c", Occurrences::One).is_err());
    }
}
