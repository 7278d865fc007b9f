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

/// Build the report from the stored transcripts and events.
pub async fn report(store: &dyn Store, job: JobId) -> Result<ContextReport, StoreError> {
    let mut r = ContextReport { job: job.to_string(), ..Default::default() };
    let sessions = store.sessions(job).await?;
    for s in &sessions {
        let entries = store.entries(s.id, 0, u32::MAX).await?;
        let main = s.role == Role::Coordinator;
        let side = if main { &mut r.main } else { &mut r.subagents };
        side.sessions += 1;
        let mut tool_names: BTreeMap<String, String> = BTreeMap::new();
        // Characters the model, the goal, mandates and reports wrote, so far.
        let mut authored = 0usize;
        let mut harness_sum = 0.0;
        for e in &entries {
            side.body_chars += e.body_chars();
            match e.kind {
                EntryKind::Assistant => {
                    side.turns += 1;
                    if let Some(u) = &e.usage {
                        side.usage.add(u);
                    }
                    for (id, name, input) in e.tool_uses() {
                        side.tool_calls += 1;
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
                    if main {
                        let tokens = e.usage.map_or(0, |u| u.context_tokens());
                        let turn = side.turns;
                        r.main_turns.push(MainTurn { turn, step: step_of(e), context_tokens: tokens });
                        harness_sum += (tokens as f64 - authored as f64 / 4.0).max(0.0);
                    }
                    authored += e.body_chars();
                }
                EntryKind::User => authored += e.body_chars(),
                EntryKind::ToolResult => {
                    if e.markers.denial_kind.is_some() {
                        r.denials += usize::from(main);
                    }
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
                }
                EntryKind::Notice => {}
            }
        }
        if main && !r.main_turns.is_empty() {
            r.harness_tokens_per_turn_estimate = harness_sum / r.main_turns.len() as f64;
        }
    }
    r.main.cache_rate = r.main.usage.cache_rate();
    r.subagents.cache_rate = r.subagents.usage.cache_rate();
    let points: Vec<(f64, f64)> = r.main_turns.iter().map(|t| (t.turn as f64, t.context_tokens as f64)).collect();
    r.main_slope_tokens_per_turn = slope(&points);
    r.main_first_tokens = r.main_turns.first().map_or(0, |t| t.context_tokens);
    r.main_last_tokens = r.main_turns.last().map_or(0, |t| t.context_tokens);
    let mut after = 0;
    loop {
        let events = store.events(job, after, 1000).await?;
        let Some(last) = events.last() else { break };
        after = last.seq;
        for e in &events {
            if let EventKind::Spill { chars, .. } = &e.kind {
                r.spills += 1;
                r.spilled_chars += chars;
            }
        }
    }
    Ok(r)
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
