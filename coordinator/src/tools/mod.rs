//! The coordinator's tools: `Agent` (delegate), `TodoWrite` (plan), `Read`
//! (workbench and workspace files). Nothing hands-on.

pub mod agent;
pub mod read;
pub mod todo;
