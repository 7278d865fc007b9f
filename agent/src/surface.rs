//! The two-tier tool surface (docs/design.md section 6): a resident set with
//! full schemas, every other admitted tool as a name in an index grouped
//! under headings, and `search_tools` — BM25 over name (weighted highest),
//! description and parameter names — which loads what it finds.
//!
//! Deferral acts on a session's [`ToolSet`], which holds only what the role
//! admits: it can hide a schema, never reveal a tool the role may not use.
//! A loaded schema is appended after the cached tool block (see
//! [`ToolSet::defs_with`]); a search loads all its matches at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use flower_model::event::ToolCost;
use flower_model::usage::estimate_tokens;
use flower_model::{EventKind, Role};

use crate::provider::{SystemBlock, ToolDef};
use crate::tool::{Tool, ToolContext, ToolError, ToolOutput, ToolSet, args, schema_of};

/// The discovery tool's name.
pub const SEARCH_TOOLS: &str = "search_tools";
/// Matches returned when a search names no limit.
pub const DEFAULT_LIMIT: u64 = 5;
/// The most a search returns.
pub const MAX_LIMIT: u64 = 25;

/// The words a miss answers with: never let "no result" read as "capability missing".
pub const MISS_HINT: &str =
    "nothing matched — try other words (what the tool acts on, or the action: create, list, search…) or a larger limit";

/// Finish a role's surface: with deferral, add `search_tools` (last
/// resident tool); without, make every deferred tool resident, in order — the
/// requests are then those of a build without deferral.
pub fn finish(mut tools: ToolSet, deferral: bool) -> ToolSet {
    if !deferral {
        let mut flat = ToolSet::new();
        for t in tools.all() {
            flat.add(t.clone());
        }
        return flat;
    }
    let search = SearchTools::new(&tools);
    tools.add(Arc::new(search));
    tools
}

/// The deferred tools' index, a system block's text (none when nothing is deferred).
pub fn index_text(tools: &ToolSet) -> Option<String> {
    if tools.deferred().is_empty() {
        return None;
    }
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut headings: Vec<&str> = Vec::new();
    for name in tools.deferred() {
        let c = tools.category(name).unwrap_or("Other tools");
        if !groups.contains_key(c) {
            headings.push(c);
        }
        groups.entry(c).or_default().push(name);
    }
    let mut out = format!(
        "# More tools\nThese {} tools are available but their schemas are not loaded yet. Call one directly by its exact name (its schema loads and the call runs in the same step), or use {SEARCH_TOOLS} to find tools by what they do.\n",
        tools.deferred().len()
    );
    for h in headings {
        out.push_str(&format!("\n## {h}\n{}\n", groups[h].join(", ")));
    }
    Some(out)
}

fn def_tokens(d: &ToolDef) -> u64 {
    estimate_tokens(serde_json::to_string(d).map(|s| s.len()).unwrap_or(0))
}

/// The session's composition, as an event (token figures are estimates).
pub fn composition(session: flower_model::SessionId, role: Role, tools: &ToolSet, system: &[SystemBlock]) -> EventKind {
    let cost = |n: &String| {
        let d = tools.def(n)?;
        Some(ToolCost {
            name: n.clone(),
            category: tools.category(n).unwrap_or_default().to_string(),
            tokens: def_tokens(&d),
        })
    };
    let resident: Vec<ToolCost> = tools.names().iter().filter_map(cost).collect();
    let deferred: Vec<ToolCost> = tools.deferred().iter().filter_map(cost).collect();
    EventKind::ToolSurface {
        session,
        role: role.as_str().into(),
        deferral: tools.get(SEARCH_TOOLS).is_some(),
        tool_tokens: resident.iter().map(|t| t.tokens).sum(),
        index_tokens: index_text(tools).map(|t| estimate_tokens(t.len())).unwrap_or(0),
        system_tokens: system.iter().map(|b| estimate_tokens(b.text.len())).sum(),
        resident,
        deferred,
    }
}

/// Split text into search terms: lower case, alphanumeric runs, no stop
/// words, a plural `s` dropped.
pub fn terms(text: &str) -> Vec<String> {
    const STOP: &[&str] = &[
        "a", "an", "the", "to", "of", "for", "and", "or", "in", "on", "with", "by", "is", "it", "this", "that", "be",
        "as", "at", "from", "mcp", "i", "me", "my", "all",
    ];
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_ascii_lowercase())
        .filter(|w| !STOP.contains(&w.as_str()))
        .map(|w| if w.len() > 3 && w.ends_with('s') && !w.ends_with("ss") { w[..w.len() - 1].to_string() } else { w })
        .collect()
}

struct Doc {
    name: String,
    /// Weighted term frequencies.
    tf: HashMap<String, f64>,
    len: f64,
    summary: String,
}

/// BM25F over the surface: name ×3, parameter names ×1.5, description ×1.
pub struct SearchIndex {
    docs: Vec<Doc>,
    df: HashMap<String, usize>,
    avg_len: f64,
}

impl SearchIndex {
    pub fn build(tools: &ToolSet) -> Self {
        Self::from_tools(tools.all().map(|t| (t.name().to_string(), t.description(), t.input_schema())))
    }

    /// The index over any catalog of `(name, description, input schema)`
    /// (`flower mcp-serve` ranks its own tools with it).
    pub fn from_tools(tools: impl IntoIterator<Item = (String, String, serde_json::Value)>) -> Self {
        let mut docs = Vec::new();
        let mut df: HashMap<String, usize> = HashMap::new();
        for (name, description, schema) in tools {
            let params: Vec<String> =
                schema["properties"].as_object().map(|p| p.keys().cloned().collect()).unwrap_or_default();
            let mut tf: HashMap<String, f64> = HashMap::new();
            for (text, w) in [(name.clone(), 3.0), (params.join(" "), 1.5), (description.clone(), 1.0)] {
                for term in terms(&text) {
                    *tf.entry(term).or_default() += w;
                }
            }
            for term in tf.keys() {
                *df.entry(term.clone()).or_default() += 1;
            }
            let first = description.split_inclusive(". ").next().unwrap_or_default().trim().to_string();
            let summary =
                format!("{first} Parameters: {}.", if params.is_empty() { "none".into() } else { params.join(", ") });
            docs.push(Doc { name, len: tf.values().sum(), tf, summary });
        }
        let avg_len = if docs.is_empty() { 1.0 } else { docs.iter().map(|d| d.len).sum::<f64>() / docs.len() as f64 };
        Self { docs, df, avg_len }
    }

    /// The best `limit` matches with a positive score, best first (ties by name).
    pub fn search(&self, query: &str, limit: usize) -> Vec<(&str, f64)> {
        let (k1, b) = (1.2, 0.75);
        let n = self.docs.len() as f64;
        let mut query_terms = terms(query);
        query_terms.dedup();
        let mut scored: Vec<(&str, f64)> = self
            .docs
            .iter()
            .map(|d| {
                let score = query_terms
                    .iter()
                    .filter_map(|q| {
                        let tf = *d.tf.get(q)?;
                        let df = *self.df.get(q)? as f64;
                        let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                        Some(idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * d.len / self.avg_len)))
                    })
                    .sum::<f64>();
                (d.name.as_str(), score)
            })
            .filter(|(_, s)| *s > 0.0)
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
        scored.truncate(limit);
        scored
    }

    fn summary(&self, name: &str) -> &str {
        self.docs.iter().find(|d| d.name == name).map(|d| d.summary.as_str()).unwrap_or_default()
    }
}

/// The arguments of `search_tools`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct SearchArgs {
    /// What you want to do, in a few words (e.g. "create a ticket").
    query: String,
    /// Most matches to return (default 5).
    #[schemars(range(min = 1, max = MAX_LIMIT))]
    limit: Option<u64>,
}

/// `search_tools(query, limit)`: finds tools of the session's surface and
/// loads the deferred ones it found (all at once: one rewrite).
pub struct SearchTools {
    index: SearchIndex,
    deferred: std::collections::HashSet<String>,
}

impl SearchTools {
    pub fn new(tools: &ToolSet) -> Self {
        Self { index: SearchIndex::build(tools), deferred: tools.deferred().iter().cloned().collect() }
    }
}

#[async_trait]
impl Tool for SearchTools {
    fn name(&self) -> &str {
        SEARCH_TOOLS
    }

    fn description(&self) -> String {
        "Search every tool available to you — including those listed by name only, whose schemas are not loaded — by what they do. Matches are loaded: you can call them on your next turn. Use it before concluding that a capability is missing.".into()
    }

    fn input_schema(&self) -> serde_json::Value {
        schema_of::<SearchArgs>()
    }

    fn concurrency_safe(&self) -> bool {
        true
    }

    async fn call(&self, input: serde_json::Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let SearchArgs { query, limit } = args(input)?;
        let limit = limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
        let found = self.index.search(&query, limit as usize);
        if found.is_empty() {
            let mut out = ToolOutput::text(format!("No tool matched \"{query}\": {MISS_HINT}."));
            out.events.push(EventKind::ToolSearchMiss { session: ctx.session_id, query, limit: limit as u32 });
            return Ok(out);
        }
        let loaded: Vec<String> =
            found.iter().map(|(n, _)| n.to_string()).filter(|n| self.deferred.contains(n)).collect();
        let mut text = format!("{} tool(s) match \"{query}\" (schemas loaded — call them directly):\n", found.len());
        for (name, _) in &found {
            text.push_str(&format!("- {name}: {}\n", self.index.summary(name)));
        }
        let mut out = ToolOutput::text(text);
        if !loaded.is_empty() {
            out.events.push(EventKind::ToolsLoaded {
                session: ctx.session_id,
                trigger: "search_tools".into(),
                tools: loaded.clone(),
                query: Some(query),
            });
        }
        out.markers.loaded_tools = loaded;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str, &'static str, serde_json::Value);

    #[async_trait]
    impl Tool for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn description(&self) -> String {
            self.1.into()
        }
        fn input_schema(&self) -> serde_json::Value {
            self.2.clone()
        }
        async fn call(&self, _: serde_json::Value, _: &ToolContext) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::text("ok"))
        }
    }

    fn set() -> ToolSet {
        let mut s = ToolSet::new();
        let props = |p: &[&str]| serde_json::json!({"type": "object", "properties": p.iter().map(|k| (k.to_string(), serde_json::json!({"type": "string"}))).collect::<serde_json::Map<_, _>>()});
        s.add(Arc::new(Named("Read", "Read a file of the working directory.", props(&["path"]))));
        s.add_deferred(
            Arc::new(Named(
                "mcp__f__ticket_create",
                "Open a new ticket in the tracker. Returns its id.",
                props(&["title", "priority"]),
            )),
            "Tickets",
        );
        s.add_deferred(
            Arc::new(Named(
                "mcp__f__calendar_create_event",
                "Create a calendar event. Invites attendees.",
                props(&["title", "start"]),
            )),
            "Calendar",
        );
        s.add_deferred(
            Arc::new(Named(
                "mcp__f__memory_recall",
                "Recall a remembered value; tickets are not stored here.",
                props(&["key"]),
            )),
            "Memory",
        );
        s
    }

    #[test]
    fn the_derived_schema_is_unchanged() {
        assert_eq!(
            SearchTools::new(&ToolSet::new()).input_schema(),
            serde_json::json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What you want to do, in a few words (e.g. \"create a ticket\")."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "description": "Most matches to return (default 5)."}
                },
                "required": ["query"]
            })
        );
    }

    #[test]
    fn the_name_weighs_most_and_plurals_match() {
        let index = SearchIndex::build(&set());
        let hits = index.search("create tickets", 5);
        assert_eq!(hits[0].0, "mcp__f__ticket_create", "{hits:?}");
        assert!(hits.iter().any(|h| h.0 == "mcp__f__calendar_create_event"));
        assert!(index.search("zebra", 5).is_empty());
        assert_eq!(index.search("event", 1).len(), 1);
    }

    #[test]
    fn off_makes_everything_resident_in_order_and_on_adds_the_search_tool_last() {
        let off = finish(set(), false);
        assert_eq!(
            off.names(),
            ["Read", "mcp__f__ticket_create", "mcp__f__calendar_create_event", "mcp__f__memory_recall"]
        );
        assert!(off.deferred().is_empty() && off.get(SEARCH_TOOLS).is_none() && index_text(&off).is_none());
        let on = finish(set(), true);
        assert_eq!(on.names(), ["Read", SEARCH_TOOLS]);
        let index = index_text(&on).unwrap();
        assert!(index.contains("## Tickets\nmcp__f__ticket_create") && index.contains("## Memory\n"), "{index}");
        let defs = on.defs_with(&["mcp__f__memory_recall".to_string(), "Read".to_string()]);
        let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["Read", SEARCH_TOOLS, "mcp__f__memory_recall"],
            "loads are appended, residents not repeated"
        );
    }

    #[tokio::test]
    async fn a_search_loads_its_deferred_matches_and_a_miss_says_so() {
        let on = finish(set(), true);
        let ctx = ToolContext {
            job_id: flower_model::JobId::random(),
            session_id: flower_model::SessionId::random(),
            role: Role::Worker,
            tool_use_id: "t".into(),
            cancel: Default::default(),
        };
        let search = on.get(SEARCH_TOOLS).unwrap();
        let out = search.call(serde_json::json!({"query": "read a file or open a ticket"}), &ctx).await.unwrap();
        assert_eq!(out.markers.loaded_tools[0], "mcp__f__ticket_create", "the name weighs most");
        assert!(!out.markers.loaded_tools.iter().any(|t| t == "Read"), "Read is resident: found, not loaded");
        assert!(flower_model::content::result_text(&out.content).contains("- Read: "));
        assert!(matches!(&out.events[0], EventKind::ToolsLoaded { trigger, .. } if trigger == "search_tools"));
        let miss = search.call(serde_json::json!({"query": "quantum zebra"}), &ctx).await.unwrap();
        assert!(!miss.is_error && miss.markers.loaded_tools.is_empty());
        assert!(flower_model::content::result_text(&miss.content).contains("try other words"));
        assert!(
            matches!(&miss.events[0], EventKind::ToolSearchMiss { query, limit: 5, .. } if query == "quantum zebra")
        );
    }
}

/// In-session pruning of *uneventful* old tool output (docs/design.md
/// section 6): empty output, "no matches", short timeouts, expired glance
/// results — replaced in the request view (never in the store) only once at
/// least [`PRUNE_MIN_TOKENS`] can be reclaimed, so a rewrite is rare and deep.
pub mod uneventful {
    use flower_model::content::result_text;
    use flower_model::usage::estimate_tokens;
    use flower_model::{ContentBlock, Entry, EntryKind, ResultBlock};

    /// Least reclaimable tokens (estimate) that justify a rewrite.
    pub const PRUNE_MIN_TOKENS: u64 = 2000;
    /// The latest model turns whose results are never pruned.
    pub const KEEP_RECENT_TURNS: usize = 6;

    /// The characters of an uneventful stored result (judged from its
    /// markers and text); `None` for anything else.
    pub fn uneventful_chars(e: &Entry) -> Option<usize> {
        if e.kind != EntryKind::ToolResult || e.markers.denial_kind.is_some() || e.markers.interrupted {
            return None;
        }
        let text: String = e
            .content
            .iter()
            .filter_map(|b| {
                if let ContentBlock::ToolResult { content, .. } = b { Some(result_text(content)) } else { None }
            })
            .collect();
        // A glance is old by the time it is judged: expired.
        if e.markers.ephemeral == Some(true) {
            return Some(text.len());
        }
        let t = text.trim().to_ascii_lowercase();
        let uneventful = t.is_empty()
            || t.starts_with("no match")
            || t.starts_with("no files found")
            || t.starts_with("0 matches")
            || (t.contains("timed out") && t.len() < 1000);
        uneventful.then_some(text.len())
    }

    fn placeholder(chars: usize) -> String {
        format!("[uneventful output pruned ({chars} chars)]")
    }

    /// One session's pruning state: each result is judged once, when it ages
    /// past the recent turns; the uneventful ones wait until together they
    /// are worth a rewrite, then are replaced at once.
    #[derive(Default)]
    pub struct Pruner {
        /// Entries before this index were judged.
        judged: usize,
        /// Uneventful results not replaced yet: (index, chars).
        pending: Vec<(usize, usize)>,
        reclaim: u64,
    }

    impl Pruner {
        /// Prune the view `history` (only ever appended to) if enough can be
        /// reclaimed. Returns the tokens reclaimed (0: no rewrite).
        pub fn prune(&mut self, history: &mut [Entry]) -> u64 {
            let horizon = history
                .iter()
                .enumerate()
                .rev()
                .filter(|(_, e)| e.kind == EntryKind::Assistant)
                .nth(KEEP_RECENT_TURNS - 1)
                .map(|(i, _)| i);
            let Some(horizon) = horizon else { return 0 };
            for (i, e) in history.iter().enumerate().take(horizon).skip(self.judged) {
                if let Some(c) = uneventful_chars(e) {
                    let saved = estimate_tokens(c).saturating_sub(estimate_tokens(placeholder(c).len()));
                    if saved > 0 {
                        self.pending.push((i, c));
                        self.reclaim += saved;
                    }
                }
            }
            self.judged = self.judged.max(horizon);
            if self.reclaim < PRUNE_MIN_TOKENS {
                return 0;
            }
            for (i, c) in self.pending.drain(..) {
                for b in &mut history[i].content {
                    if let ContentBlock::ToolResult { content, .. } = b {
                        *content = vec![ResultBlock::Text { text: placeholder(c) }];
                    }
                }
            }
            std::mem::take(&mut self.reclaim)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use flower_model::{JobId, SessionId};

        fn entry(kind: EntryKind, text: &str, ephemeral: bool) -> Entry {
            let (job, session) = (JobId::random(), SessionId::random());
            let content = match kind {
                EntryKind::ToolResult => vec![ContentBlock::tool_result("t", text, false)],
                _ => vec![ContentBlock::text(text)],
            };
            let mut e = Entry::new(job, session, None, kind, content);
            e.markers.ephemeral = ephemeral.then_some(true);
            e
        }

        #[test]
        fn waits_for_enough_then_prunes_old_uneventful_results_once() {
            let mut h = Vec::new();
            for _ in 0..3 {
                h.push(entry(EntryKind::Assistant, "glance", false));
                h.push(entry(EntryKind::ToolResult, &"x".repeat(4000), true));
                h.push(entry(EntryKind::Assistant, "grep", false));
                h.push(entry(EntryKind::ToolResult, "No matches found", false));
                h.push(entry(EntryKind::Assistant, "read", false));
                h.push(entry(EntryKind::ToolResult, &"an eventful result ".repeat(300), false));
            }
            // 9 entries, 5 turns: none is old enough yet.
            assert_eq!(Pruner::default().prune(&mut h.clone()[..9].to_vec()), 0);
            let mut pruner = Pruner::default();
            for _ in 0..6 {
                h.push(entry(EntryKind::Assistant, "more", false));
            }
            let reclaimed = pruner.prune(&mut h);
            assert!(reclaimed >= PRUNE_MIN_TOKENS, "{reclaimed}");
            let text = |e: &Entry| -> String {
                e.content
                    .iter()
                    .filter_map(|b| {
                        if let ContentBlock::ToolResult { content, .. } = b { Some(result_text(content)) } else { None }
                    })
                    .collect()
            };
            let texts: Vec<String> = h.iter().filter(|e| e.kind == EntryKind::ToolResult).map(text).collect();
            assert!(texts[0].starts_with("[uneventful output pruned (4000 chars)"), "{}", texts[0]);
            assert!(texts[2].starts_with("an eventful"), "eventful output stays");
            assert_eq!(pruner.prune(&mut h), 0, "nothing new to reclaim: no second rewrite");
        }
    }
}
