//! The coordinator's `Read`: workbench files (`.flower/…`) and files of the
//! job's current workspace state. The coordinator has no working directory of
//! its own; both are read from object storage.

use async_trait::async_trait;
use flower_agent::tool::read::{ReadArgs, number_lines};
use flower_agent::tool::{args, schema_of};
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
        schema_of::<ReadArgs>()
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a: ReadArgs = args(input)?;
        let (offset, limit) = (a.first_line(), a.lines());
        let given = a.file_path.as_str();
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
