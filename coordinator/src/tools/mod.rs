//! The coordinator's tools: `Agent` (delegate), `TodoWrite` (plan), `Read`
//! (workbench and workspace files), and `Bash` for glances (run by a worker as
//! a tool-only task). Nothing hands-on while `delegate_only` holds.

pub mod agent;
pub mod bash;
pub mod read;
pub mod todo;
