//! A distributed deployment for one test: a scratch Postgres database, its own
//! NATS stream and subjects, object storage (a local directory or the in-test
//! S3 server), a `flower sim` process, coordinator and worker processes — all
//! torn down afterwards.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flower_store::postgres::ScratchDatabase;
use flower_store::s3test::S3TestServer;

use crate::pggate::PgGate;
use crate::support::{FLOWER, repo};

/// A child process, killed when dropped. Its first stdout line is kept (the
/// processes print their address or id there), and the later ones too.
pub struct Proc {
    child: Child,
    pub first_line: String,
    later: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(args: &[&str], env: &[(String, String)]) -> Self {
        let mut child = Command::new(FLOWER)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first_line = String::new();
        out.read_line(&mut first_line).unwrap();
        assert!(!first_line.is_empty(), "`flower {}` exited before it was ready", args.join(" "));
        // Keep draining so the child never blocks on a full pipe.
        let later: Arc<Mutex<Vec<String>>> = Arc::default();
        let lines = later.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        Self { child, first_line, later }
    }

    /// The first later stdout line starting with `prefix`, waiting for it.
    pub fn wait_line(&self, prefix: &str) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self.later.lock().unwrap().iter().find(|l| l.starts_with(prefix)) {
                return l.clone();
            }
            assert!(start.elapsed() < Duration::from_secs(20), "no line starting with `{prefix}`");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The metrics endpoint's URL (the process was started with `--metrics-listen`).
    pub fn metrics_url(&self) -> String {
        self.wait_line("metrics on ").trim_start_matches("metrics on ").trim().to_string()
    }

    /// The web console's URL (the process was started with `--http-listen`).
    pub fn console_url(&self) -> String {
        self.wait_line("console on ").trim_start_matches("console on ").trim().trim_end_matches('/').to_string()
    }

    /// The http:// address in the first line.
    pub fn url(&self) -> String {
        self.first_line
            .split_whitespace()
            .find(|w| w.starts_with("http://") || w.starts_with("https://"))
            .unwrap()
            .to_string()
    }

    /// The id in the first line (`flower worker <id> …`, `flower coordinator <id> …`).
    pub fn id(&self) -> String {
        self.first_line.split_whitespace().nth(2).unwrap().to_string()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send the process a signal by name (`STOP`, `CONT`, …).
    pub fn signal(&self, name: &str) {
        let sent = std::process::Command::new("kill").arg(format!("-{name}")).arg(self.pid().to_string()).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -{name} {}", self.pid());
    }

    /// Wait for the process to exit on its own.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub struct Options {
    pub coordinators: usize,
    pub workers: usize,
    pub concurrency: usize,
    pub ack_wait: &'static str,
    pub lease_ttl: &'static str,
    pub max_attempts: u32,
    pub s3: bool,
    pub token: Option<&'static str>,
    pub max_request_bytes: Option<&'static str>,
    /// Serve the API over TLS with the test certificate.
    pub tls: bool,
    /// The cluster's processes reach Postgres through a [`PgGate`] the test
    /// can take down (the test's own queries go straight to the server).
    pub pg_gate: bool,
    /// A NATS server of the cluster's own (a fresh port and store directory)
    /// that the test may stop, kill and restart; else the shared one.
    pub private_nats: bool,
    /// Coordinators and workers serve metrics on a free port each
    /// ([`Proc::metrics_url`]).
    pub metrics: bool,
    /// Coordinators serve the web console on a free port each ([`Proc::console_url`]).
    pub console: bool,
    /// A Postgres server of the cluster's own ([`PostgresServer`]) that the
    /// test may crash and start again; else the shared one.
    pub private_postgres: bool,
    /// Runtime threads of every coordinator and worker (`FLOWER_THREADS`);
    /// else each its default (one per core).
    pub threads: Option<u16>,
    /// Coordinators accept signed tokens of the test JWKS
    /// (`coordinator/tests/fixtures/jwt`: issuer `https://idp.example`,
    /// audience `flower`).
    pub jwt: bool,
    /// The test scenarios' simulator enforces this many requests a minute
    /// (`flower sim --quota-rpm`).
    pub sim_quota_rpm: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            coordinators: 1,
            workers: 2,
            concurrency: 1,
            ack_wait: "30s",
            lease_ttl: "15s",
            max_attempts: 3,
            s3: false,
            token: None,
            max_request_bytes: None,
            tls: false,
            pg_gate: false,
            private_postgres: false,
            private_nats: false,
            metrics: false,
            console: false,
            threads: None,
            jwt: false,
            sim_quota_rpm: None,
        }
    }
}

// Fields drop in order: processes first, the database last.
pub struct Cluster {
    pub prefix: String,
    pub env: Vec<(String, String)>,
    /// The test scenarios' simulator (provider `anthropic`) and the demo's (provider `sim`).
    pub sims: Vec<Proc>,
    pub coordinators: Vec<Proc>,
    pub workers: Vec<Proc>,
    _objects_dir: tempfile::TempDir,
    _s3: Option<S3TestServer>,
    pub client_home: tempfile::TempDir,
    pub gate: Option<PgGate>,
    pub nats: Option<NatsServer>,
    opts: Options,
    pub db: ScratchDatabase,
    /// After `db`: the scratch database is dropped while its server runs.
    pub postgres: Option<PostgresServer>,
}

pub fn admin_url() -> String {
    std::env::var("FLOWER_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

pub fn nats_url() -> String {
    std::env::var("FLOWER_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

impl Cluster {
    pub async fn start(opts: Options) -> Self {
        let postgres = opts.private_postgres.then(PostgresServer::start);
        let admin = postgres.as_ref().map_or_else(admin_url, PostgresServer::admin_url);
        let db = ScratchDatabase::create(&admin).await.expect("Postgres (see scripts/test)");
        let prefix = format!("flowertest_{}", uuid::Uuid::new_v4().simple());
        let objects_dir = tempfile::tempdir().unwrap();
        let s3 = if opts.s3 { Some(S3TestServer::start("flower-e2e").await.unwrap()) } else { None };
        // The test scenarios: the cluster's own, then the workflow's roles
        // (clarifier, goal, judges) it does not have.
        let tests = tempfile::NamedTempFile::new().unwrap();
        let mut scenario =
            flower_sim::Scenario::load(&repo().join("tests/fixtures/distributed/scenario.yaml")).unwrap();
        let workflow = flower_sim::Scenario::load(&repo().join("tests/fixtures/workflow/scenario.yaml")).unwrap();
        for role in workflow.roles {
            if !scenario.roles.iter().any(|r| r.name == role.name) {
                scenario.roles.push(role);
            }
        }
        std::fs::write(tests.path(), serde_json::to_string(&scenario).unwrap()).unwrap();
        let rpm = opts.sim_quota_rpm.map(|r| r.to_string());
        let mut sim_args = vec!["sim", "--listen", "127.0.0.1:0", "--scenario", tests.path().to_str().unwrap()];
        if let Some(rpm) = &rpm {
            sim_args.extend(["--quota-rpm", rpm.as_str()]);
        }
        let sim = Proc::spawn(&sim_args, &[]);
        // The examples' roles (the demo's, the long-horizon job's) are played by a
        // second simulator, on one merged scenario.
        let examples = tempfile::NamedTempFile::new().unwrap();
        let mut merged = flower_sim::Scenario::load(&repo().join("examples/demo/scenario.yaml")).unwrap();
        merged
            .roles
            .extend(flower_sim::Scenario::load(&repo().join("examples/long-horizon/scenario.yaml")).unwrap().roles);
        merged.roles.extend(
            flower_sim::Scenario::load(&repo().join("tests/fixtures/isolation-cluster/scenario.yaml")).unwrap().roles,
        );
        merged.latency.ttft_ms = 20;
        std::fs::write(examples.path(), serde_json::to_string(&merged).unwrap()).unwrap();
        let demo_sim =
            Proc::spawn(&["sim", "--listen", "127.0.0.1:0", "--scenario", examples.path().to_str().unwrap()], &[]);
        let gate = if opts.pg_gate {
            let upstream = db.url.split_once('@').unwrap().1.split_once('/').unwrap().0.to_string();
            Some(PgGate::start(upstream).await)
        } else {
            None
        };
        let database_url = gate.as_ref().map_or_else(|| db.url.clone(), |g| g.url(&db.url));
        let nats = opts.private_nats.then(NatsServer::start);
        let nats_url = nats.as_ref().map_or_else(nats_url, NatsServer::url);
        let mut env: Vec<(String, String)> = vec![
            ("FLOWER_DATABASE_URL".into(), database_url),
            ("FLOWER_NATS_URL".into(), nats_url),
            ("FLOWER_NATS_PREFIX".into(), prefix.clone()),
            ("FLOWER_ACK_WAIT".into(), opts.ack_wait.into()),
            ("FLOWER_MAX_ATTEMPTS".into(), opts.max_attempts.to_string()),
            ("FLOWER_LEASE_TTL".into(), opts.lease_ttl.into()),
            // `sim` plays the demo; `anthropic` (an Anthropic-compatible endpoint) the test scenarios.
            ("FLOWER_PROVIDERS".into(), format!("sim={},anthropic={}", demo_sim.url(), sim.url())),
        ];
        if let Some(n) = opts.threads {
            env.push(("FLOWER_THREADS".into(), n.to_string()));
        }
        match &s3 {
            Some(server) => {
                env.push(("FLOWER_OBJECT_STORE".into(), server.url("cluster")));
                env.extend(server.env().into_iter().map(|(k, v)| (k.to_string(), v)));
            }
            None => env.push(("FLOWER_OBJECT_STORE".into(), format!("file://{}", objects_dir.path().display()))),
        }
        let mut coord_env = env.clone();
        if let Some(t) = opts.token {
            coord_env.push(("FLOWER_TOKEN".into(), t.into()));
        }
        if let Some(m) = opts.max_request_bytes {
            coord_env.push(("FLOWER_MAX_REQUEST_BYTES".into(), m.into()));
        }
        if opts.tls {
            let tls = repo().join("tests/fixtures/tls");
            coord_env.push(("FLOWER_TLS_CERT".into(), tls.join("server.crt").display().to_string()));
            coord_env.push(("FLOWER_TLS_KEY".into(), tls.join("server.key").display().to_string()));
        }
        if opts.console {
            coord_env.push(("FLOWER_HTTP_LISTEN".into(), "127.0.0.1:0".into()));
        }
        if opts.jwt {
            let jwks = repo().join("coordinator/tests/fixtures/jwt/jwks.json");
            coord_env.push(("FLOWER_JWKS".into(), jwks.display().to_string()));
            coord_env.push(("FLOWER_JWT_ISSUER".into(), "https://idp.example".into()));
            coord_env.push(("FLOWER_JWT_AUDIENCE".into(), "flower".into()));
        }
        if opts.metrics {
            env.push(("FLOWER_METRICS_LISTEN".into(), "127.0.0.1:0".into()));
            coord_env.push(("FLOWER_METRICS_LISTEN".into(), "127.0.0.1:0".into()));
        }
        let coordinators = (0..opts.coordinators)
            .map(|_| Proc::spawn(&["coordinator", "--listen", "127.0.0.1:0"], &coord_env))
            .collect();
        let mut cluster = Self {
            db,
            postgres,
            prefix,
            env,
            sims: vec![sim, demo_sim],
            coordinators,
            workers: Vec::new(),
            _objects_dir: objects_dir,
            _s3: s3,
            client_home: tempfile::tempdir().unwrap(),
            gate,
            nats,
            opts,
        };
        for _ in 0..cluster.opts.workers {
            cluster.add_worker();
        }
        cluster
    }

    /// Where the cluster's object storage lives (a directory, when not S3).
    pub fn objects_dir(&self) -> String {
        self._objects_dir.path().display().to_string()
    }

    /// Start one more coordinator replica (same settings as the others).
    pub fn add_coordinator(&mut self) {
        let mut env = self.env.clone();
        if let Some(t) = self.opts.token {
            env.push(("FLOWER_TOKEN".into(), t.into()));
        }
        self.coordinators.push(Proc::spawn(&["coordinator", "--listen", "127.0.0.1:0"], &env));
    }

    pub fn add_worker(&mut self) {
        let c = self.opts.concurrency.to_string();
        self.workers.push(Proc::spawn(&["worker", "--concurrency", &c], &self.env));
    }

    /// The first live coordinator's address.
    pub fn server(&mut self) -> String {
        self.coordinators
            .iter_mut()
            .find_map(|c| if c.alive() { Some(c.url()) } else { None })
            .expect("a live coordinator")
    }

    /// Run a client command against the service.
    pub fn flower(&mut self, args: &[&str]) -> Output {
        let server = self.server();
        let mut cmd = Command::new(FLOWER);
        cmd.args(args).env("FLOWER_SERVER", server).env("FLOWER_HOME", self.client_home.path());
        if let Some(t) = self.opts.token {
            cmd.env("FLOWER_TOKEN", t);
        }
        if self.opts.tls {
            cmd.env("FLOWER_TLS_CA", repo().join("tests/fixtures/tls/ca.crt"));
        }
        cmd.output().unwrap()
    }

    /// `flower submit SPEC` → the job id.
    pub fn submit(&mut self, spec: &Path) -> String {
        let out = self.flower(&["submit", spec.to_str().unwrap()]);
        assert!(out.status.success(), "submit: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub async fn pg(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.db.url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    }

    /// Wait (polling the database, never a fixed sleep) until `query` returns a
    /// row whose first column is true.
    pub async fn wait_for(&self, what: &str, timeout: Duration, query: &str) {
        let pg = self.pg().await;
        let start = Instant::now();
        loop {
            let ok = pg.query_opt(query, &[]).await.unwrap().map(|r| r.get::<_, bool>(0)).unwrap_or(false);
            if ok {
                return;
            }
            assert!(start.elapsed() < timeout, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait until `count` assistant entries of the job contain `needle` (a
    /// model's tool call under way, e.g. a worker's `sleep 5`).
    pub async fn wait_call(&self, job: &str, needle: &str, count: usize) {
        let q = format!(
            "SELECT count(*) >= {count} FROM entries WHERE job_id = '{job}' AND kind = 'assistant' AND body LIKE '%{needle}%'"
        );
        self.wait_for(&format!("call #{count} with `{needle}`"), Duration::from_secs(60), &q).await;
    }

    /// Wait until the job's (only) task is in `state`.
    pub async fn wait_task(&self, job: &str, state: &str) {
        let q = format!("SELECT state = '{state}' FROM tasks WHERE job_id = '{job}'");
        self.wait_for(&format!("the task of job {job} to be {state}"), Duration::from_secs(30), &q).await;
    }

    /// Wait until the job is in `state`.
    pub async fn wait_job(&self, job: &str, state: &str) {
        self.wait_job_within(job, state, Duration::from_secs(60)).await;
    }

    /// Wait until the job is in `state`, for at most `timeout` (long jobs).
    pub async fn wait_job_within(&self, job: &str, state: &str, timeout: Duration) {
        let q = format!("SELECT state = '{state}' FROM jobs WHERE id = '{job}'");
        self.wait_for(&format!("job {job} to be {state}"), timeout, &q).await;
    }

    /// Stop every process and remove the database and the NATS stream.
    pub async fn stop(mut self) {
        self.workers.clear();
        self.coordinators.clear();
        self.gate = None;
        self.sims.clear();
        if self.nats.is_none() {
            let config = flower_bus::NatsConfig::new(nats_url(), self.prefix.clone());
            if let Ok(bus) = flower_bus::NatsBus::connect(config).await {
                let _ = bus.destroy().await;
            }
        }
        self.nats = None;
        self.db.drop_now().await.unwrap();
    }
}

/// A Postgres server for one cluster: Debian's binaries run from a data
/// directory of its own (as the `postgres` user when the tests run as root),
/// on its own port, so a trial may crash it — `pg_ctl stop -m immediate`, no
/// shutdown checkpoint, WAL not yet flushed lost — and start it again (crash
/// recovery). Its WAL writer waits 10 s between rounds: a commit that did
/// not wait for its flush is lost by a crash unless a synchronous commit
/// after it flushed it.
pub struct PostgresServer {
    port: u16,
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    /// The tests run as root: the server's programs run as `postgres`.
    as_root: bool,
}

impl PostgresServer {
    pub fn start() -> Self {
        let mut versions: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .expect("Postgres's server binaries under /usr/lib/postgresql (see scripts/test)")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|b| b.join("pg_ctl").exists())
            .collect();
        versions.sort();
        let bin = versions.pop().expect("pg_ctl under /usr/lib/postgresql/*/bin");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let as_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        let server = Self { port, dir, bin, as_root };
        if server.as_root {
            let status = Command::new("chown").args(["-R", "postgres"]).arg(server.dir.path()).status().unwrap();
            assert!(status.success(), "chown of the server's directory");
        }
        let data = server.data();
        server.run("initdb", &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"]);
        server.restart();
        server
    }

    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// One of the server's programs, as the `postgres` user when root.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let path = self.bin.join(program);
        let mut command = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        };
        command.args(args);
        command
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self.command(program, args).output().unwrap();
        assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Start it (again) on the same port and data; returns once it accepts
    /// connections (after crash recovery, when it crashed).
    pub fn restart(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c wal_writer_delay=10000ms",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        self.run("pg_ctl", &["-D", &self.data(), "-l", &log, "-o", &options, "-w", "start"]);
    }

    /// A crash: every process of the server stops at once, nothing written.
    pub fn crash(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "-w", "stop"]);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self.command("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]).output();
    }
}

/// A NATS server with JetStream for one cluster: its own port and store
/// directory, so a test may stop, kill and restart it (the store survives).
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl NatsServer {
    pub fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut server = Self { child: None, port, dir: tempfile::tempdir().unwrap() };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Start it (again), on the same port and store; returns once it listens.
    pub fn restart(&mut self) {
        let bin = ["nats-server", "/usr/sbin/nats-server"]
            .into_iter()
            .find(|b| Command::new(b).arg("--version").output().is_ok())
            .expect("nats-server (see scripts/test)");
        let child = Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js", "-sd"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "nats-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, and wait for it to exit (a clean stop).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let _ = c.wait();
        }
    }

    /// SIGKILL.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill9();
    }
}
