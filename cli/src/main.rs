//! `flower`: the one binary. Runs jobs in one process (embedded mode), the
//! bundled demo, the LLM simulator, and reads transcripts.
//!
//! # Layout
//! - `cmd/run.rs`: `flower run` and `flower demo`, with live progress
//! - `cmd/sim.rs`: `flower sim`
//! - `cmd/transcript.rs`: `flower transcript show`
//! - `cmd/status.rs`: `flower status`
//! - `cmd/mcp_serve.rs`: `flower mcp-serve` (its flags and gRPC backend)
//! - `cmd/isolation.rs`: tool isolation and spec policy flags; `flower tool-exec`, the tool launcher
//! - `cpu_latency.rs`: `--cpu-latency-us`, the CPU latency request a process holds
//! - `home.rs`: where the embedded mode keeps its state
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod cpu_latency;
mod telemetry;

/// mimalloc instead of the C library's allocator: a task's path allocates
/// many small, short-lived buffers from several threads (docs/benchmarks.md,
/// "Where the time goes").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// flower: a runtime for long-horizon LLM agent jobs. A coordinator agent
/// delegates to worker agents; their long outputs go to a workbench, not into
/// the coordinator's context.
#[derive(Parser)]
#[command(name = "flower", version)]
struct Cli {
    /// Where the embedded mode keeps its database, objects and task folders
    /// [default: $XDG_DATA_HOME/flower or ~/.local/share/flower]
    #[arg(long, global = true, env = "FLOWER_HOME")]
    home: Option<PathBuf>,
    /// Threads of the process's async runtime [default: the cores it may use].
    /// Processes that share cores (a coordinator and workers on one machine)
    /// run best with fewer: one per core among them. At 1 the main thread
    /// runs every task itself (docs/benchmarks.md, "Runtime threads")
    #[arg(long, global = true, env = "FLOWER_THREADS", value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    /// Keep idle cores able to wake within this many µs while the process
    /// runs (Linux's CPU latency request, /dev/cpu_dma_latency: needs write
    /// access to it). At 0 idle cores poll instead of halting, and a message
    /// between processes does not wait for a halted core to wake — on a
    /// virtual machine, an exit to the hypervisor and back. Idle cores then
    /// spin: more power, more of the host's CPU (docs/benchmarks.md, "Idle
    /// cores that poll")
    #[arg(long, global = true, env = "FLOWER_CPU_LATENCY_US", value_name = "MICROSECONDS",
          value_parser = clap::value_parser!(i32).range(0..=2_000_000_000))]
    cpu_latency_us: Option<i32>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job in this process (embedded mode: SQLite + local files)
    Run(cmd::run::RunArgs),
    /// Run the bundled demo job against an in-process simulator (no key, no network)
    Demo(cmd::run::DemoArgs),
    /// Serve the LLM simulator (Messages API and Chat Completions), playing a scenario
    Sim(cmd::sim::SimArgs),
    /// Serve flower itself as an MCP server (stdio, or streamable HTTP with --http): agent clients
    /// submit jobs, follow them, read transcripts and artifacts, cancel, message and answer them
    McpServe(cmd::mcp_serve::McpServeArgs),
    /// Serve the fixture MCP server (a catalog of ≥ 120 realistic tools) over stdio, or streamable HTTP with --http
    McpFixture(cmd::sim::McpFixtureArgs),
    /// Read transcripts
    #[command(subcommand)]
    Transcript(cmd::transcript::TranscriptCommand),
    /// Show jobs: one in detail, or the most recent ones (embedded store, or --server)
    Status(cmd::status::StatusArgs),
    /// Serve the coordinator gRPC API and run the jobs it owns (distributed mode)
    Coordinator(cmd::serve::CoordinatorArgs),
    /// Consume and run tasks (distributed mode)
    Worker(cmd::serve::WorkerArgs),
    /// Apply the Postgres schema and exit (a deployment's migration job); --check only reports
    Migrate(cmd::migrate::MigrateArgs),
    /// Submit a job to the service; print its id
    Submit(cmd::submit::SubmitArgs),
    /// Follow a job's events until it ends (reconnects from its cursor)
    Watch(cmd::submit::WatchArgs),
    /// Cancel a job (its running tasks stop)
    Cancel(cmd::jobs::CancelArgs),
    /// Send a message to a running job's coordinator
    Interrupt(cmd::jobs::InterruptArgs),
    /// Answer a question the job asked its user (it waits in `waiting_for_user`)
    Answer(cmd::jobs::AnswerArgs),
    /// Ask a side question about a job; a read-only session answers, the job is not touched
    Aside(cmd::jobs::AsideArgs),
    /// Continue a finished job with a new instruction: a new job from its workbench, workspace and brief
    Continue(cmd::run::ContinueArgs),
    /// Serve the web console over the embedded store (jobs, live task tree, transcripts, context meter)
    Ui(cmd::ui::UiArgs),
    /// List a job's workbench files, or download one
    Artifacts(cmd::jobs::ArtifactsArgs),
    /// What entered the coordinator's context versus its subagents' (embedded store, or --server)
    Context(cmd::context::ContextArgs),
    /// Would the coordinator be allowed to run this command itself (a glance)? Exit 0 if so
    Glance(cmd::glance::GlanceArgs),
    /// Namespaces and API keys: whoami, create, list, rotate, revoke (a service with --server, or the embedded store)
    #[command(subcommand)]
    Auth(cmd::auth::AuthCommand),
    /// The audit log: every mutating call, refused ones too (operators and admins)
    Audit(cmd::auth::AuditArgs),
    /// Benchmarks (need Postgres and NATS, like the tests)
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
}

impl Command {
    /// The process's role, for span export.
    fn name(&self) -> &'static str {
        match self {
            Command::Coordinator(_) => "coordinator",
            Command::Worker(_) => "worker",
            Command::Sim(_) => "sim",
            Command::Run(_) | Command::Demo(_) | Command::McpServe(_) => "embedded",
            _ => "client",
        }
    }
}

fn main() -> ExitCode {
    // Output piped into a reader that stopped (`flower … | head`) ends the
    // process quietly, as other command-line tools do, not with a panic report.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.payload().downcast_ref::<String>().map(String::as_str).unwrap_or_default();
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default_hook(info);
    }));
    // The tool launcher reads nothing but its own arguments: no other
    // option, no environment, no runtime (it forks and execs).
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == "tool-exec") {
        return cmd::isolation::tool_exec(args.collect());
    }
    let cli = Cli::parse();
    let _telemetry = telemetry::init(cli.command.name());
    // Held until the process ends; a request that cannot be held is a
    // warning, not a failure: the process runs as it would without it.
    let _cpu_latency = cli.cpu_latency_us.and_then(|us| match cpu_latency::hold(us) {
        Ok(held) => Some(held),
        Err(e) => {
            eprintln!("warning: --cpu-latency-us {us} not applied ({e}): idle cores keep their default wake-up");
            None
        }
    });
    // One thread: the main thread runs every task itself, with no worker
    // thread to hand work to or wake.
    let mut builder = match cli.threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        threads => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if let Some(n) = threads {
                builder.worker_threads(n.into());
            }
            builder
        }
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let home = flower_runtime::home::resolve(cli.home);
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => cmd::run::run(home, args).await,
            Command::Demo(args) => cmd::run::demo(home, args).await,
            Command::Sim(args) => cmd::sim::serve(args).await,
            Command::McpFixture(args) => cmd::sim::mcp_fixture(args).await,
            Command::McpServe(args) => cmd::mcp_serve::run(home, args).await,
            Command::Transcript(c) => cmd::transcript::run(home, c).await,
            Command::Status(args) => cmd::status::run(home, args).await,
            Command::Coordinator(args) => cmd::serve::coordinator(args).await,
            Command::Worker(args) => cmd::serve::worker(args).await,
            Command::Migrate(args) => cmd::migrate::run(args).await,
            Command::Submit(args) => cmd::submit::submit(args).await,
            Command::Watch(args) => cmd::submit::watch(args).await,
            Command::Cancel(args) => cmd::jobs::cancel(args).await,
            Command::Auth(c) => cmd::auth::run(home, c).await,
            Command::Audit(args) => cmd::auth::audit(home, args).await,
            Command::Interrupt(args) => cmd::jobs::interrupt(args).await,
            Command::Answer(args) => cmd::jobs::answer(home, args).await,
            Command::Aside(args) => cmd::jobs::aside(home, args).await,
            Command::Continue(args) => cmd::run::continue_job(home, args).await,
            Command::Ui(args) => cmd::ui::ui(home, args).await,
            Command::Artifacts(args) => cmd::jobs::artifacts(args).await,
            Command::Bench(c) => cmd::bench::run(c).await,
            Command::Glance(args) => cmd::glance::run(args),
            Command::Context(args) => cmd::context::run(home, args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
