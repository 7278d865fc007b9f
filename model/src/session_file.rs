//! Transcripts in the Claude Code / Agent SDK session-file shape (JSONL, one
//! entry a line: `type`, `uuid`, `parentUuid`, `sessionId`, `isSidechain`,
//! `timestamp`, `message`, …), so existing sessions can be inspected, pruned
//! and resumed by flower, and flower's can be read by other tools.
//!
//! Import maps that shape's structural fields onto flower's markers:
//! `toolDenialKind` → `denial_kind`; `isApiErrorMessage` or model
//! `<synthetic>` → `synthetic_error`; a `[Request interrupted…` error result →
//! `interrupted`; `isMeta` → a notice; `isSidechain` → a subagent session.
//! flower's own markers without an equivalent travel in `flowerMarkers`.

use std::collections::HashMap;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::content::{ContentBlock, result_text};
use crate::entry::{Entry, EntryKind, Markers};
use crate::ids::{JobId, SessionId};
use crate::usage::Usage;

/// One exported line.
pub fn export_line(e: &Entry, sidechain: bool) -> Value {
    let ts = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(e.created_at) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default();
    let mut message = json!({"role": e.role(), "content": e.content});
    if e.kind == EntryKind::Assistant {
        message["model"] =
            json!(if e.markers.synthetic_error { "<synthetic>" } else { e.model.as_deref().unwrap_or("") });
        if let Some(u) = &e.usage {
            message["usage"] = json!(u);
        }
        if let Some(r) = &e.stop_reason {
            message["stop_reason"] = json!(r);
        }
    }
    let mut line = json!({
        "type": if e.kind == EntryKind::Assistant { "assistant" } else { "user" },
        "uuid": e.uuid,
        "parentUuid": e.parent_uuid,
        "sessionId": e.session_id,
        "isSidechain": sidechain,
        "timestamp": ts,
        "message": message,
    });
    if let Some(k) = &e.markers.denial_kind {
        line["toolDenialKind"] = json!(k);
    }
    if e.markers.synthetic_error {
        line["isApiErrorMessage"] = json!(true);
    }
    if e.kind == EntryKind::Notice {
        line["isMeta"] = json!(true);
    }
    if e.markers.ephemeral.is_some() || e.markers.interrupted {
        line["flowerMarkers"] = json!(e.markers);
    }
    line
}

/// Entries parsed from a session file, split by side.
#[derive(Debug, Default)]
pub struct Imported {
    pub main: Vec<Entry>,
    pub sidechain: Vec<Entry>,
    /// Lines skipped (not chain entries, or unreadable), with the reason.
    pub skipped: Vec<(usize, String)>,
}

/// Parse a session file into entries of `job`, in the given sessions.
pub fn import(text: &str, job: JobId, main: SessionId, side: SessionId) -> Imported {
    let mut out = Imported::default();
    // Entries split or dropped on the way keep the chain through this map.
    let mut last_of: HashMap<Uuid, Uuid> = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                out.skipped.push((n + 1, format!("not JSON: {e}")));
                continue;
            }
        };
        let kind = v["type"].as_str().unwrap_or_default();
        if kind != "user" && kind != "assistant" {
            out.skipped.push((n + 1, format!("`{kind}` is not a chain entry")));
            continue;
        }
        let sidechain = v["isSidechain"].as_bool().unwrap_or(false);
        let head = read_head(&v, job, if sidechain { side } else { main }, &last_of);
        let blocks: Vec<ContentBlock> = match &v["message"]["content"] {
            Value::String(s) => vec![ContentBlock::text(s.clone())],
            Value::Array(a) => a.iter().filter_map(|b| serde_json::from_value(b.clone()).ok()).collect(),
            _ => Vec::new(),
        };
        let entries = if kind == "assistant" {
            vec![assistant_entry(&v, &head, blocks)]
        } else {
            user_entries(&v, &head, blocks)
        };
        if let (Some(o), Some(last)) = (head.original, entries.last().map(|e| e.uuid).or(head.parent)) {
            last_of.insert(o, last);
        }
        let target = if sidechain { &mut out.sidechain } else { &mut out.main };
        target.extend(entries);
    }
    out
}

/// What every entry made from one line shares.
struct LineHead {
    job: JobId,
    session: SessionId,
    /// The line's own uuid, for the chain map.
    original: Option<Uuid>,
    /// The id of the line's first entry. Fresh ids: the same file may be
    /// imported twice; the chain is kept through the map.
    uuid: Uuid,
    /// The last entry made from the parent line.
    parent: Option<Uuid>,
    created_at: i64,
    markers: Markers,
}

/// A chain line's ids, time and markers.
fn read_head(v: &Value, job: JobId, session: SessionId, last_of: &HashMap<Uuid, Uuid>) -> LineHead {
    let parent: Option<Uuid> =
        v["parentUuid"].as_str().and_then(|u| u.parse::<Uuid>().ok()).and_then(|p| last_of.get(&p).copied());
    let created_at = v["timestamp"]
        .as_str()
        .and_then(|t| time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok())
        .map_or_else(crate::now_ms, |t| (t.unix_timestamp_nanos() / 1_000_000) as i64);
    let mut markers = Markers::default();
    if let Some(m) = v.get("flowerMarkers").and_then(|m| serde_json::from_value::<Markers>(m.clone()).ok()) {
        markers = m;
    }
    if let Some(k) = v["toolDenialKind"].as_str() {
        markers.denial_kind = Some(k.to_string());
    }
    if v["isApiErrorMessage"].as_bool() == Some(true) || v["message"]["model"].as_str() == Some("<synthetic>") {
        markers.synthetic_error = true;
    }
    LineHead {
        job,
        session,
        original: v["uuid"].as_str().and_then(|u| u.parse().ok()),
        uuid: Uuid::now_v7(),
        parent,
        created_at,
        markers,
    }
}

/// An assistant line: one entry.
fn assistant_entry(v: &Value, head: &LineHead, blocks: Vec<ContentBlock>) -> Entry {
    let mut e = Entry::new(head.job, head.session, head.parent, EntryKind::Assistant, blocks);
    e.uuid = head.uuid;
    e.created_at = head.created_at;
    e.markers = head.markers.clone();
    e.model = v["message"]["model"].as_str().map(str::to_string);
    e.stop_reason = v["message"]["stop_reason"].as_str().map(str::to_string);
    e.usage = serde_json::from_value::<Usage>(v["message"]["usage"].clone()).ok();
    e
}

/// A user line: each tool result becomes its own entry (its own markers);
/// text follows, as a notice when the line is `isMeta`. Chained in order.
fn user_entries(v: &Value, head: &LineHead, blocks: Vec<ContentBlock>) -> Vec<Entry> {
    let (results, rest): (Vec<ContentBlock>, Vec<ContentBlock>) =
        blocks.into_iter().partition(|b| matches!(b, ContentBlock::ToolResult { .. }));
    let mut out: Vec<Entry> = Vec::new();
    for r in results {
        let interrupted = matches!(&r, ContentBlock::ToolResult { content, is_error, .. } if *is_error && result_text(content).starts_with("[Request interrupted"));
        let mut e = Entry::new(
            head.job,
            head.session,
            out.last().map(|e| e.uuid).or(head.parent),
            EntryKind::ToolResult,
            vec![r],
        );
        if out.is_empty() {
            e.uuid = head.uuid;
        }
        e.created_at = head.created_at;
        e.markers = head.markers.clone();
        e.markers.interrupted |= interrupted;
        out.push(e);
    }
    if !rest.is_empty() {
        let kind = if v["isMeta"].as_bool() == Some(true) { EntryKind::Notice } else { EntryKind::User };
        let mut e = Entry::new(head.job, head.session, out.last().map(|e| e.uuid).or(head.parent), kind, rest);
        if out.is_empty() {
            e.uuid = head.uuid;
        }
        e.created_at = head.created_at;
        out.push(e);
    }
    out
}

/// Record the glance verdict on each `Bash` result that has none, as a live
/// run records it when the call is made (a session file from elsewhere
/// carries no verdict). `judge` is the one that allows glances; results the
/// tool never produced (denied calls) stay without one, as they do live.
/// Returns how many verdicts were recorded.
pub fn record_bash_verdicts(entries: &mut [Entry], judge: &dyn Fn(&str) -> bool) -> usize {
    let commands: std::collections::HashMap<String, Option<String>> = entries
        .iter()
        .flat_map(|e| e.tool_uses())
        .filter(|(_, name, _)| *name == "Bash")
        .map(|(id, _, input)| (id.to_string(), input["command"].as_str().map(str::to_string)))
        .collect();
    let mut recorded = 0;
    for e in entries.iter_mut().filter(|e| e.kind == EntryKind::ToolResult) {
        if e.markers.ephemeral.is_some() || e.markers.denial_kind.is_some() {
            continue;
        }
        let id = e.content.iter().find_map(|b| match b {
            ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
            _ => None,
        });
        if let Some(command) = id.and_then(|id| commands.get(id)) {
            e.markers.ephemeral = Some(command.as_deref().is_some_and(judge));
            recorded += 1;
        }
    }
    recorded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_code_markers_map_onto_flowers() {
        let text = r#"
{"type":"summary","summary":"x"}
{"type":"user","uuid":"00000000-0000-0000-0000-000000000001","parentUuid":null,"sessionId":"s","isSidechain":false,"timestamp":"2026-11-30T10:00:00Z","message":{"role":"user","content":"do it"}}
{"type":"assistant","uuid":"00000000-0000-0000-0000-000000000002","parentUuid":"00000000-0000-0000-0000-000000000001","sessionId":"s","isSidechain":false,"timestamp":"2026-11-30T10:00:01Z","message":{"role":"assistant","model":"claude","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"rm x"}},{"type":"tool_use","id":"t2","name":"Bash","input":{"command":"sleep 9"}}]}}
{"type":"user","uuid":"00000000-0000-0000-0000-000000000003","parentUuid":"00000000-0000-0000-0000-000000000002","sessionId":"s","isSidechain":false,"toolDenialKind":"permission-rule","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"denied","is_error":true}]}}
{"type":"user","uuid":"00000000-0000-0000-0000-000000000004","parentUuid":"00000000-0000-0000-0000-000000000003","sessionId":"s","isSidechain":false,"message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","content":"[Request interrupted by user for tool use]","is_error":true}]}}
{"type":"assistant","uuid":"00000000-0000-0000-0000-000000000005","parentUuid":"00000000-0000-0000-0000-000000000004","sessionId":"s","isSidechain":false,"isApiErrorMessage":true,"message":{"role":"assistant","model":"<synthetic>","content":[{"type":"text","text":"API Error"}]}}
{"type":"user","uuid":"00000000-0000-0000-0000-000000000006","parentUuid":"00000000-0000-0000-0000-000000000005","sessionId":"s","isSidechain":true,"message":{"role":"user","content":"sub task"}}
"#;
        let got = import(text, JobId::random(), SessionId::random(), SessionId::random());
        assert_eq!(got.skipped.len(), 1);
        assert_eq!(got.main.len(), 5);
        assert_eq!(got.sidechain.len(), 1);
        assert_eq!(got.main[2].markers.denial_kind.as_deref(), Some("permission-rule"));
        assert!(got.main[3].markers.interrupted);
        assert!(got.main[4].markers.synthetic_error);
        assert_eq!(got.main[1].parent_uuid, Some(got.main[0].uuid));
    }

    #[test]
    fn bash_results_without_a_verdict_get_the_judges_and_recorded_ones_stay() {
        let (job, s) = (JobId::random(), SessionId::random());
        let call = |id: &str, name: &str, command: &str| {
            Entry::new(
                job,
                s,
                None,
                EntryKind::Assistant,
                vec![ContentBlock::ToolUse { id: id.into(), name: name.into(), input: json!({"command": command}) }],
            )
        };
        let result = |id: &str| {
            Entry::new(job, s, None, EntryKind::ToolResult, vec![ContentBlock::tool_result(id, "out", false)])
        };
        let mut entries = vec![
            call("a", "Bash", "git status"),
            result("a"),
            call("b", "Bash", "rm x"),
            result("b"),
            call("c", "Bash", "git status"),
            result("c"),
            call("d", "Read", "git status"),
            result("d"),
            call("e", "Bash", "git status"),
            result("e"),
        ];
        entries[5].markers.ephemeral = Some(false);
        entries[9].markers.denial_kind = Some("permission-rule".into());
        let judge = |c: &str| c == "git status";
        assert_eq!(record_bash_verdicts(&mut entries, &judge), 2);
        let got: Vec<Option<bool>> = entries.iter().skip(1).step_by(2).map(|e| e.markers.ephemeral).collect();
        assert_eq!(
            got,
            vec![Some(true), Some(false), Some(false), None, None],
            "judged, judged, kept, not Bash, denied"
        );
    }

    #[test]
    fn export_then_import_round_trips_markers() {
        let job = JobId::random();
        let s = SessionId::random();
        let mut a = Entry::new(
            job,
            s,
            None,
            EntryKind::Assistant,
            vec![ContentBlock::ToolUse { id: "t".into(), name: "Bash".into(), input: json!({"command": "ls"}) }],
        );
        a.model = Some("m".into());
        let mut r =
            Entry::new(job, s, Some(a.uuid), EntryKind::ToolResult, vec![ContentBlock::tool_result("t", "x", false)]);
        r.markers.ephemeral = Some(true);
        r.markers.denial_kind = Some("delegate_guard".into());
        let text: String = [&a, &r].iter().map(|e| export_line(e, false).to_string() + "\n").collect();
        let back = import(&text, job, s, SessionId::random());
        assert_eq!(back.main.len(), 2);
        assert_eq!(back.main[1].markers, r.markers);
        assert_eq!(back.main[1].parent_uuid, Some(back.main[0].uuid), "the chain survives fresh ids");
        assert_eq!(back.main[0].content, a.content);
    }
}
