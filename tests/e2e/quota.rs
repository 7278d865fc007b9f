//! A provider route's rate limit shared by a cluster's processes: learnt
//! from the simulator's headers, calls waiting in line for their turn (the
//! most urgent job's first), the wait shown in status and metrics.

use std::time::{Duration, Instant};

use crate::cluster::{Cluster, Options};
use crate::metrics::{scrape, value};
use crate::support::repo;

/// A query's single value.
async fn one<T: for<'a> tokio_postgres::types::FromSql<'a>>(c: &Cluster, q: &str) -> T {
    c.pg().await.query_one(q, &[]).await.unwrap().get(0)
}

/// When `job` succeeded (ms).
async fn ended_at(c: &Cluster, job: &str) -> i64 {
    let q = format!(
        "SELECT max(at) FROM events WHERE job_id = '{job}' AND kind = 'job_state' AND payload->>'state' = 'succeeded'"
    );
    one::<Option<i64>>(c, &q).await.expect("the job ended")
}

/// `flower status JOB --json`.
fn status(c: &mut Cluster, job: &str) -> serde_json::Value {
    let out = c.flower(&["status", job, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_urgent_job_goes_first_on_a_rate_limited_route_and_waiting_is_shown() {
    // Fifteen requests a minute: the first fifteen calls go at once, then
    // one every four seconds. Twelve slots: no call waits for a worker.
    let opts = Options { workers: 1, concurrency: 12, sim_quota_rpm: Some(15), metrics: true, ..Default::default() };
    let mut c = Cluster::start(opts).await;
    let spec = repo().join("tests/fixtures/distributed/fanout.yaml").display().to_string();
    let submit = |c: &mut Cluster, priority: &str| {
        let out = c.flower(&["submit", &spec, "--priority", priority, "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["job_id"].as_str().unwrap().to_string()
    };
    let out = c.flower(&["submit", &spec, "--priority", "9"]);
    assert!(!out.status.success(), "a priority is 1 to 5");

    // Three jobs of the least urgent priority (8 calls each: a fan-out of
    // three tasks) use up the burst...
    let low = [submit(&mut c, "5"), submit(&mut c, "5"), submit(&mut c, "5")];
    // ...until three of their calls wait in line. Status says so, with the
    // route and when each call's turn should come.
    let start = Instant::now();
    let (job, line) = loop {
        let mut lines: Vec<(String, serde_json::Value)> = Vec::new();
        for j in &low {
            let s = status(&mut c, j);
            for l in s["waiting_for_quota"].as_array().cloned().unwrap_or_default() {
                assert_eq!(s["state"], "running", "a job held back by the route is running, not stalled: {l}");
                lines.push((j.clone(), l));
            }
        }
        if lines.len() >= 3 {
            // The last in line: its turn is two turns (8 s) away at least.
            break lines.into_iter().max_by_key(|(_, l)| l["turn_at"].as_i64()).unwrap();
        }
        assert!(start.elapsed() < Duration::from_secs(90), "the first jobs' calls did not wait for the route");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(line["route"].as_str().unwrap().starts_with("messages|http://127.0.0.1:"), "{line}");
    assert_eq!(line["priority"], 5, "{line}");
    assert!(line["turn_at"].as_i64().unwrap() >= line["since"].as_i64().unwrap(), "{line}");
    let text = String::from_utf8_lossy(&c.flower(&["status", &job]).stdout).into_owned();
    assert!(
        text.contains("waiting_for_quota: ") && text.contains("priority 5"),
        "the text status shows the wait: {text}"
    );

    // The urgent job comes later and goes first: its first call is told the
    // next turn (one request's refill, 4 s), not the turn after the calls
    // already waiting (12 s and more, first come first served).
    let urgent = submit(&mut c, "1");
    let metrics = c.coordinators[0].metrics_url();
    let mut seen_waiting = false;
    for job in [&urgent, &low[0], &low[1], &low[2]] {
        let q = format!("SELECT state = 'succeeded' FROM jobs WHERE id = '{job}'");
        let deadline = Instant::now() + Duration::from_secs(240);
        while !one::<Option<bool>>(&c, &format!("SELECT ({q})")).await.unwrap_or(false) {
            if !seen_waiting {
                let text = scrape(&metrics).await;
                seen_waiting = text.lines().any(|l| l.starts_with("flower_quota_waiting{") && !l.ends_with(" 0"));
            }
            assert!(Instant::now() < deadline, "job {job} did not succeed");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let first_wait = format!(
        "SELECT (payload->>'wait_ms')::bigint FROM events WHERE job_id = '{urgent}' AND kind = 'waiting_for_quota' ORDER BY seq LIMIT 1"
    );
    let first_wait: i64 = one(&c, &first_wait).await;
    assert!(first_wait <= 8_000, "the urgent job's first call waited for the next turn only: {first_wait} ms");
    let ends = [ended_at(&c, &low[0]).await, ended_at(&c, &low[1]).await, ended_at(&c, &low[2]).await];
    let u = ended_at(&c, &urgent).await;
    assert!(u < *ends.iter().max().unwrap(), "the priority-1 job did not end last: {u} vs {ends:?}");
    assert!(seen_waiting, "the coordinator's metrics showed calls waiting for the route");

    // No call was refused by the simulator: every one waited its turn.
    let retries: i64 = one(&c, "SELECT count(*) FROM events WHERE kind = 'provider_retry'").await;
    assert_eq!(retries, 0, "no 429 was retried");
    let text = scrape(&metrics).await;
    let route = line["route"].as_str().unwrap();
    assert!(value(&text, &format!("flower_quota_admitted_total{{route=\"{route}\"}}")) >= 1.0, "{text}");
    let used = format!("flower_quota_used_ratio{{route=\"{route}\",limit=\"requests\"}}");
    assert!(value(&text, &used) >= 0.0, "the route's use of its limit is a series");
    c.stop().await;
}
