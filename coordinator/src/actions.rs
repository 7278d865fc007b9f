//! What a user does to a running job — cancel it, send it a message, answer
//! its question — one
//! way for every front: the gRPC API and the web console.

use flower_bus::{Notice, Notifier};
use flower_model::{EventKind, Job, JobId, JobState};
use flower_store::{Batch, Store, StoreError};

/// Why an action was refused.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("job {job} already {state}")]
    Ended { job: JobId, state: JobState },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Cancel `job`: its unfinished tasks and then the job end `cancelled` with
/// `reason`; watchers and the job's owner hear it, workers stop its tasks.
pub async fn cancel(
    store: &dyn Store,
    notifier: Option<&dyn Notifier>,
    job: JobId,
    reason: &str,
) -> Result<Job, ActionError> {
    let found = store.get_job(job).await?;
    if found.state.is_terminal() {
        return Err(ActionError::Ended { job, state: found.state });
    }
    let reason = if reason.trim().is_empty() { "cancelled by the user".to_string() } else { reason.to_string() };
    let tasks = store.cancel_tasks(job, &reason).await?;
    let ended = store.set_job_state(job, JobState::Cancelled, Some(reason), None, None).await?;
    if let Some(n) = notifier {
        for w in [tasks, ended] {
            if let Some(last) = w.events.last() {
                let _ = n.notify(Notice::Events { job, seq: last.seq }).await;
            }
        }
        // Workers stop the job's running tasks on this notice.
        let _ = n.notify(Notice::Cancel { job }).await;
    }
    Ok(store.get_job(job).await?)
}

/// Deliver `message` to the running coordinator of `job` (a `user_message`
/// event its owner reads at once).
pub async fn interrupt(
    store: &dyn Store,
    notifier: Option<&dyn Notifier>,
    job: JobId,
    message: String,
) -> Result<Job, ActionError> {
    let found = store.get_job(job).await?;
    if found.state.is_terminal() {
        return Err(ActionError::Ended { job, state: found.state });
    }
    let batch = Batch { events: vec![(job, EventKind::UserMessage { text: message })], ..Default::default() };
    let written = store.append(batch).await?;
    if let Some(n) = notifier {
        if let Some(last) = written.events.last() {
            let _ = n.notify(Notice::Events { job, seq: last.seq }).await;
        }
        // The owner reads the job's events on this one.
        let _ = n.notify(Notice::Interrupt { job }).await;
    }
    Ok(found)
}

/// How a user's message (`interrupt`) reaches the running coordinator's
/// inbox.
pub fn inbox_text(message: &str) -> String {
    format!("[a message from the user, sent while the job runs: adjust and continue — don't start over]\n{message}")
}

/// Tell watchers and the job's owner that an answer to its question is
/// stored (`written`): the owner reads the job's events and wakes the
/// waiting call.
pub async fn answered(notifier: &dyn Notifier, job: JobId, written: &flower_store::Written) {
    if let Some(last) = written.events.last() {
        let _ = notifier.notify(Notice::Events { job, seq: last.seq }).await;
    }
    let _ = notifier.notify(Notice::Interrupt { job }).await;
}
