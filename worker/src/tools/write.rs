//! `Write`: create or replace a file beneath the working directory.

use std::io::Write as _;

use async_trait::async_trait;
use flower_agent::tool::{args, schema_of};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::sandbox::Sandbox;

/// The arguments of `Write`.
#[derive(Debug, Deserialize, JsonSchema)]
struct WriteArgs {
    /// Path relative to the working directory
    file_path: String,
    /// The whole new content
    content: String,
}

pub struct WriteTool {
    sandbox: Sandbox,
}

impl WriteTool {
    pub fn new(sandbox: Sandbox) -> Self {
        Self { sandbox }
    }
}

/// Write `content` at `rel` beneath the sandbox, creating parent folders.
pub fn write_beneath(sb: &Sandbox, given: &str, rel: &std::path::Path, content: &str) -> Result<(), ToolError> {
    if let Some(parent) = rel.parent()
        && !parent.as_os_str().is_empty()
    {
        // Open the parent beneath the root first: an existing parent that is a
        // symlink leading outside is refused here, not reported as "exists".
        match sb.dir().open_dir(parent) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                sb.dir().create_dir_all(parent).map_err(|e| sb.io_error(given, e))?
            }
            Err(e) => return Err(sb.io_error(given, e)),
        }
    }
    let mut f = sb.dir().create(rel).map_err(|e| sb.io_error(given, e))?;
    f.write_all(content.as_bytes()).map_err(|e| sb.io_error(given, e))
}

#[async_trait]
impl Tool for WriteTool {
    fn name(&self) -> &str {
        "Write"
    }
    fn description(&self) -> String {
        "Create or overwrite a file beneath the working directory (parent folders are created). \
         Long outputs belong in `.flower/artifacts/`, reusable scripts in `.flower/scripts/`."
            .into()
    }
    fn input_schema(&self) -> Value {
        schema_of::<WriteArgs>()
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let WriteArgs { file_path: given, content } = args(input)?;
        let rel = self.sandbox.relative(&given)?;
        let sb = self.sandbox.clone();
        tokio::task::spawn_blocking(move || {
            write_beneath(&sb, &given, &rel, &content)?;
            Ok(ToolOutput::text(format!("wrote {} bytes to {given}", content.len())))
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
            schema_of::<WriteArgs>(),
            json!({
                "type": "object",
                "properties": {
                    "file_path": {"type": "string", "description": "Path relative to the working directory"},
                    "content": {"type": "string", "description": "The whole new content"}
                },
                "required": ["file_path", "content"]
            })
        );
    }
}
