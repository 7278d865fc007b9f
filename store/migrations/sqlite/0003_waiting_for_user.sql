-- Version 3: a job waiting on a user's answer (`waiting_for_user`) is live
-- (a resumed run goes on waiting): the partial index of live jobs covers it.
DROP INDEX IF EXISTS jobs_live;
CREATE INDEX jobs_live ON jobs (created_at) WHERE state IN ('queued', 'running', 'waiting_for_user');
