//! The distributed mode with real processes: coordinators, workers, a
//! `flower sim` server, Postgres, NATS JetStream, object storage.

use std::time::Duration;

use flower_store::Store;

use crate::cluster::{Cluster, Options};
use crate::support::repo;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Acceptance: the demo over gRPC on 1 coordinator + 3 workers (concurrency 1),
/// tasks on at least two processes, transcripts in Postgres, the artifact in
/// object storage and downloadable.
/// With local object storage every coordinator and worker runs one runtime
/// thread (the current-thread scheduler: the main thread runs every task);
/// with S3, each its default.
async fn demo_on_a_cluster(s3: bool) {
    let threads = (!s3).then_some(1);
    let mut c = Cluster::start(Options { workers: 3, s3, threads, ..Default::default() }).await;
    if threads.is_some() {
        for p in c.coordinators.iter().chain(&c.workers) {
            assert!(p.first_line.contains(" 1 runtime thread"), "{}", p.first_line);
        }
    }
    let out = c.flower(&["submit", repo().join("examples/demo/job.yaml").to_str().unwrap(), "--watch"]);
    let text = stdout(&out);
    assert!(out.status.success(), "submit --watch: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let job = text.lines().next().unwrap().trim().to_string();
    assert!(text.contains("succeeded"), "{text}");
    assert!(text.contains("data/ holds 15 files"), "{text}");

    let pg = c.pg().await;
    let workers: i64 = pg
        .query_one(&format!("SELECT count(DISTINCT claimed_by) FROM tasks WHERE job_id = '{job}'"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(workers >= 2, "tasks ran on {workers} worker process(es)");
    let sessions: Vec<(String, i64)> = pg
        .query(
            &format!(
                "SELECT s.role, count(e.seq) FROM sessions s JOIN entries e ON e.session_id = s.id
                 WHERE s.job_id = '{job}' GROUP BY s.id, s.role"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(sessions.iter().filter(|(r, _)| r == "worker").count(), 3, "{sessions:?}");
    assert!(sessions.iter().all(|(_, n)| *n >= 4), "every session's transcript is in Postgres: {sessions:?}");

    // One transaction per coordinator turn (docs/design.md section 3): each
    // task's row and `task_queued` event were inserted by the transaction
    // that stored the assistant turn making its `Agent` call (a row's `xmin`
    // names the transaction that inserted it), and each `Agent` result by the
    // one that stored the next answer.
    let same_tx = |sql: String| {
        let pg = &pg;
        async move {
            let r = pg.query_one(&sql, &[]).await.unwrap();
            (r.get::<_, i64>(0), r.get::<_, i64>(1))
        }
    };
    let (with_turn, queued) = same_tx(format!(
        "SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM entries e WHERE e.session_id = t.parent_session
                  AND e.kind = 'assistant' AND position(t.tool_use_id in e.body) > 0 AND e.xmin = q.xmin)),
                count(*)
         FROM events q JOIN tasks t ON t.id = (q.payload->>'task')::uuid
         WHERE q.job_id = '{job}' AND q.kind = 'task_queued'"
    ))
    .await;
    assert!(queued >= 3, "{queued} tasks queued");
    assert_eq!(with_turn, queued, "every task row was committed with the turn that made its call");
    let (with_answer, results) = same_tx(format!(
        "SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM entries a WHERE a.session_id = r.session_id
                  AND a.kind = 'assistant' AND a.seq > r.seq AND a.xmin = r.xmin)),
                count(*)
         FROM entries r JOIN sessions s ON s.id = r.session_id
         WHERE s.job_id = '{job}' AND s.role = 'coordinator' AND r.kind = 'tool_result'
           AND r.body LIKE '%\"tool_name\":\"Agent\"%'"
    ))
    .await;
    assert!(results >= 3, "{results} Agent results");
    assert_eq!(with_answer, results, "every Agent result was committed with the next answer");

    let list = c.flower(&["artifacts", &job]);
    assert!(stdout(&list).contains("artifacts/sizes.md"), "{}", stdout(&list));
    let got = c.flower(&["artifacts", &job, "get", "artifacts/sizes.md"]);
    assert!(got.status.success());
    let table = stdout(&got);
    assert!(table.starts_with("# desc: per-file sizes of data/"), "{table}");
    assert_eq!(table.lines().filter(|l| l.contains("\tdata/")).count(), 15);

    // The same transcripts through the API.
    let t = c.flower(&["transcript", "show", &job, "--json"]);
    let t: serde_json::Value = serde_json::from_slice(&t.stdout).unwrap();
    assert_eq!(t["sessions"].as_array().unwrap().len(), 4);

    // The simulator's cache audit, joined with the job's recorded rewrites as
    // the embedded mode does: every request of the job's sessions audited.
    let demo_sim = c.sims[1].url();
    let ctx = c.flower(&["context", &job, "--json", "--sim-audit", &demo_sim]);
    assert!(ctx.status.success(), "{}", String::from_utf8_lossy(&ctx.stderr));
    let ctx: serde_json::Value = serde_json::from_slice(&ctx.stdout).unwrap();
    let audit = &ctx["cache_audit"];
    assert!(audit["requests"].as_u64().unwrap() >= 5, "{audit}");
    assert_eq!(audit["unexplained"], serde_json::json!([]), "{audit}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_runs_on_a_cluster_with_local_object_storage() {
    demo_on_a_cluster(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_runs_on_a_cluster_with_s3() {
    demo_on_a_cluster(true).await;
}

/// Acceptance: a killed worker's task is redelivered and the job succeeds; a
/// task longer than the ack wait is not redelivered while its worker lives.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_workers_task_is_redelivered_and_heartbeats_hold_long_tasks() {
    let mut c = Cluster::start(Options { workers: 2, ack_wait: "2s", ..Default::default() }).await;
    let spec = repo().join("tests/fixtures/distributed/slow.yaml");

    // A 5 s task with a 2 s ack wait, its worker alive: one attempt only.
    let job = c.submit(&spec);
    c.wait_job(&job, "succeeded").await;
    let pg = c.pg().await;
    let attempt: i32 =
        pg.query_one(&format!("SELECT attempt FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    assert_eq!(attempt, 1, "heartbeats kept the task from being redelivered");

    // Now kill -9 the worker running it, once its `sleep` is under way.
    let job = c.submit(&spec);
    c.wait_call(&job, "sleep 5", 1).await;
    let holder: String =
        pg.query_one(&format!("SELECT claimed_by FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    let victim = c.workers.iter_mut().find(|w| w.id() == holder).expect("the claiming worker is one of ours");
    victim.kill9();
    c.wait_job(&job, "succeeded").await;
    let row = pg
        .query_one(&format!("SELECT attempt, claimed_by, report FROM tasks WHERE job_id = '{job}'"), &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 2, "the task was redelivered once");
    assert_ne!(row.get::<_, String>(1), holder, "to the other worker");
    assert_eq!(row.get::<_, String>(2).trim(), "rested");
    let healed: i64 = pg
        .query_one(
            &format!("SELECT count(*) FROM entries WHERE job_id = '{job}' AND kind = 'tool_result' AND body LIKE '%\"interrupted\":true%'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(healed, 1, "the next worker resumed the subagent's transcript instead of starting over");
    c.stop().await;
}

/// Acceptance: a task whose every attempt loses its worker reaches the
/// delivery limit and fails with a clear reason; the job still ends. The
/// task's own `kill -9 $PPID` cannot reach the worker (its tools run isolated),
/// so the test kills each worker while the call is under way.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_kills_its_workers_fails_at_the_delivery_limit() {
    let mut c = Cluster::start(Options { workers: 3, ack_wait: "1s", max_attempts: 2, ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/doomed.yaml"));
    let pg = c.pg().await;
    for attempt in 1..=2 {
        c.wait_call(&job, "kill -9 $PPID", attempt).await;
        let holder: String =
            pg.query_one(&format!("SELECT claimed_by FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
        let victim = c.workers.iter_mut().find(|w| w.id() == holder).expect("the claiming worker is one of ours");
        assert!(victim.alive(), "attempt {attempt}: the worker is alive when the test kills it");
        victim.kill9();
    }
    c.wait_for(
        "the job to end",
        Duration::from_secs(60),
        &format!("SELECT state IN ('succeeded', 'failed') FROM jobs WHERE id = '{job}'"),
    )
    .await;
    let row =
        pg.query_one(&format!("SELECT state, attempt, error FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "failed");
    assert_eq!(row.get::<_, i32>(1), 3, "the delivery past the limit was recorded, not run");
    assert_eq!(row.get::<_, String>(2), "gave up after 2 attempts (no worker finished the task)");
    let healed: i64 = pg
        .query_one(
            &format!("SELECT count(*) FROM entries WHERE job_id = '{job}' AND kind = 'tool_result' AND body LIKE '%\"interrupted\":true%'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(healed, 1, "the resumed subagent got a marked, neutral result for the call that killed its worker");
    let dead = c.workers.iter_mut().map(|w| w.alive()).filter(|alive| !alive).count();
    assert_eq!(dead, 2, "two attempts ran, each lost its worker; the third was not run");
    let answer: String =
        pg.query_one(&format!("SELECT final_answer FROM jobs WHERE id = '{job}'"), &[]).await.unwrap().get(0);
    assert!(answer.contains("gave up after 2 attempts"), "the coordinator saw the reason: {answer}");
    c.stop().await;
}

/// Acceptance: two coordinators; the owner of a running job is killed; the
/// other takes the job over and it succeeds, its task adopted once; a write
/// with the dead owner's epoch is rejected.
#[tokio::test(flavor = "multi_thread")]
async fn a_surviving_coordinator_takes_over_a_running_job() {
    let mut c = Cluster::start(Options { coordinators: 2, workers: 1, lease_ttl: "2s", ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    c.wait_task(&job, "running").await;
    let pg = c.pg().await;
    let lease = pg.query_one(&format!("SELECT owner, epoch FROM leases WHERE job_id = '{job}'"), &[]).await.unwrap();
    let (owner, epoch): (String, i64) = (lease.get(0), lease.get(1));
    let victim = c.coordinators.iter_mut().find(|p| p.id() == owner).expect("the owner is one of ours");
    victim.kill9();
    c.wait_job(&job, "succeeded").await;
    let lease = pg.query_one(&format!("SELECT owner, epoch FROM leases WHERE job_id = '{job}'"), &[]).await.unwrap();
    assert_ne!(lease.get::<_, String>(0), owner, "another replica owns it");
    assert_eq!(lease.get::<_, i64>(1), epoch + 1);
    let tasks: i64 =
        pg.query_one(&format!("SELECT count(*) FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    assert_eq!(tasks, 1, "the resumed Agent call found its task again");
    let attempt: i32 =
        pg.query_one(&format!("SELECT attempt FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    assert_eq!(attempt, 1, "the worker was not disturbed");
    let results: i64 = pg
        .query_one(
            &format!(
                "SELECT count(*) FROM entries e JOIN sessions s ON s.id = e.session_id
                 WHERE s.job_id = '{job}' AND s.role = 'coordinator' AND e.kind = 'tool_result'"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(results, 1, "the report was adopted once");
    let answer: String =
        pg.query_one(&format!("SELECT final_answer FROM jobs WHERE id = '{job}'"), &[]).await.unwrap().get(0);
    assert_eq!(answer, "slow task said: rested");

    // A write carrying the dead owner's epoch is rejected.
    let store = flower_store::PostgresStore::connect(&c.db.url, 1).await.unwrap();
    let job_id: flower_model::JobId = job.parse().unwrap();
    let stale = flower_store::Fence { job: job_id, epoch };
    let err = store.set_job_state(job_id, flower_model::JobState::Failed, None, None, Some(stale)).await.unwrap_err();
    assert!(matches!(err, flower_store::StoreError::Fenced { .. }), "{err}");
    let batch = flower_store::Batch {
        events: vec![(job_id, flower_model::EventKind::UserMessage { text: "late".into() })],
        fence: Some(stale),
        ..Default::default()
    };
    assert!(matches!(store.append(batch).await, Err(flower_store::StoreError::Fenced { .. })));
    drop(store);
    c.stop().await;
}

async fn client(url: &str) -> flower_proto::v1::flower_client::FlowerClient<tonic::transport::Channel> {
    flower_proto::v1::flower_client::FlowerClient::connect(url.to_string()).await.unwrap()
}

fn authed<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// Acceptance: `Watch` cut mid-job and resumed from its cursor yields every
/// event exactly once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn watch_resumes_from_its_cursor_without_loss_or_repeats() {
    use flower_proto::v1 as pb;
    let mut c = Cluster::start(Options { workers: 3, ..Default::default() }).await;
    let url = c.server();
    let job = c.submit(&repo().join("examples/demo/job.yaml"));
    let mut api = client(&url).await;

    let mut seen: Vec<i64> = Vec::new();
    let mut cursor = 0;
    // Read a few events, drop the stream (a disconnect), reconnect from the cursor; repeat.
    loop {
        let mut stream =
            api.watch(pb::WatchRequest { job_id: job.clone(), after_seq: cursor }).await.unwrap().into_inner();
        let mut taken = 0;
        let mut ended = false;
        while let Some(e) = stream.message().await.unwrap() {
            seen.push(e.seq);
            cursor = e.seq;
            taken += 1;
            if e.kind == "job_state" && e.payload_json.contains("succeeded") {
                ended = true;
                break;
            }
            if taken == 3 {
                break;
            }
        }
        drop(stream);
        if ended {
            break;
        }
    }
    let all: Vec<i64> = {
        let mut s = api.watch(pb::WatchRequest { job_id: job.clone(), after_seq: 0 }).await.unwrap().into_inner();
        let mut v = Vec::new();
        while let Some(e) = s.message().await.unwrap() {
            v.push(e.seq);
        }
        v
    };
    assert!(all.len() > 20, "a whole run's events: {}", all.len());
    assert_eq!(all, (1..=all.len() as i64).collect::<Vec<_>>(), "gapless and ordered");
    assert_eq!(seen, all[..seen.len()].to_vec(), "the reconnecting watcher saw each event once, in order");
    assert_eq!(seen.len(), all.len());
    c.stop().await;
}

/// Acceptance: bad requests get their status and message; the service keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_clear_statuses_and_the_service_keeps_serving() {
    use flower_proto::v1 as pb;
    use tonic::Code;
    let token = "s3cret-token";
    let mut c = Cluster::start(Options {
        workers: 1,
        token: Some(token),
        max_request_bytes: Some("64 KiB"),
        ..Default::default()
    })
    .await;
    let url = c.server();
    let mut api = client(&url).await;
    let spec = std::fs::read_to_string(repo().join("tests/fixtures/distributed/slow.yaml")).unwrap();

    let no_token = api.list(pb::ListRequest::default()).await.unwrap_err();
    assert_eq!(no_token.code(), Code::Unauthenticated, "{no_token:?}");
    let wrong = api.list(authed(pb::ListRequest::default(), "nope")).await.unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated);

    // Health checks need no token.
    let channel = tonic::transport::Channel::from_shared(url.clone()).unwrap().connect().await.unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let h = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    assert_eq!(h.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);

    let bad = |spec: String| pb::SubmitRequest { spec, ..Default::default() };
    let e = api.submit(authed(bad(spec.replace("tools: [Bash]", "tools: Bash")), token)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("workers.sleeper.tools"), "{}", e.message());
    let e = api
        .submit(authed(
            bad(spec
                .replace("provider: anthropic", "provider: sim\nscenario: x.yaml")
                .replace("sim\nscenario", "openai\nscenario")),
            token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = api.submit(authed(bad(String::new()), token)).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::InvalidArgument, "spec: required (the job spec, YAML or JSON)"));
    let huge = pb::SubmitRequest {
        spec: spec.clone(),
        workspace: vec![pb::WorkspaceFile { path: "big.bin".into(), content: vec![7u8; 100 * 1024] }],
        ..Default::default()
    };
    let e = api.submit(authed(huge, token)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("over this service's limit of 65536 bytes"), "{}", e.message());
    let escape = pb::SubmitRequest {
        spec: spec.clone(),
        workspace: vec![pb::WorkspaceFile { path: "../x".into(), content: vec![] }],
        ..Default::default()
    };
    let e = api.submit(authed(escape, token)).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::InvalidArgument, "workspace[0].path: `../x` is not a relative path: it has a `..` component")
    );

    let unknown = uuid::Uuid::new_v4().to_string();
    let e = api.get(authed(pb::GetRequest { job_id: unknown.clone() }, token)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = api.get(authed(pb::GetRequest { job_id: "not-an-id".into() }, token)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("job_id:"), "{}", e.message());
    let e = api
        .cancel(authed(pb::CancelRequest { job_id: unknown.clone(), reason: String::new() }, token))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = api
        .get_artifact(authed(pb::GetArtifactRequest { job_id: unknown, path: "artifacts/x".into() }, token))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // Still serving: a good submit runs to the end; idempotency keys hold.
    let good = pb::SubmitRequest { spec: spec.clone(), idempotency_key: "k-1".into(), ..Default::default() };
    let first = api.submit(authed(good.clone(), token)).await.unwrap().into_inner();
    let again = api.submit(authed(good, token)).await.unwrap().into_inner();
    assert_eq!((again.job_id.as_str(), again.existing), (first.job_id.as_str(), true));
    // The same key with another spec is refused, naming the key and the job it holds.
    let other = pb::SubmitRequest {
        spec: spec.replacen("name: ", "name: other-", 1),
        idempotency_key: "k-1".into(),
        ..Default::default()
    };
    let e = api.submit(authed(other, token)).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains("idempotency_key `k-1`") && e.message().contains(&first.job_id), "{e:?}");
    let e = api
        .get_artifact(authed(
            pb::GetArtifactRequest { job_id: first.job_id.clone(), path: "../../etc/passwd".into() },
            token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    c.wait_job(&first.job_id, "succeeded").await;
    c.stop().await;
}

/// SIGTERM drains a worker: it takes no new task and finishes the running one.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_a_worker() {
    let mut c = Cluster::start(Options { workers: 1, ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    c.wait_task(&job, "running").await;
    // A message for the coordinator while it waits; it is taken in before its next turn.
    let sent = c.flower(&["interrupt", &job, "--message", "please also report the time"]);
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    let status = std::process::Command::new("kill").args(["-TERM", &c.workers[0].pid().to_string()]).status().unwrap();
    assert!(status.success());
    let code = c.workers[0].wait();
    assert!(code.success(), "the worker exits cleanly after draining: {code:?}");
    let pg = c.pg().await;
    let row = pg.query_one(&format!("SELECT state, attempt FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap();
    assert_eq!(
        (row.get::<_, String>(0).as_str(), row.get::<_, i32>(1)),
        ("succeeded", 1),
        "the running task was finished, not abandoned"
    );
    c.wait_job(&job, "succeeded").await;
    c.stop().await;
}

/// TLS is optional: with a certificate the API is served over TLS only.
#[tokio::test(flavor = "multi_thread")]
async fn the_api_can_be_served_over_tls() {
    let mut c = Cluster::start(Options { workers: 1, tls: true, token: Some("t0k"), ..Default::default() }).await;
    let url = c.server();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let job = c.submit(&repo().join("tests/fixtures/distributed/slow.yaml"));
    let out = c.flower(&["status", &job, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A client that does not trust the CA cannot talk to it.
    let untrusted = std::process::Command::new(crate::support::FLOWER)
        .args(["status", "--server", &url, "--token", "t0k"])
        .env_remove("FLOWER_TLS_CA")
        .output()
        .unwrap();
    assert!(!untrusted.status.success());
    // Nor can a plain-text one.
    let plain = std::process::Command::new(crate::support::FLOWER)
        .args(["status", "--server", &url.replace("https://", "http://"), "--token", "t0k"])
        .output()
        .unwrap();
    assert!(!plain.status.success());
    c.wait_job(&job, "succeeded").await;
    c.stop().await;
}

/// The long-horizon reference job in distributed mode, and its context report over gRPC.
#[tokio::test(flavor = "multi_thread")]
async fn the_long_horizon_job_runs_on_a_cluster() {
    let mut c = Cluster::start(Options { workers: 3, concurrency: 2, ..Default::default() }).await;
    let out = c.flower(&["submit", repo().join("examples/long-horizon/job.yaml").to_str().unwrap(), "--watch"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let job = text.lines().next().unwrap().trim().to_string();
    let report = c.flower(&["context", &job, "--json"]);
    assert!(report.status.success(), "{}", String::from_utf8_lossy(&report.stderr));
    let r: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    assert!(r["main"]["turns"].as_u64().unwrap() >= 60);
    assert!(r["spills"].as_u64().unwrap() > 20);
    assert!(r["largest_spill_matched_result"].as_u64().unwrap() < 4000);
    assert!(r["main_slope_tokens_per_turn"].as_f64().unwrap() < 1000.0);
    c.stop().await;
}

/// A cluster running the interrupt fixture, its sleeper's `sleep 5` under way.
async fn sleeping_job() -> (Cluster, String) {
    let mut c = Cluster::start(Options { workers: 2, ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/interrupt.yaml"));
    c.wait_for(
        "the sleeper's Bash call",
        Duration::from_secs(30),
        &format!(
            "SELECT count(*) > 0 FROM entries WHERE job_id = '{job}' AND kind = 'assistant' AND body LIKE '%sleep 5%'"
        ),
    )
    .await;
    (c, job)
}

/// An interrupt is delivered at once: the waiting call gets a placeholder (the
/// task keeps running), the user's message follows, the same session goes on,
/// and the task's report arrives later as a notice.
#[tokio::test(flavor = "multi_thread")]
async fn an_interrupt_is_delivered_at_once_and_the_task_keeps_running() {
    let (mut c, job) = sleeping_job().await;
    let sent = c.flower(&["interrupt", &job, "--message", "also nap"]);
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    c.wait_job(&job, "succeeded").await;
    let pg = c.pg().await;
    let rows = pg
        .query(
            &format!(
                "SELECT e.kind, e.body FROM entries e JOIN sessions s ON s.id = e.session_id
                 WHERE s.job_id = '{job}' AND s.role = 'coordinator' ORDER BY e.seq"
            ),
            &[],
        )
        .await
        .unwrap();
    let main: Vec<(String, serde_json::Value)> =
        rows.iter().map(|r| (r.get::<_, String>(0), serde_json::from_str(r.get::<_, &str>(1)).unwrap())).collect();
    let placeholder = main
        .iter()
        .position(|(k, b)| k == "tool_result" && b.to_string().contains("still running"))
        .expect("a placeholder result");
    assert_eq!(main[placeholder].1["markers"]["interrupted"], true);
    assert_eq!(main[placeholder + 1].0, "user");
    assert!(main[placeholder + 1].1.to_string().contains("also nap"), "the message follows the placeholder");
    let notice = main
        .iter()
        .position(|(k, b)| k == "notice" && b.to_string().contains("rested"))
        .expect("the late report as a notice");
    assert!(notice > placeholder + 1);
    assert_eq!(
        main.iter().filter(|(k, _)| k == "assistant").count(),
        3,
        "one session went on: delegate, adjust, answer"
    );
    let tasks: i64 = pg
        .query_one(&format!("SELECT count(*) FROM tasks WHERE job_id = '{job}' AND state = 'succeeded'"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tasks, 2, "the interrupted task kept running to its end");
    c.stop().await;
}

/// A user's cancel of a running job reaches its owner: the job ends
/// `cancelled`, the owner stops its run and releases the job at once, and
/// the sleeping task does not end as a success.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_ends_the_running_job_and_its_owner_lets_it_go() {
    let (mut c, job) = sleeping_job().await;
    let sent = c.flower(&["cancel", &job]);
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    c.wait_job(&job, "cancelled").await;
    // The owner stopped the run and let the job go (a released lease has
    // expires_at 0; a running owner would keep renewing it).
    c.wait_for(
        "the owner to release the job",
        Duration::from_secs(4),
        &format!("SELECT expires_at = 0 FROM leases WHERE job_id = '{job}'"),
    )
    .await;
    let pg = c.pg().await;
    let succeeded: i64 = pg
        .query_one(&format!("SELECT count(*) FROM tasks WHERE job_id = '{job}' AND state = 'succeeded'"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(succeeded, 0, "the sleeping task did not run to its end");
    c.stop().await;
}

/// A task's message goes out with the first statements of the write that
/// creates its row, so a worker may claim it before the row's creation lock
/// is taken: the claim finds no row and is made again until the write
/// commits. Here the test writes a task the way a coordinator's turn does
/// (fenced, with the lease's epoch, the message staged) while it holds the
/// job's lease row, so the write waits at its first statement with the
/// message already out; once the worker counts a claim made early, the hold
/// ends, and the task runs as its first attempt.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_that_comes_before_its_task_row_is_made_again() {
    let mut c = Cluster::start(Options { workers: 1, metrics: true, ..Default::default() }).await;
    // A job whose coordinator waits for its user: nothing else runs.
    let job = c.submit(&repo().join("tests/fixtures/distributed/ask.yaml"));
    c.wait_job(&job, "waiting_for_user").await;
    let mut pg = c.pg().await;
    let lease = pg.query_one(&format!("SELECT epoch FROM leases WHERE job_id = '{job}'"), &[]).await.unwrap();
    let session = pg
        .query_one(&format!("SELECT id FROM sessions WHERE job_id = '{job}' AND role = 'coordinator'"), &[])
        .await
        .unwrap();
    let job_id: flower_model::JobId = job.parse().unwrap();
    let fence = flower_store::Fence { job: job_id, epoch: lease.get(0) };
    let parent = flower_model::SessionId(session.get(0));
    let task = flower_model::Task::queued(job_id, parent, "toolu_early", "scribe", "write the report", "Write it.");

    let config = flower_bus::NatsConfig::new(crate::cluster::nats_url(), c.prefix.clone());
    let queue: std::sync::Arc<dyn flower_bus::TaskQueue> =
        std::sync::Arc::new(flower_bus::NatsBus::connect(config).await.unwrap());
    let message = flower_bus::TaskMessage {
        job_id,
        task_id: task.id,
        worker: task.worker.clone(),
        epoch: fence.epoch,
        base_attempt: 0,
        trace: None,
        body: None,
        republish: 0,
        stream_notice: false,
    };
    let (published_tx, published) = tokio::sync::oneshot::channel();
    let published_tx = std::sync::Mutex::new(Some(published_tx));
    let staged = flower_store::Staged::new(move || {
        let (queue, message) = (queue.clone(), message.clone());
        let done = published_tx.lock().unwrap().take();
        tokio::spawn(async move {
            let took = queue.publish(message).await.unwrap();
            if let Some(done) = done {
                let _ = done.send(took);
            }
        });
    });

    let hold = pg.transaction().await.unwrap();
    hold.execute(&format!("SELECT 1 FROM leases WHERE job_id = '{job}' FOR UPDATE"), &[]).await.unwrap();
    let store = flower_store::PostgresStore::connect(&c.db.url, 1).await.unwrap();
    let write = tokio::spawn(async move {
        let batch =
            flower_store::Batch { tasks: vec![task], fence: Some(fence), staged: Some(staged), ..Default::default() };
        store.append(batch).await
    });
    let published = tokio::time::timeout(Duration::from_secs(30), published).await;
    assert!(published.expect("no message went out while its write waited").unwrap(), "taken as new");
    let metrics = c.workers[0].metrics_url();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while crate::metrics::value(&crate::metrics::scrape(&metrics).await, "flower_claims_early_total") < 1.0 {
        assert!(std::time::Instant::now() < deadline, "no claim came before its row");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rows: i64 =
        hold.query_one(&format!("SELECT count(*) FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    assert_eq!(rows, 0, "the write is still held");
    assert!(!write.is_finished(), "the write waits for the lease row");
    hold.rollback().await.unwrap();
    let written = write.await.unwrap().unwrap();
    assert!(matches!(written.tasks.as_slice(), [(_, true)]), "{:?}", written.tasks);

    c.wait_task(&job, "succeeded").await;
    let row = pg.query_one(&format!("SELECT attempt, report FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1, "claimed by the first delivery's claim, made again");
    assert_eq!(row.get::<_, String>(1).trim(), "report written");
    c.stop().await;
}

/// Acceptance (human channel): the job asks, waits in `waiting_for_user`;
/// the coordinator that asked is killed; the answer, sent over gRPC to the
/// surviving replica meanwhile, is not lost: the new owner asks nothing again,
/// takes the stored answer, and the job finishes with it. The question and
/// the answer are in `notes/qa-log.md`, and the log is in no context.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_sent_while_the_asking_coordinator_is_killed_is_not_lost() {
    let mut c = Cluster::start(Options { coordinators: 2, workers: 1, lease_ttl: "2s", ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/ask.yaml"));
    c.wait_job(&job, "waiting_for_user").await;
    let pg = c.pg().await;
    let owner: String =
        pg.query_one(&format!("SELECT owner FROM leases WHERE job_id = '{job}'"), &[]).await.unwrap().get(0);
    let victim = c.coordinators.iter_mut().find(|p| p.id() == owner).expect("the owner is one of ours");
    victim.kill9();

    // Bad answers are refused with statuses that say why, and store nothing.
    let out = c.flower(&["answer", &job, "--option", "3"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 options"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = c.flower(&["answer", &job, "--question", "toolu_nope", "CSV"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a question of this job"));

    let out = c.flower(&["answer", &job, "--option", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    c.wait_job(&job, "succeeded").await;
    let answer: String =
        pg.query_one(&format!("SELECT final_answer FROM jobs WHERE id = '{job}'"), &[]).await.unwrap().get(0);
    assert_eq!(answer, "asked: The user chose option 2: CSV / wrote: report written");
    let count = |kind: &'static str| {
        let (pg, job) = (&pg, job.clone());
        async move {
            let q = format!("SELECT count(*) FROM events WHERE job_id = '{job}' AND kind = '{kind}'");
            pg.query_one(&q, &[]).await.unwrap().get::<_, i64>(0)
        }
    };
    assert_eq!(count("question_asked").await, 1, "the new owner did not ask again");
    assert_eq!(count("question_answered").await, 1);
    let states: Vec<String> = pg
        .query(
            &format!("SELECT payload->>'state' FROM events WHERE job_id = '{job}' AND kind = 'job_state' ORDER BY seq"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(states.contains(&"waiting_for_user".to_string()), "{states:?}");
    assert_eq!(states.last().map(String::as_str), Some("succeeded"));

    let log = c.flower(&["artifacts", &job, "get", "notes/qa-log.md"]);
    assert!(log.status.success(), "{}", String::from_utf8_lossy(&log.stderr));
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(log.contains("Which format should the report use?") && log.contains("option 2: CSV"), "{log}");
    let leaked: i64 = pg
        .query_one(
            &format!(
                "SELECT count(*) FROM entries WHERE job_id = '{job}' AND body LIKE '%Questions, answers and messages%'"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(leaked, 0, "the log enters no context");

    // A side question over gRPC: its own session, the job untouched.
    let out = c.flower(&["aside", &job, "what happened?"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("had the report written"));
    let asides: i64 = pg
        .query_one(&format!("SELECT count(*) FROM sessions WHERE job_id = '{job}' AND role = 'aside'"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(asides, 1);
    let out = c.flower(&["aside", &job, ""]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("question"), "{}", String::from_utf8_lossy(&out.stderr));
    c.stop().await;
}

/// Acceptance (workflow, distributed): clarify → goal → coordinator → judge
/// (rejected once, accepted the second round) on a cluster, shown by
/// `flower status --server`; then `flower continue --server` (gRPC
/// `Continue`) makes a new job with its lineage, which a coordinator runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_clarified_judged_job_runs_on_a_cluster_and_continues_over_grpc() {
    let mut c = Cluster::start(Options { coordinators: 1, workers: 1, ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/workflow.yaml"));
    c.wait_job(&job, "succeeded").await;
    let status = |c: &mut Cluster, job: &str| -> serde_json::Value {
        let out = c.flower(&["status", job, "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let s = status(&mut c, &job);
    assert_eq!(s["final_answer"], "Report fixed: report written", "{s}");
    let verdicts: Vec<&str> =
        s["verdicts"].as_array().unwrap().iter().map(|v| v["verdict"].as_str().unwrap()).collect();
    assert_eq!(verdicts, vec!["not_yet", "achieved"]);
    assert_eq!(s["questions"][0]["answered_by"], "timeout", "the clarifier's question, unanswered");
    let steps: Vec<&str> = s["steps"].as_array().unwrap().iter().map(|s| s["label"].as_str().unwrap()).collect();
    assert_eq!(steps, vec!["clarify", "goal", "planner", "judge-1", "judge-2"], "each step its own session");
    let text = stdout(&c.flower(&["status", &job]));
    assert!(text.contains("judge round 1: not_yet (1 checks failed)"), "{text}");
    let brief = c.flower(&["artifacts", &job, "get", "notes/brief.md"]);
    assert!(String::from_utf8_lossy(&brief.stdout).contains("## Unknowns and assumptions"));

    // Continue it over gRPC; the same key returns the same continuation.
    let out =
        c.flower(&["continue", &job, "Also add a chart of the totals.", "--idempotency-key", "chart-1", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let made: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let child = made["job_id"].as_str().unwrap().to_string();
    assert_eq!(made["existing"], false);
    let again =
        c.flower(&["continue", &job, "Also add a chart of the totals.", "--idempotency-key", "chart-1", "--json"]);
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!((again["job_id"].as_str(), again["existing"].as_bool()), (Some(child.as_str()), Some(true)));
    let out = c.flower(&["continue", &job, " "]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("instruction"), "{}", String::from_utf8_lossy(&out.stderr));
    c.wait_job(&child, "succeeded").await;

    let s = status(&mut c, &child);
    assert_eq!(
        (s["continues"]["parent"].as_str(), s["state"].as_str()),
        (Some(job.as_str()), Some("succeeded")),
        "{s}"
    );
    let steps: Vec<&str> = s["steps"].as_array().unwrap().iter().map(|s| s["label"].as_str().unwrap()).collect();
    assert_eq!(steps.first(), Some(&"goal"), "the brief carried over, the goal set again: {steps:?}");
    assert_eq!(status(&mut c, &job)["continued_by"], serde_json::json!([child]));
    let brief = c.flower(&["artifacts", &child, "get", "notes/brief.md"]);
    assert!(String::from_utf8_lossy(&brief.stdout).contains("> Also add a chart of the totals."));
    let pg = c.pg().await;
    let first: String = pg
        .query_one(
            &format!(
                "SELECT e.body::text FROM entries e JOIN sessions s ON s.id = e.session_id
                 WHERE e.job_id = '{child}' AND s.role = 'coordinator' ORDER BY e.seq LIMIT 1"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(first.contains(&format!("This job continues job {job} (succeeded)")), "{first}");
    assert!(first.contains("Report fixed: report written"), "where the parent ended: {first}");
    c.stop().await;
}

/// The judge finds the goal unreachable on a cluster; the user, asked over
/// gRPC, accepts the result; the job succeeds with the answer judged.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_verdict_is_put_to_the_user_over_grpc() {
    let mut c = Cluster::start(Options { coordinators: 1, workers: 1, ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/distributed/unreachable.yaml"));
    c.wait_job(&job, "waiting_for_user").await;
    let s: serde_json::Value = serde_json::from_slice(&c.flower(&["status", &job, "--json"]).stdout).unwrap();
    assert_eq!(s["verdicts"][0]["verdict"], "unreachable", "{s}");
    assert_eq!(
        (s["questions"][0]["id"].as_str(), s["questions"][0]["answer"].as_str()),
        (Some("judge-1-unreachable"), None)
    );
    let out = c.flower(&["answer", &job, "--option", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    c.wait_job(&job, "succeeded").await;
    let s: serde_json::Value = serde_json::from_slice(&c.flower(&["status", &job, "--json"]).stdout).unwrap();
    assert_eq!(s["final_answer"], "counted: report written", "{s}");
    assert_eq!(s["questions"][0]["answered_by"], "user");
    c.stop().await;
}

/// Two providers on a cluster: the coordinator's calls on the Messages API,
/// the workers' on Chat Completions (the cluster's `sim` entry answers
/// both); `flower context --server` reports each provider's cache reads by
/// its own rule.
#[tokio::test(flavor = "multi_thread")]
async fn workers_on_chat_completions_run_on_a_cluster() {
    let mut c = Cluster::start(Options { workers: 2, console: true, ..Default::default() }).await;
    let out = c.flower(&["submit", repo().join("tests/fixtures/providers/job.yaml").to_str().unwrap(), "--watch"]);
    let text = stdout(&out);
    assert!(out.status.success(), "submit --watch: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("succeeded") && text.contains("data/ holds 15 files"), "{text}");
    let job = text.lines().next().unwrap().trim().to_string();
    let report = c.flower(&["context", &job, "--json"]);
    assert!(report.status.success(), "{}", String::from_utf8_lossy(&report.stderr));
    let report: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let line = |api: &str| report["providers"].as_array().unwrap().iter().find(|p| p["api"] == api).cloned().unwrap();
    let (messages, chat) = (line("messages"), line("chat_completions"));
    assert_eq!((messages["sessions"].as_u64(), chat["sessions"].as_u64()), (Some(1), Some(3)), "{report}");
    assert!(messages["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0, "{messages}");
    assert!(messages["usage"]["cache_creation_input_tokens"].as_u64().unwrap() > 0, "{messages}");
    let read = chat["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(read >= 1024 && read % 128 == 0, "{chat}");
    assert_eq!(chat["usage"]["cache_creation_input_tokens"], 0, "{chat}");
    // The coordinator's console asks the simulator (another process) for the
    // job's cache audit, both APIs' sessions in it, and keeps it beside the job.
    let console = c.coordinators[0].console_url();
    for _ in 0..2 {
        let page = reqwest::get(format!("{console}/jobs/{job}")).await.unwrap().text().await.unwrap();
        assert!(page.contains("Cache audit (simulator)") && page.contains(" 0 unexplained"), "{page}");
        assert!(
            page.contains("sim · chat completions: 3 session(s)") && page.contains("automatic prefix cache"),
            "{page}"
        );
    }
}
