//! Continuing a finished job (`flower continue`, gRPC `Continue`;
//! docs/design.md section 13). A job's end is final, so a continuation is a
//! new job that names the one it goes on from (its lineage, stored on the
//! job row). It starts with a copy of its parent's workbench and workspace;
//! the brief is amended with the new instruction, the goal is set again
//! (the goal step runs again from the amended brief; without
//! `workflow.clarify` the judge checks the amended goal), and its
//! coordinator's first message carries where the parent ended — its final
//! answer, or its reason and its last handoff document.

use std::sync::Arc;

use flower_model::{Job, JobId, JobSpec, JobState, Lineage, SpecError};
use flower_store::{NewJob, Store, StoreError, Workbench};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::clarify::{BRIEF, GOAL};

/// Longest instruction (as a goal may be).
pub const MAX_INSTRUCTION_BYTES: usize = flower_model::spec::MAX_GOAL_BYTES;
/// Object copies in flight while a workbench is carried over.
const COPIES_IN_FLIGHT: usize = 16;

/// Why a continuation was not created.
#[derive(Debug, thiserror::Error)]
pub enum ContinueError {
    #[error(
        "job {job} is {state}: only a finished job can be continued (a running one takes a message: flower interrupt)"
    )]
    NotFinished { job: JobId, state: JobState },
    #[error("instruction: empty")]
    Empty,
    #[error("instruction: over {MAX_INSTRUCTION_BYTES} bytes")]
    TooLong,
    #[error("the continued spec: {}: {}", .0.field, .0.message)]
    Spec(SpecError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Create the continuation of `parent` with `instruction`: its workbench and
/// workspace carried over, then its job row (queued: an owner picks it up as
/// any submitted job). With a key already used, the first job is returned
/// (`false`) and nothing is copied.
pub async fn create(
    store: &dyn Store,
    objects: Arc<dyn ObjectStore>,
    parent: JobId,
    instruction: &str,
    idempotency_key: Option<String>,
    submitted_by: Option<String>,
) -> Result<(Job, bool), ContinueError> {
    let instruction = instruction.trim();
    if instruction.is_empty() {
        return Err(ContinueError::Empty);
    }
    if instruction.len() > MAX_INSTRUCTION_BYTES {
        return Err(ContinueError::TooLong);
    }
    let from = store.get_job(parent).await?;
    if !from.state.is_terminal() {
        return Err(ContinueError::NotFinished { job: parent, state: from.state });
    }
    let mut value = from.spec.clone();
    let spec = JobSpec::from_value(value.clone()).map_err(ContinueError::Spec)?;
    value["goal"] = serde_json::Value::String(amended_goal(&spec.goal, parent, instruction));
    JobSpec::from_value(value.clone()).map_err(ContinueError::Spec)?;
    let id = JobId::random();
    carry_over(objects.clone(), parent, id, instruction).await?;
    let new = NewJob {
        id,
        name: from.name.clone(),
        spec: value,
        idempotency_key,
        continues: Some(Lineage { parent, instruction: instruction.to_string() }),
        namespace: from.namespace.clone(),
        submitted_by,
    };
    let (job, created) = store.create_job(new).await?;
    if !created {
        // The key's first job stands: this copy is nobody's.
        remove_prefix(objects.as_ref(), &format!("jobs/{id}")).await;
    }
    Ok((job, created))
}

/// The goal a continuation runs on: the parent's, then the instruction.
pub fn amended_goal(goal: &str, parent: JobId, instruction: &str) -> String {
    format!("{}\n\nThen (continuing job {parent}): {instruction}", goal.trim_end())
}

/// `brief` with the instruction added at the end of its `## Goal` section
/// (at the end when it has none).
pub fn amended_brief(brief: &str, parent: JobId, instruction: &str) -> String {
    let added = format!("\nContinued from job {parent}, with the instruction:\n\n> {}\n", quote(instruction));
    let lines: Vec<&str> = brief.lines().collect();
    let heading = |l: &str, name: &str| {
        l.trim()
            .strip_prefix("##")
            .is_some_and(|h| h.trim_start_matches('#').trim().trim_end_matches(':').eq_ignore_ascii_case(name))
    };
    let Some(goal) = lines.iter().position(|l| heading(l, "goal")) else {
        return format!("{}\n{added}", brief.trim_end());
    };
    let end = lines.iter().skip(goal + 1).position(|l| l.trim_start().starts_with("##")).map(|n| goal + 1 + n);
    let (head, tail) = lines.split_at(end.unwrap_or(lines.len()));
    let mut out = head.join("\n").trim_end().to_string();
    out.push('\n');
    out.push_str(&added);
    if !tail.is_empty() {
        out.push('\n');
        out.push_str(&tail.join("\n"));
        out.push('\n');
    }
    out
}

fn quote(text: &str) -> String {
    text.lines().collect::<Vec<_>>().join("\n> ")
}

/// Copy the parent's workbench (but its goal, set again) and workspace
/// manifest (the blobs are shared) to the continuation; amend its brief and
/// log the instruction to its qa-log.
async fn carry_over(
    objects: Arc<dyn ObjectStore>,
    parent: JobId,
    child: JobId,
    instruction: &str,
) -> Result<(), StoreError> {
    let from = format!("jobs/{parent}/workbench/");
    let listed: Vec<_> = objects
        .list(Some(&ObjPath::from(format!("jobs/{parent}/workbench"))))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .map_err(backend)?;
    let goal = format!("{from}{GOAL}");
    let mut copies: Vec<(ObjPath, ObjPath)> = listed
        .into_iter()
        .filter(|p| p.as_ref() != goal)
        .filter_map(|p| {
            let rel = p.as_ref().strip_prefix(&from)?.to_string();
            Some((p, ObjPath::from(format!("jobs/{child}/workbench/{rel}"))))
        })
        .collect();
    copies.push((
        ObjPath::from(format!("jobs/{parent}/workspace/manifest.json")),
        ObjPath::from(format!("jobs/{child}/workspace/manifest.json")),
    ));
    futures::stream::iter(copies)
        .map(|(a, b)| {
            let objects = objects.clone();
            async move {
                match objects.copy(&a, &b).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(backend(e)),
                }
            }
        })
        .buffer_unordered(COPIES_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    let workbench = Workbench::new(objects.clone(), child);
    match workbench.get(BRIEF).await {
        Ok(bytes) => {
            let brief = amended_brief(&String::from_utf8_lossy(&bytes), parent, instruction);
            workbench.put(BRIEF, brief.into_bytes()).await?;
        }
        Err(StoreError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    // The job row does not exist yet: no one else writes this log.
    crate::qa_log::QaLog::new(objects, child).message(&format!("(continuing job {parent}) {instruction}")).await;
    Ok(())
}

fn backend(e: object_store::Error) -> StoreError {
    StoreError::backend_from(e)
}

async fn remove_prefix(objects: &dyn ObjectStore, prefix: &str) {
    let listed: Result<Vec<_>, _> =
        objects.list(Some(&ObjPath::from(prefix))).map_ok(|m| m.location).try_collect().await;
    for p in listed.unwrap_or_default() {
        if let Err(e) = objects.delete(&p).await {
            tracing::warn!(error = %e, path = %p, "an unused continuation copy was not removed");
        }
    }
}

/// What a continuation's coordinator is told before its goal: where the
/// parent ended, and the new instruction.
pub async fn preamble(store: &dyn Store, workbench: &Workbench, lineage: &Lineage) -> Result<String, StoreError> {
    let parent = store.get_job(lineage.parent).await?;
    let mut text = format!(
        "[This job continues job {} ({}). Its workbench (`.flower/`) and workspace carry over.]\n\n",
        parent.id, parent.state
    );
    match &parent.final_answer {
        Some(answer) => text.push_str(&format!("# Where it ended: its final answer\n{}\n\n", answer.trim_end())),
        None => {
            text.push_str(&format!(
                "# Where it ended\nNo final answer ({}).\n",
                parent.reason.as_deref().unwrap_or("no reason recorded")
            ));
            if let Some(path) = last_handoff(workbench).await? {
                text.push_str(&format!("Its last handoff document: `.flower/{path}` (read it first).\n"));
            }
            text.push('\n');
        }
    }
    text.push_str(&format!("# The new instruction\n{}\n\n# The whole goal, as it stands\n", lineage.instruction));
    Ok(text)
}

/// The newest `notes/handoff-N.md`.
async fn last_handoff(workbench: &Workbench) -> Result<Option<String>, StoreError> {
    Ok(workbench
        .list()
        .await?
        .into_iter()
        .filter_map(|(p, _)| {
            let n: u32 = p.strip_prefix("notes/handoff-")?.strip_suffix(".md")?.parse().ok()?;
            Some((n, p))
        })
        .max()
        .map(|(_, p)| p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_brief_takes_the_instruction_in_its_goal_section() {
        let parent = JobId::random();
        let brief = "# Brief\n\n## Goal\nCount the files.\n\n## Acceptance criteria\n- a table\n\n## Boundaries\nnone\n\n## Unknowns and assumptions\nnone\n";
        let out = amended_brief(brief, parent, "also sort it\nby size");
        let goal_at = out.find("## Goal").unwrap();
        let added_at = out.find("> also sort it\n> by size").unwrap();
        let next_at = out.find("## Acceptance criteria").unwrap();
        assert!(goal_at < added_at && added_at < next_at, "{out}");
        assert!(crate::clarify::missing_sections(&out).is_empty(), "still a complete brief: {out}");
        assert!(out.contains("Count the files.") && out.contains("- a table"));

        let last = amended_brief("## Goal\nx", parent, "y");
        assert!(last.ends_with("> y\n"), "{last}");
        let none = amended_brief("just text", parent, "y");
        assert!(none.starts_with("just text\n") && none.contains("> y"), "{none}");
    }

    #[test]
    fn the_goal_keeps_its_history() {
        let p = JobId::random();
        let g = amended_goal("count\n", p, "sort");
        assert_eq!(g, format!("count\n\nThen (continuing job {p}): sort"));
    }
}
