//! Tool isolation, from inside a job and checked on the host (the escape
//! suite): a worker's `Bash` (and the coordinator's glance, which runs
//! through it) cannot read the service's secrets through /proc or its
//! environment, cannot read /etc/shadow, cannot write outside its task
//! directory, reaches nothing listening on the host by any socket (TCP,
//! IPv6, UDP, MPTCP, SCTP, raw, abstract Unix, netlink), gains no privilege
//! (unshare, mount, setuid programs, ptrace, /proc/1/root, keyrings),
//! cannot kill its worker, and is stopped at its task's limits on
//! processes, memory and file size; a killed worker leaves no tool process
//! behind. And the spec policy: a job cannot make a worker start a program
//! or hand out a variable the operator did not allow.
//!
//! As root (the tool user is `nobody`, namespaces and mounts as root); as
//! another user the same checks hold through a user namespace and Landlock,
//! or the test fails, saying what this host lacks.

use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::Duration;

use crate::cluster::{Cluster, Options, Proc};
use crate::support::{Home, repo, sessions, tool_results};

const SECRETS: &[(&str, &str)] = &[
    ("ANTHROPIC_API_KEY", "sk-ant-isolation-do-not-leak-4242"),
    ("FLOWER_DATABASE_URL", "postgres://flower:pw-do-not-leak-4242@127.0.0.1:5432/flower"),
    ("FLOWER_TOKEN", "token-do-not-leak-4242"),
    ("AWS_SECRET_ACCESS_KEY", "aws-do-not-leak-4242"),
];
const PROBE: &str = "flower-isolation-probe";
/// A port listening on the host (TCP on 127.0.0.1 and ::1, UDP on the next
/// one) that no tool may reach.
const OPEN_PORT: u16 = 47321;
/// The task's limits in this test (the operator's flags).
const MAX_MEMORY: &str = "256MiB";
const MAX_PROCESSES: &str = "200";

fn uid() -> u32 {
    let out = std::process::Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn tools_cannot_see_the_service_secrets_nor_write_or_connect_outside() {
    let root = uid() == 0;
    for p in ["/root", "/tmp", "/etc"] {
        let _ = std::fs::remove_file(Path::new(p).join(PROBE));
    }
    // Something is listening on 5432 (the test Postgres, or this test), so a
    // refused connection is the policy, not an empty port.
    let _own_5432 = match TcpStream::connect(("127.0.0.1", 5432)) {
        Ok(_) => None,
        Err(_) => {
            Some(TcpListener::bind(("127.0.0.1", 5432)).expect("nothing on 127.0.0.1:5432 and cannot listen there"))
        }
    };
    // Listeners on the host a tool must not reach: TCP (v4 and v6), UDP, an
    // abstract Unix socket. Each is read when the job has ended.
    let tcp4 = TcpListener::bind(("127.0.0.1", OPEN_PORT)).unwrap_or_else(|e| panic!("127.0.0.1:{OPEN_PORT}: {e}"));
    let tcp6 = TcpListener::bind(("::1", OPEN_PORT)).ok();
    let udp = UdpSocket::bind(("127.0.0.1", OPEN_PORT + 1)).unwrap();
    let abstract_addr = <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
        b"flower-escape-probe",
    )
    .unwrap();
    let unix = std::os::unix::net::UnixListener::bind_addr(&abstract_addr).unwrap();
    for l in [Some(&tcp4), tcp6.as_ref()].into_iter().flatten() {
        l.set_nonblocking(true).unwrap();
    }
    udp.set_nonblocking(true).unwrap();
    unix.set_nonblocking(true).unwrap();

    let home = Home::new();
    let mut env: Vec<(&str, &str)> = SECRETS.to_vec();
    env.push(("RUST_LOG", "info"));
    let out = home
        .cmd()
        .envs(env)
        .args(["run", repo().join("tests/fixtures/isolation/job.yaml").to_str().unwrap(), "--json"])
        .args(["--tool-max-memory", MAX_MEMORY, "--tool-max-processes", MAX_PROCESSES])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.contains("tool isolation:")).unwrap_or_default();
    println!("{line}");
    assert!(out.status.success(), "{}\n{stderr}", String::from_utf8_lossy(&out.stdout));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["state"], "succeeded", "the worker survived its tools: {summary}");
    if root {
        assert!(
            line.contains("user nobody (65534:65534)")
                && line.contains("pid, mount, network namespaces")
                && line.contains("/proc fresh")
                && line.contains("network: none (an empty network namespace)")
                && line.contains("limits per task: 200 processes, 256.0 MiB memory (cgroup"),
            "as root, the full isolation is in force on this host: {line}"
        );
    } else {
        assert!(line.contains("namespaces") && line.contains("Landlock"), "as uid {}: {stderr}", uid());
    }
    let t = home.transcripts(summary["job_id"].as_str().unwrap());
    let results = tool_results(sessions(&t, "worker")[0]);
    let all = serde_json::to_string(&t).unwrap();
    for (name, value) in SECRETS {
        assert!(!all.contains(value), "{name}'s value is in a transcript");
    }
    let me = if root { "65534".to_string() } else { uid().to_string() };

    // /proc: the worker is not there; the environments that are hold no secret.
    let (proc, _) = &results[0];
    let pids: Vec<u32> = proc
        .lines()
        .find_map(|l| l.strip_prefix("pids: "))
        .unwrap_or_else(|| panic!("{proc}"))
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(pids.iter().all(|p| *p < 100), "only the tool's own processes are visible: {pids:?}\n{proc}");
    assert!(!proc.contains("FLOWER_") && !proc.contains("flower run"), "{proc}");
    // The launcher (the namespace's pid 1) got its options out of sight: its
    // command line names no hidden path.
    assert!(proc.contains("flower\ntool-exec\n") && !proc.contains("--hide") && !proc.contains("objects"), "{proc}");

    // `env`: the allowlist only.
    let (env, _) = &results[1];
    assert!(env.contains("PATH=") && !env.contains("FLOWER_") && !env.contains("AWS_"), "{env}");
    assert!(
        env.lines().any(|l| l == "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        "the system's PATH, none of the service's directories: {env}"
    );

    // /etc/shadow.
    let (shadow, is_error) = &results[2];
    assert!(*is_error && shadow.contains("Permission denied"), "{shadow}");

    // Writes: refused outside, private /tmp, the task directory works.
    let (write, _) = &results[3];
    assert!(write.contains("/root/flower-isolation-probe': Permission denied"), "{write}");
    assert!(write.contains("/etc/flower-isolation-probe': Read-only file system"), "{write}");
    assert!(write.contains("../flower-isolation-probe'"), "{write}");
    assert!(write.contains("private-tmp") && write.trim_end().ends_with("inside"), "{write}");
    // Of the home (database, objects, other task directories), only the way to its own directory.
    assert!(write.contains("home: work\n"), "{write}");
    for p in ["/root", "/tmp", "/etc"] {
        assert!(!Path::new(p).join(PROBE).exists(), "{p}/{PROBE} exists on the host");
    }
    assert!(find(home.dir.path(), PROBE).is_empty(), "nothing written beside the task directory");

    // The service's Postgres, and any other port: no network at all.
    let (pg, is_error) = &results[4];
    assert!(*is_error && !pg.contains("CONNECTED") && pg.contains("Network is unreachable"), "{pg}");
    let (port, is_error) = &results[5];
    assert!(*is_error && !port.contains("CONNECTED") && port.contains("Network is unreachable"), "{port}");
    // Every other socket: refused, and nothing arrived on the host.
    let (sockets, _) = &results[6];
    assert!(!sockets.contains("REACHED"), "{sockets}");
    for probe in ["tcp4", "tcp6", "mptcp", "mptcp-pg", "nats", "udp", "raw", "sctp", "abstract", "lo-up"] {
        assert!(sockets.contains(&format!("{probe} refused:")), "{probe}: {sockets}");
    }
    for l in [Some(&tcp4), tcp6.as_ref()].into_iter().flatten() {
        assert!(l.accept().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock), "a connection reached the host");
    }
    let mut buf = [0u8; 16];
    assert!(udp.recv_from(&mut buf).is_err(), "a datagram reached the host");
    assert!(unix.accept().is_err(), "the abstract socket was reached");

    // No privilege to gain: no namespace, mount, setuid, ptrace, keyring or link out.
    let (privileges, _) = &results[7];
    for refused in ["unshare-n refused", "mount refused", "hard-link refused"] {
        assert!(privileges.contains(refused), "{refused}: {privileges}");
    }
    assert!(privileges.contains("/proc/1/root/': Permission denied"), "{privileges}");
    assert!(!privileges.contains("uid=0"), "su gave root: {privileges}");
    assert!(privileges.contains("ptrace-1 -1 1\n"), "ptrace of pid 1 refused (EPERM): {privileges}");
    assert!(!privileges.contains("root:"), "the link read /etc/shadow: {privileges}");
    assert!(privileges.contains("add_key -1 1\n"), "the keyrings refused (EPERM): {privileges}");

    // The task's limits: processes, memory, file size.
    let (processes, is_error) = &results[8];
    assert!(
        *is_error
            && processes.contains("forks stopped after")
            && processes.contains(&format!("process limit ({MAX_PROCESSES}) was reached")),
        "{processes}"
    );
    let (memory, is_error) = &results[9];
    assert!(
        *is_error && !memory.contains("allocated") && memory.contains("memory limit (256.0 MiB) was reached"),
        "{memory}"
    );
    // One file stops at the workspace limit (8 MiB); many files together
    // at the folder's bound (what it held when filled + 8 MiB), as written.
    let (disk, _) = &results[10];
    let size: u64 = disk.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("{disk}"));
    assert!(size > 0 && size <= 8 << 20, "one file stopped at the workspace limit: {disk}");
    let stopped: u32 = disk
        .lines()
        .find_map(|l| l.strip_prefix("stopped at "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the folder's bound held: {disk}"));
    assert!(stopped <= 10 && disk.contains("No space left on device"), "{disk}");

    // Its worker (and pid 1 of its namespace) out of reach.
    let (parent, _) = &results[11];
    assert!(parent.contains(&format!("{me}\nstill here")), "{parent}");

    // A timeout kills the whole namespace, a process that left the group too.
    let (timeout, is_error) = &results[12];
    assert!(*is_error && timeout.contains("[timed out after 1500 ms"), "{timeout}");
    let left = std::process::Command::new("pgrep").args(["-f", "sleep 77"]).output().unwrap();
    assert!(left.stdout.is_empty(), "left running: {}", String::from_utf8_lossy(&left.stdout));

    // The coordinator's glance ran through the same tool.
    let glance = if root { "nobody" } else { "" };
    assert!(summary["final_answer"].as_str().unwrap().starts_with(&format!("glance ran as {glance}")), "{summary}");
}

fn find(dir: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.file_name().is_some_and(|n| n == name) {
            out.push(p.clone());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(find(&p, name));
        }
    }
    out
}

/// The launcher itself as an unprivileged user (here `nobody`, through
/// setpriv): no setuid, a user namespace for the rest.
#[test]
fn the_launcher_confines_an_unprivileged_worker_through_a_user_namespace() {
    assert_eq!(uid(), 0, "this test starts the launcher as another user: run the e2e tests as root");
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("task");
    std::fs::create_dir(&task).unwrap();
    let chown = |p: &Path| std::process::Command::new("chown").args(["-R", "65534:65534"]).arg(p).status().unwrap();
    assert!(chown(dir.path()).success());
    let script = format!(
        "id -u; ls /proc | grep -cE '^[0-9]+$'; touch {}/outside 2>&1; touch inside && echo inside-ok; \
         exec 3<>/dev/tcp/127.0.0.1/5432 2>&1 || echo pg-refused",
        dir.path().display()
    );
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", crate::support::FLOWER, "tool-exec"])
        .args(["--network", "none", "--confine"])
        .arg(&task)
        .args(["--", "bash", "-c", &script])
        .current_dir(&task)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("setpriv (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "65534");
    assert!(lines[1].parse::<u32>().unwrap() < 10, "a PID namespace of its own: {text}");
    assert!(text.contains("inside-ok") && text.contains("pg-refused"), "{text}");
    assert!(!dir.path().join("outside").exists() && task.join("inside").exists());
}

/// A worker killed with SIGKILL while a command runs takes the command
/// along: the launcher dies with it, its namespace's pid 1 with the
/// launcher, and with pid 1 everything in the namespace — a process that
/// left its session included. Within 5 s, nothing of the job is left.
#[test]
fn a_killed_worker_leaves_no_tool_process_behind() {
    let home = Home::new();
    let dir = home.dir.path().join("job");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("scenario.yaml"),
        "roles:\n  - name: coordinator\n    match: {system: \"flower coordinator\"}\n    steps:\n      - id: go\n        tool_calls:\n          - name: Agent\n            input: {subagent_type: sleeper, description: sleep, prompt: sleep}\n      - id: done\n        text: done\n  - name: sleeper\n    match: {system: \"You are worker `sleeper`\"}\n    steps:\n      - id: sleep\n        tool_calls:\n          - {name: Bash, input: {command: \"setsid sleep 593 & sleep 593\"}}\n      - id: report\n        text: slept\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("job.yaml"),
        "name: sleeper\ngoal: sleep\nprovider: sim\nscenario: scenario.yaml\ncoordinator: {name: c}\nworkers:\n  sleeper: {description: sleeps, tools: [Bash]}\n",
    )
    .unwrap();
    let mut run = home
        .cmd()
        .args(["run", dir.join("job.yaml").to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sleeping = || {
        let out = std::process::Command::new("pgrep").args(["-f", "^sleep 593$"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    let started = std::time::Instant::now();
    while sleeping() < 2 {
        assert!(started.elapsed() < Duration::from_secs(60), "the command never started");
        assert!(run.try_wait().unwrap().is_none(), "flower run ended before its command started");
        std::thread::sleep(Duration::from_millis(50));
    }
    run.kill().unwrap();
    run.wait().unwrap();
    let killed = std::time::Instant::now();
    while sleeping() > 0 {
        assert!(killed.elapsed() < Duration::from_secs(5), "tool processes left running 5 s after the worker died");
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("no tool process left {:?} after the worker was killed", killed.elapsed());
    // The killed run's task folders (tmpfs) are unmounted by the next run on
    // this home, as a restarted worker does: run one.
    let mounted = || {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let home = home.dir.path().canonicalize().unwrap();
        info.lines().filter(|l| l.split(' ').nth(4).is_some_and(|p| Path::new(p).starts_with(&home))).count()
    };
    let left = mounted();
    std::fs::write(
        dir.join("quick.yaml"),
        "roles:\n  - name: coordinator\n    match: {system: \"flower coordinator\"}\n    steps:\n      - id: done\n        text: done\n",
    )
    .unwrap();
    let quick = std::fs::read_to_string(dir.join("job.yaml")).unwrap().replace("scenario.yaml", "quick.yaml");
    std::fs::write(dir.join("quick-job.yaml"), quick).unwrap();
    let next = home
        .cmd()
        .env("RUST_LOG", "warn")
        .args(["run", dir.join("quick-job.yaml").to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&next.stderr);
    if left > 0 {
        assert!(stderr.contains("unmounted task folders a previous worker left mounted"), "{stderr}");
    }
    assert_eq!(mounted(), 0, "{stderr}");
}

/// Egress by destination: a job granted one destination (asked in its
/// spec, allowed by the operator) reaches it through the egress proxy, and
/// nothing else — another port of the same host is refused by the proxy,
/// a direct connection finds no route; a spec asking for a destination the
/// operator did not allow is refused at start, naming the field.
#[test]
fn a_job_reaches_the_destinations_it_was_granted_and_no_other() {
    use std::io::{Read as _, Write as _};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let serve = |body: &'static str| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                seen.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = write!(s, "HTTP/1.0 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
            }
        });
        (port, count)
    };
    let (granted, granted_hits) = serve("hello-egress");
    let (other, other_hits) = serve("must-not-reach");
    let home = Home::new();
    let dir = home.dir.path().join("job");
    std::fs::create_dir_all(&dir).unwrap();
    let command = format!(
        "curl -s --max-time 10 http://127.0.0.1:{granted}/x; echo; \
         curl -s --max-time 10 -o /dev/null -w 'other %{{http_code}}\\n' http://127.0.0.1:{other}/; \
         curl -s --max-time 10 https://127.0.0.1:{other}/ >/dev/null 2>&1; echo tunnel=$?; \
         (exec 3<>/dev/tcp/127.0.0.1/{granted}) 2>/dev/null || echo direct-refused"
    );
    std::fs::write(
        dir.join("scenario.yaml"),
        format!(
            "roles:\n  - name: coordinator\n    match: {{system: \"flower coordinator\"}}\n    steps:\n      - id: go\n        tool_calls:\n          - name: Agent\n            input: {{subagent_type: fetcher, description: fetch, prompt: fetch}}\n      - id: done\n        text: \"{{{{result:go}}}}\"\n  - name: fetcher\n    match: {{system: \"You are worker `fetcher`\"}}\n    steps:\n      - id: fetch\n        tool_calls:\n          - {{name: Bash, input: {{command: {}}}}}\n      - id: report\n        text: \"{{{{result:fetch}}}}\"\n",
            serde_json::to_string(&command).unwrap()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("job.yaml"),
        format!(
            "name: egress\ngoal: fetch\nprovider: sim\nscenario: scenario.yaml\ncoordinator: {{name: c}}\nworkers:\n  fetcher: {{description: fetches, tools: [Bash]}}\nnetwork:\n  egress: ['127.0.0.1:{granted}']\n"
        ),
    )
    .unwrap();
    let job = dir.join("job.yaml");
    // Not allowed by the operator: refused before anything runs.
    let refused = home.run(&["run", job.to_str().unwrap(), "--json"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("network.egress[0]") && stderr.contains("--tool-egress-allow"), "{stderr}");
    // Allowed: the granted destination only.
    let allow = format!("127.0.0.1:{granted}");
    let out = home.run(&["run", job.to_str().unwrap(), "--json", "--tool-egress-allow", &allow]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{}", String::from_utf8_lossy(&out.stdout));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let answer = summary["final_answer"].as_str().unwrap_or_default();
    assert!(answer.contains("hello-egress"), "the granted destination answered: {summary}");
    assert!(answer.contains("other 403"), "the proxy refused another port: {answer}");
    assert!(answer.contains("tunnel=56"), "a tunnel elsewhere refused: {answer}");
    assert!(answer.contains("direct-refused"), "no direct route: {answer}");
    assert!(!answer.contains("must-not-reach"), "{answer}");
    assert_eq!(granted_hits.load(Ordering::SeqCst), 1, "one connection to the granted destination");
    assert_eq!(other_hits.load(Ordering::SeqCst), 0, "no byte reached the other port");
}

/// Heavy: the acceptance's sizes at the default limits — 10,000 processes,
/// 4 GiB of memory, 4 GiB of output on stdout, 4 GiB into one file and
/// then into many — each stopped with a note the model reads, while the
/// worker's own peak resident memory stays under 200 MB. Its own command:
/// `cargo test -p flower-cli --test e2e -- --ignored heavy_ --nocapture`.
#[test]
#[ignore]
fn heavy_limits_stop_a_runaway_task_and_the_worker_stays_small() {
    let home = Home::new();
    let dir = home.dir.path().join("job");
    std::fs::create_dir_all(&dir).unwrap();
    let steps = [
        (
            "forks",
            "python3 -c 'import os,time\nn=0\ntry:\n  while n<10000:\n    if os.fork()==0:\n      time.sleep(60); os._exit(0)\n    n+=1\n  print(\"forked\",n)\nexcept OSError as e: print(\"forks stopped after\",n,e)'",
        ),
        ("memory", "python3 -c 'b=bytearray(4<<30); print(\"allocated\", len(b))'"),
        ("stdout", "head -c 4294967296 /dev/zero; echo"),
        ("file", "dd if=/dev/zero of=big.bin bs=1M count=4096 2>/dev/null; stat -c %s big.bin; rm -f big.bin"),
        (
            "files",
            "for i in $(seq 4096); do head -c 1048576 /dev/zero > f$i || { echo stopped at $i; break; }; done; rm -f f*",
        ),
    ];
    let mut scenario = String::from(
        "roles:\n  - name: coordinator\n    match: {system: \"flower coordinator\"}\n    steps:\n      - id: go\n        tool_calls:\n          - name: Agent\n            input: {subagent_type: hog, description: hog, prompt: hog}\n      - id: done\n        text: done\n  - name: hog\n    match: {system: \"You are worker `hog`\"}\n    steps:\n",
    );
    for (id, command) in steps {
        scenario.push_str(&format!(
            "      - id: {id}\n        tool_calls:\n          - {{name: Bash, input: {{command: {}, timeout: 300000}}}}\n",
            serde_json::to_string(command).unwrap()
        ));
    }
    scenario.push_str("      - id: report\n        text: done\n");
    std::fs::write(dir.join("scenario.yaml"), scenario).unwrap();
    std::fs::write(
        dir.join("job.yaml"),
        "name: hog\ngoal: hog\nprovider: sim\nscenario: scenario.yaml\ncoordinator: {name: c}\nworkers:\n  hog: {description: hogs, tools: [Bash]}\nruntime:\n  workspace_limit: 1 GiB\n  bash_timeout: 5m\n",
    )
    .unwrap();
    let run = home
        .cmd()
        .args(["run", dir.join("job.yaml").to_str().unwrap(), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = run.id();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = peak.clone();
    let watcher = std::thread::spawn(move || {
        while let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(kb) = status.lines().find_map(|l| l.strip_prefix("VmHWM:")) {
                let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                seen.fetch_max(kb, std::sync::atomic::Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let started = std::time::Instant::now();
    let out = run.wait_with_output().unwrap();
    watcher.join().unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["state"], "succeeded", "{summary}");
    let t = home.transcripts(summary["job_id"].as_str().unwrap());
    let results = tool_results(sessions(&t, "worker")[0]);
    let peak_mb = peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0;
    println!("took {:?}; the worker's peak resident memory: {peak_mb:.1} MB", started.elapsed());
    for (text, _) in &results {
        println!("---\n{}", text.chars().take(400).collect::<String>());
    }
    assert!(results[0].0.contains("forks stopped after") && results[0].0.contains("process limit (512) was reached"));
    assert!(!results[1].0.contains("allocated") && results[1].0.contains("memory limit (2.0 GiB) was reached"));
    // 4 GiB on stdout: captured up to the output limit (then spilled to the workbench whole).
    let kept: usize = results[2]
        .0
        .strip_prefix('[')
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(results[2].0.len());
    assert!(kept <= 300_000, "stdout capped at the output limit: {kept} characters kept");
    let size: u64 = results[3].0.lines().next().and_then(|l| l.trim().parse().ok()).unwrap();
    assert!(size <= 1 << 30, "one file stopped at the workspace limit: {size}");
    assert!(results[4].0.contains("stopped at") && results[4].0.contains("No space left on device"));
    assert!(peak_mb <= 200.0, "the worker's peak resident memory {peak_mb:.1} MB");
}

/// On a cluster (Postgres, NATS, a coordinator with its gRPC API and
/// metrics, the simulators, all on loopback): a job's tools reach no port
/// of the host, TCP or UDP, IPv4 or IPv6 — every one of the 131,070 tries
/// finds no route.
#[tokio::test(flavor = "multi_thread")]
async fn on_a_cluster_a_job_reaches_no_port_of_the_host() {
    let mut c = Cluster::start(Options { workers: 1, metrics: true, ..Default::default() }).await;
    let job = c.submit(&repo().join("tests/fixtures/isolation-cluster/job.yaml"));
    c.wait_job(&job, "succeeded").await;
    let pg = c.pg().await;
    let answer: String =
        pg.query_one(&format!("SELECT final_answer FROM jobs WHERE id = '{job}'"), &[]).await.unwrap().get(0);
    for host in ["127.0.0.1", "::1"] {
        assert!(answer.contains(&format!("{host}: reached 0 of 131070")), "{answer}");
    }
    assert!(answer.contains("ENETUNREACH"), "{answer}");
    c.stop().await;
}

/// The worker checks the policy again before starting anything: a job the
/// coordinator accepted (the fixture server is allowed there by default)
/// fails on a worker that allows no MCP server, with the reason, and the
/// server never starts.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_refuses_an_mcp_server_its_policy_does_not_allow() {
    let mut c = Cluster::start(Options { workers: 0, ..Default::default() }).await;
    let mut env = c.env.clone();
    env.push(("FLOWER_MCP_ALLOW".into(), "none".into()));
    let worker = Proc::spawn(&["worker", "--concurrency", "1"], &env);
    c.workers.push(worker);
    let job = c.submit(&repo().join("tests/fixtures/distributed/refused.yaml"));
    c.wait_for(
        "the job to end",
        Duration::from_secs(60),
        &format!("SELECT state IN ('succeeded', 'failed') FROM jobs WHERE id = '{job}'"),
    )
    .await;
    let pg = c.pg().await;
    let row = pg.query_one(&format!("SELECT state, error FROM tasks WHERE job_id = '{job}'"), &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "failed");
    let error: String = row.get(1);
    assert!(
        error.contains("refused by this worker's policy")
            && error.contains("mcp_servers.fx.command")
            && error.contains("(allowed: none)"),
        "{error}"
    );
    let answer: String =
        pg.query_one(&format!("SELECT final_answer FROM jobs WHERE id = '{job}'"), &[]).await.unwrap().get(0);
    assert!(answer.contains("mcp_servers.fx.command"), "the coordinator saw the reason: {answer}");
    c.stop().await;
}

/// `flower run` checks the spec against the same policy before anything is
/// created: any other program, or a variable not allowed, is refused,
/// naming the field and what is allowed.
#[test]
fn a_spec_naming_a_server_or_variable_not_allowed_is_refused_at_start() {
    let home = Home::new();
    let dir = repo().join("tests/fixtures/tools");
    let base = std::fs::read_to_string(dir.join("job.yaml"))
        .unwrap()
        .replace("scenario: scenario.yaml", &format!("scenario: {}", dir.join("scenario.yaml").display()))
        .replace("workspace: workspace", &format!("workspace: {}", dir.join("workspace").display()));
    let fixture = "    command: [flower, mcp-fixture, --token-env, FIXTURE_TOKEN]\n    env_from: {FIXTURE_TOKEN: MCP_FIXTURE_TOKEN}";
    let cases = [
        (
            "    command: [bash, -c, 'cat /proc/1/environ']",
            "mcp_servers.fixture.command",
            "(allowed: `flower mcp-fixture`)",
        ),
        (
            "    command: [flower, mcp-fixture]\n    env_from: {TOKEN: FLOWER_DATABASE_URL}",
            "mcp_servers.fixture.env_from.TOKEN",
            "`FLOWER_DATABASE_URL` is not a variable",
        ),
        (
            "    url: https://example.invalid/mcp\n    token_env: HOME",
            "mcp_servers.fixture.token_env",
            "(allowed: none)",
        ),
    ];
    for (server, field, says) in cases {
        let path = home.dir.path().join("refused.yaml");
        std::fs::write(&path, base.replace(fixture, server)).unwrap();
        let out = home.run(&["run", path.to_str().unwrap(), "--json"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&format!("invalid job spec: {field}: ")) && stderr.contains(says), "{stderr}");
    }
    assert!(!home.dir.path().join("flower.db").exists(), "refused before anything was created");
}
