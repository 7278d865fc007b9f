//! The network a job's tools may reach: none by default. A spec asks for
//! destinations (`network: {egress: [HOST:PORT, …]}`); the operator allows
//! patterns of them (`--tool-egress-allow`); a destination no pattern
//! allows is refused at submit ([`crate::policy::ToolPolicy`]). What is
//! granted is reached through the worker's egress proxy, which checks each
//! connection's destination again — never by opening the tool's network.

use serde::{Deserialize, Serialize};

/// One destination: a host (a name or an IP literal, `[…]` for IPv6) and a port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Destination {
    /// Lowercase; an IPv6 literal without its brackets.
    pub host: String,
    pub port: u16,
}

fn valid_host(host: &str) -> bool {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// `HOST:PORT` or `[V6]:PORT`, split; the port text as written.
fn split(s: &str) -> Option<(String, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, port) = rest.split_once("]:")?;
        return Some((host.to_ascii_lowercase(), port));
    }
    let (host, port) = s.rsplit_once(':')?;
    if host.contains(':') {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

impl std::str::FromStr for Destination {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("`{}`: expected HOST:PORT (a host name or IP address, and a port 1-65535)", s.escape_debug());
        let (host, port) = split(s.trim()).ok_or_else(bad)?;
        let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?;
        if !valid_host(&host) {
            return Err(bad());
        }
        Ok(Self { host, port })
    }
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl Serialize for Destination {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Destination {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What a job's tools may reach (`network` in a job spec).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// Destinations the tools may connect to, through the worker's egress proxy.
    #[serde(default)]
    pub egress: Vec<Destination>,
}

impl NetworkSpec {
    pub fn is_empty(&self) -> bool {
        self.egress.is_empty()
    }
}

/// Most destinations one job may ask for.
pub const MAX_EGRESS: usize = 64;

/// An operator's pattern of allowed destinations: `HOST:PORT`, with `*.`
/// before a domain (any name beneath it, not the domain itself) and `*` for
/// any port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressAllow {
    /// The host, or the domain after `*.`.
    host: String,
    any_subdomain: bool,
    /// `None`: any port.
    port: Option<u16>,
}

impl std::str::FromStr for EgressAllow {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}`: expected HOST:PORT, *.DOMAIN:PORT or HOST:* (e.g. api.github.com:443)");
        let (host, port) = split(s.trim()).ok_or_else(bad)?;
        let port = match port {
            "*" => None,
            p => Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?),
        };
        let (host, any_subdomain) = match host.strip_prefix("*.") {
            Some(domain) => (domain.to_string(), true),
            None => (host, false),
        };
        if !valid_host(&host) || any_subdomain && host.parse::<std::net::IpAddr>().is_ok() {
            return Err(bad());
        }
        Ok(Self { host, any_subdomain, port })
    }
}

impl std::fmt::Display for EgressAllow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = if self.any_subdomain { format!("*.{}", self.host) } else { self.host.clone() };
        let host = if host.contains(':') { format!("[{host}]") } else { host };
        match self.port {
            Some(p) => write!(f, "{host}:{p}"),
            None => write!(f, "{host}:*"),
        }
    }
}

impl EgressAllow {
    pub fn allows(&self, d: &Destination) -> bool {
        let host = if self.any_subdomain {
            // A name beneath the domain; never an address whose digits happen to end alike.
            d.host.parse::<std::net::IpAddr>().is_err()
                && d.host.strip_suffix(&self.host).is_some_and(|rest| rest.ends_with('.') && rest.len() > 1)
        } else {
            d.host == self.host
        };
        host && self.port.is_none_or(|p| p == d.port)
    }

    /// Whether the pattern names an address, not a name: its destinations
    /// are connected to as written (a name that resolves to a local address
    /// is refused).
    pub fn is_address(&self) -> bool {
        self.host.parse::<std::net::IpAddr>().is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Destination {
        s.parse().unwrap()
    }

    #[test]
    fn destinations_parse_and_print() {
        assert_eq!(d("API.github.com:443"), Destination { host: "api.github.com".into(), port: 443 });
        assert_eq!(d("[::1]:8080").to_string(), "[::1]:8080");
        assert_eq!(d("10.0.0.1:5432").to_string(), "10.0.0.1:5432");
        for bad in ["github.com", "github.com:0", "github.com:70000", "a b:1", "::1:80", "-x.com:1", "x..y:1", ":80"] {
            assert!(bad.parse::<Destination>().is_err(), "{bad}");
        }
    }

    #[test]
    fn patterns_allow_what_they_name_only() {
        let p = |s: &str| s.parse::<EgressAllow>().unwrap();
        assert!(p("api.github.com:443").allows(&d("api.github.com:443")));
        assert!(!p("api.github.com:443").allows(&d("api.github.com:80")));
        assert!(!p("api.github.com:443").allows(&d("api.github.com.evil.net:443")));
        assert!(p("*.example.com:443").allows(&d("a.b.example.com:443")));
        assert!(!p("*.example.com:443").allows(&d("example.com:443")));
        assert!(!p("*.example.com:443").allows(&d("badexample.com:443")));
        assert!(!p("*.0.1:80").allows(&d("127.0.0.1:80")), "an address never matches a domain pattern");
        assert!(p("pypi.org:*").allows(&d("pypi.org:8443")));
        assert_eq!(p("*.example.com:*").to_string(), "*.example.com:*");
        assert!(p("[::1]:8080").is_address() && !p("x.org:1").is_address());
        for bad in ["*.1.2.3.4:80", "x.org", "x.org:0", "*:80", "x.org:y"] {
            assert!(bad.parse::<EgressAllow>().is_err(), "{bad}");
        }
    }
}
