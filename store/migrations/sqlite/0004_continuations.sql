-- Version 4: a continuation (`flower continue`) is a new job that goes on
-- from a finished one: the job it continues and the user's instruction.
ALTER TABLE jobs ADD COLUMN parent TEXT REFERENCES jobs (id);
ALTER TABLE jobs ADD COLUMN instruction TEXT;
CREATE INDEX jobs_parent ON jobs (parent) WHERE parent IS NOT NULL;
