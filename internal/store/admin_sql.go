package store

// SQL for operator actions on fenceq_jobs and fenceq_queues.

import (
	"fmt"
	"strings"

	"github.com/fenceq/fenceq/queue"
)

const sqlGetJob = `SELECT ` + jobColumns + ` FROM fenceq_jobs WHERE id = $1`

// uniqueIndex is the unique index on unique_key (migration 000012).
const uniqueIndex = "fenceq_jobs_unique_key_idx"

// errorSearchExpr is the expression fenceq_jobs_*_error_idx index (migration 000018):
// the words of a job's last error. A search must spell it the same way to use them.
const errorSearchExpr = `to_tsvector('simple'::regconfig, left(errors -> -1 ->> 'error', 16384))`

// filterSQL returns the WHERE clause of a job search over fenceq_jobs (or either of its
// tables) for f and the keyset bound beforeID (0 for none), with its arguments appended
// to args (whose first element is the query mode, so the next parameter is
// $len(args)). Only the conditions f sets are written, each in the form its index
// serves: the partial indexes' predicates (tags, metadata, errors) are repeated.
func filterSQL(f *queue.JobFilter, beforeID int64, args []any) (string, []any) {
	var conds []string
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args)-1)
	}
	if beforeID > 0 {
		conds = append(conds, "id < "+arg(beforeID)+"::bigint")
	}
	if len(f.IDs) > 0 {
		conds = append(conds, "id = ANY("+arg(f.IDs)+"::bigint[])")
	}
	if f.State != "" {
		c := "state = " + arg(string(f.State)) + "::text"
		if f.State.Final() {
			// A finished job has finished_at: the hot set's index of finished jobs
			// (fenceq_jobs_finished_idx) has this predicate.
			c += " AND finished_at IS NOT NULL"
		}
		conds = append(conds, c)
	}
	if f.Queue != "" {
		conds = append(conds, "queue = "+arg(f.Queue)+"::text")
	}
	if f.Kind != "" {
		conds = append(conds, "kind = "+arg(f.Kind)+"::text")
	}
	if f.Tag != "" {
		conds = append(conds, "tags @> ARRAY["+arg(f.Tag)+"::text] AND tags <> '{}'")
	}
	if len(f.Args) > 0 {
		conds = append(conds, "args @> "+arg(string(f.Args))+"::jsonb")
	}
	if len(f.Metadata) > 0 {
		conds = append(conds, "metadata @> "+arg(string(f.Metadata))+"::jsonb AND metadata <> '{}'")
	}
	if f.Error != "" {
		conds = append(conds, "errors <> '[]' AND "+errorSearchExpr+" @@ plainto_tsquery('simple'::regconfig, "+arg(f.Error)+"::text)")
	}
	if !f.CreatedAfter.IsZero() {
		conds = append(conds, "created_at >= "+arg(f.CreatedAfter)+"::timestamptz")
	}
	if !f.CreatedBefore.IsZero() {
		conds = append(conds, "created_at < "+arg(f.CreatedBefore)+"::timestamptz")
	}
	if f.UnknownKinds {
		live := f.LiveWithin
		if live <= 0 {
			live = queue.DefaultLiveWithin
		}
		conds = append(conds, unknownKind(arg(micros(live))))
	}
	if len(conds) == 0 {
		return "", args
	}
	return "\nWHERE " + strings.Join(conds, "\n  AND "), args
}

// sqlRetryJob makes a finished, retryable or scheduled job available now, with at least
// one attempt left. A running job must be requeued instead. A job in history moves back
// to the hot set.
var sqlRetryJob = `
WITH hot AS (` + sqlRetryHot + `),
` + fromHistory("hist", "$1", retrySet) + `
SELECT * FROM hot UNION ALL SELECT * FROM hist`

// sqlRetryHot is the part of sqlRetryJob for a job in the hot set, and sqlRetryHistory
// the part for a job in history: a Citus connection runs them one after the other, so
// that a retry of a job still in the hot set (every finished job, until MoveFinished) is
// one routed statement.
var (
	sqlRetryHot = `
    UPDATE fenceq_jobs_hot SET state = ` + sqlAvailable + `, run_at = now(), finished_at = NULL,
        max_attempts = GREATEST(max_attempts, attempt + 1),
        debounce_key = CASE WHEN state IN ` + sqlFinal + ` THEN NULL ELSE debounce_key END
    WHERE id = $1 AND (state IN ` + sqlDue + ` OR state IN ` + sqlFinal + `)
    RETURNING ` + jobColumns
	sqlRetryHistory = `
WITH ` + fromHistory("hist", "$1", retrySet) + `
SELECT * FROM hist`
)

// retrySet are the new values of a job that RetryJob or RequeueJob takes out of history.
// A finished job brought back is no longer debounced: a newer job may wait under its
// debounce key, and a job that never started would collide with it in the debounce index.
var retrySet = [][2]string{{"state", sqlAvailable}, {"run_at", "now()"}, {"finished_at", "NULL"},
	{"leased_by", "NULL"}, {"lease_expires_at", "NULL"}, {"max_attempts", "GREATEST(max_attempts, attempt + 1)"},
	{"debounce_key", "NULL"}}

// sqlCancelJob cancels a job that is not finished. A running job's lease is revoked in
// the same statement (generation bumped), so its holder can write nothing afterwards.
var sqlCancelJob = `
WITH cur AS (
    SELECT id AS cid, lease_gen AS cgen, leased_by AS cby, state AS cstate FROM fenceq_jobs_hot
    WHERE id = $1 AND state IN ` + sqlUnfinished + ` FOR UPDATE),
` + finish{name: "upd", using: "cur c", usingCols: "c.cstate",
	where: "j.id = c.cid AND j.lease_gen = c.cgen", state: sqlCancelled,
	set: [][2]string{{"finished_at", "now()"}, {"lease_expires_at", "NULL"},
		{"lease_gen", "CASE WHEN cstate = " + sqlRunning + " THEN lease_gen + 1 ELSE lease_gen END"},
		{"errors", "errors || " + errorEntry(`'at', now(), 'error', $2::text`, "attempt", "lease_gen")}},
	returning: jobColumns}.ctes() + `,
ev AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT cid, cgen, cby, ` + sqlEventRevoked + `, ` + sqlLit(detailCancelledByAdmin) + ` FROM cur WHERE cstate = ` + sqlRunning + `)
SELECT * FROM upd`

// sqlRequeueJob forces a job of any state back to available. A running job's lease is
// revoked by bumping the generation. A job in history moves back to the hot set.
var sqlRequeueJob = `
WITH cur AS (
    SELECT id AS cid, lease_gen AS cgen, leased_by AS cby, state AS cstate FROM fenceq_jobs_hot
    WHERE id = $1 FOR UPDATE),
upd AS (
    UPDATE fenceq_jobs_hot j SET state = ` + sqlAvailable + `, run_at = now(), finished_at = NULL,
        leased_by = NULL, lease_expires_at = NULL,
        max_attempts = GREATEST(j.max_attempts, j.attempt + 1),
        lease_gen = CASE WHEN c.cstate = ` + sqlRunning + ` THEN j.lease_gen + 1 ELSE j.lease_gen END,
        debounce_key = CASE WHEN c.cstate IN ` + sqlFinal + ` THEN NULL ELSE j.debounce_key END
    FROM cur c WHERE j.id = c.cid AND j.lease_gen = c.cgen
    RETURNING ` + jobColumns + `),
ev AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT cid, cgen, cby, ` + sqlEventRevoked + `, ` + sqlLit(detailRequeuedByAdmin) + ` FROM cur WHERE cstate = ` + sqlRunning + `),
` + fromHistory("hist", "$1", retrySet) + `
SELECT * FROM upd UNION ALL SELECT * FROM hist`

// unknownKind is the predicate of a job waiting to run that no worker serving its queue
// and heartbeating within freshness (µs, an SQL expression) has a handler for. The job's
// columns are named unqualified (fenceq_workers has none of those names), so the
// predicate applies to fenceq_jobs under any alias.
func unknownKind(freshness string) string {
	return `state IN ` + sqlWaiting + `
  AND NOT EXISTS (
      SELECT 1 FROM fenceq_workers wk
      WHERE wk.heartbeat_at > now() - ` + freshness + `::bigint * interval '1 microsecond'
        AND queue = ANY(wk.queues) AND kind = ANY(wk.kinds))`
}

var sqlCountUnknownKinds = `SELECT count(*) FROM fenceq_jobs WHERE ` + unknownKind("$1")

const sqlSetQueuePaused = `
INSERT INTO fenceq_queues (name, paused, paused_at, updated_at)
VALUES ($1, $2, CASE WHEN $2 THEN now() END, now())
ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, paused_at = EXCLUDED.paused_at,
    updated_at = EXCLUDED.updated_at`

// sqlQueueExists: $1 queue, $2 how far back finished jobs count (µs; 0: not at all).
// Finished jobs are found through the finished_at index within that window only, in
// history and in the hot set (which keeps the finished jobs that hold their unique key,
// and on Citus every finished job until it is moved); the hot set, the settings and the
// workers are small.
const sqlQueueExists = `
SELECT EXISTS (SELECT 1 FROM fenceq_queues WHERE name = $1)
    OR EXISTS (SELECT 1 FROM fenceq_jobs_hot WHERE queue = $1 AND finished_at IS NULL)
    OR EXISTS (SELECT 1 FROM fenceq_workers WHERE $1 = ANY (queues))
    OR ($2::bigint > 0 AND (EXISTS (
        SELECT 1 FROM fenceq_jobs_history
        WHERE finished_at > now() - $2::bigint * interval '1 microsecond' AND queue = $1)
      OR EXISTS (
        SELECT 1 FROM fenceq_jobs_hot
        WHERE finished_at > now() - $2::bigint * interval '1 microsecond' AND queue = $1)))`

// sqlListQueues lists the queues with settings or counted jobs: the unfinished jobs of
// the hot set by queue and state, and the jobs that finished within $1 (µs, in whole
// minutes) from the job counters, never reading history.
var sqlListQueues = `
WITH unfinished AS MATERIALIZED (
    SELECT queue, state, count(*) AS n FROM ` + hotTable + `
    WHERE state IN ` + sqlUnfinished + ` GROUP BY queue, state),
finished AS MATERIALIZED (
    SELECT queue, state, sum(jobs)::bigint AS n FROM fenceq_job_counts
    WHERE bucket >= date_bin(interval '1 minute', now() - $1::bigint * interval '1 microsecond', timestamptz '2000-01-01 00:00:00+00')
    GROUP BY queue, state),
counts AS (
    SELECT queue, state, n FROM unfinished UNION ALL SELECT queue, state, n FROM finished),
names AS (
    SELECT name FROM fenceq_queues
    UNION SELECT queue FROM counts)
SELECT n.name, COALESCE(q.paused, false),
       COALESCE(jsonb_object_agg(c.state, c.n) FILTER (WHERE c.state IS NOT NULL), '{}')
FROM names n
LEFT JOIN fenceq_queues q ON q.name = n.name
LEFT JOIN counts c ON c.queue = n.name
GROUP BY n.name, q.paused
ORDER BY n.name`

// sqlDeleteJob deletes a job that is not running: a running job's holder must first lose
// its lease (cancel or requeue), so that no fenced write races the delete.
var sqlDeleteJob = `
WITH hot AS (
    DELETE FROM fenceq_jobs_hot WHERE id = $1 AND state <> ` + sqlRunning + `
    RETURNING ` + jobColumns + `),
hist AS (
    DELETE FROM fenceq_jobs_history WHERE id = $1
    RETURNING ` + jobColumns + `)
SELECT * FROM hot UNION ALL SELECT * FROM hist`

const sqlAddQueue = `
INSERT INTO fenceq_queues (name) VALUES ($1) ON CONFLICT (name) DO NOTHING RETURNING name`

// sqlRemoveQueue deletes a queue's settings row unless unfinished jobs still wait in it.
// It reports whether the row existed and how many unfinished jobs the queue holds.
var sqlRemoveQueue = `
WITH busy AS (
    SELECT count(*) AS n FROM fenceq_jobs_hot WHERE queue = $1 AND state IN ` + sqlUnfinished + `),
del AS (
    DELETE FROM fenceq_queues WHERE name = $1 AND (SELECT n FROM busy) = 0 RETURNING name)
SELECT EXISTS (SELECT 1 FROM fenceq_queues WHERE name = $1), (SELECT n FROM busy),
       EXISTS (SELECT 1 FROM del)`
