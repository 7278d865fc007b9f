//! A fixture MCP server with a large, realistic tool catalog: ≥ 126 tools in
//! 12 categories (tickets, memory, calendar, code review, CI, docs, CRM,
//! email, metrics, feature flags, deployments, storage), each with a
//! description of a few sentences and a schema of several parameters. The
//! catalog is `fixtures/mcp-catalog.json` (written by
//! `fixtures/gen_mcp_catalog.py`), embedded in the binary.
//!
//! Served over stdio (`flower mcp-fixture`) or streamable HTTP
//! (`flower mcp-fixture --http 127.0.0.1:PORT`, endpoint `/mcp`). A token can
//! be required: `--token-env VAR` makes the HTTP server refuse requests whose
//! `Authorization: Bearer …` is not `$VAR`, and the stdio server refuse to
//! start when `$VAR` is unset — which is how tests check that credentials
//! reach MCP servers from the worker's environment.
//!
//! Behaviour: `memory_store`/`memory_recall` and `ticket_create`/`ticket_get`
//! keep state for the server's life; every other tool validates its required
//! arguments and answers with a deterministic JSON acknowledgement naming the
//! tool and echoing the arguments.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult, MetaObject,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{Value, json};

/// One tool of the catalog, as the generator wrote it.
#[derive(Clone, Debug, Deserialize)]
pub struct FixtureTool {
    pub name: String,
    pub category: String,
    pub description: String,
    #[serde(rename = "inputSchema")]
    pub input_schema: Value,
}

const CATALOG: &str = include_str!("../fixtures/mcp-catalog.json");

/// The whole catalog, in the generator's order.
pub fn catalog() -> &'static [FixtureTool] {
    static TOOLS: OnceLock<Vec<FixtureTool>> = OnceLock::new();
    TOOLS.get_or_init(|| serde_json::from_str(CATALOG).unwrap_or_default())
}

/// The server: state for the few stateful tools.
#[derive(Clone, Default)]
pub struct FixtureServer {
    memory: Arc<Mutex<BTreeMap<String, Value>>>,
    tickets: Arc<Mutex<Vec<Value>>>,
}

fn mcp_tool(t: &FixtureTool) -> Tool {
    let schema = t.input_schema.as_object().cloned().unwrap_or_default();
    let mut tool = Tool::new(t.name.clone(), t.description.clone(), Arc::new(schema));
    let mut meta = serde_json::Map::new();
    meta.insert("category".into(), Value::String(t.category.clone()));
    tool.meta = Some(MetaObject(meta));
    tool
}

impl FixtureServer {
    /// Answer one call (the protocol-independent part).
    pub fn answer(&self, name: &str, args: &serde_json::Map<String, Value>) -> Result<Value, String> {
        let Some(tool) = catalog().iter().find(|t| t.name == name) else {
            return Err(format!("unknown tool `{name}`"));
        };
        for required in tool.input_schema["required"].as_array().into_iter().flatten() {
            if let Some(field) = required.as_str()
                && !args.contains_key(field)
            {
                return Err(format!("missing required argument `{field}`"));
            }
        }
        Ok(match name {
            "memory_store" => {
                let key = args.get("key").and_then(Value::as_str).unwrap_or_default().to_string();
                let value = args.get("value").cloned().unwrap_or(Value::Null);
                self.memory.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), value);
                json!({"stored": key})
            }
            "memory_recall" => {
                let key = args.get("key").and_then(Value::as_str).unwrap_or_default();
                match self.memory.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
                    Some(v) => json!({"key": key, "value": v}),
                    None => json!({"key": key, "found": false}),
                }
            }
            "ticket_create" => {
                let mut tickets = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
                let id = format!("TCK-{}", tickets.len() + 1);
                let mut ticket = Value::Object(args.clone());
                ticket["id"] = Value::String(id.clone());
                ticket["status"] = Value::String("open".into());
                tickets.push(ticket);
                json!({"id": id, "status": "open"})
            }
            "ticket_get" => {
                let id = args.get("id").and_then(Value::as_str).unwrap_or_default();
                let tickets = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
                match tickets.iter().find(|t| t["id"] == id) {
                    Some(t) => t.clone(),
                    None => return Err(format!("no ticket `{id}`")),
                }
            }
            _ => json!({"tool": name, "ok": true, "arguments": args}),
        })
    }
}

impl ServerHandler for FixtureServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions("flower's fixture MCP server: a large catalog of enterprise tools for tests.")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(catalog().iter().map(mcp_tool).collect()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        Ok(match self.answer(&request.name, &args) {
            Ok(v) => CallToolResult::success(vec![ContentBlock::text(v.to_string())]),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e)]),
        }
        .into())
    }
}

/// Serve over stdin/stdout until the client goes away.
pub async fn serve_stdio(token_env: Option<&str>) -> anyhow::Result<()> {
    if let Some(var) = token_env
        && std::env::var(var).map(|v| v.is_empty()).unwrap_or(true)
    {
        anyhow::bail!("the token variable {var} is not set: refusing to serve");
    }
    let running = FixtureServer::default().serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

/// A running HTTP fixture server.
pub struct HttpFixture {
    pub addr: SocketAddr,
    stop: tokio_util::sync::CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl HttpFixture {
    /// The MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    /// Wait until the server stops (it does not by itself).
    pub async fn wait(mut self) {
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serve streamable HTTP at `addr` (`/mcp`); with `token`, requests must carry it as a bearer token.
pub async fn serve_http(addr: SocketAddr, token: Option<String>) -> std::io::Result<HttpFixture> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let server = FixtureServer::default();
    let service: StreamableHttpService<FixtureServer, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(server.clone()),
        Default::default(),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None).with_cancellation_token(stop.child_token()),
    );
    let expected = token.map(|t| format!("Bearer {t}"));
    let router = axum::Router::new().nest_service("/mcp", service).layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let expected = expected.clone();
            async move {
                use axum::response::IntoResponse;
                if let Some(expected) = expected {
                    let given = req.headers().get("authorization").and_then(|v| v.to_str().ok());
                    if given != Some(expected.as_str()) {
                        return (axum::http::StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response();
                    }
                }
                next.run(req).await
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let s = stop.clone();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).with_graceful_shutdown(async move { s.cancelled_owned().await }).await;
    });
    Ok(HttpFixture { addr, stop, task: Some(task) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_catalog_is_large_and_well_formed() {
        let tools = catalog();
        assert!(tools.len() >= 120, "{} tools", tools.len());
        let names: BTreeSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names.len(), tools.len(), "names are unique");
        let categories: BTreeSet<&str> = tools.iter().map(|t| t.category.as_str()).collect();
        assert!(categories.len() >= 10, "{categories:?}");
        for t in tools {
            // `mcp__<server>__<tool>` must stay within the provider's 64 characters.
            assert!(t.name.len() <= 48 && t.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "{}", t.name);
            assert!(t.description.split(". ").count() >= 2, "{}: a few sentences", t.name);
            let props = t.input_schema["properties"].as_object().map(|p| p.len()).unwrap_or(0);
            assert!((3..=7).contains(&props), "{}: {props} parameters", t.name);
        }
    }

    #[test]
    fn stateful_tools_keep_state_and_required_arguments_are_checked() {
        let s = FixtureServer::default();
        let args = |v: Value| v.as_object().cloned().unwrap_or_default();
        s.answer("memory_store", &args(json!({"key": "k", "value": "v", "tags": []}))).unwrap();
        assert_eq!(s.answer("memory_recall", &args(json!({"key": "k"}))).unwrap()["value"], "v");
        let t = s.answer("ticket_create", &args(json!({"title": "broken build"}))).unwrap();
        assert_eq!(s.answer("ticket_get", &args(json!({"id": t["id"]}))).unwrap()["title"], "broken build");
        assert!(s.answer("ticket_get", &args(json!({}))).unwrap_err().contains("missing required argument `id`"));
        assert!(s.answer("no_such_tool", &args(json!({}))).unwrap_err().contains("unknown tool"));
    }
}
