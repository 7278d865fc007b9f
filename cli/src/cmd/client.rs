//! The gRPC client of the client commands: `--server` / `FLOWER_SERVER`,
//! with `--token` / `FLOWER_TOKEN` sent as a bearer token.

use anyhow::Context;
use clap::Args;
use flower_proto::v1::flower_client::FlowerClient;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::Channel;

#[derive(Args, Clone, Debug)]
pub struct ServerArgs {
    /// The coordinator service (e.g. http://127.0.0.1:7777); without it, commands
    /// that can read the embedded store do so
    #[arg(long, env = "FLOWER_SERVER")]
    pub server: Option<String>,
    /// Credential for the service: an API key (`flk_…`), the operator's token, or a signed token
    #[arg(long, env = "FLOWER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM CA certificate to trust for an https:// service (default: the public web roots)
    #[arg(long, env = "FLOWER_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
}

#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub type Client = FlowerClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

pub type AccessClient =
    flower_proto::v1::access_client::AccessClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

impl ServerArgs {
    pub fn configured(&self) -> bool {
        self.server.as_deref().is_some_and(|s| !s.is_empty())
    }

    pub async fn connect(&self) -> anyhow::Result<Client> {
        let (channel, bearer) = self.channel().await?;
        Ok(FlowerClient::with_interceptor(channel, bearer).max_decoding_message_size(64 << 20))
    }

    /// The `Access` service (namespaces, keys, the audit log) of the same service.
    pub async fn connect_access(&self) -> anyhow::Result<AccessClient> {
        let (channel, bearer) = self.channel().await?;
        Ok(flower_proto::v1::access_client::AccessClient::with_interceptor(channel, bearer))
    }

    async fn channel(&self) -> anyhow::Result<(Channel, Bearer)> {
        let url = self
            .server
            .clone()
            .filter(|s| !s.is_empty())
            .context("no service: pass --server URL or set FLOWER_SERVER")?;
        let mut endpoint = Channel::from_shared(url.clone()).with_context(|| format!("--server {url}"))?;
        if url.starts_with("https://") {
            let mut tls = tonic::transport::ClientTlsConfig::new();
            tls = match &self.tls_ca {
                Some(ca) => tls.ca_certificate(tonic::transport::Certificate::from_pem(
                    std::fs::read(ca).with_context(|| format!("--tls-ca {}", ca.display()))?,
                )),
                None => tls.with_webpki_roots(),
            };
            endpoint = endpoint.tls_config(tls).context("TLS settings")?;
        }
        let channel = endpoint.connect().await.with_context(|| format!("cannot reach the flower service at {url}"))?;
        let bearer = match self.token.as_deref().filter(|t| !t.is_empty()) {
            Some(t) => Some(format!("Bearer {t}").parse().context("--token: not a valid header value")?),
            None => None,
        };
        Ok((channel, Bearer(bearer)))
    }
}

/// A status read back as the application layer's error (one
/// classification: `flower_coordinator::service::status` wrote the code).
pub fn app_error(s: tonic::Status) -> flower_coordinator::app::AppError {
    use flower_model::ErrorKind;
    let kind = flower_coordinator::service::status::kind(s.code());
    let m = s.message();
    let message = match kind {
        ErrorKind::Unavailable => format!("the flower service is unavailable: {m}"),
        ErrorKind::Unauthenticated => format!("the flower service refused this client's credentials: {m}"),
        ErrorKind::PermissionDenied => format!("this client's credential does not allow it: {m}"),
        ErrorKind::Internal => format!("{:?}: {m}", s.code()),
        _ => m.to_string(),
    };
    flower_coordinator::app::AppError::new(kind, message)
}

/// A status as a one-line error for humans.
pub fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}
