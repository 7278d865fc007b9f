//! Sessions and their transcripts: session rows (one, or a group's in one
//! statement), entries stored as chunks numbered from the session row's
//! counter, the reads of both, and a batch ([`crate::Store::append`]) — entries,
//! events, usage and task rows in one transaction.

use std::collections::{BTreeMap, HashSet};

use flower_model::{Entry, EventKind, JobId, Role, Session, SessionId, TaskId};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::creation::{fence_and_lock, fence_and_lock_statements};
use super::events::{batch_durability, flush_marked, write_events, write_events_ending};
use super::tasks::{INSERT_TASKS, REQUIRED, check_required, insert_tasks};
use super::transaction::{Tx, db_execute, db_query, db_query_opt, prepare_all};
use super::{PostgresStore, corrupt, parse, written};
use crate::rules;
use crate::{Batch, Result, StoreError, Written};

/// Insert a session row (idempotent); its start event when it is new.
async fn insert_session(tx: &Tx<'_>, session: &Session) -> Result<Option<(JobId, EventKind)>> {
    let n = db_execute(
        tx,
        "INSERT INTO sessions (id, job_id, role, label, task_id, created_at) VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (id) DO NOTHING",
        &[
            &session.id.0,
            &session.job_id.0,
            &session.role.as_str(),
            &session.label,
            &session.task_id.map(|t| t.0),
            &session.created_at,
        ],
    )
    .await?;
    Ok((n == 1).then(|| (session.job_id, rules::session_started(session))))
}

/// Store entries as chunks (one row per session per batch, split at
/// [`CHUNK_ENTRIES`]) with their uuids, numbered from their session rows'
/// counters; their numbers, in order. The bodies are serialized before the
/// numbers are known, so they carry none: a chunk's entries are numbered by
/// their position from its `first_seq`. A batch goes out in parts of at
/// most [`PART_ENTRIES`], one statement each, pipelined: each part bumps the
/// counters by its own entries, and the statements run in order in this
/// transaction, so the numbers stay gapless across parts.
pub(super) async fn write_entries(tx: &Tx<'_>, entries: Vec<Entry>) -> Result<Vec<i64>> {
    let mut parts = Vec::new();
    let mut rest = entries.into_iter().peekable();
    while rest.peek().is_some() {
        parts.push(Part::of(rest.by_ref().take(PART_ENTRIES))?);
    }
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    let statement = tx.prepare_cached(WRITE_PART).await?;
    let seqs = futures::future::try_join_all(parts.iter().map(|part| part.write(tx, &statement))).await?;
    Ok(seqs.concat())
}

/// Entries per statement (measured: one statement for a 1,000-entry batch
/// is no faster than four), so that no statement grows with a batch.
const PART_ENTRIES: usize = 256;

/// One part of a batch: the session counters bumped by the part's entries,
/// its uuids and its chunks (numbered from the counters); the counters'
/// bases and the chunks stored.
pub(super) const WRITE_PART: &str = "WITH counter AS (
        UPDATE sessions s SET next_entry_seq = s.next_entry_seq + b.n
        FROM UNNEST($1::uuid[], $2::bigint[]) AS b(id, n)
        WHERE s.id = b.id AND s.id = ANY($1)
        RETURNING s.id, s.next_entry_seq - b.n AS base),
     unique_uuids AS (INSERT INTO entry_uuids (uuid) SELECT * FROM UNNEST($3::uuid[])),
     chunks AS (
        INSERT INTO entry_chunks (session_id, first_seq, last_seq, job_id, bodies)
        SELECT c.session, counter.base + c.first, counter.base + c.last, c.job, c.bodies
        FROM UNNEST($4::uuid[], $5::bigint[], $6::bigint[], $7::uuid[], $8::text[])
            AS c(session, first, last, job, bodies)
        JOIN counter ON counter.id = c.session
        RETURNING 1)
     SELECT id, base, (SELECT count(*) FROM chunks) FROM counter";

/// One statement's worth of a batch, serialized: its sessions with their
/// entry counts, per entry its session and number relative to the part,
/// its uuids, and its chunks as columns.
#[derive(Default)]
struct Part {
    sessions: Vec<Uuid>,
    counts: Vec<i64>,
    placed: Vec<(usize, i64)>,
    uuids: Vec<Uuid>,
    chunk_sessions: Vec<Uuid>,
    firsts: Vec<i64>,
    lasts: Vec<i64>,
    jobs: Vec<Uuid>,
    bodies: Vec<String>,
}

impl Part {
    fn of(entries: impl Iterator<Item = Entry>) -> Result<Self> {
        let mut part = Part::default();
        let mut index: BTreeMap<SessionId, usize> = BTreeMap::new();
        let mut chunks: Vec<Chunk> = Vec::new();
        // Each session's chunk still taking entries, as an index into `chunks`.
        let mut open: BTreeMap<usize, usize> = BTreeMap::new();
        for mut entry in entries {
            let s = *index.entry(entry.session_id).or_insert_with(|| {
                part.sessions.push(entry.session_id.0);
                part.counts.push(0);
                part.sessions.len() - 1
            });
            part.counts[s] += 1;
            let offset = part.counts[s];
            part.placed.push((s, offset));
            part.uuids.push(entry.uuid);
            entry.seq = 0;
            let at = match open.get(&s) {
                Some(&at) if chunks[at].takes(&entry, offset) => at,
                _ => {
                    chunks.push(Chunk::starting(&entry, offset));
                    open.insert(s, chunks.len() - 1);
                    chunks.len() - 1
                }
            };
            chunks[at].push(&entry, offset)?;
        }
        for chunk in chunks {
            part.chunk_sessions.push(chunk.session.0);
            part.firsts.push(chunk.first);
            part.lasts.push(chunk.last);
            part.jobs.push(chunk.job.0);
            part.bodies.push(chunk.finish()?);
        }
        Ok(part)
    }

    /// Store the part; its entries' numbers, in order.
    async fn write(&self, tx: &Tx<'_>, statement: &tokio_postgres::Statement) -> Result<Vec<i64>> {
        let params: [&(dyn ToSql + Sync); 8] = [
            &self.sessions,
            &self.counts,
            &self.uuids,
            &self.chunk_sessions,
            &self.firsts,
            &self.lasts,
            &self.jobs,
            &self.bodies,
        ];
        let rows = tx.query(statement, &params).await?;
        let base: BTreeMap<Uuid, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        if let Some(missing) = self.sessions.iter().find(|s| !base.contains_key(s)) {
            return Err(StoreError::NotFound(format!("session {missing}")));
        }
        let chunks = self.bodies.len() as i64;
        if rows.first().map(|r| r.get::<_, i64>(2)) != Some(chunks) {
            return Err(StoreError::backend(format!("{chunks} transcript chunks written, fewer stored")));
        }
        Ok(self.placed.iter().map(|&(s, offset)| base[&self.sessions[s]] + offset).collect())
    }
}

/// At most this many entries in one stored chunk (the table's `CHECK` says
/// the same): the chunk holding a number starts at most this far before it.
pub const CHUNK_ENTRIES: i64 = 1024;

/// One `entry_chunks` row being built: consecutive entries of one session
/// (and job), their bodies as one JSON array; `first` and `last` relative
/// to the part until the session's counter answers.
struct Chunk {
    session: SessionId,
    job: JobId,
    first: i64,
    last: i64,
    body: Vec<u8>,
}

impl Chunk {
    fn starting(entry: &Entry, offset: i64) -> Self {
        Self { session: entry.session_id, job: entry.job_id, first: offset, last: offset - 1, body: vec![b'['] }
    }

    /// Whether `entry`, at `offset` in its session's part, continues this chunk.
    fn takes(&self, entry: &Entry, offset: i64) -> bool {
        entry.job_id == self.job && offset == self.last + 1 && offset - self.first < CHUNK_ENTRIES
    }

    fn push(&mut self, entry: &Entry, offset: i64) -> Result<()> {
        if self.last >= self.first {
            self.body.push(b',');
        }
        serde_json::to_writer(&mut self.body, entry).map_err(corrupt)?;
        self.last = offset;
        Ok(())
    }

    fn finish(mut self) -> Result<String> {
        self.body.push(b']');
        String::from_utf8(self.body).map_err(corrupt)
    }
}

/// Insert session rows in one statement (idempotent, as [`insert_session`]);
/// the ids of those this statement created.
pub(super) async fn insert_sessions(tx: &Tx<'_>, sessions: &[&Session]) -> Result<HashSet<SessionId>> {
    if sessions.is_empty() {
        return Ok(Default::default());
    }
    let (mut ids, mut jobs, mut roles, mut labels, mut tasks, mut ats) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for s in sessions {
        ids.push(s.id.0);
        jobs.push(s.job_id.0);
        roles.push(s.role.as_str());
        labels.push(s.label.as_str());
        tasks.push(s.task_id.map(|t| t.0));
        ats.push(s.created_at);
    }
    let rows = db_query(tx, INSERT_SESSIONS, &[&ids, &jobs, &roles, &labels, &tasks, &ats]).await?;
    Ok(rows.iter().map(|r| SessionId(r.get(0))).collect())
}

/// [`insert_sessions`]'s statement.
pub(super) const INSERT_SESSIONS: &str = "INSERT INTO sessions (id, job_id, role, label, task_id, created_at)
     SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::uuid[], $6::bigint[])
     ON CONFLICT (id) DO NOTHING RETURNING id";

fn decode_session(r: &Row) -> Result<Session> {
    Ok(Session {
        id: SessionId(r.get(0)),
        job_id: JobId(r.get(1)),
        role: parse::<Role>(r.get::<_, &str>(2))?,
        label: r.get(3),
        task_id: r.get::<_, Option<Uuid>>(4).map(TaskId),
        created_at: r.get(5),
    })
}

pub(super) async fn create_session(store: &PostgresStore, session: Session) -> Result<Written> {
    store
        .tx(move |tx| {
            Box::pin(async move {
                let Some(event) = insert_session(tx, &session).await? else { return Ok(Written::default()) };
                Ok(written(write_events(tx, vec![event], None).await?))
            })
        })
        .await
}

pub(super) async fn sessions(store: &PostgresStore, job: JobId) -> Result<Vec<Session>> {
    let client = store.pool.get().await?;
    let rows = db_query(
        &client,
        "SELECT id, job_id, role, label, task_id, created_at FROM sessions WHERE job_id = $1
             ORDER BY created_at, id",
        &[&job.0],
    )
    .await?;
    rows.iter().map(decode_session).collect()
}

pub(super) async fn get_session(store: &PostgresStore, id: SessionId) -> Result<Session> {
    let client = store.pool.get().await?;
    let row = db_query_opt(
        &client,
        "SELECT id, job_id, role, label, task_id, created_at FROM sessions WHERE id = $1",
        &[&id.0],
    )
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("session {id}")))?;
    decode_session(&row)
}

pub(super) async fn append(store: &PostgresStore, batch: Batch) -> Result<Written> {
    if batch.is_empty() {
        return Ok(Written::default());
    }
    store
        .tx_ending(move |tx| {
            Box::pin(async move {
                // Every statement before the events' goes out in one flight,
                // in this order: each is prepared first (a statement not yet
                // prepared on the connection goes out after its preparation,
                // out of order). The messages of new tasks are released with
                // the flight, whose first statement takes their creation
                // locks: a claim that reaches the server before it finds no
                // row and is made again (docs/design.md section 3, "A task's
                // message, with its creator's first flight"). The required
                // ends are read last: that read waits for their writers'
                // commits, and the writes before it are done meanwhile (none
                // of them takes a lock such a writer waits for: the job's row
                // is updated with the events, after it).
                let mut first: Vec<&str> = fence_and_lock_statements(batch.fence, &batch.tasks).to_vec();
                if !batch.tasks.is_empty() {
                    first.push(INSERT_TASKS.as_str());
                }
                if !batch.entries.is_empty() {
                    first.push(WRITE_PART);
                }
                if !batch.requires.is_empty() {
                    first.push(&REQUIRED);
                }
                prepare_all(tx, &first).await?;
                // Polled last, once the flight's statements are queued on
                // the connection ahead of the messages.
                let release = async {
                    if !batch.tasks.is_empty()
                        && let Some(staged) = &batch.staged
                    {
                        staged.fire();
                    }
                    Ok::<_, StoreError>(())
                };
                let mut events = batch.events;
                let (_, tasks, entry_seqs, _, _) = futures::try_join!(
                    fence_and_lock(tx, batch.fence, &batch.tasks),
                    insert_tasks(tx, &batch.tasks, &mut events),
                    write_entries(tx, batch.entries),
                    check_required(tx, &batch.requires),
                    release
                )?;
                let durability = batch_durability(batch.fence, &tasks, &events, batch.usage.as_ref());
                let (events, ending) = write_events_ending(tx, events, batch.usage, durability).await?;
                Ok((Written { events, entry_seqs, tasks }, ending))
            })
        })
        .await
}

pub(super) async fn entries(
    store: &PostgresStore,
    session: SessionId,
    after_seq: i64,
    limit: u32,
) -> Result<Vec<Entry>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let upto = after_seq.saturating_add(i64::from(limit));
    let client = store.pool.get().await?;
    // Both bounds on the key: the chunks holding (after_seq, upto].
    // With the mark of the session's job (see `events`).
    let rows = db_query(
        &client,
        "SELECT first_seq, bodies,
            (SELECT j.unflushed_seq FROM sessions s JOIN jobs j ON j.id = s.job_id WHERE s.id = $1)
         FROM entry_chunks
         WHERE session_id = $1 AND first_seq > $2 AND first_seq <= $3 AND last_seq > $4
         ORDER BY first_seq",
        &[&session.0, &after_seq.saturating_sub(CHUNK_ENTRIES), &upto, &after_seq],
    )
    .await?;
    if rows.first().is_some_and(|r| r.get::<_, Option<i64>>(2).is_some()) {
        flush_marked(&client).await?;
    }
    let mut out = Vec::new();
    for row in &rows {
        let first: i64 = row.get(0);
        let chunk: Vec<Entry> = serde_json::from_str(row.get::<_, &str>(1)).map_err(corrupt)?;
        for (i, mut entry) in chunk.into_iter().enumerate() {
            entry.seq = first + i as i64;
            if entry.seq > after_seq && entry.seq <= upto {
                out.push(entry);
            }
        }
    }
    Ok(out)
}
