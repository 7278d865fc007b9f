//! `flower run` and `flower demo`: one job in this process, with live progress
//! on stderr and a summary at the end.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use flower_bus::{Heard, Notifier};
use flower_model::{EventKind, JobId, JobSpec, JobState};
use flower_runtime::{EmbeddedRuntime, RunSummary};
use flower_store::Store;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio_util::sync::CancellationToken;

use super::human_count;

#[derive(Args)]
pub struct RunArgs {
    /// The job spec (YAML or JSON)
    #[arg(required_unless_present = "resume")]
    pub spec: Option<PathBuf>,
    /// Continue this job (id or unique prefix), whose process died, from its stored state
    #[arg(long, conflicts_with = "spec", conflicts_with = "workspace")]
    pub resume: Option<String>,
    /// Directory the tasks work on (overrides the spec's `workspace`)
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Print the summary as JSON on stdout, and no progress
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub overrides: super::SpecOverrides,
    #[command(flatten)]
    pub tools: super::isolation::ToolArgs,
    #[command(flatten)]
    pub policy: super::isolation::PolicyArgs,
    /// Set by `flower continue`: the finished job and the new instruction.
    #[arg(skip)]
    pub continues: Option<(String, String)>,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Print the summary as JSON on stdout, and no progress
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub overrides: super::SpecOverrides,
    #[command(flatten)]
    pub tools: super::isolation::ToolArgs,
    #[command(flatten)]
    pub policy: super::isolation::PolicyArgs,
}

/// The bundled demo, in the source tree.
const DEMO_SPEC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/demo/job.yaml");

pub async fn demo(home: PathBuf, args: DemoArgs) -> anyhow::Result<ExitCode> {
    let spec = PathBuf::from(DEMO_SPEC);
    anyhow::ensure!(
        spec.exists(),
        "the demo lives in the source tree ({}); run `flower run examples/demo/job.yaml` from a checkout",
        spec.display()
    );
    run(
        home,
        RunArgs {
            spec: Some(spec),
            resume: None,
            workspace: None,
            json: args.json,
            overrides: args.overrides,
            tools: args.tools,
            policy: args.policy,
            continues: None,
        },
    )
    .await
}

#[derive(Args)]
pub struct ContinueArgs {
    /// The finished job (full id; a unique prefix for the embedded store)
    pub job: String,
    /// What to do now ("also do X")
    pub instruction: String,
    /// With --server: repeating a continue with the same key returns the first continuation
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Print JSON on stdout (the run's summary; with --server `{job_id, existing}`), and no progress
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: super::client::ServerArgs,
    #[command(flatten)]
    pub tools: super::isolation::ToolArgs,
    #[command(flatten)]
    pub policy: super::isolation::PolicyArgs,
}

/// `flower continue`: a finished job goes on with a new instruction, as a new
/// job naming it (its lineage). With --server the service runs it (follow it
/// with `flower watch`); else it runs here, like `flower run`.
pub async fn continue_job(home: PathBuf, args: ContinueArgs) -> anyhow::Result<ExitCode> {
    if args.server.configured() {
        use flower_proto::v1 as pb;
        let mut c = args.server.connect().await?;
        let r = c
            .r#continue(pb::ContinueRequest {
                job_id: args.job.clone(),
                instruction: args.instruction,
                idempotency_key: args.idempotency_key.unwrap_or_default(),
            })
            .await
            .map_err(super::client::status_error)?
            .into_inner();
        if args.json {
            println!("{}", serde_json::json!({"job_id": r.job_id, "existing": r.existing, "continues": args.job}));
        } else {
            println!("{}", r.job_id);
            eprintln!(
                "job {} continues {}{}; follow it with: flower watch {}",
                r.job_id,
                args.job,
                if r.existing { " (already submitted with this key)" } else { "" },
                r.job_id
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    anyhow::ensure!(args.idempotency_key.is_none(), "--idempotency-key needs --server");
    run(
        home,
        RunArgs {
            spec: None,
            resume: None,
            workspace: None,
            json: args.json,
            overrides: Default::default(),
            tools: args.tools,
            policy: args.policy,
            continues: Some((args.job, args.instruction)),
        },
    )
    .await
}

pub async fn run(home: PathBuf, args: RunArgs) -> anyhow::Result<ExitCode> {
    let policy = args.policy.policy(&super::isolation::service_credentials(&[]))?;
    // An invalid spec fails here, before anything runs or is created.
    let spec = match &args.spec {
        Some(path) => match checked_spec(path, &args, &policy)? {
            Ok(spec) => Some(spec),
            Err(code) => return Ok(code),
        },
        None => None,
    };
    let runtime = EmbeddedRuntime::open(&home).with_context(|| format!("opening {}", home.display()))?;
    // The home (database, objects, other jobs' task directories) is hidden from tools.
    let (tools, _) = args.tools.setup(&runtime.home().join("work"), &[runtime.home().to_path_buf()], &[], policy)?;
    let started = Instant::now();
    let (job, name, start) = match the_job(&runtime, spec, &args).await? {
        Ok(picked) => picked,
        Err(code) => return Ok(code),
    };
    let cancel = cancel_on_ctrl_c();
    let progress = (!args.json).then(|| {
        let p = Progress::new(&name, job);
        tokio::spawn(p.follow(runtime.store(), runtime.notifier()))
    });
    let summary = match start {
        Start::Resume => runtime.resume(job, &tools, cancel).await,
        Start::Fresh => runtime.run(job, &tools, cancel).await,
    };
    if let Some(p) = progress {
        p.abort();
        let _ = p.await;
    }
    let summary = summary?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_summary(&summary, started.elapsed());
    }
    Ok(if summary.state == JobState::Succeeded { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The spec file at `path` with the command line's overrides, checked
/// against its scenario, the operator's policy and `--workspace`.
/// `Err(code)`: refused, the error printed.
fn checked_spec(
    path: &Path,
    args: &RunArgs,
    policy: &flower_model::policy::ToolPolicy,
) -> anyhow::Result<Result<JobSpec, ExitCode>> {
    let mut spec = match JobSpec::load(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {}: {e}", path.display());
            return Ok(Err(ExitCode::from(2)));
        }
    };
    if let Some(scenario) = &spec.scenario
        && let Err(e) = flower_sim::Scenario::load(scenario)
    {
        eprintln!("error: {}: scenario {}: {e}", path.display(), scenario.display());
        return Ok(Err(ExitCode::from(2)));
    }
    if let Some(w) = &args.workspace {
        anyhow::ensure!(w.is_dir(), "--workspace {}: not a directory", w.display());
    }
    args.overrides.apply(&mut spec);
    if let Err(e) = spec.validate().and_then(|()| policy.check(&spec)) {
        eprintln!("error: {}: {e}", path.display());
        return Ok(Err(ExitCode::from(2)));
    }
    Ok(Ok(spec))
}

/// Whether a run starts its job or resumes it.
enum Start {
    Fresh,
    Resume,
}

/// The job this run runs, with its name: the one `--resume` names (not
/// ended yet), a new one from `spec`, or the continuation `flower continue`
/// asks for. `Err(code)`: refused, the error printed.
async fn the_job(
    runtime: &EmbeddedRuntime,
    spec: Option<JobSpec>,
    args: &RunArgs,
) -> anyhow::Result<Result<(JobId, String, Start), ExitCode>> {
    Ok(Ok(match (spec, &args.resume) {
        (_, Some(id)) => {
            let job = runtime.store().resolve_job(id).await?;
            let found = runtime.store().get_job(job).await?;
            if found.state.is_terminal() {
                eprintln!("error: job {job} already {}; nothing to resume", found.state);
                return Ok(Err(ExitCode::from(2)));
            }
            (job, found.name, Start::Resume)
        }
        (Some(spec), None) => {
            (runtime.submit(&spec, args.workspace.as_deref()).await?, spec.name.clone(), Start::Fresh)
        }
        (None, None) => match &args.continues {
            Some((parent, instruction)) => {
                let parent = runtime.store().resolve_job(parent).await?;
                let job = runtime.continue_job(parent, instruction).await?;
                eprintln!("job {job} continues {parent}");
                (job, runtime.store().get_job(job).await?.name, Start::Fresh)
            }
            None => anyhow::bail!("give a job spec, or --resume JOB"),
        },
    }))
}

/// A token cancelled by the first Ctrl-C (the job is cancelled cleanly); a
/// second one aborts the process.
fn cancel_on_ctrl_c() -> CancellationToken {
    let cancel = CancellationToken::new();
    let on_ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\ncancelling the job (Ctrl-C again to abort)…");
            on_ctrl_c.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
    cancel
}

fn print_summary(s: &RunSummary, took: Duration) {
    let short = &s.job_id.to_string()[..8];
    eprintln!();
    println!("job {short} ({}) {} in {:.1}s", s.name, s.state, took.as_secs_f64());
    if let Some(r) = &s.reason {
        println!("  reason: {r}");
    }
    println!(
        "  coordinator turns: {} · tasks: {} ({} succeeded, {} failed) · tokens: {} in, {} cache read, {} out",
        s.coordinator_turns,
        s.tasks,
        s.tasks_succeeded,
        s.tasks_failed,
        human_count(s.usage.input_tokens + s.usage.cache_creation_input_tokens),
        human_count(s.usage.cache_read_input_tokens),
        human_count(s.usage.output_tokens)
    );
    let c = &s.context;
    println!(
        "  main thread: {} turns, context {} → {} tokens ({:.0}/turn) · subagents: {} sessions, {} turns · {} spills ({} chars kept out) · {} denials",
        c.main.turns,
        c.main_first_tokens,
        c.main_last_tokens,
        c.main_slope_tokens_per_turn,
        c.subagents.sessions,
        c.subagents.turns,
        c.spills,
        c.spilled_chars,
        c.denials
    );
    let pct = |r: Option<f64>| r.map_or("-".to_string(), |x| format!("{:.1}%", x * 100.0));
    println!(
        "  prompt cache: {} (main {}, subagents {}) · cost {} · tools loaded: {}, search misses: {}, deliberate rewrites: {}",
        pct(c.cache_rate),
        pct(c.main.cache_rate),
        pct(c.subagents.cache_rate),
        c.cost_usd.map_or("-".to_string(), |x| format!("${x:.4}")),
        c.tools_loaded,
        c.search_misses,
        c.cache_rewrites.len()
    );
    if let Some(a) = &s.cache_audit {
        println!("  {}", audit_line(a));
    }
    println!(
        "  transcripts: flower transcript show {short}   (database {}; flower context {short} for the context report)",
        s.database.display()
    );
    println!("  workbench:   {}", s.workbench.display());
    for (path, size) in &s.artifacts {
        println!("    {path} ({size} B)");
    }
    if let Some(answer) = &s.final_answer {
        println!("\nFinal answer:\n{}", answer.trim_end());
    }
}

/// Live progress from the job's events (the same rows `Watch` streams).
struct Progress {
    bar: ProgressBar,
    job: JobId,
    turns: u32,
    running: usize,
    done: usize,
    queued: usize,
    tokens_in: u64,
    tokens_out: u64,
}

impl Progress {
    fn new(name: &str, job: JobId) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {prefix} {wide_msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_prefix(format!("{name} {}", &job.to_string()[..8]));
        bar.enable_steady_tick(Duration::from_millis(120));
        Self { bar, job, turns: 0, running: 0, done: 0, queued: 0, tokens_in: 0, tokens_out: 0 }
    }

    fn line(&self, text: String) {
        self.bar.suspend(|| eprintln!("{text}"));
    }

    fn redraw(&self) {
        self.bar.set_message(format!(
            "turn {} · tasks {} queued, {} running, {} done · tokens {} in / {} out",
            self.turns,
            self.queued,
            self.running,
            self.done,
            human_count(self.tokens_in),
            human_count(self.tokens_out)
        ));
    }

    async fn follow(mut self, store: Arc<dyn Store>, notifier: Arc<dyn Notifier>) {
        let mut notices = notifier.subscribe();
        let mut cursor = 0;
        loop {
            match store.events(self.job, cursor, 500).await {
                Ok(events) => {
                    for e in events {
                        cursor = e.seq;
                        self.apply(&e.kind);
                    }
                }
                Err(e) => self.line(format!("  (progress: {e})")),
            }
            self.redraw();
            // Wake on the next notice, or re-read after a moment anyway.
            if let Ok(Heard::Closed) = tokio::time::timeout(Duration::from_millis(500), notices.recv()).await {
                break;
            }
        }
    }

    fn apply(&mut self, kind: &EventKind) {
        match kind {
            EventKind::TurnCompleted { role, usage, .. } => {
                if role == "coordinator" {
                    self.turns += 1;
                }
                self.tokens_in += usage.context_tokens();
                self.tokens_out += usage.output_tokens;
            }
            EventKind::TaskQueued { worker, description, task } => {
                self.queued += 1;
                self.line(format!("  → task {} to {worker}: {description}", &task.to_string()[..8]));
            }
            EventKind::TaskStarted { .. } => {
                self.queued = self.queued.saturating_sub(1);
                self.running += 1;
            }
            EventKind::TaskFinished { task, succeeded, .. } => {
                self.running = self.running.saturating_sub(1);
                self.done += 1;
                let verdict = if *succeeded { "reported" } else { "failed" };
                self.line(format!("  ← task {} {verdict}", &task.to_string()[..8]));
            }
            EventKind::ProviderRetry { error, attempt, .. } => {
                self.line(format!("  ! model call retry {attempt}: {error}"))
            }
            EventKind::WaitingForQuota { wait_ms, limit, .. } => {
                self.line(format!("  … a model call waits {wait_ms} ms for its route's {limit} per minute"))
            }
            EventKind::WorkspaceConflict { path, .. } => {
                self.line(format!("  ! workspace conflict on {path} (later change kept)"))
            }
            EventKind::QuestionAsked { id, role, question, options, .. } => {
                let mut text =
                    format!("  ? the {role} asks (question {id}):\n    {}", question.replace('\n', "\n    "));
                for (i, o) in options.iter().enumerate() {
                    text.push_str(&format!("\n    {}. {o}", i + 1));
                }
                text.push_str(&format!(
                    "\n    answer from another terminal: flower answer {} {}",
                    self.job,
                    if options.is_empty() { "TEXT" } else { "[--option N | TEXT]" }
                ));
                self.line(text);
            }
            EventKind::QuestionAnswered { answer, by, .. } => self.line(format!(
                "  = answered{}: {answer}",
                if by == "user" { String::new() } else { format!(" ({by})") }
            )),
            EventKind::JudgeVerdict { round, verdict, failed, reason, .. } => {
                let mut text = format!("  ⚖ judge, round {round}: {verdict} — {reason}");
                for f in failed {
                    text.push_str(&format!("\n    ✗ {f}"));
                }
                self.line(text);
            }
            EventKind::JobState { state, .. } if state.is_terminal() => self.bar.finish_and_clear(),
            _ => {}
        }
    }
}

/// The cache audit in one line (`flower run`, `flower context --sim-audit`).
pub fn audit_line(a: &flower_sim::audit::CacheAudit) -> String {
    format!(
        "cache audit (simulator): {} requests, {} append-only, {} misses, {} at recorded rewrites, {} unexplained",
        a.requests,
        a.append_only,
        a.misses,
        a.explained,
        a.unexplained.len()
    )
}
