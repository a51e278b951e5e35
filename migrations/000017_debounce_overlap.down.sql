-- Back to 16: the periodic columns, the periodic index and the debounce key go. A job
-- still waiting under a debounce key stays and runs as an ordinary scheduled job.
ALTER TABLE fenceq_periodic DROP CONSTRAINT fenceq_periodic_unique_check;
ALTER TABLE fenceq_periodic DROP CONSTRAINT fenceq_periodic_metadata_object;
ALTER TABLE fenceq_periodic DROP COLUMN metadata;
ALTER TABLE fenceq_periodic DROP COLUMN tags;
ALTER TABLE fenceq_periodic DROP COLUMN unique_period_us;
ALTER TABLE fenceq_periodic DROP COLUMN unique_states;
ALTER TABLE fenceq_periodic DROP COLUMN unique_key;
ALTER TABLE fenceq_periodic DROP COLUMN skipped_slots;
ALTER TABLE fenceq_periodic DROP COLUMN last_skipped_slot;
ALTER TABLE fenceq_periodic DROP COLUMN no_overlap;
DROP INDEX fenceq_jobs_hot_periodic_idx;

-- A view cannot drop a column: it is created again as migration 000016 left it (its
-- trigger with it).
DROP VIEW fenceq_jobs;
CREATE VIEW fenceq_jobs AS
SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
       heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
       metadata, output, unique_states, tags, flow_hook
FROM fenceq_jobs_hot
UNION ALL
SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
       heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
       metadata, output, unique_states, tags, flow_hook
FROM fenceq_jobs_history;
CREATE TRIGGER fenceq_jobs_write INSTEAD OF INSERT OR UPDATE OR DELETE ON fenceq_jobs
    FOR EACH ROW EXECUTE FUNCTION fenceq_jobs_write();

DROP INDEX fenceq_jobs_hot_debounce_idx;
ALTER TABLE fenceq_jobs_history DROP COLUMN debounce_key;
ALTER TABLE fenceq_jobs_hot DROP COLUMN debounce_key;
