//! The server's tools: each one's arguments as a type, and the catalog
//! `tools/list` gives, whose schemas are derived from those types
//! ([`flower_agent::tool::schema_of`]): what a client is shown is what the
//! handlers read ([`crate::args::parse`]). A field's doc comment is its
//! description in the schema.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::Templates;
use crate::{MAX_ARTIFACT, PAGE_MAX, SEARCH_TOOL, WATCH_DEFAULT_SECS, WATCH_MAX_SECS};

/// The job's id, as submit_job returned it (the embedded store also takes a unique prefix).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct JobRef(pub String);

impl std::ops::Deref for JobRef {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// `submit_job`: a full spec, or a template with a goal.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SubmitArgs {
    /// A full job spec as YAML or JSON text (relative scenario/workspace paths resolve against the server's working directory).
    pub spec: Option<String>,
    /// A template's name: the operator's job spec, with `goal` in place of its own.
    pub template: Option<String>,
    /// What the job must achieve, in words (with template; replaces the template's goal).
    pub goal: Option<String>,
    /// A short name for the job (default: the spec's or template's).
    pub name: Option<String>,
}

/// `job_status` and `list_artifacts`: a job.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct JobArgs {
    pub job_id: JobRef,
}

/// `watch_job`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchArgs {
    pub job_id: JobRef,
    /// The longest to wait, in seconds.
    #[schemars(range(min = 1, max = WATCH_MAX_SECS))]
    pub timeout_seconds: Option<u64>,
}

/// `get_transcript`: one page of a session's transcript.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct TranscriptArgs {
    pub job_id: JobRef,
    /// A session's id, unique id prefix, or label (e.g. a worker's name); default: the coordinator's main thread.
    pub session: Option<String>,
    /// raw (default) or pruned.
    pub view: Option<View>,
    /// Start after this position (next_after of the previous page; default 0).
    pub after: Option<u64>,
    /// Entries on the page (default 50).
    #[schemars(range(min = 1, max = PAGE_MAX))]
    pub limit: Option<u64>,
}

// Which transcript a page is of (no doc comment: it would be sent as the
// field's description): every stored entry, or what a resumed session is fed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum View {
    #[default]
    Raw,
    Pruned,
}

impl View {
    pub fn as_str(self) -> &'static str {
        match self {
            View::Raw => "raw",
            View::Pruned => "pruned",
        }
    }
}

/// `get_artifact`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ArtifactArgs {
    pub job_id: JobRef,
    /// The file, e.g. sizes.md or artifacts/sizes.md.
    pub path: String,
}

/// `cancel_job`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CancelArgs {
    pub job_id: JobRef,
    /// Why (recorded as the job's reason).
    pub reason: Option<String>,
}

/// `interrupt_job`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct InterruptArgs {
    pub job_id: JobRef,
    /// The message for the coordinator.
    pub message: String,
}

/// `answer_question`: words or an option's number.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct AnswerArgs {
    pub job_id: JobRef,
    /// The answer in words.
    pub text: Option<String>,
    /// The chosen option's number (from 1).
    #[schemars(range(min = 1))]
    pub option: Option<u32>,
    /// The question's id (default: the one waiting).
    pub question_id: Option<String>,
}

/// `search_tool_bm25`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SearchArgs {
    /// What you want to do, in a few words (e.g. "download a file the job wrote").
    pub query: String,
    /// Most matches to return (default 5).
    #[schemars(range(min = 1, max = 10))]
    pub limit: Option<u64>,
}

/// One tool of the catalog.
pub struct ToolDef {
    pub name: &'static str,
    pub description: String,
    pub schema: Value,
}

/// `submit_job`'s schema: its arguments', with the operator's templates
/// (when there are some) as the values `template` takes.
fn submit_schema(templates: &Templates) -> Value {
    let mut schema = flower_agent::tool::schema_of::<SubmitArgs>();
    if !templates.is_empty() {
        schema["properties"]["template"]["enum"] = json!(templates.keys().collect::<Vec<_>>());
    }
    schema
}

/// The catalog, in the order `tools/list` gives it.
pub fn catalog(templates: &Templates) -> Vec<ToolDef> {
    use flower_agent::tool::schema_of;
    let template_text = if templates.is_empty() {
        "No templates are configured on this server (the operator adds them with --template NAME=PATH): give a full spec.".to_string()
    } else {
        format!(
            "Templates on this server: {}.",
            templates.values().map(|t| format!("`{}` ({})", t.name, t.summary)).collect::<Vec<_>>().join(", ")
        )
    };
    vec![
        ToolDef {
            name: "submit_job",
            description: format!(
                "Hand a long job to flower: a coordinator agent delegates it to worker agents, which run real tools on real files; this returns at once with the job's id. Give either a full job spec (YAML or JSON text: name, goal, coordinator, workers, …) or a `goal` with a named `template`. {template_text} Follow the job with watch_job, then read its answer with job_status and its files with list_artifacts/get_artifact. A bad spec is refused naming the field."
            ),
            schema: submit_schema(templates),
        },
        ToolDef {
            name: "job_status",
            description: "A job's state now (queued, running, waiting_for_user, waiting_for_budget, succeeded, failed, cancelled), its reason, final answer and token usage; when it waits for its user, the question to answer with answer_question.".into(),
            schema: schema_of::<JobArgs>(),
        },
        ToolDef {
            name: "watch_job",
            description: format!(
                "Follow a job until it ends, asks its user a question, or the timeout passes, then return its status (as job_status does). Sends MCP progress notifications (one per job event: tasks queued and finished, turns, questions) when the request carries a progressToken. Call it again to keep following a long job. Default timeout {WATCH_DEFAULT_SECS} s, at most {WATCH_MAX_SECS} s."
            ),
            schema: schema_of::<WatchArgs>(),
        },
        ToolDef {
            name: "get_transcript",
            description: format!(
                "Read a job's transcript, one page at a time: by default the coordinator's main thread, or a named session (a worker's, a judge's). `raw` is every stored entry; `pruned` is what a resumed session would be fed (expired glances, dropped denials), with what each rule changed. Lists the job's sessions too. At most {PAGE_MAX} entries a page; pass `after` = the previous page's next_after."
            ),
            schema: schema_of::<TranscriptArgs>(),
        },
        ToolDef {
            name: "list_artifacts",
            description: "List the files a job's workers wrote under its workbench's artifacts/ folder (reports, tables, outputs), with their sizes; get_artifact returns one.".into(),
            schema: schema_of::<JobArgs>(),
        },
        ToolDef {
            name: "get_artifact",
            description: format!(
                "Download one file from a job's workbench artifacts/ folder: text comes back as text, binary as an embedded resource (base64). The path is relative to artifacts/ (or starts with artifacts/); paths leaving it are refused. At most {} MiB.",
                MAX_ARTIFACT >> 20
            ),
            schema: schema_of::<ArtifactArgs>(),
        },
        ToolDef {
            name: "cancel_job",
            description: "Cancel a running job: its tasks stop and it ends cancelled, with the reason. A job that already ended is refused.".into(),
            schema: schema_of::<CancelArgs>(),
        },
        ToolDef {
            name: "interrupt_job",
            description: "Send a message to a running job's coordinator (new information, a change of plan): it is delivered at once, and the coordinator adjusts and goes on without starting over.".into(),
            schema: schema_of::<InterruptArgs>(),
        },
        ToolDef {
            name: "answer_question",
            description: "Answer the question a job asked its user (the job waits in waiting_for_user, or in waiting_for_budget for a raise; job_status and watch_job show the question and its options). Give words in `text`, or choose an option by its number in `option`.".into(),
            schema: schema_of::<AnswerArgs>(),
        },
        ToolDef {
            name: SEARCH_TOOL,
            description: "Search this server's tools by what they do (BM25 over names, descriptions and parameter names) and get the best matches' names and descriptions. Every tool's schema is already in tools/list: this loads nothing, it only ranks.".into(),
            schema: schema_of::<SearchArgs>(),
        },
    ]
}

#[cfg(test)]
mod tests;
