//! Prometheus metrics of the distributed processes (`--metrics-listen`).

use crate::cluster::{Cluster, Options};
use crate::support::repo;

pub(crate) async fn scrape(url: &str) -> String {
    let resp = reqwest::get(url).await.unwrap();
    assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
    resp.text().await.unwrap()
}

/// The value of the series line `name{labels}` (or `name` without labels).
pub(crate) fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no series `{series}` in\n{text}"))
}

/// The sum of every line of the metric `name` (all its label sets).
fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// The demo on 1 coordinator + 2 workers, both roles scraped: tasks succeeded
/// on the workers, model calls (and their cost) on both sides, the jobs gauge
/// from the store, the queue lag on the workers, and no job or task id in any
/// label.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_are_served_by_both_roles() {
    let mut c = Cluster::start(Options { workers: 2, metrics: true, ..Default::default() }).await;
    let out = c.flower(&["submit", repo().join("examples/demo/job.yaml").to_str().unwrap(), "--watch"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "submit --watch: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let job = text.lines().next().unwrap().trim().to_string();
    let pg = c.pg().await;
    let tasks: Vec<String> = pg
        .query(&format!("SELECT id::text FROM tasks WHERE job_id = '{job}'"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!tasks.is_empty());

    let coordinator = scrape(&c.coordinators[0].metrics_url()).await;
    let mut workers = Vec::new();
    for w in &c.workers {
        workers.push(scrape(&w.metrics_url()).await);
    }

    assert_eq!(value(&coordinator, "flower_jobs{namespace=\"default\",state=\"succeeded\"}"), 1.0, "{coordinator}");
    assert_eq!(value(&coordinator, "flower_jobs{namespace=\"default\",state=\"running\"}"), 0.0);
    assert!(value(&coordinator, "flower_lease_takeovers_total") >= 1.0, "{coordinator}");
    assert_eq!(value(&coordinator, "flower_tasks_queued_total"), tasks.len() as f64, "{coordinator}");
    assert!(sum(&coordinator, "flower_model_calls_total") > 0.0, "{coordinator}");
    assert!(sum(&coordinator, "flower_tokens_total") > 0.0, "{coordinator}");
    // What the namespace spent, from the store (the demo's model has a price).
    let spent = value(&coordinator, "flower_namespace_spend_usd{namespace=\"default\",period=\"day\"}");
    assert!(spent > 0.0, "{coordinator}");
    assert!(value(&coordinator, "flower_namespace_spend_usd{namespace=\"default\",period=\"month\"}") >= spent);
    // The job ended: none of its tasks is live or held.
    assert_eq!(value(&coordinator, "flower_namespace_tasks{namespace=\"default\",state=\"held\"}"), 0.0);
    assert_eq!(value(&coordinator, "flower_namespace_tasks{namespace=\"default\",state=\"live\"}"), 0.0);
    assert!(value(&coordinator, "flower_namespace_tokens{namespace=\"default\"}") > 0.0, "{coordinator}");
    assert!(!coordinator.contains("flower_namespace_budget_usd{"), "no limit set, no limit series: {coordinator}");

    let total = |series: &str| workers.iter().map(|w| value_or_zero(w, series)).sum::<f64>();
    assert!(
        total("flower_tasks_total{namespace=\"default\",outcome=\"started\"}") >= tasks.len() as f64,
        "{workers:?}"
    );
    assert!(total("flower_tasks_total{namespace=\"default\",outcome=\"succeeded\"}") > 0.0, "{workers:?}");
    assert!(total("flower_task_duration_seconds_count") > 0.0, "{workers:?}");
    assert!(total("flower_dispatch_seconds_count") > 0.0, "{workers:?}");
    assert!(workers.iter().map(|w| sum(w, "flower_model_calls_total")).sum::<f64>() > 0.0, "{workers:?}");
    for w in &workers {
        assert_eq!(value(w, "flower_worker_slots"), 1.0, "{w}");
        assert_eq!(value(w, "flower_worker_slots_busy"), 0.0, "{w}");
        // Read when the worker started, then every 5 s: present, never negative.
        assert!(value(w, "flower_queue_lag_messages") >= 0.0, "{w}");
    }
    // Unlabelled counters are written from the start, in every process.
    for text in std::iter::once(&coordinator).chain(&workers) {
        assert!(value(text, "flower_spills_total") >= 0.0);
        assert!(value(text, "flower_prunes_total") >= 0.0);
    }
    for text in &workers {
        assert!(value(text, "flower_claims_early_total") >= 0.0);
    }
    // The demo's model has a built-in price: its calls cost something, on both sides.
    if flower_model::spec::builtin_price("claude-sonnet-4-5").is_some() {
        let series = "flower_model_cost_dollars_total{provider=\"sim\",model=\"claude-sonnet-4-5\"}";
        assert!(value(&coordinator, series) > 0.0, "{coordinator}");
        assert!(workers.iter().map(|w| value_or_zero(w, series)).sum::<f64>() > 0.0, "{workers:?}");
    }

    // Low cardinality: no id in any label (ids are UUIDs; look for any
    // hyphenated hex run too, in case a prefix slipped in); namespaces are
    // bounded (an admin makes them).
    for text in std::iter::once(&coordinator).chain(&workers) {
        for id in std::iter::once(&job).chain(&tasks) {
            assert!(!text.contains(id.as_str()) && !text.contains(&id[..8]), "an id in\n{text}");
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some((_, labels)) = line.split_once('{') {
                let labels = labels.split('}').next().unwrap();
                for pair in labels.split(',') {
                    let (k, _) = pair.split_once('=').unwrap();
                    assert!(
                        ["namespace", "state", "outcome", "provider", "model", "kind", "period", "le"].contains(&k),
                        "unexpected label `{k}` in `{line}`"
                    );
                }
            }
        }
    }
    c.stop().await;
}

/// As [`value`], 0 for a series not written yet (a label set never seen).
fn value_or_zero(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}
