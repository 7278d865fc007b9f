//! Helpers: run `flower` with an isolated home, read its JSON outputs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub const FLOWER: &str = env!("CARGO_BIN_EXE_flower");

/// The repository root (this package lives in `cli/`).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub struct Home {
    pub dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap() }
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(FLOWER);
        c.env("FLOWER_HOME", self.dir.path()).env_remove("ANTHROPIC_BASE_URL").env_remove("RUST_LOG");
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    /// `flower run SPEC --json`, asserting success; the summary.
    pub fn run_job(&self, spec: &Path, extra_env: &[(&str, &str)]) -> Value {
        let out = self
            .cmd()
            .envs(extra_env.iter().copied())
            .args(["run", spec.to_str().unwrap(), "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "flower run failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `flower transcript show JOB --json`.
    pub fn transcripts(&self, job: &str) -> Value {
        let out = self.run(&["transcript", "show", job, "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// A file of a finished `flower run`'s workbench (its summary names the folder).
pub fn workbench_file(summary: &Value, path: &str) -> String {
    let dir = Path::new(summary["workbench"].as_str().unwrap());
    std::fs::read_to_string(dir.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Sessions of a transcript dump with the given role.
pub fn sessions<'a>(t: &'a Value, role: &str) -> Vec<&'a Value> {
    t["sessions"].as_array().unwrap().iter().filter(|s| s["role"] == role).collect()
}

/// (tool name, input) of every tool_use in a session.
pub fn tool_uses(session: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for e in session["entries"].as_array().unwrap() {
        for b in e["content"].as_array().unwrap() {
            if b["type"] == "tool_use" {
                out.push((b["name"].as_str().unwrap().to_string(), b["input"].clone()));
            }
        }
    }
    out
}

/// (text, is_error) of every tool_result in a session, in order.
pub fn tool_results(session: &Value) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for e in session["entries"].as_array().unwrap() {
        for b in e["content"].as_array().unwrap() {
            if b["type"] == "tool_result" {
                let text: String = b["content"].as_array().unwrap().iter().filter_map(|c| c["text"].as_str()).collect();
                out.push((text, b["is_error"].as_bool().unwrap_or(false)));
            }
        }
    }
    out
}

/// The job in `state`, polled through `flower status --json` (another process).
pub fn wait_state(home: &Home, state: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = home.run(&["status", "--json"]);
        if out.status.success() {
            let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            if let Some(j) = jobs.as_array().and_then(|a| a.iter().find(|j| j["state"] == state)) {
                return j["id"].as_str().unwrap().to_string();
            }
        }
        assert!(std::time::Instant::now() < deadline, "no job became {state}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
