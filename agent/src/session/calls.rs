//! Running a turn's tool calls: concurrency-safe calls together, the others
//! alone; on the main thread with an inbox, a user's message interrupts the
//! wait (the calls go on, their results become notices). Also the task rows
//! a turn's calls commit with the turn, and [`CallRunner`], which runs one
//! call through the guards, the tool and the post-hooks.

use std::sync::Arc;

use flower_model::Markers;
use futures::future::join_all;
use tokio_util::sync::CancellationToken;

use super::{AgentError, AgentSession, Call, Inbox, Run, STILL_RUNNING, SessionConfig};
use crate::hooks::{HookContext, Hooks, PreDecision};
use crate::tool::{ToolContext, ToolError, ToolOutput, ToolSet};

impl AgentSession {
    /// Run a turn's calls: consecutive concurrency-safe calls together, every
    /// other call alone, results in call order.
    pub(super) async fn run_calls(&self, calls: &[Call]) -> Result<Vec<ToolOutput>, AgentError> {
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
    async fn run_interruptible(&self, calls: &[Call], inbox: Inbox) -> Vec<Result<ToolOutput, AgentError>> {
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
                        results[k] = Some(joined.unwrap_or_else(|e| Err(AgentError::ToolTask(e))));
                    }
                    None => break,
                },
                _ = inbox.message_arrived() => {
                    let late: Vec<(String, String)> = calls.iter().map(|(id, name, _)| (id.clone(), name.clone())).collect();
                    let store = self.journal.store().clone();
                    tokio::spawn(async move {
                        while let Some((k, joined)) = running.next().await {
                            let (id, name) = &late[k];
                            let text = match joined {
                                Ok(Ok(out)) if !confirmed(&store, &out.requires).await => {
                                    "error: the worker's report was not stored; the task runs again".to_string()
                                }
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

    /// Queue the task rows of this turn's calls that can be committed with
    /// the turn: calls of tools that give one, and that no guard may deny or
    /// rewrite.
    ///
    /// Once the turn's transaction is staged, each row's tool hears of it
    /// ([`Tool::row_staged`]): its message may go out during the commit.
    ///
    /// Whether every call got its row in the batch.
    pub(super) fn rows_for_calls(&self, run: &mut Run, calls: &[Call]) -> bool {
        let runner = self.runner();
        let mut staged: Vec<(Arc<dyn crate::tool::Tool>, flower_model::Task)> = Vec::new();
        for (id, name, input) in calls {
            if self.hooks.pre.iter().any(|h| h.may_judge(name)) {
                continue;
            }
            let Some(tool) = self.tools.get(name) else { continue };
            if let Some(row) = tool.row_for_call(input, &runner.tool_context(id)) {
                staged.push((tool.clone(), row.clone()));
                run.w.task(row);
            }
        }
        let all = staged.len() == calls.len();
        if !staged.is_empty() {
            run.w.on_staged(flower_store::Staged::new(move || {
                for (tool, row) in &staged {
                    tool.row_staged(row);
                }
            }));
        }
        all
    }

    /// Hand each committed row to its call's tool.
    pub(super) fn rows_committed(&self, calls: &[Call], rows: Vec<(flower_model::Task, bool)>) {
        for (task, created) in rows {
            let tool =
                calls.iter().find(|(id, _, _)| *id == task.tool_use_id).and_then(|(_, name, _)| self.tools.get(name));
            if let Some(tool) = tool {
                tool.row_committed(task, created);
            }
        }
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
    fn tool_context(&self, tool_use_id: &str) -> ToolContext {
        let c = &self.config;
        ToolContext {
            job_id: c.job_id,
            session_id: c.session_id,
            role: c.role,
            tool_use_id: tool_use_id.to_string(),
            cancel: self.cancel.child_token(),
        }
    }

    async fn run_call(&self, id: &str, name: &str, input: &serde_json::Value) -> Result<ToolOutput, AgentError> {
        let c = &self.config;
        let ctx = self.tool_context(id);
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
            Err(ToolError::Fatal(cause)) => return Err(AgentError::Tool { tool: name.to_string(), cause }),
        };
        for hook in &self.hooks.post {
            hook.after(name, &input, &mut output, &hook_ctx).await;
        }
        Ok(output)
    }
}

/// Whether each end a result was built on is stored so (a late result
/// becomes a notice, which carries no requirement: it is confirmed first).
async fn confirmed(store: &Arc<dyn flower_store::Store>, ends: &[flower_store::TaskEnd]) -> bool {
    for end in ends {
        match store.settled_task(end.task).await {
            Ok(t) if flower_store::rules::ended_as(&t, end) => {}
            _ => return false,
        }
    }
    true
}
