-- Version 8: a namespace's limits, and what its jobs spend per UTC day
-- (docs/design.md, section 17). A spend row is the job's own, added to in
-- the statement that adds to the job's usage (the job row is held then), so
-- no two jobs ever write the same row.
ALTER TABLE namespaces ADD COLUMN limits jsonb NOT NULL DEFAULT '{}';
CREATE TABLE spend (
    namespace text NOT NULL,
    day bigint NOT NULL,
    job_id uuid NOT NULL REFERENCES jobs (id),
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cache_creation_input_tokens bigint NOT NULL DEFAULT 0,
    cache_read_input_tokens bigint NOT NULL DEFAULT 0,
    ephemeral_1h_input_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, day, job_id)
);
