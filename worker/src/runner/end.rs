//! An attempt's end: its outcome recorded (retried while the store is
//! unreachable, the final answer's held batch committed with it), its
//! notice sent once — as soon as the end's transaction is staged, else
//! after the commit — and its delivery settled (acked, or given back).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flower_bus::{Delivery, Notice};
use flower_model::{Task, TaskId, TaskOutcome, Usage, now_ms};
use flower_store::{Batch, StoreError};
use tokio_util::sync::CancellationToken;

use super::claim::Running;
use super::{RETRY_FIRST, RETRY_MAX, Reported, Worker};

/// What became of an attempt's outcome.
pub(super) enum Recorded {
    /// Written (or refused for good: superseded, cancelled, fenced); ack.
    Settled,
    /// The store stayed unreachable: give the delivery back, do not ack.
    GaveUp,
}

/// What an attempt did to its workbench, as its end's notice tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Workbench {
    /// The attempt ran no tool: its workbench is as it found it.
    Untouched,
    /// Its tools may have written there.
    MayHaveChanged,
}

/// Whether an end's copy is made from its staged transaction or from the
/// committed row ([`flower_bus::TaskEnded::committed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EndWrite {
    Staged,
    Committed,
}

impl Worker {
    /// Record the attempt's end and settle its delivery; `notice`: whether
    /// the end's notice went out already.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn settle(
        &self,
        task: &Task,
        attempt: u32,
        result: Reported,
        held: Batch,
        cancel: &CancellationToken,
        running: Running,
        delivery: Arc<dyn Delivery>,
        notice: &Arc<AtomicBool>,
    ) {
        let metrics = flower_agent::metrics::metrics();
        metrics.task_duration.observe(running.started.elapsed().as_secs_f64());
        metrics.worker_slots_busy.dec();
        metrics.task(
            &running.namespace,
            match &result {
                _ if cancel.is_cancelled() => "cancelled",
                Ok(_) => "succeeded",
                Err((f, _)) if f.retryable => "retried",
                Err(_) => "failed",
            },
        );
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

    /// Record the attempt's outcome. A store that cannot be reached is
    /// retried with backoff while the message is held (heartbeats go on);
    /// only a definite refusal (superseded, cancelled, fenced) settles without
    /// a write; a report that can never be stored fails the task instead.
    /// The held final batch (`held`: the answer's entries, events, usage) is
    /// committed with the end, in one transaction.
    /// `notice`: whether the end's notice went out already.
    pub(super) async fn finish(
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
        let workbench = Workbench::MayHaveChanged;
        self.stage_notice(task, attempt, &outcome, usage, &mut held, notice, workbench);
        loop {
            match store.finish_task_with(task.id, attempt, outcome.clone(), usage, held.clone()).await {
                Ok((ended, written)) => {
                    self.ended(&ended, &written, notice, workbench).await;
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
                    self.stage_notice(task, attempt, &outcome, usage, &mut held, notice, workbench);
                }
                Err(StoreError::Backend { message: e, .. }) if tokio::time::Instant::now() < give_up => {
                    tracing::warn!(task = %task.id, attempt, error = %e, "report not recorded yet; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
                Err(StoreError::Backend { message: e, .. }) => {
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
    /// `notice`: set once the notice went out, so it goes out once.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage_notice(
        &self,
        claimed: &Task,
        attempt: u32,
        outcome: &TaskOutcome,
        usage: Usage,
        held: &mut Batch,
        notice: &Arc<AtomicBool>,
        workbench: Workbench,
    ) {
        let copy = flower_store::rules::finish(claimed, attempt, outcome.clone(), usage, now_ms())
            .ok()
            .and_then(|change| self.end_copy(&change.task, EndWrite::Staged, workbench));
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
    pub(super) async fn ended(
        &self,
        ended: &Task,
        written: &flower_store::Written,
        notice: &AtomicBool,
        workbench: Workbench,
    ) {
        self.journal.announce(written).await;
        if !notice.swap(true, Ordering::SeqCst) {
            let copy = self.end_copy(ended, EndWrite::Committed, workbench).map(Box::new);
            let _ = self
                .journal
                .notifier()
                .notify(Notice::TaskDone { job: ended.job_id, task: ended.id, ended: copy })
                .await;
        }
    }

    /// Commit a held final batch without ending the task (best effort: a
    /// lost one only means the next attempt asks the model again).
    pub(super) async fn keep(&self, held: Batch) {
        if let Err(e) = self.journal.commit(held).await {
            tracing::warn!(error = %e, "the final answer's entries not stored");
        }
    }

    /// The copy of an attempt's end its notice carries (see
    /// [`flower_bus::TaskEnded`]).
    fn end_copy(&self, ended: &Task, write: EndWrite, workbench: Workbench) -> Option<flower_bus::TaskEnded> {
        let changeset = self.left_changeset(ended.id, ended.attempt);
        flower_bus::TaskEnded::of(ended, write == EndWrite::Committed, changeset)
            .map(|copy| flower_bus::TaskEnded { workbench_untouched: workbench == Workbench::Untouched, ..copy })
    }

    /// Whether this attempt stored a workspace changeset ([`Worker::collect`]).
    fn left_changeset(&self, task: TaskId, attempt: u32) -> bool {
        self.changesets.lock().unwrap_or_else(|p| p.into_inner()).contains(&(task, attempt))
    }
}
