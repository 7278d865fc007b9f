//! The job page's charts, as SVG: the timeline (each task's wait in the
//! queue, then each attempt as a span of its own) and the context meter
//! (the main thread's context per turn against the handoff threshold and
//! its warning line, with the subagents' mean). Coordinates are numbers the
//! console computes; every label is escaped like any other text.

use maud::{Markup, display, html};

use super::human_ms;
use crate::routes::job::{Attempt, JobView};
use flower_model::{Task, TaskState};

/// Tasks the timeline draws at once; links move the window.
pub const TIMELINE_TASKS: usize = 200;
/// Width of both charts' view box.
const WIDTH: f64 = 1000.0;
/// Height of one task's row on the timeline.
const ROW: f64 = 7.0;

/// The tasks on one time axis: the wait in the queue, then each attempt as
/// a span of its own (a failed or lost one in red).
pub fn waterfall(v: &JobView, now: i64) -> Markup {
    if v.tasks.is_empty() {
        return html! {};
    }
    let start = v.job.created_at;
    let end_of = |t: &Task| if t.state.is_terminal() { t.updated_at } else { now };
    let end = v.tasks.iter().map(end_of).max().unwrap_or(start).max(start + 1);
    let axis = Axis { start, span: (end - start) as f64 };
    let shown: Vec<&Task> = v.tasks.iter().skip(v.timeline_from).take(TIMELINE_TASKS).collect();
    let retried = v.attempts.values().filter(|a| a.len() > 1).count();
    html! {
        figure id="timeline" {
            svg class="waterfall" viewBox={ "0 0 " (WIDTH) " " (ROW * shown.len() as f64 + 4.0) } role="img"
                aria-label="task timeline: queue wait and attempts" {
                @for (i, t) in shown.iter().enumerate() {
                    (task_bars(v, &axis, t, i as f64 * ROW + 2.0, end_of(t), now))
                }
            }
            figcaption {
                (v.tasks.len()) " task(s) over " (human_ms(end - start))
                ": grey the wait in the queue, then each attempt"
                @if retried > 0 { "; " (retried) " retried" }
                (window_links(v, shown.len()))
            }
        }
    }
}

/// Where a moment falls on the timeline.
struct Axis {
    start: i64,
    span: f64,
}

impl Axis {
    fn x(&self, at: i64) -> f64 {
        (at - self.start) as f64 / self.span * WIDTH
    }
}

/// One task's row: its wait in the queue, then its attempts.
fn task_bars(v: &JobView, axis: &Axis, t: &Task, y: f64, ended: i64, now: i64) -> Markup {
    let tries = v.attempts.get(&t.id).map(Vec::as_slice).unwrap_or(&[]);
    let first = tries.first().map_or(ended, |a| a.started);
    html! {
        rect x=(format_args!("{:.1}", axis.x(t.created_at))) y=(format_args!("{y:.1}"))
            width=(format_args!("{:.1}", (axis.x(first) - axis.x(t.created_at)).max(1.0))) height="5"
            class="bar bar-queue" {
            title { (t.worker) " queued " (human_ms(first - t.created_at)) }
        }
        @for (n, a) in tries.iter().enumerate() {
            @let (until, class) = attempt_end(t, tries, n, ended, now);
            rect x=(format_args!("{:.1}", axis.x(a.started))) y=(format_args!("{y:.1}"))
                width=(format_args!("{:.1}", (axis.x(until) - axis.x(a.started)).max(2.0))) height="5"
                class={ "bar " (class) } {
                title { (t.worker) " attempt " (a.attempt) " (" (human_ms(until - a.started)) ")" }
            }
        }
    }
}

/// When attempt `n` of `t` ended, and its bar's class: as it finished; the
/// last one running, or ended with the task; an earlier one unfinished was
/// lost when the next began.
fn attempt_end(t: &Task, tries: &[Attempt], n: usize, ended: i64, now: i64) -> (i64, &'static str) {
    let last = n + 1 == tries.len();
    match tries[n].finished {
        Some((at, true)) => (at, "bar-succeeded"),
        Some((at, false)) => (at, "bar-failed"),
        None if last && !t.state.is_terminal() => (now, "bar-running"),
        None if last => (ended, if t.state == TaskState::Succeeded { "bar-succeeded" } else { "bar-failed" }),
        None => (tries[n + 1].started, "bar-failed"),
    }
}

/// Which tasks are drawn, with links to the earlier and later ones, when
/// not all are.
fn window_links(v: &JobView, drawn: usize) -> Markup {
    let from = v.timeline_from;
    if v.tasks.len() <= drawn {
        return html! {};
    }
    let link = |at: usize, text: &str| {
        html! { " " a href={ "/jobs/" (display(v.job.id)) "?tasks=" (at) "#timeline" } { (text) } }
    };
    html! {
        " — tasks " (from + 1) "–" (from + drawn) " drawn"
        @if from > 0 { (link(from.saturating_sub(TIMELINE_TASKS), "← earlier tasks")) }
        @if from + drawn < v.tasks.len() { (link(from + drawn, "later tasks →")) }
    }
}

/// The main thread's context per turn against the handoff threshold and
/// its warning line, as SVG, with the simulator's cache audit when one was kept.
pub fn context_meter(v: &JobView) -> Markup {
    let Some(limits) = &v.limits else { return html! {} };
    html! {
        section aria-labelledby="meter-h" {
            h2 id="meter-h" { "Context meter" }
            @if v.context.main_turns.is_empty() {
                p class="sub" { "No main-thread turn yet." }
            } @else {
                (meter_figure(v, limits))
                (audit(v))
            }
        }
    }
}

/// The meter's chart and caption.
fn meter_figure(v: &JobView, limits: &crate::routes::job::Limits) -> Markup {
    let c = &v.context;
    let turns = &c.main_turns;
    // The scale follows the thread (thresholds far above it are named, not drawn).
    let peak = turns.iter().map(|t| t.context_tokens).max().unwrap_or(0);
    let top = (peak as f64 * 1.25).max(1.0);
    let h = 200.0;
    let x = |i: usize| if turns.len() < 2 { WIDTH / 2.0 } else { i as f64 / (turns.len() - 1) as f64 * WIDTH };
    let y = |tokens: f64| h - tokens / top * h;
    let points: Vec<String> =
        turns.iter().enumerate().map(|(i, t)| format!("{:.1},{:.1}", x(i), y(t.context_tokens as f64))).collect();
    let sub_avg = if c.subagents.turns > 0 {
        (c.subagents.usage.context_tokens() as f64 / c.subagents.turns as f64).round()
    } else {
        0.0
    };
    let ys = format!("{:.1}", y(sub_avg.min(top)));
    html! {
        figure {
            svg class="meter" viewBox={ "0 0 " (WIDTH) " " (h) } role="img" aria-label="main-thread context per turn" {
                text x="6" y="14" class="axis" { (top.round() as u64) " tokens" }
                text x=(WIDTH) y=(h) dy="-4" dx="-6" class="axis end" { "turn " (turns.len()) }
                @for (class, tokens) in [("handoff", limits.handoff), ("warn", limits.warn)] {
                    @if tokens as f64 <= top {
                        @let at = format!("{:.1}", y(tokens as f64));
                        line x1="0" x2=(WIDTH) y1=(at) y2=(at) class=(class) {
                            title { (class) " at " (tokens) " tokens" }
                        }
                    }
                }
                line x1="0" x2=(WIDTH) y1=(ys) y2=(ys) class="sub-avg" {
                    title { "subagents' mean context per turn: " (sub_avg) " tokens" }
                }
                polyline points=(points.join(" ")) class="main" {}
            }
            figcaption {
                "Main-thread context per turn: " (c.main_first_tokens) " → " (c.main_last_tokens) " tokens, slope "
                (format_args!("{:.0}", c.main_slope_tokens_per_turn)) " tokens/turn; handoff at " (limits.handoff)
                ", warning at " (limits.warn) "; subagents' mean " (sub_avg) " per turn over " (c.subagents.turns)
                " turns."
            }
        }
    }
}

/// The simulator's cache audit of the run, when one was kept.
fn audit(v: &JobView) -> Markup {
    let Some(a) = &v.audit else { return html! {} };
    html! {
        p class="audit" {
            "Cache audit (simulator): " (a.requests) " requests, " (a.append_only) " append-only, " (a.misses)
            " misses (" (a.explained) " at recorded rewrites, " (a.unexplained.len()) " unexplained)."
        }
        @if !a.unexplained.is_empty() {
            ul class="unexplained" { @for u in a.unexplained.iter().take(20) { li { (u) } } }
        }
    }
}
