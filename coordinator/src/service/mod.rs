//! The coordinator service: the `Flower` gRPC API, job ownership through
//! leases, and the runs of the jobs this replica owns. Several replicas may
//! serve the same database; each job runs on exactly one at a time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flower_bus::{Notifier, TaskQueue};
use flower_proto::v1::access_server::AccessServer;
use flower_proto::v1::flower_server::FlowerServer;
use flower_store::Store;
use object_store::ObjectStore;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Status};

use flower_agent::provider::ConfiguredProviders;

pub mod access;
pub mod api;
pub mod owner;
pub mod status;

/// The backends a service runs on.
#[derive(Clone)]
pub struct Backends {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn TaskQueue>,
    pub notifier: Arc<dyn Notifier>,
    pub objects: Arc<dyn ObjectStore>,
    pub providers: Arc<ConfiguredProviders>,
    /// MCP servers and credential variables a spec may name (refused at submit otherwise).
    pub tool_policy: Arc<flower_model::policy::ToolPolicy>,
    /// The context windows learnt in this process (read by the runs'
    /// thresholds; shared with a console or worker of the same process).
    pub windows: flower_model::windows::Windows,
}

#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// The operator's token: an admin credential. With it (or `jwt`), every
    /// call but health checks needs `authorization: Bearer <credential>`
    /// (an API key, this token, or a signed token); without either, the
    /// service is open (every caller without a credential is an admin).
    pub token: Option<String>,
    /// Signed tokens accepted (JWT verified against a JWKS).
    pub jwt: Option<Arc<crate::app::jwt::Verifier>>,
    /// Largest request accepted (spec + workspace), checked by the handlers (default 16 MiB).
    pub max_request_bytes: usize,
    /// Lease lifetime; a dead owner's jobs are taken over after it (default 15 s).
    pub lease_ttl: Duration,
    /// This replica's name in leases (unique per process).
    pub replica: String,
    /// PEM certificate chain and key: serve over TLS when set.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// When a running task's message is presumed gone (from the queue's ack
    /// wait and delivery limit).
    pub sweep: crate::dispatch::Sweep,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            token: None,
            jwt: None,
            max_request_bytes: 16 << 20,
            lease_ttl: Duration::from_secs(15),
            replica: format!("coordinator-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()),
            tls: None,
            sweep: Default::default(),
        }
    }
}

/// A coordinator service: its owner of jobs and its application, which
/// every front-end of the process (the gRPC API, the console) calls.
pub struct Service {
    config: ServiceConfig,
    backends: Backends,
    owner: Arc<owner::Owner>,
    app: crate::app::App,
}

impl Service {
    pub fn new(config: ServiceConfig, backends: Backends) -> Self {
        let owner = owner::Owner::new(backends.clone(), config.replica.clone(), config.lease_ttl, config.sweep);
        let auth = crate::app::auth::AuthConfig { token: config.token.clone(), jwt: config.jwt.clone() };
        let app = app(&backends, owner.clone(), config.max_request_bytes).with_auth(auth);
        Self { config, backends, owner, app }
    }

    /// The application this service's front-ends call.
    pub fn app(&self) -> &crate::app::App {
        &self.app
    }

    /// Serve on `listener` until `shutdown` (see [`serve`]).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), tonic::transport::Error> {
        run(self, listener, shutdown).await
    }
}

/// Serve on `listener` until `shutdown`; jobs this replica owns are released
/// at shutdown so another replica resumes them at once.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: ServiceConfig,
    backends: Backends,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    Service::new(config, backends).serve(listener, shutdown).await
}

async fn run(
    service: Service,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let Service { config, backends, owner, app } = service;
    let owning = tokio::spawn(owner.clone().run(shutdown.clone()));
    let journal = flower_agent::Journal::new(backends.store.clone(), backends.notifier.clone());
    let dead_letters = tokio::spawn(crate::dead_letters::run(
        backends.queue.clone(),
        journal,
        config.sweep.max_attempts,
        shutdown.clone(),
    ));
    let access = AccessServer::new(access::AccessApi::new(app.clone()));
    let api = api::Api::new(app, backends.notifier.clone());
    // Every call of `Flower` and `Access` is authenticated by the
    // application (keys, the token, signed tokens); reflection, which shows
    // only the public schema, needs the operator's token when one is set.
    let token = config.token.clone();
    let auth = move |req: Request<()>| check_token(&token, req);
    // Our own size checks give the precise message; the transport's limit sits above them.
    let transport_limit = config.max_request_bytes.saturating_mul(2).max(4 << 20);
    let flower = FlowerServer::new(api).max_decoding_message_size(transport_limit);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<FlowerServer<api::Api>>().await;
    // Reflection in both versions: v1, and v1alpha for the clients that speak
    // only it (grpcurl ≤ 1.8.7, grpcui ≤ 1.4.1, Evans, grpcio's reflection client).
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(flower_proto::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 =
        reflection().build_v1().map_err(|e| tracing::error!(error = %e, "reflection v1 unavailable")).ok();
    let reflection_v1alpha =
        reflection().build_v1alpha().map_err(|e| tracing::error!(error = %e, "reflection v1alpha unavailable")).ok();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let mut server = tonic::transport::Server::builder();
    if let Some((cert, key)) = &config.tls {
        server = server.tls_config(
            tonic::transport::ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(cert, key)),
        )?;
    }
    let mut router = server.add_service(health).add_service(flower).add_service(access);
    if let Some(r) = reflection_v1 {
        router = router.add_service(tonic::service::interceptor::InterceptedService::new(r, auth.clone()));
    }
    if let Some(r) = reflection_v1alpha {
        router = router.add_service(tonic::service::interceptor::InterceptedService::new(r, auth));
    }
    let stop = shutdown.clone();
    let served = router.serve_with_incoming_shutdown(incoming, async move { stop.cancelled().await }).await;
    shutdown.cancel();
    let _ = owning.await;
    let _ = dead_letters.await;
    served
}

/// The application a service's front-ends call (the gRPC API; the console
/// beside it is given the same through [`app`]).
pub fn app(b: &Backends, owner: Arc<owner::Owner>, max_request_bytes: usize) -> crate::app::App {
    let runs = api::ServiceRuns { owner, notifier: b.notifier.clone(), providers: b.providers.clone() };
    crate::app::App::new(
        crate::app::AppBackends {
            store: b.store.clone(),
            objects: b.objects.clone(),
            providers: b.providers.clone(),
            tool_policy: b.tool_policy.clone(),
            windows: b.windows.clone(),
        },
        Arc::new(runs),
    )
    .with_max_request_bytes(max_request_bytes)
}

fn check_token(token: &Option<String>, req: Request<()>) -> Result<Request<()>, Status> {
    let Some(expected) = token else { return Ok(req) };
    let given =
        req.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(t) if flower_model::secret::same(t.as_bytes(), expected.as_bytes()) => Ok(req),
        Some(_) => Err(Status::unauthenticated("the bearer token is not valid")),
        None => Err(Status::unauthenticated("this service needs `authorization: Bearer <token>`")),
    }
}

/// The URL of a service bound at `addr` (for logs and tests that bind port 0).
pub fn describe(addr: SocketAddr, tls: bool) -> String {
    format!("{}://{addr}", if tls { "https" } else { "http" })
}
