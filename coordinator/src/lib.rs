//! The coordinator: the agent that only delegates, the dispatch of its
//! `Agent` calls as tasks, job ownership and the gRPC service. It never
//! depends on the worker or the simulator: the `runtime` crate wires them.
//!
//! # Layout
//! - [`prompts`]: the coordinator role's base system prompt
//! - [`tools`]: `Agent`, `TodoWrite`, `Read`, `ask` — nothing hands-on
//! - [`qa_log`]: the workbench's `notes/qa-log.md`: every question, answer and
//!   mid-run message, outside every context
//! - [`dispatch`]: task creation (derived ids), publish, waiting for reports,
//!   applying workspace changesets in completion order
//! - [`runner`]: one job's coordinator session, started or resumed, to its end state
//! - [`dead_letters`]: task messages the queue gave up on: republished while never claimed, then failed
//! - [`context`]: the context report of a job (main thread vs subagents)
//! - [`index`]: the workbench index as notices to the main thread (layer 2)
//! - [`app`]: the application layer every front-end calls (gRPC, console, MCP): checks, limits, one error classification
//! - [`actions`]: cancel a job, send it a message (the application layer's steps)
//! - [`aside`]: side questions answered from a job's events and workbench, outside its main thread
//! - [`clarify`]: the brief and the goal before the coordinator starts (`workflow.clarify`)
//! - [`judge`]: the judge session and its verdicts (`workflow.judge`)
//! - [`continuation`]: a finished job continued as a new job with its lineage (`flower continue`)
//! - [`record`]: a job's workflow record — lineage, steps, verdicts, questions (`flower status JOB`)
//! - [`handoff`]: a new main-thread session from a handoff document when the context fills
//! - [`side`]: the sessions beside the main thread (clarifier, goal, judge, aside), built one way
//! - [`service`]: the gRPC service, leases and takeover (distributed mode)
//! - [`stop`]: why a run stops (a user's cancel, a lost lease, a shutdown)
//!
//! The coordinator never runs a tool on files itself and never writes a
//! worker's transcript; everything it learns from workers arrives as reports.
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod actions;
pub mod app;
pub mod aside;
pub mod budget;
pub mod clarify;
pub mod context;
pub mod continuation;
pub mod dead_letters;
pub mod dispatch;
pub mod handoff;
pub mod index;
pub mod judge;
pub mod prompts;
pub mod qa_log;
pub mod record;
pub mod runner;
pub mod service;
pub mod side;
pub mod stop;
pub mod tools;
