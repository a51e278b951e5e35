CREATE INDEX fenceq_outbox_job_idx ON fenceq_outbox (job_id);
