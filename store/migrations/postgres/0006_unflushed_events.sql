-- Version 6: a job's writes not yet known to be flushed. The coordinator's
-- turn that creates tasks commits without waiting for its WAL flush
-- (docs/design.md, "A turn that creates tasks, flushed by its claims"): the
-- claim of each task it creates commits synchronously, and a synchronous
-- commit flushes the WAL up to its own record, so the turn's with it. Such a
-- write sets both columns (keeping earlier values): its first event's number
-- and the server's time; every synchronous write of the job's events clears
-- them. A read that hands a job's events, tasks or transcript to a client
-- holds back or first makes durable what they mark.
ALTER TABLE jobs ADD COLUMN unflushed_seq bigint, ADD COLUMN unflushed_since timestamptz;
