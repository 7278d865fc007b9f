//! `/jobs/ID/sessions/SID`: one session's transcript, [`ENTRIES_PAGE`]
//! entries a page, markers made visible (denied with the guard's name,
//! synthetic error, interrupted, ephemeral, loaded tools, spilled with its
//! pointer); `?view=pruned` shows what a resumed session would be fed and
//! what each pruning rule changed.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use flower_coordinator::app::Result as AppResult;
use flower_coordinator::app::views::MAX_PAGE;
use flower_model::{ContentBlock, Entry, Job, JobSpec};
use maud::{Markup, display, html};
use serde::Deserialize;

use crate::auth::Signed;
use crate::error::Refusal;
use crate::views::{cut, layout};
use crate::{Console, ENTRIES_PAGE};

/// Characters of one entry's text shown before it is cut.
const SHOWN_CHARS: usize = 4000;
/// Characters of one tool call's input shown before it is cut.
const SHOWN_INPUT_CHARS: usize = 1500;

#[derive(Deserialize, Default)]
pub struct TranscriptQuery {
    /// The first entry shown (its number); 0 from the top.
    #[serde(default)]
    from: i64,
    /// `pruned`: what a resumed session would be fed, and each rule's change.
    #[serde(default)]
    view: String,
}

pub async fn page(
    s: Signed,
    State(c): State<Console>,
    Path((job, session)): Path<(String, String)>,
    Query(q): Query<TranscriptQuery>,
) -> Result<Response, Refusal> {
    let app = &s.app;
    let job = app.job("job_id", &job).await?;
    let pruned = q.view == "pruned";
    let (from, limit) = if pruned { (0, MAX_PAGE) } else { (q.from.max(0), ENTRIES_PAGE) };
    // The application checks that the session is this job's: its refusal comes first.
    let (entries, s) = tokio::join!(app.entries(job.id, &session, from, limit), app.session(job.id, &session));
    let (entries, s) = (entries?, s?);
    let view = if pruned { pruned_view(&c, &job, &session, entries).await? } else { raw_view(&entries) };
    let body = html! {
        main {
            p { a href={ "/jobs/" (display(job.id)) } { "← " (job.name) } }
            h1 { (s.label) " " span class="role" { (s.role.as_str()) } }
            nav class="tabs" aria-label="views" {
                a href="?view=raw" aria-current=[(!pruned).then_some("page")] { "Raw" }
                a href="?view=pruned" aria-current=[pruned.then_some("page")] { "Pruned (as a resume sees it)" }
            }
            (view)
        }
    };
    Ok(layout::respond(StatusCode::OK, layout::document(&s.label, body)))
}

/// One page of the entries as stored, with a link to the next.
fn raw_view(entries: &[Entry]) -> Markup {
    let next = entries.last().map(|e| e.seq).filter(|_| entries.len() == ENTRIES_PAGE as usize);
    html! {
        @for e in entries { (entry(e, None)) }
        @if entries.is_empty() {
            p class="empty" { "No entries." }
        }
        @if let Some(last) = next {
            nav class="pager" { a href={ "?view=raw&from=" (last) } rel="next" { "later entries →" } }
        }
    }
}

/// What a resumed session would be fed (the job's pruning options over all
/// the stored entries, `first` and the rest), each rule's change beside
/// the entry it changed.
async fn pruned_view(c: &Console, job: &Job, session: &str, first: Vec<Entry>) -> AppResult<Markup> {
    let mut stored = first;
    if let Some(last) = stored.last().map(|e| e.seq).filter(|_| stored.len() == MAX_PAGE as usize) {
        stored.extend(c.app().all_entries(job.id, session, last).await?);
    }
    let total = stored.len();
    let opts = JobSpec::from_value(job.spec.clone()).map(|s| s.runtime.pruning).unwrap_or_default();
    let p = flower_store::prune::prune(stored, &opts, &flower_agent::glance::allows);
    let by_entry: BTreeMap<uuid::Uuid, String> =
        p.changes.iter().map(|ch| (ch.entry, format!("{}: {}", ch.rule, ch.detail))).collect();
    Ok(html! {
        p {
            (total) " stored entries → " (p.entries.len()) " fed to a resumed session; "
            (p.changes.len()) " change(s)."
        }
        table {
            caption { "What each rule changed" }
            thead { tr { th scope="col" { "Rule" } th scope="col" { "Entry" } th scope="col" { "Detail" } } }
            tbody {
                @for ch in &p.changes {
                    tr { td { (ch.rule) } td { code { (display(ch.entry)) } } td { (ch.detail) } }
                }
            }
        }
        @for e in p.entries.iter().take(ENTRIES_PAGE as usize * 5) {
            (entry(e, by_entry.get(&e.uuid).map(String::as_str)))
        }
    })
}

/// One entry: its number, kind, tool, markers and (in the pruned view)
/// what pruning changed; its text and tool calls, cut when long.
fn entry(e: &Entry, changed: Option<&str>) -> Markup {
    let kind = e.kind.as_str();
    let text = entry_text(e);
    html! {
        article class={ "entry entry-" (kind) (if changed.is_some() { " changed" } else { "" }) } id={ "e" (e.seq) } {
            header {
                span class="seq" { "#" (e.seq) } " " strong { (kind) }
                @if let Some(t) = &e.tool_name { " " code { (t) } }
                (markers(e, &text))
                @if let Some(c) = changed { span class="marker marker-pruned" { (c) } }
            }
            @if !text.is_empty() {
                pre { (cut(&text, SHOWN_CHARS)) }
            }
            @for (_, name, input) in e.tool_uses() {
                div class="call" { code { (name) } " " pre { (cut(&input.to_string(), SHOWN_INPUT_CHARS)) } }
            }
        }
    }
}

/// The markers of an entry, made visible (`text`: the entry's text, where
/// a spill's pointer is found).
fn markers(e: &Entry, text: &str) -> Markup {
    let m = &e.markers;
    html! {
        @if let Some(kind) = &m.denial_kind { span class="marker marker-denied" { "denied: " (kind) } }
        @if m.synthetic_error { span class="marker marker-synthetic" { "synthetic error" } }
        @if m.interrupted { span class="marker marker-interrupted" { "interrupted" } }
        @if m.ephemeral == Some(true) { span class="marker marker-ephemeral" { "ephemeral" } }
        @if !m.loaded_tools.is_empty() {
            span class="marker marker-loaded" { "loaded: " (m.loaded_tools.join(", ")) }
        }
        @if let Some(pointer) = spilled_to(text) { span class="marker marker-spilled" { "spilled → " (pointer) } }
    }
}

/// Where a spilled result went (`.flower/…`), when the text says.
fn spilled_to(text: &str) -> Option<&str> {
    let at = text.find("spilled to .flower/")? + "spilled to ".len();
    let rest = &text[at..];
    let end = rest.find(|c: char| c.is_whitespace() || c == ']').unwrap_or(rest.len());
    Some(&rest[..end])
}

/// An entry's text: its text blocks and tool results, one after another.
fn entry_text(e: &Entry) -> String {
    let mut out = String::new();
    for b in &e.content {
        match b {
            ContentBlock::Text { text } => out.push_str(text),
            ContentBlock::ToolResult { content, .. } => {
                out.push_str(&flower_model::content::result_text(content));
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_s_content_is_escaped() {
        use flower_model::{EntryKind, JobId, SessionId};
        let evil = "<script>alert(\"x\")</script>";
        let mut e = Entry::new(
            JobId::random(),
            SessionId::random(),
            None,
            EntryKind::Assistant,
            vec![
                ContentBlock::Text { text: evil.into() },
                ContentBlock::ToolUse { id: "t".into(), name: evil.into(), input: serde_json::json!({"a": evil}) },
            ],
        );
        e.tool_name = Some(evil.into());
        e.markers.denial_kind = Some(evil.into());
        e.markers.loaded_tools = vec![evil.into()];
        let shown = entry(&e, Some(evil)).into_string();
        assert!(!shown.contains("<script>"), "{shown}");
        assert!(shown.contains("denied: &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"), "{shown}");
        assert!(shown.starts_with("<article class=\"entry entry-assistant changed\" id=\"e0\"><header>"), "{shown}");
    }

    #[test]
    fn a_spill_s_pointer_is_found() {
        assert_eq!(spilled_to("[result spilled to .flower/spill/a.txt]"), Some(".flower/spill/a.txt"));
        assert_eq!(spilled_to("spilled to .flower/x and more"), Some(".flower/x"));
        assert_eq!(spilled_to("nothing"), None);
    }
}
