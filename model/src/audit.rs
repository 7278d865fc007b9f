//! A cache audit's summary: of a run's requests, how many extended the
//! previous one's cached prefix, how many missed, and which misses no
//! recorded rewrite explains (docs/design.md, section 6). Kept beside a job
//! by whoever audited it (a simulator) and shown by `flower run` and the
//! console.

use serde::{Deserialize, Serialize};

/// The simulator's cache audit checked against the job's recorded rewrites.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheAudit {
    /// Requests audited (a resend of the same body counts once).
    pub requests: usize,
    /// Requests that began with the previous request's blocks.
    pub append_only: usize,
    /// Requests that did not extend the previous one or read less than it left cached.
    pub misses: usize,
    /// Misses at a recorded deliberate rewrite.
    pub explained: usize,
    /// Misses nothing explains: "session S turn N: ...".
    pub unexplained: Vec<String>,
}
