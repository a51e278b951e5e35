-- Two of history's search indexes (migration 000018) cost less per finished job, and
-- still serve their searches. Every job that finishes writes an entry in each index of
-- fenceq_jobs_history, so each index taxes the drain of every queue.
--
-- state: history holds three states, and most of it is completed jobs. A search for
-- completed jobs walks the primary key newest first and finds a match in nearly every
-- row; only the rarer discarded and cancelled jobs need an index of their own, and a
-- completed job now writes no entry.
--
-- created_at: ids are taken at enqueue, in the order jobs are created, and history is
-- written as jobs finish, close to that order, so a BRIN index (one summary per range of
-- pages) finds a time range's pages while an insert seldom writes to it. The minmax-multi
-- class keeps a range's summary tight when a job that ran long (retried for days) lands
-- among newer ones.
--
-- Like 000018, this file runs in one transaction and builds its indexes with a lock that
-- blocks writes to history (not reads). On a large history, build them first with
-- CREATE INDEX CONCURRENTLY under these names (docs/operations.md): IF NOT EXISTS then
-- skips them.
CREATE INDEX IF NOT EXISTS fenceq_jobs_history_failed_idx ON fenceq_jobs_history (state, id)
    WHERE state IN ('discarded', 'cancelled');
DROP INDEX IF EXISTS fenceq_jobs_history_state_idx;
CREATE INDEX IF NOT EXISTS fenceq_jobs_history_created_brin ON fenceq_jobs_history
    USING brin (created_at timestamptz_minmax_multi_ops);
DROP INDEX IF EXISTS fenceq_jobs_history_created_idx;
