-- Orders placed once per idempotency key. Money is integer minor units (cents) of
-- currency.
-- UNIQUE (idempotency_key) is the last line of defence behind fenceq_idempotency_keys:
-- it also holds after the key's idempotency record expired and was cleaned up.
--
-- IF NOT EXISTS: a schema that already holds these tables (a single migration set that
-- created them together with the core's, up to its version 8) keeps them and their
-- rows, and this set takes them over.
CREATE TABLE IF NOT EXISTS orders (
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
CREATE INDEX IF NOT EXISTS orders_job_idx ON orders (job_id) WHERE job_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS order_items (
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
