//! From stored entries to the `messages` of a request: consecutive entries of
//! the same role are merged into one message, and in a user message the
//! `tool_result` blocks come first (the API requires it). A `tool_use` left
//! without a result (the process died mid-turn) gets a healing result so the
//! provider never sees an unpaired call.

use std::collections::HashSet;

use flower_model::{ContentBlock, Entry, EntryKind};

use crate::provider::Message;

/// The text given to a call that never produced a result.
pub const NEVER_PRODUCED: &str = "[interrupted here; this tool result was never produced]";

pub fn to_messages(entries: &[Entry]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    extend_messages(&mut out, entries);
    out
}

/// Add `entries` to `messages`, the messages of the entries before them:
/// the same as [`to_messages`] of all the entries, copying only the new
/// ones. (Merging a message's results first again after more blocks join
/// it gives what merging all of its blocks once gives: the partition is
/// stable.)
pub fn extend_messages(messages: &mut Vec<Message>, entries: &[Entry]) {
    // The first message this changes: the last one, should it be extended.
    let mut from = messages.len();
    // Synthetic error entries record what happened; they are never re-sent.
    for e in entries.iter().filter(|e| !e.markers.synthetic_error) {
        let role = e.role();
        let last = messages.len().wrapping_sub(1);
        match messages.last_mut() {
            Some(m) if m.role == role => {
                from = from.min(last);
                m.content.extend(e.content.iter().cloned());
            }
            _ => messages.push(Message { role: role.to_string(), content: e.content.clone() }),
        }
    }
    for m in messages[from..].iter_mut().filter(|m| m.role == "user") {
        // Stable partition: results first, in call order; other blocks after.
        let (mut results, rest): (Vec<_>, Vec<_>) =
            m.content.drain(..).partition(|b| matches!(b, ContentBlock::ToolResult { .. }));
        results.extend(rest);
        m.content = results;
    }
}

/// Calls (id, tool, input) of the last assistant entry that have no result after it.
pub fn unanswered_calls(entries: &[Entry]) -> Vec<(String, String, serde_json::Value)> {
    let Some(pos) = entries.iter().rposition(|e| e.kind == EntryKind::Assistant) else { return Vec::new() };
    let answered: HashSet<&str> = entries[pos + 1..]
        .iter()
        .flat_map(|e| e.content.iter())
        .filter_map(|b| match b {
            ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
            _ => None,
        })
        .collect();
    entries[pos]
        .tool_uses()
        .filter(|(id, _, _)| !answered.contains(id))
        .map(|(id, name, input)| (id.to_string(), name.to_string(), input.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_model::{JobId, SessionId};
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn entry(kind: EntryKind, content: Vec<ContentBlock>) -> Entry {
        Entry::new(JobId::random(), SessionId::random(), None, kind, content)
    }

    #[test]
    fn messages_extended_entry_by_entry_are_the_messages_of_all_entries() {
        let call = |id: &str| ContentBlock::ToolUse { id: id.into(), name: "Read".into(), input: json!({"p": id}) };
        let entries = vec![
            entry(EntryKind::User, vec![ContentBlock::text("goal")]),
            entry(EntryKind::Assistant, vec![call("a"), call("b")]),
            entry(EntryKind::ToolResult, vec![ContentBlock::tool_result("a", "1", false)]),
            entry(EntryKind::Notice, vec![ContentBlock::text("a notice")]),
            entry(EntryKind::ToolResult, vec![ContentBlock::tool_result("b", "2", false)]),
            entry(EntryKind::Assistant, vec![ContentBlock::text("thinking"), call("c")]),
            entry(EntryKind::Assistant, vec![call("d")]),
            entry(EntryKind::ToolResult, vec![ContentBlock::tool_result("c", "3", true)]),
            entry(EntryKind::ToolResult, vec![ContentBlock::tool_result("d", "4", false)]),
            entry(EntryKind::User, vec![ContentBlock::text("and then")]),
        ];
        let whole = to_messages(&entries);
        for cut in 0..=entries.len() {
            for second in cut..=entries.len() {
                let mut messages = to_messages(&entries[..cut]);
                extend_messages(&mut messages, &entries[cut..second]);
                extend_messages(&mut messages, &entries[second..]);
                assert_eq!(messages, whole, "cut at {cut} and {second}");
            }
        }
    }

    #[test]
    fn consecutive_user_entries_merge_with_results_first() {
        let entries = vec![
            entry(EntryKind::User, vec![ContentBlock::text("goal")]),
            entry(
                EntryKind::Assistant,
                vec![
                    ContentBlock::ToolUse { id: "a".into(), name: "Read".into(), input: json!({}) },
                    ContentBlock::ToolUse { id: "b".into(), name: "Read".into(), input: json!({}) },
                ],
            ),
            entry(EntryKind::ToolResult, vec![ContentBlock::tool_result("a", "1", false)]),
            entry(EntryKind::Notice, vec![ContentBlock::text("<system-reminder>x</system-reminder>")]),
            entry(EntryKind::ToolResult, vec![ContentBlock::tool_result("b", "2", false)]),
        ];
        let m = to_messages(&entries);
        assert_eq!(m.iter().map(|m| m.role.as_str()).collect::<Vec<_>>(), vec!["user", "assistant", "user"]);
        assert_eq!(
            m[2].content,
            vec![
                ContentBlock::tool_result("a", "1", false),
                ContentBlock::tool_result("b", "2", false),
                ContentBlock::text("<system-reminder>x</system-reminder>"),
            ]
        );
    }

    #[test]
    fn unanswered_calls_are_found() {
        let entries = vec![
            entry(
                EntryKind::Assistant,
                vec![
                    ContentBlock::ToolUse { id: "a".into(), name: "Bash".into(), input: json!({}) },
                    ContentBlock::ToolUse { id: "b".into(), name: "Read".into(), input: json!({}) },
                ],
            ),
            entry(EntryKind::ToolResult, vec![ContentBlock::tool_result("a", "1", false)]),
        ];
        assert_eq!(unanswered_calls(&entries), vec![("b".to_string(), "Read".to_string(), json!({}))]);
        assert!(unanswered_calls(&entries[1..]).is_empty());
    }
}
