//! The worker tools on a real directory: confinement, Bash limits, edits, search.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use std::time::{Duration, Instant};

use flower_agent::{ToolContext, ToolError};
use flower_model::{JobId, Role, SessionId};
use flower_worker::sandbox::Sandbox;
use flower_worker::tools::{ToolLimits, toolset};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

fn ctx() -> ToolContext {
    ToolContext {
        job_id: JobId::random(),
        session_id: SessionId::random(),
        role: Role::Worker,
        tool_use_id: "toolu_t".into(),
        cancel: CancellationToken::new(),
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    tools: flower_agent::ToolSet,
}

fn fixture(output_limit: usize) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("task");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/a.rs"), "fn main() {}\n// TODO one\n").unwrap();
    std::fs::write(root.join("src/b.txt"), "hello\nTODO two\n").unwrap();
    std::fs::write(dir.path().join("secret.txt"), "outside").unwrap();
    let names: Vec<String> = ["Read", "Write", "Edit", "Bash", "Glob", "Grep"].iter().map(|s| s.to_string()).collect();
    // In this test binary tools run directly (`flower tool-exec` is not
    // here to start); the launcher is exercised by the e2e sandbox tests.
    let limits = ToolLimits {
        bash_timeout: Duration::from_secs(20),
        bash_output_limit: output_limit,
        isolation: std::sync::Arc::new(flower_worker::isolation::ToolIsolation::None),
        group: None,
        max_file_size: None,
        egress: None,
    };
    let tools = toolset(&names, &Sandbox::open(&root).unwrap(), &limits);
    Fixture { root: root.canonicalize().unwrap(), _dir: dir, tools }
}

async fn call(f: &Fixture, tool: &str, input: Value) -> Result<(String, bool), String> {
    call_with(f, tool, input, &ctx()).await
}

async fn call_with(f: &Fixture, tool: &str, input: Value, ctx: &ToolContext) -> Result<(String, bool), String> {
    match f.tools.get(tool).unwrap().call(input, ctx).await {
        Ok(out) => Ok((flower_model::content::result_text(&out.content), out.is_error)),
        Err(ToolError::RespondToModel(m)) => Err(m),
        Err(ToolError::Fatal(m)) => panic!("fatal: {m}"),
    }
}

#[tokio::test]
async fn paths_outside_are_refused_whatever_the_route() {
    let f = fixture(64 * 1024);
    std::os::unix::fs::symlink(f.root.parent().unwrap().join("secret.txt"), f.root.join("link")).unwrap();
    std::os::unix::fs::symlink("..", f.root.join("up")).unwrap();
    for (tool, input) in [
        ("Read", json!({"file_path": "../secret.txt"})),
        ("Read", json!({"file_path": "/etc/passwd"})),
        ("Read", json!({"file_path": "link"})),
        ("Read", json!({"file_path": "up/secret.txt"})),
        ("Write", json!({"file_path": "up/new.txt", "content": "x"})),
        ("Write", json!({"file_path": "src/../../new.txt", "content": "x"})),
        ("Edit", json!({"file_path": "link", "old_string": "outside", "new_string": "pwned"})),
        ("Glob", json!({"pattern": "*", "path": "up"})),
        ("Grep", json!({"pattern": "outside", "path": ".."})),
    ] {
        let err = call(&f, tool, input.clone()).await.unwrap_err();
        assert!(err.contains("outside the task's working directory"), "{tool} {input}: {err}");
    }
    assert_eq!(std::fs::read_to_string(f.root.parent().unwrap().join("secret.txt")).unwrap(), "outside");
    assert!(!f.root.parent().unwrap().join("new.txt").exists());
    // Symlinks that stay inside are fine.
    std::os::unix::fs::symlink("src/b.txt", f.root.join("inner")).unwrap();
    assert!(call(&f, "Read", json!({"file_path": "inner"})).await.unwrap().0.contains("hello"));
}

#[tokio::test]
async fn read_write_edit_round_trip() {
    let f = fixture(64 * 1024);
    call(&f, "Write", json!({"file_path": "out/deep/x.txt", "content": "a\nb\nc\n"})).await.unwrap();
    let abs = format!("{}/out/deep/x.txt", f.root.display());
    assert_eq!(
        call(&f, "Read", json!({"file_path": abs, "offset": 2, "limit": 1})).await.unwrap().0,
        "     2\tb\n[1 more lines; read on with offset=3]\n"
    );
    call(&f, "Edit", json!({"file_path": "out/deep/x.txt", "old_string": "b", "new_string": "B"})).await.unwrap();
    assert_eq!(std::fs::read_to_string(f.root.join("out/deep/x.txt")).unwrap(), "a\nB\nc\n");
    let err = call(&f, "Edit", json!({"file_path": "out/deep/x.txt", "old_string": "zz", "new_string": "y"}))
        .await
        .unwrap_err();
    assert!(err.contains("not found"), "{err}");
    assert!(call(&f, "Read", json!({"file_path": "nope.txt"})).await.unwrap_err().contains("no such file"));
    assert!(call(&f, "Read", json!({})).await.unwrap_err().contains("file_path"));
}

#[tokio::test]
async fn glob_and_grep_search_beneath_the_root() {
    let f = fixture(64 * 1024);
    assert_eq!(call(&f, "Glob", json!({"pattern": "**/*.rs"})).await.unwrap().0, "src/a.rs");
    assert_eq!(call(&f, "Glob", json!({"pattern": "*.txt", "path": "src"})).await.unwrap().0, "src/b.txt");
    assert!(call(&f, "Glob", json!({"pattern": "*.zip"})).await.unwrap().0.contains("no files match"));
    assert_eq!(call(&f, "Grep", json!({"pattern": "TODO"})).await.unwrap().0, "src/a.rs\nsrc/b.txt");
    assert_eq!(
        call(&f, "Grep", json!({"pattern": "todo", "-i": true, "output_mode": "content", "glob": "*.txt"}))
            .await
            .unwrap()
            .0,
        "src/b.txt:2:TODO two"
    );
    assert_eq!(
        call(&f, "Grep", json!({"pattern": "TODO", "output_mode": "count"})).await.unwrap().0,
        "src/a.rs:1\nsrc/b.txt:1"
    );
    assert_eq!(call(&f, "Grep", json!({"pattern": "absent"})).await.unwrap().0, "no matches");
    assert!(call(&f, "Grep", json!({"pattern": "("})).await.unwrap_err().contains("bad pattern"));
}

#[tokio::test]
async fn bash_runs_in_the_root_with_a_minimal_environment() {
    let f = fixture(64 * 1024);
    let (out, err) =
        call(&f, "Bash", json!({"command": "pwd; echo home=$HOME; env | cut -d= -f1 | sort | tr '\\n' ' '"}))
            .await
            .unwrap();
    assert!(!err);
    assert!(out.starts_with(&format!("{}\nhome={}", f.root.display(), f.root.display())), "{out}");
    for name in out.lines().last().unwrap().split_whitespace() {
        assert!(
            ["PATH", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "HOME", "PWD", "TERM", "SHELL", "SHLVL", "_", "OLDPWD"]
                .contains(&name),
            "unexpected variable {name} in {out}"
        );
    }
    let (out, err) = call(&f, "Bash", json!({"command": "echo oops >&2; exit 3"})).await.unwrap();
    assert!(err);
    assert_eq!(out, "oops\n\n[exit code 3]");
}

#[tokio::test]
async fn bash_timeouts_kill_the_whole_process_group() {
    let f = fixture(64 * 1024);
    let started = Instant::now();
    // A background grandchild that would outlive a plain kill of bash.
    let (out, err) =
        call(&f, "Bash", json!({"command": "sleep 30 & echo $! > bg.pid; sleep 30", "timeout": 300})).await.unwrap();
    assert!(err);
    assert!(out.contains("[timed out after 300 ms; process group killed]"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let pid: i32 = std::fs::read_to_string(f.root.join("bg.pid")).unwrap().trim().parse().unwrap();
    // Wait for the kernel to reap it (it was re-parented), on the event, not a fixed sleep.
    let gone = (0..200).any(|_| {
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ");
        if alive {
            std::thread::sleep(Duration::from_millis(10));
        }
        !alive
    });
    assert!(gone, "background child {pid} survived the timeout");
}

#[tokio::test]
async fn bash_stops_on_cancel_and_caps_output() {
    let f = fixture(1024);
    let (out, err) = call(&f, "Bash", json!({"command": "head -c 5000 /dev/zero | tr '\\0' a"})).await.unwrap();
    assert!(!err);
    assert!(out.starts_with(&"a".repeat(1024)));
    assert!(out.ends_with("[output cut: 3976 more bytes not captured]"), "{out}");

    let c = ctx();
    let cancel = c.cancel.clone();
    let f2 = &f;
    let run = call_with(f2, "Bash", json!({"command": "sleep 30"}), &c);
    let started = Instant::now();
    let (res, _) = tokio::join!(run, async {
        tokio::task::yield_now().await;
        cancel.cancel();
    });
    let (out, err) = res.unwrap();
    assert!(err && out.contains("cancelled"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(10));
}
