//! What every `Read` shares (the workers' on their task directory, the
//! coordinator's on the workbench and workspace): its arguments (and so its
//! schema) and how lines are numbered and cut.

use schemars::JsonSchema;
use serde::Deserialize;

/// Lines returned when the call sets no `limit`.
pub const DEFAULT_LIMIT: usize = 2000;
/// Longer lines are cut.
pub const MAX_LINE: usize = 2000;

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

/// The arguments of every `Read` (workers' and the coordinator's).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadArgs {
    /// The file to read
    pub file_path: String,
    /// First line to read (1-based)
    #[schemars(range(min = 1))]
    pub offset: Option<u64>,
    /// Number of lines to read
    #[schemars(range(min = 1))]
    pub limit: Option<u64>,
}

impl ReadArgs {
    /// The first line to show (1-based; 0 is read as 1).
    pub fn first_line(&self) -> usize {
        self.offset.unwrap_or(1).max(1) as usize
    }

    /// How many lines to show ([`DEFAULT_LIMIT`] when not given).
    pub fn lines(&self) -> usize {
        self.limit.map_or(DEFAULT_LIMIT, |l| l as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_derived_schema_is_unchanged() {
        assert_eq!(
            crate::tool::schema_of::<ReadArgs>(),
            json!({
                "type": "object",
                "properties": {
                    "file_path": {"type": "string", "description": "The file to read"},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)"},
                    "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to read"}
                },
                "required": ["file_path"]
            })
        );
    }
}
