//! The task queue and the notice stream, behind traits with an in-process
//! implementation for the embedded mode ([`memory`]) and NATS JetStream for the
//! distributed mode ([`nats`]); `conformance` (feature `testsuite`) is the
//! suite both pass.
//!
//! The bus carries **references and hints only**: a task message names a task
//! whose row is in the store; a notice says that new rows exist. Whoever
//! receives one reads the store. So a lost or duplicated message can delay
//! work but never lose or double it — the store's attempt claim is the guard.

use std::time::Duration;

use async_trait::async_trait;
use flower_model::{JobId, TaskId};
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
}

impl TaskMessage {
    /// The publish dedupe id: a task is published once per dispatch epoch.
    pub fn dedupe_id(&self) -> String {
        format!("{}.{}.{}", self.task_id, self.epoch, self.base_attempt)
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
    /// A task ended (its row holds the outcome).
    TaskDone { job: JobId, task: TaskId },
    /// Stop work on a job (cancel); workers stop its running tasks.
    Cancel { job: JobId },
    /// A user's message for a running job is stored: the job's owner reads
    /// its events (it does not on every [`Notice::Events`]).
    Interrupt { job: JobId },
    /// A task's first model response began streaming: its prompt prefix is
    /// now readable from the provider's cache (fan-out staggering).
    TaskStreaming { job: JobId, task: TaskId },
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
