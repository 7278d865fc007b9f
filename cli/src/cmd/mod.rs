pub mod auth;
pub mod backends;
pub mod bench;
pub mod bench_console;
pub mod bench_hotpath;
pub mod bench_launch;
pub mod bench_transcript;
pub mod client;
pub mod context;
pub mod glance;
pub mod isolation;
pub mod jobs;
pub mod mcp_serve;
pub mod migrate;
pub mod run;
pub mod serve;
pub mod sim;
pub mod status;
pub mod submit;
pub mod transcript;
pub mod ui;

use std::sync::Arc;

use anyhow::Context;
use flower_model::JobId;
use flower_store::{SqliteStore, Store};

/// The embedded store of `home`, for read-only commands.
pub fn open_store(home: &std::path::Path) -> anyhow::Result<Arc<dyn Store>> {
    let db = home.join("flower.db");
    anyhow::ensure!(db.exists(), "no flower database at {} (run a job first, or pass --home)", db.display());
    Ok(Arc::new(SqliteStore::open(&db).with_context(|| format!("opening {}", db.display()))?))
}

/// A job by full id or unique prefix.
pub async fn resolve_job(store: &dyn Store, id: &str) -> anyhow::Result<JobId> {
    Ok(store.resolve_job(id).await?)
}

/// A stored time (ms since the epoch) for humans: `2026-12-07 14:03:22Z`.
pub fn format_ms(ms: i64) -> String {
    let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]Z");
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(format).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// `12.3k`-style counts for humans.
pub fn human_count(n: u64) -> String {
    match n {
        0..=999 => n.to_string(),
        1_000..=999_999 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// Settings that override a spec's `runtime` (and its priority) for this run (flags or environment).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpecOverrides {
    /// Tool deferral (docs/design.md, section 6): `off` makes every admitted tool resident and
    /// the requests those of a build without deferral
    #[arg(long, env = "FLOWER_TOOL_DEFERRAL", value_parser = on_off)]
    pub tool_deferral: Option<bool>,
    /// Fan-out staggering: siblings of one shape wait for the first one's first streamed event
    #[arg(long, env = "FLOWER_FANOUT_STAGGER", value_parser = on_off)]
    pub fanout_stagger: Option<bool>,
    /// Prompt-cache breakpoints: full (docs/design.md, section 6), tail-only (a naive builder, to compare), off
    #[arg(long, env = "FLOWER_PROMPT_CACHE", value_parser = cache_mode)]
    pub prompt_cache: Option<flower_model::spec::CacheMode>,
    /// The job's priority, 1 (most urgent) to 5: whose model calls go first when a provider's
    /// rate limit makes calls wait (overrides the spec's `priority`)
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub priority: Option<u8>,
}

impl SpecOverrides {
    pub fn any(&self) -> bool {
        self.tool_deferral.is_some()
            || self.fanout_stagger.is_some()
            || self.prompt_cache.is_some()
            || self.priority.is_some()
    }

    pub fn apply(&self, spec: &mut flower_model::JobSpec) {
        if let Some(v) = self.tool_deferral {
            spec.runtime.tool_deferral = v;
        }
        if let Some(v) = self.fanout_stagger {
            spec.runtime.fanout_stagger = v;
        }
        if let Some(v) = self.prompt_cache {
            spec.runtime.prompt_cache = v;
        }
        if let Some(p) = self.priority {
            spec.priority = Some(p);
        }
    }
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("`{s}`: expected on or off")),
    }
}

fn cache_mode(s: &str) -> Result<flower_model::spec::CacheMode, String> {
    use flower_model::spec::CacheMode;
    match s {
        "full" => Ok(CacheMode::Full),
        "tail-only" | "tail_only" => Ok(CacheMode::TailOnly),
        "off" => Ok(CacheMode::Off),
        _ => Err(format!("`{s}`: expected full, tail-only or off")),
    }
}

/// The async runtime's threads, as a serving process announces them
/// (`--threads`, or one per core), and the CPU latency request it holds
/// (`--cpu-latency-us`), if any.
pub fn runtime_threads() -> String {
    let threads = match tokio::runtime::Handle::current().metrics().num_workers() {
        1 => "1 runtime thread".into(),
        n => format!("{n} runtime threads"),
    };
    match crate::cpu_latency::held_us() {
        Some(us) => format!("{threads}, CPU latency request {us} µs held"),
        None => threads,
    }
}
