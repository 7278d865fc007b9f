//! `Grep`: regex search over files beneath the working directory, with
//! ripgrep's own libraries.

use async_trait::async_trait;
use flower_agent::tool::{args, schema_of};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::UTF8;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::sandbox::Sandbox;
use crate::tools::glob::walk;

const DEFAULT_HEAD: usize = 500;

/// The arguments of `Grep` (a field's doc comment would be its description
/// in the schema: these have none).
#[derive(Debug, Deserialize, JsonSchema)]
struct GrepArgs {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
    output_mode: Option<OutputMode>,
    #[serde(rename = "-i")]
    caseless: Option<bool>,
    #[schemars(range(min = 1))]
    head_limit: Option<u64>,
}

// What a search returns (`files_with_matches` when not given); no doc
// comment: it would be sent as the field's description.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum OutputMode {
    // The files with a match.
    #[default]
    FilesWithMatches,
    // The matching lines, with their numbers.
    Content,
    // How many lines of each file match.
    Count,
}

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
        schema_of::<GrepArgs>()
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a: GrepArgs = args(input)?;
        let pattern = a.pattern;
        let given = a.path.unwrap_or_else(|| ".".into());
        let mode = a.output_mode.unwrap_or_default();
        let head = a.head_limit.map_or(DEFAULT_HEAD, |h| h as usize);
        let caseless = a.caseless.unwrap_or(false);
        let filter = match a.glob.as_deref() {
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
                match mode {
                    OutputMode::Content => lines.extend(hits.into_iter().map(|(n, l)| format!("{rel}:{n}:{l}"))),
                    OutputMode::Count => lines.push(format!("{rel}:{}", hits.len())),
                    OutputMode::FilesWithMatches => lines.push(rel),
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_derived_schema_is_unchanged() {
        assert_eq!(
            schema_of::<GrepArgs>(),
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
        );
    }
}
