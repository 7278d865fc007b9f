//! The web console (docs/design.md section 14): jobs, the live task tree,
//! transcripts raw and pruned, the context meter, the tool surface, the
//! workbench, and the user's actions (cancel, message, answer). Served by a
//! coordinator on `--http-listen` and by `flower ui` over the embedded
//! store; server-rendered HTML, a little JavaScript, server-sent events,
//! charts as SVG, every asset in the binary.
//!
//! An adapter over the application layer ([`App`]): a route translates its
//! form or query into an `App` call or a read, and renders what comes back.
//! Pages are built with maud's `html!`, which escapes every value it is
//! given: job content is never trusted, and a content security policy
//! allows only the console's own script.
//!
//! # Layout
//! - `auth`: the one sign-in and CSRF scheme every route and action runs
//! - `error`: the one map of refusals and errors to HTTP statuses
//! - `routes`: one module per page or action (jobs, job, live, transcript,
//!   file, actions, login)
//! - `views`: the pieces pages are made of (layout, badges, the insights
//!   strip, the job page's sections, the task tree, the charts)
//! - `profile`: what the insights strip adds up across jobs
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use flower_bus::Notifier;
use flower_coordinator::app::App;
use flower_coordinator::context::CacheAudits;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

mod auth;
mod error;
mod profile;
mod routes;
mod views;

/// Jobs the list reads at most (newest first); filters and pages apply within them.
pub const LIST_WINDOW: u32 = 1000;
/// Jobs on one page of the list.
pub const PAGE: usize = 50;
/// Transcript entries on one page.
pub const ENTRIES_PAGE: u32 = 200;
const CSS: &str = include_str!("console.css");
const JS: &str = include_str!("console.js");

/// The console over a store, the objects (workbenches) and, when there is
/// one, the notifier whose notices make pages live (else they poll).
#[derive(Clone)]
pub struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    app: App,
    notifier: Option<Arc<dyn Notifier>>,
    /// Signed-in sessions, CSRF values and failed sign-ins.
    auth: auth::Auth,
    /// Ended jobs' cost by role and model, latency and TTFT (the insights strip).
    profiles: profile::Profiles,
    /// Who can audit an ended job's prompt cache when none was kept.
    audits: Option<Arc<dyn CacheAudits>>,
}

impl Console {
    /// The console over `app`, whose credentials it asks for (none: an
    /// open console); `notifier`'s notices make pages live (else they poll).
    pub fn new(app: App, notifier: Option<Arc<dyn Notifier>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                app,
                notifier,
                auth: auth::Auth::default(),
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
        use routes::{actions, file, job, jobs, live, login, transcript};
        Router::new()
            .route("/", get(jobs::page))
            .route("/login", get(login::page).post(login::sign_in))
            .route("/logout", post(login::sign_out))
            .route("/static/console.css", get(|| async { asset("text/css; charset=utf-8", CSS) }))
            .route("/static/console.js", get(|| async { asset("text/javascript; charset=utf-8", JS) }))
            .route("/live/jobs", get(live::jobs))
            .route("/jobs/{job}", get(job::page))
            .route("/jobs/{job}/live", get(live::job))
            .route("/jobs/{job}/sessions/{session}", get(transcript::page))
            .route("/jobs/{job}/files/{*path}", get(file::file))
            .route("/jobs/{job}/cancel", post(actions::cancel))
            .route("/jobs/{job}/interrupt", post(actions::interrupt))
            .route("/jobs/{job}/answer", post(actions::answer))
            .with_state(self)
    }

    /// Serve on `listener` until `shutdown`.
    pub fn serve(self, listener: TcpListener, shutdown: CancellationToken) {
        let app = self.router();
        tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
            let served = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "console stopped");
            }
        });
    }

    fn app(&self) -> &App {
        &self.inner.app
    }

    fn auth(&self) -> &auth::Auth {
        &self.inner.auth
    }
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "max-age=300")], body).into_response()
}
