//! The run of one attempt: the worker agent built for it (its tools, MCP
//! servers connected, guards and hooks, prompt, budget, and its history
//! when it resumes) and run to its answer — or, for a tool-only task, the
//! coordinator's command run with no model call — and what the outcome
//! means for the task: its report, or why there is none.

use std::path::Path;
use std::sync::Arc;

use flower_agent::guards::{DelegateGuard, SpillGuard};
use flower_agent::hooks::Hooks;
use flower_agent::provider::SystemBlock;
use flower_agent::{AgentError, AgentSession, FatalCause, Outcome, SessionConfig, ToolSet};
use flower_bus::Notice;
use flower_model::{Entry, Job, JobSpec, Role, Task, Usage, WorkerSpec};
use flower_store::workbench::MOUNT;
use flower_store::{Batch, StoreError};
use tokio_util::sync::CancellationToken;

use super::early::Early;
use super::end::Workbench;
use super::folder::{Opened, TaskDir};
use super::{Failure, Reported, Worker};
use crate::tools::worker_surface;

/// How an attempt's run starts: `fresh`, the claim opened the task's
/// session (no stored history to take up); `stream_notice`, its message
/// asks for the first model response's stream to be announced (the first
/// child of a staggered shape, [`flower_bus::TaskMessage::stream_notice`]).
#[derive(Clone, Copy)]
pub(super) struct Start {
    pub(super) fresh: bool,
    pub(super) stream_notice: bool,
}

/// What a run gives its attempt's end: the report (or why there is none),
/// and the final answer's uncommitted batch.
pub(super) type Ran = (Reported, Batch);

/// A built worker agent, what it starts from, and the MCP servers to close after it.
struct WorkerRun {
    agent: AgentSession,
    history: Vec<Entry>,
    input: Option<Vec<flower_model::ContentBlock>>,
    mcp: crate::mcp::McpClients,
}

impl Worker {
    /// Run the worker agent for one attempt; the report, or why there is
    /// none, and the final answer's uncommitted batch (see
    /// [`AgentSession::with_held_answer`]), started as `start` says.
    /// `early`: the run started before its claim committed ([`super::early`]).
    pub(super) async fn execute(
        &self,
        task: &Task,
        attempt: u32,
        opened: Opened,
        start: Start,
        cancel: CancellationToken,
        early: Option<&Early>,
    ) -> Ran {
        match self.execute_held(task, attempt, opened, start, cancel, early).await {
            Ok((result, held)) => (result, held),
            Err(failure) => (Err(failure), Batch::default()),
        }
    }

    async fn execute_held(
        &self,
        task: &Task,
        attempt: u32,
        opened: Opened,
        start: Start,
        cancel: CancellationToken,
        early: Option<&Early>,
    ) -> Result<Ran, (Failure, Usage)> {
        let none = Usage::default();
        let (cached, dir) = opened?;
        let (job, spec) = &*cached;
        if task.worker == flower_model::job::COMMAND_TASK {
            return Ok((self.run_command(task, attempt, &dir, cancel).await, Batch::default()));
        }
        let mut run = self.build_session(task, job, spec, &dir, start.fresh, cancel).await.map_err(|f| (f, none))?;
        // Only a shape's first child is waited for by staggered siblings:
        // the other tasks send no notice of their stream.
        if start.stream_notice {
            run.agent = run.agent.with_observer(self.first_stream_observer(task));
        }
        if let Some(early) = early {
            run.agent = run.agent.with_gate(early.gate.clone());
        }
        let outcome = run.agent.run(run.history, run.input).await;
        let held = run.agent.take_held().unwrap_or_default();
        run.mcp.close().await;
        // An answer on the first turn ran no tool: the directory is as checked out.
        let workbench = if matches!(outcome, Ok(Outcome::Answered { turns: 1, .. })) && spec.mcp_servers.is_empty() {
            Workbench::Untouched
        } else {
            Workbench::MayHaveChanged
        };
        let refused = match early {
            Some(early) => self.refused_by_claim(early, task, attempt, &outcome, &held, workbench).await,
            None => false,
        };
        let kept = if refused || workbench == Workbench::Untouched {
            self.release_dir(task.job_id, &dir).await;
            Ok(())
        } else {
            // Whatever happened, what the task wrote is kept.
            self.close_dir(task, attempt, &dir).await
        };
        Ok((report(task, outcome, kept), held))
    }

    /// The worker agent of this attempt: its tools (MCP servers connected),
    /// guards and hooks, prompt and budget, and its history.
    async fn build_session(
        &self,
        task: &Task,
        job: &Job,
        spec: &JobSpec,
        dir: &TaskDir,
        fresh: bool,
        cancel: CancellationToken,
    ) -> Result<WorkerRun, Failure> {
        let Some(wspec) = spec.workers.get(&task.worker) else {
            return Err(Failure::fatal(format!("this job has no worker named `{}`", task.worker)));
        };
        let provider = self
            .providers
            .for_job(job.id, spec, spec.worker_route(wspec))
            .map_err(|e| Failure::fatal(e.to_string()))?;
        let (mcp_tools, mcp) = if spec.mcp_servers.is_empty() {
            (Vec::new(), crate::mcp::McpClients::default())
        } else {
            crate::mcp::connect(&spec.mcp_servers, &dir.path, &dir.limits, self.opts.tools.policy())
                .await
                .map_err(Failure::fatal)?
        };
        let tools = Arc::new(worker_surface(spec, &dir.sandbox, &dir.limits, mcp_tools));
        let hooks = worker_hooks(task, spec, wspec, dir);
        let history = if fresh { Vec::new() } else { self.load_history(task, spec, &dir.path).await? };
        let input = history.is_empty().then(|| vec![flower_model::ContentBlock::text(task.mandate.clone())]);
        let config = session_config(task, job, spec, wspec, &tools);
        // While the coordinator may ask for a raise (`runtime.budget.wait`),
        // it is the budget's gate: a worker stops on the deadline only, the
        // tasks in flight finish, and the coordinator's next call asks.
        let mut budget = spec.runtime.budget.clone();
        if !budget.raise_wait().is_zero() {
            (budget.max_tokens, budget.max_cost_usd) = (None, None);
        }
        let limits = flower_agent::limits::JobLimits::new(
            self.journal.store().clone(),
            job.id,
            &budget,
            &spec.model,
            job.created_at,
            None,
        );
        let agent = AgentSession::new(config, provider, tools, hooks, self.journal.clone(), cancel)
            .with_held_answer()
            .with_limits(limits)
            .with_windows(self.opts.windows.clone());
        Ok(WorkerRun { agent, history, input, mcp })
    }

    /// The subagent's session row, and its stored history through the pruning
    /// loader (a redelivered task resumes it); trimmed bodies are written
    /// under the mounted workbench, where the agent's `Read` finds them.
    async fn load_history(&self, task: &Task, spec: &JobSpec, workdir: &Path) -> Result<Vec<Entry>, Failure> {
        let store = self.journal.store();
        // The session row was registered with the claim.
        let session = task.id.session();
        let stored = store.entries(session, 0, u32::MAX).await?;
        let resumed = !stored.is_empty();
        let pruned = flower_store::prune::prune(stored, &spec.runtime.pruning, &flower_agent::glance::allows);
        if resumed {
            // A resume (a redelivered task): its stored transcript was pruned.
            flower_agent::metrics::metrics().prunes.inc();
        }
        for t in &pruned.trims {
            let local = workdir.join(MOUNT).join(&t.path);
            if let Some(parent) = local.parent() {
                let _ = tokio::fs::create_dir_all(parent).await;
            }
            let _ = tokio::fs::write(&local, &t.text).await;
        }
        Ok(pruned.entries)
    }

    /// The first streamed event of this task's first model call releases
    /// staggered siblings of its shape (a notice: they may be anywhere).
    fn first_stream_observer(&self, task: &Task) -> flower_agent::provider::Observer {
        let first = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (notifier, job_id, task_id) = (self.journal.notifier().clone(), task.job_id, task.id);
        Arc::new(move |ev| {
            if matches!(ev, flower_agent::provider::StreamEvent::Started)
                && !first.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                let notifier = notifier.clone();
                tokio::spawn(async move {
                    let _ = notifier.notify(Notice::TaskStreaming { job: job_id, task: task_id }).await;
                });
            }
        })
    }

    /// A tool-only task: the coordinator's command, run here with no model call.
    async fn run_command(&self, task: &Task, attempt: u32, dir: &TaskDir, cancel: CancellationToken) -> Reported {
        let none = Usage::default();
        let bash = crate::tools::bash::BashTool::new(dir.sandbox.clone(), &dir.limits);
        let ctx = flower_agent::ToolContext {
            job_id: task.job_id,
            session_id: task.parent_session,
            role: Role::Worker,
            tool_use_id: task.tool_use_id.clone(),
            cancel,
        };
        let result = flower_agent::Tool::call(&bash, serde_json::json!({"command": task.mandate}), &ctx).await;
        let kept = self.close_dir(task, attempt, dir).await;
        kept.map_err(|e| (Failure::store("the command's changes could not be saved", e), none))?;
        match result {
            Ok(out) => {
                let text = flower_model::content::result_text(&out.content);
                if out.is_error { Err((Failure::fatal(text), none)) } else { Ok((text, none)) }
            }
            Err(e) => Err((Failure::fatal(e.to_string()), none)),
        }
    }
}

/// The guards and hooks of a worker's session.
fn worker_hooks(task: &Task, spec: &JobSpec, wspec: &WorkerSpec, dir: &TaskDir) -> Hooks {
    let spill = Arc::new(SpillGuard {
        threshold: spec.spill_threshold(),
        workbench: dir.filler.workbench.clone(),
        mirror: Some(dir.path.join(MOUNT)),
    });
    // The same guards as the coordinator's: a subagent is never denied.
    let guard = Arc::new(DelegateGuard { glance: spec.runtime.glance });
    let own = Arc::new(crate::tools::WorkerToolsGuard::new(&task.worker, &wspec.tools));
    Hooks { pre: vec![guard, own], post: vec![spill, dir.filler.sync.clone()], turn: vec![] }
}

/// Who the worker's session is and what bounds it.
fn session_config(task: &Task, job: &Job, spec: &JobSpec, wspec: &WorkerSpec, tools: &ToolSet) -> SessionConfig {
    SessionConfig {
        job_id: task.job_id,
        session_id: task.id.session(),
        role: Role::Worker,
        main_thread: false,
        model: spec.worker_model(wspec),
        system: crate::prompts::system_prompt(&task.worker, wspec, spec.runtime.workbench)
            .into_iter()
            .chain(flower_agent::surface::index_text(tools))
            .map(SystemBlock::text)
            .collect(),
        max_turns: spec.runtime.worker_max_turns,
        max_tokens: spec.runtime.max_output_tokens,
        cache: spec.runtime.prompt_cache,
        prune_uneventful: spec.runtime.pruning.uneventful,
        claimant: flower_model::quota::Claimant {
            task: task.id.to_string(),
            ..flower_model::quota::Claimant::new(&job.namespace, job.id.to_string(), spec.priority())
        },
    }
}

/// What the agent's outcome means for the task: its report, or why there is
/// none. `kept` is whether the task's changes were saved.
fn report(task: &Task, outcome: Result<Outcome, AgentError>, kept: Result<(), StoreError>) -> Reported {
    let none = Usage::default();
    match outcome {
        Ok(Outcome::Answered { text, usage, .. }) => match kept {
            Ok(()) => Ok((text, usage)),
            Err(e) => Err((Failure::store("the task's changes could not be saved", e), usage)),
        },
        Ok(Outcome::TurnLimit { turns, usage }) => {
            let reason = format!("worker `{}` reached its turn limit ({turns}) without a report", task.worker);
            Err((Failure::fatal(reason), usage))
        }
        Ok(Outcome::Cancelled { usage, .. }) => Err((Failure::fatal("cancelled"), usage)),
        Ok(Outcome::Handoff { usage, .. }) => Err((Failure::fatal("the worker's context is full"), usage)),
        Ok(Outcome::Budget { reason, usage, .. }) => {
            Err((Failure::fatal(format!("the job's budget is spent: {reason}")), usage))
        }
        // The transcript could not be stored: the next delivery resumes it.
        Err(AgentError::Store(e)) => Err((Failure::store("transcript store", e), none)),
        // A tool's store error is judged as the transcript's: an unreachable
        // store is retried on redelivery, a refusal (fenced) is not.
        Err(AgentError::Tool { tool, cause: FatalCause::Store(e) }) => Err((Failure::store(&tool, e), none)),
        Err(e) => Err((Failure::fatal(e.to_string()), none)),
    }
}
