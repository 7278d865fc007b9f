//! The calls that read a job: the list, events, sessions and their
//! entries, the workbench, the workflow record and the context report.

use std::collections::BTreeMap;

use bytes::Bytes;
use flower_model::{Entry, Event, EventKind, Job, JobId, Session, SessionId, Task, TaskId};
use flower_store::{StoreError, Workbench};

use super::input::{self, parse_id};
use super::{App, AppError, Result};

/// One attempt of a task, from its events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub attempt: u32,
    pub started: i64,
    /// When it finished, and whether it succeeded.
    pub finished: Option<(i64, bool)>,
}

// Views take a job id that `App::job` returned (it checked that the caller
// sees the job's namespace).

/// Most jobs, events or entries one read returns.
pub const MAX_PAGE: u32 = 1000;

/// A page size as asked: 0 for `default`, at most [`MAX_PAGE`].
pub fn page(asked: u32, default: u32) -> u32 {
    if asked == 0 { default } else { asked.min(MAX_PAGE) }
}

impl App {
    /// The most recent jobs of the caller's namespace, newest first (an
    /// admin's: of every namespace).
    pub async fn list(&self, limit: u32) -> Result<Vec<Job>> {
        self.list_in("", limit).await
    }

    /// The most recent jobs of `namespace` (empty: the caller's; an
    /// admin's: every namespace), newest first. Another namespace than the
    /// caller's is `PERMISSION_DENIED` but for an admin.
    pub async fn list_in(&self, namespace: &str, limit: u32) -> Result<Vec<Job>> {
        let scope = self.namespace_scope("namespace", namespace)?;
        Ok(self.b.store.list_jobs(scope.as_deref(), page(limit, 50)).await?)
    }

    /// A job's events after `after` (0: from the first), at most `limit`.
    pub async fn events(&self, job: JobId, after: i64, limit: u32) -> Result<Vec<Event>> {
        if after < 0 {
            return Err(AppError::invalid("after_seq", "must be 0 or a sequence number already seen"));
        }
        Ok(self.b.store.events(job, after, page(limit, 500)).await?)
    }

    /// A job's sessions, in the order they began.
    pub async fn sessions(&self, job: JobId) -> Result<Vec<Session>> {
        Ok(self.b.store.sessions(job).await?)
    }

    /// Entries of one of `job`'s sessions after `after`, at most `limit`.
    pub async fn entries(&self, job: JobId, session: &str, after: i64, limit: u32) -> Result<Vec<Entry>> {
        let session: SessionId = parse_id("session_id", session)?;
        if !self.b.store.sessions(job).await?.iter().any(|s| s.id == session) {
            return Err(AppError::not_found(format_args!("session {session} of job {job}")));
        }
        if after < 0 {
            return Err(AppError::invalid("after_seq", "must be 0 or more"));
        }
        Ok(self.b.store.entries(session, after, page(limit, 200)).await?)
    }

    /// The files of a job's workbench (path, size).
    pub async fn artifacts(&self, job: JobId) -> Result<Vec<(String, u64)>> {
        Ok(Workbench::new(self.b.objects.clone(), job).list().await?)
    }

    /// One file of a job's workbench (`.flower/` in front is allowed).
    pub async fn artifact(&self, job: JobId, path: &str) -> Result<Bytes> {
        let path = path.trim_start_matches(".flower/");
        input::check_path("path", path)?;
        Workbench::new(self.b.objects.clone(), job).get(path).await.map_err(|e| match e {
            StoreError::NotFound(_) => AppError::not_found(format_args!("{path} in the workbench of job {job}")),
            other => other.into(),
        })
    }

    /// A job's workflow record: lineage, steps, verdicts, questions.
    pub async fn workflow(&self, job: JobId) -> Result<crate::record::Record> {
        Ok(crate::record::workflow(self.b.store.as_ref(), job).await?)
    }

    /// A job by its id, as stored now (a front-end that already holds a
    /// checked id; checked again: another namespace's is `NOT_FOUND`).
    pub async fn get(&self, job: JobId) -> Result<Job> {
        let found = self.b.store.get_job(job).await?;
        if !self.caller()?.principal.sees(&found.namespace) {
            return Err(super::not_found(job));
        }
        Ok(found)
    }

    /// A job's tasks, in the order they were created.
    pub async fn tasks(&self, job: JobId) -> Result<Vec<Task>> {
        Ok(self.b.store.tasks(job).await?)
    }

    /// One of `job`'s sessions.
    pub async fn session(&self, job: JobId, session: &str) -> Result<Session> {
        let id: SessionId = parse_id("session_id", session)?;
        let found = self.b.store.get_session(id).await?;
        match found.job_id == job {
            true => Ok(found),
            false => Err(AppError::not_found(format_args!("session {id} of job {job}"))),
        }
    }

    /// Every entry of one of `job`'s sessions after `after` (a whole
    /// transcript read for a view, e.g. the pruned one), checked as [`App::entries`].
    pub async fn all_entries(&self, job: JobId, session: &str, after: i64) -> Result<Vec<Entry>> {
        let mut out = self.entries(job, session, after, MAX_PAGE).await?;
        if let Some(last) = out.last().map(|e| e.seq).filter(|_| out.len() == MAX_PAGE as usize) {
            let id: SessionId = parse_id("session_id", session)?;
            out.extend(self.b.store.entries(id, last, u32::MAX).await?);
        }
        Ok(out)
    }

    /// Questions `job` waits on: (id, question, options), in the order asked.
    pub async fn pending_questions(&self, job: JobId) -> Result<Vec<(String, String, Vec<String>)>> {
        Ok(crate::tools::ask::pending(self.b.store.as_ref(), job).await?)
    }

    /// Every event of `job` from the first, in order, each given to `f`
    /// (read in pages; nothing is held but what `f` keeps).
    pub async fn scan_events(&self, job: JobId, f: impl FnMut(&Event)) -> Result<()> {
        flower_store::scan_events(self.b.store.as_ref(), job, 0, f).await?;
        Ok(())
    }

    /// Each task's attempts, from `job`'s events.
    pub async fn attempts(&self, job: JobId) -> Result<BTreeMap<TaskId, Vec<Attempt>>> {
        let mut out: BTreeMap<TaskId, Vec<Attempt>> = BTreeMap::new();
        self.scan_events(job, |e| match &e.kind {
            EventKind::TaskStarted { task, attempt, .. } => {
                out.entry(*task).or_default().push(Attempt { attempt: *attempt, started: e.at, finished: None })
            }
            EventKind::TaskFinished { task, attempt, succeeded, .. } => {
                if let Some(a) = out.get_mut(task).and_then(|v| v.iter_mut().rfind(|a| a.attempt == *attempt)) {
                    a.finished = Some((e.at, *succeeded));
                }
            }
            _ => {}
        })
        .await?;
        Ok(out)
    }

    /// A job's context report (main thread vs subagents).
    pub async fn context(&self, job: JobId) -> Result<crate::context::ContextReport> {
        Ok(crate::context::report(self.b.store.as_ref(), job).await?)
    }
}
