DROP TABLE IF EXISTS fenceq_outbox;
