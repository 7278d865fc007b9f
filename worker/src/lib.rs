//! The worker: consumes tasks, runs the worker agent for each in its own
//! working directory, and returns a report.
//!
//! # Layout
//! - [`runner`]: the task consumer (claim → run → report → ack), heartbeats, cancel; a
//!   first delivery's run beside its claim; task folders and their reuse
//! - `claims`: claims asked for together written in one transaction
//! - [`tools`]: the hands-on tools (`Read`, `Write`, `Edit`, `Bash`, `Glob`, `Grep`)
//! - [`sandbox`]: the working directory as a capability (paths opened beneath it)
//! - [`prompts`]: the worker role's base system prompt
//! - [`mcp`]: MCP client connections; each server's tools as `mcp__<server>__<tool>`
//! - [`isolation`]: how tools start (through the launcher, or directly) and the spec policy:
//!   one value made at start and handed to the runner ([`WorkerOptions::tools`])
//! - [`launch`]: the launcher (`flower tool-exec`): namespaces, mounts, another user, Landlock,
//!   seccomp where there is no network namespace, resource limits
//! - [`egress`]: a task's egress proxy: the granted destinations, checked per connection
//! - [`cgroup`]: a control group per task and per launch: limits, and ending a launch whole
//! - [`taskdir`]: a task folder's size bound (a tmpfs of its own where the worker may mount)
//!
//! It owns the task consumer, the worker agent, the sandboxed tools and the
//! tool launcher (docs/design.md section 1). A worker never writes another
//! session's transcript and never reports for an attempt it does not hold:
//! the store's claim decides. It never depends on the coordinator or the
//! simulator.
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod cgroup;
mod claims;
pub mod egress;
pub mod isolation;
pub mod launch;
pub mod mcp;
pub mod prompts;
pub mod runner;
pub mod sandbox;
mod seccomp;
pub mod taskdir;
pub mod tools;

pub use runner::{Worker, WorkerOptions};
