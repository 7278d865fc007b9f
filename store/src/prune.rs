//! The pruning loader (docs/design.md section 7): what a resumed session is
//! fed. It owns the rules below and nothing else: it takes the loaded rows by
//! value (the caller's copy, changed in place — it never writes a stored
//! row), and it does no I/O — the bodies a trim moves out are returned for
//! the caller to write. Rules, in this order, one function each:
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
//!
//! Cost: a resume may load a long session, so nothing is copied that a rule
//! does not change, and the transcript is walked few times: ids are
//! numbered once and the rules ask by number and position (a call is found
//! where it is, not cloned); the entries that leave are dropped in place;
//! relinking needs only the parents of the entries that left, kept as they
//! go. `flower bench pruning` measures it.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use flower_model::content::result_text;
use flower_model::spec::{EphemeralOptions, PruningOptions, TrimOptions};
use flower_model::{ContentBlock, Entry, EntryKind, JobId, ResultBlock, SessionId};
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

/// The blocks of an entry's first `tool_result` (none if it has none).
fn first_result(e: &Entry) -> &[ResultBlock] {
    e.content
        .iter()
        .find_map(|b| match b {
            ContentBlock::ToolResult { content, .. } => Some(content.as_slice()),
            _ => None,
        })
        .unwrap_or_default()
}

/// `result_text(blocks).len()`, without building the text: a bound on its
/// characters (at least a quarter of it, at most all of it).
fn result_bytes(blocks: &[ResultBlock]) -> usize {
    let (mut bytes, mut started) = (0, false);
    for b in blocks {
        if let ResultBlock::Text { text } = b {
            bytes += usize::from(started) + text.len();
            started |= !text.is_empty();
        }
    }
    bytes
}

/// Whether `result_text(blocks)` has at most `max` characters, counted only
/// when its length in bytes does not decide it.
fn result_fits(blocks: &[ResultBlock], max: usize) -> bool {
    let bytes = result_bytes(blocks);
    bytes <= max || (bytes / 4 <= max && result_chars(blocks) <= max)
}

/// `result_text(blocks).chars().count()`, without building the text.
fn result_chars(blocks: &[ResultBlock]) -> usize {
    let (mut chars, mut started) = (0, false);
    for b in blocks {
        if let ResultBlock::Text { text } = b {
            // `result_text` puts a newline before a block once it has text.
            chars += usize::from(started) + text.chars().count();
            started |= !text.is_empty();
        }
    }
    chars
}

/// `result_text(blocks)`, borrowed when it is a single text block.
fn result_text_ref(blocks: &[ResultBlock]) -> Cow<'_, str> {
    match blocks {
        [ResultBlock::Text { text }] => Cow::Borrowed(text),
        _ => Cow::Owned(result_text(blocks)),
    }
}

/// Give every `tool_result` block of `e` the content `text`; returns the
/// first one's previous content.
fn set_result_text(e: &mut Entry, mut text: String) -> Vec<ResultBlock> {
    let mut left = e.content.iter().filter(|b| matches!(b, ContentBlock::ToolResult { .. })).count();
    let mut previous = None;
    for b in e.content.iter_mut() {
        if let ContentBlock::ToolResult { content, .. } = b {
            left -= 1;
            let t = if left == 0 { std::mem::take(&mut text) } else { text.clone() };
            let old = std::mem::replace(content, vec![ResultBlock::Text { text: t }]);
            previous.get_or_insert(old);
        }
    }
    previous.unwrap_or_default()
}

/// The ids of the transcript's calls and results, numbered in one pass —
/// the only place an id is hashed, and seldom: a result's call is mostly in
/// the message just before it — and where they are. The rules then ask by
/// number and position, without going back to the strings.
struct Ids {
    /// By entry: the number of its first `tool_result`'s id.
    result: Vec<Option<usize>>,
    /// Every `tool_use` block, in order: (entry, block, id number).
    uses: Vec<(usize, usize, usize)>,
    /// By entry: where its `tool_use` blocks start in `uses` (then the end).
    first_use: Vec<usize>,
    /// By id number: the last `tool_use` block with that id (entry, block).
    /// Positions, valid until a rule edits an assistant message (`expire`
    /// and `trim` edit results only; `residue` comes after them).
    call: Vec<Option<(usize, usize)>>,
}

impl Ids {
    fn new<'a>(entries: &'a [Entry]) -> Self {
        // Sized for a call in every other entry, the usual shape, so it seldom grows.
        let mut numbers: HashMap<&'a str, usize> = HashMap::with_capacity(entries.len() / 2);
        let mut number = |id: &'a str| {
            let next = numbers.len();
            *numbers.entry(id).or_insert(next)
        };
        let mut result = Vec::with_capacity(entries.len());
        let mut uses = Vec::new();
        let mut first_use = Vec::with_capacity(entries.len() + 1);
        // The calls of the last message that made some, with their numbers.
        let mut recent: Vec<(&'a str, usize)> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            first_use.push(uses.len());
            let (mut first, mut calls_here) = (None, false);
            for (b, block) in e.content.iter().enumerate() {
                match block {
                    ContentBlock::ToolUse { id, .. } => {
                        if !calls_here {
                            recent.clear();
                            calls_here = true;
                        }
                        let n = number(id.as_str());
                        recent.push((id.as_str(), n));
                        uses.push((i, b, n));
                    }
                    ContentBlock::ToolResult { tool_use_id, .. } if first.is_none() => {
                        let id = tool_use_id.as_str();
                        first = Some(recent.iter().find(|(r, _)| *r == id).map_or_else(|| number(id), |&(_, n)| n));
                    }
                    _ => {}
                }
            }
            result.push(first);
        }
        first_use.push(uses.len());
        let mut call = vec![None; numbers.len()];
        for &(i, b, n) in &uses {
            call[n] = Some((i, b));
        }
        Self { result, uses, first_use, call }
    }

    /// How many distinct ids.
    fn count(&self) -> usize {
        self.call.len()
    }

    /// The `tool_use` blocks of the entry at `i` as stored: (entry, block, id number).
    fn uses_of(&self, i: usize) -> &[(usize, usize, usize)] {
        &self.uses[self.first_use[i]..self.first_use[i + 1]]
    }

    /// The tool and input of the call the result at `i` answers.
    fn call_of<'e>(&self, entries: &'e [Entry], i: usize) -> Option<(&'e str, &'e serde_json::Value)> {
        let (at, block) = self.call[self.result[i]?]?;
        match entries.get(at)?.content.get(block)? {
            ContentBlock::ToolUse { name, input, .. } => Some((name.as_str(), input)),
            _ => None,
        }
    }
}

/// Whether the result at `i` answers a glance: its recorded verdict, else (a
/// `Bash` result recorded without one) `judge` on the call's command.
fn ephemeral(entries: &[Entry], i: usize, ids: &Ids, judge: &dyn Fn(&str) -> bool) -> bool {
    if let Some(recorded) = entries[i].markers.ephemeral {
        return recorded;
    }
    let Some((name, input)) = ids.call_of(entries, i) else { return false };
    name == "Bash" && input["command"].as_str().is_some_and(judge)
}

/// Prune a session's stored entries (in order) for a resume. `judge` says
/// whether a command is a glance (`flower_agent::glance::allows`); it is
/// asked only about `Bash` calls whose result records no verdict.
///
/// `stored` is consumed: the entries that stay are the same values, changed
/// where a rule says so; a caller that still needs the rows as loaded clones
/// them first. Their uuids are unique (both stores enforce it).
pub fn prune(stored: Vec<Entry>, opts: &PruningOptions, judge: &dyn Fn(&str) -> bool) -> Pruned {
    let mut entries = stored;
    let mut changes = Vec::new();
    let ids = Ids::new(&entries);
    if opts.ephemeral.enabled {
        expire(&mut entries, &ids, &opts.ephemeral, judge, &mut changes);
    }
    let trims = if opts.trim.enabled { trim(&mut entries, &opts.trim, &mut changes) } else { Vec::new() };
    let dropped = denials(&entries, &ids, opts.keep_denials, &mut changes);
    let removed = residue(&mut entries, &ids, &dropped, &mut changes);
    let left = pair(&mut entries, &ids, &dropped, &removed, &mut changes);
    drop(ids);
    relink(&mut entries, &left);
    Pruned { entries, changes, trims }
}

/// 1. Expire: glance results of at most `max_chars`, older than the
///    `keep_recent` most recent, become a notice to run the command again.
fn expire(
    entries: &mut [Entry],
    ids: &Ids,
    opts: &EphemeralOptions,
    judge: &dyn Fn(&str) -> bool,
    changes: &mut Vec<Change>,
) {
    // Assistant turns after each position (how many turns ago a result is), in one pass.
    let mut assistants_after = vec![0usize; entries.len() + 1];
    for i in (0..entries.len()).rev() {
        assistants_after[i] = assistants_after[i + 1] + usize::from(entries[i].kind == EntryKind::Assistant);
    }
    let candidates: Vec<usize> = (0..entries.len())
        .filter(|&i| {
            let e = &entries[i];
            e.kind == EntryKind::ToolResult
                && e.markers.denial_kind.is_none()
                && ephemeral(entries, i, ids, judge)
                && e.content.iter().any(
                    |b| matches!(b, ContentBlock::ToolResult { content, .. } if result_fits(content, opts.max_chars)),
                )
        })
        .collect();
    let expire = candidates.len().saturating_sub(opts.keep_recent);
    for &i in &candidates[..expire] {
        let command = ids.call_of(entries, i).and_then(|(_, input)| input["command"].as_str()).unwrap_or("the command");
        let ago = assistants_after[i];
        let text = format!(
            "[`{command}` result expired ({ago} turns ago); the state may have changed — run it again if needed]"
        );
        let detail = format!("`{command}` expired ({ago} turns ago)");
        let uuid = entries[i].uuid;
        set_result_text(&mut entries[i], text);
        changes.push(Change { rule: "ephemeral", entry: uuid, detail });
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
        // Counted in place; the text is only looked at when it is long enough.
        let blocks = first_result(&entries[i]);
        if result_bytes(blocks) < opts.min_chars {
            continue;
        }
        let chars = result_chars(blocks);
        if chars < opts.min_chars {
            continue;
        }
        let text = result_text_ref(blocks);
        if text.contains("characters spilled to .flower/") {
            continue;
        }
        let hash = hex::encode(Sha256::digest(text.as_bytes()));
        let path = format!("spill/{}.txt", &hash[..16]);
        let head = text.char_indices().nth(400).map_or(&*text, |(at, _)| &text[..at]);
        let pointer = format!(
            "[{chars} characters trimmed to .flower/{path} on resume — Read it for the full text. The first 400 follow.]\n{head}"
        );
        let uuid = entries[i].uuid;
        // The body moves out of the entry (it is the result's own text, not a copy).
        let previous = set_result_text(&mut entries[i], pointer);
        changes.push(Change { rule: "trim", entry: uuid, detail: format!("{chars} chars → .flower/{path}") });
        if trimmed.insert(path.clone()) {
            let text = match <[ResultBlock; 1]>::try_from(previous) {
                Ok([ResultBlock::Text { text }]) => text,
                Ok(other) => result_text(&other),
                Err(blocks) => result_text(&blocks),
            };
            trims.push(TrimWrite { path, text });
        }
    }
    trims
}

/// 3. Denials: denied calls beyond the `keep` most recent, by their
///    structural marker. Returns their ids (by number, see [`Ids`]): each
///    call leaves with its result (see `residue`).
fn denials(entries: &[Entry], ids: &Ids, keep: usize, changes: &mut Vec<Change>) -> Vec<bool> {
    let mut dropped = vec![false; ids.count()];
    let denied: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == EntryKind::ToolResult && e.markers.denial_kind.is_some())
        .map(|(i, _)| i)
        .collect();
    let drop_denied = denied.len().saturating_sub(keep);
    for &i in &denied[..drop_denied] {
        if let Some(n) = ids.result[i] {
            dropped[n] = true;
            let kind = entries[i].markers.denial_kind.as_deref().unwrap_or_default();
            let tool = ids.call_of(entries, i).map(|(name, _)| name).unwrap_or_default();
            changes.push(Change {
                rule: "denial",
                entry: entries[i].uuid,
                detail: format!("{tool} call denied by {kind} removed with its result"),
            });
        }
    }
    dropped
}

/// 4. Residue, in one pass with the removal of the dropped (denied) calls:
///    synthetic API-error entries are not re-sent, interrupted results get
///    the neutral text, a dropped call leaves its message (the message too
///    when nothing else is left of it) and its result leaves with it. Returns
///    which entries are removed, by position.
fn residue(entries: &mut [Entry], ids: &Ids, dropped: &[bool], changes: &mut Vec<Change>) -> Vec<bool> {
    let mut removed = vec![false; entries.len()];
    let any_dropped = dropped.contains(&true);
    for (i, e) in entries.iter_mut().enumerate() {
        if e.markers.synthetic_error {
            removed[i] = true;
            changes.push(Change {
                rule: "synthetic",
                entry: e.uuid,
                detail: "synthetic API-error entry not re-injected".into(),
            });
            continue;
        }
        if e.kind == EntryKind::ToolResult {
            if ids.result[i].is_some_and(|n| dropped[n]) {
                removed[i] = true;
                continue;
            }
            if e.markers.interrupted {
                neutralise(e, changes);
            }
        }
        if e.kind == EntryKind::Assistant && any_dropped && ids.uses_of(i).iter().any(|&(_, _, n)| dropped[n]) {
            // The dropped calls' blocks, by position (the message is as stored until here).
            let mut gone = ids.uses_of(i).iter().filter(|&&(_, _, n)| dropped[n]).map(|&(_, b, _)| b).peekable();
            let mut block = 0;
            e.content.retain(|_| {
                let leaves = gone.next_if_eq(&block).is_some();
                block += 1;
                !leaves
            });
            if e.content.is_empty() {
                removed[i] = true;
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
        .any(|b| matches!(b, ContentBlock::ToolResult { content, .. } if result_text_ref(content) == NEVER_PRODUCED));
    if !already {
        set_result_text(e, NEVER_PRODUCED.to_string());
        changes.push(Change { rule: "interrupted", entry: e.uuid, detail: "interrupted result neutralised".into() });
    }
}

/// The last entry kept so far, as a healing result after it needs it.
#[derive(Clone, Copy)]
struct Tail {
    job: JobId,
    session: SessionId,
    uuid: Uuid,
    seq: i64,
}

impl Tail {
    fn of(e: &Entry) -> Self {
        Self { job: e.job_id, session: e.session_id, uuid: e.uuid, seq: e.seq }
    }
}

/// Pairing: the surviving entries, without results whose call is gone, and
/// with a healing result after each call left without one — except in the
/// last turn: the resuming session makes idempotent calls again (an `Agent`
/// call finds its task) and gives the others a stored neutral result.
///
/// Decided first, by id number and position, then done in place: the
/// entries that leave are dropped, the healing results go into the gaps.
/// Returns the parents the entries that left had (for `relink`).
fn pair(
    entries: &mut Vec<Entry>,
    ids: &Ids,
    dropped: &[bool],
    removed: &[bool],
    changes: &mut Vec<Change>,
) -> HashMap<Uuid, Option<Uuid>> {
    let mut keep = vec![false; entries.len()];
    let mut left: HashMap<Uuid, Option<Uuid>> = HashMap::new();
    // Healing results, each with how many stored entries are kept before it.
    let mut heals: Vec<(usize, Entry)> = Vec::new();
    {
        // The calls still made (`residue` took the dropped ones out of
        // assistant messages) and the calls answered, among the survivors.
        let (mut live_calls, mut answered) = (vec![false; ids.count()], vec![false; ids.count()]);
        for (i, e) in entries.iter().enumerate() {
            if removed[i] {
                continue;
            }
            let assistant = e.kind == EntryKind::Assistant;
            for &(_, _, n) in ids.uses_of(i) {
                live_calls[n] |= !(assistant && dropped[n]);
            }
            if let Some(n) = ids.result[i] {
                answered[n] = true;
            }
        }
        let mut pending: Vec<(&str, &str)> = Vec::new();
        let mut tail: Option<Tail> = None;
        let mut kept = 0;
        for (i, e) in entries.iter().enumerate() {
            if removed[i] {
                left.insert(e.uuid, e.parent_uuid);
                continue;
            }
            if e.kind == EntryKind::ToolResult && ids.result[i].is_some_and(|n| !live_calls[n]) {
                changes.push(Change {
                    rule: "orphan",
                    entry: e.uuid,
                    detail: "result without its call dropped".into(),
                });
                left.insert(e.uuid, e.parent_uuid);
                continue;
            }
            // Heal the previous assistant turn's unanswered calls before anything else follows it.
            if e.kind != EntryKind::ToolResult && !pending.is_empty() {
                heal(&mut heals, kept, &mut tail, &mut pending, changes);
            }
            if e.kind == EntryKind::Assistant {
                pending.clear();
                // The message's calls as `residue` left it, in order: the ones not dropped.
                let made = ids.uses_of(i).iter().map(|&(_, _, n)| n).filter(|&n| !dropped[n]);
                if made.clone().any(|n| !answered[n]) {
                    pending.extend(
                        e.tool_uses().zip(made).filter(|&(_, n)| !answered[n]).map(|((id, name, _), _)| (id, name)),
                    );
                }
            }
            keep[i] = true;
            kept += 1;
            tail = Some(Tail::of(e));
        }
    }
    let mut keep = keep.into_iter();
    entries.retain(|_| keep.next().unwrap_or(false));
    fill_gaps(entries, heals);
    left
}

/// Insert `heals` (each with the number of entries it goes after) into the
/// kept entries in one pass from the back: the vector grows by as many
/// placeholders, each kept entry moves up once into the gap, each healing
/// result takes its slot.
fn fill_gaps(entries: &mut Vec<Entry>, heals: Vec<(usize, Entry)>) {
    let Some((_, first)) = heals.first() else { return };
    let placeholder = Entry::new(first.job_id, first.session_id, None, EntryKind::Notice, Vec::new());
    let kept = entries.len();
    entries.resize(kept + heals.len(), placeholder);
    // The placeholders are the gap, `read..write`; it closes as the healing results go in.
    let (mut read, mut write) = (kept, kept + heals.len());
    for (after, heal) in heals.into_iter().rev() {
        while read > after {
            read -= 1;
            write -= 1;
            entries.swap(read, write);
        }
        write -= 1;
        entries[write] = heal;
    }
}

/// Relink: each kept entry's parent is its nearest surviving ancestor in
/// the stored chain; `left` holds the parents of the stored entries that
/// left (a parent that is neither kept nor among them is not in the chain).
/// Uuids are unique (both stores enforce it), so an id among `left` is not
/// kept; the previous kept entry, the usual parent, is asked for first, and
/// the set of kept ids is only made for a parent that is neither.
fn relink(kept: &mut [Entry], left: &HashMap<Uuid, Option<Uuid>>) {
    let mut surviving: Option<HashSet<Uuid>> = None;
    let mut previous: Option<Uuid> = None;
    for k in 0..kept.len() {
        let mut p = kept[k].parent_uuid;
        while let Some(id) = p {
            if previous == Some(id) {
                break;
            }
            if let Some(up) = left.get(&id) {
                p = *up;
                continue;
            }
            if !surviving.get_or_insert_with(|| kept.iter().map(|e| e.uuid).collect()).contains(&id) {
                p = None;
            }
            break;
        }
        let e = &mut kept[k];
        if p != e.parent_uuid {
            e.parent_uuid = p;
        }
        previous = Some(e.uuid);
    }
}

/// Healing results for `pending` calls after the last kept entry (`tail`:
/// each one becomes the next one's parent), to go after the first `kept`
/// stored entries.
fn heal(
    heals: &mut Vec<(usize, Entry)>,
    kept: usize,
    tail: &mut Option<Tail>,
    pending: &mut Vec<(&str, &str)>,
    changes: &mut Vec<Change>,
) {
    for (id, name) in pending.drain(..) {
        let Some(last) = *tail else { return };
        let mut e = Entry::new(
            last.job,
            last.session,
            Some(last.uuid),
            EntryKind::ToolResult,
            vec![ContentBlock::tool_result(id, NEVER_PRODUCED, true)],
        );
        e.tool_name = Some(name.to_string());
        e.markers.interrupted = true;
        e.seq = last.seq;
        changes.push(Change {
            rule: "heal",
            entry: last.uuid,
            detail: format!("{name} call {id} had no result; a neutral one was added"),
        });
        *tail = Some(Tail::of(&e));
        heals.push((kept, e));
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

    fn result_id(e: &Entry) -> Option<&str> {
        e.content.iter().find_map(|b| match b {
            ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
            _ => None,
        })
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
        let p = prune(b.entries.clone(), &PruningOptions::default(), &never);
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
            prune(b2.entries.clone(), &PruningOptions::default(), &never).changes.is_empty(),
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
        let p = prune(b.entries.clone(), &PruningOptions::default(), &judge);
        let t = texts(&p);
        for i in 0..3 {
            assert!(t[2 + 2 * i].starts_with("[`git status` result expired"), "{}", t[2 + 2 * i]);
        }
        assert!(t[8..].iter().all(|x| !x.contains("expired")), "the latest six stay: {t:?}");
        assert_eq!(p.changes.iter().filter(|c| c.rule == "ephemeral").count(), 3);
        assert!(prune(b.entries.clone(), &PruningOptions::default(), &never).changes.is_empty(), "the judge decided");

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
        assert!(prune(b.entries.clone(), &PruningOptions::default(), &judge).changes.is_empty());
        let mut b = Builder::new();
        for i in 0..8 {
            b.calls(&[(&format!("r{i}"), "Bash", json!({"command": "rm -rf x"}))]);
            b.result(&format!("r{i}"), "").markers.ephemeral = Some(true);
        }
        assert_eq!(prune(b.entries.clone(), &PruningOptions::default(), &judge).changes.len(), 2);
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
        let p = prune(b.entries.clone(), &PruningOptions::default(), &never);
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
        let p = prune(b.entries.clone(), &PruningOptions::default(), &never);
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
        let p = prune(b.entries.clone(), &opts, &never);
        assert_eq!(p.changes.iter().filter(|c| c.rule == "trim").count(), 5);
        assert_eq!(p.trims.len(), 1, "the same body is written once");
        assert!(texts(&p)[1].starts_with("[3000 characters trimmed to .flower/spill/"));
        assert_eq!(prune(b.entries.clone(), &opts, &never).trims, p.trims, "the loader is idempotent");
    }

    /// The input is consumed, so the parents of the entries that leave are
    /// kept as they go: a run of removals is walked past to the survivor.
    #[test]
    fn relink_walks_past_a_run_of_removed_entries() {
        let mut b = Builder::new();
        b.user("goal");
        b.calls(&[("k1", "Bash", json!({"command": "make"}))]);
        b.result("k1", "ok");
        b.push(EntryKind::Assistant, vec![ContentBlock::text("API error")]).markers.synthetic_error = true;
        b.calls(&[("d1", "Write", json!({}))]);
        b.result("d1", "Denied by delegate_guard").markers.denial_kind = Some("delegate_guard".into());
        b.result("ghost", "orphan");
        b.calls(&[("d2", "Edit", json!({}))]);
        b.result("d2", "Denied by delegate_guard").markers.denial_kind = Some("delegate_guard".into());
        b.user("after");
        b.push(EntryKind::User, vec![ContentBlock::text("elsewhere")]).parent_uuid = Some(Uuid::new_v4());
        let stored = b.entries.clone();
        let p = prune(b.entries, &PruningOptions::default(), &never);
        assert_eq!(texts(&p), vec!["goal", "use:k1", "ok", "use:d2", "Denied by delegate_guard", "after", "elsewhere"]);
        assert_eq!(p.entries[6].parent_uuid, None, "a parent outside the chain has no survivor");
        let rules: Vec<&str> = p.changes.iter().map(|c| c.rule).collect();
        assert_eq!(rules, vec!["denial", "synthetic", "orphan"]);
        assert_eq!(p.entries[3].uuid, stored[7].uuid);
        assert_eq!(p.entries[3].parent_uuid, Some(stored[2].uuid), "four removed entries walked past");
        for k in 1..6 {
            if k != 3 {
                assert_eq!(p.entries[k].parent_uuid, Some(p.entries[k - 1].uuid), "entry {k}");
            }
        }
    }

    /// Healing results go right after the turn that left calls unanswered,
    /// each after the previous one, however many entries were kept before.
    #[test]
    fn healing_results_follow_their_turn_in_order() {
        let mut b = Builder::new();
        b.user("goal");
        b.calls(&[("a1", "Bash", json!({})), ("a2", "Read", json!({}))]);
        b.user("next");
        b.calls(&[("b1", "Bash", json!({}))]);
        b.result("b1", "ok");
        b.calls(&[("c1", "Grep", json!({}))]);
        b.push(EntryKind::Assistant, vec![ContentBlock::text("thinking")]);
        b.calls(&[("d1", "Agent", json!({}))]);
        let stored = b.entries.clone();
        let p = prune(b.entries, &PruningOptions::default(), &never);
        assert_eq!(
            texts(&p),
            vec![
                "goal",
                "use:a1",
                NEVER_PRODUCED,
                NEVER_PRODUCED,
                "next",
                "use:b1",
                "ok",
                "use:c1",
                NEVER_PRODUCED,
                "thinking",
                "use:d1"
            ]
        );
        let e = &p.entries;
        let ids: Vec<Option<&str>> = e.iter().map(result_id).collect();
        assert_eq!((ids[2], ids[3], ids[8]), (Some("a1"), Some("a2"), Some("c1")));
        let tools: Vec<Option<&str>> = [2, 3, 8].iter().map(|&k| e[k].tool_name.as_deref()).collect();
        assert_eq!(tools, vec![Some("Bash"), Some("Read"), Some("Grep")]);
        assert_eq!(e[2].parent_uuid, Some(stored[1].uuid));
        assert_eq!(e[3].parent_uuid, Some(e[2].uuid), "the second heal follows the first");
        assert_eq!(e[8].parent_uuid, Some(stored[5].uuid));
        assert_eq!((e[2].seq, e[3].seq, e[8].seq), (stored[1].seq, stored[1].seq, stored[5].seq));
        assert_eq!(e[4].parent_uuid, Some(stored[1].uuid), "stored parents are kept");
        assert!(e.iter().filter(|x| x.markers.interrupted).count() == 3);
        let healed: Vec<Uuid> = p.changes.iter().filter(|c| c.rule == "heal").map(|c| c.entry).collect();
        assert_eq!(healed, vec![stored[1].uuid, e[2].uuid, stored[5].uuid]);
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
            let p = prune(b.entries.clone(), &opts, &never);
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
