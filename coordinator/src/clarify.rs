//! The steps before the coordinator (`workflow.clarify`, docs/design.md
//! section 12): a clarifier session turns the request into a brief — goal,
//! acceptance criteria, boundaries, unknowns and assumptions — asking the
//! user only what changes the approach; a goal session turns the brief into
//! checks a judge can verify. Both are written to the workbench
//! (`notes/brief.md`, `notes/goal.md`) and handed to the coordinator as its
//! first message. A job that already has a complete brief (resumed) skips
//! the step that wrote it.

use std::sync::Arc;

use flower_agent::Outcome;
use flower_model::{ContentBlock, JobId, JobSpec, Role};
use flower_store::{StoreError, Workbench};

use crate::runner::JobContext;
use crate::side::Side;
use crate::tools::ask::AskTool;

pub const BRIEF: &str = "notes/brief.md";
pub const GOAL: &str = "notes/goal.md";
/// A brief's sections, in order, as `## …` headings.
pub const SECTIONS: [&str; 4] = ["Goal", "Acceptance criteria", "Boundaries", "Unknowns and assumptions"];

pub const CLARIFIER_PROMPT: &str = "You are the clarifier of a flower job. Before any work starts, you turn the \
user's request into a brief. Rules:\n\
- Do no work. Read the workspace and the workbench (`Read`) instead of asking what they show.\n\
- Ask (`ask`) only questions whose answer changes the approach, one at a time, with options when the choices are \
known. The user may be away: \"no answer\" means assume the most reasonable answer and record the assumption.\n\
- Answer with the brief in Markdown, exactly these four sections as `##` headings: Goal; Acceptance criteria; \
Boundaries; Unknowns and assumptions (every assumption you made, and why).";

pub const GOAL_PROMPT: &str = "You set the goal of a flower job. From the brief, write the goal and the checks a \
judge will verify it with. Answer in Markdown: a `## Goal` section (one paragraph), then a `## Checks` section: one \
`- ` item per check, each \"run or open X, see Y\", as many as the ways the work could fail; a check that cannot be \
verified in this environment is kept and marked `(cannot verify here: why)`.";

/// What the steps before the coordinator came to.
#[derive(Debug)]
pub enum Prepared {
    /// The coordinator's first message: the request, the brief, the goal.
    Ready(String),
    /// The job cannot start: why (a brief or goal missing what it needs).
    Failed(String),
    /// The run was stopped (cancel, hand-over) meanwhile.
    Stopped,
}

/// The sections of [`SECTIONS`] `brief` lacks (headings matched without case).
pub fn missing_sections(brief: &str) -> Vec<&'static str> {
    let headings: Vec<String> = brief
        .lines()
        .filter_map(|l| l.trim().strip_prefix("##"))
        .map(|h| h.trim_start_matches('#').trim().trim_end_matches(':').to_lowercase())
        .collect();
    SECTIONS.iter().copied().filter(|s| !headings.iter().any(|h| h == &s.to_lowercase())).collect()
}

/// The `- ` items under the `## Checks` heading of a goal.
pub fn checks(goal: &str) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for l in goal.lines() {
        let t = l.trim();
        if let Some(h) = t.strip_prefix("##") {
            inside = h.trim().eq_ignore_ascii_case("checks");
        } else if inside && let Some(item) = t.strip_prefix("- ").or_else(|| t.strip_prefix("* ")) {
            out.push(item.trim().to_string());
        }
    }
    out
}

/// Run what is missing of the clarify and goal steps; the coordinator's first message.
pub async fn prepare(ctx: &JobContext, spec: &JobSpec, job: JobId) -> Result<Prepared, StoreError> {
    let workbench = Workbench::new(ctx.objects.clone(), job);
    let stored = |text: Option<String>| text.filter(|t| !t.trim().is_empty());
    let brief = match stored(read(&workbench, BRIEF).await?) {
        Some(b) if missing_sections(&b).is_empty() => b,
        _ => {
            let index = workbench.render_index(flower_store::workbench::INDEX_ENTRIES).await.unwrap_or_default();
            let input = format!("# The request\n{}\n\n# The workbench now\n{index}", spec.goal.trim());
            let step = Step { label: "clarify", prompt: CLARIFIER_PROMPT, ask: true };
            let checked = |text: &str| {
                let missing = missing_sections(text);
                (!missing.is_empty()).then(|| format!("sections missing: {}", missing.join(", ")))
            };
            match run_step(ctx, spec, job, step, input, checked).await? {
                StepEnd::Text(b) => b,
                StepEnd::Failed(why) => return Ok(Prepared::Failed(format!("the clarify step's brief: {why}"))),
                StepEnd::Stopped => return Ok(Prepared::Stopped),
            }
        }
    };
    workbench.put(BRIEF, brief.clone().into_bytes()).await?;
    let goal = match stored(read(&workbench, GOAL).await?) {
        Some(g) if !checks(&g).is_empty() => g,
        _ => {
            let input = format!("# The brief\n{brief}");
            let step = Step { label: "goal", prompt: GOAL_PROMPT, ask: false };
            let checked = |text: &str| checks(text).is_empty().then(|| "no `- ` items under `## Checks`".to_string());
            match run_step(ctx, spec, job, step, input, checked).await? {
                StepEnd::Text(g) => g,
                StepEnd::Failed(why) => return Ok(Prepared::Failed(format!("the goal step: {why}"))),
                StepEnd::Stopped => return Ok(Prepared::Stopped),
            }
        }
    };
    workbench.put(GOAL, goal.clone().into_bytes()).await?;
    Ok(Prepared::Ready(format!(
        "{}\n\n# The brief (`.flower/{BRIEF}`)\n{brief}\n\n# The goal and its checks (`.flower/{GOAL}`; a judge \
         verifies them)\n{goal}",
        spec.goal.trim()
    )))
}

async fn read(workbench: &Workbench, path: &str) -> Result<Option<String>, StoreError> {
    match workbench.get(path).await {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

struct Step {
    label: &'static str,
    prompt: &'static str,
    ask: bool,
}

enum StepEnd {
    Text(String),
    Failed(String),
    Stopped,
}

/// One step's session: its answer, checked by `check` (`Some(what is
/// wrong)`); a wrong answer is asked for again once, in the same session.
async fn run_step(
    ctx: &JobContext,
    spec: &JobSpec,
    job: JobId,
    step: Step,
    input: String,
    check: impl Fn(&str) -> Option<String>,
) -> Result<StepEnd, StoreError> {
    let mut extra: Vec<Arc<dyn flower_agent::Tool>> = Vec::new();
    if step.ask {
        let options = spec.runtime.ask.clone().unwrap_or_default();
        extra.push(Arc::new(AskTool::new(crate::tools::ask::Asker::new(
            ctx.journal.clone(),
            ctx.qa_log.clone(),
            ctx.inbox.clone(),
            options,
            ctx.stop.clone(),
            "clarifier",
        ))));
    }
    let side = Side { role: Role::Clarifier, label: step.label.into(), prompt: step.prompt, max_turns: 30 };
    let (id, session) = crate::side::open(ctx.wiring(job), spec, job, side, extra).await?;
    let mut input = Some(vec![ContentBlock::text(input)]);
    for attempt in 0..2 {
        let history = if attempt == 0 { Vec::new() } else { ctx.journal.store().entries(id, 0, u32::MAX).await? };
        let text = match session.run(history, input.take()).await {
            _ if ctx.stop.is_stopped() => return Ok(StepEnd::Stopped),
            Ok(Outcome::Answered { text, .. }) => text,
            Ok(_) => return Ok(StepEnd::Failed(format!("the {} session ended without an answer", step.label))),
            Err(flower_agent::AgentError::Store(e)) => return Err(e),
            Err(e) => return Ok(StepEnd::Failed(format!("the {} session failed: {e}", step.label))),
        };
        match check(&text) {
            None => return Ok(StepEnd::Text(text.trim().to_string())),
            Some(wrong) if attempt == 0 => {
                input = Some(vec![ContentBlock::text(format!(
                    "[flower] Your answer is incomplete ({wrong}). Answer again with all of it."
                ))]);
            }
            Some(wrong) => return Ok(StepEnd::Failed(wrong)),
        }
    }
    Ok(StepEnd::Failed("no answer".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_brief_needs_its_four_sections() {
        let full =
            "# Brief\n## Goal\nx\n## Acceptance criteria\n- a\n## Boundaries\nnone\n## Unknowns and assumptions\n- b";
        assert!(missing_sections(full).is_empty());
        assert_eq!(
            missing_sections("## goal:\n## Boundaries\n"),
            vec!["Acceptance criteria", "Unknowns and assumptions"]
        );
        assert_eq!(missing_sections("Goal\nAcceptance criteria").len(), 4, "headings, not words");
    }

    #[test]
    fn checks_are_the_items_under_their_heading() {
        let goal = "## Goal\n- not a check\n## Checks\n- open report.md, see a totals row\n* run make, see 0 errors\n\n## Notes\n- no";
        assert_eq!(checks(goal), vec!["open report.md, see a totals row", "run make, see 0 errors"]);
        assert!(checks("## Goal\nx").is_empty());
    }
}
