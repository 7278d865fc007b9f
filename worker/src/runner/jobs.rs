//! The jobs recently run here, each read once: what a task uses of its job
//! (id, spec, submission time) never changes after submit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use flower_model::{Job, JobId, JobSpec, Usage};

use super::{Failure, Worker};

/// Jobs kept in a [`JobCache`]; past this the cache starts again empty.
const JOB_CACHE: usize = 256;

/// A job and its parsed spec, as read once.
pub(super) type CachedJob = Arc<(Job, JobSpec)>;

/// The jobs read by this worker, at most [`JOB_CACHE`] of them.
#[derive(Default)]
pub(super) struct JobCache {
    jobs: Mutex<HashMap<JobId, CachedJob>>,
}

impl JobCache {
    pub(super) fn get(&self, id: JobId) -> Option<CachedJob> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    fn insert(&self, id: JobId, read: CachedJob) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if jobs.len() >= JOB_CACHE {
            jobs.clear();
        }
        jobs.insert(id, read);
    }
}

impl Worker {
    /// The namespace of a job read here (every task's job is read before
    /// its attempt starts); `default` for one not in the cache.
    pub(super) fn namespace_of(&self, id: JobId) -> String {
        self.jobs.get(id).map_or_else(|| flower_model::access::DEFAULT_NAMESPACE.to_string(), |j| j.0.namespace.clone())
    }

    /// The task's job and its parsed spec, from the cache or read once.
    pub(super) async fn job(&self, id: JobId) -> Result<CachedJob, (Failure, Usage)> {
        let none = Usage::default();
        if let Some(hit) = self.jobs.get(id) {
            return Ok(hit);
        }
        let job = self.journal.store().get_job(id).await.map_err(|e| (Failure::from(e), none))?;
        let spec = JobSpec::from_value(job.spec.clone()).map_err(|e| (Failure::fatal(e.to_string()), none))?;
        let read = Arc::new((job, spec));
        self.jobs.insert(id, read.clone());
        Ok(read)
    }
}
