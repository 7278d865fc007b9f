//! `flower status`: jobs of the embedded store.

use std::process::ExitCode;

use clap::Args;

use super::{human_count, open_store, resolve_job};

#[derive(Args)]
pub struct StatusArgs {
    /// A job id (or unique prefix); without one, the most recent jobs
    pub job: Option<String>,
    /// How many jobs to list
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub async fn run(home: std::path::PathBuf, args: StatusArgs) -> anyhow::Result<ExitCode> {
    let store = open_store(&home)?;
    let jobs = match &args.job {
        Some(id) => vec![store.get_job(resolve_job(store.as_ref(), id).await?).await?],
        None => store.list_jobs(args.limit).await?,
    };
    if args.json {
        let out: Vec<serde_json::Value> = jobs
            .iter()
            .map(|j| {
                serde_json::json!({
                    "id": j.id, "name": j.name, "state": j.state, "reason": j.reason,
                    "final_answer": j.final_answer, "usage": j.usage,
                    "created_at": j.created_at, "updated_at": j.updated_at,
                })
            })
            .collect();
        let value =
            if args.job.is_some() { out.into_iter().next().unwrap_or_default() } else { serde_json::Value::Array(out) };
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(ExitCode::SUCCESS);
    }
    if jobs.is_empty() {
        println!("no jobs yet");
    }
    for j in &jobs {
        let tasks = store.tasks(j.id).await?;
        println!(
            "{}  {:<10} {:<24} tasks {:>3}  tokens {:>7} in {:>7} out{}",
            j.id,
            j.state.as_str(),
            j.name,
            tasks.len(),
            human_count(j.usage.context_tokens()),
            human_count(j.usage.output_tokens),
            j.reason.as_deref().map(|r| format!("  ({r})")).unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}
