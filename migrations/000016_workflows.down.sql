-- Going down removes dependencies, workflows, batches, signals and waits. Refused while a
-- job still waits for any of them: without this migration nothing would give it its turn.
DO $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM fenceq_jobs_hot j
    WHERE j.state IN ('pending', 'scheduled')
      AND (EXISTS (SELECT 1 FROM fenceq_flow_jobs f WHERE f.job_id = j.id AND f.deps_left > 0)
           OR EXISTS (SELECT 1 FROM fenceq_job_waits w WHERE w.job_id = j.id AND w.gen = j.lease_gen));
    IF n > 0 THEN
        RAISE EXCEPTION 'fenceq: % jobs wait for dependencies, a signal or a timer; cancel them or let them run before migrating below 16', n;
    END IF;
END $$;

-- The triggers go with their function below (DROP ... CASCADE): a Citus coordinator
-- refuses DROP TRIGGER on a distributed table, which has none of them.

DROP FUNCTION fenceq_enqueue_workflow(text, jsonb);
DROP FUNCTION fenceq_wait(bigint, bigint, text, timestamptz);
DROP FUNCTION fenceq_send_signal(bigint, text, jsonb);
DROP FUNCTION fenceq_flow_wait(bigint, bigint, text, timestamptz);
DROP FUNCTION fenceq_flow_send(bigint, text, jsonb);
DROP FUNCTION fenceq_flow_link(bigint, bigint[], bigint[], bigint, text, boolean);
DROP FUNCTION fenceq_flow_trigger() CASCADE;
DROP FUNCTION fenceq_flow_gone(bigint, text);
DROP FUNCTION fenceq_flow_reopened(bigint);
DROP FUNCTION fenceq_flow_ended(bigint, text);
DROP FUNCTION fenceq_flow_block(bigint, bigint, text);
DROP FUNCTION fenceq_flow_release(bigint);
DROP FUNCTION fenceq_flow_check();

DROP TABLE fenceq_job_waits;
DROP TABLE fenceq_signals;
DROP TABLE fenceq_job_deps;
DROP TABLE fenceq_flow_jobs;
DROP TABLE fenceq_workflows;

-- The view cannot lose a column in place: it is made again as migration 000014 made it,
-- with its INSTEAD OF trigger.
DROP VIEW fenceq_jobs;
CREATE VIEW fenceq_jobs AS
SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
       heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
       metadata, output, unique_states, tags
FROM fenceq_jobs_hot
UNION ALL
SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
       heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
       metadata, output, unique_states, tags
FROM fenceq_jobs_history;
CREATE TRIGGER fenceq_jobs_write INSTEAD OF INSERT OR UPDATE OR DELETE ON fenceq_jobs
    FOR EACH ROW EXECUTE FUNCTION fenceq_jobs_write();

ALTER TABLE fenceq_jobs_hot DROP COLUMN flow_hook;
ALTER TABLE fenceq_jobs_history DROP COLUMN flow_hook;
