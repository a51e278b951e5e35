-- Back to one table: history moves into the hot set, which takes the name fenceq_jobs
-- again, and the SQL functions write it as migration 000013 wrote them.
DROP TRIGGER fenceq_jobs_write ON fenceq_jobs;
DROP FUNCTION fenceq_jobs_write();
DROP VIEW fenceq_jobs;
INSERT INTO fenceq_jobs_hot OVERRIDING SYSTEM VALUE SELECT * FROM fenceq_jobs_history;
DROP TABLE fenceq_jobs_history;
DROP INDEX fenceq_jobs_hot_keeps_idx;
ALTER TABLE fenceq_jobs_hot RENAME TO fenceq_jobs;

CREATE OR REPLACE FUNCTION fenceq_enqueue_row(
    kind text, args jsonb, queue text, run_at timestamptz, priority int, unique_key text,
    max_attempts int, tags text[], metadata jsonb,
    OUT id bigint, OUT existing boolean)
    LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    k text := kind;
    -- An empty queue and a zero max_attempts take the defaults, as Go's zero values do.
    q text := COALESCE(NULLIF(queue, ''), 'default');
    a jsonb := COALESCE(args, '{}');
    prio int := COALESCE(priority, 1);
    attempts int := COALESCE(NULLIF(max_attempts, 0), 25);
    meta jsonb := COALESCE(metadata, '{}');
    key text := NULLIF(unique_key, '');
    at timestamptz := COALESCE(run_at, now());
    t text;
    tg text[] := '{}';
    st text;
BEGIN
    -- In the order of Go's checks (store.InsertParams.normalize), so that an input with
    -- two faults names the same field in both.
    IF metadata IS NOT NULL THEN
        PERFORM fenceq_check_object('metadata', meta, 65536);
    END IF;
    PERFORM fenceq_check_name('queue', q, 64);
    PERFORM fenceq_check_name('kind', k, 128);
    PERFORM fenceq_check_object('args', a, 1048576);
    IF prio < 0 OR prio > 100 THEN
        PERFORM fenceq_invalid('priority', format('%s is outside 0–100', prio));
    END IF;
    IF attempts < 1 OR attempts > 1000 THEN
        PERFORM fenceq_invalid('max_attempts', format('%s is outside 1–1000', attempts));
    END IF;
    IF tags IS NOT NULL THEN
        FOREACH t IN ARRAY tags LOOP
            PERFORM fenceq_check_name('tags', t, 64);
            IF NOT t = ANY(tg) THEN
                tg := tg || t;
            END IF;
        END LOOP;
        IF cardinality(tg) > 20 THEN
            PERFORM fenceq_invalid('tags', format('%s tags, more than 20', cardinality(tg)));
        END IF;
    END IF;
    IF key IS NOT NULL THEN
        PERFORM fenceq_check_unique_key('unique_key', key);
    END IF;

    -- The insert of Go's store.Insert: the same columns, the same ON CONFLICT target and
    -- predicate (a key as given, held in the unfinished states: mask 15), so that Go and
    -- SQL enqueues of one key collide. The holder can leave the states that hold the
    -- key between the conflicting insert and the read of it; then the insert is tried
    -- again, as Go does.
    FOR try IN 1..5 LOOP
        INSERT INTO fenceq_jobs AS j (queue, kind, args, priority, run_at, max_attempts, unique_key, state,
            metadata, unique_states, tags)
        VALUES (q, k, a, prio, at, attempts, key,
            CASE WHEN at > now() THEN 'scheduled' ELSE 'available' END,
            meta, CASE WHEN key IS NOT NULL THEN 15 END, tg)
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND fenceq_state_in_mask(state, unique_states)
        DO NOTHING
        RETURNING j.id, j.state INTO id, st;
        IF id IS NOT NULL THEN
            existing := false;
            -- On plain PostgreSQL the insert trigger has notified the queue. A Citus
            -- distributed fenceq_jobs has no trigger (migration 000001): then the
            -- function notifies itself, on the coordinator it runs on.
            IF st = 'available' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                    WHERE tgrelid = 'fenceq_jobs'::regclass AND tgname = 'fenceq_jobs_notify_insert') THEN
                PERFORM pg_notify('fenceq_jobs:' || current_schema(), q);
            END IF;
            RETURN;
        END IF;
        SELECT j.id INTO id FROM fenceq_jobs j
        WHERE j.unique_key = key AND j.unique_key IS NOT NULL AND fenceq_state_in_mask(j.state, j.unique_states);
        IF id IS NOT NULL THEN
            existing := true;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'insert % job with unique key %: kept racing with the job holding it', k, key;
END;
$fn$;

CREATE OR REPLACE FUNCTION fenceq_complete(job_id bigint, lease_gen bigint, output jsonb DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    n int;
BEGIN
    IF output IS NOT NULL AND octet_length(output::text) > 262144 THEN
        PERFORM fenceq_invalid('output', format('%s bytes, over the limit of 262144', octet_length(output::text)));
    END IF;
    UPDATE fenceq_jobs j SET state = 'completed', finished_at = now(), lease_expires_at = NULL,
        output = fenceq_complete.output
    WHERE j.id = fenceq_complete.job_id AND j.lease_gen = fenceq_complete.lease_gen AND j.state = 'running';
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> 1 THEN
        PERFORM fenceq_lease_lost('complete', job_id, lease_gen);
    END IF;
END;
$fn$;

CREATE OR REPLACE FUNCTION fenceq_heartbeat(job_id bigint, lease_gen bigint) RETURNS timestamptz
    LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    expires timestamptz;
BEGIN
    UPDATE fenceq_jobs j SET heartbeat_at = now(),
        lease_expires_at = ((now() AT TIME ZONE 'UTC') + (j.lease_expires_at - j.heartbeat_at)) AT TIME ZONE 'UTC'
    WHERE j.id = fenceq_heartbeat.job_id AND j.lease_gen = fenceq_heartbeat.lease_gen AND j.state = 'running'
    RETURNING j.lease_expires_at INTO expires;
    IF expires IS NULL THEN
        PERFORM fenceq_lease_lost('heartbeat', job_id, lease_gen);
    END IF;
    RETURN expires;
END;
$fn$;

CREATE OR REPLACE FUNCTION fenceq_record_stale(job_id bigint, lease_gen bigint, worker text DEFAULT NULL,
    detail text DEFAULT 'complete') RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT fenceq_record_stale.job_id, fenceq_record_stale.lease_gen, worker, 'stale_write_rejected',
        fenceq_record_stale.detail
    WHERE NOT EXISTS (SELECT 1 FROM fenceq_jobs j WHERE j.id = fenceq_record_stale.job_id
        AND j.lease_gen = fenceq_record_stale.lease_gen AND j.state = 'running');
    RETURN FOUND;
END;
$fn$;

-- CREATE OR REPLACE resets a function's settings: fix the search_path again (EXECUTE
-- grants are kept).
DO $do$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['fenceq_enqueue_row(text, jsonb, text, timestamptz, int, text, int, text[], jsonb)', 'fenceq_complete(bigint, bigint, jsonb)', 'fenceq_heartbeat(bigint, bigint)', 'fenceq_record_stale(bigint, bigint, text, text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END;
$do$;
