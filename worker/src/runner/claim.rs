//! Taking an attempt: its claim in the store (retried with backoff while the
//! store is unreachable or the task not stored yet, the message held
//! meanwhile), what the claim means for the delivery, the attempt's start
//! (heartbeats, counted, cancellable), and a delivery past the limit of a
//! task no attempt ever claimed (published again).

use std::sync::Arc;
use std::time::Duration;

use flower_bus::Delivery;
use flower_model::{EventKind, Role, Session, Task, now_ms};
use flower_store::{Claim, ClaimRequest, EndOffer, StoreError};
use tokio_util::sync::CancellationToken;

use super::{RETRY_FIRST, RETRY_MAX, Worker};

/// How long a claim that finds no task row is made again: a task's message
/// goes out with its creator's first statements, and may reach the store
/// before them (docs/design.md section 3, "A task's message, with its
/// creator's first flight"). Past this, its creator did not commit.
const UNKNOWN_FOR: Duration = Duration::from_secs(5);
/// First and longest pause between claims of a task not stored yet.
const UNKNOWN_FIRST: Duration = Duration::from_millis(1);
const UNKNOWN_MAX: Duration = Duration::from_millis(250);

/// What a claim returns: the claim, and the ended task (with what the write
/// stored) when it took the end offered to it.
pub(super) type Claimed = (Claim, Option<(Task, flower_store::Written)>);

/// An attempt's heartbeat and start, while it runs.
pub(super) struct Running {
    pub(super) beat: tokio::task::JoinHandle<()>,
    pub(super) started: std::time::Instant,
    /// The job's namespace, as its start was counted (its end is counted the same).
    pub(super) namespace: String,
}

impl Worker {
    /// The delivery past the limit of a task no attempt ever claimed (its
    /// deliveries were given back: a store outage outlasted their claims'
    /// retries) does not fail a task that never ran: its message is
    /// published again, with deliveries of its own, at most `max_attempts`
    /// times — as a coordinator does with a dead letter (docs/design.md
    /// section 3, "Delivery limit"). Whether it was; when the row cannot be
    /// read, the delivery goes the usual way.
    pub(super) async fn published_again(&self, delivery: &dyn Delivery) -> bool {
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

    /// What the claim means for the delivery: the task and whether the claim
    /// opened its session just now (so there is no history to read) — or
    /// `None`, the delivery settled (unknown task: dropped; store error:
    /// redelivered later; ended or superseded: acked).
    pub(super) async fn claimed(
        &self,
        delivery: &dyn Delivery,
        claim: Result<Claim, StoreError>,
    ) -> Option<(Task, bool)> {
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
    pub(super) fn started(
        &self,
        task: &Task,
        attempt: u32,
        delivery: Arc<dyn Delivery>,
        cancel: &CancellationToken,
    ) -> Running {
        self.lock_running().entry(task.job_id).or_default().push((task.id, cancel.clone()));
        let beat = self.heartbeat(delivery, task, attempt);
        let metrics = flower_agent::metrics::metrics();
        let namespace = self.namespace_of(task.job_id);
        metrics.task(&namespace, "started");
        if attempt == 1 {
            let waited_ms = (now_ms() - task.created_at).max(0);
            metrics.dispatch.observe(waited_ms as f64 / 1000.0);
        }
        metrics.worker_slots_busy.inc();
        Running { beat, started: std::time::Instant::now(), namespace }
    }

    /// Claim the attempt. While the store is unreachable the claim is retried
    /// with backoff, holding the message (in-progress acks), so an outage does
    /// not use up the message's deliveries.
    /// `offer`: an end the claim may take ([`flower_store::Store::claim_task_ending`]).
    pub(super) async fn claim(
        &self,
        delivery: &dyn Delivery,
        attempt: u32,
        offer: &EndOffer,
    ) -> Result<Claimed, StoreError> {
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
                Err(StoreError::Backend { message: e, .. }) if tokio::time::Instant::now() < give_up => {
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
}
