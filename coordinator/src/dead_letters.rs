//! Dead letters: task messages the queue gave up on (docs/design.md section
//! 3, "Delivery limit"). A worker settles a message's last delivery itself
//! — it records the failure without running the task — unless it cannot:
//! it died holding that delivery, or the store stayed unreachable for as
//! long as it retried the claim. Then the queue drops the message, and every
//! coordinator replica may take the dead letter:
//!
//! - a task still *queued* never ran (no claim ever committed): its message
//!   is published again, as a new message with deliveries of its own, at
//!   most `max_attempts` times; after that its task fails, naming why;
//! - a *running* task is its owner's sweeper's (an attempt gone silent is
//!   requeued or failed there); an ended task, or one whose row never
//!   committed, needs nothing.
//!
//! A dead letter is settled (its message deleted from the queue) once
//! handled, and offered again while the store cannot be reached.

use std::sync::Arc;
use std::time::Duration;

use flower_agent::Journal;
use flower_bus::{BusError, DeadLetter, Notice, TaskQueue};
use flower_model::{TaskOutcome, TaskState};
use flower_store::{Claim, StoreError, Written};
use tokio_util::sync::CancellationToken;

/// The name a dead letter's failure is claimed under.
const CLAIMANT: &str = "dead-letters";
/// Pause before a dead letter is offered again (store or queue unreachable).
const RETRY: Duration = Duration::from_secs(1);

/// What became of a dead letter's task.
#[derive(Debug, PartialEq)]
pub enum Handled {
    /// Nothing to do: no message, no row, or the task is running or ended.
    Nothing,
    /// Published again, as its `n`th republish.
    Republished(u32),
    /// Failed: its messages were given up on too often.
    Failed,
}

/// Take dead letters until `shutdown`.
pub async fn run(queue: Arc<dyn TaskQueue>, journal: Journal, max_attempts: u32, shutdown: CancellationToken) {
    loop {
        let dead = tokio::select! {
            dead = queue.dead_letter() => dead,
            _ = shutdown.cancelled() => return,
        };
        let dead = match dead {
            Ok(dead) => dead,
            Err(BusError::Closed) => return,
            Err(e) => {
                tracing::warn!(error = %e, "dead letters not readable; trying again");
                tokio::select! {
                    _ = tokio::time::sleep(RETRY) => continue,
                    _ = shutdown.cancelled() => return,
                }
            }
        };
        match handle(dead.as_ref(), queue.as_ref(), &journal, max_attempts).await {
            Ok(handled) => {
                let outcome = match handled {
                    Handled::Nothing => "none",
                    Handled::Republished(_) => "republished",
                    Handled::Failed => "failed",
                };
                let label = flower_agent::metrics::OutcomeLabel { outcome };
                flower_agent::metrics::metrics().dead_letters.get_or_create(&label).inc();
                if let Err(e) = dead.settle().await {
                    tracing::warn!(error = %e, "dead letter handled but not settled; it comes again");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "dead letter not handled yet; offered again");
                let _ = dead.retry(RETRY).await;
            }
        }
    }
}

/// Why a dead letter could not be handled now.
#[derive(Debug, thiserror::Error)]
pub enum NotYet {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] BusError),
}

/// Handle one dead letter (see the module's documentation).
pub async fn handle(
    dead: &dyn DeadLetter,
    queue: &dyn TaskQueue,
    journal: &Journal,
    max_attempts: u32,
) -> Result<Handled, NotYet> {
    let Some(msg) = dead.message() else { return Ok(Handled::Nothing) };
    let store = journal.store();
    let task = match store.get_task(msg.task_id).await {
        Ok(task) => task,
        // Its creator's transaction never committed: nothing was queued.
        Err(StoreError::NotFound(_)) => return Ok(Handled::Nothing),
        Err(e) => return Err(e.into()),
    };
    if task.state != TaskState::Queued {
        return Ok(Handled::Nothing);
    }
    let deliveries = dead.deliveries();
    if let Some(again) = msg.published_again(max_attempts) {
        let n = again.republish;
        queue.publish(again).await?;
        tracing::warn!(task = %task.id, deliveries, republish = n, "no worker claimed the task before its message was given up on; published again");
        return Ok(Handled::Republished(n));
    }
    // As a worker records a last delivery's failure: claimed past every
    // attempt the message could have made, then failed.
    let attempt = (msg.base_attempt + deliveries).max(task.attempt + 1);
    let Claim::Claimed { events, .. } = store.claim_task(task.id, attempt, CLAIMANT).await? else {
        return Ok(Handled::Nothing);
    };
    journal.announce(&Written { events, ..Default::default() }).await;
    let error = format!(
        "no worker claimed the task: the queue gave up on its message {} times ({deliveries} deliveries the last time)",
        msg.republish + 1
    );
    let outcome = TaskOutcome::Failed { error };
    let (ended, written) = match store.finish_task(task.id, attempt, outcome, Default::default()).await {
        Ok(done) => done,
        // Another replica took the same dead letter and got there first.
        Err(StoreError::AlreadyFinished { .. } | StoreError::Superseded { .. }) => return Ok(Handled::Nothing),
        Err(e) => return Err(e.into()),
    };
    journal.announce(&written).await;
    let _ = journal.notifier().notify(Notice::TaskDone { job: ended.job_id, task: ended.id, ended: None }).await;
    tracing::warn!(task = %task.id, deliveries, "task failed: its message was given up on too often");
    Ok(Handled::Failed)
}
