DROP INDEX fenceq_jobs_claim_idx;
CREATE INDEX fenceq_jobs_claim_idx ON fenceq_jobs (state, queue, priority, run_at, id);
