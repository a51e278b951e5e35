-- The claim index keeps only the jobs waiting to be claimed.
--
-- A full index (state, queue, priority, run_at, id) takes an entry at every claim and
-- every completion, both non-HOT updates; kept to state = 'available' it takes one
-- entry when a job is inserted and none while the job is worked. Each claimed job
-- leaves a dead entry among the available ones until VACUUM removes it, and a claim
-- from the start of the order walks all of them. fenceq's workers therefore claim after
-- the position where their previous claim ended (queue.ClaimCursor), which starts past
-- those entries, and claim from the start of the order only when they have no cursor
-- or to look behind it (at least once per poll interval).
-- Listing jobs by state uses the other partial indexes (lease, due, finished) or the
-- primary key.
DROP INDEX fenceq_jobs_claim_idx;
CREATE INDEX fenceq_jobs_claim_idx ON fenceq_jobs (queue, priority, run_at, id)
    WHERE state = 'available';
