//! The coordinator's tools: `Agent` (delegate), `TodoWrite` (plan), `Read`
//! (workbench and workspace files), and `Bash` for glances (run by a worker as
//! a tool-only task), and `ask` (a question to the user, with `runtime.ask`).
//! Nothing hands-on while `delegate_only` holds.

pub mod agent;
pub mod ask;
pub mod bash;
pub mod read;
pub mod todo;
