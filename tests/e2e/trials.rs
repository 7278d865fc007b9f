//! Fault trials, not in the default run (each takes minutes):
//! `cargo test -p flower-cli --test e2e -- --ignored trial_ --nocapture --test-threads 1`
//! (`FLOWER_TRIAL_SEED` replays a run; `FLOWER_TRIAL_ROUNDS` sets the number
//! of faults per trial, 20 by default).
//!
//! The long-horizon job in distributed mode under one kind of fault at seeded
//! points: a worker killed with SIGKILL while it runs a task, NATS stopped and
//! killed, Postgres restarted, Postgres down while a report is saved, Postgres
//! crashed (a server of the trial's own, its unflushed WAL lost). Every
//! trial checks the same invariants at the end: the job succeeded, every task
//! is terminal, no task completed twice, and every tool call of every session
//! has exactly one result (none lost, none duplicated). The coordinator kill
//! trial is `soak` (same checks).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use flower_model::JobId;
use flower_store::{PostgresStore, Store};

use rand::{Rng, SeedableRng};

use crate::cluster::{Cluster, Options};
use crate::pggate::REPORT_WRITE;
use crate::support::repo;

/// How long the long-horizon job may take under faults (it takes about a
/// minute undisturbed in a debug build).
const LONG: Duration = Duration::from_secs(900);

fn rounds() -> usize {
    std::env::var("FLOWER_TRIAL_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20)
}

fn rng(name: &str) -> rand::rngs::StdRng {
    let seed: u64 = std::env::var("FLOWER_TRIAL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("{name} seed: {seed} (FLOWER_TRIAL_SEED={seed} replays it)");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Coordinator entries stored so far for `job` (the trials' clock).
async fn progress(c: &Cluster, job: &str) -> (i64, String) {
    let pg = c.pg().await;
    let q = format!(
        "SELECT (SELECT count(*) FROM entries e JOIN sessions s ON s.id = e.session_id
                 WHERE s.job_id = '{job}' AND s.role = 'coordinator'),
                (SELECT state FROM jobs WHERE id = '{job}')"
    );
    let row = pg.query_one(&q, &[]).await.unwrap();
    (row.get(0), row.get(1))
}

/// The job's last event sequence number.
async fn last_event(c: &Cluster, job: &str) -> i64 {
    let pg = c.pg().await;
    let q = format!("SELECT coalesce(max(seq), 0) FROM events WHERE job_id = '{job}'");
    pg.query_one(&q, &[]).await.unwrap().get(0)
}

/// Wait until the job has `entries` coordinator entries or has ended; whether it still runs.
async fn reach(c: &Cluster, job: &str, entries: i64) -> bool {
    let q = format!(
        "SELECT count(*) >= {entries} OR (SELECT state FROM jobs WHERE id = '{job}') NOT IN ('queued', 'running') FROM entries e
         JOIN sessions s ON s.id = e.session_id WHERE s.job_id = '{job}' AND s.role = 'coordinator'"
    );
    c.wait_for(&format!("{entries} coordinator entries"), Duration::from_secs(300), &q).await;
    live(&progress(c, job).await.1)
}

/// Not ended yet.
fn live(state: &str) -> bool {
    matches!(state, "queued" | "running")
}

/// The invariants every trial ends with; a summary line.
pub async fn check_invariants(c: &Cluster, job: &str) -> String {
    let pg = c.pg().await;
    let state: String = pg.query_one(&format!("SELECT state FROM jobs WHERE id = '{job}'"), &[]).await.unwrap().get(0);
    assert_eq!(state, "succeeded", "the job succeeded");
    let tasks = pg
        .query(
            &format!(
                "SELECT t.id::text, t.state, (SELECT count(*) FROM events e WHERE e.job_id = t.job_id
                   AND e.kind = 'task_finished' AND e.payload->>'task' = t.id::text
                   AND e.payload->>'succeeded' = 'true')
                 FROM tasks t WHERE t.job_id = '{job}'"
            ),
            &[],
        )
        .await
        .unwrap();
    let open: Vec<String> = tasks
        .iter()
        .filter(|r| matches!(r.get::<_, String>(1).as_str(), "queued" | "running"))
        .map(|r| r.get(0))
        .collect();
    assert!(open.is_empty(), "every task is terminal: {open:?}");
    let twice: Vec<String> = tasks.iter().filter(|r| r.get::<_, i64>(2) > 1).map(|r| r.get(0)).collect();
    assert!(twice.is_empty(), "no task completed twice: {twice:?}");
    // Tool calls and their results, per session, from the stored bodies.
    let rows = pg
        .query(
            &format!("SELECT session_id::text, body FROM entries WHERE job_id = '{job}' ORDER BY session_id, seq"),
            &[],
        )
        .await
        .unwrap();
    let mut calls: HashMap<(String, String), (usize, usize)> = HashMap::new();
    for r in &rows {
        let session: String = r.get(0);
        let body: serde_json::Value = serde_json::from_str(&r.get::<_, String>(1)).unwrap();
        for b in body["content"].as_array().into_iter().flatten() {
            match b["type"].as_str() {
                Some("tool_use") => {
                    calls.entry((session.clone(), b["id"].as_str().unwrap().into())).or_default().0 += 1
                }
                Some("tool_result") => {
                    calls.entry((session.clone(), b["tool_use_id"].as_str().unwrap().into())).or_default().1 += 1
                }
                _ => {}
            }
        }
    }
    let bad: Vec<_> = calls.iter().filter(|(_, n)| **n != (1, 1)).collect();
    assert!(bad.is_empty(), "every tool call has exactly one result: {bad:?}");
    format!("{} tasks, {} tool calls, all paired; 0 duplicate completions", tasks.len(), calls.len())
}

fn long_horizon() -> std::path::PathBuf {
    repo().join("examples/long-horizon/job.yaml")
}

/// Seeded fault points over the job's run (coordinator entries, ~140 in all).
fn points(rng: &mut impl Rng, n: usize) -> Vec<i64> {
    let mut p: Vec<i64> = (0..n).map(|_| rng.random_range(3..130)).collect();
    p.sort();
    p
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "heavy: run with --ignored trial_"]
async fn trial_kill_workers_mid_task() {
    let mut rng = rng("worker kills");
    let mut c = Cluster::start(Options { workers: 3, concurrency: 2, ack_wait: "2s", ..Default::default() }).await;
    let job = c.submit(&long_horizon());
    let pg = c.pg().await;
    let mut killed = 0;
    for point in points(&mut rng, rounds()) {
        if !reach(&c, &job, point).await {
            break;
        }
        // A worker that holds a running task, when there is one.
        let holders: Vec<String> = pg
            .query(&format!("SELECT DISTINCT claimed_by FROM tasks WHERE job_id = '{job}' AND state = 'running'"), &[])
            .await
            .unwrap()
            .iter()
            .filter_map(|r| r.get::<_, Option<String>>(0))
            .collect();
        let victim = c.workers.iter().position(|w| holders.contains(&w.id()));
        let i = victim.unwrap_or_else(|| rng.random_range(0..c.workers.len()));
        c.workers[i].kill9();
        c.workers.remove(i);
        killed += 1;
        println!("kill {killed}: worker at ≥ {point} coordinator entries (held a task: {})", victim.is_some());
        c.add_worker();
    }
    c.wait_job_within(&job, "succeeded", LONG).await;
    println!("worker kills: {killed}; {}", check_invariants(&c, &job).await);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "heavy: run with --ignored trial_"]
async fn trial_nats_stopped_and_killed() {
    let mut rng = rng("NATS stop/kill");
    let mut c = Cluster::start(Options { workers: 3, concurrency: 2, private_nats: true, ..Default::default() }).await;
    let job = c.submit(&long_horizon());
    let mut faults = 0;
    for (i, point) in points(&mut rng, rounds()).into_iter().enumerate() {
        if !reach(&c, &job, point).await {
            break;
        }
        let nats = c.nats.as_mut().unwrap();
        if i % 2 == 0 {
            nats.stop()
        } else {
            nats.kill9()
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await; // the outage
        nats.restart();
        faults += 1;
        println!(
            "fault {faults}: NATS {} at ≥ {point} coordinator entries",
            if i % 2 == 0 { "stopped" } else { "killed" }
        );
    }
    c.wait_job_within(&job, "succeeded", LONG).await;
    println!("NATS faults: {faults}; {}", check_invariants(&c, &job).await);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "heavy: run with --ignored trial_"]
async fn trial_postgres_restarts() {
    let mut rng = rng("Postgres restarts");
    let mut c = Cluster::start(Options { workers: 3, concurrency: 2, pg_gate: true, ..Default::default() }).await;
    let job = c.submit(&long_horizon());
    let mut faults = 0;
    let mut stalls = Vec::new();
    for point in points(&mut rng, rounds()) {
        if !reach(&c, &job, point).await {
            break;
        }
        let gate = c.gate.as_ref().unwrap();
        let seen = last_event(&c, &job).await;
        gate.down();
        let outage = Duration::from_millis(rng.random_range(100..2000));
        tokio::time::sleep(outage).await; // the outage
        gate.up();
        let up = std::time::Instant::now();
        // The stall: from Postgres back to the job's next stored event.
        while last_event(&c, &job).await == seen && live(&progress(&c, &job).await.1) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stalls.push(up.elapsed());
        faults += 1;
        println!(
            "fault {faults}: Postgres down {outage:?} at ≥ {point} coordinator entries; next event {:?} after",
            up.elapsed()
        );
    }
    c.wait_job_within(&job, "succeeded", LONG).await;
    stalls.sort();
    let median = stalls.get(stalls.len() / 2).copied().unwrap_or_default();
    println!(
        "Postgres restarts: {faults}; stall after the restart: median {median:?}, max {:?}; {}",
        stalls.last().copied().unwrap_or_default(),
        check_invariants(&c, &job).await
    );
    c.stop().await;
}

/// Every event of `job` a client could be handed now (the store's own read,
/// as a watch reads), added to `seen`: seq → (time, kind and payload).
async fn read_as_a_watcher(store: &PostgresStore, job: JobId, seen: &mut BTreeMap<i64, (i64, serde_json::Value)>) {
    let mut cursor = seen.keys().next_back().copied().unwrap_or(0);
    let mut failures = 0;
    loop {
        match store.events(job, cursor, 1000).await {
            Ok(page) if page.is_empty() => return,
            Ok(page) => {
                for e in page {
                    cursor = e.seq;
                    seen.insert(e.seq, (e.at, serde_json::to_value(&e.kind).unwrap()));
                }
            }
            // Connections the last crash cut, recycled.
            Err(e) => {
                failures += 1;
                assert!(failures < 50, "the store stays unreadable: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Wait (up to two seconds, polling) for `job` to be marked with a turn not
/// flushed yet; whether it was, and the job's last event then.
async fn unflushed_turn(c: &Cluster, job: &str) -> (bool, i64) {
    let pg = c.pg().await;
    let q = format!(
        "SELECT j.unflushed_seq IS NOT NULL AND pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn(),
                (SELECT coalesce(max(seq), 0) FROM events WHERE job_id = j.id)
         FROM jobs j WHERE j.id = '{job}'"
    );
    let until = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let row = pg.query_one(&q, &[]).await.unwrap();
        let (marked, last): (bool, i64) = (row.get(0), row.get(1));
        if marked || std::time::Instant::now() > until {
            return (marked, last);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "heavy: run with --ignored trial_"]
async fn trial_postgres_crashes() {
    let mut rng = rng("Postgres crashes");
    let mut c =
        Cluster::start(Options { workers: 3, concurrency: 2, private_postgres: true, ..Default::default() }).await;
    let job = c.submit(&long_horizon());
    let id = JobId(job.parse().unwrap());
    // A reader through the store, as the API's watch and the console read.
    let store = PostgresStore::connect(&c.db.url, 2).await.unwrap();
    let mut seen = BTreeMap::new();
    let (mut faults, mut taken_back) = (0, 0);
    for point in points(&mut rng, rounds()) {
        if !reach(&c, &job, point).await {
            break;
        }
        // Aim at a turn not flushed yet (its job marked, WAL written past
        // the flush), for up to two seconds; what a watcher is handed then;
        // then a crash at once.
        let (aimed, written) = unflushed_turn(&c, &job).await;
        read_as_a_watcher(&store, id, &mut seen).await;
        let server = c.postgres.as_ref().unwrap();
        server.crash();
        server.restart();
        let kept = last_event(&c, &job).await;
        if aimed && kept < written {
            taken_back += 1;
        }
        faults += 1;
        println!(
            "crash {faults} at ≥ {point} coordinator entries{}: events {written} written, {kept} kept",
            if aimed { ", a turn not flushed yet" } else { "" }
        );
    }
    c.wait_job_within(&job, "succeeded", LONG).await;
    // Every event a reader was handed is stored as it was handed.
    let mut stored = BTreeMap::new();
    read_as_a_watcher(&store, id, &mut stored).await;
    for (seq, handed) in &seen {
        assert_eq!(stored.get(seq), Some(handed), "event {seq} was handed out, then changed or lost");
    }
    println!(
        "Postgres crashes: {faults}; {taken_back} took back a turn not flushed yet; {} events handed out before a \
         crash, all kept; {}",
        seen.len(),
        check_invariants(&c, &job).await
    );
    drop(store);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "heavy: run with --ignored trial_"]
async fn trial_postgres_down_while_reports_are_saved() {
    let mut rng = rng("Postgres down at report writes");
    let mut c = Cluster::start(Options { workers: 3, concurrency: 2, pg_gate: true, ..Default::default() }).await;
    let job = c.submit(&long_horizon());
    let mut faults = 0;
    for _ in 0..rounds() {
        let down = Duration::from_millis(rng.random_range(200..3000));
        let tripped = c.gate.as_ref().unwrap().trip_on(REPORT_WRITE, down);
        let ended = async {
            loop {
                if !live(&progress(&c, &job).await.1) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            _ = tripped => {}
            _ = ended => break,
        }
        faults += 1;
        println!("fault {faults}: Postgres down {down:?} at a report write");
    }
    c.wait_job_within(&job, "succeeded", LONG).await;
    println!("report-write outages: {faults}; {}", check_invariants(&c, &job).await);
    c.stop().await;
}

/// Resident memory of a process, in MiB (from /proc).
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024.0
}

/// Memory returns after large jobs end: the coordinator's idle RSS after
/// jobs each carrying a 16 MiB request (a workspace of 16 MiB less the
/// spec), against its idle RSS before them.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "heavy: run with --ignored trial_"]
async fn trial_memory_returns_after_large_jobs() {
    use flower_proto::v1 as pb;
    let jobs: usize = std::env::var("FLOWER_TRIAL_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let mut c = Cluster::start(Options { workers: 1, concurrency: 4, ..Default::default() }).await;
    let pid = c.coordinators[0].pid();
    let mut api = flower_proto::v1::flower_client::FlowerClient::connect(c.server())
        .await
        .unwrap()
        .max_encoding_message_size(64 << 20);
    let spec = std::fs::read_to_string(repo().join("tests/fixtures/distributed/slow.yaml"))
        .unwrap()
        .replace("tools: [Bash]", "tools: [Bash]\nruntime:\n  workspace_limit: 64 MiB");
    let idle_before = rss_mib(pid);
    let mut ids = Vec::new();
    for i in 0..jobs {
        let size = (16 << 20) - spec.len() - 64;
        let files = (0..4)
            .map(|k| pb::WorkspaceFile { path: format!("blob-{k}.bin"), content: vec![(i + k) as u8; size / 4] })
            .collect();
        let r = pb::SubmitRequest {
            spec: spec.clone(),
            idempotency_key: String::new(),
            workspace: files,
            ..Default::default()
        };
        ids.push(api.submit(r).await.unwrap().into_inner().job_id);
    }
    let peak = rss_mib(pid);
    for id in &ids {
        c.wait_job(id, "succeeded").await;
    }
    // Idle: nothing runs; give the allocator its time to hand pages back.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let idle_after = rss_mib(pid);
    println!(
        "coordinator RSS: idle {idle_before:.0} MiB before, {peak:.0} MiB after {jobs} submits of 16 MiB, \
         idle {idle_after:.0} MiB after they ended"
    );
    assert!(idle_after < idle_before + 150.0, "memory held after the jobs ended: {idle_after:.0} MiB");
    c.stop().await;
}
