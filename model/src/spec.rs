//! The job spec: what a user submits. YAML, or JSON (a JSON document is read
//! the same way). It mirrors the seed API
//! `coordinator(name, goal, {workers})` / `worker(description, instructions, tools)`.
//!
//! An invalid spec fails before anything runs, with an error naming the field
//! (`workers.counter.tools[2]: unknown tool `Bsh` …`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

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

// Upper bounds of the runtime options (see `RuntimeOptions::validate_limits`).
const MAX_TURNS: u64 = 10_000;
const MAX_CONCURRENCY: u64 = 1_024;
/// The most output tokens a model offers in one call.
const MAX_OUTPUT_TOKENS: u64 = 128_000;
/// The documented maximum of `bash_timeout`.
const MAX_BASH_TIMEOUT: Duration = Duration::from_secs(600);
const MAX_BASH_OUTPUT_LIMIT: ByteSize = ByteSize::mib(64);
const MAX_WORKSPACE_LIMIT: ByteSize = ByteSize::gib(4);
const MAX_SPILL_THRESHOLD: u64 = 1_000_000;
const MAX_KEEP_RECENT: u64 = 100_000;
const MAX_PRUNING_CHARS: u64 = 10_000_000;
const MAX_GENERATIONS: u64 = 64;
const MIN_WINDOW: u64 = 1_000;
const MAX_WINDOW: u64 = 10_000_000;

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

/// Runtime options, each with its default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeOptions {
    /// Model calls the coordinator may make (default 50).
    pub max_turns: u32,
    /// Model calls each worker session may make (default 40).
    pub worker_max_turns: u32,
    /// Tasks run at once in embedded mode (default 4).
    pub concurrency: u32,
    /// `max_tokens` of each model call (default 8192).
    pub max_output_tokens: u32,
    /// Time limit of one `Bash` call unless the call asks for less (default 2m).
    #[serde(with = "humantime_serde")]
    pub bash_timeout: Duration,
    /// Output kept from one `Bash` call, stdout and stderr together (default 256 KiB).
    pub bash_output_limit: ByteSize,
    /// Largest workspace accepted, at submit and as each task leaves it; on
    /// workers also the largest file a tool writes and what it may add to
    /// its task folder (default 64 MiB).
    pub workspace_limit: ByteSize,
    /// Layer 2: the workbench rules, its INDEX.md and index notices to the
    /// coordinator (default true).
    pub workbench: bool,
    /// Layer 3: tool results of at least this many characters are spilled to
    /// the workbench (default 4000; 0 disables; needs `workbench`).
    pub spill_threshold: usize,
    /// The coordinator may run read-only commands itself (default true).
    pub glance: bool,
    /// Layer 1: the coordinator only delegates; hands-on calls on the main
    /// thread are denied (default true).
    pub delegate_only: bool,
    /// Layer 4: how a session's history is pruned when it is resumed.
    pub pruning: PruningOptions,
    /// Limits of the whole job; crossing one ends it with the reason.
    pub budget: Budget,
    /// When the coordinator's main thread nears its window, a new session
    /// continues from a handoff document.
    pub handoff: HandoffOptions,
    /// Two-tier tool surface: a resident set with schemas, every other tool
    /// by name in an index, loaded on use or by `search_tools` (default
    /// true). Off: every admitted tool resident, no `search_tools`.
    pub tool_deferral: bool,
    /// Siblings of one shape (role, provider, model) wait for the first
    /// one's first streamed event before starting, so they read its cache
    /// entry instead of writing their own (default true; at most 8 s).
    pub fanout_stagger: bool,
    /// Prompt-cache breakpoints (default `full`).
    pub prompt_cache: CacheMode,
    /// The human channel: with it, the coordinator has an `ask` tool (a
    /// question with options) and the job waits for the answer
    /// (`waiting_for_user`); without it (the default), no session asks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask: Option<AskOptions>,
}

/// Steps around the coordinator's run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workflow {
    /// Before the coordinator starts: a clarifier writes a brief (asking the
    /// user what changes the approach), then a goal with checks.
    pub clarify: bool,
    /// After the coordinator's final answer, a judge session checks the
    /// result against the goal; "not yet" sends the failed checks back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judge: Option<JudgeOptions>,
}

impl Workflow {
    pub fn is_empty(&self) -> bool {
        !self.clarify && self.judge.is_none()
    }
}

/// `workflow.judge`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JudgeOptions {
    /// Verdicts before the job ends failed (default 3; 1 to 10).
    pub rounds: u32,
    /// Whether the judge may run commands to check the result (`Bash`, run
    /// as tool-only tasks by workers in the job's workspace, under the
    /// workers' sandbox); otherwise it reads the workbench and the workspace.
    pub can_run: bool,
}

impl Default for JudgeOptions {
    fn default() -> Self {
        Self { rounds: 3, can_run: false }
    }
}

/// How a job asks its user (`runtime.ask`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AskOptions {
    /// How long a question waits; then the session goes on with "no answer"
    /// and records its assumption (default 10m; 1s to 7 days).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Questions one job may ask; past it, "no answer" at once (default 5; at most 100).
    pub max_asks: u32,
}

impl Default for AskOptions {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(600), max_asks: 5 }
    }
}

/// Handoff of the coordinator's main thread (flower's formula).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HandoffOptions {
    pub enabled: bool,
    /// The model's context window in tokens (default: from the model name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Room kept free; 0 means max(50,000, 25 % of the window).
    pub headroom: u64,
    /// Sessions a job may use before it fails (default 8).
    pub max_generations: u32,
}

impl Default for HandoffOptions {
    fn default() -> Self {
        Self { enabled: true, window: None, headroom: 0, max_generations: 8 }
    }
}

impl HandoffOptions {
    /// The window: configured, else learnt from a provider's overflow
    /// error (see [`crate::windows`]), else known from the model name (200K
    /// for Claude models).
    pub fn window_for(&self, model: &str) -> u64 {
        self.window.or_else(|| crate::windows::learnt(model)).unwrap_or(if model.contains("[1m]") {
            1_000_000
        } else {
            200_000
        })
    }

    /// (warn at, hand off at): `at = max(10_000, window − room)`, the warning
    /// at `max(1_000, at − 20_000)`.
    pub fn thresholds(&self, model: &str) -> (u64, u64) {
        let window = self.window_for(model);
        let room = if self.headroom > 0 { self.headroom } else { 50_000u64.max(window / 4) };
        let at = 10_000u64.max(window.saturating_sub(room));
        (1_000u64.max(at.saturating_sub(20_000)), at)
    }
}

/// Limits of a job (all off by default).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    /// Tokens across every session: input + cache reads + cache writes + output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Cost in US dollars, priced per model from `prices` (else the built-in table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Time from submission after which the job ends.
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde::option")]
    pub deadline: Option<Duration>,
    /// Prices per million tokens, by model name (overrides the built-in table).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
}

/// US dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    pub cache_write_5m: f64,
    pub cache_write_1h: f64,
    pub cache_read: f64,
}

/// Published list prices (USD per MTok) of the models flower knows by name.
pub fn builtin_price(model: &str) -> Option<Price> {
    let p = |input: f64, output: f64| Price {
        input,
        output,
        cache_write_5m: input * 1.25,
        cache_write_1h: input * 2.0,
        cache_read: input * 0.1,
    };
    let m = model.to_ascii_lowercase();
    if m.contains("opus-4-5") || m.contains("opus-4.5") {
        Some(p(5.0, 25.0))
    } else if m.contains("opus") {
        Some(p(15.0, 75.0))
    } else if m.contains("sonnet") {
        Some(p(3.0, 15.0))
    } else if m.contains("haiku-4-5") || m.contains("haiku-4.5") {
        Some(p(1.0, 5.0))
    } else if m.contains("haiku") {
        Some(p(0.8, 4.0))
    } else {
        openai_price(&m)
    }
}

/// OpenAI's list prices: automatic caching writes at the input price and
/// reads at the model's cached-input price.
fn openai_price(m: &str) -> Option<Price> {
    let p = |input: f64, cached: f64, output: f64| Price {
        input,
        output,
        cache_write_5m: input,
        cache_write_1h: input,
        cache_read: cached,
    };
    // Longest names first: `gpt-4.1-mini` before `gpt-4.1`.
    let table: &[(&str, Price)] = &[
        ("gpt-5-nano", p(0.05, 0.005, 0.4)),
        ("gpt-5-mini", p(0.25, 0.025, 2.0)),
        ("gpt-5", p(1.25, 0.125, 10.0)),
        ("gpt-4.1-nano", p(0.1, 0.025, 0.4)),
        ("gpt-4.1-mini", p(0.4, 0.1, 1.6)),
        ("gpt-4.1", p(2.0, 0.5, 8.0)),
        ("gpt-4o-mini", p(0.15, 0.075, 0.6)),
        ("gpt-4o", p(2.5, 1.25, 10.0)),
    ];
    table.iter().find(|(name, _)| m.contains(name)).map(|(_, price)| *price)
}

impl Budget {
    /// The price of `model`: the spec's table first, then the built-in one.
    pub fn price(&self, model: &str) -> Option<Price> {
        self.prices.get(model).copied().or_else(|| builtin_price(model))
    }
}

impl Price {
    /// The cost of `usage` at this price.
    pub fn cost(&self, u: &crate::usage::Usage) -> f64 {
        let w1h = u.cache_creation.ephemeral_1h_input_tokens as f64;
        let w5m = (u.cache_creation_input_tokens as f64 - w1h).max(0.0);
        (u.input_tokens as f64 * self.input
            + u.output_tokens as f64 * self.output
            + w5m * self.cache_write_5m
            + w1h * self.cache_write_1h
            + u.cache_read_input_tokens as f64 * self.cache_read)
            / 1e6
    }
}

/// Layer 4, applied on the copy of a history fed back on resume (stored rows
/// are never changed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PruningOptions {
    pub ephemeral: EphemeralOptions,
    pub trim: TrimOptions,
    /// Denied calls kept (the most recent ones); older ones are removed with their results (default 1).
    pub keep_denials: usize,
    /// In a running session, replace uneventful old tool output (empty, "no
    /// matches", short timeouts, expired glances) once ≥ 2000 tokens can be
    /// reclaimed — one recorded rewrite (default true).
    pub uneventful: bool,
}

/// Results of calls recorded as ephemeral expire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EphemeralOptions {
    pub enabled: bool,
    /// The most recent ephemeral results kept as they are (default 6).
    pub keep_recent: usize,
    /// Only results up to this many characters expire (default 2000).
    pub max_chars: usize,
}

/// Older large tool results are moved to the workbench behind a pointer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrimOptions {
    /// Off by default.
    pub enabled: bool,
    /// The most recent tool results never trimmed (default 20).
    pub keep_recent: usize,
    /// Results of at least this many characters are trimmed (default 2000).
    pub min_chars: usize,
}

impl Default for PruningOptions {
    fn default() -> Self {
        Self { ephemeral: EphemeralOptions::default(), trim: TrimOptions::default(), keep_denials: 1, uneventful: true }
    }
}

impl Default for EphemeralOptions {
    fn default() -> Self {
        Self { enabled: true, keep_recent: 6, max_chars: 2000 }
    }
}

impl Default for TrimOptions {
    fn default() -> Self {
        Self { enabled: false, keep_recent: 20, min_chars: 2000 }
    }
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            max_turns: 50,
            worker_max_turns: 40,
            concurrency: 4,
            max_output_tokens: 8192,
            bash_timeout: Duration::from_secs(120),
            bash_output_limit: ByteSize::kib(256),
            workspace_limit: ByteSize::mib(64),
            workbench: true,
            spill_threshold: 4000,
            glance: true,
            delegate_only: true,
            pruning: PruningOptions::default(),
            budget: Budget::default(),
            handoff: HandoffOptions::default(),
            tool_deferral: true,
            fanout_stagger: true,
            prompt_cache: CacheMode::Full,
            ask: None,
        }
    }
}

fn default_model() -> String {
    DEFAULT_MODEL.to_string()
}

fn inherit() -> String {
    "inherit".to_string()
}

/// An invalid spec: which field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid job spec: {field}: {message}")]
pub struct SpecError {
    /// Dotted path of the field (`workers.counter.tools[1]`), or `(document)`.
    pub field: String,
    pub message: String,
}

impl SpecError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: shorten(field.into()), message: message.into() }
    }
}

/// A field path is echoed in errors: a path made of a huge key (a 1 MB
/// worker name) is cut, so an error never carries the input back.
fn shorten(mut field: String) -> String {
    const MAX: usize = 200;
    if field.len() > MAX {
        let mut end = MAX;
        while !field.is_char_boundary(end) {
            end -= 1;
        }
        field.truncate(end);
        field.push('…');
    }
    field
}

impl JobSpec {
    /// Parse and validate a spec. Relative paths stay relative: see [`JobSpec::load`].
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let value: serde_json::Value = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| SpecError::new("(document)", format!("not valid JSON: {e}")))?
        } else {
            let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)
                .map_err(|e| SpecError::new("(document)", format!("not valid YAML: {e}")))?;
            // JSON has no NaN or infinity: converted, `.nan` would silently read as "not set".
            refuse_non_finite(&yaml, "")?;
            serde_yaml_ng::from_str(text).map_err(|e| SpecError::new("(document)", format!("not valid YAML: {e}")))?
        };
        Self::from_value(value)
    }

    /// Deserialize a JSON value (as stored with a job) and validate it.
    pub fn from_value(value: serde_json::Value) -> Result<Self, SpecError> {
        let Some(doc) = value.as_object() else {
            return Err(SpecError::new(
                "(document)",
                "a job spec is a mapping with `name`, `goal`, `coordinator` and `workers`",
            ));
        };
        refuse_nul(&value, "")?;
        check_mappings(doc)?;
        let spec: JobSpec = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            // serde reports a missing field at its parent; name the field itself.
            match missing_field(&inner) {
                Some(name) if path == "." => SpecError::new(name, "missing (required)"),
                Some(name) => SpecError::new(format!("{path}.{name}"), "missing (required)"),
                None => SpecError::new(if path == "." { "(document)".into() } else { path }, inner),
            }
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// Read a spec file; relative `scenario`/`workspace` paths are resolved
    /// against the spec's directory.
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SpecError::new("(document)", format!("cannot read {}: {e}", path.display())))?;
        let mut spec = Self::parse(&text)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        if let Some(s) = &spec.scenario {
            let p = dir.join(s);
            if !p.is_file() {
                return Err(SpecError::new("scenario", format!("no such file: {}", p.display())));
            }
            spec.scenario = Some(p);
        }
        if let Some(w) = &spec.workspace {
            let p = dir.join(w);
            if !p.is_dir() {
                return Err(SpecError::new("workspace", format!("no such directory: {}", p.display())));
            }
            spec.workspace = Some(p);
        }
        Ok(spec)
    }

    /// Rules serde cannot express: required text, sizes, cross-references
    /// and the limits of each runtime option. Each error names its field.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.validate_text()?;
        self.validate_workers()?;
        self.validate_coordinator_workers()?;
        self.validate_provider()?;
        self.validate_ask()?;
        self.validate_workflow()?;
        for (name, m) in &self.mcp_servers {
            validate_mcp_server(name, m)?;
        }
        let resident: usize =
            self.mcp_servers.values().map(|m| m.resident.len()).sum::<usize>() + WORKER_TOOLS.len() + 1;
        if self.runtime.tool_deferral && resident > MAX_RESIDENT_TOOLS {
            return Err(SpecError::new(
                "mcp_servers",
                format!(
                    "{resident} resident tools: a role keeps at most {MAX_RESIDENT_TOOLS} (list fewer under `resident`)"
                ),
            ));
        }
        if self.network.egress.len() > crate::network::MAX_EGRESS {
            return Err(SpecError::new(
                "network.egress",
                format!("at most {} destinations", crate::network::MAX_EGRESS),
            ));
        }
        self.runtime.validate_limits()?;
        self.validate_budget()
    }

    /// Names, goal and prompts: present, printable where shown, and bounded.
    fn validate_text(&self) -> Result<(), SpecError> {
        non_empty("name", &self.name)?;
        at_most_chars("name", &self.name, MAX_NAME_CHARS)?;
        printable("name", &self.name)?;
        non_empty("goal", &self.goal)?;
        at_most_bytes("goal", &self.goal, MAX_GOAL_BYTES)?;
        non_empty("model", &self.model)?;
        non_empty("coordinator.name", &self.coordinator.name)?;
        at_most_chars("coordinator.name", &self.coordinator.name, MAX_ROLE_NAME_CHARS)?;
        printable("coordinator.name", &self.coordinator.name)?;
        at_most_bytes("coordinator.instructions", &self.coordinator.instructions, MAX_INSTRUCTIONS_BYTES)
    }

    fn validate_workers(&self) -> Result<(), SpecError> {
        if self.workers.is_empty() {
            return Err(SpecError::new("workers", "at least one worker is required: the coordinator only delegates"));
        }
        for (name, w) in &self.workers {
            let at = format!("workers.{name}");
            if name.trim().is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(SpecError::new(at, "a worker name is one word without spaces"));
            }
            at_most_chars(&at, name, MAX_ROLE_NAME_CHARS)?;
            non_empty(&format!("{at}.description"), &w.description)?;
            at_most_bytes(&format!("{at}.description"), &w.description, MAX_INSTRUCTIONS_BYTES)?;
            at_most_bytes(&format!("{at}.instructions"), &w.instructions, MAX_INSTRUCTIONS_BYTES)?;
            non_empty(&format!("{at}.model"), &w.model)?;
            for (i, tool) in w.tools.iter().enumerate() {
                if !WORKER_TOOLS.contains(&tool.as_str()) {
                    return Err(SpecError::new(
                        format!("{at}.tools[{i}]"),
                        format!("unknown tool `{tool}` (workers may use: {})", WORKER_TOOLS.join(", ")),
                    ));
                }
                if w.tools[..i].contains(tool) {
                    return Err(SpecError::new(format!("{at}.tools[{i}]"), format!("`{tool}` listed twice")));
                }
            }
        }
        Ok(())
    }

    fn validate_coordinator_workers(&self) -> Result<(), SpecError> {
        let Some(list) = &self.coordinator.workers else { return Ok(()) };
        if list.is_empty() {
            return Err(SpecError::new("coordinator.workers", "empty: the coordinator needs a worker to delegate to"));
        }
        for (i, name) in list.iter().enumerate() {
            if !self.workers.contains_key(name) {
                let known: Vec<&str> = self.workers.keys().map(String::as_str).collect();
                return Err(SpecError::new(
                    format!("coordinator.workers[{i}]"),
                    format!("no worker named `{name}` (defined under `workers`: {})", known.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn validate_workflow(&self) -> Result<(), SpecError> {
        let Some(judge) = &self.workflow.judge else { return Ok(()) };
        if !(1..=10).contains(&judge.rounds) {
            return Err(SpecError::new("workflow.judge.rounds", "must be between 1 and 10"));
        }
        Ok(())
    }

    fn validate_ask(&self) -> Result<(), SpecError> {
        let Some(ask) = &self.runtime.ask else { return Ok(()) };
        if !(Duration::from_secs(1)..=Duration::from_secs(7 * 24 * 3600)).contains(&ask.timeout) {
            return Err(SpecError::new("runtime.ask.timeout", "must be between 1s and 7 days"));
        }
        if !(1..=100).contains(&ask.max_asks) {
            return Err(SpecError::new("runtime.ask.max_asks", "must be between 1 and 100"));
        }
        Ok(())
    }

    fn validate_provider(&self) -> Result<(), SpecError> {
        match self.provider {
            ProviderKind::Sim if self.scenario.is_none() => {
                return Err(SpecError::new("scenario", "required with provider `sim` (the file the simulator plays)"));
            }
            ProviderKind::Sim if self.base_url.is_some() => {
                return Err(SpecError::new("base_url", "not used with provider `sim` (the simulator runs in-process)"));
            }
            ProviderKind::Anthropic | ProviderKind::Openai if self.scenario.is_some() => {
                return Err(SpecError::new("scenario", "only used with provider `sim`"));
            }
            _ => {}
        }
        let roles = std::iter::once(("coordinator.provider".to_string(), self.coordinator.provider))
            .chain(self.workers.iter().map(|(n, w)| (format!("workers.{n}.provider"), w.provider)));
        for (field, kind) in roles {
            if kind == Some(ProviderKind::Sim) {
                return Err(SpecError::new(
                    field,
                    "`sim` is a job's provider, not a role's: a role names `anthropic` or `openai` (with provider `sim`, the simulator answers either API)",
                ));
            }
        }
        if let Some(url) = &self.base_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(SpecError::new("base_url", format!("`{url}` is not an http(s) URL")));
        }
        Ok(())
    }

    /// A budget or deadline that could never be met is a mistake, not a limit.
    fn validate_budget(&self) -> Result<(), SpecError> {
        let b = &self.runtime.budget;
        if b.max_tokens == Some(0) {
            return Err(SpecError::new("runtime.budget.max_tokens", "must be more than 0 (leave it out for no limit)"));
        }
        if let Some(usd) = b.max_cost_usd
            && !(usd.is_finite() && usd > 0.0)
        {
            return Err(SpecError::new(
                "runtime.budget.max_cost_usd",
                format!("{usd} is not a budget: a finite amount more than 0 (leave it out for no limit)"),
            ));
        }
        if b.deadline.is_some_and(|d| d.is_zero()) {
            return Err(SpecError::new(
                "runtime.budget.deadline",
                "must be longer than 0s (leave it out for no limit)",
            ));
        }
        for (model, p) in &b.prices {
            let fields = [
                ("input", p.input),
                ("output", p.output),
                ("cache_write_5m", p.cache_write_5m),
                ("cache_write_1h", p.cache_write_1h),
                ("cache_read", p.cache_read),
            ];
            if let Some((field, v)) = fields.into_iter().find(|(_, v)| !(v.is_finite() && *v >= 0.0)) {
                return Err(SpecError::new(
                    format!("runtime.budget.prices.{model}.{field}"),
                    format!("{v} is not a price: a finite amount of 0 or more"),
                ));
            }
        }
        if b.max_cost_usd.is_some() {
            let models = std::iter::once(self.model.clone()).chain(self.workers.values().map(|w| self.worker_model(w)));
            for m in models {
                if b.price(&m).is_none() {
                    return Err(SpecError::new(
                        "runtime.budget.prices",
                        format!("no price for model `{m}`: add it to runtime.budget.prices to use max_cost_usd"),
                    ));
                }
            }
        }
        Ok(())
    }

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

/// One MCP server: a usable name, one transport, credentials by reference only.
fn validate_mcp_server(name: &str, m: &McpServerSpec) -> Result<(), SpecError> {
    let at = format!("mcp_servers.{name}");
    if name.is_empty() || name.len() > 16 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(SpecError::new(
            at,
            "a server name is 1-16 letters, digits or '-' (tools are named mcp__<server>__<tool>, at most 64 characters)",
        ));
    }
    match (m.command.is_empty(), &m.url) {
        (true, None) => return Err(SpecError::new(at, "needs `command` (stdio) or `url` (streamable HTTP)")),
        (false, Some(_)) => {
            return Err(SpecError::new(at, "has both `command` and `url`: choose one transport"));
        }
        (true, Some(url)) if !(url.starts_with("http://") || url.starts_with("https://")) => {
            return Err(SpecError::new(format!("{at}.url"), format!("`{url}` is not an http(s) URL")));
        }
        _ => {}
    }
    if m.url.is_some() && !m.env_from.is_empty() {
        return Err(SpecError::new(format!("{at}.env_from"), "only for stdio servers (use `token_env` over HTTP)"));
    }
    if !m.command.is_empty() && m.token_env.is_some() {
        return Err(SpecError::new(format!("{at}.token_env"), "only for HTTP servers (use `env_from` for stdio)"));
    }
    for (var, from) in m.env_from.iter().chain(m.token_env.as_ref().map(|t| (t, t))) {
        let ok = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok(var) || !ok(from) {
            return Err(SpecError::new(
                format!("{at}.env_from"),
                format!("`{var}: {from}` must name environment variables (secrets never go in a spec)"),
            ));
        }
    }
    Ok(())
}

impl RuntimeOptions {
    /// Upper bounds on every number: past them a value is a typo or would
    /// fail later (an hour-long `Bash` call, a model asked for more output
    /// tokens than any offers, an output buffer the size of the machine).
    fn validate_limits(&self) -> Result<(), SpecError> {
        in_range("runtime.max_turns", self.max_turns.into(), 1, MAX_TURNS)?;
        in_range("runtime.worker_max_turns", self.worker_max_turns.into(), 1, MAX_TURNS)?;
        in_range("runtime.concurrency", self.concurrency.into(), 1, MAX_CONCURRENCY)?;
        in_range("runtime.max_output_tokens", self.max_output_tokens.into(), 1, MAX_OUTPUT_TOKENS)?;
        if self.bash_timeout.is_zero() || self.bash_timeout > MAX_BASH_TIMEOUT {
            return Err(SpecError::new(
                "runtime.bash_timeout",
                format!(
                    "{} is out of range: must be longer than 0s and at most 10m",
                    humantime_serde::re::humantime::format_duration(self.bash_timeout)
                ),
            ));
        }
        in_bytes("runtime.bash_output_limit", self.bash_output_limit, MAX_BASH_OUTPUT_LIMIT)?;
        in_bytes("runtime.workspace_limit", self.workspace_limit, MAX_WORKSPACE_LIMIT)?;
        in_range("runtime.spill_threshold", self.spill_threshold as u64, 0, MAX_SPILL_THRESHOLD)?;
        let p = &self.pruning;
        in_range("runtime.pruning.keep_denials", p.keep_denials as u64, 0, MAX_KEEP_RECENT)?;
        in_range("runtime.pruning.ephemeral.keep_recent", p.ephemeral.keep_recent as u64, 0, MAX_KEEP_RECENT)?;
        in_range("runtime.pruning.ephemeral.max_chars", p.ephemeral.max_chars as u64, 0, MAX_PRUNING_CHARS)?;
        in_range("runtime.pruning.trim.keep_recent", p.trim.keep_recent as u64, 0, MAX_KEEP_RECENT)?;
        in_range("runtime.pruning.trim.min_chars", p.trim.min_chars as u64, 0, MAX_PRUNING_CHARS)?;
        let h = &self.handoff;
        in_range("runtime.handoff.max_generations", h.max_generations.into(), 1, MAX_GENERATIONS)?;
        if let Some(window) = h.window {
            in_range("runtime.handoff.window", window, MIN_WINDOW, MAX_WINDOW)?;
        }
        Ok(())
    }
}

fn in_range(field: &str, value: u64, min: u64, max: u64) -> Result<(), SpecError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(SpecError::new(field, format!("{value} is out of range: must be from {min} to {max}")))
    }
}

fn in_bytes(field: &str, value: ByteSize, max: ByteSize) -> Result<(), SpecError> {
    if value.as_u64() == 0 || value > max {
        Err(SpecError::new(field, format!("{value} is out of range: must be more than 0 B and at most {max}")))
    } else {
        Ok(())
    }
}

fn at_most_chars(field: &str, value: &str, max: usize) -> Result<(), SpecError> {
    let n = value.chars().count();
    if n > max { Err(SpecError::new(field, format!("{n} characters: at most {max}"))) } else { Ok(()) }
}

fn at_most_bytes(field: &str, value: &str, max: usize) -> Result<(), SpecError> {
    if value.len() > max {
        Err(SpecError::new(field, format!("{} bytes: at most {} KiB", value.len(), max / 1024)))
    } else {
        Ok(())
    }
}

/// A name is shown on one line (listings, progress): no control characters.
fn printable(field: &str, value: &str) -> Result<(), SpecError> {
    match value.chars().find(|c| c.is_control()) {
        Some(c) => Err(SpecError::new(field, format!("contains the control character {c:?}"))),
        None => Ok(()),
    }
}

/// `at.key`, or `key` at the top.
fn child(at: &str, key: &str) -> String {
    if at.is_empty() { key.to_string() } else { format!("{at}.{key}") }
}

/// Refuse a NUL byte in any string or key, naming its exact path: text with
/// NUL cannot be stored (Postgres `text` refuses it), and it is never meant.
fn refuse_nul(v: &serde_json::Value, at: &str) -> Result<(), SpecError> {
    let nul = |at: &str| {
        let at = if at.is_empty() { "(document)".to_string() } else { at.replace('\0', "\\0") };
        Err(SpecError::new(at, "contains a NUL byte (\\0), which stored text cannot hold"))
    };
    match v {
        serde_json::Value::String(s) if s.contains('\0') => nul(at),
        serde_json::Value::Array(items) => {
            items.iter().enumerate().try_for_each(|(i, x)| refuse_nul(x, &format!("{at}[{i}]")))
        }
        serde_json::Value::Object(map) => map.iter().try_for_each(|(k, x)| {
            let here = child(at, k);
            if k.contains('\0') { nul(&here) } else { refuse_nul(x, &here) }
        }),
        _ => Ok(()),
    }
}

/// Refuse `.nan` and `.inf` anywhere in a YAML document, naming the field.
fn refuse_non_finite(v: &serde_yaml_ng::Value, at: &str) -> Result<(), SpecError> {
    use serde_yaml_ng::Value;
    match v {
        Value::Number(n) if !n.is_finite() => {
            Err(SpecError::new(if at.is_empty() { "(document)" } else { at }, format!("{n} is not a finite number")))
        }
        Value::Sequence(items) => {
            items.iter().enumerate().try_for_each(|(i, x)| refuse_non_finite(x, &format!("{at}[{i}]")))
        }
        Value::Mapping(map) => map.iter().try_for_each(|(k, x)| {
            let key = match k {
                Value::String(k) => k.clone(),
                other => serde_yaml_ng::to_string(other).unwrap_or_default().trim().to_string(),
            };
            refuse_non_finite(x, &child(at, &key))
        }),
        Value::Tagged(t) => refuse_non_finite(&t.value, at),
        _ => Ok(()),
    }
}

type Mapping = serde_json::Map<String, serde_json::Value>;

/// The value at `field` must be a mapping when present. serde reads a
/// sequence into a struct field by field (`runtime: []` would parse as all
/// defaults), so the shape is checked before deserializing.
fn mapping<'a>(field: &str, v: Option<&'a serde_json::Value>) -> Result<Option<&'a Mapping>, SpecError> {
    use serde_json::Value;
    let found = match v {
        None => return Ok(None),
        Some(Value::Object(m)) => return Ok(Some(m)),
        Some(Value::Null) => "nothing",
        Some(Value::Bool(_)) => "a boolean",
        Some(Value::Number(_)) => "a number",
        Some(Value::String(_)) => "a string",
        Some(Value::Array(_)) => "a sequence",
    };
    Err(SpecError::new(field, format!("must be a mapping (`key: value` entries), not {found}")))
}

/// Every place the spec expects a mapping is one.
fn check_mappings(doc: &Mapping) -> Result<(), SpecError> {
    mapping("coordinator", doc.get("coordinator"))?;
    if let Some(workers) = mapping("workers", doc.get("workers"))? {
        for (name, w) in workers {
            mapping(&child("workers", name), Some(w))?;
        }
    }
    if let Some(servers) = mapping("mcp_servers", doc.get("mcp_servers"))? {
        for (name, m) in servers {
            let at = child("mcp_servers", name);
            if let Some(m) = mapping(&at, Some(m))? {
                mapping(&child(&at, "env_from"), m.get("env_from"))?;
            }
        }
    }
    let Some(r) = mapping("runtime", doc.get("runtime"))? else { return Ok(()) };
    if let Some(p) = mapping("runtime.pruning", r.get("pruning"))? {
        mapping("runtime.pruning.ephemeral", p.get("ephemeral"))?;
        mapping("runtime.pruning.trim", p.get("trim"))?;
    }
    mapping("runtime.handoff", r.get("handoff"))?;
    if let Some(b) = mapping("runtime.budget", r.get("budget"))?
        && let Some(prices) = mapping("runtime.budget.prices", b.get("prices"))?
    {
        for (model, p) in prices {
            mapping(&child("runtime.budget.prices", model), Some(p))?;
        }
    }
    Ok(())
}

fn non_empty(field: &str, value: &str) -> Result<(), SpecError> {
    if value.trim().is_empty() { Err(SpecError::new(field, "must not be empty")) } else { Ok(()) }
}

fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest.split('`').next()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const GOOD: &str = r#"
name: demo
goal: find out how big data/ is
provider: sim
scenario: scenario.yaml
coordinator:
  name: lead
workers:
  counter:
    description: counts files
    tools: [Bash, Read]
"#;

    fn err(text: &str) -> SpecError {
        JobSpec::parse(text).unwrap_err()
    }

    #[test]
    fn a_good_spec_parses_with_defaults() {
        let spec = JobSpec::parse(GOOD).unwrap();
        assert_eq!(spec.model, DEFAULT_MODEL);
        assert_eq!(spec.workers["counter"].model, "inherit");
        assert_eq!(spec.runtime, RuntimeOptions::default());
        assert_eq!(spec.delegable_workers().len(), 1);
    }

    #[test]
    fn json_is_accepted() {
        let v: serde_json::Value = serde_yaml_ng::from_str(GOOD).unwrap();
        let spec = JobSpec::parse(&serde_json::to_string(&v).unwrap()).unwrap();
        assert_eq!(spec, JobSpec::parse(GOOD).unwrap());
    }

    #[test]
    fn errors_name_the_field() {
        let e = err(&GOOD.replace("goal: find out how big data/ is\n", ""));
        assert_eq!((e.field.as_str(), e.message.as_str()), ("goal", "missing (required)"));

        let e = err(&GOOD.replace("tools: [Bash, Read]", "tools: Bash"));
        assert_eq!(e.field, "workers.counter.tools");
        assert!(e.message.contains("expected a sequence"), "{e}");

        let e = err(&GOOD.replace("tools: [Bash, Read]", "tools: [Bash, Bsh]"));
        assert_eq!(e.field, "workers.counter.tools[1]");

        let e = err(&GOOD.replace("name: lead", "name: lead\n  workers: [counter, ghost]"));
        assert_eq!(e.field, "coordinator.workers[1]");
        assert!(e.message.contains("no worker named `ghost`"), "{e}");

        let e = err(&format!("{GOOD}runtime:\n  max_turns: many\n"));
        assert_eq!(e.field, "runtime.max_turns");

        let e = err(&format!("{GOOD}runtime:\n  max_turn: 3\n"));
        assert_eq!(e.field, "runtime.max_turn");
        assert!(e.message.contains("unknown field `max_turn`"), "{e}");

        let e = err(&GOOD.replace("description: counts files", "description: counts files\n    colour: red"));
        assert_eq!(e.field, "workers.counter.colour", "{e}");

        let e = err(&GOOD.replace("description: counts files", "description: [counts, files]"));
        assert_eq!(e.field, "workers.counter.description", "{e}");

        let e = err(&GOOD.replace("scenario: scenario.yaml\n", ""));
        assert_eq!(e.field, "scenario");

        assert_eq!(err("- a\n- b\n").field, "(document)");
        assert_eq!(err("name: [").field, "(document)");
    }

    #[test]
    fn mcp_servers_are_checked_and_secrets_stay_out() {
        let with = |m: &str| format!("{GOOD}mcp_servers:\n{m}");
        let ok = JobSpec::parse(&with("  fx:\n    command: [flower, mcp-fixture]\n    env_from: {TOKEN: MY_TOKEN}\n"))
            .unwrap();
        assert_eq!(ok.mcp_servers["fx"].env_from["TOKEN"], "MY_TOKEN");
        let e = err(&with("  fx:\n    command: [srv]\n    env: {TOKEN: hunter2}\n"));
        assert_eq!(e.field, "mcp_servers.fx.env", "a clear-text environment is refused: {e}");
        let e = err(&with("  fx: {}\n"));
        assert!(e.field == "mcp_servers.fx" && e.message.contains("`command` (stdio) or `url`"), "{e}");
        let e = err(&with("  fx:\n    url: ftp://x\n"));
        assert_eq!(e.field, "mcp_servers.fx.url");
        let e = err(&with("  fx:\n    command: [srv]\n    env_from: {TOKEN: \"hunter2 value\"}\n"));
        assert_eq!(e.field, "mcp_servers.fx.env_from");
        let e = err(&with("  a_very_long_server_name:\n    command: [srv]\n"));
        assert!(e.message.contains("64 characters"), "{e}");
        let resident: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
        let e = err(&with(&format!("  fx:\n    command: [srv]\n    resident: [{}]\n", resident.join(", "))));
        assert!(e.message.contains("at most 40"), "{e}");
    }

    /// GOOD as a JSON value, to edit one field.
    fn good() -> serde_json::Value {
        serde_yaml_ng::from_str(GOOD).unwrap()
    }

    fn err_v(v: serde_json::Value) -> SpecError {
        JobSpec::from_value(v).unwrap_err()
    }

    #[test]
    fn the_judge_is_checked() {
        for (opts, field, says) in [
            ("judge: {rounds: 0}", "workflow.judge.rounds", "1 and 10"),
            ("judge: {rounds: 11}", "workflow.judge.rounds", "1 and 10"),
            ("judge: {can_run: yes please}", "workflow.judge.can_run", "invalid"),
            ("judges: {}", "workflow.judges", "unknown field"),
        ] {
            let e = err(&format!("{GOOD}workflow:\n  {opts}\n"));
            assert_eq!(e.field, field, "{opts}: {e}");
            assert!(e.message.contains(says), "{opts}: {e}");
        }
        let spec = JobSpec::parse(&format!("{GOOD}workflow:\n  judge: {{}}\n")).unwrap();
        assert_eq!(spec.workflow.judge, Some(JudgeOptions { rounds: 3, can_run: false }));
        let spec = JobSpec::parse(&format!("{GOOD}workflow:\n  judge: {{can_run: true}}\n")).unwrap();
        assert_eq!(spec.workflow.judge, Some(JudgeOptions { rounds: 3, can_run: true }));
        assert!(JobSpec::parse(GOOD).unwrap().workflow.is_empty());
    }

    #[test]
    fn runtime_numbers_have_upper_bounds() {
        for (opts, field, limit) in [
            ("max_turns: 4294967295", "runtime.max_turns", "10000"),
            ("worker_max_turns: 10001", "runtime.worker_max_turns", "10000"),
            ("concurrency: 4294967295", "runtime.concurrency", "1024"),
            ("max_output_tokens: 4294967295", "runtime.max_output_tokens", "128000"),
            ("bash_timeout: 10y", "runtime.bash_timeout", "10m"),
            ("bash_timeout: 601s", "runtime.bash_timeout", "10m"),
            ("bash_output_limit: 0 B", "runtime.bash_output_limit", "more than 0 B"),
            ("bash_output_limit: 1 EiB", "runtime.bash_output_limit", "MiB"),
            ("workspace_limit: 0 B", "runtime.workspace_limit", "more than 0 B"),
            ("workspace_limit: 5 GiB", "runtime.workspace_limit", "GiB"),
            ("spill_threshold: 1000001", "runtime.spill_threshold", "1000000"),
            ("pruning: {keep_denials: 100001}", "runtime.pruning.keep_denials", "100000"),
            ("pruning: {ephemeral: {keep_recent: 100001}}", "runtime.pruning.ephemeral.keep_recent", "100000"),
            ("pruning: {ephemeral: {max_chars: 10000001}}", "runtime.pruning.ephemeral.max_chars", "10000000"),
            ("pruning: {trim: {keep_recent: 100001}}", "runtime.pruning.trim.keep_recent", "100000"),
            ("pruning: {trim: {min_chars: 10000001}}", "runtime.pruning.trim.min_chars", "10000000"),
            ("handoff: {max_generations: 0}", "runtime.handoff.max_generations", "1 to 64"),
            ("handoff: {max_generations: 65}", "runtime.handoff.max_generations", "1 to 64"),
            ("handoff: {window: 999}", "runtime.handoff.window", "1000 to 10000000"),
            ("handoff: {window: 10000001}", "runtime.handoff.window", "1000 to 10000000"),
            ("ask: {timeout: 0s}", "runtime.ask.timeout", "1s and 7 days"),
            ("ask: {timeout: 8days}", "runtime.ask.timeout", "1s and 7 days"),
            ("ask: {max_asks: 0}", "runtime.ask.max_asks", "1 and 100"),
            ("ask: {max_asks: 101}", "runtime.ask.max_asks", "1 and 100"),
            ("ask: {timout: 1m}", "runtime.ask.timout", "expected `timeout`"),
        ] {
            let e = err(&format!("{GOOD}runtime:\n  {opts}\n"));
            assert_eq!(e.field, field, "{opts}: {e}");
            assert!(e.message.contains(limit), "{opts}: the message says the limit: {e}");
        }
        let at_the_limits = "runtime:\n  max_turns: 10000\n  worker_max_turns: 10000\n  concurrency: 1024\n  \
            max_output_tokens: 128000\n  bash_timeout: 10m\n  bash_output_limit: 64 MiB\n  workspace_limit: 4 GiB\n  \
            spill_threshold: 1000000\n  handoff: {max_generations: 64, window: 10000000}\n";
        JobSpec::parse(&format!("{GOOD}{at_the_limits}")).unwrap();
    }

    #[test]
    fn names_goal_and_prompts_are_bounded() {
        let mut v = good();
        v["name"] = "n".repeat(1_000_000).into();
        let e = err_v(v);
        assert!(e.field == "name" && e.message.contains("at most 200"), "{e}");
        let mut v = good();
        v["name"] = "two\nlines".into();
        assert!(err_v(v).field == "name", "control characters in a name are refused");
        let mut v = good();
        v["goal"] = "g".repeat(16 << 20).into();
        let e = err_v(v);
        assert!(e.field == "goal" && e.message.contains("at most 256 KiB"), "{e}");
        let mut v = good();
        v["goal"] = "g".repeat(MAX_GOAL_BYTES).into();
        JobSpec::from_value(v).unwrap();
        assert_eq!(MAX_MESSAGE_BYTES, MAX_GOAL_BYTES);

        let mut v = good();
        v["coordinator"]["name"] = "c".repeat(65).into();
        let e = err_v(v);
        assert!(e.field == "coordinator.name" && e.message.contains("at most 64"), "{e}");
        let mut v = good();
        let long = "w".repeat(65);
        v["workers"] = serde_json::json!({ long.clone(): {"description": "d"} });
        let e = err_v(v);
        assert!(e.field == format!("workers.{long}") && e.message.contains("at most 64"), "{e}");

        let big = "i".repeat(64 * 1024 + 1);
        for field in ["coordinator.instructions", "workers.counter.instructions", "workers.counter.description"] {
            let mut v = good();
            let mut at = &mut v;
            for k in field.split('.') {
                at = &mut at[k];
            }
            *at = big.clone().into();
            let e = err_v(v);
            assert!(e.field == field && e.message.contains("at most 64 KiB"), "{field}: {e}");
        }
    }

    #[test]
    fn a_nul_byte_anywhere_is_refused_at_its_exact_path() {
        let mut v = good();
        v["workers"]["counter"]["instructions"] = "a\0b".into();
        assert_eq!(err_v(v).field, "workers.counter.instructions");
        let mut v = good();
        v["coordinator"]["workers"] = serde_json::json!(["counter", "gho\0st"]);
        let e = err_v(v);
        assert!(e.field == "coordinator.workers[1]" && e.message.contains("NUL"), "{e}");
        let mut v = good();
        v["name"] = "demo\0".into();
        assert_eq!(err_v(v).field, "name");
        assert_eq!(err(&GOOD.replace("name: demo", "name: \"de\\0mo\"")).field, "name", "YAML's `\\0` escape");
        let mut v = good();
        v["workers"]["co\0unter"] = serde_json::json!({"description": "d"});
        assert_eq!(err_v(v).field, "workers.co\\0unter");
        let mut v = good();
        v["runtime"] = serde_json::json!({"budget": {"prices": {"m\0": {}}}});
        assert_eq!(err_v(v).field, "runtime.budget.prices.m\\0");
    }

    #[test]
    fn budgets_and_deadlines_must_be_reachable() {
        for (opts, field) in [
            ("max_tokens: 0", "runtime.budget.max_tokens"),
            ("max_cost_usd: 0", "runtime.budget.max_cost_usd"),
            ("max_cost_usd: -1.5", "runtime.budget.max_cost_usd"),
            ("max_cost_usd: .nan", "runtime.budget.max_cost_usd"),
            ("max_cost_usd: .inf", "runtime.budget.max_cost_usd"),
            ("max_cost_usd: -.inf", "runtime.budget.max_cost_usd"),
            ("deadline: 0s", "runtime.budget.deadline"),
        ] {
            let e = err(&format!("{GOOD}runtime:\n  budget:\n    {opts}\n"));
            assert_eq!(e.field, field, "{opts}: {e}");
        }
        // A spec built in code is held to the same rule.
        for usd in [f64::NAN, f64::INFINITY] {
            let mut spec = JobSpec::parse(GOOD).unwrap();
            spec.runtime.budget.max_cost_usd = Some(usd);
            assert_eq!(spec.validate().unwrap_err().field, "runtime.budget.max_cost_usd");
        }
        let price = "{input: -1, output: 1, cache_write_5m: 1, cache_write_1h: 1, cache_read: 1}";
        let e = err(&format!("{GOOD}runtime:\n  budget:\n    prices:\n      m: {price}\n"));
        assert_eq!(e.field, "runtime.budget.prices.m.input");
        JobSpec::parse(&format!("{GOOD}runtime:\n  budget: {{max_tokens: 1, max_cost_usd: 0.01, deadline: 1ms}}\n"))
            .unwrap();
    }

    #[test]
    fn a_tool_listed_twice_is_named() {
        let e = err(&GOOD.replace("tools: [Bash, Read]", "tools: [Bash, Read, Bash]"));
        assert_eq!((e.field.as_str(), e.message.as_str()), ("workers.counter.tools[2]", "`Bash` listed twice"));
    }

    #[test]
    fn a_sequence_where_a_mapping_belongs_is_refused() {
        for (path, field) in [
            (&["runtime"][..], "runtime"),
            (&["coordinator"], "coordinator"),
            (&["workers"], "workers"),
            (&["workers", "counter"], "workers.counter"),
            (&["mcp_servers"], "mcp_servers"),
            (&["mcp_servers", "fx"], "mcp_servers.fx"),
            (&["mcp_servers", "fx", "env_from"], "mcp_servers.fx.env_from"),
            (&["runtime", "pruning"], "runtime.pruning"),
            (&["runtime", "pruning", "ephemeral"], "runtime.pruning.ephemeral"),
            (&["runtime", "pruning", "trim"], "runtime.pruning.trim"),
            (&["runtime", "handoff"], "runtime.handoff"),
            (&["runtime", "budget"], "runtime.budget"),
            (&["runtime", "budget", "prices"], "runtime.budget.prices"),
            (&["runtime", "budget", "prices", "m"], "runtime.budget.prices.m"),
        ] {
            let mut v = good();
            v["mcp_servers"] = serde_json::json!({"fx": {"command": ["srv"]}});
            let mut at = &mut v;
            for k in path {
                if at.get(*k).is_none() {
                    at[*k] = serde_json::json!({});
                }
                at = &mut at[*k];
            }
            *at = serde_json::json!([]);
            let e = err_v(v);
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains("must be a mapping") && e.message.contains("a sequence"), "{e}");
        }
        let e = err(&format!("{GOOD}runtime: []\n"));
        assert_eq!(e.field, "runtime");
    }

    #[test]
    fn a_huge_key_is_not_echoed_in_the_field() {
        // (YAML caps a plain key at 1024 characters; JSON has no such cap.)
        let mut v: serde_json::Value = serde_yaml_ng::from_str(GOOD).unwrap();
        let worker = v["workers"]["counter"].take();
        v["workers"] = serde_json::json!({ "w".repeat(1 << 20) + " x": worker });
        let e = err(&v.to_string());
        assert!(e.field.starts_with("workers.www") && e.field.len() < 300, "{}", e.field.len());
    }

    #[test]
    fn durations_and_sizes_are_typed() {
        let spec =
            JobSpec::parse(&format!("{GOOD}runtime:\n  bash_timeout: 5s\n  bash_output_limit: 1 MiB\n")).unwrap();
        assert_eq!(spec.runtime.bash_timeout, Duration::from_secs(5));
        assert_eq!(spec.runtime.bash_output_limit, ByteSize::mib(1));
        let e = err(&format!("{GOOD}runtime:\n  bash_timeout: 0s\n"));
        assert_eq!(e.field, "runtime.bash_timeout");
    }

    #[test]
    fn each_role_routes_to_its_provider_and_api() {
        let two = GOOD.replace("    tools: [Bash, Read]\n", "    tools: [Bash, Read]\n    provider: openai\n");
        let spec = JobSpec::parse(&two).unwrap();
        let w = &spec.workers["counter"];
        // With `sim`, the simulator answers both APIs.
        assert_eq!(spec.coordinator_route(), Route { entry: ProviderKind::Sim, api: Api::Messages });
        assert_eq!(spec.worker_route(w), Route { entry: ProviderKind::Sim, api: Api::ChatCompletions });
        assert_eq!(spec.routes().len(), 2);
        let real = two.replace("provider: sim\nscenario: scenario.yaml\n", "provider: anthropic\n");
        let spec = JobSpec::parse(&real).unwrap();
        assert_eq!(spec.coordinator_route(), Route { entry: ProviderKind::Anthropic, api: Api::Messages });
        assert_eq!(
            spec.worker_route(&spec.workers["counter"]),
            Route { entry: ProviderKind::Openai, api: Api::ChatCompletions }
        );
        let openai = GOOD.replace("provider: sim\nscenario: scenario.yaml\n", "provider: openai\n");
        let spec = JobSpec::parse(&openai).unwrap();
        assert_eq!(spec.routes(), vec![Route { entry: ProviderKind::Openai, api: Api::ChatCompletions }]);
        // A role does not name the simulator; an unknown provider names its field.
        let e = err(&GOOD.replace("  name: lead\n", "  name: lead\n  provider: sim\n"));
        assert_eq!(e.field, "coordinator.provider");
        let e = err(&GOOD.replace("    tools: [Bash, Read]\n", "    tools: [Bash, Read]\n    provider: mistral\n"));
        assert!(e.field.starts_with("workers"), "{e}");
        assert!(e.to_string().contains("mistral"), "{e}");
        let e = err(&openai.replace("provider: openai\n", "provider: openai\nscenario: s.yaml\n"));
        assert_eq!(e.field, "scenario");
    }

    #[test]
    fn openai_models_have_prices_with_their_cached_rate() {
        let p = builtin_price("gpt-4.1-mini").unwrap();
        assert_eq!((p.input, p.cache_read, p.output), (0.4, 0.1, 1.6), "not gpt-4.1's");
        assert_eq!(builtin_price("gpt-4o").unwrap().cache_read, 1.25);
        assert!(builtin_price("llama-3-70b").is_none());
    }
}
