DROP TABLE IF EXISTS fenceq_idempotency_keys;
