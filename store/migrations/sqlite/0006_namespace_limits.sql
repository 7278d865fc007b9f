-- Version 6: a namespace's limits, and what its jobs spend per UTC day
-- (docs/design.md, section 17): one row per namespace, day and job.
ALTER TABLE namespaces ADD COLUMN limits TEXT NOT NULL DEFAULT '{}';
CREATE TABLE spend (
    namespace TEXT NOT NULL,
    day INTEGER NOT NULL,
    job_id TEXT NOT NULL REFERENCES jobs (id),
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_creation_input_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_input_tokens INTEGER NOT NULL DEFAULT 0,
    ephemeral_1h_input_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, day, job_id)
);
