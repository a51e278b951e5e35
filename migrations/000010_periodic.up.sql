-- Periodic jobs: schedules kept in the database, so every worker reads the same ones,
-- a pause survives restarts, and a slot's enqueue is decided by a compare-and-set on
-- last_slot in the transaction that inserts its job.

CREATE TABLE fenceq_periodic (
    -- The queue name charset: letters, digits and _ . : -, starting with a letter or digit.
    name               text        PRIMARY KEY,
    -- A cron expression (five fields, or six with seconds first), a descriptor
    -- (@hourly, @daily, …) or "@every D".
    spec               text        NOT NULL,
    -- The IANA time zone the cron fields are read in.
    timezone           text        NOT NULL DEFAULT 'UTC',
    kind               text        NOT NULL,
    args               jsonb       NOT NULL DEFAULT '{}',
    queue              text        NOT NULL DEFAULT 'default',
    priority           smallint    NOT NULL DEFAULT 1,
    max_attempts       integer     NOT NULL DEFAULT 25,
    -- What to do with slots that fell due while no worker ran a scheduling pass.
    missed             text        NOT NULL DEFAULT 'skip',
    -- Enqueue one job when a pass finds that every worker was down.
    run_on_start       boolean     NOT NULL DEFAULT false,
    paused             boolean     NOT NULL DEFAULT false,
    -- Every slot up to last_slot is decided (enqueued, or passed over by the missed
    -- policy or a pause); the compare-and-set column. Starts at the row's creation.
    last_slot          timestamptz NOT NULL DEFAULT now(),
    -- The newest slot a job was enqueued for.
    last_enqueued_slot timestamptz,
    -- code: defined by a worker's Config.Periodic (upserted at its start); cli: added
    -- by an operator.
    source             text        NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT fenceq_periodic_name_check CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$'),
    CONSTRAINT fenceq_periodic_spec_check CHECK (char_length(spec) BETWEEN 1 AND 256),
    CONSTRAINT fenceq_periodic_kind_check CHECK (char_length(kind) BETWEEN 1 AND 128),
    CONSTRAINT fenceq_periodic_queue_check CHECK (char_length(queue) BETWEEN 1 AND 64),
    CONSTRAINT fenceq_periodic_args_object CHECK (jsonb_typeof(args) = 'object'),
    CONSTRAINT fenceq_periodic_priority_check CHECK (priority BETWEEN 0 AND 100),
    CONSTRAINT fenceq_periodic_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT fenceq_periodic_missed_check CHECK (missed IN ('skip', 'once')),
    CONSTRAINT fenceq_periodic_source_check CHECK (source IN ('code', 'cli'))
);

-- One row: when a worker last ran a scheduling pass. Each pass locks it first, which
-- serializes passes across workers, and sets heartbeat_at at its end: a slot later than
-- heartbeat_at plus the grace fell due while every worker was down.
CREATE TABLE fenceq_periodic_clock (
    id           boolean PRIMARY KEY DEFAULT true,
    heartbeat_at timestamptz,
    CONSTRAINT fenceq_periodic_clock_one_row CHECK (id)
);
INSERT INTO fenceq_periodic_clock (id) VALUES (true);
