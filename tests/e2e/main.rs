//! End-to-end tests: the real `flower` binary, real files, the simulator over
//! real HTTP (in-process for `provider: sim`, a `flower sim` server process
//! otherwise). Each test has its own `FLOWER_HOME`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

mod access;
mod ask;
mod bench;
mod cluster;
mod console;
mod continuation;
mod pggate;
mod support;

mod demo;
mod distributed;
mod faults;
mod handoff;
mod hostile;
mod invalid_specs;
mod isolation;
mod judge;
mod long_horizon;
mod mcp_serve;
mod metrics;
mod migrate;
mod providers;
mod quota;
mod sandbox;
mod sim_server;
mod soak;
mod tools;
mod trials;
