//! The coordinator's `Read`: workbench files (`.flower/…`) and files of the
//! job's current workspace state. The coordinator has no working directory of
//! its own; both are read from object storage.

use async_trait::async_trait;
use flower_agent::tool::read::{number_lines, read_schema};
use flower_agent::tool::{str_field, uint_field};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use flower_store::workbench::{MOUNT, is_user_only};
use flower_store::workspace::Workspace;
use flower_store::{StoreError, Workbench};
use serde_json::Value;

pub struct CoordinatorRead {
    workbench: Workbench,
    workspace: Workspace,
}

impl CoordinatorRead {
    pub fn new(workbench: Workbench, workspace: Workspace) -> Self {
        Self { workbench, workspace }
    }
}

#[async_trait]
impl Tool for CoordinatorRead {
    fn name(&self) -> &str {
        "Read"
    }
    fn description(&self) -> String {
        "Read a workbench file (`.flower/artifacts/…`, `.flower/notes/…`, `.flower/scripts/…`) or a file of the \
         job's workspace (relative path). Lines come numbered; use `offset`/`limit` for long files."
            .into()
    }
    fn input_schema(&self) -> Value {
        read_schema()
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let given = str_field(&input, "file_path")?;
        let offset = uint_field(&input, "offset")?.unwrap_or(1).max(1) as usize;
        let limit = uint_field(&input, "limit")?.map_or(2000, |l| l as usize);
        let path = given.trim_start_matches("./");
        let got = match path.strip_prefix(MOUNT).and_then(|p| p.strip_prefix('/')) {
            Some(rel) if is_user_only(rel) => {
                return Err(ToolError::RespondToModel(format!(
                    "{given}: kept for the user, not for sessions (the answers to your own questions are their results)"
                )));
            }
            Some(rel) => self.workbench.get(rel).await,
            None => self.workspace.read(path).await,
        };
        let bytes = got.map_err(|e| match e {
            StoreError::NotFound(_) => ToolError::RespondToModel(format!("{given}: no such file")),
            other => ToolError::RespondToModel(format!("{given}: {other}")),
        })?;
        if bytes.contains(&0) {
            return Err(ToolError::RespondToModel(format!("{given}: binary file ({} bytes), not shown", bytes.len())));
        }
        Ok(ToolOutput::text(number_lines(&String::from_utf8_lossy(&bytes), offset, limit)))
    }
}
