//! `flower bench transcript`: entries per second into Postgres through the
//! store's batch path (chunk rows), beside two floors of the layout it
//! replaced — a row per entry, with that table's keys and foreign key —
//! measured in the same run on the same entries: one `INSERT` per entry,
//! and a raw binary `COPY` of bodies serialized before the clock starts.
//! Each batch is one committed transaction in all three. Tool output is
//! word text (it compresses like prose, not like a repeated byte).

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use flower_model::{Entry, JobId, Role, Session, SessionId};
use flower_store::postgres::ScratchDatabase;
use flower_store::{Batch, NewJob, PostgresStore, Store};
use serde_json::json;
use tokio_postgres::NoTls;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};

use super::bench::{median, synthetic_transcript};

#[derive(Args)]
pub struct TranscriptArgs {
    /// Entries written per run through the batch path and the COPY floor
    #[arg(long, default_value_t = 100_000)]
    pub entries: usize,
    /// Entries per batch (one transaction each)
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Entries per run for the single-row floor (it is ~20× slower)
    #[arg(long, default_value_t = 10_000)]
    pub single_row_entries: usize,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Postgres URL with CREATE DATABASE rights (a scratch database is made and dropped)
    #[arg(long, env = "FLOWER_BENCH_DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub database_url: String,
    /// Print the figures as JSON
    #[arg(long)]
    pub json: bool,
}

pub async fn transcript(a: TranscriptArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.entries > 0 && a.batch > 0 && a.single_row_entries > 0, "counts must be positive");
    let db = ScratchDatabase::create(&a.database_url).await.context("--database-url")?;
    let store = PostgresStore::connect(&db.url, 2).await?;
    let (client, conn) = tokio_postgres::connect(&db.url, NoTls).await?;
    let driver = tokio::spawn(conn);
    let job = store.create_job(NewJob::new(JobId::random(), "bench-transcript", json!({}))).await?.0.id;
    client.batch_execute(&row_per_entry_table()?).await?;
    let mut rows = synthetic_transcript(a.entries);
    wordy(&mut rows);
    let bytes: usize = rows.iter().map(|e| serde_json::to_string(e).map(|s| s.len()).unwrap_or(0)).sum();
    let rates = measure(&a, &store, &client, job, &rows).await?;
    let stored = stored_per_entry(&a, &client).await?;
    drop(client);
    let _ = driver.await;
    drop(store);
    db.drop_now().await?;
    report(&a, bytes as f64 / a.entries as f64, rates, stored)
}

/// Entries per second of each run, by writer.
struct Rates {
    store: Vec<f64>,
    copy: Vec<f64>,
    single: Vec<f64>,
}

/// Write `rows` the three ways, interleaved run by run, each run in a new
/// session of `job`.
async fn measure(
    a: &TranscriptArgs,
    store: &PostgresStore,
    client: &tokio_postgres::Client,
    job: JobId,
    rows: &[Entry],
) -> anyhow::Result<Rates> {
    let mut rates = Rates { store: vec![], copy: vec![], single: vec![] };
    let progress = indicatif::ProgressBar::new(a.runs as u64 * 3);
    progress.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")?);
    for _ in 0..a.runs.max(1) {
        // Interleaved, so a noisy moment hurts all three alike.
        progress.set_message("store batch path");
        let session = new_session(store, job).await?;
        let entries = for_session(rows, job, session, a.entries);
        let started = Instant::now();
        for chunk in chunks(entries, a.batch) {
            store.append(Batch { entries: chunk, ..Default::default() }).await?;
        }
        rates.store.push(a.entries as f64 / started.elapsed().as_secs_f64());
        progress.inc(1);

        progress.set_message("COPY floor");
        let session = new_session(store, job).await?;
        let ready = encoded(rows, job, session, a.entries)?;
        let started = Instant::now();
        for chunk in ready.chunks(a.batch) {
            copy_floor(client, chunk).await?;
        }
        rates.copy.push(a.entries as f64 / started.elapsed().as_secs_f64());
        progress.inc(1);

        progress.set_message("single-row floor");
        let session = new_session(store, job).await?;
        let ready = encoded(rows, job, session, a.single_row_entries.min(a.entries))?;
        let started = Instant::now();
        for chunk in ready.chunks(a.batch) {
            single_row_floor(client, chunk).await?;
        }
        rates.single.push(ready.len() as f64 / started.elapsed().as_secs_f64());
        progress.inc(1);
    }
    progress.finish_and_clear();
    Ok(rates)
}

/// Bytes stored per entry (chunks, row per entry), once every entry
/// written is checked to be stored.
async fn stored_per_entry(a: &TranscriptArgs, client: &tokio_postgres::Client) -> anyhow::Result<(f64, f64)> {
    let sizes = client
        .query_one(
            "SELECT (SELECT coalesce(sum(last_seq - first_seq + 1), 0) FROM entry_chunks)::bigint,
                    (SELECT count(*) FROM entry_rows),
                    pg_total_relation_size('entry_chunks') + pg_total_relation_size('entry_uuids'),
                    pg_total_relation_size('entry_rows')",
            &[],
        )
        .await?;
    let (chunked, row_per_entry, chunk_bytes, row_bytes): (i64, i64, i64, i64) =
        (sizes.get(0), sizes.get(1), sizes.get(2), sizes.get(3));
    let runs = a.runs.max(1);
    let expected = (runs * a.entries, runs * (a.entries + a.single_row_entries.min(a.entries)));
    anyhow::ensure!(
        (chunked as usize, row_per_entry as usize) == expected,
        "{chunked} + {row_per_entry} entries stored, {expected:?} written"
    );
    Ok((chunk_bytes as f64 / chunked as f64, row_bytes as f64 / row_per_entry as f64))
}

/// The figures, as JSON or as lines: medians of the runs, each floor
/// against the store's path.
fn report(
    a: &TranscriptArgs,
    per_entry: f64,
    rates: Rates,
    (stored_per_entry, row_stored_per_entry): (f64, f64),
) -> anyhow::Result<ExitCode> {
    let Rates { store: store_rates, copy: copy_rates, single: single_rates } = rates;
    let (s, c, one) = (median(store_rates.clone()), median(copy_rates.clone()), median(single_rates.clone()));
    let figures = json!({
        "entries": a.entries,
        "batch": a.batch,
        "runs": a.runs.max(1),
        "mean_body_bytes": per_entry,
        "store_batch_entries_per_s": s,
        "copy_floor_entries_per_s": c,
        "single_row_floor_entries_per_s": one,
        "store_vs_copy_floor": s / c,
        "store_vs_single_row": s / one,
        "stored_bytes_per_entry": stored_per_entry,
        "row_per_entry_stored_bytes_per_entry": row_stored_per_entry,
        "per_run": {"store": store_rates, "copy_floor": copy_rates, "single_row_floor": single_rates},
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "transcript writes, {} entries in batches of {} (bodies {per_entry:.0} B on average), medians of {} runs:",
        a.entries,
        a.batch,
        a.runs.max(1)
    );
    println!(
        "  store batch path (chunks)       {s:>9.0} entries/s  ({:.1} MB/s; {stored_per_entry:.0} B stored per entry)",
        s * per_entry / 1e6
    );
    println!(
        "  row per entry: COPY floor       {c:>9.0} entries/s  (store path = {:.2}× of it; {row_stored_per_entry:.0} B stored per entry)",
        s / c
    );
    println!("  row per entry: single-row floor {one:>9.0} entries/s  (store path = {:.1}× of it)", s / one);
    Ok(ExitCode::SUCCESS)
}

/// The layout the floors write: the row-per-entry table exactly as the
/// first migration created it (keyed by session and number, its uuid
/// unique, its session a foreign key), named `entry_rows`.
fn row_per_entry_table() -> anyhow::Result<String> {
    let initial = flower_store::migrations::POSTGRES
        .iter()
        .find(|(version, _)| *version == 1)
        .map(|(_, sql)| *sql)
        .context("the first Postgres migration")?;
    let start = initial.find("CREATE TABLE entries (").context("migration 1 creates `entries`")?;
    let end = start + initial[start..].find(");").context("the end of `entries`' definition")? + 2;
    Ok(initial[start..end].replacen("CREATE TABLE entries", "CREATE TABLE entry_rows", 1))
}

/// Tool output as word text of the same lengths, in place of the synthetic
/// transcript's repeated byte (which any compression would erase).
fn wordy(rows: &mut [Entry]) {
    const WORDS: &str = "the build failed at line src/main.rs warning: unused variable error[E0308]: mismatched \
        types expected found struct drwxr-xr-x root 4096 Dec README.md test passed ok running 12 tests in 0.42s \
        cargo fn let =";
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for entry in rows {
        for block in &mut entry.content {
            if let flower_model::ContentBlock::ToolResult { content, .. } = block {
                for part in content.iter_mut() {
                    if let flower_model::ResultBlock::Text { text } = part {
                        let mut out = String::with_capacity(text.len() + 16);
                        while out.len() < text.len() {
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            out.push_str(words[(state % words.len() as u64) as usize]);
                            out.push(if state.is_multiple_of(11) { '\n' } else { ' ' });
                        }
                        *text = out;
                    }
                }
            }
        }
    }
}

async fn new_session(store: &PostgresStore, job: JobId) -> anyhow::Result<SessionId> {
    let id = SessionId::random();
    store
        .create_session(Session {
            id,
            job_id: job,
            role: Role::Worker,
            label: "bench".into(),
            task_id: None,
            created_at: 0,
        })
        .await?;
    Ok(id)
}

/// The first `n` rows, as entries of `session` (fresh uuids: they are unique).
fn for_session(rows: &[Entry], job: JobId, session: SessionId, n: usize) -> Vec<Entry> {
    rows.iter()
        .take(n)
        .enumerate()
        .map(|(i, e)| {
            let mut e = e.clone();
            (e.job_id, e.session_id, e.uuid, e.seq) = (job, session, uuid::Uuid::now_v7(), i as i64 + 1);
            e
        })
        .collect()
}

fn chunks(entries: Vec<Entry>, size: usize) -> Vec<Vec<Entry>> {
    let mut out = Vec::new();
    let mut it = entries.into_iter().peekable();
    while it.peek().is_some() {
        out.push(it.by_ref().take(size).collect());
    }
    out
}

/// A row as the floors send it: every field ready, the body already JSON.
struct Encoded {
    session: uuid::Uuid,
    seq: i64,
    uuid: uuid::Uuid,
    job: uuid::Uuid,
    kind: &'static str,
    body: String,
    at: i64,
}

fn encoded(rows: &[Entry], job: JobId, session: SessionId, n: usize) -> anyhow::Result<Vec<Encoded>> {
    for_session(rows, job, session, n)
        .into_iter()
        .map(|e| {
            Ok(Encoded {
                session: e.session_id.0,
                seq: e.seq,
                uuid: e.uuid,
                job: e.job_id.0,
                kind: e.kind.as_str(),
                body: serde_json::to_string(&e)?,
                at: e.created_at,
            })
        })
        .collect()
}

async fn copy_floor(client: &tokio_postgres::Client, rows: &[Encoded]) -> anyhow::Result<()> {
    client.batch_execute("BEGIN").await?;
    let sink = client
        .copy_in("COPY entry_rows (session_id, seq, uuid, job_id, kind, body, created_at) FROM STDIN (FORMAT binary)")
        .await?;
    let types = [Type::UUID, Type::INT8, Type::UUID, Type::UUID, Type::TEXT, Type::TEXT, Type::INT8];
    let writer = BinaryCopyInWriter::new(sink, &types);
    futures::pin_mut!(writer);
    for r in rows {
        let fields: [&(dyn ToSql + Sync); 7] = [&r.session, &r.seq, &r.uuid, &r.job, &r.kind, &r.body, &r.at];
        writer.as_mut().write(&fields).await?;
    }
    writer.finish().await?;
    client.batch_execute("COMMIT").await?;
    Ok(())
}

async fn single_row_floor(client: &tokio_postgres::Client, rows: &[Encoded]) -> anyhow::Result<()> {
    let insert = client
        .prepare(
            "INSERT INTO entry_rows (session_id, seq, uuid, job_id, kind, body, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .await?;
    client.batch_execute("BEGIN").await?;
    for r in rows {
        client.execute(&insert, &[&r.session, &r.seq, &r.uuid, &r.job, &r.kind, &r.body, &r.at]).await?;
    }
    client.batch_execute("COMMIT").await?;
    Ok(())
}
