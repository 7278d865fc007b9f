//! The agent loop shared by the coordinator and workers: build a request from
//! the session's history, call the provider (streaming), run the tool calls
//! (concurrency-safe ones in parallel), append the results, repeat until a
//! final answer or the turn limit. Every entry is stored as it happens.
//!
//! [`AgentSession::run`] reads as the turn it runs, one method a phase:
//! `resume` (heal the stored history), `stop_before_turn` (handoff, cancel,
//! turn limit, budget), `drain_inbox`, `plan_rewrite` (uneventful pruning,
//! loaded schemas), `build_request` (the cache plan), `send`,
//! `record_response`, then `run_calls` and `record_results`. Running the
//! calls themselves is [`calls`]'s.

use std::ops::ControlFlow;
use std::sync::Arc;

use flower_model::windows::Windows;
use flower_model::{ContentBlock, Entry, EntryKind, EventKind, JobId, ResultBlock, Role, SessionId, Usage};
use tokio_util::sync::CancellationToken;

use crate::history::{NEVER_PRODUCED, extend_messages, unanswered_calls};
use crate::hooks::Hooks;
use crate::journal::{Journal, TranscriptWriter};
use crate::provider::{CachePlan, Observer, Provider, ProviderError, Request, Response, StreamEvent, SystemBlock};
use crate::tool::{FatalCause, ToolOutput, ToolSet};

mod calls;

/// Who the session is and what bounds it.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    pub job_id: JobId,
    pub session_id: SessionId,
    pub role: Role,
    /// True for the coordinator's main thread.
    pub main_thread: bool,
    pub model: String,
    pub system: Vec<SystemBlock>,
    pub max_turns: u32,
    pub max_tokens: u32,
    /// Where the prompt-cache breakpoints go.
    pub cache: flower_model::spec::CacheMode,
    /// Prune uneventful old tool output from the request view (see [`crate::surface::uneventful`]).
    pub prune_uneventful: bool,
    /// Whose calls these are, for a rate-limited route's line.
    pub claimant: flower_model::quota::Claimant,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The model answered without calling a tool.
    Answered {
        text: String,
        turns: u32,
        usage: Usage,
    },
    /// The main thread reached its handoff threshold (or the provider said the
    /// prompt is too long: `forced`); a new session should continue.
    Handoff {
        forced: bool,
        turns: u32,
        usage: Usage,
        /// The model's real window, when the provider's overflow error named
        /// it (already recorded in the session's [`Windows`], if it has one).
        window: Option<u64>,
    },
    /// The job's budget (tokens, cost, deadline) is spent.
    Budget {
        reason: String,
        turns: u32,
        usage: Usage,
    },
    /// `max_turns` model calls were made without a final answer.
    TurnLimit {
        turns: u32,
        usage: Usage,
    },
    Cancelled {
        turns: u32,
        usage: Usage,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The provider failed for good (fatal, or retries exhausted).
    #[error("model call failed: {0}")]
    Provider(#[from] ProviderError),
    /// The transcript could not be stored: nothing more may happen.
    #[error("transcript store: {0}")]
    Store(#[from] flower_store::StoreError),
    /// A tool ended the session. Its cause stays typed so the runner can
    /// match it: `FatalCause::Store(StoreError::Fenced { .. })` means the job
    /// has a newer owner, as it does for [`AgentError::Store`].
    #[error("{tool}: {cause}")]
    Tool { tool: String, cause: FatalCause },
    /// A call's task ended without a result (it panicked or was aborted).
    #[error("tool task failed: {0}")]
    ToolTask(#[from] tokio::task::JoinError),
}

/// Messages for a running session from outside (see [`crate::mailbox`]).
pub type Inbox = Arc<crate::mailbox::Mailbox>;

/// The result given to a call still running when the user interrupted.
pub const STILL_RUNNING: &str = "[still running: you were interrupted while waiting; this call goes on and its result will be appended as a notice when it arrives]";

/// How long a turn's model call took.
#[derive(Clone, Copy, Debug, Default)]
struct Timing {
    latency_ms: u64,
    ttft_ms: Option<u64>,
}

pub struct AgentSession {
    /// (warn at, hand off at), in context tokens, for a main thread.
    handoff: Option<(u64, u64)>,
    limits: Option<Arc<crate::limits::JobLimits>>,
    inbox: Option<Inbox>,
    /// Where a window the provider names is recorded (see [`AgentSession::with_windows`]).
    windows: Option<Windows>,
    config: SessionConfig,
    provider: Arc<dyn Provider>,
    tools: Arc<ToolSet>,
    hooks: Hooks,
    journal: Journal,
    cancel: CancellationToken,
    observer: Option<Observer>,
    /// Set by [`AgentSession::with_held_answer`]: the final answer's batch.
    held: Option<std::sync::Mutex<Option<flower_store::Batch>>>,
    /// Set by [`AgentSession::with_gate`]: what the run waits for before it
    /// acts on a model answer.
    gate: Option<Gate>,
}

/// A decision a run may start before (see [`AgentSession::with_gate`]).
#[derive(Clone, Debug)]
pub struct Gate {
    /// `None` while pending, then whether the run may act.
    pub decision: tokio::sync::watch::Receiver<Option<bool>>,
    /// Told when the run first needs the decision (a permit is kept), so
    /// whoever decides need not wait any longer for a reason to.
    pub asked: Arc<tokio::sync::Notify>,
}

/// Ask for the gate's decision and wait for it; a dropped sender closes it.
pub async fn gate_opens(gate: &Gate) -> bool {
    gate.asked.notify_one();
    let mut decision = gate.decision.clone();
    matches!(decision.wait_for(Option::is_some).await.as_deref(), Ok(Some(true)))
}

impl AgentSession {
    pub fn new(
        config: SessionConfig,
        provider: Arc<dyn Provider>,
        tools: Arc<ToolSet>,
        hooks: Hooks,
        journal: Journal,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            config,
            provider,
            tools,
            hooks,
            journal,
            cancel,
            observer: None,
            inbox: None,
            windows: None,
            limits: None,
            handoff: None,
            held: None,
            gate: None,
        }
    }

    /// Hand off when the context reaches `at` (a warning event at `warn`).
    pub fn with_handoff(mut self, thresholds: Option<(u64, u64)>) -> Self {
        self.handoff = thresholds;
        self
    }

    /// Record in `windows` the window a provider's overflow error names, for
    /// the thresholds of later sessions of this process (without it, the
    /// window is only reported in the outcome or the error).
    pub fn with_windows(mut self, windows: Windows) -> Self {
        self.windows = Some(windows);
        self
    }

    /// Stop when the job's budget is spent.
    pub fn with_limits(mut self, limits: Option<Arc<crate::limits::JobLimits>>) -> Self {
        self.limits = limits;
        self
    }

    /// Take in messages from `inbox` before each model call.
    pub fn with_inbox(mut self, inbox: Inbox) -> Self {
        self.inbox = Some(inbox);
        self
    }

    /// Defer the session's edge writes to its caller (a worker ending a
    /// task): the first turn's input is committed with the first answer (a
    /// model call is no effect to flush for: a crash before it only repeats
    /// it), and a final answer is not committed but held, for
    /// [`AgentSession::take_held`], to be committed with the task's end in
    /// one transaction. Every other outcome, and a failure, commits as usual.
    pub fn with_held_answer(mut self) -> Self {
        self.held = Some(Default::default());
        self
    }

    /// The final answer's uncommitted batch (entries, events, usage), once,
    /// The run's model requests may go out before `gate` decides (a
    /// worker's first request while its claim commits), but nothing the
    /// model answers is acted on — no entry written, no tool run — until it
    /// opens; a gate that closes ends the run as cancelled, having written
    /// nothing. A final answer held for the caller
    /// ([`AgentSession::with_held_answer`]) is not acted on here: the run
    /// returns it without waiting for the gate (the caller may commit it
    /// with the decision itself, see `Store::claim_task_ending`).
    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Whether the run may act now (no gate, or an open one).
    async fn through_gate(&self) -> bool {
        match &self.gate {
            None => true,
            Some(gate) => gate_opens(gate).await,
        }
    }

    /// after [`AgentSession::run`] answered with [`AgentSession::with_held_answer`] set.
    pub fn take_held(&self) -> Option<flower_store::Batch> {
        self.held.as_ref().and_then(|h| h.lock().unwrap_or_else(|p| p.into_inner()).take())
    }

    /// Observe stream progress of every model call.
    pub fn with_observer(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Run from the stored `history` (empty for a new session), first adding
    /// `input` as a user message when given.
    #[tracing::instrument(name = "session", skip_all, fields(job = %self.config.job_id, session = %self.config.session_id, role = self.config.role.as_str()))]
    pub async fn run(&self, history: Vec<Entry>, input: Option<Vec<ContentBlock>>) -> Result<Outcome, AgentError> {
        // Resumed after the final answer was stored but before the job ended:
        // the answer stands, no new model call.
        if input.is_none()
            && let Some(answered) = stored_answer(&history)
        {
            return Ok(answered);
        }
        // A resume may write before its first model call: gated first.
        if (!history.is_empty() || self.held.is_none()) && !self.through_gate().await {
            return Ok(Outcome::Cancelled { turns: 0, usage: Usage::default() });
        }
        let mut run = self.resume(history).await?;
        if let Some(content) = input {
            run.push(self.entry(EntryKind::User, content));
        }
        if self.held.is_none() {
            run.w.flush().await?;
        }
        let outcome = self.turns(&mut run).await;
        match (&outcome, &self.held) {
            // The caller commits the answer with what depends on it.
            (Ok(Outcome::Answered { .. }), Some(held)) => {
                *held.lock().unwrap_or_else(|p| p.into_inner()) = Some(run.w.take());
            }
            // A session its gate refused writes nothing.
            (Ok(_), _) => {
                if self.through_gate().await {
                    run.w.flush().await?;
                }
            }
            // Best effort: what was queued before the failure (the first
            // turn's input when writes are deferred) is still worth keeping.
            (Err(_), _) => {
                if !run.w.is_empty()
                    && self.through_gate().await
                    && let Err(e) = run.w.flush().await
                {
                    tracing::warn!(error = %e, "entries queued before the failure not stored");
                }
            }
        }
        outcome
    }

    /// The turn loop of [`AgentSession::run`]. A final answer is left queued
    /// (the caller of this commits it, or holds it).
    async fn turns(&self, run: &mut Run) -> Result<Outcome, AgentError> {
        loop {
            if let Some(outcome) = self.stop_before_turn(run).await? {
                return Ok(outcome);
            }
            self.drain_inbox(run).await?;
            run.turns += 1;
            let rewrite = self.plan_rewrite(run);
            let request = self.build_request(run);
            let turn_span = tracing::info_span!("turn", turn = run.turns);
            let sent = self.send(run, &request, turn_span.clone()).await;
            // The messages sent are the next request's start.
            run.view = Some(View { entries: run.history.len(), messages: request.messages, encoded: request.encoded });
            let (response, dropped, timing) = match sent? {
                ControlFlow::Continue(sent) => sent,
                ControlFlow::Break(outcome) => return Ok(outcome),
            };
            // Recorded, not written: a held final answer is the caller's to
            // commit, and needs no gate here.
            let calls = self.record_response(run, &response, dropped, rewrite, timing);
            if (!calls.is_empty() || self.held.is_none()) && !self.through_gate().await {
                return Ok(Outcome::Cancelled { turns: run.turns - 1, usage: run.usage });
            }
            if calls.is_empty() {
                return Ok(Outcome::Answered {
                    text: answer_text(&response.content),
                    turns: run.turns,
                    usage: run.usage,
                });
            }
            // The assistant turn is durable before any tool acts on it, and
            // the task rows of its calls with it, in the same transaction.
            // When every call's row is in that transaction, the calls start
            // with the commit: what they do first is publish their rows'
            // messages, and a worker's claim waits for the commit in the
            // store (docs/design.md section 3).
            let all_rows = self.rows_for_calls(run, &calls);
            let calls_run = tracing::Instrument::instrument(self.run_calls(&calls), turn_span);
            let results = if all_rows {
                let commit = async {
                    let written = run.w.flush().await?;
                    self.rows_committed(&calls, written.tasks);
                    Ok::<_, AgentError>(())
                };
                tokio::try_join!(commit, calls_run)?.1
            } else {
                let written = run.w.flush().await?;
                self.rows_committed(&calls, written.tasks);
                calls_run.await?
            };
            self.record_results(run, &calls, results);
            // Results a resumed run makes again the same way (an `Agent` call
            // re-attaches to its task, whose row holds the report) go with the
            // next answer's commit instead of one of their own; any other
            // result is durable before the next model call.
            if !calls.iter().all(|(_, name, _)| self.tools.get(name).is_some_and(|t| t.resumable())) {
                run.w.flush().await?;
            }
        }
    }

    /// Take up the stored history: the deferred tools it loaded (in order,
    /// so the tool block is rebuilt as it was sent), the surface event, and
    /// the calls left without a result (the process died mid-turn), before
    /// anything else: idempotent ones are made again (an `Agent` call
    /// re-attaches to its task); the others get a neutral, marked result.
    async fn resume(&self, history: Vec<Entry>) -> Result<Run, AgentError> {
        let c = &self.config;
        let w = TranscriptWriter::new(self.journal.clone(), history.last().map(|e| e.uuid));
        let mut loaded: Vec<String> = Vec::new();
        for name in history.iter().flat_map(|e| &e.markers.loaded_tools) {
            if !loaded.contains(name) {
                loaded.push(name.clone());
            }
        }
        let mut run = Run {
            w,
            history,
            loaded,
            usage: Usage::default(),
            turns: 0,
            context: 0,
            warned: false,
            previous_tail: None,
            sent_loaded: 0,
            pruner: crate::surface::uneventful::Pruner::default(),
            view: None,
        };
        run.w.event(c.job_id, crate::surface::composition(c.session_id, c.role, &self.tools, &c.system));
        let (again, heal): (Vec<_>, Vec<_>) = unanswered_calls(&run.history)
            .into_iter()
            .partition(|(_, name, _)| self.tools.get(name).is_some_and(|t| t.resumable()));
        for (id, name, _) in heal {
            let mut e = self.entry(EntryKind::ToolResult, vec![ContentBlock::tool_result(id, NEVER_PRODUCED, true)]);
            e.tool_name = Some(name);
            e.markers.interrupted = true;
            run.push(e);
        }
        if !again.is_empty() {
            run.w.flush().await?;
            let results = self.run_calls(&again).await?;
            self.record_results(&mut run, &again, results);
        }
        // The context the last request occupied, as the provider reported it.
        run.context = run.history.iter().rev().find_map(|e| e.usage.map(|u| u.context_tokens())).unwrap_or(0);
        run.sent_loaded = run.loaded.len();
        Ok(run)
    }

    /// Why the run stops before its next model call, if it must: the handoff
    /// threshold, a cancel, the turn limit, the job's budget — in that order.
    /// Past the handoff warning threshold a warning event is stored, once.
    async fn stop_before_turn(&self, run: &mut Run) -> Result<Option<Outcome>, AgentError> {
        let c = &self.config;
        let (turns, usage) = (run.turns, run.usage);
        if let Some((warn, at)) = self.handoff {
            if run.context >= at {
                return Ok(Some(Outcome::Handoff { forced: false, turns, usage, window: None }));
            }
            if run.context >= warn && !run.warned {
                run.warned = true;
                run.w.event(
                    c.job_id,
                    EventKind::HandoffWarning { session: c.session_id, context_tokens: run.context, at },
                );
                run.w.flush().await?;
            }
        }
        if self.cancel.is_cancelled() {
            return Ok(Some(Outcome::Cancelled { turns, usage }));
        }
        if turns >= c.max_turns {
            return Ok(Some(Outcome::TurnLimit { turns, usage }));
        }
        if let Some(limits) = &self.limits {
            match limits.check(c.session_id).await {
                crate::limits::Verdict::Go => {}
                crate::limits::Verdict::Stop(reason) => return Ok(Some(Outcome::Budget { reason, turns, usage })),
                crate::limits::Verdict::Interrupted => return Ok(Some(Outcome::Cancelled { turns, usage })),
            }
        }
        Ok(None)
    }

    /// Append what arrived since the last model call: the user's messages,
    /// then notices (late results, the turn hooks' reminders) as appended
    /// `<system-reminder>` content — never a rewrite of what was sent.
    async fn drain_inbox(&self, run: &mut Run) -> Result<(), AgentError> {
        let arrived: Vec<String> = self.inbox.as_ref().map(|i| i.take_messages()).unwrap_or_default();
        let mut notices: Vec<String> = self
            .inbox
            .as_ref()
            .map(|i| i.take_notices())
            .unwrap_or_default()
            .into_iter()
            .map(|n| format!("<system-reminder>\n{n}\n</system-reminder>"))
            .collect();
        // What came through the inbox (a user's words, a late result) is
        // durable before the model sees it; the turn hooks' reminders are
        // derived (a resumed run makes them again) and go with the next answer.
        let from_inbox = !arrived.is_empty() || !notices.is_empty();
        if from_inbox {
            for hook in &self.hooks.turn {
                hook.arrived(false);
            }
        }
        for hook in &self.hooks.turn {
            if let Some(n) = hook.before_turn().await {
                notices.push(format!("<system-reminder>\n{n}\n</system-reminder>"));
            }
        }
        if arrived.is_empty() && notices.is_empty() {
            return Ok(());
        }
        for text in arrived {
            run.push(self.entry(EntryKind::User, vec![ContentBlock::text(text)]));
        }
        for n in notices {
            run.push(self.entry(EntryKind::Notice, vec![ContentBlock::text(n)]));
        }
        if from_inbox {
            run.w.flush().await?;
        }
        Ok(())
    }

    /// Prune uneventful old output when enough can be reclaimed, and name the
    /// deliberate rewrite this request makes, if any. Newly loaded schemas go
    /// after the cached tool block, and pruning changes old messages:
    /// everything after the change is written again once — a rewrite recorded
    /// with its measured cost; the previous-tail marker resets.
    fn plan_rewrite(&self, run: &mut Run) -> Option<&'static str> {
        let reclaimed = if self.config.prune_uneventful { run.pruner.prune(&mut run.history) } else { 0 };
        if reclaimed > 0 {
            // Older messages changed: the next request's are made anew.
            run.view = None;
        }
        let rewrite = if run.loaded.len() > run.sent_loaded {
            Some("tools_loaded")
        } else if reclaimed > 0 {
            Some("pruned_uneventful")
        } else {
            None
        };
        if rewrite.is_some() {
            run.previous_tail = None;
        }
        run.sent_loaded = run.loaded.len();
        rewrite
    }

    /// This turn's request, with its cache plan (docs/design.md section 6);
    /// its tail becomes the next request's previous-tail breakpoint.
    fn build_request(&self, run: &mut Run) -> Request {
        use flower_model::spec::CacheMode;
        let c = &self.config;
        let (messages, encoded) = run.messages();
        let request = Request {
            model: c.model.clone(),
            max_tokens: c.max_tokens,
            system: c.system.clone(),
            messages,
            encoded,
            tools: self.tools.defs_with(&run.loaded),
            resident_tools: Some(self.tools.names().len()),
            stream: true,
            cache: match c.cache {
                CacheMode::Full => Some(CachePlan { previous_tail: run.previous_tail, tail_only: false }),
                CacheMode::TailOnly => Some(CachePlan { previous_tail: None, tail_only: true }),
                CacheMode::Off => None,
            },
            session: Some(c.session_id.to_string()),
            claimant: Some(c.claimant.clone()),
        };
        run.previous_tail = request.tail();
        request
    }

    /// Send the turn's request. A cancel, or a prompt too long for the window
    /// of a session that may hand off, ends the run instead. With the response
    /// come the errors of the streams that dropped on the way (each one sent
    /// again).
    async fn send(
        &self,
        run: &Run,
        request: &Request,
        span: tracing::Span,
    ) -> Result<ControlFlow<Outcome, (Response, Vec<String>, Timing)>, AgentError> {
        let (turns, usage) = (run.turns, run.usage);
        let dropped: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let started = std::time::Instant::now();
        let first: Arc<std::sync::Mutex<Option<u64>>> = Arc::default();
        let call = tracing::Instrument::instrument(
            self.provider.send(request, Some(self.retry_observer(dropped.clone(), first.clone(), started))),
            span,
        );
        let response = tokio::select! {
            r = call => match r {
                Ok(r) => r,
                // "Prompt is too long" cannot be retried; a handoff can help. The
                // window it names is the model's, whichever session heard it.
                Err(e) if e.class() == crate::provider::ErrorClass::PromptTooLong => {
                    let window = e.window();
                    if let Some(w) = window {
                        if let Some(windows) = &self.windows {
                            windows.learn(&request.model, w);
                        }
                        tracing::info!(model = %request.model, window = w, "the provider named the model's context window");
                    }
                    if self.handoff.is_none() {
                        return Err(e.into());
                    }
                    return Ok(ControlFlow::Break(Outcome::Handoff { forced: true, turns, usage, window }));
                }
                Err(e) => return Err(e.into()),
            },
            _ = self.cancel.cancelled() => return Ok(ControlFlow::Break(Outcome::Cancelled { turns: turns - 1, usage })),
        };
        let dropped = std::mem::take(&mut *dropped.lock().unwrap_or_else(|p| p.into_inner()));
        let timing = Timing {
            latency_ms: started.elapsed().as_millis() as u64,
            ttft_ms: *first.lock().unwrap_or_else(|p| p.into_inner()),
        };
        Ok(ControlFlow::Continue((response, dropped, timing)))
    }

    /// Queue the model's answer with its usage and the turn's events; the
    /// tool calls it makes, in order.
    fn record_response(
        &self,
        run: &mut Run,
        response: &Response,
        dropped: Vec<String>,
        rewrite: Option<&'static str>,
        timing: Timing,
    ) -> Vec<Call> {
        let c = &self.config;
        run.usage.add(&response.usage);
        run.context = response.usage.context_tokens();
        // A dropped stream's partial output was discarded; what is left of it
        // is a marked entry, never re-sent to the model.
        for error in dropped {
            let mut e = self.entry(
                EntryKind::Assistant,
                vec![ContentBlock::text(format!("[{error}; the request was sent again]"))],
            );
            e.markers.synthetic_error = true;
            run.push(e);
        }
        let mut assistant = self.entry(EntryKind::Assistant, response.content.clone());
        assistant.model = Some(response.model.clone());
        assistant.stop_reason = response.stop_reason.clone();
        assistant.usage = Some(response.usage);
        run.push(assistant);
        run.w.usage(c.job_id, response.usage);
        if let Some(reason) = rewrite {
            run.w.event(
                c.job_id,
                EventKind::CacheRewrite {
                    session: c.session_id,
                    turn: run.turns,
                    reason: reason.into(),
                    cache_write_tokens: response.usage.cache_creation_input_tokens,
                    cache_read_tokens: response.usage.cache_read_input_tokens,
                },
            );
        }
        run.w.event(
            c.job_id,
            EventKind::TurnCompleted {
                session: c.session_id,
                role: c.role.as_str().into(),
                turn: run.turns,
                usage: response.usage,
                stop_reason: response.stop_reason.clone().unwrap_or_default(),
                latency_ms: Some(timing.latency_ms),
                ttft_ms: timing.ttft_ms,
                model: Some(c.model.clone()),
            },
        );
        let calls = tool_calls(&response.content);
        for (id, name, _) in &calls {
            run.w.event(
                c.job_id,
                EventKind::ToolCalled { session: c.session_id, tool: name.clone(), tool_use_id: id.clone() },
            );
        }
        calls
    }

    /// Queue the result entries (and their events) of `calls`, in call order.
    fn record_results(&self, run: &mut Run, calls: &[Call], results: Vec<ToolOutput>) {
        let c = &self.config;
        let untouched = results.iter().all(|out| out.workbench_untouched && out.spills.is_empty());
        for hook in &self.hooks.turn {
            hook.arrived(untouched);
        }
        for ((id, name, _), mut out) in calls.iter().zip(results) {
            // A direct call to a deferred tool loads its schema; the call ran in this step.
            if self.tools.is_deferred(name)
                && out.markers.denial_kind.is_none()
                && !run.loaded.contains(name)
                && !out.markers.loaded_tools.contains(name)
            {
                out.markers.loaded_tools.push(name.clone());
                out.events.push(EventKind::ToolsLoaded {
                    session: c.session_id,
                    trigger: "direct_call".into(),
                    tools: vec![name.clone()],
                    query: None,
                });
            }
            for t in &out.markers.loaded_tools {
                if !run.loaded.contains(t) {
                    run.loaded.push(t.clone());
                }
            }
            for ev in std::mem::take(&mut out.events) {
                run.w.event(c.job_id, ev);
            }
            for end in std::mem::take(&mut out.requires) {
                run.w.require(end);
            }
            let chars =
                out.content.iter().map(|b| if let ResultBlock::Text { text } = b { text.len() } else { 0 }).sum();
            let mut e = self.entry(
                EntryKind::ToolResult,
                vec![ContentBlock::ToolResult {
                    tool_use_id: id.clone(),
                    content: out.content,
                    is_error: out.is_error,
                }],
            );
            e.tool_name = Some(name.clone());
            if let Some(kind) = &out.markers.denial_kind {
                crate::metrics::metrics().tool_denied(kind);
                run.w.event(
                    c.job_id,
                    EventKind::ToolDenied { session: c.session_id, tool: name.clone(), denial_kind: kind.clone() },
                );
            }
            for (path, chars) in &out.spills {
                run.w.event(
                    c.job_id,
                    EventKind::Spill { session: c.session_id, tool: name.clone(), path: path.clone(), chars: *chars },
                );
            }
            e.markers = out.markers;
            run.push(e);
            run.w.event(
                c.job_id,
                EventKind::ToolFinished {
                    session: c.session_id,
                    tool: name.clone(),
                    tool_use_id: id.clone(),
                    is_error: out.is_error,
                    chars,
                },
            );
        }
    }

    fn entry(&self, kind: EntryKind, content: Vec<ContentBlock>) -> Entry {
        Entry::new(self.config.job_id, self.config.session_id, None, kind, content)
    }

    /// Forward stream events to the session's observer, and record retries as events.
    fn retry_observer(
        &self,
        dropped: Arc<std::sync::Mutex<Vec<String>>>,
        first: Arc<std::sync::Mutex<Option<u64>>>,
        started: std::time::Instant,
    ) -> Observer {
        let outer = self.observer.clone();
        let journal = self.journal.clone();
        let (job, session) = (self.config.job_id, self.config.session_id);
        // A call's first wait for its route's quota is recorded, not each.
        let waited = Arc::new(std::sync::atomic::AtomicBool::new(false));
        Arc::new(move |ev: StreamEvent| {
            if let StreamEvent::WaitingForQuota { route, wait, limit } = &ev {
                let m = crate::metrics::metrics();
                let label = crate::metrics::RouteLimitLabel { route: route.clone(), limit: limit.replace(' ', "_") };
                m.quota_waits.get_or_create(&label).inc();
                m.quota_wait
                    .get_or_create(&crate::metrics::RouteLabel { route: route.clone() })
                    .observe(wait.as_secs_f64());
                if !waited.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    let kind = EventKind::WaitingForQuota {
                        session,
                        route: route.clone(),
                        wait_ms: wait.as_millis() as u64,
                        limit: limit.to_string(),
                    };
                    let journal = journal.clone();
                    tokio::spawn(async move {
                        let batch = flower_store::Batch { events: vec![(job, kind)], ..Default::default() };
                        if let Err(e) = journal.commit(batch).await {
                            tracing::warn!(error = %e, "quota wait event not stored");
                        }
                    });
                }
            }
            if ev == StreamEvent::Started {
                // The attempt that answered started last: its start counts.
                *first.lock().unwrap_or_else(|p| p.into_inner()) = Some(started.elapsed().as_millis() as u64);
            }
            if let StreamEvent::Retrying { attempt, error, .. } = &ev {
                if error.starts_with("stream dropped") {
                    dropped.lock().unwrap_or_else(|p| p.into_inner()).push(error.clone());
                }
                let (journal, attempt, error) = (journal.clone(), *attempt, error.clone());
                tokio::spawn(async move {
                    let batch = flower_store::Batch {
                        events: vec![(job, EventKind::ProviderRetry { session, attempt, error })],
                        ..Default::default()
                    };
                    if let Err(e) = journal.commit(batch).await {
                        tracing::warn!(error = %e, "retry event not stored");
                    }
                });
            }
            if let Some(o) = &outer {
                o(ev);
            }
        })
    }
}

/// A tool call of an assistant message: (tool_use id, tool name, input).
type Call = (String, String, serde_json::Value);

/// What a run carries from one turn to the next.
struct Run {
    /// Queues entries and events until the next durable point.
    w: TranscriptWriter,
    /// The history as the next request shows it: what was stored, then this run's entries.
    history: Vec<Entry>,
    /// The deferred tools loaded so far, in load order.
    loaded: Vec<String>,
    usage: Usage,
    turns: u32,
    /// The context the last request occupied, as the provider reported it.
    context: u64,
    /// The handoff warning was stored.
    warned: bool,
    /// The previous request's tail, for its cache breakpoint (none after a
    /// rewrite: a resumed session starts without one).
    previous_tail: Option<(usize, usize)>,
    /// Loaded schemas the previous request carried: more now is a rewrite.
    sent_loaded: usize,
    /// Uneventful old output, replaced in the request view when worth a rewrite.
    pruner: crate::surface::uneventful::Pruner,
    /// The last request's messages, taken up by the next one: only the
    /// entries after them are copied (a long history is not copied per turn).
    view: Option<View>,
}

/// Messages of the history's first `entries` entries.
struct View {
    entries: usize,
    messages: Vec<crate::provider::Message>,
    /// The encoded first messages the last request carried.
    encoded: crate::provider::Encoded,
}

impl Run {
    /// The history as messages: the last request's, extended by what came
    /// after them; and the encoded first ones, all but the last request's
    /// last message (the only one extending may change).
    fn messages(&mut self) -> (Vec<crate::provider::Message>, crate::provider::Encoded) {
        let (from, mut messages, encoded) = match self.view.take() {
            Some(v) if v.entries <= self.history.len() => {
                let upto = v.messages.len().saturating_sub(1);
                let encoded = v.encoded.extended(&v.messages, upto);
                (v.entries, v.messages, encoded)
            }
            _ => (0, Vec::new(), Default::default()),
        };
        extend_messages(&mut messages, &self.history[from..]);
        (messages, encoded)
    }

    /// Queue `e` for the store and add it to the history.
    fn push(&mut self, e: Entry) {
        self.w.push(e.clone());
        self.history.push(e);
    }
}

/// The final answer a stored history already ends with (an assistant
/// message that calls no tool), as the run's outcome.
fn stored_answer(history: &[Entry]) -> Option<Outcome> {
    let last = history.last()?;
    (last.kind == EntryKind::Assistant && last.tool_uses().next().is_none()).then(|| Outcome::Answered {
        text: last.text(),
        turns: 0,
        usage: Usage::default(),
    })
}

/// The tool calls of a response's content, in order.
fn tool_calls(content: &[ContentBlock]) -> Vec<Call> {
    content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::ToolUse { id, name, input } => Some((id.clone(), name.clone(), input.clone())),
            _ => None,
        })
        .collect()
}

/// A final answer's text: its text blocks, one per line.
fn answer_text(content: &[ContentBlock]) -> String {
    content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}
