CREATE INDEX IF NOT EXISTS fenceq_jobs_history_state_idx ON fenceq_jobs_history (state, id);
DROP INDEX IF EXISTS fenceq_jobs_history_failed_idx;
CREATE INDEX IF NOT EXISTS fenceq_jobs_history_created_idx ON fenceq_jobs_history (created_at);
DROP INDEX IF EXISTS fenceq_jobs_history_created_brin;
