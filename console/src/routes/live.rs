//! The server-sent event streams that make pages live: `/live/jobs` says
//! when the list's rows may have changed, `/jobs/ID/live` streams a job's
//! events. Each waits on the notifier's notices when there is one, else
//! polls every 2 s.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use flower_bus::{Heard, Notice, NoticeStream};
use flower_model::JobId;
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::auth::Signed;
use crate::error::Refusal;
use crate::{Console, PAGE};

type Sender = mpsc::Sender<Result<SseEvent, Infallible>>;

/// Events one read of a job's stream takes.
const EVENTS_READ: u32 = 500;

/// Server-sent `changed` events whenever a job's row may have changed (a
/// notice, or every 2 s without a notifier); the page refreshes its rows.
pub async fn jobs(s: Signed, State(c): State<Console>) -> Response {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut notices = c.inner.notifier.as_ref().map(|n| n.subscribe());
        let mut last = String::new();
        loop {
            let now = match s.app.list(PAGE as u32).await {
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

#[derive(Deserialize, Default)]
pub struct LiveQuery {
    /// The last event the page has (without `Last-Event-ID`).
    #[serde(default)]
    after: i64,
}

/// The job's events as server-sent events (`id` = the event's number), from
/// `Last-Event-ID` (a reconnect) or `after`; ends once the job has ended and
/// every event is sent.
pub async fn job(
    s: Signed,
    State(c): State<Console>,
    headers: HeaderMap,
    Path(job): Path<String>,
    Query(q): Query<LiveQuery>,
) -> Result<Response, Refusal> {
    let job = s.app.job_id("job_id", &job).await?;
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i64>().ok());
    let cursor = resume.unwrap_or(q.after).max(0);
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(follow(c, s.app, job, cursor, tx));
    Ok(sse(rx))
}

/// Send `job`'s events after `cursor` until the job has ended and all are sent.
async fn follow(c: Console, app: flower_coordinator::app::App, job: JobId, mut cursor: i64, tx: Sender) {
    let mut notices = c.inner.notifier.as_ref().map(|n| n.subscribe());
    loop {
        let page = match c.app().events(job, cursor, EVENTS_READ).await {
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
        if page.len() == EVENTS_READ as usize {
            continue;
        }
        let ended = app.get(job).await.map(|j| j.state.is_terminal()).unwrap_or(false);
        if ended && c.app().events(job, cursor, 1).await.map(|p| p.is_empty()).unwrap_or(true) {
            let _ = tx.send(Ok(SseEvent::default().event("end").data("ended"))).await;
            return;
        }
        wait_for_change(&mut notices, Some(job), &tx).await;
        if tx.is_closed() {
            return;
        }
    }
}

/// Until a notice (of `job`, when given), at most 2 s.
async fn wait_for_change(notices: &mut Option<NoticeStream>, job: Option<JobId>, tx: &Sender) {
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

fn sse(rx: mpsc::Receiver<Result<SseEvent, Infallible>>) -> Response {
    let mut r = Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
