//! The distributed mode's wiring: one builder, from configuration to
//! connected backends, used by `flower coordinator`, `flower worker` and
//! `flower bench`. Postgres for state, NATS JetStream for tasks and notices,
//! object storage for workbenches and workspaces, the provider table.

use std::sync::Arc;
use std::time::Duration;

use flower_agent::Journal;
use flower_agent::provider::{ConfiguredProviders, ProviderConfigError};
use flower_bus::{BusError, NatsBus, NatsConfig};
use flower_coordinator::dispatch::Sweep;
use flower_coordinator::service::Backends;
use flower_model::policy::ToolPolicy;
use flower_store::objects::{self, S3Options};
use flower_store::{PostgresStore, SchemaPolicy, StoreError};
use flower_worker::{Worker, WorkerOptions};
use object_store::ObjectStore;

/// Where a distributed process finds its backends.
#[derive(Clone, Debug)]
pub struct DistributedConfig {
    /// `postgres://user@host:port/db`.
    pub database_url: String,
    pub database_pool: usize,
    /// Migrate an older schema at start, or refuse it (`flower migrate` does it).
    pub schema: SchemaPolicy,
    pub nats_url: String,
    /// Prefix of the NATS stream and subjects (deployments sharing a server differ here).
    pub nats_prefix: String,
    /// `s3://bucket/prefix` or `file:///path`.
    pub object_store: String,
    pub s3: S3Options,
    /// `NAME=URL` entries; keys from `<NAME>_API_KEY`.
    pub providers: Vec<String>,
    /// Concurrent model calls per provider from this process.
    pub provider_concurrency: usize,
    /// Admit model calls against their routes' limits kept in the store
    /// (else each call retries its own 429s).
    pub shared_rate_limits: bool,
    /// Deliveries of a task before it fails without running again.
    pub max_attempts: u32,
    /// Time a running task may go without a heartbeat before it is redelivered.
    pub ack_wait: Duration,
    /// MCP servers and variables a spec may name.
    pub tool_policy: ToolPolicy,
}

/// A backend that could not be reached or configured, named.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the delivery limit must be at least 1")]
    MaxAttempts,
    #[error("the ack wait must be at least 1s")]
    AckWait,
    #[error("providers: {0}")]
    Providers(#[from] ProviderConfigError),
    #[error("database: {0}")]
    Database(StoreError),
    #[error("NATS: {0}")]
    Nats(BusError),
    #[error("object storage: {0}")]
    Objects(StoreError),
}

/// Connected backends of one process.
#[derive(Clone)]
pub struct Connected {
    pub store: Arc<PostgresStore>,
    pub bus: NatsBus,
    pub objects: Arc<dyn ObjectStore>,
    pub providers: Arc<ConfiguredProviders>,
    pub tool_policy: Arc<ToolPolicy>,
    /// The context windows learnt in this process, shared by its service and workers.
    pub windows: flower_model::windows::Windows,
    max_attempts: u32,
    ack_wait: Duration,
}

impl DistributedConfig {
    /// Connect every backend; the bus hears every notice kind.
    pub async fn connect(&self) -> Result<Connected, ConnectError> {
        self.connect_hearing(&flower_bus::NoticeKind::ALL).await
    }

    /// [`DistributedConfig::connect`], the bus hearing only the notice kinds
    /// `hears` (a worker process: cancels).
    pub async fn connect_hearing(&self, hears: &[flower_bus::NoticeKind]) -> Result<Connected, ConnectError> {
        if self.max_attempts < 1 {
            return Err(ConnectError::MaxAttempts);
        }
        if self.ack_wait < Duration::from_secs(1) {
            return Err(ConnectError::AckWait);
        }
        // A bad table is refused before anything connects.
        ConfiguredProviders::parse(&self.providers, self.provider_concurrency.max(1), None)?;
        let store = PostgresStore::connect_with(&self.database_url, self.database_pool, self.schema)
            .await
            .map_err(ConnectError::Database)?;
        let store = Arc::new(store);
        // Every process draws from the routes' rate limits kept in the store.
        let shared: Arc<dyn flower_store::Store> = store.clone();
        let quotas = self.shared_rate_limits.then_some(&shared);
        let providers = ConfiguredProviders::parse(&self.providers, self.provider_concurrency.max(1), quotas)?;
        let mut nats = NatsConfig::new(self.nats_url.clone(), self.nats_prefix.clone());
        nats.ack_wait = self.ack_wait;
        nats.max_attempts = self.max_attempts;
        nats.hears = hears.to_vec();
        let bus = NatsBus::connect(nats).await.map_err(ConnectError::Nats)?;
        let objects = objects::open(&self.object_store, &self.s3).map_err(ConnectError::Objects)?;
        Ok(Connected {
            store,
            bus,
            objects,
            providers: Arc::new(providers),
            tool_policy: Arc::new(self.tool_policy.clone()),
            windows: Default::default(),
            max_attempts: self.max_attempts,
            ack_wait: self.ack_wait,
        })
    }
}

impl Connected {
    /// The same backends with another provider table (benchmarks wrap the
    /// providers to time each side).
    pub fn with_providers(mut self, providers: Arc<ConfiguredProviders>) -> Self {
        self.providers = providers;
        self
    }

    /// What a coordinator service runs on.
    pub fn backends(&self) -> Backends {
        Backends {
            store: self.store.clone(),
            queue: Arc::new(self.bus.clone()),
            notifier: Arc::new(self.bus.clone()),
            objects: self.objects.clone(),
            providers: self.providers.clone(),
            tool_policy: self.tool_policy.clone(),
            windows: self.windows.clone(),
        }
    }

    /// When the owning coordinator presumes a running task's message gone:
    /// no heartbeat for the ack wait × (delivery limit + 1).
    pub fn sweep(&self) -> Sweep {
        Sweep { stale_after: self.ack_wait * (self.max_attempts + 1), max_attempts: self.max_attempts }
    }

    /// A worker consuming this deployment's tasks; `opts` gets the delivery
    /// limit and a heartbeat well inside the ack wait.
    pub fn worker(&self, mut opts: WorkerOptions) -> Arc<Worker> {
        opts.max_attempts = self.max_attempts;
        opts.heartbeat = self.ack_wait / 3;
        opts.windows = self.windows.clone();
        let journal = Journal::new(self.store.clone(), Arc::new(self.bus.clone()));
        Worker::new(opts, journal, Arc::new(self.bus.clone()), self.objects.clone(), self.providers.clone())
    }
}
