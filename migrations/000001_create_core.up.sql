-- fenceq core: jobs, workers, queues, lease events.
-- Tables are unqualified so search_path picks the schema.

CREATE TABLE fenceq_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL DEFAULT 'default',
    kind             text        NOT NULL,
    args             jsonb       NOT NULL DEFAULT '{}',
    state            text        NOT NULL DEFAULT 'available',
    priority         smallint    NOT NULL DEFAULT 1,
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 25,
    lease_gen        bigint      NOT NULL DEFAULT 0,
    leased_by        text,
    heartbeat_at     timestamptz,
    lease_expires_at timestamptz,
    attempted_at     timestamptz,
    unique_key       text,
    errors           jsonb       NOT NULL DEFAULT '[]',
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    CONSTRAINT fenceq_jobs_state_check CHECK (state IN
        ('available', 'scheduled', 'running', 'retryable', 'completed', 'discarded', 'cancelled')),
    CONSTRAINT fenceq_jobs_queue_check CHECK (char_length(queue) BETWEEN 1 AND 64),
    CONSTRAINT fenceq_jobs_kind_check CHECK (char_length(kind) BETWEEN 1 AND 128),
    CONSTRAINT fenceq_jobs_args_object CHECK (jsonb_typeof(args) = 'object'),
    CONSTRAINT fenceq_jobs_attempts_check CHECK (max_attempts >= 1 AND attempt >= 0),
    CONSTRAINT fenceq_jobs_lease_check CHECK (state <> 'running' OR lease_expires_at IS NOT NULL),
    CONSTRAINT fenceq_jobs_finished_check CHECK
        ((state IN ('completed', 'discarded', 'cancelled')) = (finished_at IS NOT NULL))
);

-- Claims: available jobs of a queue in claim order (migration 000007 keeps only the
-- available ones in it).
CREATE INDEX fenceq_jobs_claim_idx ON fenceq_jobs (state, queue, priority, run_at, id);
-- Reaper: running jobs by lease expiry.
CREATE INDEX fenceq_jobs_lease_idx ON fenceq_jobs (lease_expires_at) WHERE state = 'running';
-- Scheduler: scheduled and retryable jobs by due time.
CREATE INDEX fenceq_jobs_due_idx ON fenceq_jobs (run_at) WHERE state IN ('scheduled', 'retryable');
-- Retention: finished jobs by age.
CREATE INDEX fenceq_jobs_finished_idx ON fenceq_jobs (finished_at) WHERE finished_at IS NOT NULL;
-- Unique keys hold while a job is not finished.
CREATE UNIQUE INDEX fenceq_jobs_unique_key_idx ON fenceq_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'retryable');
CREATE INDEX fenceq_jobs_kind_idx ON fenceq_jobs (kind, id);

-- Wake-ups: one notification per statement and queue; PostgreSQL folds identical
-- notifications of one transaction into one, so a transaction notifies each queue once.
-- The channel carries the schema name so schemas sharing a database do not wake each other.
CREATE FUNCTION fenceq_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fenceq_jobs:' || TG_TABLE_SCHEMA, q.queue)
    FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'available') AS q;
    RETURN NULL;
END;
$$;

-- A Citus distributed table cannot have triggers, and a trigger's NOTIFY would run on the
-- worker node, where the coordinator's listeners never see it: there fenceq's insert
-- path notifies on the coordinator instead (queue.Insert), and the trigger is left out.
DO $$
DECLARE
    distributed boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)'
            INTO distributed USING 'fenceq_jobs'::regclass;
    END IF;
    IF NOT distributed THEN
        CREATE TRIGGER fenceq_jobs_notify_insert
            AFTER INSERT ON fenceq_jobs
            REFERENCING NEW TABLE AS new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION fenceq_jobs_notify();
    END IF;
END;
$$;

CREATE TABLE fenceq_workers (
    id           text PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    queues       text[]      NOT NULL DEFAULT '{}',
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE fenceq_queues (
    name       text PRIMARY KEY,
    paused     boolean     NOT NULL DEFAULT false,
    paused_at  timestamptz,
    metadata   jsonb       NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE fenceq_lease_events (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id    bigint      NOT NULL,
    lease_gen bigint      NOT NULL,
    worker_id text,
    kind      text        NOT NULL,
    detail    text,
    at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT fenceq_lease_events_kind_check CHECK (kind IN
        ('revoked', 'stale_write_rejected', 'expired_holder_alive', 'heartbeat_lost'))
);
CREATE INDEX fenceq_lease_events_at_idx ON fenceq_lease_events (at);
CREATE INDEX fenceq_lease_events_job_idx ON fenceq_lease_events (job_id, lease_gen);
