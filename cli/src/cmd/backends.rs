//! Flags shared by the service processes (`flower coordinator`, `flower
//! worker`): where the database, the bus, object storage and the providers are.
//! Every flag has an environment variable; bad values fail at start, named.

use std::time::Duration;

use clap::Args;
use flower_runtime::{ConnectError, Connected, DistributedConfig};
use flower_store::SchemaPolicy;
use flower_store::objects::S3Options;

#[derive(Args, Clone, Debug)]
pub struct BackendArgs {
    /// Postgres URL (postgres://user@host:port/db)
    #[arg(long, env = "FLOWER_DATABASE_URL")]
    pub database_url: String,
    /// An older database schema: `migrate` it at start, or `require-current`
    /// (refuse to start; a deployment's `flower migrate` job applies it)
    #[arg(long, env = "FLOWER_SCHEMA", default_value = "migrate", value_parser = parse_schema)]
    pub schema: SchemaPolicy,
    /// Connections in the database pool
    #[arg(long, env = "FLOWER_DATABASE_POOL", default_value_t = 16)]
    pub database_pool: usize,
    /// NATS server with JetStream
    #[arg(long, env = "FLOWER_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Prefix of the NATS stream and subjects (deployments sharing a server differ here)
    #[arg(long, env = "FLOWER_NATS_PREFIX", default_value = "flower")]
    pub nats_prefix: String,
    /// Object storage for workbenches and workspaces: s3://bucket/prefix or file:///path
    /// (S3 endpoint and credentials: FLOWER_S3_ENDPOINT / AWS_* variables)
    #[arg(long, env = "FLOWER_OBJECT_STORE")]
    pub object_store: String,
    /// A model provider, NAME=URL (repeatable; or FLOWER_PROVIDERS="sim=http://…,anthropic=https://…").
    /// Keys come from <NAME>_API_KEY.
    #[arg(long = "provider", env = "FLOWER_PROVIDERS", value_delimiter = ',')]
    pub providers: Vec<String>,
    /// Concurrent model calls per provider from this process
    #[arg(long, env = "FLOWER_PROVIDER_CONCURRENCY", default_value_t = 16)]
    pub provider_concurrency: usize,
    /// Shared rate limits: `shared` (default) admits each model call against its route's limits,
    /// kept in the store for every process; `off` leaves each call to retry its own 429s (to compare)
    #[arg(long, env = "FLOWER_RATE_LIMITS", default_value = "shared", value_parser = ["shared", "off"])]
    pub rate_limits: String,
    /// Deliveries of a task before it fails without running again
    #[arg(long, env = "FLOWER_MAX_ATTEMPTS", default_value_t = 3)]
    pub max_attempts: u32,
    /// Time a running task may go without a heartbeat before it is redelivered
    #[arg(long, env = "FLOWER_ACK_WAIT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub ack_wait: Duration,
    #[command(flatten)]
    pub policy: super::isolation::PolicyArgs,
}

impl BackendArgs {
    /// Connect every backend (`flower_runtime::distributed`), naming the
    /// flag of whichever fails.
    pub async fn connect(&self) -> anyhow::Result<Connected> {
        self.connect_hearing(&flower_bus::NoticeKind::ALL).await
    }

    /// [`BackendArgs::connect`], the bus hearing only the notice kinds `hears`.
    pub async fn connect_hearing(&self, hears: &[flower_bus::NoticeKind]) -> anyhow::Result<Connected> {
        let config = DistributedConfig {
            database_url: self.database_url.clone(),
            database_pool: self.database_pool,
            schema: self.schema,
            nats_url: self.nats_url.clone(),
            nats_prefix: self.nats_prefix.clone(),
            object_store: self.object_store.clone(),
            s3: S3Options::from_env(),
            providers: self.providers.clone(),
            provider_concurrency: self.provider_concurrency,
            shared_rate_limits: self.rate_limits == "shared",
            max_attempts: self.max_attempts,
            ack_wait: self.ack_wait,
            tool_policy: self.tool_policy()?,
        };
        config.connect_hearing(hears).await.map_err(|e| {
            let flag = match &e {
                ConnectError::MaxAttempts => "--max-attempts",
                ConnectError::AckWait => "--ack-wait",
                ConnectError::Providers(_) => "--provider / FLOWER_PROVIDERS",
                ConnectError::Database(_) => "--database-url / FLOWER_DATABASE_URL",
                ConnectError::Nats(_) => "--nats-url / FLOWER_NATS_URL",
                ConnectError::Objects(_) => "--object-store / FLOWER_OBJECT_STORE",
            };
            anyhow::Error::new(e).context(flag)
        })
    }

    /// The spec policy (--mcp-allow, --env-allow), refusing the variables
    /// this process reads its own credentials from.
    pub fn tool_policy(&self) -> anyhow::Result<flower_model::policy::ToolPolicy> {
        self.policy.policy(&super::isolation::service_credentials(&self.providers))
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn terminated() {
    #[cfg(unix)]
    {
        if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

fn parse_schema(s: &str) -> Result<SchemaPolicy, String> {
    match s {
        "migrate" => Ok(SchemaPolicy::Migrate),
        "require-current" => Ok(SchemaPolicy::RequireCurrent),
        _ => Err(format!("`{s}`: expected migrate or require-current")),
    }
}
