//! `ask`: a session's question to the job's user (the human channel,
//! docs/design.md section 10). The question is an event, the job waits in
//! `waiting_for_user` (no model call, no worker slot), and the answer — given
//! over gRPC `Answer` or `flower answer`, or "no answer" after
//! `runtime.ask.timeout` — is the call's result. Both are logged to the
//! workbench's `notes/qa-log.md`, never into another context.
//!
//! Everything is read back from the job's events, so a run resumed on another
//! replica (the call is resumable: it has no result yet) finds its question
//! asked, keeps the first deadline, and takes an answer stored meanwhile.

use std::time::Duration;

use async_trait::async_trait;
use flower_agent::tool::{FatalCause, args, schema_of};
use flower_agent::{Inbox, Journal, Tool, ToolContext, ToolError, ToolOutput};
use flower_model::spec::AskOptions;
use flower_model::{EventKind, JobId, JobState, now_ms};
use flower_store::{Batch, StoreError};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

/// An answer is looked for at least this often without a wake-up (wake-ups
/// are hints: an answer written by another process is seen within this).
const BACKSTOP: Duration = Duration::from_secs(1);
pub const MAX_QUESTION_CHARS: usize = 4_000;
pub const MAX_OPTIONS: usize = 8;
pub const MAX_OPTION_CHARS: usize = 200;
/// What a question left without an answer is answered.
pub const NO_ANSWER: &str = "no answer";

/// Asks the job's user a question and waits for the answer, everything
/// read back from the job's events (the `ask` tool, and the judge after an
/// `unreachable` verdict).
#[derive(Clone)]
pub struct Asker {
    journal: Journal,
    qa_log: crate::qa_log::QaLog,
    inbox: Inbox,
    options: AskOptions,
    stop: crate::stop::Stop,
    role: String,
    /// The job's state while it waits (`waiting_for_user`, or
    /// `waiting_for_budget` for the budget's question).
    waiting: JobState,
}

/// How a question ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Asked {
    /// The user's answer (`by` = `user`), or "no answer" (`by` = `timeout`,
    /// or `limit` when the job's questions were all asked).
    Answer { text: String, option: Option<u32>, by: String },
    /// The user cancelled the job meanwhile.
    Cancelled,
    /// The run stopped to hand the job over; the next owner waits on.
    HandingOver,
}

impl Asker {
    pub fn new(
        journal: Journal,
        qa_log: crate::qa_log::QaLog,
        inbox: Inbox,
        options: AskOptions,
        stop: crate::stop::Stop,
        role: &str,
    ) -> Self {
        Self { journal, qa_log, inbox, options, stop, role: role.to_string(), waiting: JobState::WaitingForUser }
    }

    /// Wait in `state` rather than `waiting_for_user`.
    pub fn waiting_in(mut self, state: JobState) -> Self {
        self.waiting = state;
        self
    }

    /// Wait `timeout` for an answer rather than the configured time.
    pub fn timed(mut self, timeout: Duration) -> Self {
        self.options.timeout = timeout;
        self
    }

    pub fn options(&self) -> &AskOptions {
        &self.options
    }

    /// Ask question `id` (stored once: asked again after a resume, it goes on
    /// waiting for the same answer until the first deadline) and wait.
    pub async fn ask(
        &self,
        job: JobId,
        session: flower_model::SessionId,
        id: &str,
        question: &str,
        options: &[String],
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<Asked, StoreError> {
        let mut q = Questions::default();
        read_on(self.journal.store().as_ref(), job, id, &mut q).await?;
        if q.asked_at.is_none() {
            if q.count >= self.options.max_asks {
                let why = format!("{NO_ANSWER} (the job's {} questions are asked: runtime.ask.max_asks)", q.count);
                self.qa_log.question(&self.role, id, question, options).await;
                self.qa_log.answer(id, &why).await;
                return Ok(Asked::Answer { text: why, option: None, by: "limit".into() });
            }
            let asked = EventKind::QuestionAsked {
                id: id.to_string(),
                session,
                role: self.role.clone(),
                question: question.to_string(),
                options: options.to_vec(),
            };
            let written = self.journal.commit(Batch { events: vec![(job, asked)], ..Default::default() }).await?;
            self.journal.announce(&written).await;
            q.read(&written.events, id);
            self.set_state(job, self.waiting).await?;
            self.qa_log.question(&self.role, id, question, options).await;
        }
        let deadline_ms = q.asked_at.unwrap_or_else(now_ms) + self.options.timeout.as_millis() as i64;
        while q.answer.is_none() {
            let left = Duration::from_millis((deadline_ms - now_ms()).max(0) as u64);
            if left.is_zero() {
                let timed_out = EventKind::QuestionAnswered {
                    id: id.to_string(),
                    answer: NO_ANSWER.into(),
                    option: None,
                    by: "timeout".into(),
                };
                let written =
                    self.journal.commit(Batch { events: vec![(job, timed_out)], ..Default::default() }).await?;
                self.journal.announce(&written).await;
                // An answer stored just before the timeout's comes first: read in order.
                read_on(self.journal.store().as_ref(), job, id, &mut q).await?;
                break;
            }
            tokio::select! {
                _ = self.inbox.answer_notice() => {}
                _ = tokio::time::sleep(left.min(BACKSTOP)) => {}
                _ = cancel.cancelled() => {
                    return Ok(if self.stop.handing_over() { Asked::HandingOver } else { Asked::Cancelled });
                }
            }
            read_on(self.journal.store().as_ref(), job, id, &mut q).await?;
        }
        let (text, option, by) = q.answer.unwrap_or_else(|| (NO_ANSWER.into(), None, "timeout".into()));
        self.set_state(job, JobState::Running).await?;
        self.qa_log.answer(id, &logged(&text, option, &by)).await;
        Ok(Asked::Answer { text, option, by })
    }

    async fn set_state(&self, job: JobId, state: JobState) -> Result<(), StoreError> {
        let store = self.journal.store();
        match store.set_job_state(job, state, None, None, self.journal.fence()).await {
            Ok(written) => self.journal.announce(&written).await,
            // A user's cancel ended the job meanwhile: the run is being stopped.
            Err(StoreError::JobEnded { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

/// The arguments of `ask`.
#[derive(Debug, Deserialize, JsonSchema)]
struct AskArgs {
    /// The question, self-contained
    question: String,
    /// The answers to choose from, when known (the user may still answer in words)
    #[schemars(length(max = MAX_OPTIONS))]
    options: Option<Vec<String>>,
}

pub struct AskTool {
    asker: Asker,
}

impl AskTool {
    pub fn new(asker: Asker) -> Self {
        Self { asker }
    }
}

/// What the job's events say about questions: the one asked by `id` (with
/// its time), the first answer to it, how many were asked in all.
#[derive(Default)]
struct Questions {
    asked_at: Option<i64>,
    answer: Option<(String, Option<u32>, String)>,
    count: u32,
    /// The last event read, to read on from.
    cursor: i64,
}

impl Questions {
    fn read(&mut self, events: &[flower_model::Event], id: &str) {
        for e in events {
            self.see(e, id);
        }
    }

    fn see(&mut self, e: &flower_model::Event, id: &str) {
        self.cursor = self.cursor.max(e.seq);
        match &e.kind {
            EventKind::QuestionAsked { id: asked, .. } => {
                // The budget's questions are not the sessions' own.
                if !asked.starts_with("budget-") {
                    self.count += 1;
                }
                if asked == id {
                    self.asked_at = Some(e.at);
                }
            }
            EventKind::QuestionAnswered { id: answered, answer, option, by }
                if answered == id && self.answer.is_none() =>
            {
                self.answer = Some((answer.clone(), *option, by.clone()));
            }
            _ => {}
        }
    }
}

/// Read the job's events from `q.cursor` on.
async fn read_on(store: &dyn flower_store::Store, job: JobId, id: &str, q: &mut Questions) -> Result<(), StoreError> {
    let from = q.cursor;
    flower_store::scan_events(store, job, from, |e| q.see(e, id)).await?;
    Ok(())
}

fn store_err(e: StoreError) -> ToolError {
    ToolError::Fatal(FatalCause::Store(e))
}

#[async_trait]
impl Tool for AskTool {
    fn name(&self) -> &str {
        "ask"
    }

    fn description(&self) -> String {
        let o = self.asker.options();
        format!(
            "Ask the job's user one question, and wait for the answer. Ask only what changes the approach and \
             cannot be found in the workspace or the workbench; one question at a time, with `options` when the \
             choices are known. The user may be away: after {} the answer is \"{NO_ANSWER}\" — then assume what \
             is most reasonable, say so, and record the assumption. At most {} questions per job.",
            humantime::format_duration(o.timeout),
            o.max_asks
        )
    }

    fn input_schema(&self) -> Value {
        schema_of::<AskArgs>()
    }

    /// A resumed run makes the call again: it finds its question by the call's id.
    fn resumable(&self) -> bool {
        true
    }

    async fn call(&self, input: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let (question, options) = parse(&input)?;
        let asked = self
            .asker
            .ask(ctx.job_id, ctx.session_id, &ctx.tool_use_id, &question, &options, &ctx.cancel)
            .await
            .map_err(store_err)?;
        Ok(ToolOutput::text(match asked {
            Asked::Answer { text, option, by } => match (by.as_str(), option) {
                ("user", Some(n)) => format!("The user chose option {n}: {text}"),
                ("user", None) => format!("The user answered: {text}"),
                ("limit", _) => assume(&text),
                _ => assume(&format!(
                    "{NO_ANSWER} within {} (the user may be away)",
                    humantime::format_duration(self.asker.options().timeout)
                )),
            },
            // Left without a result: the next owner asks nothing again and
            // goes on waiting for the same answer.
            Asked::HandingOver => return Err(ToolError::fatal("the run stopped to hand the job over")),
            Asked::Cancelled => return Ok(ToolOutput::error("[cancelled while waiting for the user's answer]")),
        }))
    }
}

fn assume(why: &str) -> String {
    format!(
        "[{why}] Go on without it: assume what is most reasonable, say what you assumed, and record the \
         assumption (in notes/ when there is a workbench)."
    )
}

fn logged(answer: &str, option: Option<u32>, by: &str) -> String {
    match (by, option) {
        ("user", Some(n)) => format!("option {n}: {answer}"),
        ("user", None) => answer.to_string(),
        (by, _) => format!("{answer} ({by})"),
    }
}

/// The call's question and options, or what is wrong with them (the model fixes it).
fn parse(input: &Value) -> Result<(String, Vec<String>), ToolError> {
    let bad = |m: &str| ToolError::RespondToModel(m.to_string());
    let a: AskArgs = args(input.clone())?;
    let question = a.question.trim();
    if question.is_empty() {
        return Err(bad("`question` is required: the question to ask the user"));
    }
    if question.chars().count() > MAX_QUESTION_CHARS {
        return Err(bad(&format!("`question` is over {MAX_QUESTION_CHARS} characters: ask something shorter")));
    }
    let options: Vec<String> = a.options.unwrap_or_default().iter().map(|o| o.trim().to_string()).collect();
    if options.iter().any(String::is_empty) {
        return Err(bad("`options` must be non-empty strings"));
    }
    if options.len() > MAX_OPTIONS {
        return Err(bad(&format!("at most {MAX_OPTIONS} `options`")));
    }
    if options.iter().any(|o| o.chars().count() > MAX_OPTION_CHARS) {
        return Err(bad(&format!("an option is over {MAX_OPTION_CHARS} characters")));
    }
    Ok((question.to_string(), options))
}

/// A user's answer: words, or the number (from 1) of one of the options.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Text(String),
    Option(u32),
}

/// Why an answer was not stored.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("job {0} has no question waiting for an answer")]
    NothingPending(JobId),
    #[error("job {job} has {count} questions waiting: name one ({ids})")]
    Ambiguous { job: JobId, count: usize, ids: String },
    #[error("question `{0}` is not a question of this job")]
    UnknownQuestion(String),
    #[error("question `{id}` was already answered ({by})")]
    AlreadyAnswered { id: String, by: String },
    #[error("option {given}: the question has {count} options (from 1)")]
    NoSuchOption { given: u32, count: usize },
    #[error("the answer is empty")]
    Empty,
    #[error("job {job} has ended ({state}): nothing waits for an answer")]
    JobEnded { job: JobId, state: JobState },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The questions of `job` still waiting for an answer, in the order asked:
/// (id, question, options).
pub async fn pending(
    store: &dyn flower_store::Store,
    job: JobId,
) -> Result<Vec<(String, String, Vec<String>)>, StoreError> {
    let mut open: Vec<(String, String, Vec<String>)> = Vec::new();
    flower_store::scan_events(store, job, 0, |e| match &e.kind {
        EventKind::QuestionAsked { id, question, options, .. } => {
            open.push((id.clone(), question.clone(), options.clone()))
        }
        EventKind::QuestionAnswered { id, .. } => open.retain(|(q, ..)| q != id),
        _ => {}
    })
    .await?;
    Ok(open)
}

/// Store the user's answer to `question` (or to the one question waiting,
/// when `None`), checked against what the job asked. The waiting session
/// reads it from the store; the caller wakes it (a notice) when it can.
pub async fn answer(
    store: &dyn flower_store::Store,
    job: JobId,
    question: Option<&str>,
    reply: Reply,
) -> Result<flower_store::Written, AnswerError> {
    let state = store.get_job(job).await?.state;
    if state.is_terminal() {
        return Err(AnswerError::JobEnded { job, state });
    }
    let open = pending(store, job).await?;
    let (id, _, options) = match question {
        Some(id) => match open.iter().find(|(q, ..)| q == id) {
            Some(found) => found.clone(),
            None => return Err(answered_or_unknown(store, job, id).await?),
        },
        None => match open.as_slice() {
            [] => return Err(AnswerError::NothingPending(job)),
            [one] => one.clone(),
            many => {
                let ids = many.iter().map(|(q, ..)| q.as_str()).collect::<Vec<_>>().join(", ");
                return Err(AnswerError::Ambiguous { job, count: many.len(), ids });
            }
        },
    };
    let (answer, option) = match reply {
        Reply::Text(t) if t.trim().is_empty() => return Err(AnswerError::Empty),
        Reply::Text(t) => (t.trim().to_string(), None),
        Reply::Option(n) => match options.get((n as usize).wrapping_sub(1)) {
            Some(text) if n >= 1 => (text.clone(), Some(n)),
            _ => return Err(AnswerError::NoSuchOption { given: n, count: options.len() }),
        },
    };
    let kind = EventKind::QuestionAnswered { id, answer, option, by: "user".into() };
    Ok(store.append(Batch { events: vec![(job, kind)], ..Default::default() }).await?)
}

async fn answered_or_unknown(store: &dyn flower_store::Store, job: JobId, id: &str) -> Result<AnswerError, StoreError> {
    let mut q = Questions::default();
    read_on(store, job, id, &mut q).await?;
    Ok(match (q.asked_at, q.answer) {
        (Some(_), Some((_, _, by))) => AnswerError::AlreadyAnswered { id: id.to_string(), by },
        _ => AnswerError::UnknownQuestion(id.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    #[test]
    fn the_derived_schema_is_unchanged() {
        assert_eq!(
            schema_of::<AskArgs>(),
            json!({
                "type": "object",
                "properties": {
                    "question": {"type": "string", "description": "The question, self-contained"},
                    "options": {
                        "type": "array",
                        "items": {"type": "string"},
                        "maxItems": MAX_OPTIONS,
                        "description": "The answers to choose from, when known (the user may still answer in words)"
                    }
                },
                "required": ["question"]
            })
        );
    }

    #[test]
    fn questions_and_options_are_checked() {
        assert!(parse(&json!({})).is_err());
        assert!(parse(&json!({"question": "  "})).is_err());
        assert!(parse(&json!({"question": "q", "options": "a"})).is_err());
        assert!(parse(&json!({"question": "q", "options": ["a", ""]})).is_err());
        assert!(parse(&json!({"question": "q", "options": vec!["a"; 9]})).is_err());
        assert!(parse(&json!({"question": "x".repeat(MAX_QUESTION_CHARS + 1)})).is_err());
        let (q, o) = parse(&json!({"question": " Which DB? ", "options": ["Postgres", " SQLite "]})).unwrap();
        assert_eq!((q.as_str(), o), ("Which DB?", vec!["Postgres".to_string(), "SQLite".to_string()]));
    }

    #[test]
    fn the_first_answer_counts() {
        let ev = |seq, kind| flower_model::Event { job_id: JobId::random(), seq, at: seq * 10, kind };
        let asked = |id: &str| EventKind::QuestionAsked {
            id: id.into(),
            session: flower_model::SessionId::random(),
            role: "coordinator".into(),
            question: "q".into(),
            options: vec![],
        };
        let answered = |id: &str, a: &str, by: &str| EventKind::QuestionAnswered {
            id: id.into(),
            answer: a.into(),
            option: None,
            by: by.into(),
        };
        let mut q = Questions::default();
        q.read(
            &[
                ev(1, asked("a")),
                ev(2, asked("b")),
                ev(3, answered("a", "other question's", "user")),
                ev(4, answered("b", "yes", "user")),
                ev(5, answered("b", NO_ANSWER, "timeout")),
            ],
            "b",
        );
        assert_eq!((q.asked_at, q.count, q.cursor), (Some(20), 2, 5));
        assert_eq!(q.answer, Some(("yes".into(), None, "user".into())));
    }
}
