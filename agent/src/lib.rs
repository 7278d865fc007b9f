//! The agent loop shared by the coordinator and workers, and what it stands on:
//! the LLM provider client, the tool seam, the hooks seam (guards), and the
//! write path to the transcript store.
//!
//! # Layout
//! - [`provider`]: the `Provider` trait, the Anthropic Messages API client
//!   (streaming SSE, error classes, retries with backoff and jitter) and the
//!   provider table a process is configured with
//! - [`session`]: the loop itself (`AgentSession::run`)
//! - [`glance`]: `is_ephemeral`, the one judge of commands the coordinator may run itself
//! - [`guards`]: `delegate_guard` (layer 1) and `spill_guard` (layer 3) as hooks
//! - [`history`]: stored entries → request messages
//! - [`tool`]: the `Tool` trait, a session's `ToolSet`, tool errors (a fatal
//!   one keeps its cause typed), and what every `Read` shares
//! - [`surface`]: tool deferral: the resident set, the index, `search_tools` (BM25)
//! - [`hooks`]: pre-/post-tool hooks (allow, deny with a marker, rewrite; replace output)
//! - [`limits`]: a job's budget (tokens, cost, deadline), checked before every model call
//! - [`mailbox`]: user messages and late reports for a running session (interrupts)
//! - [`journal`]: commit-then-notify writes, and the per-session transcript writer
//! - [`metrics`]: the process's Prometheus series (one registry, no role knowledge)
//!
//! It owns what both roles run the same way (docs/design.md section 1): the
//! loop, providers, the tool seam and the read helpers, hooks, tool deferral,
//! cache breakpoints, the glance policy. It never knows which role's process
//! it runs in: no particular tool and no particular role's prompt — the
//! coordinator and worker crates bring those.
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod admission;
pub mod glance;
pub mod guards;
pub mod history;
pub mod hooks;
pub mod journal;
pub mod limits;
pub mod mailbox;
pub mod metrics;
pub mod provider;
pub mod session;
pub mod slot;
pub mod spend;
pub mod surface;
pub mod tool;

pub use journal::{Journal, TranscriptWriter};
pub use session::{AgentError, AgentSession, Gate, Inbox, Outcome, SessionConfig, gate_opens};
pub use tool::{FatalCause, Tool, ToolContext, ToolError, ToolOutput, ToolSet};
