package store

// SQL for the bounded counts of stats.go. Each scan names its states literally so that
// it meets the partial index of those states, and stops after $cap rows.

// sqlCountQueues: $1 window (µs), $2 cap. Rows: group, queue, state (NULL for a queue's
// settings alone), count, paused (NULL without settings).
var sqlCountQueues = `
WITH a AS (SELECT queue FROM fenceq_jobs WHERE state = ` + sqlAvailable + ` LIMIT $2),
r AS (SELECT queue FROM fenceq_jobs WHERE state = ` + sqlRunning + ` LIMIT $2),
d AS (SELECT queue, state FROM fenceq_jobs WHERE state IN ` + sqlDue + ` LIMIT $2),
f AS (SELECT queue, state FROM fenceq_jobs
      WHERE finished_at > now() - $1::bigint * interval '1 microsecond' LIMIT $2),
c AS (
    SELECT 'available' AS grp, queue, ` + sqlAvailable + `::text AS state, count(*) AS n FROM a GROUP BY queue
    UNION ALL SELECT 'running', queue, ` + sqlRunning + `, count(*) FROM r GROUP BY queue
    UNION ALL SELECT 'due', queue, state, count(*) FROM d GROUP BY queue, state
    UNION ALL SELECT 'finished', queue, state, count(*) FROM f GROUP BY queue, state)
SELECT c.grp, c.queue, c.state, c.n, q.paused FROM c LEFT JOIN fenceq_queues q ON q.name = c.queue
UNION ALL
SELECT 'settings', q.name, NULL, 0, q.paused FROM fenceq_queues q`

// sqlThroughput: $1 bucket (µs), $2 buckets, $3 cap. One row per bucket, oldest first:
// now, start of the first bucket, bucket index, completed, discarded, cancelled, failed
// attempts, and the most rows one scan read (the cap when it stopped there). The last
// error of a cancelled job is its cancellation, not a failure. Rows are read where
// they are aggregated rather than materialized, and only the jobs that have errors
// have them expanded. A failure at or after the window's start but in a job whose
// errors hold older ones too is counted once, in its own bucket; older errors fall
// outside every bucket.
var sqlThroughput = `
WITH o AS MATERIALIZED (
    SELECT now() AS now, first, extract(epoch FROM first) AS e0, extract(epoch FROM b) AS bs
    FROM (SELECT date_bin(b, now(), timestamptz '2000-01-01 00:00:00+00') - ($2::int - 1) * b AS first, b
          FROM (SELECT $1::bigint * interval '1 microsecond' AS b) x) y),
fb AS (
    SELECT floor((extract(epoch FROM f.finished_at) - o.e0) / o.bs)::int AS i,
           count(*) FILTER (WHERE f.state = ` + sqlCompleted + `) AS completed,
           count(*) FILTER (WHERE f.state = ` + sqlDiscarded + `) AS discarded,
           count(*) FILTER (WHERE f.state = ` + sqlCancelled + `) AS cancelled,
           count(*) AS n
    FROM (SELECT state, finished_at FROM fenceq_jobs WHERE finished_at >= (SELECT first FROM o) LIMIT $3) f, o
    GROUP BY 1),
failing AS (
    SELECT state, errors FROM (
        SELECT state, errors FROM fenceq_jobs WHERE finished_at >= (SELECT first FROM o) LIMIT $3) f
    WHERE errors <> '[]'::jsonb
    UNION ALL
    SELECT state, errors FROM (
        SELECT state, errors FROM fenceq_jobs WHERE state IN ` + sqlDue + ` LIMIT $3) d
    WHERE errors <> '[]'::jsonb
    UNION ALL
    SELECT state, errors FROM fenceq_jobs WHERE state = ` + sqlRunning + ` AND errors <> '[]'::jsonb),
eb AS (
    SELECT floor((extract(epoch FROM (e.v ->> 'at')::timestamptz) - o.e0) / o.bs)::int AS i, count(*) AS n
    FROM failing j CROSS JOIN LATERAL jsonb_array_elements(j.errors) WITH ORDINALITY AS e(v, n), o
    WHERE NOT (j.state = ` + sqlCancelled + ` AND e.n = jsonb_array_length(j.errors))
    GROUP BY 1),
scanned AS (
    SELECT GREATEST((SELECT COALESCE(sum(n), 0) FROM fb),
                    (SELECT count(*) FROM (SELECT 1 FROM fenceq_jobs WHERE state IN ` + sqlDue + ` LIMIT $3) d)) AS n)
SELECT o.now, o.first, s.i, COALESCE(fb.completed, 0), COALESCE(fb.discarded, 0),
       COALESCE(fb.cancelled, 0), COALESCE(eb.n, 0), scanned.n
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
