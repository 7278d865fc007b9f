-- Version 2: the job indexes the Postgres schema has had from version 1, so
-- listing jobs newest first and finding live jobs without an owner (what a
-- coordinator takes over) read an index instead of the whole table.
CREATE INDEX IF NOT EXISTS jobs_by_created ON jobs (created_at DESC, id);
CREATE INDEX IF NOT EXISTS jobs_live ON jobs (created_at) WHERE state IN ('queued', 'running', 'waiting');
