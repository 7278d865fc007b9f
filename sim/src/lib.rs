//! The LLM simulator: an Anthropic Messages API server (`POST /v1/messages`)
//! and a Chat Completions server (`POST /v1/chat/completions`) — streaming
//! and not, tool use, usage with each provider's cache rules, error shapes —
//! that plays scripted scenarios, so the whole system runs with real tools on real data and no
//! network or key.
//!
//! # Layout
//! - [`scenario`]: the scenario file format (documented there) and its validation
//! - [`cache`]: prompt-cache accounting by each provider's rules
//! - [`chat`]: the Chat Completions shapes, translated to and from the engine's
//! - [`audit`]: the cache audit joined with the rewrites a job recorded
//! - [`engine`]: request validation, stateless step choice, rendering, faults
//! - [`quota`]: rate limits per API key, with each provider's 429s and headers
//! - [`server`]: the HTTP shell and the exact event shapes it emits
//! - [`mcp_fixture`]: a fixture MCP server with a catalog of ≥ 120 realistic tools
//!
//! The simulator keeps no conversation state: everything it needs is in the
//! request, which is what lets pruning, resume and handoff work against it.
//! It is never a dependency of a role (docs/design.md section 1): only the
//! runtime, the CLI and tests use it.
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod audit;
pub mod cache;
pub mod chat;
pub mod engine;
pub mod mcp_fixture;
pub mod quota;
pub mod scenario;
pub mod server;
pub mod timeline;

pub use scenario::{Scenario, ScenarioError};
pub use server::{SimHandle, start};
