//! `flower bench launch`: what starting one tool through the launcher costs
//! — what a `Bash` call pays before and after its command: the launch's
//! control group made and joined, the namespaces, mounts, credentials,
//! Landlock, seccomp and resource limits put in force, the command (`true`)
//! run, the group killed and removed. Measured at the worker side, as the
//! `Bash` tool starts it (a tokio child process), beside the floor of
//! starting `true` directly, interleaved in the same run.

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use flower_worker::isolation::Launch;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::bench::median;

#[derive(Args)]
pub struct LaunchArgs {
    /// Launches per round
    #[arg(long, default_value_t = 200)]
    pub launches: usize,
    /// Rounds (the figures are medians of the rounds' percentiles)
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Print the figures as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub tools: super::isolation::ToolArgs,
}

/// One round's sorted times (ms): through the launcher, and started directly.
struct Round {
    launched: Vec<f64>,
    direct: Vec<f64>,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(idx.min(sorted.len().saturating_sub(1))).copied().unwrap_or(f64::NAN)
}

pub async fn launch(a: LaunchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.launches > 0 && a.rounds > 0, "--launches and --rounds: at least 1");
    let scratch = tempfile::tempdir()?;
    let work_root = scratch.path().join("work");
    let (probed, summary) = a.tools.launcher(&work_root, &[], &[])?;
    let launcher = probed.launcher();
    let task: PathBuf = work_root.join("task");
    std::fs::create_dir_all(&task)?;
    launcher.hand_over(&task).await.context("handing the task directory to the tool user")?;
    let group = match launcher.task_group("bench") {
        Some(lazy) => Some(lazy.get().await.context("the task's control group")?),
        None => None,
    };
    if !a.json {
        eprintln!("tool isolation: {summary}");
    }
    let bar = ProgressBar::new((a.launches * a.rounds) as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} launches {msg}")?);
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut rounds = Vec::new();
    for _ in 0..a.rounds {
        let (mut launched, mut direct) = (Vec::new(), Vec::new());
        for _ in 0..a.launches {
            let t = Instant::now();
            let leaf = group.as_ref().map(|g| g.leaf()).transpose()?;
            let mut cmd = launcher.command(
                &task,
                vec!["true".into()],
                &Launch { leaf: leaf.as_ref(), max_file_size: Some(64 << 20), egress: None },
                vec![("PATH".into(), flower_worker::isolation::TOOL_PATH.into())],
            );
            let status = cmd.stdin(Stdio::null()).status().await?;
            if let Some(leaf) = leaf {
                tokio::task::spawn_blocking(move || leaf.close()).await?;
            }
            launched.push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(status.success(), "a launch failed: {status}");
            let t = Instant::now();
            let status = tokio::process::Command::new("true").stdin(Stdio::null()).status().await?;
            direct.push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(status.success(), "`true` failed: {status}");
            bar.inc(1);
        }
        launched.sort_by(f64::total_cmp);
        direct.sort_by(f64::total_cmp);
        rounds.push(Round { launched, direct });
    }
    bar.finish_and_clear();
    let fig = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let out = json!({
        "isolation": summary,
        "launches": a.launches,
        "rounds": a.rounds,
        "launch_p50_ms": fig(&|r| pct(&r.launched, 0.5)),
        "launch_p90_ms": fig(&|r| pct(&r.launched, 0.9)),
        "launch_p99_ms": fig(&|r| pct(&r.launched, 0.99)),
        "direct_p50_ms": fig(&|r| pct(&r.direct, 0.5)),
        "round_p50s_ms": rounds.iter().map(|r| pct(&r.launched, 0.5)).collect::<Vec<_>>(),
    });
    if a.json {
        println!("{out}");
    } else {
        println!(
            "one tool launch: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms (medians of {} rounds of {}); `true` started directly: p50 {:.2} ms",
            out["launch_p50_ms"].as_f64().unwrap_or(f64::NAN),
            out["launch_p90_ms"].as_f64().unwrap_or(f64::NAN),
            out["launch_p99_ms"].as_f64().unwrap_or(f64::NAN),
            a.rounds,
            a.launches,
            out["direct_p50_ms"].as_f64().unwrap_or(f64::NAN),
        );
    }
    Ok(ExitCode::SUCCESS)
}
