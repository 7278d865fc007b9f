//! The hands-on tools of a worker, each confined to the task's working
//! directory ([`crate::sandbox`]). Names and input shapes follow the tools
//! models already know (`Read`, `Write`, `Edit`, `Bash`, `Glob`, `Grep`).

use std::sync::Arc;
use std::time::Duration;

use flower_agent::{Tool, ToolSet};

use crate::sandbox::Sandbox;

pub mod bash;
pub mod edit;
pub mod glob;
pub mod grep;
pub mod read;
pub mod write;

/// Limits the tools apply.
#[derive(Clone, Debug)]
pub struct ToolLimits {
    pub bash_timeout: Duration,
    pub bash_output_limit: usize,
}

/// The tools named in a worker spec (names validated with the spec).
pub fn toolset(names: &[String], sandbox: &Sandbox, limits: &ToolLimits) -> ToolSet {
    let mut set = ToolSet::new();
    for name in names {
        let tool: Arc<dyn Tool> = match name.as_str() {
            "Read" => Arc::new(read::ReadTool::new(sandbox.clone())),
            "Write" => Arc::new(write::WriteTool::new(sandbox.clone())),
            "Edit" => Arc::new(edit::EditTool::new(sandbox.clone())),
            "Bash" => Arc::new(bash::BashTool::new(sandbox.clone(), limits.bash_timeout, limits.bash_output_limit)),
            "Glob" => Arc::new(glob::GlobTool::new(sandbox.clone())),
            "Grep" => Arc::new(grep::GrepTool::new(sandbox.clone())),
            _ => continue,
        };
        set.add(tool);
    }
    set
}

/// Tools whose calls may change files (the workbench is synced after them).
pub fn may_write(tool: &str) -> bool {
    matches!(tool, "Write" | "Edit" | "Bash" | "NotebookEdit")
}
