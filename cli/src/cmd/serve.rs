//! `flower coordinator` and `flower worker`: the distributed mode's processes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use flower_coordinator::service::{self, ServiceConfig};
use flower_worker::WorkerOptions;
use tokio_util::sync::CancellationToken;

use super::backends::{BackendArgs, terminated};

#[derive(Args)]
pub struct CoordinatorArgs {
    /// Address the gRPC API listens on (port 0: any free port; the address is printed)
    #[arg(long, env = "FLOWER_LISTEN", default_value = "127.0.0.1:7777")]
    pub listen: SocketAddr,
    /// The operator's token, an admin credential. With it (or --jwks), every call but health
    /// checks needs `authorization: Bearer <credential>`: an API key (`flower auth create`), this
    /// token, or a signed token
    #[arg(long, env = "FLOWER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[command(flatten)]
    pub jwt: JwtArgs,
    /// Namespaces and API keys to make exist at start (YAML: `namespaces: [..]`, `keys: [{namespace,
    /// role, name, env}]`, each key read from the variable `env` names, e.g. from a Secret)
    #[arg(long, env = "FLOWER_BOOTSTRAP")]
    pub bootstrap: Option<PathBuf>,
    /// Largest request accepted (spec and workspace together)
    #[arg(long, env = "FLOWER_MAX_REQUEST_BYTES", default_value = "16 MiB")]
    pub max_request_bytes: bytesize::ByteSize,
    /// Serve over TLS with this PEM certificate chain (with --tls-key)
    #[arg(long, env = "FLOWER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert
    #[arg(long, env = "FLOWER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Lease lifetime: a dead replica's jobs are taken over after this
    #[arg(long, env = "FLOWER_LEASE_TTL", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,
    /// Serve Prometheus metrics at `GET /metrics` on this address (port 0: any free port; the address is printed) [default: off]
    #[arg(long, env = "FLOWER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the web console on this address (port 0: any free port; the address is printed) [default: off].
    /// With --token, the console asks for it
    #[arg(long, env = "FLOWER_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// Serve the API or the console beyond loopback without a token (for
    /// trials only: anyone who reaches the port may read and cancel every job)
    #[arg(long, env = "FLOWER_INSECURE")]
    pub insecure: bool,
    #[command(flatten)]
    pub backends: BackendArgs,
}

/// The `--bootstrap` file.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Bootstrap {
    #[serde(default)]
    namespaces: Vec<String>,
    /// Each namespace's limits, set at every start.
    #[serde(default)]
    limits: std::collections::BTreeMap<String, flower_model::access::Limits>,
    #[serde(default)]
    keys: Vec<BootstrapKey>,
}

/// What a `--bootstrap` file asks for.
pub struct Bootstrapped {
    pub namespaces: Vec<String>,
    pub limits: Vec<(String, flower_model::access::Limits)>,
    pub keys: Vec<flower_coordinator::app::keys::ProvidedKey>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BootstrapKey {
    namespace: String,
    role: String,
    #[serde(default)]
    name: String,
    /// The variable holding the key.
    env: String,
}

/// The namespaces and keys a `--bootstrap` file names, each key read from its variable.
fn read_bootstrap(path: &std::path::Path) -> anyhow::Result<Bootstrapped> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--bootstrap {}", path.display()))?;
    let b: Bootstrap = serde_yaml_ng::from_str(&text).with_context(|| format!("--bootstrap {}", path.display()))?;
    let mut keys = Vec::new();
    for (i, k) in b.keys.into_iter().enumerate() {
        let field = format!("--bootstrap {}: keys[{i}]", path.display());
        let role = k.role.parse().map_err(|e: String| anyhow::anyhow!("{field}.role: {e}"))?;
        let secret = std::env::var(&k.env).with_context(|| format!("{field}.env: `{}` is not set", k.env))?;
        let name = if k.name.is_empty() { k.env.clone() } else { k.name };
        keys.push(flower_coordinator::app::keys::ProvidedKey { namespace: k.namespace, role, name, secret });
    }
    Ok(Bootstrapped { namespaces: b.namespaces, limits: b.limits.into_iter().collect(), keys })
}

/// Signed tokens (JWT) from an identity provider.
#[derive(Args, Clone, Debug)]
pub struct JwtArgs {
    /// Accept signed tokens verified against this JWKS (a file, or an http(s) URL read again every 5 minutes)
    #[arg(long, env = "FLOWER_JWKS", requires_all = ["jwt_issuer", "jwt_audience"])]
    pub jwks: Option<String>,
    /// The `iss` a signed token must carry
    #[arg(long, env = "FLOWER_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// The `aud` a signed token must carry
    #[arg(long, env = "FLOWER_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// The claim naming the caller's namespace
    #[arg(long, env = "FLOWER_JWT_NAMESPACE_CLAIM", default_value = "flower_namespace")]
    pub jwt_namespace_claim: String,
    /// The claim naming the caller's role (viewer, submitter, operator, admin)
    #[arg(long, env = "FLOWER_JWT_ROLE_CLAIM", default_value = "flower_role")]
    pub jwt_role_claim: String,
}

impl JwtArgs {
    /// The verifier these flags describe, if any.
    pub async fn verifier(
        &self,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Option<Arc<flower_coordinator::app::jwt::Verifier>>> {
        let Some(source) = &self.jwks else { return Ok(None) };
        let mut config = flower_coordinator::app::jwt::JwtConfig::new(
            self.jwt_issuer.clone().unwrap_or_default(),
            self.jwt_audience.clone().unwrap_or_default(),
        );
        config.namespace_claim = self.jwt_namespace_claim.clone();
        config.role_claim = self.jwt_role_claim.clone();
        let verifier = flower_runtime::jwks::verifier(source, config, shutdown)
            .await
            .map_err(|e| anyhow::anyhow!("--jwks: {e}"))?;
        Ok(Some(verifier))
    }
}

/// The API and the console beyond loopback need a token, or `--insecure`.
fn check_exposure(args: &CoordinatorArgs, token: Option<&str>) -> anyhow::Result<()> {
    if token.is_some() {
        return Ok(());
    }
    for (flag, addr) in [("--listen", Some(args.listen)), ("--http-listen", args.http_listen)] {
        let Some(addr) = addr else { continue };
        if addr.ip().is_loopback() {
            continue;
        }
        anyhow::ensure!(
            args.insecure,
            "{flag} {addr}: serving beyond loopback needs a token (--token or FLOWER_TOKEN); --insecure serves it open, for trials"
        );
        tracing::warn!(%addr, "{flag} beyond loopback without a token (--insecure): anyone who reaches it may read and cancel every job");
    }
    Ok(())
}

/// Bind the metrics endpoint before anything runs, so a taken port fails the
/// start, named.
async fn bind_metrics(addr: Option<SocketAddr>) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    let Some(addr) = addr else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("--metrics-listen {addr}"))?;
    Ok(Some(listener))
}

/// Start serving metrics; the address goes on a line of its own after the
/// process's first line (which tools read for the API address or the id).
fn serve_metrics(
    listener: Option<tokio::net::TcpListener>,
    store: Option<std::sync::Arc<dyn flower_store::Store>>,
) -> anyhow::Result<()> {
    if let Some(listener) = listener {
        println!("metrics on http://{}/metrics", listener.local_addr()?);
        // Served until the process exits: a draining process still reports
        // the work it finishes.
        flower_runtime::metrics::serve(listener, store, CancellationToken::new());
    }
    Ok(())
}

pub async fn coordinator(args: CoordinatorArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.lease_ttl >= Duration::from_secs(1), "--lease-ttl: must be at least 1s");
    let credential = args.token.as_deref().filter(|t| !t.is_empty()).or(args.jwt.jwks.as_deref());
    check_exposure(&args, credential)?;
    let shutdown = CancellationToken::new();
    let jwt = args.jwt.verifier(shutdown.clone()).await?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => Some((
            std::fs::read(c).with_context(|| format!("--tls-cert {}", c.display()))?,
            std::fs::read(k).with_context(|| format!("--tls-key {}", k.display()))?,
        )),
        _ => None,
    };
    // The providers' endpoints: a simulator among them keeps a cache audit the console shows.
    let audit_sources: Vec<String> = args
        .backends
        .providers
        .iter()
        .flat_map(|e| e.split(','))
        .filter_map(|e| e.split_once('=').map(|(_, url)| url.trim().to_string()))
        .collect();
    let connected = args.backends.connect().await?;
    let backends = connected.backends();
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("--listen {}", args.listen))?;
    let addr = listener.local_addr()?;
    let metrics = bind_metrics(args.metrics_listen).await?;
    let console = match args.http_listen {
        Some(a) => Some(tokio::net::TcpListener::bind(a).await.with_context(|| format!("--http-listen {a}"))?),
        None => None,
    };
    let token = args.token.filter(|t| !t.is_empty());
    let config = ServiceConfig {
        token: token.clone(),
        jwt,
        max_request_bytes: args.max_request_bytes.as_u64() as usize,
        lease_ttl: args.lease_ttl,
        tls,
        sweep: connected.sweep(),
        ..Default::default()
    };
    println!(
        "flower coordinator {} listening on {} (providers: {}; {})",
        config.replica,
        service::describe(addr, config.tls.is_some()),
        backends.providers.names().join(", "),
        super::runtime_threads()
    );
    serve_metrics(metrics, Some(connected.store.clone()))?;
    let notifier = backends.notifier.clone();
    let service = service::Service::new(config, backends);
    if let Some(path) = &args.bootstrap {
        let b = read_bootstrap(path)?;
        service
            .app()
            .bootstrap(&b.namespaces, &b.limits, &b.keys)
            .await
            .with_context(|| format!("--bootstrap {}", path.display()))?;
    }
    if let Some(listener) = console {
        println!("console on http://{}/", listener.local_addr()?);
        let audits = Arc::new(flower_runtime::audit::SimAudits::new(audit_sources));
        flower_console::Console::new(service.app().clone(), Some(notifier))
            .with_audits(audits)
            .serve(listener, shutdown.clone());
    }
    let stop = shutdown.clone();
    tokio::spawn(async move {
        terminated().await;
        stop.cancel();
    });
    service.serve(listener, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct WorkerArgs {
    /// Tasks run at once by this process
    #[arg(long, env = "FLOWER_WORKER_CONCURRENCY", default_value_t = 4)]
    pub concurrency: usize,
    /// Where per-task working directories are made [default: a folder in the system temp dir]
    #[arg(long, env = "FLOWER_WORK_DIR")]
    pub work_dir: Option<PathBuf>,
    /// This worker's name in claims and events [default: worker-<pid>-<random>]
    #[arg(long, env = "FLOWER_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Serve Prometheus metrics at `GET /metrics` on this address (port 0: any free port; the address is printed) [default: off]
    #[arg(long, env = "FLOWER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub tools: super::isolation::ToolArgs,
    #[command(flatten)]
    pub backends: BackendArgs,
}

/// A worker's name is a plain name: it names its work folder and appears in
/// claims, events and metrics.
fn check_worker_id(id: &str) -> anyhow::Result<()> {
    let bad = id.char_indices().find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')));
    if let Some((at, c)) = bad {
        anyhow::bail!(
            "--worker-id `{}`: {c:?} at byte {at} is not allowed (letters, digits, '-', '_' and '.')",
            id.escape_debug()
        );
    }
    anyhow::ensure!(!id.is_empty() && id.len() <= 128, "--worker-id: 1 to 128 characters");
    anyhow::ensure!(!id.starts_with('.'), "--worker-id `{id}`: may not start with '.'");
    Ok(())
}

/// Default work folders (`worker-PID-RANDOM`) no live process holds are
/// unmounted and removed: a worker killed with SIGKILL leaves its task
/// folders, tmpfs included, behind.
fn remove_dead_workers_folders(all: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(all) else { return };
    for e in entries.flatten() {
        let named = e.file_name().to_str().is_some_and(|n| n.starts_with("worker-"));
        if named && flower_worker::taskdir::abandoned(&e.path()) {
            flower_worker::taskdir::unmount_beneath(&e.path());
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.concurrency >= 1, "--concurrency: must be at least 1");
    let metrics = bind_metrics(args.metrics_listen).await?;
    // A worker acts on cancels only: it hears no other notice kind.
    let connected = args.backends.connect_hearing(&[flower_bus::NoticeKind::Cancel]).await?;
    let id = args.worker_id.unwrap_or_else(|| {
        format!("worker-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..8])
    });
    check_worker_id(&id)?;
    let work = match args.work_dir {
        Some(dir) => dir,
        None => {
            let all = std::env::temp_dir().join("flower-work");
            remove_dead_workers_folders(&all);
            all.join(&id)
        }
    };
    std::fs::create_dir_all(&work).with_context(|| format!("--work-dir {}", work.display()))?;
    let (tools, isolation) = args.tools.setup(
        &work,
        &super::isolation::local_store(&args.backends.object_store).into_iter().collect::<Vec<_>>(),
        &[&args.backends.database_url, &args.backends.nats_url],
        args.backends.tool_policy()?,
    )?;
    let worker = connected.worker(WorkerOptions::new(id.clone(), work, tools));
    println!("flower worker {id} consuming tasks (concurrency {}, {})", args.concurrency, super::runtime_threads());
    println!("{isolation}");
    // A worker's store holds every job, but counting them is the
    // coordinators' part: one source for the jobs gauge.
    serve_metrics(metrics, None)?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        terminated().await;
        tracing::info!("draining: no new tasks; running ones finish");
        stop.cancel();
    });
    worker.run(args.concurrency, shutdown).await;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn worker_ids_are_plain_names() {
        assert!(super::check_worker_id("flower-worker-7c9f_2.a").is_ok());
        let e = super::check_worker_id("../../etc").unwrap_err().to_string();
        assert!(e.contains("'/' at byte 2"), "{e}");
        assert!(super::check_worker_id("a b").unwrap_err().to_string().contains("' ' at byte 1"));
        assert!(super::check_worker_id("..").unwrap_err().to_string().contains("start with '.'"));
        assert!(super::check_worker_id("").is_err());
        assert!(super::check_worker_id("w\n").unwrap_err().to_string().contains("'\\n' at byte 1"));
    }

    /// The chart's bootstrap ConfigMap, as `helm template` renders it.
    #[test]
    fn a_bootstrap_file_names_limits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bootstrap.yaml");
        let rendered = "namespaces:\n  - \"team-a\"\nlimits:\n  \"team-a\": {\"cost_per_day_usd\":50,\"max_jobs\":8,\"wait\":\"30m\"}\n  \"team-b\": {\"tokens_per_day\":20000000}\nkeys:\n";
        std::fs::write(&path, rendered).unwrap();
        let b = super::read_bootstrap(&path).unwrap();
        assert_eq!(b.namespaces, ["team-a"]);
        let (ns, l) = &b.limits[0];
        assert_eq!((ns.as_str(), l.max_jobs, l.cost_per_day_usd), ("team-a", Some(8), Some(50.0)));
        assert_eq!(l.wait, Some(std::time::Duration::from_secs(1800)));
        assert_eq!(b.limits[1].1.tokens_per_day, Some(20_000_000));
        std::fs::write(&path, "limits:\n  team-a: {max_job: 8}\n").unwrap();
        let e = format!("{:#}", super::read_bootstrap(&path).err().unwrap());
        assert!(e.contains("max_job"), "a misspelled limit is named: {e}");
    }
}
