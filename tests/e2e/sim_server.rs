//! The simulator as its own process, driven over HTTP by a job whose provider
//! is `anthropic` with a `base_url`: parallel `Agent` calls, real tools.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use crate::support::{FLOWER, Home, repo, sessions, tool_results, tool_uses};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `flower sim` (as `cmd` is set up) on an ephemeral port; the
/// server and its first stdout line.
fn spawn_sim(mut cmd: std::process::Command, scenario: &std::path::Path) -> (Server, String) {
    let mut child = cmd
        .args(["sim", "--listen", "127.0.0.1:0", "--scenario", scenario.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    (Server(child), line)
}

/// Start `flower sim` on an ephemeral port; its first stdout line names the address.
fn start_sim(scenario: &std::path::Path) -> (Server, String) {
    let (server, line) = spawn_sim(std::process::Command::new(FLOWER), scenario);
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (server, url)
}

#[test]
fn a_job_against_a_sim_server_delegates_in_parallel() {
    let fixture = repo().join("tests/fixtures/parallel");
    let (_server, url) = start_sim(&fixture.join("scenario.yaml"));
    let dir = tempfile::tempdir().unwrap();
    let spec = std::fs::read_to_string(fixture.join("job.yaml")).unwrap().replace(
        "workspace: workspace",
        &format!("workspace: {}\nbase_url: {url}", fixture.join("workspace").display()),
    );
    let spec_path = dir.path().join("job.yaml");
    std::fs::write(&spec_path, spec).unwrap();

    let home = Home::new();
    let summary = home.run_job(&spec_path, &[]);
    assert_eq!(summary["state"], "succeeded");
    let answer = summary["final_answer"].as_str().unwrap();
    // a.txt has 5 words, b.txt 9: `cat | wc -w` really ran.
    assert!(answer.starts_with("Answer: words=14"), "{answer}");
    assert!(
        answer.contains("src/a.txt:2:TODO: delta") && answer.contains("src/b.txt:3:# TODO second thing"),
        "{answer}"
    );
    assert_eq!(summary["artifacts"][0][0], "artifacts/todos.txt");

    let t = home.transcripts(summary["job_id"].as_str().unwrap());
    let coordinator = sessions(&t, "coordinator")[0];
    let calls = tool_uses(coordinator);
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|(n, _)| n == "Agent"));
    assert_eq!(tool_results(coordinator).len(), 2);
    let workers = sessions(&t, "worker");
    let labels: std::collections::BTreeSet<&str> = workers.iter().map(|w| w["label"].as_str().unwrap()).collect();
    assert_eq!(labels.into_iter().collect::<Vec<_>>(), vec!["finder", "wc"]);
    let wc = workers.iter().find(|w| w["label"] == "wc").unwrap();
    assert_eq!(tool_uses(wc)[0].0, "Bash");
    assert_eq!(tool_results(wc)[0].0.trim(), "14");
}

/// `--threads` (or `FLOWER_THREADS`) sizes a serving process's runtime, and
/// the process says how many it runs; zero is refused, naming the option.
#[test]
fn a_serving_process_runs_the_threads_it_is_given() {
    let scenario = repo().join("tests/fixtures/parallel/scenario.yaml");
    let first_line = |threads: Option<&str>, env: Option<&str>| {
        let mut cmd = std::process::Command::new(FLOWER);
        if let Some(n) = threads {
            cmd.args(["--threads", n]);
        }
        if let Some(n) = env {
            cmd.env("FLOWER_THREADS", n);
        } else {
            cmd.env_remove("FLOWER_THREADS");
        }
        let (_server, line) = spawn_sim(cmd, &scenario);
        line
    };
    let line = first_line(Some("3"), None);
    assert!(line.contains("3 runtime threads"), "{line}");
    let line = first_line(None, Some("1"));
    assert!(line.contains("1 runtime thread)") || line.contains("1 runtime thread;"), "{line}");
    // The flag wins over the environment, as every other option does.
    let line = first_line(Some("2"), Some("1"));
    assert!(line.contains("2 runtime threads"), "{line}");

    let out = std::process::Command::new(FLOWER).args(["--threads", "0", "sim"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--threads"), "{stderr}");
}

/// The kernel's CPU latency request in force now, in µs
/// (`/dev/cpu_dma_latency` reads back the lowest request any process holds).
fn cpu_latency_in_force() -> i32 {
    let bytes = std::fs::read("/dev/cpu_dma_latency")
        .expect("this test reads /dev/cpu_dma_latency: run it as a user who may (root, as CI does)");
    i32::from_ne_bytes(bytes[..4].try_into().unwrap())
}

/// `--cpu-latency-us` (or `FLOWER_CPU_LATENCY_US`): the process holds the
/// kernel's CPU latency request while it runs, says so, and the request ends
/// with it; a value out of range is refused, naming the option.
#[test]
fn a_process_holds_its_cpu_latency_request_while_it_runs() {
    let scenario = repo().join("tests/fixtures/parallel/scenario.yaml");
    // A value nothing else on the machine asks for, so what reads back is ours.
    let asked = 17;
    assert_ne!(cpu_latency_in_force(), asked, "another process already holds {asked} µs");
    let mut cmd = std::process::Command::new(FLOWER);
    cmd.env("FLOWER_CPU_LATENCY_US", asked.to_string());
    let (mut server, line) = spawn_sim(cmd, &scenario);
    assert!(line.contains(&format!("CPU latency request {asked} µs held")), "{line}");
    assert_eq!(cpu_latency_in_force(), asked);
    let _ = server.0.kill();
    let _ = server.0.wait();
    assert_ne!(cpu_latency_in_force(), asked, "the request outlived its process");

    let out = std::process::Command::new(FLOWER).args(["--cpu-latency-us", "3000000000", "sim"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--cpu-latency-us"), "{stderr}");
}
