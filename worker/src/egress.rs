//! The egress proxy: the one way out of a tool's empty network namespace,
//! for the destinations its job was granted (`network.egress`, each allowed
//! by the operator's `--tool-egress-allow`). One per task, listening on a
//! Unix socket in the task folder; inside the namespace the launcher
//! forwards `127.0.0.1:`[`PROXY_PORT`] to it, and tools find it through
//! `HTTP(S)_PROXY`. Each connection names its destination (an HTTP
//! `CONNECT`, or an absolute `http://` request) and is checked here against
//! the grant — by destination, not by a list of refused ports. A granted
//! name that resolves to this host's own or a link-local address is refused
//! (the service's own ports and cloud metadata live there); a granted
//! address is connected to as written. A plain-HTTP connection stays with
//! the destination its first request named: later requests on it go there
//! too, whatever their `Host`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flower_model::network::Destination;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};

/// The port tools reach the proxy on, inside their namespace.
pub const PROXY_PORT: u16 = 3128;
/// The socket's name in the task folder.
pub const SOCKET: &str = ".egress.sock";
/// Longest request head read before the destination is known.
const MAX_HEAD: usize = 16 * 1024;
/// Connections of one task at once.
const MAX_CONNECTIONS: usize = 64;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a task may reach: each destination, and whether the operator's
/// pattern named an address (connected to as written) or a name.
#[derive(Clone, Debug)]
pub struct Grant {
    pub destination: Destination,
    pub address: bool,
}

/// A task's proxy; dropped, it stops and its socket is removed (unless a
/// later task's proxy has taken the name since).
#[derive(Debug)]
pub struct EgressProxy {
    path: PathBuf,
    inode: u64,
    accept: tokio::task::JoinHandle<()>,
}

impl EgressProxy {
    /// Listen at `dir`/[`SOCKET`] for the tools of a task granted `grants`.
    pub fn start(dir: &Path, grants: Vec<Grant>) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(SOCKET);
        let _ = std::fs::remove_file(&path);
        // A socket's path is at most 107 bytes; a task folder's may be
        // longer: bound through a descriptor of the folder.
        let folder = std::fs::File::open(dir)?;
        let short = format!("/proc/self/fd/{}/{SOCKET}", std::os::fd::AsRawFd::as_raw_fd(&folder));
        let listener = UnixListener::bind(&short)?;
        drop(folder);
        // The tool user connects to it (a socket is written to); only this
        // task's tools see the folder (the worker grants egress only where
        // tools have mount namespaces of their own).
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::symlink_metadata(&path)?);
        let grants = Arc::new(grants);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    let mut s = stream;
                    let _ = refuse(&mut s, 503, "too many connections from this task at once").await;
                    continue;
                };
                let grants = grants.clone();
                tokio::spawn(async move {
                    serve(stream, &grants).await;
                    drop(slot);
                });
            }
        });
        Ok(Self { path, inode, accept })
    }

    pub fn socket(&self) -> &Path {
        &self.path
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.accept.abort();
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == self.inode);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The environment a tool finds the proxy through.
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]
        .iter()
        .map(|k| (k.to_string(), url.clone()))
        .chain([("NO_PROXY".to_string(), String::new()), ("no_proxy".to_string(), String::new())])
        .collect()
}

async fn refuse(s: &mut UnixStream, code: u16, why: &str) -> std::io::Result<()> {
    let reason = match code {
        400 => "Bad Request",
        403 => "Forbidden",
        502 => "Bad Gateway",
        _ => "Service Unavailable",
    };
    let body = format!("flower egress: {why}\n");
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await
}

/// The destination a request head names: `CONNECT host:port`, or an
/// absolute `http://host[:port]/…` target; and whether it is a tunnel.
fn destination(head: &str) -> Result<(Destination, bool), String> {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err("not an HTTP proxy request".into());
    };
    if method == "CONNECT" {
        return target.parse().map(|d| (d, true));
    }
    let rest = target
        .strip_prefix("http://")
        .ok_or_else(|| format!("`{method} {target}`: a proxy request names an http:// URL or is a CONNECT"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let with_port = if authority.ends_with(']') || !authority.contains(':') {
        format!("{authority}:80")
    } else {
        authority.to_string()
    };
    with_port.parse().map(|d| (d, false))
}

/// This host's own or link-local addresses: loopback, unspecified, "this
/// network" (0.0.0.0/8), link-local (169.254/16 — cloud metadata —, fe80::/10),
/// in either family (IPv4-mapped and -compatible forms included).
fn local(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().or_else(|| v6.to_ipv4()).map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified() || v4.is_link_local() || v4.octets()[0] == 0,
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

async fn resolve(g: &Grant) -> Result<Vec<SocketAddr>, String> {
    let d = &g.destination;
    if let Ok(ip) = d.host.parse::<IpAddr>() {
        if local(ip) && !g.address {
            return Err(format!("`{d}` is a local address"));
        }
        return Ok(vec![SocketAddr::new(ip, d.port)]);
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((d.host.as_str(), d.port))
        .await
        .map_err(|e| format!("`{d}` does not resolve: {e}"))?
        .collect();
    if addrs.iter().any(|a| local(a.ip())) && !g.address {
        return Err(format!("`{d}` resolves to a local address"));
    }
    Ok(addrs)
}

async fn serve(mut s: UnixStream, grants: &[Grant]) {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    let end = loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if head.len() > MAX_HEAD {
            let _ = refuse(&mut s, 400, "request head too long").await;
            return;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let (dest, tunnel) = match destination(&text) {
        Ok(d) => d,
        Err(why) => {
            let _ = refuse(&mut s, 400, &why).await;
            return;
        }
    };
    let Some(grant) = grants.iter().find(|g| g.destination == dest) else {
        tracing::info!(destination = %dest, "egress refused: not granted to the task");
        let _ = refuse(&mut s, 403, &format!("`{dest}` is not among this job's network.egress")).await;
        return;
    };
    let addrs = match resolve(grant).await {
        Ok(a) => a,
        Err(why) => {
            let _ = refuse(&mut s, 403, &why).await;
            return;
        }
    };
    let upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addrs[..])).await {
        Ok(Ok(u)) => u,
        Ok(Err(e)) => {
            let _ = refuse(&mut s, 502, &format!("`{dest}`: {e}")).await;
            return;
        }
        Err(_) => {
            let _ = refuse(&mut s, 502, &format!("`{dest}`: no answer within {}s", CONNECT_TIMEOUT.as_secs())).await;
            return;
        }
    };
    let mut upstream = upstream;
    // A plain request goes up whole; a tunnel's early bytes (a TLS hello
    // sent with the CONNECT) follow the answer.
    let sent = if tunnel {
        match s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await {
            Ok(()) => upstream.write_all(&head[end..]).await,
            Err(e) => Err(e),
        }
    } else {
        upstream.write_all(&head).await
    };
    if sent.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut s, &mut upstream).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_name_their_destination() {
        let d = |h: &str| destination(h).map(|(d, t)| (d.to_string(), t));
        assert_eq!(d("CONNECT pypi.org:443 HTTP/1.1\r\n\r\n"), Ok(("pypi.org:443".into(), true)));
        assert_eq!(d("GET http://example.com/x HTTP/1.1\r\n\r\n"), Ok(("example.com:80".into(), false)));
        assert_eq!(d("GET http://u:p@Example.com:8080/ HTTP/1.1\r\n"), Ok(("example.com:8080".into(), false)));
        assert_eq!(d("GET http://[::1]/ HTTP/1.1\r\n"), Ok(("[::1]:80".into(), false)));
        assert!(d("GET /relative HTTP/1.1\r\n").is_err());
        assert!(d("CONNECT pypi.org HTTP/1.1\r\n").is_err());
        assert!(d("").is_err());
    }

    #[test]
    fn local_addresses_are_known_in_both_families() {
        for ip in [
            "127.0.0.1",
            "127.8.9.1",
            "::1",
            "0.0.0.0",
            "::",
            "::ffff:127.0.0.1",
            "169.254.169.254",
            "0.1.2.3",
            "fe80::1",
            "::127.0.0.1",
        ] {
            assert!(local(ip.parse().unwrap()), "{ip}");
        }
        assert!(!local("140.82.112.5".parse().unwrap()));
    }
}
