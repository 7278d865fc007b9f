//! `flower context JOB`: what entered the coordinator's context versus its
//! subagents', measured from the stored transcripts.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use flower_coordinator::context::{ContextReport, SessionView, report, svg};

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
    /// One session in detail (id or prefix, or `main`): resident tools with
    /// their token cost, the deferred index with what each withheld schema
    /// would cost, system prompt, history, loads, spills
    #[arg(long, conflicts_with = "baseline")]
    pub session: Option<String>,
    /// The `flower sim` server the job ran against (distributed mode): its
    /// cache audit is joined with the job's recorded rewrites, as `flower run`
    /// does with its in-process simulator
    #[arg(long, env = "FLOWER_SIM_AUDIT", value_name = "URL")]
    pub sim_audit: Option<String>,
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
    // `--session` shows one session and nothing else (it conflicts with `--baseline`).
    if let Some(wanted) = &args.session {
        let view = find_session(&main, wanted)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(view)?);
        } else {
            print_session(view);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let audit = match &args.sim_audit {
        Some(url) => Some(sim_audit(url, &main).await?),
        None => None,
    };
    if args.json {
        print_json(&main, base.as_ref(), audit.as_ref())?;
        return Ok(ExitCode::SUCCESS);
    }
    print_table(&main, base.as_ref());
    if let Some(a) = &audit {
        println!("{}", super::run::audit_line(a));
        for u in &a.unexplained {
            println!("  unexplained miss: {u}");
        }
    }
    // The per-session list only makes sense for one run; with a baseline the
    // table is the comparison.
    if base.is_none() {
        print_providers(&main);
        print_sessions(&main);
    }
    Ok(ExitCode::SUCCESS)
}

/// The one session `wanted` names: `main` is the coordinator's thread,
/// anything else an id prefix that must match exactly one session.
fn find_session<'a>(main: &'a ContextReport, wanted: &str) -> anyhow::Result<&'a SessionView> {
    let found: Vec<&SessionView> = main
        .sessions
        .iter()
        .filter(|s| if wanted == "main" { s.role == "coordinator" } else { s.session.starts_with(wanted) })
        .collect();
    match found.as_slice() {
        [one] => Ok(*one),
        [] => anyhow::bail!("no session `{wanted}` in job {}", main.job),
        _ => anyhow::bail!("`{wanted}` names {} sessions: give more of the id", found.len()),
    }
}

/// `--json`: the report itself, or `{"run", "baseline"}` when comparing, with
/// the simulator's cache audit added under `cache_audit` when asked for.
fn print_json(
    main: &ContextReport,
    base: Option<&ContextReport>,
    audit: Option<&flower_sim::audit::CacheAudit>,
) -> anyhow::Result<()> {
    let mut v = match base {
        Some(b) => serde_json::json!({"run": main, "baseline": b}),
        None => serde_json::to_value(main)?,
    };
    if let Some(a) = audit {
        v["cache_audit"] = serde_json::to_value(a)?;
    }
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

/// A cache rate as a percentage, `-` when no context tokens were reported.
fn rate(r: Option<f64>) -> String {
    r.map_or("-".to_string(), |x| format!("{:.1}%", x * 100.0))
}

/// The headline figures, one column for this run and one for the baseline.
fn print_table(main: &ContextReport, base: Option<&ContextReport>) {
    let cols: Vec<(&str, &ContextReport)> =
        std::iter::once(("this run", main)).chain(base.map(|b| ("baseline", b))).collect();
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
    row("workflow sessions / turns (clarify, judge, …)", &|r| {
        format!("{} / {}", r.workflow.sessions, r.workflow.turns)
    });
    row("main context: first → last (tokens)", &|r| format!("{} → {}", r.main_first_tokens, r.main_last_tokens));
    row("main context slope (tokens/turn)", &|r| format!("{:.0}", r.main_slope_tokens_per_turn));
    row("harness tokens per main turn (estimate)", &|r| format!("{:.0}", r.harness_tokens_per_turn_estimate));
    row("cache rate: main / subagents", &|r| format!("{} / {}", rate(r.main.cache_rate), rate(r.subagents.cache_rate)));
    row("spills / chars removed", &|r| format!("{} / {}", r.spills, r.spilled_chars));
    row("denials (main thread) / glances", &|r| format!("{} / {}", r.denials, r.glances));
    row("mandates: count / mean chars", &|r| {
        let n = r.mandate_chars.len();
        format!("{} / {}", n, r.mandate_chars.iter().sum::<usize>().checked_div(n).unwrap_or(0))
    });
    row("scripts: writes / runs", &|r| format!("{} / {}", r.script_writes, r.script_runs));
    row("largest spill-matched result in a context", &|r| r.largest_spill_matched_result.to_string());
    row("cache rate: job / estimated cost", &|r| {
        format!("{} / {}", rate(r.cache_rate), r.cost_usd.map_or("-".into(), |c| format!("${c:.4}")))
    });
    row("tools loaded / search misses / rewrites", &|r| {
        format!("{} / {} / {}", r.tools_loaded, r.search_misses, r.cache_rewrites.len())
    });
}

/// Usage and cache reads by provider, each with the rule its cache follows.
fn print_providers(main: &ContextReport) {
    if main.providers.is_empty() {
        return;
    }
    println!("\nproviders (each caches by its own rule):");
    println!(
        "  {:<10} {:<17} {:>8} {:>11} {:>11} {:>11} {:>7}  rule",
        "provider", "api", "sessions", "input", "cache read", "cache write", "cache"
    );
    for p in &main.providers {
        println!(
            "  {:<10} {:<17} {:>8} {:>11} {:>11} {:>11} {:>7}  {}",
            p.provider,
            p.api,
            p.sessions,
            p.usage.input_tokens,
            p.usage.cache_read_input_tokens,
            p.usage.cache_creation_input_tokens,
            rate(p.cache_rate),
            p.cache_rule
        );
    }
}

/// Every session of the job, one line each, pointing at `--session` for detail.
fn print_sessions(main: &ContextReport) {
    println!("\nsessions (flower context {} --session ID for one in detail):", &main.job[..8.min(main.job.len())]);
    println!(
        "  {:<10} {:<12} {:<14} {:<17} {:>6} {:>9} {:>7} {:>14} {:>14} {:>7}",
        "session", "role", "label", "provider", "turns", "history", "cache", "resident/tok", "deferred/index", "loaded"
    );
    for s in &main.sessions {
        println!(
            "  {:<10} {:<12} {:<14} {:<17} {:>6} {:>9} {:>7} {:>14} {:>14} {:>7}",
            &s.session[..8],
            s.role,
            truncate(&s.label, 14),
            if s.api == "chat_completions" { format!("{} (chat)", s.provider) } else { s.provider.clone() },
            s.turns,
            s.history_tokens,
            rate(s.cache_rate),
            format!("{}/{}", s.resident.len(), s.tool_tokens),
            format!("{}/{}", s.deferred.len(), s.index_tokens),
            s.loaded.len()
        );
    }
}

/// The simulator's audit of this job's sessions, joined with its rewrites.
async fn sim_audit(url: &str, report: &ContextReport) -> anyhow::Result<flower_sim::audit::CacheAudit> {
    let mut records = flower_runtime::audit::fetch(url).await.map_err(|e| anyhow::anyhow!("--sim-audit {url}: {e}"))?;
    records.retain(|session, _| report.sessions.iter().any(|s| &s.session == session));
    Ok(flower_sim::audit::join(&records, &report.rewrites()))
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { s.chars().take(n - 1).chain(['…']).collect() }
}

fn print_session(v: &SessionView) {
    let rate = v.cache_rate.map_or("-".to_string(), |x| format!("{:.1}%", x * 100.0));
    println!("session {} — {} `{}`", v.session, v.role, v.label);
    println!("  turns {} · history {} tokens (last request, reported) · cache rate {rate}", v.turns, v.history_tokens);
    println!(
        "  tool deferral {} · tool block {} tokens (resident schemas {} + index {}) · system prompt {} tokens (estimates)",
        if v.deferral { "on" } else { "off" },
        v.tool_block_tokens(),
        v.tool_tokens,
        v.index_tokens,
        v.system_tokens
    );
    println!("\n  resident tools ({}):", v.resident.len());
    for t in &v.resident {
        println!("    {:<48} {:>6} tokens", t.name, t.tokens);
    }
    if !v.deferred.is_empty() {
        let withheld: u64 = v.deferred.iter().map(|t| t.tokens).sum();
        println!("\n  deferred tools ({}; their schemas would cost {withheld} tokens):", v.deferred.len());
        let mut heading = "";
        for t in &v.deferred {
            if t.category != heading {
                heading = &t.category;
                println!("    ## {heading}");
            }
            let mark = if v.loaded.iter().any(|(n, _)| n == &t.name) { " (loaded)" } else { "" };
            println!("    {:<48} {:>6} tokens{mark}", t.name, t.tokens);
        }
    }
    if !v.loaded.is_empty() {
        println!("\n  loaded during the run:");
        for (name, trigger) in &v.loaded {
            println!("    {name} ({trigger})");
        }
    }
    for q in &v.search_misses {
        println!("  search miss: \"{q}\"");
    }
    println!("  spills: {}", v.spills);
}
