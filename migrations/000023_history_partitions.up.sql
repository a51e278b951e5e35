-- History in partitions of a million job ids.
--
-- Every finished job writes an entry in each of history's indexes, and the entries of
-- the args index (GIN) land across the whole of it: once that index no longer fits in
-- shared buffers, each finished job reads and dirties pages all over it, and its cost
-- grows with the history retained. With history partitioned on id (ids are taken at
-- enqueue, so a partition fills over a stretch of time), the partition that takes new
-- rows has small indexes of its own, and what is retained sits in older partitions that
-- finishing jobs no longer write to. Searches read every partition, each through its
-- own indexes; a lookup by id reads one.
--
-- fenceq_jobs_history keeps its name, columns, constraints, index names and triggers: it
-- becomes the partitioned table, and the rows it held stay where they are, as its first
-- partition, fenceq_jobs_history_0 (ids up to the next multiple of a million). Later
-- partitions are named by their first id (fenceq_jobs_history_3000000) and made ahead of
-- the ids in use by fenceq_history_extend, which the worker calls; a job whose id has no
-- partition yet (the worker fell behind, or none runs) lands in the default partition,
-- fenceq_jobs_history_default, so that no finishing write ever fails for want of one.
-- fenceq_history_drop_emptied drops the partitions that retention has emptied.
--
-- Attaching the existing table scans it once, to check that its ids are below the
-- bound, under a lock that blocks writes to history. A Citus distributed schema keeps a
-- plain history table: there jobs finish in place in the hot set (docs/citus.md).
DO $$
DECLARE
    distributed boolean := false;
    seq text := pg_get_serial_sequence('fenceq_jobs_hot', 'id');
    top bigint;
    bound bigint;
    r record;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)'
            INTO distributed USING 'fenceq_jobs_hot'::regclass;
    END IF;
    IF distributed THEN
        RETURN;
    END IF;

    -- The table's triggers move to the partitioned table, which gives them to every
    -- partition; its indexes are renamed for the partition it becomes, and attached to
    -- the partitioned table's indexes of the same definition (no index is rebuilt).
    DROP TRIGGER IF EXISTS fenceq_flow_history ON fenceq_jobs_history;
    DROP TRIGGER IF EXISTS fenceq_flow_history_gone ON fenceq_jobs_history;
    DROP TRIGGER IF EXISTS fenceq_flow_limit_release_finish ON fenceq_jobs_history;
    DROP TRIGGER IF EXISTS fenceq_flow_limit_release_history_delete ON fenceq_jobs_history;
    FOR r IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE i.indrelid = 'fenceq_jobs_history'::regclass LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', r.relname,
                       'fenceq_jobs_history_0' || substr(r.relname, length('fenceq_jobs_history') + 1));
    END LOOP;
    ALTER TABLE fenceq_jobs_history RENAME TO fenceq_jobs_history_0;

    CREATE TABLE fenceq_jobs_history (LIKE fenceq_jobs_history_0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (id);
    ALTER TABLE fenceq_jobs_history ADD CONSTRAINT fenceq_jobs_history_pkey PRIMARY KEY (id);
    -- The indexes of migrations 000014, 000018 and 000022, as they were defined.
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

    EXECUTE format('SELECT greatest((SELECT max(id) FROM fenceq_jobs_history_0), (SELECT max(id) FROM fenceq_jobs_hot),
                                    (SELECT last_value FROM %s))', seq) INTO top;
    bound := (coalesce(top, 0) / 1000000 + 1) * 1000000;
    EXECUTE format('ALTER TABLE fenceq_jobs_history ATTACH PARTITION fenceq_jobs_history_0 FOR VALUES FROM (MINVALUE) TO (%s)',
                   bound);
    CREATE TABLE fenceq_jobs_history_default PARTITION OF fenceq_jobs_history DEFAULT;

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

-- The view of every job reads the partitioned table (a view refers to a table by its
-- identity, which the first partition kept). Its columns are unchanged.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'fenceq_jobs_history'::regclass) THEN
        CREATE OR REPLACE VIEW fenceq_jobs AS
        SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
               heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
               metadata, output, unique_states, tags, flow_hook, debounce_key, flow_key
        FROM fenceq_jobs_hot
        UNION ALL
        SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
               heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
               metadata, output, unique_states, tags, flow_hook, debounce_key, flow_key
        FROM fenceq_jobs_history;
    END IF;
END;
$$;

-- A trigger on the partitioned table runs on its partitions, whose names TG_TABLE_NAME
-- gives: a delete from history is told by the table not being the hot set.
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
    ELSIF TG_OP = 'DELETE' AND (TG_TABLE_NAME <> 'fenceq_jobs_hot'
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

-- fenceq_history_partitions lists history's range partitions with their bounds (the
-- first one's from is NULL: it starts at the lowest id), in id order.
CREATE FUNCTION fenceq_history_partitions(OUT name text, OUT from_id bigint, OUT to_id bigint)
    RETURNS SETOF record LANGUAGE sql STABLE AS $fn$
    SELECT c.relname::text,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''?(\d+)''?\)'))[1]::bigint,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''?(\d+)''?\)'))[1]::bigint
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'fenceq_jobs_history'::regclass
      AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
    ORDER BY 3;
$fn$;

-- fenceq_history_extend makes history's partitions, a million ids each, until they hold
-- every id up to `ahead` past the last id taken, and returns the first id they do not
-- hold (NULL when history is not partitioned, on Citus). A new partition starts above
-- every id in the default partition, so it never takes a row that is already there. It
-- waits at most lock_wait for its locks (the default partition's, which it checks), and
-- returns what it made so far if that passes: it is called again.
CREATE FUNCTION fenceq_history_extend(ahead bigint DEFAULT 4000000, lock_wait interval DEFAULT '1s')
    RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    size constant bigint := 1000000;
    last_id bigint;
    covered bigint;
    lo bigint;
    hi bigint;
    saved text := current_setting('lock_timeout');
BEGIN
    IF ahead IS NULL OR ahead < 0 THEN
        RAISE EXCEPTION 'invalid ahead: % must be zero or more', coalesce(ahead::text, 'NULL')
            USING ERRCODE = 'QF001', COLUMN = 'ahead';
    END IF;
    IF lock_wait IS NULL OR lock_wait <= interval '0' THEN
        RAISE EXCEPTION 'invalid lock_wait: % must be positive', coalesce(lock_wait::text, 'NULL')
            USING ERRCODE = 'QF001', COLUMN = 'lock_wait';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'fenceq_jobs_history'::regclass) THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT last_value FROM %s', pg_get_serial_sequence('fenceq_jobs_hot', 'id')) INTO last_id;
    SELECT max(p.to_id) INTO covered FROM fenceq_history_partitions() p;
    IF covered > last_id + ahead THEN
        RETURN covered;
    END IF;
    -- With no range partition left (all emptied and dropped), start at the partition of
    -- the next id: the ids before it are taken, and a job among them still unfinished
    -- lands in the default partition.
    lo := greatest(coalesce(covered, (last_id + 1) / size * size),
                   (SELECT max(id) + 1 FROM fenceq_jobs_history_default), 1);
    PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint::text, true);
    WHILE lo <= last_id + ahead LOOP
        hi := (lo / size + 1) * size;
        BEGIN
            -- Made apart and then attached, which locks the partitioned table against
            -- other schema changes only: finishing writes and searches go on meanwhile.
            EXECUTE format('CREATE TABLE %I (LIKE fenceq_jobs_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                           'fenceq_jobs_history_' || lo);
            EXECUTE format('ALTER TABLE fenceq_jobs_history ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)',
                           'fenceq_jobs_history_' || lo, lo, hi);
        EXCEPTION WHEN lock_not_available THEN
            -- This partition is undone with its block; those made before it stay.
            EXIT;
        END;
        covered := hi;
        lo := hi;
    END LOOP;
    PERFORM set_config('lock_timeout', saved, true);
    RETURN coalesce(covered, lo);
END;
$fn$;

-- fenceq_history_drop_emptied drops the range partitions of history that hold no row and
-- that no unfinished job can still land in (their ids are all below the hot set's
-- lowest), and returns how many it dropped. Retention empties them by deleting old rows;
-- dropping the table returns its space at once. Like fenceq_history_extend it waits at
-- most lock_wait for a lock, and stops there.
CREATE FUNCTION fenceq_history_drop_emptied(lock_wait interval DEFAULT '1s')
    RETURNS integer LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    floor_id bigint;
    r record;
    n int := 0;
    first_id bigint;
    saved text := current_setting('lock_timeout');
BEGIN
    IF lock_wait IS NULL OR lock_wait <= interval '0' THEN
        RAISE EXCEPTION 'invalid lock_wait: % must be positive', coalesce(lock_wait::text, 'NULL')
            USING ERRCODE = 'QF001', COLUMN = 'lock_wait';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'fenceq_jobs_history'::regclass) THEN
        RETURN 0;
    END IF;
    EXECUTE format('SELECT coalesce((SELECT min(id) FROM fenceq_jobs_hot), (SELECT last_value + 1 FROM %s))',
                   pg_get_serial_sequence('fenceq_jobs_hot', 'id')) INTO floor_id;
    PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint::text, true);
    FOR r IN SELECT p.name FROM fenceq_history_partitions() p WHERE p.to_id <= floor_id LOOP
        -- The primary key finds the lowest id left; the index entries of deleted rows are
        -- marked dead by the first scan that meets them, so this stays cheap on a
        -- partition that retention is part way through.
        EXECUTE format('SELECT id FROM %I ORDER BY id LIMIT 1', r.name) INTO first_id;
        CONTINUE WHEN first_id IS NOT NULL;
        BEGIN
            -- Locked before it is checked again: no finishing write can put a row in it
            -- between the check and the drop.
            EXECUTE format('LOCK TABLE fenceq_jobs_history, %I IN ACCESS EXCLUSIVE MODE', r.name);
            EXECUTE format('SELECT id FROM %I ORDER BY id LIMIT 1', r.name) INTO first_id;
            CONTINUE WHEN first_id IS NOT NULL;
            EXECUTE format('DROP TABLE %I', r.name);
            n := n + 1;
        EXCEPTION WHEN lock_not_available THEN
            EXIT;
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', saved, true);
    RETURN n;
END;
$fn$;

-- Like the SQL functions of migration 000013: the search_path fixed to this schema, and
-- no EXECUTE for PUBLIC (the schema's owner, whom fenceq's worker normally connects as,
-- keeps it; an operator grants it to a worker's role that is not the owner,
-- docs/operations.md).
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['fenceq_history_extend(bigint, interval)', 'fenceq_history_drop_emptied(interval)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END;
$$;

SELECT fenceq_history_extend();
