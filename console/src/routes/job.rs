//! `/jobs/ID`: one job's page — everything it shows read once into a
//! [`JobView`], then rendered by `views::job`, `views::tree` and
//! `views::charts`. With `fragment=live`, only the parts a live refresh
//! replaces (header, actions, context meter, task tree).

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use flower_coordinator::app::AppError;
use flower_coordinator::context::{ContextReport, audit_key};
use flower_model::audit::CacheAudit;
use flower_model::{Job, JobSpec, Session, Task, TaskId, now_ms};
use maud::{Markup, display, html};
use object_store::ObjectStoreExt;
use serde::Deserialize;

use crate::Console;
use crate::auth::Signed;
use crate::error::Refusal;
use crate::views::{charts, job as parts, layout, tree};

#[derive(Deserialize, Default)]
pub struct JobQuery {
    /// `live`: only the parts a live refresh replaces.
    #[serde(default)]
    fragment: String,
    /// The first task the timeline draws (it draws [`charts::TIMELINE_TASKS`] at a time).
    #[serde(default)]
    tasks: usize,
}

/// Everything the job page shows, read once.
pub struct JobView {
    /// The timeline's first task (the page's `tasks`).
    pub timeline_from: usize,
    pub job: Job,
    /// The main thread's window and thresholds, when the spec reads.
    pub limits: Option<Limits>,
    pub tasks: Vec<Task>,
    pub sessions: Vec<Session>,
    pub record: flower_coordinator::record::Record,
    pub context: ContextReport,
    /// Questions waiting for the user: (id, question, options).
    pub pending: Vec<(String, String, Vec<String>)>,
    /// The workbench's files: (path, size).
    pub files: Vec<(String, u64)>,
    /// Each task's attempts.
    pub attempts: BTreeMap<TaskId, Vec<Attempt>>,
    /// The simulator's cache audit of the run, when one was kept.
    pub audit: Option<CacheAudit>,
}

/// The model's context window and the handoff's thresholds, in tokens.
pub struct Limits {
    pub window: u64,
    pub warn: u64,
    pub handoff: u64,
}

pub use flower_coordinator::app::views::Attempt;

pub async fn page(
    s: Signed,
    State(c): State<Console>,
    Path(job): Path<String>,
    Query(q): Query<JobQuery>,
) -> Result<Response, Refusal> {
    let job = s.app.job("job_id", &job).await?;
    let mut v = load(&c, job).await?;
    v.timeline_from = q.tasks.min(v.tasks.len().saturating_sub(1));
    let now = now_ms();
    let csrf = s.csrf.as_str();
    if q.fragment == "live" {
        return Ok(layout::respond(StatusCode::OK, live_parts(&v, csrf, now)));
    }
    let id = v.job.id;
    let body = html! {
        main class="job" data-job=(display(id)) data-live={ "/jobs/" (display(id)) "/live" }
            data-state=(v.job.state.as_str()) {
            div id="live" { (live_parts(&v, csrf, now)) }
            (parts::workflow(&v))
            (parts::costs(&v))
            (parts::sessions(&v))
            (parts::files(&v))
            section aria-labelledby="ev-h" {
                h2 id="ev-h" { "Events " span class="sub" id="ev-status" { "connecting…" } }
                ol class="events" id="events" aria-live="polite" {}
            }
        }
    };
    Ok(layout::respond(StatusCode::OK, layout::document(&v.job.name, body)))
}

/// What a live refresh of the job page replaces: the header, the actions,
/// the context meter and the task tree.
fn live_parts(v: &JobView, csrf: &str, now: i64) -> Markup {
    html! {
        (parts::header(v, now))
        (parts::actions(v, csrf))
        (charts::context_meter(v))
        (tree::task_tree(v, now))
    }
}

/// Everything the page shows of `job`.
async fn load(c: &Console, job: Job) -> Result<JobView, AppError> {
    let app = c.app();
    let limits = JobSpec::from_value(job.spec.clone()).ok().map(|s| {
        let windows = c.app().windows();
        let (warn, handoff) = s.runtime.handoff.thresholds(&s.model, windows);
        Limits { window: s.runtime.handoff.window_for(&s.model, windows), warn, handoff }
    });
    let (tasks, sessions, record, context, pending, attempts) = tokio::try_join!(
        app.tasks(job.id),
        app.sessions(job.id),
        app.workflow(job.id),
        app.context(job.id),
        app.pending_questions(job.id),
        app.attempts(job.id),
    )?;
    let files = app.artifacts(job.id).await.unwrap_or_default();
    let audit = audit(c, &job, &sessions, &context).await;
    Ok(JobView { timeline_from: 0, job, limits, tasks, sessions, record, context, pending, files, attempts, audit })
}

/// The cache audit kept beside the job; for an ended job without one, the
/// one whoever can audit makes, then kept.
async fn audit(c: &Console, job: &Job, sessions: &[Session], context: &ContextReport) -> Option<CacheAudit> {
    let objects = c.app().objects();
    let kept = match objects.get(&audit_key(job.id)).await {
        Ok(got) => got.bytes().await.ok().and_then(|b| serde_json::from_slice(&b).ok()),
        Err(_) => None,
    };
    if kept.is_some() || !job.state.is_terminal() {
        return kept;
    }
    let audits = c.inner.audits.as_ref()?;
    let ids: Vec<String> = sessions.iter().map(|s| s.id.to_string()).collect();
    let made = audits.audit(&ids, &context.rewrites()).await?;
    if let Ok(body) = serde_json::to_vec(&made)
        && let Err(e) = objects.put(&audit_key(job.id), object_store::PutPayload::from(body)).await
    {
        tracing::warn!(error = %e, "the cache audit was not kept");
    }
    Some(made)
}
