//! `/`: the jobs list — the newest [`LIST_WINDOW`] jobs filtered by state,
//! name and creation time, [`PAGE`] a page, under the insights strip; with
//! `fragment=rows`, only the table's rows (the live refresh).

use std::ops::Range;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use flower_model::{Job, JobSpec, now_ms};
use maud::{Markup, display, html};
use serde::Deserialize;

use crate::auth::Signed;
use crate::error::Refusal;
use crate::views::insights::{self, Insight};
use crate::views::{human_ms, layout, money, pct, state_badge};
use crate::{Console, LIST_WINDOW, PAGE};

/// The states the filter offers (empty: any).
const STATES: [&str; 8] =
    ["", "queued", "running", "waiting_for_user", "waiting_for_budget", "succeeded", "failed", "cancelled"];
/// The creation windows the filter offers (hours, label; 0: any time).
const WINDOWS: [(u64, &str); 4] = [(0, "any time"), (1, "1 hour"), (24, "1 day"), (168, "7 days")];

#[derive(Deserialize, Default)]
pub struct ListQuery {
    #[serde(default)]
    state: String,
    #[serde(default)]
    name: String,
    /// Only jobs created within this many hours (0: any).
    #[serde(default)]
    hours: u64,
    #[serde(default)]
    page: usize,
    /// `rows`: only the table's body (the live refresh).
    #[serde(default)]
    fragment: String,
}

/// What the list shows of one job, read from its row and spec alone.
pub struct JobLine {
    pub job: Job,
    pub cost: Option<f64>,
}

/// A job's line, priced at its spec's model.
pub fn job_line(job: Job) -> JobLine {
    let spec = JobSpec::from_value(job.spec.clone()).ok();
    let cost = spec.as_ref().and_then(|s| s.runtime.budget.price(&s.model)).map(|p| p.cost(&job.usage));
    JobLine { job, cost }
}

/// The jobs `q` chooses, as lines.
fn filtered(jobs: Vec<Job>, q: &ListQuery, now: i64) -> Vec<JobLine> {
    let name = q.name.trim().to_lowercase();
    jobs.into_iter()
        .filter(|j| q.state.is_empty() || j.state.as_str() == q.state)
        .filter(|j| name.is_empty() || j.name.to_lowercase().contains(&name))
        .filter(|j| q.hours == 0 || now - j.created_at <= (q.hours as i64) * 3_600_000)
        .map(job_line)
        .collect()
}

/// The jobs of the period before the chosen window, with the same filters.
fn earlier(jobs: &[Job], q: &ListQuery, now: i64) -> Option<Vec<JobLine>> {
    let shift = (q.hours as i64) * 3_600_000;
    (q.hours > 0).then(|| {
        let before: Vec<Job> =
            jobs.iter().filter(|j| now - j.created_at > shift && now - j.created_at <= 2 * shift).cloned().collect();
        let all = ListQuery { state: q.state.clone(), name: q.name.clone(), ..Default::default() };
        filtered(before, &all, now)
    })
}

/// Ended jobs' rows priced turn by turn at each turn's model (from their
/// kept profiles); the others stay priced at the job's model.
fn priced(lines: &mut [JobLine], profiles: &crate::profile::Profiles) {
    for l in lines {
        if let Some(cost) = profiles.cost(l.job.id) {
            l.cost = Some(cost);
        }
    }
}

/// The insight over `lines`, with their profile read.
async fn insight(c: &Console, lines: &[JobLine], now: i64) -> Result<Insight, Refusal> {
    let profile = c.inner.profiles.total(c.app(), lines.iter().map(|l| &l.job)).await?;
    Ok(Insight::of(lines, now).with_profile(profile))
}

/// One page of the list: which page is shown, of how many, which lines.
struct Paged {
    page: usize,
    pages: usize,
    shown: Range<usize>,
}

fn paged(lines: usize, asked: usize) -> Paged {
    let pages = lines.div_ceil(PAGE).max(1);
    let page = asked.min(pages - 1);
    Paged { page, pages, shown: (page * PAGE).min(lines)..((page + 1) * PAGE).min(lines) }
}

pub async fn page(s: Signed, State(c): State<Console>, Query(q): Query<ListQuery>) -> Result<Response, Refusal> {
    let jobs = s.app.list(LIST_WINDOW).await?;
    let now = now_ms();
    let earlier = earlier(&jobs, &q, now);
    let mut lines = filtered(jobs, &q, now);
    let p = paged(lines.len(), q.page);
    if q.fragment == "rows" {
        priced(&mut lines[p.shown.clone()], &c.inner.profiles);
        return Ok(layout::respond(StatusCode::OK, rows(&lines[p.shown], now)));
    }
    let current = insight(&c, &lines, now).await?;
    let before = match &earlier {
        Some(e) => Some(insight(&c, e, now).await?),
        None => None,
    };
    priced(&mut lines[p.shown.clone()], &c.inner.profiles);
    let body = html! {
        main {
            h1 { "Jobs" }
            (insights::strip(&current, before.as_ref()))
            (filters(&q))
            (table(&q, &p, &lines[p.shown.clone()], now))
            (pager(&q, &p))
        }
    };
    Ok(layout::respond(StatusCode::OK, layout::document("Jobs", body)))
}

/// The address of page `page` of the list under `q`'s filters (each value
/// form-encoded: a name may hold `&`, `#` or `+`).
fn link(q: &ListQuery, page: usize) -> String {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("state", &q.state)
        .append_pair("name", &q.name)
        .append_pair("hours", &q.hours.to_string())
        .append_pair("page", &page.to_string())
        .finish();
    format!("/?{query}")
}

/// The filter form, showing `q`'s choices.
fn filters(q: &ListQuery) -> Markup {
    html! {
        form class="filters" method="get" action="/" role="search" {
            label { "State " select name="state" {
                @for s in STATES {
                    option value=(s) selected[s == q.state] { (if s.is_empty() { "any state" } else { s }) }
                }
            } }
            label { "Name " input name="name" value=(q.name) placeholder="contains…"; }
            label { "Created within " select name="hours" {
                @for (h, label) in WINDOWS {
                    option value=(h) selected[h == q.hours] { (label) }
                }
            } }
            button type="submit" { "Filter" }
        }
    }
}

/// The jobs table; `console.js` refetches its rows from `data-rows` when
/// `data-live` says jobs changed.
fn table(q: &ListQuery, p: &Paged, shown: &[JobLine], now: i64) -> Markup {
    html! {
        table class="jobs" id="jobs" data-live="/live/jobs" data-rows={ (link(q, p.page)) "&fragment=rows" } {
            caption class="sr" { "Jobs, newest first" }
            thead { tr {
                th scope="col" { "State" } th scope="col" { "Name" } th scope="col" { "Age" }
                th scope="col" { "Duration" }
                th scope="col" class="num" { "Tokens" } th scope="col" class="num" { "Cost (est.)" }
                th scope="col" class="num" { "Cache rate" }
            } }
            tbody { (rows(shown, now)) }
        }
    }
}

/// The table's rows (also the live refresh's fragment).
fn rows(lines: &[JobLine], now: i64) -> Markup {
    html! {
        @for l in lines {
            @let j = &l.job;
            @let end = if j.state.is_terminal() { j.updated_at } else { now };
            tr data-job=(display(j.id)) {
                td { (state_badge(j.state)) }
                td { a href={ "/jobs/" (display(j.id)) } { (j.name) } div class="sub" { (&j.id.to_string()[..8]) } }
                td { (human_ms(now - j.created_at)) " ago" }
                td { (human_ms(end - j.created_at)) }
                td class="num" { (j.usage.context_tokens() + j.usage.output_tokens) }
                td class="num" { (money(l.cost)) }
                td class="num" { (pct(j.usage.cache_rate())) }
            }
        }
        @if lines.is_empty() {
            tr { td colspan="7" class="empty" { "No jobs match." } }
        }
    }
}

/// Links to the newer and older pages.
fn pager(q: &ListQuery, p: &Paged) -> Markup {
    html! {
        nav class="pager" aria-label="pages" {
            @if p.page > 0 {
                a href=(link(q, p.page - 1)) rel="prev" { "← newer" }
            }
            span { "page " (p.page + 1) " of " (p.pages) }
            @if p.page + 1 < p.pages {
                a href=(link(q, p.page + 1)) rel="next" { "older →" }
            }
        }
    }
}
