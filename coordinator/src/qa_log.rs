//! `notes/qa-log.md` in the job's workbench: every question a session asked
//! the user, every answer (or "no answer"), and every message the user sent
//! while the job ran — a record for the people following the job, never
//! read into a context (docs/design.md section 10).
//!
//! Appends are read-modify-write of one object, so one job's appends take
//! turns: each job has one [`QaLog`], held by whoever writes to its log in
//! this process (its run's `ask` calls, and the owner that logs the user's
//! messages), and another job's log never waits on it. One owner runs a job
//! at a time, so turns are not needed across processes. The log is a record,
//! not the source of truth — the job's events are — so a failed write is
//! logged, not fatal.

use std::sync::Arc;

use flower_model::JobId;
use flower_store::Workbench;
use object_store::ObjectStore;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

pub const PATH: &str = "notes/qa-log.md";

/// One job's qa-log. A handle: clones share the job's turn to append, so
/// every writer of a job's log in this process must hold a clone of the same
/// one (a second `QaLog` of the job would let two appends lose one another).
#[derive(Clone)]
pub struct QaLog {
    workbench: Workbench,
    appending: Arc<tokio::sync::Mutex<()>>,
}

impl QaLog {
    /// The log of `job`'s workbench, with a turn of its own.
    pub fn new(objects: Arc<dyn ObjectStore>, job: JobId) -> Self {
        Self { workbench: Workbench::new(objects, job), appending: Arc::default() }
    }

    /// Record a question.
    pub async fn question(&self, role: &str, id: &str, question: &str, options: &[String]) {
        let mut text = format!("\n## Question from the {role} · {} · `{id}`\n\n{}\n", now(), quote(question));
        for (i, o) in options.iter().enumerate() {
            text.push_str(&format!("{}. {}\n", i + 1, one_line(o)));
        }
        self.append(&text).await;
    }

    /// Record the answer to question `id`.
    pub async fn answer(&self, id: &str, answer: &str) {
        self.append(&format!("\n**Answer** to `{id}` · {}:\n\n{}\n", now(), quote(answer))).await;
    }

    /// Record a message the user sent while the job ran (`flower interrupt`).
    pub async fn message(&self, text: &str) {
        self.append(&format!("\n## Message from the user · {}\n\n{}\n", now(), quote(text))).await;
    }

    async fn append(&self, text: &str) {
        let _turn = self.appending.lock().await;
        let mut log = match self.workbench.get(PATH).await {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(flower_store::StoreError::NotFound(_)) => {
                "# Questions, answers and messages\n\nWhat the job asked its user, what it was told, and the \
                 messages sent while it ran. Nothing here is read into a model's context.\n"
                    .to_string()
            }
            Err(e) => {
                tracing::warn!(error = %e, "qa-log not read; this entry is not logged");
                return;
            }
        };
        log.push_str(text);
        if let Err(e) = self.workbench.put(PATH, log.into_bytes()).await {
            tracing::warn!(error = %e, "qa-log not written");
        }
    }
}

fn now() -> String {
    OffsetDateTime::now_utc().format(&Rfc3339).unwrap_or_default()
}

/// As a Markdown quote, so no line of it reads as the log's own structure.
fn quote(text: &str) -> String {
    text.lines().map(|l| format!("> {l}")).collect::<Vec<_>>().join("\n")
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
