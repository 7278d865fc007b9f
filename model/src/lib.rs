//! Domain types shared by every flower crate: the job spec, transcript entries
//! and their content blocks, job events, usage, and the ids that tie them together.
//!
//! # Layout
//! - [`ids`]: job, session and task ids; task ids are derived, not random
//! - [`spec`]: the job spec (YAML/JSON) and its validation
//! - [`access`]: namespaces, roles, API keys and audit records
//! - [`audit`]: a cache audit's summary (requests, append-only, misses unexplained)
//! - [`content`]: message content blocks in the Anthropic Messages shape
//! - [`entry`]: transcript entries with their structural markers
//! - [`error`]: the one classification of errors ([`ErrorKind`]) every front-end renders
//! - [`event`]: job events (rows with a per-job sequence number)
//! - [`job`]: job, task and session records and their states
//! - [`policy`]: the operator's allowlists of MCP servers and credential variables a spec may name
//! - [`secret`]: the one constant-time compare of tokens and session values
//! - [`session_file`]: export/import in the Claude Code session-file (JSONL) shape
//! - [`usage`]: token usage, including the prompt-cache fields
//! - [`windows`]: context windows learnt from providers' overflow errors
//!
//! This crate does no I/O except reading a spec's own files during validation;
//! it must never talk to a store, the network or a provider (no tokio,
//! database, object store or NATS: docs/design.md section 1).
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod access;
pub mod audit;
pub mod content;
pub mod entry;
pub mod error;
pub mod event;
pub mod ids;
pub mod job;
pub mod network;
pub mod policy;
pub mod quota;
pub mod secret;
pub mod session_file;
pub mod spec;
pub mod usage;
pub mod windows;

pub use content::{ContentBlock, ResultBlock};
pub use entry::{Entry, EntryKind, Markers};
pub use error::{Classify, ErrorKind};
pub use event::{Event, EventKind};
pub use ids::{JobId, SessionId, TaskId};
pub use job::{Job, JobState, Lineage, Role, Session, Task, TaskOutcome, TaskState};
pub use spec::{JobSpec, SpecError, WorkerSpec};
pub use usage::Usage;

/// Milliseconds since the Unix epoch, the one timestamp format stored everywhere.
pub fn now_ms() -> i64 {
    let now = time::OffsetDateTime::now_utc();
    (now.unix_timestamp_nanos() / 1_000_000) as i64
}
