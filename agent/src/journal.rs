//! The write path: commit to the store, *then* notify. Every writer goes
//! through here so a notice is never published for a row that is not committed.

use std::sync::Arc;

use flower_bus::{Notice, Notifier};
use flower_model::{Entry, EventKind, JobId, Usage};
use flower_store::{Batch, Fence, Store, StoreError, Written};
use uuid::Uuid;

#[derive(Clone)]
pub struct Journal {
    store: Arc<dyn Store>,
    notifier: Arc<dyn Notifier>,
    /// The coordinator's lease: every batch it commits is fenced by it.
    fence: Option<Fence>,
}

impl Journal {
    pub fn new(store: Arc<dyn Store>, notifier: Arc<dyn Notifier>) -> Self {
        Self { store, notifier, fence: None }
    }

    /// The same journal, with every batch fenced by a coordinator's lease.
    pub fn fenced(&self, fence: Fence) -> Self {
        Self { fence: Some(fence), ..self.clone() }
    }

    pub fn fence(&self) -> Option<Fence> {
        self.fence
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn notifier(&self) -> &Arc<dyn Notifier> {
        &self.notifier
    }

    /// Commit a batch in one transaction, then notify.
    pub async fn commit(&self, mut batch: Batch) -> Result<Written, StoreError> {
        batch.fence = batch.fence.or(self.fence);
        let written = self.store.append(batch).await?;
        self.announce(&written).await;
        Ok(written)
    }

    /// Notify that the events of a committed write exist.
    pub async fn announce(&self, written: &Written) {
        if let Some(last) = written.events.last() {
            // Notices are hints: a failed notify only delays readers.
            if let Err(e) = self.notifier.notify(Notice::Events { job: last.job_id, seq: last.seq }).await {
                tracing::warn!(error = %e, "notice not published");
            }
        }
    }
}

/// Buffers one session's entries, chaining `parent_uuid`, until the next
/// flush. The loop flushes before any effect that depends on the entries (a
/// tool run, a publish, an answer).
pub struct TranscriptWriter {
    journal: Journal,
    last: Option<Uuid>,
    pending: Batch,
}

impl TranscriptWriter {
    /// Continue after `last` (the newest stored entry, if any).
    pub fn new(journal: Journal, last: Option<Uuid>) -> Self {
        Self { journal, last, pending: Batch::default() }
    }

    /// Queue an entry, chained to the previous one.
    pub fn push(&mut self, mut entry: Entry) -> Uuid {
        entry.parent_uuid = self.last;
        self.last = Some(entry.uuid);
        let uuid = entry.uuid;
        self.pending.entries.push(entry);
        uuid
    }

    /// Queue a task row to create with the next commit.
    pub fn task(&mut self, task: flower_model::Task) {
        self.pending.tasks.push(task);
    }

    /// The next write commits only if this task end is stored.
    pub fn require(&mut self, end: flower_store::TaskEnd) {
        self.pending.requires.push(end);
    }

    /// Called when the next write is staged (see [`flower_store::Staged`]).
    pub fn on_staged(&mut self, staged: flower_store::Staged) {
        self.pending.staged = Some(staged);
    }

    pub fn event(&mut self, job: JobId, kind: EventKind) {
        self.pending.events.push((job, kind));
    }

    pub fn usage(&mut self, job: JobId, usage: Usage) {
        match &mut self.pending.usage {
            Some((_, u)) => u.add(&usage),
            None => self.pending.usage = Some((job, usage)),
        }
    }

    /// What is queued, taken out uncommitted (for a caller committing it with more).
    pub fn take(&mut self) -> Batch {
        std::mem::take(&mut self.pending)
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Commit everything queued, in one transaction.
    pub async fn flush(&mut self) -> Result<Written, StoreError> {
        let batch = std::mem::take(&mut self.pending);
        self.journal.commit(batch).await
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }
}
