//! The distributed processes' metrics endpoint: `GET /metrics` on a port of
//! its own (`--metrics-listen`), apart from the API so it can stay inside the
//! cluster's network, in the Prometheus text format.

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use flower_agent::metrics::{CONTENT_TYPE, metrics};
use flower_store::Store;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serve `/metrics` on `listener` until `shutdown`. With a store, the jobs
/// gauge is counted from it at each scrape (one aggregate query); a store
/// that cannot answer leaves the last counts in place.
pub fn serve(listener: TcpListener, store: Option<Arc<dyn Store>>, shutdown: CancellationToken) {
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let store = store.clone();
            async move {
                if let Some(store) = store {
                    match store.job_counts().await {
                        Ok(counts) => metrics().set_job_counts(&counts),
                        Err(e) => tracing::warn!(error = %e, "jobs not counted for metrics"),
                    }
                }
                ([(header::CONTENT_TYPE, CONTENT_TYPE)], metrics().encode()).into_response()
            }
        }),
    );
    tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "metrics endpoint stopped");
        }
    });
}
