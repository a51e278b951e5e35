package outbox

import "strings"

// SQL for fenceq_outbox. Row states are rendered from the constants in outbox.go; job
// states arrive as parameters from the queue package's vocabulary.

// lit renders a row state as an SQL literal, for predicates the planner must match
// against the partial indexes on pending and failed rows.
func lit(s State) string { return "'" + strings.ReplaceAll(string(s), "'", "''") + "'" }

var (
	sqlPending   = lit(StatePending)
	sqlDelivered = lit(StateDelivered)
	sqlFailed    = lit(StateFailed)
)

const sqlInsert = `
INSERT INTO fenceq_outbox (topic, dedupe_key, payload, job_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id`

const sqlSetDeliveryJob = `UPDATE fenceq_outbox SET delivery_job_id = $2 WHERE id = $1`

const sqlGetByKey = `SELECT id, COALESCE(delivery_job_id, 0) FROM fenceq_outbox WHERE dedupe_key = $1`

// columns reads a row with its delivery job ($1 the running job state). The lease
// expiry reported is the delivery job's own while it still runs under the lease that is
// delivering the row: the copy in fenceq_outbox is taken when an attempt begins and is
// not renewed by heartbeats.
const columns = `o.id, o.topic, o.dedupe_key, o.payload, o.state, o.attempt, o.lease_gen,
	o.leased_by,
	CASE WHEN dj.state = $1 AND dj.lease_gen = o.lease_gen THEN dj.lease_expires_at END,
	o.available_at, o.delivered_at, o.last_error, o.job_id,
	o.delivery_job_id, o.created_at, COALESCE(dj.state, '')`

const from = `fenceq_outbox o LEFT JOIN fenceq_jobs dj ON dj.id = o.delivery_job_id`

const sqlGet = `SELECT ` + columns + ` FROM ` + from + ` WHERE o.id = $2`

// sqlList: $2 state (empty for any), $3 topic (empty for any), $4 limit, $5 before id
// (0 for the newest).
const sqlList = `
SELECT ` + columns + ` FROM ` + from + `
WHERE ($2::text = '' OR o.state = $2) AND ($3::text = '' OR o.topic = $3)
  AND ($5::bigint = 0 OR o.id < $5)
ORDER BY o.id DESC LIMIT $4`

// Every relay write is fenced in its own statement: a CTE locks the delivery job row
// FOR SHARE only if it is still running under the caller's generation
// ("lease_gen = $3"), which keeps the reaper out until the transaction ends, and the
// outbox row is updated only if that lock was taken and the row names that job as its
// delivery job. $1 outbox id, $2 delivery job id, $3 lease generation, $4 worker,
// $5 the running job state.
const fence = `
WITH fence AS (
    SELECT id AS fence_job_id, lease_expires_at AS fence_expires FROM fenceq_jobs_hot
    WHERE id = $2 AND lease_gen = $3 AND state = $5
    FOR SHARE)
`

// fenceTarget is the WHERE clause of every relay write: the row is pending and names
// the fenced job as its delivery job.
var fenceTarget = `
WHERE o.id = $1 AND o.state = ` + sqlPending + ` AND o.delivery_job_id = fence.fence_job_id
RETURNING o.attempt`

// sqlBeginAttempt records that the lease holder is about to deliver the row: the
// attempt count grows and the row names the lease that is delivering it.
var sqlBeginAttempt = fence + `
UPDATE fenceq_outbox o SET attempt = o.attempt + 1, lease_gen = $3, leased_by = $4,
    lease_expires_at = fence.fence_expires
FROM fence` + fenceTarget

// sqlMarkDelivered: the row becomes delivered under the lease that delivered it.
var sqlMarkDelivered = fence + `
UPDATE fenceq_outbox o SET state = ` + sqlDelivered + `, delivered_at = now(), lease_gen = $3,
    leased_by = $4, lease_expires_at = NULL, last_error = NULL
FROM fence` + fenceTarget

// sqlMarkFailed: $6 reason. The row is kept, failed, for an operator to see and retry.
var sqlMarkFailed = fence + `
UPDATE fenceq_outbox o SET state = ` + sqlFailed + `, lease_gen = $3, leased_by = $4,
    lease_expires_at = NULL, last_error = $6
FROM fence` + fenceTarget

// sqlRecordAttempt: $6 error of an attempt that will be retried.
var sqlRecordAttempt = fence + `
UPDATE fenceq_outbox o SET lease_gen = $3, leased_by = $4, lease_expires_at = NULL,
    last_error = $6
FROM fence` + fenceTarget

// sqlHasFence tells a missed relay write's cause: false when the lease is gone.
const sqlHasFence = `
SELECT EXISTS (SELECT 1 FROM fenceq_jobs WHERE id = $1 AND lease_gen = $2 AND state = $3)`

// orphaned holds for a row that is pending but that no unfinished job (their states
// are the parameter named by states) will deliver: its delivery job was discarded or
// cancelled (for example by the reaper after every attempt's holder crashed), completed
// without marking it, or was pruned.
func orphaned(states string) string {
	return `o.state = ` + sqlPending + ` AND NOT EXISTS (
    SELECT 1 FROM fenceq_jobs j WHERE j.id = o.delivery_job_id AND j.state = ANY(` + states + `::text[]))`
}

// sqlRetry makes a failed (or orphaned) row pending again; the caller enqueues a new
// delivery job in the same transaction.
var sqlRetry = `
UPDATE fenceq_outbox o SET state = ` + sqlPending + `, available_at = now(), lease_expires_at = NULL
WHERE o.id = $1 AND (o.state = ` + sqlFailed + ` OR (` + orphaned("$2") + `))
RETURNING o.id`

// sqlFailOrphaned: $1 limit.
var sqlFailOrphaned = `
WITH orphan AS (
    SELECT o.id AS oid,
           CASE WHEN dj.id IS NULL THEN 'its delivery job ' || COALESCE(o.delivery_job_id::text, '(none)') || ' no longer exists'
                ELSE 'its delivery job ' || dj.id || ' is ' || dj.state || ' after ' || dj.attempt || ' attempt(s)'
                     || COALESCE(': ' || (dj.errors -> -1 ->> 'error'), '')
           END AS reason
    FROM fenceq_outbox o LEFT JOIN fenceq_jobs dj ON dj.id = o.delivery_job_id
    WHERE ` + orphaned("$2") + `
    ORDER BY o.id
    LIMIT $1
    FOR UPDATE OF o SKIP LOCKED)
UPDATE fenceq_outbox o SET state = ` + sqlFailed + `, lease_expires_at = NULL,
    last_error = 'orphaned: ' || orphan.reason
FROM orphan
WHERE o.id = orphan.oid AND o.state = ` + sqlPending + `
RETURNING o.id`

// sqlStats reads the backlog by the database's clock ($2 the unfinished job states).
// The pending count and the oldest pending row come from the partial index on pending
// rows, the failed count from the one on failed rows.
var sqlStats = `
SELECT
    (SELECT count(*) FROM fenceq_outbox WHERE state = ` + sqlPending + `),
    (SELECT count(*) FROM fenceq_outbox WHERE state = ` + sqlFailed + `),
    COALESCE((SELECT extract(epoch FROM now() - min(available_at)) FROM fenceq_outbox
              WHERE state = ` + sqlPending + `), 0)::float8,
    (SELECT count(*) FROM fenceq_outbox o WHERE ` + orphaned("$1") + `)`
