//! The pruning loader (docs/design.md section 7): what a resumed session is
//! fed. It owns the rules below and nothing else: it works on a copy and
//! never changes a stored row, and it does no I/O — the bodies a trim moves
//! out are returned for the caller to write. Rules, in this order, one
//! function each:
//!
//! 1. `expire` results of calls recorded as ephemeral (≤ `max_chars`),
//!    older than the `keep_recent` most recent ones: their body becomes a
//!    notice to run the command again. A `Bash` result recorded without a
//!    verdict (an imported session) is judged now, by the same judge that
//!    allows glances (passed in: the judge lives with the agent); a recorded
//!    verdict always wins, so a newer allowlist never re-judges what a run
//!    recorded;
//! 2. `trim` (off by default) older large text results: the text goes to
//!    the workbench, content-addressed (written only if absent), behind a
//!    pointer;
//! 3. `denials`: denied calls leave by their structural marker (keeping the
//!    most recent `keep_denials`);
//! 4. `residue`: synthetic API-error entries are dropped, results left by an
//!    interruption neutralised; then `pair` drops results whose call is gone
//!    and heals calls left without a result;
//! 5. `relink` the parent chain.
//!
//! Red lines: a `tool_use` and its `tool_result` leave together; other calls
//! of the same assistant message stay; the parent chain is relinked to the
//! nearest surviving ancestor.

use std::collections::{HashMap, HashSet};

use flower_model::content::result_text;
use flower_model::spec::{EphemeralOptions, PruningOptions, TrimOptions};
use flower_model::{ContentBlock, Entry, EntryKind, ResultBlock};
use serde::Serialize;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The neutral text of a result that was never produced.
pub const NEVER_PRODUCED: &str = "[interrupted here; this tool result was never produced]";

/// What one rule did to one entry (for `transcript show --pruned`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    pub rule: &'static str,
    /// The stored entry's uuid (of the entry changed, removed or healed after).
    pub entry: Uuid,
    pub detail: String,
}

/// A trimmed body to store where the resumed agent's `Read` can open it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrimWrite {
    /// Workbench-relative path (`spill/<sha256[:16]>.txt`).
    pub path: String,
    pub text: String,
}

#[derive(Clone, Debug, Default)]
pub struct Pruned {
    pub entries: Vec<Entry>,
    pub changes: Vec<Change>,
    pub trims: Vec<TrimWrite>,
}

fn result_id(e: &Entry) -> Option<&str> {
    e.content.iter().find_map(|b| match b {
        ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
        _ => None,
    })
}

fn set_result_text(e: &mut Entry, text: String) {
    for b in e.content.iter_mut() {
        if let ContentBlock::ToolResult { content, .. } = b {
            *content = vec![ResultBlock::Text { text: text.clone() }];
        }
    }
}

/// A call's name and input, by its tool_use id.
type Calls = HashMap<String, (usize, String, serde_json::Value)>;

/// Whether a result's call was a glance: its recorded verdict, else (a `Bash`
/// result recorded without one) `judge` on the call's command.
fn ephemeral(e: &Entry, calls: &Calls, judge: &dyn Fn(&str) -> bool) -> bool {
    if let Some(recorded) = e.markers.ephemeral {
        return recorded;
    }
    let Some((_, name, input)) = result_id(e).and_then(|id| calls.get(id)) else { return false };
    name == "Bash" && input["command"].as_str().is_some_and(judge)
}

/// Prune a session's stored entries (in order) for a resume. `judge` says
/// whether a command is a glance (`flower_agent::glance::allows`); it is
/// asked only about `Bash` calls whose result records no verdict.
pub fn prune(stored: &[Entry], opts: &PruningOptions, judge: &dyn Fn(&str) -> bool) -> Pruned {
    let mut entries = stored.to_vec();
    let mut changes = Vec::new();
    let calls = index_calls(&entries);
    if opts.ephemeral.enabled {
        expire(&mut entries, &calls, &opts.ephemeral, judge, &mut changes);
    }
    let trims = if opts.trim.enabled { trim(&mut entries, &opts.trim, &mut changes) } else { Vec::new() };
    let drop_ids = denials(&entries, &calls, opts.keep_denials, &mut changes);
    let removed = residue(&mut entries, &drop_ids, &mut changes);
    let mut kept = pair(entries, &removed, &mut changes);
    relink(&mut kept, stored);
    Pruned { entries: kept, changes, trims }
}

/// Where each call was made: tool_use id → (assistant index, tool, input).
fn index_calls(entries: &[Entry]) -> Calls {
    let mut calls: Calls = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        for (id, name, input) in e.tool_uses() {
            calls.insert(id.to_string(), (i, name.to_string(), input.clone()));
        }
    }
    calls
}

/// 1. Expire: glance results of at most `max_chars`, older than the
///    `keep_recent` most recent, become a notice to run the command again.
fn expire(
    entries: &mut [Entry],
    calls: &Calls,
    opts: &EphemeralOptions,
    judge: &dyn Fn(&str) -> bool,
    changes: &mut Vec<Change>,
) {
    // Assistant turns after each position (how many turns ago a result is), in one pass.
    let mut assistants_after = vec![0usize; entries.len() + 1];
    for i in (0..entries.len()).rev() {
        assistants_after[i] = assistants_after[i + 1] + usize::from(entries[i].kind == EntryKind::Assistant);
    }
    let candidates: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            e.kind == EntryKind::ToolResult
                && e.markers.denial_kind.is_none()
                && ephemeral(e, calls, judge)
                && e.content.iter().any(|b| matches!(b, ContentBlock::ToolResult { content, .. } if result_text(content).chars().count() <= opts.max_chars))
        })
        .map(|(i, _)| i)
        .collect();
    let expire = candidates.len().saturating_sub(opts.keep_recent);
    for &i in &candidates[..expire] {
        let id = result_id(&entries[i]).unwrap_or_default().to_string();
        let command =
            calls.get(&id).and_then(|(_, _, input)| input["command"].as_str()).unwrap_or("the command").to_string();
        let ago = assistants_after[i];
        let uuid = entries[i].uuid;
        set_result_text(
            &mut entries[i],
            format!(
                "[`{command}` result expired ({ago} turns ago); the state may have changed — run it again if needed]"
            ),
        );
        changes.push(Change {
            rule: "ephemeral",
            entry: uuid,
            detail: format!("`{command}` expired ({ago} turns ago)"),
        });
    }
}

/// 2. Trim: text results of at least `min_chars`, older than the
///    `keep_recent` most recent, move behind a pointer; the bodies to write
///    (once per path: they are content-addressed) are returned.
fn trim(entries: &mut [Entry], opts: &TrimOptions, changes: &mut Vec<Change>) -> Vec<TrimWrite> {
    let mut trims = Vec::new();
    let mut trimmed: HashSet<String> = HashSet::new();
    let results: Vec<usize> =
        entries.iter().enumerate().filter(|(_, e)| e.kind == EntryKind::ToolResult).map(|(i, _)| i).collect();
    let old = results.len().saturating_sub(opts.keep_recent);
    for &i in &results[..old] {
        if entries[i].markers.denial_kind.is_some() {
            continue;
        }
        let text = entries[i]
            .content
            .iter()
            .find_map(|b| match b {
                ContentBlock::ToolResult { content, .. } => Some(result_text(content)),
                _ => None,
            })
            .unwrap_or_default();
        let chars = text.chars().count();
        if chars < opts.min_chars || text.contains("characters spilled to .flower/") {
            continue;
        }
        let hash = hex::encode(Sha256::digest(text.as_bytes()));
        let path = format!("spill/{}.txt", &hash[..16]);
        let head: String = text.chars().take(400).collect();
        let uuid = entries[i].uuid;
        set_result_text(
            &mut entries[i],
            format!(
                "[{chars} characters trimmed to .flower/{path} on resume — Read it for the full text. The first 400 follow.]\n{head}"
            ),
        );
        changes.push(Change { rule: "trim", entry: uuid, detail: format!("{chars} chars → .flower/{path}") });
        if trimmed.insert(path.clone()) {
            trims.push(TrimWrite { path, text });
        }
    }
    trims
}

/// 3. Denials: denied calls beyond the `keep` most recent, by their
///    structural marker. Returns their tool_use ids: each call leaves with
///    its result (see `residue`).
fn denials(entries: &[Entry], calls: &Calls, keep: usize, changes: &mut Vec<Change>) -> HashSet<String> {
    let mut drop_ids: HashSet<String> = HashSet::new();
    let denied: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == EntryKind::ToolResult && e.markers.denial_kind.is_some())
        .map(|(i, _)| i)
        .collect();
    let drop_denied = denied.len().saturating_sub(keep);
    for &i in &denied[..drop_denied] {
        if let Some(id) = result_id(&entries[i]) {
            drop_ids.insert(id.to_string());
            let kind = entries[i].markers.denial_kind.clone().unwrap_or_default();
            let tool = calls.get(id).map(|c| c.1.clone()).unwrap_or_default();
            changes.push(Change {
                rule: "denial",
                entry: entries[i].uuid,
                detail: format!("{tool} call denied by {kind} removed with its result"),
            });
        }
    }
    drop_ids
}

/// 4. Residue, in one pass with the removal of the dropped (denied) calls:
///    synthetic API-error entries are not re-sent, interrupted results get
///    the neutral text, a dropped call leaves its message (the message too
///    when nothing else is left of it) and its result leaves with it. Returns
///    the entries removed.
fn residue(entries: &mut [Entry], drop_ids: &HashSet<String>, changes: &mut Vec<Change>) -> HashSet<Uuid> {
    let mut removed: HashSet<Uuid> = HashSet::new();
    for e in entries.iter_mut() {
        if e.markers.synthetic_error {
            removed.insert(e.uuid);
            changes.push(Change {
                rule: "synthetic",
                entry: e.uuid,
                detail: "synthetic API-error entry not re-injected".into(),
            });
            continue;
        }
        if e.kind == EntryKind::ToolResult {
            if result_id(e).is_some_and(|id| drop_ids.contains(id)) {
                removed.insert(e.uuid);
                continue;
            }
            if e.markers.interrupted {
                neutralise(e, changes);
            }
        }
        if e.kind == EntryKind::Assistant && e.tool_uses().any(|(id, _, _)| drop_ids.contains(id)) {
            e.content.retain(|b| !matches!(b, ContentBlock::ToolUse { id, .. } if drop_ids.contains(id)));
            if e.content.is_empty() {
                removed.insert(e.uuid);
            }
        }
    }
    removed
}

/// Give an interrupted result the neutral text, unless it has it already.
fn neutralise(e: &mut Entry, changes: &mut Vec<Change>) {
    let already = e
        .content
        .iter()
        .any(|b| matches!(b, ContentBlock::ToolResult { content, .. } if result_text(content) == NEVER_PRODUCED));
    if !already {
        set_result_text(e, NEVER_PRODUCED.to_string());
        changes.push(Change { rule: "interrupted", entry: e.uuid, detail: "interrupted result neutralised".into() });
    }
}

/// Pairing: the surviving entries, without results whose call is gone, and
/// with a healing result after each call left without one — except in the
/// last turn: the resuming session makes idempotent calls again (an `Agent`
/// call finds its task) and gives the others a stored neutral result.
fn pair(entries: Vec<Entry>, removed: &HashSet<Uuid>, changes: &mut Vec<Change>) -> Vec<Entry> {
    let mut kept: Vec<Entry> = Vec::with_capacity(entries.len());
    let live_calls: HashSet<String> = entries
        .iter()
        .filter(|e| !removed.contains(&e.uuid))
        .flat_map(|e| e.tool_uses().map(|(id, _, _)| id.to_string()).collect::<Vec<_>>())
        .collect();
    let answered: HashSet<String> = entries
        .iter()
        .filter(|e| !removed.contains(&e.uuid))
        .filter_map(|e| result_id(e).map(str::to_string))
        .collect();
    let mut pending: Vec<(String, String)> = Vec::new();
    for e in entries {
        if removed.contains(&e.uuid) {
            continue;
        }
        if e.kind == EntryKind::ToolResult && result_id(&e).is_some_and(|id| !live_calls.contains(id)) {
            changes.push(Change { rule: "orphan", entry: e.uuid, detail: "result without its call dropped".into() });
            continue;
        }
        // Heal the previous assistant turn's unanswered calls before anything else follows it.
        if e.kind != EntryKind::ToolResult && !pending.is_empty() {
            heal(&mut kept, &mut pending, changes);
        }
        if e.kind == EntryKind::Assistant {
            pending = e
                .tool_uses()
                .filter(|(id, _, _)| !answered.contains(*id))
                .map(|(id, n, _)| (id.to_string(), n.to_string()))
                .collect();
        }
        kept.push(e);
    }
    kept
}

/// Relink: each kept entry's parent is its nearest surviving ancestor in
/// the `stored` chain.
fn relink(kept: &mut [Entry], stored: &[Entry]) {
    let original_parent: HashMap<Uuid, Option<Uuid>> = stored.iter().map(|e| (e.uuid, e.parent_uuid)).collect();
    let surviving: HashSet<Uuid> = kept.iter().map(|e| e.uuid).collect();
    for e in kept.iter_mut() {
        let mut p = e.parent_uuid;
        while let Some(id) = p {
            if surviving.contains(&id) {
                break;
            }
            p = original_parent.get(&id).copied().flatten();
        }
        if p != e.parent_uuid {
            e.parent_uuid = p;
        }
    }
}

/// Append healing results for `pending` calls after the last kept entry.
fn heal(kept: &mut Vec<Entry>, pending: &mut Vec<(String, String)>, changes: &mut Vec<Change>) {
    for (id, name) in pending.drain(..) {
        let Some(last) = kept.last() else { return };
        let mut e = Entry::new(
            last.job_id,
            last.session_id,
            Some(last.uuid),
            EntryKind::ToolResult,
            vec![ContentBlock::tool_result(id.clone(), NEVER_PRODUCED, true)],
        );
        e.tool_name = Some(name.clone());
        e.markers.interrupted = true;
        e.seq = last.seq;
        changes.push(Change {
            rule: "heal",
            entry: last.uuid,
            detail: format!("{name} call {id} had no result; a neutral one was added"),
        });
        kept.push(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_model::{JobId, SessionId};
    use rand::{Rng, SeedableRng};
    use serde_json::json;

    struct Builder {
        job: JobId,
        session: SessionId,
        entries: Vec<Entry>,
    }

    impl Builder {
        fn new() -> Self {
            Self { job: JobId::random(), session: SessionId::random(), entries: Vec::new() }
        }
        fn push(&mut self, kind: EntryKind, content: Vec<ContentBlock>) -> &mut Entry {
            let parent = self.entries.last().map(|e| e.uuid);
            let mut e = Entry::new(self.job, self.session, parent, kind, content);
            e.seq = self.entries.len() as i64 + 1;
            self.entries.push(e);
            self.entries.last_mut().unwrap()
        }
        fn user(&mut self, t: &str) {
            self.push(EntryKind::User, vec![ContentBlock::text(t)]);
        }
        fn calls(&mut self, calls: &[(&str, &str, serde_json::Value)]) {
            let blocks = calls
                .iter()
                .map(|(id, name, input)| ContentBlock::ToolUse {
                    id: id.to_string(),
                    name: name.to_string(),
                    input: input.clone(),
                })
                .collect();
            self.push(EntryKind::Assistant, blocks);
        }
        fn result(&mut self, id: &str, text: &str) -> &mut Entry {
            self.push(EntryKind::ToolResult, vec![ContentBlock::tool_result(id, text, false)])
        }
    }

    /// A judge that admits nothing: only recorded verdicts count.
    fn never(_: &str) -> bool {
        false
    }

    fn texts(p: &Pruned) -> Vec<String> {
        p.entries
            .iter()
            .map(|e| match e.content.first() {
                Some(ContentBlock::ToolResult { content, .. }) => result_text(content),
                Some(ContentBlock::ToolUse { id, .. }) => format!("use:{id}"),
                Some(ContentBlock::Text { text }) => text.clone(),
                _ => String::new(),
            })
            .collect()
    }

    #[test]
    fn old_ephemeral_results_expire_the_recent_ones_stay() {
        let mut b = Builder::new();
        b.user("goal");
        for i in 0..8 {
            b.calls(&[(&format!("g{i}"), "Bash", json!({"command": format!("ls {i}")}))]);
            b.result(&format!("g{i}"), "out").markers.ephemeral = Some(true);
        }
        let p = prune(&b.entries, &PruningOptions::default(), &never);
        let t = texts(&p);
        assert!(t[2].starts_with("[`ls 0` result expired (7 turns ago)"), "{}", t[2]);
        assert!(t[4].starts_with("[`ls 1` result expired (6 turns ago)"));
        assert_eq!(t[6], "out", "the 6 most recent stay");
        assert_eq!(p.changes.iter().filter(|c| c.rule == "ephemeral").count(), 2);
        let big = "x".repeat(2001);
        let mut b2 = Builder::new();
        for i in 0..8 {
            b2.calls(&[(&format!("g{i}"), "Bash", json!({"command": "ls"}))]);
            b2.result(&format!("g{i}"), &big).markers.ephemeral = Some(true);
        }
        assert!(
            prune(&b2.entries, &PruningOptions::default(), &never).changes.is_empty(),
            "over max_chars: not expired"
        );
    }

    #[test]
    fn a_bash_result_without_a_verdict_is_judged_and_a_recorded_one_wins() {
        let judge = |c: &str| c.starts_with("git status");
        let mut b = Builder::new();
        b.user("goal");
        for i in 0..9 {
            b.calls(&[(&format!("g{i}"), "Bash", json!({"command": "git status"}))]);
            b.result(&format!("g{i}"), "clean");
        }
        let p = prune(&b.entries, &PruningOptions::default(), &judge);
        let t = texts(&p);
        for i in 0..3 {
            assert!(t[2 + 2 * i].starts_with("[`git status` result expired"), "{}", t[2 + 2 * i]);
        }
        assert!(t[8..].iter().all(|x| !x.contains("expired")), "the latest six stay: {t:?}");
        assert_eq!(p.changes.iter().filter(|c| c.rule == "ephemeral").count(), 3);
        assert!(prune(&b.entries, &PruningOptions::default(), &never).changes.is_empty(), "the judge decided");

        // Recorded verdicts win over the judge, both ways; other tools are never judged.
        let mut b = Builder::new();
        b.user("goal");
        for i in 0..8 {
            b.calls(&[(&format!("r{i}"), "Bash", json!({"command": "git status"}))]);
            b.result(&format!("r{i}"), "clean").markers.ephemeral = Some(false);
        }
        for i in 0..8 {
            b.calls(&[(&format!("x{i}"), "Read", json!({"command": "git status"}))]);
            b.result(&format!("x{i}"), "text");
        }
        assert!(prune(&b.entries, &PruningOptions::default(), &judge).changes.is_empty());
        let mut b = Builder::new();
        for i in 0..8 {
            b.calls(&[(&format!("r{i}"), "Bash", json!({"command": "rm -rf x"}))]);
            b.result(&format!("r{i}"), "").markers.ephemeral = Some(true);
        }
        assert_eq!(prune(&b.entries, &PruningOptions::default(), &judge).changes.len(), 2);
    }

    #[test]
    fn denied_calls_leave_with_their_results_keeping_the_latest_and_siblings() {
        let mut b = Builder::new();
        b.user("goal");
        b.calls(&[("d1", "Bash", json!({"command": "rm x"})), ("a1", "Agent", json!({}))]);
        b.result("d1", "Denied by delegate_guard").markers.denial_kind = Some("delegate_guard".into());
        b.result("a1", "report");
        b.calls(&[("d2", "Write", json!({}))]);
        b.result("d2", "Denied by delegate_guard").markers.denial_kind = Some("delegate_guard".into());
        b.push(EntryKind::Assistant, vec![ContentBlock::text("done")]);
        let p = prune(&b.entries, &PruningOptions::default(), &never);
        assert_eq!(texts(&p), vec!["goal", "use:a1", "report", "use:d2", "Denied by delegate_guard", "done"]);
        assert_eq!(p.entries[1].content.len(), 1, "the sibling Agent call stays");
        assert_eq!(p.entries[2].parent_uuid, Some(p.entries[1].uuid), "relinked past the removed result");
    }

    #[test]
    fn residue_is_cleaned_and_unpaired_calls_are_healed() {
        let mut b = Builder::new();
        b.user("goal");
        b.push(EntryKind::Assistant, vec![ContentBlock::text("API error")]).markers.synthetic_error = true;
        b.calls(&[("i1", "Bash", json!({})), ("u1", "Read", json!({}))]);
        b.result("i1", "[Request interrupted by user]").markers.interrupted = true;
        b.result("ghost", "orphan");
        b.user("continue");
        b.calls(&[("last", "Agent", json!({}))]);
        let p = prune(&b.entries, &PruningOptions::default(), &never);
        assert_eq!(texts(&p), vec!["goal", "use:i1", NEVER_PRODUCED, NEVER_PRODUCED, "continue", "use:last"]);
        assert_eq!(p.entries.len(), 6, "the last turn's pending call is left for the session to resume");
        assert!(p.entries[3].markers.interrupted);
        assert_eq!(p.entries[1].parent_uuid, Some(p.entries[0].uuid), "relinked past the synthetic entry");
    }

    #[test]
    fn trim_moves_old_large_results_out_idempotently() {
        let mut b = Builder::new();
        let big = "y".repeat(3000);
        for i in 0..25 {
            b.calls(&[(&format!("c{i}"), "Read", json!({}))]);
            b.result(&format!("c{i}"), &big);
        }
        let mut opts = PruningOptions::default();
        opts.trim.enabled = true;
        let p = prune(&b.entries, &opts, &never);
        assert_eq!(p.changes.iter().filter(|c| c.rule == "trim").count(), 5);
        assert_eq!(p.trims.len(), 1, "the same body is written once");
        assert!(texts(&p)[1].starts_with("[3000 characters trimmed to .flower/spill/"));
        assert_eq!(prune(&b.entries, &opts, &never).trims, p.trims, "the loader is idempotent");
    }

    /// Random transcripts: every call paired in the next message, an unbroken
    /// chain, the stored rows unchanged.
    #[test]
    fn property_pairs_chain_and_stored_rows_hold() {
        for seed in 0..300u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut b = Builder::new();
            b.user("goal");
            let mut n = 0;
            for _ in 0..rng.random_range(1..25) {
                match rng.random_range(0..10) {
                    0 => b.user("a message"),
                    1 => b.push(EntryKind::Assistant, vec![ContentBlock::text("err")]).markers.synthetic_error = true,
                    2 => {
                        b.push(EntryKind::Notice, vec![ContentBlock::text("<system-reminder>x</system-reminder>")])
                            .kind = EntryKind::Notice
                    }
                    _ => {
                        let k = rng.random_range(1..4);
                        let ids: Vec<String> = (0..k)
                            .map(|_| {
                                n += 1;
                                format!("t{n}")
                            })
                            .collect();
                        let calls: Vec<(&str, &str, serde_json::Value)> =
                            ids.iter().map(|id| (id.as_str(), "Bash", json!({"command": "ls"}))).collect();
                        b.calls(&calls);
                        for id in &ids {
                            match rng.random_range(0..6) {
                                0 => {} // never answered
                                1 => b.result(id, "Denied by x").markers.denial_kind = Some("delegate_guard".into()),
                                2 => b.result(id, "cut").markers.interrupted = true,
                                3 => b.result(id, "ok").markers.ephemeral = Some(true),
                                _ => {
                                    b.result(id, &"z".repeat(rng.random_range(0..3000)));
                                }
                            }
                        }
                    }
                }
            }
            let before = b.entries.clone();
            let mut opts = PruningOptions::default();
            opts.trim.enabled = rng.random_bool(0.5);
            opts.keep_denials = rng.random_range(0..3);
            let p = prune(&b.entries, &opts, &never);
            assert_eq!(b.entries, before, "seed {seed}: stored rows unchanged");
            // Pairing, checked on the messages a request would carry.
            let mut i = 0;
            let e = &p.entries;
            while i < e.len() {
                if e[i].kind == EntryKind::Assistant {
                    let ids: Vec<&str> = e[i].tool_uses().map(|(id, _, _)| id).collect();
                    let mut next: Vec<&str> = Vec::new();
                    let mut j = i + 1;
                    while j < e.len() && e[j].kind != EntryKind::Assistant && e[j].kind != EntryKind::User {
                        if let Some(id) = result_id(&e[j]) {
                            next.push(id);
                        }
                        j += 1;
                    }
                    let tail = e[i + 1..].iter().all(|x| x.kind == EntryKind::ToolResult);
                    for id in &ids {
                        assert!(next.contains(id) || tail, "seed {seed}: {id} unpaired");
                    }
                    for id in &next {
                        assert!(ids.contains(id), "seed {seed}: result {id} without its call");
                    }
                }
                i += 1;
            }
            let uuids: HashSet<Uuid> = e.iter().map(|x| x.uuid).collect();
            for (k, x) in e.iter().enumerate() {
                match x.parent_uuid {
                    None => assert!(
                        k == 0 || before.iter().find(|b| b.uuid == x.uuid).is_some_and(|b| b.parent_uuid.is_none()),
                        "seed {seed}"
                    ),
                    Some(pu) => assert!(uuids.contains(&pu), "seed {seed}: broken chain at {k}"),
                }
            }
        }
    }
}
