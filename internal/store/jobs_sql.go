package store

// SQL for fenceq_jobs. Every statement that writes under a lease carries
// "lease_gen = " in its WHERE clause next to the job id and the running state, spelled
// out for the batched statements and as leaseGuard (lockedGuard in the fenced
// transaction) for the single-lease ones:
//
//	grep -n "lease_gen = \|leaseGuard\|lockedGuard" internal/store/*_sql.go
//
// Times are always the database's (now()); durations arrive as microseconds. States and
// event kinds come from vocab.go.

import (
	"fmt"
	"strings"
)

// sqlInsertJob: $7 the unique key's fixed part, $10 its state mask, $11 its period
// (µs, 0 for none), $12 tags.
//
// A single VALUES row, its run_at spelled out where it is needed (now() is the
// transaction's time, the same at each place): an INSERT … SELECT, even from a one-row
// CTE, is one that Citus pulls to the coordinator and then commits in two phases.
var sqlInsertJob = `
INSERT INTO fenceq_jobs_hot (queue, kind, args, priority, run_at, max_attempts, unique_key, state, metadata,
    unique_states, tags, flow_key)
VALUES ($1, $2, $3, $4, ` + insertRunAt + `, $6, ` + uniqueKeySQL("$7::text", "$11::bigint", insertRunAt) + `,
    CASE WHEN ` + insertRunAt + ` > now() THEN ` + sqlScheduled + ` ELSE ` + sqlAvailable + ` END, $9, $10, $12, $13)
ON CONFLICT (unique_key) WHERE ` + uniqueHeld + ` DO NOTHING
RETURNING ` + jobColumns

// sqlInsertDebounced inserts a debounced job, or replaces the args and options of the
// job of the same kind and debounce key that has not started: $5 the window (µs), $9
// the key. The conflict target spells the predicate of fenceq_jobs_hot_debounce_idx
// exactly. The job is scheduled at the end of the window either way; created_at and the
// id stay. xmax is 0 on a row this statement inserted and set on one it updated. The DO
// UPDATE SET list uses only EXCLUDED's values: Citus refuses a function that is not
// immutable there (now(), timestamptz + interval), so a maximum wait is applied by
// sqlCapDebounced after it.
var sqlInsertDebounced = `
INSERT INTO fenceq_jobs_hot AS j (queue, kind, args, priority, run_at, max_attempts, state, metadata, tags,
    debounce_key)
VALUES ($1, $2, $3, $4, now() + $5::bigint * interval '1 microsecond', $6, ` + sqlScheduled + `, $7, $8, $9)
ON CONFLICT (kind, debounce_key) WHERE ` + debounceWaiting + `
DO UPDATE SET queue = EXCLUDED.queue, args = EXCLUDED.args, priority = EXCLUDED.priority,
    run_at = EXCLUDED.run_at, max_attempts = EXCLUDED.max_attempts, state = EXCLUDED.state,
    metadata = EXCLUDED.metadata, tags = EXCLUDED.tags
RETURNING ` + jobColumns + `, j.xmax::text <> '0'`

// sqlCapDebounced moves the run_at of debounced job $1, which sqlInsertDebounced just
// replaced in the same transaction (so its row is locked), back to $2, its created_at
// plus the maximum wait, and sets its state to $3 (available when $2 has come). The
// guard repeats that the job has not started.
var sqlCapDebounced = `
UPDATE fenceq_jobs_hot SET run_at = $2::timestamptz, state = $3
WHERE id = $1 AND lease_gen = 0 AND state IN (` + sqlAvailable + `, ` + sqlScheduled + `)
RETURNING ` + jobColumns

// debounceWaiting is the predicate of fenceq_jobs_hot_debounce_idx: a job with a debounce
// key that was never claimed (lease_gen grows at every claim and never shrinks) and waits.
var debounceWaiting = `debounce_key IS NOT NULL AND lease_gen = 0 AND state IN (` + sqlAvailable + `, ` + sqlScheduled + `)`

// insertRunAt is the run_at of sqlInsertJob: $5 an absolute time, else now() plus $8 µs.
const insertRunAt = `COALESCE($5::timestamptz, now() + $8::bigint * interval '1 microsecond')`

// sqlGetUniqueHolder reads the job holding a unique key: $1 the key's fixed part, $2 its
// period (µs), $3 run_at, $4 run_in (µs), as given to sqlInsertJob.
var sqlGetUniqueHolder = `
SELECT ` + jobColumns + ` FROM fenceq_jobs_hot
WHERE unique_key = ` + uniqueKeySQL("$1::text", "$2::bigint", "COALESCE($3::timestamptz, now() + $4::bigint * interval '1 microsecond')") + `
  AND ` + uniqueHeld

// The staging table lives until the end of the transaction; TRUNCATE makes a second
// InsertMany in one transaction start empty.
const sqlCreateStaging = `
CREATE TEMP TABLE IF NOT EXISTS fenceq_jobs_staging (
    ord int, queue text, kind text, args jsonb, priority smallint, run_at timestamptz,
    run_in_us bigint, max_attempts int, unique_key text, metadata jsonb,
    unique_states smallint, unique_period_us bigint, tags text[], flow_key text) ON COMMIT DROP;
TRUNCATE fenceq_jobs_staging`

// The rows inserted are counted from RETURNING rather than read from the command tag:
// on Citus, where the INSERT … SELECT pulls the rows to the coordinator, the tag counts
// the rows offered, including those ON CONFLICT skipped.
var sqlInsertFromStaging = `
WITH ins AS (
INSERT INTO fenceq_jobs_hot (queue, kind, args, priority, run_at, max_attempts, unique_key, state, metadata,
    unique_states, tags, flow_key)
SELECT queue, kind, args, priority, at, max_attempts, ` + uniqueKeySQL("unique_key", "unique_period_us", "at") + `,
       CASE WHEN at > now() THEN ` + sqlScheduled + ` ELSE ` + sqlAvailable + ` END, metadata, unique_states, tags, flow_key
FROM (SELECT s.*, COALESCE(s.run_at, now() + s.run_in_us * interval '1 microsecond') AS at
      FROM fenceq_jobs_staging s ORDER BY ord) x
ON CONFLICT (unique_key) WHERE ` + uniqueHeld + ` DO NOTHING
RETURNING 1)
SELECT count(*) FROM ins`

// claimSQL is the claim: $1 queue, $2 limit, $3 worker id, $4 lease (µs). With after,
// it claims only jobs after a position in claim order: $5 priority, $6 run_at, $7 id. The
// row comparison is an index condition of fenceq_jobs_claim_idx, so that scan starts at
// the position instead of walking, from the start of the available range, the index
// entries of the jobs claimed since the last VACUUM. With kinds, it claims only jobs of
// those kinds (the next parameter, a text array): a filter on the rows the same scan
// visits, so jobs of other kinds are stepped over, never claimed (see ClaimParams.Kinds).
//
// The ordinary claim leaves out a queue with a limit (fenceq_queues.max_running): such a
// queue is claimed by ClaimInQueueLimit, in a transaction that holds the queue's lock,
// with inLimit set.
func claimSQL(after, kinds bool, inLimit ...bool) string {
	skip := "(q.paused OR q.max_running IS NOT NULL)"
	if len(inLimit) > 0 && inLimit[0] {
		skip = "q.paused"
	}
	cursor, kind := "", ""
	if after {
		cursor = `
      AND (priority, run_at, id) > ($5::smallint, $6::timestamptz, $7::bigint)`
	}
	if kinds {
		n := 5
		if after {
			n = 8
		}
		kind = fmt.Sprintf(`
      AND kind = ANY($%d::text[])`, n)
	}
	return `
WITH next AS (
    SELECT id AS next_id FROM fenceq_jobs_hot
    WHERE state = ` + sqlAvailable + ` AND flow_key IS NULL AND queue = $1 AND run_at <= now()` + cursor + kind + `
      AND NOT EXISTS (SELECT 1 FROM fenceq_queues q WHERE q.name = $1 AND ` + skip + `)
    ORDER BY priority, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE fenceq_jobs_hot
SET ` + claimSet("$3", "$4") + `
FROM next WHERE id = next.next_id
RETURNING ` + claimedColumns
}

// claimSet is the SET list of a claim: worker names the worker id's parameter, lease
// the lease's (µs).
func claimSet(worker, lease string) string {
	return `state = ` + sqlRunning + `, attempt = attempt + 1, lease_gen = lease_gen + 1,
    leased_by = ` + worker + `, heartbeat_at = now(), attempted_at = now(),
    lease_expires_at = now() + ` + lease + `::bigint * interval '1 microsecond'`
}

// claimManySQL claims from many queues in one statement: $1 worker id, $2 lease (µs),
// $3 the most jobs in all, then one array per column of the queues' batch: $4 names,
// $5 limits, and the cursor of each queue, $6 priority, $7 run_at, $8 id (NULL elements
// for a queue claimed from the start of the order). With kinds, $9 is the text array of
// the kinds claimed.
//
// Each queue of the batch that is not paused is claimed by a LATERAL subquery of its
// own, claimSQL's scan: the claim index from the queue's cursor on, in claim order,
// LIMIT the queue's limit, FOR UPDATE SKIP LOCKED. The queues are visited in the order
// of the batch, and the visit stops once $3 jobs are taken (the nested loop stops
// pulling rows, so no row past them is locked): the queues after that point are not
// claimed from. A missing cursor is the lowest
// position of the order (the least smallint, -infinity, id 0: ids start at 1), so that
// the row comparison is an index condition of every queue's scan, where an OR with "no
// cursor" would be a filter. The batch is MATERIALIZED: read once, each queue scanned
// once. The update finds the rows by primary key (id = ANY of an array); a join with the
// claimed ids is planned as a hash join over the whole table. Rows come back with their
// queue.
func claimManySQL(kinds bool) string {
	kind := ""
	if kinds {
		kind = `
          AND kind = ANY($9::text[])`
	}
	return `
WITH q AS MATERIALIZED (
    SELECT * FROM unnest($4::text[], $5::int[], $6::smallint[], $7::timestamptz[], $8::bigint[])
        AS q(name, n, cp, cr, cid)
    WHERE NOT EXISTS (SELECT 1 FROM fenceq_queues p WHERE p.name = q.name AND (p.paused OR p.max_running IS NOT NULL))),
next AS (
    SELECT x.id FROM q CROSS JOIN LATERAL (
        SELECT id FROM fenceq_jobs_hot
        WHERE state = ` + sqlAvailable + ` AND flow_key IS NULL AND queue = q.name AND run_at <= now()
          AND (priority, run_at, id) > (COALESCE(q.cp, (-32768)::smallint),
                                        COALESCE(q.cr, '-infinity'::timestamptz), COALESCE(q.cid, 0::bigint))` + kind + `
        ORDER BY priority, run_at, id
        LIMIT q.n
        FOR UPDATE SKIP LOCKED) x
    LIMIT $3)
UPDATE fenceq_jobs_hot
SET ` + claimSet("$1", "$2") + `
WHERE id = ANY (ARRAY(SELECT id FROM next))
RETURNING ` + claimedColumns + `, queue`
}

var (
	sqlClaimMany      = claimManySQL(false)
	sqlClaimManyKinds = claimManySQL(true)
)

// sqlOtherKindsAhead is sqlOtherKindAhead for many queues: $1 the kinds, $2 the queues'
// names, and the position before which to look in each, $3 priority, $4 run_at, $5 id
// (NULL elements to look anywhere in the queue). A missing position is the highest of
// the order (the greatest smallint, infinity, the greatest bigint; an available job
// claimable now has run_at <= now()), so that the row comparison is an index condition
// of every queue's backward scan. It returns the position (from 1) of the queue in $2
// and the job found, for the queues that have one.
var sqlOtherKindsAhead = `
SELECT q.ord, x.priority, x.run_at, x.id
FROM unnest($2::text[], $3::smallint[], $4::timestamptz[], $5::bigint[]) WITH ORDINALITY AS q(name, bp, br, bid, ord)
CROSS JOIN LATERAL (
    SELECT priority, run_at, id FROM fenceq_jobs_hot
    WHERE state = ` + sqlAvailable + ` AND flow_key IS NULL AND queue = q.name AND run_at <= now()
      AND (priority, run_at, id) < (COALESCE(q.bp, (32767)::smallint),
                                    COALESCE(q.br, 'infinity'::timestamptz), COALESCE(q.bid, 9223372036854775807::bigint))
      AND kind <> ALL($1::text[])
    ORDER BY priority DESC, run_at DESC, id DESC
    LIMIT 1) x`

var (
	sqlClaimInLimit      = claimSQL(false, false, true)
	sqlClaimKindsInLimit = claimSQL(false, true, true)
	sqlClaim             = claimSQL(false, false)
	sqlClaimAfter        = claimSQL(true, false)
	sqlClaimKinds        = claimSQL(false, true)
	sqlClaimKindsAfter   = claimSQL(true, true)
)

// sqlOtherKindAhead finds the last available job of queue $1 whose kind is not among $2,
// before the position ($3, $4, $5) in claim order, or anywhere when $3 is NULL. It walks
// the claim index backwards from that position, over the jobs of the kinds in $2 (few:
// a claim just took every one it could), to the first job of another kind.
var sqlOtherKindAhead = `
SELECT priority, run_at, id FROM fenceq_jobs_hot
WHERE state = ` + sqlAvailable + ` AND flow_key IS NULL AND queue = $1 AND run_at <= now()
  AND ($3::smallint IS NULL OR (priority, run_at, id) < ($3::smallint, $4::timestamptz, $5::bigint))
  AND kind <> ALL($2::text[])
ORDER BY priority DESC, run_at DESC, id DESC
LIMIT 1`

// sqlHeartbeat renews every lease a process holds in one statement and heartbeats the
// worker row. $1 ids, $2 generations, $3 lease (µs), $4 worker id.
//
// The state is compared with a column of the batch so that rows are looked up by id
// (see sqlCompleteMany). The held and renewed leases are aggregated apart (every renewed
// lease is also held), because joining them makes a nested loop, quadratic in the
// leases. Both come back as (id, generation) pairs: a worker can send two leases of one
// job (an old one, revoked while its handler still runs, and the one it claimed
// afterwards), and only the matching generation is held.
//
// A lease whose row still carries its generation but is no longer running was ended by
// the holder's own write (only the holder leaves running without bumping the
// generation: see Landed), which may land between the worker's snapshot of its leases
// and this statement; it comes back as finished, not lost.
// Held leases are looked up in fenceq_jobs, the view of both tables, because such a job
// may have moved to history; the renewal locks and updates the hot set only.
//
// Rows locked by someone else right now (this process's own fenced commit, the reaper,
// an operator) are skipped rather than waited for, so one long transaction cannot stall
// the renewal of every other lease. Such a lease is reported as held-but-not-renewed
// when its generation still matches in the statement's snapshot, and as lost otherwise.
var sqlHeartbeat = heartbeatSQL("fenceq_jobs")

// sqlHeartbeatRouted is sqlHeartbeat for a Citus connection: it reads the held leases in
// the hot set only, so that the statement names no view and is routed whole (jobs are
// finished in place there, and stay in the hot set until MoveFinished).
var sqlHeartbeatRouted = heartbeatSQL(hotTable)

// heartbeatSQL is the heartbeat statement, reading held leases from table.
func heartbeatSQL(table string) string {
	return `
WITH l AS MATERIALIZED (
    SELECT l.*, ` + sqlRunning + `::text AS lstate FROM unnest($1::bigint[], $2::bigint[]) AS l(lid, lgen)),
held AS (
    SELECT j.id, j.lease_gen, j.state = l.lstate AS running FROM ` + table + ` j JOIN l ON j.id = l.lid
    WHERE j.lease_gen = l.lgen AND j.id = ANY($1::bigint[])),
lk AS (
    SELECT j.id AS lk_id, l.lgen AS lk_gen, l.lstate AS lk_state FROM fenceq_jobs_hot j JOIN l ON j.id = l.lid
    WHERE j.lease_gen = l.lgen AND j.state = l.lstate
    ORDER BY j.id
    FOR NO KEY UPDATE OF j SKIP LOCKED),
upd AS (
    UPDATE fenceq_jobs_hot j
    SET heartbeat_at = now(), lease_expires_at = now() + $3::bigint * interval '1 microsecond'
    FROM lk WHERE j.id = lk.lk_id AND j.lease_gen = lk.lk_gen AND j.state = lk.lk_state
    RETURNING j.id, j.lease_gen),
w AS (UPDATE fenceq_workers SET heartbeat_at = now() WHERE id = $4 RETURNING id)
SELECT h.ids, h.gens, h.running, u.ids, u.gens, (SELECT count(*) FROM w)
FROM (SELECT COALESCE(array_agg(id), '{}')::bigint[] AS ids, COALESCE(array_agg(lease_gen), '{}')::bigint[] AS gens,
             COALESCE(array_agg(running), '{}')::boolean[] AS running FROM held) h,
     (SELECT COALESCE(array_agg(id), '{}')::bigint[] AS ids, COALESCE(array_agg(lease_gen), '{}')::bigint[] AS gens FROM upd) u`
}

// fencedSQL is a single-lease write in the two forms fencedWrite runs. Both take $1 id,
// $2 gen, $3 worker and $4 the operation (the event's detail); the write's own
// parameters start at $5, and both return the row's new state, or no row when the
// lease is gone.
type fencedSQL struct {
	// one records the rejection of a write that matched nothing in the same statement.
	one string
	// routed is the write alone: one modification, which a Citus coordinator sends
	// whole to the node holding the schema. A statement that also inserts (an INSERT
	// in a CTE) is planned in steps on the coordinator and committed in two phases
	// across it and that node; fencedWrite records the rejection with a second,
	// routed statement instead. $3 and $4 are typed in a CTE of their own so that the
	// parameters stay those of one.
	routed string
}

// staleWrite wraps a single-lease write in its two forms (see fencedSQL): ctes are the
// write's CTEs, the last of them named upd and returning the row's new state.
func staleWrite(ctes string) fencedSQL { return staleWrites(ctes, ctes) }

// staleFinish is staleWrite for a write that may finish its job: it moves the job to
// history, and its routed form finishes the job in place (see finish.inPlace).
func staleFinish(f finish) fencedSQL { return staleWrites(f.ctes(), f.inPlace()) }

// staleWrites is staleWrite with the routed form's CTEs apart.
func staleWrites(ctes, routedCTEs string) fencedSQL {
	return fencedSQL{
		one: `
WITH ` + ctes + `,
rej AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT $1, $2, $3, ` + sqlEventStaleWrite + `, $4::text
    WHERE NOT EXISTS (SELECT 1 FROM upd)
    RETURNING id)
SELECT upd.state FROM upd`,
		routed: `
WITH ` + routedCTEs + `,
p AS (SELECT $3::text AS worker, $4::text AS op)
SELECT upd.state FROM upd, p`,
	}
}

// leaseCond is the condition of every single-lease write, and leaseGuard its WHERE
// clause.
var (
	leaseCond  = `id = $1 AND lease_gen = $2 AND state = ` + sqlRunning
	leaseGuard = `WHERE ` + leaseCond
)

// sqlComplete: $5 the job's output (NULL for none). A job that is already completed
// under the same generation counts as completed, without a rejection record and
// without touching the row (its output stays the one written with that completion):
// only the holder of the generation leaves running without bumping it (see Landed), so
// that completion was this attempt's own, made under the lease by a transaction of the
// application's (the SQL function fenceq_complete, called by an HTTP endpoint, say).
var sqlComplete = fencedSQL{
	one: `
WITH ` + sqlCompleteUpdate + `,
done AS (` + sqlCompletedAlready + `),
rej AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT $1, $2, $3, ` + sqlEventStaleWrite + `, $4::text
    WHERE NOT EXISTS (SELECT 1 FROM upd) AND NOT EXISTS (SELECT 1 FROM done)
    RETURNING id)
SELECT state FROM upd UNION ALL SELECT state FROM done`,
	routed: `
WITH ` + completion("upd", leaseCond, "", "", "$5::jsonb", "state").inPlace() + `,
done AS (` + strings.Replace(sqlCompletedAlready, "FROM fenceq_jobs\n", "FROM "+hotTable+"\n", 1) + `),
p AS (SELECT $3::text AS worker, $4::text AS op)
SELECT s.state FROM (SELECT state FROM upd UNION ALL SELECT state FROM done) s, p`,
}

// sqlCompleteUpdate is the fenced completion of sqlComplete: CTEs, the last named upd.
var sqlCompleteUpdate = completion("upd", leaseCond, "", "", "$5::jsonb", "state").ctes()

// completion is the finish that completes the rows where selects, with output the SQL of
// each one's output.
func completion(name, where, using, usingCols, output, returning string) finish {
	return finish{name: name, using: using, usingCols: usingCols, where: where, state: sqlCompleted,
		set:       [][2]string{{"finished_at", "now()"}, {"lease_expires_at", "NULL"}, {"output", output}},
		returning: returning}
}

// sqlCompletedAlready finds, for sqlComplete, the job completed under the lease by an
// earlier statement. It reads the statement's snapshot, so it never sees the row upd
// completes (that row was running when the statement started); it runs only when upd
// matched nothing.
var sqlCompletedAlready = `
    SELECT state FROM fenceq_jobs
    WHERE id = $1 AND lease_gen = $2 AND state = ` + sqlCompleted + ` AND NOT EXISTS (SELECT 1 FROM upd)`

// sqlCompleteMany: $1 ids, $2 generations, $3 worker, $4 outputs (NULL elements for
// jobs without one; an empty or NULL array when none has one: unnest pads the shorter
// arrays with NULLs). Returns the (id, generation) pairs
// whose lease was lost: one batch can carry two leases of one job (an old one revoked
// while its handler still ran here, and the one claimed afterwards).
//
// The fence compares the row's state with a column of the batch (l.lstate, always
// running) rather than with a constant, so that it is a join condition and not a
// restriction on fenceq_jobs. As a restriction, the planner estimates it from
// statistics taken when no job was running (about one row) and either scans the whole
// running range of an index (walking the entries of every job completed since the last
// VACUUM) or makes fenceq_jobs the outer side of a nested loop. As a join condition it
// leaves the rows to be found by id in the primary key. The batch is MATERIALIZED so
// its constant stays opaque to the planner.
//
// A lease whose job is already completed under the same generation is neither
// completed again nor rejected: that completion was the attempt's own (see
// sqlComplete). The lookup runs only for the leases upd did not complete.
var sqlCompleteMany = completeManySQL(finish.ctes)

// sqlCompleteManyMoving is sqlCompleteMany for a batch of jobs that each keep no unique
// key once completed (CompleteManyMoving): the finish's moving CTEs, without the
// in-place arm, which would probe fenceq_jobs_hot_keeps_idx once per job of the batch and
// set up an UPDATE of the hot set to match no row.
var sqlCompleteManyMoving = completeManySQL(finish.movingCTEs)

// completeManySQL is sqlCompleteMany with the completion written by write.
func completeManySQL(write func(finish) string) string {
	return completeManyUpdate("$4", write) + `,
rej AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT l.lid, l.lgen, $3, ` + sqlEventStaleWrite + `, 'complete'
    FROM l WHERE (l.lid, l.lgen) NOT IN (SELECT id, lease_gen FROM upd)
        AND NOT EXISTS (SELECT 1 FROM fenceq_jobs d
            WHERE d.id = l.lid AND d.lease_gen = l.lgen AND d.state = ` + sqlCompleted + ` AND d.id = ANY($1::bigint[]))
    RETURNING job_id, lease_gen)
SELECT COALESCE(array_agg(job_id), '{}')::bigint[], COALESCE(array_agg(lease_gen), '{}')::bigint[] FROM rej`
}

// sqlCompleteManyRouted is sqlCompleteMany without the rejection records, for Citus
// (see fencedSQL): $1 ids, $2 generations, $3 outputs. It returns the (id, generation)
// pairs it completed, with those it found already completed under the same generation;
// the caller records the others.
var sqlCompleteManyRouted = completeManyUpdate("$3", finish.inPlace) + `,
done AS (
    SELECT id, lease_gen FROM upd
    UNION ALL
    SELECT d.id, d.lease_gen FROM fenceq_jobs_hot d JOIN l ON d.id = l.lid AND d.lease_gen = l.lgen
    WHERE d.state = ` + sqlCompleted + ` AND d.id = ANY($1::bigint[])
        AND (l.lid, l.lgen) NOT IN (SELECT id, lease_gen FROM upd))
SELECT COALESCE(array_agg(id), '{}')::bigint[], COALESCE(array_agg(lease_gen), '{}')::bigint[] FROM done`

// completeManyUpdate is the batch of leases ($1 ids, $2 generations, outputs the
// parameter named) and its fenced completion, the CTEs every form of the batched
// completion starts with; write spells the completion (finish.ctes, finish.movingCTEs,
// or finish.inPlace for Citus).
func completeManyUpdate(outputs string, write func(finish) string) string {
	f := completion("upd", "j.id = l.lid AND j.lease_gen = l.lgen AND j.state = l.lstate AND j.id = ANY($1::bigint[])", "l", "l.lout",
		"lout", "id, lease_gen")
	return `
WITH l AS MATERIALIZED (
    SELECT l.*, ` + sqlRunning + `::text AS lstate
    FROM unnest($1::bigint[], $2::bigint[], ` + outputs + `::jsonb[]) AS l(lid, lgen, lout)),
` + write(f)
}

// sqlFail: $5 discard now, $6 backoff (µs), $7 error, $8 trace, $9 whether the backoff
// counts from the attempt's attempted_at (never earlier than now()) rather than now().
//
// The time is read once, in c: CASE branches and expressions over the row's columns
// hold no function that is not IMMUTABLE (see errorEntry and addMicros), which is what
// Citus needs to run the statement on the node that holds the row.
var sqlFail = staleFinish(finish{name: "upd",
	using:     `(SELECT now() AS c_now, now() + $6::bigint * interval '1 microsecond' AS c_later) c`,
	usingCols: "c.c_now, c.c_later",
	where:     leaseCond,
	state:     `CASE WHEN $5::boolean OR attempt >= max_attempts THEN ` + sqlDiscarded + ` ELSE ` + sqlRetryable + ` END`,
	set: [][2]string{
		{"run_at", `CASE WHEN $5::boolean OR attempt >= max_attempts THEN run_at
                      WHEN $9::boolean THEN GREATEST(` + addMicros("attempted_at", "$6::bigint") + `, c_now)
                      ELSE c_later END`},
		{"finished_at", "CASE WHEN $5::boolean OR attempt >= max_attempts THEN c_now END"},
		{"leased_by", "CASE WHEN $5::boolean OR attempt >= max_attempts THEN leased_by END"},
		{"lease_expires_at", "NULL"},
		{"errors", "errors || " + errorEntry(`'at', now(), 'worker', $3::text, 'error', $7::text, 'trace', $8::text`, "attempt", "lease_gen")},
	},
	returning: "state"})

// sqlSnooze: $5 delay (µs). Snoozing does not use up an attempt.
var sqlSnooze = staleWrite(`upd AS (
    UPDATE fenceq_jobs_hot SET
        state = CASE WHEN $5::bigint > 0 THEN ` + sqlScheduled + ` ELSE ` + sqlAvailable + ` END,
        run_at = now() + $5::bigint * interval '1 microsecond',
        max_attempts = max_attempts + 1,
        leased_by = NULL, lease_expires_at = NULL
    ` + leaseGuard + `
    RETURNING state)`)

// sqlCancel: $5 reason.
var sqlCancel = staleFinish(finish{name: "upd", where: leaseCond, state: sqlCancelled,
	set: [][2]string{{"finished_at", "now()"}, {"lease_expires_at", "NULL"},
		{"errors", "errors || " + errorEntry(`'at', now(), 'worker', $3::text, 'error', $5::text`, "attempt", "lease_gen")}},
	returning: "state"})

// sqlRelease gives a job back on shutdown; the attempt is not counted.
var sqlRelease = staleWrite(`upd AS (
    UPDATE fenceq_jobs_hot SET state = ` + sqlAvailable + `, attempt = GREATEST(attempt - 1, 0),
        leased_by = NULL, lease_expires_at = NULL
    ` + leaseGuard + `
    RETURNING state)`)

// lockedGuard is leaseGuard for the statements of the fenced transaction, with the
// running state compared to an uncorrelated subquery (an InitPlan: a value known only
// at execution). Compared to the constant, state = 'running' matches the predicate of
// the partial fenceq_jobs_lease_idx, and with statistics taken while few jobs ran the
// planner estimates that index to hold one row and picks it over the primary key —
// custom and generic plans alike — so every lock and completion would walk the entries
// of every running job. With the subquery only the primary key can find the row.
var (
	lockedCond  = `id = $1 AND lease_gen = $2 AND state = (SELECT ` + sqlRunning + `::text)`
	lockedGuard = `WHERE ` + lockedCond
)

// sqlLockLease is the fence of a handler's transaction: the row lock keeps the reaper
// and every other writer out until COMMIT.
var sqlLockLease = `
SELECT state FROM fenceq_jobs_hot
` + lockedGuard + `
FOR UPDATE`

// sqlLockLeaseChecked is sqlLockLease for a transaction sent as one pipeline: when the
// lease is gone it raises an error instead of returning no row, so the server skips
// every statement queued behind it (the writes, the completion, COMMIT) and the
// transaction is left aborted.
var sqlLockLeaseChecked = exactlyOneRow(lockMissed, `(SELECT 1 FROM fenceq_jobs_hot `+lockedGuard+` FOR UPDATE) l`)

// exactlyOneRow selects 1 when rows (a FROM item) holds one row, and otherwise raises
// an error whose text starts with missed and names the count: the ELSE arm casts that
// text to integer, and depends on count(*), so the planner cannot fold it into a
// constant that would fail every execution. See isMissed.
func exactlyOneRow(missed, rows string) string {
	return `
SELECT CASE count(*) WHEN 1 THEN 1
       ELSE (` + sqlLit(missed) + ` || count(*))::int END
FROM ` + rows
}

// lockMissed starts the error text of a checked lock that matched no row.
const lockMissed = "fenceq: fenced lock matched rows: "

// sqlCompleteLocked: $3 the job's output (NULL for none). It returns a row if it
// completed the job.
//
// sqlCompleteLockedChecked is sqlCompleteLocked for a pipeline that sends COMMIT right
// behind it: a completion that matched no row raises an error (exactlyOneRow), which
// makes the server skip the COMMIT queued after it and leaves the transaction aborted.
// A row count checked in Go would come too late: the COMMIT would already have run. $3
// the job's output (NULL for none).
//
// sqlCompleteLockedRouted and sqlCompleteLockedCheckedRouted are both for a Citus
// connection: the job is completed in place (see finish.inPlace).
//
// sqlCompleteLockedMoving and sqlCompleteLockedCheckedMoving are both for a job that
// keeps no unique key once completed (LeaseTx.MovesOut, finish.movingCTEs).
var (
	lockedDone                                              = completion("done", lockedCond, "", "", "$3::jsonb", "1")
	sqlCompleteLocked, sqlCompleteLockedChecked             = completeLockedForms(lockedDone.ctes())
	sqlCompleteLockedRouted, sqlCompleteLockedCheckedRouted = completeLockedForms(lockedDone.inPlace())
	sqlCompleteLockedMoving, sqlCompleteLockedCheckedMoving = completeLockedForms(lockedDone.movingCTEs())
)

// completeLockedForms returns the two forms of a fenced completion over its CTEs, the
// last named done: plain (a row if it completed the job) and checked.
func completeLockedForms(ctes string) (plain, checked string) {
	return `
WITH ` + ctes + `
SELECT 1 FROM done`, `
WITH ` + ctes + exactlyOneRow(completionMissed, "done")
}

// completeLockedSQL is the completion of the fenced transaction: checked for a pipeline,
// routed for a Citus connection, moving for a job that keeps no unique key once
// completed (unless routed: a routed completion is in place).
func completeLockedSQL(checked, dist, moving bool) string {
	switch {
	case checked && dist:
		return sqlCompleteLockedCheckedRouted
	case checked && moving:
		return sqlCompleteLockedCheckedMoving
	case checked:
		return sqlCompleteLockedChecked
	case dist:
		return sqlCompleteLockedRouted
	case moving:
		return sqlCompleteLockedMoving
	}
	return sqlCompleteLocked
}

// completionMissed starts the error text of a checked completion that matched no row.
const completionMissed = "fenceq: fenced completion matched rows: "

// sqlJobLease reads the generation and state a job has now (Landed).
const sqlJobLease = `SELECT lease_gen, state FROM fenceq_jobs WHERE id = $1`

var sqlRecordStale = `
INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
VALUES ($1, $2, $3, ` + sqlEventStaleWrite + `, $4)`

// sqlReap revokes expired leases. $1 limit, $2 freshness (µs) of a holder's worker
// heartbeat that counts as alive.
var sqlReap = reapRevoke(false) + `,
ev AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT id, egen, eby, ` + sqlEventRevoked + `, ` + sqlLit(detailExpired) + ` || '; now ' || state FROM upd
    UNION ALL
    SELECT u.id, u.egen, u.eby, ` + sqlEventHolderAlive + `, ` + sqlLit(detailHolderAlive) + `
    FROM upd u JOIN alive a ON a.id = u.id),
wake AS (
    SELECT count(pg_notify(` + sqlLit(ChannelPrefix) + ` || current_schema(), q)) AS n
    FROM (SELECT DISTINCT queue AS q FROM upd WHERE state = ` + sqlAvailable + `) x)
` + reapResult + ` CROSS JOIN wake`

// sqlReapRouted is sqlReap without the events and the wake-ups, for Citus (see
// fencedSQL): Reap records the events in the same transaction and notifies on the
// coordinator.
var sqlReapRouted = reapRevoke(true) + "\n" + reapResult

// reapRevoke is the part of the reaper's statement that revokes and finds the holders
// still alive; inPlace discards jobs in place (see finish.inPlace).
func reapRevoke(inPlace bool) string {
	f := finish{name: "reaped", using: "expired e", usingCols: "e.eerr, e.enow",
		where: "j.id = e.eid AND j.lease_gen = e.egen AND j.state = " + sqlRunning,
		state: `CASE WHEN attempt >= max_attempts THEN ` + sqlDiscarded + ` ELSE ` + sqlAvailable + ` END`,
		set: [][2]string{{"lease_gen", "lease_gen + 1"},
			{"finished_at", "CASE WHEN attempt >= max_attempts THEN enow END"},
			{"leased_by", "NULL"}, {"lease_expires_at", "NULL"}, {"errors", "errors || eerr"}},
		returning: "id, state, queue, kind"}
	write := f.ctes() + `,
upd AS (
    SELECT r.id, e.egen, e.eby, r.state, r.queue, r.kind FROM reaped r JOIN expired e ON e.eid = r.id)`
	if inPlace {
		// One UPDATE returning the columns of the expired row it joins: the statement
		// Citus routes whole.
		f.name, f.returning = "upd", "j.id, e.egen, e.eby, j.state, j.queue, j.kind"
		write = f.inPlace()
	}
	return `
WITH expired AS (
    SELECT id AS eid, lease_gen AS egen, leased_by AS eby,
           jsonb_build_object('at', now(), 'attempt', attempt, 'lease_gen', lease_gen, 'worker', leased_by,
               'error', ` + sqlLit(detailExpired) + ` || ' (last heartbeat ' || heartbeat_at || ')') AS eerr,
           now() AS enow
    FROM fenceq_jobs_hot
    WHERE state = ` + sqlRunning + ` AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED),` + write + `,
alive AS (
    SELECT u.id FROM upd u JOIN fenceq_workers w ON w.id = u.eby
    WHERE w.heartbeat_at > now() - $2::bigint * interval '1 microsecond')`
}

// reapResult is the reaper's result: one row per revocation.
const reapResult = `SELECT u.id, u.egen, COALESCE(u.eby, ''), u.state, u.queue, u.kind,
       EXISTS (SELECT 1 FROM alive a WHERE a.id = u.id)
FROM upd u`

// sqlPromoteDue makes scheduled and retryable jobs whose time has come available.
var sqlPromoteDue = `
WITH due AS (
    SELECT id AS did FROM fenceq_jobs_hot
    WHERE state IN ` + sqlDue + ` AND run_at <= now()
    ORDER BY run_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED),
upd AS (
    UPDATE fenceq_jobs_hot j SET state = ` + sqlAvailable + `
    FROM due WHERE j.id = due.did AND j.state IN ` + sqlDue + `
    RETURNING j.queue)
SELECT (SELECT count(*) FROM upd),
       (SELECT count(pg_notify(` + sqlLit(ChannelPrefix) + ` || current_schema(), q))
        FROM (SELECT DISTINCT queue AS q FROM upd) x),
       (SELECT COALESCE(array_agg(DISTINCT queue), '{}') FROM upd)`

// sqlPruneFinished deletes finished jobs older than $1 (µs), at most $2 of them from
// history and $2 of them from the hot set (the finished jobs that hold their unique key),
// and returns how many it deleted.
var sqlPruneFinished = `
WITH old AS (
    SELECT id AS oid FROM fenceq_jobs_history
    WHERE finished_at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM fenceq_jobs_history j USING old WHERE j.id = old.oid RETURNING 1),
old_hot AS (
    SELECT id AS oid FROM fenceq_jobs_hot
    WHERE finished_at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED),
gone_hot AS (
    DELETE FROM fenceq_jobs_hot j USING old_hot
    WHERE j.id = old_hot.oid AND j.state IN ` + sqlFinal + ` RETURNING 1)
SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM gone_hot)`

const sqlPruneLeaseEvents = `
DELETE FROM fenceq_lease_events WHERE id IN (
    SELECT id FROM fenceq_lease_events WHERE at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY at LIMIT $2)`

// errorEntry is the SQL of one entry appended to a job's errors array: the object built
// from consts (key-value pairs of constants, parameters and now(), no column) with each
// integer column of cols added under its own name (the part after any "alias.").
//
// It is spelled with IMMUTABLE functions only wherever a column is involved (jsonb_set,
// integer to text to jsonb): Citus runs an UPDATE on the node that holds the row only
// when every function over the row's columns is IMMUTABLE (jsonb_build_object is
// STABLE), and evaluates the column-free rest once, on the coordinator. "array ||
// object" appends the object as an element, as jsonb_build_array would.
func errorEntry(consts string, cols ...string) string {
	s := "jsonb_build_object(" + consts + ")"
	for _, c := range cols {
		name := c
		if i := strings.LastIndexByte(c, '.'); i >= 0 {
			name = c[i+1:]
		}
		s = "jsonb_set(" + s + ", '{" + name + "}', (" + c + ")::text::jsonb)"
	}
	return s
}

// addMicros is the SQL of the instant ts plus us microseconds (a bigint expression),
// spelled with IMMUTABLE functions only: timestamptz + interval is STABLE (it depends
// on the session's time zone for days and months), timestamp + interval is not. A
// duration in microseconds has no days or months, so the result is the same instant.
func addMicros(ts, us string) string {
	return "(((" + ts + ") AT TIME ZONE 'UTC') + (" + us + ") * interval '1 microsecond') AT TIME ZONE 'UTC'"
}
