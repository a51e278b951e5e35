-- Pending jobs cannot exist without the state: going down refuses while any is left, so
-- that no job is lost or silently made runnable.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM fenceq_jobs_hot WHERE state = 'pending') THEN
        RAISE EXCEPTION 'fenceq: % pending jobs remain; cancel them or let them run before migrating below 15',
            (SELECT count(*) FROM fenceq_jobs_hot WHERE state = 'pending');
    END IF;
END $$;

DROP INDEX fenceq_jobs_hot_pending_idx;

CREATE OR REPLACE FUNCTION fenceq_state_in_mask(state text, mask smallint) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (mask::int >> (array_position(
        '{available,scheduled,running,retryable,completed,discarded,cancelled}'::text[], state) - 1)) & 1 = 1
$$;
REINDEX INDEX fenceq_jobs_unique_key_idx;

ALTER TABLE fenceq_jobs_hot DROP CONSTRAINT fenceq_jobs_state_check;
ALTER TABLE fenceq_jobs_hot ADD CONSTRAINT fenceq_jobs_state_check CHECK (state IN
    ('available', 'scheduled', 'running', 'retryable', 'completed', 'discarded', 'cancelled'));
