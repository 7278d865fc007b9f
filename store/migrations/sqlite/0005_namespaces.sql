-- Version 5: namespaces, API keys and the audit log (docs/design.md,
-- section 17). Every job belongs to a namespace; what existed before is in
-- `default`. An idempotency key is unique within its namespace: the stored
-- value is `<namespace>/<key>` (a namespace name holds no `/`), so the one
-- unique constraint scopes it and existing keys move to `default/`.
CREATE TABLE namespaces (
    name TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);
INSERT INTO namespaces (name, created_at) VALUES ('default', CAST(unixepoch('subsec') * 1000 AS INTEGER));
-- (SQLite refuses a REFERENCES clause on an added column with a default.)
ALTER TABLE jobs ADD COLUMN namespace TEXT NOT NULL DEFAULT 'default';
ALTER TABLE jobs ADD COLUMN submitted_by TEXT;
UPDATE jobs SET idempotency_key = 'default/' || idempotency_key WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_by_namespace ON jobs (namespace, created_at DESC, id);
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL REFERENCES namespaces (name),
    role TEXT NOT NULL,
    name TEXT NOT NULL,
    digest TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    expires_at INTEGER,
    last_used_at INTEGER,
    revoked_at INTEGER
);
CREATE INDEX api_keys_by_namespace ON api_keys (namespace, created_at);
CREATE TABLE audit_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    subject TEXT NOT NULL,
    namespace TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    origin TEXT NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX audit_log_by_namespace ON audit_log (namespace, seq);
-- The log is append-only: no row is ever changed or removed by flower.
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
-- A job waiting for a raise of its budget (`waiting_for_budget`) is live.
DROP INDEX IF EXISTS jobs_live;
CREATE INDEX jobs_live ON jobs (created_at) WHERE state IN ('queued', 'running', 'waiting_for_user', 'waiting_for_budget');
