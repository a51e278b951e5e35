DROP INDEX fenceq_jobs_kind_idx;
CREATE INDEX fenceq_jobs_kind_idx ON fenceq_jobs (kind, id);
