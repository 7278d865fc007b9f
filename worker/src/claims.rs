//! Claims written together: a worker process's claims asked for while one
//! write of claims is under way wait for it, then go in one transaction
//! ([`Store::claim_tasks_ending`]): one commit for the group, and one hold
//! of each job's row where there were as many as the group's claims. A
//! claim asked for while no write is under way goes at once, alone, so a
//! lone claim waits for nothing (docs/design.md section 3, "Claims written
//! together").

use std::sync::{Arc, Mutex};

use flower_store::{ClaimAnswer, ClaimRequest, Store, StoreError};
use tokio::sync::oneshot;

/// Claims per transaction at most (a worker's slots bound them anyway).
const GROUP_MAX: usize = 64;

type Reply = oneshot::Sender<Result<ClaimAnswer, StoreError>>;

pub(crate) struct ClaimWriter {
    store: Arc<dyn Store>,
    queue: Mutex<Queue>,
    /// Groups written so far.
    groups: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<(ClaimRequest, Reply)>,
    /// A writer task is running: it takes what waits when its write is over.
    writing: bool,
}

impl ClaimWriter {
    pub(crate) fn new(store: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Self { store, queue: Mutex::new(Queue::default()), groups: Default::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Store::claim_task_ending`], written with the claims that wait beside it.
    pub(crate) async fn claim(self: &Arc<Self>, request: ClaimRequest) -> Result<ClaimAnswer, StoreError> {
        let (reply, answer) = oneshot::channel();
        let lead = {
            let mut queue = self.lock();
            queue.waiting.push((request, reply));
            !std::mem::replace(&mut queue.writing, true)
        };
        if lead {
            // Its own task: a caller that goes away takes no other claim's
            // write with it.
            let writer = self.clone();
            tokio::spawn(async move { writer.write_all().await });
        }
        answer.await.unwrap_or_else(|_| Err(StoreError::backend("the claim writer stopped")))
    }

    /// Write what waits, group after group, until nothing does.
    async fn write_all(self: Arc<Self>) {
        // Should a write panic, the claims waiting are answered with an
        // error (their callers retry) and the next claim starts a writer.
        let _writing = Writing(&self);
        loop {
            let group: Vec<(ClaimRequest, Reply)> = {
                let mut queue = self.lock();
                if queue.waiting.is_empty() {
                    queue.writing = false;
                    return;
                }
                let n = queue.waiting.len().min(GROUP_MAX);
                queue.waiting.drain(..n).collect()
            };
            let (requests, replies): (Vec<ClaimRequest>, Vec<Reply>) = group.into_iter().unzip();
            self.groups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let answers = self.write(&requests).await;
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
        }
    }

    /// One group's write. A group that fails as a whole — one claim's end
    /// refused (a fence, a required end), or the store unreachable — is
    /// written again claim by claim, so that each gets its own answer.
    async fn write(&self, requests: &[ClaimRequest]) -> Vec<Result<ClaimAnswer, StoreError>> {
        match self.store.claim_tasks_ending(requests).await {
            Ok(answers) => answers,
            Err(e) if requests.len() == 1 => vec![Err(e)],
            Err(e) => {
                tracing::debug!(claims = requests.len(), error = %e, "a group of claims failed; each again alone");
                let mut answers = Vec::with_capacity(requests.len());
                for r in requests {
                    answers.push(
                        self.store.claim_task_ending(r.task, r.attempt, &r.worker_id, r.session.clone(), &r.end).await,
                    );
                }
                answers
            }
        }
    }
}

/// When a writer task ends by a panic: the waiting claims answered with an
/// error (their replies dropped), the writing flag cleared so that the next
/// claim starts another writer.
struct Writing<'a>(&'a ClaimWriter);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut queue = self.0.lock();
            queue.waiting.clear();
            queue.writing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use flower_model::{JobId, SessionId, Task};
    use flower_store::{Claim, EndOffer, NewJob, SqliteStore};

    use super::*;

    #[tokio::test]
    async fn claims_that_wait_go_in_one_write() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().unwrap());
        let job = JobId::random();
        let new = NewJob::new(job, "j", serde_json::json!({}));
        store.create_job(new).await.unwrap();
        let tasks: Vec<Task> =
            (0..6).map(|i| Task::queued(job, SessionId::random(), &format!("toolu_{i}"), "w", "d", "go")).collect();
        store.create_tasks(tasks.clone(), None).await.unwrap();
        let writer = ClaimWriter::new(store.clone());
        // A write under way: every claim asked for meanwhile waits.
        writer.lock().writing = true;
        let claims: Vec<_> = tasks
            .iter()
            .map(|t| {
                let request = ClaimRequest {
                    task: t.id,
                    attempt: 1,
                    worker_id: "w1".into(),
                    session: None,
                    end: EndOffer::default(),
                };
                let writer = writer.clone();
                tokio::spawn(async move { writer.claim(request).await })
            })
            .collect();
        while writer.lock().waiting.len() < tasks.len() {
            tokio::task::yield_now().await;
        }
        // The write under way ends: its writer takes all that waited, at once.
        let writes = writer.clone();
        tokio::spawn(async move { writes.write_all().await });
        for (claim, task) in claims.into_iter().zip(&tasks) {
            let (claim, end) = claim.await.unwrap().unwrap();
            assert!(matches!(claim, Claim::Claimed { task: ref t, .. } if t.id == task.id) && end.is_none());
        }
        assert_eq!(writer.groups.load(std::sync::atomic::Ordering::Relaxed), 1, "one write for the six");
        assert!(!writer.lock().writing, "the writer stopped with nothing left");
        // Nothing under way: a claim goes at once, alone.
        let (claim, _) = writer
            .claim(ClaimRequest {
                task: tasks[0].id,
                attempt: 1,
                worker_id: "w2".into(),
                session: None,
                end: EndOffer::default(),
            })
            .await
            .unwrap();
        assert!(matches!(claim, Claim::Claimed { .. } | Claim::Superseded { .. }), "{claim:?}");
        assert_eq!(writer.groups.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
