pub mod backends;
pub mod bench;
pub mod client;
pub mod context;
pub mod glance;
pub mod jobs;
pub mod run;
pub mod serve;
pub mod sim;
pub mod status;
pub mod submit;
pub mod transcript;

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

/// `12.3k`-style counts for humans.
pub fn human_count(n: u64) -> String {
    match n {
        0..=999 => n.to_string(),
        1_000..=999_999 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}
