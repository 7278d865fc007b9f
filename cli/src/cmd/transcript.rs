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
    let TranscriptCommand::Show(args) = cmd;
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
            let p = flower_store::prune::prune(&entries, &policy);
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
