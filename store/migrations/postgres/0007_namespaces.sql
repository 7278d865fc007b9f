-- Version 7: namespaces, API keys and the audit log (docs/design.md,
-- section 17). Every job belongs to a namespace; what existed before is in
-- `default`. An idempotency key is unique within its namespace: the stored
-- value is `<namespace>/<key>` (a namespace name holds no `/`), so the one
-- unique constraint scopes it and existing keys move to `default/`.
CREATE TABLE namespaces (
    name text PRIMARY KEY,
    created_at bigint NOT NULL
);
INSERT INTO namespaces (name, created_at) VALUES ('default', (extract(epoch from now()) * 1000)::bigint);
ALTER TABLE jobs ADD COLUMN namespace text NOT NULL DEFAULT 'default' REFERENCES namespaces (name),
    ADD COLUMN submitted_by text;
UPDATE jobs SET idempotency_key = 'default/' || idempotency_key WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_by_namespace ON jobs (namespace, created_at DESC, id);
CREATE TABLE api_keys (
    id text PRIMARY KEY,
    namespace text NOT NULL REFERENCES namespaces (name),
    role text NOT NULL,
    name text NOT NULL,
    digest text NOT NULL,
    created_at bigint NOT NULL,
    created_by text NOT NULL,
    expires_at bigint,
    last_used_at bigint,
    revoked_at bigint
);
CREATE INDEX api_keys_by_namespace ON api_keys (namespace, created_at);
CREATE TABLE audit_log (
    seq bigserial PRIMARY KEY,
    at bigint NOT NULL,
    subject text NOT NULL,
    namespace text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    origin text NOT NULL,
    outcome text NOT NULL,
    detail text NOT NULL
);
CREATE INDEX audit_log_by_namespace ON audit_log (namespace, seq);
-- The log is append-only: no row is ever changed or removed by flower.
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
-- A job waiting for a raise of its budget (`waiting_for_budget`) is live.
DROP INDEX IF EXISTS jobs_live;
CREATE INDEX jobs_live ON jobs (created_at) WHERE state IN ('queued', 'running', 'waiting_for_user', 'waiting_for_budget');
