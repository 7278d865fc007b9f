//! The jobs list's insights strip: figures over the chosen jobs (jobs,
//! error rate, estimated cost, cache rate, tokens, tokens per second of run
//! time, model latency and time to first token, cost by role and by model),
//! each beside the previous period's when a time window is chosen.

use std::collections::BTreeMap;

use flower_model::JobState;
use maud::{Markup, html};

use super::{human_ms, money, pct};
use crate::profile::Profile;
use crate::routes::jobs::JobLine;

/// Figures of the insights strip over some jobs.
pub struct Insight {
    pub jobs: usize,
    pub error_rate: Option<f64>,
    pub cost: f64,
    pub cache_rate: Option<f64>,
    pub tokens: u64,
    pub tokens_per_s: Option<f64>,
    /// Cost by role and model, latency and TTFT (from the jobs' events).
    pub profile: Profile,
}

impl Insight {
    /// The figures of `lines` read from their rows alone (the profile
    /// comes after, from their events: [`Insight::with_profile`]).
    pub fn of(lines: &[JobLine], now: i64) -> Self {
        let ended = lines.iter().filter(|l| l.job.state.is_terminal()).count();
        let failed = lines.iter().filter(|l| l.job.state == JobState::Failed).count();
        let mut usage = flower_model::Usage::default();
        let mut run_ms = 0i64;
        for l in lines {
            usage.add(&l.job.usage);
            let end = if l.job.state.is_terminal() { l.job.updated_at } else { now };
            run_ms += (end - l.job.created_at).max(0);
        }
        let tokens = usage.context_tokens() + usage.output_tokens;
        Self {
            jobs: lines.len(),
            error_rate: (ended > 0).then(|| failed as f64 / ended as f64),
            // (An empty f64 sum is -0.0, shown as "$-0.0000".)
            cost: lines.iter().filter_map(|l| l.cost).sum::<f64>() + 0.0,
            cache_rate: usage.cache_rate(),
            tokens,
            tokens_per_s: (run_ms > 0).then(|| tokens as f64 * 1000.0 / run_ms as f64),
            profile: Profile::default(),
        }
    }

    /// With the jobs' profile: the cost is then each turn's, priced at its
    /// own model (a job may use two).
    pub fn with_profile(mut self, profile: Profile) -> Self {
        self.cost = profile.cost_by_model.values().sum::<f64>() + 0.0;
        self.profile = profile;
        self
    }
}

/// The insights strip over the chosen jobs, each figure beside the previous
/// period's (the same filters, the window before) when a window is chosen.
pub fn strip(now_: &Insight, before: Option<&Insight>) -> Markup {
    let per_s = |r: Option<f64>| r.map_or("–".into(), |x| format!("{x:.0}"));
    let ms = |m: Option<u64>| m.map_or("–".into(), |x| human_ms(x as i64));
    let dollars = |x: f64| format!("${x:.4}");
    let (p, b) = (&now_.profile, before.map(|b| &b.profile));
    html! {
        section class="insights" aria-label="insights" {
            (figure("jobs", now_.jobs.to_string(), before.map(|b| b.jobs.to_string())))
            (figure("error rate", pct(now_.error_rate), before.map(|b| pct(b.error_rate))))
            (figure("cost (est.)", dollars(now_.cost), before.map(|b| dollars(b.cost))))
            (figure("cache rate", pct(now_.cache_rate), before.map(|b| pct(b.cache_rate))))
            (figure("tokens", now_.tokens.to_string(), before.map(|b| b.tokens.to_string())))
            (figure("tokens/s of run time", per_s(now_.tokens_per_s), before.map(|b| per_s(b.tokens_per_s))))
            (figure("model latency (p50)", ms(p.latency.median()), b.map(|b| ms(b.latency.median()))))
            (figure("time to first token (p50)", ms(p.ttft.median()), b.map(|b| ms(b.ttft.median()))))
            (breakdown("cost by role", &p.cost_by_role, b.map(|b| &b.cost_by_role)))
            (breakdown("cost by model", &p.cost_by_model, b.map(|b| &b.cost_by_model)))
        }
    }
}

/// One figure, with the previous period's beneath it when there is one.
fn figure(label: &str, value: String, prev: Option<String>) -> Markup {
    html! {
        div class="figure" {
            div class="value" { (value) }
            div class="label" { (label) }
            @if let Some(p) = prev {
                div class="sub" { "previous period: " (p) }
            }
        }
    }
}

/// A cost breakdown (largest first), each line beside the previous period's.
fn breakdown(label: &str, now_: &BTreeMap<String, f64>, before: Option<&BTreeMap<String, f64>>) -> Markup {
    let mut lines: Vec<(&String, &f64)> = now_.iter().collect();
    lines.sort_by(|a, b| b.1.total_cmp(a.1));
    html! {
        div class="figure breakdown" {
            div class="label" { (label) }
            ul aria-label=(label) {
                @for (k, v) in &lines {
                    li {
                        span class="key" { (k) } " " span class="num" { "$" (format_args!("{v:.4}")) }
                        @if let Some(b) = before {
                            " " span class="sub" { "(previous: " (money(b.get(*k).copied())) ")" }
                        }
                    }
                }
                @if lines.is_empty() {
                    li class="sub" { "no priced calls" }
                }
            }
        }
    }
}
