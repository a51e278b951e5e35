-- No statement looks outbox rows up by the job that wrote them (job_id is kept for
-- inspection only), so an index on it costs a write at every outbox insert and is never
-- read. Delivery is found through delivery_job_id, pending rows through
-- fenceq_outbox_pending_idx.
DROP INDEX fenceq_outbox_job_idx;
