//! `Grep`: regex search over files beneath the working directory, with
//! ripgrep's own libraries.

use async_trait::async_trait;
use flower_agent::tool::{str_field, uint_field};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::UTF8;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use serde_json::{Value, json};

use crate::sandbox::Sandbox;
use crate::tools::glob::walk;

const DEFAULT_HEAD: usize = 500;

pub struct GrepTool {
    sandbox: Sandbox,
}

impl GrepTool {
    pub fn new(sandbox: Sandbox) -> Self {
        Self { sandbox }
    }
}

#[async_trait]
impl Tool for GrepTool {
    fn name(&self) -> &str {
        "Grep"
    }
    fn description(&self) -> String {
        "Search file contents with a regular expression (ripgrep syntax) beneath the working directory or `path`. \
         `output_mode`: `files_with_matches` (default), `content` (matching lines with numbers) or `count`. \
         `glob` filters files (`*.py`); `-i` ignores case; `head_limit` caps the lines returned."
            .into()
    }
    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string"},
                "glob": {"type": "string"},
                "output_mode": {"type": "string", "enum": ["files_with_matches", "content", "count"]},
                "-i": {"type": "boolean"},
                "head_limit": {"type": "integer", "minimum": 1}
            },
            "required": ["pattern"]
        })
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let pattern = str_field(&input, "pattern")?.to_string();
        let given = input.get("path").and_then(Value::as_str).unwrap_or(".").to_string();
        let mode = input.get("output_mode").and_then(Value::as_str).unwrap_or("files_with_matches").to_string();
        if !matches!(mode.as_str(), "files_with_matches" | "content" | "count") {
            return Err(ToolError::RespondToModel(format!("unknown output_mode `{mode}`")));
        }
        let head = uint_field(&input, "head_limit")?.map_or(DEFAULT_HEAD, |h| h as usize);
        let caseless = input.get("-i").and_then(Value::as_bool).unwrap_or(false);
        let filter = match input.get("glob").and_then(Value::as_str) {
            Some(g) => Some(
                globset::Glob::new(g)
                    .map_err(|e| ToolError::RespondToModel(format!("bad glob `{g}`: {e}")))?
                    .compile_matcher(),
            ),
            None => None,
        };
        let matcher = RegexMatcherBuilder::new()
            .case_insensitive(caseless)
            .build(&pattern)
            .map_err(|e| ToolError::RespondToModel(format!("bad pattern `{pattern}`: {e}")))?;
        let start = self.sandbox.relative(&given)?;
        let sb = self.sandbox.clone();
        tokio::task::spawn_blocking(move || {
            let files = walk(&sb, &given, &start)?;
            let mut searcher =
                SearcherBuilder::new().binary_detection(BinaryDetection::quit(0)).line_number(true).build();
            let mut lines: Vec<String> = Vec::new();
            for rel in files {
                let name = std::path::Path::new(&rel)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if filter.as_ref().is_some_and(|g| !g.is_match(&rel) && !g.is_match(&name)) {
                    continue;
                }
                let Ok(file) = sb.dir().open(&rel) else { continue };
                let file = file.into_std();
                let mut hits: Vec<(u64, String)> = Vec::new();
                let result = searcher.search_file(
                    &matcher,
                    &file,
                    UTF8(|n, line| {
                        hits.push((n, line.trim_end_matches(['\n', '\r']).to_string()));
                        Ok(true)
                    }),
                );
                if result.is_err() || hits.is_empty() {
                    continue;
                }
                match mode.as_str() {
                    "content" => lines.extend(hits.into_iter().map(|(n, l)| format!("{rel}:{n}:{l}"))),
                    "count" => lines.push(format!("{rel}:{}", hits.len())),
                    _ => lines.push(rel),
                }
                if lines.len() >= head {
                    break;
                }
            }
            if lines.is_empty() {
                return Ok(ToolOutput::text("no matches"));
            }
            let cut = lines.len() > head;
            lines.truncate(head);
            let mut text = lines.join("\n");
            if cut {
                text.push_str(&format!("\n[cut at head_limit={head}]"));
            }
            Ok(ToolOutput::text(text))
        })
        .await
        .map_err(|e| ToolError::fatal(e.to_string()))?
    }
}
