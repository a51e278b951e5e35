-- The pending state: a job that waits for its turn (a dependency, its sequence, a
-- concurrency slot, or a signal or timer) before it becomes available. Workers never
-- claim a pending job and the promotion pass never touches it: only the database
-- statement that gives the job its turn makes it available (or scheduled, when its
-- run_at is still ahead). Pending is an unfinished state; such a job lives in the hot set.

ALTER TABLE fenceq_jobs_hot DROP CONSTRAINT fenceq_jobs_state_check;
ALTER TABLE fenceq_jobs_hot ADD CONSTRAINT fenceq_jobs_state_check CHECK (state IN
    ('available', 'scheduled', 'running', 'retryable', 'completed', 'discarded', 'cancelled', 'pending'));

-- A pending job holds its unique key exactly when an available one would: it has no bit
-- of its own in unique_states and reads available's. No row is pending before this
-- migration, so every index entry built on the old definition stays right.
CREATE OR REPLACE FUNCTION fenceq_state_in_mask(state text, mask smallint) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (mask::int >> (array_position(
        '{available,scheduled,running,retryable,completed,discarded,cancelled}'::text[],
        CASE WHEN state = 'pending' THEN 'available' ELSE state END) - 1)) & 1 = 1
$$;
-- A session keeps an index's predicate with the function's body inlined as it was when
-- the session first read it. Rebuilding the unique index (the hot set holds only the
-- work in flight) makes every session read it anew, so that ON CONFLICT statements,
-- which name the predicate, keep matching the index in sessions opened before this
-- migration.
REINDEX INDEX fenceq_jobs_unique_key_idx;

-- Pending jobs by queue and kind, for the operators' counts and lists; only pending rows
-- have entries.
CREATE INDEX fenceq_jobs_hot_pending_idx ON fenceq_jobs_hot (queue, kind, id) WHERE state = 'pending';
