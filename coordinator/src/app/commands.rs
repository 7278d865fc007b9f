//! The calls that change a job: submit, continue, cancel, send a message,
//! answer a question, ask aside.

use bytes::Bytes;
use flower_model::{ErrorKind, Job, JobId, JobSpec, JobState};
use flower_store::NewJob;
use flower_store::workspace::Workspace;

use super::access::Caller;
use super::audit::Verb;
use super::input::{self, MAX_IDEMPOTENCY_KEY, MAX_QUESTION_ID, MAX_REASON};
use super::{App, AppError, Result};
use crate::tools::ask::Reply;

/// A job to submit.
#[derive(Clone, Debug, Default)]
pub struct SubmitRequest {
    /// The job spec, YAML or JSON.
    pub spec: String,
    /// Files of the job's workspace (relative path, content).
    pub workspace: Vec<(String, Bytes)>,
    /// A retry with the same key and spec returns the first job.
    pub idempotency_key: String,
    /// The namespace to submit in; empty: the caller's.
    pub namespace: String,
    /// 1–5, over the spec's; 0: the spec's.
    pub priority: u32,
}

/// What a submit or a continue made.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub job: Job,
    /// False when the idempotency key named a job submitted before.
    pub created: bool,
}

/// An answer to a job's question.
#[derive(Clone, Debug, Default)]
pub struct AnswerRequest {
    /// The question answered; empty when only one waits.
    pub question_id: String,
    /// Words, or empty when `option` is given.
    pub text: String,
    /// An option of the question, from 1; 0 when `text` is given.
    pub option: u32,
}

impl App {
    /// Submit a job: the request's size, the spec, the key and the
    /// workspace paths checked; the spec admitted by the tool policy and by
    /// the deployment ([`super::Runs::admit`]); the job stored, its workspace
    /// uploaded, and its run started.
    pub async fn submit(&self, r: SubmitRequest) -> Result<Submitted> {
        let size = r.spec.len() + r.workspace.iter().map(|(p, c)| p.len() + c.len()).sum::<usize>();
        if size > self.max_request_bytes {
            return Err(AppError::too_large(format!(
                "the request is {size} bytes, over this service's limit of {} bytes (spec and workspace together)",
                self.max_request_bytes
            )));
        }
        if r.spec.trim().is_empty() {
            return Err(AppError::invalid("spec", "required (the job spec, YAML or JSON)"));
        }
        input::check_text("idempotency_key", &r.idempotency_key, MAX_IDEMPOTENCY_KEY)?;
        input::check_workspace_paths(r.workspace.iter().map(|(p, _)| p.as_str()))?;
        let mut spec = JobSpec::parse(&r.spec).map_err(|e| AppError::bad_spec(&e))?;
        match r.priority {
            0 => {}
            p @ 1..=5 => spec.priority = Some(p as u8),
            p => return Err(AppError::invalid("priority", format!("{p}: 1 (most urgent) to 5, or 0 for the spec's"))),
        }
        self.submit_in(&r.namespace, spec, r.workspace, r.idempotency_key).await
    }

    /// Submit a spec already read (a template filled in by a front-end):
    /// the same checks as [`App::submit`] from the policy on.
    pub async fn submit_spec(
        &self,
        spec: JobSpec,
        workspace: Vec<(String, Bytes)>,
        idempotency_key: String,
    ) -> Result<Submitted> {
        self.submit_in("", spec, workspace, idempotency_key).await
    }

    /// Submit in `namespace` (empty: the caller's): the caller's role must
    /// allow it there; the call is recorded in the audit log.
    async fn submit_in(
        &self,
        namespace: &str,
        spec: JobSpec,
        workspace: Vec<(String, Bytes)>,
        idempotency_key: String,
    ) -> Result<Submitted> {
        let caller = self.caller()?;
        let namespace = match namespace {
            "" => caller.principal.namespace.clone(),
            named => {
                flower_model::access::check_namespace(named).map_err(|m| AppError::invalid("namespace", m))?;
                named.to_string()
            }
        };
        self.authorize_in(&caller, Verb::Submit, &namespace, "").await?;
        let submitted = self.store_job(&caller, &namespace, spec, workspace, idempotency_key).await;
        let target = submitted.as_ref().map(|s| s.job.id.to_string()).unwrap_or_default();
        self.record(&caller, Verb::Submit, &namespace, &target, submitted.as_ref().map(|_| ())).await;
        submitted
    }

    async fn store_job(
        &self,
        caller: &Caller,
        namespace: &str,
        spec: JobSpec,
        workspace: Vec<(String, Bytes)>,
        idempotency_key: String,
    ) -> Result<Submitted> {
        self.admit(&spec)?;
        if !self.b.store.namespaces().await?.iter().any(|n| n.name == namespace) {
            return Err(AppError::invalid("namespace", format_args!("no namespace `{namespace}`")));
        }
        let value = serde_json::to_value(&spec).map_err(|e| AppError::internal("the spec could not be encoded", e))?;
        let key = Some(idempotency_key).filter(|k| !k.is_empty());
        let (job, created) = self
            .b
            .store
            .create_job(NewJob {
                id: JobId::random(),
                name: spec.name.clone(),
                spec: value.clone(),
                idempotency_key: key,
                continues: None,
                namespace: namespace.to_string(),
                submitted_by: Some(caller.principal.subject.clone()),
            })
            .await?;
        if !created && !same_spec(&job.spec, &value) {
            return Err(AppError::new(
                ErrorKind::AlreadyExists,
                format!(
                    "idempotency_key `{}`: job {} was submitted with this key and another spec; a retry sends the same spec, a new job a new key",
                    job.idempotency_key.as_deref().unwrap_or_default(),
                    job.id
                ),
            ));
        }
        if created {
            self.upload_workspace(&job, &spec, workspace).await?;
            tracing::info!(job = %job.id, name = %job.name, "job submitted");
            self.runs.submitted(job.id);
        }
        Ok(Submitted { job, created })
    }

    /// Whether this deployment runs `spec`: MCP servers, credential
    /// variables and egress from the operator's allowlist only, then what
    /// the deployment itself needs.
    pub fn admit(&self, spec: &JobSpec) -> Result<()> {
        self.b.tool_policy.check(spec).map_err(|e| AppError::bad_spec(&e))?;
        self.runs.admit(spec)
    }

    /// A new job's workspace (the files sent, or with [`super::Workspaces::Local`]
    /// the spec's directory), uploaded; a failed upload fails the job.
    async fn upload_workspace(&self, job: &Job, spec: &JobSpec, files: Vec<(String, Bytes)>) -> Result<()> {
        let ws = Workspace::new(self.b.objects.clone(), job.id);
        let limit = spec.runtime.workspace_limit.as_u64();
        let uploaded = match (&spec.workspace, self.workspaces) {
            _ if !files.is_empty() => ws.upload_files(files, limit).await,
            (Some(dir), super::Workspaces::Local) => ws.upload_dir(dir, limit).await,
            _ => return Ok(()),
        };
        if let Err(e) = uploaded {
            let reason = format!("workspace upload failed: {e}");
            let _ = self.b.store.set_job_state(job.id, JobState::Failed, Some(reason), None, None).await;
            return Err(e.into());
        }
        Ok(())
    }

    /// Continue the finished job `job_id` as a new job with `instruction`.
    pub async fn continue_job(&self, job_id: &str, instruction: &str, idempotency_key: String) -> Result<Submitted> {
        use crate::continuation::MAX_INSTRUCTION_BYTES;
        input::required_text("instruction", instruction, MAX_INSTRUCTION_BYTES, "required (what to do now)")?;
        input::check_text("idempotency_key", &idempotency_key, MAX_IDEMPOTENCY_KEY)?;
        let caller = self.caller()?;
        let parent = self.job("job_id", job_id).await?;
        self.authorize_on(&caller, Verb::Continue, &parent, job_id).await?;
        let key = Some(idempotency_key).filter(|k| !k.is_empty());
        let by = caller.principal.subject.clone();
        let store = self.b.store.as_ref();
        let made = crate::continuation::create(store, self.b.objects.clone(), parent.id, instruction, key, Some(by));
        let (job, created) = self
            .audited(&caller, Verb::Continue, &parent.namespace, &parent.id.to_string(), async { Ok(made.await?) })
            .await?;
        if created {
            tracing::info!(job = %job.id, parent = %parent.id, "job continued");
            self.runs.submitted(job.id);
        }
        Ok(Submitted { job, created })
    }

    /// Cancel a job that has not ended; `reason` may be empty (a default is
    /// recorded).
    pub async fn cancel(&self, job_id: &str, reason: &str) -> Result<Job> {
        input::check_text("reason", reason, MAX_REASON)?;
        let (caller, found) = self.job_for(Verb::Cancel, job_id).await?;
        let job = found.id;
        let notifier = self.runs.notifier(job);
        let store = self.b.store.as_ref();
        let ended = self
            .audited(&caller, Verb::Cancel, &found.namespace, &job.to_string(), async {
                Ok(crate::actions::cancel(store, notifier.as_deref(), job, reason).await?)
            })
            .await?;
        self.runs.cancelled(job).await;
        Ok(ended)
    }

    /// The job `job_id` names, if the caller may do `verb` on it.
    async fn job_for(&self, verb: Verb, job_id: &str) -> Result<(Caller, Job)> {
        let caller = self.caller()?;
        let job = self.job("job_id", job_id).await?;
        self.authorize_on(&caller, verb, &job, job_id).await?;
        Ok((caller, job))
    }

    /// Send a message to a running job's coordinator.
    pub async fn interrupt(&self, job_id: &str, message: &str) -> Result<Job> {
        let (caller, found) = self.job_for(Verb::Interrupt, job_id).await?;
        let outcome = self.send(found.id, message).await;
        self.record(&caller, Verb::Interrupt, &found.namespace, &found.id.to_string(), outcome.as_ref().map(|_| ()))
            .await;
        outcome
    }

    async fn send(&self, job: JobId, message: &str) -> Result<Job> {
        if message.trim().is_empty() {
            return Err(AppError::invalid("message", "required"));
        }
        if message.len() > self.max_request_bytes {
            return Err(AppError::too_large("message: over the request size limit"));
        }
        input::check_text("message", message, flower_model::spec::MAX_MESSAGE_BYTES)?;
        let state = self.b.store.get_job(job).await?.state;
        if state.is_terminal() {
            return Err(crate::actions::ActionError::Ended { job, state }.into());
        }
        self.runs.reachable(job)?;
        let notifier = self.runs.notifier(job);
        let found = crate::actions::interrupt(self.b.store.as_ref(), notifier.as_deref(), job, message.into()).await?;
        self.runs.message_stored(job, message).await;
        Ok(found)
    }

    /// Answer the question a job waits on; the job as it is after.
    pub async fn answer(&self, job_id: &str, r: AnswerRequest) -> Result<Job> {
        let (caller, found) = self.job_for(Verb::Answer, job_id).await?;
        let outcome = async {
            let reply = reply_of(&r)?;
            // A namespace's budget question: the raise first (an operator's).
            let raised = self.raise_for_answer(&caller, &found, &r.question_id, &r.text, r.option).await?;
            self.reply(found.id, &r.question_id, reply, raised).await
        }
        .await;
        self.record(&caller, Verb::Answer, &found.namespace, &found.id.to_string(), outcome.as_ref().map(|_| ())).await;
        outcome
    }

    /// Store `reply`. When it raised the namespace's budget, the job may
    /// have seen the raise and answered its question itself meanwhile
    /// (`by: limits`): the answer has then done its work.
    async fn reply(&self, job: JobId, question_id: &str, reply: Reply, raised: bool) -> Result<Job> {
        let question = Some(question_id).filter(|q| !q.is_empty());
        let written = match crate::tools::ask::answer(self.b.store.as_ref(), job, question, reply).await {
            Ok(w) => w,
            Err(
                crate::tools::ask::AnswerError::NothingPending(_)
                | crate::tools::ask::AnswerError::AlreadyAnswered { .. },
            ) if raised => {
                return Ok(self.b.store.get_job(job).await?);
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(n) = self.runs.notifier(job) {
            crate::actions::answered(n.as_ref(), job, &written).await;
        }
        self.runs.answer_stored(job).await;
        Ok(self.b.store.get_job(job).await?)
    }

    /// Answer a side question about a job from its events and workbench,
    /// outside its main thread.
    pub async fn aside(&self, job_id: &str, question: &str) -> Result<crate::aside::Aside> {
        let (caller, job) = self.job_for(Verb::Aside, job_id).await?;
        let target = job.id.to_string();
        let namespace = job.namespace.clone();
        self.audited(&caller, Verb::Aside, &namespace, &target, self.ask_aside(job, question)).await
    }

    async fn ask_aside(&self, job: Job, question: &str) -> Result<crate::aside::Aside> {
        use crate::aside::MAX_QUESTION_BYTES;
        input::required_text("question", question, MAX_QUESTION_BYTES, "required")?;
        let spec = JobSpec::from_value(job.spec.clone()).map_err(|e| AppError::internal("the job's stored spec", e))?;
        let providers = &self.b.providers;
        let provider = providers
            .check(&spec)
            .map(|_| providers.for_spec(&spec))
            .map_err(|e| AppError::precondition(format!("no provider for this job here: {e}")))?
            .ok_or_else(|| AppError::precondition("no provider for this job here"))?;
        // No one to tell (a process reading a store it does not run): notices go nowhere.
        let notifier = self.runs.notifier(job.id).unwrap_or_else(|| std::sync::Arc::new(flower_bus::MemoryBus::new()));
        let journal = flower_agent::Journal::new(self.b.store.clone(), notifier);
        Ok(crate::aside::aside(&journal, self.b.objects.clone(), provider, &self.b.windows, &spec, job.id, question)
            .await?)
    }
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

/// An answer's words or option, checked.
fn reply_of(r: &AnswerRequest) -> Result<Reply> {
    let reply = match (r.text.trim().is_empty(), r.option) {
        (false, 0) => {
            input::check_text("text", &r.text, flower_model::spec::MAX_MESSAGE_BYTES)?;
            Reply::Text(r.text.clone())
        }
        (true, 0) => return Err(AppError::invalid("text", "required (or `option`, from 1)")),
        (true, n) => Reply::Option(n),
        (false, _) => return Err(AppError::invalid("option", "give `text` or `option`, not both")),
    };
    if !r.question_id.is_empty() {
        input::check_text("question_id", &r.question_id, MAX_QUESTION_ID)?;
    }
    Ok(reply)
}
