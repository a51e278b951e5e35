ALTER TABLE fenceq_workers DROP COLUMN kinds;
DROP INDEX fenceq_jobs_tags_idx;
ALTER TABLE fenceq_jobs DROP COLUMN tags;
-- Jobs unique beyond their unfinished states lose that: the old index covers only
-- unfinished jobs, where every mask holds (a mask always includes the unfinished states).
DROP INDEX fenceq_jobs_unique_key_idx;
CREATE UNIQUE INDEX fenceq_jobs_unique_key_idx ON fenceq_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'retryable');
ALTER TABLE fenceq_jobs DROP CONSTRAINT fenceq_jobs_unique_states_check;
ALTER TABLE fenceq_jobs DROP COLUMN unique_states;
DROP FUNCTION fenceq_state_in_mask(text, smallint);
