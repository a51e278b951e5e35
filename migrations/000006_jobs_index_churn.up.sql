-- The kind index covers only the jobs that wait. A job row is updated at its claim and
-- at its completion, and neither update can be HOT (state is indexed), so each adds an
-- entry to every index whose predicate the new row version satisfies. A full (kind, id)
-- index takes two entries per job that nothing reads while the job is worked; kept to
-- the jobs that wait, it takes one entry when the job is inserted and none after.
-- Listing jobs by kind among the waiting ones (`fenceq jobs list --kind K --state
-- available`) still uses it.
DROP INDEX fenceq_jobs_kind_idx;
CREATE INDEX fenceq_jobs_kind_idx ON fenceq_jobs (kind, id)
    WHERE state IN ('available', 'scheduled', 'retryable');
