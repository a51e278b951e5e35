-- The claim index keeps only the jobs waiting to be claimed.
--
-- With the full index (state, queue, priority, run_at, id) every claim and every
-- completion, both non-HOT updates, added an entry to it; kept to state = 'available'
-- it takes one entry when a job is inserted and none while the job is worked. DESIGN.md
-- measured such a partial index as unstable (4k-55k jobs/s, ~7.5k with autovacuum off)
-- because claims from the start of the order walk the dead entries of the jobs claimed
-- since the last VACUUM; fenceq's workers now claim after the position where their
-- previous claim ended (queue.ClaimCursor), which starts past them. Measured with
-- `fenceq bench` on a 2-core machine, autovacuum off, 1,000 workers, alternating runs:
--   drain 200k:   full 38.2k 42.2k 33.5k 36.7k 34.1k  -> partial 32.1k 48.9k 47.0k 33.5k 41.1k jobs/s
--   steady 10 s:  full 29.1k (decaying over the run)  -> partial 39.0k jobs/s (steady)
-- DESIGN.md's claim without a cursor on this index: 6.7k jobs/s (bench's bare-SQL side
-- therefore keeps the full index for its ceiling).
-- Listing jobs by state uses the other partial indexes (lease, due, finished) or the
-- primary key.
DROP INDEX fenceq_jobs_claim_idx;
CREATE INDEX fenceq_jobs_claim_idx ON fenceq_jobs (queue, priority, run_at, id)
    WHERE state = 'available';
