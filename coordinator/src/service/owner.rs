//! Job ownership: every replica renews the leases of the jobs it runs and
//! takes over queued jobs and jobs whose owner's lease expired. Writes of a
//! run are fenced by its lease epoch, so an owner that lost its lease (paused,
//! partitioned) cannot write over its successor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flower_agent::{Inbox, Journal};
use flower_bus::{Heard, Notice};
use flower_model::{EventKind, JobId, JobSpec, JobState, now_ms};
use flower_store::{Lease, StoreError};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Backends;
use crate::qa_log::QaLog;
use crate::runner::{JobContext, run_job};
use crate::stop::{Stop, StopCause};

/// First and longest pause before a run interrupted by a store error resumes.
const RESUME_FIRST: Duration = Duration::from_millis(200);
const RESUME_MAX: Duration = Duration::from_secs(2);
/// How often an owner reads its jobs' events without a notice (a lost
/// interrupt or cancel notice is seen within this).
const EVENTS_BACKSTOP: Duration = Duration::from_secs(2);

struct Running {
    lease: Lease,
    stop: Stop,
    inbox: Inbox,
    /// The job's qa-log: the run's and the user's messages take turns on it.
    qa_log: QaLog,
    /// Events of this job already looked at (for interrupts and cancels).
    cursor: i64,
}

pub struct Owner {
    backends: Backends,
    replica: String,
    lease_ttl: Duration,
    sweep: crate::dispatch::Sweep,
    running: Mutex<HashMap<JobId, Running>>,
    wake: Notify,
    /// Trace context of recent submits, so a job's run continues its trace.
    traces: Mutex<HashMap<JobId, String>>,
    /// The namespaces' spending limits, read once for all the runs here.
    budgets: flower_agent::spend::NamespaceBudgets,
}

impl Owner {
    pub fn new(backends: Backends, replica: String, lease_ttl: Duration, sweep: crate::dispatch::Sweep) -> Arc<Self> {
        Arc::new(Self {
            replica,
            lease_ttl,
            sweep,
            running: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            traces: Mutex::new(HashMap::new()),
            budgets: flower_agent::spend::NamespaceBudgets::new(backends.store.clone()),
            backends,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Look for work now: `job` was just submitted (in the current trace).
    pub fn submitted(&self, job: JobId) {
        if let Some(tp) = flower_bus::trace::current_traceparent() {
            self.traces.lock().unwrap_or_else(|p| p.into_inner()).insert(job, tp);
        }
        self.wake.notify_one();
    }

    /// Jobs this replica runs.
    pub fn running(&self) -> Vec<JobId> {
        self.lock().keys().copied().collect()
    }

    /// Renew, take over, repeat — until `shutdown`; then release what it holds
    /// so another replica takes over without waiting for expiry.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let me = self.clone();
        let stop = shutdown.clone();
        let follower = tokio::spawn(async move { me.follow_events(stop).await });
        let tick = self.lease_ttl / 3;
        loop {
            self.renew().await;
            self.take_over().await;
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = self.wake.notified() => {}
                _ = shutdown.cancelled() => break,
            }
        }
        follower.abort();
        let held: Vec<Running> = self.lock().drain().map(|(_, r)| r).collect();
        for r in held {
            r.stop.stop(StopCause::Shutdown);
            let _ = self.backends.store.release_lease(&r.lease).await;
        }
    }

    /// Renew every held lease in one store transaction (a replica running a
    /// thousand jobs makes one round trip a tick, not a thousand).
    async fn renew(&self) {
        let leases: Vec<Lease> = self.lock().values().map(|r| r.lease.clone()).collect();
        if leases.is_empty() {
            return;
        }
        let ttl = self.lease_ttl.as_millis() as i64;
        match self.backends.store.renew_leases(&leases, ttl).await {
            Ok(held) => {
                for (lease, held) in leases.iter().zip(held) {
                    if held {
                        continue;
                    }
                    tracing::warn!(job = %lease.job, epoch = lease.epoch, "lease lost; stopping the run");
                    let mut lock = self.lock();
                    // Only the run this lease belongs to (not a newer one of the same job).
                    if lock.get(&lease.job).is_some_and(|r| r.lease.epoch == lease.epoch)
                        && let Some(r) = lock.remove(&lease.job)
                    {
                        r.stop.stop(StopCause::LeaseLost);
                    }
                }
            }
            Err(e) => tracing::warn!(leases = leases.len(), error = %e, "leases not renewed; retrying"),
        }
    }

    async fn take_over(self: &Arc<Self>) {
        let store = &self.backends.store;
        let orphans = match store.orphaned_jobs(now_ms(), 64).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list jobs to take over");
                return;
            }
        };
        for job in orphans {
            if self.lock().contains_key(&job) {
                continue;
            }
            let lease = match store.acquire_lease(job, &self.replica, self.lease_ttl.as_millis() as i64).await {
                Ok(Some(l)) => {
                    flower_agent::metrics::metrics().lease_takeovers.inc();
                    l
                }
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(job = %job, error = %e, "lease not acquired");
                    continue;
                }
            };
            let cursor = store.events(job, 0, u32::MAX).await.ok().and_then(|e| e.last().map(|e| e.seq)).unwrap_or(0);
            let qa_log = QaLog::new(self.backends.objects.clone(), job);
            let running =
                Running { lease: lease.clone(), stop: Stop::default(), inbox: Inbox::default(), qa_log, cursor };
            let (stop, inbox, qa_log) = (running.stop.clone(), running.inbox.clone(), running.qa_log.clone());
            self.lock().insert(job, running);
            tracing::info!(job = %job, epoch = lease.epoch, replica = %self.replica, "job owned");
            let span = tracing::info_span!("job", job = %job, epoch = lease.epoch);
            if let Some(tp) = self.traces.lock().unwrap_or_else(|p| p.into_inner()).remove(&job) {
                flower_bus::trace::continue_trace(&span, &tp);
            }
            let me = self.clone();
            tokio::spawn(tracing::Instrument::instrument(
                async move { me.run_one(lease, stop, inbox, qa_log).await },
                span,
            ));
        }
    }

    async fn run_one(self: Arc<Self>, lease: Lease, stop: Stop, inbox: Inbox, qa_log: QaLog) {
        let job = lease.job;
        let b = &self.backends;
        let journal = Journal::new(b.store.clone(), b.notifier.clone()).fenced(lease.fence());
        let mut namespace = flower_model::access::DEFAULT_NAMESPACE.to_string();
        let mut priority = flower_model::quota::DEFAULT_PRIORITY;
        let provider = match b.store.get_job(job).await.map_err(|e| e.to_string()).and_then(|j| {
            namespace = j.namespace;
            let spec = JobSpec::from_value(j.spec).map_err(|e| e.to_string())?;
            b.providers.check(&spec).map(|_| spec)
        }) {
            Ok(spec) => {
                priority = spec.priority();
                b.providers.for_spec(&spec)
            }
            Err(reason) => {
                let _ = b.store.set_job_state(job, JobState::Failed, Some(reason), None, Some(lease.fence())).await;
                None
            }
        };
        if let Some(provider) = provider {
            let ctx = JobContext {
                sweep: self.sweep,
                journal,
                queue: b.queue.clone(),
                objects: b.objects.clone(),
                provider,
                epoch: lease.epoch,
                inbox,
                stop,
                qa_log,
                windows: b.windows.clone(),
                budgets: self.budgets.clone(),
                namespace,
                priority,
            };
            // A store error is not a lost lease: while the lease holds (the
            // renewal loop stops the run when it is lost), the run is
            // resumed from the store after a pause, so a database restart
            // stalls the job for the restart plus a retry, not a lease TTL.
            let mut pause = RESUME_FIRST;
            loop {
                match run_job(&ctx, job).await {
                    Ok(Some(f)) => tracing::info!(job = %job, state = %f.state, "job ended"),
                    Ok(None) => tracing::info!(job = %job, cause = ?ctx.stop.cause(), "job handed over"),
                    Err(StoreError::Fenced { .. }) => tracing::warn!(job = %job, "job taken over by another replica"),
                    // Retrying cannot help a job whose stored data cannot be read,
                    // or that must write what cannot be stored: end it.
                    Err(StoreError::Corrupt(m) | StoreError::Invalid(m)) => {
                        let reason = format!("the job cannot be run: {m}");
                        let _ =
                            b.store.set_job_state(job, JobState::Failed, Some(reason), None, Some(lease.fence())).await;
                    }
                    Err(e) if !ctx.stop.is_stopped() => {
                        tracing::warn!(job = %job, error = %e, pause_ms = pause.as_millis() as u64, "job run interrupted by the store; resuming");
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = ctx.stop.token().cancelled() => {}
                        }
                        pause = (pause * 2).min(RESUME_MAX);
                        continue;
                    }
                    Err(e) => tracing::warn!(job = %job, error = %e, "job run stopped; another owner may resume it"),
                }
                break;
            }
        }
        let mine = self.lock().remove(&job);
        if let Some(r) = mine {
            let _ = b.store.release_lease(&r.lease).await;
        }
        // A job of a namespace at its `max_jobs` may start now.
        self.wake.notify_one();
    }

    /// Interrupts and cancels reach the owner as events of its jobs, read
    /// when an interrupt or cancel notice names the job — not on every event
    /// notice: the job's own turns and tasks write most events — and, since
    /// notices are hints, every [`EVENTS_BACKSTOP`] for all its jobs.
    async fn follow_events(&self, shutdown: CancellationToken) {
        let mut notices = self.backends.notifier.subscribe();
        let mut backstop = tokio::time::interval(EVENTS_BACKSTOP);
        backstop.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let heard = tokio::select! {
                h = notices.recv() => Some(h),
                _ = backstop.tick() => None,
                _ = shutdown.cancelled() => return,
            };
            let jobs: Vec<JobId> = match heard {
                Some(Heard::Notice(Notice::Interrupt { job } | Notice::Cancel { job })) => vec![job],
                Some(Heard::Lagged) | None => self.running(),
                Some(Heard::Closed) => return,
                Some(Heard::Notice(_)) => continue,
            };
            for job in jobs {
                self.look_at_events(job).await;
            }
        }
    }

    async fn look_at_events(&self, job: JobId) {
        let Some(cursor) = self.lock().get(&job).map(|r| r.cursor) else { return };
        let Ok(events) = self.backends.store.events(job, cursor, 1000).await else { return };
        let mut lock = self.lock();
        let Some(r) = lock.get_mut(&job) else { return };
        let mut messages = Vec::new();
        for e in events {
            r.cursor = r.cursor.max(e.seq);
            match e.kind {
                EventKind::UserMessage { text } => {
                    r.inbox.push(crate::actions::inbox_text(&text));
                    messages.push(text);
                }
                EventKind::QuestionAnswered { .. } => r.inbox.answer_arrived(),
                EventKind::JobState { state: JobState::Cancelled, .. } => r.stop.stop(StopCause::User),
                _ => {}
            }
        }
        let qa_log = r.qa_log.clone();
        drop(lock);
        if !messages.is_empty() {
            tokio::spawn(async move {
                for text in messages {
                    qa_log.message(&text).await;
                }
            });
        }
    }
}
