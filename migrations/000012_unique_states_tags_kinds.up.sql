-- Richer uniqueness: a job with a unique key holds it while its state is in its own
-- unique_states, a bitmask whose bit i stands for the i-th state of queue.JobStates()
-- (available, scheduled, running, retryable, completed, discarded, cancelled). The
-- unique index's predicate reads the mask through an IMMUTABLE function, so every
-- INSERT … ON CONFLICT names that predicate and the database decides, race-free.
-- queue's tests check that this function agrees with queue.StateMask for every state.
CREATE FUNCTION fenceq_state_in_mask(state text, mask smallint) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (mask::int >> (array_position(
        '{available,scheduled,running,retryable,completed,discarded,cancelled}'::text[], state) - 1)) & 1 = 1
$$;

ALTER TABLE fenceq_jobs ADD COLUMN unique_states smallint;

-- Jobs enqueued with a unique key so far hold it while unfinished: the mask of the
-- unfinished states (available, scheduled, running, retryable = bits 0-3). The new
-- index covers exactly the rows the old one covered, so building it cannot fail on
-- existing data.
UPDATE fenceq_jobs SET unique_states = 15 WHERE unique_key IS NOT NULL;

ALTER TABLE fenceq_jobs ADD CONSTRAINT fenceq_jobs_unique_states_check
    CHECK ((unique_key IS NULL) = (unique_states IS NULL));

CREATE UNIQUE INDEX fenceq_jobs_unique_key_mask_idx ON fenceq_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND fenceq_state_in_mask(state, unique_states);
DROP INDEX fenceq_jobs_unique_key_idx;
ALTER INDEX fenceq_jobs_unique_key_mask_idx RENAME TO fenceq_jobs_unique_key_idx;

-- Tags: short labels to find jobs by. The index covers only tagged jobs, so untagged
-- jobs (and their claims and completions, which are not HOT updates) add no entry to it;
-- a tag filter says `tags <> '{}'` besides `tags @> …` to use it.
ALTER TABLE fenceq_jobs ADD COLUMN tags text[] NOT NULL DEFAULT '{}';
CREATE INDEX fenceq_jobs_tags_idx ON fenceq_jobs USING gin (tags) WHERE tags <> '{}';

-- The kinds each worker has handlers for: it claims only those, and operators find the
-- jobs that no live worker of their queue knows.
ALTER TABLE fenceq_workers ADD COLUMN kinds text[] NOT NULL DEFAULT '{}';
