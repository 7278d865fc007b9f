//! `flower transcript show`: the coordinator's main thread and each
//! subagent's transcript, separately.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use flower_model::content::result_text;
use flower_model::{ContentBlock, Entry, Session, SessionId};

use super::{open_store, resolve_job};

#[derive(Subcommand)]
pub enum TranscriptCommand {
    /// Show a job's transcripts, one session after another
    Show(ShowArgs),
    /// Write a job's transcripts in the Claude Code session-file shape (JSONL)
    Export(ExportArgs),
    /// Read a Claude Code session file (JSONL) into the embedded store; prints the id
    /// to use with `flower transcript show ID --pruned`
    Import(ImportArgs),
}

#[derive(Args)]
pub struct ExportArgs {
    /// The job id (or a unique prefix)
    pub job: String,
    /// Only this session (id or unique prefix)
    #[arg(long)]
    pub session: Option<String>,
    /// Write here instead of stdout
    #[arg(short, long)]
    pub output: Option<std::path::PathBuf>,
}

#[derive(Args)]
pub struct ImportArgs {
    /// The session file (JSONL)
    pub file: std::path::PathBuf,
    /// Print `{"job_id": …, "sessions": […], "entries": N, "skipped": […]}`
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ShowArgs {
    /// The job id (or a unique prefix)
    pub job: String,
    /// Only this session (id or unique prefix; see the session headers)
    #[arg(long)]
    pub session: Option<String>,
    /// Print JSON: `{"job": …, "sessions": [{…, "entries": […]}]}`
    #[arg(long)]
    pub json: bool,
    /// Show exactly the history the model would receive on resume (the pruning
    /// loader's copy), with what each rule changed; stored rows are untouched
    #[arg(long)]
    pub pruned: bool,
    /// Characters of each text shown (0: everything)
    #[arg(long, default_value_t = 600)]
    pub width: usize,
    #[command(flatten)]
    pub server: super::client::ServerArgs,
}

pub async fn run(home: std::path::PathBuf, cmd: TranscriptCommand) -> anyhow::Result<ExitCode> {
    let args = match cmd {
        TranscriptCommand::Show(args) => args,
        TranscriptCommand::Export(args) => return export(home, args).await,
        TranscriptCommand::Import(args) => return import(home, args).await,
    };
    let (job, mut sessions, store) = if args.server.configured() {
        let (job, sessions) = remote_sessions(&args).await?;
        (job, sessions, None)
    } else {
        let store = open_store(&home)?;
        let job = resolve_job(store.as_ref(), &args.job).await?;
        let sessions = store.sessions(job).await?;
        (job, sessions, Some(store))
    };
    if let Some(want) = &args.session {
        let want = want.to_lowercase();
        sessions.retain(|s| s.id.to_string().starts_with(&want));
        anyhow::ensure!(!sessions.is_empty(), "job {job} has no session `{want}`");
        anyhow::ensure!(sessions.len() == 1, "`{want}` matches several sessions; give more of the id");
    }
    // The job's pruning policy (remote: the defaults; the API does not serve specs).
    let policy = match &store {
        Some(store) => flower_model::JobSpec::from_value(store.get_job(job).await?.spec)
            .map(|s| s.runtime.pruning)
            .unwrap_or_default(),
        None => Default::default(),
    };
    let mut out = Vec::new();
    let mut changes = Vec::new();
    for s in &sessions {
        let mut entries = match &store {
            Some(store) => store.entries(s.id, 0, u32::MAX).await?,
            None => remote_entries(&args, job, s.id).await?,
        };
        if args.pruned {
            let p = flower_store::prune::prune(entries, &policy, &flower_agent::glance::allows);
            entries = p.entries;
            changes.push(p.changes);
        } else {
            changes.push(Vec::new());
        }
        out.push((s.clone(), entries));
    }
    if args.json {
        let sessions: Vec<serde_json::Value> = out
            .iter()
            .zip(&changes)
            .map(|((s, entries), changes)| {
                serde_json::json!({
                    "session": s.id, "role": s.role, "label": s.label, "task_id": s.task_id,
                    "entries": entries, "pruning": changes,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"job": job, "sessions": sessions}))?);
        return Ok(ExitCode::SUCCESS);
    }
    for ((s, entries), changes) in out.iter().zip(&changes) {
        print_session(s, entries, args.width);
        if args.pruned {
            if changes.is_empty() {
                println!("  (pruning changed nothing)\n");
            }
            for c in changes {
                println!("  pruned [{}] {}", c.rule, c.detail);
            }
            if !changes.is_empty() {
                println!();
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn remote_sessions(args: &ShowArgs) -> anyhow::Result<(flower_model::JobId, Vec<Session>)> {
    use flower_proto::v1 as pb;
    let mut c = args.server.connect().await?;
    let req = pb::GetTranscriptRequest { job_id: args.job.clone(), ..Default::default() };
    let resp = c.get_transcript(req).await.map_err(super::client::status_error)?.into_inner();
    let job: flower_model::JobId = args.job.parse()?;
    let sessions = resp
        .sessions
        .into_iter()
        .map(|s| {
            Ok(Session {
                id: s.id.parse()?,
                job_id: job,
                role: s.role.parse()?,
                label: s.label,
                task_id: if s.task_id.is_empty() { None } else { Some(s.task_id.parse()?) },
                created_at: 0,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok((job, sessions))
}

/// Every entry of a session, page by page.
async fn remote_entries(args: &ShowArgs, job: flower_model::JobId, session: SessionId) -> anyhow::Result<Vec<Entry>> {
    use flower_proto::v1 as pb;
    let mut c = args.server.connect().await?;
    let mut out: Vec<Entry> = Vec::new();
    let mut after = 0;
    loop {
        let req = pb::GetTranscriptRequest {
            job_id: job.to_string(),
            session_id: session.to_string(),
            after_seq: after,
            limit: 500,
        };
        let page = c.get_transcript(req).await.map_err(super::client::status_error)?.into_inner();
        if page.entries_json.is_empty() {
            return Ok(out);
        }
        for e in &page.entries_json {
            out.push(serde_json::from_str(e)?);
        }
        after = page.next_after_seq;
    }
}

fn cut(s: &str, width: usize) -> String {
    let s = s.trim_end().trim_start_matches('\n');
    if width == 0 || s.chars().count() <= width {
        return s.to_string();
    }
    let head: String = s.chars().take(width).collect();
    format!("{head}… [{} more chars]", s.chars().count() - width)
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("      {l}")).collect::<Vec<_>>().join("\n")
}

fn short(id: SessionId) -> String {
    id.to_string()[..8].to_string()
}

fn print_session(s: &Session, entries: &[Entry], width: usize) {
    let chars: usize = entries.iter().map(Entry::body_chars).sum();
    let task = s.task_id.map(|t| format!(", task {}", &t.to_string()[..8])).unwrap_or_default();
    println!(
        "== {} `{}` — session {}{task} — {} entries, {chars} chars",
        s.role.as_str(),
        s.label,
        short(s.id),
        entries.len()
    );
    for e in entries {
        let mut marks = Vec::new();
        if let Some(d) = &e.markers.denial_kind {
            marks.push(format!("denied:{d}"));
        }
        if e.markers.synthetic_error {
            marks.push("synthetic".into());
        }
        if e.markers.interrupted {
            marks.push("interrupted".into());
        }
        if let Some(eph) = e.markers.ephemeral {
            marks.push(format!("ephemeral:{eph}"));
        }
        let marks = if marks.is_empty() { String::new() } else { format!(" [{}]", marks.join(", ")) };
        let usage =
            e.usage.map(|u| format!(" ({} in, {} out)", u.context_tokens(), u.output_tokens)).unwrap_or_default();
        println!("  #{} {:?}{usage}{marks}", e.seq, e.kind);
        for b in &e.content {
            match b {
                ContentBlock::Text { text } => println!("{}", indent(&cut(text, width))),
                ContentBlock::ToolUse { name, input, id } => {
                    println!("      → {name} {} ({id})", cut(&input.to_string(), width))
                }
                ContentBlock::ToolResult { content, is_error, tool_use_id } => {
                    let tag = if *is_error { "error result" } else { "result" };
                    println!("      ← {tag} for {tool_use_id}:\n{}", indent(&cut(&result_text(content), width)));
                }
                ContentBlock::Image { .. } => println!("      [image]"),
                ContentBlock::Thinking { thinking, .. } => println!("      (thinking) {}", cut(thinking, width)),
            }
        }
    }
    println!();
}

async fn export(home: std::path::PathBuf, args: ExportArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let store = open_store(&home)?;
    let job = resolve_job(store.as_ref(), &args.job).await?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(std::fs::File::create(p)?),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut found = false;
    for s in store.sessions(job).await? {
        if args.session.as_ref().is_some_and(|want| !s.id.to_string().starts_with(&want.to_lowercase())) {
            continue;
        }
        found = true;
        for e in store.entries(s.id, 0, u32::MAX).await? {
            let line = flower_model::session_file::export_line(&e, s.role == flower_model::Role::Worker);
            writeln!(out, "{line}")?;
        }
    }
    anyhow::ensure!(found, "no session to export");
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

async fn import(home: std::path::PathBuf, args: ImportArgs) -> anyhow::Result<ExitCode> {
    use flower_model::{JobId, JobState, Role, SessionId, now_ms};
    let text = std::fs::read_to_string(&args.file)?;
    std::fs::create_dir_all(&home)?;
    let store = flower_store::SqliteStore::open(&home.join("flower.db"))?;
    let (job, main, side) = (JobId::random(), SessionId::random(), SessionId::random());
    let mut imported = flower_model::session_file::import(&text, job, main, side);
    // The pruning loader expires glances by the verdict recorded on their results.
    for entries in [&mut imported.main, &mut imported.sidechain] {
        flower_model::session_file::record_bash_verdicts(entries, &flower_agent::glance::allows);
    }
    anyhow::ensure!(
        !imported.main.is_empty() || !imported.sidechain.is_empty(),
        "no transcript entries in {}",
        args.file.display()
    );
    use flower_store::Store;
    let name =
        format!("import: {}", args.file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    store
        .create_job(flower_store::NewJob::new(
            job,
            name.clone(),
            serde_json::json!({"imported_from": args.file.display().to_string()}),
        ))
        .await?;
    let mut sessions = Vec::new();
    for (id, role, entries) in [(main, Role::Coordinator, &imported.main), (side, Role::Worker, &imported.sidechain)] {
        if entries.is_empty() {
            continue;
        }
        let label = if role == Role::Coordinator { "main".to_string() } else { "sidechain".to_string() };
        store
            .create_session(flower_model::Session { id, job_id: job, role, label, task_id: None, created_at: now_ms() })
            .await?;
        store.append(flower_store::Batch { entries: entries.clone(), ..Default::default() }).await?;
        sessions.push(id);
    }
    let reason = Some(format!("imported from {}", args.file.display()));
    store.set_job_state(job, JobState::Succeeded, reason, None, None).await?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "job_id": job, "sessions": sessions,
                "entries": imported.main.len() + imported.sidechain.len(),
                "skipped": imported.skipped.iter().map(|(n, why)| serde_json::json!({"line": n, "why": why})).collect::<Vec<_>>(),
            })
        );
    } else {
        println!("{job}");
        eprintln!(
            "imported {} entries ({} skipped lines); see: flower transcript show {} --pruned",
            imported.main.len() + imported.sidechain.len(),
            imported.skipped.len(),
            &job.to_string()[..8]
        );
    }
    Ok(ExitCode::SUCCESS)
}
