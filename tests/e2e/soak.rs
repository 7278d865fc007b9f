//! Heavy trial, not in the default run:
//! `cargo test -p flower-cli --test e2e -- --ignored soak --nocapture`
//! (needs Postgres and NATS, like the tests; `FLOWER_SOAK_SEED` replays a run).
//!
//! The long-horizon job in distributed mode; at 20 seeded random points
//! (`FLOWER_TRIAL_ROUNDS`) the coordinator that owns it is killed with SIGKILL
//! and a fresh replica is started. The job must succeed; no task may complete
//! twice; no stored transcript entry may be lost (per-session sequences stay
//! gapless); every tool call keeps exactly one result.

use std::time::Duration;

use rand::{Rng, SeedableRng};

use crate::cluster::{Cluster, Options};
use crate::support::repo;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "heavy: run with --ignored soak"]
async fn soak_killing_coordinators_during_the_long_horizon_job() {
    let seed: u64 = std::env::var("FLOWER_SOAK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("soak seed: {seed} (FLOWER_SOAK_SEED={seed} replays it)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kills: usize = std::env::var("FLOWER_TRIAL_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let mut c =
        Cluster::start(Options { coordinators: 2, workers: 3, concurrency: 2, lease_ttl: "2s", ..Default::default() })
            .await;
    let job = c.submit(&repo().join("examples/long-horizon/job.yaml"));
    let pg = c.pg().await;
    // Kill points: coordinator-entry counts spread over the run (~140 entries).
    let mut points: Vec<i64> = (0..kills).map(|_| rng.random_range(3..120)).collect();
    let mut killed = 0;
    points.sort();
    for (i, point) in points.iter().enumerate() {
        let q = format!(
            "SELECT count(*) >= {point} OR (SELECT state FROM jobs WHERE id = '{job}') <> 'running' FROM entries e
             JOIN sessions s ON s.id = e.session_id WHERE s.job_id = '{job}' AND s.role = 'coordinator'"
        );
        c.wait_for(&format!("kill point {i} ({point} entries)"), Duration::from_secs(180), &q).await;
        // The owner must be a live replica (the previous one may still hold an expiring lease).
        let started = std::time::Instant::now();
        let victim = loop {
            let state: String =
                pg.query_one(&format!("SELECT state FROM jobs WHERE id = '{job}'"), &[]).await.unwrap().get(0);
            if state != "running" {
                break None;
            }
            let owner: Option<String> = pg
                .query_opt(&format!("SELECT owner FROM leases WHERE job_id = '{job}' AND expires_at > 0"), &[])
                .await
                .unwrap()
                .map(|r| r.get(0));
            let live = owner.and_then(|o| c.coordinators.iter_mut().position(|p| p.id() == o && p.alive()));
            if live.is_some() {
                break live;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "seed {seed}: no live owner took the job");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let Some(victim) = victim else { break };
        let owner = c.coordinators[victim].id();
        c.coordinators[victim].kill9();
        killed += 1;
        println!("kill {i}: owner {owner} killed at ≥ {point} coordinator entries");
        c.add_coordinator();
    }
    c.wait_job(&job, "succeeded").await;
    assert!(killed >= kills, "seed {seed}: only {killed} kills happened before the job ended");
    let twice: i64 = pg
        .query_one(
            &format!(
                "SELECT count(*) FROM (SELECT payload->>'task' AS t FROM events WHERE job_id = '{job}'
                 AND kind = 'task_finished' AND payload->>'succeeded' = 'true' GROUP BY 1 HAVING count(*) > 1) d"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(twice, 0, "seed {seed}: a task completed twice");
    let gaps: i64 = pg
        .query_one(
            &format!(
                "SELECT count(*) FROM (SELECT s.id FROM sessions s JOIN entries e ON e.session_id = s.id
                 WHERE s.job_id = '{job}' GROUP BY s.id HAVING max(e.seq) <> count(*)) g"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(gaps, 0, "seed {seed}: a stored entry went missing");
    let epoch: i64 =
        pg.query_one(&format!("SELECT epoch FROM leases WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    println!("soak seed {seed}: job succeeded through {} ownerships", epoch);
    println!("coordinator kills: {killed}; {}", crate::trials::check_invariants(&c, &job).await);
    c.stop().await;
}
