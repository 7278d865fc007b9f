//! `Read`: a file beneath the working directory, with line numbers.

use std::io::Read as _;

use async_trait::async_trait;
use flower_agent::tool::read::{ReadArgs, number_lines};
use flower_agent::tool::{args, schema_of};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use serde_json::Value;

use crate::sandbox::Sandbox;

/// Largest file read whole (bigger ones need offset/limit over a prefix).
const MAX_BYTES: u64 = 16 * 1024 * 1024;

pub struct ReadTool {
    sandbox: Sandbox,
}

impl ReadTool {
    pub fn new(sandbox: Sandbox) -> Self {
        Self { sandbox }
    }
}

#[async_trait]
impl Tool for ReadTool {
    fn name(&self) -> &str {
        "Read"
    }
    fn description(&self) -> String {
        "Read a text file beneath the working directory. Lines come numbered (`cat -n` style). \
         For large files pass `offset` (1-based line) and `limit` (lines, default 2000)."
            .into()
    }
    fn input_schema(&self) -> Value {
        schema_of::<ReadArgs>()
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a: ReadArgs = args(input)?;
        let (offset, limit) = (a.first_line(), a.lines());
        let given = a.file_path;
        let rel = self.sandbox.relative(&given)?;
        let sb = self.sandbox.clone();
        tokio::task::spawn_blocking(move || {
            let mut file = sb.dir().open(&rel).map_err(|e| sb.io_error(&given, e))?;
            let meta = file.metadata().map_err(|e| sb.io_error(&given, e))?;
            if meta.is_dir() {
                return Err(ToolError::RespondToModel(format!("{given}: is a directory (use Glob or Bash `ls`)")));
            }
            let mut bytes = Vec::new();
            (&mut file).take(MAX_BYTES).read_to_end(&mut bytes).map_err(|e| sb.io_error(&given, e))?;
            if bytes.contains(&0) {
                return Err(ToolError::RespondToModel(format!(
                    "{given}: binary file ({} bytes), not shown",
                    meta.len()
                )));
            }
            let text = String::from_utf8_lossy(&bytes);
            Ok(ToolOutput::text(number_lines(&text, offset, limit)))
        })
        .await
        .map_err(|e| ToolError::fatal(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_numbered_and_windowed() {
        assert_eq!(number_lines("a\nb\nc\n", 1, 10), "     1\ta\n     2\tb\n     3\tc\n");
        assert_eq!(number_lines("a\nb\nc\n", 2, 1), "     2\tb\n[1 more lines; read on with offset=3]\n");
        assert_eq!(number_lines("", 1, 10), "[empty file]\n");
    }
}
