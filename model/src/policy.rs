//! What a job spec may make a worker start or hand out, decided by the
//! operator, not by the spec: the MCP servers a job may start (stdio
//! commands) and the worker environment variables a spec may name in
//! `env_from` / `token_env`. A variable sent as a bearer token
//! (`token_env`) is bound by the operator to the URL prefix it may be sent
//! to (`--env-allow VAR=URL`): a spec cannot send it anywhere else.
//!
//! The same policy is checked when a job is submitted (the coordinator, or
//! `flower run`) and again by the worker before it starts any server, so a
//! spec stored earlier, or submitted elsewhere, cannot get past it.
//!
//! A spec's `command` must equal an allowed command argument for argument.
//! `flower` as the first argument is compared as written and means the
//! worker's own binary when the server starts.

use std::collections::BTreeMap;

use crate::spec::{JobSpec, McpServerSpec, SpecError};

/// The fixture server (`flower mcp-fixture`): our own, harmless, allowed
/// when no allowlist is configured.
pub const DEFAULT_MCP_ALLOW: &str = "fixture=flower mcp-fixture";

/// Prefix of the service's own variables: never handed to a tool.
pub const RESERVED_PREFIX: &str = "FLOWER_";

/// One allowed stdio server: a name (shown in messages) and its exact argv.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpAllow {
    pub name: String,
    pub command: Vec<String>,
}

impl std::str::FromStr for McpAllow {
    type Err = String;

    /// `NAME=COMMAND`, the command split on whitespace (no shell quoting).
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, command) =
            s.split_once('=').ok_or_else(|| format!("`{s}`: expected NAME=COMMAND (e.g. {DEFAULT_MCP_ALLOW})"))?;
        let name = name.trim();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(format!("`{s}`: the name is letters, digits, '-' or '_'"));
        }
        let command: Vec<String> = command.split_whitespace().map(str::to_string).collect();
        if command.is_empty() {
            return Err(format!("`{s}`: the command is empty"));
        }
        Ok(Self { name: name.to_string(), command })
    }
}

impl std::fmt::Display for McpAllow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.name, self.command.join(" "))
    }
}

/// A variable that may not be allowed, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{0}: not a variable name (letters, digits and '_')")]
    BadName(String),
    #[error("{0}: the service's own variables ({RESERVED_PREFIX}*) are never handed to a tool")]
    Reserved(String),
    #[error("{0}: this process reads its own credentials from it; it is never handed to a tool")]
    ServiceCredential(String),
    #[error("{0}: the URL a token may be sent to is an http(s) URL with a host, no user, query or fragment")]
    BadUrl(String),
}

/// Whether `url` lies beneath `prefix`: same scheme, host and port, and a
/// path that is the prefix's or continues it past a `/` (so
/// `https://api.example.com/v1` admits `/v1/x` but not `/v10` nor
/// `https://api.example.com.evil.net`). A URL with a user part is never within.
pub fn url_within(url: &str, prefix: &url::Url) -> bool {
    let Ok(u) = url::Url::parse(url) else { return false };
    if !u.username().is_empty() || u.password().is_some() {
        return false;
    }
    let (path, base) = (u.path(), prefix.path());
    u.scheme() == prefix.scheme()
        && u.host_str() == prefix.host_str()
        && u.port_or_known_default() == prefix.port_or_known_default()
        && (path == base || path.starts_with(base) && (base.ends_with('/') || path[base.len()..].starts_with('/')))
}

fn token_url(var: &str, text: &str) -> Result<url::Url, PolicyError> {
    let bad = || PolicyError::BadUrl(format!("{var}={text}"));
    let u = url::Url::parse(text.trim()).map_err(|_| bad())?;
    let plain = u.username().is_empty() && u.password().is_none() && u.query().is_none() && u.fragment().is_none();
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() || !plain {
        return Err(bad());
    }
    Ok(u)
}

/// The operator's policy over MCP servers and credentials (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolPolicy {
    mcp_allow: Vec<McpAllow>,
    /// Destinations tools may reach through the egress proxy.
    egress_allow: Vec<crate::network::EgressAllow>,
    /// Variable → the URL prefix it may be sent to as a token (`None`: to
    /// stdio servers' environments only).
    env_allow: BTreeMap<String, Option<url::Url>>,
}

impl Default for ToolPolicy {
    /// The fixture server only; no variable.
    fn default() -> Self {
        let fixture = McpAllow { name: "fixture".into(), command: vec!["flower".into(), "mcp-fixture".into()] };
        Self { mcp_allow: vec![fixture], egress_allow: Vec::new(), env_allow: BTreeMap::new() }
    }
}

impl ToolPolicy {
    /// A policy allowing these servers and variables (`VAR`, or `VAR=URL`
    /// for a variable that may also be sent as a token to URLs beneath
    /// URL). `FLOWER_*` variables and the names in `service_credentials`
    /// (those this process reads its own secrets from) are refused.
    pub fn new(
        mcp_allow: Vec<McpAllow>,
        env_allow: impl IntoIterator<Item = String>,
        service_credentials: &[String],
    ) -> Result<Self, PolicyError> {
        let mut allowed = BTreeMap::new();
        for entry in env_allow {
            let (var, url) = match entry.split_once('=') {
                Some((v, u)) => (v.trim().to_string(), Some(u.trim().to_string())),
                None => (entry.trim().to_string(), None),
            };
            if var.is_empty() || !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(PolicyError::BadName(var));
            }
            if var.to_ascii_uppercase().starts_with(RESERVED_PREFIX) {
                return Err(PolicyError::Reserved(var));
            }
            if service_credentials.iter().any(|c| c.eq_ignore_ascii_case(&var)) {
                return Err(PolicyError::ServiceCredential(var));
            }
            let url = url.map(|u| token_url(&var, &u)).transpose()?;
            allowed.insert(var, url);
        }
        Ok(Self { mcp_allow, egress_allow: Vec::new(), env_allow: allowed })
    }

    /// The same policy, allowing tools these destinations.
    pub fn with_egress(mut self, allow: Vec<crate::network::EgressAllow>) -> Self {
        self.egress_allow = allow;
        self
    }

    /// The operator's pattern allowing `d`, if any.
    pub fn egress_allowed(&self, d: &crate::network::Destination) -> Option<&crate::network::EgressAllow> {
        self.egress_allow.iter().find(|a| a.allows(d))
    }

    pub fn mcp_allowed(&self) -> &[McpAllow] {
        &self.mcp_allow
    }

    pub fn env_allowed(&self) -> impl Iterator<Item = &str> {
        self.env_allow.keys().map(String::as_str)
    }

    /// Every MCP server of `spec` against the policy; the first refusal names its field.
    pub fn check(&self, spec: &JobSpec) -> Result<(), SpecError> {
        for (name, server) in &spec.mcp_servers {
            self.check_server(name, server)?;
        }
        for (i, d) in spec.network.egress.iter().enumerate() {
            if self.egress_allowed(d).is_none() {
                let allowed = if self.egress_allow.is_empty() {
                    "none".to_string()
                } else {
                    self.egress_allow.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                };
                return Err(SpecError {
                    field: format!("network.egress[{i}]"),
                    message: format!(
                        "`{d}` is not a destination this service lets tools reach (allowed: {allowed}); the operator allows destinations with --tool-egress-allow HOST:PORT"
                    ),
                });
            }
        }
        Ok(())
    }

    /// One server (`mcp_servers.<name>`) against the policy.
    pub fn check_server(&self, name: &str, server: &McpServerSpec) -> Result<(), SpecError> {
        let at = format!("mcp_servers.{name}");
        if !server.command.is_empty() && !self.mcp_allow.iter().any(|a| a.command == server.command) {
            return Err(SpecError {
                field: format!("{at}.command"),
                message: format!(
                    "`{}` is not a server this service may start (allowed: {}); the operator allows servers with --mcp-allow NAME=COMMAND",
                    server.command.join(" "),
                    self.list_servers()
                ),
            });
        }
        for (var, from) in &server.env_from {
            self.check_var(&format!("{at}.env_from.{var}"), from)?;
        }
        if let Some(var) = &server.token_env {
            let field = format!("{at}.token_env");
            self.check_var(&field, var)?;
            let url = server.url.as_ref().map(ToString::to_string).unwrap_or_default();
            match self.env_allow.get(var.as_str()) {
                Some(Some(prefix)) if url_within(&url, prefix) => {}
                Some(Some(prefix)) => {
                    return Err(SpecError {
                        field,
                        message: format!(
                            "`{var}` may be sent only to URLs beneath {prefix}, not to `{url}` (the operator binds it with --env-allow {var}=URL)"
                        ),
                    });
                }
                _ => {
                    return Err(SpecError {
                        field,
                        message: format!(
                            "`{var}` is not bound to a URL it may be sent to: the operator allows a token with --env-allow {var}=URL"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    fn check_var(&self, field: &str, var: &str) -> Result<(), SpecError> {
        if self.env_allow.contains_key(var) && !var.to_ascii_uppercase().starts_with(RESERVED_PREFIX) {
            return Ok(());
        }
        Err(SpecError {
            field: field.to_string(),
            message: format!(
                "`{var}` is not a variable this service hands to MCP servers (allowed: {}); the operator allows variables with --env-allow VAR",
                self.list_vars()
            ),
        })
    }

    fn list_servers(&self) -> String {
        if self.mcp_allow.is_empty() {
            return "none".into();
        }
        self.mcp_allow.iter().map(|a| format!("`{}`", a.command.join(" "))).collect::<Vec<_>>().join(", ")
    }

    fn list_vars(&self) -> String {
        if self.env_allow.is_empty() {
            return "none".into();
        }
        self.env_allow
            .iter()
            .map(|(v, u)| match u {
                Some(u) => format!("{v} (token to {u})"),
                None => v.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One line for logs: what this policy allows.
    pub fn describe(&self) -> String {
        let list = |v: Vec<String>| if v.is_empty() { "none".to_string() } else { v.join(", ") };
        format!(
            "MCP servers: {}; variables: {}; egress: {}",
            list(self.mcp_allow.iter().map(ToString::to_string).collect()),
            self.list_vars(),
            list(self.egress_allow.iter().map(ToString::to_string).collect()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn spec(servers: &str) -> JobSpec {
        JobSpec::parse(&format!(
            "name: t\ngoal: g\nprovider: sim\nscenario: s.yaml\ncoordinator: {{name: lead}}\nworkers:\n  w: {{description: d, tools: [Bash]}}\nmcp_servers:\n{servers}"
        ))
        .unwrap()
    }

    fn policy(allow: &[&str], vars: &[&str]) -> ToolPolicy {
        ToolPolicy::new(
            allow.iter().map(|a| a.parse().unwrap()).collect(),
            vars.iter().map(|v| v.to_string()),
            &["AWS_SECRET_ACCESS_KEY".to_string()],
        )
        .unwrap()
    }

    #[test]
    fn a_token_goes_only_beneath_the_url_it_is_bound_to() {
        let p = policy(&[], &["GH_TOKEN=https://api.github.com/v3", "PLAIN"]);
        let server = |url: &str, var: &str| spec(&format!("  gh:\n    url: {url}\n    token_env: {var}\n"));
        assert_eq!(p.check(&server("https://api.github.com/v3", "GH_TOKEN")), Ok(()));
        assert_eq!(p.check(&server("https://API.github.com/v3/mcp?x=1", "GH_TOKEN")), Ok(()));
        for elsewhere in [
            "https://api.github.com/v30",
            "https://api.github.com.evil.net/v3",
            "http://api.github.com/v3",
            "https://api.github.com:8443/v3",
            "https://user@api.github.com/v3",
            "https://api.github.com/v3/../../x",
            "http://127.0.0.1:5432/",
        ] {
            let e = p.check(&server(elsewhere, "GH_TOKEN")).unwrap_err();
            assert_eq!(e.field, "mcp_servers.gh.token_env", "{elsewhere}");
            assert!(e.message.contains("beneath https://api.github.com/v3"), "{elsewhere}: {e}");
        }
        let e = p.check(&server("https://api.github.com/v3", "PLAIN")).unwrap_err();
        assert!(e.message.contains("not bound to a URL"), "{e}");
        let new = |v: &str| ToolPolicy::new(vec![], [v.to_string()], &[]);
        for bad in ["T=ftp://x/", "T=https://u:p@x/", "T=https://x/?q", "T=not a url"] {
            assert!(matches!(new(bad), Err(PolicyError::BadUrl(_))), "{bad}");
        }
    }

    #[test]
    fn egress_is_refused_unless_the_operator_allows_it() {
        let asks = spec(
            "  fx:\n    command: [flower, mcp-fixture]\nnetwork:\n  egress: [pypi.org:443, 'files.pythonhosted.org:443']\n",
        );
        let e = ToolPolicy::default().check(&asks).unwrap_err();
        assert_eq!(e.field, "network.egress[0]");
        assert!(e.message.contains("`pypi.org:443`") && e.message.contains("(allowed: none)"), "{e}");
        let p = ToolPolicy::default().with_egress(vec!["pypi.org:443".parse().unwrap()]);
        let e = p.check(&asks).unwrap_err();
        assert_eq!(e.field, "network.egress[1]", "{e}");
        let p = p.with_egress(vec!["pypi.org:443".parse().unwrap(), "*.pythonhosted.org:443".parse().unwrap()]);
        assert_eq!(p.check(&asks), Ok(()));
        assert!(p.describe().ends_with("egress: pypi.org:443, *.pythonhosted.org:443"), "{}", p.describe());
    }

    #[test]
    fn allow_entries_parse_and_print() {
        let a: McpAllow = "tickets=npx -y  tickets-mcp".parse().unwrap();
        assert_eq!(
            a,
            McpAllow { name: "tickets".into(), command: vec!["npx".into(), "-y".into(), "tickets-mcp".into()] }
        );
        assert_eq!(a.to_string(), "tickets=npx -y tickets-mcp");
        assert!("no-equals".parse::<McpAllow>().unwrap_err().contains("NAME=COMMAND"));
        assert!("x=".parse::<McpAllow>().unwrap_err().contains("empty"));
        assert!("a b=cmd".parse::<McpAllow>().is_err());
    }

    #[test]
    fn reserved_and_service_variables_are_refused_at_start() {
        let new = |v: &str| ToolPolicy::new(vec![], [v.to_string()], &["AWS_SECRET_ACCESS_KEY".to_string()]);
        assert_eq!(new("FLOWER_DATABASE_URL"), Err(PolicyError::Reserved("FLOWER_DATABASE_URL".into())));
        assert_eq!(new("flower_token"), Err(PolicyError::Reserved("flower_token".into())));
        assert_eq!(new("AWS_SECRET_ACCESS_KEY"), Err(PolicyError::ServiceCredential("AWS_SECRET_ACCESS_KEY".into())));
        assert_eq!(new("NOT A NAME"), Err(PolicyError::BadName("NOT A NAME".into())));
        assert!(new("GITHUB_TOKEN").is_ok());
    }

    #[test]
    fn the_default_allows_the_fixture_server_and_no_variable() {
        let p = ToolPolicy::default();
        assert!(p.check(&spec("  fx:\n    command: [flower, mcp-fixture]\n")).is_ok());
        let e = p.check(&spec("  fx:\n    command: [flower, mcp-fixture, --http, '0.0.0.0:80']\n")).unwrap_err();
        assert_eq!(e.field, "mcp_servers.fx.command", "argv must match exactly: {e}");
        let e = p.check(&spec("  fx:\n    command: [flower, mcp-fixture]\n    env_from: {T: HOME}\n")).unwrap_err();
        assert_eq!(e.field, "mcp_servers.fx.env_from.T");
        assert!(e.message.contains("(allowed: none)"), "{e}");
        assert_eq!(p.env_allowed().count(), 0);
        assert_eq!(p.mcp_allowed(), &[DEFAULT_MCP_ALLOW.parse::<McpAllow>().unwrap()]);
    }

    #[test]
    fn a_spec_is_checked_field_by_field_naming_what_is_allowed() {
        let p = policy(&["fixture=flower mcp-fixture", "tickets=/opt/tickets/serve --stdio"], &["TICKETS_TOKEN"]);
        // Any program the spec chooses: refused, naming the field and the allowed commands.
        let e = p.check(&spec("  fx:\n    command: [bash, -c, 'cat /etc/shadow']\n")).unwrap_err();
        assert_eq!(e.field, "mcp_servers.fx.command");
        assert!(
            e.message.contains("`bash -c cat /etc/shadow` is not a server")
                && e.message.contains("`flower mcp-fixture`, `/opt/tickets/serve --stdio`"),
            "{e}"
        );
        // An allowed command with an allowed variable passes.
        let ok = spec("  t:\n    command: [/opt/tickets/serve, --stdio]\n    env_from: {TOKEN: TICKETS_TOKEN}\n");
        assert_eq!(p.check(&ok), Ok(()));
        // The service's database URL through env_from: refused.
        let e = p
            .check(&spec("  fx:\n    command: [flower, mcp-fixture]\n    env_from: {TOKEN: FLOWER_DATABASE_URL}\n"))
            .unwrap_err();
        assert_eq!(e.field, "mcp_servers.fx.env_from.TOKEN");
        assert!(e.message.contains("`FLOWER_DATABASE_URL` is not a variable") && e.message.contains("TICKETS_TOKEN"));
        // ... or as a bearer token to a URL the spec chose.
        let e = p
            .check(&spec("  web:\n    url: https://evil.example/mcp\n    token_env: FLOWER_DATABASE_URL\n"))
            .unwrap_err();
        assert_eq!(e.field, "mcp_servers.web.token_env");
        // A variable allowed without a URL goes to stdio servers' environments only.
        let web = spec("  web:\n    url: https://tickets.example/mcp\n    token_env: TICKETS_TOKEN\n");
        assert_eq!(p.check(&web).unwrap_err().field, "mcp_servers.web.token_env");
        let bound = policy(&[], &["TICKETS_TOKEN=https://tickets.example/"]);
        assert_eq!(bound.check(&web), Ok(()));
        // An HTTP server without a token needs no allowlist entry.
        assert_eq!(p.check(&spec("  web:\n    url: https://docs.example/mcp\n")), Ok(()));
        assert!(p.describe().contains("tickets=/opt/tickets/serve --stdio") && p.describe().contains("TICKETS_TOKEN"));
    }

    #[test]
    fn an_empty_allowlist_refuses_every_stdio_server() {
        let p = ToolPolicy::new(vec![], Vec::<String>::new(), &[]).unwrap();
        let e = p.check(&spec("  fx:\n    command: [flower, mcp-fixture]\n")).unwrap_err();
        assert!(e.message.contains("(allowed: none)"), "{e}");
    }
}
