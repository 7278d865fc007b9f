//! The context-economy guards, as hooks.
//!
//! - [`DelegateGuard`] (layer 1, pre-tool): on the coordinator's main thread,
//!   `Bash`/`Write`/`Edit`/`NotebookEdit` are denied with guidance that shows
//!   the way (delegate), and a structural `denial_kind` marker is stored —
//!   except a `Bash` glance [`crate::glance::is_ephemeral`] allows. Subagents
//!   always pass.
//! - [`SpillGuard`] (layer 3, post-tool): each text block of at least the
//!   threshold is written to `spill/<sha256[:16]>.txt` in the workbench and
//!   replaced by a pointer line and its first 400 characters. Images never;
//!   a call whose input names the spill folder passes through (reading a
//!   spilled file must not spill it again).

use std::path::PathBuf;

use async_trait::async_trait;
use flower_model::ResultBlock;
use flower_store::Workbench;
use sha2::{Digest, Sha256};

use crate::glance::is_ephemeral;
use crate::hooks::{HookContext, PostToolHook, PreDecision, PreToolHook};
use crate::tool::ToolOutput;

/// The `denial_kind` the delegate guard writes.
pub const DELEGATE_GUARD: &str = "delegate_guard";

/// Hands-on tools the main thread may not use.
const HANDS_ON: &[&str] = &["Bash", "Write", "Edit", "NotebookEdit"];

/// What the coordinator reads when it tries hands-on work.
pub const DELEGATE_GUIDANCE: &str = "Denied by delegate_guard: the coordinator does not do hands-on work. \
Delegate it to a worker with the Agent tool: state the goal and the acceptance criteria in the mandate, \
require long outputs in .flower/artifacts/ and only paths and conclusions back.";

pub struct DelegateGuard {
    /// Read-only commands pass (a glance).
    pub glance: bool,
}

#[async_trait]
impl PreToolHook for DelegateGuard {
    fn may_judge(&self, tool: &str) -> bool {
        HANDS_ON.contains(&tool)
    }
    async fn before(&self, tool: &str, input: &serde_json::Value, ctx: &HookContext) -> PreDecision {
        if !ctx.main_thread || !HANDS_ON.contains(&tool) {
            return PreDecision::Allow;
        }
        if tool == "Bash" && self.glance {
            let command = input.get("command").and_then(|c| c.as_str()).unwrap_or_default();
            let v = is_ephemeral(command);
            if v.allowed {
                return PreDecision::Allow;
            }
            let why = match &v.segment {
                Some(seg) => format!("segment `{seg}`: {}", v.reason),
                None => v.reason,
            };
            return PreDecision::Deny {
                kind: DELEGATE_GUARD.into(),
                reason: format!("{DELEGATE_GUIDANCE} (Only read-only glances run here; this one is not: {why}.)"),
            };
        }
        PreDecision::Deny { kind: DELEGATE_GUARD.into(), reason: DELEGATE_GUIDANCE.into() }
    }
}

/// Tools whose results are spilled (MCP tools too).
pub fn spill_matches(tool: &str) -> bool {
    matches!(tool, "Bash" | "Read" | "Grep" | "Glob" | "WebFetch" | "WebSearch") || tool.starts_with("mcp__")
}

/// Characters of the spilled text kept inline after the pointer.
pub const SPILL_HEAD: usize = 400;

pub struct SpillGuard {
    pub threshold: usize,
    pub workbench: Workbench,
    /// A worker's local `.flower/` mirror: the file is written there too so
    /// the worker's own `Read` finds it at once.
    pub mirror: Option<PathBuf>,
}

/// Does any string in the call's input name the spill folder?
fn names_spill_folder(input: &serde_json::Value) -> bool {
    match input {
        serde_json::Value::String(s) => s.contains("spill/"),
        serde_json::Value::Array(a) => a.iter().any(names_spill_folder),
        serde_json::Value::Object(o) => o.values().any(names_spill_folder),
        _ => false,
    }
}

/// The pointer that replaces a spilled text.
pub fn spill_pointer(path: &str, text: &str) -> String {
    let chars = text.chars().count();
    let head: String = text.chars().take(SPILL_HEAD).collect();
    format!(
        "[{chars} characters spilled to .flower/{path} — Read it for the full text, Grep it to find things. The first {SPILL_HEAD} follow.]\n{head}"
    )
}

#[async_trait]
impl PostToolHook for SpillGuard {
    async fn after(&self, tool: &str, input: &serde_json::Value, output: &mut ToolOutput, _ctx: &HookContext) {
        if self.threshold == 0 || !spill_matches(tool) || names_spill_folder(input) {
            return;
        }
        for block in output.content.iter_mut() {
            let ResultBlock::Text { text } = block else { continue };
            let chars = text.chars().count();
            if chars < self.threshold {
                continue;
            }
            let hash = hex::encode(Sha256::digest(text.as_bytes()));
            let path = format!("spill/{}.txt", &hash[..16]);
            if let Some(mirror) = &self.mirror {
                let local = mirror.join(&path);
                if let Some(parent) = local.parent() {
                    let _ = tokio::fs::create_dir_all(parent).await;
                }
                if let Err(e) = tokio::fs::write(&local, text.as_bytes()).await {
                    tracing::warn!(error = %e, "spill not written locally; result kept inline");
                    continue;
                }
            }
            if let Err(e) = self.workbench.put(&path, text.clone().into_bytes()).await {
                tracing::warn!(error = %e, "spill not stored; result kept inline");
                continue;
            }
            *text = spill_pointer(&path, text);
            output.spills.push((path, chars));
            crate::metrics::metrics().spills.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::ToolContext;
    use flower_model::{JobId, Role, SessionId};
    use std::sync::Arc;

    fn ctx(main_thread: bool) -> HookContext {
        HookContext {
            tool: ToolContext {
                job_id: JobId::random(),
                session_id: SessionId::random(),
                role: if main_thread { Role::Coordinator } else { Role::Worker },
                tool_use_id: "t".into(),
                cancel: Default::default(),
            },
            main_thread,
        }
    }

    #[tokio::test]
    async fn the_main_thread_is_denied_hands_on_work_subagents_never() {
        let g = DelegateGuard { glance: true };
        let rm = serde_json::json!({"command": "rm -rf x"});
        for tool in ["Write", "Edit", "NotebookEdit"] {
            let d = g.before(tool, &serde_json::json!({}), &ctx(true)).await;
            assert_eq!(d, PreDecision::Deny { kind: DELEGATE_GUARD.into(), reason: DELEGATE_GUIDANCE.into() });
            assert_eq!(g.before(tool, &serde_json::json!({}), &ctx(false)).await, PreDecision::Allow);
        }
        assert!(matches!(g.before("Bash", &rm, &ctx(true)).await, PreDecision::Deny { .. }));
        assert_eq!(g.before("Bash", &rm, &ctx(false)).await, PreDecision::Allow, "subagents always pass");
        assert_eq!(
            g.before("Bash", &serde_json::json!({"command": "git status"}), &ctx(true)).await,
            PreDecision::Allow
        );
        assert_eq!(g.before("Agent", &serde_json::json!({}), &ctx(true)).await, PreDecision::Allow);
        let strict = DelegateGuard { glance: false };
        assert!(matches!(
            strict.before("Bash", &serde_json::json!({"command": "ls"}), &ctx(true)).await,
            PreDecision::Deny { .. }
        ));
    }

    #[tokio::test]
    async fn the_guard_and_the_glance_verdict_agree_on_the_whole_table() {
        let g = DelegateGuard { glance: true };
        for (cmd, allowed) in crate::glance::CASES {
            let d = g.before("Bash", &serde_json::json!({"command": cmd}), &ctx(true)).await;
            assert_eq!(d == PreDecision::Allow, *allowed, "{cmd:?}");
        }
    }

    #[tokio::test]
    async fn large_text_blocks_spill_small_ones_and_images_stay() {
        let objects = Arc::new(object_store::memory::InMemory::new());
        let wb = Workbench::new(objects, JobId::random());
        let g = SpillGuard { threshold: 100, workbench: wb.clone(), mirror: None };
        let big = "x".repeat(150);
        let mut out = ToolOutput {
            content: vec![
                ResultBlock::Text { text: big.clone() },
                ResultBlock::Text { text: "small".into() },
                ResultBlock::Image { source: serde_json::json!({"type": "base64"}) },
            ],
            ..Default::default()
        };
        g.after("mcp__tickets__search", &serde_json::json!({"q": "a"}), &mut out, &ctx(false)).await;
        assert_eq!(out.spills.len(), 1);
        let (path, chars) = &out.spills[0];
        assert_eq!(*chars, 150);
        assert!(path.starts_with("spill/") && path.len() == "spill/".len() + 16 + 4);
        let ResultBlock::Text { text } = &out.content[0] else { panic!() };
        assert!(text.starts_with(&format!("[150 characters spilled to .flower/{path}")));
        assert_eq!(&wb.get(path).await.unwrap()[..], big.as_bytes());
        assert_eq!(out.content[1], ResultBlock::Text { text: "small".into() });

        // Reading the spilled file is not spilled again.
        let mut read = ToolOutput::text(big.clone());
        g.after("Read", &serde_json::json!({"file_path": format!(".flower/{path}")}), &mut read, &ctx(false)).await;
        assert_eq!(read.content, vec![ResultBlock::Text { text: big }]);
        // Other tools are not matched.
        let mut agent = ToolOutput::text("y".repeat(500));
        g.after("Agent", &serde_json::json!({}), &mut agent, &ctx(true)).await;
        assert!(agent.spills.is_empty());
    }
}
