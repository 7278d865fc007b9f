-- Version 4: a transcript's entries are stored as chunks, one row per
-- session per appended batch (at most 1,024 entries: a longer batch is
-- split), its bodies one JSON array in order, the first and last numbers
-- beside it. A row per entry cost the server a heap tuple, three index
-- insertions and a foreign-key check per entry; a chunk costs them once.
-- Entry uuids stay unique through their own narrow table. `entries`, the
-- old table's name, is now a view with the old table's columns (and its
-- rows' xmin: the writing transaction).
CREATE TABLE entry_chunks (
    session_id uuid NOT NULL REFERENCES sessions (id),
    first_seq bigint NOT NULL,
    last_seq bigint NOT NULL,
    job_id uuid NOT NULL,
    bodies text NOT NULL,
    PRIMARY KEY (session_id, first_seq),
    -- Readers look for a number's chunk no further back than 1,024 numbers.
    CHECK (first_seq >= 1 AND last_seq >= first_seq AND last_seq - first_seq < 1024)
);
-- lz4 where the server has it (compressing a large chunk with the default
-- pglz costs more than writing it); else stored out of line uncompressed.
DO $$
BEGIN
    ALTER TABLE entry_chunks ALTER COLUMN bodies SET COMPRESSION lz4;
EXCEPTION WHEN OTHERS THEN
    ALTER TABLE entry_chunks ALTER COLUMN bodies SET STORAGE EXTERNAL;
END $$;
CREATE TRIGGER entry_chunks_append_only BEFORE UPDATE ON entry_chunks
    FOR EACH ROW EXECUTE FUNCTION flower_append_only();

CREATE TABLE entry_uuids (uuid uuid PRIMARY KEY);

INSERT INTO entry_chunks (session_id, first_seq, last_seq, job_id, bodies)
    SELECT session_id, seq, seq, job_id, '[' || body || ']' FROM entries;
INSERT INTO entry_uuids (uuid) SELECT uuid FROM entries;
DROP TABLE entries;

CREATE VIEW entries AS
    SELECT c.session_id,
           c.first_seq + e.ord - 1 AS seq,
           (e.body->>'uuid')::uuid AS uuid,
           c.job_id,
           e.body->>'kind' AS kind,
           e.body::text AS body,
           (e.body->>'created_at')::bigint AS created_at,
           -- The transaction that wrote the entry, as the table's own xmin said.
           c.xmin
    FROM entry_chunks c,
         LATERAL json_array_elements(c.bodies::json) WITH ORDINALITY AS e(body, ord);
-- Rewriting through the view is refused as rewriting the table was.
CREATE TRIGGER entries_append_only INSTEAD OF UPDATE ON entries
    FOR EACH ROW EXECUTE FUNCTION flower_append_only();
