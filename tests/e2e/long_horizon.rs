//! The long-horizon reference scenario, with the context layers on and off
//! (one script for both): what the harness changes, measured.

use crate::support::{Home, repo};

#[test]
fn the_economy_run_keeps_the_main_thread_small_and_nothing_large_enters_a_context() {
    let home = Home::new();
    let run = home.run_job(&repo().join("examples/long-horizon/job.yaml"), &[]);
    let base = home.run_job(&repo().join("examples/long-horizon/baseline.yaml"), &[]);
    assert_eq!((run["state"].as_str(), base["state"].as_str()), (Some("succeeded"), Some("succeeded")));
    let (a, b) = (run["job_id"].as_str().unwrap(), base["job_id"].as_str().unwrap());
    let svg = home.dir.path().join("context.svg");
    let out = home.run(&["context", a, "--baseline", b, "--json", "--svg", svg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (r, bl) = (&report["run"], &report["baseline"]);

    // The scenario's size (authored by the script).
    assert!(r["main"]["turns"].as_u64().unwrap() >= 60, "{}", r["main"]);
    assert!(r["subagents"]["sessions"].as_u64().unwrap() >= 20);
    assert!(r["denials"].as_u64().unwrap() >= 1 && r["glances"].as_u64().unwrap() >= 3);
    assert_eq!(r["script_writes"], 1, "the script is written once");
    assert!(r["script_runs"].as_u64().unwrap() > 20, "and re-run");

    // Layer 3: every oversized result was spilled; none entered any context.
    assert!(r["spills"].as_u64().unwrap() > 20);
    assert!(r["largest_spill_matched_result"].as_u64().unwrap() < 4000, "{}", r["largest_spill_matched_result"]);
    assert!(bl["largest_spill_matched_result"].as_u64().unwrap() > 4000, "the baseline shows what spilling prevents");

    // The main thread's slope is well below the seed's ~2.2K tokens/turn, and below the baseline's.
    let slope = r["main_slope_tokens_per_turn"].as_f64().unwrap();
    assert!(slope < 1000.0 && slope < bl["main_slope_tokens_per_turn"].as_f64().unwrap(), "{slope}");

    // The cache breakpoints keep the main thread's prefix cached (the seed measured 96.1 %).
    let rate = r["main"]["cache_rate"].as_f64().unwrap();
    assert!(rate >= 0.961, "main-thread cache rate {rate}");
    // Next to a naive request builder (one tail marker) on the same scenario.
    let out = home
        .cmd()
        .args([
            "run",
            repo().join("examples/long-horizon/job.yaml").to_str().unwrap(),
            "--json",
            "--prompt-cache",
            "tail-only",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let naive: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let naive_rate = naive["context"]["main"]["cache_rate"].as_f64().unwrap();
    let (job_rate, naive_job) =
        (run["context"]["cache_rate"].as_f64().unwrap(), naive["context"]["cache_rate"].as_f64().unwrap());
    println!(
        "cache rate, main thread: {rate:.4} (4 breakpoints) vs {naive_rate:.4} (tail marker only); job: {job_rate:.4} vs {naive_job:.4}"
    );
    // No main-thread turn here adds more than 20 blocks, so a lone tail marker
    // finds its previous entry too (the two main-thread rates are within a few
    // hundredths of a percent); the job as a whole gains from the tool and
    // system markers the subagents share. The wide fan-out of tests/e2e/tools.rs
    // shows the main-thread case where the naive builder misses.
    assert!((rate - naive_rate).abs() < 0.005, "{rate} vs {naive_rate}");
    assert!(job_rate > naive_job, "job {job_rate} vs {naive_job}");
    assert_eq!(run["cache_audit"]["unexplained"], serde_json::json!([]), "{}", run["cache_audit"]);

    // Step by step: from the first hands-on attempt's result on, the economy run's main thread is smaller.
    let by_step = |side: &serde_json::Value| -> std::collections::BTreeMap<u64, u64> {
        side["main_turns"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| Some((t["step"].as_u64()?, t["context_tokens"].as_u64().unwrap())))
            .collect()
    };
    let (ra, rb) = (by_step(r), by_step(bl));
    let scenario = std::fs::read_to_string(repo().join("examples/long-horizon/scenario.yaml")).unwrap();
    let scenario: serde_json::Value = serde_json::from_str(scenario.split_once('\n').unwrap().1).unwrap();
    let steps = scenario["roles"][0]["steps"].as_array().unwrap();
    let first_attempt = steps.iter().position(|s| s["id"] == "hands-on-0").unwrap() as u64;
    let compared: Vec<u64> = ra.keys().filter(|s| **s > first_attempt && rb.contains_key(s)).copied().collect();
    assert!(compared.len() > 50);
    for s in compared {
        assert!(ra[&s] < rb[&s], "step {s}: economy {} vs baseline {}", ra[&s], rb[&s]);
    }
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg") && drawn.matches("<polyline").count() == 2);
}
