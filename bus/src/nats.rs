//! The distributed bus on NATS JetStream (server 2.9 features only).
//!
//! Tasks: a work-queue stream (`<prefix>.tasks`), one durable pull consumer
//! shared by every worker (competing consumers), explicit acks, an ack wait
//! extended by in-progress acks while a task runs, publish dedupe by
//! `Nats-Msg-Id` within the stream's duplicate window, MaxDeliver =
//! `max_attempts + 1` (on 2.9 a message at MaxDeliver just stays in the stream:
//! the worker that receives `delivered > max_attempts` terminates it and
//! records the failure). Payloads are the protobuf messages of `flower.v1`.
//!
//! Dead letters: a message whose last delivery was not settled either (its
//! worker died holding it, or gave it back) is dropped from the consumer,
//! and the server says so once, in a max-deliveries advisory. A second stream
//! (`<STREAM>_DEAD`) keeps those advisories, so none is lost while no
//! coordinator listens; coordinators take them through a durable consumer of
//! their own ([`TaskQueue::dead_letter`]).
//!
//! Notices: core NATS publish/subscribe on `<prefix>.notices.<kind>`, fanned
//! out to local subscribers; they are hints, so at-most-once delivery is
//! enough. A process subscribes to the kinds it needs only
//! ([`NatsConfig::hears`]): a worker hears cancels, not every task's events.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::{self, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, AckKind, Context};
use async_trait::async_trait;
use flower_model::{JobId, TaskId};
use flower_proto::v1 as pb;
use futures::StreamExt;
use prost::Message as _;
use tokio::sync::broadcast;

use crate::{
    BusError, DeadLetter, Delivery, Notice, NoticeKind, NoticeStream, Notifier, Result, TaskBody, TaskEnded,
    TaskMessage, TaskQueue,
};

/// Where and how the bus lives on the server.
#[derive(Clone, Debug)]
pub struct NatsConfig {
    pub url: String,
    /// Subject and stream-name prefix: several deployments (or tests) share a
    /// server without seeing each other. Letters, digits, `_` and `-`.
    pub prefix: String,
    /// How long a delivery may go without an ack or heartbeat before the
    /// server redelivers it (default 30 s).
    pub ack_wait: Duration,
    /// Deliveries of one task that may run (default 3); the consumer's
    /// MaxDeliver is one more, so the worker sees the excess delivery.
    pub max_attempts: u32,
    /// Publish dedupe window (default 2 min).
    pub duplicate_window: Duration,
    /// The notice kinds this process hears (default: all). Every kind can
    /// be sent whatever this says.
    pub hears: Vec<NoticeKind>,
}

impl NatsConfig {
    pub fn new(url: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: prefix.into(),
            ack_wait: Duration::from_secs(30),
            max_attempts: 3,
            duplicate_window: Duration::from_secs(120),
            hears: NoticeKind::ALL.to_vec(),
        }
    }

    pub fn stream_name(&self) -> String {
        format!("{}_TASKS", self.prefix.replace(['.', '-'], "_").to_uppercase())
    }
    /// The stream keeping the task consumer's max-deliveries advisories.
    pub fn dead_letter_stream_name(&self) -> String {
        format!("{}_DEAD", self.stream_name())
    }
    fn workers_consumer(&self) -> String {
        format!("{}-workers", self.prefix)
    }
    fn tasks_subject(&self) -> String {
        format!("{}.tasks", self.prefix)
    }
    fn notices_subject(&self, kind: NoticeKind) -> String {
        format!("{}.notices.{}", self.prefix, kind.as_str())
    }
}

fn unavailable(e: impl std::fmt::Display) -> BusError {
    BusError::Unavailable(e.to_string())
}

#[derive(Clone)]
pub struct NatsBus {
    config: NatsConfig,
    client: async_nats::Client,
    js: Context,
    consumer: PullConsumer,
    /// The tasks stream (a dead letter's message is read and deleted there).
    tasks: stream::Stream,
    /// The coordinators' consumer of max-deliveries advisories.
    dead: PullConsumer,
    notices: broadcast::Sender<Notice>,
}

impl NatsBus {
    /// Connect, and create the stream and the shared consumer if absent.
    pub async fn connect(config: NatsConfig) -> Result<Self> {
        if config.prefix.is_empty() || !config.prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(BusError::Unavailable(format!(
                "bad NATS prefix `{}`: use letters, digits, `_`, `-`",
                config.prefix
            )));
        }
        let client = async_nats::connect(&config.url)
            .await
            .map_err(|e| BusError::Unavailable(format!("cannot reach NATS at {}: {e}", config.url)))?;
        let js = jetstream::new(client.clone());
        let stream = js
            .get_or_create_stream(stream::Config {
                name: config.stream_name(),
                subjects: vec![config.tasks_subject()],
                retention: RetentionPolicy::WorkQueue,
                storage: StorageType::File,
                duplicate_window: config.duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(unavailable)?;
        let durable = config.workers_consumer();
        let consumer = stream
            .get_or_create_consumer(
                &durable,
                pull::Config {
                    durable_name: Some(durable.clone()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: config.ack_wait,
                    max_deliver: i64::from(config.max_attempts) + 1,
                    ..Default::default()
                },
            )
            .await
            .map_err(unavailable)?;
        let dead_stream = js
            .get_or_create_stream(stream::Config {
                name: config.dead_letter_stream_name(),
                subjects: vec![format!(
                    "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.{durable}",
                    config.stream_name()
                )],
                retention: RetentionPolicy::WorkQueue,
                storage: StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(unavailable)?;
        let dead_durable = format!("{}-dead-letters", config.prefix);
        let dead = dead_stream
            .get_or_create_consumer(
                &dead_durable,
                pull::Config {
                    durable_name: Some(dead_durable.clone()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: config.ack_wait,
                    ..Default::default()
                },
            )
            .await
            .map_err(unavailable)?;
        let (tx, _) = broadcast::channel(4096);
        let bus = Self { config, client, js, consumer, tasks: stream, dead, notices: tx };
        bus.forward_notices().await?;
        Ok(bus)
    }

    pub fn config(&self) -> &NatsConfig {
        &self.config
    }

    /// Relay the notices subjects this process hears into the local broadcast channel.
    async fn forward_notices(&self) -> Result<()> {
        let mut hears = self.config.hears.clone();
        hears.sort_by_key(|k| k.as_str());
        hears.dedup();
        let subject = match hears.len() {
            // Every kind: one wildcard subscription.
            n if n == NoticeKind::ALL.len() => format!("{}.notices.*", self.config.prefix),
            _ => String::new(),
        };
        let mut subs = Vec::new();
        if subject.is_empty() {
            for kind in hears {
                subs.push(self.client.subscribe(self.config.notices_subject(kind)).await.map_err(unavailable)?);
            }
        } else {
            subs.push(self.client.subscribe(subject).await.map_err(unavailable)?);
        }
        let mut sub = futures::stream::select_all(subs);
        let tx = self.notices.clone();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                match pb::Notice::decode(msg.payload.as_ref()).map_err(|e| e.to_string()).and_then(notice_from_pb) {
                    Ok(n) => {
                        let _ = tx.send(n);
                    }
                    Err(e) => tracing::warn!(error = %e, "undecodable notice ignored"),
                }
            }
        });
        // The subscription must be registered before anyone relies on it.
        self.client.flush().await.map_err(unavailable)?;
        Ok(())
    }

    /// Delete the streams and their consumers (tests and teardown).
    pub async fn destroy(&self) -> Result<()> {
        self.js.delete_stream(self.config.stream_name()).await.map_err(unavailable)?;
        self.js.delete_stream(self.config.dead_letter_stream_name()).await.map_err(unavailable)?;
        Ok(())
    }

    /// A raw publish → consume → ack round trip of one small message (the floor
    /// the task path is compared with in benchmarks).
    pub async fn raw_round_trip(&self) -> Result<Duration> {
        let started = std::time::Instant::now();
        let id = TaskMessage {
            job_id: JobId::random(),
            task_id: TaskId::random(),
            worker: "ping".into(),
            epoch: 0,
            base_attempt: 0,
            trace: None,
            body: None,
            republish: 0,
            stream_notice: false,
        };
        self.publish(id).await?;
        let d = self.next().await?;
        d.ack().await?;
        Ok(started.elapsed())
    }
}

fn notice_to_pb(n: &Notice) -> pb::Notice {
    use pb::notice::What;
    let (job, what, ended) = match n {
        Notice::Events { job, seq } => (job, What::EventSeq(*seq), None),
        Notice::TaskDone { job, task, ended } => (job, What::TaskDone(task.to_string()), ended.as_deref()),
        Notice::Cancel { job } => (job, What::Cancel(true), None),
        Notice::Interrupt { job } => (job, What::Interrupt(true), None),
        Notice::TaskStreaming { job, task } => (job, What::TaskStreaming(task.to_string()), None),
    };
    pb::Notice {
        job_id: job.to_string(),
        what: Some(what),
        ended: ended.map(|e| pb::TaskEnded {
            attempt: e.attempt,
            state: e.state.as_str().to_string(),
            report: e.report.clone(),
            error: e.error.clone(),
            usage_json: serde_json::to_string(&e.usage).unwrap_or_default(),
            committed: e.committed,
            no_changeset: !e.changeset,
            workbench_untouched: e.workbench_untouched,
            task_state: pb::TaskState::from(e.state).into(),
            usage: Some((&e.usage).into()),
        }),
    }
}

fn ended_from_pb(e: pb::TaskEnded) -> std::result::Result<TaskEnded, String> {
    let state = flower_proto::convert::task_state(e.task_state, &e.state)
        .ok_or_else(|| format!("ended.state: `{}` is not a task state", e.state))?;
    if !state.is_terminal() {
        return Err(format!("ended.state: `{}` is not an end", state.as_str()));
    }
    let usage = match &e.usage {
        Some(u) => u.into(),
        // From a sender that predates the typed field.
        None => serde_json::from_str(&e.usage_json).map_err(|err| format!("ended.usage_json: {err}"))?,
    };
    Ok(TaskEnded {
        attempt: e.attempt,
        state,
        report: e.report,
        error: e.error,
        usage,
        committed: e.committed,
        changeset: !e.no_changeset,
        workbench_untouched: e.workbench_untouched,
    })
}

fn notice_from_pb(n: pb::Notice) -> std::result::Result<Notice, String> {
    use pb::notice::What;
    let job: JobId = n.job_id.parse().map_err(|e| format!("job_id: {e}"))?;
    match n.what {
        Some(What::EventSeq(seq)) => Ok(Notice::Events { job, seq }),
        Some(What::TaskDone(t)) => Ok(Notice::TaskDone {
            job,
            task: t.parse().map_err(|e| format!("task_done: {e}"))?,
            ended: n.ended.map(ended_from_pb).transpose()?.map(Box::new),
        }),
        Some(What::Cancel(_)) => Ok(Notice::Cancel { job }),
        Some(What::Interrupt(_)) => Ok(Notice::Interrupt { job }),
        Some(What::TaskStreaming(t)) => {
            Ok(Notice::TaskStreaming { job, task: t.parse().map_err(|e| format!("task_streaming: {e}"))? })
        }
        None => Err("empty notice".into()),
    }
}

fn task_to_pb(t: &TaskMessage) -> pb::TaskMessage {
    pb::TaskMessage {
        job_id: t.job_id.to_string(),
        task_id: t.task_id.to_string(),
        worker: t.worker.clone(),
        epoch: t.epoch,
        base_attempt: t.base_attempt,
        body: t.body.as_ref().map(|b| pb::TaskBody {
            parent_session: b.parent_session.to_string(),
            tool_use_id: b.tool_use_id.clone(),
            description: b.description.clone(),
            mandate: b.mandate.clone(),
        }),
        republish: t.republish,
        stream_notice: t.stream_notice,
    }
}

fn task_from_pb(t: pb::TaskMessage) -> std::result::Result<TaskMessage, String> {
    Ok(TaskMessage {
        job_id: t.job_id.parse().map_err(|e| format!("job_id: {e}"))?,
        task_id: t.task_id.parse().map_err(|e| format!("task_id: {e}"))?,
        worker: t.worker,
        epoch: t.epoch,
        base_attempt: t.base_attempt,
        trace: None,
        body: t
            .body
            .map(|b| -> std::result::Result<TaskBody, String> {
                Ok(TaskBody {
                    parent_session: b.parent_session.parse().map_err(|e| format!("body.parent_session: {e}"))?,
                    tool_use_id: b.tool_use_id,
                    description: b.description,
                    mandate: b.mandate,
                })
            })
            .transpose()?,
        republish: t.republish,
        stream_notice: t.stream_notice,
    })
}

#[async_trait]
impl TaskQueue for NatsBus {
    async fn publish(&self, task: TaskMessage) -> Result<bool> {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", task.dedupe_id().as_str());
        if let Some(t) = &task.trace {
            headers.insert(crate::trace::TRACEPARENT, t.as_str());
        }
        let payload = task_to_pb(&task).encode_to_vec();
        let ack = self
            .js
            .publish_with_headers(self.config.tasks_subject(), headers, payload.into())
            .await
            .map_err(unavailable)?
            .await
            .map_err(unavailable)?;
        Ok(!ack.duplicate)
    }

    async fn next(&self) -> Result<Box<dyn Delivery>> {
        loop {
            let Some(msg) = pull_one(&self.consumer).await? else { continue };
            let delivered = msg.info().map(|i| i.delivered).unwrap_or(1).max(1) as u32;
            match decode_task(msg.headers.as_ref(), &msg.payload) {
                Ok(task) => return Ok(Box::new(NatsDelivery { msg, task, delivered })),
                Err(e) => {
                    // Not ours to run and never will be: drop it for good.
                    tracing::warn!(error = %e, "undecodable task message terminated");
                    let _ = msg.ack_with(AckKind::Term).await;
                }
            }
        }
    }

    async fn lag(&self) -> Result<u64> {
        // The durable consumer's own counts: not yet delivered, and delivered
        // but not yet acknowledged.
        let info = self.consumer.get_info().await.map_err(unavailable)?;
        Ok(info.num_pending + info.num_ack_pending as u64)
    }

    async fn dead_letter(&self) -> Result<Box<dyn DeadLetter>> {
        /// The fields of `io.nats.jetstream.advisory.v1.max_deliver` read here.
        #[derive(serde::Deserialize)]
        struct MaxDeliveries {
            stream_seq: u64,
            deliveries: u64,
        }
        loop {
            let Some(advisory) = pull_one(&self.dead).await? else { continue };
            let Ok(said) = serde_json::from_slice::<MaxDeliveries>(&advisory.payload) else {
                tracing::warn!("unreadable max-deliveries advisory dropped");
                let _ = advisory.double_ack_with(AckKind::Term).await;
                continue;
            };
            let task = match self.tasks.get_raw_message(said.stream_seq).await {
                Ok(m) => match decode_task(Some(&m.headers), &m.payload) {
                    Ok(task) => Some(task),
                    Err(e) => {
                        tracing::warn!(error = %e, seq = said.stream_seq, "undecodable dead letter");
                        None
                    }
                },
                Err(e) if matches!(e.kind(), stream::RawMessageErrorKind::NoMessageFound) => None,
                Err(e) => {
                    let _ = advisory.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                    return Err(unavailable(e));
                }
            };
            let deliveries = u32::try_from(said.deliveries).unwrap_or(u32::MAX);
            return Ok(Box::new(NatsDeadLetter {
                advisory,
                seq: said.stream_seq,
                deliveries,
                task,
                tasks: self.tasks.clone(),
            }));
        }
    }
}

/// One message of `consumer`, or `None` when none came within the pull's
/// expiry (the caller pulls again).
async fn pull_one(consumer: &PullConsumer) -> Result<Option<jetstream::Message>> {
    let mut batch =
        consumer.batch().max_messages(1).expires(Duration::from_secs(10)).messages().await.map_err(unavailable)?;
    batch.next().await.transpose().map_err(unavailable)
}

/// A task message's payload and trace header, decoded.
fn decode_task(headers: Option<&HeaderMap>, payload: &[u8]) -> std::result::Result<TaskMessage, String> {
    let mut task = pb::TaskMessage::decode(payload).map_err(|e| e.to_string()).and_then(task_from_pb)?;
    task.trace = headers.and_then(|h| h.get(crate::trace::TRACEPARENT)).map(|v| v.as_str().to_string());
    Ok(task)
}

struct NatsDeadLetter {
    advisory: jetstream::Message,
    seq: u64,
    deliveries: u32,
    task: Option<TaskMessage>,
    tasks: stream::Stream,
}

#[async_trait]
impl DeadLetter for NatsDeadLetter {
    fn message(&self) -> Option<&TaskMessage> {
        self.task.as_ref()
    }
    fn deliveries(&self) -> u32 {
        self.deliveries
    }
    async fn settle(&self) -> Result<()> {
        use async_nats::jetstream::stream::DeleteMessageErrorKind;
        match self.tasks.delete_message(self.seq).await {
            // Deleted, or the server says there is nothing to delete.
            Ok(_) => {}
            Err(e) if matches!(e.kind(), DeleteMessageErrorKind::JetStream(_)) => {}
            Err(e) => return Err(unavailable(e)),
        }
        self.advisory.double_ack().await.map_err(unavailable)
    }
    async fn retry(&self, delay: Duration) -> Result<()> {
        self.advisory.ack_with(AckKind::Nak(Some(delay))).await.map_err(unavailable)
    }
}

#[async_trait]
impl Notifier for NatsBus {
    async fn notify(&self, notice: Notice) -> Result<()> {
        let payload = notice_to_pb(&notice).encode_to_vec();
        self.client.publish(self.config.notices_subject(notice.kind()), payload.into()).await.map_err(unavailable)
    }

    fn subscribe(&self) -> NoticeStream {
        NoticeStream::new(self.notices.subscribe())
    }
}

struct NatsDelivery {
    msg: jetstream::Message,
    task: TaskMessage,
    delivered: u32,
}

#[async_trait]
impl Delivery for NatsDelivery {
    fn message(&self) -> &TaskMessage {
        &self.task
    }
    fn delivered(&self) -> u32 {
        self.delivered
    }
    async fn ack(&self) -> Result<()> {
        // A confirmed ack: once this returns, the server will not redeliver.
        self.msg.double_ack().await.map_err(unavailable)
    }
    async fn nak(&self, delay: Option<Duration>) -> Result<()> {
        self.msg.ack_with(AckKind::Nak(delay)).await.map_err(unavailable)
    }
    async fn progress(&self) -> Result<()> {
        self.msg.ack_with(AckKind::Progress).await.map_err(unavailable)
    }
    async fn term(&self) -> Result<()> {
        self.msg.double_ack_with(AckKind::Term).await.map_err(unavailable)
    }
}
