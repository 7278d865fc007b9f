//! The task consumer: take a delivery, claim its attempt in the store, run the
//! worker agent in a fresh working directory (workspace checked out, workbench
//! mounted at `.flower/`), publish the report, ack.
//!
//! The claim — not the queue — guarantees a task completes once: a stale or
//! superseded delivery is acked without running; a delivery past
//! `max_attempts` is recorded as failed without running (dead letter) —
//! unless no attempt ever claimed the task: then it is published again.
//!
//! # Layout
//! - this module: the worker and its options, its consume loops, cancels,
//!   and a delivery's way from claim to ack
//! - `claim`: taking an attempt (the claim retried through outages, what it
//!   means for the delivery), its heartbeats, a delivery published again
//! - `early`: a first delivery whose run starts while its claim commits
//! - `session`: the run of one attempt: the worker agent, or a tool-only command
//! - `folder`: an attempt's working directory: opened, filled, collected, released
//! - `spare`: emptied directories kept for their job's next attempt
//! - `end`: an attempt's end recorded, its notice sent, its delivery settled
//! - `jobs`: the jobs recently run here, each read once

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flower_agent::Journal;
use flower_agent::provider::ProviderSource;
use flower_bus::{BusError, Delivery, Heard, Notice, TaskQueue};
use flower_model::{JobId, TaskId, TaskOutcome, Usage};
use flower_store::{Batch, EndOffer, StoreError};
use object_store::ObjectStore;
use tokio_util::sync::CancellationToken;

use crate::isolation::ToolSetup;

mod claim;
mod early;
mod end;
mod folder;
mod jobs;
mod session;
mod spare;

use end::Recorded;
use folder::Fill;
use session::Start;

#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Names this process in claims and events.
    pub worker_id: String,
    /// Where per-task working directories are made.
    pub work_root: PathBuf,
    /// How tools start and what specs may ask of this worker (made at start).
    pub tools: ToolSetup,
    /// Deliveries of one task before it is failed without running (default 3).
    pub max_attempts: u32,
    /// Interval of in-progress acks while a task runs (default 10 s).
    pub heartbeat: Duration,
    /// Keep task directories after the task (debugging).
    pub keep_workdirs: bool,
    /// How long a report whose write failed (store unreachable) is retried
    /// while the message is held, before the delivery is given back for
    /// redelivery (default 2m).
    pub report_retry: Duration,
    /// Where the sessions record a window their provider names (the
    /// process's table; default: one of this worker's own).
    pub windows: flower_model::windows::Windows,
}

impl WorkerOptions {
    pub fn new(worker_id: impl Into<String>, work_root: impl Into<PathBuf>, tools: ToolSetup) -> Self {
        Self {
            worker_id: worker_id.into(),
            work_root: work_root.into(),
            tools,
            max_attempts: 3,
            heartbeat: Duration::from_secs(10),
            keep_workdirs: false,
            report_retry: Duration::from_secs(120),
            windows: Default::default(),
        }
    }
}

pub struct Worker {
    opts: WorkerOptions,
    journal: Journal,
    queue: Arc<dyn TaskQueue>,
    objects: Arc<dyn ObjectStore>,
    providers: Arc<dyn ProviderSource>,
    running: Mutex<HashMap<JobId, Vec<(TaskId, CancellationToken)>>>,
    /// Jobs recently run here ([`jobs::JobCache`]).
    jobs: jobs::JobCache,
    /// Emptied working directories of finished attempts ([`spare::SpareDirs`]).
    spare: spare::SpareDirs,
    /// Attempts that stored a workspace changeset, until their end is
    /// recorded: their end's notice says so (the coordinator looks for a
    /// changeset only then).
    changesets: Mutex<std::collections::HashSet<(TaskId, u32)>>,
    /// This process's claims, written in groups ([`crate::claims`]).
    claims: Arc<crate::claims::ClaimWriter>,
}

/// Why a task attempt produced no report.
#[derive(Debug)]
pub struct Failure {
    pub reason: String,
    /// A transient cause (the store or object storage unreachable): the
    /// delivery is given back and the task resumes on redelivery, instead of
    /// failing for good.
    pub retryable: bool,
}

impl Failure {
    fn fatal(reason: impl Into<String>) -> Self {
        Self { reason: reason.into(), retryable: false }
    }

    fn store(context: &str, e: StoreError) -> Self {
        let retryable = matches!(e, StoreError::Backend { .. });
        Self { reason: if context.is_empty() { e.to_string() } else { format!("{context}: {e}") }, retryable }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self::store("", e)
    }
}

/// An attempt's report and its usage, or why there is none.
type Reported = Result<(String, Usage), (Failure, Usage)>;

/// How often a worker reads the queue's lag into its gauge.
const QUEUE_LAG_EVERY: Duration = Duration::from_secs(5);

/// Keep the queue-lag gauge current (one read every [`QUEUE_LAG_EVERY`],
/// never one per task) until `shutdown`; a failed read keeps the last value.
async fn refresh_queue_lag(queue: Arc<dyn TaskQueue>, shutdown: CancellationToken) {
    let gauge = &flower_agent::metrics::metrics().queue_lag;
    loop {
        let read = tokio::select! {
            r = queue.lag() => r,
            _ = shutdown.cancelled() => return,
        };
        match read {
            Ok(n) => {
                gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            Err(BusError::Closed) => return,
            Err(e) => tracing::debug!(error = %e, "queue lag not read"),
        }
        tokio::select! {
            _ = tokio::time::sleep(QUEUE_LAG_EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// First and longest pause between retries of a claim or a report write.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

impl Worker {
    pub fn new(
        opts: WorkerOptions,
        journal: Journal,
        queue: Arc<dyn TaskQueue>,
        objects: Arc<dyn ObjectStore>,
        providers: Arc<dyn ProviderSource>,
    ) -> Arc<Self> {
        let claims = crate::claims::ClaimWriter::new(journal.store().clone());
        Arc::new(Self {
            opts,
            journal,
            queue,
            objects,
            providers,
            running: Mutex::new(HashMap::new()),
            jobs: Default::default(),
            spare: Default::default(),
            changesets: Mutex::new(Default::default()),
            claims,
        })
    }

    /// Consume with `concurrency` slots until `shutdown`; running tasks finish
    /// (drain) before this returns. Cancel notices stop a job's running tasks.
    /// A task whose model call waits for its route's turn lends its slot
    /// meanwhile ([`flower_agent::slot`]): there are more loops than slots, so
    /// another task may take it, up to `RESIDENT_PER_SLOT` tasks per slot in hand.
    pub async fn run(self: Arc<Self>, concurrency: usize, shutdown: CancellationToken) {
        let mut loops = Vec::new();
        let concurrency = concurrency.max(1);
        flower_agent::metrics::metrics().worker_slots.set(concurrency as i64);
        let slots = flower_agent::slot::Slots::new(concurrency);
        for n in 0..concurrency * flower_agent::slot::RESIDENT_PER_SLOT {
            let me = self.clone();
            let stop = shutdown.clone();
            let slots = slots.clone();
            loops.push(tokio::spawn(async move { me.consume(n, slots, stop).await }));
        }
        let me = self.clone();
        let stop = shutdown.clone();
        let listener = tokio::spawn(async move { me.listen_for_cancels(stop).await });
        let lag = tokio::spawn(refresh_queue_lag(self.queue.clone(), shutdown.clone()));
        for l in loops {
            if let Err(e) = l.await {
                tracing::error!(error = %e, "worker loop ended abnormally");
            }
        }
        listener.abort();
        lag.abort();
        self.spare.drop_all().await;
    }

    /// One loop: a free slot, then a message, handled in the slot. While
    /// it waits for the message its slot is parked: a task back from a wait
    /// may take it, and the loop then takes another for the message.
    async fn consume(&self, n: usize, slots: Arc<flower_agent::slot::Slots>, shutdown: CancellationToken) {
        loop {
            let permit = tokio::select! {
                p = slots.acquire() => match p {
                    Some(p) => p,
                    None => return,
                },
                _ = shutdown.cancelled() => return,
            };
            let parked = slots.park(permit);
            let delivery = tokio::select! {
                d = self.queue.next() => d,
                _ = shutdown.cancelled() => return,
            };
            let permit = match slots.unpark(parked) {
                Some(p) => p,
                None => match slots.acquire().await {
                    Some(p) => p,
                    None => return,
                },
            };
            match delivery {
                Ok(d) => flower_agent::slot::Slot::new(slots.clone(), permit).scope(self.handle(d)).await,
                Err(BusError::Closed) => return,
                Err(e) => {
                    drop(permit);
                    tracing::warn!(loop = n, error = %e, "task queue unavailable, retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    async fn listen_for_cancels(&self, shutdown: CancellationToken) {
        let mut notices = self.journal.notifier().subscribe();
        loop {
            let heard = tokio::select! {
                h = notices.recv() => h,
                _ = shutdown.cancelled() => return,
            };
            match heard {
                Heard::Notice(Notice::Cancel { job }) => {
                    let tokens = self.lock_running().remove(&job).unwrap_or_default();
                    for (_, t) in tokens {
                        t.cancel();
                    }
                }
                Heard::Closed => return,
                _ => {}
            }
        }
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, Vec<(TaskId, CancellationToken)>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Handle one delivery from claim to ack, in a span that continues the
    /// dispatcher's trace.
    pub async fn handle(&self, delivery: Box<dyn Delivery>) {
        let msg = delivery.message();
        let span = tracing::info_span!("task", job = %msg.job_id, task = %msg.task_id, attempt = delivery.delivered(), worker = %self.opts.worker_id);
        if let Some(tp) = &msg.trace {
            flower_bus::trace::continue_trace(&span, tp);
        }
        tracing::Instrument::instrument(self.handle_in_span(delivery), span).await
    }

    async fn handle_in_span(&self, delivery: Box<dyn Delivery>) {
        let msg = delivery.message().clone();
        let attempt = msg.base_attempt + delivery.delivered();
        let over = delivery.delivered() > self.opts.max_attempts;
        let delivery: Arc<dyn Delivery> = Arc::from(delivery);
        if over && self.published_again(delivery.as_ref()).await {
            return;
        }
        // A first delivery that carries the task's words starts its first
        // model request while the claim commits (docs/design.md section 3).
        if attempt == 1
            && !over
            && msg.worker != flower_model::job::COMMAND_TASK
            && let Some(queued) = msg.queued_task()
        {
            return self.handle_early(delivery, msg, queued).await;
        }
        // The working directory is made ready while the claim commits: the
        // claim decides whether it is used, and the first model call waits
        // for neither one after the other.
        let open = async { if over { None } else { Some(self.open_attempt(&msg, attempt, Fill::Now).await) } };
        let none = EndOffer::default();
        let (claim, opened) = tokio::join!(self.claim(delivery.as_ref(), attempt, &none), open);
        let Some((task, fresh)) = self.claimed(delivery.as_ref(), claim.map(|(claim, _)| claim)).await else {
            self.discard(msg.job_id, opened).await;
            return;
        };
        let Some(opened) = opened else {
            let error = format!("gave up after {} attempts (no worker finished the task)", self.opts.max_attempts);
            let outcome = TaskOutcome::Failed { error };
            let _ = match self
                .finish(&task, attempt, outcome, Usage::default(), Batch::default(), &Default::default())
                .await
            {
                Recorded::Settled => delivery.term().await,
                Recorded::GaveUp => delivery.nak(Some(Duration::from_secs(1))).await,
            };
            return;
        };
        let cancel = CancellationToken::new();
        let running = self.started(&task, attempt, delivery.clone(), &cancel);
        let start = Start { fresh, stream_notice: msg.stream_notice };
        let (result, held) = self.execute(&task, attempt, opened, start, cancel.clone(), None).await;
        self.settle(&task, attempt, result, held, &cancel, running, delivery, &Default::default()).await;
    }
}
