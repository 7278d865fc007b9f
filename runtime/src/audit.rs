//! The cache audit of a `flower sim` server, for jobs that ran against it in
//! distributed mode: `flower context` joins it with the job's recorded
//! rewrites, as the embedded mode does with its in-process simulator.

use std::collections::HashMap;

use flower_sim::audit::AuditReply;
use flower_sim::engine::AuditRecord;

/// `GET {base_url}/v1/flower/audit`: per session, what each request read.
pub async fn fetch(base_url: &str) -> Result<HashMap<String, Vec<AuditRecord>>, reqwest::Error> {
    let url = format!("{}/v1/flower/audit", base_url.trim_end_matches('/'));
    let reply: AuditReply = reqwest::get(url).await?.error_for_status()?.json().await?;
    Ok(reply.sessions)
}
