-- flower's Postgres schema, version 1. Ids are UUIDs; transcript entry bodies
-- are kept as the exact JSON text written (never re-serialised by the database).
CREATE TABLE jobs (
    id uuid PRIMARY KEY,
    name text NOT NULL,
    state text NOT NULL,
    reason text,
    spec jsonb NOT NULL,
    final_answer text,
    idempotency_key text UNIQUE,
    usage jsonb NOT NULL,
    next_event_seq bigint NOT NULL DEFAULT 0,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL
);
CREATE INDEX jobs_by_created ON jobs (created_at DESC, id);
CREATE INDEX jobs_live ON jobs (created_at) WHERE state IN ('queued', 'running', 'waiting');

CREATE TABLE sessions (
    id uuid PRIMARY KEY,
    job_id uuid NOT NULL REFERENCES jobs (id),
    role text NOT NULL,
    label text NOT NULL,
    task_id uuid,
    next_entry_seq bigint NOT NULL DEFAULT 0,
    created_at bigint NOT NULL
);
CREATE INDEX sessions_by_job ON sessions (job_id, created_at);

CREATE TABLE entries (
    session_id uuid NOT NULL REFERENCES sessions (id),
    seq bigint NOT NULL,
    uuid uuid NOT NULL UNIQUE,
    job_id uuid NOT NULL,
    kind text NOT NULL,
    body text NOT NULL,
    created_at bigint NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE FUNCTION flower_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'transcript entries are append-only';
END $$;
CREATE TRIGGER entries_append_only BEFORE UPDATE ON entries
    FOR EACH ROW EXECUTE FUNCTION flower_append_only();

CREATE TABLE tasks (
    id uuid PRIMARY KEY,
    job_id uuid NOT NULL REFERENCES jobs (id),
    parent_session uuid NOT NULL,
    tool_use_id text NOT NULL,
    worker text NOT NULL,
    mandate text NOT NULL,
    description text NOT NULL,
    state text NOT NULL,
    attempt integer NOT NULL,
    claimed_by text,
    report text,
    error text,
    usage jsonb NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL
);
CREATE INDEX tasks_by_job ON tasks (job_id, created_at);

CREATE TABLE leases (
    job_id uuid PRIMARY KEY REFERENCES jobs (id),
    owner text NOT NULL,
    epoch bigint NOT NULL,
    expires_at bigint NOT NULL
);

CREATE TABLE events (
    job_id uuid NOT NULL REFERENCES jobs (id),
    seq bigint NOT NULL,
    at bigint NOT NULL,
    kind text NOT NULL,
    payload jsonb NOT NULL,
    PRIMARY KEY (job_id, seq)
);
