//! The LLM simulator: an Anthropic Messages API server (`POST /v1/messages`,
//! streaming and not, tool use, usage, error shapes) that plays scripted
//! scenarios, so the whole system runs with real tools on real data and no
//! network or key.
//!
//! # Layout
//! - [`scenario`]: the scenario file format (documented there) and its validation
//! - [`cache`]: prompt-cache accounting by the provider's rules
//! - [`audit`]: the cache audit joined with the rewrites a job recorded
//! - [`engine`]: request validation, stateless step choice, rendering, faults
//! - [`server`]: the HTTP shell and the exact event shapes it emits
//! - [`mcp_fixture`]: a fixture MCP server with a catalog of ≥ 120 realistic tools
//!
//! The simulator keeps no conversation state: everything it needs is in the
//! request, which is what lets pruning, resume and handoff work against it.
//! It is never a dependency of a role (docs/design.md section 1): only the
//! runtime, the CLI and tests use it.

pub mod audit;
pub mod cache;
pub mod engine;
pub mod mcp_fixture;
pub mod scenario;
pub mod server;

pub use scenario::{Scenario, ScenarioError};
pub use server::{SimHandle, start};
