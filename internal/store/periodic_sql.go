package store

// SQL for fenceq_periodic and fenceq_periodic_clock. Times are the database's: a
// schedule's first last_slot is now() at its insert, a resume moves last_slot to now(),
// and a scheduling pass reads clock_timestamp() once it holds the clock row. Jobs are
// inserted with the column defaults of fenceq_jobs for state and run_at (available,
// now()).

const periodicColumns = `name, spec, timezone, kind, args, queue, priority, max_attempts, missed,
    run_on_start, paused, last_slot, last_enqueued_slot, source, created_at, updated_at`

// sqlUpsertPeriodic defines a schedule from code: a new row, or the definition of an
// existing one replaced, keeping paused, last_slot and last_enqueued_slot. A row whose
// definition is unchanged is not written.
const sqlUpsertPeriodic = `
INSERT INTO fenceq_periodic (name, spec, timezone, kind, args, queue, priority, max_attempts, missed,
    run_on_start, source, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, now())
ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, timezone = EXCLUDED.timezone, kind = EXCLUDED.kind,
    args = EXCLUDED.args, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts, missed = EXCLUDED.missed, run_on_start = EXCLUDED.run_on_start,
    source = EXCLUDED.source, updated_at = EXCLUDED.updated_at
WHERE (fenceq_periodic.spec, fenceq_periodic.timezone, fenceq_periodic.kind, fenceq_periodic.args,
       fenceq_periodic.queue, fenceq_periodic.priority, fenceq_periodic.max_attempts, fenceq_periodic.missed,
       fenceq_periodic.run_on_start, fenceq_periodic.source)
   IS DISTINCT FROM (EXCLUDED.spec, EXCLUDED.timezone, EXCLUDED.kind, EXCLUDED.args, EXCLUDED.queue,
       EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.missed, EXCLUDED.run_on_start, EXCLUDED.source)`

// sqlInsertPeriodic adds a schedule unless one has the name.
const sqlInsertPeriodic = `
INSERT INTO fenceq_periodic (name, spec, timezone, kind, args, queue, priority, max_attempts, missed,
    run_on_start, source)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (name) DO NOTHING
RETURNING ` + periodicColumns

const sqlListPeriodic = `SELECT ` + periodicColumns + `, now() FROM fenceq_periodic ORDER BY name`

const sqlGetPeriodic = `SELECT ` + periodicColumns + `, now() FROM fenceq_periodic WHERE name = $1`

// sqlSetPeriodicPaused pauses or resumes a schedule. A resume moves last_slot to now():
// the slots that fell due while it was paused are passed over, not caught up. The time
// is read once, in c, so that no function call sits in the CASE or the RETURNING list
// (Citus evaluates those on the coordinator and refuses them there).
const sqlSetPeriodicPaused = `
WITH c AS (SELECT now() AS now)
UPDATE fenceq_periodic
SET paused = $2, updated_at = c.now,
    last_slot = CASE WHEN paused AND NOT $2 THEN GREATEST(last_slot, c.now) ELSE last_slot END
FROM c
WHERE name = $1
RETURNING ` + periodicColumns + `, c.now`

const sqlRemovePeriodic = `
WITH c AS (SELECT now() AS now)
DELETE FROM fenceq_periodic USING c WHERE name = $1 RETURNING ` + periodicColumns + `, c.now`

// sqlTriggerPeriodic enqueues one job of a schedule now, leaving last_slot alone.
var sqlTriggerPeriodic = `
INSERT INTO fenceq_jobs_hot (queue, kind, args, priority, max_attempts, metadata)
SELECT queue, kind, args, priority, max_attempts,
       jsonb_build_object('periodic', jsonb_build_object('name', name, 'triggered', true,
           'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))
FROM fenceq_periodic WHERE name = $1
RETURNING ` + jobColumns

// sqlLockPeriodicClock starts a scheduling pass: it locks the clock row, which
// serializes passes across workers, and bounds how long this session may sit idle in
// the transaction ($1, e.g. "5000ms"): a holder paused mid-pass is disconnected, so
// the lock is released and the other workers' passes go on.
const sqlLockPeriodicClock = `
SELECT heartbeat_at, set_config('idle_in_transaction_session_timeout', $1, true)
FROM fenceq_periodic_clock FOR UPDATE`

const sqlEnsurePeriodicClock = `INSERT INTO fenceq_periodic_clock (id) VALUES (true) ON CONFLICT DO NOTHING`

// sqlDuePeriodic reads, in a pass that holds the clock row, the database's time and the
// schedules that are not paused. The time is read after the lock was granted, so
// serialized passes read increasing times.
const sqlDuePeriodic = `
SELECT t.now, p.name, p.spec, p.timezone, p.missed, p.run_on_start, p.last_slot
FROM (SELECT clock_timestamp() AS now) t
LEFT JOIN fenceq_periodic p ON NOT p.paused
ORDER BY p.name`

// sqlEnqueuePeriodic decides the slots of one schedule: a compare-and-set of last_slot
// from the value the pass read ($2) to the newest slot decided ($3), on the definition
// the pass computed the slots from ($4 spec, $5 timezone), and, only when it matched,
// one job per element of $6 (their metadata), in slot order. $7 is the newest slot
// enqueued (NULL when none). It returns whether the compare-and-set matched, how many
// jobs it inserted and the schedule's queue.
const sqlEnqueuePeriodic = `
WITH s AS (
    UPDATE fenceq_periodic
    SET last_slot = $3, last_enqueued_slot = COALESCE($7, last_enqueued_slot)
    WHERE name = $1 AND last_slot = $2 AND spec = $4 AND timezone = $5 AND NOT paused
    RETURNING queue, kind, args, priority, max_attempts),
ins AS (
    INSERT INTO fenceq_jobs_hot (queue, kind, args, priority, max_attempts, metadata)
    SELECT s.queue, s.kind, s.args, s.priority, s.max_attempts, m.meta
    FROM s, unnest($6::jsonb[]) WITH ORDINALITY AS m(meta, ord)
    ORDER BY m.ord
    RETURNING id)
SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM ins), (SELECT queue FROM s)`

// sqlEnqueueOnStart inserts the one job of a run-on-start schedule ($2 its metadata).
const sqlEnqueueOnStart = `
INSERT INTO fenceq_jobs_hot (queue, kind, args, priority, max_attempts, metadata)
SELECT queue, kind, args, priority, max_attempts, $2
FROM fenceq_periodic WHERE name = $1 AND NOT paused
RETURNING id, queue`

const sqlTouchPeriodicClock = `UPDATE fenceq_periodic_clock SET heartbeat_at = $1`

const sqlReadPeriodicClock = `SELECT heartbeat_at, now() FROM fenceq_periodic_clock`
