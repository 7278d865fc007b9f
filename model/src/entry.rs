//! Transcript entries. One entry is one message (or one tool result) of one
//! session, appended as it happens and **never rewritten**: every later rewrite
//! (pruning on resume, expiry) acts on the copy fed back to the model.
//!
//! The structural markers exist from the first version on because the pruning
//! loader relies on them, never on matching text.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::content::ContentBlock;
use crate::ids::{JobId, SessionId};
use crate::usage::Usage;

/// What an entry is. Tool results get entries of their own (one per call) so
/// that each carries its own markers; consecutive results are merged into one
/// user message when a request is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A user (or delegating coordinator) message.
    User,
    /// One complete assistant response.
    Assistant,
    /// The result of one tool call (sent with role `user`).
    ToolResult,
    /// A notice from the harness, sent as user content (`<system-reminder>`).
    Notice,
}

impl EntryKind {
    /// The stored name (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::User => "user",
            EntryKind::Assistant => "assistant",
            EntryKind::ToolResult => "tool_result",
            EntryKind::Notice => "notice",
        }
    }
}

/// Structural markers the pruning loader relies on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Markers {
    /// Set by the guard that denied the call (e.g. `delegate_guard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denial_kind: Option<String>,
    /// An error entry the harness made up (e.g. a dropped stream), never model output.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub synthetic_error: bool,
    /// A tool result produced by an interruption rather than by the tool.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// For `Bash` calls: whether the command's result can expire, judged when
    /// the call was made (a later policy never re-judges old entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<bool>,
    /// Deferred tools whose schemas this result loaded (the matches of a
    /// `search_tools` call, or the tool itself on a direct call): a resumed
    /// session rebuilds its tool block from these, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loaded_tools: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub uuid: Uuid,
    pub parent_uuid: Option<Uuid>,
    pub job_id: JobId,
    pub session_id: SessionId,
    /// Position in the session, from 1; assigned by the store on append
    /// (0 until then, and then not serialized: a stored body is written
    /// before its number is known).
    #[serde(default, skip_serializing_if = "unnumbered")]
    pub seq: i64,
    pub kind: EntryKind,
    pub content: Vec<ContentBlock>,
    /// For tool results: the tool that produced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub markers: Markers,
    /// Milliseconds since the epoch.
    pub created_at: i64,
}

fn unnumbered(seq: &i64) -> bool {
    *seq == 0
}

impl Entry {
    pub fn new(
        job_id: JobId,
        session_id: SessionId,
        parent_uuid: Option<Uuid>,
        kind: EntryKind,
        content: Vec<ContentBlock>,
    ) -> Self {
        Self {
            // Time-ordered: the store's unique index on entry uuids takes
            // new ones at its right edge instead of on random pages.
            uuid: Uuid::now_v7(),
            parent_uuid,
            job_id,
            session_id,
            seq: 0,
            kind,
            content,
            tool_name: None,
            model: None,
            stop_reason: None,
            usage: None,
            markers: Markers::default(),
            created_at: crate::now_ms(),
        }
    }

    /// The role this entry is sent with.
    pub fn role(&self) -> &'static str {
        match self.kind {
            EntryKind::Assistant => "assistant",
            EntryKind::User | EntryKind::ToolResult | EntryKind::Notice => "user",
        }
    }

    /// Characters of body text (for accounting and summaries).
    pub fn body_chars(&self) -> usize {
        self.content.iter().map(ContentBlock::text_len).sum()
    }

    /// All text blocks joined.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for b in &self.content {
            if let ContentBlock::Text { text } = b {
                out.push_str(text);
            }
        }
        out
    }

    /// The `tool_use` blocks of an assistant entry.
    pub fn tool_uses(&self) -> impl Iterator<Item = (&str, &str, &serde_json::Value)> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolUse { id, name, input } => Some((id.as_str(), name.as_str(), input)),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::EntryKind;

    #[test]
    fn kind_names_are_the_serialized_ones() {
        for kind in [EntryKind::User, EntryKind::Assistant, EntryKind::ToolResult, EntryKind::Notice] {
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::json!(kind.as_str()));
        }
    }
}
