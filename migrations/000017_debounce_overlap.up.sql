-- Debounce, periodic overlap, and the kind's options on periodic jobs.

-- Debounce. A job enqueued with a debounce key waits (scheduled) until the end of its
-- window; an enqueue of the same kind and key while it has not started replaces its args
-- and options and moves its run_at to the end of the new window, so only the latest
-- runs. "Not started" is lease_gen = 0: the generation grows at every claim and never
-- shrinks, so a job that was ever claimed (running, retryable, or back to available after
-- a release or a revocation) is out of the index for good and never collides with a
-- newer one. The enqueue is INSERT … ON CONFLICT on this index … DO UPDATE: a claim that
-- takes the job first moves it out of the index, and the insert then goes through.
ALTER TABLE fenceq_jobs_hot ADD COLUMN debounce_key text;
ALTER TABLE fenceq_jobs_history ADD COLUMN debounce_key text;
CREATE UNIQUE INDEX fenceq_jobs_hot_debounce_idx ON fenceq_jobs_hot (kind, debounce_key)
    WHERE debounce_key IS NOT NULL AND lease_gen = 0 AND state IN ('available', 'scheduled');

-- The view of every job gains the column at its end (CREATE OR REPLACE VIEW can only
-- append): debounce_key.
CREATE OR REPLACE VIEW fenceq_jobs AS
SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
       heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
       metadata, output, unique_states, tags, flow_hook, debounce_key
FROM fenceq_jobs_hot
UNION ALL
SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
       heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
       metadata, output, unique_states, tags, flow_hook, debounce_key
FROM fenceq_jobs_history;

-- Periodic overlap: the jobs of a schedule that are not finished, found by the schedule's
-- name in their metadata ({"periodic": {"name": …}}, written by every periodic enqueue).
-- Only jobs with periodic metadata have entries.
CREATE INDEX fenceq_jobs_hot_periodic_idx ON fenceq_jobs_hot ((metadata->'periodic'->>'name'))
    WHERE metadata ? 'periodic';

-- no_overlap: a slot due while a job of the schedule is unfinished is skipped (decided
-- and not enqueued); last_skipped_slot is the newest slot so skipped and skipped_slots
-- counts them.
ALTER TABLE fenceq_periodic ADD COLUMN no_overlap boolean NOT NULL DEFAULT false;
ALTER TABLE fenceq_periodic ADD COLUMN last_skipped_slot timestamptz;
ALTER TABLE fenceq_periodic ADD COLUMN skipped_slots bigint NOT NULL DEFAULT 0;
-- The kind's options every job of the schedule gets: the unique key's fixed part (the
-- period's start is added at each insert), its state mask and period (µs, 0 for none),
-- tags, and metadata (the periodic origin is merged over it).
ALTER TABLE fenceq_periodic ADD COLUMN unique_key text;
ALTER TABLE fenceq_periodic ADD COLUMN unique_states smallint;
ALTER TABLE fenceq_periodic ADD COLUMN unique_period_us bigint NOT NULL DEFAULT 0;
ALTER TABLE fenceq_periodic ADD COLUMN tags text[] NOT NULL DEFAULT '{}';
ALTER TABLE fenceq_periodic ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';
ALTER TABLE fenceq_periodic
    ADD CONSTRAINT fenceq_periodic_metadata_object CHECK (jsonb_typeof(metadata) = 'object');
ALTER TABLE fenceq_periodic
    ADD CONSTRAINT fenceq_periodic_unique_check CHECK ((unique_key IS NULL) = (unique_states IS NULL));
