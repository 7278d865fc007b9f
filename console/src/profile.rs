//! What the insights strip adds up across jobs: each job's cost by role and
//! by model, and its model calls' latency and time to first token — read
//! from its sessions and its `turn_completed` events. An ended job's profile
//! never changes, so it is kept (at most [`KEPT`] of them); a running job's
//! is read again each time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use flower_coordinator::app::{App, AppError};
use flower_model::{EventKind, Job, JobId, JobSpec, Role};

/// Ended jobs' profiles kept in memory (the list's own window).
pub const KEPT: usize = 2 * super::LIST_WINDOW as usize;

/// Latencies are counted in buckets 2^(1/8) apart (a median within 9 %),
/// from 1 ms to 2^20 ms (about 17 minutes); longer calls land in the last.
const BUCKETS: usize = 161;

/// A mergeable latency histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    counts: Vec<u32>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { counts: vec![0; BUCKETS] }
    }
}

impl Histogram {
    pub fn add(&mut self, ms: u64) {
        let i = ((ms.max(1) as f64).log2() * 8.0).round() as usize;
        self.counts[i.min(BUCKETS - 1)] += 1;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| *c as u64).sum()
    }

    /// The median, as its bucket's value (ms); `None` when empty.
    pub fn median(&self) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += *c as u64;
            if seen * 2 >= n {
                return Some(2f64.powf(i as f64 / 8.0).round() as u64);
            }
        }
        None
    }
}

/// One job's figures, or several jobs' added up.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// `coordinator`, `worker NAME`, or the workflow step (`judge`, `clarify`, …).
    pub cost_by_role: BTreeMap<String, f64>,
    pub cost_by_model: BTreeMap<String, f64>,
    pub latency: Histogram,
    pub ttft: Histogram,
}

impl Profile {
    pub fn merge(&mut self, other: &Profile) {
        for (k, v) in &other.cost_by_role {
            *self.cost_by_role.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.cost_by_model {
            *self.cost_by_model.entry(k.clone()).or_default() += v;
        }
        self.latency.merge(&other.latency);
        self.ttft.merge(&other.ttft);
    }
}

/// Read a job's profile from its sessions and events.
pub async fn read(app: &App, job: &Job) -> Result<Profile, AppError> {
    let spec = JobSpec::from_value(job.spec.clone()).ok();
    let roles: HashMap<_, _> = app
        .sessions(job.id)
        .await?
        .into_iter()
        .map(|s| {
            let role = match s.role {
                Role::Coordinator => "coordinator".to_string(),
                Role::Worker => format!("worker {}", s.label),
                other => other.as_str().to_string(),
            };
            (s.id, role)
        })
        .collect();
    let mut p = Profile::default();
    app.scan_events(job.id, |e| {
        let EventKind::TurnCompleted { session, usage, latency_ms, ttft_ms, model, .. } = &e.kind else { return };
        // Turns recorded before the model was named were the job's model's.
        let model = model.clone().or_else(|| spec.as_ref().map(|s| s.model.clone())).unwrap_or_default();
        let price = match &spec {
            Some(s) => s.runtime.budget.price(&model),
            None => flower_model::spec::builtin_price(&model),
        };
        if let Some(price) = price {
            let cost = price.cost(usage);
            let role = roles.get(session).cloned().unwrap_or_else(|| "other".into());
            *p.cost_by_role.entry(role).or_default() += cost;
            *p.cost_by_model.entry(model).or_default() += cost;
        }
        if let Some(ms) = latency_ms {
            p.latency.add(*ms);
        }
        if let Some(ms) = ttft_ms {
            p.ttft.add(*ms);
        }
    })
    .await?;
    Ok(p)
}

/// Ended jobs' profiles, read once.
#[derive(Default)]
pub struct Profiles {
    kept: Mutex<HashMap<JobId, Arc<Profile>>>,
}

impl Profiles {
    /// An ended job's cost, each turn priced at its own model, when its
    /// profile has been read.
    pub fn cost(&self, job: JobId) -> Option<f64> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.get(&job).filter(|p| !p.cost_by_model.is_empty()).map(|p| p.cost_by_model.values().sum())
    }

    /// The profiles of `jobs` added up (eight read at once; an ended job's
    /// is read once and kept).
    pub async fn total<'a>(&self, app: &App, jobs: impl Iterator<Item = &'a Job>) -> Result<Profile, AppError> {
        use futures::StreamExt;
        let mut total = Profile::default();
        let mut wanted = Vec::new();
        {
            let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            for j in jobs {
                match kept.get(&j.id) {
                    Some(p) => total.merge(p),
                    None => wanted.push(j.clone()),
                }
            }
        }
        let reads: Vec<_> = wanted
            .into_iter()
            .map(|j| async move {
                let p = read(app, &j).await;
                (j, p)
            })
            .collect();
        let mut reads = futures::stream::iter(reads).buffer_unordered(8);
        while let Some((job, profile)) = reads.next().await {
            let profile = Arc::new(profile?);
            total.merge(&profile);
            if job.state.is_terminal() {
                let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
                if kept.len() >= KEPT {
                    kept.clear();
                }
                kept.insert(job.id, profile);
            }
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_median_is_within_a_bucket() {
        let mut h = Histogram::default();
        assert_eq!(h.median(), None);
        for ms in [10, 20, 30, 400, 5000] {
            h.add(ms);
        }
        let m = h.median().unwrap() as f64;
        assert!((m / 30.0 - 1.0).abs() < 0.1, "{m}");
        let mut other = Histogram::default();
        for _ in 0..10 {
            other.add(2_000_000_000);
        }
        h.merge(&other);
        assert_eq!(h.count(), 15);
        assert_eq!(h.median(), Some(1 << 20), "the last bucket holds anything longer");
    }

    #[test]
    fn profiles_add_up() {
        let mut a = Profile::default();
        a.cost_by_role.insert("coordinator".into(), 1.0);
        a.cost_by_model.insert("m".into(), 1.0);
        let mut b = a.clone();
        b.cost_by_role.insert("worker x".into(), 0.5);
        a.merge(&b);
        assert_eq!(a.cost_by_role["coordinator"], 2.0);
        assert_eq!(a.cost_by_role["worker x"], 0.5);
        assert_eq!(a.cost_by_model["m"], 2.0);
    }
}
