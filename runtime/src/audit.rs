//! The cache audit of `flower sim` servers, for jobs that ran against them
//! in distributed mode: `flower context` and the console join it with the
//! job's recorded rewrites, as the embedded mode does with its in-process
//! simulator.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use flower_model::audit::CacheAudit;
use flower_sim::audit::AuditReply;
use flower_sim::engine::AuditRecord;

/// `GET {base_url}/v1/flower/audit`: per session, what each request read.
pub async fn fetch(base_url: &str) -> Result<HashMap<String, Vec<AuditRecord>>, reqwest::Error> {
    let url = format!("{}/v1/flower/audit", base_url.trim_end_matches('/'));
    let reply: AuditReply = reqwest::get(url).await?.error_for_status()?.json().await?;
    Ok(reply.sessions)
}

/// Provider endpoints that may be simulators keeping a cache audit; one
/// that answered without one is not asked again.
pub struct SimAudits {
    sources: Vec<String>,
    no_audit: Mutex<HashSet<String>>,
}

impl SimAudits {
    pub fn new(sources: Vec<String>) -> Self {
        Self { sources, no_audit: Default::default() }
    }

    fn skipped(&self, source: &str) -> bool {
        self.no_audit.lock().unwrap_or_else(|p| p.into_inner()).contains(source)
    }
}

#[async_trait::async_trait]
impl flower_coordinator::context::CacheAudits for SimAudits {
    async fn audit(&self, sessions: &[String], rewrites: &[(String, u32)]) -> Option<CacheAudit> {
        let ours: HashSet<&str> = sessions.iter().map(String::as_str).collect();
        let mut records = HashMap::new();
        for source in &self.sources {
            if self.skipped(source) {
                continue;
            }
            match tokio::time::timeout(Duration::from_secs(3), fetch(source)).await {
                Ok(Ok(found)) => records.extend(found.into_iter().filter(|(s, _)| ours.contains(s.as_str()))),
                // Not a simulator (a real provider has no such endpoint): never asked again.
                Ok(Err(e)) if e.status().is_some() || e.is_decode() => {
                    self.no_audit.lock().unwrap_or_else(|p| p.into_inner()).insert(source.clone());
                }
                // Unreachable for now: asked again on the next view.
                Ok(Err(_)) | Err(_) => {}
            }
        }
        (!records.is_empty()).then(|| flower_sim::audit::join(&records, rewrites))
    }
}
