//! `flower mcp-serve` (docs/design.md section 16): flower as an MCP server,
//! so an agent client (Claude Code, Codex, an IDE assistant) can hand a long
//! job to flower and follow it. Over stdio or streamable HTTP (`/mcp`, with
//! a bearer token when configured); over the embedded store (jobs run in
//! this process) or a coordinator's gRPC API ([`Jobs`]).
//!
//! The whole catalog is in `tools/list`, every tool with its full schema: a
//! client that caches the list never needs a tool it did not see.
//! `search_tool_bm25` ranks that same catalog with the agent's BM25 index
//! ([`flower_agent::surface::SearchIndex`]) and loads nothing.
//!
//! Errors a caller can fix (a bad argument, a spec field, an unknown job, a
//! path out of `artifacts/`) are tool results with `isError`, naming the
//! field; an unknown tool is a JSON-RPC invalid-params error.
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod args;
pub mod backend;
mod catalog;
mod error;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use flower_agent::surface::SearchIndex;
use flower_coordinator::tools::ask::Reply;
use flower_model::JobState;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ResourceContents, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use args::{ArgError, Template, Templates};
pub use backend::{AppJobs, EventView, JobView, Jobs, SessionView, answer_request};
pub use flower_coordinator::app::AppError;

use catalog::{
    AnswerArgs, ArtifactArgs, CancelArgs, InterruptArgs, JobArgs, SearchArgs, SubmitArgs, ToolDef, TranscriptArgs,
    View, WatchArgs, catalog,
};

/// The ranking tool's name.
pub const SEARCH_TOOL: &str = "search_tool_bm25";
/// `watch_job`'s default and longest wait.
pub const WATCH_DEFAULT_SECS: u64 = 300;
pub const WATCH_MAX_SECS: u64 = 3600;
/// Transcript entries on a page, by default and at most.
pub const PAGE_DEFAULT: u64 = 50;
pub const PAGE_MAX: u64 = 200;
/// The largest artifact `get_artifact` returns (larger: `flower artifacts JOB get PATH`).
pub const MAX_ARTIFACT: usize = 16 << 20;

/// The server: a backend, the operator's templates, the catalog and its index.
#[derive(Clone)]
pub struct FlowerMcp {
    inner: Arc<Inner>,
    /// The backend as the caller of this request sees it (over HTTP, the
    /// bearer's; over stdio, the configured credential's).
    jobs: Arc<dyn Jobs>,
}

/// The backend acting for an HTTP request's caller (put in the request's
/// extensions by [`serve_http`]'s authentication).
#[derive(Clone)]
struct Acting(Arc<dyn Jobs>);

struct Inner {
    templates: Templates,
    /// Where a full spec's relative paths resolve (the server's working directory).
    base: PathBuf,
    tools: Vec<ToolDef>,
    index: SearchIndex,
}

/// A tool's failure: shown to the client as an error result.
struct Fail(String);

impl From<ArgError> for Fail {
    fn from(e: ArgError) -> Self {
        Fail(format!("invalid argument {e}"))
    }
}

impl From<AppError> for Fail {
    fn from(e: AppError) -> Self {
        Fail(error::text(&e))
    }
}

type Outcome = Result<CallToolResult, Fail>;

fn json_result(v: Value) -> Outcome {
    Ok(CallToolResult::success(vec![ContentBlock::text(serde_json::to_string_pretty(&v).unwrap_or_default())]))
}

impl FlowerMcp {
    pub fn new(jobs: Arc<dyn Jobs>, templates: Templates, base: PathBuf) -> Self {
        let tools = catalog(&templates);
        let index = SearchIndex::from_tools(
            tools
                .iter()
                .filter(|t| t.name != SEARCH_TOOL)
                .map(|t| (t.name.to_string(), t.description.clone(), t.schema.clone())),
        );
        Self { inner: Arc::new(Inner { templates, base, tools, index }), jobs }
    }

    /// The catalog as MCP tools.
    pub fn tools(&self) -> Vec<Tool> {
        self.inner
            .tools
            .iter()
            .map(|t| {
                Tool::new(t.name, t.description.clone(), Arc::new(t.schema.as_object().cloned().unwrap_or_default()))
            })
            .collect()
    }

    /// The tool names `search_tool_bm25` finds for `query`, best first, with their descriptions.
    pub fn search(&self, query: &str, limit: usize) -> Vec<(String, String, f64)> {
        self.inner
            .index
            .search(query, limit)
            .into_iter()
            .map(|(name, score)| {
                let d = self.inner.tools.iter().find(|t| t.name == name).map(|t| t.description.clone());
                (name.to_string(), d.unwrap_or_default(), score)
            })
            .collect()
    }

    pub fn jobs(&self) -> &Arc<dyn Jobs> {
        &self.jobs
    }

    /// Run one call; `None` when no tool has that name.
    async fn call(
        &self,
        name: &str,
        args: &serde_json::Map<String, Value>,
        ctx: Option<&RequestContext<RoleServer>>,
    ) -> Option<Outcome> {
        let acting = ctx
            .and_then(|c| c.extensions.get::<axum::http::request::Parts>())
            .and_then(|p| p.extensions.get::<Acting>())
            .map(|a| a.0.clone());
        match acting {
            Some(jobs) => Self { inner: self.inner.clone(), jobs }.dispatch(name, args, ctx).await,
            None => self.dispatch(name, args, ctx).await,
        }
    }

    async fn dispatch(
        &self,
        name: &str,
        args: &serde_json::Map<String, Value>,
        ctx: Option<&RequestContext<RoleServer>>,
    ) -> Option<Outcome> {
        Some(match name {
            "submit_job" => self.submit(args).await,
            "job_status" => self.status(args).await,
            "watch_job" => self.watch(args, ctx).await,
            "get_transcript" => self.transcript(args).await,
            "list_artifacts" => self.list_artifacts(args).await,
            "get_artifact" => self.get_artifact(args).await,
            "cancel_job" => self.cancel(args).await,
            "interrupt_job" => self.interrupt(args).await,
            "answer_question" => self.answer(args).await,
            SEARCH_TOOL => self.search_tool(args),
            _ => return None,
        })
    }

    async fn submit(&self, m: &serde_json::Map<String, Value>) -> Outcome {
        let a: SubmitArgs = args::parse(m)?;
        let name = a.name.as_deref();
        if let Some(n) = name
            && (n.trim().is_empty() || n.len() > 200)
        {
            return Err(ArgError::new("name", "1 to 200 characters").into());
        }
        let spec = match (a.spec.as_deref(), a.template.as_deref()) {
            (Some(_), Some(_)) => {
                return Err(ArgError::new("template", "give either spec or template, not both").into());
            }
            (None, None) => {
                return Err(ArgError::new("spec", "missing: give a full spec, or a goal with a template").into());
            }
            (Some(text), None) => {
                if a.goal.is_some() {
                    return Err(ArgError::new("goal", "only with template (a full spec carries its own goal)").into());
                }
                let mut spec = args::spec_from_text(text, &self.inner.base)
                    .map_err(|e| Fail(format!("invalid argument spec: {e}")))?;
                if let Some(n) = name {
                    spec.name = n.to_string();
                }
                spec
            }
            (None, Some(t)) => {
                let Some(template) = self.inner.templates.get(t) else {
                    let known = if self.inner.templates.is_empty() {
                        "this server has none (start it with --template NAME=PATH)".to_string()
                    } else {
                        format!("known: {}", self.inner.templates.keys().cloned().collect::<Vec<_>>().join(", "))
                    };
                    return Err(
                        ArgError::new("template", format!("no template `{}`; {known}", args::cut(t, 64))).into()
                    );
                };
                let goal = match a.goal.as_deref() {
                    Some(g) if !g.trim().is_empty() => g,
                    Some(_) => return Err(ArgError::new("goal", "must not be empty").into()),
                    None => return Err(ArgError::new("goal", "missing (required)").into()),
                };
                template.with_goal(goal, name).map_err(|e| Fail(format!("invalid argument: template {t}: {e}")))?
            }
        };
        let job = self.jobs.submit(spec).await?;
        json_result(json!({
            "job_id": job.job_id,
            "name": job.name,
            "state": job.state,
            "next": "follow it with watch_job (it returns when the job ends or asks a question); then job_status, list_artifacts, get_artifact",
        }))
    }

    /// The job as job_status shows it (with the pending question, when it waits).
    async fn status_value(&self, job: &str) -> Result<Value, Fail> {
        let j = self.jobs.job(job).await?;
        let mut v = serde_json::to_value(&j).unwrap_or_default();
        v["ended"] = json!(j.ended());
        if matches!(j.state, JobState::WaitingForUser | JobState::WaitingForBudget) {
            let events = self.all_events(&j.job_id).await?;
            if let Some(q) = backend::pending_question(&events) {
                v["question"] = q;
                v["next"] = json!("answer it with answer_question");
            }
        }
        Ok(v)
    }

    async fn all_events(&self, job: &str) -> Result<Vec<EventView>, Fail> {
        let mut out: Vec<EventView> = Vec::new();
        loop {
            let after = out.last().map_or(0, |e| e.seq);
            let page = self.jobs.events(job, after, Duration::ZERO).await?;
            if page.is_empty() || out.len() > 100_000 {
                return Ok(out);
            }
            out.extend(page);
        }
    }

    async fn status(&self, m: &serde_json::Map<String, Value>) -> Outcome {
        let a: JobArgs = args::parse(m)?;
        json_result(self.status_value(&a.job_id).await?)
    }

    async fn watch(&self, m: &serde_json::Map<String, Value>, ctx: Option<&RequestContext<RoleServer>>) -> Outcome {
        let a: WatchArgs = args::parse(m)?;
        let timeout = a.timeout_seconds.unwrap_or(WATCH_DEFAULT_SECS);
        let id = self.jobs.job(&a.job_id).await?.job_id;
        let token = ctx.and_then(|c| c.meta.get_progress_token());
        let stop = ctx.map(|c| c.ct.clone()).unwrap_or_default();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let (mut cursor, mut seen) = (0i64, 0u64);
        let why = loop {
            let j = self.jobs.job(&id).await?;
            let now = tokio::time::Instant::now();
            let end = if j.ended() {
                Some("ended")
            } else if j.state == JobState::WaitingForUser {
                Some("waiting_for_user")
            } else if j.state == JobState::WaitingForBudget {
                Some("waiting_for_budget")
            } else if now >= deadline {
                Some("timeout")
            } else {
                None
            };
            // At the end, the events written up to it are still sent (the last is the job's state).
            let wait = if end.is_some() { Duration::ZERO } else { (deadline - now).min(Duration::from_secs(1)) };
            let events = tokio::select! {
                e = self.jobs.events(&id, cursor, wait) => e?,
                _ = stop.cancelled() => break "cancelled by the client",
            };
            let drained = events.is_empty();
            for e in events {
                cursor = e.seq;
                seen += 1;
                if let (Some(token), Some(ctx)) = (&token, ctx) {
                    let p = ProgressNotificationParam::new(token.clone(), seen as f64).with_message(event_line(&e));
                    let _ = ctx.peer.notify_progress(p).await;
                }
            }
            if let Some(why) = end
                && drained
            {
                break why;
            }
        };
        let mut v = self.status_value(&id).await?;
        v["watch"] = json!({
            "returned_because": why,
            "events_seen": seen,
            "timed_out": why == "timeout",
        });
        if why == "timeout" {
            v["next"] = json!("the job goes on: call watch_job again to keep following it");
        }
        json_result(v)
    }

    async fn transcript(&self, m: &serde_json::Map<String, Value>) -> Outcome {
        let a: TranscriptArgs = args::parse(m)?;
        let view = a.view.unwrap_or_default();
        let after = a.after.unwrap_or(0);
        if i64::try_from(after).is_err() {
            return Err(ArgError::new("after", format!("{after} is out of range (0 to {})", i64::MAX)).into());
        }
        let limit = a.limit.unwrap_or(PAGE_DEFAULT);
        let want = a.session.as_deref();
        let id = self.jobs.job(&a.job_id).await?.job_id;
        let sessions = self.jobs.sessions(&id).await?;
        let session = match want {
            Some(w) => {
                backend::find_session(&sessions, w).map_err(|e| Fail(format!("invalid argument session: {e}")))?
            }
            None => backend::main_session(&sessions)
                .ok_or_else(|| Fail(format!("job {id} has no coordinator session yet (it has not started)")))?,
        }
        .clone();
        let (entries, next, more, changes) = if view == View::Raw {
            let entries = self.jobs.entries(&id, &session.session_id, after as i64, limit as u32).await?;
            let next = entries.last().map_or(after as i64, |e| e.seq);
            let more = entries.len() as u64 == limit;
            (entries, next, more, Value::Null)
        } else {
            let mut all = Vec::new();
            loop {
                let from = all.last().map_or(0, |e: &flower_model::Entry| e.seq);
                let page = self.jobs.entries(&id, &session.session_id, from, 500).await?;
                if page.is_empty() {
                    break;
                }
                all.extend(page);
            }
            let policy = self.jobs.pruning(&id).await;
            let pruned = flower_store::prune::prune(all, &policy, &flower_agent::glance::allows);
            let total = pruned.entries.len() as u64;
            let page: Vec<_> = pruned.entries.into_iter().skip(after as usize).take(limit as usize).collect();
            let next = (after + page.len() as u64) as i64;
            (page, next, (next as u64) < total, serde_json::to_value(&pruned.changes).unwrap_or_default())
        };
        let mut v = json!({
            "job_id": id,
            "session": session,
            "view": view.as_str(),
            "entries": entries,
            "next_after": next,
            "more": more,
            "sessions": sessions,
        });
        if view == View::Pruned {
            v["pruning_changes"] = changes;
        }
        json_result(v)
    }

    async fn list_artifacts(&self, m: &serde_json::Map<String, Value>) -> Outcome {
        let a: JobArgs = args::parse(m)?;
        let id = self.jobs.job(&a.job_id).await?.job_id;
        let files: Vec<Value> = self
            .jobs
            .files(&id)
            .await?
            .into_iter()
            .filter(|(p, _)| p.starts_with(args::ARTIFACTS))
            .map(|(path, size)| json!({"path": path, "size": size}))
            .collect();
        json_result(json!({"job_id": id, "artifacts": files}))
    }

    async fn get_artifact(&self, m: &serde_json::Map<String, Value>) -> Outcome {
        let a: ArtifactArgs = args::parse(m)?;
        let path = args::artifact_path(&a.path)?;
        let id = self.jobs.job(&a.job_id).await?.job_id;
        let bytes = self.jobs.file(&id, &path).await?;
        if bytes.len() > MAX_ARTIFACT {
            return Err(Fail(format!(
                "{path} holds {} bytes, more than the {} MiB this tool returns: download it with `flower artifacts {id} get {path}`",
                bytes.len(),
                MAX_ARTIFACT >> 20
            )));
        }
        let uri = format!("flower://jobs/{id}/{path}");
        Ok(CallToolResult::success(match args::as_text(&bytes) {
            Some(text) => vec![ContentBlock::text(text.to_string())],
            None => vec![ContentBlock::resource(ResourceContents::BlobResourceContents {
                uri,
                mime_type: Some(args::mime_for(&path).to_string()),
                blob: base64::engine::general_purpose::STANDARD.encode(&bytes),
                meta: None,
            })],
        }))
    }

    async fn cancel(&self, m: &serde_json::Map<String, Value>) -> Outcome {
        let a: CancelArgs = args::parse(m)?;
        // The length of a reason is the application layer's to check.
        let reason = a.reason.as_deref().filter(|r| !r.trim().is_empty()).unwrap_or("cancelled by the MCP client");
        let j = self.jobs.cancel(&a.job_id, reason).await?;
        json_result(serde_json::to_value(j).unwrap_or_default())
    }

    async fn interrupt(&self, m: &serde_json::Map<String, Value>) -> Outcome {
        let a: InterruptArgs = args::parse(m)?;
        let j = self.jobs.interrupt(&a.job_id, &a.message).await?;
        json_result(json!({"job_id": j.job_id, "state": j.state, "delivered": true}))
    }

    async fn answer(&self, m: &serde_json::Map<String, Value>) -> Outcome {
        let a: AnswerArgs = args::parse(m)?;
        // Words or an option, as the application layer takes them; it checks
        // the words and that the option is one of the question's.
        let reply = match (a.text, a.option) {
            (Some(_), Some(_)) => return Err(ArgError::new("option", "give either text or option, not both").into()),
            (None, Some(n)) => Reply::Option(n),
            (Some(t), None) if !t.trim().is_empty() => Reply::Text(t),
            _ => return Err(ArgError::new("text", "missing: give the answer in text, or an option's number").into()),
        };
        let j = self.jobs.answer(&a.job_id, a.question_id.as_deref(), reply).await?;
        json_result(json!({"job_id": j.job_id, "state": j.state, "answered": true}))
    }

    fn search_tool(&self, m: &serde_json::Map<String, Value>) -> Outcome {
        let SearchArgs { query, limit } = args::parse(m)?;
        let limit = limit.unwrap_or(5);
        let found: Vec<Value> = self
            .search(&query, limit as usize)
            .into_iter()
            .map(|(name, description, score)| {
                json!({"name": name, "description": description, "score": (score * 1000.0).round() / 1000.0})
            })
            .collect();
        let note = if found.is_empty() {
            "nothing matched: try other words (what you act on: job, transcript, artifact, question; or the action: submit, follow, cancel…)"
        } else {
            "every tool's schema is already in tools/list: call the one you need"
        };
        json_result(json!({"query": query, "tools": found, "note": note}))
    }
}

/// One line for a progress notification.
pub fn event_line(e: &EventView) -> String {
    let p = &e.payload;
    let s = |k: &str| p[k].as_str().unwrap_or_default().to_string();
    match e.kind.as_str() {
        "job_state" => {
            format!("job {}{}", s("state"), p["reason"].as_str().map(|r| format!(": {r}")).unwrap_or_default())
        }
        "task_queued" => format!("task to {}: {}", s("worker"), args::cut(&s("description"), 200)),
        "task_started" => "a task started".into(),
        "task_finished" => {
            if p["succeeded"] == true {
                "a task reported".into()
            } else {
                "a task failed".into()
            }
        }
        "turn_completed" => format!("{} turn {}", s("role"), p["turn"]),
        "tool_called" => format!("calls {}", s("tool")),
        "tool_finished" => format!("{} done", s("tool")),
        "question_asked" => format!("question for the user: {}", args::cut(&s("question"), 300)),
        "question_answered" => format!("answered: {}", args::cut(&s("answer"), 200)),
        "judge_verdict" => format!("judge: {}", s("verdict")),
        other => other.replace('_', " "),
    }
}

impl ServerHandler for FlowerMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("flower", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "flower runs long-horizon agent jobs: a coordinator agent delegates to worker agents that run real tools. Hand a long job over with submit_job, follow it with watch_job, read the result with job_status and get_artifact. Jobs live in {}.",
                self.jobs.describe()
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        match self.call(&request.name, &args, Some(&context)).await {
            Some(Ok(r)) => Ok(r.into()),
            Some(Err(Fail(message))) => Ok(CallToolResult::error(vec![ContentBlock::text(message)]).into()),
            None => Err(ErrorData::invalid_params(
                format!(
                    "unknown tool `{}`; this server's tools: {}",
                    args::cut(&request.name, 64),
                    self.inner.tools.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
                ),
                None,
            )),
        }
    }
}

/// Serve over stdin/stdout until the client goes away.
pub async fn serve_stdio(server: FlowerMcp) -> anyhow::Result<()> {
    let running = server.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

/// A running HTTP server.
pub struct HttpServer {
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl HttpServer {
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
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serve streamable HTTP at `addr` (`/mcp`). Every request's bearer
/// credential goes to the backend ([`Jobs::acting`]): a refused one (or
/// none where one is needed) gets 401; the calls of an accepted one act as
/// its caller.
pub async fn serve_http(server: FlowerMcp, addr: SocketAddr) -> std::io::Result<HttpServer> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let stop = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let mut config =
        StreamableHttpServerConfig::default().with_sse_keep_alive(None).with_cancellation_token(stop.child_token());
    if !addr.ip().is_loopback() {
        // The default admits loopback hosts only (DNS rebinding): add the address served.
        config.allowed_hosts.push(addr.ip().to_string());
        config.allowed_hosts.push(addr.to_string());
    }
    let jobs = server.jobs.clone();
    let service: StreamableHttpService<FlowerMcp, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(server.clone()), Default::default(), config);
    let router = axum::Router::new().nest_service("/mcp", service).layer(axum::middleware::from_fn(
        move |mut req: axum::extract::Request, next: axum::middleware::Next| {
            let jobs = jobs.clone();
            async move {
                use axum::response::IntoResponse;
                let peer = req.extensions().get::<axum::extract::ConnectInfo<SocketAddr>>().map(|c| c.0);
                let origin = peer.map_or_else(|| "mcp".to_string(), |p| format!("mcp {p}"));
                let header = req.headers().get("authorization").map(|v| v.to_str().unwrap_or("?").to_string());
                let bearer = match header.as_deref().map(|h| h.strip_prefix("Bearer ")) {
                    None => Ok(None),
                    Some(Some(b)) => Ok(Some(b)),
                    Some(None) => {
                        Err(AppError::unauthenticated("the authorization header must be `Bearer <credential>`"))
                    }
                };
                let acting = match bearer {
                    Ok(b) => jobs.acting(b, &origin).await,
                    Err(e) => Err(e),
                };
                match acting {
                    Ok(acting) => {
                        req.extensions_mut().insert(Acting(acting));
                        next.run(req).await
                    }
                    Err(e) => {
                        let status = match e.kind {
                            flower_model::ErrorKind::Unauthenticated => axum::http::StatusCode::UNAUTHORIZED,
                            flower_model::ErrorKind::Unavailable => axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            _ => axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        };
                        (status, [(axum::http::header::WWW_AUTHENTICATE, "Bearer")], e.message).into_response()
                    }
                }
            }
        },
    ));
    let s = stop.clone();
    let task = tokio::spawn(async move {
        let router = router.into_make_service_with_connect_info::<SocketAddr>();
        let _ = axum::serve(listener, router).with_graceful_shutdown(async move { s.cancelled_owned().await }).await;
    });
    Ok(HttpServer { addr, stop, task: Some(task) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that knows no job (the catalog and argument checks need none).
    struct NoJobs;

    #[async_trait::async_trait]
    impl Jobs for NoJobs {
        fn describe(&self) -> String {
            "nowhere".into()
        }
        async fn acting(self: Arc<Self>, _: Option<&str>, _: &str) -> Result<Arc<dyn Jobs>, AppError> {
            Ok(self)
        }
        async fn submit(&self, spec: flower_model::JobSpec) -> Result<JobView, AppError> {
            Err(AppError::new(flower_model::ErrorKind::Internal, format!("would submit {}: {}", spec.name, spec.goal)))
        }
        async fn job(&self, job: &str) -> Result<JobView, AppError> {
            Err(AppError::new(flower_model::ErrorKind::NotFound, format!("no job `{job}`")))
        }
        async fn events(&self, job: &str, _: i64, _: Duration) -> Result<Vec<EventView>, AppError> {
            self.job(job).await.map(|_| vec![])
        }
        async fn sessions(&self, job: &str) -> Result<Vec<SessionView>, AppError> {
            self.job(job).await.map(|_| vec![])
        }
        async fn entries(&self, job: &str, _: &str, _: i64, _: u32) -> Result<Vec<flower_model::Entry>, AppError> {
            self.job(job).await.map(|_| vec![])
        }
        async fn pruning(&self, _: &str) -> flower_model::spec::PruningOptions {
            Default::default()
        }
        async fn files(&self, job: &str) -> Result<Vec<(String, u64)>, AppError> {
            self.job(job).await.map(|_| vec![])
        }
        async fn file(&self, job: &str, _: &str) -> Result<Vec<u8>, AppError> {
            self.job(job).await.map(|_| vec![])
        }
        async fn cancel(&self, job: &str, _: &str) -> Result<JobView, AppError> {
            self.job(job).await
        }
        async fn interrupt(&self, job: &str, _: &str) -> Result<JobView, AppError> {
            self.job(job).await
        }
        async fn answer(&self, job: &str, _: Option<&str>, _: Reply) -> Result<JobView, AppError> {
            self.job(job).await
        }
    }

    /// One ended job whose workbench holds a text file and a binary one.
    struct OneJob;

    fn view() -> JobView {
        JobView {
            job_id: "0f0f0f0f-0000-4000-8000-000000000001".into(),
            name: "one".into(),
            state: JobState::Succeeded,
            reason: None,
            final_answer: Some("done".into()),
            usage: Value::Null,
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    #[async_trait::async_trait]
    impl Jobs for OneJob {
        fn describe(&self) -> String {
            "one job".into()
        }
        async fn acting(self: Arc<Self>, _: Option<&str>, _: &str) -> Result<Arc<dyn Jobs>, AppError> {
            Ok(self)
        }
        async fn submit(&self, _: flower_model::JobSpec) -> Result<JobView, AppError> {
            Ok(view())
        }
        async fn job(&self, _: &str) -> Result<JobView, AppError> {
            Ok(view())
        }
        async fn events(&self, _: &str, _: i64, _: Duration) -> Result<Vec<EventView>, AppError> {
            Ok(vec![])
        }
        async fn sessions(&self, _: &str) -> Result<Vec<SessionView>, AppError> {
            Ok(vec![])
        }
        async fn entries(&self, _: &str, _: &str, _: i64, _: u32) -> Result<Vec<flower_model::Entry>, AppError> {
            Ok(vec![])
        }
        async fn pruning(&self, _: &str) -> flower_model::spec::PruningOptions {
            Default::default()
        }
        async fn files(&self, _: &str) -> Result<Vec<(String, u64)>, AppError> {
            Ok(vec![("artifacts/a.md".into(), 3), ("artifacts/p.png".into(), 4), ("notes/qa-log.md".into(), 9)])
        }
        async fn file(&self, _: &str, path: &str) -> Result<Vec<u8>, AppError> {
            match path {
                "artifacts/a.md" => Ok(b"# a".to_vec()),
                "artifacts/p.png" => Ok(vec![0x89, b'P', b'N', 0]),
                _ => Err(AppError::new(flower_model::ErrorKind::NotFound, format!("no file `{path}`"))),
            }
        }
        async fn cancel(&self, _: &str, _: &str) -> Result<JobView, AppError> {
            Err(AppError::precondition("job already succeeded"))
        }
        async fn interrupt(&self, _: &str, _: &str) -> Result<JobView, AppError> {
            Err(AppError::precondition("job already succeeded"))
        }
        async fn answer(&self, _: &str, _: Option<&str>, _: Reply) -> Result<JobView, AppError> {
            Err(AppError::precondition("job already succeeded"))
        }
    }

    #[tokio::test]
    async fn artifacts_come_back_as_text_or_as_an_embedded_blob() {
        let s = FlowerMcp::new(Arc::new(OneJob), Templates::new(), std::env::temp_dir());
        let args = |v: Value| v.as_object().cloned().unwrap_or_default();
        let list = call(&s, "list_artifacts", json!({"job_id": "0f0f"})).await.unwrap().unwrap();
        assert!(list.contains("artifacts/a.md") && !list.contains("qa-log"), "{list}");
        let text = call(&s, "get_artifact", json!({"job_id": "0f0f", "path": "a.md"})).await.unwrap().unwrap();
        assert_eq!(text, "# a");
        let Some(Ok(r)) = s.call("get_artifact", &args(json!({"job_id": "0f0f", "path": "p.png"})), None).await else {
            panic!("get_artifact p.png failed")
        };
        let Some(res) = r.content[0].as_resource() else { panic!("not a resource: {:?}", r.content) };
        match &res.resource {
            ResourceContents::BlobResourceContents { uri, mime_type, blob, .. } => {
                assert_eq!(uri, "flower://jobs/0f0f0f0f-0000-4000-8000-000000000001/artifacts/p.png");
                assert_eq!(mime_type.as_deref(), Some("image/png"));
                assert_eq!(base64::engine::general_purpose::STANDARD.decode(blob).unwrap(), vec![0x89, b'P', b'N', 0]);
            }
            other => panic!("{other:?}"),
        }
        let e = call(&s, "get_artifact", json!({"job_id": "0f0f", "path": "gone.md"})).await.unwrap().unwrap_err();
        assert!(e.contains("no file `artifacts/gone.md`"), "{e}");
        let e = call(&s, "cancel_job", json!({"job_id": "0f0f"})).await.unwrap().unwrap_err();
        assert!(e.contains("already succeeded"), "{e}");
        let w = call(&s, "watch_job", json!({"job_id": "0f0f", "timeout_seconds": 5})).await.unwrap().unwrap();
        let w: Value = serde_json::from_str(&w).unwrap();
        assert_eq!(w["watch"]["returned_because"], "ended");
        assert_eq!(w["final_answer"], "done");
    }

    fn server() -> FlowerMcp {
        FlowerMcp::new(Arc::new(NoJobs), Templates::new(), std::env::temp_dir())
    }

    async fn call(s: &FlowerMcp, name: &str, args: Value) -> Option<Result<String, String>> {
        let args = args.as_object().cloned().unwrap_or_default();
        s.call(name, &args, None).await.map(|r| match r {
            Ok(r) => Ok(r.content[0].as_text().map(|t| t.text.clone()).unwrap_or_default()),
            Err(Fail(m)) => Err(m),
        })
    }

    #[test]
    fn the_catalog_is_complete_and_ranked_by_bm25() {
        let s = server();
        let names: Vec<String> = s.tools().iter().map(|t| t.name.to_string()).collect();
        for want in [
            "submit_job",
            "job_status",
            "watch_job",
            "get_transcript",
            "list_artifacts",
            "get_artifact",
            "cancel_job",
            "interrupt_job",
            "answer_question",
            SEARCH_TOOL,
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        for t in s.tools() {
            assert_eq!(t.input_schema["type"], "object", "{}", t.name);
            assert!(t.input_schema["properties"].as_object().is_some_and(|p| !p.is_empty()), "{}", t.name);
        }
        let top = |q: &str| s.search(q, 3).first().map(|(n, _, _)| n.clone()).unwrap_or_default();
        assert_eq!(top("download an artifact file"), "get_artifact");
        assert_eq!(top("answer the question the job asked"), "answer_question");
        assert_eq!(top("stop cancel a running job"), "cancel_job");
        assert_eq!(top("transcript session entries pruned"), "get_transcript");
        assert!(s.search("zzzz qqqq", 5).is_empty());
        assert!(s.search("job", 10).iter().all(|(n, _, _)| n != SEARCH_TOOL), "the ranker does not rank itself");
    }

    #[tokio::test]
    async fn bad_arguments_are_tool_errors_naming_the_field() {
        let s = server();
        assert!(call(&s, "no_such_tool", json!({})).await.is_none());
        let e = call(&s, "job_status", json!({})).await.unwrap().unwrap_err();
        assert!(e.contains("job_id") && e.contains("missing"), "{e}");
        let e = call(&s, "job_status", json!({"job_id": 12})).await.unwrap().unwrap_err();
        assert!(e.contains("job_id: expected a string"), "{e}");
        let e = call(&s, "job_status", json!({"job_id": "abc", "extra": 1})).await.unwrap().unwrap_err();
        assert!(e.contains("extra: not a parameter"), "{e}");
        let e = call(&s, "job_status", json!({"job_id": "abc"})).await.unwrap().unwrap_err();
        assert!(e.contains("no job `abc`"), "{e}");
        let e = call(&s, "watch_job", json!({"job_id": "abc", "timeout_seconds": 0})).await.unwrap().unwrap_err();
        assert!(e.contains("timeout_seconds"), "{e}");
        let e = call(&s, "get_transcript", json!({"job_id": "abc", "view": "cooked"})).await.unwrap().unwrap_err();
        assert!(e.contains("view"), "{e}");
        let e = call(&s, "get_artifact", json!({"job_id": "abc", "path": "../notes/qa-log.md"}))
            .await
            .unwrap()
            .unwrap_err();
        assert!(e.contains("path") && e.contains(".."), "{e}");
        let e = call(&s, "submit_job", json!({})).await.unwrap().unwrap_err();
        assert!(e.contains("spec: missing"), "{e}");
        let e = call(&s, "submit_job", json!({"spec": "name: x\ngoal: y\n"})).await.unwrap().unwrap_err();
        assert!(e.contains("invalid argument spec") && (e.contains("coordinator") || e.contains("workers")), "{e}");
        let e = call(&s, "submit_job", json!({"template": "demo", "goal": "x"})).await.unwrap().unwrap_err();
        assert!(e.contains("template") && e.contains("--template"), "{e}");
        let e = call(&s, "answer_question", json!({"job_id": "abc"})).await.unwrap().unwrap_err();
        assert!(e.contains("text: missing"), "{e}");
        let e =
            call(&s, "answer_question", json!({"job_id": "abc", "text": "t", "option": 1})).await.unwrap().unwrap_err();
        assert!(e.contains("not both"), "{e}");
        let e = call(&s, "interrupt_job", json!({"job_id": "abc", "message": ""})).await.unwrap().unwrap_err();
        assert!(e.contains("message: must not be empty"), "{e}");
        let ok =
            call(&s, SEARCH_TOOL, json!({"query": "follow a job until it ends", "limit": 2})).await.unwrap().unwrap();
        let v: Value = serde_json::from_str(&ok).unwrap();
        assert_eq!(v["tools"][0]["name"], "watch_job", "{v}");
        assert_eq!(v["tools"].as_array().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_template_submit_carries_the_goal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        std::fs::write(
            &path,
            "name: t\ngoal: old\ncoordinator: {name: lead}\nworkers:\n  w: {description: d, tools: [Bash]}\n",
        )
        .unwrap();
        let t = Template::parse_flag(&format!("t={}", path.display())).unwrap();
        let s = FlowerMcp::new(Arc::new(NoJobs), [("t".to_string(), t)].into(), dir.path().to_path_buf());
        let e = call(&s, "submit_job", json!({"template": "t", "goal": "the new goal"})).await.unwrap().unwrap_err();
        assert_eq!(e, "would submit t: the new goal");
        let e = call(&s, "submit_job", json!({"template": "t"})).await.unwrap().unwrap_err();
        assert!(e.contains("goal: missing"), "{e}");
        let e = call(&s, "submit_job", json!({"template": "nope", "goal": "g"})).await.unwrap().unwrap_err();
        assert!(e.contains("known: t"), "{e}");
        assert!(s.tools()[0].description.as_deref().unwrap_or_default().contains("`t`"));
    }
}
