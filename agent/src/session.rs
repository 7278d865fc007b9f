//! The agent loop shared by the coordinator and workers: build a request from
//! the session's history, call the provider (streaming), run the tool calls
//! (concurrency-safe ones in parallel), append the results, repeat until a
//! final answer or the turn limit. Every entry is stored as it happens.

use std::sync::Arc;

use flower_model::{ContentBlock, Entry, EntryKind, EventKind, JobId, Markers, ResultBlock, Role, SessionId, Usage};
use futures::future::join_all;
use tokio_util::sync::CancellationToken;

use crate::history::{NEVER_PRODUCED, to_messages, unanswered_calls};
use crate::hooks::{HookContext, Hooks, PreDecision};
use crate::journal::{Journal, TranscriptWriter};
use crate::provider::{CachePlan, Observer, Provider, ProviderError, Request, StreamEvent, SystemBlock};
use crate::tool::{ToolContext, ToolError, ToolOutput, ToolSet};

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
    #[error("{0}")]
    Tool(String),
}

/// Messages for a running session from outside (see [`crate::mailbox`]).
pub type Inbox = Arc<crate::mailbox::Mailbox>;

/// The result given to a call still running when the user interrupted.
pub const STILL_RUNNING: &str = "[still running: you were interrupted while waiting; this call goes on and its result will be appended as a notice when it arrives]";

pub struct AgentSession {
    /// (warn at, hand off at), in context tokens, for a main thread.
    handoff: Option<(u64, u64)>,
    limits: Option<Arc<crate::limits::JobLimits>>,
    inbox: Option<Inbox>,
    config: SessionConfig,
    provider: Arc<dyn Provider>,
    tools: Arc<ToolSet>,
    hooks: Hooks,
    journal: Journal,
    cancel: CancellationToken,
    observer: Option<Observer>,
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
            limits: None,
            handoff: None,
        }
    }

    /// Hand off when the context reaches `at` (a warning event at `warn`).
    pub fn with_handoff(mut self, thresholds: Option<(u64, u64)>) -> Self {
        self.handoff = thresholds;
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
    pub async fn run(&self, mut history: Vec<Entry>, input: Option<Vec<ContentBlock>>) -> Result<Outcome, AgentError> {
        let c = &self.config;
        // Resumed after the final answer was stored but before the job ended:
        // the answer stands, no new model call.
        if input.is_none()
            && let Some(last) = history.last()
            && last.kind == EntryKind::Assistant
            && last.tool_uses().next().is_none()
        {
            return Ok(Outcome::Answered { text: last.text(), turns: 0, usage: Usage::default() });
        }
        let mut w = TranscriptWriter::new(self.journal.clone(), history.last().map(|e| e.uuid));
        // The deferred tools this session loaded before, in order: the tool
        // block is rebuilt as it was sent.
        let mut loaded: Vec<String> = Vec::new();
        for name in history.iter().flat_map(|e| &e.markers.loaded_tools) {
            if !loaded.contains(name) {
                loaded.push(name.clone());
            }
        }
        w.event(c.job_id, crate::surface::composition(c.session_id, c.role, &self.tools, &c.system));
        // Calls left without a result (the process died mid-turn): idempotent
        // ones are made again (an `Agent` call re-attaches to its task); the
        // others get a neutral, marked result. Before anything else.
        let (again, heal): (Vec<_>, Vec<_>) = unanswered_calls(&history)
            .into_iter()
            .partition(|(_, name, _)| self.tools.get(name).is_some_and(|t| t.resumable()));
        for (id, name, _) in heal {
            let mut e = self.entry(EntryKind::ToolResult, vec![ContentBlock::tool_result(id, NEVER_PRODUCED, true)]);
            e.tool_name = Some(name);
            e.markers.interrupted = true;
            w.push(e.clone());
            history.push(e);
        }
        if !again.is_empty() {
            w.flush().await?;
            let results = self.run_calls(&again).await?;
            self.record_results(&mut w, &mut history, &again, results, &mut loaded);
        }
        if let Some(content) = input {
            let e = self.entry(EntryKind::User, content);
            w.push(e.clone());
            history.push(e);
        }
        w.flush().await?;

        let mut usage = Usage::default();
        let mut turns = 0u32;
        // The context the last request occupied, as the provider reported it.
        let mut context = history.iter().rev().find_map(|e| e.usage.map(|u| u.context_tokens())).unwrap_or(0);
        let mut warned = false;
        // The previous request's tail, for its cache breakpoint (none after a
        // rewrite: a resumed session starts without one).
        let mut previous_tail: Option<(usize, usize)> = None;
        // Loaded schemas the previous request carried: more now is a rewrite.
        let mut sent_loaded = loaded.len();
        // Uneventful old output, replaced in the request view when worth a rewrite.
        let mut pruner = crate::surface::uneventful::Pruner::default();
        loop {
            if let Some((warn, at)) = self.handoff {
                if context >= at {
                    return Ok(Outcome::Handoff { forced: false, turns, usage });
                }
                if context >= warn && !warned {
                    warned = true;
                    w.event(c.job_id, EventKind::HandoffWarning { session: c.session_id, context_tokens: context, at });
                    w.flush().await?;
                }
            }
            if self.cancel.is_cancelled() {
                return Ok(Outcome::Cancelled { turns, usage });
            }
            if turns >= c.max_turns {
                return Ok(Outcome::TurnLimit { turns, usage });
            }
            if let Some(limits) = &self.limits
                && let Some(reason) = limits.exceeded().await
            {
                return Ok(Outcome::Budget { reason, turns, usage });
            }
            let arrived: Vec<String> = self.inbox.as_ref().map(|i| i.take_messages()).unwrap_or_default();
            let mut notices: Vec<String> = self
                .inbox
                .as_ref()
                .map(|i| i.take_notices())
                .unwrap_or_default()
                .into_iter()
                .map(|n| format!("<system-reminder>\n{n}\n</system-reminder>"))
                .collect();
            for hook in &self.hooks.turn {
                if let Some(n) = hook.before_turn().await {
                    notices.push(format!("<system-reminder>\n{n}\n</system-reminder>"));
                }
            }
            if !arrived.is_empty() || !notices.is_empty() {
                for text in arrived {
                    let e = self.entry(EntryKind::User, vec![ContentBlock::text(text)]);
                    w.push(e.clone());
                    history.push(e);
                }
                for n in notices {
                    let e = self.entry(EntryKind::Notice, vec![ContentBlock::text(n)]);
                    w.push(e.clone());
                    history.push(e);
                }
                w.flush().await?;
            }
            turns += 1;
            let reclaimed = if c.prune_uneventful { pruner.prune(&mut history) } else { 0 };
            // Newly loaded schemas go after the cached tool block, and pruning
            // changes old messages: everything after the change is written
            // again once — a deliberate rewrite, recorded with its measured
            // cost; the previous-tail marker resets.
            let rewrite = if loaded.len() > sent_loaded {
                Some("tools_loaded")
            } else if reclaimed > 0 {
                Some("pruned_uneventful")
            } else {
                None
            };
            if rewrite.is_some() {
                previous_tail = None;
            }
            sent_loaded = loaded.len();
            use flower_model::spec::CacheMode;
            let request = Request {
                model: c.model.clone(),
                max_tokens: c.max_tokens,
                system: c.system.clone(),
                messages: to_messages(&history),
                tools: self.tools.defs_with(&loaded),
                resident_tools: Some(self.tools.names().len()),
                stream: true,
                cache: match c.cache {
                    CacheMode::Full => Some(CachePlan { previous_tail, tail_only: false }),
                    CacheMode::TailOnly => Some(CachePlan { previous_tail: None, tail_only: true }),
                    CacheMode::Off => None,
                },
                session: Some(c.session_id.to_string()),
            };
            previous_tail = request.tail();
            let dropped: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
            let turn_span = tracing::info_span!("turn", turn = turns);
            let call = tracing::Instrument::instrument(
                self.provider.send(&request, Some(self.retry_observer(dropped.clone()))),
                turn_span.clone(),
            );
            let response = tokio::select! {
                r = call => match r {
                    Ok(r) => r,
                    // "Prompt is too long" cannot be retried; a handoff can help.
                    Err(e) if self.handoff.is_some() && e.class() == crate::provider::ErrorClass::PromptTooLong => {
                        return Ok(Outcome::Handoff { forced: true, turns, usage });
                    }
                    Err(e) => return Err(e.into()),
                },
                _ = self.cancel.cancelled() => return Ok(Outcome::Cancelled { turns: turns - 1, usage }),
            };
            usage.add(&response.usage);
            context = response.usage.context_tokens();
            // A dropped stream's partial output was discarded; what is left of it
            // is a marked entry, never re-sent to the model.
            for error in std::mem::take(&mut *dropped.lock().unwrap_or_else(|p| p.into_inner())) {
                let mut e = self.entry(
                    EntryKind::Assistant,
                    vec![ContentBlock::text(format!("[{error}; the request was sent again]"))],
                );
                e.markers.synthetic_error = true;
                w.push(e.clone());
                history.push(e);
            }
            let mut assistant = self.entry(EntryKind::Assistant, response.content.clone());
            assistant.model = Some(response.model.clone());
            assistant.stop_reason = response.stop_reason.clone();
            assistant.usage = Some(response.usage);
            w.push(assistant.clone());
            history.push(assistant);
            w.usage(c.job_id, response.usage);
            if let Some(reason) = rewrite {
                w.event(
                    c.job_id,
                    EventKind::CacheRewrite {
                        session: c.session_id,
                        turn: turns,
                        reason: reason.into(),
                        cache_write_tokens: response.usage.cache_creation_input_tokens,
                        cache_read_tokens: response.usage.cache_read_input_tokens,
                    },
                );
            }
            w.event(
                c.job_id,
                EventKind::TurnCompleted {
                    session: c.session_id,
                    role: c.role.as_str().into(),
                    turn: turns,
                    usage: response.usage,
                    stop_reason: response.stop_reason.clone().unwrap_or_default(),
                },
            );
            let calls: Vec<(String, String, serde_json::Value)> = response
                .content
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::ToolUse { id, name, input } => Some((id.clone(), name.clone(), input.clone())),
                    _ => None,
                })
                .collect();
            for (id, name, _) in &calls {
                w.event(
                    c.job_id,
                    EventKind::ToolCalled { session: c.session_id, tool: name.clone(), tool_use_id: id.clone() },
                );
            }
            // The assistant turn is durable before any tool acts on it.
            w.flush().await?;
            if calls.is_empty() {
                let text = response
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        ContentBlock::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                return Ok(Outcome::Answered { text, turns, usage });
            }
            let results = tracing::Instrument::instrument(self.run_calls(&calls), turn_span).await?;
            self.record_results(&mut w, &mut history, &calls, results, &mut loaded);
            w.flush().await?;
        }
    }

    /// Queue the result entries (and their events) of `calls`, in call order.
    fn record_results(
        &self,
        w: &mut TranscriptWriter,
        history: &mut Vec<Entry>,
        calls: &[(String, String, serde_json::Value)],
        results: Vec<ToolOutput>,
        loaded: &mut Vec<String>,
    ) {
        let c = &self.config;
        for ((id, name, _), mut out) in calls.iter().zip(results) {
            // A direct call to a deferred tool loads its schema; the call ran in this step.
            if self.tools.is_deferred(name)
                && out.markers.denial_kind.is_none()
                && !loaded.contains(name)
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
                if !loaded.contains(t) {
                    loaded.push(t.clone());
                }
            }
            for ev in std::mem::take(&mut out.events) {
                w.event(c.job_id, ev);
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
                w.event(
                    c.job_id,
                    EventKind::ToolDenied { session: c.session_id, tool: name.clone(), denial_kind: kind.clone() },
                );
            }
            for (path, chars) in &out.spills {
                w.event(
                    c.job_id,
                    EventKind::Spill { session: c.session_id, tool: name.clone(), path: path.clone(), chars: *chars },
                );
            }
            e.markers = out.markers;
            w.push(e.clone());
            history.push(e);
            w.event(
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
    fn retry_observer(&self, dropped: Arc<std::sync::Mutex<Vec<String>>>) -> Observer {
        let outer = self.observer.clone();
        let journal = self.journal.clone();
        let (job, session) = (self.config.job_id, self.config.session_id);
        Arc::new(move |ev: StreamEvent| {
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

    /// Run a turn's calls: consecutive concurrency-safe calls together, every
    /// other call alone, results in call order.
    async fn run_calls(&self, calls: &[(String, String, serde_json::Value)]) -> Result<Vec<ToolOutput>, AgentError> {
        let mut out = Vec::with_capacity(calls.len());
        let mut i = 0;
        while i < calls.len() {
            let safe = |n: &str| self.tools.get(n).is_some_and(|t| t.concurrency_safe());
            let mut j = i + 1;
            if safe(&calls[i].1) {
                while j < calls.len() && safe(&calls[j].1) {
                    j += 1;
                }
            }
            match (&self.inbox, self.config.main_thread) {
                (Some(inbox), true) => {
                    for r in self.run_interruptible(&calls[i..j], inbox.clone()).await {
                        out.push(r?);
                    }
                }
                _ => {
                    let group =
                        join_all(calls[i..j].iter().map(|(id, name, input)| self.run_call(id, name, input))).await;
                    for r in group {
                        out.push(r?);
                    }
                }
            }
            i = j;
        }
        Ok(out)
    }

    /// Run a group of calls, each as a task of its own, until they end — or
    /// until a user's message arrives: then the calls still running get a
    /// placeholder result and go on in the background; each one's result is
    /// appended as a notice when it arrives.
    async fn run_interruptible(
        &self,
        calls: &[(String, String, serde_json::Value)],
        inbox: Inbox,
    ) -> Vec<Result<ToolOutput, AgentError>> {
        use futures::StreamExt;
        let mut running = futures::stream::FuturesUnordered::new();
        for (k, (id, name, input)) in calls.iter().enumerate() {
            let runner = self.runner();
            let (id, name, input) = (id.clone(), name.clone(), input.clone());
            let handle = tokio::spawn(async move { runner.run_call(&id, &name, &input).await });
            running.push(async move { (k, handle.await) });
        }
        let mut results: Vec<Option<Result<ToolOutput, AgentError>>> = (0..calls.len()).map(|_| None).collect();
        loop {
            tokio::select! {
                next = running.next() => match next {
                    Some((k, joined)) => {
                        results[k] = Some(joined.unwrap_or_else(|e| Err(AgentError::Tool(format!("tool task failed: {e}")))));
                    }
                    None => break,
                },
                _ = inbox.message_arrived() => {
                    let late: Vec<(String, String)> = calls.iter().map(|(id, name, _)| (id.clone(), name.clone())).collect();
                    tokio::spawn(async move {
                        while let Some((k, joined)) = running.next().await {
                            let (id, name) = &late[k];
                            let text = match joined {
                                Ok(Ok(out)) => flower_model::content::result_text(&out.content),
                                Ok(Err(e)) => format!("error: {e}"),
                                Err(e) => format!("error: the call's task failed: {e}"),
                            };
                            inbox.push_notice(format!("The result of your {name} call {id}, which was still running when you were interrupted:\n{text}"));
                        }
                    });
                    break;
                }
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    let mut placeholder = ToolOutput::text(STILL_RUNNING);
                    placeholder.markers.interrupted = true;
                    Ok(placeholder)
                })
            })
            .collect()
    }

    /// What running one call needs, owned (so a call can outlive the turn).
    fn runner(&self) -> CallRunner {
        CallRunner {
            config: self.config.clone(),
            tools: self.tools.clone(),
            hooks: self.hooks.clone(),
            cancel: self.cancel.clone(),
        }
    }

    async fn run_call(&self, id: &str, name: &str, input: &serde_json::Value) -> Result<ToolOutput, AgentError> {
        self.runner().run_call(id, name, input).await
    }
}

/// Runs one tool call: guards, the tool, post-hooks.
#[derive(Clone)]
struct CallRunner {
    config: SessionConfig,
    tools: Arc<ToolSet>,
    hooks: Hooks,
    cancel: CancellationToken,
}

impl CallRunner {
    async fn run_call(&self, id: &str, name: &str, input: &serde_json::Value) -> Result<ToolOutput, AgentError> {
        let c = &self.config;
        let ctx = ToolContext {
            job_id: c.job_id,
            session_id: c.session_id,
            role: c.role,
            tool_use_id: id.to_string(),
            cancel: self.cancel.child_token(),
        };
        let hook_ctx = HookContext { tool: ctx.clone(), main_thread: c.main_thread };
        let mut input = input.clone();
        // Guards judge the call before anything else, even a call to a tool
        // this session does not have: the denial carries the guidance.
        for hook in &self.hooks.pre {
            match hook.before(name, &input, &hook_ctx).await {
                PreDecision::Allow => {}
                PreDecision::Rewrite(new) => input = new,
                PreDecision::Deny { kind, reason } => {
                    let mut out = ToolOutput::error(reason);
                    out.markers = Markers { denial_kind: Some(kind), ..Default::default() };
                    return Ok(out);
                }
            }
        }
        let Some(tool) = self.tools.get(name) else {
            let known = self.tools.names().join(", ");
            return Ok(ToolOutput::error(format!("no tool named `{name}` in this session (available: {known})")));
        };
        let mut output = match tool.call(input.clone(), &ctx).await {
            Ok(o) => o,
            Err(ToolError::RespondToModel(msg)) => ToolOutput::error(msg),
            Err(ToolError::Fatal(msg)) => return Err(AgentError::Tool(format!("{name}: {msg}"))),
        };
        for hook in &self.hooks.post {
            hook.after(name, &input, &mut output, &hook_ctx).await;
        }
        Ok(output)
    }
}
