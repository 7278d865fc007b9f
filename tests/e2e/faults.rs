//! Store and queue faults on a cluster of real processes: Postgres down
//! while a task's report is saved, a Postgres restart under a running job, a
//! task whose message is gone, one whose message the queue gave up on, the
//! task queue down while the coordinator delegates. Each checks that the job ends, nothing completes twice, and
//! (for the restart) that the owner kept its job instead of waiting for its
//! lease to expire. Postgres is taken down for this test's processes only,
//! through a gate (see `pggate`).

use std::time::Duration;

use flower_bus::TaskQueue;

use crate::cluster::{Cluster, Options};
use crate::pggate::REPORT_WRITE;
use crate::support::repo;

/// Completions of each task of a job (TaskFinished events), and its tasks' states.
async fn finished_counts(c: &Cluster, job: &str) -> Vec<(String, String, i64)> {
    let pg = c.pg().await;
    let q = format!(
        "SELECT t.id::text, t.state, (SELECT count(*) FROM events e WHERE e.job_id = t.job_id
           AND e.kind = 'task_finished' AND e.payload->>'task' = t.id::text)
         FROM tasks t WHERE t.job_id = '{job}' ORDER BY t.id"
    );
    pg.query(&q, &[]).await.unwrap().iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
}

/// Acceptance: Postgres stopped while a task's report is saved, then started:
/// the job succeeds and the task completes once.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_down_while_a_report_is_saved_loses_nothing() {
    let mut c = Cluster::start(Options { workers: 1, pg_gate: true, ..Default::default() }).await;
    // The worker's report write trips the gate: its transaction is cut before
    // it commits, and Postgres stays away for 3 s.
    let tripped = c.gate.as_ref().unwrap().trip_on(REPORT_WRITE, Duration::from_secs(3));
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    tokio::time::timeout(Duration::from_secs(60), tripped).await.expect("the report write was reached").unwrap();
    c.wait_job(&job, "succeeded").await;
    let tasks = finished_counts(&c, &job).await;
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!((tasks[0].1.as_str(), tasks[0].2), ("succeeded", 1), "the task completed once: {tasks:?}");
    let pg = c.pg().await;
    let row = pg.query_one(&format!("SELECT report, attempt FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0).trim(), "rested");
    assert_eq!(row.get::<_, i32>(1), 1, "the worker retried the write while holding the message");
    c.stop().await;
}

/// A Postgres restart under a running job: the owner retries the store and
/// keeps its job (the lease epoch does not move), instead of giving the job
/// up until its lease expires.
#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_restart_does_not_cost_the_owner_its_job() {
    let mut c = Cluster::start(Options { workers: 1, pg_gate: true, ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    c.wait_call(&job, "sleep 5", 1).await;
    let gate = c.gate.as_ref().unwrap();
    gate.down();
    tokio::time::sleep(Duration::from_millis(500)).await; // the outage itself
    gate.up();
    c.wait_job(&job, "succeeded").await;
    let pg = c.pg().await;
    let epoch: i64 =
        pg.query_one(&format!("SELECT epoch FROM leases WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    assert_eq!(epoch, 1, "the first owner kept the job through the restart");
    let tasks = finished_counts(&c, &job).await;
    assert!(tasks.iter().all(|(_, state, n)| state == "succeeded" && *n == 1), "{tasks:?}");
    c.stop().await;
}

/// A running task whose message is gone (its worker died and the queue no
/// longer has it): the owning coordinator's sweeper requeues it as its next
/// attempt, and the job ends.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweeper_requeues_a_task_whose_message_is_gone() {
    let mut c = Cluster::start(Options { workers: 1, ack_wait: "1s", ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    c.wait_call(&job, "sleep 5", 1).await;
    c.workers[0].kill9();
    // The message goes with it: purge the job's task stream.
    let nats = async_nats::connect(crate::cluster::nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let config = flower_bus::NatsConfig::new(crate::cluster::nats_url(), c.prefix.clone());
    let mut stream = js.get_stream(config.stream_name()).await.unwrap();
    stream.purge().await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 0, "no message left for the task");
    c.add_worker();
    c.wait_job(&job, "succeeded").await;
    let pg = c.pg().await;
    let row = pg.query_one(&format!("SELECT attempt, report FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 2, "requeued as the next attempt");
    assert_eq!(row.get::<_, String>(1).trim(), "rested");
    let tasks = finished_counts(&c, &job).await;
    assert_eq!(tasks[0].2, 1, "{tasks:?}");
    c.stop().await;
}

/// A queued task whose message is gone before any worker took it (the
/// queue's store purged: no delivery, no dead letter): once it has been
/// queued longer than the sweeper's wait with nothing at all in the queue,
/// its coordinator publishes it again, and it runs as its first attempt.
#[tokio::test(flavor = "multi_thread")]
async fn a_queued_task_whose_message_is_gone_is_published_again() {
    let mut c = Cluster::start(Options { workers: 0, ack_wait: "1s", max_attempts: 1, ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    let nats = async_nats::connect(crate::cluster::nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let config = flower_bus::NatsConfig::new(crate::cluster::nats_url(), c.prefix.clone());
    let mut stream = js.get_stream(config.stream_name()).await.unwrap();
    let probe = stream.clone();
    let messages = |n: u64, what: &'static str| {
        let mut stream = probe.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while stream.info().await.unwrap().state.messages != n {
                assert!(tokio::time::Instant::now() < deadline, "{what}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    messages(1, "the task's message never reached the queue").await;
    stream.purge().await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 0, "no message left for the task");
    messages(1, "the queued task was not published again").await;
    c.add_worker();
    c.wait_job(&job, "succeeded").await;
    let pg = c.pg().await;
    let row = pg.query_one(&format!("SELECT attempt, report FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1, "it ran as its first attempt");
    assert_eq!(row.get::<_, String>(1).trim(), "rested");
    c.stop().await;
}

/// A task whose message the queue gave up on before any worker claimed it
/// (both deliveries given back, as a worker does when the store stays out
/// longer than its claim retries) is published again by the coordinator,
/// as a new message with deliveries of its own; given up on again past the
/// attempt limit, the task fails with the reason, the job's coordinator
/// hears of it and answers, and the dead messages leave the queue.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_whose_message_the_queue_gave_up_on_is_published_again_then_failed() {
    let opts = Options { workers: 0, ack_wait: "1s", max_attempts: 1, metrics: true, ..Default::default() };
    let mut c = Cluster::start(opts).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    // This test's consumer plays the workers that cannot claim.
    let mut config = flower_bus::NatsConfig::new(crate::cluster::nats_url(), c.prefix.clone());
    config.ack_wait = Duration::from_secs(1);
    config.max_attempts = 1;
    let bus = flower_bus::NatsBus::connect(config.clone()).await.unwrap();
    let mut task = None;
    for republish in [0, 1] {
        for delivered in [1, 2] {
            let d = tokio::time::timeout(Duration::from_secs(30), bus.next()).await.expect("a delivery").unwrap();
            let m = d.message();
            assert_eq!((m.republish, d.delivered()), (republish, delivered), "republish, delivery");
            assert_eq!(*task.get_or_insert(m.task_id), m.task_id, "one task");
            d.nak(None).await.unwrap();
        }
    }
    // Waiting for a delivery makes the server give up on the last message.
    tokio::select! {
        d = bus.next() => panic!("delivered past the limit: {:?}", d.map(|d| d.delivered())),
        () = c.wait_task(&job, "failed") => {}
    }
    let pg = c.pg().await;
    let row = pg
        .query_one(&format!("SELECT error, claimed_by, attempt FROM tasks WHERE job_id = '{job}'"), &[])
        .await
        .unwrap();
    let error: String = row.get(0);
    assert!(error.contains("the queue gave up on its message 2 times"), "{error}");
    assert_eq!(row.get::<_, String>(1), "dead-letters");
    assert_eq!(row.get::<_, i32>(2), 2, "claimed past the deliveries of its last message");
    c.wait_for(
        "the job to end",
        Duration::from_secs(60),
        &format!("SELECT state IN ('succeeded', 'failed') FROM jobs WHERE id = '{job}'"),
    )
    .await;
    let answer: String =
        pg.query_one(&format!("SELECT final_answer FROM jobs WHERE id = '{job}'"), &[]).await.unwrap().get(0);
    assert!(answer.contains("gave up on its message"), "the coordinator got the failure: {answer}");
    // Both dead messages are deleted once handled, and both advisories taken.
    let js = async_nats::jetstream::new(async_nats::connect(crate::cluster::nats_url()).await.unwrap());
    for name in [config.stream_name(), config.dead_letter_stream_name()] {
        let mut stream = js.get_stream(&name).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while stream.info().await.unwrap().state.messages > 0 {
            assert!(tokio::time::Instant::now() < deadline, "{name} still holds a message");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Counted once settled (each is counted before its message is deleted).
    let text = reqwest::get(c.coordinators[0].metrics_url()).await.unwrap().text().await.unwrap();
    for line in
        ["flower_dead_letters_total{outcome=\"republished\"} 1", "flower_dead_letters_total{outcome=\"failed\"} 1"]
    {
        assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
    }
    c.stop().await;
}

/// The delivery past the limit of a task no attempt ever claimed (the
/// earlier one given back, as by a worker that could not reach the store)
/// reaches a worker that can: it publishes the task again instead of
/// failing a task that never ran, and the task runs as its first attempt.
#[tokio::test(flavor = "multi_thread")]
async fn a_never_claimed_task_at_its_delivery_limit_is_published_again_and_runs() {
    let mut c = Cluster::start(Options { workers: 0, ack_wait: "1s", max_attempts: 1, ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    let mut config = flower_bus::NatsConfig::new(crate::cluster::nats_url(), c.prefix.clone());
    config.ack_wait = Duration::from_secs(1);
    config.max_attempts = 1;
    let bus = flower_bus::NatsBus::connect(config).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(30), bus.next()).await.expect("a delivery").unwrap();
    assert_eq!((d.message().republish, d.delivered()), (0, 1));
    d.nak(None).await.unwrap();
    c.add_worker();
    c.wait_job(&job, "succeeded").await;
    let pg = c.pg().await;
    let row =
        pg.query_one(&format!("SELECT state, attempt, report FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "succeeded");
    assert_eq!(row.get::<_, i32>(1), 1, "the message published again ran as the first attempt");
    assert_eq!(row.get::<_, String>(2).trim(), "rested");
    c.stop().await;
}

/// A replica shutting down hands its jobs over: SIGTERM to the owning
/// coordinator mid-job, another replica finishes the job, and no task is
/// cancelled (only a user's cancel cancels tasks).
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_to_the_owner_hands_the_job_over_and_cancels_nothing() {
    let mut c = Cluster::start(Options { coordinators: 2, workers: 1, ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    c.wait_call(&job, "sleep 5", 1).await;
    let pg = c.pg().await;
    let owner: String =
        pg.query_one(&format!("SELECT owner FROM leases WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    let victim = c.coordinators.iter_mut().find(|p| p.id() == owner).expect("the owner is one of ours");
    let status = std::process::Command::new("kill").args(["-TERM", &victim.pid().to_string()]).status().unwrap();
    assert!(status.success());
    assert!(victim.wait().success(), "the replica shut down cleanly");
    c.wait_job(&job, "succeeded").await;
    let row = pg
        .query_one(&format!("SELECT state, attempt, report, claimed_by FROM tasks WHERE job_id = '{job}'"), &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "succeeded", "the task was not cancelled");
    assert_eq!(row.get::<_, i32>(1), 1, "and ran once");
    assert_eq!(row.get::<_, String>(2).trim(), "rested");
    let cancelled: i64 = pg
        .query_one(
            &format!(
                "SELECT count(*) FROM events WHERE job_id = '{job}' AND kind = 'task_finished'
                 AND payload->>'succeeded' = 'false'"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(cancelled, 0, "no task ended unsuccessfully");
    let answer: String =
        pg.query_one(&format!("SELECT final_answer FROM jobs WHERE id = '{job}'"), &[]).await.unwrap().get(0);
    assert_eq!(answer.trim(), "slow task said: rested", "the new owner got the report, not a cancellation");
    let new_owner: String =
        pg.query_one(&format!("SELECT owner FROM leases WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    assert_ne!(new_owner, owner, "another replica finished it");
    c.stop().await;
}

/// The task queue down while the coordinator delegates: a task row is
/// committed with its turn and its message cannot be published. The
/// dispatch publishes again until the queue is back (the outage outlasts a
/// publish's ack timeout), and the job succeeds with every task completed
/// once — a NATS restart does not fail the job.
#[tokio::test(flavor = "multi_thread")]
async fn a_delegation_during_a_queue_outage_waits_for_the_queue() {
    let mut c = Cluster::start(Options { workers: 2, concurrency: 2, private_nats: true, ..Default::default() }).await;
    let job = c.submit(&repo().join("examples/long-horizon/job.yaml"));
    let tasks = format!("SELECT count(*) FROM tasks WHERE job_id = '{job}'");
    // Every task so far in a worker's hands (none queued: each message
    // delivered and claimed) before the queue stops, so the run can go on
    // without it; a task whose message the outage held back would keep its
    // delegation waiting for the queue, and no turn would come after it.
    // The coordinator is paused from that check to the stop: no turn of it
    // creates a task in between (one that had, found queued, lets it run on
    // and the check is made again).
    let none_queued = format!(
        "SELECT ({tasks}) > 0 AND NOT EXISTS (SELECT 1 FROM tasks WHERE job_id = '{job}' AND state = 'queued')"
    );
    loop {
        c.wait_for("a first delegation, every task claimed", Duration::from_secs(120), &none_queued).await;
        c.coordinators[0].signal("STOP");
        let still: bool = c.pg().await.query_one(&none_queued, &[]).await.unwrap().get(0);
        if still {
            c.nats.as_mut().unwrap().stop();
        }
        c.coordinators[0].signal("CONT");
        if still {
            break;
        }
    }
    let before: i64 = c.pg().await.query_one(&tasks, &[]).await.unwrap().get(0);
    // A turn after the stop delegates: its row is committed, its message owed.
    c.wait_for(
        "a delegation while the queue is down",
        Duration::from_secs(120),
        &format!(
            "SELECT ({tasks}) > {before} OR (SELECT state FROM jobs WHERE id = '{job}') NOT IN ('queued', 'running')"
        ),
    )
    .await;
    let state: String =
        c.pg().await.query_one(&format!("SELECT state FROM jobs WHERE id = '{job}'"), &[]).await.unwrap().get(0);
    assert!(matches!(state.as_str(), "queued" | "running"), "the job ended while the queue was down: {state}");
    // Longer than a publish's ack timeout (5 s): the publish fails at least once.
    tokio::time::sleep(Duration::from_secs(7)).await;
    c.nats.as_mut().unwrap().restart();
    c.wait_job(&job, "succeeded").await;
    let finished = finished_counts(&c, &job).await;
    assert!(finished.len() as i64 > before, "{finished:?}");
    assert!(finished.iter().all(|(_, state, n)| state == "succeeded" && *n == 1), "{finished:?}");
    c.stop().await;
}
