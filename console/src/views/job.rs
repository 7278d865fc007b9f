//! The job page's sections: the header (state, figures, the context chip),
//! the actions (cancel, message, answers), the workflow record, cost by
//! role and by model, every session's cache and tool surface, and the
//! workbench's files.

use std::collections::BTreeMap;

use flower_model::Role;
use maud::{Markup, display, html};

use super::{human_ms, money, path_in_url, pct, state_badge};
use crate::routes::job::JobView;
use crate::routes::jobs::job_line;

/// The job's header: state, figures, the context meter chip, the reason
/// and the final answer.
pub fn header(v: &JobView, now: i64) -> Markup {
    let j = &v.job;
    let end = if j.state.is_terminal() { j.updated_at } else { now };
    let cost = v.context.cost_usd.map_or_else(|| money(job_line(j.clone()).cost), |c| money(Some(c)));
    let ms = |m: Option<u64>| m.map_or("–".into(), |ms| format!("{ms} ms"));
    html! {
        section class="head" id="head" {
            h1 { (j.name) " " (state_badge(j.state)) }
            (meter_chip(v))
            dl class="facts" {
                div { dt { "Job" } dd { code { (display(j.id)) } } }
                div { dt { "Age" } dd { (human_ms(now - j.created_at)) } }
                div { dt { "Duration" } dd { (human_ms(end - j.created_at)) } }
                div { dt { "Main turns" } dd { (v.context.main.turns) } }
                div { dt { "Tasks" } dd { (v.tasks.len()) } }
                div { dt { "Cost (est.)" } dd { (cost) } }
                div { dt { "Cache rate" } dd { (pct(v.context.cache_rate)) } }
                div { dt { "Model latency p50" } dd { (ms(v.context.latency_ms_p50)) } }
                div { dt { "Time to first token p50" } dd { (ms(v.context.ttft_ms_p50)) } }
            }
            @if let Some(r) = &j.reason {
                p class="reason" { (r) }
            }
            @if let Some(w) = v.record.waiting_for_quota.first() {
                p class="quota" {
                    span class="state state-waiting_for_quota" { "waiting_for_quota" } " "
                    (v.record.waiting_for_quota.len()) " model call(s) wait for their turn on " code { (w.route) }
                    " (priority " (w.priority) "; next turn in ~" (human_ms((w.turn_at - now).max(0))) ")"
                }
            }
            @if let Some(a) = &j.final_answer {
                details open { summary { "Final answer" } pre { (a) } }
            }
        }
    }
}

/// Current context / window of the main thread, with the last turn's breakdown.
fn meter_chip(v: &JobView) -> Markup {
    let Some(limits) = &v.limits else { return html! {} };
    let Some(main) = v.context.sessions.iter().rfind(|s| s.role == Role::Coordinator.as_str()) else {
        return html! {};
    };
    let window = limits.window.max(1);
    let share = main.history_tokens as f64 / window as f64;
    let level = if share >= 0.9 {
        "red"
    } else if share >= 0.75 {
        "amber"
    } else {
        "green"
    };
    let u = &main.usage;
    let title = format!(
        "last turn: {} input, {} output, {} cache read, {} cache write (summed over the session)",
        u.input_tokens, u.output_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens
    );
    html! {
        span class={ "chip chip-" (level) } id="meter-chip" title=(title) {
            "context " (main.history_tokens) " / " (window) " (" (format_args!("{:.0}", share * 100.0)) "%)"
        }
    }
}

/// The forms of a job that has not ended: cancel, a message to the
/// coordinator, and an answer to each waiting question (its options as
/// buttons, or words). Each carries the CSRF value.
pub fn actions(v: &JobView, csrf: &str) -> Markup {
    if v.job.state.is_terminal() {
        return html! {};
    }
    let job = display(v.job.id);
    html! {
        section class="actions" aria-labelledby="act-h" {
            h2 id="act-h" { "Actions" }
            form method="post" action={ "/jobs/" (job) "/cancel" } class="inline" {
                input type="hidden" name="csrf" value=(csrf);
                label { "Reason " input name="reason" placeholder="optional"; }
                button type="submit" class="danger" id="cancel" { "Cancel job" }
            }
            form method="post" action={ "/jobs/" (job) "/interrupt" } class="inline" {
                input type="hidden" name="csrf" value=(csrf);
                label { "Message " input name="message" required; }
                button type="submit" { "Send to the coordinator" }
            }
            @for (id, question, options) in &v.pending {
                form method="post" action={ "/jobs/" (job) "/answer" } class="question" {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="question" value=(id);
                    p { strong { "Question:" } " " (question) }
                    @for (i, o) in options.iter().enumerate() {
                        button type="submit" name="option" value=(i + 1) { (i + 1) ". " (o) }
                    }
                    label { "Or in words " input name="text"; }
                    button type="submit" { "Answer" }
                }
            }
        }
    }
}

/// The workflow record's lines (lineage, steps, verdicts, questions).
pub fn workflow(v: &JobView) -> Markup {
    let lines = v.record.lines();
    if lines.is_empty() {
        return html! {};
    }
    html! {
        section aria-labelledby="wf-h" {
            h2 id="wf-h" { "Workflow" }
            ul { @for l in &lines { li { (l.trim()) } } }
        }
    }
}

/// Turns, tokens and cost of some sessions added up.
type Sums = BTreeMap<String, (usize, u64, Option<f64>)>;

/// Cost and tokens by role (workers by name) and by model, from the sessions.
pub fn costs(v: &JobView) -> Markup {
    let mut by_role = Sums::new();
    let mut by_model = Sums::new();
    for s in &v.context.sessions {
        let who = if s.role == Role::Worker.as_str() { format!("worker {}", s.label) } else { s.role.clone() };
        let tokens = s.usage.context_tokens() + s.usage.output_tokens;
        for (map, key) in [(&mut by_role, who), (&mut by_model, s.model.clone())] {
            if key.is_empty() && s.turns == 0 {
                continue;
            }
            let e = map.entry(key).or_insert((0, 0, None));
            e.0 += s.turns;
            e.1 += tokens;
            if let Some(c) = s.cost_usd {
                *e.2.get_or_insert(0.0) += c;
            }
        }
    }
    html! {
        section aria-labelledby="cost-h" {
            h2 id="cost-h" { "Cost" }
            div class="two" {
                (cost_table("By role", "Role", &by_role))
                (cost_table("By model", "Model", &by_model))
            }
        }
    }
}

fn cost_table(caption: &str, head: &str, rows: &Sums) -> Markup {
    html! {
        table class="costs" {
            caption { (caption) }
            thead { tr {
                th scope="col" { (head) } th scope="col" class="num" { "Turns" }
                th scope="col" class="num" { "Tokens" } th scope="col" class="num" { "Cost (est.)" }
            } }
            tbody {
                @for (k, (turns, tokens, cost)) in rows {
                    tr {
                        td { (k) } td class="num" { (turns) } td class="num" { (tokens) }
                        td class="num" { (money(*cost)) }
                    }
                }
            }
        }
    }
}

/// Every session's turns, context, cache rate and tool surface (resident
/// tools with their cost, deferred, loaded with their trigger, misses).
pub fn sessions(v: &JobView) -> Markup {
    let n = v.context.sessions.len();
    html! {
        section aria-labelledby="ss-h" { details open[n <= 12] {
            summary { h2 id="ss-h" { "Sessions (" (n) "): cache and tool surface" } }
            (providers(v))
            table {
                thead { tr {
                    th scope="col" { "Session" } th scope="col" { "Role" } th scope="col" { "Provider" }
                    th scope="col" { "Turns" } th scope="col" { "Context" } th scope="col" { "Cache rate" }
                    th scope="col" { "Resident tools (tokens)" } th scope="col" { "Deferred" }
                    th scope="col" { "Loaded (trigger)" } th scope="col" { "Search misses" }
                } }
                tbody {
                    @for s in &v.context.sessions {
                        tr {
                            td { a href={ "/jobs/" (display(v.job.id)) "/sessions/" (s.session) } { (s.label) } }
                            td { (s.role) }
                            td { (s.provider) " · " (s.api.replace('_', " ")) }
                            td class="num" { (s.turns) }
                            td class="num" { (s.history_tokens) }
                            td class="num" { (pct(s.cache_rate)) }
                            td { @for (i, t) in s.resident.iter().enumerate() {
                                @if i > 0 { ", " } (t.name) " (" (t.tokens) ")"
                            } }
                            td class="num" { (s.deferred.len()) }
                            td { @for (i, (t, why)) in s.loaded.iter().enumerate() {
                                @if i > 0 { ", " } (t) " (" (why) ")"
                            } }
                            td { (s.search_misses.join(", ")) }
                        }
                    }
                }
            }
        } }
    }
}

/// Each provider's cache reads under its own rule, when the job used more than one API.
fn providers(v: &JobView) -> Markup {
    if v.context.providers.len() < 2 {
        return html! {};
    }
    html! {
        ul class="providers" aria-label="providers" {
            @for p in &v.context.providers {
                li {
                    (p.provider) " · " (p.api.replace('_', " ")) ": " (p.sessions) " session(s), cache read "
                    (p.usage.cache_read_input_tokens) " of " (p.usage.context_tokens()) " input tokens ("
                    (pct(p.cache_rate)) ") — " (p.cache_rule)
                }
            }
        }
    }
}

/// The workbench's files, each to open or download.
pub fn files(v: &JobView) -> Markup {
    if v.files.is_empty() {
        return html! {};
    }
    let job = display(v.job.id);
    html! {
        section aria-labelledby="wb-h" {
            h2 id="wb-h" { "Workbench" }
            ul class="files" {
                @for (p, size) in &v.files {
                    @let at = path_in_url(p);
                    li {
                        a href={ "/jobs/" (job) "/files/" (at) } { (p) } " " span class="sub" { (size) " B" } " "
                        a href={ "/jobs/" (job) "/files/" (at) "?download=1" } aria-label={ "download " (p) } {
                            "download"
                        }
                    }
                }
            }
        }
    }
}
