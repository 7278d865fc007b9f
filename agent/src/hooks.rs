//! Pre- and post-tool hooks: the guards' seam. A pre-tool hook may allow a
//! call, deny it with a reason (recording a structural denial marker), or
//! rewrite its input; a post-tool hook may replace the output. Hooks run the
//! same way for the coordinator and workers; whether a call comes from the main
//! thread is structural ([`HookContext::main_thread`]), never guessed from text.

use std::sync::Arc;

use async_trait::async_trait;

use crate::tool::{ToolContext, ToolOutput};

/// Who is calling.
#[derive(Clone, Debug)]
pub struct HookContext {
    pub tool: ToolContext,
    /// True for the coordinator's main thread, false for every subagent.
    pub main_thread: bool,
}

/// A pre-tool decision.
#[derive(Clone, Debug, PartialEq)]
pub enum PreDecision {
    Allow,
    /// Refuse: the model sees `reason`; the result entry gets `denial_kind = kind`.
    Deny {
        kind: String,
        reason: String,
    },
    /// Run with this input instead.
    Rewrite(serde_json::Value),
}

#[async_trait]
pub trait PreToolHook: Send + Sync + 'static {
    async fn before(&self, tool: &str, input: &serde_json::Value, ctx: &HookContext) -> PreDecision;
    /// Whether [`PreToolHook::before`] may deny or rewrite a call to `tool`
    /// (true unless the hook says otherwise). A call no hook may judge can
    /// have its task row committed with the turn that makes it.
    fn may_judge(&self, _tool: &str) -> bool {
        true
    }
}

#[async_trait]
pub trait PostToolHook: Send + Sync + 'static {
    /// May replace `output` (e.g. spill a large result).
    async fn after(&self, tool: &str, input: &serde_json::Value, output: &mut ToolOutput, ctx: &HookContext);
}

/// Runs before each model call; may return a notice to append (sent as user
/// content in a `<system-reminder>`), never an edit of what was already sent.
#[async_trait]
pub trait TurnHook: Send + Sync + 'static {
    async fn before_turn(&self) -> Option<String>;

    /// Something arrived for the next model call: a turn's tool results
    /// (`workbench_untouched`: each is known to have left the job's
    /// workbench as it was — see [`ToolOutput::workbench_untouched`]) or
    /// the inbox's content (`false`).
    fn arrived(&self, _workbench_untouched: bool) {}
}

/// The hooks of a session, run in order.
#[derive(Clone, Default)]
pub struct Hooks {
    pub pre: Vec<Arc<dyn PreToolHook>>,
    pub post: Vec<Arc<dyn PostToolHook>>,
    pub turn: Vec<Arc<dyn TurnHook>>,
}
