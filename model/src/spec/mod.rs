//! The job spec: what a user submits. YAML, or JSON (a JSON document is read
//! the same way). It mirrors the seed API
//! `coordinator(name, goal, {workers})` / `worker(description, instructions, tools)`.
//!
//! An invalid spec fails before anything runs, with an error naming the field
//! (`workers.counter.tools[2]: unknown tool `Bsh` …`).
//!
//! # Layout
//! - this module: the spec's document (the job, its roles, MCP servers) and
//!   where each role's calls go
//! - `runtime`: `runtime:` options with their defaults (pruning, asking)
//! - `handoff`: the main thread's handoff options and thresholds
//! - `budget`: the job's limits and the prices they are counted in
//! - `workflow`: the steps around the coordinator's run (clarify, judge)
//! - `parse`: reading YAML/JSON into a spec, with errors naming the field
//! - `validate`: the rules serde cannot express, and the bounds of every number

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

mod budget;
mod handoff;
mod parse;
mod runtime;
mod validate;
mod workflow;

pub use budget::{Budget, Price, builtin_price};
pub use handoff::HandoffOptions;
pub use parse::SpecError;
pub use runtime::{AskOptions, EphemeralOptions, PruningOptions, RuntimeOptions, TrimOptions};
pub use workflow::{JudgeOptions, Workflow};

/// Tools a worker may be given.
pub const WORKER_TOOLS: &[&str] = &["Read", "Write", "Edit", "Bash", "Glob", "Grep"];

/// The model used when a spec names none.
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-5";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// A short name for humans (listing, progress).
    pub name: String,
    /// The prompt given to the coordinator.
    pub goal: String,
    /// Which provider answers model calls: `sim` (in-process simulator playing
    /// `scenario`, speaking each role's API), `anthropic` (the Messages API:
    /// `base_url`, else `ANTHROPIC_BASE_URL`, else the public endpoint; key
    /// from `ANTHROPIC_API_KEY`) or `openai` (Chat Completions: `base_url`,
    /// else `OPENAI_BASE_URL`, else the public endpoint; key from
    /// `OPENAI_API_KEY`). A role may name another (`coordinator.provider`,
    /// `workers.NAME.provider`).
    #[serde(default)]
    pub provider: ProviderKind,
    #[serde(default = "default_model")]
    pub model: String,
    /// Endpoint of the job's provider (`anthropic`: any Messages API server,
    /// e.g. `flower sim`; `openai`: any Chat Completions server — vLLM,
    /// llama.cpp's server, Ollama, `flower sim`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Scenario file for `sim`, relative to the spec file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<PathBuf>,
    /// Directory the tasks work on, relative to the spec file (`--workspace` overrides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<PathBuf>,
    pub coordinator: CoordinatorSpec,
    pub workers: BTreeMap<String, WorkerSpec>,
    /// MCP servers whose tools join the workers' surface as
    /// `mcp__<server>__<tool>` (workers are the MCP clients).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp_servers: BTreeMap<String, McpServerSpec>,
    /// What the tools may reach: nothing unless destinations are asked for
    /// here and allowed by the operator.
    #[serde(default, skip_serializing_if = "crate::network::NetworkSpec::is_empty")]
    pub network: crate::network::NetworkSpec,
    #[serde(default)]
    pub runtime: RuntimeOptions,
    /// Steps around the coordinator's run (default: none).
    #[serde(default, skip_serializing_if = "Workflow::is_empty")]
    pub workflow: Workflow,
    /// 1 (most urgent) to 5 (default 3): whose model calls go first when a
    /// provider route's rate limit makes calls wait (`flower submit
    /// --priority` sets it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
}

impl JobSpec {
    /// The job's priority (1 most urgent, 5 least; 3 when unset).
    pub fn priority(&self) -> u8 {
        self.priority.unwrap_or(crate::quota::DEFAULT_PRIORITY)
    }
}

/// An MCP server a job's workers connect to: stdio (`command`) or
/// streamable HTTP (`url`). Credentials never appear in a spec: they are
/// named here and read from the worker's environment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    /// A stdio server: the program and its arguments (`flower` means the
    /// worker's own binary, e.g. `[flower, mcp-fixture]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// A streamable HTTP server's endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Environment of a stdio server, each value taken from the worker's
    /// environment: `{SERVER_VAR: WORKER_VAR}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env_from: BTreeMap<String, String>,
    /// An HTTP server's bearer token, read from this worker environment variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
    /// Tools of this server kept resident (full schema in every request);
    /// the others are deferred: listed by name, loaded on use or by search.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resident: Vec<String>,
}

/// Most tools a role may keep resident (docs/design.md section 6).
pub const MAX_RESIDENT_TOOLS: usize = 40;

/// Longest `goal`, in bytes. The goal is sent whole in the coordinator's
/// first request and again after each handoff: 256 KiB stays well under the
/// provider's request limit and leaves the context window to the work.
pub const MAX_GOAL_BYTES: usize = 256 * 1024;

/// Longest user message an interrupt carries into a running session, in
/// bytes: the goal's bound, for the same reason — it joins the next request
/// whole, which must stay well under the provider's request limit.
pub const MAX_MESSAGE_BYTES: usize = MAX_GOAL_BYTES;

/// Longest `instructions` or `description`, in bytes: each is repeated in
/// every request of its role.
pub const MAX_INSTRUCTIONS_BYTES: usize = 64 * 1024;

/// Longest job `name`, in characters (one line in listings and progress).
pub const MAX_NAME_CHARS: usize = 200;

/// Longest worker or coordinator name, in characters.
pub const MAX_ROLE_NAME_CHARS: usize = 64;

/// Where the prompt-cache breakpoints go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// The breakpoints of docs/design.md section 6: last tool (1 h), last system block (1 h),
    /// previous tail and current tail (5 min).
    #[default]
    Full,
    /// One marker on the current tail only (a naive request builder, for comparison).
    TailOnly,
    /// No markers.
    Off,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    #[default]
    Anthropic,
    Openai,
    Sim,
}

impl ProviderKind {
    /// The provider's name, as a service's provider table knows it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::Openai => "openai",
            Self::Sim => "sim",
        }
    }
}

/// The wire API a role's model calls speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// Anthropic's Messages API: explicit `cache_control` breakpoints.
    Messages,
    /// OpenAI's Chat Completions: automatic prefix caching, no breakpoints.
    ChatCompletions,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Self::Messages => "messages",
            Self::ChatCompletions => "chat_completions",
        }
    }

    /// How the provider caches prompts, in words (reports).
    pub fn cache_rule(self) -> &'static str {
        match self {
            Self::Messages => "explicit breakpoints (cache_control), reads at a breakpoint's prefix",
            Self::ChatCompletions => "automatic prefix cache (from 1,024 tokens, in 128-token steps)",
        }
    }
}

/// Where a role's model calls go: the provider table's entry and the API
/// spoken to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    pub entry: ProviderKind,
    pub api: Api,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorSpec {
    pub name: String,
    /// Appended to flower's own coordinator prompt, never replacing it.
    #[serde(default)]
    pub instructions: String,
    /// The workers this coordinator may delegate to (default: all of `workers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<Vec<String>>,
    /// `anthropic` or `openai` when the coordinator's calls go to another
    /// provider than the job's (default: the job's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderKind>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    /// Shown to the coordinator: when to delegate to this worker.
    pub description: String,
    /// Appended to flower's own worker prompt.
    #[serde(default)]
    pub instructions: String,
    /// Tool names from [`WORKER_TOOLS`].
    #[serde(default)]
    pub tools: Vec<String>,
    /// `inherit` (the job's model) or a model name.
    #[serde(default = "inherit")]
    pub model: String,
    /// `anthropic` or `openai` when this worker's calls go to another
    /// provider than the job's (default: the job's), e.g. a local model
    /// behind a Chat Completions server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderKind>,
}

fn default_model() -> String {
    DEFAULT_MODEL.to_string()
}

fn inherit() -> String {
    "inherit".to_string()
}

impl JobSpec {
    /// The workers the coordinator may delegate to, by name.
    pub fn delegable_workers(&self) -> Vec<(&str, &WorkerSpec)> {
        match &self.coordinator.workers {
            Some(list) => {
                list.iter().filter_map(|n| self.workers.get_key_value(n)).map(|(k, v)| (k.as_str(), v)).collect()
            }
            None => self.workers.iter().map(|(k, v)| (k.as_str(), v)).collect(),
        }
    }

    /// The spill threshold in force (0 when spilling is off).
    pub fn spill_threshold(&self) -> usize {
        if self.runtime.workbench { self.runtime.spill_threshold } else { 0 }
    }

    /// Where the coordinator's calls go (and those of the steps around it:
    /// clarify, goal, judge, handoff, asides).
    pub fn coordinator_route(&self) -> Route {
        self.route(self.coordinator.provider)
    }

    /// Where a worker's calls go.
    pub fn worker_route(&self, worker: &WorkerSpec) -> Route {
        self.route(worker.provider)
    }

    /// A role's route: with `sim`, the simulator answers whichever API the
    /// role speaks; otherwise the role's provider (else the job's) is both
    /// the table entry and the API.
    fn route(&self, role: Option<ProviderKind>) -> Route {
        let kind = role.unwrap_or(self.provider);
        let api = if kind == ProviderKind::Openai { Api::ChatCompletions } else { Api::Messages };
        let entry = if self.provider == ProviderKind::Sim { ProviderKind::Sim } else { kind };
        Route { entry, api }
    }

    /// Every route the job's roles use (the coordinator's first).
    pub fn routes(&self) -> Vec<Route> {
        let mut out = vec![self.coordinator_route()];
        for w in self.workers.values() {
            let r = self.worker_route(w);
            if !out.contains(&r) {
                out.push(r);
            }
        }
        out
    }

    /// The model a worker runs with (`inherit` resolved).
    pub fn worker_model(&self, worker: &WorkerSpec) -> String {
        if worker.model == "inherit" { self.model.clone() } else { worker.model.clone() }
    }
}

#[cfg(test)]
mod tests;
