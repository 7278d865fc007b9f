//! `runtime:`: the options of a job's run, each with its default, and those
//! it groups: how a history is pruned on resume (layer 4) and how the job
//! asks its user.

use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use super::{Budget, CacheMode, HandoffOptions};

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
