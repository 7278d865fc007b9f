//! `flower migrate` and `--schema require-current`: a deployment migrates
//! once (its migration job), and its processes refuse a database whose schema
//! is behind instead of changing it themselves.

use std::process::Command;

use flower_store::postgres::ScratchDatabase;

use crate::cluster::{Proc, admin_url, nats_url};
use crate::support::FLOWER;

fn migrate(url: &str, args: &[&str]) -> (i32, serde_json::Value) {
    let out =
        Command::new(FLOWER).arg("migrate").args(args).arg("--json").env("FLOWER_DATABASE_URL", url).output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap(), v)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deployment_migrates_once_and_its_processes_refuse_an_older_schema() {
    let db = ScratchDatabase::create(&admin_url()).await.expect("Postgres (see scripts/test)");
    let objects = tempfile::tempdir().unwrap();
    let prefix = format!("flowertest_{}", uuid::Uuid::new_v4().simple());
    let env = vec![
        ("FLOWER_DATABASE_URL".to_string(), db.url.clone()),
        ("FLOWER_NATS_URL".to_string(), nats_url()),
        ("FLOWER_NATS_PREFIX".to_string(), prefix.clone()),
        ("FLOWER_OBJECT_STORE".to_string(), format!("file://{}", objects.path().display())),
        ("FLOWER_SCHEMA".to_string(), "require-current".to_string()),
    ];

    let (code, v) = migrate(&db.url, &["--check"]);
    assert_eq!((code, v["after"].as_i64()), (1, Some(0)), "a new database is behind: {v}");
    let latest = v["latest"].as_i64().unwrap();
    assert!(latest >= 1);

    let refused = Command::new(FLOWER)
        .args(["coordinator", "--listen", "127.0.0.1:0"])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("this release needs") && err.contains("flower migrate"), "{err}");

    let (code, v) = migrate(&db.url, &[]);
    assert_eq!((code, v["before"].as_i64(), v["after"].as_i64()), (0, Some(0), Some(latest)), "{v}");
    let (code, v) = migrate(&db.url, &[]);
    assert_eq!((code, v["before"].as_i64(), v["after"].as_i64()), (0, Some(latest), Some(latest)), "idempotent: {v}");
    assert_eq!(migrate(&db.url, &["--check"]).0, 0);

    // Now the coordinator starts (its first line says where it listens).
    let mut coordinator = Proc::spawn(&["coordinator", "--listen", "127.0.0.1:0"], &env);
    assert!(coordinator.first_line.contains("listening on"), "{}", coordinator.first_line);
    coordinator.kill9();
    if let Ok(bus) = flower_bus::NatsBus::connect(flower_bus::NatsConfig::new(nats_url(), prefix)).await {
        let _ = bus.destroy().await;
    }
    db.drop_now().await.unwrap();
}
