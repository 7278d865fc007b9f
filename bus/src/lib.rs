//! The task queue and the notice stream, behind traits with an in-process
//! implementation for the embedded mode ([`memory`]) and NATS JetStream for the
//! distributed mode ([`nats`]); `conformance` (feature `testsuite`) is the
//! suite both pass.
//!
//! The bus carries **references and hints**: a task message names a task
//! whose row is in the store; a notice says that new rows exist. A first
//! dispatch's message may carry a copy of the task's words, and a task's end
//! notice a copy of the end, so the next step can start while the write that
//! they copy commits — but nothing is decided from a copy: the store's
//! attempt claim decides who runs a task, and a write built on a copied end
//! commits only if the store holds that end (docs/design.md section 3). So a
//! lost or duplicated message can delay work but never lose or double it.
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

use std::time::Duration;

use async_trait::async_trait;
use flower_model::{JobId, SessionId, TaskId, TaskState, Usage};
use serde::{Deserialize, Serialize};

#[cfg(any(test, feature = "testsuite"))]
pub mod conformance;
pub mod memory;
pub mod nats;
pub mod trace;

pub use memory::MemoryBus;
pub use nats::{NatsBus, NatsConfig};

/// Errors of the bus. [`BusError::Unavailable`] is retryable.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The transport is down or timed out; retry later.
    #[error("bus unavailable: {0}")]
    Unavailable(String),
    /// The bus was shut down; stop consuming.
    #[error("bus closed")]
    Closed,
}

pub type Result<T, E = BusError> = std::result::Result<T, E>;

/// A task to run. The task itself (mandate, worker, attempts) is a store row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskMessage {
    pub job_id: JobId,
    pub task_id: TaskId,
    pub worker: String,
    /// Epoch of the coordinator lease that dispatched it (fencing).
    pub epoch: i64,
    /// Attempts the task had when this message was published: a delivery is
    /// attempt `base_attempt + delivered`. 0 for a first dispatch; a task
    /// requeued by the sweeper (its message was lost) continues its count.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub base_attempt: u32,
    /// W3C `traceparent` of the dispatching span, when tracing is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// A copy of the task's words (first dispatch, when small): the worker
    /// may start the attempt's first model request while its claim commits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<TaskBody>,
    /// How many times this dispatch was published again under a dedupe id
    /// of its own: its first message may have been dropped (its task row did
    /// not commit then), or the queue gave up on it (a dead letter, see
    /// [`DeadLetter`]). On the wire: a dead letter's republish is bounded by it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub republish: u32,
    /// Fan-out staggering waits for this task: its worker announces the
    /// first model response's stream ([`Notice::TaskStreaming`]). Only the
    /// first child of a shape asks; the others' workers send nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream_notice: bool,
}

impl TaskMessage {
    /// The publish dedupe id: a task is published once per dispatch epoch.
    pub fn dedupe_id(&self) -> String {
        match self.republish {
            0 => format!("{}.{}.{}", self.task_id, self.epoch, self.base_attempt),
            n => format!("{}.{}.{}.r{n}", self.task_id, self.epoch, self.base_attempt),
        }
    }

    /// This dispatch published again under a new dedupe id, with deliveries
    /// of its own — `None` once it was, `limit` times (a task no worker
    /// ever claimed is published again at most the attempt limit's times).
    pub fn published_again(&self, limit: u32) -> Option<TaskMessage> {
        (self.republish < limit).then(|| TaskMessage { republish: self.republish + 1, ..self.clone() })
    }

    /// The task row the body describes, as its creator queued it — `None`
    /// without a body, or when the body does not derive this message's task
    /// id (the id is derived from the job, session and call).
    pub fn queued_task(&self) -> Option<flower_model::Task> {
        let b = self.body.as_ref()?;
        let task = flower_model::Task::queued(
            self.job_id,
            b.parent_session,
            &b.tool_use_id,
            &self.worker,
            &b.description,
            &b.mandate,
        );
        (task.id == self.task_id).then_some(task)
    }
}

/// The words of a task, copied into its first message ([`TaskMessage::body`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskBody {
    pub parent_session: SessionId,
    pub tool_use_id: String,
    pub description: String,
    pub mandate: String,
}

impl TaskBody {
    /// Bodies above this many bytes stay in the store only (the worker reads
    /// the row with its claim).
    pub const INLINE_MAX: usize = 16 * 1024;

    /// The body of `task`, when small enough to travel inline.
    pub fn of(task: &flower_model::Task) -> Option<Self> {
        (task.mandate.len() + task.description.len() + task.tool_use_id.len() <= Self::INLINE_MAX).then(|| Self {
            parent_session: task.parent_session,
            tool_use_id: task.tool_use_id.clone(),
            description: task.description.clone(),
            mandate: task.mandate.clone(),
        })
    }
}

/// A copy of a task's end ([`Notice::TaskDone`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEnded {
    pub attempt: u32,
    pub state: TaskState,
    pub report: Option<String>,
    pub error: Option<String>,
    pub usage: Usage,
    /// `false`: sent while the end's transaction was staged, before its
    /// commit — a write built on it must require the end
    /// (`flower_store::Batch::requires`).
    pub committed: bool,
    /// Whether the attempt may have left a workspace changeset: `false`
    /// only when it is known to have left none (the receiver need not look).
    pub changeset: bool,
    /// `true` only when the attempt is known to have left the job's
    /// workbench as it found it (it ran no tool): the receiver need not
    /// list the workbench again for it. [`TaskEnded::of`] says `false`.
    pub workbench_untouched: bool,
}

impl TaskEnded {
    /// Reports above this many bytes are not copied: the receiver reads the row.
    pub const INLINE_MAX: usize = 32 * 1024;

    /// The end of `task` (as stored, or as its transaction will store it);
    /// `changeset`: see [`TaskEnded::changeset`].
    pub fn of(task: &flower_model::Task, committed: bool, changeset: bool) -> Option<Self> {
        let size = task.report.as_deref().map_or(0, str::len) + task.error.as_deref().map_or(0, str::len);
        (task.state.is_terminal() && size <= Self::INLINE_MAX).then(|| Self {
            attempt: task.attempt,
            state: task.state,
            report: task.report.clone(),
            error: task.error.clone(),
            usage: task.usage,
            committed,
            changeset,
            workbench_untouched: false,
        })
    }

    /// `task` (as its creator queued it) with this end applied.
    pub fn apply(&self, mut task: flower_model::Task) -> flower_model::Task {
        task.state = self.state;
        task.attempt = self.attempt;
        task.report = self.report.clone();
        task.error = self.error.clone();
        task.usage = self.usage;
        task
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A hint that rows exist; receivers read the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Notice {
    /// Events up to `seq` are stored for `job`.
    Events { job: JobId, seq: i64 },
    /// A task ended (its row holds the outcome); with a copy of the end when small.
    TaskDone { job: JobId, task: TaskId, ended: Option<Box<TaskEnded>> },
    /// Stop work on a job (cancel); workers stop its running tasks.
    Cancel { job: JobId },
    /// A user's message for a running job is stored: the job's owner reads
    /// its events (it does not on every [`Notice::Events`]).
    Interrupt { job: JobId },
    /// A task's first model response began streaming: its prompt prefix is
    /// now readable from the provider's cache (fan-out staggering).
    TaskStreaming { job: JobId, task: TaskId },
}

/// The kinds of [`Notice`]: a process may hear only some (a worker needs
/// only cancels), and a bus that can route by kind delivers it no other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NoticeKind {
    Events,
    TaskDone,
    Cancel,
    Interrupt,
    TaskStreaming,
}

impl NoticeKind {
    pub const ALL: [NoticeKind; 5] = [
        NoticeKind::Events,
        NoticeKind::TaskDone,
        NoticeKind::Cancel,
        NoticeKind::Interrupt,
        NoticeKind::TaskStreaming,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::Events => "events",
            NoticeKind::TaskDone => "task_done",
            NoticeKind::Cancel => "cancel",
            NoticeKind::Interrupt => "interrupt",
            NoticeKind::TaskStreaming => "task_streaming",
        }
    }
}

impl Notice {
    pub fn kind(&self) -> NoticeKind {
        match self {
            Notice::Events { .. } => NoticeKind::Events,
            Notice::TaskDone { .. } => NoticeKind::TaskDone,
            Notice::Cancel { .. } => NoticeKind::Cancel,
            Notice::Interrupt { .. } => NoticeKind::Interrupt,
            Notice::TaskStreaming { .. } => NoticeKind::TaskStreaming,
        }
    }
}

/// One delivery of a task message.
#[async_trait]
pub trait Delivery: Send + Sync {
    fn message(&self) -> &TaskMessage;
    /// How many times this message has been delivered, from 1: the attempt number.
    fn delivered(&self) -> u32;
    /// Done: never deliver again.
    async fn ack(&self) -> Result<()>;
    /// Deliver again, after `delay`.
    async fn nak(&self, delay: Option<Duration>) -> Result<()>;
    /// Still working: extend the ack deadline (heartbeat).
    async fn progress(&self) -> Result<()>;
    /// Give up on the message without running it again (dead letter).
    async fn term(&self) -> Result<()>;
}

/// The competing-consumers work queue.
#[async_trait]
pub trait TaskQueue: Send + Sync + 'static {
    /// Publish; a second publish with the same [`TaskMessage::dedupe_id`] within
    /// the dedupe window is dropped. Returns `false` for a dropped duplicate.
    async fn publish(&self, task: TaskMessage) -> Result<bool>;
    /// The next delivery for this consumer group; `Err(Closed)` at shutdown.
    async fn next(&self) -> Result<Box<dyn Delivery>>;
    /// Messages of the consumer group not yet acknowledged: waiting to be
    /// delivered plus delivered and not settled (in flight). May cost a round
    /// trip to the server: read it periodically, not per task.
    async fn lag(&self) -> Result<u64>;
    /// The next message the queue gave up on (see [`DeadLetter`]). A queue
    /// without a delivery limit gives up on none: pending forever.
    async fn dead_letter(&self) -> Result<Box<dyn DeadLetter>> {
        futures::future::pending().await
    }
}

/// A task message whose deliveries reached the queue's limit with the last
/// one never settled: its worker died holding it, or gave it back (a store
/// outage outlasted every delivery's claim). The queue delivers it no more;
/// whoever takes the dead letter decides what becomes of its task.
#[async_trait]
pub trait DeadLetter: Send + Sync {
    /// The message, if the queue still holds it (`None`: settled after all,
    /// or not readable as a task message).
    fn message(&self) -> Option<&TaskMessage>;
    /// How many times the message was delivered.
    fn deliveries(&self) -> u32;
    /// Handled: the message leaves the queue, and the dead letter with it.
    async fn settle(&self) -> Result<()>;
    /// Not handled now (the store is unreachable): offer it again after `delay`.
    async fn retry(&self, delay: Duration) -> Result<()>;
}

/// The notice stream (fan-out: every subscriber sees every notice).
#[async_trait]
pub trait Notifier: Send + Sync + 'static {
    async fn notify(&self, notice: Notice) -> Result<()>;
    fn subscribe(&self) -> NoticeStream;
}

/// Notices as they come. After a lag (notices dropped for a slow reader) the
/// stream yields [`Heard::Lagged`]: re-read the store, nothing is lost there.
pub struct NoticeStream {
    rx: tokio::sync::broadcast::Receiver<Notice>,
}

/// What a [`NoticeStream`] yields.
#[derive(Debug, PartialEq)]
pub enum Heard {
    Notice(Notice),
    Lagged,
    Closed,
}

impl NoticeStream {
    pub fn new(rx: tokio::sync::broadcast::Receiver<Notice>) -> Self {
        Self { rx }
    }

    pub async fn recv(&mut self) -> Heard {
        use tokio::sync::broadcast::error::RecvError;
        match self.rx.recv().await {
            Ok(n) => Heard::Notice(n),
            Err(RecvError::Lagged(_)) => Heard::Lagged,
            Err(RecvError::Closed) => Heard::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn first_message(task: &flower_model::Task) -> TaskMessage {
        TaskMessage {
            job_id: task.job_id,
            task_id: task.id,
            worker: task.worker.clone(),
            epoch: 3,
            base_attempt: 0,
            trace: None,
            body: TaskBody::of(task),
            republish: 0,
            stream_notice: false,
        }
    }

    #[test]
    fn a_body_gives_back_its_task_only_when_it_derives_the_id() {
        let task = flower_model::Task::queued(JobId::random(), SessionId::random(), "toolu_1", "w", "d", "do it");
        let msg = first_message(&task);
        let again = msg.queued_task().unwrap();
        assert_eq!((again.id, again.mandate.as_str(), again.worker.as_str()), (task.id, "do it", "w"));
        let mut forged = msg.clone();
        forged.body.as_mut().unwrap().mandate = "something else".into();
        assert_eq!(forged.queued_task().unwrap().mandate, "something else", "the id covers the call, not the words");
        forged.body.as_mut().unwrap().tool_use_id = "toolu_2".into();
        assert!(forged.queued_task().is_none(), "a body of another call is not this task's");
        assert!(TaskMessage { body: None, ..msg }.queued_task().is_none());
    }

    #[test]
    fn large_words_and_reports_stay_in_the_store() {
        let big = "x".repeat(TaskBody::INLINE_MAX + 1);
        let task = flower_model::Task::queued(JobId::random(), SessionId::random(), "toolu_1", "w", "d", &big);
        assert!(TaskBody::of(&task).is_none());
        let mut ended = task.clone();
        ended.state = TaskState::Succeeded;
        ended.report = Some("y".repeat(TaskEnded::INLINE_MAX + 1));
        assert!(TaskEnded::of(&ended, true, false).is_none());
        ended.report = Some("ok".into());
        let copy = TaskEnded::of(&ended, false, true).unwrap();
        assert!(!copy.committed);
        assert!(copy.changeset);
        assert!(!TaskEnded::of(&ended, true, false).unwrap().changeset);
        assert!(!copy.workbench_untouched, "unknown: the workbench may have changed");
        assert_eq!(copy.apply(task.clone()).report.as_deref(), Some("ok"));
        assert!(TaskEnded::of(&task, true, true).is_none(), "a queued task has no end to copy");
    }

    #[test]
    fn a_republish_has_a_dedupe_id_of_its_own() {
        let task = flower_model::Task::queued(JobId::random(), SessionId::random(), "toolu_1", "w", "d", "do it");
        let msg = first_message(&task);
        assert_eq!(msg.dedupe_id(), format!("{}.3.0", task.id));
        assert_eq!(TaskMessage { republish: 1, ..msg }.dedupe_id(), format!("{}.3.0.r1", task.id));
        let again = TaskMessage { republish: 1, ..first_message(&task) }.published_again(2).unwrap();
        assert_eq!(again.dedupe_id(), format!("{}.3.0.r2", task.id));
        assert!(again.published_again(2).is_none(), "at most the limit's times");
    }
}
