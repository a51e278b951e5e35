-- Transactional outbox: external effects (email, webhooks) written in the job's
-- transaction and delivered at least once by a relay. dedupe_key is the idempotency key
-- every delivery attempt carries.
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
-- Failed rows wait for an operator; counting and listing them must stay cheap.
CREATE INDEX fenceq_outbox_failed_idx ON fenceq_outbox (id) WHERE state = 'failed';
