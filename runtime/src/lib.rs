//! The runtime: how flower's parts are wired into processes. The roles
//! (`coordinator`, `worker`) never import each other; this crate is the one
//! place that puts them together, with the backends and the simulator.
//!
//! # Layout
//! - [`embedded`]: a whole job in one process — SQLite, local objects, the
//!   in-process bus, a worker pool, the in-process simulator when a spec names
//!   `sim` (`flower run`, `flower demo`)
//! - [`distributed`]: the builder from configuration to connected Postgres,
//!   NATS, object storage and providers (`flower coordinator`, `flower
//!   worker`, `flower bench`)
//! - [`home`]: the embedded mode's home directory
//! - [`metrics`]: the distributed processes' `/metrics` endpoint
//! - [`audit`]: the simulator's cache audit fetched from a `flower sim` server
//! - [`jobs`]: the application layer over the embedded store, its jobs run in
//!   this process (`flower mcp-serve`, `flower ui`)
//!
//! The front-ends (`flower-console`, `flower-mcp`) are adapters over the
//! application layer (`flower_coordinator::app`); this crate gives them one.
//!
//! It holds no policy of its own: rules live in the crates it wires (see
//! docs/design.md, section 1).
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod audit;
pub mod distributed;
pub mod embedded;
pub mod home;
pub mod jobs;
pub mod jwks;
pub mod metrics;

pub use distributed::{ConnectError, Connected, DistributedConfig};
pub use embedded::{EmbeddedRuntime, RunError, RunSummary};
