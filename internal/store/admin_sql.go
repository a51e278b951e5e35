package store

// SQL for operator actions on fenceq_jobs and fenceq_queues.

import (
	"fmt"

	"github.com/fenceq/fenceq/queue"
)

const sqlGetJob = `SELECT ` + jobColumns + ` FROM fenceq_jobs WHERE id = $1`

// uniqueIndex is the unique index on unique_key (migration 000012).
const uniqueIndex = "fenceq_jobs_unique_key_idx"

// listFilter is the WHERE clause of the job lists: $1 state, $2 queue, $3 kind (empty
// for any), $5 before id (0 for the newest), $6 text in args (empty for any). The
// statements are planned per execution, so the unused conditions fold away and a state
// filter meets its partial index.
const listFilter = `
WHERE ($1::text = '' OR state = $1) AND ($2::text = '' OR queue = $2) AND ($3::text = '' OR kind = $3)
  AND ($5::bigint = 0 OR id < $5)
  AND ($6::text = '' OR strpos(lower(args::text), lower($6)) > 0)`

// listExtra returns the conditions of the tag and unknown-kind filters, when asked
// for, with their arguments appended to args (whose first element is the query mode,
// so the next parameter is $len(args)). They are added only then, so that a tag filter
// can use fenceq_jobs_tags_idx (whose predicate, tags <> '{}', it repeats).
func listExtra(p *queue.ListParams, args []any) (string, []any) {
	q := ""
	if p.Tag != "" {
		args = append(args, p.Tag)
		q += fmt.Sprintf(`
  AND tags @> ARRAY[$%d::text] AND tags <> '{}'`, len(args)-1)
	}
	if p.UnknownKinds {
		args = append(args, micros(p.LiveWithin))
		q += `
  AND ` + unknownKind(fmt.Sprintf("$%d", len(args)-1))
	}
	return q, args
}

// listJobsSQL: $4 limit.
func listJobsSQL(extra string) string {
	return `
SELECT ` + jobColumns + ` FROM fenceq_jobs` + listFilter + extra + `
ORDER BY id DESC LIMIT $4`
}

// listJobsWindowSQL applies the filter to at most $7 jobs, newest first from the
// before id, walking the primary key: its cost does not depend on how rare matches are.
func listJobsWindowSQL(extra string) string {
	return `
SELECT ` + jobColumns + ` FROM (
    SELECT * FROM fenceq_jobs WHERE ($5::bigint = 0 OR id < $5) ORDER BY id DESC LIMIT $7) w` + listFilter + extra + `
ORDER BY id DESC LIMIT $4`
}

// sqlJobsWindowEnd is the lowest id of the window sqlListJobsWindow examined and the
// number of jobs in it: $1 before id, $2 window size.
const sqlJobsWindowEnd = `
SELECT min(id), count(*)::int FROM (
    SELECT id FROM fenceq_jobs WHERE ($1::bigint = 0 OR id < $1) ORDER BY id DESC LIMIT $2) w`

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
// Finished jobs are found through the finished_at index within that window only; the
// hot set, the settings and the workers are small.
const sqlQueueExists = `
SELECT EXISTS (SELECT 1 FROM fenceq_queues WHERE name = $1)
    OR EXISTS (SELECT 1 FROM fenceq_jobs_hot WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM fenceq_workers WHERE $1 = ANY (queues))
    OR ($2::bigint > 0 AND EXISTS (
        SELECT 1 FROM fenceq_jobs_history
        WHERE finished_at > now() - $2::bigint * interval '1 microsecond' AND queue = $1))`

const sqlListQueues = `
WITH counts AS MATERIALIZED (
    SELECT queue, state, count(*) AS n FROM fenceq_jobs GROUP BY queue, state),
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
