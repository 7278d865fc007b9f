//! Namespaces, keys, roles, signed tokens and the audit log, at the
//! application layer over a real SQLite store: every refusal gets its kind
//! and changes nothing, and the audit log shows the refused attempts. The
//! same rules reach gRPC, the console and MCP through this layer (their own
//! tests check the rendering: tests/e2e/access.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use flower_bus::Notifier;
use flower_coordinator::app::auth::AuthConfig;
use flower_coordinator::app::jwt::{JwtConfig, Verifier};
use flower_coordinator::app::keys::KeyRequest;
use flower_coordinator::app::{self, App, AppBackends, AppError, Runs, SubmitRequest};
use flower_model::access::Outcome;
use flower_model::{ErrorKind, JobId, JobSpec, JobState};
use flower_store::{SqliteStore, Store};

struct Quiet;

#[async_trait::async_trait]
impl Runs for Quiet {
    fn admit(&self, _spec: &JobSpec) -> app::Result<()> {
        Ok(())
    }
    fn submitted(&self, _job: JobId) {}
    fn notifier(&self, _job: JobId) -> Option<Arc<dyn Notifier>> {
        None
    }
}

const SPEC: &str = "name: access-test\ngoal: count the files\nmodel: claude-sonnet-4-5\n\
coordinator:\n  name: lead\n  instructions: delegate\n\
workers:\n  counter:\n    description: Counts files.\n    instructions: Count.\n    tools: [Bash]\n";

const TOKEN: &str = "the-operators-token";

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{}/tests/fixtures/jwt/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn jwt_config() -> JwtConfig {
    JwtConfig::new("https://idp.example", "flower")
}

fn app(dir: &tempfile::TempDir) -> (App, Arc<dyn Store>) {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("flower.db")).unwrap());
    let objects = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let backends = AppBackends {
        store: store.clone(),
        objects,
        providers: Arc::new(Default::default()),
        tool_policy: Arc::new(Default::default()),
        windows: Default::default(),
    };
    let jwt = Verifier::new(jwt_config(), &fixture("jwks.json")).unwrap();
    let auth = AuthConfig { token: Some(TOKEN.into()), jwt: Some(Arc::new(jwt)) };
    (App::new(backends, Arc::new(Quiet)).with_auth(auth), store)
}

fn submit() -> SubmitRequest {
    SubmitRequest { spec: SPEC.into(), ..Default::default() }
}

async fn as_(app: &App, credential: &str) -> App {
    app.authenticate(Some(credential), "test").await.unwrap()
}

async fn key(admin: &App, namespace: &str, role: &str) -> String {
    let r = KeyRequest {
        namespace: namespace.into(),
        role: role.into(),
        name: format!("{namespace} {role}"),
        expires_in: None,
    };
    admin.create_key(r).await.unwrap().secret
}

fn kind<T: std::fmt::Debug>(r: Result<T, AppError>) -> ErrorKind {
    r.unwrap_err().kind
}

/// Two teams with their own keys: each sees and controls only its jobs.
#[tokio::test]
async fn each_namespace_sees_and_controls_only_its_own_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let (app, store) = app(&dir);
    let admin = as_(&app, TOKEN).await;
    admin.create_namespace("team-a").await.unwrap();
    admin.create_namespace("team-b").await.unwrap();
    assert_eq!(admin.create_namespace("team-a").await.unwrap_err().kind, ErrorKind::AlreadyExists);
    let a_op = as_(&app, &key(&admin, "team-a", "operator").await).await;
    let b_op = as_(&app, &key(&admin, "team-b", "operator").await).await;
    let a_sub = as_(&app, &key(&admin, "team-a", "submitter").await).await;

    let job = a_sub.submit(submit()).await.unwrap().job;
    assert_eq!(job.namespace, "team-a");
    let id = job.id.to_string();
    // Team b: the job does not exist, in every call.
    assert_eq!(kind(b_op.job("job_id", &id).await), ErrorKind::NotFound);
    assert_eq!(kind(b_op.get(job.id).await), ErrorKind::NotFound);
    assert_eq!(kind(b_op.cancel(&id, "").await), ErrorKind::NotFound);
    assert_eq!(kind(b_op.interrupt(&id, "hi").await), ErrorKind::NotFound);
    assert_eq!(kind(b_op.aside(&id, "what?").await), ErrorKind::NotFound);
    assert_eq!(kind(b_op.continue_job(&id, "more", String::new()).await), ErrorKind::NotFound);
    let words = b_op.job("job_id", &id).await.unwrap_err().message;
    let unknown = b_op.job("job_id", &JobId::random().to_string()).await.unwrap_err().message;
    assert_eq!(
        words.replace(&id, "ID"),
        unknown.split('`').enumerate().map(|(i, p)| if i == 1 { "ID" } else { p }).collect::<Vec<_>>().join("`"),
        "no hint that it exists"
    );
    assert!(b_op.list(10).await.unwrap().is_empty());
    assert_eq!(kind(b_op.list_in("team-a", 10).await), ErrorKind::PermissionDenied);
    assert_eq!(a_op.list(10).await.unwrap().len(), 1);
    assert_eq!(admin.list(10).await.unwrap().len(), 1, "an admin sees every namespace");
    // Submitting into another namespace is refused.
    let into_a = SubmitRequest { namespace: "team-a".into(), ..submit() };
    assert_eq!(kind(b_op.submit(into_a).await), ErrorKind::PermissionDenied);
    assert_eq!(store.get_job(job.id).await.unwrap().state, JobState::Queued, "nothing changed");
    // Team a's operator cancels its submitter's job.
    assert_eq!(a_op.cancel(&id, "stop").await.unwrap().state, JobState::Cancelled);
}

#[tokio::test]
async fn each_role_is_held_to_what_it_may_do() {
    let dir = tempfile::tempdir().unwrap();
    let (app, store) = app(&dir);
    let admin = as_(&app, TOKEN).await;
    admin.create_namespace("team-a").await.unwrap();
    let viewer = as_(&app, &key(&admin, "team-a", "viewer").await).await;
    let alice = as_(&app, &key(&admin, "team-a", "submitter").await).await;
    let bob = as_(&app, &key(&admin, "team-a", "submitter").await).await;
    let op = as_(&app, &key(&admin, "team-a", "operator").await).await;

    assert_eq!(kind(viewer.submit(submit()).await), ErrorKind::PermissionDenied);
    let job = alice.submit(submit()).await.unwrap().job;
    let id = job.id.to_string();
    assert_eq!(viewer.job("job_id", &id).await.unwrap().id, job.id, "a viewer reads");
    for refused in [
        kind(viewer.cancel(&id, "").await),
        kind(viewer.interrupt(&id, "hi").await),
        kind(viewer.aside(&id, "q").await),
        kind(bob.cancel(&id, "").await),
        kind(bob.interrupt(&id, "hi").await),
        kind(op.create_key(KeyRequest { role: "admin".into(), ..Default::default() }).await),
        kind(op.create_namespace("team-z").await),
        kind(viewer.keys("").await),
        kind(viewer.audit_log("", 0, 10).await),
        kind(alice.create_key(KeyRequest { role: "viewer".into(), ..Default::default() }).await),
    ] {
        assert_eq!(refused, ErrorKind::PermissionDenied);
    }
    let e = bob.cancel(&id, "").await.unwrap_err();
    assert!(e.message.contains("its own jobs only"), "{e}");
    assert_eq!(store.get_job(job.id).await.unwrap().state, JobState::Queued, "nothing changed");
    assert_eq!(alice.interrupt(&id, "also count dirs").await.unwrap().id, job.id, "the submitter steers its own job");
    // An operator manages its namespace's keys, never above its role.
    let made =
        op.create_key(KeyRequest { role: "submitter".into(), name: "ci".into(), ..Default::default() }).await.unwrap();
    assert_eq!((made.key.namespace.as_str(), made.key.role.as_str()), ("team-a", "submitter"));
    assert!(op.keys("").await.unwrap().iter().all(|k| k.namespace == "team-a"));
    assert_eq!(op.cancel(&id, "operator stops it").await.unwrap().state, JobState::Cancelled);

    // The audit log: the refused mutations are there, with who and why.
    let log = op.audit_log("", 0, 100).await.unwrap();
    let denied: Vec<&str> = log.iter().filter(|r| r.outcome == Outcome::Denied).map(|r| r.action.as_str()).collect();
    for action in ["submit", "cancel", "interrupt", "aside", "key.create"] {
        assert!(denied.contains(&action), "{action} refused and recorded: {denied:?}");
    }
    let cancel = log.iter().rfind(|r| r.action == "cancel").unwrap();
    assert_eq!((cancel.outcome, cancel.target.as_str(), cancel.origin.as_str()), (Outcome::Ok, id.as_str(), "test"));
    assert!(log.iter().all(|r| r.namespace == "team-a"));
}

#[tokio::test]
async fn bad_credentials_are_unauthenticated_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _store) = app(&dir);
    let admin = as_(&app, TOKEN).await;
    let good = admin.create_key(KeyRequest { role: "operator".into(), ..Default::default() }).await.unwrap();
    let short = KeyRequest { role: "viewer".into(), expires_in: Some(Duration::from_millis(1)), ..Default::default() };
    let expiring = admin.create_key(short).await.unwrap();
    while flower_model::now_ms() <= expiring.key.expires_at.unwrap() {
        tokio::task::yield_now().await;
    }
    let revoked = admin.create_key(KeyRequest { role: "viewer".into(), ..Default::default() }).await.unwrap();
    admin.revoke_key(&revoked.key.id).await.unwrap();
    let mut wrong = good.secret.clone();
    wrong.replace_range(wrong.len() - 4.., "0000");
    let missing = format!("flk_{}_{}", "0".repeat(16), "0".repeat(64));
    for bad in [
        None,
        Some("nonsense"),
        Some(&*wrong),
        Some(&*missing),
        Some(&*expiring.secret),
        Some(&*revoked.secret),
        Some("the-operators-tokem"),
    ] {
        let e = app.authenticate(bad, "test").await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unauthenticated, "{bad:?}");
    }
    // Without a checked caller, nothing is done.
    assert_eq!(kind(app.submit(submit()).await), ErrorKind::Unauthenticated);
    let rotated = as_(&app, &good.secret).await.rotate_key(&good.key.id).await.unwrap();
    assert_eq!(
        kind(app.authenticate(Some(&good.secret), "test").await),
        ErrorKind::Unauthenticated,
        "rotated out at once"
    );
    let op = as_(&app, &rotated.secret).await;
    assert_eq!(op.whoami().unwrap().role.as_str(), "operator");
    let e = AppError::unauthenticated("no credential");
    app.record_refused("grpc 127.0.0.1:9", app::audit::Verb::Cancel, "some-job", &e).await;
    let log = admin.audit_log("", 0, 100).await.unwrap();
    let anon = log.iter().find(|r| r.subject == "anonymous").unwrap();
    assert_eq!(
        (anon.outcome, anon.action.as_str(), anon.origin.as_str()),
        (Outcome::Unauthenticated, "cancel", "grpc 127.0.0.1:9")
    );
    let keys = admin.keys("").await.unwrap();
    assert!(keys.iter().any(|k| k.id == good.key.id && k.revoked_at.is_some()));
    assert!(serde_json::to_string(&keys).unwrap().find("digest").is_none(), "a key's digest is never shown");
}

fn sign(claims: serde_json::Value, pem: &str, alg: jsonwebtoken::Algorithm) -> String {
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = Some("test-1".into());
    let key = match alg {
        jsonwebtoken::Algorithm::HS256 => jsonwebtoken::EncodingKey::from_secret(pem.as_bytes()),
        _ => jsonwebtoken::EncodingKey::from_ec_pem(pem.as_bytes()).unwrap(),
    };
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

#[tokio::test]
async fn signed_tokens_are_verified_against_the_jwks() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let (app, _store) = app(&dir);
    as_(&app, TOKEN).await.create_namespace("team-a").await.unwrap();
    let exp = (flower_model::now_ms() / 1000) + 600;
    let claims = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = serde_json::json!({"iss": "https://idp.example", "aud": "flower", "sub": "alice@example",
            "exp": exp, "flower_namespace": "team-a", "flower_role": "submitter"});
        f(&mut c);
        c
    };
    let es = jsonwebtoken::Algorithm::ES256;
    let good = sign(claims(&|_| {}), &fixture("es256.pem"), es);
    let alice = as_(&app, &good).await;
    let p = alice.whoami().unwrap();
    assert_eq!(
        (p.namespace.as_str(), p.role.as_str(), p.subject.as_str()),
        ("team-a", "submitter", "jwt:alice@example")
    );
    assert_eq!(alice.submit(submit()).await.unwrap().job.submitted_by.as_deref(), Some("jwt:alice@example"));

    let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let none = format!("{}.{}.", b64(serde_json::json!({"alg": "none", "kid": "test-1"})), b64(claims(&|_| {})));
    let mut tampered = good.clone();
    let sig_at = tampered.rfind('.').unwrap() + 1;
    tampered.replace_range(sig_at..sig_at + 2, if &good[sig_at..sig_at + 2] == "AA" { "BB" } else { "AA" });
    let bad = [
        ("another key's signature", sign(claims(&|_| {}), &fixture("attacker.pem"), es)),
        ("a changed signature", tampered),
        ("alg none", none),
        ("HMAC with the public key", sign(claims(&|_| {}), &fixture("es256.pub.pem"), jsonwebtoken::Algorithm::HS256)),
        ("a wrong audience", sign(claims(&|c| c["aud"] = "other".into()), &fixture("es256.pem"), es)),
        ("a wrong issuer", sign(claims(&|c| c["iss"] = "https://evil.example".into()), &fixture("es256.pem"), es)),
        ("expired", sign(claims(&|c| c["exp"] = (exp - 3600).into()), &fixture("es256.pem"), es)),
        (
            "no expiry",
            sign(
                claims(&|c| {
                    c.as_object_mut().unwrap().remove("exp");
                }),
                &fixture("es256.pem"),
                es,
            ),
        ),
        (
            "no role claim",
            sign(
                claims(&|c| {
                    c.as_object_mut().unwrap().remove("flower_role");
                }),
                &fixture("es256.pem"),
                es,
            ),
        ),
        ("a bad role", sign(claims(&|c| c["flower_role"] = "root".into()), &fixture("es256.pem"), es)),
    ];
    for (label, token) in bad {
        let e = app.authenticate(Some(&token), "test").await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unauthenticated, "{label}: {e}");
    }
}

/// The chart's bootstrap: namespaces and keys from values and a Secret,
/// made to exist at every start without duplicates; a key id taken by
/// another key is refused; a bootstrapped key works.
#[tokio::test]
async fn a_bootstrap_makes_namespaces_and_keys_exist_once() {
    use flower_coordinator::app::keys::ProvidedKey;
    use flower_model::access::Role;
    let dir = tempfile::tempdir().unwrap();
    let (app, store) = app(&dir);
    let secret = format!("flk_{}_{}", "a1".repeat(8), "b2".repeat(32));
    let keys = vec![ProvidedKey {
        namespace: "team-a".into(),
        role: Role::Operator,
        name: "team-a operators".into(),
        secret: secret.clone(),
    }];
    let namespaces = vec!["team-b".to_string()];
    let limits = flower_model::access::Limits { max_jobs: Some(3), cost_per_day_usd: Some(20.0), ..Default::default() };
    let with_limits = vec![("team-c".to_string(), limits.clone())];
    app.bootstrap(&namespaces, &with_limits, &keys).await.unwrap();
    app.bootstrap(&namespaces, &with_limits, &keys).await.unwrap();
    let names: Vec<String> = store.namespaces().await.unwrap().into_iter().map(|n| n.name).collect();
    assert_eq!(names, ["default", "team-a", "team-b", "team-c"]);
    assert_eq!(store.namespace("team-c").await.unwrap().limits, limits, "limits from the values");
    let zero = vec![("team-c".to_string(), flower_model::access::Limits { max_jobs: Some(0), ..Default::default() })];
    let e = app.bootstrap(&[], &zero, &[]).await.unwrap_err();
    assert!(e.kind == ErrorKind::Invalid && e.message.contains("limits.team-c.max_jobs"), "{e}");
    assert_eq!(store.keys(None).await.unwrap().len(), 1, "made once");
    let op = as_(&app, &secret).await;
    assert_eq!(op.whoami().unwrap().namespace, "team-a");
    assert_eq!(op.whoami().unwrap().subject, format!("key:{}", "a1".repeat(8)));
    let other = ProvidedKey { secret: format!("flk_{}_{}", "a1".repeat(8), "c3".repeat(32)), ..keys[0].clone() };
    assert_eq!(app.bootstrap(&[], &[], &[other]).await.unwrap_err().kind, ErrorKind::AlreadyExists);
    let bad = ProvidedKey { secret: "not-a-key".into(), ..keys[0].clone() };
    assert_eq!(app.bootstrap(&[], &[], &[bad]).await.unwrap_err().kind, ErrorKind::Invalid);
    let log = as_(&app, TOKEN).await.audit_log("", 0, 100).await.unwrap();
    assert!(log.iter().any(|r| r.subject == "bootstrap" && r.action == "key.create"));
    let set = log.iter().filter(|r| r.subject == "bootstrap" && r.action == "namespace.limits").count();
    assert_eq!(set, 1, "limits set once: the second start found them as wanted");
}
