//! `Read`: a file beneath the working directory, with line numbers.

use std::io::Read as _;

use async_trait::async_trait;
use flower_agent::tool::{str_field, uint_field};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::sandbox::Sandbox;

/// Lines returned when the call sets no `limit`.
const DEFAULT_LIMIT: usize = 2000;
/// Longer lines are cut.
const MAX_LINE: usize = 2000;
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

/// `cat -n` style numbering from line `offset` (1-based), `limit` lines.
pub fn number_lines(text: &str, offset: usize, limit: usize) -> String {
    let mut out = String::new();
    let total = text.lines().count();
    for (i, line) in text.lines().enumerate().skip(offset.saturating_sub(1)).take(limit) {
        let line = if line.len() > MAX_LINE {
            let mut end = MAX_LINE;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}… [line cut at {MAX_LINE} chars]", &line[..end])
        } else {
            line.to_string()
        };
        out.push_str(&format!("{:>6}\t{line}\n", i + 1));
    }
    let shown_to = (offset.saturating_sub(1) + limit).min(total);
    if shown_to < total {
        out.push_str(&format!("[{} more lines; read on with offset={}]\n", total - shown_to, shown_to + 1));
    }
    if total == 0 {
        out.push_str("[empty file]\n");
    }
    out
}

/// The input schema of every `Read` (workers' and the coordinator's).
pub fn read_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "file_path": {"type": "string", "description": "The file to read"},
            "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)"},
            "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to read"}
        },
        "required": ["file_path"]
    })
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
        read_schema()
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let given = str_field(&input, "file_path")?.to_string();
        let offset = uint_field(&input, "offset")?.unwrap_or(1).max(1) as usize;
        let limit = uint_field(&input, "limit")?.map_or(DEFAULT_LIMIT, |l| l as usize);
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
        .map_err(|e| ToolError::Fatal(e.to_string()))?
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
