-- Idempotency keys: one row per (scope, key). The row is claimed with
-- INSERT … ON CONFLICT DO NOTHING in the transaction that does the work, so the decision
-- "first request or retry" is one atomic conditional write, never a read-then-write.
-- state: in_flight while the owner works (only visible to others when an owner records
-- progress in separate transactions), finished once the result is stored.
-- lease_gen fences an owner: it grows when an expired key is taken over, and finishing or
-- releasing a key is conditional on the generation the claim returned.
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
-- Cleanup: finished keys by expiry. In-flight keys are not in the index and never deleted.
CREATE INDEX fenceq_idempotency_keys_expiry_idx ON fenceq_idempotency_keys (expires_at)
    WHERE state = 'finished';
