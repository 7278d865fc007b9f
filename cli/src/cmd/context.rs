//! `flower context JOB`: what entered the coordinator's context versus its
//! subagents', measured from the stored transcripts.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use flower_coordinator::context::{ContextReport, report, svg};

use super::{open_store, resolve_job};

#[derive(Args)]
pub struct ContextArgs {
    /// The job id (or unique prefix)
    pub job: String,
    /// Print the report as JSON (`main`, `subagents`, …)
    #[arg(long)]
    pub json: bool,
    /// Draw the main thread's context per step to this SVG file
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Another job (e.g. the same script with layers off) to compare with, side by side
    #[arg(long)]
    pub baseline: Option<String>,
    #[command(flatten)]
    pub server: super::client::ServerArgs,
}

async fn load(home: &std::path::Path, args: &ContextArgs, job: &str) -> anyhow::Result<ContextReport> {
    if args.server.configured() {
        let mut c = args.server.connect().await?;
        let resp = c
            .get_context(flower_proto::v1::GetContextRequest { job_id: job.to_string() })
            .await
            .map_err(super::client::status_error)?
            .into_inner();
        return Ok(serde_json::from_str(&resp.report_json)?);
    }
    let store = open_store(home)?;
    let id = resolve_job(store.as_ref(), job).await?;
    Ok(report(store.as_ref(), id).await?)
}

pub async fn run(home: PathBuf, args: ContextArgs) -> anyhow::Result<ExitCode> {
    let main = load(&home, &args, &args.job).await?;
    let base = match &args.baseline {
        Some(b) => Some(load(&home, &args, b).await?),
        None => None,
    };
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&main, base.as_ref()))?;
    }
    if args.json {
        let v = match &base {
            Some(b) => serde_json::json!({"run": main, "baseline": b}),
            None => serde_json::to_value(&main)?,
        };
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    let cols: Vec<(&str, &ContextReport)> =
        std::iter::once(("this run", &main)).chain(base.iter().map(|b| ("baseline", b))).collect();
    let row = |label: &str, f: &dyn Fn(&ContextReport) -> String| {
        let cells: Vec<String> = cols.iter().map(|(_, r)| format!("{:>22}", f(r))).collect();
        println!("{label:<46}{}", cells.join(""));
    };
    let heads: Vec<String> = cols.iter().map(|(n, _)| format!("{n:>22}")).collect();
    println!("{:<46}{}", "", heads.join(""));
    row("main thread: turns / subagents: turns", &|r| format!("{} / {}", r.main.turns, r.subagents.turns));
    row("main thread: body chars / subagents", &|r| format!("{} / {}", r.main.body_chars, r.subagents.body_chars));
    row("main thread: tool calls / subagents", &|r| format!("{} / {}", r.main.tool_calls, r.subagents.tool_calls));
    row("subagent sessions", &|r| r.subagents.sessions.to_string());
    row("main context: first → last (tokens)", &|r| format!("{} → {}", r.main_first_tokens, r.main_last_tokens));
    row("main context slope (tokens/turn)", &|r| format!("{:.0}", r.main_slope_tokens_per_turn));
    row("harness tokens per main turn (estimate)", &|r| format!("{:.0}", r.harness_tokens_per_turn_estimate));
    let rate = |r: Option<f64>| r.map_or("-".to_string(), |x| format!("{:.1}%", x * 100.0));
    row("cache rate: main / subagents", &|r| format!("{} / {}", rate(r.main.cache_rate), rate(r.subagents.cache_rate)));
    row("spills / chars removed", &|r| format!("{} / {}", r.spills, r.spilled_chars));
    row("denials (main thread) / glances", &|r| format!("{} / {}", r.denials, r.glances));
    row("mandates: count / mean chars", &|r| {
        let n = r.mandate_chars.len();
        format!("{} / {}", n, r.mandate_chars.iter().sum::<usize>().checked_div(n).unwrap_or(0))
    });
    row("scripts: writes / runs", &|r| format!("{} / {}", r.script_writes, r.script_runs));
    row("largest spill-matched result in a context", &|r| r.largest_spill_matched_result.to_string());
    Ok(ExitCode::SUCCESS)
}
