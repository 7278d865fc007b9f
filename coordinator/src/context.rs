//! The context report of a job: what entered the coordinator's main thread
//! versus its subagents — turns, body characters, tool calls, the main
//! thread's context per turn and its slope, spills, denials, mandate lengths,
//! script writes and runs, the largest spill-matched result that entered a
//! context, and the tokens the harness itself adds per main-thread turn.
//!
//! Context sizes are the provider's reported figures (input + cache read +
//! cache write). The harness's share is that figure minus an *estimate*
//! (4 characters a token) of everything the model, the goal, mandates and
//! reports wrote — it is labelled as an estimate.

use std::collections::BTreeMap;

use flower_agent::guards::spill_matches;
use flower_model::content::result_text;
use flower_model::{ContentBlock, Entry, EntryKind, EventKind, JobId, Role};
use flower_store::{Store, StoreError};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Side {
    pub sessions: usize,
    pub turns: usize,
    pub body_chars: usize,
    pub tool_calls: usize,
    /// Reported usage summed over the side's model calls.
    pub usage: flower_model::Usage,
    /// Cache reads / (uncached input + cache reads + cache writes).
    pub cache_rate: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MainTurn {
    pub turn: usize,
    /// The scenario step the turn played, when the model is the simulator.
    pub step: Option<usize>,
    pub context_tokens: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ContextReport {
    pub job: String,
    pub main: Side,
    pub subagents: Side,
    /// The workflow's sessions beside the main thread (clarify, goal,
    /// judge rounds, asides): neither the main thread nor subagents.
    #[serde(default)]
    pub workflow: Side,
    pub main_turns: Vec<MainTurn>,
    /// Least-squares slope of the main thread's context, tokens per turn.
    pub main_slope_tokens_per_turn: f64,
    pub main_first_tokens: u64,
    pub main_last_tokens: u64,
    /// Estimate: reported context minus what model, goal, mandates and reports wrote, per turn.
    pub harness_tokens_per_turn_estimate: f64,
    pub spills: usize,
    pub spilled_chars: usize,
    pub denials: usize,
    pub glances: usize,
    pub mandate_chars: Vec<usize>,
    pub script_writes: usize,
    pub script_runs: usize,
    /// The largest result of a spill-matched tool that entered any context
    /// (reads of spilled files excepted: they pass the guard by design).
    pub largest_spill_matched_result: usize,
    /// Every session's tool surface, history and cache figures (the context explorer).
    pub sessions: Vec<SessionView>,
    /// Deferred tools loaded, over the job (direct calls + searches).
    pub tools_loaded: usize,
    /// `search_tools` calls that matched nothing.
    pub search_misses: usize,
    /// Requests that deliberately rewrote the cached prefix, with what they wrote.
    pub cache_rewrites: Vec<Rewrite>,
    /// The job's usage priced by the spec's table (else the built-in one), per model.
    pub cost_usd: Option<f64>,
    /// The job's cache rate (every session).
    pub cache_rate: Option<f64>,
    /// Model calls' wall time (retries included) and time to the response's
    /// start, medians over every turn that recorded them (ms).
    #[serde(default)]
    pub latency_ms_p50: Option<u64>,
    #[serde(default)]
    pub ttft_ms_p50: Option<u64>,
    /// Usage and cache reads by provider and API, each cached by its own rule.
    #[serde(default)]
    pub providers: Vec<ProviderView>,
}

/// A provider's share of the job: its sessions' usage and what its cache gave.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProviderView {
    /// The provider table's entry (`anthropic`, `openai`, `sim`).
    pub provider: String,
    /// `messages` or `chat_completions`.
    pub api: String,
    /// How that API caches prompts.
    pub cache_rule: String,
    pub sessions: usize,
    pub usage: flower_model::Usage,
    pub cache_rate: Option<f64>,
}

/// One session as the context explorer shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SessionView {
    pub session: String,
    pub role: String,
    pub label: String,
    pub turns: usize,
    /// The context its last request occupied (provider-reported).
    pub history_tokens: u64,
    pub usage: flower_model::Usage,
    pub cache_rate: Option<f64>,
    /// Tool deferral on for this session.
    pub deferral: bool,
    pub resident: Vec<flower_model::event::ToolCost>,
    pub deferred: Vec<flower_model::event::ToolCost>,
    /// Estimates (4 characters a token): resident schemas, the deferred index, the whole system prompt.
    pub tool_tokens: u64,
    pub index_tokens: u64,
    pub system_tokens: u64,
    /// (tool, trigger) in load order.
    pub loaded: Vec<(String, String)>,
    pub search_misses: Vec<String>,
    pub spills: usize,
    /// The model of its last turn.
    #[serde(default)]
    pub model: String,
    /// Its usage priced per model (the spec's table, else the built-in one).
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// The provider its calls went to, and the API spoken.
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub api: String,
}

impl SessionView {
    /// What the tools cost this session's requests: resident schemas plus the index.
    pub fn tool_block_tokens(&self) -> u64 {
        self.tool_tokens + self.index_tokens
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Rewrite {
    pub session: String,
    pub turn: u32,
    pub reason: String,
    pub cache_write_tokens: u64,
}

impl ContextReport {
    /// The recorded deliberate rewrites as (session, turn) pairs: what the
    /// simulator's cache audit is joined with (`flower_sim::audit::join`).
    pub fn rewrites(&self) -> Vec<(String, u32)> {
        self.cache_rewrites.iter().map(|w| (w.session.clone(), w.turn)).collect()
    }
}

fn step_of(entry: &Entry) -> Option<usize> {
    entry.tool_uses().filter_map(|(id, _, _)| id.strip_prefix("toolu_s")?.split('_').next()?.parse().ok()).max()
}

fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + (x - mx) * (y - my), b + (x - mx).powi(2)));
    if den == 0.0 { 0.0 } else { num / den }
}

/// Where a job's cache audit is kept beside it once made.
pub fn audit_key(job: JobId) -> object_store::path::Path {
    object_store::path::Path::from(format!("jobs/{job}/audit/cache.json"))
}

/// Who can audit a run's prompt cache after it ended (a simulator that kept
/// a record of what each request read): the console asks through this, so
/// it never knows what a simulator is.
#[async_trait::async_trait]
pub trait CacheAudits: Send + Sync + 'static {
    /// The audit of `sessions` (ids) against the rewrites the job recorded
    /// (session id, turn), or `None` when no source kept one.
    async fn audit(&self, sessions: &[String], rewrites: &[(String, u32)]) -> Option<flower_model::audit::CacheAudit>;
}

/// Build the report from the stored transcripts and events.
pub async fn report(store: &dyn Store, job: JobId) -> Result<ContextReport, StoreError> {
    let mut r = ContextReport { job: job.to_string(), ..Default::default() };
    let sessions = store.sessions(job).await?;
    let spec = store.get_job(job).await.ok().and_then(|j| flower_model::JobSpec::from_value(j.spec).ok());
    let mut cost: Option<f64> = None;
    let mut all = flower_model::Usage::default();
    // Which worker each task ran: a worker session's route is its worker's.
    let workers: std::collections::HashMap<flower_model::TaskId, String> =
        store.tasks(job).await?.into_iter().map(|t| (t.id, t.worker)).collect();
    for s in &sessions {
        let entries = store.entries(s.id, 0, u32::MAX).await?;
        let mut view = session_view(s, &entries, spec.as_ref(), &mut cost);
        if let Some(spec) = &spec {
            let worker = s.task_id.and_then(|t| workers.get(&t)).and_then(|w| spec.workers.get(w));
            let route = worker.map_or_else(|| spec.coordinator_route(), |w| spec.worker_route(w));
            view.provider = route.entry.name().to_string();
            view.api = route.api.name().to_string();
            by_provider(&mut r.providers, &view, route.api.cache_rule());
        }
        all.add(&view.usage);
        r.sessions.push(view);
        count_entries(&mut r, Who::of(s.role), &entries);
    }
    for p in &mut r.providers {
        p.cache_rate = p.usage.cache_rate();
    }
    r.cost_usd = cost;
    r.cache_rate = all.cache_rate();
    r.main.cache_rate = r.main.usage.cache_rate();
    r.subagents.cache_rate = r.subagents.usage.cache_rate();
    r.workflow.cache_rate = r.workflow.usage.cache_rate();
    let points: Vec<(f64, f64)> = r.main_turns.iter().map(|t| (t.turn as f64, t.context_tokens as f64)).collect();
    r.main_slope_tokens_per_turn = slope(&points);
    r.main_first_tokens = r.main_turns.first().map_or(0, |t| t.context_tokens);
    r.main_last_tokens = r.main_turns.last().map_or(0, |t| t.context_tokens);
    count_events(&mut r, store, job, &sessions).await?;
    Ok(r)
}

/// Add a session's usage to its provider's line.
fn by_provider(lines: &mut Vec<ProviderView>, view: &SessionView, rule: &str) {
    let at = match lines.iter().position(|p| p.provider == view.provider && p.api == view.api) {
        Some(i) => i,
        None => {
            lines.push(ProviderView {
                provider: view.provider.clone(),
                api: view.api.clone(),
                cache_rule: rule.to_string(),
                ..Default::default()
            });
            lines.len() - 1
        }
    };
    lines[at].sessions += 1;
    lines[at].usage.add(&view.usage);
}

/// One session's turns, usage and cache rate; its cost is added to `cost`
/// (priced by the spec's table, else the built-in one).
fn session_view(
    s: &flower_model::Session,
    entries: &[Entry],
    spec: Option<&flower_model::JobSpec>,
    cost: &mut Option<f64>,
) -> SessionView {
    let mut view = SessionView {
        session: s.id.to_string(),
        role: s.role.as_str().into(),
        label: s.label.clone(),
        ..Default::default()
    };
    for e in entries.iter().filter(|e| e.kind == EntryKind::Assistant) {
        let Some(u) = &e.usage else { continue };
        view.turns += 1;
        view.usage.add(u);
        view.history_tokens = u.context_tokens();
        let model = e.model.clone().unwrap_or_default();
        let price = match spec {
            Some(sp) => sp.runtime.budget.price(&model),
            None => flower_model::spec::builtin_price(&model),
        };
        if let Some(p) = price {
            *cost.get_or_insert(0.0) += p.cost(u);
            *view.cost_usd.get_or_insert(0.0) += p.cost(u);
        }
        view.model = model;
    }
    view.cache_rate = view.usage.cache_rate();
    view
}

/// Whose a session's entries are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    Main,
    Subagent,
    Workflow,
}

impl Who {
    fn of(role: Role) -> Self {
        match role {
            Role::Coordinator => Self::Main,
            Role::Worker => Self::Subagent,
            _ => Self::Workflow,
        }
    }

    fn side(self, r: &mut ContextReport) -> &mut Side {
        match self {
            Self::Main => &mut r.main,
            Self::Subagent => &mut r.subagents,
            Self::Workflow => &mut r.workflow,
        }
    }
}

/// What one session's entries add to its side (main thread, subagents, workflow).
fn count_entries(r: &mut ContextReport, who: Who, entries: &[Entry]) {
    let main = who == Who::Main;
    who.side(r).sessions += 1;
    let mut tool_names: BTreeMap<String, String> = BTreeMap::new();
    // Characters the model, the goal, mandates and reports wrote, so far.
    let mut authored = 0usize;
    let mut harness_sum = 0.0;
    for e in entries {
        who.side(r).body_chars += e.body_chars();
        match e.kind {
            EntryKind::Assistant => {
                let side = who.side(r);
                side.turns += 1;
                if let Some(u) = &e.usage {
                    side.usage.add(u);
                }
                let turn = side.turns;
                for (id, name, input) in e.tool_uses() {
                    count_call(r, who, &mut tool_names, id, name, input);
                }
                if main {
                    let tokens = e.usage.map_or(0, |u| u.context_tokens());
                    r.main_turns.push(MainTurn { turn, step: step_of(e), context_tokens: tokens });
                    harness_sum += (tokens as f64 - authored as f64 / 4.0).max(0.0);
                }
                authored += e.body_chars();
            }
            EntryKind::User => authored += e.body_chars(),
            EntryKind::ToolResult => authored += count_result(r, main, &tool_names, e),
            EntryKind::Notice => {}
        }
    }
    if main && !r.main_turns.is_empty() {
        r.harness_tokens_per_turn_estimate = harness_sum / r.main_turns.len() as f64;
    }
}

/// One tool call: counted on its side, remembered by id for its result, and
/// the mandates, glances and workbench scripts it shows.
fn count_call(
    r: &mut ContextReport,
    who: Who,
    tool_names: &mut BTreeMap<String, String>,
    id: &str,
    name: &str,
    input: &serde_json::Value,
) {
    who.side(r).tool_calls += 1;
    let main = who == Who::Main;
    // A deliberate read of a spilled file is exempt: it passes the guard by design.
    let exempt = input.to_string().contains("spill/");
    tool_names.insert(id.to_string(), if exempt { String::new() } else { name.to_string() });
    if main && name == "Agent" {
        r.mandate_chars.push(input["prompt"].as_str().map_or(0, |p| p.chars().count()));
    }
    if main && name == "Bash" {
        r.glances += 1;
    }
    if name == "Write"
        && let Some(p) = input["file_path"].as_str()
        && p.contains(".flower/scripts/")
    {
        r.script_writes += 1;
    }
    if name == "Bash"
        && let Some(c) = input["command"].as_str()
        && c.contains(".flower/scripts/")
        && !c.trim_start().starts_with("ls")
    {
        r.script_runs += 1;
    }
}

/// One tool-result entry: denials, the largest result a spill would have
/// caught; returns the characters it brought into the context.
fn count_result(r: &mut ContextReport, main: bool, tool_names: &BTreeMap<String, String>, e: &Entry) -> usize {
    if e.markers.denial_kind.is_some() {
        r.denials += usize::from(main);
    }
    let mut authored = 0;
    for b in &e.content {
        if let ContentBlock::ToolResult { tool_use_id, content, .. } = b {
            let tool = tool_names.get(tool_use_id).cloned().unwrap_or_default();
            let chars = result_text(content).chars().count();
            if spill_matches(&tool) {
                r.largest_spill_matched_result = r.largest_spill_matched_result.max(chars);
            }
            if e.markers.denial_kind.is_none() {
                authored += chars;
            }
        }
    }
    authored
}

/// Spills, tool surfaces, loads, search misses and rewrites, from the job's events.
async fn count_events(
    r: &mut ContextReport,
    store: &dyn Store,
    job: JobId,
    sessions: &[flower_model::Session],
) -> Result<(), StoreError> {
    // Each session's place in `r.sessions`, for the events that name one.
    let index: std::collections::HashMap<flower_model::SessionId, usize> =
        sessions.iter().enumerate().map(|(i, s)| (s.id, i)).collect();
    let (mut latency, mut ttft) = (Vec::new(), Vec::new());
    flower_store::scan_events(store, job, 0, |e| {
        if let EventKind::TurnCompleted { latency_ms, ttft_ms, .. } = &e.kind {
            latency.extend(*latency_ms);
            ttft.extend(*ttft_ms);
        }
        count_event(r, &index, &e.kind);
    })
    .await?;
    r.latency_ms_p50 = median(&mut latency);
    r.ttft_ms_p50 = median(&mut ttft);
    Ok(())
}

fn median(v: &mut [u64]) -> Option<u64> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

fn count_event(
    r: &mut ContextReport,
    index: &std::collections::HashMap<flower_model::SessionId, usize>,
    kind: &EventKind,
) {
    match kind {
        EventKind::Spill { chars, session, .. } => {
            r.spills += 1;
            r.spilled_chars += chars;
            if let Some(i) = index.get(session).copied() {
                r.sessions[i].spills += 1;
            }
        }
        EventKind::ToolSurface {
            session,
            deferral,
            resident,
            deferred,
            tool_tokens,
            index_tokens,
            system_tokens,
            ..
        } => {
            if let Some(i) = index.get(session).copied() {
                let v = &mut r.sessions[i];
                v.deferral = *deferral;
                v.resident = resident.clone();
                v.deferred = deferred.clone();
                (v.tool_tokens, v.index_tokens, v.system_tokens) = (*tool_tokens, *index_tokens, *system_tokens);
            }
        }
        EventKind::ToolsLoaded { session, trigger, tools, .. } => {
            r.tools_loaded += tools.len();
            if let Some(i) = index.get(session).copied() {
                r.sessions[i].loaded.extend(tools.iter().map(|t| (t.clone(), trigger.clone())));
            }
        }
        EventKind::ToolSearchMiss { session, query, .. } => {
            r.search_misses += 1;
            if let Some(i) = index.get(session).copied() {
                r.sessions[i].search_misses.push(query.clone());
            }
        }
        EventKind::CacheRewrite { session, turn, reason, cache_write_tokens, .. } => {
            r.cache_rewrites.push(Rewrite {
                session: session.to_string(),
                turn: *turn,
                reason: reason.clone(),
                cache_write_tokens: *cache_write_tokens,
            });
        }
        _ => {}
    }
}

/// An SVG of the main thread's context per scenario step (or turn), with a
/// second curve for a baseline.
pub fn svg(report: &ContextReport, baseline: Option<&ContextReport>) -> String {
    let series = |r: &ContextReport| -> Vec<(f64, f64)> {
        r.main_turns.iter().map(|t| (t.step.map_or(t.turn as f64, |s| s as f64), t.context_tokens as f64)).collect()
    };
    let a = series(report);
    let b = baseline.map(series).unwrap_or_default();
    let max_x = a.iter().chain(b.iter()).map(|p| p.0).fold(1.0, f64::max);
    let max_y = a.iter().chain(b.iter()).map(|p| p.1).fold(1.0, f64::max);
    let (w, h, pad) = (800.0, 400.0, 50.0);
    let poly = |pts: &[(f64, f64)], color: &str| {
        let coords: Vec<String> = pts
            .iter()
            .map(|(x, y)| {
                format!("{:.1},{:.1}", pad + x / max_x * (w - 2.0 * pad), h - pad - y / max_y * (h - 2.0 * pad))
            })
            .collect();
        format!("<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>", coords.join(" "))
    };
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{pad}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/><line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{y0}\" stroke=\"black\"/>\n\
         <text x=\"{pad}\" y=\"20\">main-thread context (tokens, max {max_y:.0}) per scenario step (max {max_x:.0})</text>\n",
        y0 = h - pad,
        x1 = w - pad,
    );
    out.push_str(&poly(&a, "#1f77b4"));
    out.push_str(&format!("\n<text x=\"{}\" y=\"40\" fill=\"#1f77b4\">this run</text>\n", w - 200.0));
    if !b.is_empty() {
        out.push_str(&poly(&b, "#d62728"));
        out.push_str(&format!("\n<text x=\"{}\" y=\"56\" fill=\"#d62728\">baseline</text>\n", w - 200.0));
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_is_least_squares() {
        assert_eq!(slope(&[(1.0, 10.0), (2.0, 12.0), (3.0, 14.0)]), 2.0);
        assert_eq!(slope(&[(1.0, 5.0)]), 0.0);
    }
}
