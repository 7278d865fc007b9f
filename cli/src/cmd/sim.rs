//! `flower sim`: the simulator as a server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use flower_sim::Scenario;

#[derive(Args)]
pub struct SimArgs {
    /// Address to listen on (loopback by default)
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,
    /// Scenario file to play (see the README's scenario format); without one,
    /// every request gets the default reply
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// Log every answered Messages request as a JSON line (arrival and answer
    /// instants in µs since the Unix epoch, its first user text, the tool
    /// results it carries and the calls answered) for benchmarks
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// Requests per minute per API key (429 with `retry-after` and the
    /// provider's rate-limit headers beyond; overrides the scenario's `quota`)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub quota_rpm: Option<u64>,
    /// Input tokens per minute per API key (every input token, cached or not)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub quota_itpm: Option<u64>,
    /// Output tokens per minute per API key
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub quota_otpm: Option<u64>,
}

pub async fn serve(args: SimArgs) -> anyhow::Result<ExitCode> {
    let scenario = match &args.scenario {
        Some(p) => Scenario::load(p)?,
        None => Scenario::default(),
    };
    let roles = scenario.roles.len();
    let mut engine = flower_sim::engine::Engine::new(scenario);
    if args.quota_rpm.is_some() || args.quota_itpm.is_some() || args.quota_otpm.is_some() {
        engine = engine.with_quota(flower_sim::quota::Quota {
            requests_per_minute: args.quota_rpm,
            input_tokens_per_minute: args.quota_itpm,
            output_tokens_per_minute: args.quota_otpm,
        });
    }
    if let Some(path) = &args.timeline {
        let timeline =
            flower_sim::timeline::Timeline::create(path).with_context(|| format!("--timeline {}", path.display()))?;
        engine = engine.with_timeline(timeline);
    }
    let handle = flower_sim::server::start_with(engine, args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let quota = engine_quota(&handle);
    println!(
        "flower sim listening on {} ({roles} scripted roles, {}{quota}); POST /v1/messages, POST /v1/chat/completions",
        handle.base_url(),
        super::runtime_threads()
    );
    // Ctrl-C or SIGTERM (`docker stop`) ends it.
    super::backends::terminated().await;
    handle.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// The quota the simulator enforces, as its first line says it.
fn engine_quota(handle: &flower_sim::SimHandle) -> String {
    let q = handle.quota();
    if !q.is_set() {
        return String::new();
    }
    let per = |v: Option<u64>, what: &str| v.map(|v| format!("{v} {what}/min"));
    let parts: Vec<String> = [
        per(q.requests_per_minute, "requests"),
        per(q.input_tokens_per_minute, "input tokens"),
        per(q.output_tokens_per_minute, "output tokens"),
    ]
    .into_iter()
    .flatten()
    .collect();
    format!(", quota per key: {}", parts.join(", "))
}

#[derive(Args)]
pub struct McpFixtureArgs {
    /// Serve streamable HTTP at this address (endpoint `/mcp`) instead of stdio
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// Require a token: the value of this environment variable, as a bearer
    /// token over HTTP; over stdio the server refuses to start without it
    #[arg(long)]
    pub token_env: Option<String>,
    /// Print the catalog (name, category, schema size) instead of serving
    #[arg(long)]
    pub list: bool,
    /// With --list: machine-readable output
    #[arg(long)]
    pub json: bool,
}

pub async fn mcp_fixture(args: McpFixtureArgs) -> anyhow::Result<ExitCode> {
    use flower_sim::mcp_fixture;
    if args.list {
        let tools = mcp_fixture::catalog();
        if args.json {
            let v: Vec<_> = tools
                .iter()
                .map(|t| serde_json::json!({"name": t.name, "category": t.category, "description": t.description, "inputSchema": t.input_schema}))
                .collect();
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            for t in tools {
                println!(
                    "{:<40} {:<28} {} chars",
                    t.name,
                    t.category,
                    t.description.len() + t.input_schema.to_string().len()
                );
            }
            println!("{} tools", tools.len());
        }
        return Ok(ExitCode::SUCCESS);
    }
    match args.http {
        None => mcp_fixture::serve_stdio(args.token_env.as_deref()).await?,
        Some(addr) => {
            let token = match &args.token_env {
                Some(var) => Some(std::env::var(var).with_context(|| format!("the token variable {var} is not set"))?),
                None => None,
            };
            let server = mcp_fixture::serve_http(addr, token).await.with_context(|| format!("listening on {addr}"))?;
            eprintln!("flower mcp-fixture listening on {}", server.url());
            tokio::select! {
                _ = tokio::signal::ctrl_c() => server.shutdown().await,
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
