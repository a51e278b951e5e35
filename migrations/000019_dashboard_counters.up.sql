-- Maintained counters of finished jobs, so that dashboards and reports read a few
-- hundred rows whatever the number of retained jobs. A roll-up (store.RollupCounts, run
-- by every worker's maintenance and by the dashboard, one at a time) reads the jobs that
-- finished since its cursor through the finished_at indexes and adds them here, one row
-- per minute, queue, kind and final state. The engine's finishing statements do not
-- touch these tables.

-- jobs counts the jobs that reached state within the minute starting at bucket (a job
-- retried after it finished counts again when it finishes again); failed counts the
-- failed attempts (the errors of jobs, but a cancelled job's cancellation) those jobs
-- recorded, in the minute they finished.
CREATE TABLE fenceq_job_counts (
    bucket timestamptz NOT NULL,
    queue  text        NOT NULL,
    kind   text        NOT NULL,
    state  text        NOT NULL CHECK (state IN ('completed', 'discarded', 'cancelled')),
    jobs   bigint      NOT NULL DEFAULT 0,
    failed bigint      NOT NULL DEFAULT 0,
    -- The counts ride in the index: the reads of a window are index-only scans of a
    -- contiguous range, however the rows of its minutes lie in the table.
    PRIMARY KEY (bucket, queue, kind, state) INCLUDE (jobs, failed)
);

-- The roll-up's one cursor row: jobs whose finished_at is at or before rolled_to are
-- counted. The roll-up locks it (FOR UPDATE SKIP LOCKED), so that concurrent roll-ups
-- never count a job twice.
CREATE TABLE fenceq_job_counts_cursor (
    one       boolean     PRIMARY KEY DEFAULT true CHECK (one),
    rolled_to timestamptz NOT NULL,
    rolled_at timestamptz
);
INSERT INTO fenceq_job_counts_cursor (rolled_to) VALUES ('-infinity');
