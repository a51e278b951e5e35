package store

// SQL for the bounded counts of stats.go. Each scan of the hot set names its states
// literally so that it meets the partial index of those states, and stops after $cap
// rows; finished jobs are read from the counters (counters.go).

// sqlCountQueues: $1 window (µs), $2 cap. Rows: group, queue, state (NULL for a queue's
// settings alone), count, paused (NULL without settings). Unfinished jobs are read from
// the hot set through the partial indexes of their states; finished ones from the
// counters (fenceq_job_counts) of the minutes of the window.
var sqlCountQueues = `
WITH a AS (SELECT queue FROM ` + hotTable + ` WHERE state = ` + sqlAvailable + ` LIMIT $2),
r AS (SELECT queue FROM ` + hotTable + ` WHERE state = ` + sqlRunning + ` LIMIT $2),
d AS (SELECT queue, state FROM ` + hotTable + ` WHERE state IN ` + sqlDue + ` LIMIT $2),
c AS (
    SELECT 'available' AS grp, queue, ` + sqlAvailable + `::text AS state, count(*) AS n FROM a GROUP BY queue
    UNION ALL SELECT 'running', queue, ` + sqlRunning + `, count(*) FROM r GROUP BY queue
    UNION ALL SELECT 'due', queue, state, count(*) FROM d GROUP BY queue, state
    UNION ALL SELECT 'finished', queue, state, sum(jobs)::bigint FROM fenceq_job_counts
        WHERE bucket >= ` + sqlWindowStart + ` GROUP BY queue, state)
SELECT c.grp, c.queue, c.state, c.n, q.paused FROM c LEFT JOIN fenceq_queues q ON q.name = c.queue
UNION ALL
SELECT 'settings', q.name, NULL, 0, q.paused FROM fenceq_queues q`

// sqlWindowStart is the start of the counter minute that holds now() less the window
// ($1, µs): the finished counts of a window cover it in whole minutes.
const sqlWindowStart = `date_bin(interval '1 minute', now() - $1::bigint * interval '1 microsecond', timestamptz '2000-01-01 00:00:00+00')`

// sqlThroughput: $1 bucket (µs, whole minutes), $2 buckets, $3 cap. One row per bucket,
// oldest first: now, start of the first bucket, bucket index, completed, discarded,
// cancelled, failed attempts, and the most rows one scan of the hot set read (the cap
// when it stopped there). Finished jobs and the failed attempts of finished jobs come
// from the counters; the failed attempts of jobs that are scheduled, retryable or
// running now from their errors in the hot set (a failed attempt of a job that now
// waits, available, for its next attempt is counted once that attempt begins).
var sqlThroughput = `
WITH o AS MATERIALIZED (
    SELECT now() AS now, first, extract(epoch FROM first) AS e0, extract(epoch FROM b) AS bs
    FROM (SELECT date_bin(b, now(), timestamptz '2000-01-01 00:00:00+00') - ($2::int - 1) * b AS first, b
          FROM (SELECT $1::bigint * interval '1 microsecond' AS b) x) y),
fb AS (
    SELECT floor((extract(epoch FROM c.bucket) - o.e0) / o.bs)::int AS i,
           sum(c.jobs) FILTER (WHERE c.state = ` + sqlCompleted + `) AS completed,
           sum(c.jobs) FILTER (WHERE c.state = ` + sqlDiscarded + `) AS discarded,
           sum(c.jobs) FILTER (WHERE c.state = ` + sqlCancelled + `) AS cancelled,
           sum(c.failed) AS failed
    FROM fenceq_job_counts c, o
    -- The first bucket's start spelled out, not read from o: the planner then estimates
    -- the rows of the window and reads them by the index.
    WHERE c.bucket >= date_bin($1::bigint * interval '1 microsecond', now(), timestamptz '2000-01-01 00:00:00+00')
                      - ($2::int - 1) * ($1::bigint * interval '1 microsecond')
    GROUP BY 1),
failing AS (
    SELECT errors FROM (
        SELECT errors FROM ` + hotTable + ` WHERE state IN ` + sqlDue + ` LIMIT $3) d
    WHERE errors <> '[]'::jsonb
    UNION ALL
    SELECT errors FROM ` + hotTable + ` WHERE state = ` + sqlRunning + ` AND errors <> '[]'::jsonb),
eb AS (
    SELECT floor((extract(epoch FROM (e.v ->> 'at')::timestamptz) - o.e0) / o.bs)::int AS i, count(*) AS n
    FROM failing j CROSS JOIN LATERAL jsonb_array_elements(j.errors) AS e(v), o
    GROUP BY 1),
scanned AS (
    SELECT count(*) AS n FROM (SELECT 1 FROM ` + hotTable + ` WHERE state IN ` + sqlDue + ` LIMIT $3) d)
SELECT o.now, o.first, s.i, COALESCE(fb.completed, 0)::bigint, COALESCE(fb.discarded, 0)::bigint,
       COALESCE(fb.cancelled, 0)::bigint, (COALESCE(fb.failed, 0) + COALESCE(eb.n, 0))::bigint, scanned.n
FROM o CROSS JOIN scanned CROSS JOIN generate_series(0, $2::int - 1) AS s(i)
LEFT JOIN fb ON fb.i = s.i
LEFT JOIN eb ON eb.i = s.i
ORDER BY s.i`

// sqlActivity is the age of the oldest open transaction of a client in the current
// database (idle in transaction included) and the count of sessions idle in one,
// leaving out this very statement's own backend.
const sqlActivity = `
SELECT COALESCE(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)::float8,
       count(*) FILTER (WHERE state = 'idle in transaction')
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND xact_start IS NOT NULL AND pid <> pg_backend_pid()`

// sqlActivityCitus is sqlActivity across every node of a Citus cluster, from the
// coordinator: a transaction that runs on a worker node on a client's behalf holds back
// that node's vacuum, and shows only there. The caller's own transaction is left out by
// its global pid, which the worker backends working for it share.
const sqlActivityCitus = `
SELECT COALESCE(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)::float8,
       count(DISTINCT global_pid) FILTER (WHERE state = 'idle in transaction')
FROM citus_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND xact_start IS NOT NULL AND global_pid <> citus_backend_gpid()`
