//! The JWKS of an identity provider, read from a file or an `http(s)://`
//! URL at start and again every [`REFRESH`] (a provider rotates its keys),
//! for the application's signed-token verifier (docs/design.md, section 17).

use std::sync::Arc;
use std::time::Duration;

use flower_coordinator::app::jwt::{JwtConfig, Verifier};
use tokio_util::sync::CancellationToken;

/// How often the JWKS is read again.
pub const REFRESH: Duration = Duration::from_secs(300);

/// Read the JWKS at `source` (a path, or an `http(s)://` URL).
pub async fn read(source: &str) -> Result<String, String> {
    if source.starts_with("http://") {
        // Keys fetched in clear could be swapped on the way: https, but for loopback.
        let url = reqwest::Url::parse(source).map_err(|e| format!("{source}: {e}"))?;
        let host = url.host_str().unwrap_or_default();
        let ip = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>();
        let loopback = host == "localhost" || ip.is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return Err(format!("{source}: a JWKS is read over https (http only from loopback)"));
        }
    }
    if source.starts_with("http://") || source.starts_with("https://") {
        let fetch = async {
            let response = reqwest::get(source).await.map_err(|e| e.to_string())?;
            let response = response.error_for_status().map_err(|e| e.to_string())?;
            response.text().await.map_err(|e| e.to_string())
        };
        tokio::time::timeout(Duration::from_secs(10), fetch)
            .await
            .map_err(|_| "no answer within 10 s".to_string())?
            .map_err(|e| format!("{source}: {e}"))
    } else {
        tokio::fs::read_to_string(source).await.map_err(|e| format!("{source}: {e}"))
    }
}

/// A verifier with the keys at `source`, kept fresh until `shutdown` (a
/// failed refresh keeps the keys last read, and says so in the log).
pub async fn verifier(source: &str, config: JwtConfig, shutdown: CancellationToken) -> Result<Arc<Verifier>, String> {
    let verifier = Arc::new(Verifier::new(config, &read(source).await?)?);
    let (kept, source) = (verifier.clone(), source.to_string());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(REFRESH) => {}
            }
            match read(&source).await.and_then(|jwks| kept.replace_keys(&jwks)) {
                Ok(n) => tracing::debug!(keys = n, "JWKS read again"),
                Err(e) => tracing::warn!(error = %e, "the JWKS could not be read again; the keys last read stay"),
            }
        }
    });
    Ok(verifier)
}
