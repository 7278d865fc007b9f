//! The benchmark commands at toy sizes: each runs and reports figures that
//! make sense, so `flower bench …` keeps working between the runs that
//! measure (docs/benchmarks.md).

use serde_json::Value;

use crate::support::Home;

#[test]
fn the_hot_path_runs_every_task_through() {
    let home = Home::new();
    let out = home.run(&["bench", "hotpath", "--tasks", "20", "--fan-out", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("20 tasks dispatched, claimed and finished"));
}

#[test]
fn transcript_writes_are_measured_beside_their_floors() {
    let home = Home::new();
    let out = home
        .cmd()
        .env("FLOWER_BENCH_DATABASE_URL", crate::cluster::admin_url())
        .args(["bench", "transcript", "--entries", "300", "--batch", "100", "--single-row-entries", "40"])
        .args(["--runs", "1", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["store_batch_entries_per_s", "copy_floor_entries_per_s", "single_row_floor_entries_per_s"] {
        assert!(figures[key].as_f64().unwrap() > 0.0, "{key}: {figures}");
    }
    assert!(figures["mean_body_bytes"].as_f64().unwrap() > 100.0, "{figures}");
}

#[test]
fn the_console_pages_of_a_large_job_are_timed() {
    let home = Home::new();
    let out = home.run(&["bench", "console", "--entries", "400", "--tasks", "30", "--rounds", "2", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pages = figures["pages"].as_array().unwrap();
    assert_eq!(pages.len(), 5, "{figures}");
    for p in pages {
        assert!(p["median_ms"].as_f64().unwrap() > 0.0 && p["bytes"].as_u64().unwrap() > 500, "{p}");
    }
    // The job page holds every task: 30 rows of the tree.
    assert!(pages[1]["bytes"].as_u64().unwrap() > pages[0]["bytes"].as_u64().unwrap());

    // The same over a scratch Postgres database.
    let out = home.run(&[
        "bench",
        "console",
        "--entries",
        "100",
        "--tasks",
        "5",
        "--rounds",
        "1",
        "--json",
        "--postgres",
        &crate::cluster::admin_url(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((figures["store"].as_str(), figures["pages"].as_array().map(Vec::len)), (Some("postgres"), Some(5)));
}
