//! `notes/qa-log.md` in the job's workbench: every question a session asked
//! the user, every answer (or "no answer"), and every message the user sent
//! while the job ran — a record for the people following the job, never
//! read into a context (docs/design.md section 10).
//!
//! Appends are read-modify-write of one object, serialised in this process
//! (one owner runs a job at a time). The log is a record, not the source of
//! truth — the job's events are — so a failed write is logged, not fatal.

use flower_store::Workbench;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

pub const PATH: &str = "notes/qa-log.md";

/// One writer at a time for every job of this process: appends are rare.
static APPENDING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Record a question.
pub async fn question(workbench: &Workbench, role: &str, id: &str, question: &str, options: &[String]) {
    let mut text = format!("\n## Question from the {role} · {} · `{id}`\n\n{}\n", now(), quote(question));
    for (i, o) in options.iter().enumerate() {
        text.push_str(&format!("{}. {}\n", i + 1, one_line(o)));
    }
    append(workbench, &text).await;
}

/// Record the answer to question `id`.
pub async fn answer(workbench: &Workbench, id: &str, answer: &str) {
    append(workbench, &format!("\n**Answer** to `{id}` · {}:\n\n{}\n", now(), quote(answer))).await;
}

/// Record a message the user sent while the job ran (`flower interrupt`).
pub async fn message(workbench: &Workbench, text: &str) {
    append(workbench, &format!("\n## Message from the user · {}\n\n{}\n", now(), quote(text))).await;
}

async fn append(workbench: &Workbench, text: &str) {
    let _one = APPENDING.lock().await;
    let mut log = match workbench.get(PATH).await {
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
    if let Err(e) = workbench.put(PATH, log.into_bytes()).await {
        tracing::warn!(error = %e, "qa-log not written");
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
