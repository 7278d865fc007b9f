//! The `Flower` gRPC API: an adapter over the application layer
//! ([`crate::app`]). A handler translates its request into an [`App`] call
//! and renders the result; the checks, limits and errors are the app's, their
//! codes [`super::status`]'s. Job runs happen in the owner, never in a handler.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flower_bus::{Heard, Notice, Notifier};
use flower_model::{EventKind, Job, JobId, JobSpec};
use flower_proto::v1 as pb;
use flower_proto::v1::flower_server::Flower;
use flower_store::Store;
use futures::Stream;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::owner::Owner;
use super::status::from_store;
use crate::app::audit::Verb;
use crate::app::{self, AnswerRequest, App, AppError, Runs, SubmitRequest};

const CHUNK: usize = 64 * 1024;

/// Events a `Watch` reads at once; a shorter page means it has caught up.
const WATCH_PAGE: u32 = 500;

/// A watch reads at most once per this while its job writes: the events of
/// a busy job (hundreds of commits a second) come in pages, not a query per
/// commit; after a quiet spell the first notice is read at once.
const WATCH_GAP: Duration = Duration::from_millis(10);

/// How jobs run behind a service: its owner takes new ones; the bus tells
/// watchers and runs.
pub struct ServiceRuns {
    pub owner: Arc<Owner>,
    pub notifier: Arc<dyn Notifier>,
    pub providers: Arc<flower_agent::provider::ConfiguredProviders>,
}

#[async_trait::async_trait]
impl Runs for ServiceRuns {
    fn admit(&self, spec: &JobSpec) -> app::Result<()> {
        self.providers.check(spec).map_err(|m| AppError::invalid("spec", m))
    }

    fn submitted(&self, job: JobId) {
        self.owner.submitted(job);
    }

    fn notifier(&self, _job: JobId) -> Option<Arc<dyn Notifier>> {
        Some(self.notifier.clone())
    }
}

pub struct Api {
    app: App,
    notifier: Arc<dyn Notifier>,
}

impl Api {
    pub fn new(app: App, notifier: Arc<dyn Notifier>) -> Self {
        Self { app, notifier }
    }

    async fn read<T>(&self, req: &Request<T>) -> Result<App, Status> {
        reader(&self.app, req).await
    }

    async fn change<T>(&self, req: &Request<T>, verb: Verb, target: &str) -> Result<App, Status> {
        changer(&self.app, req, verb, target).await
    }
}

/// The application acting for the request's caller (a read).
pub(super) async fn reader<T>(app: &App, req: &Request<T>) -> Result<App, Status> {
    Ok(app.authenticate(bearer(req.metadata())?, &origin(req)).await?)
}

/// The application acting for the request's caller (a change to
/// `target`): a refused credential is recorded in the audit log.
pub(super) async fn changer<T>(app: &App, req: &Request<T>, verb: Verb, target: &str) -> Result<App, Status> {
    let origin = origin(req);
    let entered = match bearer(req.metadata()) {
        Ok(b) => app.authenticate(b, &origin).await,
        Err(s) => Err(AppError::unauthenticated(s.message())),
    };
    match entered {
        Ok(app) => Ok(app),
        Err(e) => {
            app.record_refused(&origin, verb, target, &e).await;
            Err(e.into())
        }
    }
}

/// The bearer credential of a request: `None` when it shows none; a
/// malformed `authorization` header is refused.
pub fn bearer(metadata: &tonic::metadata::MetadataMap) -> Result<Option<&str>, Status> {
    let Some(value) = metadata.get("authorization") else { return Ok(None) };
    let value = value.to_str().map_err(|_| Status::unauthenticated("the authorization header is not text"))?;
    match value.strip_prefix("Bearer ") {
        Some(b) => Ok(Some(b)),
        None => Err(Status::unauthenticated("the authorization header must be `Bearer <credential>`")),
    }
}

/// Where a request comes from, for the audit log.
pub fn origin<T>(req: &Request<T>) -> String {
    match req.remote_addr() {
        Some(a) => format!("grpc {a}"),
        None => "grpc".into(),
    }
}

pub fn job_to_pb(j: &Job) -> pb::Job {
    j.into()
}

fn event_to_pb(e: &flower_model::Event) -> pb::JobEvent {
    e.into()
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn stream_of<T: Send + 'static>(rx: mpsc::Receiver<Result<T, Status>>) -> BoxStream<T> {
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

#[tonic::async_trait]
impl Flower for Api {
    #[tracing::instrument(name = "submit", skip_all)]
    async fn submit(&self, req: Request<pb::SubmitRequest>) -> Result<Response<pb::SubmitResponse>, Status> {
        let app = self.change(&req, Verb::Submit, "").await?;
        let r = req.into_inner();
        let workspace = r.workspace.into_iter().map(|f| (f.path, Bytes::from(f.content))).collect();
        let submit = SubmitRequest {
            spec: r.spec,
            workspace,
            idempotency_key: r.idempotency_key,
            namespace: r.namespace,
            priority: r.priority,
        };
        let done = app.submit(submit).await?;
        Ok(Response::new(pb::SubmitResponse { job_id: done.job.id.to_string(), existing: !done.created }))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::Job>, Status> {
        let app = self.read(&req).await?;
        Ok(Response::new(job_to_pb(&app.job("job_id", &req.into_inner().job_id).await?)))
    }

    async fn list(&self, req: Request<pb::ListRequest>) -> Result<Response<pb::ListResponse>, Status> {
        let app = self.read(&req).await?;
        let r = req.into_inner();
        if !r.page_token.is_empty() {
            return Err(
                AppError::invalid("page_token", "this service lists the most recent jobs only; give a limit").into()
            );
        }
        let jobs = app.list_in(&r.namespace, r.limit).await?;
        Ok(Response::new(pb::ListResponse {
            jobs: jobs.iter().map(job_to_pb).collect(),
            next_page_token: String::new(),
        }))
    }

    type WatchStream = BoxStream<pb::JobEvent>;

    async fn watch(&self, req: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let app = self.read(&req).await?;
        let r = req.into_inner();
        let job = app.job("job_id", &r.job_id).await?.id;
        if r.after_seq < 0 {
            return Err(AppError::invalid("after_seq", "must be 0 or a sequence number already seen").into());
        }
        let (tx, rx) = mpsc::channel(256);
        let watch = Watch { store: self.app.store().clone(), job, cursor: r.after_seq, tx };
        tokio::spawn(watch.run(self.notifier.subscribe()));
        Ok(Response::new(stream_of(rx)))
    }

    async fn cancel(&self, req: Request<pb::CancelRequest>) -> Result<Response<pb::Job>, Status> {
        let app = self.change(&req, Verb::Cancel, &req.get_ref().job_id).await?;
        let r = req.into_inner();
        Ok(Response::new(job_to_pb(&app.cancel(&r.job_id, &r.reason).await?)))
    }

    async fn interrupt(&self, req: Request<pb::InterruptRequest>) -> Result<Response<pb::Job>, Status> {
        let app = self.change(&req, Verb::Interrupt, &req.get_ref().job_id).await?;
        let r = req.into_inner();
        Ok(Response::new(job_to_pb(&app.interrupt(&r.job_id, &r.message).await?)))
    }

    async fn answer(&self, req: Request<pb::AnswerRequest>) -> Result<Response<pb::Job>, Status> {
        let app = self.change(&req, Verb::Answer, &req.get_ref().job_id).await?;
        let r = req.into_inner();
        let answer = AnswerRequest { question_id: r.question_id, text: r.text, option: r.option };
        Ok(Response::new(job_to_pb(&app.answer(&r.job_id, answer).await?)))
    }

    async fn aside(&self, req: Request<pb::AsideRequest>) -> Result<Response<pb::AsideResponse>, Status> {
        let app = self.change(&req, Verb::Aside, &req.get_ref().job_id).await?;
        let r = req.into_inner();
        let a = app.aside(&r.job_id, &r.question).await?;
        Ok(Response::new(pb::AsideResponse { answer: a.answer, session_id: a.session.to_string() }))
    }

    async fn get_transcript(
        &self,
        req: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::GetTranscriptResponse>, Status> {
        let app = self.read(&req).await?;
        let r = req.into_inner();
        let job = app.job("job_id", &r.job_id).await?;
        let sessions = app.sessions(job.id).await?;
        let mut out = pb::GetTranscriptResponse::default();
        for s in &sessions {
            let entries = if r.session_id.is_empty() { 0 } else { 1 };
            out.sessions.push(pb::Session {
                id: s.id.to_string(),
                role: s.role.as_str().into(),
                label: s.label.clone(),
                task_id: s.task_id.map(|t| t.to_string()).unwrap_or_default(),
                entries,
                session_role: pb::Role::from(s.role).into(),
            });
        }
        if r.session_id.is_empty() {
            return Ok(Response::new(out));
        }
        let entries = app.entries(job.id, &r.session_id, r.after_seq, r.limit).await?;
        out.next_after_seq = entries.last().map_or(r.after_seq, |e| e.seq);
        out.entries_json = entries.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect();
        Ok(Response::new(out))
    }

    async fn list_artifacts(
        &self,
        req: Request<pb::ListArtifactsRequest>,
    ) -> Result<Response<pb::ListArtifactsResponse>, Status> {
        let app = self.read(&req).await?;
        let job = app.job("job_id", &req.into_inner().job_id).await?;
        let files = app.artifacts(job.id).await?;
        Ok(Response::new(pb::ListArtifactsResponse {
            artifacts: files.into_iter().map(|(path, size)| pb::Artifact { path, size }).collect(),
        }))
    }

    async fn r#continue(&self, req: Request<pb::ContinueRequest>) -> Result<Response<pb::SubmitResponse>, Status> {
        let app = self.change(&req, Verb::Continue, &req.get_ref().job_id).await?;
        let r = req.into_inner();
        let done = app.continue_job(&r.job_id, &r.instruction, r.idempotency_key).await?;
        Ok(Response::new(pb::SubmitResponse { job_id: done.job.id.to_string(), existing: !done.created }))
    }

    async fn get_workflow(
        &self,
        req: Request<pb::GetWorkflowRequest>,
    ) -> Result<Response<pb::GetWorkflowResponse>, Status> {
        let app = self.read(&req).await?;
        let job = app.job("job_id", &req.into_inner().job_id).await?;
        let record = app.workflow(job.id).await?;
        let record_json = serde_json::to_string(&record)
            .map_err(|e| AppError::internal("the workflow record could not be encoded", e))?;
        Ok(Response::new(pb::GetWorkflowResponse { record_json }))
    }

    async fn get_context(
        &self,
        req: Request<pb::GetContextRequest>,
    ) -> Result<Response<pb::GetContextResponse>, Status> {
        let app = self.read(&req).await?;
        let job = app.job("job_id", &req.into_inner().job_id).await?;
        let report = app.context(job.id).await?;
        let report_json = serde_json::to_string(&report)
            .map_err(|e| AppError::internal("the context report could not be encoded", e))?;
        Ok(Response::new(pb::GetContextResponse { report_json }))
    }

    type GetArtifactStream = BoxStream<pb::ArtifactChunk>;

    async fn get_artifact(
        &self,
        req: Request<pb::GetArtifactRequest>,
    ) -> Result<Response<Self::GetArtifactStream>, Status> {
        let app = self.read(&req).await?;
        let r = req.into_inner();
        let job = app.job("job_id", &r.job_id).await?;
        let bytes = app.artifact(job.id, &r.path).await?;
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

/// One `Watch` call: the job's events from `cursor` on, sent as they are
/// stored, until the job's final state or the client goes away.
struct Watch {
    store: Arc<dyn Store>,
    job: JobId,
    cursor: i64,
    tx: mpsc::Sender<Result<pb::JobEvent, Status>>,
}

/// What one read of a watch found.
enum Read {
    /// More may be stored already (a full page): read again at once.
    More,
    /// Caught up: wait for news.
    CaughtUp,
    /// The job's last event was sent, or the client went away.
    Done,
}

impl Watch {
    async fn run(mut self, mut notices: flower_bus::NoticeStream) {
        let mut end_checked = false;
        // When the last read found the watch caught up (pages of a
        // backlog are read back to back).
        let mut caught_up: Option<tokio::time::Instant> = None;
        loop {
            if let Some(gap) = caught_up.take().and_then(|at| WATCH_GAP.checked_sub(at.elapsed())) {
                tokio::time::sleep(gap).await;
            }
            let read_at = tokio::time::Instant::now();
            match self.read_page().await {
                Read::More => continue,
                Read::Done => return,
                Read::CaughtUp => caught_up = Some(read_at),
            }
            // A finished job wrote its last event with its final state: a
            // cursor at or past it has nothing more to wait for. Once, at the
            // first time caught up (later, the final state comes as an event).
            if !end_checked {
                end_checked = true;
                match self.ended().await {
                    Some(true) => return,
                    Some(false) => {}
                    None => continue,
                }
            }
            // Wait for a notice of events past the cursor (notices are
            // hints: re-read after a while anyway).
            let (job, cursor) = (self.job, self.cursor);
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
                _ = self.tx.closed() => return,
            }
        }
    }

    /// Send the next page of events.
    async fn read_page(&mut self) -> Read {
        let events = match self.store.events(self.job, self.cursor, WATCH_PAGE).await {
            Ok(e) => e,
            Err(e) => {
                let _ = self.tx.send(Err(from_store(e))).await;
                return Read::Done;
            }
        };
        let full = events.len() == WATCH_PAGE as usize;
        for e in &events {
            self.cursor = e.seq;
            if self.tx.send(Ok(event_to_pb(e))).await.is_err() {
                return Read::Done; // the client went away
            }
        }
        // The page ends on the job's final state: nothing follows it.
        let ended =
            events.last().is_some_and(|e| matches!(e.kind, EventKind::JobState { state, .. } if state.is_terminal()));
        match (ended, full) {
            (true, _) => Read::Done,
            (false, true) => Read::More,
            (false, false) => Read::CaughtUp,
        }
    }

    /// `Some(true)` when the job ended and nothing is stored past the
    /// cursor; `None` when events arrived meanwhile (read them first).
    async fn ended(&self) -> Option<bool> {
        match self.store.get_job(self.job).await {
            Ok(j) if j.state.is_terminal() => match self.store.events(self.job, self.cursor, 1).await {
                Ok(more) if more.is_empty() => Some(true),
                _ => None,
            },
            Ok(_) => Some(false),
            Err(e) => {
                let _ = self.tx.send(Err(from_store(e))).await;
                Some(true)
            }
        }
    }
}
