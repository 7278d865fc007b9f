//! The judge (`workflow.judge`, docs/design.md section 11): after the
//! coordinator's final answer, a session of its own checks the result
//! against the goal and returns a verdict through its `verdict` tool —
//! `achieved`, `not_yet` (with the checks that failed: they go back to the
//! coordinator as the next round's instruction, in the same session) or
//! `unreachable`. Every verdict is a `judge_verdict` event.
//!
//! Its disciplines: judge the artifacts (the workbench, the workspace), not
//! the coordinator's report; believe nothing it has not checked; "not done"
//! and "cannot verify" are different, and neither passes.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use flower_agent::tool::{args, schema_of};
use flower_agent::{Outcome, Tool, ToolContext, ToolError, ToolOutput};
use flower_model::{ContentBlock, EventKind, JobId, JobSpec, Role};
use flower_store::{Batch, StoreError, Workbench};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::runner::JobContext;
use crate::side::Side;

/// What a judge decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Achieved { reason: String },
    NotYet { failed: Vec<String>, reason: String },
    Unreachable { reason: String },
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Achieved { .. } => "achieved",
            Self::NotYet { .. } => "not_yet",
            Self::Unreachable { .. } => "unreachable",
        }
    }

    fn parts(&self) -> (Vec<String>, String) {
        match self {
            Self::Achieved { reason } | Self::Unreachable { reason } => (Vec::new(), reason.clone()),
            Self::NotYet { failed, reason } => (failed.clone(), reason.clone()),
        }
    }
}

pub const JUDGE_PROMPT: &str = "You are the judge of a flower job. The coordinator says the goal is met; you decide \
whether it is. Rules:\n\
- Judge the artifacts — the workbench (`.flower/…`) and the workspace files, read with `Read` — never the \
coordinator's report: it is a claim, not evidence.\n\
- Believe nothing you have not checked. A check you could not verify is not passed.\n\
- \"Not done\" and \"cannot verify\" are different; say which, and neither passes.\n\
- Give your verdict with the `verdict` tool, once: `achieved` when every check passes; `not_yet` with each \
failed check and what is missing (the coordinator gets them as its next instruction); `unreachable` when the goal \
cannot be met as stated, with why. Then answer with one line.";

/// The last verdict stored (a resumed run goes on from it): its round and verdict.
pub async fn last_verdict(store: &dyn flower_store::Store, job: JobId) -> Result<Option<(u32, Verdict)>, StoreError> {
    let mut last = None;
    flower_store::scan_events(store, job, 0, |e| {
        if let EventKind::JudgeVerdict { round, verdict, failed, reason, .. } = &e.kind {
            let v = match verdict.as_str() {
                "achieved" => Verdict::Achieved { reason: reason.clone() },
                "unreachable" => Verdict::Unreachable { reason: reason.clone() },
                _ => Verdict::NotYet { failed: failed.clone(), reason: reason.clone() },
            };
            last = Some((*round, v));
        }
    })
    .await?;
    Ok(last)
}

/// What the user said to an `unreachable` verdict.
#[derive(Debug, PartialEq)]
pub enum Overruled {
    /// Option 1: the result is accepted as it is; the job succeeds with it.
    Accepted,
    /// In words: how to go on (the goal amended, or why the judge is
    /// wrong) — the coordinator's next instruction.
    Words(String),
    /// The job ends failed; what to add to its reason.
    No(String),
}

/// The question's id for round `round`'s `unreachable` verdict.
pub fn unreachable_question(round: u32) -> String {
    format!("judge-{round}-unreachable")
}

/// The options offered after an `unreachable` verdict, in order.
pub const UNREACHABLE_OPTIONS: [&str; 2] =
    ["accept the result as it is (the job succeeds with it)", "end the job: the goal is unreachable"];

/// Ask the user what to do about round `round`'s `unreachable` verdict
/// (no answer within `runtime.ask.timeout`: the verdict stands). A resumed
/// run asks the same question again and so finds the answer stored to it.
pub async fn overrule(
    ctx: &JobContext,
    spec: &JobSpec,
    job: JobId,
    round: u32,
    reason: &str,
) -> Result<Overruled, StoreError> {
    use crate::tools::ask::{Asked, Asker};
    // As the clarifier does, with the default `runtime.ask` when the spec sets none.
    let options = spec.runtime.ask.clone().unwrap_or_default();
    let asker =
        Asker::new(ctx.journal.clone(), ctx.qa_log.clone(), ctx.inbox.clone(), options, ctx.stop.clone(), "judge");
    let question = format!(
        "The judge found the goal unreachable (round {round}): {reason}\nChoose 1 to accept the result as it is, 2 to \
         end the job, or answer in words — amend the goal, or say why the judge is wrong — and the work goes on \
         with your words."
    );
    let options: Vec<String> = UNREACHABLE_OPTIONS.iter().map(|o| o.to_string()).collect();
    let verdict_session = last_judge_session(ctx.journal.store().as_ref(), job, round).await?;
    let asked =
        asker.ask(job, verdict_session, &unreachable_question(round), &question, &options, ctx.stop.token()).await?;
    Ok(match asked {
        Asked::Answer { option: Some(1), by, .. } if by == "user" => Overruled::Accepted,
        Asked::Answer { option: Some(_), by, .. } if by == "user" => {
            Overruled::No(" (the user agreed: the job ends)".into())
        }
        Asked::Answer { text, by, .. } if by == "user" => Overruled::Words(format!(
            "[the judge found the goal unreachable (round {round}): {reason}]\nThe user answered: {text}\nGo on \
             with the user's words (delegate what they need), then give a new final answer."
        )),
        Asked::Answer { .. } => Overruled::No(" (the user did not answer)".into()),
        Asked::Cancelled | Asked::HandingOver => Overruled::No(" (stopped while asking the user)".into()),
    })
}

/// The session of round `round`'s verdict (the question is asked on its behalf).
async fn last_judge_session(
    store: &dyn flower_store::Store,
    job: JobId,
    round: u32,
) -> Result<flower_model::SessionId, StoreError> {
    let mut found = flower_model::SessionId::random();
    flower_store::scan_events(store, job, 0, |e| {
        if let EventKind::JudgeVerdict { round: r, session, .. } = &e.kind
            && *r == round
        {
            found = *session;
        }
    })
    .await?;
    Ok(found)
}

/// What the user said in words after `unreachable` verdicts, by round:
/// the next judges weigh it.
async fn user_words(store: &dyn flower_store::Store, job: JobId) -> Result<Vec<(String, String)>, StoreError> {
    let mut words = Vec::new();
    flower_store::scan_events(store, job, 0, |e| {
        if let EventKind::QuestionAnswered { id, answer, option: None, by } = &e.kind
            && by == "user"
            && id.starts_with("judge-")
            && id.ends_with("-unreachable")
        {
            words.push((id.clone(), answer.clone()));
        }
    })
    .await?;
    Ok(words)
}

/// Run round `round`'s judge on `answer` and store its verdict. A judge that
/// ends without one is "not yet: cannot verify" — never a pass. `None`: the
/// run was stopped meanwhile (cancel, hand-over), and nothing was stored.
pub async fn judge(
    ctx: &JobContext,
    spec: &JobSpec,
    job: JobId,
    round: u32,
    rounds: u32,
    answer: &str,
) -> Result<Option<Verdict>, StoreError> {
    let workbench = Workbench::new(ctx.objects.clone(), job);
    let index = workbench.render_index(flower_store::workbench::INDEX_ENTRIES).await.unwrap_or_default();
    let checks = match workbench.get("notes/goal.md").await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => "(no notes/goal.md: judge against the goal as stated)".into(),
    };
    let mut input = format!(
        "Round {round} of {rounds}.\n\n# The goal\n{goal}\n\n# Its checks\n{checks}\n\n# The workbench now\n{index}\n\
         # The coordinator's final answer (a claim to check, not evidence)\n{answer}",
        goal = spec.goal.trim(),
    );
    let words = user_words(ctx.journal.store().as_ref(), job).await?;
    if !words.is_empty() {
        input.push_str(
            "\n\n# The user's word on earlier verdicts (it amends the goal, or says why a judge was wrong)\n",
        );
        for (id, text) in words {
            input.push_str(&format!("- {id}: {text}\n"));
        }
    }
    let can_run = spec.workflow.judge.as_ref().is_some_and(|j| j.can_run);
    if can_run {
        input.push_str(
            "\n\nYou may run commands (`Bash`, run by a worker in the job's workspace) to check; never to change \
             anything.",
        );
    }
    let slot: Arc<Mutex<Option<Verdict>>> = Arc::default();
    let side = Side { role: Role::Judge, label: format!("judge-{round}"), prompt: JUDGE_PROMPT, max_turns: 20 };
    let mut tools: Vec<Arc<dyn Tool>> = vec![Arc::new(VerdictTool { slot: slot.clone() })];
    if can_run {
        // Its commands run as tool-only tasks on workers, as the coordinator's own do.
        tools.push(Arc::new(crate::tools::bash::CommandTool::new(crate::runner::dispatcher(ctx, job), false)));
    }
    let (id, session) = crate::side::open(ctx.wiring(job), spec, job, side, tools).await?;
    let outcome = session.run(Vec::new(), Some(vec![ContentBlock::text(input)])).await;
    let verdict = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    if ctx.stop.is_stopped() && verdict.is_none() {
        return Ok(None);
    }
    let verdict = match (verdict, outcome) {
        (Some(v), _) => v,
        (None, Ok(Outcome::Answered { .. })) => Verdict::NotYet {
            failed: vec!["the judge gave no verdict".into()],
            reason: "cannot verify: the judge ended without using `verdict`".into(),
        },
        (None, Ok(other)) => Verdict::NotYet {
            failed: vec!["the judge did not finish".into()],
            reason: format!("cannot verify: the judge's session ended early ({})", outcome_name(&other)),
        },
        (None, Err(e)) => match e {
            flower_agent::AgentError::Store(e) => return Err(e),
            e => Verdict::NotYet {
                failed: vec!["the judge failed".into()],
                reason: format!("cannot verify: the judge's session failed: {e}"),
            },
        },
    };
    let (failed, reason) = verdict.parts();
    let event = EventKind::JudgeVerdict { round, session: id, verdict: verdict.name().into(), failed, reason };
    let written = ctx.journal.commit(Batch { events: vec![(job, event)], ..Default::default() }).await?;
    ctx.journal.announce(&written).await;
    Ok(Some(verdict))
}

pub(crate) fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Answered { .. } => "answered",
        Outcome::Handoff { .. } => "context full",
        Outcome::Budget { .. } => "budget",
        Outcome::TurnLimit { .. } => "turn limit",
        Outcome::Cancelled { .. } => "cancelled",
    }
}

/// What the coordinator is told after a `not_yet` verdict.
pub fn next_round_instruction(round: u32, rounds: u32, failed: &[String], reason: &str) -> String {
    let mut text = format!(
        "[the judge, round {round} of {rounds}: the goal is not yet achieved]\n{reason}\nChecks that failed:\n"
    );
    for f in failed {
        text.push_str(&format!("- {f}\n"));
    }
    text.push_str("Make these pass (delegate the work), then give a new final answer.");
    text
}

/// The arguments of `verdict`.
#[derive(Debug, Deserialize, JsonSchema)]
struct VerdictArgs {
    verdict: VerdictKind,
    /// For not_yet: each check that failed, and what is missing
    failed: Option<Vec<String>>,
    reason: String,
}

// Which verdict (no doc comment: it would be sent as the field's description).
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum VerdictKind {
    Achieved,
    NotYet,
    Unreachable,
}

struct VerdictTool {
    slot: Arc<Mutex<Option<Verdict>>>,
}

#[async_trait]
impl Tool for VerdictTool {
    fn name(&self) -> &str {
        "verdict"
    }

    fn description(&self) -> String {
        "Record your verdict on the coordinator's result, once: `achieved`, `not_yet` (list every failed check \
         in `failed`) or `unreachable`, with the reason."
            .into()
    }

    fn input_schema(&self) -> Value {
        schema_of::<VerdictArgs>()
    }

    async fn call(&self, input: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a: VerdictArgs = args(input)?;
        let reason = a.reason.trim().to_string();
        if reason.is_empty() {
            return Err(ToolError::RespondToModel("`reason` is required".into()));
        }
        let failed: Vec<String> =
            a.failed.unwrap_or_default().iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        let verdict = match a.verdict {
            VerdictKind::Achieved => Verdict::Achieved { reason },
            VerdictKind::NotYet if failed.is_empty() => {
                return Err(ToolError::RespondToModel("`not_yet` needs the failed checks in `failed`".into()));
            }
            VerdictKind::NotYet => Verdict::NotYet { failed, reason },
            VerdictKind::Unreachable => Verdict::Unreachable { reason },
        };
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Err(ToolError::RespondToModel("the verdict is already recorded".into()));
        }
        *slot = Some(verdict);
        Ok(ToolOutput::text("verdict recorded"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_derived_schema_is_unchanged() {
        assert_eq!(
            schema_of::<VerdictArgs>(),
            json!({
                "type": "object",
                "properties": {
                    "verdict": {"type": "string", "enum": ["achieved", "not_yet", "unreachable"]},
                    "failed": {"type": "array", "items": {"type": "string"}, "description": "For not_yet: each check that failed, and what is missing"},
                    "reason": {"type": "string"}
                },
                "required": ["verdict", "reason"]
            })
        );
    }
}
