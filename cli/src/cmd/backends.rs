//! Flags shared by the service processes (`flower coordinator`, `flower
//! worker`): where the database, the bus, object storage and the providers are.
//! Every flag has an environment variable; bad values fail at start, named.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use flower_bus::{NatsBus, NatsConfig};
use flower_coordinator::providers::ConfiguredProviders;
use flower_coordinator::service::Backends;
use flower_store::PostgresStore;
use flower_store::objects::{self, S3Options};

#[derive(Args, Clone, Debug)]
pub struct BackendArgs {
    /// Postgres URL (postgres://user@host:port/db)
    #[arg(long, env = "FLOWER_DATABASE_URL")]
    pub database_url: String,
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
    pub async fn connect(&self) -> anyhow::Result<(Backends, NatsBus)> {
        anyhow::ensure!(self.max_attempts >= 1, "--max-attempts: must be at least 1");
        anyhow::ensure!(self.ack_wait >= Duration::from_secs(1), "--ack-wait: must be at least 1s");
        let providers = ConfiguredProviders::parse(&self.providers, self.provider_concurrency.max(1))
            .context("--provider / FLOWER_PROVIDERS")?;
        let tool_policy = self.tool_policy()?;
        let store = PostgresStore::connect(&self.database_url, self.database_pool)
            .await
            .context("--database-url / FLOWER_DATABASE_URL")?;
        let mut nats = NatsConfig::new(self.nats_url.clone(), self.nats_prefix.clone());
        nats.ack_wait = self.ack_wait;
        nats.max_attempts = self.max_attempts;
        let bus = NatsBus::connect(nats).await.context("--nats-url / FLOWER_NATS_URL")?;
        let objects = objects::open(&self.object_store, &S3Options::from_env())
            .context("--object-store / FLOWER_OBJECT_STORE")?;
        let backends = Backends {
            store: Arc::new(store),
            queue: Arc::new(bus.clone()),
            notifier: Arc::new(bus.clone()),
            objects,
            providers: Arc::new(providers),
            tool_policy: Arc::new(tool_policy),
        };
        Ok((backends, bus))
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
