//! `Glob`: files beneath a folder of the working directory matching a pattern.

use async_trait::async_trait;
use flower_agent::tool::{args, schema_of};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::sandbox::Sandbox;

const MAX_RESULTS: usize = 1000;

/// The arguments of `Glob`.
#[derive(Debug, Deserialize, JsonSchema)]
struct GlobArgs {
    pattern: String,
    /// Folder to search in (default: the working directory)
    path: Option<String>,
}

pub struct GlobTool {
    sandbox: Sandbox,
}

impl GlobTool {
    pub fn new(sandbox: Sandbox) -> Self {
        Self { sandbox }
    }
}

/// Files beneath `start` (relative to the sandbox), never following symlinks,
/// as paths relative to the sandbox root. `.git` folders are skipped.
pub fn walk(sb: &Sandbox, given: &str, start: &std::path::Path) -> Result<Vec<String>, ToolError> {
    // Opening the folder beneath the root first makes cap-std judge the path.
    let meta = sb.dir().metadata(start).map_err(|e| sb.io_error(given, e))?;
    let root = sb.root();
    let base = root.join(start);
    if !meta.is_dir() {
        return Ok(vec![start.display().to_string()]);
    }
    let mut out = Vec::new();
    let walker = ignore::WalkBuilder::new(&base)
        .hidden(false)
        .follow_links(false)
        .require_git(true)
        .filter_entry(|e| e.file_name() != ".git")
        .build();
    for entry in walker.flatten() {
        if entry.file_type().is_some_and(|t| t.is_file())
            && let Ok(rel) = entry.path().strip_prefix(root)
        {
            out.push(rel.display().to_string());
        }
    }
    out.sort();
    Ok(out)
}

#[async_trait]
impl Tool for GlobTool {
    fn name(&self) -> &str {
        "Glob"
    }
    fn description(&self) -> String {
        "Find files by glob pattern (`**/*.rs`, `data/*.csv`) beneath the working directory or beneath `path`. \
         Returns matching paths, sorted."
            .into()
    }
    fn input_schema(&self) -> Value {
        schema_of::<GlobArgs>()
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let GlobArgs { pattern, path } = args(input)?;
        let given = path.unwrap_or_else(|| ".".into());
        let start = self.sandbox.relative(&given)?;
        let glob = globset::GlobBuilder::new(&pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| ToolError::RespondToModel(format!("bad pattern `{pattern}`: {e}")))?
            .compile_matcher();
        let sb = self.sandbox.clone();
        tokio::task::spawn_blocking(move || {
            let files = walk(&sb, &given, &start)?;
            let prefix =
                if start == std::path::Path::new(".") { String::new() } else { format!("{}/", start.display()) };
            let hits: Vec<&String> = files
                .iter()
                .filter(|f| glob.is_match(f.as_str()) || glob.is_match(f.strip_prefix(&prefix).unwrap_or(f)))
                .collect();
            if hits.is_empty() {
                return Ok(ToolOutput::text(format!("no files match `{pattern}`")));
            }
            let mut text = hits.iter().take(MAX_RESULTS).map(|s| s.as_str()).collect::<Vec<_>>().join("\n");
            if hits.len() > MAX_RESULTS {
                text.push_str(&format!("\n[{} more; narrow the pattern]", hits.len() - MAX_RESULTS));
            }
            Ok(ToolOutput::text(text))
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
            schema_of::<GlobArgs>(),
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "path": {"type": "string", "description": "Folder to search in (default: the working directory)"}
                },
                "required": ["pattern"]
            })
        );
    }
}
