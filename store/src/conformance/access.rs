//! Namespaces, API keys and the audit log: the checks every backend passes.

use flower_model::access::{ApiKey, AuditRecord, DEFAULT_NAMESPACE, Outcome, Role};
use flower_model::{JobId, now_ms};

use crate::{NewJob, Store, StoreError};

fn key(id: &str, namespace: &str, role: Role) -> ApiKey {
    ApiKey {
        id: id.into(),
        namespace: namespace.into(),
        role,
        name: "ci's key".into(),
        digest: format!("digest-of-{id}"),
        created_at: now_ms(),
        created_by: "token".into(),
        expires_at: Some(now_ms() + 60_000),
        last_used_at: None,
        revoked_at: None,
    }
}

async fn job_in(store: &dyn Store, namespace: &str, key: Option<&str>) -> (flower_model::Job, bool) {
    store
        .create_job(NewJob {
            id: JobId::random(),
            name: "t".into(),
            spec: serde_json::json!({}),
            idempotency_key: key.map(str::to_string),
            continues: None,
            namespace: namespace.into(),
            submitted_by: Some("key:0123456789abcdef".into()),
        })
        .await
        .unwrap()
}

pub async fn jobs_belong_to_a_namespace(store: &dyn Store) {
    let names: Vec<String> = store.namespaces().await.unwrap().into_iter().map(|n| n.name).collect();
    assert_eq!(names, vec![DEFAULT_NAMESPACE.to_string()], "`default` exists from the start");
    assert!(store.create_namespace("team-a").await.unwrap());
    assert!(!store.create_namespace("team-a").await.unwrap(), "a second create is told it exists");
    let (a, _) = job_in(store, "team-a", Some("k")).await;
    let (d, _) = job_in(store, DEFAULT_NAMESPACE, Some("k")).await;
    assert_ne!(a.id, d.id, "an idempotency key is unique within its namespace only");
    assert_eq!(a.idempotency_key.as_deref(), Some("k"), "the key reads back as given");
    assert_eq!((a.namespace.as_str(), a.submitted_by.as_deref()), ("team-a", Some("key:0123456789abcdef")));
    let (again, created) = job_in(store, "team-a", Some("k")).await;
    assert!(!created && again.id == a.id, "the same key in the same namespace names the first job");
    let only_a: Vec<JobId> = store.list_jobs(Some("team-a"), 10).await.unwrap().iter().map(|j| j.id).collect();
    assert_eq!(only_a, vec![a.id]);
    assert_eq!(store.list_jobs(None, 10).await.unwrap().len(), 2);
    assert!(store.list_jobs(Some("team-b"), 10).await.unwrap().is_empty());
    // A prefix is resolved among a namespace's jobs only: the other's never makes it ambiguous.
    let common = a.id.to_string().chars().zip(d.id.to_string().chars()).take_while(|(x, y)| x == y).count();
    let prefix = &a.id.to_string()[..common.max(1)];
    assert_eq!(store.resolve_job_in(Some("team-a"), prefix).await.unwrap(), a.id);
    let other = store.resolve_job_in(Some("team-b"), &a.id.to_string()).await;
    assert!(matches!(other, Err(StoreError::NotFound(_))), "{other:?}");
}

pub async fn keys_are_stored_revoked_and_rotated(store: &dyn Store) {
    let missing = store.create_key(key("00000000000000aa", "nowhere", Role::Viewer), None).await;
    assert!(matches!(missing, Err(StoreError::NotFound(_))), "{missing:?}");
    store.create_namespace("team-a").await.unwrap();
    let k = key("00000000000000a1", "team-a", Role::Operator);
    store.create_key(k.clone(), None).await.unwrap();
    assert_eq!(store.get_key(&k.id).await.unwrap(), k);
    assert!(matches!(store.get_key("ffffffffffffffff").await, Err(StoreError::NotFound(_))));
    store.touch_keys(vec![k.id.clone()], 500).await.unwrap();
    store.touch_keys(vec![k.id.clone()], 400).await.unwrap();
    assert_eq!(store.get_key(&k.id).await.unwrap().last_used_at, Some(500), "last use only moves forward");
    let other = key("00000000000000b1", DEFAULT_NAMESPACE, Role::Viewer);
    store.create_key(other.clone(), None).await.unwrap();
    assert_eq!(store.keys(Some("team-a")).await.unwrap().len(), 1);
    assert_eq!(store.keys(None).await.unwrap().len(), 2);
    let rotated = key("00000000000000a2", "team-a", Role::Operator);
    store.create_key(rotated.clone(), Some(k.id.clone())).await.unwrap();
    let old = store.get_key(&k.id).await.unwrap();
    assert_eq!(old.revoked_at, Some(rotated.created_at), "a rotation revokes the old key in the same write");
    let revoked = store.revoke_key(&rotated.id, 7).await.unwrap();
    assert_eq!(revoked.revoked_at, Some(7));
    assert_eq!(store.revoke_key(&rotated.id, 9).await.unwrap().revoked_at, Some(7), "the first revocation stands");
    assert!(matches!(store.revoke_key("ffffffffffffffff", 1).await, Err(StoreError::NotFound(_))));
    // A rotation of a key revoked meanwhile stores nothing.
    let late = key("00000000000000a3", "team-a", Role::Operator);
    let refused = store.create_key(late.clone(), Some(rotated.id.clone())).await;
    assert!(matches!(refused, Err(StoreError::KeyRevoked(_))), "{refused:?}");
    assert!(matches!(store.get_key(&late.id).await, Err(StoreError::NotFound(_))), "rolled back");
}

pub async fn the_audit_log_is_append_only_and_scoped(store: &dyn Store) {
    let record = |ns: &str, action: &str, outcome| AuditRecord {
        seq: 0,
        at: now_ms(),
        subject: "key:00000000000000a1".into(),
        namespace: ns.into(),
        action: action.into(),
        target: "t".into(),
        origin: "grpc 127.0.0.1:1".into(),
        outcome,
        detail: String::new(),
    };
    store.append_audit(vec![]).await.unwrap();
    store.append_audit(vec![record("a", "submit", Outcome::Ok), record("b", "cancel", Outcome::Denied)]).await.unwrap();
    store.append_audit(vec![record("a", "cancel", Outcome::Failed)]).await.unwrap();
    let all = store.audit_log(None, 0, 10).await.unwrap();
    assert_eq!(all.iter().map(|r| r.action.as_str()).collect::<Vec<_>>(), ["submit", "cancel", "cancel"]);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "in order of writing");
    assert_eq!(all[1].outcome, Outcome::Denied);
    let a = store.audit_log(Some("a"), 0, 10).await.unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(store.audit_log(Some("a"), a[0].seq, 10).await.unwrap().len(), 1, "after a sequence number");
    assert_eq!(store.audit_log(None, 0, 1).await.unwrap().len(), 1, "a limit");
}

pub async fn namespaces_keep_limits_and_count_spend(store: &dyn Store) {
    use flower_model::Usage;
    use flower_model::access::{Limits, day_of};

    assert!(store.create_namespace("team-s").await.unwrap());
    let fresh = store.namespace("team-s").await.unwrap();
    assert_eq!(fresh.limits, Limits::default(), "no limit until one is set");
    let limits = Limits {
        max_jobs: Some(2),
        cost_per_day_usd: Some(1.5),
        tokens_per_day: Some(10_000),
        wait: Some(std::time::Duration::from_secs(90)),
        ..Default::default()
    };
    assert_eq!(store.set_limits("team-s", &limits).await.unwrap().limits, limits);
    assert_eq!(store.namespace("team-s").await.unwrap().limits, limits, "read back");
    let listed = store.namespaces().await.unwrap().into_iter().find(|n| n.name == "team-s").unwrap();
    assert_eq!(listed.limits, limits);
    let missing = store.set_limits("team-none", &limits).await;
    assert!(matches!(missing, Err(StoreError::NotFound(_))), "{missing:?}");
    assert!(matches!(store.namespace("team-none").await, Err(StoreError::NotFound(_))));

    // Every usage charged to a job is counted on its namespace's day, per job.
    let (a, _) = job_in(store, "team-s", None).await;
    let (b, _) = job_in(store, "team-s", None).await;
    let (other, _) = job_in(store, DEFAULT_NAMESPACE, None).await;
    let mut u = Usage { input_tokens: 100, output_tokens: 20, ..Default::default() };
    u.cache_creation_input_tokens = 30;
    u.cache_creation.ephemeral_1h_input_tokens = 10;
    u.cache_creation.ephemeral_5m_input_tokens = 20;
    u.cache_read_input_tokens = 40;
    let today = day_of(now_ms());
    store.append(crate::Batch { usage: Some((a.id, u)), ..Default::default() }).await.unwrap();
    store.append(crate::Batch { usage: Some((a.id, u)), ..Default::default() }).await.unwrap();
    store.append(crate::Batch { usage: Some((b.id, u)), ..Default::default() }).await.unwrap();
    store.append(crate::Batch { usage: Some((other.id, u)), ..Default::default() }).await.unwrap();
    let spend = store.spend("team-s", today - 1).await.unwrap();
    assert_eq!(spend.len(), 2, "one row per job and day: {spend:?}");
    let of = |job: JobId| spend.iter().find(|s| s.job == job).unwrap();
    let mut twice = u;
    twice.add(&u);
    let day = of(a.id).day;
    assert!(day == today || day == today + 1, "counted on the day of the write");
    assert_eq!(of(a.id).usage, twice, "both writes of job a, every kind of token");
    assert_eq!(of(b.id).usage, u);
    assert!(store.spend("team-s", today + 2).await.unwrap().is_empty(), "nothing from a later day");
    assert_eq!(store.spend(DEFAULT_NAMESPACE, today - 1).await.unwrap().len(), 1, "namespaces apart");
}

pub async fn a_namespaces_max_jobs_holds_its_queued_jobs(store: &dyn Store) {
    use flower_model::JobState;
    use flower_model::access::Limits;

    assert!(store.create_namespace("team-j").await.unwrap());
    store.set_limits("team-j", &Limits { max_jobs: Some(1), ..Default::default() }).await.unwrap();
    let first = job_in(store, "team-j", None).await.0.id;
    let second = job_in(store, "team-j", None).await.0.id;
    let elsewhere = job_in(store, DEFAULT_NAMESPACE, None).await.0.id;
    let now = now_ms();
    let orphans = store.orphaned_jobs(now, 10).await.unwrap();
    assert!(orphans.contains(&first) && orphans.contains(&second), "none runs yet: both may be tried");
    assert!(store.acquire_lease(first, "r1", 60_000).await.unwrap().is_some());
    assert_eq!(store.acquire_lease(second, "r2", 60_000).await.unwrap(), None, "one job of team-j at a time");
    assert!(store.acquire_lease(elsewhere, "r2", 60_000).await.unwrap().is_some(), "other namespaces unaffected");
    store.set_job_state(first, JobState::Running, None, None, None).await.unwrap();
    let orphans = store.orphaned_jobs(now_ms(), 10).await.unwrap();
    assert!(!orphans.contains(&second), "a held job is not offered while its namespace is full: {orphans:?}");
    // A started job whose lease expired is offered whatever the limit.
    assert!(store.orphaned_jobs(now_ms() + 120_000, 10).await.unwrap().contains(&first));
    store.set_job_state(first, JobState::Succeeded, None, None, None).await.unwrap();
    assert!(store.orphaned_jobs(now_ms(), 10).await.unwrap().contains(&second), "a slot freed");
    assert!(store.acquire_lease(second, "r2", 60_000).await.unwrap().is_some());
    store.set_limits("team-j", &Limits::default()).await.unwrap();
}

pub async fn a_namespaces_max_tasks_admits_its_held_tasks_in_turn(store: &dyn Store) {
    use flower_model::access::Limits;
    use flower_model::{SessionId, Task, TaskOutcome, TaskState};

    use crate::Claim;

    assert!(store.create_namespace("team-t").await.unwrap());
    let job = job_in(store, "team-t", None).await.0.id;
    let other = job_in(store, "team-t", None).await.0.id;
    let session = SessionId::random();
    let task = |job, i: usize| Task::queued(job, session, &format!("toolu_{i}"), "w", "d", "go");
    // One task queued before the limit was set; four held (whatever their
    // creator thought), in two jobs.
    let running = store.create_task(task(job, 0), None).await.unwrap().0;
    assert_eq!(running.state, TaskState::Queued);
    store.set_limits("team-t", &Limits { max_tasks: Some(2), ..Default::default() }).await.unwrap();
    let mut held = Vec::new();
    for (i, j) in [(1, job), (2, other), (3, job), (4, other)] {
        let (row, created, _) = store.create_task(task(j, i), None).await.unwrap();
        assert!(created && row.state == TaskState::Held, "{row:?}");
        held.push(row.id);
        // Created in this order: the oldest first.
        while now_ms() <= row.created_at {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(store.task_counts("team-t").await.unwrap(), crate::TaskCounts { live: 1, held: 4 });
    // A held task's stray message does not run it.
    assert!(matches!(store.claim_task(held[0], 1, "w1").await.unwrap(), Claim::Superseded { .. }));
    assert_eq!(store.get_task(held[0]).await.unwrap().state, TaskState::Held);

    let admitted = store.admit_tasks("team-t", &held).await.unwrap();
    assert_eq!(admitted.iter().map(|t| t.id).collect::<Vec<_>>(), vec![held[0]], "one place: the oldest");
    assert_eq!(store.get_task(held[0]).await.unwrap().state, TaskState::Queued);
    assert!(store.admit_tasks("team-t", &held[1..]).await.unwrap().is_empty(), "full: 2 of 2");
    // Other namespaces are not counted.
    let elsewhere = job_in(store, DEFAULT_NAMESPACE, None).await.0.id;
    let free = store.create_task(task(elsewhere, 9), None).await.unwrap().0;
    assert_eq!(free.state, TaskState::Queued, "a namespace without a task limit holds none");

    // A task ends: one more goes.
    assert!(matches!(store.claim_task(running.id, 1, "w1").await.unwrap(), Claim::Claimed { .. }));
    let done = TaskOutcome::Succeeded { report: "ok".into() };
    store.finish_task(running.id, 1, done, Default::default()).await.unwrap();
    let admitted = store.admit_tasks("team-t", &held).await.unwrap();
    assert_eq!(admitted.iter().map(|t| t.id).collect::<Vec<_>>(), vec![held[1]]);
    assert_eq!(store.task_counts("team-t").await.unwrap(), crate::TaskCounts { live: 2, held: 2 });

    // A cancel ends held tasks too; the limit lifted admits the rest.
    store.cancel_tasks(other, "stop").await.unwrap();
    assert_eq!(store.get_task(held[3]).await.unwrap().state, TaskState::Cancelled);
    store.set_limits("team-t", &Limits::default()).await.unwrap();
    let admitted = store.admit_tasks("team-t", &held).await.unwrap();
    assert_eq!(admitted.iter().map(|t| t.id).collect::<Vec<_>>(), vec![held[2]], "the rest still held");
}

pub async fn routes_share_their_rate_limits(store: &dyn Store) {
    use flower_model::quota::{Claimant, Limit, Quota};

    let route = "anthropic|http://127.0.0.1:1|k:0123456789ab|m";
    let t0 = now_ms();
    let claim = Claimant::new("team-a", "job-1", 3);
    let ticket = std::sync::atomic::AtomicU64::new(1);
    let admit = |tokens: u64, at: i64| {
        let n = ticket.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let claim = claim.clone();
        async move { store.admit_quota(route, &claim, n, tokens, at).await }
    };
    assert_eq!(admit(1_000_000, t0).await.unwrap(), None, "no limit known: it goes");
    store.charge_quota(route, 5.0, 5.0, t0).await.unwrap();
    assert!(store.route_quotas().await.unwrap().is_empty(), "charging an unknown route stores nothing");

    let limits =
        Quota { requests_per_minute: Some(3), input_tokens_per_minute: Some(1_000), output_tokens_per_minute: None };
    store.learn_quota(route, limits, None, None, t0).await.unwrap();
    // Admissions from many callers at once: exactly the limit goes.
    let admitted = futures::future::join_all((0..8).map(|_| admit(10, t0))).await;
    let went = admitted.iter().filter(|a| matches!(a, Ok(None))).count();
    assert_eq!(went, 3, "{admitted:?}");
    let wait = admitted.into_iter().find_map(|a| a.unwrap()).unwrap();
    assert_eq!((wait.limit, wait.per_minute), (Limit::Requests, 3));
    assert!((1..=20_000).contains(&wait.ms), "a third of a minute at most: {wait:?}");
    // Later, input tokens: what a request used above its estimate is charged.
    // Later, when the calls left waiting above are gone (past their leases).
    let later = t0 + 200_000;
    assert_eq!(admit(100, later).await.unwrap(), None);
    store.charge_quota(route, 900.0, 0.0, later).await.unwrap();
    let wait = admit(100, later).await.unwrap().unwrap();
    assert_eq!(wait.limit, Limit::InputTokens, "1,000 of 1,000 used");
    // A provider's refusal drains every bucket for its wait; new limits keep what was used.
    store.learn_quota(route, limits, None, Some(30_000), later + 60_000).await.unwrap();
    assert!(admit(1, later + 60_000).await.unwrap().unwrap().ms >= 30_000);
    let raised = Quota { requests_per_minute: Some(1_000_000), input_tokens_per_minute: None, ..limits };
    store.learn_quota(route, raised, None, None, later + 200_000).await.unwrap();
    assert_eq!(admit(1_000_000, later + 200_000).await.unwrap(), None);
    let all = store.route_quotas().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].0.as_str(), all[0].1.buckets.quota), (route, raised));

    // Who goes first: an urgent call asking after others goes before them,
    // and each is told when its turn comes.
    let line = "anthropic|http://127.0.0.1:1|k:0123456789ab|line";
    let per_second = Quota { requests_per_minute: Some(60), ..Quota::default() };
    let none_left = Quota { requests_per_minute: Some(0), ..Quota::default() };
    store.learn_quota(line, per_second, Some(none_left), None, t0).await.unwrap();
    let (low, urgent) = (Claimant::new("team-a", "job-1", 5), Claimant::new("team-b", "job-2", 1));
    for (n, turn) in [(100, 1_000), (101, 2_000)] {
        let wait = store.admit_quota(line, &low, n, 10, t0).await.unwrap().unwrap();
        assert_eq!(wait.ms, turn, "told when its turn comes");
    }
    let wait = store.admit_quota(line, &urgent, 200, 10, t0 + 1).await.unwrap().unwrap();
    assert_eq!(wait.ms, 999, "first in line");
    assert!(store.admit_quota(line, &low, 100, 10, t0 + 1_000).await.unwrap().is_some(), "the urgent call's turn");
    let waiting = store.route_quotas().await.unwrap().into_iter().find(|(r, _)| r == line).unwrap().1;
    let mut jobs: Vec<_> = waiting.waiting_at(t0 + 1_000).map(|w| w.claim.job.as_str()).collect();
    jobs.sort();
    assert_eq!(jobs, ["job-1", "job-1", "job-2"], "who waits is there for every process to show");
    assert_eq!(store.admit_quota(line, &urgent, 200, 10, t0 + 1_000).await.unwrap(), None);
    assert_eq!(store.admit_quota(line, &low, 100, 10, t0 + 2_000).await.unwrap(), None);
}
