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
    /// The namespace to list (default: the credential's; an admin's: every namespace)
    #[arg(long, env = "FLOWER_NAMESPACE", default_value = "")]
    pub namespace: String,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: super::client::ServerArgs,
}

pub async fn run(home: std::path::PathBuf, args: StatusArgs) -> anyhow::Result<ExitCode> {
    if args.server.configured() {
        return remote(args).await;
    }
    let store = open_store(&home)?;
    let jobs = match &args.job {
        Some(id) => vec![store.get_job(resolve_job(store.as_ref(), id).await?).await?],
        None => {
            store.list_jobs(Some(&args.namespace).filter(|n| !n.is_empty()).map(String::as_str), args.limit).await?
        }
    };
    // One job: its workflow record too (lineage, steps, verdicts, questions).
    let record = match (&args.job, jobs.first()) {
        (Some(_), Some(j)) => Some(flower_coordinator::record::workflow(store.as_ref(), j.id).await?),
        _ => None,
    };
    if args.json {
        let out: Vec<serde_json::Value> = jobs
            .iter()
            .map(|j| {
                let mut v = serde_json::json!({
                    "id": j.id, "name": j.name, "state": j.state, "reason": j.reason,
                    "final_answer": j.final_answer, "usage": j.usage,
                    "created_at": j.created_at, "updated_at": j.updated_at, "continues": j.continues,
                    "namespace": j.namespace, "submitted_by": j.submitted_by,
                });
                if let Some(record) = &record {
                    merge(&mut v, record);
                }
                v
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
    for line in record.iter().flat_map(|r| r.lines()) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The workflow record's fields beside the job's own.
fn merge(job: &mut serde_json::Value, record: &flower_coordinator::record::Record) {
    if let (Some(out), Ok(serde_json::Value::Object(fields))) = (job.as_object_mut(), serde_json::to_value(record)) {
        out.extend(fields);
    }
}

/// `flower status` against the service.
async fn remote(args: StatusArgs) -> anyhow::Result<ExitCode> {
    use flower_proto::v1 as pb;
    let mut c = args.server.connect().await?;
    let jobs = match &args.job {
        Some(id) => {
            vec![c.get(pb::GetRequest { job_id: id.clone() }).await.map_err(super::client::status_error)?.into_inner()]
        }
        None => {
            c.list(pb::ListRequest { limit: args.limit, page_token: String::new(), namespace: args.namespace.clone() })
                .await
                .map_err(super::client::status_error)?
                .into_inner()
                .jobs
        }
    };
    // One job: its workflow record too.
    let record = match &args.job {
        Some(_) => {
            let r = c
                .get_workflow(pb::GetWorkflowRequest { job_id: jobs[0].id.clone() })
                .await
                .map_err(super::client::status_error)?
                .into_inner();
            Some(serde_json::from_str::<flower_coordinator::record::Record>(&r.record_json)?)
        }
        None => None,
    };
    let to_json = |j: &pb::Job| {
        let u = j.usage.unwrap_or_default();
        serde_json::json!({
            "id": j.id, "name": j.name, "state": j.state, "reason": j.reason, "final_answer": j.final_answer,
            "usage": {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                      "cache_creation_input_tokens": u.cache_creation_input_tokens, "cache_read_input_tokens": u.cache_read_input_tokens},
            "created_at": j.created_at_ms, "updated_at": j.updated_at_ms,
            "continues": (!j.continues_job_id.is_empty())
                .then(|| serde_json::json!({"parent": j.continues_job_id, "instruction": j.instruction})),
            "namespace": j.namespace, "submitted_by": j.submitted_by,
        })
    };
    if args.json {
        let value = if let Some(record) = &record {
            let mut v = to_json(&jobs[0]);
            merge(&mut v, record);
            v
        } else {
            serde_json::Value::Array(jobs.iter().map(to_json).collect())
        };
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(ExitCode::SUCCESS);
    }
    for j in &jobs {
        let u = j.usage.unwrap_or_default();
        println!(
            "{}  {:<10} {:<24} tokens {:>7} in {:>7} out{}",
            j.id,
            j.state,
            j.name,
            human_count(u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens),
            human_count(u.output_tokens),
            if j.reason.is_empty() { String::new() } else { format!("  ({})", j.reason) }
        );
    }
    for line in record.iter().flat_map(|r| r.lines()) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
