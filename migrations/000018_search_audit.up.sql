-- Search over the whole history, and the operators' audit trail.
--
-- Every condition of a job search (queue.JobFilter) has an index on fenceq_jobs_history,
-- so that a page of matches costs what the matches cost, not what the history holds.
-- Pages are keyset pages on id, newest first: the btree indexes end with id, so an
-- equality filter walks its index in page order. The hot set gets none of them: it holds
-- the work in flight only, and every claim and heartbeat of a job there writes an entry
-- in each of its indexes (those updates change indexed columns, so they are never HOT
-- updates): an index there would tax every job to speed a search over a set that stays
-- small.
--
-- Every file of a migration set runs in one transaction (migrations.stepDriver), and
-- CREATE INDEX CONCURRENTLY cannot run in one: these builds take a SHARE lock on their
-- table, which blocks writes to it (not reads) while the index is built. On a large
-- history, build them beforehand with CREATE INDEX CONCURRENTLY under these names
-- (docs/operations.md, "Upgrading to schema version 18"): IF NOT EXISTS then skips them.

-- state: history's finished states get an index in id order. The hot set gets none: its
-- partial indexes serve each unfinished state (claim, due and lease indexes) and its
-- finished jobs (fenceq_jobs_finished_idx, the search adds finished_at IS NOT NULL), and
-- a (state, id) index there would be chosen over the primary key by the worker's fenced
-- statements (WHERE id = $1 AND state = 'running'), which must find the row by its id.
CREATE INDEX IF NOT EXISTS fenceq_jobs_history_state_idx ON fenceq_jobs_history (state, id);
-- queue
CREATE INDEX IF NOT EXISTS fenceq_jobs_history_queue_idx ON fenceq_jobs_history (queue, id);
-- kind
CREATE INDEX IF NOT EXISTS fenceq_jobs_history_kind_idx ON fenceq_jobs_history (kind, id);
-- tag: fenceq_jobs_tags_idx and fenceq_jobs_history_tags_idx exist (migrations 12, 14).
-- args and metadata containment (@>): jsonb_path_ops indexes only containment, smaller
-- than the default operator class. Most jobs carry no metadata: only those are indexed,
-- and the search repeats the predicate.
CREATE INDEX IF NOT EXISTS fenceq_jobs_history_args_idx ON fenceq_jobs_history USING gin (args jsonb_path_ops);
CREATE INDEX IF NOT EXISTS fenceq_jobs_history_metadata_idx ON fenceq_jobs_history USING gin (metadata jsonb_path_ops)
    WHERE metadata <> '{}';
-- error text: full-text search over the last recorded error, with the "simple"
-- configuration (lower-cased words, no stemming, no stop words), built into every
-- PostgreSQL: no extension (pg_trgm) is needed. Only the last error is indexed, cut to
-- 16 KiB, so that the index entry of a job stays small however many attempts failed
-- (a tsvector holds at most 1 MiB, and a job may record up to 1000 errors). Jobs
-- without errors are not indexed.
CREATE INDEX IF NOT EXISTS fenceq_jobs_history_error_idx ON fenceq_jobs_history
    USING gin (to_tsvector('simple'::regconfig, left(errors -> -1 ->> 'error', 16384)))
    WHERE errors <> '[]';
-- time range: created_at, which every job has (finished_at only the finished ones).
CREATE INDEX IF NOT EXISTS fenceq_jobs_history_created_idx ON fenceq_jobs_history (created_at);

-- The audit trail: one row per operator action (one per batch of a bulk action),
-- written in the action's transaction. job_ids are the jobs it changed, names the
-- queues or schedules it named, filter the filter of a bulk action (NULL otherwise).
CREATE TABLE fenceq_audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL,
    action text NOT NULL,
    job_ids bigint[] NOT NULL DEFAULT '{}',
    names text[] NOT NULL DEFAULT '{}',
    filter jsonb,
    matched integer NOT NULL DEFAULT 0,
    detail text NOT NULL DEFAULT ''
);
-- The records naming one job (the job page, `fenceq jobs show`).
CREATE INDEX fenceq_audit_job_ids_idx ON fenceq_audit USING gin (job_ids);
