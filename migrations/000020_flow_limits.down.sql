-- Without the flow claim, jobs under a limit would be claimed by no one, or by anyone:
-- going down refuses while any unfinished job carries a flow key.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM fenceq_jobs_hot WHERE flow_key IS NOT NULL
               AND state IN ('available', 'scheduled', 'running', 'retryable', 'pending')) THEN
        RAISE EXCEPTION 'fenceq: unfinished jobs under flow limits remain; let them finish or cancel them before migrating below 20';
    END IF;
END $$;

DROP VIEW fenceq_jobs;
CREATE VIEW fenceq_jobs AS
SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
       heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
       metadata, output, unique_states, tags, flow_hook, debounce_key
FROM fenceq_jobs_hot
UNION ALL
SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
       heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
       metadata, output, unique_states, tags, flow_hook, debounce_key
FROM fenceq_jobs_history;
CREATE TRIGGER fenceq_jobs_write INSTEAD OF INSERT OR UPDATE OR DELETE ON fenceq_jobs
    FOR EACH ROW EXECUTE FUNCTION fenceq_jobs_write();

-- The triggers go with their function (a Citus coordinator refuses DROP TRIGGER on a
-- distributed table, which has none of them).
DROP FUNCTION fenceq_flow_limit_release() CASCADE;

DROP INDEX fenceq_jobs_hot_flow_seq_idx;
DROP INDEX fenceq_jobs_hot_flow_idx;
CREATE INDEX fenceq_jobs_claim_all_idx ON fenceq_jobs_hot (queue, priority, run_at, id) WHERE state = 'available';
DROP INDEX fenceq_jobs_claim_idx;
ALTER INDEX fenceq_jobs_claim_all_idx RENAME TO fenceq_jobs_claim_idx;

ALTER TABLE fenceq_jobs_history DROP COLUMN flow_key;
ALTER TABLE fenceq_jobs_hot DROP COLUMN flow_key;
DROP TABLE fenceq_flow_keys;
DROP TABLE fenceq_flow_limits;
