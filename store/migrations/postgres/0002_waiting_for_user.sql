-- Version 2: a job waiting on a user's answer (`waiting_for_user`) is live
-- (its owner holds a lease, a takeover resumes the wait): the partial index
-- of live jobs covers that state.
DROP INDEX IF EXISTS jobs_live;
CREATE INDEX jobs_live ON jobs (created_at) WHERE state IN ('queued', 'running', 'waiting_for_user');
