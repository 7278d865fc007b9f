//! `flower cancel`, `flower interrupt`, `flower artifacts`: acting on a job of the service.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use flower_proto::v1 as pb;

use super::client::{ServerArgs, status_error};

#[derive(Args)]
pub struct CancelArgs {
    pub job: String,
    /// Why (recorded as the job's reason)
    #[arg(long, default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let mut c = args.server.connect().await?;
    let j =
        c.cancel(pb::CancelRequest { job_id: args.job, reason: args.reason }).await.map_err(status_error)?.into_inner();
    println!("job {} {}", j.id, j.state);
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct InterruptArgs {
    pub job: String,
    /// The message for the coordinator
    #[arg(long)]
    pub message: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub async fn interrupt(args: InterruptArgs) -> anyhow::Result<ExitCode> {
    let mut c = args.server.connect().await?;
    let j = c
        .interrupt(pb::InterruptRequest { job_id: args.job, message: args.message })
        .await
        .map_err(status_error)?
        .into_inner();
    println!("message sent to job {} ({})", j.id, j.state);
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct ArtifactsArgs {
    pub job: String,
    #[command(subcommand)]
    pub action: Option<ArtifactAction>,
    /// Print the list as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Subcommand)]
pub enum ArtifactAction {
    /// Download one workbench file (e.g. artifacts/report.md)
    Get {
        path: String,
        /// Write here instead of stdout
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

pub async fn artifacts(args: ArtifactsArgs) -> anyhow::Result<ExitCode> {
    let mut c = args.server.connect().await?;
    match args.action {
        None => {
            let list = c
                .list_artifacts(pb::ListArtifactsRequest { job_id: args.job })
                .await
                .map_err(status_error)?
                .into_inner();
            if args.json {
                let items: Vec<_> =
                    list.artifacts.iter().map(|a| serde_json::json!({"path": a.path, "size": a.size})).collect();
                println!("{}", serde_json::Value::Array(items));
            } else {
                for a in list.artifacts {
                    println!("{:>10}  {}", a.size, a.path);
                }
            }
        }
        Some(ArtifactAction::Get { path, output }) => {
            let mut stream = c
                .get_artifact(pb::GetArtifactRequest { job_id: args.job, path })
                .await
                .map_err(status_error)?
                .into_inner();
            let mut out: Box<dyn Write> = match &output {
                Some(p) => Box::new(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?),
                None => Box::new(std::io::stdout().lock()),
            };
            while let Some(chunk) = stream.message().await.map_err(status_error)? {
                out.write_all(&chunk.data)?;
            }
            out.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("reply").required(true).args(["text", "option"])))]
pub struct AnswerArgs {
    /// The job (full id, or a unique prefix for the embedded store)
    pub job: String,
    /// The answer in words
    pub text: Option<String>,
    /// Choose one of the question's options instead (from 1)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub option: Option<u32>,
    /// The question's id (the `question_asked` event's `id`); default: the one waiting
    #[arg(long)]
    pub question: Option<String>,
    /// Print the job's state as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `flower answer`: the user's answer to a question the job asked — over the
/// service with `--server`, else into the embedded store, where the running
/// `flower run` finds it.
pub async fn answer(home: PathBuf, args: AnswerArgs) -> anyhow::Result<ExitCode> {
    let state = if args.server.configured() {
        let mut c = args.server.connect().await?;
        let req = pb::AnswerRequest {
            job_id: args.job.clone(),
            question_id: args.question.clone().unwrap_or_default(),
            text: args.text.clone().unwrap_or_default(),
            option: args.option.unwrap_or(0),
        };
        c.answer(req).await.map_err(status_error)?.into_inner().state
    } else {
        use flower_coordinator::tools::ask::{Reply, answer};
        let store = super::open_store(&home)?;
        let job = super::resolve_job(store.as_ref(), &args.job).await?;
        let reply = match (&args.text, args.option) {
            (_, Some(n)) => Reply::Option(n),
            (Some(t), None) => Reply::Text(t.clone()),
            (None, None) => anyhow::bail!("give the answer, or --option N"),
        };
        answer(store.as_ref(), job, args.question.as_deref(), reply).await?;
        store.get_job(job).await?.state.to_string()
    };
    if args.json {
        println!("{}", serde_json::json!({"job_id": args.job, "state": state}));
    } else {
        println!("answer sent to job {} ({state})", args.job);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct AsideArgs {
    /// The job (full id, or a unique prefix for the embedded store)
    pub job: String,
    /// The side question ("what is it doing?")
    pub question: String,
    /// Print `{"answer", "session_id"}` as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `flower aside`: a side question answered by a read-only session from the
/// job's recent events and workbench; nothing enters the job's main thread.
pub async fn aside(home: PathBuf, args: AsideArgs) -> anyhow::Result<ExitCode> {
    let (answer, session) = if args.server.configured() {
        let mut c = args.server.connect().await?;
        let r = c
            .aside(pb::AsideRequest { job_id: args.job.clone(), question: args.question.clone() })
            .await
            .map_err(status_error)?
            .into_inner();
        (r.answer, r.session_id)
    } else {
        let runtime = flower_runtime::embedded::EmbeddedRuntime::open(&home)
            .with_context(|| format!("opening {}", home.display()))?;
        let store = runtime.store();
        let job = super::resolve_job(store.as_ref(), &args.job).await?;
        let a = runtime.aside(job, &args.question).await?;
        (a.answer, a.session.to_string())
    };
    if args.json {
        println!("{}", serde_json::json!({"answer": answer, "session_id": session}));
    } else {
        println!("{}", answer.trim_end());
    }
    Ok(ExitCode::SUCCESS)
}
