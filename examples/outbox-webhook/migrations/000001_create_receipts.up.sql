CREATE TABLE receipts (job_id bigint PRIMARY KEY, order_id bigint NOT NULL, total_cents bigint NOT NULL);
