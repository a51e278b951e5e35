package queue

// SQL for fenceq_jobs. Every statement that writes under a lease carries
// "lease_gen = " in its WHERE clause next to the job id and state = 'running':
//
//	grep -n "lease_gen = " queue/*_sql.go
//
// Times are always the database's (now()); durations arrive as microseconds.

const unfinishedStates = `('available', 'scheduled', 'running', 'retryable')`

const sqlInsertJob = `
WITH t AS (SELECT COALESCE($5::timestamptz, now() + $8::bigint * interval '1 microsecond') AS at)
INSERT INTO fenceq_jobs (queue, kind, args, priority, run_at, max_attempts, unique_key, state)
SELECT $1, $2, $3, $4, t.at, $6, $7, CASE WHEN t.at > now() THEN 'scheduled' ELSE 'available' END
FROM t
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ` + unfinishedStates + ` DO NOTHING
RETURNING ` + jobColumns

const sqlGetUnfinishedByUniqueKey = `
SELECT ` + jobColumns + ` FROM fenceq_jobs
WHERE unique_key = $1 AND state IN ` + unfinishedStates

// The staging table lives until the end of the transaction; TRUNCATE makes a second
// InsertMany in one transaction start empty.
const sqlCreateStaging = `
CREATE TEMP TABLE IF NOT EXISTS fenceq_jobs_staging (
    ord int, queue text, kind text, args jsonb, priority smallint, run_at timestamptz,
    run_in_us bigint, max_attempts int, unique_key text) ON COMMIT DROP;
TRUNCATE fenceq_jobs_staging`

const sqlInsertFromStaging = `
INSERT INTO fenceq_jobs (queue, kind, args, priority, run_at, max_attempts, unique_key, state)
SELECT queue, kind, args, priority, at, max_attempts, unique_key,
       CASE WHEN at > now() THEN 'scheduled' ELSE 'available' END
FROM (SELECT s.*, COALESCE(s.run_at, now() + s.run_in_us * interval '1 microsecond') AS at
      FROM fenceq_jobs_staging s ORDER BY ord) x
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ` + unfinishedStates + ` DO NOTHING`

// sqlClaim: $1 queue, $2 limit, $3 worker id, $4 lease (µs).
const sqlClaim = `
WITH next AS (
    SELECT id AS next_id FROM fenceq_jobs
    WHERE state = 'available' AND queue = $1 AND run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM fenceq_queues q WHERE q.name = $1 AND q.paused)
    ORDER BY priority, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE fenceq_jobs
SET state = 'running', attempt = attempt + 1, lease_gen = lease_gen + 1,
    leased_by = $3, heartbeat_at = now(), attempted_at = now(),
    lease_expires_at = now() + $4::bigint * interval '1 microsecond'
FROM next WHERE id = next.next_id
RETURNING ` + claimedColumns

// sqlClaimAfter is sqlClaim starting after a position in claim order: $5 priority,
// $6 run_at, $7 id. The row comparison is an index condition of fenceq_jobs_claim_idx,
// so the scan starts at the position instead of walking, from the start of the
// available range, the index entries of jobs claimed since the last VACUUM.
const sqlClaimAfter = `
WITH next AS (
    SELECT id AS next_id FROM fenceq_jobs
    WHERE state = 'available' AND queue = $1 AND run_at <= now()
      AND (priority, run_at, id) > ($5::smallint, $6::timestamptz, $7::bigint)
      AND NOT EXISTS (SELECT 1 FROM fenceq_queues q WHERE q.name = $1 AND q.paused)
    ORDER BY priority, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE fenceq_jobs
SET state = 'running', attempt = attempt + 1, lease_gen = lease_gen + 1,
    leased_by = $3, heartbeat_at = now(), attempted_at = now(),
    lease_expires_at = now() + $4::bigint * interval '1 microsecond'
FROM next WHERE id = next.next_id
RETURNING ` + claimedColumns

// sqlHeartbeat renews every lease a process holds in one statement and heartbeats the
// worker row. $1 ids, $2 generations, $3 lease (µs), $4 worker id.
//
// The state is compared with a column of the batch so that rows are looked up by id
// (see sqlCompleteMany). The held and renewed ids are aggregated apart (every renewed
// lease is also held): joining them was a nested loop, quadratic in the leases (1.2 of
// the 1.7 ms of a 100-lease heartbeat). Both come back as (id, generation) pairs: a
// worker can send two leases of one job (an old one, revoked while its handler still
// runs, and the one it claimed afterwards), and only the matching generation is held.
//
// A lease whose row still carries its generation but is no longer running was ended by
// the holder's own write (only the holder leaves running without bumping the
// generation: see Landed), which may land between the worker's snapshot of its leases
// and this statement; it comes back as finished, not lost.
//
// Rows locked by someone else right now (this process's own fenced commit, the reaper,
// an operator) are skipped rather than waited for, so one long transaction cannot stall
// the renewal of every other lease. Such a lease is reported as held-but-not-renewed
// when its generation still matches in the statement's snapshot, and as lost otherwise.
const sqlHeartbeat = `
WITH l AS MATERIALIZED (
    SELECT l.*, 'running'::text AS lstate FROM unnest($1::bigint[], $2::bigint[]) AS l(lid, lgen)),
held AS (
    SELECT j.id, j.lease_gen, j.state = l.lstate AS running FROM fenceq_jobs j JOIN l ON j.id = l.lid
    WHERE j.lease_gen = l.lgen),
lk AS (
    SELECT j.id AS lk_id, l.lgen AS lk_gen, l.lstate AS lk_state FROM fenceq_jobs j JOIN l ON j.id = l.lid
    WHERE j.lease_gen = l.lgen AND j.state = l.lstate
    ORDER BY j.id
    FOR NO KEY UPDATE OF j SKIP LOCKED),
upd AS (
    UPDATE fenceq_jobs j
    SET heartbeat_at = now(), lease_expires_at = now() + $3::bigint * interval '1 microsecond'
    FROM lk WHERE j.id = lk.lk_id AND j.lease_gen = lk.lk_gen AND j.state = lk.lk_state
    RETURNING j.id, j.lease_gen),
w AS (UPDATE fenceq_workers SET heartbeat_at = now() WHERE id = $4 RETURNING id)
SELECT h.ids, h.gens, h.running, u.ids, u.gens, (SELECT count(*) FROM w)
FROM (SELECT COALESCE(array_agg(id), '{}')::bigint[] AS ids, COALESCE(array_agg(lease_gen), '{}')::bigint[] AS gens,
             COALESCE(array_agg(running), '{}')::boolean[] AS running FROM held) h,
     (SELECT COALESCE(array_agg(id), '{}')::bigint[] AS ids, COALESCE(array_agg(lease_gen), '{}')::bigint[] AS gens FROM upd) u`

// staleWrite is appended to every single-lease write: when the guarded UPDATE matched
// nothing, the rejection is recorded in the same statement. $1 id, $2 gen, $3 worker.
func staleWrite(write, op string) string {
	return `
WITH upd AS (` + write + `),
rej AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT $1, $2, $3, 'stale_write_rejected', '` + op + `'
    WHERE NOT EXISTS (SELECT 1 FROM upd)
    RETURNING id)
SELECT upd.state FROM upd`
}

var sqlComplete = staleWrite(`
    UPDATE fenceq_jobs SET state = 'completed', finished_at = now(), lease_expires_at = NULL
    WHERE id = $1 AND lease_gen = $2 AND state = 'running'
    RETURNING state`, "complete")

// sqlCompleteMany: $1 ids, $2 generations, $3 worker. Returns the (id, generation) pairs
// whose lease was lost: one batch can carry two leases of one job (an old one revoked
// while its handler still ran here, and the one claimed afterwards).
//
// The fence compares the row's state with a column of the batch (l.lstate, always
// 'running') rather than with a constant, so that it is a join condition and not a
// restriction on fenceq_jobs. As a restriction, the planner estimated it from
// statistics taken when no job was running ("state = 'running'": about one row) and
// either scanned the whole running range of an index (walking the entries of every job
// completed since the last VACUUM: 21 ms per ~300 jobs with an idle transaction holding
// the horizon) or made fenceq_jobs the outer side of a nested loop (bench steady: 0.3 to
// 1.3 s per batch). As a join condition it leaves the rows to be found by id in the
// primary key. The batch is MATERIALIZED so its constant stays opaque to the planner.
const sqlCompleteMany = `
WITH l AS MATERIALIZED (
    SELECT l.*, 'running'::text AS lstate FROM unnest($1::bigint[], $2::bigint[]) AS l(lid, lgen)),
upd AS (
    UPDATE fenceq_jobs j SET state = 'completed', finished_at = now(), lease_expires_at = NULL
    FROM l WHERE j.id = l.lid AND j.lease_gen = l.lgen AND j.state = l.lstate
    RETURNING j.id, j.lease_gen),
rej AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT l.lid, l.lgen, $3, 'stale_write_rejected', 'complete'
    FROM l WHERE NOT EXISTS (SELECT 1 FROM upd WHERE upd.id = l.lid AND upd.lease_gen = l.lgen)
    RETURNING job_id, lease_gen)
SELECT COALESCE(array_agg(job_id), '{}')::bigint[], COALESCE(array_agg(lease_gen), '{}')::bigint[] FROM rej`

// sqlFail: $4 discard now, $5 backoff (µs), $6 error, $7 trace.
var sqlFail = staleWrite(`
    UPDATE fenceq_jobs SET
        state = CASE WHEN $4::boolean OR attempt >= max_attempts THEN 'discarded' ELSE 'retryable' END,
        run_at = CASE WHEN $4::boolean OR attempt >= max_attempts THEN run_at
                      ELSE now() + $5::bigint * interval '1 microsecond' END,
        finished_at = CASE WHEN $4::boolean OR attempt >= max_attempts THEN now() END,
        leased_by = CASE WHEN $4::boolean OR attempt >= max_attempts THEN leased_by END,
        lease_expires_at = NULL,
        errors = errors || jsonb_build_array(jsonb_build_object(
            'at', now(), 'attempt', attempt, 'lease_gen', lease_gen, 'worker', $3::text,
            'error', $6::text, 'trace', $7::text))
    WHERE id = $1 AND lease_gen = $2 AND state = 'running'
    RETURNING state`, "fail")

// sqlSnooze: $4 delay (µs). Snoozing does not use up an attempt.
var sqlSnooze = staleWrite(`
    UPDATE fenceq_jobs SET
        state = CASE WHEN $4::bigint > 0 THEN 'scheduled' ELSE 'available' END,
        run_at = now() + $4::bigint * interval '1 microsecond',
        max_attempts = max_attempts + 1,
        leased_by = NULL, lease_expires_at = NULL
    WHERE id = $1 AND lease_gen = $2 AND state = 'running'
    RETURNING state`, "snooze")

// sqlCancel: $4 reason.
var sqlCancel = staleWrite(`
    UPDATE fenceq_jobs SET state = 'cancelled', finished_at = now(), lease_expires_at = NULL,
        errors = errors || jsonb_build_array(jsonb_build_object(
            'at', now(), 'attempt', attempt, 'lease_gen', lease_gen, 'worker', $3::text,
            'error', $4::text))
    WHERE id = $1 AND lease_gen = $2 AND state = 'running'
    RETURNING state`, "cancel")

// sqlRelease gives a job back on shutdown; the attempt is not counted.
var sqlRelease = staleWrite(`
    UPDATE fenceq_jobs SET state = 'available', attempt = GREATEST(attempt - 1, 0),
        leased_by = NULL, lease_expires_at = NULL
    WHERE id = $1 AND lease_gen = $2 AND state = 'running'
    RETURNING state`, "release")

// sqlLockLease is the fence of a handler's transaction: the row lock keeps the reaper
// and every other writer out until COMMIT.
const sqlLockLease = `
SELECT state FROM fenceq_jobs
WHERE id = $1 AND lease_gen = $2 AND state = 'running'
FOR UPDATE`

const sqlCompleteLocked = `
UPDATE fenceq_jobs SET state = 'completed', finished_at = now(), lease_expires_at = NULL
WHERE id = $1 AND lease_gen = $2 AND state = 'running'`

// sqlJobLease reads the generation and state a job has now (Landed).
const sqlJobLease = `SELECT lease_gen, state FROM fenceq_jobs WHERE id = $1`

const sqlRecordStale = `
INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
VALUES ($1, $2, $3, 'stale_write_rejected', $4)`

// sqlReap revokes expired leases. $1 limit, $2 freshness (µs) of a holder's worker
// heartbeat that counts as alive.
const sqlReap = `
WITH expired AS (
    SELECT id AS eid, lease_gen AS egen, leased_by AS eby, heartbeat_at AS ehb FROM fenceq_jobs
    WHERE state = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED),
upd AS (
    UPDATE fenceq_jobs j SET
        lease_gen = j.lease_gen + 1,
        state = CASE WHEN j.attempt >= j.max_attempts THEN 'discarded' ELSE 'available' END,
        finished_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
        leased_by = NULL, lease_expires_at = NULL,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'at', now(), 'attempt', j.attempt, 'lease_gen', e.egen, 'worker', e.eby,
            'error', 'lease expired (last heartbeat ' || e.ehb || ')'))
    FROM expired e
    WHERE j.id = e.eid AND j.lease_gen = e.egen AND j.state = 'running'
    RETURNING j.id, e.egen, e.eby, j.state, j.queue, j.kind),
alive AS (
    SELECT u.id FROM upd u JOIN fenceq_workers w ON w.id = u.eby
    WHERE w.heartbeat_at > now() - $2::bigint * interval '1 microsecond'),
ev AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT id, egen, eby, 'revoked', 'lease expired; now ' || state FROM upd
    UNION ALL
    SELECT u.id, u.egen, u.eby, 'expired_holder_alive', 'holder still heartbeats in fenceq_workers'
    FROM upd u JOIN alive a ON a.id = u.id),
wake AS (
    SELECT count(pg_notify('fenceq_jobs:' || current_schema(), q)) AS n
    FROM (SELECT DISTINCT queue AS q FROM upd WHERE state = 'available') x)
SELECT u.id, u.egen, COALESCE(u.eby, ''), u.state, u.queue, u.kind,
       EXISTS (SELECT 1 FROM alive a WHERE a.id = u.id)
FROM upd u CROSS JOIN wake`

// sqlPromoteDue makes scheduled and retryable jobs whose time has come available.
const sqlPromoteDue = `
WITH due AS (
    SELECT id AS did FROM fenceq_jobs
    WHERE state IN ('scheduled', 'retryable') AND run_at <= now()
    ORDER BY run_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED),
upd AS (
    UPDATE fenceq_jobs j SET state = 'available'
    FROM due WHERE j.id = due.did AND j.state IN ('scheduled', 'retryable')
    RETURNING j.queue)
SELECT (SELECT count(*) FROM upd),
       (SELECT count(pg_notify('fenceq_jobs:' || current_schema(), q))
        FROM (SELECT DISTINCT queue AS q FROM upd) x)`

// sqlPruneFinished deletes finished jobs older than $1 (µs), at most $2 of them.
const sqlPruneFinished = `
WITH old AS (
    SELECT id AS oid FROM fenceq_jobs
    WHERE finished_at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
DELETE FROM fenceq_jobs j USING old
WHERE j.id = old.oid AND j.state IN ('completed', 'discarded', 'cancelled')`

const sqlPruneLeaseEvents = `
DELETE FROM fenceq_lease_events WHERE id IN (
    SELECT id FROM fenceq_lease_events WHERE at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY at LIMIT $2)`
