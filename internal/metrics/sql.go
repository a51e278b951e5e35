package metrics

// SQL read at scrape time. Every statement is cheap: the depth count walks the claim
// index of unfinished jobs only, the outbox one the partial pending index.

// sqlTablesExist reports which of the tables the snapshot reads exist on the
// search_path (before migrations, or before the outbox migration, some do not).
const sqlTablesExist = `
SELECT to_regclass('fenceq_jobs') IS NOT NULL, to_regclass('fenceq_queues') IS NOT NULL,
       to_regclass('fenceq_outbox') IS NOT NULL, to_regclass('fenceq_periodic') IS NOT NULL`

// sqlQueueDepth counts unfinished jobs by queue and state, plus every configured queue
// (with no row when it has no unfinished job).
const sqlQueueDepth = `
SELECT queue, state, count(*) FROM fenceq_jobs
WHERE state IN ('available', 'scheduled', 'running', 'retryable')
GROUP BY queue, state`

const sqlQueueNames = `SELECT name FROM fenceq_queues`

// sqlOutboxPending counts pending outbox rows and how long the oldest has been pending
// (since available_at: a row retried by an operator counts from its retry, as in
// queue.OutboxStats), by the database's clock.
const sqlOutboxPending = `
SELECT count(*), COALESCE(extract(epoch FROM now() - min(available_at)), 0)::float8
FROM fenceq_outbox WHERE state = 'pending'`

// sqlOldestTransaction is the age of the oldest open transaction of a client in the
// current database (idle in transaction included), leaving out this very statement's
// own backend. Without the pg_read_all_stats role, other users' sessions are invisible.
const sqlOldestTransaction = `
SELECT COALESCE(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)::float8,
       count(*) FILTER (WHERE state = 'idle in transaction')
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND xact_start IS NOT NULL AND pid <> pg_backend_pid()`
