-- flower's SQLite schema, version 1: the schema shipped before migrations were
-- versioned. Every statement is IF NOT EXISTS so that a database created by
-- that release (tables present, no flower_migrations row) takes this version
-- as a no-op. Ids are UUID text; JSON columns hold serde_json text.
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    spec TEXT NOT NULL,
    final_answer TEXT,
    idempotency_key TEXT UNIQUE,
    usage TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES jobs(id),
    role TEXT NOT NULL,
    label TEXT NOT NULL,
    task_id TEXT,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_job ON sessions(job_id, created_at);
CREATE TABLE IF NOT EXISTS entries (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL,
    uuid TEXT NOT NULL UNIQUE,
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TRIGGER IF NOT EXISTS entries_append_only BEFORE UPDATE ON entries
BEGIN SELECT RAISE(ABORT, 'transcript entries are append-only'); END;
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES jobs(id),
    parent_session TEXT NOT NULL,
    tool_use_id TEXT NOT NULL,
    worker TEXT NOT NULL,
    mandate TEXT NOT NULL,
    description TEXT NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    claimed_by TEXT,
    report TEXT,
    error TEXT,
    usage TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_by_job ON tasks(job_id, created_at);
CREATE TABLE IF NOT EXISTS leases (
    job_id TEXT PRIMARY KEY REFERENCES jobs(id),
    owner TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL REFERENCES jobs(id),
    seq INTEGER NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
