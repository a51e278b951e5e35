-- The hot set apart from history. fenceq_jobs_hot holds the jobs that are not finished
-- (available, scheduled, running, retryable), and the finished jobs that still hold their
-- unique key (their unique_states include their final state), so that one unique index
-- decides every unique key. fenceq_jobs_history holds every other finished job: a row is
-- written there once, by the statement that finishes the job (it deletes the job from the
-- hot set and inserts it into history, fenced on the lease as before), and never updated.
-- Claims, heartbeats, completions and the reaper touch only the hot set, whose tables and
-- indexes stay the size of the work in flight however much history is kept.
--
-- fenceq_jobs becomes a view of both, with the columns it had: readers (operators'
-- queries, outside checks, dashboards) see every job as before. The engine writes the
-- tables themselves. Writes through the view are for one-off fixes and tests: its
-- INSTEAD OF trigger compares and sets on the row's lease_gen and state as read, and
-- moves the row to the table its new state belongs in. A view of a UNION cannot be
-- locked (FOR UPDATE), so a process built for the single table cannot claim from it.

ALTER TABLE fenceq_jobs RENAME TO fenceq_jobs_hot;

CREATE TABLE fenceq_jobs_history (LIKE fenceq_jobs_hot INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
-- One subcommand per ALTER TABLE: a Citus coordinator refuses ADD CONSTRAINT with others.
ALTER TABLE fenceq_jobs_history ADD CONSTRAINT fenceq_jobs_history_pkey PRIMARY KEY (id);
ALTER TABLE fenceq_jobs_history
    ADD CONSTRAINT fenceq_jobs_history_final_check CHECK (state IN ('completed', 'discarded', 'cancelled'));
-- Retention: finished jobs by age.
CREATE INDEX fenceq_jobs_history_finished_idx ON fenceq_jobs_history (finished_at);
-- Tags, as on the hot set: only tagged jobs have entries.
CREATE INDEX fenceq_jobs_history_tags_idx ON fenceq_jobs_history USING gin (tags) WHERE tags <> '{}';

-- Jobs already finished move, in this transaction; running jobs stay with their lease
-- (lease_gen) untouched, so their holders complete with the fence or are rejected as
-- before.
WITH moved AS (
    DELETE FROM fenceq_jobs_hot
    WHERE state IN ('completed', 'discarded', 'cancelled')
      AND NOT (unique_key IS NOT NULL AND fenceq_state_in_mask(state, unique_states))
    RETURNING *)
INSERT INTO fenceq_jobs_history SELECT * FROM moved;

-- The finishing writes update in place only the jobs that hold their unique key in a
-- final state (unique_states has a bit of completed, discarded or cancelled: 112); this
-- index holds just those, so that the update arm of a batched completion finds them
-- without looking up every job of the batch again.
CREATE INDEX fenceq_jobs_hot_keeps_idx ON fenceq_jobs_hot (id)
    WHERE unique_key IS NOT NULL AND (unique_states::integer & 112) <> 0;

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

-- fenceq_jobs_write carries a write through the view to the tables: an UPDATE or DELETE
-- applies only while the row still has the lease_gen and state the statement read
-- (otherwise it counts as matching nothing), and a row goes to history when its state is
-- final and it holds no unique key in it, else to the hot set.
CREATE FUNCTION fenceq_jobs_write() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    n int;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM fenceq_jobs_hot j WHERE j.id = OLD.id AND j.lease_gen = OLD.lease_gen AND j.state = OLD.state;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n = 0 THEN
            DELETE FROM fenceq_jobs_history j
            WHERE j.id = OLD.id AND j.lease_gen = OLD.lease_gen AND j.state = OLD.state;
            GET DIAGNOSTICS n = ROW_COUNT;
        END IF;
        IF n = 0 THEN
            RETURN NULL;
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
    ELSE
        -- An INSERT through the view takes the tables' defaults for the columns it left
        -- out (a view's own column defaults are not available on Citus).
        NEW.id := COALESCE(NEW.id, nextval(pg_get_serial_sequence('fenceq_jobs_hot', 'id')));
        NEW.queue := COALESCE(NEW.queue, 'default');
        NEW.args := COALESCE(NEW.args, '{}');
        NEW.state := COALESCE(NEW.state, 'available');
        NEW.priority := COALESCE(NEW.priority, 1);
        NEW.run_at := COALESCE(NEW.run_at, now());
        NEW.attempt := COALESCE(NEW.attempt, 0);
        NEW.max_attempts := COALESCE(NEW.max_attempts, 25);
        NEW.lease_gen := COALESCE(NEW.lease_gen, 0);
        NEW.errors := COALESCE(NEW.errors, '[]');
        NEW.created_at := COALESCE(NEW.created_at, now());
        NEW.metadata := COALESCE(NEW.metadata, '{}');
        NEW.tags := COALESCE(NEW.tags, '{}');
    END IF;
    IF NEW.state IN ('completed', 'discarded', 'cancelled')
       AND NOT (NEW.unique_key IS NOT NULL AND fenceq_state_in_mask(NEW.state, NEW.unique_states)) THEN
        INSERT INTO fenceq_jobs_history SELECT NEW.*;
    ELSE
        INSERT INTO fenceq_jobs_hot OVERRIDING SYSTEM VALUE SELECT NEW.*;
    END IF;
    RETURN NEW;
END;
$fn$;

CREATE TRIGGER fenceq_jobs_write INSTEAD OF INSERT OR UPDATE OR DELETE ON fenceq_jobs
    FOR EACH ROW EXECUTE FUNCTION fenceq_jobs_write();

-- The SQL functions of migration 000013 write the tables.
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
        INSERT INTO fenceq_jobs_hot AS j (queue, kind, args, priority, run_at, max_attempts, unique_key, state,
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
            -- distributed fenceq_jobs_hot has no trigger (migration 000001): then the
            -- function notifies itself, on the coordinator it runs on.
            IF st = 'available' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                    WHERE tgrelid = 'fenceq_jobs_hot'::regclass AND tgname = 'fenceq_jobs_notify_insert') THEN
                PERFORM pg_notify('fenceq_jobs:' || current_schema(), q);
            END IF;
            RETURN;
        END IF;
        SELECT j.id INTO id FROM fenceq_jobs_hot j
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
    -- A job that holds its unique key once completed stays in the hot set; every other
    -- completed job moves to history. Either arm is one statement fenced on the lease.
    WITH d AS (
        DELETE FROM fenceq_jobs_hot j
        WHERE j.id = fenceq_complete.job_id AND j.lease_gen = fenceq_complete.lease_gen AND j.state = 'running'
          AND NOT (j.unique_key IS NOT NULL AND fenceq_state_in_mask('completed', j.unique_states))
        RETURNING j.*)
    INSERT INTO fenceq_jobs_history (id, queue, kind, args, state, priority, run_at, attempt, max_attempts,
        lease_gen, leased_by, heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at,
        finished_at, metadata, output, unique_states, tags)
    SELECT d.id, d.queue, d.kind, d.args, 'completed', d.priority, d.run_at, d.attempt, d.max_attempts,
        d.lease_gen, d.leased_by, d.heartbeat_at, NULL, d.attempted_at, d.unique_key, d.errors, d.created_at,
        now(), d.metadata, fenceq_complete.output, d.unique_states, d.tags
    FROM d;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 0 THEN
        UPDATE fenceq_jobs_hot j SET state = 'completed', finished_at = now(), lease_expires_at = NULL,
            output = fenceq_complete.output
        WHERE j.id = fenceq_complete.job_id AND j.lease_gen = fenceq_complete.lease_gen AND j.state = 'running'
          AND j.unique_key IS NOT NULL AND fenceq_state_in_mask('completed', j.unique_states);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
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
    UPDATE fenceq_jobs_hot j SET heartbeat_at = now(),
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
    WHERE NOT EXISTS (SELECT 1 FROM fenceq_jobs_hot j WHERE j.id = fenceq_record_stale.job_id
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
