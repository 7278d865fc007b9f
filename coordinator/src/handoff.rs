//! Handoff: when the coordinator's main thread nears its window (flower's
//! formula: `at = max(10_000, window − room)`), the model writes a handoff
//! document — doing now; decided, each with why; dead ends; next steps; where
//! things are (pointers, not content) — to `notes/`, and a new session starts
//! from the goal and that document; the old one is retired, untouched. If the
//! handoff turn fails or the document lacks a section, a degraded document is
//! built from what is known (todo list, tasks, the last calls, the workbench).

use flower_agent::history::to_messages;
use flower_agent::provider::{Message, Request, SystemBlock};
use flower_model::{ContentBlock, EntryKind, EventKind, JobId, JobSpec, Role, Session, SessionId, now_ms};
use flower_store::{Batch, StoreError, Workbench};

use crate::runner::JobContext;

/// The sections a handoff document must have.
pub const SECTIONS: &[&str] = &["Doing now", "Decided", "Dead ends", "Next", "Where things are"];

/// The instruction that asks for the document (the simulator recognises it).
pub const REQUEST: &str = "<flower-handoff>\nYour context is nearly full; a fresh session will continue this job from \
a handoff document you write now. Write it in markdown with these sections: ## Doing now; ## Decided (each decision \
with why); ## Dead ends; ## Next; ## Where things are (pointers: workbench paths, task ids, the last calls — not \
content). Do not call tools.";

pub struct Next {
    pub session: SessionId,
    pub first_message: String,
}

pub async fn hand_off(
    ctx: &JobContext,
    spec: &JobSpec,
    job: JobId,
    from: SessionId,
    generation: u32,
    (forced, window): (bool, Option<u64>),
) -> Result<Next, StoreError> {
    let store = ctx.journal.store().clone();
    let stored = store.entries(from, 0, u32::MAX).await?;
    let workbench = Workbench::new(ctx.objects.clone(), job);
    let history = crate::runner::load_pruned(stored, spec, &workbench).await?;
    let mut messages = to_messages(&history);
    // The request must end with a user message: the instruction joins the last one or follows.
    match messages.last_mut() {
        Some(m) if m.role == "user" => m.content.push(ContentBlock::text(REQUEST)),
        _ => messages.push(Message { role: "user".into(), content: vec![ContentBlock::text(REQUEST)] }),
    }
    let request = Request {
        model: spec.model.clone(),
        max_tokens: spec.runtime.max_output_tokens,
        system: crate::prompts::system_prompt(spec).into_iter().map(SystemBlock::text).collect(),
        messages,
        tools: Vec::new(),
        stream: true,
        cache: None,
        ..Default::default()
    };
    let written = match ctx.provider.send(&request, None).await {
        Ok(r) => Some(
            r.content
                .iter()
                .filter_map(|b| if let ContentBlock::Text { text } = b { Some(text.as_str()) } else { None })
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "handoff turn failed; building a degraded handoff");
            None
        }
    };
    let complete =
        written.as_deref().is_some_and(|d| SECTIONS.iter().all(|s| d.to_lowercase().contains(&s.to_lowercase())));
    let (document, degraded) = match written {
        Some(d) if complete => (d, false),
        other => (degraded_document(ctx, spec, job, &history, other.is_some()).await?, true),
    };
    let path = format!("notes/handoff-{generation}.md");
    workbench.put(&path, document.clone().into_bytes()).await?;
    let session = SessionId::random();
    let written = store
        .create_session(Session {
            id: session,
            job_id: job,
            role: Role::Coordinator,
            label: format!("{} (generation {})", spec.coordinator.name, generation + 1),
            task_id: None,
            created_at: now_ms(),
        })
        .await?;
    ctx.journal.announce(&written).await;
    let event = EventKind::Handoff {
        from,
        to: session,
        generation: generation + 1,
        degraded,
        forced,
        document: path.clone(),
        window,
    };
    ctx.journal.commit(Batch { events: vec![(job, event)], ..Default::default() }).await?;
    let first_message = format!(
        "{goal}\n\n---\nYou continue this job from an earlier coordinator session whose context filled up. Its handoff \
         document (also at .flower/{path}):\n\n{document}",
        goal = spec.goal.trim()
    );
    Ok(Next { session, first_message })
}

/// What is known without the model: the todo list, the tasks, the last calls, the workbench.
async fn degraded_document(
    ctx: &JobContext,
    spec: &JobSpec,
    job: JobId,
    history: &[flower_model::Entry],
    incomplete: bool,
) -> Result<String, StoreError> {
    let store = ctx.journal.store();
    let why = if incomplete { "the handoff turn's document was incomplete" } else { "the handoff turn failed" };
    let mut doc = format!("# Handoff (degraded: {why}; built by flower from the record)\n\n## Doing now\n");
    if let Some(text) =
        history.iter().rev().find(|e| e.kind == EntryKind::Assistant && !e.text().is_empty()).map(|e| e.text())
    {
        doc.push_str(&format!("Last said: {}\n", text.chars().take(400).collect::<String>()));
    }
    doc.push_str(
        "\n## Decided\nSee .flower/notes/ (one decision per file).\n\n## Dead ends\nNot recorded.\n\n## Next\n",
    );
    if let Some(todos) =
        history.iter().rev().flat_map(|e| e.tool_uses().collect::<Vec<_>>()).find(|(_, n, _)| *n == "TodoWrite")
    {
        for t in todos.2["todos"].as_array().into_iter().flatten() {
            doc.push_str(&format!(
                "- [{}] {}\n",
                t["status"].as_str().unwrap_or("?"),
                t["content"].as_str().unwrap_or("")
            ));
        }
    }
    doc.push_str("\n## Where things are\n");
    if let Some(last) = history.iter().rev().find(|e| e.kind == EntryKind::Assistant && e.tool_uses().next().is_some())
    {
        let calls: Vec<String> = last.tool_uses().map(|(id, name, _)| format!("{name} {id}")).collect();
        doc.push_str(&format!("- last calls: {}\n", calls.join(", ")));
    }
    for t in store.tasks(job).await? {
        let first = t.report.as_deref().and_then(|r| r.lines().next()).unwrap_or("");
        doc.push_str(&format!(
            "- task {} ({}): {} — {} {}\n",
            &t.id.to_string()[..8],
            t.worker,
            t.description,
            t.state.as_str(),
            first
        ));
    }
    let index = Workbench::new(ctx.objects.clone(), job).render_index(flower_store::workbench::INDEX_ENTRIES).await?;
    doc.push_str(&format!("\n{index}"));
    let _ = spec;
    Ok(doc)
}
