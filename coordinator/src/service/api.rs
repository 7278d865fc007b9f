//! The `Flower` gRPC API. Every handler validates its request (bad fields are
//! `InvalidArgument` naming the field; unknown ids `NotFound`; oversized
//! requests `ResourceExhausted`) and reads or writes the store; job runs happen
//! in the owner, never in a handler.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flower_bus::{Heard, Notice};
use flower_model::{EventKind, Job, JobId, JobSpec, JobState, SessionId};
use flower_proto::v1 as pb;
use flower_proto::v1::flower_server::Flower;
use flower_store::workspace::Workspace;
use flower_store::{NewJob, StoreError, Workbench};
use futures::Stream;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::Backends;
use super::owner::Owner;
use super::status::{self, MAX_IDEMPOTENCY_KEY, MAX_REASON, check_path, check_text, from_store, parse_id};

const CHUNK: usize = 64 * 1024;
const MAX_PAGE: u32 = 1000;

/// Events a `Watch` reads at once; a shorter page means it has caught up.
const WATCH_PAGE: u32 = 500;

/// A watch reads at most once per this while its job writes: the events of
/// a busy job (hundreds of commits a second) come in pages, not a query per
/// commit; after a quiet spell the first notice is read at once.
const WATCH_GAP: Duration = Duration::from_millis(10);

pub struct Api {
    b: Backends,
    owner: Arc<Owner>,
    max_request_bytes: usize,
}

impl Api {
    pub fn new(b: Backends, owner: Arc<Owner>, max_request_bytes: usize) -> Self {
        Self { b, owner, max_request_bytes }
    }

    async fn job(&self, field: &str, id: &str) -> Result<Job, Status> {
        let id: JobId = parse_id(field, id)?;
        self.b.store.get_job(id).await.map_err(from_store)
    }
}

pub fn job_to_pb(j: &Job) -> pb::Job {
    pb::Job {
        id: j.id.to_string(),
        name: j.name.clone(),
        state: j.state.as_str().into(),
        reason: j.reason.clone().unwrap_or_default(),
        final_answer: j.final_answer.clone().unwrap_or_default(),
        created_at_ms: j.created_at,
        updated_at_ms: j.updated_at,
        usage: Some(pb::Usage {
            input_tokens: j.usage.input_tokens,
            output_tokens: j.usage.output_tokens,
            cache_creation_input_tokens: j.usage.cache_creation_input_tokens,
            cache_read_input_tokens: j.usage.cache_read_input_tokens,
        }),
        continues_job_id: j.continues.as_ref().map(|l| l.parent.to_string()).unwrap_or_default(),
        instruction: j.continues.as_ref().map(|l| l.instruction.clone()).unwrap_or_default(),
    }
}

fn action_error(e: crate::actions::ActionError) -> Status {
    match e {
        crate::actions::ActionError::Ended { .. } => Status::failed_precondition(e.to_string()),
        crate::actions::ActionError::Store(e) => from_store(e),
    }
}

fn event_to_pb(e: &flower_model::Event) -> pb::JobEvent {
    pb::JobEvent {
        job_id: e.job_id.to_string(),
        seq: e.seq,
        at_ms: e.at,
        kind: e.kind.name().into(),
        payload_json: serde_json::to_string(&e.kind).unwrap_or_default(),
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn stream_of<T: Send + 'static>(rx: mpsc::Receiver<Result<T, Status>>) -> BoxStream<T> {
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

#[tonic::async_trait]
impl Flower for Api {
    #[tracing::instrument(name = "submit", skip_all)]
    async fn submit(&self, req: Request<pb::SubmitRequest>) -> Result<Response<pb::SubmitResponse>, Status> {
        let r = req.into_inner();
        let size = r.spec.len() + r.workspace.iter().map(|f| f.path.len() + f.content.len()).sum::<usize>();
        if size > self.max_request_bytes {
            return Err(status::too_large(format!(
                "the request is {size} bytes, over this service's limit of {} bytes (spec and workspace together)",
                self.max_request_bytes
            )));
        }
        if r.spec.trim().is_empty() {
            return Err(status::invalid("spec", "required (the job spec, YAML or JSON)"));
        }
        check_text("idempotency_key", &r.idempotency_key, MAX_IDEMPOTENCY_KEY)?;
        check_workspace_paths(&r.workspace)?;
        let spec = JobSpec::parse(&r.spec).map_err(|e| status::bad_spec(&e))?;
        self.b.providers.check(&spec).map_err(|m| status::invalid("spec", m))?;
        // MCP servers and credential variables come from the operator's allowlist only.
        self.b.tool_policy.check(&spec).map_err(|e| status::bad_spec(&e))?;
        let mut files = Vec::with_capacity(r.workspace.len());
        for f in r.workspace {
            files.push((f.path, Bytes::from(f.content)));
        }
        let value = serde_json::to_value(&spec).map_err(|e| status::internal("the spec could not be encoded", e))?;
        let key = Some(r.idempotency_key).filter(|k| !k.is_empty());
        let (job, created) = self
            .b
            .store
            .create_job(NewJob {
                id: JobId::random(),
                name: spec.name.clone(),
                spec: value.clone(),
                idempotency_key: key,
                continues: None,
            })
            .await
            .map_err(from_store)?;
        if !created && !same_spec(&job.spec, &value) {
            return Err(Status::already_exists(format!(
                "idempotency_key `{}`: job {} was submitted with this key and another spec; a retry sends the same spec, a new job a new key",
                job.idempotency_key.as_deref().unwrap_or_default(),
                job.id
            )));
        }
        if created && !files.is_empty() {
            let ws = Workspace::new(self.b.objects.clone(), job.id);
            if let Err(e) = ws.upload_files(files, spec.runtime.workspace_limit.as_u64()).await {
                let reason = format!("workspace upload failed: {e}");
                let _ = self.b.store.set_job_state(job.id, JobState::Failed, Some(reason.clone()), None, None).await;
                return Err(from_store(e));
            }
        }
        if created {
            tracing::info!(job = %job.id, name = %job.name, "job submitted");
            self.owner.submitted(job.id);
        }
        Ok(Response::new(pb::SubmitResponse { job_id: job.id.to_string(), existing: !created }))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::Job>, Status> {
        Ok(Response::new(job_to_pb(&self.job("job_id", &req.into_inner().job_id).await?)))
    }

    async fn list(&self, req: Request<pb::ListRequest>) -> Result<Response<pb::ListResponse>, Status> {
        let r = req.into_inner();
        if !r.page_token.is_empty() {
            return Err(status::invalid("page_token", "this service lists the most recent jobs only; give a limit"));
        }
        let limit = if r.limit == 0 { 50 } else { r.limit.min(MAX_PAGE) };
        let jobs = self.b.store.list_jobs(limit).await.map_err(from_store)?;
        Ok(Response::new(pb::ListResponse {
            jobs: jobs.iter().map(job_to_pb).collect(),
            next_page_token: String::new(),
        }))
    }

    type WatchStream = BoxStream<pb::JobEvent>;

    async fn watch(&self, req: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let r = req.into_inner();
        let job = self.job("job_id", &r.job_id).await?.id;
        if r.after_seq < 0 {
            return Err(status::invalid("after_seq", "must be 0 or a sequence number already seen"));
        }
        let (tx, rx) = mpsc::channel(256);
        let store = self.b.store.clone();
        let mut notices = self.b.notifier.subscribe();
        tokio::spawn(async move {
            let mut cursor = r.after_seq;
            let mut end_checked = false;
            // When the last read found the watch caught up (pages of a
            // backlog are read back to back).
            let mut caught_up: Option<tokio::time::Instant> = None;
            loop {
                if let Some(gap) = caught_up.take().and_then(|at| WATCH_GAP.checked_sub(at.elapsed())) {
                    tokio::time::sleep(gap).await;
                }
                let read_at = tokio::time::Instant::now();
                let events = match store.events(job, cursor, WATCH_PAGE).await {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = tx.send(Err(from_store(e))).await;
                        return;
                    }
                };
                let full = events.len() == WATCH_PAGE as usize;
                let mut ended = false;
                for e in &events {
                    cursor = e.seq;
                    ended = matches!(e.kind, EventKind::JobState { state, .. } if state.is_terminal());
                    if tx.send(Ok(event_to_pb(e))).await.is_err() {
                        return; // the client went away
                    }
                }
                if ended {
                    return;
                }
                if full {
                    continue; // a page short of the limit means caught up: wait
                }
                caught_up = Some(read_at);
                // A finished job wrote its last event with its final state: a
                // cursor at or past it has nothing more to wait for. Once, at the
                // first time caught up (later, the final state comes as an event).
                if !end_checked {
                    end_checked = true;
                    match store.get_job(job).await {
                        Ok(j) if j.state.is_terminal() => match store.events(job, cursor, 1).await {
                            Ok(more) if more.is_empty() => return,
                            _ => continue,
                        },
                        Ok(_) => {}
                        Err(e) => {
                            let _ = tx.send(Err(from_store(e))).await;
                            return;
                        }
                    }
                }
                // Wait for a notice of events past the cursor (notices are
                // hints: re-read after a while anyway).
                let wait = async {
                    loop {
                        match notices.recv().await {
                            Heard::Notice(Notice::Events { job: j, seq }) if j == job && seq > cursor => return,
                            Heard::Lagged | Heard::Closed => return,
                            Heard::Notice(_) => {}
                        }
                    }
                };
                tokio::select! {
                    _ = wait => {}
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(stream_of(rx)))
    }

    async fn cancel(&self, req: Request<pb::CancelRequest>) -> Result<Response<pb::Job>, Status> {
        let r = req.into_inner();
        check_text("reason", &r.reason, MAX_REASON)?;
        let job = self.job("job_id", &r.job_id).await?;
        let ended = crate::actions::cancel(self.b.store.as_ref(), Some(self.b.notifier.as_ref()), job.id, &r.reason)
            .await
            .map_err(action_error)?;
        Ok(Response::new(job_to_pb(&ended)))
    }

    async fn interrupt(&self, req: Request<pb::InterruptRequest>) -> Result<Response<pb::Job>, Status> {
        let r = req.into_inner();
        let job = self.job("job_id", &r.job_id).await?;
        if r.message.trim().is_empty() {
            return Err(status::invalid("message", "required"));
        }
        if r.message.len() > self.max_request_bytes {
            return Err(status::too_large("message: over the request size limit"));
        }
        check_text("message", &r.message, flower_model::spec::MAX_MESSAGE_BYTES)?;
        let job = crate::actions::interrupt(self.b.store.as_ref(), Some(self.b.notifier.as_ref()), job.id, r.message)
            .await
            .map_err(action_error)?;
        Ok(Response::new(job_to_pb(&job)))
    }

    async fn answer(&self, req: Request<pb::AnswerRequest>) -> Result<Response<pb::Job>, Status> {
        use crate::tools::ask::{AnswerError, Reply};
        let r = req.into_inner();
        let job = self.job("job_id", &r.job_id).await?;
        let reply = match (r.text.trim().is_empty(), r.option) {
            (false, 0) => {
                check_text("text", &r.text, flower_model::spec::MAX_MESSAGE_BYTES)?;
                Reply::Text(r.text)
            }
            (true, 0) => return Err(status::invalid("text", "required (or `option`, from 1)")),
            (true, n) => Reply::Option(n),
            (false, _) => return Err(status::invalid("option", "give `text` or `option`, not both")),
        };
        if !r.question_id.is_empty() {
            check_text("question_id", &r.question_id, 256)?;
        }
        let question = Some(r.question_id.as_str()).filter(|q| !q.is_empty());
        let written =
            crate::tools::ask::answer(self.b.store.as_ref(), job.id, question, reply).await.map_err(|e| match e {
                AnswerError::Store(e) => from_store(e),
                AnswerError::UnknownQuestion(_) => Status::not_found(e.to_string()),
                AnswerError::NoSuchOption { .. } => status::invalid("option", &e),
                AnswerError::Empty => status::invalid("text", &e),
                AnswerError::Ambiguous { .. } => status::invalid("question_id", &e),
                AnswerError::NothingPending(_) | AnswerError::AlreadyAnswered { .. } | AnswerError::JobEnded { .. } => {
                    Status::failed_precondition(e.to_string())
                }
            })?;
        crate::actions::answered(self.b.notifier.as_ref(), job.id, &written).await;
        Ok(Response::new(job_to_pb(&self.b.store.get_job(job.id).await.map_err(from_store)?)))
    }

    async fn aside(&self, req: Request<pb::AsideRequest>) -> Result<Response<pb::AsideResponse>, Status> {
        use crate::aside::{AsideError, MAX_QUESTION_BYTES};
        let r = req.into_inner();
        let job = self.job("job_id", &r.job_id).await?;
        if r.question.trim().is_empty() {
            return Err(status::invalid("question", "required"));
        }
        check_text("question", &r.question, MAX_QUESTION_BYTES)?;
        let spec = JobSpec::from_value(job.spec.clone()).map_err(|e| status::internal("the job's stored spec", e))?;
        let provider = self
            .b
            .providers
            .check(&spec)
            .map(|_| self.b.providers.for_spec(&spec))
            .map_err(|e| Status::failed_precondition(format!("no provider for this job here: {e}")))?
            .ok_or_else(|| Status::failed_precondition("no provider for this job here"))?;
        let journal = flower_agent::Journal::new(self.b.store.clone(), self.b.notifier.clone());
        let done = crate::aside::aside(
            &journal,
            self.b.objects.clone(),
            provider,
            &self.b.windows,
            &spec,
            job.id,
            &r.question,
        )
        .await;
        match done {
            Ok(a) => Ok(Response::new(pb::AsideResponse { answer: a.answer, session_id: a.session.to_string() })),
            Err(AsideError::Store(e)) => Err(from_store(e)),
            Err(e @ (AsideError::Empty | AsideError::TooLong)) => Err(status::invalid("question", e)),
            Err(e @ AsideError::NoAnswer(_)) => Err(Status::unavailable(e.to_string())),
        }
    }

    async fn get_transcript(
        &self,
        req: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::GetTranscriptResponse>, Status> {
        let r = req.into_inner();
        let job = self.job("job_id", &r.job_id).await?;
        let store = &self.b.store;
        let sessions = store.sessions(job.id).await.map_err(from_store)?;
        let mut out = pb::GetTranscriptResponse::default();
        for s in &sessions {
            let entries = if r.session_id.is_empty() { 0 } else { 1 };
            out.sessions.push(pb::Session {
                id: s.id.to_string(),
                role: s.role.as_str().into(),
                label: s.label.clone(),
                task_id: s.task_id.map(|t| t.to_string()).unwrap_or_default(),
                entries,
            });
        }
        if r.session_id.is_empty() {
            return Ok(Response::new(out));
        }
        let session: SessionId = parse_id("session_id", &r.session_id)?;
        if !sessions.iter().any(|s| s.id == session) {
            return Err(status::not_found(format_args!("session {session} of job {}", job.id)));
        }
        if r.after_seq < 0 {
            return Err(status::invalid("after_seq", "must be 0 or more"));
        }
        let limit = if r.limit == 0 { 200 } else { r.limit.min(MAX_PAGE) };
        let entries = store.entries(session, r.after_seq, limit).await.map_err(from_store)?;
        out.next_after_seq = entries.last().map_or(r.after_seq, |e| e.seq);
        out.entries_json = entries.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect();
        Ok(Response::new(out))
    }

    async fn list_artifacts(
        &self,
        req: Request<pb::ListArtifactsRequest>,
    ) -> Result<Response<pb::ListArtifactsResponse>, Status> {
        let job = self.job("job_id", &req.into_inner().job_id).await?;
        let files = Workbench::new(self.b.objects.clone(), job.id).list().await.map_err(from_store)?;
        Ok(Response::new(pb::ListArtifactsResponse {
            artifacts: files.into_iter().map(|(path, size)| pb::Artifact { path, size }).collect(),
        }))
    }

    async fn r#continue(&self, req: Request<pb::ContinueRequest>) -> Result<Response<pb::SubmitResponse>, Status> {
        use crate::continuation::{ContinueError, MAX_INSTRUCTION_BYTES};
        let r = req.into_inner();
        if r.instruction.trim().is_empty() {
            return Err(status::invalid("instruction", "required (what to do now)"));
        }
        check_text("instruction", &r.instruction, MAX_INSTRUCTION_BYTES)?;
        check_text("idempotency_key", &r.idempotency_key, MAX_IDEMPOTENCY_KEY)?;
        let parent = self.job("job_id", &r.job_id).await?;
        let key = Some(r.idempotency_key).filter(|k| !k.is_empty());
        let (job, created) =
            crate::continuation::create(self.b.store.as_ref(), self.b.objects.clone(), parent.id, &r.instruction, key)
                .await
                .map_err(|e| match e {
                    ContinueError::NotFinished { .. } => Status::failed_precondition(e.to_string()),
                    ContinueError::Empty | ContinueError::TooLong => status::invalid("instruction", &e),
                    ContinueError::Spec(_) => status::invalid("instruction", &e),
                    ContinueError::Store(e) => from_store(e),
                })?;
        if created {
            tracing::info!(job = %job.id, parent = %parent.id, "job continued");
            self.owner.submitted(job.id);
        }
        Ok(Response::new(pb::SubmitResponse { job_id: job.id.to_string(), existing: !created }))
    }

    async fn get_workflow(
        &self,
        req: Request<pb::GetWorkflowRequest>,
    ) -> Result<Response<pb::GetWorkflowResponse>, Status> {
        let job = self.job("job_id", &req.into_inner().job_id).await?;
        let record = crate::record::workflow(self.b.store.as_ref(), job.id).await.map_err(from_store)?;
        let record_json = serde_json::to_string(&record)
            .map_err(|e| status::internal("the workflow record could not be encoded", e))?;
        Ok(Response::new(pb::GetWorkflowResponse { record_json }))
    }

    async fn get_context(
        &self,
        req: Request<pb::GetContextRequest>,
    ) -> Result<Response<pb::GetContextResponse>, Status> {
        let job = self.job("job_id", &req.into_inner().job_id).await?;
        let report = crate::context::report(self.b.store.as_ref(), job.id).await.map_err(from_store)?;
        let report_json = serde_json::to_string(&report)
            .map_err(|e| status::internal("the context report could not be encoded", e))?;
        Ok(Response::new(pb::GetContextResponse { report_json }))
    }

    type GetArtifactStream = BoxStream<pb::ArtifactChunk>;

    async fn get_artifact(
        &self,
        req: Request<pb::GetArtifactRequest>,
    ) -> Result<Response<Self::GetArtifactStream>, Status> {
        let r = req.into_inner();
        let job = self.job("job_id", &r.job_id).await?;
        let path = r.path.trim_start_matches(".flower/");
        check_path("path", path)?;
        let bytes = Workbench::new(self.b.objects.clone(), job.id).get(path).await.map_err(|e| match e {
            StoreError::NotFound(_) => status::not_found(format_args!("{path} in the workbench of job {}", job.id)),
            other => from_store(other),
        })?;
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            for chunk in bytes.chunks(CHUNK) {
                if tx.send(Ok(pb::ArtifactChunk { data: chunk.to_vec() })).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(stream_of(rx)))
    }
}

/// Every workspace path is a short relative path, and no two collide: the
/// same path twice, or a path beneath another one (`zz` and `zz/b`: `zz`
/// cannot be both a file and a directory).
fn check_workspace_paths(files: &[pb::WorkspaceFile]) -> Result<(), Status> {
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        check_path(&format!("workspace[{i}].path"), &f.path)?;
        if let Some(j) = seen.insert(f.path.as_str(), i) {
            return Err(status::invalid(
                &format!("workspace[{i}].path"),
                format_args!("`{}` is also workspace[{j}]", f.path),
            ));
        }
    }
    for (i, f) in files.iter().enumerate() {
        let mut parent = f.path.as_str();
        while let Some((dir, _)) = parent.rsplit_once('/') {
            if let Some(j) = seen.get(dir) {
                return Err(status::invalid(
                    &format!("workspace[{i}].path"),
                    format_args!("`{}` is beneath `{dir}`, which workspace[{j}] makes a file", f.path),
                ));
            }
            parent = dir;
        }
    }
    Ok(())
}

/// Whether a stored spec and a submitted one are the same job spec (both
/// read back through [`JobSpec`], so a store's own rendering of the JSON —
/// key order, number forms — does not count as a difference).
fn same_spec(stored: &serde_json::Value, submitted: &serde_json::Value) -> bool {
    let normal = |v: &serde_json::Value| {
        serde_json::from_value::<JobSpec>(v.clone()).ok().and_then(|s| serde_json::to_value(s).ok())
    };
    match (normal(stored), normal(submitted)) {
        (Some(a), Some(b)) => a == b,
        _ => stored == submitted,
    }
}
