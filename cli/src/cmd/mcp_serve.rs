//! `flower mcp-serve`: flower as an MCP server (stdio, or streamable HTTP
//! with `--http`), over the embedded store (jobs run in this process, as
//! `flower run` runs them) or a coordinator (`--server`). The server itself
//! is `flower_mcp`; this is its flags and the gRPC backend.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use clap::Args;
use flower_coordinator::tools::ask::Reply;
use flower_mcp::{AppError, AppJobs, EventView, FlowerMcp, JobView, Jobs, SessionView, Template, Templates};
use flower_model::ErrorKind;
use flower_model::{Entry, JobSpec};
use flower_proto::v1 as pb;

use super::client::{Client, ServerArgs, app_error as status};

#[derive(Args)]
pub struct McpServeArgs {
    /// Serve streamable HTTP on this address (endpoint /mcp) instead of stdio, e.g. 127.0.0.1:7790
    /// (port 0: any free port; the URL is printed)
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// With --http: clients must send `Authorization: Bearer <token>`, the token read from this
    /// environment variable
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// With --http: the bearer token clients must send (prefer FLOWER_MCP_TOKEN or --token-env to
    /// keep it out of the process list)
    #[arg(long, env = "FLOWER_MCP_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub mcp_token: Option<String>,
    /// A job template, NAME=PATH of a job spec (repeatable): submit_job with `template: NAME`
    /// and a `goal` runs that spec with the goal in place of its own
    #[arg(long = "template", value_name = "NAME=PATH")]
    pub templates: Vec<String>,
    /// A spec sent whole by a client (submit_job with `spec`) may name a scenario or a workspace
    /// only inside this directory; its relative paths resolve against it (default: the working
    /// directory)
    #[arg(long, env = "FLOWER_MCP_SPEC_ROOT", value_name = "DIR")]
    pub spec_root: Option<PathBuf>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub tools: super::isolation::ToolArgs,
    #[command(flatten)]
    pub policy: super::isolation::PolicyArgs,
}

impl McpServeArgs {
    /// The bearer token HTTP clients must show, if any.
    fn token(&self) -> anyhow::Result<Option<String>> {
        let token = match &self.token_env {
            Some(var) => {
                Some(std::env::var(var).with_context(|| format!("--token-env {var}: the variable is not set"))?)
            }
            None => self.mcp_token.clone(),
        };
        Ok(token.filter(|t| !t.trim().is_empty()))
    }
}

pub async fn run(home: PathBuf, args: McpServeArgs) -> anyhow::Result<ExitCode> {
    let mut templates = Templates::new();
    for flag in &args.templates {
        let t = Template::parse_flag(flag).map_err(|e| anyhow::anyhow!("--template {e}"))?;
        anyhow::ensure!(!templates.contains_key(&t.name), "--template {}: named twice", t.name);
        templates.insert(t.name.clone(), t);
    }
    let token = args.token()?;
    let mut runs = None;
    let jobs: Arc<dyn Jobs> = if args.server.configured() {
        let client = args.server.connect().await?;
        let url = args.server.server.clone().unwrap_or_default();
        Arc::new(GrpcJobs { client, url, server: args.server.clone(), mcp_token: token.clone() })
    } else {
        let policy = args.policy.policy(&super::isolation::service_credentials(&[]))?;
        std::fs::create_dir_all(&home).with_context(|| format!("opening {}", home.display()))?;
        let home = home.canonicalize().unwrap_or(home);
        // As `flower run`: the home (database, objects, other jobs' task directories) is hidden from tools.
        let (tools, _) = args.tools.setup(&home.join("work"), std::slice::from_ref(&home), &[], policy)?;
        let (app, embedded) =
            flower_runtime::jobs::embedded_app(&home, tools).with_context(|| format!("opening {}", home.display()))?;
        let describe = format!("the embedded store at {} (jobs run in this process)", embedded.home().display());
        runs = Some(embedded);
        // Over HTTP, the token (an admin's) or an API key of this store; over
        // stdio, the local admin (the client is the process that started this one).
        let http_token = if args.http.is_some() { token.clone() } else { None };
        let auth = flower_coordinator::app::auth::AuthConfig { token: http_token, jwt: None };
        Arc::new(AppJobs::new(app.with_auth(auth), describe))
    };
    let base = match &args.spec_root {
        Some(dir) => dir.canonicalize().with_context(|| format!("--spec-root {}", dir.display()))?,
        None => std::env::current_dir().context("the working directory")?,
    };
    let server = FlowerMcp::new(jobs.clone(), templates, base);
    match args.http {
        None => {
            if token.is_some() {
                tracing::info!("a token is for --http; over stdio the client is the process that started this one");
            }
            tokio::select! {
                served = flower_mcp::serve_stdio(server) => {
                    served?;
                    // The client went away: the jobs running here end first.
                    if let Some(r) = &runs {
                        r.drain().await;
                    }
                }
                _ = shutdown_signal() => eprintln!("flower mcp-serve: stopping (jobs still running are left for `flower run --resume JOB`)"),
            }
        }
        Some(addr) => {
            anyhow::ensure!(
                addr.ip().is_loopback() || token.is_some(),
                "--http {addr}: serving beyond loopback needs a token (--token-env VAR or FLOWER_MCP_TOKEN)"
            );
            let http = flower_mcp::serve_http(server, addr).await.with_context(|| format!("--http {addr}"))?;
            println!(
                "flower mcp-serve on {} ({}; jobs in {}; Ctrl-C stops)",
                http.url(),
                if token.is_some() { "bearer token required" } else { "no token" },
                jobs.describe()
            );
            shutdown_signal().await;
            http.shutdown().await;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// A coordinator over gRPC, with the client of `flower submit`.
struct GrpcJobs {
    client: Client,
    url: String,
    /// How to reach the service with another credential.
    server: ServerArgs,
    /// The token HTTP clients may show to act with this server's own credential.
    mcp_token: Option<String>,
}

fn job_view(j: pb::Job) -> JobView {
    // A state this client does not know reads as running: not ended.
    let state = j.typed_state().unwrap_or(flower_model::JobState::Running);
    let opt = |s: String| (!s.is_empty()).then_some(s);
    let usage = j.usage.map(|u| {
        serde_json::json!({
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "cache_creation_input_tokens": u.cache_creation_input_tokens,
            "cache_read_input_tokens": u.cache_read_input_tokens,
        })
    });
    JobView {
        job_id: j.id,
        name: j.name,
        state,
        reason: opt(j.reason),
        final_answer: opt(j.final_answer),
        usage: usage.unwrap_or_default(),
        created_at_ms: j.created_at_ms,
        updated_at_ms: j.updated_at_ms,
    }
}

#[async_trait]
impl Jobs for GrpcJobs {
    fn describe(&self) -> String {
        format!("the flower service at {}", self.url)
    }

    /// The MCP token (or none, when none is set) acts with this server's own
    /// credential; any other bearer is the service's to check.
    async fn acting(self: Arc<Self>, bearer: Option<&str>, _origin: &str) -> Result<Arc<dyn Jobs>, AppError> {
        let own = match (&self.mcp_token, bearer) {
            (None, None) => true,
            (Some(t), Some(b)) => flower_model::secret::same(t.as_bytes(), b.as_bytes()),
            (Some(_), None) => {
                return Err(AppError::unauthenticated("this MCP server needs `Authorization: Bearer <credential>`"));
            }
            (None, Some(_)) => false,
        };
        if own {
            return Ok(self);
        }
        let server = ServerArgs { token: bearer.map(str::to_string), ..self.server.clone() };
        let client = server.connect().await.map_err(|e| {
            AppError::new(ErrorKind::Unavailable, format!("the flower service cannot be reached: {e:#}"))
        })?;
        Ok(Arc::new(GrpcJobs { client, url: self.url.clone(), server, mcp_token: self.mcp_token.clone() }))
    }

    async fn submit(&self, spec: JobSpec) -> Result<JobView, AppError> {
        let workspace = match &spec.workspace {
            Some(dir) => super::submit::read_workspace(dir, spec.runtime.workspace_limit.as_u64())
                .map_err(|e| AppError::invalid("workspace", format_args!("{e:#}")))?,
            None => Vec::new(),
        };
        let text = serde_json::to_string(&spec).map_err(|e| AppError::internal("the spec could not be encoded", e))?;
        let req = pb::SubmitRequest { spec: text, idempotency_key: String::new(), workspace, ..Default::default() };
        let r = self.client.clone().submit(req).await.map_err(status)?.into_inner();
        self.job(&r.job_id).await
    }

    async fn job(&self, job: &str) -> Result<JobView, AppError> {
        match self.client.clone().get(pb::GetRequest { job_id: job.to_string() }).await {
            Ok(r) => Ok(job_view(r.into_inner())),
            Err(s) if s.code() == tonic::Code::NotFound => {
                Err(AppError::new(ErrorKind::NotFound, format!("no job `{job}` on {} ({})", self.url, s.message())))
            }
            Err(s) => Err(status(s)),
        }
    }

    async fn events(&self, job: &str, after: i64, wait: Duration) -> Result<Vec<EventView>, AppError> {
        let req = pb::WatchRequest { job_id: job.to_string(), after_seq: after };
        let mut stream = self.client.clone().watch(req).await.map_err(status)?.into_inner();
        let mut out = Vec::new();
        // The first event may take up to `wait`; then what is there at once.
        let mut patience = wait.max(Duration::from_millis(300));
        while out.len() < 1000 {
            match tokio::time::timeout(patience, stream.message()).await {
                Ok(Ok(Some(e))) => out.push(EventView {
                    seq: e.seq,
                    at_ms: e.at_ms,
                    kind: e.kind,
                    payload: serde_json::from_str(&e.payload_json).unwrap_or_default(),
                }),
                Ok(Ok(None)) | Err(_) => break,
                Ok(Err(s)) if out.is_empty() => return Err(status(s)),
                Ok(Err(_)) => break,
            }
            patience = Duration::from_millis(50);
        }
        Ok(out)
    }

    async fn sessions(&self, job: &str) -> Result<Vec<SessionView>, AppError> {
        let req = pb::GetTranscriptRequest { job_id: job.to_string(), ..Default::default() };
        let r = self.client.clone().get_transcript(req).await.map_err(status)?.into_inner();
        Ok(r.sessions
            .into_iter()
            .map(|s| SessionView {
                session_id: s.id,
                role: s.role,
                label: s.label,
                task_id: (!s.task_id.is_empty()).then_some(s.task_id),
            })
            .collect())
    }

    async fn entries(&self, job: &str, session: &str, after: i64, limit: u32) -> Result<Vec<Entry>, AppError> {
        let req = pb::GetTranscriptRequest {
            job_id: job.to_string(),
            session_id: session.to_string(),
            after_seq: after,
            limit,
        };
        let r = self.client.clone().get_transcript(req).await.map_err(status)?.into_inner();
        r.entries_json
            .iter()
            .map(|e| {
                serde_json::from_str(e)
                    .map_err(|e| AppError::internal("an entry the service sent could not be read", e))
            })
            .collect()
    }

    async fn pruning(&self, _job: &str) -> flower_model::spec::PruningOptions {
        // The API does not serve specs: the defaults (as `flower transcript show --server --pruned`).
        Default::default()
    }

    async fn files(&self, job: &str) -> Result<Vec<(String, u64)>, AppError> {
        let req = pb::ListArtifactsRequest { job_id: job.to_string() };
        let r = self.client.clone().list_artifacts(req).await.map_err(status)?.into_inner();
        Ok(r.artifacts.into_iter().map(|a| (a.path, a.size)).collect())
    }

    async fn file(&self, job: &str, path: &str) -> Result<Vec<u8>, AppError> {
        let req = pb::GetArtifactRequest { job_id: job.to_string(), path: path.to_string() };
        let mut stream = self.client.clone().get_artifact(req).await.map_err(status)?.into_inner();
        let mut out = Vec::new();
        while let Some(chunk) = stream.message().await.map_err(status)? {
            out.extend_from_slice(&chunk.data);
            if out.len() > flower_mcp::MAX_ARTIFACT {
                break; // the caller refuses it, naming the size limit
            }
        }
        Ok(out)
    }

    async fn cancel(&self, job: &str, reason: &str) -> Result<JobView, AppError> {
        let req = pb::CancelRequest { job_id: job.to_string(), reason: reason.to_string() };
        Ok(job_view(self.client.clone().cancel(req).await.map_err(status)?.into_inner()))
    }

    async fn interrupt(&self, job: &str, message: &str) -> Result<JobView, AppError> {
        let req = pb::InterruptRequest { job_id: job.to_string(), message: message.to_string() };
        Ok(job_view(self.client.clone().interrupt(req).await.map_err(status)?.into_inner()))
    }

    async fn answer(&self, job: &str, question: Option<&str>, reply: Reply) -> Result<JobView, AppError> {
        let (text, option) = match reply {
            Reply::Text(t) => (t, 0),
            Reply::Option(n) => (String::new(), n),
        };
        let req = pb::AnswerRequest {
            job_id: job.to_string(),
            question_id: question.unwrap_or_default().to_string(),
            text,
            option,
        };
        Ok(job_view(self.client.clone().answer(req).await.map_err(status)?.into_inner()))
    }
}
