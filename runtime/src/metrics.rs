//! The distributed processes' metrics endpoint: `GET /metrics` on a port of
//! its own (`--metrics-listen`), apart from the API so it can stay inside the
//! cluster's network. A scraper that asks for OpenMetrics (Prometheus does)
//! gets it; any other client (curl, `promtool check metrics`) gets the
//! Prometheus text format 0.0.4, translated from it by [`prometheus_text`].

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderMap, header};
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
        get(move |headers: HeaderMap| {
            let store = store.clone();
            async move {
                if let Some(store) = store {
                    match store.job_counts().await {
                        Ok(counts) => metrics().set_job_counts(&counts),
                        Err(e) => tracing::warn!(error = %e, "jobs not counted for metrics"),
                    }
                    namespace_spend(store.as_ref()).await;
                    match store.route_quotas().await {
                        Ok(routes) => metrics().set_routes(&routes, flower_model::now_ms()),
                        Err(e) => tracing::warn!(error = %e, "routes' rate limits not read for metrics"),
                    }
                }
                let text = metrics().encode();
                let openmetrics = headers
                    .get_all(header::ACCEPT)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .any(|v| v.contains("application/openmetrics-text"));
                if openmetrics {
                    ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
                } else {
                    ([(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)], prometheus_text(&text)).into_response()
                }
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

/// Each namespace's spend of the day and month, its cost limits and its
/// tasks, from the store (queries per namespace; each job's price read once).
async fn namespace_spend(store: &dyn Store) {
    let namespaces = match store.namespaces().await {
        Ok(n) => n,
        Err(e) => return tracing::warn!(error = %e, "namespaces not read for metrics"),
    };
    for ns in namespaces {
        match flower_agent::spend::tally(store, &ns.name).await {
            Ok(spent) => metrics().set_namespace_spend(&ns.name, &spent, &ns.limits),
            Err(e) => tracing::warn!(namespace = %ns.name, error = %e, "spend not read for metrics"),
        }
        match store.task_counts(&ns.name).await {
            Ok(tasks) => metrics().set_namespace_tasks(&ns.name, tasks),
            Err(e) => tracing::warn!(namespace = %ns.name, error = %e, "tasks not counted for metrics"),
        }
    }
}

/// The Prometheus text format's media type.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// OpenMetrics text (as `prometheus-client` writes it) in the Prometheus text
/// format 0.0.4: a counter's `HELP`/`TYPE` name its `_total` samples, `UNIT`
/// lines and the `# EOF` terminator go, `unknown` becomes `untyped`. Samples
/// are the same in both formats.
pub fn prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name_out, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "unknown" => (name.to_string(), "untyped"),
                k => (name.to_string(), k),
            };
            if let Some((h, text)) = help.take()
                && h == name
            {
                out.push_str(&format!("# HELP {name_out} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name_out} {kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_counters_become_total_families_in_the_text_format() {
        let om = "# HELP flower_tasks Task attempts.\n# TYPE flower_tasks counter\n\
                  flower_tasks_total{outcome=\"started\"} 3\n\
                  # HELP flower_task_duration_seconds Task time.\n# TYPE flower_task_duration_seconds histogram\n\
                  # UNIT flower_task_duration_seconds seconds\n\
                  flower_task_duration_seconds_sum 1.5\nflower_task_duration_seconds_count 2\n\
                  flower_task_duration_seconds_bucket{le=\"+Inf\"} 2\n\
                  # HELP flower_worker_slots Slots.\n# TYPE flower_worker_slots gauge\nflower_worker_slots 4\n# EOF\n";
        let text = prometheus_text(om);
        assert_eq!(
            text,
            "# HELP flower_tasks_total Task attempts.\n# TYPE flower_tasks_total counter\n\
             flower_tasks_total{outcome=\"started\"} 3\n\
             # HELP flower_task_duration_seconds Task time.\n# TYPE flower_task_duration_seconds histogram\n\
             flower_task_duration_seconds_sum 1.5\nflower_task_duration_seconds_count 2\n\
             flower_task_duration_seconds_bucket{le=\"+Inf\"} 2\n\
             # HELP flower_worker_slots Slots.\n# TYPE flower_worker_slots gauge\nflower_worker_slots 4\n"
        );
    }

    #[test]
    fn every_registered_counter_is_described_under_its_sample_name() {
        let text = prometheus_text(&metrics().encode());
        for line in text.lines().filter(|l| l.starts_with("# TYPE ") && l.ends_with(" counter")) {
            let name = line["# TYPE ".len()..].trim_end_matches(" counter");
            assert!(name.ends_with("_total"), "{line}");
            assert!(text.contains(&format!("# HELP {name} ")), "no help for {name}");
        }
        assert!(!text.contains("# EOF"));
    }
}
