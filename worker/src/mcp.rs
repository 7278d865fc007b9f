//! Workers as MCP clients: connect to the servers a job names (stdio or
//! streamable HTTP), list their tools, and expose each as a flower tool named
//! `mcp__<server>__<tool>` (the provider's rule `^[a-zA-Z0-9_-]{1,64}$`).
//! Credentials come from the worker's environment, named by the spec
//! (`env_from`, `token_env`), never from the spec itself; a stdio server
//! starts with a cleared environment plus those variables. Which servers
//! may start and which variables may be named is the worker's policy
//! ([`crate::isolation::ToolSetup::policy`]), checked again here before
//! anything starts; a stdio server starts through the tool launcher like `Bash`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use flower_model::policy::ToolPolicy;
use flower_model::spec::McpServerSpec;
use rmcp::model::{CallToolRequestParams, ClientConfig, ContentBlock};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};

use crate::isolation::ToolIsolation;

/// How long connecting (start, initialize, list tools) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// One MCP tool as the agent sees it.
pub struct McpTool {
    name: String,
    remote: String,
    description: String,
    schema: serde_json::Value,
    peer: Peer<RoleClient>,
    /// The index heading (the server's `_meta.category`, else the server's name).
    pub category: String,
    /// Listed under the server's `resident` tools.
    pub resident: bool,
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    fn input_schema(&self) -> serde_json::Value {
        self.schema.clone()
    }

    async fn call(&self, input: serde_json::Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args = match input {
            serde_json::Value::Object(o) => o,
            serde_json::Value::Null => Default::default(),
            _ => return Err(ToolError::RespondToModel("the input of an MCP tool must be a JSON object".into())),
        };
        let call = self.peer.call_tool(CallToolRequestParams::new(self.remote.clone()).with_arguments(args));
        let result = tokio::select! {
            r = call => r.map_err(|e| ToolError::RespondToModel(format!("MCP call failed: {e}")))?,
            _ = ctx.cancel.cancelled() => return Err(ToolError::RespondToModel("cancelled".into())),
        };
        let text: Vec<String> = result
            .content
            .iter()
            .map(|c| match c {
                ContentBlock::Text(t) => t.text.clone(),
                other => serde_json::to_string(other).unwrap_or_default(),
            })
            .collect();
        let text = text.join("\n");
        Ok(if result.is_error == Some(true) { ToolOutput::error(text) } else { ToolOutput::text(text) })
    }
}

/// The open connections of one session; closed by [`McpClients::close`] (or on drop).
#[derive(Default)]
pub struct McpClients {
    running: Vec<RunningService<RoleClient, ClientConfig>>,
    /// The stdio servers' control groups, ended after their servers.
    leaves: Vec<crate::cgroup::Leaf>,
}

impl McpClients {
    pub async fn close(self) {
        for r in self.running {
            let _ = r.cancel().await;
        }
        let leaves = self.leaves;
        let _ = tokio::task::spawn_blocking(move || leaves.into_iter().map(crate::cgroup::Leaf::close).sum::<usize>())
            .await;
    }
}

/// Connect to every server of `servers` and list their tools, in server
/// order then each server's own order (a stable tool block). Nothing starts
/// unless every server passes the worker's `policy`.
pub async fn connect(
    servers: &BTreeMap<String, McpServerSpec>,
    cwd: &Path,
    limits: &crate::tools::ToolLimits,
    policy: &ToolPolicy,
) -> Result<(Vec<McpTool>, McpClients), String> {
    for (server, spec) in servers {
        policy.check_server(server, spec).map_err(|e| format!("refused by this worker's policy: {e}"))?;
    }
    let mut clients = McpClients::default();
    let mut tools = Vec::new();
    for (server, spec) in servers {
        let leaf = match (limits.isolation.launcher(), spec.command.is_empty()) {
            (Some(_), false) => limits
                .leaf()
                .await
                .map_err(|e| format!("MCP server `{server}`: its control group: {e}"))?
                .map(|(_, leaf)| leaf),
            _ => None,
        };
        let launch = limits.launch(leaf.as_ref());
        let connected = tokio::time::timeout(
            CONNECT_TIMEOUT,
            connect_one(spec, cwd, &limits.isolation, &launch, limits.launch_env()),
        )
        .await;
        clients.leaves.extend(leaf);
        let running = match connected {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                clients.close().await;
                return Err(format!("MCP server `{server}`: {e}"));
            }
            Err(_) => {
                clients.close().await;
                return Err(format!("MCP server `{server}`: no answer within {}s", CONNECT_TIMEOUT.as_secs()));
            }
        };
        let listed = match running.list_all_tools().await {
            Ok(l) => l,
            Err(e) => {
                let _ = running.cancel().await;
                clients.close().await;
                return Err(format!("MCP server `{server}`: listing its tools: {e}"));
            }
        };
        for t in listed {
            let name = format!("mcp__{server}__{}", t.name);
            if name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
                tracing::warn!(server, tool = %t.name, "MCP tool skipped: its name does not fit the provider's rule");
                continue;
            }
            let category = t
                .meta
                .as_ref()
                .and_then(|m| m.0.get("category"))
                .and_then(|c| c.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| format!("MCP server {server}"));
            tools.push(McpTool {
                resident: spec.resident.iter().any(|r| r == t.name.as_ref()),
                name,
                remote: t.name.to_string(),
                description: t.description.as_deref().unwrap_or_default().to_string(),
                schema: serde_json::Value::Object((*t.input_schema).clone()),
                peer: running.peer().clone(),
                category,
            });
        }
        clients.running.push(running);
    }
    Ok((tools, clients))
}

async fn connect_one(
    spec: &McpServerSpec,
    cwd: &Path,
    isolation: &ToolIsolation,
    launch: &crate::isolation::Launch<'_>,
    launch_env: Vec<(String, String)>,
) -> Result<RunningService<RoleClient, ClientConfig>, String> {
    if let Some(url) = &spec.url {
        let mut config =
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url.as_str());
        if let Some(var) = &spec.token_env {
            let token =
                std::env::var(var).map_err(|_| format!("the token variable {var} is not set on this worker"))?;
            config = config.auth_header(token);
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        return ClientConfig::default().serve(transport).await.map_err(|e| e.to_string());
    }
    let Some((program, args)) = spec.command.split_first() else {
        return Err("no command".into());
    };
    // `flower` is this very binary (e.g. `flower mcp-fixture`).
    let launcher = isolation.launcher();
    let program: std::path::PathBuf = match (program.as_str(), launcher) {
        // The launcher is a `flower` too: its own executable, reached whatever
        // directories the tool user may not search.
        ("flower", Some(_)) => "/proc/self/exe".into(),
        ("flower", None) => std::env::current_exe().map_err(|e| format!("locating this binary: {e}"))?,
        _ => program.into(),
    };
    // Launched, the server gets the working directory as its home (the
    // worker's is not its user's) and a private /tmp.
    let passed: &[&str] = if launcher.is_some() { &["LANG"] } else { &["PATH", "HOME", "LANG", "TMPDIR"] };
    let mut env: Vec<(String, String)> =
        passed.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect();
    if launcher.is_some() {
        env.push(("HOME".into(), cwd.display().to_string()));
        env.push(("PATH".into(), crate::isolation::TOOL_PATH.into()));
        env.extend(launch_env);
    }
    for (var, from) in &spec.env_from {
        let value = std::env::var(from).map_err(|_| format!("{from} (for {var}) is not set on this worker"))?;
        env.push((var.clone(), value));
    }
    let command = match launcher {
        None => {
            let mut c = tokio::process::Command::new(&program);
            c.args(args).env_clear().envs(env);
            c
        }
        Some(l) => {
            l.hand_over(cwd).await.map_err(|e| format!("handing the working directory over: {e}"))?;
            let argv = std::iter::once(program.clone().into_os_string()).chain(args.iter().map(Into::into)).collect();
            l.command(cwd, argv, launch, env)
        }
    };
    let command = command.configure(|c| {
        c.current_dir(cwd).kill_on_drop(true);
    });
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", program.display()))?;
    ClientConfig::default().serve(transport).await.map_err(|e| e.to_string())
}
