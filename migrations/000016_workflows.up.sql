-- Workflows and dependencies, batches, signals and timers (docs/flow.md), decided by the
-- database in the transaction of the write that ends a job, so that each happens once
-- whichever worker process makes that write.
--
-- * A job may depend on other jobs (fenceq_job_deps). It waits in the state pending, with
--   a counter of the dependencies not yet done (fenceq_flow_jobs.deps_left). The
--   statement that finishes a dependency decrements the counter under its row lock, so
--   that of two dependencies finishing at the same instant exactly one sees zero, and
--   that one makes the job available (or scheduled, when its run_at is ahead). A
--   dependency discarded or cancelled cancels its dependents (transitively) unless they
--   tolerate it; an operator's retry of it brings back the dependents it cancelled.
-- * A workflow (fenceq_workflows) names a set of such jobs, its tasks; a batch is a
--   workflow whose callback task depends on every member and tolerates their failures.
-- * A job may wait for a named signal, or until a time, holding no lease
--   (fenceq_job_waits); a signal (fenceq_signals) is kept once per (job, name) and wakes
--   the wait it matches, once.
--
-- The decisions run in triggers on the job tables, so that every path that ends a job
-- takes them: the worker's completions (single, batched, in Job.Commit), fenceq_complete,
-- the reaper, an operator's cancel, retry or requeue. Each trigger has a WHEN condition on
-- the job's flow_hook column, set only on jobs that have dependents, belong to a
-- workflow or batch, or waited: other jobs pay the test of one column.
--
-- SQLSTATEs besides those of migration 000013: QF004 not found (the job named does not
-- exist). On a Citus distributed schema, where triggers are not used, these features are
-- refused (SQLSTATE 0A000, feature_not_supported).

-- flow_hook: the job's end, its move back out of a final state, or its deletion runs the
-- flow decisions above. NULL (false) for every other job.
ALTER TABLE fenceq_jobs_hot ADD COLUMN flow_hook boolean;
ALTER TABLE fenceq_jobs_history ADD COLUMN flow_hook boolean;

-- The view of both tables gains the column, appended at the end (CREATE OR REPLACE VIEW
-- can only append). Migrations that add job columns each append their own here.
CREATE OR REPLACE VIEW fenceq_jobs AS
SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
       heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
       metadata, output, unique_states, tags, flow_hook
FROM fenceq_jobs_hot
UNION ALL
SELECT id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
       heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at,
       metadata, output, unique_states, tags, flow_hook
FROM fenceq_jobs_history;

-- A workflow or a batch: a name for a set of jobs enqueued together.
CREATE TABLE fenceq_workflows (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL,
    kind       text NOT NULL DEFAULT 'workflow'
        CONSTRAINT fenceq_workflows_kind_check CHECK (kind IN ('workflow', 'batch')),
    created_at timestamptz NOT NULL DEFAULT now());

-- One row per job that has dependencies or belongs to a workflow or batch. deps_left
-- counts its dependencies not yet done; its row lock serializes the dependencies that
-- finish at once. blocked_by is the dependency whose discard or cancel cancelled it.
-- dep_counts: when the job is released, its dependencies' final states are counted into
-- its metadata (a batch's callback).
CREATE TABLE fenceq_flow_jobs (
    job_id      bigint PRIMARY KEY,
    workflow_id bigint REFERENCES fenceq_workflows (id) ON DELETE CASCADE,
    task        text,
    deps_left   int NOT NULL DEFAULT 0,
    blocked_by  bigint,
    dep_counts  boolean NOT NULL DEFAULT false,
    CONSTRAINT fenceq_flow_jobs_task_key UNIQUE (workflow_id, task));
CREATE INDEX fenceq_flow_jobs_blocked_idx ON fenceq_flow_jobs (blocked_by) WHERE blocked_by IS NOT NULL;

-- Job job_id runs after job dep_id. done: the dependency counts as done for it (it
-- completed, or it ended otherwise and tolerate is set).
CREATE TABLE fenceq_job_deps (
    job_id   bigint NOT NULL,
    dep_id   bigint NOT NULL,
    tolerate boolean NOT NULL DEFAULT false,
    done     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (job_id, dep_id));
CREATE INDEX fenceq_job_deps_dep_idx ON fenceq_job_deps (dep_id);

-- A signal sent to a job: at most one per (job, name). delivered_at and delivered_gen
-- record the wait it ended (the lease generation of the attempt that waited), set once.
CREATE TABLE fenceq_signals (
    job_id        bigint NOT NULL,
    name          text NOT NULL,
    payload       jsonb,
    sent_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at  timestamptz,
    delivered_gen bigint,
    PRIMARY KEY (job_id, name));

-- A job's latest wait: for a signal (signal set) or a timer (signal NULL), made by the
-- attempt of lease generation gen, until deadline (NULL: no timeout).
CREATE TABLE fenceq_job_waits (
    job_id    bigint PRIMARY KEY,
    signal    text,
    gen       bigint NOT NULL,
    waited_at timestamptz NOT NULL DEFAULT now(),
    deadline  timestamptz);

-- fenceq_flow_check refuses the features of this migration where their triggers are
-- missing: a Citus distributed schema.
CREATE FUNCTION fenceq_flow_check() RETURNS void
    LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                   WHERE tgrelid = 'fenceq_jobs_history'::regclass AND tgname = 'fenceq_flow_history') THEN
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
            MESSAGE = 'fenceq: dependencies, workflows, batches, signals and waits are not supported on a Citus distributed schema';
    END IF;
END;
$fn$;

-- fenceq_flow_release gives a pending job its turn: available, or scheduled when its
-- run_at is still ahead. A job released now goes to the end of its priority's line
-- (run_at = now()). For a batch's callback, its dependencies' final states are counted
-- into its metadata under "batch".
CREATE FUNCTION fenceq_flow_release(p_job bigint) RETURNS void
    LANGUAGE plpgsql AS $fn$
DECLARE
    v_counts jsonb;
    v_queue text;
    v_state text;
BEGIN
    IF (SELECT f.dep_counts FROM fenceq_flow_jobs f WHERE f.job_id = p_job) THEN
        SELECT jsonb_build_object('id', f.workflow_id,
                   'completed', count(*) FILTER (WHERE s.state = 'completed'),
                   'discarded', count(*) FILTER (WHERE s.state = 'discarded'),
                   'cancelled', count(*) FILTER (WHERE s.state = 'cancelled'))
        INTO v_counts
        FROM fenceq_flow_jobs f
        JOIN fenceq_job_deps d ON d.job_id = f.job_id
        LEFT JOIN fenceq_jobs s ON s.id = d.dep_id
        WHERE f.job_id = p_job
        GROUP BY f.workflow_id;
    END IF;
    UPDATE fenceq_jobs_hot j
    SET state = CASE WHEN j.run_at > now() THEN 'scheduled' ELSE 'available' END,
        run_at = GREATEST(j.run_at, now()),
        metadata = CASE WHEN v_counts IS NULL THEN j.metadata ELSE j.metadata || jsonb_build_object('batch', v_counts) END
    WHERE j.id = p_job AND j.state = 'pending'
    RETURNING j.queue, j.state INTO v_queue, v_state;
    IF v_state = 'available' THEN
        PERFORM pg_notify('fenceq_jobs:' || current_schema(), v_queue);
    END IF;
END;
$fn$;

-- fenceq_flow_block cancels the pending job p_job because its dependency p_dep ended in
-- p_state without being tolerated, and records that dependency in blocked_by. The job
-- moves to history (or stays in the hot set when it holds its unique key once
-- cancelled) with the ordinary finishing moves, in two statements of their own, so that
-- columns added to the job tables later are carried along.
CREATE FUNCTION fenceq_flow_block(p_job bigint, p_dep bigint, p_state text) RETURNS void
    LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE fenceq_jobs_hot j
    SET state = 'cancelled', finished_at = now(),
        errors = j.errors || jsonb_build_object('at', now(), 'attempt', j.attempt, 'lease_gen', j.lease_gen,
            'error', format('dependency %s was %s', p_dep, p_state))
    WHERE j.id = p_job AND j.state = 'pending';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE fenceq_flow_jobs f SET blocked_by = p_dep WHERE f.job_id = p_job;
    WITH d AS (
        DELETE FROM fenceq_jobs_hot j
        WHERE j.id = p_job AND j.state = 'cancelled'
          AND NOT (j.unique_key IS NOT NULL AND fenceq_state_in_mask(j.state, j.unique_states))
        RETURNING j.*)
    INSERT INTO fenceq_jobs_history SELECT * FROM d;
END;
$fn$;

-- fenceq_flow_ended takes the decisions of job p_job having reached the final state
-- p_state: each dependent for which it counts as done (completed, or tolerated) has its
-- counter decremented under the counter's row lock, and is released at zero; each other
-- dependent is cancelled. Dependents are visited in id order, so that two jobs ending
-- at once lock shared counters in the same order. It may run twice for one end (an
-- in-place finish and the move to history): every step is guarded by the state it
-- changes, so the second run changes nothing.
CREATE FUNCTION fenceq_flow_ended(p_job bigint, p_state text) RETURNS void
    LANGUAGE plpgsql AS $fn$
DECLARE
    e record;
    v_left int;
BEGIN
    FOR e IN SELECT d.job_id, d.tolerate FROM fenceq_job_deps d
             WHERE d.dep_id = p_job AND NOT d.done ORDER BY d.job_id LOOP
        IF p_state = 'completed' OR e.tolerate THEN
            UPDATE fenceq_job_deps d SET done = true WHERE d.job_id = e.job_id AND d.dep_id = p_job AND NOT d.done;
            IF FOUND THEN
                UPDATE fenceq_flow_jobs f SET deps_left = f.deps_left - 1 WHERE f.job_id = e.job_id
                RETURNING f.deps_left INTO v_left;
                IF v_left = 0 THEN
                    PERFORM fenceq_flow_release(e.job_id);
                END IF;
            END IF;
        ELSE
            PERFORM fenceq_flow_block(e.job_id, p_job, p_state);
        END IF;
    END LOOP;
END;
$fn$;

-- fenceq_flow_reopened takes the decisions of job p_job having left a final state (an
-- operator's retry or requeue): each dependent it cancelled becomes pending again and
-- waits for it, unless another of its dependencies has failed without being tolerated,
-- which then keeps it cancelled in its name. A dependent made pending again leaves its
-- own final state, so its own dependents follow, transitively.
CREATE FUNCTION fenceq_flow_reopened(p_job bigint) RETURNS void
    LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
    v_other bigint;
BEGIN
    FOR r IN SELECT f.job_id FROM fenceq_flow_jobs f WHERE f.blocked_by = p_job ORDER BY f.job_id LOOP
        SELECT d.dep_id INTO v_other
        FROM fenceq_job_deps d JOIN fenceq_jobs s ON s.id = d.dep_id
        WHERE d.job_id = r.job_id AND d.dep_id <> p_job AND NOT d.done AND s.state IN ('discarded', 'cancelled')
        ORDER BY d.dep_id LIMIT 1;
        IF v_other IS NOT NULL THEN
            UPDATE fenceq_flow_jobs f SET blocked_by = v_other WHERE f.job_id = r.job_id;
            CONTINUE;
        END IF;
        UPDATE fenceq_flow_jobs f SET blocked_by = NULL WHERE f.job_id = r.job_id;
        WITH d AS (
            DELETE FROM fenceq_jobs_history j WHERE j.id = r.job_id AND j.state = 'cancelled' RETURNING j.*)
        INSERT INTO fenceq_jobs_hot OVERRIDING SYSTEM VALUE SELECT * FROM d;
        UPDATE fenceq_jobs_hot j SET state = 'pending', finished_at = NULL
        WHERE j.id = r.job_id AND j.state = 'cancelled';
    END LOOP;
END;
$fn$;

-- fenceq_flow_gone cleans up after a job that no longer exists (retention, an operator's
-- delete). A job deleted before it finished counts as cancelled for its dependents. It
-- runs at commit (a deferred constraint trigger), when a job that only moved between
-- the tables is found in its new one.
CREATE FUNCTION fenceq_flow_gone(p_job bigint, p_state text) RETURNS void
    LANGUAGE plpgsql AS $fn$
DECLARE
    v_workflow bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM fenceq_jobs_hot WHERE id = p_job)
       OR EXISTS (SELECT 1 FROM fenceq_jobs_history WHERE id = p_job) THEN
        RETURN;
    END IF;
    IF p_state NOT IN ('completed', 'discarded', 'cancelled') THEN
        PERFORM fenceq_flow_ended(p_job, 'cancelled');
    END IF;
    DELETE FROM fenceq_flow_jobs f WHERE f.job_id = p_job RETURNING f.workflow_id INTO v_workflow;
    DELETE FROM fenceq_job_deps d WHERE d.job_id = p_job;
    DELETE FROM fenceq_job_deps d WHERE d.dep_id = p_job AND d.done;
    DELETE FROM fenceq_signals s WHERE s.job_id = p_job;
    DELETE FROM fenceq_job_waits w WHERE w.job_id = p_job;
    IF v_workflow IS NOT NULL THEN
        DELETE FROM fenceq_workflows w WHERE w.id = v_workflow
            AND NOT EXISTS (SELECT 1 FROM fenceq_flow_jobs f WHERE f.workflow_id = v_workflow);
    END IF;
END;
$fn$;

-- fenceq_flow_trigger runs the decisions for one row of a job table whose flow_hook is
-- set: a job that reached a final state (inserted into history, or finished in place in
-- the hot set), or one that left it (moved back to the hot set, or updated in place).
CREATE FUNCTION fenceq_flow_trigger() RETURNS trigger
    LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM fenceq_flow_gone(OLD.id, OLD.state);
    ELSIF NEW.state IN ('completed', 'discarded', 'cancelled') THEN
        IF TG_OP = 'INSERT' OR OLD.state NOT IN ('completed', 'discarded', 'cancelled') THEN
            PERFORM fenceq_flow_ended(NEW.id, NEW.state);
        END IF;
    ELSIF TG_OP = 'INSERT' OR OLD.state IN ('completed', 'discarded', 'cancelled') THEN
        PERFORM fenceq_flow_reopened(NEW.id);
    END IF;
    RETURN NULL;
END;
$fn$;

-- The triggers, except on a Citus distributed schema (no triggers there; the features
-- are refused by fenceq_flow_check).
DO $$
DECLARE
    distributed boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)'
            INTO distributed USING 'fenceq_jobs_hot'::regclass;
    END IF;
    IF NOT distributed THEN
        CREATE TRIGGER fenceq_flow_history AFTER INSERT ON fenceq_jobs_history
            FOR EACH ROW WHEN (NEW.flow_hook) EXECUTE FUNCTION fenceq_flow_trigger();
        CREATE TRIGGER fenceq_flow_hot_insert AFTER INSERT ON fenceq_jobs_hot
            FOR EACH ROW WHEN (NEW.flow_hook) EXECUTE FUNCTION fenceq_flow_trigger();
        CREATE TRIGGER fenceq_flow_hot_update AFTER UPDATE OF state ON fenceq_jobs_hot
            FOR EACH ROW WHEN (NEW.flow_hook AND OLD.state IS DISTINCT FROM NEW.state)
            EXECUTE FUNCTION fenceq_flow_trigger();
        CREATE CONSTRAINT TRIGGER fenceq_flow_hot_gone AFTER DELETE ON fenceq_jobs_hot
            DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW WHEN (OLD.flow_hook) EXECUTE FUNCTION fenceq_flow_trigger();
        CREATE CONSTRAINT TRIGGER fenceq_flow_history_gone AFTER DELETE ON fenceq_jobs_history
            DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW WHEN (OLD.flow_hook) EXECUTE FUNCTION fenceq_flow_trigger();
    END IF;
END;
$$;

-- fenceq_flow_link gives job p_job, just enqueued and not yet started, its place in a
-- workflow (p_workflow, task p_task; NULL for none) and its dependencies p_deps, of
-- which those in p_tolerate count as done even when they are discarded or cancelled. A
-- job with dependencies becomes pending until they are done; with none left (all
-- completed already) it keeps its turn. A dependency already failed and not tolerated
-- cancels it at once. Each dependency gets flow_hook, under its row lock, so that its end
-- is seen: a dependency finishing concurrently either waits for this transaction and
-- then sees the link, or has finished, and its final state is read here. It returns the
-- job's state.
CREATE FUNCTION fenceq_flow_link(p_job bigint, p_deps bigint[], p_tolerate bigint[] DEFAULT '{}',
    p_workflow bigint DEFAULT NULL, p_task text DEFAULT NULL, p_dep_counts boolean DEFAULT false) RETURNS text
    LANGUAGE plpgsql AS $fn$
DECLARE
    v_dep bigint;
    v_state text;
    v_done boolean;
    v_tol boolean;
    v_left int := 0;
    v_blocked bigint;
    v_blocked_state text;
    v_deps bigint[];
BEGIN
    PERFORM fenceq_flow_check();
    SELECT COALESCE(array_agg(DISTINCT x ORDER BY x), '{}') INTO v_deps FROM unnest(COALESCE(p_deps, '{}')) x;
    IF p_job = ANY(v_deps) THEN
        PERFORM fenceq_invalid('depends_on', format('job %s cannot depend on itself', p_job));
    END IF;
    UPDATE fenceq_jobs_hot j
    SET state = CASE WHEN cardinality(v_deps) > 0 THEN 'pending' ELSE j.state END, flow_hook = true
    WHERE j.id = p_job AND j.state IN ('available', 'scheduled')
    RETURNING j.state INTO v_state;
    IF NOT FOUND THEN
        SELECT j.state INTO v_state FROM fenceq_jobs j WHERE j.id = p_job;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'QF004', MESSAGE = format('fenceq: job %s does not exist', p_job);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'QF003',
            MESSAGE = format('fenceq: job %s is %s: only a job that has not started can get dependencies', p_job, v_state);
    END IF;
    BEGIN
        INSERT INTO fenceq_flow_jobs (job_id, workflow_id, task, dep_counts)
        VALUES (p_job, p_workflow, p_task, COALESCE(p_dep_counts, false));
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION USING ERRCODE = 'QF003',
            MESSAGE = format('fenceq: job %s already has its dependencies, or task %s is already in workflow %s',
                p_job, p_task, p_workflow);
    END;
    FOREACH v_dep IN ARRAY v_deps LOOP
        v_tol := v_dep = ANY(COALESCE(p_tolerate, '{}'));
        UPDATE fenceq_jobs_hot j SET flow_hook = true
        WHERE j.id = v_dep AND j.state NOT IN ('completed', 'discarded', 'cancelled');
        IF FOUND THEN
            v_done := false;
        ELSE
            SELECT j.state INTO v_state FROM fenceq_jobs j WHERE j.id = v_dep;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'QF004',
                    MESSAGE = format('fenceq: dependency %s of job %s does not exist', v_dep, p_job);
            END IF;
            v_done := v_state = 'completed' OR v_tol;
            IF NOT v_done AND v_blocked IS NULL THEN
                v_blocked := v_dep;
                v_blocked_state := v_state;
            END IF;
        END IF;
        IF NOT v_done THEN
            v_left := v_left + 1;
        END IF;
        INSERT INTO fenceq_job_deps (job_id, dep_id, tolerate, done) VALUES (p_job, v_dep, v_tol, v_done);
    END LOOP;
    UPDATE fenceq_flow_jobs f SET deps_left = v_left WHERE f.job_id = p_job;
    IF v_blocked IS NOT NULL THEN
        PERFORM fenceq_flow_block(p_job, v_blocked, v_blocked_state);
    ELSIF v_left = 0 AND cardinality(v_deps) > 0 THEN
        PERFORM fenceq_flow_release(p_job);
    END IF;
    RETURN (SELECT j.state FROM fenceq_jobs j WHERE j.id = p_job);
END;
$fn$;

-- fenceq_flow_send delivers signal p_name with p_payload to job p_job: it is kept (one
-- per job and name; a second send changes nothing) and, when the job waits for it under
-- its current wait, wakes the job, once. It locks the job's row first, as the wait does
-- (fenceq_flow_wait), so that a send and a wait are serialized and each sees the
-- other: a signal sent before the wait ends it at once. It returns 'delivered' (the job
-- was woken), 'kept' (sent; the job is not waiting for it now) or 'duplicate' (sent
-- before, even if the job has finished since).
CREATE FUNCTION fenceq_flow_send(p_job bigint, p_name text, p_payload jsonb) RETURNS text
    LANGUAGE plpgsql AS $fn$
DECLARE
    v_state text;
    v_gen bigint;
    v_queue text;
BEGIN
    PERFORM fenceq_flow_check();
    PERFORM fenceq_check_name('name', p_name, 64);
    IF p_payload IS NOT NULL AND octet_length(p_payload::text) > 65536 THEN
        PERFORM fenceq_invalid('payload', format('%s bytes, over the limit of 65536', octet_length(p_payload::text)));
    END IF;
    SELECT j.state, j.lease_gen INTO v_state, v_gen FROM fenceq_jobs_hot j WHERE j.id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        SELECT j.state INTO v_state FROM fenceq_jobs_history j WHERE j.id = p_job;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'QF004', MESSAGE = format('fenceq: job %s does not exist', p_job);
        END IF;
    END IF;
    -- A signal sent again is a duplicate whatever the job has done since, so that a
    -- sender may retry.
    IF EXISTS (SELECT 1 FROM fenceq_signals s WHERE s.job_id = p_job AND s.name = p_name) THEN
        RETURN 'duplicate';
    END IF;
    IF v_state IN ('completed', 'discarded', 'cancelled') THEN
        RAISE EXCEPTION USING ERRCODE = 'QF003',
            MESSAGE = format('fenceq: job %s is %s: a finished job takes no signal', p_job, v_state);
    END IF;
    INSERT INTO fenceq_signals (job_id, name, payload) VALUES (p_job, p_name, p_payload)
    ON CONFLICT (job_id, name) DO NOTHING;
    IF NOT FOUND THEN
        RETURN 'duplicate';
    END IF;
    UPDATE fenceq_jobs_hot j SET flow_hook = true WHERE j.id = p_job AND j.flow_hook IS NOT TRUE;
    UPDATE fenceq_jobs_hot j SET state = 'available', run_at = now()
    FROM fenceq_job_waits w
    WHERE j.id = p_job AND w.job_id = j.id AND w.signal = p_name AND w.gen = j.lease_gen
      AND j.state IN ('pending', 'scheduled')
    RETURNING j.queue INTO v_queue;
    IF NOT FOUND THEN
        RETURN 'kept';
    END IF;
    UPDATE fenceq_signals s SET delivered_at = now(), delivered_gen = v_gen
    WHERE s.job_id = p_job AND s.name = p_name AND s.delivered_at IS NULL;
    PERFORM pg_notify('fenceq_jobs:' || current_schema(), v_queue);
    RETURN 'delivered';
END;
$fn$;

-- fenceq_flow_wait ends the attempt of lease (p_job, p_gen) with a wait, releasing the
-- lease without using up an attempt: for signal p_signal (NULL: a timer), until
-- p_deadline (NULL: no timeout; a signal wait only). The job becomes pending (a signal
-- wait without a timeout) or scheduled at the deadline; at the deadline it becomes
-- available through the promotion pass, and its wait has ended without the signal. A
-- signal already sent ends the wait at once (the job is made available). It raises QF002
-- when the lease is gone. It returns the job's new state.
CREATE FUNCTION fenceq_flow_wait(p_job bigint, p_gen bigint, p_signal text, p_deadline timestamptz)
    RETURNS text
    LANGUAGE plpgsql AS $fn$
DECLARE
    v_sent boolean := false;
    v_state text;
    v_queue text;
BEGIN
    PERFORM fenceq_flow_check();
    IF p_signal IS NOT NULL THEN
        PERFORM fenceq_check_name('signal', p_signal, 64);
    ELSIF p_deadline IS NULL THEN
        PERFORM fenceq_invalid('deadline', 'a timer needs a deadline');
    END IF;
    -- The lock first: a sender holding it has committed its signal before the next
    -- statement reads.
    PERFORM 1 FROM fenceq_jobs_hot j WHERE j.id = p_job AND j.lease_gen = p_gen AND j.state = 'running' FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM fenceq_lease_lost('wait', p_job, p_gen);
    END IF;
    IF p_signal IS NOT NULL THEN
        UPDATE fenceq_signals s SET delivered_at = now(), delivered_gen = p_gen
        WHERE s.job_id = p_job AND s.name = p_signal AND s.delivered_at IS NULL;
        v_sent := FOUND OR EXISTS (SELECT 1 FROM fenceq_signals s WHERE s.job_id = p_job AND s.name = p_signal);
    END IF;
    UPDATE fenceq_jobs_hot j
    SET state = CASE WHEN v_sent THEN 'available'
                     WHEN p_deadline IS NULL THEN 'pending'
                     WHEN p_deadline > now() THEN 'scheduled'
                     ELSE 'available' END,
        run_at = CASE WHEN NOT v_sent AND p_deadline > now() THEN p_deadline ELSE now() END,
        max_attempts = j.max_attempts + 1, leased_by = NULL, lease_expires_at = NULL, flow_hook = true
    WHERE j.id = p_job AND j.lease_gen = p_gen AND j.state = 'running'
    RETURNING j.state, j.queue INTO v_state, v_queue;
    INSERT INTO fenceq_job_waits AS w (job_id, signal, gen, waited_at, deadline)
    VALUES (p_job, p_signal, p_gen, now(), p_deadline)
    ON CONFLICT (job_id) DO UPDATE SET signal = EXCLUDED.signal, gen = EXCLUDED.gen,
        waited_at = EXCLUDED.waited_at, deadline = EXCLUDED.deadline;
    IF v_state = 'available' THEN
        PERFORM pg_notify('fenceq_jobs:' || current_schema(), v_queue);
    END IF;
    RETURN v_state;
END;
$fn$;

-- fenceq_complete (migration 000014) named the columns it copied to history, and so
-- would drop flow_hook: it now completes the job in place, fenced as before, and moves it
-- with every column, so that the triggers above see the end of a job completed from SQL
-- and columns added later are carried along. Its signature, grants and errors are
-- unchanged; going down keeps this body, which is right for schema 15 too.
CREATE OR REPLACE FUNCTION fenceq_complete(job_id bigint, lease_gen bigint, output jsonb DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    IF output IS NOT NULL AND octet_length(output::text) > 262144 THEN
        PERFORM fenceq_invalid('output', format('%s bytes, over the limit of 262144', octet_length(output::text)));
    END IF;
    UPDATE fenceq_jobs_hot j SET state = 'completed', finished_at = now(), lease_expires_at = NULL,
        output = fenceq_complete.output
    WHERE j.id = fenceq_complete.job_id AND j.lease_gen = fenceq_complete.lease_gen AND j.state = 'running';
    IF NOT FOUND THEN
        PERFORM fenceq_lease_lost('complete', job_id, lease_gen);
    END IF;
    -- A job that holds its unique key once completed stays in the hot set.
    WITH d AS (
        DELETE FROM fenceq_jobs_hot j
        WHERE j.id = fenceq_complete.job_id AND j.state = 'completed'
          AND NOT (j.unique_key IS NOT NULL AND fenceq_state_in_mask('completed', j.unique_states))
        RETURNING j.*)
    INSERT INTO fenceq_jobs_history SELECT * FROM d;
END;
$fn$;

-- The functions for other languages (docs/other-languages.md), SECURITY DEFINER like
-- those of migration 000013.

-- fenceq_send_signal sends signal name with payload to job job_id (fenceq_flow_send).
CREATE FUNCTION fenceq_send_signal(job_id bigint, name text, payload jsonb DEFAULT NULL) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    RETURN fenceq_flow_send(job_id, name, payload);
END;
$fn$;

-- fenceq_wait ends the attempt of lease (job_id, lease_gen) with a wait for signal (NULL:
-- a timer) until deadline (fenceq_flow_wait); commit right after it.
CREATE FUNCTION fenceq_wait(job_id bigint, lease_gen bigint, signal text DEFAULT NULL,
    deadline timestamptz DEFAULT NULL) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    RETURN fenceq_flow_wait(job_id, lease_gen, signal, deadline);
END;
$fn$;

-- fenceq_enqueue_workflow enqueues a workflow in the caller's transaction: name, and
-- tasks, a JSON array of objects, each {"name", "kind", "args", "queue", "priority",
-- "run_at", "max_attempts", "tags", "metadata", "unique_key", "after": [task names],
-- "tolerate": [task names among "after"], "after_jobs": [job ids]}, every task after the
-- tasks it names in "after" (so that no cycle can be written). It returns one row per
-- task: the workflow's id, the task's name and its job's id.
CREATE FUNCTION fenceq_enqueue_workflow(name text, tasks jsonb)
    RETURNS TABLE (workflow_id bigint, task text, job_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER AS $fn$
#variable_conflict use_variable
DECLARE
    v_wf bigint;
    t jsonb;
    v_name text;
    v_ids jsonb := '{}';
    v_deps bigint[];
    v_tol bigint[];
    v_dep text;
    v_job record;
    i int := 0;
BEGIN
    PERFORM fenceq_flow_check();
    PERFORM fenceq_check_name('name', fenceq_enqueue_workflow.name, 128);
    IF jsonb_typeof(tasks) IS DISTINCT FROM 'array' OR jsonb_array_length(tasks) = 0 THEN
        PERFORM fenceq_invalid('tasks', 'must be a non-empty JSON array of task objects');
    END IF;
    INSERT INTO fenceq_workflows AS w (name) VALUES (fenceq_enqueue_workflow.name) RETURNING w.id INTO v_wf;
    FOR t IN SELECT x FROM jsonb_array_elements(tasks) x LOOP
        i := i + 1;
        IF jsonb_typeof(t) IS DISTINCT FROM 'object' THEN
            PERFORM fenceq_invalid('tasks', format('task %s is not a JSON object', i));
        END IF;
        v_name := t->>'name';
        PERFORM fenceq_check_name(format('tasks[%s].name', i), v_name, 128);
        IF v_ids ? v_name THEN
            PERFORM fenceq_invalid(format('tasks[%s].name', i), format('task %s is named twice', v_name));
        END IF;
        v_deps := '{}';
        v_tol := '{}';
        FOR v_dep IN SELECT jsonb_array_elements_text(COALESCE(t->'after', '[]')) LOOP
            IF NOT v_ids ? v_dep THEN
                PERFORM fenceq_invalid(format('tasks[%s].after', i),
                    format('task %s runs after %s, which is not a task listed before it', v_name, v_dep));
            END IF;
            v_deps := v_deps || (v_ids->>v_dep)::bigint;
        END LOOP;
        FOR v_dep IN SELECT jsonb_array_elements_text(COALESCE(t->'tolerate', '[]')) LOOP
            IF NOT (COALESCE(t->'after', '[]') ? v_dep) THEN
                PERFORM fenceq_invalid(format('tasks[%s].tolerate', i),
                    format('task %s tolerates %s, which is not among its "after"', v_name, v_dep));
            END IF;
            v_tol := v_tol || (v_ids->>v_dep)::bigint;
        END LOOP;
        v_deps := v_deps || ARRAY(SELECT jsonb_array_elements_text(COALESCE(t->'after_jobs', '[]'))::bigint);
        v_job := fenceq_enqueue_row(t->>'kind', COALESCE(t->'args', '{}'), t->>'queue', (t->>'run_at')::timestamptz,
            (t->>'priority')::int, t->>'unique_key', (t->>'max_attempts')::int,
            ARRAY(SELECT jsonb_array_elements_text(t->'tags')), t->'metadata');
        IF v_job.existing THEN
            RAISE EXCEPTION USING ERRCODE = 'QF003', MESSAGE = format(
                'fenceq: task %s: unique key %s is held by job %s; a workflow''s tasks must be new jobs',
                v_name, t->>'unique_key', v_job.id);
        END IF;
        PERFORM fenceq_flow_link(v_job.id, v_deps, v_tol, v_wf, v_name);
        v_ids := v_ids || jsonb_build_object(v_name, v_job.id);
        workflow_id := v_wf;
        task := v_name;
        job_id := v_job.id;
        RETURN NEXT;
    END LOOP;
END;
$fn$;

-- Fix each function's search_path to this schema; the three functions for other
-- languages run only for the roles an operator grants them to.
DO $do$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'fenceq_flow_check()',
        'fenceq_flow_release(bigint)',
        'fenceq_flow_block(bigint, bigint, text)',
        'fenceq_flow_ended(bigint, text)',
        'fenceq_flow_reopened(bigint)',
        'fenceq_flow_gone(bigint, text)',
        'fenceq_flow_trigger()',
        'fenceq_flow_link(bigint, bigint[], bigint[], bigint, text, boolean)',
        'fenceq_flow_send(bigint, text, jsonb)',
        'fenceq_flow_wait(bigint, bigint, text, timestamptz)',
        'fenceq_send_signal(bigint, text, jsonb)',
        'fenceq_wait(bigint, bigint, text, timestamptz)',
        'fenceq_enqueue_workflow(text, jsonb)',
        'fenceq_complete(bigint, bigint, jsonb)'
    ] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    FOREACH f IN ARRAY ARRAY[
        'fenceq_send_signal(bigint, text, jsonb)',
        'fenceq_wait(bigint, bigint, text, timestamptz)',
        'fenceq_enqueue_workflow(text, jsonb)'
    ] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END;
$do$;
