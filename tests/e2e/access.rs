//! Many teams on one deployment: two namespaces with their own keys on a
//! cluster (real coordinator, worker, Postgres, NATS), each seeing and
//! controlling only its own jobs through the CLI, every RPC and the console;
//! every kind of bad credential on every RPC gets its status and changes
//! nothing; the audit log shows the refused attempts.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use tonic::Code;

use crate::cluster::{Cluster, Options};
use crate::hostile::{RPCS, Rpc, send};
use crate::support::repo;

const TOKEN: &str = "access-s3cret";

/// `flower ARGS` with `credential`, its JSON output.
fn as_(c: &mut Cluster, credential: &str, args: &[&str]) -> Result<Value, String> {
    let server = c.server();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flower"))
        .args(args)
        .env("FLOWER_SERVER", server)
        .env("FLOWER_TOKEN", credential)
        .env("FLOWER_HOME", c.client_home.path())
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).to_string());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(serde_json::from_str(text.trim()).unwrap_or(Value::String(text.trim().to_string())))
}

fn key(c: &mut Cluster, namespace: &str, role: &str) -> (String, String) {
    let made = as_(c, TOKEN, &["auth", "create", "--namespace", namespace, "--role", role, "--json"]).unwrap();
    (made["key"]["id"].as_str().unwrap().to_string(), made["secret"].as_str().unwrap().to_string())
}

fn jwt(claims: Value, pem: &str) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("test-1".into());
    let pem = std::fs::read(repo().join("coordinator/tests/fixtures/jwt").join(pem)).unwrap();
    jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_ec_pem(&pem).unwrap()).unwrap()
}

/// One MCP tool call over streamable HTTP with `bearer`: its result.
async fn mcp_call(url: &str, bearer: Option<&str>, tool: &str, arguments: Value) -> Value {
    let http = reqwest::Client::new();
    let post = |body: Value, session: Option<String>| {
        let mut r = http
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(b) = bearer {
            r = r.bearer_auth(b.to_string());
        }
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        r.send()
    };
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "access-test", "version": "0"}}});
    let r = post(init, None).await.unwrap();
    assert!(r.status().is_success(), "initialize: {}", r.status());
    let session = r.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_string());
    r.text().await.unwrap();
    let done = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(done, session.clone()).await.unwrap().text().await.unwrap();
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}});
    let text = post(call, session).await.unwrap().text().await.unwrap();
    let body = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|l| l.contains("\"id\":2"));
    let reply: Value = serde_json::from_str(body.unwrap_or(text.trim())).unwrap();
    reply["result"].clone()
}

/// A form body, URL-encoded.
fn form(pairs: &[(&str, &str)]) -> String {
    let enc = |v: &str| {
        v.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs.iter().map(|(k, v)| format!("{k}={}", enc(v))).collect::<Vec<_>>().join("&")
}

fn claims(namespace: &str, role: &str, exp_in: i64) -> Value {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    serde_json::json!({"iss": "https://idp.example", "aud": "flower", "sub": "carol@example",
        "exp": now + exp_in, "flower_namespace": namespace, "flower_role": role})
}

/// Acceptance: two namespaces, each sees and controls only its own jobs in
/// every front-end; an operator key of one cannot touch the other; the
/// refusal matrix over every RPC; the audit log.
#[tokio::test(flavor = "multi_thread")]
async fn two_namespaces_share_a_cluster_and_each_sees_only_its_own() {
    let mut c =
        Cluster::start(Options { workers: 1, token: Some(TOKEN), console: true, jwt: true, ..Default::default() })
            .await;
    for ns in ["team-a", "team-b"] {
        as_(&mut c, TOKEN, &["auth", "namespace", "create", ns, "--json"]).unwrap();
    }
    let (_, a_sub) = key(&mut c, "team-a", "submitter");
    let (_, a_other_sub) = key(&mut c, "team-a", "submitter");
    let (_, a_op) = key(&mut c, "team-a", "operator");
    let (_, a_viewer) = key(&mut c, "team-a", "viewer");
    let (_, b_op) = key(&mut c, "team-b", "operator");
    let (revoked_id, revoked) = key(&mut c, "team-a", "operator");
    as_(&mut c, &a_op, &["auth", "revoke", &revoked_id, "--json"]).unwrap();
    let expiring = as_(
        &mut c,
        TOKEN,
        &["auth", "create", "--namespace", "team-a", "--role", "operator", "--expires-in", "1s", "--json"],
    )
    .unwrap();
    let expired = expiring["secret"].as_str().unwrap().to_string();
    let spec = |name: &str| repo().join("tests/fixtures/distributed").join(name).display().to_string();

    // Each team submits (team a's job waits for its user); each lists only its own.
    let a_job =
        as_(&mut c, &a_sub, &["submit", &spec("ask.yaml"), "--json"]).unwrap()["job_id"].as_str().unwrap().to_string();
    let b_job =
        as_(&mut c, &b_op, &["submit", &spec("slow.yaml"), "--json"]).unwrap()["job_id"].as_str().unwrap().to_string();
    c.wait_job(&a_job, "waiting_for_user").await;
    let listed =
        |v: Value| v.as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert_eq!(listed(as_(&mut c, &a_viewer, &["status", "--json"]).unwrap()), vec![a_job.clone()]);
    assert_eq!(listed(as_(&mut c, &b_op, &["status", "--json"]).unwrap()), vec![b_job.clone()]);
    let all = listed(as_(&mut c, TOKEN, &["status", "--json"]).unwrap());
    assert!(all.contains(&a_job) && all.contains(&b_job), "the admin sees both");
    let e = as_(&mut c, &b_op, &["cancel", &a_job]).unwrap_err();
    assert!(e.contains("not found"), "team b's operator: {e}");
    let e = as_(&mut c, &b_op, &["auth", "list", "--namespace", "team-a", "--json"]).unwrap_err();
    assert!(e.contains("PermissionDenied") || e.contains("does not allow"), "{e}");

    // The refusal matrix: every RPC, every bad credential.
    let channel = tonic::transport::Channel::from_shared(c.server()).unwrap().connect().await.unwrap();
    while flower_model::now_ms() <= expiring["key"]["expires_at"].as_i64().unwrap() {
        tokio::task::yield_now().await;
    }
    let mut tampered = jwt(claims("team-a", "operator", 600), "es256.pem");
    tampered.push_str("AA");
    let b64 = |v: Value| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let none = format!(
        "{}.{}.",
        b64(serde_json::json!({"alg": "none", "kid": "test-1"})),
        b64(claims("team-a", "admin", 600))
    );
    let mut bad: Vec<(&str, Option<String>, Code)> = vec![
        ("no credential", None, Code::Unauthenticated),
        ("a wrong token", Some("Bearer access-s3creT".into()), Code::Unauthenticated),
        ("not a bearer", Some(format!("Basic {TOKEN}")), Code::Unauthenticated),
        ("a revoked key", Some(format!("Bearer {revoked}")), Code::Unauthenticated),
        ("an expired key", Some(format!("Bearer {expired}")), Code::Unauthenticated),
        ("another key's secret", Some(format!("Bearer {}0000", &a_op[..a_op.len() - 4])), Code::Unauthenticated),
        ("a JWT with a bad signature", Some(format!("Bearer {tampered}")), Code::Unauthenticated),
        (
            "a JWT of another key",
            Some(format!("Bearer {}", jwt(claims("team-a", "admin", 600), "attacker.pem"))),
            Code::Unauthenticated,
        ),
        ("a JWT with alg none", Some(format!("Bearer {none}")), Code::Unauthenticated),
        (
            "an expired JWT",
            Some(format!("Bearer {}", jwt(claims("team-a", "admin", -3600), "es256.pem"))),
            Code::Unauthenticated,
        ),
    ];
    for (field, value, label) in
        [("aud", "other", "a JWT for another audience"), ("iss", "https://evil.example", "a JWT of another issuer")]
    {
        let mut c = claims("team-a", "admin", 600);
        c[field] = value.into();
        bad.push((label, Some(format!("Bearer {}", jwt(c, "es256.pem"))), Code::Unauthenticated));
    }
    let mut wrong = Vec::new();
    let mut sent = 0;
    for rpc in RPCS {
        let body = match rpc {
            Rpc::Submit | Rpc::List => rpc.valid(),
            _ => rpc.with_job(&a_job),
        };
        for (label, auth, want) in &bad {
            let s = send(&channel, rpc, body.clone(), auth.as_deref()).await;
            sent += 1;
            if s.code() != *want {
                wrong.push(format!("{rpc:?} with {label}: want {want:?}, got {:?}: {}", s.code(), s.message()));
            }
        }
        // Team b's operator: team a's job does not exist (a submit and a list are its own).
        if !matches!(rpc, Rpc::Submit | Rpc::List) {
            let s = send(&channel, rpc, body.clone(), Some(&format!("Bearer {b_op}"))).await;
            sent += 1;
            if s.code() != Code::NotFound {
                wrong.push(format!("{rpc:?} by another namespace: want NotFound, got {:?}: {}", s.code(), s.message()));
            }
        }
    }
    // Roles: a viewer mutating, a submitter cancelling someone else's job.
    for (label, who, rpc) in [
        ("a viewer submitting", &a_viewer, Rpc::Submit),
        ("a viewer cancelling", &a_viewer, Rpc::Cancel),
        ("a viewer interrupting", &a_viewer, Rpc::Interrupt),
        ("a viewer answering", &a_viewer, Rpc::Answer),
        ("a viewer continuing", &a_viewer, Rpc::Continue),
        ("a viewer asking aside", &a_viewer, Rpc::Aside),
        ("a submitter cancelling another's job", &a_other_sub, Rpc::Cancel),
        ("a submitter messaging another's job", &a_other_sub, Rpc::Interrupt),
    ] {
        let body = if rpc == Rpc::Submit { rpc.valid() } else { rpc.with_job(&a_job) };
        let s = send(&channel, rpc, body, Some(&format!("Bearer {who}"))).await;
        sent += 1;
        if s.code() != Code::PermissionDenied {
            wrong.push(format!("{label}: want PermissionDenied, got {:?}: {}", s.code(), s.message()));
        }
    }
    assert!(wrong.is_empty(), "{} of {sent} requests got the wrong status:\n{}", wrong.len(), wrong.join("\n"));
    let state = as_(&mut c, TOKEN, &["status", &a_job, "--json"]).unwrap();
    assert_ne!(state["state"], "cancelled", "no refused call changed the job");

    // A signed token of team a works without a flower key.
    let carol = jwt(claims("team-a", "viewer", 600), "es256.pem");
    assert_eq!(listed(as_(&mut c, &carol, &["status", "--json"]).unwrap()), vec![a_job.clone()]);
    let who = as_(&mut c, &carol, &["auth", "whoami", "--json"]).unwrap();
    assert_eq!((who["namespace"].as_str(), who["role"].as_str()), (Some("team-a"), Some("viewer")));

    // The console: team b's operator signs in and does not find team a's job;
    // a viewer's cancel is refused; a bad key signs in to nothing.
    let console = c.coordinators[0].console_url();
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let page = |cred: &str, path: &str| http.get(format!("{console}{path}")).bearer_auth(cred.to_string()).send();
    assert_eq!(page(&b_op, &format!("/jobs/{a_job}")).await.unwrap().status(), 404);
    assert_eq!(page(&a_viewer, &format!("/jobs/{a_job}")).await.unwrap().status(), 200);
    assert_eq!(page(&revoked, "/").await.unwrap().status(), 401);
    let deep = http.get(format!("{console}/jobs/{a_job}")).send().await.unwrap();
    assert_eq!(deep.status(), 401);
    let login_cookie = deep.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let sign_in_page = deep.text().await.unwrap();
    assert!(sign_in_page.contains(&format!("value=\"/jobs/{a_job}\"")), "the sign-in form keeps the deep link");
    let login_csrf = sign_in_page.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap();
    let sign_in = |cookie: Option<&str>, csrf: &str| {
        let mut r = http
            .post(format!("{console}/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("token", a_viewer.as_str()), ("next", &format!("/jobs/{a_job}")), ("csrf", csrf)]));
        if let Some(c) = cookie {
            r = r.header("cookie", c.to_string());
        }
        r.send()
    };
    // A sign-in posted from elsewhere (no form cookie: SameSite=Strict) signs nobody in.
    for (cookie, csrf) in [(None, login_csrf), (Some(login_cookie.as_str()), "0123"), (Some(login_cookie.as_str()), "")]
    {
        let forged = sign_in(cookie, csrf).await.unwrap();
        assert_eq!(forged.status(), 403, "a sign-in without the form's value");
        let set =
            forged.headers().get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_string()).collect::<Vec<_>>();
        assert!(set.iter().all(|c| !c.starts_with("flower_console=")), "no session: {set:?}");
    }
    let signed = sign_in(Some(&login_cookie), login_csrf).await.unwrap();
    assert_eq!(signed.status(), 303);
    assert_eq!(signed.headers()["location"], format!("/jobs/{a_job}").as_str(), "back to the deep link");
    let cookie = signed.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    assert!(!cookie.contains(&a_viewer), "the cookie is not the key");
    let job_page = http.get(format!("{console}/jobs/{a_job}")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(job_page.status(), 200);
    let html = job_page.text().await.unwrap();
    let csrf = html.split("name=\"csrf\" value=\"").nth(1).map(|r| r.split('"').next().unwrap().to_string());
    let cancel = http
        .post(format!("{console}/jobs/{a_job}/cancel"))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("csrf", csrf.unwrap_or_default().as_str()), ("reason", "viewer")]))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 403, "a viewer's cancel from the console");
    let out = http.post(format!("{console}/logout")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(out.status(), 303);
    let after = http.get(format!("{console}/jobs/{a_job}")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(after.status(), 401, "signed out");

    // A job whose budget runs out waits for a raise: not team b's to give,
    // nor a viewer's; team a's operator raises it and the job finishes.
    let dir = tempfile::tempdir().unwrap();
    let budgeted = dir.path().join("budgeted.yaml");
    let text = std::fs::read_to_string(spec("slow.yaml")).unwrap();
    std::fs::write(&budgeted, format!("{text}runtime:\n  budget: {{max_tokens: 1, wait: 5m}}\n")).unwrap();
    let budgeted = budgeted.display().to_string();
    let c_job = as_(&mut c, &a_sub, &["submit", &budgeted, "--json"]).unwrap()["job_id"].as_str().unwrap().to_string();
    c.wait_job(&c_job, "waiting_for_budget").await;
    let e = as_(&mut c, &b_op, &["answer", &c_job, "--option", "1"]).unwrap_err();
    assert!(e.contains("not found"), "{e}");
    let e = as_(&mut c, &a_viewer, &["answer", &c_job, "--option", "1"]).unwrap_err();
    assert!(e.contains("PermissionDenied") || e.contains("does not allow"), "{e}");
    as_(&mut c, &a_op, &["answer", &c_job, "raise it to 100000000 tokens"]).unwrap();
    c.wait_job(&c_job, "succeeded").await;

    // MCP over HTTP: each request acts as its bearer (forwarded to the service).
    let mcp = crate::cluster::Proc::spawn(
        &["mcp-serve", "--server", &c.server(), "--http", "127.0.0.1:0"],
        &[("FLOWER_TOKEN".to_string(), TOKEN.to_string())],
    );
    let url = mcp.url();
    let seen = mcp_call(&url, Some(&a_viewer), "job_status", serde_json::json!({"job_id": a_job})).await;
    assert_eq!(seen["isError"], false, "team a's viewer sees its job: {seen}");
    let hidden = mcp_call(&url, Some(&b_op), "job_status", serde_json::json!({"job_id": a_job})).await;
    assert_eq!(hidden["isError"], true, "{hidden}");
    assert!(hidden.to_string().contains("not found") || hidden.to_string().contains("no job"), "{hidden}");
    let refused = mcp_call(&url, Some(&a_viewer), "cancel_job", serde_json::json!({"job_id": a_job})).await;
    assert_eq!(refused["isError"], true, "{refused}");
    assert!(refused.to_string().contains("may not"), "a viewer's cancel over MCP: {refused}");

    // Team a's operator cancels its submitter's job.
    as_(&mut c, &a_op, &["cancel", &a_job, "--reason", "operator"]).unwrap();
    c.wait_job(&a_job, "cancelled").await;

    // The audit log: the refused mutations, anonymous and denied, with where from.
    let log = as_(&mut c, TOKEN, &["audit", "--limit", "1000", "--json"]).unwrap();
    let log = log.as_array().unwrap();
    let mut outcomes: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in log {
        *outcomes.entry((r["action"].as_str().unwrap().into(), r["outcome"].as_str().unwrap().into())).or_default() +=
            1;
    }
    for (action, outcome) in [
        ("cancel", "unauthenticated"),
        ("cancel", "denied"),
        ("submit", "denied"),
        ("cancel", "ok"),
        ("key.create", "ok"),
        ("key.revoke", "ok"),
        ("interrupt", "denied"),
    ] {
        assert!(
            outcomes.contains_key(&(action.to_string(), outcome.to_string())),
            "{action} {outcome} in the audit log: {outcomes:?}"
        );
    }
    assert!(
        log.iter().all(|r| r["origin"].as_str().unwrap().starts_with("grpc ")
            || r["origin"].as_str().unwrap().starts_with("console "))
    );
    let a_log = as_(&mut c, &a_op, &["audit", "--limit", "1000", "--json"]).unwrap();
    assert!(
        a_log.as_array().unwrap().iter().all(|r| r["namespace"] == "team-a"),
        "an operator reads its namespace's log"
    );
    assert!(as_(&mut c, &a_viewer, &["audit", "--json"]).is_err(), "a viewer does not read the audit log");
    c.stop().await;
}

/// Acceptance: a job whose namespace's daily cost budget runs out mid-run
/// waits in `waiting_for_budget` and asks; only an operator of the namespace
/// raises it, and the job finishes. Raised by an admin's new limits, a
/// waiting job goes on too. Without an answer, it ends `failed` with the
/// namespace's budget as its reason after the namespace's wait, its
/// transcript kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_namespaces_spent_budget_pauses_its_jobs_until_an_operator_raises_it() {
    // Three slots: a limit of one task at a time is the namespace's, not the worker's.
    let opts = Options { workers: 1, concurrency: 3, token: Some(TOKEN), ..Default::default() };
    let mut c = Cluster::start(opts).await;
    as_(&mut c, TOKEN, &["auth", "namespace", "create", "team-c", "--json"]).unwrap();
    let (_, sub) = key(&mut c, "team-c", "submitter");
    let (_, op) = key(&mut c, "team-c", "operator");
    let spec = repo().join("tests/fixtures/distributed/slow.yaml").display().to_string();
    let tiny = ["--cost-per-day", "0.000001", "--wait", "5m", "--json"];
    let set = as_(&mut c, TOKEN, &[&["auth", "namespace", "limits", "team-c"][..], &tiny].concat()).unwrap();
    assert_eq!(set["limits"]["cost_per_day_usd"], 0.000001, "{set}");
    as_(&mut c, TOKEN, &["auth", "namespace", "limits", "team-c", "--clear", "--json"]).unwrap();
    let e = as_(&mut c, &op, &["auth", "namespace", "limits", "team-c", "--cost-per-day", "5"]).unwrap_err();
    assert!(e.contains("may not"), "limits are an admin's to set: {e}");

    // One job of team c at a time: the second starts when the first ended.
    as_(&mut c, TOKEN, &["auth", "namespace", "limits", "team-c", "--max-jobs", "1", "--json"]).unwrap();
    let one = as_(&mut c, &sub, &["submit", &spec, "--json"]).unwrap()["job_id"].as_str().unwrap().to_string();
    let two = as_(&mut c, &sub, &["submit", &spec, "--json"]).unwrap()["job_id"].as_str().unwrap().to_string();
    c.wait_job(&one, "running").await;
    let held = as_(&mut c, &sub, &["auth", "namespace", "show", "--json"]).unwrap();
    let one_ended = as_(&mut c, &sub, &["status", &one, "--json"]).unwrap().to_string().contains("succeeded");
    assert!(held["spend"]["queued"] == 1 || one_ended, "the second job is held, and says so: {held}");
    c.wait_job(&two, "succeeded").await;
    let state_at = |job: &str, state: &str, f: &str| {
        format!(
            "(SELECT {f}(at) FROM events WHERE job_id = '{job}' AND kind = 'job_state' AND payload->>'state' = '{state}')"
        )
    };
    let after = format!("SELECT {} >= {}", state_at(&two, "running", "min"), state_at(&one, "succeeded", "max"));
    c.wait_for("the second job to have started after the first ended", Duration::from_secs(5), &after).await;
    as_(&mut c, TOKEN, &["auth", "namespace", "limits", "team-c", "--clear", "--json"]).unwrap();

    // One task of team c at a time: a fan-out of three runs them one after
    // the other, the others held meanwhile (no message, no worker slot).
    let set = as_(&mut c, TOKEN, &["auth", "namespace", "limits", "team-c", "--max-tasks", "1", "--json"]).unwrap();
    assert_eq!(set["limits"]["max_tasks"], 1, "{set}");
    let fanout = repo().join("tests/fixtures/distributed/fanout.yaml").display().to_string();
    let job = as_(&mut c, &sub, &["submit", &fanout, "--json"]).unwrap()["job_id"].as_str().unwrap().to_string();
    let held = format!("SELECT count(*) >= 1 FROM tasks WHERE job_id = '{job}' AND state = 'held'");
    c.wait_for("a task held by the namespace's task limit", Duration::from_secs(60), &held).await;
    let shown = as_(&mut c, &sub, &["auth", "namespace", "show", "--json"]).unwrap();
    let ended = as_(&mut c, &sub, &["status", &job, "--json"]).unwrap().to_string().contains("succeeded");
    assert!(shown["spend"]["held_tasks"].as_u64() >= Some(1) || ended, "held tasks are shown: {shown}");
    assert!(shown["spend"]["live_tasks"].as_u64() <= Some(1), "one at a time: {shown}");
    c.wait_job(&job, "succeeded").await;
    let spans = format!(
        "SELECT payload->>'task' AS t, min(at) FILTER (WHERE kind = 'task_started') AS s,
                max(at) FILTER (WHERE kind = 'task_finished') AS f
         FROM events WHERE job_id = '{job}' AND kind IN ('task_started', 'task_finished') GROUP BY 1"
    );
    let apart = format!(
        "SELECT count(*) = 3 AND NOT EXISTS (SELECT 1 FROM ({spans}) a JOIN ({spans}) b
                                                ON a.t < b.t AND a.s < b.f AND b.s < a.f)
         FROM ({spans}) x WHERE s IS NOT NULL AND f IS NOT NULL"
    );
    c.wait_for("three tasks run one at a time", Duration::from_secs(5), &apart).await;
    let e = as_(&mut c, TOKEN, &["auth", "namespace", "limits", "team-c", "--max-tasks", "0"]).unwrap_err();
    assert!(e.contains("max_tasks"), "a limit of no task names its field: {e}");
    as_(&mut c, TOKEN, &["auth", "namespace", "limits", "team-c", "--clear", "--json"]).unwrap();
    as_(&mut c, TOKEN, &[&["auth", "namespace", "limits", "team-c"][..], &tiny].concat()).unwrap();

    // The first turn spends past the limit; the job asks before its next one.
    let job = as_(&mut c, &sub, &["submit", &spec, "--json"]).unwrap()["job_id"].as_str().unwrap().to_string();
    c.wait_job(&job, "waiting_for_budget").await;
    let shown = as_(&mut c, &sub, &["auth", "namespace", "show", "--json"]).unwrap();
    assert!(shown["spend"]["cost_today_usd"].as_f64().unwrap() > 0.000001, "{shown}");
    assert_eq!(shown["spend"]["waiting_for_budget"], 1, "{shown}");
    let status = as_(&mut c, &sub, &["status", &job, "--json"]).unwrap();
    let question = status.to_string();
    assert!(question.contains("namespace-budget-cost-day-1"), "the question names the limit: {question}");
    let e = as_(&mut c, &sub, &["answer", &job, "--option", "1"]).unwrap_err();
    assert!(e.contains("may not raise"), "a submitter does not raise the namespace's budget: {e}");
    as_(&mut c, &op, &["answer", &job, "raise it to $100"]).unwrap();
    c.wait_job(&job, "succeeded").await;
    let shown = as_(&mut c, &op, &["auth", "namespace", "show", "team-c", "--json"]).unwrap();
    assert_eq!(shown["limits"]["cost_per_day_usd"], 100.0, "the operator's raise is the namespace's: {shown}");
    // A question no longer waiting raises nothing: answering it is not a way around SetLimits.
    let e = as_(&mut c, &op, &["answer", &job, "--question", "namespace-budget-cost-day-1", "1000000"]).unwrap_err();
    assert!(e.contains("ended") || e.contains("answered"), "{e}");
    let shown = as_(&mut c, &op, &["auth", "namespace", "show", "team-c", "--json"]).unwrap();
    assert_eq!(shown["limits"]["cost_per_day_usd"], 100.0, "unchanged: {shown}");

    // Limits raised by an admin let a waiting job go on.
    as_(&mut c, TOKEN, &[&["auth", "namespace", "limits", "team-c"][..], &tiny].concat()).unwrap();
    let raised = as_(&mut c, &sub, &["submit", &spec, "--json"]).unwrap()["job_id"].as_str().unwrap().to_string();
    c.wait_job(&raised, "waiting_for_budget").await;
    as_(&mut c, TOKEN, &["auth", "namespace", "limits", "team-c", "--cost-per-day", "100", "--json"]).unwrap();
    c.wait_job(&raised, "succeeded").await;

    // No answer within the namespace's wait: the job ends failed, saying
    // why, after its first turn (the day's spend so far is under the limit).
    let spent = as_(&mut c, &op, &["auth", "namespace", "show", "--json"]).unwrap()["spend"]["cost_today_usd"]
        .as_f64()
        .unwrap();
    let limit = format!("{}", spent + 0.000001);
    let short = ["--cost-per-day", &limit, "--wait", "1s", "--json"];
    as_(&mut c, TOKEN, &[&["auth", "namespace", "limits", "team-c"][..], &short].concat()).unwrap();
    let lapsed = as_(&mut c, &sub, &["submit", &spec, "--json"]).unwrap()["job_id"].as_str().unwrap().to_string();
    c.wait_job(&lapsed, "failed").await;
    let status = as_(&mut c, &sub, &["status", &lapsed, "--json"]).unwrap();
    let reason = status.to_string();
    assert!(reason.contains("namespace `team-c`'s daily cost budget spent"), "{reason}");
    let transcript = as_(&mut c, &sub, &["transcript", "show", &lapsed, "--json"]);
    let transcript = transcript.unwrap().to_string();
    assert!(transcript.contains("\"Agent\"") && transcript.contains("rested"), "its work is kept: {transcript}");

    // The raise and the refusal are in the audit log.
    let log = as_(&mut c, &op, &["audit", "--limit", "1000", "--json"]).unwrap();
    let seen = |action: &str, outcome: &str| {
        log.as_array().unwrap().iter().any(|r| r["action"] == action && r["outcome"] == outcome)
    };
    assert!(seen("namespace.raise", "ok") && seen("namespace.raise", "denied"), "{log}");
    c.stop().await;
}
