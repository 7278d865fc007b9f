-- Version 5: the rows a job's writes add (events, tasks, sessions) and a
-- session's entry chunks no longer carry a foreign key to their parent.
-- Every such write already proves its parent in the same statement or
-- transaction: events are numbered from the job row's counter (a missing
-- job leaves their number null, which the table refuses), a task row or a
-- session row is written with its own event (so with that counter), and a
-- chunk is joined to the session counter that numbers it. The foreign keys
-- only added, per row, a lookup of the parent under a key-share lock — on a
-- job row that each of those transactions also updates, so every lookup
-- walked the row's versions through multixacts: about a fifth of the
-- server's time on a burst of tasks. Parents are never deleted.
ALTER TABLE events DROP CONSTRAINT events_job_id_fkey;
ALTER TABLE tasks DROP CONSTRAINT tasks_job_id_fkey;
ALTER TABLE sessions DROP CONSTRAINT sessions_job_id_fkey;
ALTER TABLE entry_chunks DROP CONSTRAINT entry_chunks_session_id_fkey;
