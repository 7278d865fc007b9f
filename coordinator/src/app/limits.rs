//! A namespace's limits as calls of the application (docs/design.md,
//! section 17): an admin sets them, anyone of the namespace reads them with
//! what it spent, and an operator of the namespace raises a spending limit
//! by answering a job's question about it.

use flower_model::access::{Limits, Namespace, SpendLimit, check_namespace};
use flower_model::{ErrorKind, Job, JobState};

use super::access::{Caller, Owner};
use super::audit::Verb;
use super::{App, AppError, Result};

/// A namespace with what its jobs spent and run.
#[derive(Clone, Debug)]
pub struct NamespaceStatus {
    pub namespace: Namespace,
    pub spent: flower_agent::spend::Tally,
    /// Jobs started and not ended.
    pub live_jobs: u64,
    /// Jobs waiting for a raise of a budget (theirs or the namespace's).
    pub waiting_for_budget: u64,
    /// Jobs not started yet (held back while the namespace is at `max_jobs`).
    pub queued: u64,
    /// Tasks of its live jobs queued or running, and held by `max_tasks`.
    pub tasks: flower_store::TaskCounts,
}

impl App {
    /// Replace a namespace's limits (admin).
    pub async fn set_limits(&self, name: &str, limits: Limits) -> Result<Namespace> {
        let caller = self.caller()?;
        check_namespace(name).map_err(|m| AppError::invalid("namespace", m))?;
        limits.check().map_err(|(field, m)| AppError::invalid(&format!("limits.{field}"), m))?;
        self.authorize_in(&caller, Verb::SetLimits, name, name).await?;
        let store = self.b.store.clone();
        self.audited(&caller, Verb::SetLimits, name, name, async {
            store.set_limits(name, &limits).await.map_err(|e| match e {
                flower_store::StoreError::NotFound(_) => AppError::not_found(format_args!("namespace `{name}`")),
                e => e.into(),
            })
        })
        .await
    }

    /// A namespace the caller sees, with what its jobs spent today and this
    /// month and how many run; empty: the caller's.
    pub async fn namespace_status(&self, name: &str) -> Result<NamespaceStatus> {
        let p = self.caller()?.principal;
        let name = if name.is_empty() { p.namespace.clone() } else { name.to_string() };
        check_namespace(&name).map_err(|m| AppError::invalid("name", m))?;
        let missing = || AppError::not_found(format_args!("namespace `{name}`"));
        if !p.sees(&name) {
            return Err(missing());
        }
        let namespace = self.b.store.namespace(&name).await.map_err(|e| match e {
            flower_store::StoreError::NotFound(_) => missing(),
            e => e.into(),
        })?;
        let spent = flower_agent::spend::tally(self.b.store.as_ref(), &name).await?;
        let (mut live_jobs, mut waiting_for_budget, mut queued) = (0, 0, 0);
        for (ns, state, n) in self.b.store.job_counts().await? {
            if ns == name && !state.is_terminal() && state != JobState::Queued {
                live_jobs += n;
            }
            if ns == name && state == JobState::WaitingForBudget {
                waiting_for_budget += n;
            }
            if ns == name && state == JobState::Queued {
                queued += n;
            }
        }
        let tasks = self.b.store.task_counts(&name).await?;
        Ok(NamespaceStatus { namespace, spent, live_jobs, waiting_for_budget, queued, tasks })
    }

    /// When an answer is for one of the namespace's budget questions, still
    /// waiting: only an operator of the namespace may give it, and its raise
    /// is stored on the namespace first (so the job, reading the answer,
    /// finds the limit raised). A refusal is recorded. Whether a raise was
    /// stored; a question not waiting raises nothing (the answer then fails
    /// as for any question).
    pub(crate) async fn raise_for_answer(
        &self,
        caller: &Caller,
        job: &Job,
        question: &str,
        text: &str,
        option: u32,
    ) -> Result<bool> {
        // Most answers name a question of another kind: no read for them.
        if !question.is_empty() && crate::budget::namespace_question(question).is_none() {
            return Ok(false);
        }
        let pending = crate::tools::ask::pending(self.b.store.as_ref(), job.id).await?;
        let id = match (question, pending.as_slice()) {
            ("", [(one, ..)]) => one.clone(),
            ("", _) => return Ok(false),
            (given, waiting) if waiting.iter().any(|(q, ..)| q == given) => given.to_string(),
            _ => return Ok(false),
        };
        let Some(limit) = crate::budget::namespace_question(&id) else { return Ok(false) };
        let ns = job.namespace.as_str();
        if !caller.principal.allows(Verb::RaiseBudget.action(), ns, Owner::Other) {
            let e = AppError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "role `{}` may not raise namespace `{ns}`'s budget (an operator of it may)",
                    caller.principal.role
                ),
            );
            self.record(caller, Verb::RaiseBudget, ns, &job.id.to_string(), Err(&e)).await;
            return Err(e);
        }
        let option = (option > 0).then_some(option);
        let store = self.b.store.clone();
        let limits = store.namespace(ns).await?.limits;
        let Some(raised) = crate::budget::raise_namespace(&limits, limit, text, option) else { return Ok(false) };
        self.audited(caller, Verb::RaiseBudget, ns, &raise_target(limit, &limits, &raised), async {
            Ok(store.set_limits(ns, &raised).await?)
        })
        .await?;
        Ok(true)
    }
}

/// `cost-day $1.0000 -> $2.0000`, as the audit log shows a raise.
fn raise_target(limit: SpendLimit, before: &Limits, after: &Limits) -> String {
    let show = |l: &Limits| limit.get(l).map(|v| limit.amount(v)).unwrap_or_default();
    format!("{} {} -> {}", limit.as_str(), show(before), show(after))
}
