//! The task consumer: take a delivery, claim its attempt in the store, run the
//! worker agent in a fresh working directory (workspace checked out, workbench
//! mounted at `.flower/`), publish the report, ack.
//!
//! The claim — not the queue — guarantees a task completes once: a stale or
//! superseded delivery is acked without running; a delivery past
//! `max_attempts` is recorded as failed without running (dead letter) —
//! unless no attempt ever claimed the task: then it is published again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use flower_agent::guards::{DelegateGuard, SpillGuard};
use flower_agent::hooks::{HookContext, Hooks, PostToolHook};
use flower_agent::provider::{ProviderSource, SystemBlock};
use flower_agent::{AgentError, AgentSession, FatalCause, Journal, Outcome, SessionConfig, ToolOutput, ToolSet};
use flower_bus::{BusError, Delivery, Heard, Notice, TaskQueue};
use flower_model::{
    Entry, EventKind, Job, JobId, JobSpec, Role, Session, Task, TaskId, TaskOutcome, Usage, WorkerSpec, now_ms,
};
use flower_store::localfs::Manifest;
use flower_store::workbench::MOUNT;
use flower_store::workspace::Workspace;
use flower_store::{Batch, Claim, ClaimRequest, EndOffer, OfferedEnd, StoreError, Workbench};
use object_store::ObjectStore;
use tokio_util::sync::CancellationToken;

use crate::sandbox::Sandbox;
use crate::tools::{ToolLimits, may_write, worker_surface};

#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Names this process in claims and events.
    pub worker_id: String,
    /// Where per-task working directories are made.
    pub work_root: PathBuf,
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
    pub fn new(worker_id: impl Into<String>, work_root: impl Into<PathBuf>) -> Self {
        Self {
            worker_id: worker_id.into(),
            work_root: work_root.into(),
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
    running: Mutex<HashMap<JobId, Vec<(flower_model::TaskId, CancellationToken)>>>,
    /// Jobs recently run here, read once: what a task uses of its job (id,
    /// spec, submission time) never changes after submit.
    jobs: Mutex<HashMap<JobId, Arc<(Job, JobSpec)>>>,
    /// Emptied working directories of finished attempts, newest last, each
    /// reused only by a later attempt of the same job (see [`Worker::open_dir`]).
    spare: Mutex<std::collections::VecDeque<(JobId, PathBuf)>>,
    /// Attempts that stored a workspace changeset, until their end is
    /// recorded: their end's notice says so (the coordinator looks for a
    /// changeset only then).
    changesets: Mutex<std::collections::HashSet<(flower_model::TaskId, u32)>>,
    /// This process's claims, written in groups ([`crate::claims`]).
    claims: Arc<crate::claims::ClaimWriter>,
}

/// Emptied working directories kept for reuse; the oldest beyond this are removed.
const SPARE_DIRS: usize = 64;

/// Jobs kept in [`Worker::jobs`]; past this the cache starts again empty.
const JOB_CACHE: usize = 256;

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
        let retryable = matches!(e, StoreError::Backend(_));
        Self { reason: if context.is_empty() { e.to_string() } else { format!("{context}: {e}") }, retryable }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self::store("", e)
    }
}

/// What a first delivery's run shares with its claim (see
/// [`Worker::handle_early`]): the gate its session waits at, the end it may
/// offer the claim, and whether the end's notice went out.
struct Early {
    gate: flower_agent::Gate,
    offer: EndOffer,
    notice: Arc<AtomicBool>,
}

/// A first delivery's claim: the task claimed (running), or claimed and
/// ended in one write with the run's offered end (the claimed row, the
/// ended row and what the write stored).
enum Taken {
    Claimed(Task, Running),
    Ended(Task, Box<(Task, flower_store::Written)>),
}

/// What became of an attempt's outcome.
enum Recorded {
    /// Written (or refused for good: superseded, cancelled, fenced); ack.
    Settled,
    /// The store stayed unreachable: give the delivery back, do not ack.
    GaveUp,
}

/// How long a first delivery's claim waits for its run to need it (see
/// [`Worker::handle_early`]): a model that answers sooner, finally, has its
/// attempt claimed and ended in one write; a slower one finds it claimed
/// (the task shows as started) long before its answer.
const CLAIM_AFTER: Duration = Duration::from_millis(20);

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

/// First and longest pause between retries of a report write.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// How long a claim that finds no task row is made again: a task's message
/// goes out with its creator's first statements, and may reach the store
/// before them (docs/design.md section 3, "A task's message, with its
/// creator's first flight"). Past this, its creator did not commit.
const UNKNOWN_FOR: Duration = Duration::from_secs(5);
/// First and longest pause between claims of a task not stored yet.
const UNKNOWN_FIRST: Duration = Duration::from_millis(1);
const UNKNOWN_MAX: Duration = Duration::from_millis(250);

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
            jobs: Mutex::new(HashMap::new()),
            spare: Mutex::new(Default::default()),
            changesets: Mutex::new(Default::default()),
            claims,
        })
    }

    /// Consume with `concurrency` loops until `shutdown`; running tasks finish
    /// (drain) before this returns. Cancel notices stop a job's running tasks.
    pub async fn run(self: Arc<Self>, concurrency: usize, shutdown: CancellationToken) {
        let mut loops = Vec::new();
        flower_agent::metrics::metrics().worker_slots.set(concurrency.max(1) as i64);
        for slot in 0..concurrency.max(1) {
            let me = self.clone();
            let stop = shutdown.clone();
            loops.push(tokio::spawn(async move { me.consume(slot, stop).await }));
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
        self.drop_spares().await;
    }

    async fn consume(&self, slot: usize, shutdown: CancellationToken) {
        loop {
            let delivery = tokio::select! {
                d = self.queue.next() => d,
                _ = shutdown.cancelled() => return,
            };
            match delivery {
                Ok(d) => self.handle(d).await,
                Err(BusError::Closed) => return,
                Err(e) => {
                    tracing::warn!(slot, error = %e, "task queue unavailable, retrying");
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

    fn lock_running(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<JobId, Vec<(flower_model::TaskId, CancellationToken)>>> {
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
        let open = async { if over { None } else { Some(self.open_attempt(&msg, attempt).await) } };
        let none = EndOffer::default();
        let (claim, opened) = tokio::join!(self.claim(delivery.as_ref(), attempt, &none), open);
        let Some((task, fresh)) = self.claimed(delivery.as_ref(), claim.map(|(claim, _)| claim)).await else {
            self.discard(msg.job_id, opened).await;
            return;
        };
        let Some(opened) = opened else {
            let error = format!("gave up after {} attempts (no worker finished the task)", self.opts.max_attempts);
            let _ = match self
                .finish(
                    &task,
                    attempt,
                    TaskOutcome::Failed { error },
                    Usage::default(),
                    Batch::default(),
                    &Default::default(),
                )
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

    /// The delivery past the limit of a task no attempt ever claimed (its
    /// deliveries were given back: a store outage outlasted their claims'
    /// retries) does not fail a task that never ran: its message is
    /// published again, with deliveries of its own, at most `max_attempts`
    /// times — as a coordinator does with a dead letter (docs/design.md
    /// section 3, "Delivery limit"). Whether it was; when the row cannot be
    /// read, the delivery goes the usual way.
    async fn published_again(&self, delivery: &dyn Delivery) -> bool {
        let msg = delivery.message();
        let Some(again) = msg.published_again(self.opts.max_attempts) else { return false };
        match self.journal.store().get_task(msg.task_id).await {
            Ok(task) if task.state == flower_model::TaskState::Queued => {}
            _ => return false,
        }
        if let Err(e) = self.queue.publish(again).await {
            tracing::warn!(task = %msg.task_id, error = %e, "task not published again; its delivery goes the usual way");
            return false;
        }
        tracing::warn!(task = %msg.task_id, deliveries = delivery.delivered(), "no attempt ever claimed the task; published again");
        let _ = delivery.term().await;
        true
    }

    /// A first delivery with the task's words: the claim, and meanwhile the
    /// attempt's directory, session and first model request. The session
    /// acts on nothing the model answers (no entry, no tool) before the claim
    /// commits; a refused claim cancels it and its answer is dropped. A job
    /// with MCP servers starts none of their programs before the claim. A
    /// first answer that was final before the claim held the task's row is
    /// offered to the claim, which then ends the task in the same write
    /// ([`Store::claim_task_ending`]); its end's notice goes out once that
    /// transaction holds the row.
    ///
    /// [`Store::claim_task_ending`]: flower_store::Store::claim_task_ending
    async fn handle_early(&self, delivery: Arc<dyn Delivery>, msg: flower_bus::TaskMessage, queued: Task) {
        let attempt = 1;
        let began = std::time::Instant::now();
        let cancel = CancellationToken::new();
        let (decided, decision) = tokio::sync::watch::channel(None::<bool>);
        let asked = Arc::new(tokio::sync::Notify::new());
        let gate = flower_agent::Gate { decision, asked: asked.clone() };
        let early = Early { gate, offer: EndOffer::default(), notice: Default::default() };
        let start = Start { fresh: true, stream_notice: msg.stream_notice };
        // The directory is opened now and filled (workspace, workbench)
        // while the claim commits: the first request needs neither.
        let opened = self.open_attempt_with(&msg, attempt, false).await;
        let filler = opened.as_ref().ok().map(|(_, dir)| dir.filler.clone());
        let programs = matches!(&opened, Ok((cached, _)) if !cached.1.mcp_servers.is_empty());
        let claim_side = async {
            // The claim is made once the run needs it (its session asks the
            // gate: a tool call, a write), once it offers its end, once it
            // is over — or after CLAIM_AFTER: a fast final answer is then
            // claimed and ended in one write.
            tokio::select! {
                _ = asked.notified() => {}
                _ = tokio::time::sleep(CLAIM_AFTER) => {}
            }
            // The directory fills while the claim commits — unless the run
            // already offered its end: a first-turn final answer ran no
            // tool, and nothing reads the directory after it.
            let fill = async {
                match &filler {
                    Some(f) if !early.offer.is_made() => f.fill().await,
                    _ => Ok(()),
                }
            };
            let (claim, filled) = tokio::join!(self.claim(delivery.as_ref(), attempt, &early.offer), fill);
            let taken = match claim {
                // Claimed and ended in one write: the run's offered end.
                Ok((Claim::Claimed { task, mut events }, Some((ended, written)))) => {
                    events.extend(written.events);
                    Some(Taken::Ended(task, Box::new((ended, flower_store::Written { events, ..written }))))
                }
                claim => self.claimed(delivery.as_ref(), claim.map(|(claim, _)| claim)).await.map(|(task, _)| {
                    let running = self.started(&task, attempt, delivery.clone(), &cancel);
                    Taken::Claimed(task, running)
                }),
            };
            if taken.is_none() {
                cancel.cancel();
            }
            let open = matches!(taken, Some(Taken::Ended(..))) || (taken.is_some() && filled.is_ok());
            let _ = decided.send(Some(open));
            (taken, filled)
        };
        let run_side = async {
            if programs && !flower_agent::gate_opens(&early.gate).await {
                return Err(opened);
            }
            // A session stopped at its gate releases its directory itself.
            let ran = self.execute(&queued, attempt, opened, start, cancel.clone(), Some(&early)).await;
            // Over without asking (a failure before any write): claim now.
            early.gate.asked.notify_one();
            Ok(ran)
        };
        match tokio::join!(claim_side, run_side) {
            ((Some(Taken::Ended(claimed, end)), _), _) => {
                let (ended, written) = *end;
                self.claimed_and_ended(&claimed, &ended, &written, &early.notice, began).await;
                let _ = delivery.ack().await;
            }
            ((Some(Taken::Claimed(task, running)), Ok(())), ran) => {
                let (result, held) = match ran {
                    Ok(ran) => ran,
                    // (Not reached: an open gate lets the session start.)
                    Err(opened) => self.execute(&task, attempt, opened, start, cancel.clone(), None).await,
                };
                self.settle(&task, attempt, result, held, &cancel, running, delivery, &early.notice).await;
            }
            // Claimed, but the directory could not be filled: given back.
            ((Some(Taken::Claimed(task, running)), Err(e)), ran) => {
                if let Err(opened) = ran {
                    self.discard(msg.job_id, Some(opened)).await;
                }
                let failed = Err((Failure::store("preparing the working directory", e), Usage::default()));
                self.settle(&task, attempt, failed, Batch::default(), &cancel, running, delivery, &Default::default())
                    .await;
            }
            // Refused: a job's programs were never started.
            ((None, _), Err(opened)) => self.discard(msg.job_id, Some(opened)).await,
            // Refused: the session stopped at its gate, before any write or
            // tool (or held its final answer), and released its directory.
            ((None, _), Ok(_)) => {}
        }
    }

    /// An attempt claimed and ended in one write: its events announced, its
    /// end's notice sent unless it went out while the write was staged.
    async fn claimed_and_ended(
        &self,
        claimed: &Task,
        ended: &Task,
        written: &flower_store::Written,
        notice: &AtomicBool,
        began: std::time::Instant,
    ) {
        let metrics = flower_agent::metrics::metrics();
        metrics.task("started");
        metrics.dispatch.observe((now_ms() - claimed.created_at).max(0) as f64 / 1000.0);
        // From the delivery: the claim and the end are one write.
        metrics.task_duration.observe(began.elapsed().as_secs_f64());
        metrics.task(if ended.state == flower_model::TaskState::Succeeded { "succeeded" } else { "failed" });
        // Only a first-turn final answer is offered to its claim: it ran
        // no tool, the workbench is as it found it.
        self.ended(ended, written, notice, true).await;
    }

    /// What the claim means for the delivery: the task and whether the claim
    /// opened its session just now (so there is no history to read) — or
    /// `None`, the delivery settled (unknown task: dropped; store error:
    /// redelivered later; ended or superseded: acked).
    async fn claimed(&self, delivery: &dyn Delivery, claim: Result<Claim, StoreError>) -> Option<(Task, bool)> {
        let task = delivery.message().task_id;
        match claim {
            Ok(Claim::Claimed { task, events }) => {
                let session = task.id.session();
                let fresh = events
                    .iter()
                    .any(|e| matches!(&e.kind, EventKind::SessionStarted { session: s, .. } if *s == session));
                self.journal.announce(&flower_store::Written { events, ..Default::default() }).await;
                Some((task, fresh))
            }
            Err(StoreError::NotFound(_)) => {
                // Still no row after its creator's transaction ended (see
                // UNKNOWN_FOR): it did not commit (a coordinator that
                // republishes uses a new id).
                tracing::warn!(%task, "delivery for an unknown task, dropped");
                let _ = delivery.term().await;
                None
            }
            Err(e) => {
                tracing::warn!(%task, error = %e, "claim failed, redelivering later");
                let _ = delivery.nak(Some(Duration::from_secs(1))).await;
                None
            }
            Ok(Claim::AlreadyFinished(_) | Claim::Superseded { .. }) => {
                // Someone else owns or finished it: this delivery is stale.
                let _ = delivery.ack().await;
                None
            }
        }
    }

    /// A claimed attempt starts running: cancellable by the job's cancel
    /// notice, heartbeats going, counted.
    fn started(&self, task: &Task, attempt: u32, delivery: Arc<dyn Delivery>, cancel: &CancellationToken) -> Running {
        self.lock_running().entry(task.job_id).or_default().push((task.id, cancel.clone()));
        let beat = self.heartbeat(delivery, task, attempt);
        let metrics = flower_agent::metrics::metrics();
        metrics.task("started");
        if attempt == 1 {
            let waited_ms = (now_ms() - task.created_at).max(0);
            metrics.dispatch.observe(waited_ms as f64 / 1000.0);
        }
        metrics.worker_slots_busy.inc();
        Running { beat, started: std::time::Instant::now() }
    }

    /// Record the attempt's end and settle its delivery; `notice`: whether
    /// the end's notice went out already.
    #[allow(clippy::too_many_arguments)]
    async fn settle(
        &self,
        task: &Task,
        attempt: u32,
        result: Result<(String, Usage), (Failure, Usage)>,
        held: Batch,
        cancel: &CancellationToken,
        running: Running,
        delivery: Arc<dyn Delivery>,
        notice: &Arc<AtomicBool>,
    ) {
        let metrics = flower_agent::metrics::metrics();
        metrics.task_duration.observe(running.started.elapsed().as_secs_f64());
        metrics.worker_slots_busy.dec();
        metrics.task(match &result {
            _ if cancel.is_cancelled() => "cancelled",
            Ok(_) => "succeeded",
            Err((f, _)) if f.retryable => "retried",
            Err(_) => "failed",
        });
        self.lock_running().entry(task.job_id).or_default().retain(|(id, _)| *id != task.id);
        // Cancelled: the store already ended the task.
        let recorded = match result {
            _ if cancel.is_cancelled() => {
                self.keep(held).await;
                Recorded::Settled
            }
            Ok((report, usage)) => {
                self.finish(task, attempt, TaskOutcome::Succeeded { report }, usage, held, notice).await
            }
            Err((f, _)) if f.retryable => {
                tracing::warn!(task = %task.id, attempt, reason = %f.reason, "attempt stopped by a transient failure; redelivering");
                // A stored answer is taken up by the next attempt without a new model call.
                self.keep(held).await;
                Recorded::GaveUp
            }
            Err((f, usage)) => {
                let outcome = TaskOutcome::Failed { error: f.reason };
                self.finish(task, attempt, outcome, usage, held, notice).await
            }
        };
        running.beat.abort();
        self.changesets.lock().unwrap_or_else(|p| p.into_inner()).remove(&(task.id, attempt));
        let _ = match recorded {
            Recorded::Settled => delivery.ack().await,
            // Not acked: the message comes back and the stored transcript resumes.
            Recorded::GaveUp => delivery.nak(Some(Duration::from_secs(1))).await,
        };
    }

    /// Claim the attempt. While the store is unreachable the claim is retried
    /// with backoff, holding the message (in-progress acks), so an outage does
    /// not use up the message's deliveries.
    /// `offer`: an end the claim may take ([`flower_store::Store::claim_task_ending`]).
    async fn claim(
        &self,
        delivery: &dyn Delivery,
        attempt: u32,
        offer: &EndOffer,
    ) -> Result<(Claim, Option<(Task, flower_store::Written)>), StoreError> {
        let msg = delivery.message();
        let task = msg.task_id;
        // An agent task's transcript session is opened with the claim, in its transaction.
        let session = (msg.worker != flower_model::job::COMMAND_TASK).then(|| Session {
            id: task.session(),
            job_id: msg.job_id,
            role: Role::Worker,
            label: msg.worker.clone(),
            task_id: Some(task),
            created_at: now_ms(),
        });
        let started = tokio::time::Instant::now();
        let give_up = started + self.opts.report_retry;
        let mut pause = RETRY_FIRST;
        let mut unknown_pause = UNKNOWN_FIRST;
        // When the message was last held: its delivery, then each in-progress ack.
        let mut held = started;
        loop {
            let request = ClaimRequest {
                task,
                attempt,
                worker_id: self.opts.worker_id.clone(),
                session: session.clone(),
                end: offer.clone(),
            };
            match self.claims.claim(request).await {
                Err(StoreError::Backend(e)) if tokio::time::Instant::now() < give_up => {
                    tracing::warn!(%task, attempt, error = %e, "claim not recorded yet; retrying");
                    self.hold(delivery, &mut held, pause).await;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
                Err(StoreError::NotFound(_)) if started.elapsed() < UNKNOWN_FOR => {
                    if unknown_pause == UNKNOWN_FIRST {
                        tracing::info!(%task, attempt, "task not stored yet; claiming it again");
                        flower_agent::metrics::metrics().claims_early.inc();
                    }
                    // Held meanwhile, as through a store outage.
                    self.hold(delivery, &mut held, unknown_pause).await;
                    tokio::time::sleep(unknown_pause).await;
                    unknown_pause = (unknown_pause * 2).min(UNKNOWN_MAX);
                }
                other => return other,
            }
        }
    }

    /// Keep a message held through a pause of its claim's retries: an
    /// in-progress ack when, by the pause's end, a heartbeat's time will have
    /// passed since it was last held (`held`), not one per retry — retries a
    /// millisecond apart would send hundreds. Between acks there is never
    /// more than a heartbeat or the pause, whichever is longer.
    async fn hold(&self, delivery: &dyn Delivery, held: &mut tokio::time::Instant, pause: Duration) {
        if held.elapsed() + pause >= self.opts.heartbeat {
            let _ = delivery.progress().await;
            *held = tokio::time::Instant::now();
        }
    }

    /// In-progress acks keep the message held; a store heartbeat tells the
    /// owning coordinator's sweeper the attempt is alive.
    fn heartbeat(&self, delivery: Arc<dyn Delivery>, task: &Task, attempt: u32) -> tokio::task::JoinHandle<()> {
        let every = self.opts.heartbeat;
        let store = self.journal.store().clone();
        let id = task.id;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = delivery.progress().await {
                    tracing::warn!(error = %e, "heartbeat not sent");
                }
                if let Err(e) = store.heartbeat_task(id, attempt).await {
                    tracing::warn!(error = %e, "heartbeat not stored");
                }
            }
        })
    }

    /// Record the attempt's outcome. A store that cannot be reached is
    /// retried with backoff while the message is held (heartbeats go on);
    /// only a definite refusal (superseded, cancelled, fenced) settles without
    /// a write; a report that can never be stored fails the task instead.
    /// The held final batch (`held`: the answer's entries, events, usage) is
    /// committed with the end, in one transaction.
    /// `notice`: whether the end's notice went out already.
    async fn finish(
        &self,
        task: &Task,
        attempt: u32,
        mut outcome: TaskOutcome,
        usage: Usage,
        mut held: Batch,
        notice: &Arc<AtomicBool>,
    ) -> Recorded {
        let store = self.journal.store();
        let give_up = tokio::time::Instant::now() + self.opts.report_retry;
        let mut pause = RETRY_FIRST;
        self.stage_notice(task, attempt, &outcome, usage, &mut held, notice, false);
        loop {
            match store.finish_task_with(task.id, attempt, outcome.clone(), usage, held.clone()).await {
                Ok((ended, written)) => {
                    self.ended(&ended, &written, notice, false).await;
                    return Recorded::Settled;
                }
                Err(StoreError::Invalid(m)) if matches!(outcome, TaskOutcome::Succeeded { .. }) || !held.is_empty() => {
                    // The answer's entries hold the same text as the report:
                    // neither can be stored, and the task fails saying why.
                    tracing::warn!(task = %task.id, attempt, error = %m, "report cannot be stored; failing the task");
                    if let TaskOutcome::Succeeded { .. } = outcome {
                        outcome = TaskOutcome::Failed { error: format!("the report could not be stored: {m}") };
                    }
                    held = Batch::default();
                    self.stage_notice(task, attempt, &outcome, usage, &mut held, notice, false);
                }
                Err(StoreError::Backend(e)) if tokio::time::Instant::now() < give_up => {
                    tracing::warn!(task = %task.id, attempt, error = %e, "report not recorded yet; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
                Err(StoreError::Backend(e)) => {
                    tracing::warn!(task = %task.id, attempt, error = %e, "report not recorded; giving the delivery back");
                    return Recorded::GaveUp;
                }
                // Superseded, cancelled or fenced meanwhile: the store refused, as it must.
                Err(e) => {
                    tracing::info!(task = %task.id, attempt, error = %e, "report refused by the store");
                    return Recorded::Settled;
                }
            }
        }
    }

    /// The end's notice, with a copy of the end, goes out as soon as the
    /// end's transaction is staged (docs/design.md section 3): the
    /// coordinator goes on while this commits, and its next write requires
    /// the end. Else (a backend that does not stage) [`Worker::ended`] sends
    /// it after the commit. `claimed`: the task as its attempt holds it;
    /// `notice`: set once the notice went out, so it goes out once;
    /// `untouched`: the attempt ran no tool (its workbench is as it was).
    #[allow(clippy::too_many_arguments)]
    fn stage_notice(
        &self,
        claimed: &Task,
        attempt: u32,
        outcome: &TaskOutcome,
        usage: Usage,
        held: &mut Batch,
        notice: &Arc<AtomicBool>,
        untouched: bool,
    ) {
        let copy = flower_store::rules::finish(claimed, attempt, outcome.clone(), usage, now_ms())
            .ok()
            .and_then(|change| self.end_copy(&change.task, false, untouched));
        held.staged = copy.map(|ended| {
            let (notifier, sent, job, id) =
                (self.journal.notifier().clone(), notice.clone(), claimed.job_id, claimed.id);
            flower_store::Staged::new(move || {
                if sent.swap(true, Ordering::SeqCst) {
                    return;
                }
                let (notifier, ended) = (notifier.clone(), Box::new(ended.clone()));
                tokio::spawn(async move {
                    let _ = notifier.notify(Notice::TaskDone { job, task: id, ended: Some(ended) }).await;
                });
            })
        });
    }

    /// A task's end is committed: its events announced, and its notice sent
    /// unless it went out while the end was staged.
    async fn ended(&self, ended: &Task, written: &flower_store::Written, notice: &AtomicBool, untouched: bool) {
        self.journal.announce(written).await;
        if !notice.swap(true, Ordering::SeqCst) {
            let copy = self.end_copy(ended, true, untouched).map(Box::new);
            let _ = self
                .journal
                .notifier()
                .notify(Notice::TaskDone { job: ended.job_id, task: ended.id, ended: copy })
                .await;
        }
    }

    /// The task's job and its parsed spec, from the cache or read once.
    async fn job(&self, id: JobId) -> Result<Arc<(Job, JobSpec)>, (Failure, Usage)> {
        let none = Usage::default();
        if let Some(hit) = self.jobs.lock().unwrap_or_else(|p| p.into_inner()).get(&id) {
            return Ok(hit.clone());
        }
        let job = self.journal.store().get_job(id).await.map_err(|e| (Failure::from(e), none))?;
        let spec = JobSpec::from_value(job.spec.clone()).map_err(|e| (Failure::fatal(e.to_string()), none))?;
        let read = Arc::new((job, spec));
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if jobs.len() >= JOB_CACHE {
            jobs.clear();
        }
        jobs.insert(id, read.clone());
        Ok(read)
    }

    /// Commit a held final batch without ending the task (best effort: a
    /// lost one only means the next attempt asks the model again).
    async fn keep(&self, held: Batch) {
        if let Err(e) = self.journal.commit(held).await {
            tracing::warn!(error = %e, "the final answer's entries not stored");
        }
    }

    /// The attempt's job (cached) and its working directory, made ready
    /// before the claim is known (see [`Worker::handle`]).
    async fn open_attempt(&self, msg: &flower_bus::TaskMessage, attempt: u32) -> Opened {
        self.open_attempt_with(msg, attempt, true).await
    }

    /// [`Worker::open_attempt`]; `filled`: with the directory filled, else
    /// only opened (the caller fills it, [`Filler::fill`]).
    async fn open_attempt_with(&self, msg: &flower_bus::TaskMessage, attempt: u32, filled: bool) -> Opened {
        let cached = self.job(msg.job_id).await?;
        let (job, spec) = (msg.job_id, &cached.1);
        let dir = if filled {
            self.open_dir(job, spec, msg.task_id, attempt).await
        } else {
            self.open_empty(job, spec, msg.task_id, attempt).await
        };
        Ok((cached, dir.map_err(|f| (f, Usage::default()))?))
    }

    /// A directory made ready for an attempt the claim refused: emptied for
    /// the job's next attempt, as after a run.
    async fn discard(&self, job: JobId, opened: Option<Opened>) {
        if let Some(Ok((_, dir))) = opened {
            self.release_dir(job, &dir).await;
        }
    }

    /// Run the worker agent for one attempt; the report, or why there is
    /// none, and the final answer's uncommitted batch (see
    /// [`AgentSession::with_held_answer`]), started as `start` says.
    async fn execute(
        &self,
        task: &Task,
        attempt: u32,
        opened: Opened,
        start: Start,
        cancel: CancellationToken,
        early: Option<&Early>,
    ) -> (Result<(String, Usage), (Failure, Usage)>, Batch) {
        match self.execute_held(task, attempt, opened, start, cancel, early).await {
            Ok((result, held)) => (result, held),
            Err(failure) => (Err(failure), Batch::default()),
        }
    }

    async fn execute_held(
        &self,
        task: &Task,
        attempt: u32,
        opened: Opened,
        start: Start,
        cancel: CancellationToken,
        early: Option<&Early>,
    ) -> Result<(Result<(String, Usage), (Failure, Usage)>, Batch), (Failure, Usage)> {
        let none = Usage::default();
        let (cached, dir) = opened?;
        let (job, spec) = &*cached;
        if task.worker == flower_model::job::COMMAND_TASK {
            return Ok((self.run_command(task, attempt, &dir, cancel).await, Batch::default()));
        }
        let mut run = self.build_session(task, job, spec, &dir, start.fresh, cancel).await.map_err(|f| (f, none))?;
        // Only a shape's first child is waited for by staggered siblings:
        // the other tasks send no notice of their stream.
        if start.stream_notice {
            run.agent = run.agent.with_observer(self.first_stream_observer(task));
        }
        if let Some(early) = early {
            run.agent = run.agent.with_gate(early.gate.clone());
        }
        let outcome = run.agent.run(run.history, run.input).await;
        let held = run.agent.take_held().unwrap_or_default();
        run.mcp.close().await;
        // An answer on the first turn ran no tool: the directory is as checked out.
        let untouched = matches!(outcome, Ok(Outcome::Answered { turns: 1, .. })) && spec.mcp_servers.is_empty();
        let refused = match early {
            Some(early) => {
                // Final before the claim decided: offered to the claim, to
                // end the task in its write.
                if untouched
                    && early.gate.decision.borrow().is_none()
                    && let Ok(Outcome::Answered { text, usage, .. }) = &outcome
                {
                    let outcome = TaskOutcome::Succeeded { report: text.clone() };
                    let mut batch = held.clone();
                    if let flower_store::rules::ClaimDecision::Take(claim) =
                        flower_store::rules::claim(task, attempt, &self.opts.worker_id, now_ms())
                    {
                        self.stage_notice(&claim.task, attempt, &outcome, *usage, &mut batch, &early.notice, true);
                    }
                    let _ = early.offer.offer(OfferedEnd { outcome, usage: *usage, batch });
                }
                // Asking the gate starts the claim (it takes the offer). The
                // directory fills beside the claim; the decision comes after
                // both. A session its claim refused acted on nothing:
                // nothing to keep.
                !flower_agent::gate_opens(&early.gate).await
            }
            None => false,
        };
        let kept = if refused || untouched {
            self.release_dir(task.job_id, &dir).await;
            Ok(())
        } else {
            // Whatever happened, what the task wrote is kept.
            self.close_dir(task, attempt, &dir).await
        };
        Ok((report(task, outcome, kept), held))
    }

    /// A fresh working directory for the attempt (the workspace checked out,
    /// the workbench mounted at `.flower/`) and the limits its tools apply.
    ///
    /// Creating and removing a directory tree per task costs more than all
    /// of a short task's other work on ext4 (directory inodes are placed by
    /// scanning past every recently freed one), so a finished attempt's
    /// directory is emptied down to its `.flower/` folders and reused by the
    /// next attempt of the same job — never another job's: a job's tasks
    /// already share its workbench and workspace, jobs share nothing.
    async fn open_dir(&self, job: JobId, spec: &JobSpec, task: TaskId, attempt: u32) -> Result<TaskDir, Failure> {
        let dir = self.open_empty(job, spec, task, attempt).await?;
        dir.filler.fill().await.map_err(|e| Failure::store("preparing the working directory", e))?;
        Ok(dir)
    }

    /// [`Worker::open_dir`] before its filling: the directory exists and is
    /// opened, its workspace and workbench not there yet ([`Filler::fill`]).
    async fn open_empty(&self, job: JobId, spec: &JobSpec, task: TaskId, attempt: u32) -> Result<TaskDir, Failure> {
        let reused = if self.opts.keep_workdirs { None } else { self.take_spare(job) };
        let path = match &reused {
            Some(path) => path.clone(),
            None => self.opts.work_root.join(job.to_string()).join(format!("{task}-{attempt}")),
        };
        if reused.is_none() {
            self.make_dir(&path).await.map_err(|e| Failure::store("preparing the working directory", e))?;
        }
        let sandbox =
            Sandbox::open(&path).map_err(|e| Failure::fatal(format!("opening the working directory: {e}")))?;
        let isolation = crate::isolation::installed();
        let group = isolation.launcher().and_then(|l| l.task_group(&format!("{task}-{attempt}")));
        let egress = match (isolation.launcher(), spec.network.egress.is_empty()) {
            (Some(l), false) if l.network == crate::isolation::NetworkPolicy::None => {
                if !l.egress_possible() {
                    return Err(Failure::fatal(
                        "network.egress: this worker cannot give tools a network of their own (no network namespace), so it grants no egress",
                    ));
                }
                Some(Arc::new(self.egress_proxy(spec, &path)?))
            }
            _ => None,
        };
        let limits = ToolLimits {
            bash_timeout: spec.runtime.bash_timeout,
            bash_output_limit: spec.runtime.bash_output_limit.as_u64() as usize,
            isolation,
            group,
            max_file_size: Some(spec.runtime.workspace_limit.as_u64()),
            egress,
        };
        let workbench = Workbench::new(self.objects.clone(), job);
        let sync = Arc::new(WorkbenchSync {
            workbench: workbench.clone(),
            mount: path.join(MOUNT),
            base: tokio::sync::Mutex::new(Manifest::new()),
        });
        let filler = Filler {
            path: path.clone(),
            workspace: Workspace::new(self.objects.clone(), job),
            base: Default::default(),
            workbench,
            sync,
            filled: Default::default(),
            room: crate::taskdir::bounded().then(|| spec.runtime.workspace_limit.as_u64()),
        };
        Ok(TaskDir { path, sandbox, limits, filler })
    }

    /// The task's egress proxy for the destinations its job was granted,
    /// each checked again against this worker's policy.
    fn egress_proxy(&self, spec: &JobSpec, dir: &Path) -> Result<crate::egress::EgressProxy, Failure> {
        let policy = crate::isolation::policy();
        let mut grants = Vec::new();
        for (i, d) in spec.network.egress.iter().enumerate() {
            let allow = policy.egress_allowed(d).ok_or_else(|| {
                Failure::fatal(format!(
                    "refused by this worker's policy: network.egress[{i}]: `{d}` is not a destination it lets tools reach"
                ))
            })?;
            grants.push(crate::egress::Grant { destination: d.clone(), address: allow.is_address() });
        }
        crate::egress::EgressProxy::start(dir, grants)
            .map_err(|e| Failure::fatal(format!("starting the task's egress proxy: {e}")))
    }

    /// The worker agent of this attempt: its tools (MCP servers connected),
    /// guards and hooks, prompt and budget, and its history.
    async fn build_session(
        &self,
        task: &Task,
        job: &Job,
        spec: &JobSpec,
        dir: &TaskDir,
        fresh: bool,
        cancel: CancellationToken,
    ) -> Result<WorkerRun, Failure> {
        let Some(wspec) = spec.workers.get(&task.worker) else {
            return Err(Failure::fatal(format!("this job has no worker named `{}`", task.worker)));
        };
        let provider = self
            .providers
            .for_job(job.id, spec, spec.worker_route(wspec))
            .map_err(|e| Failure::fatal(e.to_string()))?;
        let (mcp_tools, mcp) = if spec.mcp_servers.is_empty() {
            (Vec::new(), crate::mcp::McpClients::default())
        } else {
            crate::mcp::connect(&spec.mcp_servers, &dir.path, &dir.limits).await.map_err(Failure::fatal)?
        };
        let tools = Arc::new(worker_surface(spec, &dir.sandbox, &dir.limits, mcp_tools));
        let hooks = worker_hooks(task, spec, wspec, dir);
        let history = if fresh { Vec::new() } else { self.load_history(task, spec, &dir.path).await? };
        let input = history.is_empty().then(|| vec![flower_model::ContentBlock::text(task.mandate.clone())]);
        let config = session_config(task, spec, wspec, &tools);
        let limits = flower_agent::limits::JobLimits::new(
            self.journal.store().clone(),
            job.id,
            &spec.runtime.budget,
            &spec.model,
            job.created_at,
        );
        let agent = AgentSession::new(config, provider, tools, hooks, self.journal.clone(), cancel)
            .with_held_answer()
            .with_limits(limits)
            .with_windows(self.opts.windows.clone());
        Ok(WorkerRun { agent, history, input, mcp })
    }

    /// The subagent's session row, and its stored history through the pruning
    /// loader (a redelivered task resumes it); trimmed bodies are written
    /// under the mounted workbench, where the agent's `Read` finds them.
    async fn load_history(&self, task: &Task, spec: &JobSpec, workdir: &Path) -> Result<Vec<Entry>, Failure> {
        let store = self.journal.store();
        // The session row was registered with the claim.
        let session = task.id.session();
        let stored = store.entries(session, 0, u32::MAX).await?;
        let resumed = !stored.is_empty();
        let pruned = flower_store::prune::prune(stored, &spec.runtime.pruning, &flower_agent::glance::allows);
        if resumed {
            // A resume (a redelivered task): its stored transcript was pruned.
            flower_agent::metrics::metrics().prunes.inc();
        }
        for t in &pruned.trims {
            let local = workdir.join(MOUNT).join(&t.path);
            if let Some(parent) = local.parent() {
                let _ = tokio::fs::create_dir_all(parent).await;
            }
            let _ = tokio::fs::write(&local, &t.text).await;
        }
        Ok(pruned.entries)
    }

    /// The first streamed event of this task's first model call releases
    /// staggered siblings of its shape (a notice: they may be anywhere).
    fn first_stream_observer(&self, task: &Task) -> flower_agent::provider::Observer {
        let first = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (notifier, job_id, task_id) = (self.journal.notifier().clone(), task.job_id, task.id);
        Arc::new(move |ev| {
            if matches!(ev, flower_agent::provider::StreamEvent::Started)
                && !first.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                let notifier = notifier.clone();
                tokio::spawn(async move {
                    let _ = notifier.notify(Notice::TaskStreaming { job: job_id, task: task_id }).await;
                });
            }
        })
    }

    /// A tool-only task: the coordinator's command, run here with no model call.
    async fn run_command(
        &self,
        task: &Task,
        attempt: u32,
        dir: &TaskDir,
        cancel: CancellationToken,
    ) -> Result<(String, Usage), (Failure, Usage)> {
        let none = Usage::default();
        let bash = crate::tools::bash::BashTool::new(dir.sandbox.clone(), &dir.limits);
        let ctx = flower_agent::ToolContext {
            job_id: task.job_id,
            session_id: task.parent_session,
            role: Role::Worker,
            tool_use_id: task.tool_use_id.clone(),
            cancel,
        };
        let result = flower_agent::Tool::call(&bash, serde_json::json!({"command": task.mandate}), &ctx).await;
        let kept = self.close_dir(task, attempt, dir).await;
        kept.map_err(|e| (Failure::store("the command's changes could not be saved", e), none))?;
        match result {
            Ok(out) => {
                let text = flower_model::content::result_text(&out.content);
                if out.is_error { Err((Failure::fatal(text), none)) } else { Ok((text, none)) }
            }
            Err(e) => Err((Failure::fatal(e.to_string()), none)),
        }
    }

    /// Check the workspace out into `workdir` and mount the workbench there;
    /// A new directory for an attempt, replacing what an earlier try left.
    async fn make_dir(&self, workdir: &Path) -> Result<(), StoreError> {
        let dir = workdir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            crate::taskdir::remove(&dir)?;
            std::fs::create_dir_all(&dir)?;
            if crate::taskdir::bounded() {
                crate::taskdir::mount_at(&dir)?;
            }
            Ok::<_, std::io::Error>(())
        })
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))?
        .map_err(|e| StoreError::Backend(format!("{}: {e}", workdir.display())))
    }

    /// Keep what the attempt wrote (see [`Worker::collect`]), then remove its
    /// directory unless directories are kept for debugging.
    async fn close_dir(&self, task: &Task, attempt: u32, dir: &TaskDir) -> Result<(), StoreError> {
        let kept = self.collect(task, attempt, dir).await;
        self.release_dir(task.job_id, dir).await;
        kept
    }

    /// Empty a finished attempt's directory for the job's next attempt, or
    /// remove it when it cannot be reused (unless directories are kept). A
    /// directory never filled is as it was taken: reused as it is.
    async fn release_dir(&self, job: JobId, dir: &TaskDir) {
        if self.opts.keep_workdirs {
            return;
        }
        if !dir.filler.filled.load(Ordering::Acquire) {
            return self.put_spare(job, dir.path.clone()).await;
        }
        let path = dir.path.clone();
        let emptied = tokio::task::spawn_blocking(move || empty_for_reuse(&path).map(|()| path)).await;
        match emptied {
            Ok(Ok(path)) => self.put_spare(job, path).await,
            _ => remove_dir(dir.path.clone()).await,
        }
    }

    fn take_spare(&self, job: JobId) -> Option<PathBuf> {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        let at = spare.iter().rposition(|(j, _)| *j == job)?;
        spare.remove(at).map(|(_, path)| path)
    }

    async fn put_spare(&self, job: JobId, path: PathBuf) {
        let evicted = {
            let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
            spare.push_back((job, path));
            if spare.len() > SPARE_DIRS { spare.pop_front() } else { None }
        };
        if let Some((_, old)) = evicted {
            remove_dir(old).await;
        }
    }

    /// Remove the emptied directories kept for reuse (at shutdown).
    async fn drop_spares(&self) {
        let spare: Vec<(JobId, PathBuf)> = self.spare.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for (_, path) in spare {
            remove_dir(path).await;
        }
    }

    /// Final workbench sync, and the workspace changeset for the job's owner.
    async fn collect(&self, task: &Task, attempt: u32, dir: &TaskDir) -> Result<(), StoreError> {
        let f = &dir.filler;
        f.sync.sync().await?;
        let cs = f.workspace.diff(&f.base(), &dir.path, dir.limits.max_file_size.unwrap_or(u64::MAX)).await?;
        if !cs.is_empty() {
            f.workspace.put_changeset(task.id, attempt, &cs).await?;
            self.changesets.lock().unwrap_or_else(|p| p.into_inner()).insert((task.id, attempt));
        }
        Ok(())
    }

    /// The copy of an attempt's end its notice carries (see
    /// [`flower_bus::TaskEnded`]); `untouched`: the attempt ran no tool.
    fn end_copy(&self, ended: &Task, committed: bool, untouched: bool) -> Option<flower_bus::TaskEnded> {
        let changeset = self.left_changeset(ended.id, ended.attempt);
        flower_bus::TaskEnded::of(ended, committed, changeset)
            .map(|copy| flower_bus::TaskEnded { workbench_untouched: untouched, ..copy })
    }

    /// Whether this attempt stored a workspace changeset ([`Worker::collect`]).
    fn left_changeset(&self, task: flower_model::TaskId, attempt: u32) -> bool {
        self.changesets.lock().unwrap_or_else(|p| p.into_inner()).contains(&(task, attempt))
    }
}

/// Remove a task folder (its tmpfs first), logging what could not be.
async fn remove_dir(path: PathBuf) {
    let at = path.clone();
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || crate::taskdir::remove(&at)).await {
        tracing::warn!(dir = %path.display(), error = %e, "a task folder could not be removed");
    }
}

/// Empty a finished attempt's directory down to its `.flower/` folders, for
/// the next attempt of its job: every other entry is removed (links are
/// removed, never followed), and the kept folders get the directory's own
/// permissions back. An error means the directory is not fit for reuse.
fn empty_for_reuse(dir: &Path) -> std::io::Result<()> {
    fn remove(entry: &std::fs::DirEntry) -> std::io::Result<()> {
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())
        } else {
            std::fs::remove_file(entry.path())
        }
    }
    // The permissions the worker gave the job's folder: a task may have
    // changed its own directory's.
    let parent = dir.parent().ok_or_else(|| std::io::Error::other("a working directory has a parent"))?;
    let mode = std::fs::symlink_metadata(parent)?.permissions();
    let mut kept = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() != MOUNT || !entry.file_type()?.is_dir() {
            remove(&entry)?;
            continue;
        }
        for inner in std::fs::read_dir(entry.path())? {
            let inner = inner?;
            let folder = flower_store::workbench::FOLDERS.iter().any(|f| inner.file_name() == *f);
            if !folder || !inner.file_type()?.is_dir() {
                remove(&inner)?;
                continue;
            }
            for leaf in std::fs::read_dir(inner.path())? {
                remove(&leaf?)?;
            }
            kept.push(inner.path());
        }
        kept.push(entry.path());
    }
    kept.push(dir.to_path_buf());
    for path in kept {
        std::fs::set_permissions(path, mode.clone())?;
    }
    Ok(())
}

/// An attempt's working directory and what its tools and final sync need.
struct TaskDir {
    path: PathBuf,
    sandbox: Sandbox,
    limits: ToolLimits,
    /// What fills the directory (see [`Filler`]).
    filler: Filler,
}

/// What fills an opened directory: the workspace checked out, the workbench
/// materialised at `.flower/`, and the manifests they are later compared to.
#[derive(Clone)]
struct Filler {
    path: PathBuf,
    workspace: Workspace,
    /// The workspace as checked out, to diff the attempt's changes against.
    base: Arc<std::sync::Mutex<Manifest>>,
    workbench: Workbench,
    sync: Arc<WorkbenchSync>,
    /// Whether filling began: a directory never filled was not written.
    filled: Arc<AtomicBool>,
    /// What tools may add to a bounded (tmpfs) folder once it is filled.
    room: Option<u64>,
}

impl Filler {
    async fn fill(&self) -> Result<(), StoreError> {
        self.filled.store(true, Ordering::Release);
        let base = self.workspace.load().await?;
        self.workspace.checkout(&base, &self.path).await?;
        *self.base.lock().unwrap_or_else(|p| p.into_inner()) = base;
        let wb_base = self.workbench.materialize(&self.path.join(MOUNT)).await?;
        *self.sync.base.lock().await = wb_base;
        if let Some(room) = self.room {
            let path = self.path.clone();
            tokio::task::spawn_blocking(move || crate::taskdir::resize(&path, room))
                .await
                .map_err(|e| StoreError::Backend(e.to_string()))?
                .map_err(|e| StoreError::Backend(format!("bounding {}: {e}", self.path.display())))?;
        }
        Ok(())
    }

    fn base(&self) -> Manifest {
        self.base.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// An attempt's job and working directory, or why they could not be had.
type Opened = Result<(Arc<(Job, JobSpec)>, TaskDir), (Failure, Usage)>;

/// An attempt's heartbeat and start, while it runs.
struct Running {
    beat: tokio::task::JoinHandle<()>,
    started: std::time::Instant,
}

/// How an attempt's run starts: `fresh`, the claim opened the task's
/// session (no stored history to take up); `stream_notice`, its message
/// asks for the first model response's stream to be announced (the first
/// child of a staggered shape, [`flower_bus::TaskMessage::stream_notice`]).
#[derive(Clone, Copy)]
struct Start {
    fresh: bool,
    stream_notice: bool,
}

/// A built worker agent, what it starts from, and the MCP servers to close after it.
struct WorkerRun {
    agent: AgentSession,
    history: Vec<Entry>,
    input: Option<Vec<flower_model::ContentBlock>>,
    mcp: crate::mcp::McpClients,
}

/// The guards and hooks of a worker's session.
fn worker_hooks(task: &Task, spec: &JobSpec, wspec: &WorkerSpec, dir: &TaskDir) -> Hooks {
    let spill = Arc::new(SpillGuard {
        threshold: spec.spill_threshold(),
        workbench: dir.filler.workbench.clone(),
        mirror: Some(dir.path.join(MOUNT)),
    });
    // The same guards as the coordinator's: a subagent is never denied.
    let guard = Arc::new(DelegateGuard { glance: spec.runtime.glance });
    let own = Arc::new(crate::tools::WorkerToolsGuard::new(&task.worker, &wspec.tools));
    Hooks { pre: vec![guard, own], post: vec![spill, dir.filler.sync.clone()], turn: vec![] }
}

/// Who the worker's session is and what bounds it.
fn session_config(task: &Task, spec: &JobSpec, wspec: &WorkerSpec, tools: &ToolSet) -> SessionConfig {
    SessionConfig {
        job_id: task.job_id,
        session_id: task.id.session(),
        role: Role::Worker,
        main_thread: false,
        model: spec.worker_model(wspec),
        system: crate::prompts::system_prompt(&task.worker, wspec, spec.runtime.workbench)
            .into_iter()
            .chain(flower_agent::surface::index_text(tools))
            .map(SystemBlock::text)
            .collect(),
        max_turns: spec.runtime.worker_max_turns,
        max_tokens: spec.runtime.max_output_tokens,
        cache: spec.runtime.prompt_cache,
        prune_uneventful: spec.runtime.pruning.uneventful,
    }
}

/// What the agent's outcome means for the task: its report, or why there is
/// none. `kept` is whether the task's changes were saved.
fn report(
    task: &Task,
    outcome: Result<Outcome, AgentError>,
    kept: Result<(), StoreError>,
) -> Result<(String, Usage), (Failure, Usage)> {
    let none = Usage::default();
    match outcome {
        Ok(Outcome::Answered { text, usage, .. }) => match kept {
            Ok(()) => Ok((text, usage)),
            Err(e) => Err((Failure::store("the task's changes could not be saved", e), usage)),
        },
        Ok(Outcome::TurnLimit { turns, usage }) => {
            let reason = format!("worker `{}` reached its turn limit ({turns}) without a report", task.worker);
            Err((Failure::fatal(reason), usage))
        }
        Ok(Outcome::Cancelled { usage, .. }) => Err((Failure::fatal("cancelled"), usage)),
        Ok(Outcome::Handoff { usage, .. }) => Err((Failure::fatal("the worker's context is full"), usage)),
        Ok(Outcome::Budget { reason, usage, .. }) => {
            Err((Failure::fatal(format!("the job's budget is spent: {reason}")), usage))
        }
        // The transcript could not be stored: the next delivery resumes it.
        Err(AgentError::Store(e)) => Err((Failure::store("transcript store", e), none)),
        // A tool's store error is judged as the transcript's: an unreachable
        // store is retried on redelivery, a refusal (fenced) is not.
        Err(AgentError::Tool { tool, cause: FatalCause::Store(e) }) => Err((Failure::store(&tool, e), none)),
        Err(e) => Err((Failure::fatal(e.to_string()), none)),
    }
}

/// Post-tool hook: after any call that may write, push workbench changes to
/// object storage so the coordinator and other tasks see them at once.
struct WorkbenchSync {
    workbench: Workbench,
    mount: PathBuf,
    base: tokio::sync::Mutex<Manifest>,
}

impl WorkbenchSync {
    async fn sync(&self) -> Result<(), StoreError> {
        let mut base = self.base.lock().await;
        self.workbench.sync(&self.mount, &mut base).await.map(|_| ())
    }
}

#[async_trait]
impl PostToolHook for WorkbenchSync {
    async fn after(&self, tool: &str, input: &serde_json::Value, _output: &mut ToolOutput, _ctx: &HookContext) {
        if !may_write(tool) {
            return;
        }
        if let Err(e) = self.sync().await {
            tracing::warn!(error = %e, "workbench sync failed; retried after the next write");
            return;
        }
        // A Write/Edit that landed in the workbench refreshes its index.
        let path = input.get("file_path").and_then(|p| p.as_str()).unwrap_or_default();
        if matches!(tool, "Write" | "Edit") && path.trim_start_matches("./").starts_with(".flower/") {
            match self.workbench.refresh_index().await {
                Ok((index, true)) => {
                    let _ = tokio::fs::write(self.mount.join(flower_store::workbench::INDEX), index).await;
                    let _ = self.sync().await;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "workbench index not refreshed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_reused_directory_keeps_only_its_workbench_folders() {
        let root = tempfile::tempdir().unwrap();
        let outside = root.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep.txt"), "x").unwrap();
        let dir = root.path().join("job").join("task-1");
        std::fs::create_dir_all(dir.join("src/deep")).unwrap();
        std::fs::write(dir.join("src/deep/a.rs"), "a").unwrap();
        std::fs::write(dir.join(".hidden"), "h").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        for f in flower_store::workbench::FOLDERS {
            std::fs::create_dir_all(dir.join(MOUNT).join(f)).unwrap();
        }
        std::fs::write(dir.join(MOUNT).join("scripts/run.sh"), "s").unwrap();
        std::fs::create_dir_all(dir.join(MOUNT).join("notes/sub")).unwrap();
        std::fs::write(dir.join(MOUNT).join("INDEX.md"), "i").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join(MOUNT).join("spill/out")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join(MOUNT).join("artifacts"), std::fs::Permissions::from_mode(0o500)).unwrap();

        empty_for_reuse(&dir).unwrap();

        let mut left: Vec<String> = walk(&dir);
        left.sort();
        let mut want: Vec<String> = flower_store::workbench::FOLDERS.iter().map(|f| format!("{MOUNT}/{f}")).collect();
        want.push(MOUNT.to_string());
        want.sort();
        assert_eq!(left, want);
        assert!(outside.join("keep.txt").exists(), "links are removed, not followed");
        let parent = std::fs::metadata(dir.parent().unwrap()).unwrap().permissions().mode();
        let artifacts = std::fs::metadata(dir.join(MOUNT).join("artifacts")).unwrap().permissions().mode();
        assert_eq!(artifacts, parent, "a folder's permissions are given back");
    }

    fn walk(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let rel = e.file_name().to_string_lossy().to_string();
            if e.file_type().unwrap().is_dir() {
                out.extend(walk(&e.path()).into_iter().map(|r| format!("{rel}/{r}")));
            }
            out.push(rel);
        }
        out
    }
}
