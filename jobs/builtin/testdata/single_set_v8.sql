-- A schema at version 8 of a single migration set that holds both the core's tables and
-- the built-in jobs' business tables (versions 3 and 5 create the billing and order
-- tables), with rows in every table. TestUpgradeFromSingleSetSchema migrates it to the
-- per-job sets and checks that every row and constraint is kept.

-- 000001_create_core.up.sql

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

CREATE INDEX fenceq_jobs_claim_idx ON fenceq_jobs (state, queue, priority, run_at, id);
CREATE INDEX fenceq_jobs_lease_idx ON fenceq_jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX fenceq_jobs_due_idx ON fenceq_jobs (run_at) WHERE state IN ('scheduled', 'retryable');
CREATE INDEX fenceq_jobs_finished_idx ON fenceq_jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE UNIQUE INDEX fenceq_jobs_unique_key_idx ON fenceq_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'retryable');
CREATE INDEX fenceq_jobs_kind_idx ON fenceq_jobs (kind, id);

CREATE FUNCTION fenceq_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fenceq_jobs:' || TG_TABLE_SCHEMA, q.queue)
    FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'available') AS q;
    RETURN NULL;
END;
$$;

CREATE TRIGGER fenceq_jobs_notify_insert
    AFTER INSERT ON fenceq_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION fenceq_jobs_notify();

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

-- 000002_create_outbox.up.sql
CREATE TABLE fenceq_outbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic            text        NOT NULL,
    dedupe_key       text        NOT NULL,
    payload          jsonb       NOT NULL DEFAULT '{}',
    state            text        NOT NULL DEFAULT 'pending',
    attempt          integer     NOT NULL DEFAULT 0,
    lease_gen        bigint      NOT NULL DEFAULT 0,
    leased_by        text,
    lease_expires_at timestamptz,
    available_at     timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    last_error       text,
    job_id           bigint,
    delivery_job_id  bigint,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT fenceq_outbox_dedupe_key_key UNIQUE (dedupe_key),
    CONSTRAINT fenceq_outbox_state_check CHECK (state IN ('pending', 'delivered', 'failed')),
    CONSTRAINT fenceq_outbox_topic_check CHECK (char_length(topic) BETWEEN 1 AND 128),
    CONSTRAINT fenceq_outbox_dedupe_key_check CHECK (char_length(dedupe_key) BETWEEN 1 AND 255)
);
CREATE INDEX fenceq_outbox_pending_idx ON fenceq_outbox (available_at) WHERE state = 'pending';
CREATE INDEX fenceq_outbox_job_idx ON fenceq_outbox (job_id);
CREATE INDEX fenceq_outbox_failed_idx ON fenceq_outbox (id) WHERE state = 'failed';

-- 000003_create_billing.up.sql

CREATE TABLE customers (
    id         bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL,
    email      text        NOT NULL,
    country    text        NOT NULL DEFAULT 'US',
    currency   text        NOT NULL DEFAULT 'USD',
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT customers_name_check CHECK (char_length(name) BETWEEN 1 AND 200),
    CONSTRAINT customers_email_check CHECK (email ~ '^[^@\s]+@[^@\s]+$'),
    CONSTRAINT customers_country_check CHECK (country ~ '^[A-Z]{2}$'),
    CONSTRAINT customers_currency_check CHECK (currency ~ '^[A-Z]{3}$')
);

CREATE TABLE usage_records (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id      bigint      NOT NULL REFERENCES customers (id),
    period           text        NOT NULL,
    sku              text        NOT NULL,
    description      text        NOT NULL,
    quantity         bigint      NOT NULL,
    unit_price_cents bigint      NOT NULL,
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT usage_records_period_check CHECK (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    CONSTRAINT usage_records_quantity_check CHECK (quantity >= 0),
    CONSTRAINT usage_records_price_check CHECK (unit_price_cents >= 0)
);
CREATE INDEX usage_records_customer_period_idx ON usage_records (customer_id, period);

CREATE TABLE invoices (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id     bigint      NOT NULL REFERENCES customers (id),
    period          text        NOT NULL,
    currency        text        NOT NULL,
    subtotal_cents  bigint      NOT NULL,
    tax_rate_micros bigint      NOT NULL,
    tax_cents       bigint      NOT NULL,
    total_cents     bigint      NOT NULL,
    tax_reference   text        NOT NULL DEFAULT '',
    job_id          bigint      NOT NULL,
    lease_gen       bigint      NOT NULL,
    leased_by       text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT invoices_customer_period_key UNIQUE (customer_id, period),
    CONSTRAINT invoices_period_check CHECK (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    CONSTRAINT invoices_amounts_check CHECK (subtotal_cents >= 0 AND tax_cents >= 0
        AND tax_rate_micros >= 0 AND total_cents = subtotal_cents + tax_cents)
);
CREATE INDEX invoices_period_idx ON invoices (period, customer_id);
CREATE INDEX invoices_job_idx ON invoices (job_id);

CREATE TABLE invoice_lines (
    invoice_id       bigint NOT NULL REFERENCES invoices (id) ON DELETE CASCADE,
    line_no          integer NOT NULL,
    sku              text   NOT NULL,
    description      text   NOT NULL,
    quantity         bigint NOT NULL,
    unit_price_cents bigint NOT NULL,
    amount_cents     bigint NOT NULL,
    CONSTRAINT invoice_lines_pkey PRIMARY KEY (invoice_id, line_no),
    CONSTRAINT invoice_lines_amount_check CHECK (quantity >= 0 AND unit_price_cents >= 0
        AND amount_cents = quantity * unit_price_cents)
);

-- 000004_create_idempotency_keys.up.sql
CREATE TABLE fenceq_idempotency_keys (
    scope           text        NOT NULL,
    key             text        NOT NULL,
    request_hash    bytea       NOT NULL,
    state           text        NOT NULL DEFAULT 'in_flight',
    lease_gen       bigint      NOT NULL DEFAULT 1,
    resource_id     text,
    response_status integer,
    response        bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    expires_at      timestamptz NOT NULL,
    CONSTRAINT fenceq_idempotency_keys_pkey PRIMARY KEY (scope, key),
    CONSTRAINT fenceq_idempotency_keys_state_check CHECK (state IN ('in_flight', 'finished')),
    CONSTRAINT fenceq_idempotency_keys_scope_check CHECK (char_length(scope) BETWEEN 1 AND 128),
    CONSTRAINT fenceq_idempotency_keys_key_check CHECK (octet_length(key) BETWEEN 1 AND 255),
    CONSTRAINT fenceq_idempotency_keys_hash_check CHECK (octet_length(request_hash) BETWEEN 1 AND 64),
    CONSTRAINT fenceq_idempotency_keys_finished_check CHECK ((state = 'finished') = (finished_at IS NOT NULL))
);
CREATE INDEX fenceq_idempotency_keys_expiry_idx ON fenceq_idempotency_keys (expires_at)
    WHERE state = 'finished';

-- 000005_create_orders.up.sql
CREATE TABLE orders (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text        NOT NULL,
    request_hash    bytea       NOT NULL,
    customer_email  text        NOT NULL,
    currency        text        NOT NULL,
    total_cents     bigint      NOT NULL,
    status          text        NOT NULL DEFAULT 'placed',
    created_at      timestamptz NOT NULL DEFAULT now(),
    job_id          bigint,
    lease_gen       bigint,
    CONSTRAINT orders_idempotency_key_key UNIQUE (idempotency_key),
    CONSTRAINT orders_idempotency_key_check CHECK (octet_length(idempotency_key) BETWEEN 1 AND 255),
    CONSTRAINT orders_currency_check CHECK (currency ~ '^[A-Z]{3}$'),
    CONSTRAINT orders_total_check CHECK (total_cents >= 0),
    CONSTRAINT orders_status_check CHECK (status IN ('placed', 'cancelled')),
    CONSTRAINT orders_lease_check CHECK ((job_id IS NULL) = (lease_gen IS NULL))
);
CREATE INDEX orders_job_idx ON orders (job_id) WHERE job_id IS NOT NULL;

CREATE TABLE order_items (
    order_id         bigint NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    line             integer NOT NULL,
    sku              text   NOT NULL,
    quantity         integer NOT NULL,
    unit_price_cents bigint NOT NULL,
    CONSTRAINT order_items_pkey PRIMARY KEY (order_id, line),
    CONSTRAINT order_items_sku_check CHECK (char_length(sku) BETWEEN 1 AND 64),
    CONSTRAINT order_items_quantity_check CHECK (quantity > 0),
    CONSTRAINT order_items_price_check CHECK (unit_price_cents >= 0)
);

-- 000006_jobs_index_churn.up.sql
DROP INDEX fenceq_jobs_kind_idx;
CREATE INDEX fenceq_jobs_kind_idx ON fenceq_jobs (kind, id)
    WHERE state IN ('available', 'scheduled', 'retryable');

-- 000007_claim_index_partial.up.sql
DROP INDEX fenceq_jobs_claim_idx;
CREATE INDEX fenceq_jobs_claim_idx ON fenceq_jobs (queue, priority, run_at, id)
    WHERE state = 'available';

-- 000008_drop_outbox_job_idx.up.sql
DROP INDEX fenceq_outbox_job_idx;

-- golang-migrate's version table, at version 8.
CREATE TABLE fenceq_schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);
INSERT INTO fenceq_schema_migrations (version, dirty) VALUES (8, false);

-- Rows.
INSERT INTO customers (id, name, email, country, currency) VALUES
    (1, 'Ada', 'ada@example.com', 'DE', 'EUR'),
    (2, 'Grace', 'grace@example.com', 'US', 'USD');
INSERT INTO usage_records (customer_id, period, sku, description, quantity, unit_price_cents) VALUES
    (1, '2026-10', 'api-calls', 'API calls', 1200, 2),
    (2, '2026-10', 'seats', 'Seats', 3, 1500);
INSERT INTO fenceq_jobs (queue, kind, args, state, unique_key, attempt, lease_gen, finished_at) VALUES
    ('billing', 'invoice', '{"customer_id": 1, "period": "2026-10"}', 'completed', 'invoice:1:2026-10', 1, 1, now()),
    ('billing', 'invoice', '{"customer_id": 2, "period": "2026-10"}', 'available', 'invoice:2:2026-10', 0, 0, NULL);
INSERT INTO invoices (customer_id, period, currency, subtotal_cents, tax_rate_micros, tax_cents, total_cents,
                      tax_reference, job_id, lease_gen, leased_by)
SELECT 1, '2026-10', 'EUR', 2400, 190000, 456, 2856, 'tax-1', id, 1, 'worker-a' FROM fenceq_jobs WHERE unique_key = 'invoice:1:2026-10';
INSERT INTO invoice_lines (invoice_id, line_no, sku, description, quantity, unit_price_cents, amount_cents)
SELECT id, 1, 'api-calls', 'API calls', 1200, 2, 2400 FROM invoices;
INSERT INTO fenceq_outbox (topic, dedupe_key, payload, state, delivered_at)
SELECT 'email', 'invoice-email:' || id, '{"to": ["ada@example.com"], "subject": "Invoice"}', 'delivered', now() FROM invoices;
INSERT INTO fenceq_idempotency_keys (scope, key, request_hash, state, resource_id, response_status, response, finished_at, expires_at)
VALUES ('orders', 'key-1', '\x01', 'finished', '1', 201, '{"id": 1}', now(), now() + interval '1 day');
INSERT INTO orders (idempotency_key, request_hash, customer_email, currency, total_cents) VALUES
    ('key-1', '\x01', 'ada@example.com', 'EUR', 2500);
INSERT INTO order_items (order_id, line, sku, quantity, unit_price_cents)
SELECT id, 1, 'A1', 2, 1250 FROM orders;
INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
SELECT id, 1, 'worker-a', 'revoked', 'lease expired; now available' FROM fenceq_jobs WHERE unique_key = 'invoice:2:2026-10';
INSERT INTO fenceq_workers (id, host, pid, queues) VALUES ('worker-a', 'host-a', 42, '{billing,outbox}');
INSERT INTO fenceq_queues (name, paused) VALUES ('billing', true);
