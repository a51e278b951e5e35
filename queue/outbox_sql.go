package queue

// SQL for fenceq_outbox beyond InsertOutbox (outbox.go): what a relay writes under the
// lease of a delivery job, and what operators read and retry.
//
// Every relay write is fenced in its own statement: a CTE locks the delivery job row
// FOR SHARE only if it is still running under the caller's generation
// ("lease_gen = $3"), which keeps the reaper out until the transaction ends, and the
// outbox row is updated only if that lock was taken and the row names that job as its
// delivery job. $1 outbox id, $2 delivery job id, $3 lease generation, $4 worker.

// The lease expiry reported is the delivery job's own while it still runs under the
// lease that is delivering the row: the copy in fenceq_outbox is taken when an attempt
// begins and is not renewed by heartbeats, so a live delivery looked expired.
const outboxColumns = `o.id, o.topic, o.dedupe_key, o.payload, o.state, o.attempt, o.lease_gen,
	o.leased_by,
	CASE WHEN dj.state = 'running' AND dj.lease_gen = o.lease_gen THEN dj.lease_expires_at END,
	o.available_at, o.delivered_at, o.last_error, o.job_id,
	o.delivery_job_id, o.created_at, COALESCE(dj.state, '')`

const outboxFrom = `fenceq_outbox o LEFT JOIN fenceq_jobs dj ON dj.id = o.delivery_job_id`

const sqlGetOutbox = `SELECT ` + outboxColumns + ` FROM ` + outboxFrom + ` WHERE o.id = $1`

// sqlListOutbox: $1 state (empty for any), $2 topic (empty for any), $3 limit, $4 before id
// (0 for the newest).
const sqlListOutbox = `
SELECT ` + outboxColumns + ` FROM ` + outboxFrom + `
WHERE ($1::text = '' OR o.state = $1) AND ($2::text = '' OR o.topic = $2)
  AND ($4::bigint = 0 OR o.id < $4)
ORDER BY o.id DESC LIMIT $3`

// fencedOutbox prefixes a relay write with the fence on the delivery job.
const fencedOutbox = `
WITH fence AS (
    SELECT id AS fence_job_id, lease_expires_at AS fence_expires FROM fenceq_jobs
    WHERE id = $2 AND lease_gen = $3 AND state = 'running'
    FOR SHARE)
`

// sqlBeginOutboxAttempt records that the lease holder is about to deliver the row: the
// attempt count grows and the row names the lease that is delivering it.
const sqlBeginOutboxAttempt = fencedOutbox + `
UPDATE fenceq_outbox o SET attempt = o.attempt + 1, lease_gen = $3, leased_by = $4,
    lease_expires_at = fence.fence_expires
FROM fence
WHERE o.id = $1 AND o.state = 'pending' AND o.delivery_job_id = fence.fence_job_id
RETURNING o.attempt`

// sqlMarkOutboxDelivered: the row becomes delivered under the lease that delivered it.
const sqlMarkOutboxDelivered = fencedOutbox + `
UPDATE fenceq_outbox o SET state = 'delivered', delivered_at = now(), lease_gen = $3,
    leased_by = $4, lease_expires_at = NULL, last_error = NULL
FROM fence
WHERE o.id = $1 AND o.state = 'pending' AND o.delivery_job_id = fence.fence_job_id
RETURNING o.attempt`

// sqlMarkOutboxFailed: $5 reason. The row is kept, failed, for an operator to see and
// retry.
const sqlMarkOutboxFailed = fencedOutbox + `
UPDATE fenceq_outbox o SET state = 'failed', lease_gen = $3, leased_by = $4,
    lease_expires_at = NULL, last_error = $5
FROM fence
WHERE o.id = $1 AND o.state = 'pending' AND o.delivery_job_id = fence.fence_job_id
RETURNING o.attempt`

// sqlRecordOutboxAttempt: $5 error of an attempt that will be retried.
const sqlRecordOutboxAttempt = fencedOutbox + `
UPDATE fenceq_outbox o SET lease_gen = $3, leased_by = $4, lease_expires_at = NULL,
    last_error = $5
FROM fence
WHERE o.id = $1 AND o.state = 'pending' AND o.delivery_job_id = fence.fence_job_id
RETURNING o.attempt`

// sqlOutboxHasFence tells a missed relay write's cause: false when the lease is gone.
const sqlOutboxHasFence = `
SELECT EXISTS (SELECT 1 FROM fenceq_jobs WHERE id = $1 AND lease_gen = $2 AND state = 'running')`

// A row is orphaned when it is pending but no unfinished job will deliver it: its
// delivery job was discarded or cancelled (for example by the reaper after every
// attempt's holder crashed), completed without marking it, or was pruned.
const outboxOrphaned = `o.state = 'pending' AND NOT EXISTS (
    SELECT 1 FROM fenceq_jobs j WHERE j.id = o.delivery_job_id
      AND j.state IN ` + unfinishedStates + `)`

// sqlRetryOutbox makes a failed (or orphaned) row pending again; the caller enqueues a
// new delivery job in the same transaction.
const sqlRetryOutbox = `
UPDATE fenceq_outbox o SET state = 'pending', available_at = now(), lease_expires_at = NULL
WHERE o.id = $1 AND (o.state = 'failed' OR (` + outboxOrphaned + `))
RETURNING o.id`

// sqlFailOrphanedOutbox: $1 limit.
const sqlFailOrphanedOutbox = `
WITH orphan AS (
    SELECT o.id AS oid,
           CASE WHEN dj.id IS NULL THEN 'its delivery job ' || COALESCE(o.delivery_job_id::text, '(none)') || ' no longer exists'
                ELSE 'its delivery job ' || dj.id || ' is ' || dj.state || ' after ' || dj.attempt || ' attempt(s)'
                     || COALESCE(': ' || (dj.errors -> -1 ->> 'error'), '')
           END AS reason
    FROM fenceq_outbox o LEFT JOIN fenceq_jobs dj ON dj.id = o.delivery_job_id
    WHERE ` + outboxOrphaned + `
    ORDER BY o.id
    LIMIT $1
    FOR UPDATE OF o SKIP LOCKED)
UPDATE fenceq_outbox o SET state = 'failed', lease_expires_at = NULL,
    last_error = 'orphaned: ' || orphan.reason
FROM orphan
WHERE o.id = orphan.oid AND o.state = 'pending'
RETURNING o.id`

// sqlOutboxStats reads the backlog by the database's clock. The pending count and the
// oldest pending row come from the partial index on pending rows.
const sqlOutboxStats = `
SELECT
    (SELECT count(*) FROM fenceq_outbox WHERE state = 'pending'),
    (SELECT count(*) FROM fenceq_outbox WHERE state = 'failed'),
    COALESCE((SELECT extract(epoch FROM now() - min(available_at)) FROM fenceq_outbox
              WHERE state = 'pending'), 0)::float8,
    (SELECT count(*) FROM fenceq_outbox o WHERE ` + outboxOrphaned + `)`
