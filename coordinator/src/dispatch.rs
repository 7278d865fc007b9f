//! Delegation: an `Agent` call becomes a task row (id derived from the call),
//! a task message on the queue, and — once a worker reports — the report. The
//! finished task's workspace changeset is applied here, by the job's owner, in
//! completion order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use flower_agent::Journal;
use flower_bus::{Heard, Notice, TaskMessage, TaskQueue};
use flower_model::{EventKind, JobId, SessionId, Task, TaskId};
use flower_store::workspace::{Workspace, apply};
use flower_store::{Batch, StoreError};
use tokio_util::sync::CancellationToken;

/// How often a waiting delegation re-reads the store even without a notice
/// (notices are hints; this bounds the delay if one is lost).
const RECHECK: Duration = Duration::from_secs(5);
/// The first pause before a publish is tried again ([`Dispatcher::publish`]); it doubles up to the second.
const PUBLISH_RETRY_FIRST: Duration = Duration::from_millis(50);
const PUBLISH_RETRY_MAX: Duration = Duration::from_secs(5);

/// Longest a staggered sibling waits for its shape's first child (docs/design.md, section 6).
pub const STAGGER_WAIT: Duration = Duration::from_secs(8);

/// When a running task's message is presumed gone: no worker heartbeat for
/// longer than the queue's ack wait × its delivery limit (a live worker beats
/// every few seconds; a dead one's message comes back within that time unless
/// the queue gave up on it).
#[derive(Clone, Copy, Debug)]
pub struct Sweep {
    pub stale_after: Duration,
    /// Attempts after which a stale task fails instead of being requeued.
    pub max_attempts: u32,
}

impl Default for Sweep {
    /// The defaults of the worker and queue flags: ack wait 30 s, 3 attempts (+1 delivery).
    fn default() -> Self {
        Self { stale_after: Duration::from_secs(30 * 4), max_attempts: 3 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("task queue: {0}")]
    Bus(#[from] flower_bus::BusError),
    #[error("cancelled while waiting for the task")]
    Cancelled,
    /// The run stopped to hand the job over (lease lost, shutdown): the call
    /// stays unanswered, and the next owner re-attaches to its task.
    #[error("the run stopped to hand the job over")]
    HandedOver,
}

/// A task a run waits for is one it stored, or read from the store: a row
/// gone since is a write the store took back — a Postgres crash before the
/// turn that created it was flushed (docs/design.md, "A turn that creates
/// tasks, flushed by its claims"). The run resumes from what is stored,
/// as after an outage, instead of failing the job.
fn taken_back(e: StoreError) -> DispatchError {
    match e {
        StoreError::NotFound(what) => DispatchError::Store(StoreError::backend(format!(
            "{what}: the store no longer has it (a crash took back the write that created it)"
        ))),
        e => e.into(),
    }
}

/// A delegation that cannot go on ends the coordinator's session, its cause
/// kept typed: a fenced store write is a lost lease, not a failed job.
impl From<DispatchError> for flower_agent::ToolError {
    fn from(e: DispatchError) -> Self {
        match e {
            DispatchError::Store(e) => Self::Fatal(flower_agent::tool::FatalCause::Store(e)),
            other => Self::fatal(other.to_string()),
        }
    }
}

/// A task row waiting for the next write, and who waits for it.
type PendingTask = (Task, tokio::sync::oneshot::Sender<Result<(Task, bool), StoreError>>);

/// Group commit of task rows: the calls of one turn arrive together, and
/// every row of a job's write waits for the job's event counter, so the rows
/// that arrive while a write is under way go in the next one — one
/// transaction for a fan-out, not one each. The writer runs as its own task:
/// a caller that stops waiting stops no one else's write.
struct TaskWriter {
    journal: Journal,
    /// Rows not yet written, and whether a writer is running.
    state: std::sync::Mutex<(Vec<PendingTask>, bool)>,
}

impl TaskWriter {
    async fn create(self: &Arc<Self>, task: Task) -> Result<(Task, bool), StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let start = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.0.push((task, tx));
            !std::mem::replace(&mut state.1, true)
        };
        if start {
            tokio::spawn(self.clone().drain());
        }
        rx.await.map_err(|_| StoreError::backend("the task writer stopped"))?
    }

    async fn drain(self: Arc<Self>) {
        loop {
            let batch = {
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if state.0.is_empty() {
                    state.1 = false;
                    return;
                }
                std::mem::take(&mut state.0)
            };
            let (tasks, waiters): (Vec<Task>, Vec<_>) = batch.into_iter().unzip();
            let store = self.journal.store();
            match store.create_tasks(tasks.clone(), self.journal.fence()).await {
                Ok((rows, written)) => {
                    self.journal.announce(&written).await;
                    for (waiter, row) in waiters.into_iter().zip(rows) {
                        let _ = waiter.send(Ok(row));
                    }
                }
                // One row that can never be stored (a NUL byte in a mandate)
                // must not fail its siblings: each is written alone.
                Err(StoreError::Invalid(_)) if tasks.len() > 1 => {
                    for (task, waiter) in tasks.into_iter().zip(waiters) {
                        let one = store.create_task(task, self.journal.fence()).await;
                        if let Ok((_, _, written)) = &one {
                            self.journal.announce(written).await;
                        }
                        let _ = waiter.send(one.map(|(t, created, _)| (t, created)));
                    }
                }
                Err(e) => {
                    for waiter in waiters {
                        let _ = waiter.send(Err(e.clone()));
                    }
                }
            }
        }
    }
}

/// Waiters for task ends, woken per task: one notice subscription per
/// dispatcher (a job's run) instead of one per waiting delegation, so a
/// fan-out of N wakes one waiter per task's end, not N on every notice.
#[derive(Default)]
struct TaskWaiters {
    inner: std::sync::Mutex<WaitersInner>,
}

#[derive(Default)]
struct WaitersInner {
    /// Per task, its waiters' signals. A `Notify` keeps a permit, so an end
    /// heard between a waiter's store read and its wait is not lost.
    by_task: HashMap<TaskId, Vec<Arc<tokio::sync::Notify>>>,
    /// Tasks this run dispatched and waits for, with the copy of the end
    /// their worker's notice carried, once heard. An entry is made before the
    /// task's message goes out, so a notice that beats the waiter is kept.
    expected: HashMap<TaskId, Expected>,
    /// The notice stream closed: waiters stop.
    closed: bool,
    /// Stops the listener when the dispatcher goes; set by the first waiter.
    listener: Option<tokio_util::sync::DropGuard>,
}

/// A task waited for: the copy of its end its worker's notice carried, once
/// heard, and whether every notice about it was heard (its message went out
/// after the listener subscribed) — else (a run re-attaching to a task) its
/// end may have been heard by no one: see [`Dispatcher::wait`].
#[derive(Default)]
struct Expected {
    end: Option<flower_bus::TaskEnded>,
    from_start: bool,
}

/// One waiter's registration, removed when dropped.
struct Waiting<'a> {
    waiters: &'a TaskWaiters,
    task: TaskId,
    signal: Arc<tokio::sync::Notify>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut inner = self.waiters.lock();
        if let Some(list) = inner.by_task.get_mut(&self.task) {
            list.retain(|s| !Arc::ptr_eq(s, &self.signal));
            if list.is_empty() {
                inner.by_task.remove(&self.task);
            }
        }
    }
}

impl TaskWaiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, WaitersInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Register a waiter for `task`'s end, before its row is read. The
    /// listener subscribes here, synchronously, so no notice after this
    /// call can be missed.
    fn register<'a>(self: &'a Arc<Self>, notifier: &Arc<dyn flower_bus::Notifier>, task: TaskId) -> Waiting<'a> {
        let signal = Arc::new(tokio::sync::Notify::new());
        let mut inner = self.lock();
        self.listening(&mut inner, notifier);
        inner.expected.entry(task).or_default();
        inner.by_task.entry(task).or_default().push(signal.clone());
        Waiting { waiters: self, task, signal }
    }

    /// Keep the end notice of `task`, whose message is about to go out
    /// (before anyone waits for it: a fast worker may report first).
    /// `from_start`: no notice about it can have gone out before (this run
    /// made the task, and its message follows); once not, never again.
    fn expect(self: &Arc<Self>, notifier: &Arc<dyn flower_bus::Notifier>, task: TaskId, from_start: bool) {
        let mut inner = self.lock();
        self.listening(&mut inner, notifier);
        inner.expected.entry(task).or_insert(Expected { end: None, from_start }).from_start &= from_start;
    }

    /// Whether every notice about `task` was heard (see [`Expected`]).
    fn heard_from_start(&self, task: TaskId) -> bool {
        self.lock().expected.get(&task).is_some_and(|e| e.from_start)
    }

    fn listening(self: &Arc<Self>, inner: &mut WaitersInner, notifier: &Arc<dyn flower_bus::Notifier>) {
        if inner.listener.is_none() {
            let stop = CancellationToken::new();
            tokio::spawn(Self::listen(Arc::downgrade(self), notifier.subscribe(), stop.clone()));
            inner.listener = Some(stop.drop_guard());
        }
    }

    /// The end heard for `task`, taken.
    fn heard_end(&self, task: TaskId) -> Option<flower_bus::TaskEnded> {
        self.lock().expected.get_mut(&task).and_then(|e| e.end.take())
    }

    /// `task` is no longer waited for.
    fn forget(&self, task: TaskId) {
        self.lock().expected.remove(&task);
    }

    async fn listen(waiters: std::sync::Weak<Self>, mut notices: flower_bus::NoticeStream, stop: CancellationToken) {
        loop {
            let heard = tokio::select! {
                heard = notices.recv() => heard,
                _ = stop.cancelled() => return,
            };
            let Some(waiters) = waiters.upgrade() else { return };
            let mut inner = waiters.lock();
            match heard {
                Heard::Notice(Notice::TaskDone { task, ended, .. }) => {
                    if let (Some(slot), Some(ended)) = (inner.expected.get_mut(&task), ended) {
                        slot.end = Some(*ended);
                    }
                    for signal in inner.by_task.get(&task).into_iter().flatten() {
                        signal.notify_one();
                    }
                }
                Heard::Notice(_) => {}
                // Notices were dropped: every waiter reads its row again.
                Heard::Lagged => inner.by_task.values().flatten().for_each(|signal| signal.notify_one()),
                Heard::Closed => {
                    inner.closed = true;
                    inner.by_task.values().flatten().for_each(|signal| signal.notify_one());
                    return;
                }
            }
        }
    }
}

/// A call's row as its turn's commit stored it, and whether it created it;
/// `None` until that commit.
type RowSlot = tokio::sync::watch::Sender<Option<(Task, bool)>>;

/// A message published during its row's commit: whether the queue took it as new.
type EarlyPublish = tokio::task::JoinHandle<Result<bool, flower_bus::BusError>>;

/// A delegation's end: the task as it ended, and, when its end was heard
/// before its commit, what the write storing the result must require.
#[derive(Clone, Debug)]
pub struct Delegated {
    pub task: Task,
    pub requires: Option<flower_store::TaskEnd>,
    /// Whether the attempt may have left a workspace changeset (`false`
    /// only when its worker said it left none).
    pub changeset: bool,
    /// Whether the attempt may have changed the job's workbench (`false`
    /// only when its worker said it ran no tool).
    pub workbench: bool,
}

impl Delegated {
    /// `out`, the call's result built from this end, carrying its
    /// requirement and what it did to the workbench.
    pub fn result(&self, mut out: flower_agent::ToolOutput) -> flower_agent::ToolOutput {
        out.requires.extend(self.requires);
        out.workbench_untouched = !self.workbench;
        out
    }
}

/// Forgets a waited-for task when its wait ends, however it ends.
struct Forget<'a>(&'a TaskWaiters, TaskId);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.forget(self.1);
    }
}

pub struct Dispatcher {
    journal: Journal,
    tasks: Arc<TaskWriter>,
    /// Rows going with the assistant turn that made their calls, not yet
    /// dispatched: each as that commit stored it (and whether it created it),
    /// once it committed (see [`Dispatcher::row_pending`]).
    committed: std::sync::Mutex<HashMap<TaskId, RowSlot>>,
    /// Messages published while their row's transaction was staged (see
    /// [`Dispatcher::row_staged`]): whether the queue took each as new.
    early: std::sync::Mutex<HashMap<TaskId, EarlyPublish>>,
    waiters: Arc<TaskWaiters>,
    queue: Arc<dyn TaskQueue>,
    workspace: Workspace,
    /// Changesets are applied one at a time.
    apply_lock: tokio::sync::Mutex<()>,
    epoch: i64,
    sweep: Sweep,
    stop: crate::stop::Stop,
    /// Fan-out staggering: per shape, released once its first child's first
    /// model response began streaming (or it ended, or 8 s passed).
    gates: std::sync::Mutex<std::collections::HashMap<String, tokio::sync::watch::Receiver<bool>>>,
    /// The job's namespace's limits: with a task limit, tasks start held
    /// and go out once it admits them.
    namespace: Option<Arc<flower_agent::spend::NamespaceBudget>>,
}

/// What a delegation asks for.
pub struct Delegation<'a> {
    pub job: JobId,
    pub session: SessionId,
    pub tool_use_id: &'a str,
    pub worker: &'a str,
    pub description: &'a str,
    pub mandate: &'a str,
    /// (role, provider, model) of the child, when siblings of one shape are staggered.
    pub shape: Option<String>,
}

impl Dispatcher {
    pub fn new(journal: Journal, queue: Arc<dyn TaskQueue>, workspace: Workspace, epoch: i64, sweep: Sweep) -> Self {
        Self {
            tasks: Arc::new(TaskWriter { journal: journal.clone(), state: Default::default() }),
            committed: Default::default(),
            early: Default::default(),
            waiters: Default::default(),
            journal,
            queue,
            workspace,
            apply_lock: tokio::sync::Mutex::new(()),
            epoch,
            sweep,
            stop: Default::default(),
            gates: Default::default(),
            namespace: None,
        }
    }

    /// The job's namespace's limits (its task limit holds the tasks made).
    pub fn with_namespace(mut self, namespace: Arc<flower_agent::spend::NamespaceBudget>) -> Self {
        self.namespace = Some(namespace);
        self
    }

    /// Whether the tasks made now are likely held (the store decides): the
    /// job's namespace limits its tasks, as last read — their messages are
    /// not sent before their rows commit (docs/design.md section 17, "Task limit").
    pub fn holds_tasks(&self) -> bool {
        self.namespace.as_ref().is_some_and(|n| n.limits_tasks())
    }

    /// `task`, held, once its namespace's task limit admitted it: queued.
    async fn admitted(&self, task: Task) -> Result<Task, DispatchError> {
        let Some(namespace) = &self.namespace else {
            return Err(StoreError::Invalid(format!(
                "task {} is held, and this run has no namespace to admit it",
                task.id
            ))
            .into());
        };
        tracing::info!(task = %task.id, "task held by its namespace's task limit");
        let queued = namespace.admitted(self.journal.notifier(), task.id).await?;
        Ok(queued)
    }

    /// The run's stop signal: a delegation cut off by a hand-over (not a
    /// user's cancel) is left unanswered instead of answered "cancelled".
    pub fn with_stop(mut self, stop: crate::stop::Stop) -> Self {
        self.stop = stop;
        self
    }

    fn cancelled<T>(&self) -> Result<Option<T>, DispatchError> {
        if self.stop.handing_over() { Err(DispatchError::HandedOver) } else { Ok(None) }
    }

    /// Fan-out staggering: the first child of a shape starts alone; its
    /// siblings wait until its first model response begins streaming — a
    /// notice from whichever worker runs it — so they read the prefix it
    /// wrote instead of each writing their own. At most [`STAGGER_WAIT`].
    async fn stagger(&self, d: &Delegation<'_>) -> Result<Task, DispatchError> {
        let Some(shape) = &d.shape else { return self.dispatch(d).await };
        // Ok(receiver): a sibling waits; Err(sender): this one leads.
        let role = {
            let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
            match gates.get(shape) {
                Some(rx) => Ok(rx.clone()),
                None => {
                    let (tx, rx) = tokio::sync::watch::channel(false);
                    gates.insert(shape.clone(), rx);
                    Err(tx)
                }
            }
        };
        match role {
            Ok(mut rx) => {
                let _ = tokio::time::timeout(STAGGER_WAIT, rx.wait_for(|released| *released)).await;
            }
            Err(tx) => {
                // Listen before publishing: the notice cannot be missed.
                let mut notices = self.journal.notifier().subscribe();
                let task = self.dispatch_as(d, true).await;
                let id = task.as_ref().map(|t| t.id).ok();
                tokio::spawn(async move {
                    let wait = async {
                        loop {
                            match notices.recv().await {
                                Heard::Notice(Notice::TaskStreaming { task, .. } | Notice::TaskDone { task, .. })
                                    if Some(task) == id =>
                                {
                                    break;
                                }
                                Heard::Closed => break,
                                _ => {}
                            }
                        }
                    };
                    let _ = tokio::time::timeout(STAGGER_WAIT, wait).await;
                    let _ = tx.send(true);
                });
                return task;
            }
        }
        self.dispatch(d).await
    }

    /// Whether siblings of `shape` go without waiting: its first child's
    /// first model response began streaming (or the wait for it is over).
    /// Their messages may then go out during their turn's commit, as
    /// unstaggered calls' do ([`Dispatcher::row_staged`]).
    pub fn shape_released(&self, shape: &str) -> bool {
        let gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.get(shape).is_some_and(|rx| *rx.borrow())
    }

    /// A call's row, committed with the assistant turn that made the call
    /// (and `created` by that commit, or found there): its dispatch only
    /// publishes it.
    pub fn row_committed(&self, task: Task, created: bool) {
        let mut rows = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        let slot = rows.entry(task.id).or_insert_with(|| tokio::sync::watch::channel(None).0);
        slot.send_replace(Some((task, created)));
    }

    /// A call's row goes with its turn's commit: its dispatch, which may
    /// start during that commit, waits for it instead of writing the row.
    pub fn row_pending(&self, task: &Task) {
        let mut rows = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        rows.entry(task.id).or_insert_with(|| tokio::sync::watch::channel(None).0);
    }

    /// A call's row is staged in its turn's transaction, whose first
    /// statement takes the row's creation lock (docs/design.md section 3):
    /// the message goes out now, during the commit. A worker's claim waits
    /// for the transaction (or, come before the lock, is made again until
    /// the row is there); if it never commits, the claim finds no row and
    /// drops the message.
    pub fn row_staged(&self, task: &Task) {
        self.waiters.expect(self.journal.notifier(), task.id, true);
        let msg = self.first_message(task);
        let queue = self.queue.clone();
        let publish = tokio::spawn(async move { queue.publish(msg).await });
        self.early.lock().unwrap_or_else(|p| p.into_inner()).insert(task.id, publish);
    }

    /// Publish `msg`, riding out an outage of the queue: its row is
    /// committed and the message is owed, so an unavailable queue is tried
    /// again with backoff (a NATS restart must not fail the job); only a
    /// closed queue fails the dispatch. Whether the queue took it as new.
    async fn publish(&self, msg: TaskMessage) -> Result<bool, DispatchError> {
        let mut pause = PUBLISH_RETRY_FIRST;
        loop {
            match self.queue.publish(msg.clone()).await {
                Err(flower_bus::BusError::Unavailable(e)) => {
                    tracing::warn!(task = %msg.task_id, error = %e, "task queue unavailable; publishing again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(PUBLISH_RETRY_MAX);
                }
                published => return Ok(published?),
            }
        }
    }

    /// A task's first message, with a copy of its words when small.
    fn first_message(&self, task: &Task) -> TaskMessage {
        TaskMessage {
            job_id: task.job_id,
            task_id: task.id,
            worker: task.worker.clone(),
            epoch: self.epoch,
            base_attempt: 0,
            trace: flower_bus::trace::current_traceparent(),
            body: flower_bus::TaskBody::of(task),
            republish: 0,
            stream_notice: false,
        }
    }

    /// Create the task (or find it again: the id is derived from the call) and
    /// publish it unless it already ended. A row committed with its call's
    /// turn is not written again.
    #[tracing::instrument(name = "task.publish", skip_all, fields(job = %d.job, worker = d.worker))]
    pub async fn dispatch(&self, d: &Delegation<'_>) -> Result<Task, DispatchError> {
        self.dispatch_as(d, false).await
    }

    /// [`Dispatcher::dispatch`]; `stream_notice`: the message asks its
    /// worker to announce the first model response's stream (a shape's
    /// first child, which its siblings wait for).
    async fn dispatch_as(&self, d: &Delegation<'_>, stream_notice: bool) -> Result<Task, DispatchError> {
        let task = Task::queued(d.job, d.session, d.tool_use_id, d.worker, d.description, d.mandate);
        let id = task.id;
        // The row is committed (and announced) before the message that points at it is published.
        let slot = self.committed.lock().unwrap_or_else(|p| p.into_inner()).get(&id).map(|s| s.subscribe());
        let (task, created) = match slot {
            Some(mut slot) => {
                let row = slot.wait_for(Option::is_some).await.ok().and_then(|r| r.clone());
                self.committed.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                match row {
                    Some(row) => row,
                    None => self.tasks.create(task).await?,
                }
            }
            None => self.tasks.create(task).await?,
        };
        let early = self.early.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        // A held task goes out once admitted; a message sent before (its
        // row found held) is refused by its claim, so another goes.
        let held = task.state == flower_model::TaskState::Held;
        let task = if held { self.admitted(task).await? } else { task };
        if !task.state.is_terminal() {
            self.waiters.expect(self.journal.notifier(), id, created);
            let early = match early {
                Some(handle) => handle.await.map_err(|e| flower_bus::BusError::Unavailable(e.to_string())),
                None => Err(flower_bus::BusError::Closed),
            };
            match early {
                Ok(Ok(_)) if held => {
                    self.publish(TaskMessage { republish: 1, stream_notice, ..self.first_message(&task) }).await?;
                }
                // Published during the commit, and taken as new.
                Ok(Ok(true)) => {}
                // The queue had this dispatch's id already: from a turn whose
                // transaction did not commit, if this commit created the row —
                // and a worker may have dropped that message (no row then).
                Ok(Ok(false)) if created => {
                    self.publish(TaskMessage { republish: 1, stream_notice, ..self.first_message(&task) }).await?;
                }
                Ok(Ok(false)) => {}
                _ => {
                    self.publish(TaskMessage { stream_notice, ..self.first_message(&task) }).await?;
                }
            }
            if created {
                flower_agent::metrics::metrics().tasks_queued.inc();
            }
        }
        Ok(task)
    }

    /// Wait until the task ends; its row holds the report. `queued` is the
    /// row as dispatched. An end copied in the worker's notice is taken as
    /// heard — before its commit, maybe: then it comes with the requirement
    /// that the write storing what follows from it checks
    /// ([`flower_store::Batch::requires`]).
    pub async fn wait(&self, queued: &Task, cancel: &CancellationToken) -> Result<Delegated, DispatchError> {
        let id = queued.id;
        let waiting = self.waiters.register(self.journal.notifier(), id);
        let _forget = Forget(&self.waiters, id);
        let mut requeued: Option<tokio::time::Instant> = None;
        // A task whose notices were not all heard (a run re-attaching to it)
        // may have announced its end, staged, before this run listened: the
        // first read waits for a write of the row in flight, so that end is
        // read once committed instead of at the next recheck.
        let from_start = self.waiters.heard_from_start(id);
        let mut settled = !from_start;
        // A task this run made and listened to before its message went out
        // cannot have ended unheard: its row is the one just queued, so
        // there is nothing to read before its first notice (or recheck).
        let mut unread = from_start;
        loop {
            if let Some(ended) = self.waiters.heard_end(id) {
                let requires = (!ended.committed).then_some(flower_store::TaskEnd {
                    task: id,
                    attempt: ended.attempt,
                    state: ended.state,
                });
                let (changeset, workbench) = (ended.changeset, !ended.workbench_untouched);
                return Ok(Delegated { task: ended.apply(queued.clone()), requires, changeset, workbench });
            }
            let mut read = match std::mem::take(&mut unread) {
                true => None,
                false => Some(
                    match std::mem::take(&mut settled) {
                        true => self.journal.store().settled_task(id).await,
                        false => self.journal.store().get_task(id).await,
                    }
                    .map_err(taken_back)?,
                ),
            };
            if let Some(task) = read.take_if(|t| t.state.is_terminal()) {
                return Ok(Delegated { task, requires: None, changeset: true, workbench: true });
            }
            if self.waiters.lock().closed {
                return Err(DispatchError::Bus(flower_bus::BusError::Closed));
            }
            // A requeue rides out a queue outage (see [`Dispatcher::publish`]): a cancel still ends the wait.
            if let Some(task) = &read {
                tokio::select! {
                    swept = self.sweep(task, &mut requeued) => swept?,
                    _ = cancel.cancelled() => return Err(DispatchError::Cancelled),
                }
            }
            tokio::select! {
                _ = waiting.signal.notified() => {}
                _ = tokio::time::sleep(RECHECK) => {}
                _ = cancel.cancelled() => return Err(DispatchError::Cancelled),
            }
        }
    }

    /// The sweeper: a running task with no heartbeat for
    /// [`Sweep::stale_after`] lost its message (its worker died and the queue
    /// stopped redelivering). Requeue it as its next attempts, or fail it once
    /// its attempts are spent — through the same claim a worker makes, so a
    /// late report of an older attempt is still refused. A task still queued
    /// that long may have lost its message too ([`Dispatcher::sweep_queued`]).
    async fn sweep(&self, task: &Task, requeued: &mut Option<tokio::time::Instant>) -> Result<(), DispatchError> {
        let stale = flower_model::now_ms() - task.updated_at > self.sweep.stale_after.as_millis() as i64;
        let recently = requeued.is_some_and(|at| at.elapsed() < self.sweep.stale_after);
        if !stale || recently {
            return Ok(());
        }
        if task.state == flower_model::TaskState::Queued {
            return self.sweep_queued(task, requeued).await;
        }
        if task.state != flower_model::TaskState::Running {
            return Ok(());
        }
        let store = self.journal.store();
        if task.attempt >= self.sweep.max_attempts {
            let attempt = task.attempt + 1;
            if let flower_store::Claim::Claimed { events, .. } = store.claim_task(task.id, attempt, "sweeper").await? {
                self.journal.announce(&flower_store::Written { events, ..Default::default() }).await;
                let error = format!("no worker reported after {} attempts (the last one went silent)", task.attempt);
                let outcome = flower_model::TaskOutcome::Failed { error };
                let (_, written) = store.finish_task(task.id, attempt, outcome, Default::default()).await?;
                self.journal.announce(&written).await;
                tracing::warn!(task = %task.id, attempts = task.attempt, "task failed by the sweeper");
            }
            return Ok(());
        }
        tracing::warn!(task = %task.id, attempt = task.attempt, "no heartbeat from the task's worker; requeued");
        self.publish(TaskMessage { base_attempt: task.attempt, body: None, ..self.first_message(task) }).await?;
        *requeued = Some(tokio::time::Instant::now());
        Ok(())
    }

    /// A task queued for longer than [`Sweep::stale_after`] while the queue
    /// holds no message at all (none waiting, none in flight) lost its
    /// message outright — the queue's store was lost or purged, which no
    /// dead letter reports: it is published again, under a dedupe id of its
    /// own. A queue that still holds messages may hold this one (a backlog
    /// waiting for workers): nothing is published then.
    async fn sweep_queued(
        &self,
        task: &Task,
        requeued: &mut Option<tokio::time::Instant>,
    ) -> Result<(), DispatchError> {
        match self.queue.lag().await {
            Ok(0) => {}
            Ok(_) => return Ok(()),
            // Unreachable now: the next recheck asks again.
            Err(e) => {
                tracing::debug!(task = %task.id, error = %e, "queue lag unknown; a lost message is looked for later");
                return Ok(());
            }
        }
        tracing::warn!(task = %task.id, "task queued with no message in the queue; published again");
        self.publish(TaskMessage { base_attempt: task.attempt, republish: 1, ..self.first_message(task) }).await?;
        *requeued = Some(tokio::time::Instant::now());
        Ok(())
    }

    /// Dispatch, wait for the end, and apply the task's workspace changes when
    /// it succeeded. `None` when cancelled while waiting.
    pub async fn delegate(
        &self,
        d: Delegation<'_>,
        cancel: &CancellationToken,
    ) -> Result<Option<Delegated>, DispatchError> {
        let task = tokio::select! {
            t = self.stagger(&d) => t?,
            _ = cancel.cancelled() => return self.cancelled(),
        };
        let ended = match self.wait(&task, cancel).await {
            Ok(t) => t,
            Err(DispatchError::Cancelled) => return self.cancelled(),
            Err(e) => return Err(e),
        };
        if ended.task.state == flower_model::TaskState::Succeeded {
            match self.apply_changes(&ended).await {
                Ok(_) => {}
                // Changes are applied only from a stored end: this one was not.
                Err(e @ DispatchError::Store(StoreError::Unconfirmed { .. })) => return Err(e),
                Err(e) => tracing::warn!(task = %ended.task.id, error = %e, "workspace changes not applied"),
            }
        }
        Ok(Some(ended))
    }

    /// Apply the changeset a finished task left, recording conflicts. An end
    /// heard before its commit is confirmed in the store first: the job's
    /// workspace takes changes of stored ends only.
    pub async fn apply_changes(&self, ended: &Delegated) -> Result<usize, DispatchError> {
        let task = &ended.task;
        if !ended.changeset {
            return Ok(0);
        }
        let Some(cs) = self.workspace.changeset(task.id, task.attempt).await? else { return Ok(0) };
        if let Some(end) = &ended.requires {
            let stored = self.journal.store().settled_task(task.id).await.map_err(taken_back)?;
            if !flower_store::rules::ended_as(&stored, end) {
                return Err(flower_store::rules::unconfirmed(end).into());
            }
        }
        let _one_at_a_time = self.apply_lock.lock().await;
        let mut current = self.workspace.load().await?;
        let conflicts = apply(&mut current, &cs);
        self.workspace.save(&current).await?;
        if !conflicts.is_empty() {
            let events = conflicts
                .into_iter()
                .map(|path| (task.job_id, EventKind::WorkspaceConflict { path, task: task.id }))
                .collect();
            self.journal.commit(Batch { events, ..Default::default() }).await?;
        }
        Ok(cs.changes.len())
    }
}
