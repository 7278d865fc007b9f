//! `flower bench`: measured figures anyone can rerun.
//!
//! `orchestration` runs the distributed path in one process — a coordinator
//! service and four workers talking over the real Postgres and NATS
//! JetStream, a zero-latency simulator — and reports:
//! - dispatch overhead: from the coordinator receiving a response with an
//!   `Agent` call to the worker's first model request for that task;
//! - return overhead: from the worker receiving its final response (the
//!   report) to the coordinator's next request carrying it as a tool result;
//! - tasks per second through 1 coordinator + 4 workers (fan-out of 20 per turn);
//! - next to a raw JetStream publish → consume → ack round trip, same run.

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_trait::async_trait;
use clap::{Args, Subcommand};
use flower_agent::provider::ConfiguredProviders;
use flower_agent::provider::{AnthropicClient, AnthropicConfig, Observer, Provider, ProviderError, Request, Response};
use flower_bus::{NatsBus, NatsConfig};
use flower_coordinator::service::{self, ServiceConfig};
use flower_model::{ContentBlock, JobState};
use flower_runtime::DistributedConfig;
use flower_sim::Scenario;
use flower_sim::scenario::{RoleScript, Step, ToolCall};
use flower_store::postgres::ScratchDatabase;
use flower_store::{PostgresStore, Store};
use flower_worker::WorkerOptions;
use flower_worker::isolation::ToolSetup;
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Orchestration overhead per delegated task, and task throughput
    Orchestration(OrchestrationArgs),
    /// The pruning loader on a large synthetic transcript: time and peak memory
    Pruning(PruningArgs),
    /// Transcript entries/s into Postgres through the store's batch path, beside
    /// the single-row INSERT and binary COPY floors of a row per entry, measured in the same run
    Transcript(super::bench_transcript::TranscriptArgs),
    /// The dispatch and claim path on one thread over in-memory stores, for an
    /// instruction count that does not move with machine load (bench/callgrind)
    Hotpath(super::bench_hotpath::HotpathArgs),
    /// The web console's pages for a large job (10,000 entries, 500 tasks): median time to answer
    Console(super::bench_console::ConsoleArgs),
    /// From a coordinator's restart to its first resumed request: load the main
    /// thread from the store, prune it, build the request (SQLite and Postgres)
    Resume(ResumeArgs),
    /// One tool launch through the launcher (control group, namespaces, mounts,
    /// Landlock, seccomp, limits): its time, beside starting the command directly
    Launch(super::bench_launch::LaunchArgs),
}

#[derive(Args)]
pub struct ResumeArgs {
    /// Entries in the stored main thread
    #[arg(long, default_value_t = 5_000)]
    pub entries: usize,
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Postgres URL with CREATE DATABASE rights (a scratch database is made and dropped)
    #[arg(long, env = "FLOWER_BENCH_DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub database_url: String,
}

async fn resume(a: ResumeArgs) -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let db = ScratchDatabase::create(&a.database_url).await.context("--database-url")?;
    let backends: Vec<(&str, Arc<dyn Store>)> = vec![
        ("sqlite", Arc::new(flower_store::SqliteStore::open(&dir.path().join("flower.db"))?)),
        ("postgres", Arc::new(PostgresStore::connect(&db.url, 4).await?)),
    ];
    for (name, store) in backends {
        let (spec, session) = seed_main_thread(store.as_ref(), a.entries).await?;
        let mut times = time_resume(store.as_ref(), session, &spec, a.runs).await?;
        times.sort_by(|x, y| x.total_cmp(y));
        println!(
            "{name:>8}: restart → first resumed request for a {}-entry main thread: median {:.1} ms (min {:.1}, max {:.1}; load + prune + build)",
            a.entries,
            times[times.len() / 2],
            times[0],
            times[times.len() - 1]
        );
    }
    db.drop_now().await?;
    Ok(ExitCode::SUCCESS)
}

/// A stored job whose coordinator main thread holds `entries` entries (`Agent`
/// calls and their results, appended in batches of 1000), as a restarted
/// coordinator finds it. Returns the job's spec and the main thread's session.
async fn seed_main_thread(
    store: &dyn Store,
    entries: usize,
) -> anyhow::Result<(flower_model::JobSpec, flower_model::SessionId)> {
    use flower_model::{Entry, EntryKind, JobId, Role, Session, SessionId};
    let spec = flower_model::JobSpec::parse(&spec("resume"))?;
    let (job, _) =
        store.create_job(flower_store::NewJob::new(JobId::random(), "resume", serde_json::to_value(&spec)?)).await?;
    let session = SessionId::random();
    store
        .create_session(Session {
            id: session,
            job_id: job.id,
            role: Role::Coordinator,
            label: "c".into(),
            task_id: None,
            created_at: 0,
        })
        .await?;
    let mut parent = None;
    let mut batch = Vec::new();
    for n in 0..entries / 2 {
        let id = format!("toolu_{n}");
        let call = Entry::new(
            job.id,
            session,
            parent,
            EntryKind::Assistant,
            vec![ContentBlock::ToolUse {
                id: id.clone(),
                name: "Agent".into(),
                input: json!({"subagent_type": "w", "prompt": "x".repeat(170)}),
            }],
        );
        let result = Entry::new(
            job.id,
            session,
            Some(call.uuid),
            EntryKind::ToolResult,
            vec![ContentBlock::tool_result(id, "r".repeat(600), false)],
        );
        parent = Some(result.uuid);
        batch.push(call);
        batch.push(result);
        if batch.len() >= 1000 {
            store.append(flower_store::Batch { entries: std::mem::take(&mut batch), ..Default::default() }).await?;
        }
    }
    store.append(flower_store::Batch { entries: batch, ..Default::default() }).await?;
    Ok((spec, session))
}

/// What a restarted coordinator does before its first request, timed `runs`
/// times (in ms, unsorted): load the main thread, prune it, build and
/// serialize the request.
async fn time_resume(
    store: &dyn Store,
    session: flower_model::SessionId,
    spec: &flower_model::JobSpec,
    runs: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::new();
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        let stored = store.entries(session, 0, u32::MAX).await?;
        let pruned = flower_store::prune::prune(stored, &spec.runtime.pruning, &flower_agent::glance::allows);
        let request = flower_agent::provider::Request {
            model: spec.model.clone(),
            max_tokens: 1024,
            system: vec![],
            messages: flower_agent::history::to_messages(&pruned.entries),
            tools: vec![],
            stream: true,
            cache: None,
            ..Default::default()
        };
        let body = serde_json::to_vec(&request)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(!body.is_empty());
    }
    Ok(times)
}

#[derive(Args)]
pub struct PruningArgs {
    /// Entries in the synthetic transcript
    #[arg(long, default_value_t = 100_000)]
    pub entries: usize,
    /// Runs, each in a process of its own (the medians are reported)
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Print the figures as JSON
    #[arg(long)]
    pub json: bool,
    /// Make one run in this process and print its figures as one JSON line
    /// (what each run's process is asked to do)
    #[arg(long, hide = true)]
    pub one_run: bool,
}

/// A line of this process's `/proc/self/status` (Linux), in KiB: `VmHWM`,
/// the peak resident memory so far, or `VmRSS`, what is resident now.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU time this thread has run so far (Linux `/proc/thread-self/schedstat`), in ns.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat").ok()?.split_whitespace().next()?.parse().ok()
}

/// Bring this process's peak resident memory (`VmHWM`) down to what is
/// resident now (`clear_refs` 5, Linux ≥ 4.0); false where that is refused.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// One run's figures (a run's process prints them as one JSON line).
#[derive(serde::Serialize, serde::Deserialize)]
struct PruningRun {
    entries: usize,
    kept: usize,
    ms: f64,
    /// CPU time of the pruning thread over the same span (ms): the time less
    /// what other processes took of the CPU meanwhile.
    cpu_ms: Option<f64>,
    /// Peak resident memory the transcript took to build (KiB).
    transcript_kib: Option<u64>,
    /// Peak resident memory pruning added over the resident transcript (KiB).
    extra_kib: Option<u64>,
    /// Whether the peak was reset before pruning (else `extra_kib` is an upper bound).
    peak_reset: bool,
}

/// `flower bench pruning`: the pruning loader (trimming on) over a synthetic
/// transcript of `--entries` entries (`synthetic_transcript`): its time and
/// the peak memory it adds. The acceptance it is read against: 100,000
/// entries pruned in ≤ 200 ms, adding ≤ 0.5× the transcript's own size.
///
/// Run it from a release build (no services needed):
///
/// ```text
/// cargo run --release -p flower-cli -- bench pruning --entries 100000 [--runs 5] [--json]
/// ```
///
/// How it measures. The loader consumes the transcript it is given (as a
/// resume does), so each run is a process of its own (this binary with
/// `--one-run`): no run starts on a heap another one grew, and no copy of
/// the transcript is ever made. A run builds the transcript and reads the
/// peak resident memory (`VmHWM`; after building minus before = the
/// transcript's size); it then resets the peak to what is resident now,
/// prunes, and reads the peak again with the result still held: that minus
/// what was resident before pruning is what pruning adds. Where the reset is
/// refused the peak stays at least what building reached, so the added
/// figure can only come out too high (`peak_reset: false`). The time is
/// wall-clock; the CPU time the pruning thread ran over the same span tells
/// a slow loader from a busy machine. Reported: medians over the runs of the
/// time, the CPU time, the transcript's size and pruning's extra; the ratio
/// of the two medians; and every run.
fn pruning(a: PruningArgs) -> anyhow::Result<ExitCode> {
    if a.one_run {
        println!("{}", serde_json::to_string(&one_pruning_run(a.entries))?);
        return Ok(ExitCode::SUCCESS);
    }
    let exe = std::env::current_exe().context("the path of this binary (each run is a process of its own)")?;
    let mut runs: Vec<PruningRun> = Vec::new();
    for _ in 0..a.runs.max(1) {
        let out = std::process::Command::new(&exe)
            .args(["bench", "pruning", "--one-run", "--entries", &a.entries.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output()
            .context("starting a pruning run")?;
        anyhow::ensure!(out.status.success(), "a pruning run failed ({})", out.status);
        runs.push(serde_json::from_slice(&out.stdout).context("a pruning run's figures")?);
    }
    let kib = |f: fn(&PruningRun) -> Option<u64>| -> Option<Vec<f64>> {
        runs.iter().map(|r| f(r).map(|k| k as f64)).collect()
    };
    let times: Vec<f64> = runs.iter().map(|r| r.ms).collect();
    let (min_ms, max_ms) =
        (times.iter().copied().fold(f64::INFINITY, f64::min), times.iter().copied().fold(0.0, f64::max));
    let median_ms = median(times);
    let cpu_ms: Option<Vec<f64>> = runs.iter().map(|r| r.cpu_ms).collect();
    let median_cpu_ms = cpu_ms.map(median);
    let transcript = kib(|r| r.transcript_kib).map(median);
    let extra = kib(|r| r.extra_kib).map(median);
    let extra_max = runs.iter().filter_map(|r| r.extra_kib).max();
    let ratio = transcript.zip(extra).filter(|(t, _)| *t > 0.0).map(|(t, e)| e / t);
    let peak_reset = runs.iter().all(|r| r.peak_reset);
    let (entries, kept) = runs.last().map(|r| (r.entries, r.kept)).unwrap_or_default();
    let figures = json!({
        "entries": entries,
        "kept": kept,
        "runs": runs.len(),
        "median_ms": median_ms,
        "min_ms": min_ms,
        "max_ms": max_ms,
        "median_cpu_ms": median_cpu_ms,
        "peak_rss_transcript_kib": transcript,
        "peak_rss_pruning_extra_kib": extra,
        "peak_rss_pruning_extra_max_kib": extra_max,
        "peak_rss_extra_ratio": ratio,
        "peak_reset": peak_reset,
        "per_run": runs,
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "pruning loader: {entries} entries → {kept} in {median_ms:.1} ms (median of {} runs, each its own process; min {min_ms:.1}, max {max_ms:.1}){}",
        runs.len(),
        median_cpu_ms.map(|c| format!("; CPU {c:.1} ms")).unwrap_or_default()
    );
    match (transcript, extra, ratio) {
        (Some(t), Some(e), Some(r)) => println!(
            "peak memory (medians): transcript {t:.0} KiB, pruning adds {e:.0} KiB = {r:.3}× the transcript (largest run: {} KiB){}",
            extra_max.unwrap_or_default(),
            if peak_reset { "" } else { "; the peak could not be reset: an upper bound" }
        ),
        _ => println!("peak memory: not measured here (needs Linux /proc/self/status)"),
    }
    Ok(ExitCode::SUCCESS)
}

/// One run, in this process: build the transcript, then prune it (see
/// [`pruning`] for what is measured).
fn one_pruning_run(len: usize) -> PruningRun {
    let before = status_kib("VmHWM");
    let entries = synthetic_transcript(len);
    let built = status_kib("VmHWM");
    let n = entries.len();
    // From here the transcript is resident; building may have peaked above
    // that, so the peak is brought down to it before pruning starts.
    let peak_reset = reset_peak_rss();
    let resident = status_kib("VmRSS");
    let cpu = thread_cpu_ns();
    let (ms, pruned) = time_pruning(entries);
    let cpu_ms = thread_cpu_ns().zip(cpu).map(|(b, a)| b.saturating_sub(a) as f64 / 1e6);
    let after = status_kib("VmHWM");
    PruningRun {
        entries: n,
        kept: pruned.entries.len(),
        ms,
        cpu_ms,
        transcript_kib: built.zip(before).map(|(b, a)| b.saturating_sub(a)),
        extra_kib: after.zip(resident).map(|(a, r)| a.saturating_sub(r)),
        peak_reset,
    }
}

/// A long session of at least `len` entries: `Bash` calls with results of
/// mixed sizes, glances, denials, interruptions.
pub(super) fn synthetic_transcript(len: usize) -> Vec<flower_model::Entry> {
    use flower_model::{Entry, EntryKind, JobId, SessionId};
    let (job, session) = (JobId::random(), SessionId::random());
    let mut entries: Vec<Entry> = Vec::with_capacity(len);
    let mut parent = None;
    let mut n = 0usize;
    while entries.len() < len {
        n += 1;
        let id = format!("toolu_{n}");
        let mut call = Entry::new(
            job,
            session,
            parent,
            EntryKind::Assistant,
            vec![ContentBlock::ToolUse {
                id: id.clone(),
                name: "Bash".into(),
                input: json!({"command": if n.is_multiple_of(3) { "ls -la" } else { "sh .flower/scripts/run.sh" }}),
            }],
        );
        call.seq = entries.len() as i64 + 1;
        parent = Some(call.uuid);
        entries.push(call);
        let body = "x".repeat(if n.is_multiple_of(10) { 6000 } else { 300 });
        let mut result =
            Entry::new(job, session, parent, EntryKind::ToolResult, vec![ContentBlock::tool_result(id, body, false)]);
        result.seq = entries.len() as i64 + 1;
        result.markers.ephemeral = Some(n.is_multiple_of(3));
        if n.is_multiple_of(97) {
            result.markers.denial_kind = Some("delegate_guard".into());
        }
        if n.is_multiple_of(211) {
            result.markers.interrupted = true;
        }
        parent = Some(result.uuid);
        entries.push(result);
    }
    entries
}

/// The pruning loader (trimming on) over `entries`, which it consumes: the
/// time in ms, and what it returned (still held, so the peak counts it).
fn time_pruning(entries: Vec<flower_model::Entry>) -> (f64, flower_store::prune::Pruned) {
    let mut opts = flower_model::spec::PruningOptions::default();
    opts.trim.enabled = true;
    let started = Instant::now();
    let pruned = flower_store::prune::prune(entries, &opts, &flower_agent::glance::allows);
    (started.elapsed().as_secs_f64() * 1e3, pruned)
}

#[derive(Args)]
pub struct OrchestrationArgs {
    /// Delegations measured one at a time (latency phase)
    #[arg(long, default_value_t = 200)]
    pub sequential: usize,
    /// Turns of the throughput phase, each delegating `--fan-out` tasks at once
    #[arg(long, default_value_t = 10)]
    pub turns: usize,
    #[arg(long, default_value_t = 20)]
    pub fan_out: usize,
    /// Worker processes' stand-ins (each its own NATS connection)
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Tasks each worker runs at once
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Postgres URL with CREATE DATABASE rights (a scratch database is made and dropped)
    #[arg(long, env = "FLOWER_BENCH_DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub database_url: String,
    #[arg(long, env = "FLOWER_BENCH_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Print the figures as JSON
    #[arg(long)]
    pub json: bool,
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Orchestration(args) => orchestration(args).await,
        BenchCommand::Pruning(args) => pruning(args),
        BenchCommand::Resume(args) => resume(args).await,
        BenchCommand::Hotpath(args) => super::bench_hotpath::hotpath(args).await,
        BenchCommand::Console(args) => super::bench_console::console(args).await,
        BenchCommand::Transcript(args) => super::bench_transcript::transcript(args).await,
        BenchCommand::Launch(args) => super::bench_launch::launch(args).await,
    }
}

/// Instants seen by the timing providers, per task marker (`task-<n>`).
#[derive(Default)]
struct Timings {
    call: HashMap<String, Instant>,
    first_request: HashMap<String, Instant>,
    report: HashMap<String, Instant>,
    result: HashMap<String, Instant>,
    /// tool_use id → task marker, learnt from the coordinator's responses.
    tool_use: HashMap<String, String>,
}

fn marker(text: &str) -> Option<String> {
    let at = text.find("task-")?;
    Some(text[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect())
}

struct Timed {
    inner: AnthropicClient,
    coordinator: bool,
    t: Arc<Mutex<Timings>>,
}

#[async_trait]
impl Provider for Timed {
    async fn send(&self, request: &Request, observer: Option<Observer>) -> Result<Response, ProviderError> {
        let now = Instant::now();
        {
            let mut t = self.t.lock().unwrap_or_else(|p| p.into_inner());
            if self.coordinator {
                for b in request.messages.last().map(|m| m.content.as_slice()).unwrap_or_default() {
                    if let ContentBlock::ToolResult { tool_use_id, .. } = b
                        && let Some(m) = t.tool_use.get(tool_use_id).cloned()
                    {
                        t.result.entry(m).or_insert(now);
                    }
                }
            } else if let Some(m) = request.messages.first().and_then(|m| m.content.first()).and_then(|b| match b {
                ContentBlock::Text { text } => marker(text),
                _ => None,
            }) {
                t.first_request.entry(m).or_insert(now);
            }
        }
        let response = self.inner.send(request, observer).await?;
        let done = Instant::now();
        let mut t = self.t.lock().unwrap_or_else(|p| p.into_inner());
        if self.coordinator {
            for b in &response.content {
                if let ContentBlock::ToolUse { id, input, .. } = b
                    && let Some(m) = input["prompt"].as_str().and_then(marker)
                {
                    t.call.insert(m.clone(), done);
                    t.tool_use.insert(id.clone(), m);
                }
            }
        } else if let Some(m) = request.messages.first().and_then(|m| m.content.first()).and_then(|b| match b {
            ContentBlock::Text { text } => marker(text),
            _ => None,
        }) {
            t.report.insert(m, done);
        }
        Ok(response)
    }
}

/// A coordinator script: `turns` steps, each delegating `per_turn` tasks.
fn script(name: &str, first: usize, turns: usize, per_turn: usize) -> RoleScript {
    let mut steps = Vec::new();
    for turn in 0..turns {
        let tool_calls = (0..per_turn)
            .map(|i| ToolCall {
                name: "Agent".into(),
                input: json!({"subagent_type": "echo", "description": "bench", "prompt": format!("task-{}", first + turn * per_turn + i)}),
            })
            .collect();
        steps.push(Step { id: format!("t{turn}"), tool_calls, ..Default::default() });
    }
    steps.push(Step { id: "done".into(), text: Some("done".into()), ..Default::default() });
    RoleScript {
        name: name.into(),
        matcher: flower_sim::scenario::Matcher {
            system: Some(format!("flower coordinator `{name}`")),
            first_user: None,
        },
        steps,
    }
}

fn spec(coordinator: &str) -> String {
    format!(
        "name: bench-{coordinator}\ngoal: benchmark\nprovider: sim\nscenario: none\ncoordinator:\n  name: {coordinator}\nworkers:\n  echo:\n    description: replies at once\nruntime:\n  max_turns: 1000\n"
    )
}

/// The median of `v` (NaN when empty).
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|x, y| x.total_cmp(y));
    percentile(&v, 0.5)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    json!({"n": v.len(), "p50_ms": percentile(&v, 0.5), "p99_ms": percentile(&v, 0.99), "max_ms": v.last().copied().unwrap_or(f64::NAN)})
}

async fn orchestration(a: OrchestrationArgs) -> anyhow::Result<ExitCode> {
    let db = ScratchDatabase::create(&a.database_url).await.context("--database-url")?;
    let prefix = format!("flowerbench_{}", uuid::Uuid::new_v4().simple());
    let objects_dir = tempfile::tempdir()?;
    let result = measure(&a, &db, &prefix, objects_dir.path()).await;
    if let Ok(bus) = NatsBus::connect(NatsConfig::new(a.nats_url.clone(), prefix)).await {
        let _ = bus.destroy().await;
    }
    db.drop_now().await?;
    let figures = result?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        let f = |k: &str, q: &str| figures[k][q].as_f64().unwrap_or(f64::NAN);
        println!("orchestration overhead ({} sequential delegations, zero-latency simulator)", a.sequential);
        println!(
            "  Agent call → worker's first model request   p50 {:>7.2} ms   p99 {:>7.2} ms",
            f("dispatch", "p50_ms"),
            f("dispatch", "p99_ms")
        );
        println!(
            "  worker's report → coordinator's tool result  p50 {:>7.2} ms   p99 {:>7.2} ms",
            f("return", "p50_ms"),
            f("return", "p99_ms")
        );
        println!(
            "throughput: {:.1} tasks/s ({} tasks, fan-out {} per turn, {} workers × concurrency {})",
            figures["tasks_per_second"].as_f64().unwrap_or(f64::NAN),
            a.turns * a.fan_out,
            a.fan_out,
            a.workers,
            a.concurrency
        );
        println!(
            "raw JetStream publish → consume → ack        p50 {:>7.3} ms   p99 {:>7.3} ms",
            f("raw_jetstream", "p50_ms"),
            f("raw_jetstream", "p99_ms")
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure(
    a: &OrchestrationArgs,
    db: &ScratchDatabase,
    prefix: &str,
    objects_dir: &std::path::Path,
) -> anyhow::Result<serde_json::Value> {
    let sim = flower_sim::start(scenario(a), ([127, 0, 0, 1], 0).into()).await?;
    let timings = Arc::new(Mutex::new(Timings::default()));
    let cluster = Cluster::start(a, db, prefix, objects_dir, &sim.base_url(), &timings).await?;
    let raw = raw_jetstream(&a.nats_url, prefix).await?;
    let took = run_phases(a, cluster.addr, &cluster.store).await?;
    cluster.stop().await;
    sim.shutdown().await;
    let t = timings.lock().unwrap_or_else(|p| p.into_inner());
    Ok(figures(a, &t, took, raw))
}

/// The simulator's script: the latency coordinator (`seq`, one delegation a
/// turn), the throughput one (`fan`, `--fan-out` a turn, markers from
/// 1 000 000 on so they never collide), and the `echo` worker that replies at once.
fn scenario(a: &OrchestrationArgs) -> Scenario {
    Scenario {
        roles: vec![
            script("seq", 0, a.sequential, 1),
            script("fan", 1_000_000, a.turns, a.fan_out),
            RoleScript {
                name: "echo".into(),
                matcher: flower_sim::scenario::Matcher {
                    system: Some("You are worker `echo`".into()),
                    first_user: None,
                },
                steps: vec![Step { id: "r".into(), text: Some("ok".into()), ..Default::default() }],
            },
        ],
        ..Default::default()
    }
}

/// A provider table whose only provider, `sim`, talks to the simulator and
/// records its instants in `timings` for the coordinator's side or a worker's.
fn timed_providers(
    base_url: &str,
    coordinator: bool,
    timings: &Arc<Mutex<Timings>>,
) -> anyhow::Result<Arc<ConfiguredProviders>> {
    let inner = AnthropicClient::new(AnthropicConfig {
        base_url: base_url.to_string(),
        max_concurrent: 64,
        ..Default::default()
    })?;
    let p: Arc<dyn Provider> = Arc::new(Timed { inner, coordinator, t: timings.clone() });
    Ok(Arc::new(ConfiguredProviders::from_map(BTreeMap::from([("sim".to_string(), p)]))))
}

/// The coordinator service and its worker pools, running until [`Cluster::stop`].
struct Cluster {
    store: Arc<dyn Store>,
    /// Where the coordinator's gRPC API listens.
    addr: std::net::SocketAddr,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    pools: Vec<tokio::task::JoinHandle<()>>,
    /// The workers' working directories, removed once they have stopped.
    _work: tempfile::TempDir,
}

impl Cluster {
    async fn start(
        a: &OrchestrationArgs,
        db: &ScratchDatabase,
        prefix: &str,
        objects_dir: &std::path::Path,
        sim_url: &str,
        timings: &Arc<Mutex<Timings>>,
    ) -> anyhow::Result<Cluster> {
        // The same builder as `flower coordinator` and `flower worker`; only the
        // provider tables differ (timed, to split the overhead by side).
        let config = DistributedConfig {
            database_url: db.url.clone(),
            database_pool: 16,
            schema: Default::default(),
            nats_url: a.nats_url.clone(),
            nats_prefix: prefix.to_string(),
            object_store: format!("file://{}", objects_dir.display()),
            s3: Default::default(),
            providers: Vec::new(),
            provider_concurrency: 64,
            shared_rate_limits: true,
            max_attempts: 3,
            ack_wait: Duration::from_secs(30),
            tool_policy: Default::default(),
        };
        let coordinator = config.connect().await?.with_providers(timed_providers(sim_url, true, timings)?);
        let store: Arc<dyn Store> = coordinator.store.clone();
        let backends = coordinator.backends();
        let shutdown = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let service = ServiceConfig { sweep: coordinator.sweep(), ..Default::default() };
        let server = tokio::spawn(service::serve(listener, service, backends, shutdown.clone()));
        let work = tempfile::tempdir()?;
        let mut pools = Vec::new();
        for i in 0..a.workers {
            // Stand-ins for worker processes, in this one: tools start directly.
            let tools = ToolSetup::direct(Default::default());
            let opts = WorkerOptions::new(format!("bench-worker-{i}"), work.path().join(i.to_string()), tools);
            let w = config.connect().await?.with_providers(timed_providers(sim_url, false, timings)?).worker(opts);
            pools.push(tokio::spawn(w.run(a.concurrency, shutdown.clone())));
        }
        Ok(Cluster { store, addr, shutdown, server, pools, _work: work })
    }

    /// Cancel everything and wait for the worker pools, then the service.
    async fn stop(self) {
        self.shutdown.cancel();
        for p in self.pools {
            let _ = p.await;
        }
        let _ = self.server.await;
    }
}

/// 200 raw JetStream publish → consume → ack round trips (ms), on a stream of
/// their own, as the floor the orchestration figures are read against.
async fn raw_jetstream(nats_url: &str, prefix: &str) -> anyhow::Result<Vec<f64>> {
    let mut v = Vec::new();
    let probe = NatsBus::connect(NatsConfig::new(nats_url.to_string(), format!("{prefix}_raw"))).await?;
    for _ in 0..200 {
        v.push(probe.raw_round_trip().await?.as_secs_f64() * 1e3);
    }
    probe.destroy().await?;
    Ok(v)
}

/// Submits the latency job (`seq`) and waits for it, then the throughput job
/// (`fan`), timed from its submission to its end.
async fn run_phases(
    a: &OrchestrationArgs,
    addr: std::net::SocketAddr,
    store: &Arc<dyn Store>,
) -> anyhow::Result<Duration> {
    let mut api = flower_proto::v1::flower_client::FlowerClient::connect(format!("http://{addr}")).await?;
    let mut submit = async |name: &'static str| {
        let req = flower_proto::v1::SubmitRequest { spec: spec(name), ..Default::default() };
        let id = api.submit(req).await.map_err(|s| anyhow::anyhow!("submit: {s}"))?.into_inner().job_id;
        anyhow::Ok(id.parse::<flower_model::JobId>()?)
    };
    let wait = |job: flower_model::JobId| {
        let store = store.clone();
        async move {
            loop {
                let j = store.get_job(job).await?;
                if j.state.is_terminal() {
                    anyhow::ensure!(j.state == JobState::Succeeded, "bench job {}: {:?}", j.state, j.reason);
                    return anyhow::Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let pb = indicatif::ProgressBar::new_spinner();
    pb.enable_steady_tick(Duration::from_millis(120));
    pb.set_message(format!("latency phase: {} delegations one at a time", a.sequential));
    wait(submit("seq").await?).await?;
    pb.set_message(format!("throughput phase: {} tasks", a.turns * a.fan_out));
    let started = Instant::now();
    wait(submit("fan").await?).await?;
    let took = started.elapsed();
    pb.finish_and_clear();
    Ok(took)
}

/// The figures `flower bench orchestration` prints: overheads from the
/// latency phase's markers (`task-0` … `task-<sequential - 1>`), throughput
/// from the fan-out phase's duration.
fn figures(a: &OrchestrationArgs, t: &Timings, took: Duration, raw: Vec<f64>) -> serde_json::Value {
    let ms = |from: &HashMap<String, Instant>, to: &HashMap<String, Instant>| -> Vec<f64> {
        (0..a.sequential)
            .filter_map(|k| {
                let m = format!("task-{k}");
                Some(to.get(&m)?.duration_since(*from.get(&m)?).as_secs_f64() * 1e3)
            })
            .collect()
    };
    json!({
        "dispatch": summary(ms(&t.call, &t.first_request)),
        "return": summary(ms(&t.report, &t.result)),
        "tasks_per_second": (a.turns * a.fan_out) as f64 / took.as_secs_f64(),
        "throughput_tasks": a.turns * a.fan_out,
        "raw_jetstream": summary(raw),
    })
}
