//! `flower submit` and `flower watch`: jobs on the service.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use flower_model::JobSpec;
use flower_proto::v1 as pb;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::client::{Client, ServerArgs, status_error};

#[derive(Args)]
pub struct SubmitArgs {
    /// The job spec (YAML or JSON)
    pub spec: PathBuf,
    /// Directory uploaded as the job's workspace (overrides the spec's `workspace`)
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Follow the job's events; exit 0 only if it succeeds
    #[arg(long)]
    pub watch: bool,
    /// Submitting again with the same key returns the first job
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// The namespace to submit in (default: the one the credential is bound to)
    #[arg(long, env = "FLOWER_NAMESPACE", default_value = "")]
    pub namespace: String,
    /// Print JSON (`{"job_id": …, "existing": …}`, then events with --watch)
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub overrides: super::SpecOverrides,
}

pub async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.spec).with_context(|| format!("reading {}", args.spec.display()))?;
    let mut spec = match JobSpec::load(&args.spec) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {}: {e}", args.spec.display());
            return Ok(ExitCode::from(2));
        }
    };
    // Overrides travel in the spec itself (sent as JSON).
    let text = if args.overrides.any() {
        args.overrides.apply(&mut spec);
        serde_json::to_string(&spec)?
    } else {
        text
    };
    let workspace = match args.workspace.as_ref().or(spec.workspace.as_ref()) {
        Some(dir) => read_workspace(dir, spec.runtime.workspace_limit.as_u64())?,
        None => Vec::new(),
    };
    let mut client = args.server.connect().await?;
    let req = pb::SubmitRequest {
        spec: text,
        idempotency_key: args.idempotency_key.unwrap_or_default(),
        workspace,
        namespace: args.namespace.clone(),
        ..Default::default()
    };
    let resp = client.submit(req).await.map_err(status_error)?.into_inner();
    if args.json {
        println!("{}", serde_json::json!({"job_id": resp.job_id, "existing": resp.existing}));
    } else {
        println!("{}", resp.job_id);
    }
    if !args.watch {
        return Ok(ExitCode::SUCCESS);
    }
    follow(&mut client, &resp.job_id, 0, args.json).await
}

/// The files of `dir` (not `.flower/`, no symlinks), refusing more than `limit` bytes.
pub(crate) fn read_workspace(dir: &std::path::Path, limit: u64) -> anyhow::Result<Vec<pb::WorkspaceFile>> {
    let manifest = flower_store::localfs::scan(dir, &[flower_store::workbench::MOUNT])?;
    let total: u64 = manifest.values().map(|f| f.size).sum();
    anyhow::ensure!(
        total <= limit,
        "workspace {} holds {total} bytes, more than runtime.workspace_limit ({limit} bytes)",
        dir.display()
    );
    manifest
        .keys()
        .map(|rel| {
            let content = std::fs::read(dir.join(rel)).with_context(|| format!("reading {rel}"))?;
            Ok(pb::WorkspaceFile { path: rel.clone(), content })
        })
        .collect()
}

#[derive(Args)]
pub struct WatchArgs {
    /// The job id
    pub job: String,
    /// Start after this event sequence number (what a previous watch printed last)
    #[arg(long, default_value_t = 0)]
    pub after: i64,
    /// Print events as JSON lines
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub async fn watch(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    follow(&mut client, &args.job, args.after, args.json).await
}

/// Print events until the job ends, reconnecting from the last cursor when
/// the stream breaks; exit 0 only if the job succeeded.
async fn follow(client: &mut Client, job: &str, mut cursor: i64, json: bool) -> anyhow::Result<ExitCode> {
    let bar = (!json).then(|| {
        let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        b.enable_steady_tick(Duration::from_millis(120));
        b
    });
    let mut failures = 0;
    loop {
        let stream = client.watch(pb::WatchRequest { job_id: job.to_string(), after_seq: cursor }).await;
        let mut stream = match stream {
            Ok(s) => s.into_inner(),
            Err(s) if s.code() == tonic::Code::Unavailable && failures < 30 => {
                failures += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(s) => return Err(status_error(s)),
        };
        loop {
            match stream.message().await {
                Ok(Some(e)) => {
                    failures = 0;
                    cursor = e.seq;
                    show_event(client, job, &e, bar.as_ref());
                }
                // The stream ends after the terminal state.
                Ok(None) => match ended(client, job, bar.as_ref()).await? {
                    Some(code) => return Ok(code),
                    None => break,
                },
                Err(s) => {
                    failures += 1;
                    anyhow::ensure!(failures < 30, "watch kept failing: {s}");
                    tracing::warn!(cursor, error = %s, "watch stream broke; reconnecting from the cursor");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    break;
                }
            }
        }
    }
}

/// One event: a JSON line (no `bar`), else the bar's message, a question
/// shown (and answered at a terminal) and the notable events printed.
fn show_event(client: &Client, job: &str, e: &pb::JobEvent, bar: Option<&ProgressBar>) {
    let Some(b) = bar else {
        println!(
            "{}",
            serde_json::json!({"seq": e.seq, "at_ms": e.at_ms, "kind": e.kind, "event": serde_json::from_str::<serde_json::Value>(&e.payload_json).unwrap_or_default()})
        );
        return;
    };
    b.set_message(format!("#{} {}", e.seq, e.kind));
    if matches!(e.detail, Some(pb::job_event::Detail::QuestionAsked(_))) {
        let q: serde_json::Value = serde_json::from_str(&e.payload_json).unwrap_or_default();
        b.suspend(|| eprintln!("{}", show_question(job, &q)));
        if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            answer_at_terminal(client.clone(), job.to_string(), q);
        }
    } else if matches!(
        e.kind.as_str(),
        "task_queued" | "task_finished" | "job_state" | "workspace_conflict" | "question_answered" | "judge_verdict"
    ) {
        b.suspend(|| eprintln!("  #{} {} {}", e.seq, e.kind, e.payload_json));
    }
}

/// After the stream ended: the job's end (printed without JSON) and the
/// exit code, or `None` when it has not ended (watch again).
async fn ended(client: &mut Client, job: &str, bar: Option<&ProgressBar>) -> anyhow::Result<Option<ExitCode>> {
    let j = client.get(pb::GetRequest { job_id: job.to_string() }).await.map_err(status_error)?.into_inner();
    if let Some(b) = bar {
        b.finish_and_clear();
        println!(
            "job {} {}{}",
            j.id,
            j.state,
            if j.reason.is_empty() { String::new() } else { format!(": {}", j.reason) }
        );
        if !j.final_answer.is_empty() {
            println!("\nFinal answer:\n{}", j.final_answer.trim_end());
        }
    }
    let state = j.typed_state();
    Ok(state
        .filter(|s| s.is_terminal())
        .map(|s| if s == flower_model::JobState::Succeeded { ExitCode::SUCCESS } else { ExitCode::from(1) }))
}

/// A question as `flower watch` shows it: the text, the options, how to answer.
fn show_question(job: &str, q: &serde_json::Value) -> String {
    let mut out = format!(
        "\n? the {} asks (question {}):\n  {}\n",
        q["role"].as_str().unwrap_or("job"),
        q["id"].as_str().unwrap_or_default(),
        q["question"].as_str().unwrap_or_default().replace('\n', "\n  ")
    );
    let options: Vec<&str> =
        q["options"].as_array().map(|o| o.iter().filter_map(|v| v.as_str()).collect()).unwrap_or_default();
    for (i, o) in options.iter().enumerate() {
        out.push_str(&format!("  {}. {o}\n", i + 1));
    }
    out.push_str(&format!(
        "  answer here ({}words, then Enter), or: flower answer {job} {}\n",
        if options.is_empty() { "" } else { "an option's number or " },
        if options.is_empty() { "TEXT" } else { "[--option N | TEXT]" }
    ));
    out
}

/// Read one line from the terminal and send it as the answer to `q`: a
/// number that names an option chooses it, anything else is the answer in
/// words. A question answered elsewhere first makes this one's send fail
/// harmlessly (FAILED_PRECONDITION, printed).
fn answer_at_terminal(mut client: Client, job: String, q: serde_json::Value) {
    // A thread of its own, not the runtime's blocking pool: the process may
    // end (the job ended) while it still waits for a line.
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line).is_ok() {
            let _ = tx.send(line);
        }
    });
    tokio::spawn(async move {
        let Ok(line) = rx.await else { return };
        let line = line.trim().to_string();
        if line.is_empty() {
            return;
        }
        let count = q["options"].as_array().map_or(0, Vec::len);
        let option = line.parse::<u32>().ok().filter(|n| (1..=count as u32).contains(n));
        let req = pb::AnswerRequest {
            job_id: job,
            question_id: q["id"].as_str().unwrap_or_default().to_string(),
            text: if option.is_some() { String::new() } else { line },
            option: option.unwrap_or(0),
        };
        match client.answer(req).await {
            Ok(_) => eprintln!("  answer sent"),
            Err(s) => eprintln!("  answer not taken: {}", s.message()),
        }
    });
}
