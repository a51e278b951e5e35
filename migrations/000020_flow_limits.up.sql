-- Flow limits: concurrency limits, sequences and rate limits, enforced by the database
-- across every worker process.
--
-- A limit (fenceq_flow_limits) is named and set by the application or an operator. A
-- job enqueued under a limit carries a flow key: the limit's name and a partition (say a
-- customer id), one row of fenceq_flow_keys per key. Such a job is available like any
-- other, but the ordinary claim never takes it (the claim index leaves it out): the flow
-- claim takes it, only while its key has room, and in the same statement counts it on
-- the key row, which it locks. The count goes down in the transaction that ends the
-- lease (a completion, a failure, a revocation by the reaper or an operator), by the
-- triggers below: a revoked lease frees its slot the moment the database revokes it, and
-- a paused holder whose lease was revoked counts nowhere.

CREATE TABLE fenceq_flow_limits (
    name            text        PRIMARY KEY,
    -- At most this many running jobs per key (NULL: no concurrency limit).
    max_running     integer,
    -- At most rate_limit starts per rate_period_us microseconds per key (NULL: none).
    rate_limit      integer,
    rate_period_us  bigint,
    -- A sequence runs the jobs of a key one at a time in enqueue order: a job holds its
    -- key from its first start until it finishes, retries included.
    sequence        boolean     NOT NULL DEFAULT false,
    -- A discarded job of a sequence keeps holding it (the rest wait until an operator
    -- retries or deletes that job) instead of letting the next one go on.
    hold_on_discard boolean     NOT NULL DEFAULT false,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT fenceq_flow_limits_name_check CHECK (char_length(name) BETWEEN 1 AND 128 AND position(':' IN name) = 0),
    CONSTRAINT fenceq_flow_limits_max_check CHECK (max_running >= 1),
    CONSTRAINT fenceq_flow_limits_rate_check CHECK ((rate_limit IS NULL) = (rate_period_us IS NULL)
        AND rate_limit BETWEEN 1 AND 10000 AND rate_period_us >= 1000),
    CONSTRAINT fenceq_flow_limits_some_check CHECK (max_running IS NOT NULL OR rate_limit IS NOT NULL OR sequence),
    CONSTRAINT fenceq_flow_limits_hold_check CHECK (sequence OR NOT hold_on_discard)
);

-- One row per flow key (limit name, ':', partition), created by the first enqueue under
-- it. running counts the leases held under the key; holder is the job that holds a
-- sequence; starts are the start times within the last rate period, oldest first.
CREATE TABLE fenceq_flow_keys (
    key        text    PRIMARY KEY,
    limit_name text    NOT NULL REFERENCES fenceq_flow_limits (name) ON DELETE RESTRICT,
    running    integer NOT NULL DEFAULT 0,
    holder     bigint,
    starts     timestamptz[] NOT NULL DEFAULT '{}',
    CONSTRAINT fenceq_flow_keys_running_check CHECK (running >= 0)
);
CREATE INDEX fenceq_flow_keys_limit_idx ON fenceq_flow_keys (limit_name);

ALTER TABLE fenceq_jobs_hot ADD COLUMN flow_key text;
ALTER TABLE fenceq_jobs_history ADD COLUMN flow_key text;

-- The ordinary claim's index leaves flow jobs out, so that a pile of jobs waiting for
-- their key's room costs the ordinary claim nothing.
CREATE INDEX fenceq_jobs_claim_free_idx ON fenceq_jobs_hot (queue, priority, run_at, id)
    WHERE state = 'available' AND flow_key IS NULL;
DROP INDEX fenceq_jobs_claim_idx;
ALTER INDEX fenceq_jobs_claim_free_idx RENAME TO fenceq_jobs_claim_idx;
-- The flow claim: the keys with available jobs in a queue (visited one key at a time,
-- so a key with a long backlog costs one step), then each key's jobs in claim order.
CREATE INDEX fenceq_jobs_hot_flow_idx ON fenceq_jobs_hot (queue, flow_key, priority, run_at, id)
    WHERE state = 'available' AND flow_key IS NOT NULL;
-- A sequence's head: its unfinished jobs in enqueue order.
CREATE INDEX fenceq_jobs_hot_flow_seq_idx ON fenceq_jobs_hot (flow_key, id)
    WHERE flow_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'retryable', 'pending');

-- fenceq_flow_limit_release: a flow job's lease ended (it left running, or its generation
-- moved on), or the job finished or left the hot set. It frees the lease's slot, and
-- lets a sequence go on past the job that held it, unless that job was discarded under a
-- limit that holds on discard. The jobs it touches are found by key; ordinary jobs never
-- reach it (every trigger below has a WHEN clause on flow_key).
CREATE FUNCTION fenceq_flow_limit_release() RETURNS trigger LANGUAGE plpgsql AS $fn$
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

-- A Citus distributed table cannot have triggers: there the triggers are left out, and
-- fenceq.SetFlowLimit refuses to set a limit (see docs/citus.md).
DO $$
DECLARE
    distributed boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)'
            INTO distributed USING 'fenceq_jobs_hot'::regclass;
    END IF;
    IF NOT distributed THEN
        CREATE TRIGGER fenceq_flow_limit_release_update AFTER UPDATE ON fenceq_jobs_hot FOR EACH ROW
            WHEN (OLD.flow_key IS NOT NULL AND (
                (OLD.state = 'running' AND (NEW.state <> 'running' OR NEW.lease_gen <> OLD.lease_gen))
                OR (NEW.state IN ('completed', 'discarded', 'cancelled') AND NEW.state IS DISTINCT FROM OLD.state)))
            EXECUTE FUNCTION fenceq_flow_limit_release();
        CREATE TRIGGER fenceq_flow_limit_release_delete AFTER DELETE ON fenceq_jobs_hot FOR EACH ROW
            WHEN (OLD.flow_key IS NOT NULL)
            EXECUTE FUNCTION fenceq_flow_limit_release();
        CREATE TRIGGER fenceq_flow_limit_release_finish AFTER INSERT ON fenceq_jobs_history FOR EACH ROW
            WHEN (NEW.flow_key IS NOT NULL)
            EXECUTE FUNCTION fenceq_flow_limit_release();
        CREATE TRIGGER fenceq_flow_limit_release_history_delete AFTER DELETE ON fenceq_jobs_history FOR EACH ROW
            WHEN (OLD.flow_key IS NOT NULL)
            EXECUTE FUNCTION fenceq_flow_limit_release();
    END IF;
END;
$$;

-- The view of both tables shows the flow key too (columns can only be appended).
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
