//! The web console (docs/design.md section 14): jobs, the live task tree,
//! transcripts raw and pruned, the context meter, the tool surface, the
//! workbench, and the user's actions (cancel, message, answer). Served by a
//! coordinator on `--http-listen` and by `flower ui` over the embedded
//! store; server-rendered HTML, a little JavaScript, server-sent events,
//! charts as SVG, every asset in the binary.
//!
//! With a token, every request shows it: a bearer header (scripts) or the
//! HttpOnly cookie the login form sets (a digest of the token, never the
//! token); anything else is 401 and shows nothing. Every action carries a
//! CSRF value derived from the token (or, without one, from a secret of
//! this process), and job content is never trusted: all text is escaped and
//! a content security policy allows only the console's own script.
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use flower_bus::{Heard, Notice, Notifier};
use flower_coordinator::app::{AnswerRequest, App};
use flower_coordinator::context::ContextReport;
use flower_coordinator::context::{CacheAudits, audit_key};
use flower_model::{ContentBlock, Entry, Job, JobId, JobSpec, JobState, Role, SessionId, Task, now_ms};
use flower_store::{Store, StoreError};
use object_store::ObjectStoreExt;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Jobs the list reads at most (newest first); filters and pages apply within them.
pub const LIST_WINDOW: u32 = 1000;
/// Jobs on one page of the list.
pub const PAGE: usize = 50;
/// Transcript entries on one page.
pub const ENTRIES_PAGE: u32 = 200;
/// Characters of one entry's text shown before it is cut.
const SHOWN_CHARS: usize = 4000;
const COOKIE: &str = "flower_console";
const CSS: &str = include_str!("console.css");
const JS: &str = include_str!("console.js");
/// Pages load their script and style from the console only; nothing inline.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
                   frame-ancestors 'none'; form-action 'self'; base-uri 'none'";

/// The console over a store, the objects (workbenches) and, when there is
/// one, the notifier whose notices make pages live (else they poll).
#[derive(Clone)]
pub struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    app: App,
    notifier: Option<Arc<dyn Notifier>>,
    /// The token's digest (the cookie's value), when a token is set.
    token_digest: Option<String>,
    csrf: String,
    /// Ended jobs' cost by role and model, latency and TTFT (the insights strip).
    profiles: profile::Profiles,
    /// Who can audit an ended job's prompt cache when none was kept.
    audits: Option<Arc<dyn CacheAudits>>,
}

mod error;
mod profile;

fn digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn same(a: &str, b: &str) -> bool {
    flower_model::secret::same(a.as_bytes(), b.as_bytes())
}

impl Console {
    /// The console over `app`; `notifier`'s notices make pages live (else they poll).
    pub fn new(app: App, notifier: Option<Arc<dyn Notifier>>, token: Option<String>) -> Self {
        let token = token.filter(|t| !t.is_empty());
        let secret = token.clone().unwrap_or_else(|| hex::encode(rand::random::<[u8; 32]>()));
        Self {
            inner: Arc::new(Inner {
                app,
                notifier,
                token_digest: token.as_deref().map(|t| digest(&format!("flower-console-session:{t}"))),
                csrf: digest(&format!("flower-console-csrf:{secret}")),
                profiles: Default::default(),
                audits: None,
            }),
        }
    }

    /// Who to ask for the cache audit of an ended job that has none kept (a
    /// coordinator's console: the simulator is another process). What is
    /// found is kept beside the job.
    pub fn with_audits(mut self, audits: Arc<dyn CacheAudits>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.audits = Some(audits);
        }
        self
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/", get(jobs_page))
            .route("/login", get(login_page).post(login))
            .route("/static/console.css", get(|| async { asset("text/css; charset=utf-8", CSS) }))
            .route("/static/console.js", get(|| async { asset("text/javascript; charset=utf-8", JS) }))
            .route("/live/jobs", get(jobs_live))
            .route("/jobs/{job}", get(job_page))
            .route("/jobs/{job}/live", get(job_live))
            .route("/jobs/{job}/sessions/{session}", get(transcript_page))
            .route("/jobs/{job}/files/{*path}", get(file))
            .route("/jobs/{job}/cancel", post(cancel))
            .route("/jobs/{job}/interrupt", post(interrupt))
            .route("/jobs/{job}/answer", post(answer))
            .with_state(self)
    }

    /// Serve on `listener` until `shutdown`.
    pub fn serve(self, listener: TcpListener, shutdown: CancellationToken) {
        let app = self.router();
        tokio::spawn(async move {
            let served = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "console stopped");
            }
        });
    }

    /// `Ok` when the request shows the token (or none is set); else the 401 to send.
    fn check(&self, headers: &HeaderMap) -> Result<(), Box<Response>> {
        let Some(want) = &self.inner.token_digest else { return Ok(()) };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| digest(&format!("flower-console-session:{t}")));
        let cookie = cookie(headers, COOKIE);
        if bearer.iter().chain(cookie.iter()).any(|got| same(got, want)) {
            return Ok(());
        }
        Err(Box::new(unauthorized()))
    }

    fn csrf_ok(&self, given: &str) -> bool {
        same(given, &self.inner.csrf)
    }

    fn store(&self) -> &dyn Store {
        self.inner.app.store().as_ref()
    }
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        (k == name).then(|| v.to_string())
    })
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "max-age=300")], body).into_response()
}

fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn unauthorized() -> Response {
    html(StatusCode::UNAUTHORIZED, layout("Sign in", &login_form(None)))
}

fn login_form(error: Option<&str>) -> String {
    format!(
        "<main class=\"narrow\"><h1>flower</h1><form method=\"post\" action=\"/login\" class=\"card\">\
         <label for=\"token\">Access token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required autofocus>\
         {}<button type=\"submit\">Sign in</button></form></main>",
        error.map(|e| format!("<p class=\"error\" role=\"alert\">{}</p>", esc(e))).unwrap_or_default()
    )
}

/// A message page for a refused or failed request.
fn problem(status: StatusCode, message: &str) -> Response {
    html(
        status,
        layout(
            "flower",
            &format!(
                "<main><p class=\"error\" role=\"alert\">{}</p><p><a href=\"/\">Jobs</a></p></main>",
                esc(message)
            ),
        ),
    )
}

/// HTML-escaped text.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn layout(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · flower</title><link rel=\"stylesheet\" href=\"/static/console.css\">\
         <script src=\"/static/console.js\" defer></script></head>\
         <body><header class=\"top\"><a href=\"/\" class=\"brand\">flower</a><nav aria-label=\"main\"><a href=\"/\">Jobs</a></nav></header>{body}</body></html>",
        esc(title)
    )
}

fn parse_job(id: &str) -> Result<JobId, Box<Response>> {
    id.parse().map_err(|_| Box::new(problem(StatusCode::BAD_REQUEST, "not a job id")))
}

// ------------------------------------------------------------------ login

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login_page(State(c): State<Console>, headers: HeaderMap) -> Response {
    if c.inner.token_digest.is_none() || c.check(&headers).is_ok() {
        return redirect("/");
    }
    html(StatusCode::OK, layout("Sign in", &login_form(None)))
}

async fn login(State(c): State<Console>, Form(f): Form<LoginForm>) -> Response {
    let Some(want) = &c.inner.token_digest else { return redirect("/") };
    let got = digest(&format!("flower-console-session:{}", f.token));
    if !same(&got, want) {
        return html(
            StatusCode::UNAUTHORIZED,
            layout("Sign in", &login_form(Some("That token is not this service's."))),
        );
    }
    let mut r = redirect("/");
    let cookie = format!("{COOKIE}={got}; HttpOnly; SameSite=Strict; Path=/");
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

// ------------------------------------------------------------------ jobs list

#[derive(Deserialize, Default)]
struct ListQuery {
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
struct JobLine {
    job: Job,
    cost: Option<f64>,
}

fn job_line(job: Job) -> JobLine {
    let spec = JobSpec::from_value(job.spec.clone()).ok();
    let cost = spec.as_ref().and_then(|s| s.runtime.budget.price(&s.model)).map(|p| p.cost(&job.usage));
    JobLine { job, cost }
}

fn human_ms(ms: i64) -> String {
    if (0..1000).contains(&ms) {
        return format!("{ms} ms");
    }
    let s = ms.max(0) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

fn pct(r: Option<f64>) -> String {
    r.map_or("–".into(), |x| format!("{:.0}%", x * 100.0))
}

fn money(c: Option<f64>) -> String {
    c.map_or("–".into(), |x| format!("${x:.4}"))
}

fn state_badge(state: JobState) -> String {
    format!("<span class=\"state state-{0}\" data-state=\"{0}\">{0}</span>", state.as_str())
}

fn is_live(state: JobState) -> bool {
    !state.is_terminal()
}

fn filtered(jobs: Vec<Job>, q: &ListQuery, now: i64) -> Vec<JobLine> {
    let name = q.name.trim().to_lowercase();
    jobs.into_iter()
        .filter(|j| q.state.is_empty() || j.state.as_str() == q.state)
        .filter(|j| name.is_empty() || j.name.to_lowercase().contains(&name))
        .filter(|j| q.hours == 0 || now - j.created_at <= (q.hours as i64) * 3_600_000)
        .map(job_line)
        .collect()
}

fn rows(lines: &[JobLine], now: i64) -> String {
    let mut out = String::new();
    for l in lines {
        let j = &l.job;
        let end = if j.state.is_terminal() { j.updated_at } else { now };
        let _ = write!(
            out,
            "<tr data-job=\"{id}\"><td>{state}</td><td><a href=\"/jobs/{id}\">{name}</a><div class=\"sub\">{short}</div></td>\
             <td>{age} ago</td><td>{dur}</td><td class=\"num\">{tokens}</td><td class=\"num\">{cost}</td><td class=\"num\">{rate}</td></tr>",
            id = j.id,
            state = state_badge(j.state),
            name = esc(&j.name),
            short = &j.id.to_string()[..8],
            age = human_ms(now - j.created_at),
            dur = human_ms(end - j.created_at),
            tokens = j.usage.context_tokens() + j.usage.output_tokens,
            cost = money(l.cost),
            rate = pct(j.usage.cache_rate()),
        );
    }
    if lines.is_empty() {
        out.push_str("<tr><td colspan=\"7\" class=\"empty\">No jobs match.</td></tr>");
    }
    out
}

/// Figures of the insights strip over some jobs.
struct Insight {
    jobs: usize,
    error_rate: Option<f64>,
    cost: f64,
    cache_rate: Option<f64>,
    tokens: u64,
    tokens_per_s: Option<f64>,
    /// Cost by role and model, latency and TTFT (from the jobs' events).
    profile: profile::Profile,
}

fn insight(lines: &[JobLine], now: i64) -> Insight {
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
    Insight {
        jobs: lines.len(),
        error_rate: (ended > 0).then(|| failed as f64 / ended as f64),
        // (An empty f64 sum is -0.0, shown as "$-0.0000".)
        cost: lines.iter().filter_map(|l| l.cost).sum::<f64>() + 0.0,
        cache_rate: usage.cache_rate(),
        tokens,
        tokens_per_s: (run_ms > 0).then(|| tokens as f64 * 1000.0 / run_ms as f64),
        profile: profile::Profile::default(),
    }
}

/// Ended jobs' rows priced turn by turn at each turn's model (from their
/// kept profiles); the others stay priced at the job's model.
fn priced(lines: &mut [JobLine], profiles: &profile::Profiles) {
    for l in lines {
        if let Some(cost) = profiles.cost(l.job.id) {
            l.cost = Some(cost);
        }
    }
}

/// The insights strip over the chosen jobs, each figure beside the previous
/// period's (the same filters, the window before) when a window is chosen.
fn insights(now_: &Insight, before: Option<&Insight>) -> String {
    let figure = |label: &str, value: String, prev: Option<String>| {
        format!(
            "<div class=\"figure\"><div class=\"value\">{value}</div><div class=\"label\">{label}</div>{}</div>",
            prev.map(|p| format!("<div class=\"sub\">previous period: {p}</div>")).unwrap_or_default()
        )
    };
    let rate = |r: Option<f64>| pct(r);
    let per_s = |r: Option<f64>| r.map_or("–".into(), |x| format!("{x:.0}"));
    let ms = |m: Option<u64>| m.map_or("–".into(), |x| human_ms(x as i64));
    let (p, b) = (&now_.profile, before.map(|b| &b.profile));
    format!(
        "<section class=\"insights\" aria-label=\"insights\">{}{}{}{}{}{}{}{}{}{}</section>",
        figure("jobs", now_.jobs.to_string(), before.map(|b| b.jobs.to_string())),
        figure("error rate", rate(now_.error_rate), before.map(|b| rate(b.error_rate))),
        figure("cost (est.)", format!("${:.4}", now_.cost), before.map(|b| format!("${:.4}", b.cost))),
        figure("cache rate", rate(now_.cache_rate), before.map(|b| rate(b.cache_rate))),
        figure("tokens", now_.tokens.to_string(), before.map(|b| b.tokens.to_string())),
        figure("tokens/s of run time", per_s(now_.tokens_per_s), before.map(|b| per_s(b.tokens_per_s))),
        figure("model latency (p50)", ms(p.latency.median()), b.map(|b| ms(b.latency.median()))),
        figure("time to first token (p50)", ms(p.ttft.median()), b.map(|b| ms(b.ttft.median()))),
        breakdown("cost by role", &p.cost_by_role, b.map(|b| &b.cost_by_role)),
        breakdown("cost by model", &p.cost_by_model, b.map(|b| &b.cost_by_model)),
    )
}

/// A cost breakdown (largest first), each line beside the previous period's.
fn breakdown(label: &str, now_: &BTreeMap<String, f64>, before: Option<&BTreeMap<String, f64>>) -> String {
    let mut lines: Vec<(&String, &f64)> = now_.iter().collect();
    lines.sort_by(|a, b| b.1.total_cmp(a.1));
    let items: String = lines
        .iter()
        .map(|(k, v)| {
            let prev = before
                .map(|b| format!(" <span class=\"sub\">(previous: {})</span>", money(b.get(*k).copied())))
                .unwrap_or_default();
            format!("<li><span class=\"key\">{}</span> <span class=\"num\">${v:.4}</span>{prev}</li>", esc(k))
        })
        .collect();
    let items = if items.is_empty() { "<li class=\"sub\">no priced calls</li>".to_string() } else { items };
    format!(
        "<div class=\"figure breakdown\"><div class=\"label\">{label}</div><ul aria-label=\"{label}\">{items}</ul></div>"
    )
}

async fn jobs_page(State(c): State<Console>, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    if let Err(r) = c.check(&headers) {
        return *r;
    }
    let jobs = match c.store().list_jobs(LIST_WINDOW).await {
        Ok(j) => j,
        Err(e) => return error::page(e),
    };
    let now = now_ms();
    // The period before the chosen window, with the same filters.
    let earlier = (q.hours > 0).then(|| {
        let shift = (q.hours as i64) * 3_600_000;
        let earlier: Vec<Job> =
            jobs.iter().filter(|j| now - j.created_at > shift && now - j.created_at <= 2 * shift).cloned().collect();
        let all = ListQuery { state: q.state.clone(), name: q.name.clone(), ..Default::default() };
        filtered(earlier, &all, now)
    });
    let mut lines = filtered(jobs, &q, now);
    let pages = lines.len().div_ceil(PAGE).max(1);
    let page = q.page.min(pages - 1);
    let shown = (page * PAGE).min(lines.len())..((page + 1) * PAGE).min(lines.len());
    if q.fragment == "rows" {
        priced(&mut lines[shown.clone()], &c.inner.profiles);
        return html(StatusCode::OK, rows(&lines[shown], now));
    }
    let mut current = insight(&lines, now);
    let mut before = earlier.as_ref().map(|e| insight(e, now));
    let profiles = &c.inner.profiles;
    let store = c.store();
    match profiles.total(store, lines.iter().map(|l| &l.job)).await {
        Ok(p) => current.profile = p,
        Err(e) => return error::page(e),
    }
    // Each turn priced at its own model (a job may use two).
    current.cost = current.profile.cost_by_model.values().sum::<f64>() + 0.0;
    if let (Some(b), Some(e)) = (before.as_mut(), earlier.as_ref()) {
        match profiles.total(store, e.iter().map(|l| &l.job)).await {
            Ok(p) => b.profile = p,
            Err(e) => return error::page(e),
        }
        b.cost = b.profile.cost_by_model.values().sum::<f64>() + 0.0;
    }
    priced(&mut lines[shown.clone()], profiles);
    let shown = &lines[shown];
    let states = ["", "queued", "running", "waiting_for_user", "succeeded", "failed", "cancelled"];
    let options: String = states
        .iter()
        .map(|s| {
            format!(
                "<option value=\"{s}\"{}>{}</option>",
                if *s == q.state { " selected" } else { "" },
                if s.is_empty() { "any state" } else { s }
            )
        })
        .collect();
    let link = |p: usize| format!("/?state={}&name={}&hours={}&page={p}", esc(&q.state), esc(&q.name), q.hours);
    let nav = format!(
        "<nav class=\"pager\" aria-label=\"pages\">{}<span>page {} of {pages}</span>{}</nav>",
        if page > 0 { format!("<a href=\"{}\" rel=\"prev\">← newer</a>", link(page - 1)) } else { String::new() },
        page + 1,
        if page + 1 < pages {
            format!("<a href=\"{}\" rel=\"next\">older →</a>", link(page + 1))
        } else {
            String::new()
        },
    );
    let body = format!(
        "<main><h1>Jobs</h1>{insights}\
         <form class=\"filters\" method=\"get\" action=\"/\" role=\"search\">\
         <label>State <select name=\"state\">{options}</select></label>\
         <label>Name <input name=\"name\" value=\"{name}\" placeholder=\"contains…\"></label>\
         <label>Created within <select name=\"hours\">{hours}</select></label>\
         <button type=\"submit\">Filter</button></form>\
         <table class=\"jobs\" id=\"jobs\" data-live=\"/live/jobs\" data-rows=\"{rows_url}\">\
         <caption class=\"sr\">Jobs, newest first</caption>\
         <thead><tr><th scope=\"col\">State</th><th scope=\"col\">Name</th><th scope=\"col\">Age</th><th scope=\"col\">Duration</th>\
         <th scope=\"col\" class=\"num\">Tokens</th><th scope=\"col\" class=\"num\">Cost (est.)</th><th scope=\"col\" class=\"num\">Cache rate</th></tr></thead>\
         <tbody>{rows}</tbody></table>{nav}</main>",
        insights = insights(&current, before.as_ref()),
        name = esc(&q.name),
        hours = [(0, "any time"), (1, "1 hour"), (24, "1 day"), (168, "7 days")]
            .iter()
            .map(|(h, l)| format!("<option value=\"{h}\"{}>{l}</option>", if *h == q.hours { " selected" } else { "" }))
            .collect::<String>(),
        rows_url = esc(&format!("{}&fragment=rows", link(page))),
        rows = rows(shown, now),
    );
    html(StatusCode::OK, layout("Jobs", &body))
}

/// Server-sent `changed` events whenever a job's row may have changed (a
/// notice, or every 2 s without a notifier); the page refreshes its rows.
async fn jobs_live(State(c): State<Console>, headers: HeaderMap) -> Response {
    if let Err(r) = c.check(&headers) {
        return *r;
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, std::convert::Infallible>>(16);
    let console = c.clone();
    tokio::spawn(async move {
        let mut notices = console.inner.notifier.as_ref().map(|n| n.subscribe());
        let mut last = String::new();
        loop {
            let now = match console.store().list_jobs(PAGE as u32).await {
                Ok(jobs) => jobs.iter().map(|j| format!("{}:{}:{};", j.id, j.state.as_str(), j.updated_at)).collect(),
                Err(_) => last.clone(),
            };
            if now != last {
                last = now;
                if tx.send(Ok(SseEvent::default().event("changed").data("jobs"))).await.is_err() {
                    return;
                }
            }
            wait_for_change(&mut notices, None, &tx).await;
            if tx.is_closed() {
                return;
            }
        }
    });
    sse(rx)
}

/// Until a notice (of `job`, when given), at most 2 s.
async fn wait_for_change(
    notices: &mut Option<flower_bus::NoticeStream>,
    job: Option<JobId>,
    tx: &tokio::sync::mpsc::Sender<Result<SseEvent, std::convert::Infallible>>,
) {
    let tick = tokio::time::sleep(Duration::from_secs(2));
    tokio::pin!(tick);
    loop {
        let heard = async {
            match notices.as_mut() {
                Some(n) => n.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut tick => return,
            _ = tx.closed() => return,
            h = heard => match h {
                Heard::Notice(Notice::Events { job: j, .. }) if job.is_none_or(|want| want == j) => return,
                Heard::Lagged => return,
                Heard::Closed => *notices = None,
                Heard::Notice(_) => {}
            },
        }
    }
}

fn sse(rx: tokio::sync::mpsc::Receiver<Result<SseEvent, std::convert::Infallible>>) -> Response {
    let mut r = Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

// ------------------------------------------------------------------ one job

#[derive(Deserialize, Default)]
struct JobQuery {
    /// `live`: only the parts a live refresh replaces.
    #[serde(default)]
    fragment: String,
    /// The first task the timeline draws (it draws [`TIMELINE_TASKS`] at a time).
    #[serde(default)]
    tasks: usize,
}

/// Tasks the timeline draws at once; links move the window.
const TIMELINE_TASKS: usize = 200;

/// Everything the job page shows, read once.
struct JobView {
    /// The timeline's first task (the page's `tasks`).
    timeline_from: usize,
    job: Job,
    spec: Option<JobSpec>,
    tasks: Vec<Task>,
    sessions: Vec<flower_model::Session>,
    record: flower_coordinator::record::Record,
    context: ContextReport,
    pending: Vec<(String, String, Vec<String>)>,
    files: Vec<(String, u64)>,
    /// Each task's attempts: (attempt, started at, finished at and whether it succeeded).
    attempts: BTreeMap<flower_model::TaskId, Vec<Attempt>>,
    /// The simulator's cache audit of the run, when one was kept.
    audit: Option<flower_model::audit::CacheAudit>,
}

struct Attempt {
    attempt: u32,
    started: i64,
    finished: Option<(i64, bool)>,
}

/// Each task's attempts, from the job's events.
async fn attempts(store: &dyn Store, job: JobId) -> Result<BTreeMap<flower_model::TaskId, Vec<Attempt>>, StoreError> {
    use flower_model::EventKind;
    let mut out: BTreeMap<flower_model::TaskId, Vec<Attempt>> = BTreeMap::new();
    flower_store::scan_events(store, job, 0, |e| match &e.kind {
        EventKind::TaskStarted { task, attempt, .. } => {
            out.entry(*task).or_default().push(Attempt { attempt: *attempt, started: e.at, finished: None })
        }
        EventKind::TaskFinished { task, attempt, succeeded, .. } => {
            if let Some(a) = out.get_mut(task).and_then(|v| v.iter_mut().rfind(|a| a.attempt == *attempt)) {
                a.finished = Some((e.at, *succeeded));
            }
        }
        _ => {}
    })
    .await?;
    Ok(out)
}

async fn load_job(c: &Console, job: JobId) -> Result<JobView, StoreError> {
    let store = c.store();
    let job = store.get_job(job).await?;
    let spec = JobSpec::from_value(job.spec.clone()).ok();
    let (tasks, sessions, record, context, pending, attempts) = tokio::try_join!(
        store.tasks(job.id),
        store.sessions(job.id),
        flower_coordinator::record::workflow(store, job.id),
        flower_coordinator::context::report(store, job.id),
        flower_coordinator::tools::ask::pending(store, job.id),
        attempts(store, job.id),
    )?;
    let files = c.inner.app.artifacts(job.id).await.unwrap_or_default();
    let objects = c.inner.app.objects();
    let mut audit = match objects.get(&audit_key(job.id)).await {
        Ok(got) => got.bytes().await.ok().and_then(|b| serde_json::from_slice(&b).ok()),
        Err(_) => None,
    };
    if audit.is_none() && job.state.is_terminal() {
        audit = fetch_audit(c, &sessions, &context).await;
        if let Some(a) = &audit
            && let Ok(body) = serde_json::to_vec(a)
            && let Err(e) = objects.put(&audit_key(job.id), object_store::PutPayload::from(body)).await
        {
            tracing::warn!(error = %e, "the cache audit was not kept");
        }
    }
    Ok(JobView { timeline_from: 0, job, spec, tasks, sessions, record, context, pending, files, attempts, audit })
}

/// The cache audit of these sessions from whoever can make one.
async fn fetch_audit(
    c: &Console,
    sessions: &[flower_model::Session],
    context: &ContextReport,
) -> Option<flower_model::audit::CacheAudit> {
    let audits = c.inner.audits.as_ref()?;
    let ids: Vec<String> = sessions.iter().map(|s| s.id.to_string()).collect();
    audits.audit(&ids, &context.rewrites()).await
}

/// The job's header: state, figures, the context meter chip.
fn job_header(c: &Console, v: &JobView, now: i64) -> String {
    let j = &v.job;
    let end = if j.state.is_terminal() { j.updated_at } else { now };
    let cost = v.context.cost_usd.map_or_else(|| money(job_line(j.clone()).cost), |c| money(Some(c)));
    let chip = meter_chip(c, v);
    let mut out = format!(
        "<section class=\"head\" id=\"head\"><h1>{name} {state}</h1>{chip}<dl class=\"facts\">\
         <div><dt>Job</dt><dd><code>{id}</code></dd></div>\
         <div><dt>Age</dt><dd>{age}</dd></div><div><dt>Duration</dt><dd>{dur}</dd></div>\
         <div><dt>Main turns</dt><dd>{turns}</dd></div><div><dt>Tasks</dt><dd>{tasks}</dd></div>\
         <div><dt>Cost (est.)</dt><dd>{cost}</dd></div><div><dt>Cache rate</dt><dd>{rate}</dd></div>\
         <div><dt>Model latency p50</dt><dd>{lat}</dd></div><div><dt>Time to first token p50</dt><dd>{ttft}</dd></div></dl>",
        name = esc(&j.name),
        state = state_badge(j.state),
        id = j.id,
        age = human_ms(now - j.created_at),
        dur = human_ms(end - j.created_at),
        turns = v.context.main.turns,
        tasks = v.tasks.len(),
        rate = pct(v.context.cache_rate),
        lat = v.context.latency_ms_p50.map_or("–".into(), |ms| format!("{ms} ms")),
        ttft = v.context.ttft_ms_p50.map_or("–".into(), |ms| format!("{ms} ms")),
    );
    if let Some(r) = &j.reason {
        let _ = write!(out, "<p class=\"reason\">{}</p>", esc(r));
    }
    if let Some(a) = &j.final_answer {
        let _ = write!(out, "<details open><summary>Final answer</summary><pre>{}</pre></details>", esc(a));
    }
    out.push_str("</section>");
    out
}

/// Current context / window of the main thread, with the last turn's breakdown.
fn meter_chip(c: &Console, v: &JobView) -> String {
    let Some(spec) = &v.spec else { return String::new() };
    let window = spec.runtime.handoff.window_for(&spec.model, c.inner.app.windows()).max(1);
    let main = v.context.sessions.iter().rfind(|s| s.role == Role::Coordinator.as_str());
    let Some(main) = main else { return String::new() };
    let share = main.history_tokens as f64 / window as f64;
    let level = if share >= 0.9 {
        "red"
    } else if share >= 0.75 {
        "amber"
    } else {
        "green"
    };
    let u = &main.usage;
    format!(
        "<span class=\"chip chip-{level}\" id=\"meter-chip\" title=\"last turn: {} input, {} output, {} cache read, {} cache write (summed over the session)\">\
         context {} / {} ({:.0}%)</span>",
        u.input_tokens,
        u.output_tokens,
        u.cache_read_input_tokens,
        u.cache_creation_input_tokens,
        main.history_tokens,
        window,
        share * 100.0
    )
}

/// Coordinator-side sessions with the tasks they delegated, each task with
/// its worker session (its transcript).
fn task_tree(v: &JobView) -> String {
    let job = v.job.id;
    let mut by_parent: BTreeMap<SessionId, Vec<&Task>> = BTreeMap::new();
    for t in &v.tasks {
        by_parent.entry(t.parent_session).or_default().push(t);
    }
    let worker_session: BTreeMap<flower_model::TaskId, SessionId> =
        v.sessions.iter().filter_map(|s| s.task_id.map(|t| (t, s.id))).collect();
    let mut out = String::from(
        "<section id=\"tree\" aria-labelledby=\"tree-h\"><h2 id=\"tree-h\">Task tree</h2><ul class=\"tree\">",
    );
    for s in v.sessions.iter().filter(|s| s.role != Role::Worker) {
        let tasks = by_parent.remove(&s.id).unwrap_or_default();
        let _ = write!(
            out,
            "<li><a href=\"/jobs/{job}/sessions/{}\" class=\"session\">{} <span class=\"role\">{}</span></a>",
            s.id,
            esc(&s.label),
            s.role.as_str()
        );
        if !tasks.is_empty() {
            out.push_str("<ul>");
            for t in tasks {
                task_item(&mut out, job, t, worker_session.get(&t.id));
            }
            out.push_str("</ul>");
        }
        out.push_str("</li>");
    }
    // Tasks whose delegating session is not stored (never expected).
    for t in by_parent.into_values().flatten() {
        task_item(&mut out, job, t, worker_session.get(&t.id));
    }
    out.push_str("</ul>");
    out.push_str(&waterfall(v, now_ms()));
    out.push_str("</section>");
    out
}

fn task_item(out: &mut String, job: JobId, t: &Task, session: Option<&SessionId>) {
    let label = if t.worker == flower_model::job::COMMAND_TASK {
        format!("command: {}", esc(&cut(&t.mandate, 80)))
    } else {
        format!("{} — {}", esc(&t.worker), esc(&t.description))
    };
    let link = session.map_or(label.clone(), |s| format!("<a href=\"/jobs/{job}/sessions/{s}\">{label}</a>"));
    let _ = write!(
        out,
        "<li class=\"task\" data-task=\"{id}\">{link} <span class=\"tstate tstate-{st}\">{st}</span> \
         <span class=\"sub\">attempt {att} · {dur} · {tok} tokens{by}</span></li>",
        id = t.id,
        st = t.state.as_str(),
        att = t.attempt,
        dur = human_ms(t.updated_at - t.created_at),
        tok = t.usage.context_tokens() + t.usage.output_tokens,
        by = t.claimed_by.as_deref().map(|w| format!(" · {}", esc(w))).unwrap_or_default(),
    );
}

/// The tasks on one time axis: the wait in the queue, then each attempt as
/// a span of its own (a failed or lost one in red).
fn waterfall(v: &JobView, now: i64) -> String {
    if v.tasks.is_empty() {
        return String::new();
    }
    let start = v.job.created_at;
    let end_of = |t: &Task| if t.state.is_terminal() { t.updated_at } else { now };
    let end = v.tasks.iter().map(end_of).max().unwrap_or(start).max(start + 1);
    let span = (end - start) as f64;
    let from = v.timeline_from;
    let shown: Vec<&Task> = v.tasks.iter().skip(from).take(TIMELINE_TASKS).collect();
    let (w, row) = (1000.0, 7.0);
    let x = |at: i64| (at - start) as f64 / span * w;
    let mut svg = format!(
        "<figure id=\"timeline\"><svg class=\"waterfall\" viewBox=\"0 0 {w} {}\" role=\"img\" aria-label=\"task timeline: queue wait and attempts\">",
        row * shown.len() as f64 + 4.0
    );
    for (i, t) in shown.iter().enumerate() {
        let y = i as f64 * row + 2.0;
        let tries = v.attempts.get(&t.id).map(Vec::as_slice).unwrap_or(&[]);
        let first = tries.first().map_or(end_of(t), |a| a.started);
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"5\" class=\"bar bar-queue\"><title>{} queued {}</title></rect>",
            x(t.created_at),
            (x(first) - x(t.created_at)).max(1.0),
            esc(&t.worker),
            human_ms(first - t.created_at)
        );
        for (n, a) in tries.iter().enumerate() {
            let last = n + 1 == tries.len();
            let (until, class) = match a.finished {
                Some((at, true)) => (at, "bar-succeeded"),
                Some((at, false)) => (at, "bar-failed"),
                None if last && !t.state.is_terminal() => (now, "bar-running"),
                None if last => (
                    end_of(t),
                    if t.state == flower_model::TaskState::Succeeded { "bar-succeeded" } else { "bar-failed" },
                ),
                None => (tries[n + 1].started, "bar-failed"),
            };
            let _ = write!(
                svg,
                "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"5\" class=\"bar {class}\"><title>{} attempt {} ({})</title></rect>",
                x(a.started),
                (x(until) - x(a.started)).max(2.0),
                esc(&t.worker),
                a.attempt,
                human_ms(until - a.started)
            );
        }
    }
    let retried = v.attempts.values().filter(|a| a.len() > 1).count();
    let window = if v.tasks.len() > shown.len() {
        let link = |at: usize, text: &str| format!(" <a href=\"/jobs/{}?tasks={at}#timeline\">{text}</a>", v.job.id);
        format!(
            " — tasks {}–{} drawn{}{}",
            from + 1,
            from + shown.len(),
            if from > 0 { link(from.saturating_sub(TIMELINE_TASKS), "← earlier tasks") } else { String::new() },
            if from + shown.len() < v.tasks.len() {
                link(from + shown.len(), "later tasks →")
            } else {
                String::new()
            },
        )
    } else {
        String::new()
    };
    let _ = write!(
        svg,
        "</svg><figcaption>{} task(s) over {}: grey the wait in the queue, then each attempt{}{window}</figcaption></figure>",
        v.tasks.len(),
        human_ms(end - start),
        if retried > 0 { format!("; {retried} retried") } else { String::new() },
    );
    svg
}

/// The main thread's context per turn against the handoff threshold and
/// its warning line, as SVG.
fn context_meter(c: &Console, v: &JobView) -> String {
    let turns = &v.context.main_turns;
    let Some(spec) = &v.spec else { return String::new() };
    let (warn, at) = spec.runtime.handoff.thresholds(&spec.model, c.inner.app.windows());
    let mut out = String::from("<section aria-labelledby=\"meter-h\"><h2 id=\"meter-h\">Context meter</h2>");
    if turns.is_empty() {
        out.push_str("<p class=\"sub\">No main-thread turn yet.</p></section>");
        return out;
    }
    // The scale follows the thread (thresholds far above it are named, not drawn).
    let peak = turns.iter().map(|t| t.context_tokens).max().unwrap_or(0);
    let top = (peak as f64 * 1.25).max(1.0);
    let (w, h) = (1000.0, 200.0);
    let x = |i: usize| if turns.len() < 2 { w / 2.0 } else { i as f64 / (turns.len() - 1) as f64 * w };
    let y = |tokens: f64| h - tokens / top * h;
    let points: Vec<String> =
        turns.iter().enumerate().map(|(i, t)| format!("{:.1},{:.1}", x(i), y(t.context_tokens as f64))).collect();
    let sub_avg = if v.context.subagents.turns > 0 {
        (v.context.subagents.usage.context_tokens() as f64 / v.context.subagents.turns as f64).round()
    } else {
        0.0
    };
    let _ = write!(
        out,
        "<figure><svg class=\"meter\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"main-thread context per turn\">\
         <text x=\"6\" y=\"14\" class=\"axis\">{top_label} tokens</text><text x=\"{w}\" y=\"{h}\" dy=\"-4\" dx=\"-6\" class=\"axis end\">turn {n}</text>\
         {lines}<line x1=\"0\" x2=\"{w}\" y1=\"{ys:.1}\" y2=\"{ys:.1}\" class=\"sub-avg\"><title>subagents' mean context per turn: {sub_avg} tokens</title></line>\
         <polyline points=\"{pts}\" class=\"main\"/></svg>\
         <figcaption>Main-thread context per turn: {first} → {last} tokens, slope {slope:.0} tokens/turn; \
         handoff at {at}, warning at {warn}; subagents' mean {sub_avg} per turn over {st} turns.</figcaption></figure>",
        top_label = top.round() as u64,
        n = turns.len(),
        lines = [("handoff", at), ("warn", warn)]
            .iter()
            .map(|(class, tokens)| {
                let t = *tokens as f64;
                if t <= top {
                    format!(
                        "<line x1=\"0\" x2=\"{w}\" y1=\"{0:.1}\" y2=\"{0:.1}\" class=\"{class}\"><title>{class} at {tokens} tokens</title></line>",
                        y(t)
                    )
                } else {
                    String::new()
                }
            })
            .collect::<String>(),
        ys = y(sub_avg.min(top)),
        pts = points.join(" "),
        first = v.context.main_first_tokens,
        last = v.context.main_last_tokens,
        slope = v.context.main_slope_tokens_per_turn,
        st = v.context.subagents.turns,
    );
    if let Some(a) = &v.audit {
        let _ = write!(
            out,
            "<p class=\"audit\">Cache audit (simulator): {} requests, {} append-only, {} misses ({} at recorded rewrites, {} unexplained).</p>",
            a.requests,
            a.append_only,
            a.misses,
            a.explained,
            a.unexplained.len()
        );
        if !a.unexplained.is_empty() {
            let items: String = a.unexplained.iter().take(20).map(|u| format!("<li>{}</li>", esc(u))).collect();
            let _ = write!(out, "<ul class=\"unexplained\">{items}</ul>");
        }
    }
    out.push_str("</section>");
    out
}

/// Cost and tokens by role (workers by name) and by model, from the sessions.
fn costs(v: &JobView) -> String {
    let mut by_role: BTreeMap<String, (usize, u64, Option<f64>)> = BTreeMap::new();
    let mut by_model: BTreeMap<String, (usize, u64, Option<f64>)> = BTreeMap::new();
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
    let table = |caption: &str, head: &str, rows: &BTreeMap<String, (usize, u64, Option<f64>)>| {
        let body: String = rows
            .iter()
            .map(|(k, (turns, tokens, cost))| {
                format!(
                    "<tr><td>{}</td><td class=\"num\">{turns}</td><td class=\"num\">{tokens}</td><td class=\"num\">{}</td></tr>",
                    esc(k),
                    money(*cost)
                )
            })
            .collect();
        format!(
            "<table class=\"costs\"><caption>{caption}</caption><thead><tr><th scope=\"col\">{head}</th><th scope=\"col\" class=\"num\">Turns</th>\
             <th scope=\"col\" class=\"num\">Tokens</th><th scope=\"col\" class=\"num\">Cost (est.)</th></tr></thead><tbody>{body}</tbody></table>"
        )
    };
    format!(
        "<section aria-labelledby=\"cost-h\"><h2 id=\"cost-h\">Cost</h2><div class=\"two\">{}{}</div></section>",
        table("By role", "Role", &by_role),
        table("By model", "Model", &by_model)
    )
}

/// Every session's turns, context, cache rate and tool surface (resident
/// tools with their cost, deferred, loaded with their trigger, misses).
fn sessions_table(v: &JobView) -> String {
    let mut out = format!(
        "<section aria-labelledby=\"ss-h\"><details{}><summary><h2 id=\"ss-h\">Sessions ({}): cache and tool surface</h2></summary>",
        if v.context.sessions.len() <= 12 { " open" } else { "" },
        v.context.sessions.len()
    );
    out.push_str(&providers_line(v));
    out.push_str("<table><thead><tr><th scope=\"col\">Session</th><th scope=\"col\">Role</th><th scope=\"col\">Provider</th>\
                  <th scope=\"col\">Turns</th><th scope=\"col\">Context</th><th scope=\"col\">Cache rate</th><th scope=\"col\">Resident tools (tokens)</th>\
                  <th scope=\"col\">Deferred</th><th scope=\"col\">Loaded (trigger)</th><th scope=\"col\">Search misses</th></tr></thead><tbody>");
    for s in &v.context.sessions {
        let resident: Vec<String> = s.resident.iter().map(|t| format!("{} ({})", esc(&t.name), t.tokens)).collect();
        let loaded: Vec<String> = s.loaded.iter().map(|(t, why)| format!("{} ({})", esc(t), esc(why))).collect();
        let _ = write!(
            out,
            "<tr><td><a href=\"/jobs/{job}/sessions/{id}\">{label}</a></td><td>{role}</td><td>{provider}</td><td class=\"num\">{turns}</td>\
             <td class=\"num\">{ctx}</td><td class=\"num\">{rate}</td><td>{res}</td><td class=\"num\">{def}</td><td>{loaded}</td><td>{miss}</td></tr>",
            job = v.job.id,
            id = esc(&s.session),
            label = esc(&s.label),
            role = esc(&s.role),
            provider = esc(&format!("{} · {}", s.provider, s.api.replace('_', " "))),
            turns = s.turns,
            ctx = s.history_tokens,
            rate = pct(s.cache_rate),
            res = resident.join(", "),
            def = s.deferred.len(),
            loaded = loaded.join(", "),
            miss = esc(&s.search_misses.join(", ")),
        );
    }
    out.push_str("</tbody></table></details></section>");
    out
}

/// Each provider's cache reads under its own rule, when the job used more than one API.
fn providers_line(v: &JobView) -> String {
    if v.context.providers.len() < 2 {
        return String::new();
    }
    let items: String = v
        .context
        .providers
        .iter()
        .map(|p| {
            format!(
                "<li>{} · {}: {} session(s), cache read {} of {} input tokens ({}) — {}</li>",
                esc(&p.provider),
                esc(&p.api.replace('_', " ")),
                p.sessions,
                p.usage.cache_read_input_tokens,
                p.usage.context_tokens(),
                pct(p.cache_rate),
                esc(&p.cache_rule)
            )
        })
        .collect();
    format!("<ul class=\"providers\" aria-label=\"providers\">{items}</ul>")
}

fn workflow_section(v: &JobView) -> String {
    let lines = v.record.lines();
    if lines.is_empty() {
        return String::new();
    }
    let items: String = lines.iter().map(|l| format!("<li>{}</li>", esc(l.trim()))).collect();
    format!("<section aria-labelledby=\"wf-h\"><h2 id=\"wf-h\">Workflow</h2><ul>{items}</ul></section>")
}

fn actions(c: &Console, v: &JobView) -> String {
    if !is_live(v.job.state) {
        return String::new();
    }
    let job = v.job.id;
    let csrf = &c.inner.csrf;
    let mut out = format!(
        "<section class=\"actions\" aria-labelledby=\"act-h\"><h2 id=\"act-h\">Actions</h2>\
         <form method=\"post\" action=\"/jobs/{job}/cancel\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label>Reason <input name=\"reason\" placeholder=\"optional\"></label>\
         <button type=\"submit\" class=\"danger\" id=\"cancel\">Cancel job</button></form>\
         <form method=\"post\" action=\"/jobs/{job}/interrupt\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label>Message <input name=\"message\" required></label><button type=\"submit\">Send to the coordinator</button></form>"
    );
    for (id, question, options) in &v.pending {
        let opts: String = options
            .iter()
            .enumerate()
            .map(|(i, o)| {
                format!("<button type=\"submit\" name=\"option\" value=\"{}\">{}. {}</button>", i + 1, i + 1, esc(o))
            })
            .collect();
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/jobs/{job}/answer\" class=\"question\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <input type=\"hidden\" name=\"question\" value=\"{qid}\"><p><strong>Question:</strong> {q}</p>{opts}\
             <label>Or in words <input name=\"text\"></label><button type=\"submit\">Answer</button></form>",
            qid = esc(id),
            q = esc(question),
        );
    }
    out.push_str("</section>");
    out
}

fn files_section(v: &JobView) -> String {
    if v.files.is_empty() {
        return String::new();
    }
    let job = v.job.id;
    let items: String = v
        .files
        .iter()
        .map(|(p, size)| {
            format!(
                "<li><a href=\"/jobs/{job}/files/{p}\">{p}</a> <span class=\"sub\">{size} B</span> \
                 <a href=\"/jobs/{job}/files/{p}?download=1\" aria-label=\"download {p}\">download</a></li>",
                p = esc(p)
            )
        })
        .collect();
    format!(
        "<section aria-labelledby=\"wb-h\"><h2 id=\"wb-h\">Workbench</h2><ul class=\"files\">{items}</ul></section>"
    )
}

/// What a live refresh of the job page replaces: the header, the actions,
/// the context meter and the task tree.
fn live_parts(c: &Console, v: &JobView, now: i64) -> String {
    format!("{}{}{}{}", job_header(c, v, now), actions(c, v), context_meter(c, v), task_tree(v))
}

async fn job_page(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(job): Path<String>,
    Query(q): Query<JobQuery>,
) -> Response {
    if let Err(r) = c.check(&headers) {
        return *r;
    }
    let job = match parse_job(&job) {
        Ok(j) => j,
        Err(r) => return *r,
    };
    let mut v = match load_job(&c, job).await {
        Ok(v) => v,
        Err(e) => return error::page(e),
    };
    v.timeline_from = q.tasks.min(v.tasks.len().saturating_sub(1));
    let now = now_ms();
    if q.fragment == "live" {
        return html(StatusCode::OK, live_parts(&c, &v, now));
    }
    let body = format!(
        "<main class=\"job\" data-job=\"{id}\" data-live=\"/jobs/{id}/live\" data-state=\"{state}\">\
         <div id=\"live\">{live}</div>{workflow}{costs}{sessions}{files}\
         <section aria-labelledby=\"ev-h\"><h2 id=\"ev-h\">Events <span class=\"sub\" id=\"ev-status\">connecting…</span></h2>\
         <ol class=\"events\" id=\"events\" aria-live=\"polite\"></ol></section></main>",
        id = v.job.id,
        state = v.job.state.as_str(),
        live = live_parts(&c, &v, now),
        workflow = workflow_section(&v),
        costs = costs(&v),
        sessions = sessions_table(&v),
        files = files_section(&v),
    );
    html(StatusCode::OK, layout(&v.job.name, &body))
}

#[derive(Deserialize, Default)]
struct LiveQuery {
    #[serde(default)]
    after: i64,
}

/// The job's events as server-sent events (`id` = the event's number), from
/// `Last-Event-ID` (a reconnect) or `after`; ends once the job has ended and
/// every event is sent.
async fn job_live(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(job): Path<String>,
    Query(q): Query<LiveQuery>,
) -> Response {
    if let Err(r) = c.check(&headers) {
        return *r;
    }
    let job = match parse_job(&job) {
        Ok(j) => j,
        Err(r) => return *r,
    };
    if let Err(e) = c.store().get_job(job).await {
        return error::page(e);
    }
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i64>().ok());
    let mut cursor = resume.unwrap_or(q.after).max(0);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut notices = c.inner.notifier.as_ref().map(|n| n.subscribe());
        loop {
            let page = match c.store().events(job, cursor, 500).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "console: events not read");
                    Vec::new()
                }
            };
            for e in &page {
                cursor = e.seq;
                let data = serde_json::json!({"seq": e.seq, "at": e.at, "kind": e.kind.name(), "payload": e.kind});
                let ev = SseEvent::default().id(e.seq.to_string()).event("job").data(data.to_string());
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            if page.len() == 500 {
                continue;
            }
            let ended = c.store().get_job(job).await.map(|j| j.state.is_terminal()).unwrap_or(false);
            if ended && c.store().events(job, cursor, 1).await.map(|p| p.is_empty()).unwrap_or(true) {
                let _ = tx.send(Ok(SseEvent::default().event("end").data("ended"))).await;
                return;
            }
            wait_for_change(&mut notices, Some(job), &tx).await;
            if tx.is_closed() {
                return;
            }
        }
    });
    sse(rx)
}

// ------------------------------------------------------------------ transcripts

#[derive(Deserialize, Default)]
struct TranscriptQuery {
    /// The first entry shown (its number); 0 from the top.
    #[serde(default)]
    from: i64,
    /// `pruned`: what a resumed session would be fed, and each rule's change.
    #[serde(default)]
    view: String,
}

fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let kept: String = text.chars().take(max).collect();
    format!("{kept}… [{} more characters]", text.chars().count() - max)
}

/// The markers of an entry, made visible.
fn markers(e: &Entry) -> String {
    let mut out = String::new();
    let m = &e.markers;
    if let Some(kind) = &m.denial_kind {
        let _ = write!(out, "<span class=\"marker marker-denied\">denied: {}</span>", esc(kind));
    }
    if m.synthetic_error {
        out.push_str("<span class=\"marker marker-synthetic\">synthetic error</span>");
    }
    if m.interrupted {
        out.push_str("<span class=\"marker marker-interrupted\">interrupted</span>");
    }
    if m.ephemeral == Some(true) {
        out.push_str("<span class=\"marker marker-ephemeral\">ephemeral</span>");
    }
    if !m.loaded_tools.is_empty() {
        let _ = write!(out, "<span class=\"marker marker-loaded\">loaded: {}</span>", esc(&m.loaded_tools.join(", ")));
    }
    let text = entry_text(e);
    if let Some(at) = text.find("spilled to .flower/") {
        let pointer: String =
            text[at + "spilled to ".len()..].chars().take_while(|c| !c.is_whitespace() && *c != ']').collect();
        let _ = write!(out, "<span class=\"marker marker-spilled\">spilled → {}</span>", esc(&pointer));
    }
    out
}

fn entry_text(e: &Entry) -> String {
    let mut out = String::new();
    for b in &e.content {
        match b {
            ContentBlock::Text { text } => out.push_str(text),
            ContentBlock::ToolResult { content, .. } => {
                out.push_str(&flower_model::content::result_text(content));
            }
            _ => {}
        }
    }
    out
}

fn render_entry(out: &mut String, e: &Entry, changed: Option<&str>) {
    let kind = e.kind.as_str();
    let _ = write!(
        out,
        "<article class=\"entry entry-{kind}{}\" id=\"e{seq}\"><header><span class=\"seq\">#{seq}</span> <strong>{kind}</strong>{tool}{markers}{change}</header>",
        if changed.is_some() { " changed" } else { "" },
        seq = e.seq,
        tool = e.tool_name.as_deref().map(|t| format!(" <code>{}</code>", esc(t))).unwrap_or_default(),
        markers = markers(e),
        change = changed.map(|c| format!("<span class=\"marker marker-pruned\">{}</span>", esc(c))).unwrap_or_default(),
    );
    let text = entry_text(e);
    if !text.is_empty() {
        let _ = write!(out, "<pre>{}</pre>", esc(&cut(&text, SHOWN_CHARS)));
    }
    for (_, name, input) in e.tool_uses() {
        let _ = write!(
            out,
            "<div class=\"call\"><code>{}</code> <pre>{}</pre></div>",
            esc(name),
            esc(&cut(&input.to_string(), 1500))
        );
    }
    out.push_str("</article>");
}

async fn transcript_page(
    State(c): State<Console>,
    headers: HeaderMap,
    Path((job, session)): Path<(String, String)>,
    Query(q): Query<TranscriptQuery>,
) -> Response {
    if let Err(r) = c.check(&headers) {
        return *r;
    }
    let job = match parse_job(&job) {
        Ok(j) => j,
        Err(r) => return *r,
    };
    let Ok(session) = session.parse::<SessionId>() else {
        return problem(StatusCode::BAD_REQUEST, "not a session id");
    };
    let store = c.store();
    let (found, sessions) = match tokio::try_join!(store.get_job(job), store.sessions(job)) {
        Ok(x) => x,
        Err(e) => return error::page(e),
    };
    let Some(s) = sessions.iter().find(|s| s.id == session) else {
        return problem(StatusCode::NOT_FOUND, "no such session in this job");
    };
    let pruned = q.view == "pruned";
    let mut out = format!(
        "<main><p><a href=\"/jobs/{job}\">← {name}</a></p><h1>{label} <span class=\"role\">{role}</span></h1>\
         <nav class=\"tabs\" aria-label=\"views\"><a href=\"?view=raw\"{raw_cur}>Raw</a><a href=\"?view=pruned\"{pr_cur}>Pruned (as a resume sees it)</a></nav>",
        name = esc(&found.name),
        label = esc(&s.label),
        role = s.role.as_str(),
        raw_cur = if pruned { "" } else { " aria-current=\"page\"" },
        pr_cur = if pruned { " aria-current=\"page\"" } else { "" },
    );
    if pruned {
        let stored = match store.entries(session, 0, u32::MAX).await {
            Ok(e) => e,
            Err(e) => return error::page(e),
        };
        let total = stored.len();
        let opts = JobSpec::from_value(found.spec.clone()).map(|s| s.runtime.pruning).unwrap_or_default();
        let p = flower_store::prune::prune(stored, &opts, &flower_agent::glance::allows);
        let by_entry: BTreeMap<uuid::Uuid, String> =
            p.changes.iter().map(|ch| (ch.entry, format!("{}: {}", ch.rule, ch.detail))).collect();
        let _ = write!(
            out,
            "<p>{} stored entries → {} fed to a resumed session; {} change(s).</p><table><caption>What each rule changed</caption>\
             <thead><tr><th scope=\"col\">Rule</th><th scope=\"col\">Entry</th><th scope=\"col\">Detail</th></tr></thead><tbody>",
            total,
            p.entries.len(),
            p.changes.len()
        );
        for ch in &p.changes {
            let _ = write!(
                out,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                ch.rule,
                ch.entry,
                esc(&ch.detail)
            );
        }
        out.push_str("</tbody></table>");
        for e in p.entries.iter().take(ENTRIES_PAGE as usize * 5) {
            render_entry(&mut out, e, by_entry.get(&e.uuid).map(String::as_str));
        }
    } else {
        let from = q.from.max(0);
        let entries = match store.entries(session, from, ENTRIES_PAGE).await {
            Ok(e) => e,
            Err(e) => return error::page(e),
        };
        let last = entries.last().map(|e| e.seq);
        for e in &entries {
            render_entry(&mut out, e, None);
        }
        if entries.is_empty() {
            out.push_str("<p class=\"empty\">No entries.</p>");
        }
        if let (Some(last), true) = (last, entries.len() == ENTRIES_PAGE as usize) {
            let _ = write!(
                out,
                "<nav class=\"pager\"><a href=\"?view=raw&amp;from={last}\" rel=\"next\">later entries →</a></nav>"
            );
        }
    }
    out.push_str("</main>");
    html(StatusCode::OK, layout(&s.label, &out))
}

// ------------------------------------------------------------------ files

#[derive(Deserialize, Default)]
struct FileQuery {
    #[serde(default)]
    download: u8,
}

async fn file(
    State(c): State<Console>,
    headers: HeaderMap,
    Path((job, path)): Path<(String, String)>,
    Query(q): Query<FileQuery>,
) -> Response {
    if let Err(r) = c.check(&headers) {
        return *r;
    }
    let job = match parse_job(&job) {
        Ok(j) => j,
        Err(r) => return *r,
    };
    let bytes = match c.inner.app.artifact(job, &path).await {
        Ok(b) => b,
        Err(e) => return error::page(e),
    };
    let text = std::str::from_utf8(&bytes).is_ok();
    let kind = if text { "text/plain; charset=utf-8" } else { "application/octet-stream" };
    let mut r = (StatusCode::OK, bytes).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("default-src 'none'; sandbox"));
    if q.download == 1 || !text {
        let name: String = path
            .rsplit('/')
            .next()
            .unwrap_or("file")
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || ".-_".contains(*c))
            .collect();
        if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
            h.insert(header::CONTENT_DISPOSITION, v);
        }
    }
    r
}

// ------------------------------------------------------------------ actions

#[derive(Deserialize)]
struct CancelForm {
    csrf: String,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
struct MessageForm {
    csrf: String,
    message: String,
}

#[derive(Deserialize)]
struct AnswerForm {
    csrf: String,
    question: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    option: Option<u32>,
}

/// The checks every action runs: the token, the CSRF value, the job id.
fn action_guard(c: &Console, headers: &HeaderMap, csrf: &str, job: &str) -> Result<JobId, Box<Response>> {
    c.check(headers)?;
    if !c.csrf_ok(csrf) {
        let why = "this form is stale or not the console's (CSRF check): reload the page";
        return Err(Box::new(problem(StatusCode::FORBIDDEN, why)));
    }
    parse_job(job)
}

async fn cancel(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(job): Path<String>,
    Form(f): Form<CancelForm>,
) -> Response {
    let job = match action_guard(&c, &headers, &f.csrf, &job) {
        Ok(j) => j,
        Err(r) => return *r,
    };
    let reason = if f.reason.trim().is_empty() { "cancelled from the console" } else { f.reason.as_str() };
    match c.inner.app.cancel(&job.to_string(), reason).await {
        Ok(_) => redirect(&format!("/jobs/{job}")),
        Err(e) => error::page(e),
    }
}

async fn interrupt(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(job): Path<String>,
    Form(f): Form<MessageForm>,
) -> Response {
    let job = match action_guard(&c, &headers, &f.csrf, &job) {
        Ok(j) => j,
        Err(r) => return *r,
    };
    match c.inner.app.interrupt(&job.to_string(), &f.message).await {
        Ok(_) => redirect(&format!("/jobs/{job}")),
        Err(e) => error::page(e),
    }
}

async fn answer(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(job): Path<String>,
    Form(f): Form<AnswerForm>,
) -> Response {
    let job = match action_guard(&c, &headers, &f.csrf, &job) {
        Ok(j) => j,
        Err(r) => return *r,
    };
    let answer = AnswerRequest { question_id: f.question, text: f.text, option: f.option.unwrap_or(0) };
    match c.inner.app.answer(&job.to_string(), answer).await {
        Ok(_) => redirect(&format!("/jobs/{job}")),
        Err(e) => error::page(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_cut() {
        assert_eq!(esc("<script>\"x\" & 'y'</script>"), "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt;");
        assert_eq!(cut("abcdef", 3), "abc… [3 more characters]");
        assert_eq!(cut("abc", 3), "abc");
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd") && !same("abc", "ab") && !same("", "a"));
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_static("a=1; flower_console=xyz; b=2"));
        assert_eq!(cookie(&h, COOKIE).as_deref(), Some("xyz"));
        assert_eq!(cookie(&h, "c"), None);
    }
}
