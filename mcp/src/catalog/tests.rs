//! The catalog's schemas, derived from the argument types, are the ones
//! written by hand before them (pasted below as they were): clients that
//! cached the list see no change.

use super::*;
use crate::args::Template;

fn job_id_param() -> Value {
    json!({"type": "string", "description": "The job's id, as submit_job returned it (the embedded store also takes a unique prefix)."})
}

/// The catalog as it was written by hand.
fn catalog_before(templates: &Templates) -> Vec<ToolDef> {
    let template_names: Vec<&str> = templates.keys().map(String::as_str).collect();
    let template_text = if templates.is_empty() {
        "No templates are configured on this server (the operator adds them with --template NAME=PATH): give a full spec.".to_string()
    } else {
        format!(
            "Templates on this server: {}.",
            templates.values().map(|t| format!("`{}` ({})", t.name, t.summary)).collect::<Vec<_>>().join(", ")
        )
    };
    let mut template_param = json!({"type": "string", "description": "A template's name: the operator's job spec, with `goal` in place of its own."});
    if !template_names.is_empty() {
        template_param["enum"] = json!(template_names);
    }
    vec![
        ToolDef {
            name: "submit_job",
            description: format!(
                "Hand a long job to flower: a coordinator agent delegates it to worker agents, which run real tools on real files; this returns at once with the job's id. Give either a full job spec (YAML or JSON text: name, goal, coordinator, workers, …) or a `goal` with a named `template`. {template_text} Follow the job with watch_job, then read its answer with job_status and its files with list_artifacts/get_artifact. A bad spec is refused naming the field."
            ),
            schema: json!({
                "type": "object",
                "properties": {
                    "spec": {"type": "string", "description": "A full job spec as YAML or JSON text (relative scenario/workspace paths resolve against the server's working directory)."},
                    "template": template_param,
                    "goal": {"type": "string", "description": "What the job must achieve, in words (with template; replaces the template's goal)."},
                    "name": {"type": "string", "description": "A short name for the job (default: the spec's or template's)."}
                }
            }),
        },
        ToolDef {
            name: "job_status",
            description: "A job's state now (queued, running, waiting_for_user, waiting_for_budget, succeeded, failed, cancelled), its reason, final answer and token usage; when it waits for its user, the question to answer with answer_question.".into(),
            schema: json!({"type": "object", "properties": {"job_id": job_id_param()}, "required": ["job_id"]}),
        },
        ToolDef {
            name: "watch_job",
            description: format!(
                "Follow a job until it ends, asks its user a question, or the timeout passes, then return its status (as job_status does). Sends MCP progress notifications (one per job event: tasks queued and finished, turns, questions) when the request carries a progressToken. Call it again to keep following a long job. Default timeout {WATCH_DEFAULT_SECS} s, at most {WATCH_MAX_SECS} s."
            ),
            schema: json!({
                "type": "object",
                "properties": {
                    "job_id": job_id_param(),
                    "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": WATCH_MAX_SECS, "description": "The longest to wait, in seconds."}
                },
                "required": ["job_id"]
            }),
        },
        ToolDef {
            name: "get_transcript",
            description: format!(
                "Read a job's transcript, one page at a time: by default the coordinator's main thread, or a named session (a worker's, a judge's). `raw` is every stored entry; `pruned` is what a resumed session would be fed (expired glances, dropped denials), with what each rule changed. Lists the job's sessions too. At most {PAGE_MAX} entries a page; pass `after` = the previous page's next_after."
            ),
            schema: json!({
                "type": "object",
                "properties": {
                    "job_id": job_id_param(),
                    "session": {"type": "string", "description": "A session's id, unique id prefix, or label (e.g. a worker's name); default: the coordinator's main thread."},
                    "view": {"type": "string", "enum": ["raw", "pruned"], "description": "raw (default) or pruned."},
                    "after": {"type": "integer", "minimum": 0, "description": "Start after this position (next_after of the previous page; default 0)."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": PAGE_MAX, "description": "Entries on the page (default 50)."}
                },
                "required": ["job_id"]
            }),
        },
        ToolDef {
            name: "list_artifacts",
            description: "List the files a job's workers wrote under its workbench's artifacts/ folder (reports, tables, outputs), with their sizes; get_artifact returns one.".into(),
            schema: json!({"type": "object", "properties": {"job_id": job_id_param()}, "required": ["job_id"]}),
        },
        ToolDef {
            name: "get_artifact",
            description: format!(
                "Download one file from a job's workbench artifacts/ folder: text comes back as text, binary as an embedded resource (base64). The path is relative to artifacts/ (or starts with artifacts/); paths leaving it are refused. At most {} MiB.",
                MAX_ARTIFACT >> 20
            ),
            schema: json!({
                "type": "object",
                "properties": {
                    "job_id": job_id_param(),
                    "path": {"type": "string", "description": "The file, e.g. sizes.md or artifacts/sizes.md."}
                },
                "required": ["job_id", "path"]
            }),
        },
        ToolDef {
            name: "cancel_job",
            description: "Cancel a running job: its tasks stop and it ends cancelled, with the reason. A job that already ended is refused.".into(),
            schema: json!({
                "type": "object",
                "properties": {
                    "job_id": job_id_param(),
                    "reason": {"type": "string", "description": "Why (recorded as the job's reason)."}
                },
                "required": ["job_id"]
            }),
        },
        ToolDef {
            name: "interrupt_job",
            description: "Send a message to a running job's coordinator (new information, a change of plan): it is delivered at once, and the coordinator adjusts and goes on without starting over.".into(),
            schema: json!({
                "type": "object",
                "properties": {
                    "job_id": job_id_param(),
                    "message": {"type": "string", "description": "The message for the coordinator."}
                },
                "required": ["job_id", "message"]
            }),
        },
        ToolDef {
            name: "answer_question",
            description: "Answer the question a job asked its user (the job waits in waiting_for_user, or in waiting_for_budget for a raise; job_status and watch_job show the question and its options). Give words in `text`, or choose an option by its number in `option`.".into(),
            schema: json!({
                "type": "object",
                "properties": {
                    "job_id": job_id_param(),
                    "text": {"type": "string", "description": "The answer in words."},
                    "option": {"type": "integer", "minimum": 1, "description": "The chosen option's number (from 1)."},
                    "question_id": {"type": "string", "description": "The question's id (default: the one waiting)."}
                },
                "required": ["job_id"]
            }),
        },
        ToolDef {
            name: SEARCH_TOOL,
            description: "Search this server's tools by what they do (BM25 over names, descriptions and parameter names) and get the best matches' names and descriptions. Every tool's schema is already in tools/list: this loads nothing, it only ranks.".into(),
            schema: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What you want to do, in a few words (e.g. \"download a file the job wrote\")."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 10, "description": "Most matches to return (default 5)."}
                },
                "required": ["query"]
            }),
        },
    ]
}

fn assert_same(now: Vec<ToolDef>, before: Vec<ToolDef>) {
    assert_eq!(now.len(), before.len());
    for (n, b) in now.iter().zip(&before) {
        assert_eq!(n.name, b.name);
        assert_eq!(n.description, b.description, "{}", n.name);
        assert_eq!(n.schema, b.schema, "{}", n.name);
        assert_eq!(n.schema.to_string(), b.schema.to_string(), "{}", n.name);
    }
}

#[test]
fn the_derived_schemas_are_unchanged() {
    assert_same(catalog(&Templates::new()), catalog_before(&Templates::new()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.yaml");
    std::fs::write(
        &path,
        "name: t\ngoal: old\ncoordinator: {name: lead}\nworkers:\n  w: {description: d, tools: [Bash]}\n",
    )
    .unwrap();
    let templates: Templates = ["t", "u"]
        .into_iter()
        .map(|n| (n.to_string(), Template::parse_flag(&format!("{n}={}", path.display())).unwrap()))
        .collect();
    assert_same(catalog(&templates), catalog_before(&templates));
    assert_eq!(catalog(&templates)[0].schema["properties"]["template"]["enum"], json!(["t", "u"]));
}
