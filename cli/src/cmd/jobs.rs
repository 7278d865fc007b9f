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
