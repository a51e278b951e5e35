package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5"
)

// The maintained counters of finished jobs (migration 000019). fenceq_job_counts holds,
// per minute, queue, kind and final state, the jobs that reached that state in the
// minute and the failed attempts those jobs recorded in it. RollupCounts adds the jobs
// that finished since its cursor; the dashboard's and reports' reads of finished jobs
// read these rows, never history.

const (
	// CounterBucket is the length of one counter row's interval.
	CounterBucket = time.Minute
	// CounterRetention is how long counter rows are kept: the longest window they serve.
	CounterRetention = 24 * time.Hour
	// rollupSettle keeps the roll-up this far behind now(): a statement's start time is
	// taken a few instructions before its session shows it as active.
	rollupSettle = 50 * time.Millisecond
	// rollupMaxLag bounds how far one open transaction holds the roll-up back: the
	// horizon never lags now() by more than this. A job finished by a transaction open
	// longer than this when the roll-up passes it is not counted.
	rollupMaxLag = 5 * time.Minute
)

// RollupCounts adds to fenceq_job_counts the jobs that finished since the cursor, up to
// a horizon before which no job can still be finished, and advances the cursor. It reads
// fenceq_jobs_history and the finished jobs of the hot set (those holding their unique
// key) by their finished_at indexes, so it costs what finished since the last roll-up.
//
// The count is exact: the cursor row is locked for the whole roll-up (a concurrent one
// skips, queue.Rollup.Skipped), and the horizon is before the start of every transaction that
// could still commit a finished job (see sqlRollupHorizon), and at most rollupMaxLag
// before now(): a job finished by a transaction open longer than that, or by one that
// wrote nothing to the job tables until after the roll-up passed its start (a call of
// fenceq_complete after other statements), can be missed. A finished job is counted
// once, when the roll-up passes its finished_at, in the minute of its finished_at, with
// the failed attempts its errors record; retried and finished again, it counts again, with the errors it carried
// through the retry; deleting or pruning it later leaves the counters as they are.
// Counter rows older than CounterRetention are deleted.
//
// db must not be a transaction: the horizon is read by a statement before the one that
// reads the jobs, each with its own snapshot.
func RollupCounts(ctx context.Context, db queue.DBTX) (queue.Rollup, error) {
	if _, ok := db.(pgx.Tx); ok {
		return queue.Rollup{}, errors.New("roll up job counters: needs a pool or a connection, not a transaction")
	}
	var out queue.Rollup
	err := inTx(ctx, db, func(tx queue.DBTX) error {
		var from time.Time
		err := tx.QueryRow(ctx, sqlRollupLock, micros(CounterRetention)).Scan(&from)
		if errors.Is(err, pgx.ErrNoRows) {
			out.Skipped = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("lock the cursor: %w", err)
		}
		var to time.Time
		if err := tx.QueryRow(ctx, sqlRollupHorizon, micros(rollupSettle), micros(rollupMaxLag)).Scan(&to); err != nil {
			return fmt.Errorf("read the horizon: %w", err)
		}
		out.From, out.To = from, to
		if !to.After(from) {
			return nil
		}
		if err := tx.QueryRow(ctx, sqlRollup, customPlan, from, to, micros(CounterRetention)).Scan(&out.Jobs); err != nil {
			return fmt.Errorf("count finished jobs: %w", err)
		}
		return nil
	})
	if err != nil {
		return queue.Rollup{}, fmt.Errorf("roll up job counters: %w", err)
	}
	return out, nil
}

// sqlRollupLock locks the cursor row and returns where the roll-up starts: the cursor,
// or the retention's start when the cursor is older. No row when a roll-up holds it.
// $1 retention (µs).
const sqlRollupLock = `
SELECT GREATEST(rolled_to, now() - $1::bigint * interval '1 microsecond')
FROM fenceq_job_counts_cursor FOR UPDATE SKIP LOCKED`

// sqlRollupHorizon is the latest finish time at or before which no job can still be
// finished by a transaction that has not committed. Finishing statements stamp
// finished_at with their transaction's start, and every one of them holds a lock stronger
// than a reader's on the job tables from its start to its transaction's end; until it has
// that lock, its session shows the statement as active. So the horizon is before the
// start of every other transaction that holds or awaits such a lock, and of every other
// statement running in the database (its transaction's start, or its own when the
// transaction's is not shown yet; vacuum and other background processes finish no job),
// and $1 (µs) before now(); but no further back than now() less $2 (µs). A session whose
// activity this role cannot see (another role's, without pg_read_all_stats) is taken as
// holding the horizon at the latter when it holds such a lock, and is otherwise not seen.
const sqlRollupHorizon = `
WITH act AS (
    SELECT pid, state, COALESCE(xact_start, query_start) AS started FROM pg_stat_activity
    WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()),
writers AS (
    SELECT a.started FROM pg_locks l LEFT JOIN act a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.relation IN ('fenceq_jobs_hot'::regclass, 'fenceq_jobs_history'::regclass)
      AND l.mode <> 'AccessShareLock' AND l.pid <> pg_backend_pid()),
starts AS (
    SELECT COALESCE(started, now() - $2::bigint * interval '1 microsecond') AS t FROM writers
    UNION ALL
    SELECT started FROM act WHERE state = 'active' AND started IS NOT NULL)
SELECT GREATEST(now() - $2::bigint * interval '1 microsecond',
                LEAST(now() - $1::bigint * interval '1 microsecond', (SELECT min(t) FROM starts) - interval '1 microsecond'))`

// sqlRollup counts the jobs finished in ($1, $2] into the minutes they finished in,
// with the failed attempts they recorded (every error but a cancelled job's last, its
// cancellation), in one pass over the finished_at indexes; moves the cursor to $2; and
// deletes counter rows older than the retention $3 (µs). Returns the jobs counted.
var sqlRollup = `
WITH fin AS (
    SELECT queue, kind, state, finished_at, errors FROM ` + historyTable + `
    WHERE finished_at > $1 AND finished_at <= $2
    UNION ALL
    SELECT queue, kind, state, finished_at, errors FROM ` + hotTable + `
    WHERE finished_at > $1 AND finished_at <= $2 AND state IN ` + sqlFinal + `),
g AS (
    SELECT date_bin(interval '1 minute', finished_at, timestamptz '2000-01-01 00:00:00+00') AS b,
           queue, kind, state, count(*) AS jobs,
           sum(CASE WHEN errors = '[]'::jsonb THEN 0
                    WHEN state = ` + sqlCancelled + ` THEN jsonb_array_length(errors) - 1
                    ELSE jsonb_array_length(errors) END) AS failed
    FROM fin GROUP BY 1, 2, 3, 4),
ins AS (
    INSERT INTO fenceq_job_counts AS c (bucket, queue, kind, state, jobs, failed)
    SELECT b, queue, kind, state, jobs, failed FROM g
    WHERE b >= date_bin(interval '1 minute', now() - $3::bigint * interval '1 microsecond', timestamptz '2000-01-01 00:00:00+00')
    ON CONFLICT (bucket, queue, kind, state)
    DO UPDATE SET jobs = c.jobs + EXCLUDED.jobs, failed = c.failed + EXCLUDED.failed),
cur AS (
    UPDATE fenceq_job_counts_cursor SET rolled_to = $2, rolled_at = now()),
old AS (
    DELETE FROM fenceq_job_counts WHERE bucket < now() - $3::bigint * interval '1 microsecond')
SELECT COALESCE(sum(jobs), 0)::bigint FROM g`

// CountErrorsByKind reads the discarded jobs and the failed attempts of finished jobs
// per kind over the last window, from the counters, kinds with the most first.
func CountErrorsByKind(ctx context.Context, db queue.DBTX, window time.Duration) ([]queue.KindErrors, error) {
	if window <= 0 || window > CounterRetention {
		return nil, invalid("window", "%s is outside (0, %s]", window, CounterRetention)
	}
	rows, err := db.Query(ctx, sqlErrorsByKind, micros(window))
	if err != nil {
		return nil, fmt.Errorf("count errors by kind: %w", err)
	}
	defer rows.Close()
	var out []queue.KindErrors
	for rows.Next() {
		var k queue.KindErrors
		if err := rows.Scan(&k.Kind, &k.Discarded, &k.Failed); err != nil {
			return nil, fmt.Errorf("count errors by kind: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count errors by kind: %w", err)
	}
	return out, nil
}

// sqlErrorsByKind: $1 window (µs). The window starts at the minute that holds now()
// less the window, as the throughput chart's first bucket does.
var sqlErrorsByKind = `
SELECT kind, COALESCE(sum(jobs) FILTER (WHERE state = ` + sqlDiscarded + `), 0)::bigint AS discarded,
       sum(failed)::bigint AS failed
FROM fenceq_job_counts
WHERE bucket >= date_bin(interval '1 minute', now() - $1::bigint * interval '1 microsecond', timestamptz '2000-01-01 00:00:00+00')
GROUP BY kind
HAVING sum(jobs) FILTER (WHERE state = ` + sqlDiscarded + `) > 0 OR sum(failed) > 0
ORDER BY COALESCE(sum(jobs) FILTER (WHERE state = ` + sqlDiscarded + `), 0) + sum(failed) DESC, kind`

// RollupCountsIfStale runs RollupCounts when no roll-up ran within maxAge, by the
// database's clock, or none ever ran, and reports whether it ran one.
func RollupCountsIfStale(ctx context.Context, db queue.DBTX, maxAge time.Duration) (bool, error) {
	var stale bool
	if err := db.QueryRow(ctx, `SELECT rolled_at IS NULL OR rolled_at <= now() - $1::bigint * interval '1 microsecond'
		FROM fenceq_job_counts_cursor`, micros(maxAge)).Scan(&stale); err != nil {
		return false, fmt.Errorf("read the job counters' cursor: %w", err)
	}
	if !stale {
		return false, nil
	}
	if _, err := RollupCounts(ctx, db); err != nil {
		return false, err
	}
	return true, nil
}

// ReadCountersState returns how far the counters have been rolled up.
func ReadCountersState(ctx context.Context, db queue.DBTX) (queue.CountersState, error) {
	var to, at *time.Time
	err := db.QueryRow(ctx, `SELECT NULLIF(rolled_to, '-infinity'), rolled_at FROM fenceq_job_counts_cursor`).Scan(&to, &at)
	if err != nil {
		return queue.CountersState{}, fmt.Errorf("read the job counters' cursor: %w", err)
	}
	var st queue.CountersState
	if to != nil {
		st.RolledTo = *to
	}
	if at != nil {
		st.RolledAt = *at
	}
	return st, nil
}
