-- History back in one table. The rows are copied (not moved in place, as the up
-- migration attached them): on a large history this takes a while, under a lock that
-- blocks writes to history.
DROP FUNCTION IF EXISTS fenceq_history_drop_emptied(interval);
DROP FUNCTION IF EXISTS fenceq_history_extend(bigint, interval);
DROP FUNCTION IF EXISTS fenceq_history_partitions();

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'fenceq_jobs_history'::regclass) THEN
        RETURN;
    END IF;
    CREATE TABLE fenceq_jobs_history_plain (LIKE fenceq_jobs_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
    INSERT INTO fenceq_jobs_history_plain SELECT * FROM fenceq_jobs_history;
    CREATE OR REPLACE VIEW fenceq_jobs AS
    SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
           heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
           metadata, output, unique_states, tags, flow_hook, debounce_key, flow_key
    FROM fenceq_jobs_hot
    UNION ALL
    SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
           heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
           metadata, output, unique_states, tags, flow_hook, debounce_key, flow_key
    FROM fenceq_jobs_history_plain;
    DROP TABLE fenceq_jobs_history;
    ALTER TABLE fenceq_jobs_history_plain RENAME TO fenceq_jobs_history;

    ALTER TABLE fenceq_jobs_history ADD CONSTRAINT fenceq_jobs_history_pkey PRIMARY KEY (id);
    CREATE INDEX fenceq_jobs_history_finished_idx ON fenceq_jobs_history (finished_at);
    CREATE INDEX fenceq_jobs_history_tags_idx ON fenceq_jobs_history USING gin (tags) WHERE tags <> '{}';
    CREATE INDEX fenceq_jobs_history_queue_idx ON fenceq_jobs_history (queue, id);
    CREATE INDEX fenceq_jobs_history_kind_idx ON fenceq_jobs_history (kind, id);
    CREATE INDEX fenceq_jobs_history_args_idx ON fenceq_jobs_history USING gin (args jsonb_path_ops);
    CREATE INDEX fenceq_jobs_history_metadata_idx ON fenceq_jobs_history USING gin (metadata jsonb_path_ops)
        WHERE metadata <> '{}';
    CREATE INDEX fenceq_jobs_history_error_idx ON fenceq_jobs_history
        USING gin (to_tsvector('simple'::regconfig, left(errors -> -1 ->> 'error', 16384)))
        WHERE errors <> '[]';
    CREATE INDEX fenceq_jobs_history_failed_idx ON fenceq_jobs_history (state, id)
        WHERE state IN ('discarded', 'cancelled');
    CREATE INDEX fenceq_jobs_history_created_brin ON fenceq_jobs_history
        USING brin (created_at timestamptz_minmax_multi_ops);

    CREATE TRIGGER fenceq_flow_history AFTER INSERT ON fenceq_jobs_history
        FOR EACH ROW WHEN (NEW.flow_hook) EXECUTE FUNCTION fenceq_flow_trigger();
    CREATE CONSTRAINT TRIGGER fenceq_flow_history_gone AFTER DELETE ON fenceq_jobs_history
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW WHEN (OLD.flow_hook) EXECUTE FUNCTION fenceq_flow_trigger();
    CREATE TRIGGER fenceq_flow_limit_release_finish AFTER INSERT ON fenceq_jobs_history FOR EACH ROW
        WHEN (NEW.flow_key IS NOT NULL)
        EXECUTE FUNCTION fenceq_flow_limit_release();
    CREATE TRIGGER fenceq_flow_limit_release_history_delete AFTER DELETE ON fenceq_jobs_history FOR EACH ROW
        WHEN (OLD.flow_key IS NOT NULL)
        EXECUTE FUNCTION fenceq_flow_limit_release();
END;
$$;

-- A delete from history is told by the table's name again.
CREATE OR REPLACE FUNCTION fenceq_flow_limit_release() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    old_running boolean := OLD.state = 'running' AND TG_TABLE_NAME = 'fenceq_jobs_hot'
        AND (TG_OP = 'DELETE' OR NEW.state <> 'running' OR NEW.lease_gen <> OLD.lease_gen);
    final_state text;
BEGIN
    IF old_running THEN
        UPDATE fenceq_flow_keys SET running = running - 1 WHERE key = OLD.flow_key;
    END IF;
    IF TG_OP = 'INSERT' THEN
        final_state := NEW.state;
    ELSIF TG_OP = 'UPDATE' AND NEW.state IN ('completed', 'discarded', 'cancelled') THEN
        final_state := NEW.state;
    ELSIF TG_OP = 'DELETE' AND (TG_TABLE_NAME = 'fenceq_jobs_history'
            OR OLD.state IN ('available', 'scheduled', 'retryable', 'pending')) THEN
        -- Deleted by an operator (a finishing write inserts into history, which is the
        -- case above).
        final_state := 'deleted';
    END IF;
    IF final_state IS NOT NULL THEN
        UPDATE fenceq_flow_keys k SET holder = NULL
        FROM fenceq_flow_limits l
        WHERE k.key = COALESCE(NEW.flow_key, OLD.flow_key) AND k.holder = COALESCE(NEW.id, OLD.id)
          AND l.name = k.limit_name AND NOT (final_state = 'discarded' AND l.hold_on_discard);
    END IF;
    RETURN NULL;
END;
$fn$;
