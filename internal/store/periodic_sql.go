package store

import "strings"

// SQL for fenceq_periodic and fenceq_periodic_clock. Times are the database's: a
// schedule's first last_slot is now() at its insert, a resume moves last_slot to now(),
// and a scheduling pass reads clock_timestamp() once it holds the clock row. Jobs are
// inserted with the column defaults of fenceq_jobs for state and run_at (available,
// now()).

const periodicColumns = `name, spec, timezone, kind, args, queue, priority, max_attempts, missed,
    run_on_start, paused, last_slot, last_enqueued_slot, source, created_at, updated_at, no_overlap,
    last_skipped_slot, skipped_slots, unique_key, unique_states, unique_period_us, NULLIF(tags, '{}'::text[]), metadata`

// periodicDefinition are the columns of a schedule's definition after name, in the order
// of periodicArgs' parameters $2 on.
const periodicDefinition = `spec, timezone, kind, args, queue, priority, max_attempts, missed, run_on_start, source,
    no_overlap, unique_key, unique_states, unique_period_us, tags, metadata`

const periodicValues = `$2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17`

// sqlUpsertPeriodic defines a schedule from code: a new row, or the definition of an
// existing one replaced, keeping paused, last_slot and last_enqueued_slot. A row whose
// definition is unchanged is not written.
var sqlUpsertPeriodic = `
INSERT INTO fenceq_periodic (name, ` + periodicDefinition + `, updated_at)
VALUES ($1, ` + periodicValues + `, now())
ON CONFLICT (name) DO UPDATE SET (` + periodicDefinition + `, updated_at) =
    (` + excluded(periodicDefinition) + `, EXCLUDED.updated_at)
WHERE (` + qualified("fenceq_periodic", periodicDefinition) + `)
   IS DISTINCT FROM (` + excluded(periodicDefinition) + `)`

// sqlInsertPeriodic adds a schedule unless one has the name.
var sqlInsertPeriodic = `
INSERT INTO fenceq_periodic (name, ` + periodicDefinition + `)
VALUES ($1, ` + periodicValues + `)
ON CONFLICT (name) DO NOTHING
RETURNING ` + periodicColumns

// excluded and qualified qualify a comma-separated list of columns.
func excluded(cols string) string { return qualified("EXCLUDED", cols) }

func qualified(table, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = table + "." + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}

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

// periodicJob is the INSERT of a job of a schedule: the columns, and the values over the
// schedule's columns (prefix p., the names of fenceq_periodic) with meta, an SQL
// expression, for its origin metadata, merged over the schedule's. The unique key's period
// starts are taken at now(), the job's run_at.
func periodicJob(meta string) (cols, values string) {
	return `queue, kind, args, priority, max_attempts, metadata, unique_key, unique_states, tags`,
		`p.queue, p.kind, p.args, p.priority, p.max_attempts, p.metadata || ` + meta + `, ` +
			uniqueKeySQL("p.unique_key", "p.unique_period_us", "now()") + `, p.unique_states, p.tags`
}

// sqlTriggerPeriodic enqueues one job of a schedule now, leaving last_slot alone. A job
// whose unique key is held is not inserted (no row).
var sqlTriggerPeriodic = func() string {
	cols, values := periodicJob(`jsonb_build_object('periodic', jsonb_build_object('name', p.name, 'triggered', true,
           'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))`)
	return `
INSERT INTO fenceq_jobs_hot (` + cols + `)
SELECT ` + values + `
FROM fenceq_periodic p WHERE p.name = $1
ON CONFLICT (unique_key) WHERE ` + uniqueHeld + ` DO NOTHING
RETURNING ` + jobColumns
}()

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
SELECT t.now, p.name, p.spec, p.timezone, p.missed, p.run_on_start, p.last_slot, p.no_overlap
FROM (SELECT clock_timestamp() AS now) t
LEFT JOIN fenceq_periodic p ON NOT p.paused
ORDER BY p.name`

// sqlEnqueuePeriodic decides the slots of one schedule: a compare-and-set of last_slot
// from the value the pass read ($2) to the newest slot decided ($3), on the definition
// the pass computed the slots from ($4 spec, $5 timezone, $8 no_overlap), and, only when
// it matched, one job per element of $6 (their metadata) for the slot of the same
// position in $7, in slot order. With no_overlap, b reads whether a job of the schedule
// is unfinished (through fenceq_jobs_hot_periodic_idx): then no job is inserted, else only
// the first; the slots left out are skipped (last_skipped_slot, skipped_slots). It
// returns whether the compare-and-set matched, how many jobs it inserted, the schedule's
// queue, how many slots it skipped, the newest of them and the unfinished job's id.
var sqlEnqueuePeriodic = func() string {
	cols, values := periodicJob("m.meta")
	return `
WITH b AS (
    SELECT cardinality($6::jsonb[]) AS planned,
           CASE WHEN $8::boolean THEN (
               SELECT j.id FROM fenceq_jobs_hot j
               WHERE j.metadata ? 'periodic' AND (j.metadata->'periodic'->>'name') = $1::text
                 AND j.state NOT IN ` + sqlFinal + `
               LIMIT 1) END AS busy),
d AS (
    SELECT planned, busy,
           CASE WHEN NOT $8::boolean THEN planned WHEN busy IS NOT NULL THEN 0 ELSE LEAST(planned, 1) END AS n
    FROM b),
s AS (
    UPDATE fenceq_periodic p
    SET last_slot = $3,
        last_enqueued_slot = COALESCE(($7::timestamptz[])[d.n], p.last_enqueued_slot),
        last_skipped_slot = COALESCE(($7::timestamptz[])[CASE WHEN d.n < d.planned THEN d.planned END],
                                     p.last_skipped_slot),
        skipped_slots = p.skipped_slots + (d.planned - d.n)
    FROM d
    WHERE p.name = $1 AND p.last_slot = $2 AND p.spec = $4 AND p.timezone = $5 AND p.no_overlap = $8
      AND NOT p.paused
    RETURNING p.*, d.n AS take),
ins AS (
    INSERT INTO fenceq_jobs_hot (` + cols + `)
    SELECT ` + values + `
    FROM s p, unnest($6::jsonb[]) WITH ORDINALITY AS m(meta, ord)
    WHERE m.ord <= p.take
    ORDER BY m.ord
    ON CONFLICT (unique_key) WHERE ` + uniqueHeld + ` DO NOTHING
    RETURNING id)
SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM ins), (SELECT queue FROM s),
       (SELECT planned - n FROM d), ($7::timestamptz[])[(SELECT CASE WHEN n < planned THEN planned END FROM d)],
       (SELECT busy FROM d)`
}()

// sqlEnqueueOnStart inserts the one job of a run-on-start schedule ($2 its metadata).
var sqlEnqueueOnStart = func() string {
	cols, values := periodicJob("$2::jsonb")
	return `
INSERT INTO fenceq_jobs_hot (` + cols + `)
SELECT ` + values + `
FROM fenceq_periodic p WHERE p.name = $1 AND NOT p.paused
ON CONFLICT (unique_key) WHERE ` + uniqueHeld + ` DO NOTHING
RETURNING id, queue`
}()

const sqlTouchPeriodicClock = `UPDATE fenceq_periodic_clock SET heartbeat_at = $1`

const sqlReadPeriodicClock = `SELECT heartbeat_at, now() FROM fenceq_periodic_clock`
