//! The tool seam: what a tool is, what it returns, and the set a session may use.
//!
//! A tool failure is one of two things: [`ToolError::RespondToModel`] (the model
//! sees it as an error result and the run goes on) or [`ToolError::Fatal`]
//! (the session cannot continue). A fatal error keeps its cause typed
//! ([`FatalCause`]) up to the runner, which must tell a fenced write (the job
//! has a newer owner: hand it over) from a failure.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use flower_model::{JobId, Markers, ResultBlock, Role, SessionId};
use tokio_util::sync::CancellationToken;

use crate::provider::ToolDef;

pub mod args;
pub mod read;

pub use args::{ArgsError, args, parse_args, schema_of};

/// What a tool call may know about where it runs.
#[derive(Clone, Debug)]
pub struct ToolContext {
    pub job_id: JobId,
    pub session_id: SessionId,
    pub role: Role,
    pub tool_use_id: String,
    /// Cancelled when the job is cancelled or the session must stop.
    pub cancel: CancellationToken,
}

/// A tool's result, before hooks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOutput {
    pub content: Vec<ResultBlock>,
    pub is_error: bool,
    /// Markers to store on the result entry (e.g. the `ephemeral` verdict).
    pub markers: Markers,
    /// Text blocks a post-tool hook moved to the workbench: (path, chars).
    pub spills: Vec<(String, usize)>,
    /// Events to record with the result (e.g. a search's loads or miss).
    pub events: Vec<flower_model::EventKind>,
    /// Task ends this result was built on before they were known committed
    /// (a report heard in its worker's notice): the write that stores the
    /// result requires them ([`flower_store::Batch::requires`]).
    pub requires: Vec<flower_store::TaskEnd>,
    /// Known to have left the job's workbench as it was (a delegation whose
    /// worker ran no tool), so the workbench index need not be listed again
    /// for it. `false` (the default): it may have changed it.
    pub workbench_untouched: bool,
}

impl ToolOutput {
    pub fn text(text: impl Into<String>) -> Self {
        Self { content: vec![ResultBlock::Text { text: text.into() }], ..Default::default() }
    }

    pub fn error(text: impl Into<String>) -> Self {
        Self { is_error: true, ..Self::text(text) }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// Shown to the model as an error result; the run goes on.
    #[error("{0}")]
    RespondToModel(String),
    /// The session cannot go on (e.g. the store is gone).
    #[error("fatal tool error: {0}")]
    Fatal(FatalCause),
}

impl ToolError {
    /// A fatal error with no typed cause worth matching.
    pub fn fatal(reason: impl Into<String>) -> Self {
        Self::Fatal(FatalCause::Other(reason.into()))
    }
}

/// Why a tool ended its session, typed so the runner can match it: a
/// `StoreError::Fenced` is a lost lease (docs/design.md section 4), not a
/// failed job.
#[derive(Debug, thiserror::Error)]
pub enum FatalCause {
    /// The store refused or failed a write or read the tool needed.
    #[error(transparent)]
    Store(#[from] flower_store::StoreError),
    /// Anything else the session cannot go on after (the task queue gone, a
    /// blocking task that panicked).
    #[error("{0}")]
    Other(String),
}

#[async_trait]
pub trait Tool: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn description(&self) -> String;
    fn input_schema(&self) -> serde_json::Value;
    /// True when calls may run at the same time as other calls of the same turn
    /// (reads, delegations); false for calls that change local state.
    fn concurrency_safe(&self) -> bool {
        false
    }
    /// True when a call left without a result (the process died mid-turn) may
    /// simply be made again on resume: the call is idempotent by construction
    /// (an `Agent` call finds its task again by the derived id). Other calls
    /// get a neutral "never produced" result instead.
    fn resumable(&self) -> bool {
        false
    }
    /// The task row this call creates, when it can be committed with the
    /// assistant turn that makes the call (docs/design.md section 3): the
    /// turn is durable before any tool acts on it, and its `Agent` calls'
    /// rows go in the same transaction instead of one of their own. `None`
    /// (the default) when the call creates no row or its input is not valid.
    /// The call may then start during that commit; it must wait for
    /// [`Tool::row_committed`] before it relies on the row.
    fn row_for_call(&self, _input: &serde_json::Value, _ctx: &ToolContext) -> Option<flower_model::Task> {
        None
    }
    /// The row [`Tool::row_for_call`] gave, as that commit stored it, and
    /// whether the commit created it (a resumed call finds it there).
    fn row_committed(&self, _task: flower_model::Task, _created: bool) {}
    /// The row [`Tool::row_for_call`] gave is staged in the turn's
    /// transaction (see [`flower_store::Staged`]): a message naming it may
    /// go out before the commit. Called from inside the store's write: it
    /// must not block.
    fn row_staged(&self, _task: &flower_model::Task) {}
    async fn call(&self, input: serde_json::Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError>;
}

/// The tools of one session (its role's admitted set), by name: the
/// resident ones in the order they are sent, and the deferred ones
/// (docs/design.md section 6), callable by name but sent only once loaded.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    order: Vec<String>,
    deferred: Vec<String>,
    categories: BTreeMap<String, String>,
}

impl ToolSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a resident tool (its schema in every request).
    pub fn add(&mut self, tool: Arc<dyn Tool>) {
        let name = tool.name().to_string();
        if self.tools.insert(name.clone(), tool).is_none() {
            self.order.push(name);
        }
    }

    /// Add a deferred tool under an index heading.
    pub fn add_deferred(&mut self, tool: Arc<dyn Tool>, category: &str) {
        let name = tool.name().to_string();
        if self.tools.insert(name.clone(), tool).is_none() {
            self.categories.insert(name.clone(), category.to_string());
            self.deferred.push(name);
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// The resident tools' names, in order.
    pub fn names(&self) -> &[String] {
        &self.order
    }

    /// The deferred tools' names, in order.
    pub fn deferred(&self) -> &[String] {
        &self.deferred
    }

    pub fn is_deferred(&self, name: &str) -> bool {
        self.categories.contains_key(name)
    }

    /// A deferred tool's index heading.
    pub fn category(&self, name: &str) -> Option<&str> {
        self.categories.get(name).map(String::as_str)
    }

    /// Every admitted tool: resident first, then deferred.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.order.iter().chain(&self.deferred).filter_map(|n| self.tools.get(n))
    }

    /// One tool's definition.
    pub fn def(&self, name: &str) -> Option<ToolDef> {
        self.tools.get(name).map(|t| ToolDef {
            name: t.name().to_string(),
            description: t.description(),
            input_schema: t.input_schema(),
        })
    }

    /// Resident definitions in a stable order (the cached prefix depends on it).
    pub fn defs(&self) -> Vec<ToolDef> {
        self.order.iter().filter_map(|n| self.def(n)).collect()
    }

    /// The resident definitions, then the `loaded` deferred ones in load
    /// order: loads are appended after the cached block, never merged in.
    pub fn defs_with(&self, loaded: &[String]) -> Vec<ToolDef> {
        let mut defs = self.defs();
        defs.extend(loaded.iter().filter(|n| self.is_deferred(n)).filter_map(|n| self.def(n)));
        defs
    }
}
