//! Running one job's coordinator session to its end — the same code for the
//! embedded mode and the service. A run starts fresh or resumes the stored
//! main thread (after a takeover or restart): calls left without results are
//! re-attached to their tasks, never run twice.

use std::sync::Arc;

use flower_agent::guards::{DelegateGuard, SpillGuard};
use flower_agent::hooks::Hooks;
use flower_agent::provider::{Provider, SystemBlock};
use flower_agent::tool::FatalCause;
use flower_agent::{AgentError, AgentSession, Inbox, Journal, Outcome, SessionConfig, ToolSet};
use flower_bus::{Notice, TaskQueue};
use flower_model::windows::Windows;
use flower_model::{ContentBlock, JobId, JobSpec, JobState, Role, Session, SessionId, now_ms};
use flower_store::workspace::Workspace;
use flower_store::{StoreError, Workbench};
use object_store::ObjectStore;

use crate::dispatch::Dispatcher;
use crate::tools::agent::AgentTool;
use crate::tools::ask::AskTool;
use crate::tools::bash::CommandTool;
use crate::tools::read::CoordinatorRead;
use crate::tools::todo::TodoTool;

/// What a run needs. The journal is fenced by the owner's lease in the
/// service; `epoch` stamps the task messages it publishes.
#[derive(Clone)]
pub struct JobContext {
    pub journal: Journal,
    pub queue: Arc<dyn TaskQueue>,
    pub objects: Arc<dyn ObjectStore>,
    pub provider: Arc<dyn Provider>,
    pub epoch: i64,
    pub inbox: Inbox,
    /// Stops the run; its cause decides whether the job ends (a user's
    /// cancel) or is left for the next owner (lease lost, shutdown).
    pub stop: crate::stop::Stop,
    /// When a running task's message is presumed gone.
    pub sweep: crate::dispatch::Sweep,
    /// The job's qa-log, shared with whoever else logs to it in this process
    /// (the owner, for the user's messages).
    pub qa_log: crate::qa_log::QaLog,
    /// The context windows learnt in this process: the run's sessions record
    /// what a provider names, each generation's thresholds read it.
    pub windows: Windows,
    /// The namespaces' spending limits as this process's runs check them.
    pub budgets: flower_agent::spend::NamespaceBudgets,
    /// The job's namespace.
    pub namespace: String,
    /// The job's priority (its spec's).
    pub priority: u8,
}

impl JobContext {
    /// What a side session (judge, clarifier) of this run runs with.
    pub fn wiring(&self, job: JobId) -> crate::side::Wiring<'_> {
        crate::side::Wiring {
            journal: &self.journal,
            provider: self.provider.clone(),
            objects: self.objects.clone(),
            cancel: self.stop.token().clone(),
            windows: Some(self.windows.clone()),
            claimant: self.claimant(job),
        }
    }

    /// Whose model calls the run's are, in a rate-limited route's line.
    pub fn claimant(&self, job: JobId) -> flower_model::quota::Claimant {
        flower_model::quota::Claimant::new(&self.namespace, job.to_string(), self.priority)
    }
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct Finished {
    pub state: JobState,
    pub reason: Option<String>,
    pub answer: Option<String>,
    pub session: SessionId,
    pub turns: u32,
}

/// Run (or resume) the job's coordinator and record its end state.
/// `Ok(None)`: stopped to hand the job over (lease lost, shutdown) — nothing
/// ended, nothing cancelled. `Err(StoreError::Fenced)` means another owner
/// took the job: stop quietly.
pub async fn run_job(ctx: &JobContext, job_id: JobId) -> Result<Option<Finished>, StoreError> {
    let store = ctx.journal.store().clone();
    let job = store.get_job(job_id).await?;
    let spec = JobSpec::from_value(job.spec.clone()).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    if job.state == JobState::Queued {
        let written = store.set_job_state(job_id, JobState::Running, None, None, ctx.journal.fence()).await?;
        ctx.journal.announce(&written).await;
    }
    let first = match first_message(ctx, &spec, job_id).await? {
        // A continuation says first where its parent ended and what is asked now.
        Ok(first) => match &job.continues {
            Some(lineage) => {
                let workbench = Workbench::new(ctx.objects.clone(), job_id);
                format!("{}{first}", crate::continuation::preamble(store.as_ref(), &workbench, lineage).await?)
            }
            None => first,
        },
        Err(None) if ctx.stop.handing_over() => return Ok(None),
        Err(why) => {
            let (state, reason) = match why {
                Some(why) => (JobState::Failed, why),
                None => (JobState::Cancelled, "cancelled".to_string()),
            };
            record_end(ctx, job_id, state, Some(reason.clone()), None).await?;
            return Ok(Some(Finished {
                state,
                reason: Some(reason),
                answer: None,
                session: SessionId::random(),
                turns: 0,
            }));
        }
    };
    let start = open_session(ctx, &spec, job_id, first).await?;
    let limits = job_limits(ctx, &spec, &job).await?;
    let mut driven = drive(ctx, &spec, job_id, start, limits.clone()).await?;
    if let Some(judge) = &spec.workflow.judge
        && !ctx.stop.handing_over()
    {
        driven = judged(ctx, &spec, job_id, driven, limits, judge.rounds).await?;
    }
    if ctx.stop.handing_over() {
        tracing::info!(job = %job_id, cause = ?ctx.stop.cause(), "run stopped; the job is left for the next owner");
        return Ok(None);
    }
    let (state, reason, answer, turns) = decide_end(driven.outcome)?;
    let (state, reason) = match state {
        JobState::Succeeded => match all_tasks_failed(store.as_ref(), job_id).await? {
            Some(why) => (JobState::Failed, Some(why)),
            None => (state, reason),
        },
        _ => (state, reason),
    };
    record_end(ctx, job_id, state, reason.clone(), answer.clone()).await?;
    Ok(Some(Finished { state, reason, answer, session: driven.session, turns: driven.earlier_turns + turns }))
}

/// Where a run starts: the latest coordinator session resumed through the
/// pruning loader, or a new one fed the goal.
struct Start {
    session: SessionId,
    history: Vec<flower_model::Entry>,
    input: Option<Vec<ContentBlock>>,
    generation: u32,
}

/// The coordinator's first message: the goal, or with `workflow.clarify`
/// the goal with the brief and the checks (the steps run first, those whose
/// output is not in the workbench yet). `Err(None)`: stopped meanwhile;
/// `Err(Some(why))`: the job cannot start.
async fn first_message(
    ctx: &JobContext,
    spec: &JobSpec,
    job_id: JobId,
) -> Result<Result<String, Option<String>>, StoreError> {
    if !spec.workflow.clarify {
        return Ok(Ok(spec.goal.clone()));
    }
    // A resumed job finds its brief and goal in the workbench: no step runs again.
    Ok(match crate::clarify::prepare(ctx, spec, job_id).await? {
        crate::clarify::Prepared::Ready(first) => Ok(first),
        crate::clarify::Prepared::Failed(why) => Err(Some(why)),
        crate::clarify::Prepared::Stopped => Err(None),
    })
}

async fn open_session(ctx: &JobContext, spec: &JobSpec, job_id: JobId, first: String) -> Result<Start, StoreError> {
    let store = ctx.journal.store();
    let coordinator_sessions: Vec<Session> =
        store.sessions(job_id).await?.into_iter().filter(|s| s.role == Role::Coordinator).collect();
    let generation = coordinator_sessions.len().max(1) as u32;
    if let Some(s) = coordinator_sessions.last() {
        let stored = store.entries(s.id, 0, u32::MAX).await?;
        let resumed = !stored.is_empty();
        let history = load_pruned(stored, spec, &Workbench::new(ctx.objects.clone(), job_id)).await?;
        if resumed {
            // A resume: the stored transcript went through the pruning loader.
            flower_agent::metrics::metrics().prunes.inc();
        }
        if !history.is_empty() {
            tracing::info!(job = %job_id, entries = history.len(), epoch = ctx.epoch, "resuming the coordinator session");
        }
        let input = history.is_empty().then(|| vec![ContentBlock::text(first)]);
        return Ok(Start { session: s.id, history, input, generation });
    }
    let id = SessionId::random();
    let written = store
        .create_session(Session {
            id,
            job_id,
            role: Role::Coordinator,
            label: spec.coordinator.name.clone(),
            task_id: None,
            created_at: now_ms(),
        })
        .await?;
    ctx.journal.announce(&written).await;
    Ok(Start { session: id, history: Vec::new(), input: Some(vec![ContentBlock::text(first)]), generation })
}

/// How the main thread ended: its outcome (or the generation cap's
/// diagnosis), the last session, the turns of the sessions before it.
struct Driven {
    outcome: Result<Result<Outcome, AgentError>, String>,
    session: SessionId,
    earlier_turns: u32,
}

/// Run the main thread, handing off to a new session each time its context
/// fills, up to `runtime.handoff.max_generations`.
async fn drive(
    ctx: &JobContext,
    spec: &JobSpec,
    job_id: JobId,
    start: Start,
    limits: Option<Arc<flower_agent::limits::JobLimits>>,
) -> Result<Driven, StoreError> {
    let Start { mut session, mut history, mut input, mut generation } = start;
    let ho = &spec.runtime.handoff;
    let mut earlier_turns = 0;
    loop {
        // Each generation's thresholds: a window learnt from an overflow
        // error counts from the next session on.
        let thresholds = ho.enabled.then(|| ho.thresholds(&spec.model, &ctx.windows));
        let agent =
            coordinator_session(ctx, spec, job_id, session).with_limits(limits.clone()).with_handoff(thresholds);
        match agent.run(std::mem::take(&mut history), input.take()).await {
            Ok(Outcome::Handoff { forced, turns, window, .. }) => {
                if generation >= ho.max_generations {
                    let diagnosis = format!(
                        "the coordinator's main thread filled {generation} sessions (runtime.handoff.max_generations): \
                         each reached the handoff threshold{}; the goal needs a larger window, more headroom or fewer turns",
                        if forced { " or the provider's prompt limit" } else { "" }
                    );
                    return Ok(Driven { outcome: Err(diagnosis), session, earlier_turns });
                }
                let next = crate::handoff::hand_off(ctx, spec, job_id, session, generation, (forced, window)).await?;
                tracing::info!(job = %job_id, generation, turns, forced, "handoff to a new coordinator session");
                earlier_turns += turns;
                session = next.session;
                input = Some(vec![ContentBlock::text(next.first_message)]);
                generation += 1;
            }
            other => return Ok(Driven { outcome: Ok(other), session, earlier_turns }),
        }
    }
}

/// The judge loop (`workflow.judge`, docs/design.md section 11): each final
/// answer is judged; `not_yet` sends the failed checks back to the same
/// coordinator session as its next instruction, until `rounds` verdicts.
/// `unreachable` asks the user: accept the result, end
/// the job, or say in words how to go on — the words go to the coordinator
/// and the next round's judge, and earn one more round. A resumed run goes
/// on from the last stored verdict (and the answer stored to it).
async fn judged(
    ctx: &JobContext,
    spec: &JobSpec,
    job_id: JobId,
    mut driven: Driven,
    limits: Option<Arc<flower_agent::limits::JobLimits>>,
    rounds: u32,
) -> Result<Driven, StoreError> {
    use crate::judge::{Overruled, Verdict, judge, last_verdict, next_round_instruction, overrule};
    let store = ctx.journal.store().clone();
    let mut last = last_verdict(store.as_ref(), job_id).await?;
    let mut limit = rounds;
    loop {
        let (n, instruction) = match &last {
            None => (0, None),
            Some((_, Verdict::Achieved { .. })) => return Ok(driven),
            Some((n, Verdict::Unreachable { reason })) => match overrule(ctx, spec, job_id, *n, reason).await? {
                Overruled::Accepted => return Ok(driven),
                Overruled::Words(instruction) => {
                    limit = limit.max(n + 1);
                    (*n, Some(instruction))
                }
                Overruled::No(why) => {
                    driven.outcome = Err(format!("the judge found the goal unreachable (round {n}): {reason}{why}"));
                    return Ok(driven);
                }
            },
            Some((n, Verdict::NotYet { failed, reason })) if *n >= limit => {
                driven.outcome = Err(format!(
                    "the goal is not achieved after {n} judge round(s): {reason} (failed: {})",
                    failed.join("; ")
                ));
                return Ok(driven);
            }
            Some((n, Verdict::NotYet { failed, reason })) => {
                (*n, Some(next_round_instruction(*n, rounds.max(limit), failed, reason)))
            }
        };
        if let Some(instruction) = instruction {
            driven = another_round(ctx, spec, job_id, driven, limits.clone(), instruction).await?;
        }
        let round = n + 1;
        let answer = match &driven.outcome {
            Ok(Ok(Outcome::Answered { text, .. })) if !ctx.stop.is_stopped() => text.clone(),
            _ => return Ok(driven),
        };
        match judge(ctx, spec, job_id, round, limit.max(round), &answer).await? {
            Some(v) => last = Some((round, v)),
            None => return Ok(driven),
        }
    }
}

/// Back to the coordinator, in its latest session (loaded as any resume
/// is), with `instruction` as its input — unless that session already has
/// it (a run resumed mid-round goes on where it was).
async fn another_round(
    ctx: &JobContext,
    spec: &JobSpec,
    job_id: JobId,
    driven: Driven,
    limits: Option<Arc<flower_agent::limits::JobLimits>>,
    instruction: String,
) -> Result<Driven, StoreError> {
    let mut start = open_session(ctx, spec, job_id, String::new()).await?;
    let told = start.history.iter().any(|e| e.kind == flower_model::EntryKind::User && e.text() == instruction);
    start.input = (!told).then(|| vec![ContentBlock::text(instruction)]);
    let earlier = driven.earlier_turns + answered_turns(&driven);
    let mut next = drive(ctx, spec, job_id, start, limits).await?;
    next.earlier_turns += earlier;
    Ok(next)
}

fn answered_turns(d: &Driven) -> u32 {
    match &d.outcome {
        Ok(Ok(Outcome::Answered { turns, .. })) => *turns,
        _ => 0,
    }
}

/// The job's end state, reason, answer and last session's turns; the
/// store's own failures are returned instead (they are not the job's).
type End = (JobState, Option<String>, Option<String>, u32);

fn decide_end(outcome: Result<Result<Outcome, AgentError>, String>) -> Result<End, StoreError> {
    let outcome = match outcome {
        Ok(o) => o,
        Err(diagnosis) => return Ok((JobState::Failed, Some(diagnosis), None, 0)),
    };
    Ok(match outcome {
        Ok(Outcome::Answered { text, turns, .. }) => (JobState::Succeeded, None, Some(text), turns),
        Ok(Outcome::TurnLimit { turns, .. }) => (
            JobState::Failed,
            Some(format!("the coordinator reached runtime.max_turns ({turns}) without a final answer")),
            None,
            turns,
        ),
        Ok(Outcome::Cancelled { turns, .. }) => (JobState::Cancelled, Some("cancelled".into()), None, turns),
        Ok(Outcome::Budget { reason, turns, .. }) => (JobState::Failed, Some(format!("budget: {reason}")), None, turns),
        Ok(Outcome::Handoff { turns, .. }) => {
            (JobState::Failed, Some("handoff loop ended unexpectedly".into()), None, turns)
        }
        // A newer owner (fenced), an outage, or a write built on a task end
        // not stored: the owner rides them out by resuming the run.
        Err(
            AgentError::Store(
                e @ (StoreError::Fenced { .. } | StoreError::Backend { .. } | StoreError::Unconfirmed { .. }),
            )
            | AgentError::Tool {
                cause:
                    FatalCause::Store(
                        e @ (StoreError::Fenced { .. } | StoreError::Backend { .. } | StoreError::Unconfirmed { .. }),
                    ),
                ..
            },
        ) => return Err(e),
        Err(e) => (JobState::Failed, Some(e.to_string()), None, 0),
    })
}

/// Write the end: a job that did not succeed takes its unfinished tasks
/// with it (workers hear the cancel notice); a job already ended elsewhere
/// (a user's cancel) keeps that end.
async fn record_end(
    ctx: &JobContext,
    job_id: JobId,
    state: JobState,
    reason: Option<String>,
    answer: Option<String>,
) -> Result<(), StoreError> {
    let store = ctx.journal.store();
    if state != JobState::Succeeded {
        let written = store.cancel_tasks(job_id, reason.as_deref().unwrap_or("job ended")).await?;
        ctx.journal.announce(&written).await;
        let _ = ctx.journal.notifier().notify(Notice::Cancel { job: job_id }).await;
    }
    match store.set_job_state(job_id, state, reason, answer, ctx.journal.fence()).await {
        Ok(written) => ctx.journal.announce(&written).await,
        Err(StoreError::JobEnded { .. }) => {}
        Err(e) => return Err(e),
    }
    Ok(())
}

/// A job whose delegated tasks all failed has not achieved its goal, whatever
/// its coordinator answered: it ends `failed`, the answer kept beside the
/// reason. (Tool-only tasks — the coordinator's own glances — do not count:
/// a glance that fails is information, not a failed delegation.)
async fn all_tasks_failed(store: &dyn flower_store::Store, job: JobId) -> Result<Option<String>, StoreError> {
    let tasks = store.tasks(job).await?;
    let delegated: Vec<_> = tasks.iter().filter(|t| t.worker != flower_model::job::COMMAND_TASK).collect();
    let failed: Vec<_> = delegated.iter().filter(|t| t.state == flower_model::TaskState::Failed).collect();
    if delegated.is_empty() || failed.len() < delegated.len() {
        return Ok(None);
    }
    let first = failed.first().and_then(|t| t.error.as_deref()).unwrap_or("no reason recorded");
    Ok(Some(format!(
        "every delegated task failed ({} of {}; the first: {first}); the coordinator's answer is kept",
        failed.len(),
        delegated.len()
    )))
}

/// A stored history through the pruning loader (layer 4), consumed: what the
/// resumed session is fed; trimmed bodies are written where `Read` finds them.
pub async fn load_pruned(
    stored: Vec<flower_model::Entry>,
    spec: &JobSpec,
    workbench: &Workbench,
) -> Result<Vec<flower_model::Entry>, StoreError> {
    let pruned = flower_store::prune::prune(stored, &spec.runtime.pruning, &flower_agent::glance::allows);
    for t in &pruned.trims {
        if matches!(workbench.get(&t.path).await, Err(StoreError::NotFound(_))) {
            workbench.put(&t.path, t.text.clone().into_bytes()).await?;
        }
    }
    if !pruned.changes.is_empty() {
        tracing::info!(changes = pruned.changes.len(), entries = pruned.entries.len(), "history pruned for resume");
    }
    Ok(pruned.entries)
}

/// The dispatcher of this run's tasks in `job_id`'s workspace.
pub(crate) fn dispatcher(ctx: &JobContext, job_id: JobId) -> Arc<Dispatcher> {
    let workspace = Workspace::new(ctx.objects.clone(), job_id);
    Arc::new(
        Dispatcher::new(ctx.journal.clone(), ctx.queue.clone(), workspace, ctx.epoch, ctx.sweep)
            .with_stop(ctx.stop.clone())
            .with_namespace(ctx.budgets.get(&ctx.namespace)),
    )
}

/// The job's budget as raised so far, with the gate that asks for a raise
/// when its tokens or cost run out (`runtime.budget.wait` > 0) or its
/// namespace's spending limits are reached (the namespace's `wait` > 0).
async fn job_limits(
    ctx: &JobContext,
    spec: &JobSpec,
    job: &flower_model::Job,
) -> Result<Option<Arc<flower_agent::limits::JobLimits>>, StoreError> {
    let store = ctx.journal.store().clone();
    let (budget, _, _) = crate::budget::replay(store.as_ref(), job.id, &spec.runtime.budget).await?;
    let asker = crate::tools::ask::Asker::new(
        ctx.journal.clone(),
        ctx.qa_log.clone(),
        ctx.inbox.clone(),
        crate::budget::BudgetAsk::ask_options(spec.runtime.budget.raise_wait()),
        ctx.stop.clone(),
        "coordinator",
    );
    let gate =
        Arc::new(crate::budget::BudgetAsk::new(asker, store.clone(), job.id, ctx.stop.clone(), ctx.budgets.clone()));
    Ok(Some(flower_agent::limits::JobLimits::with_namespace(
        store,
        job.id,
        &budget,
        &spec.model,
        job.created_at,
        gate,
        ctx.budgets.get(&job.namespace),
    )))
}

fn coordinator_session(ctx: &JobContext, spec: &JobSpec, job_id: JobId, session: SessionId) -> AgentSession {
    let workspace = Workspace::new(ctx.objects.clone(), job_id);
    let dispatcher = dispatcher(ctx, job_id);
    let workbench = Workbench::new(ctx.objects.clone(), job_id);
    let rt = &spec.runtime;
    let mut tools = ToolSet::new();
    tools.add(Arc::new(AgentTool::new(dispatcher.clone(), spec)));
    tools.add(Arc::new(TodoTool));
    tools.add(Arc::new(CoordinatorRead::new(workbench.clone(), workspace)));
    if let Some(ask) = &rt.ask {
        tools.add(Arc::new(AskTool::new(crate::tools::ask::Asker::new(
            ctx.journal.clone(),
            ctx.qa_log.clone(),
            ctx.inbox.clone(),
            ask.clone(),
            ctx.stop.clone(),
            "coordinator",
        ))));
    }
    if rt.glance || !rt.delegate_only {
        tools.add(Arc::new(CommandTool::new(dispatcher, rt.delegate_only)));
    }
    let mut hooks = Hooks::default();
    if rt.delegate_only {
        hooks.pre.push(Arc::new(DelegateGuard { glance: rt.glance }));
    }
    if rt.workbench {
        hooks.turn.push(Arc::new(crate::index::IndexNotices::new(workbench.clone())));
    }
    hooks.post.push(Arc::new(SpillGuard { threshold: spec.spill_threshold(), workbench, mirror: None }));
    let config = SessionConfig {
        job_id,
        session_id: session,
        role: Role::Coordinator,
        main_thread: true,
        model: spec.model.clone(),
        system: crate::prompts::system_prompt(spec).into_iter().map(SystemBlock::text).collect(),
        max_turns: spec.runtime.max_turns,
        max_tokens: spec.runtime.max_output_tokens,
        cache: spec.runtime.prompt_cache,
        prune_uneventful: spec.runtime.pruning.uneventful,
        claimant: ctx.claimant(job_id),
    };
    let tools = flower_agent::surface::finish(tools, rt.tool_deferral);
    AgentSession::new(
        config,
        ctx.provider.clone(),
        Arc::new(tools),
        hooks,
        ctx.journal.clone(),
        ctx.stop.token().clone(),
    )
    .with_inbox(ctx.inbox.clone())
    .with_windows(ctx.windows.clone())
}
