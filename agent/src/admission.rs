//! A namespace's task limit, as one process's held tasks wait for it
//! (docs/design.md section 17, "Task limit"): the process's held tasks of
//! the namespace are offered to the store together ([`Store::admit_tasks`]),
//! again whenever a task ends anywhere (a notice), a task comes to wait, or
//! [`RECHECK`] passes — one query per pass whatever the number waiting.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flower_bus::{Heard, Notice, NoticeStream, Notifier};
use flower_model::{Task, TaskId};
use flower_store::{Store, StoreError};
use tokio::sync::oneshot;

/// How often held tasks are offered without a notice (a limit raised, a
/// notice lost, a job's tasks cancelled).
const RECHECK: Duration = Duration::from_secs(2);
/// Passes are at least this far apart: ends heard meanwhile go in one pass.
const COALESCE: Duration = Duration::from_millis(25);

pub(crate) struct HeldTasks {
    store: Arc<dyn Store>,
    namespace: String,
    state: Mutex<State>,
    /// A task came to wait while a pass was under way or pausing.
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    waiting: Vec<(TaskId, oneshot::Sender<Task>)>,
    /// A task admitting them runs (it stops when none waits).
    admitting: bool,
}

impl HeldTasks {
    pub(crate) fn new(store: Arc<dyn Store>, namespace: &str) -> Self {
        Self { store, namespace: namespace.to_string(), state: Default::default(), wake: Default::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until `task` (held, of this namespace) is admitted: its row,
    /// queued. A caller that stops waiting leaves the task held (a later
    /// run of its job waits for it again).
    pub(crate) async fn admitted(
        self: &Arc<Self>,
        notifier: &Arc<dyn Notifier>,
        task: TaskId,
    ) -> Result<Task, StoreError> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut state = self.lock();
            state.waiting.push((task, tx));
            !std::mem::replace(&mut state.admitting, true)
        };
        if start {
            // Listening before the first pass: no end after it is missed.
            tokio::spawn(self.clone().admit(notifier.subscribe()));
        } else {
            self.wake.notify_one();
        }
        rx.await.map_err(|_| StoreError::backend("the namespace's admissions stopped"))
    }

    async fn admit(self: Arc<Self>, mut notices: NoticeStream) {
        loop {
            let ids: Vec<TaskId> = {
                let mut state = self.lock();
                state.waiting.retain(|(_, tx)| !tx.is_closed());
                if state.waiting.is_empty() {
                    state.admitting = false;
                    return;
                }
                state.waiting.iter().map(|(id, _)| *id).collect()
            };
            match self.store.admit_tasks(&self.namespace, &ids).await {
                Ok(rows) => {
                    let mut state = self.lock();
                    for row in rows {
                        if let Some(i) = state.waiting.iter().position(|(id, _)| *id == row.id) {
                            let (_, tx) = state.waiting.swap_remove(i);
                            let _ = tx.send(row);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(namespace = %self.namespace, error = %e, "held tasks not admitted; again soon")
                }
            }
            tokio::time::sleep(COALESCE).await;
            if self.lock().waiting.is_empty() {
                continue;
            }
            tokio::select! {
                _ = a_task_ends(&mut notices) => {}
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
    }
}

/// Until a task ends somewhere (or notices were lost: one may have).
async fn a_task_ends(notices: &mut NoticeStream) {
    loop {
        match notices.recv().await {
            Heard::Notice(Notice::TaskDone { .. }) | Heard::Lagged => return,
            // No more notices: the recheck alone.
            Heard::Closed => std::future::pending::<()>().await,
            Heard::Notice(_) => {}
        }
    }
}
