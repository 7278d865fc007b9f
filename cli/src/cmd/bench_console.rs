//! `flower bench console`: how long the web console takes to answer for a
//! large job — by default 10,000 transcript entries on the main thread and
//! 500 tasks, each with its worker session — measured at the HTTP client on
//! loopback (so the server's whole answer, rendering included), median of
//! several rounds, the pages interleaved in each round.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use flower_model::{ContentBlock, Entry, EntryKind, JobId, Role, Session, SessionId, Task, TaskOutcome, Usage, now_ms};
use flower_store::{Batch, Claim, NewJob, SqliteStore, Store};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Args)]
pub struct ConsoleArgs {
    /// Entries on the job's main thread
    #[arg(long, default_value_t = 10_000)]
    pub entries: usize,
    /// Tasks of the job (each with a worker session of 2 entries)
    #[arg(long, default_value_t = 500)]
    pub tasks: usize,
    /// Rounds (each fetches every page once)
    #[arg(long, default_value_t = 7)]
    pub rounds: usize,
    /// Print the figures as JSON
    #[arg(long)]
    pub json: bool,
    /// Fill and read a scratch Postgres database made on this server instead of SQLite
    /// (e.g. postgres://postgres@127.0.0.1:5432/postgres)
    #[arg(long)]
    pub postgres: Option<String>,
}

pub async fn console(a: ConsoleArgs) -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let scratch = match &a.postgres {
        Some(url) => Some(flower_store::postgres::ScratchDatabase::create(url).await.context("--postgres")?),
        None => None,
    };
    let store: Arc<dyn Store> = match &scratch {
        Some(db) => Arc::new(flower_store::PostgresStore::connect(&db.url, 8).await?),
        None => Arc::new(SqliteStore::open(&dir.path().join("flower.db"))?),
    };
    let objects: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path())?);
    let bar = (!a.json).then(|| {
        let b = ProgressBar::new((a.entries + a.tasks) as u64);
        b.set_style(
            ProgressStyle::with_template("{prefix} {wide_bar} {pos}/{len}").unwrap_or(ProgressStyle::default_bar()),
        );
        b.set_prefix("filling the store");
        b
    });
    let (job, main) = fill(store.as_ref(), a.entries, a.tasks, bar.as_ref()).await?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let shutdown = tokio_util::sync::CancellationToken::new();
    flower_console::Console::new(flower_runtime::jobs::reader_app(store, objects), None)
        .serve(listener, shutdown.clone());
    let pages = [
        ("jobs list", format!("{base}/")),
        ("job page", format!("{base}/jobs/{job}")),
        ("job page, timeline from task 201", format!("{base}/jobs/{job}?tasks=200")),
        ("transcript, first page", format!("{base}/jobs/{job}/sessions/{main}")),
        ("transcript, pruned view", format!("{base}/jobs/{job}/sessions/{main}?view=pruned")),
    ];
    let measured = measure(&pages, a.rounds).await;
    shutdown.cancel();
    if let Some(db) = scratch {
        db.drop_now().await?;
    }
    report(&a, &pages, measured?);
    Ok(ExitCode::SUCCESS)
}

/// Each page read `rounds` times: its median time and its size.
async fn measure(pages: &[(&str, String)], rounds: usize) -> anyhow::Result<Vec<(Duration, usize)>> {
    let http = reqwest::Client::new();
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); pages.len()];
    let mut sizes = vec![0usize; pages.len()];
    for _ in 0..rounds.max(1) {
        for (i, (_, url)) in pages.iter().enumerate() {
            let start = Instant::now();
            let r = http.get(url).send().await?;
            anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
            sizes[i] = r.bytes().await?.len();
            times[i].push(start.elapsed());
        }
    }
    Ok(times
        .into_iter()
        .zip(sizes)
        .map(|(mut t, size)| {
            t.sort();
            (t[t.len() / 2], size)
        })
        .collect())
}

/// The figures, as a table or (`--json`) one JSON line.
fn report(a: &ConsoleArgs, pages: &[(&str, String)], measured: Vec<(Duration, usize)>) {
    let store_name = if a.postgres.is_some() { "postgres" } else { "sqlite" };
    let rows: Vec<(&str, f64, usize)> =
        pages.iter().zip(measured).map(|((name, _), (t, size))| (*name, t.as_secs_f64() * 1e3, size)).collect();
    if a.json {
        let v: Vec<_> =
            rows.iter().map(|(n, ms, b)| serde_json::json!({"page": n, "median_ms": ms, "bytes": b})).collect();
        let figures = serde_json::json!({
            "entries": a.entries, "tasks": a.tasks, "rounds": a.rounds, "store": store_name, "pages": v
        });
        println!("{figures}");
    } else {
        println!(
            "console over {store_name}, a job of {} main-thread entries and {} tasks ({} rounds, median):",
            a.entries, a.tasks, a.rounds
        );
        for (n, ms, b) in &rows {
            println!("  {n:<26} {ms:>8.1} ms  {:>8} bytes", b);
        }
    }
}

/// A job with `entries` main-thread entries (turns of a delegation and its
/// result) and `tasks` finished tasks, each with its session.
async fn fill(
    store: &dyn Store,
    entries: usize,
    tasks: usize,
    bar: Option<&ProgressBar>,
) -> anyhow::Result<(JobId, SessionId)> {
    let spec = serde_json::json!({
        "name": "large", "goal": "A large job for the console benchmark.",
        "workers": {"w": {"description": "works", "tools": ["Read"]}}
    });
    let job = store.create_job(NewJob::new(JobId::random(), "large", spec)).await?.0.id;
    let main = SessionId::random();
    let session = Session {
        id: main,
        job_id: job,
        role: Role::Coordinator,
        label: "main".into(),
        task_id: None,
        created_at: now_ms(),
    };
    store.create_session(session).await?;
    let mut parent = None;
    let mut batch = Vec::new();
    for i in 0..entries {
        let (kind, content) = if i % 2 == 0 {
            (
                EntryKind::Assistant,
                vec![ContentBlock::text(format!("turn {i}: the next step, in a few sentences of plain text."))],
            )
        } else {
            (EntryKind::User, vec![ContentBlock::text(format!("result {i}: {}", "a line of output. ".repeat(20)))])
        };
        let mut e = Entry::new(job, main, parent, kind, content);
        if kind == EntryKind::Assistant {
            e.usage = Some(Usage { input_tokens: 1000 + i as u64, output_tokens: 50, ..Default::default() });
        }
        parent = Some(e.uuid);
        batch.push(e);
        if batch.len() == 1000 {
            store.append(Batch { entries: std::mem::take(&mut batch), ..Default::default() }).await?;
            if let Some(b) = bar {
                b.inc(1000);
            }
        }
    }
    store.append(Batch { entries: batch, ..Default::default() }).await?;
    for chunk in (0..tasks).collect::<Vec<_>>().chunks(50) {
        let made: Vec<Task> =
            chunk.iter().map(|i| Task::queued(job, main, &format!("toolu_{i:06}"), "w", "a task", "do it")).collect();
        let (created, _) = store.create_tasks(made, None).await?;
        for (task, _) in created {
            let s = Session {
                id: task.id.session(),
                job_id: job,
                role: Role::Worker,
                label: "w".into(),
                task_id: Some(task.id),
                created_at: now_ms(),
            };
            let claimed = store.claim_task_opening(task.id, 1, "bench", Some(s.clone())).await?;
            anyhow::ensure!(matches!(claimed, Claim::Claimed { .. }), "a new task is claimed");
            let input = Entry::new(job, s.id, None, EntryKind::User, vec![ContentBlock::text("do it")]);
            let answer =
                Entry::new(job, s.id, Some(input.uuid), EntryKind::Assistant, vec![ContentBlock::text("done")]);
            let b = Batch { entries: vec![input, answer], ..Default::default() };
            store
                .finish_task_with(task.id, 1, TaskOutcome::Succeeded { report: "done".into() }, Usage::default(), b)
                .await?;
            if let Some(b) = bar {
                b.inc(1);
            }
        }
    }
    Ok((job, main))
}
