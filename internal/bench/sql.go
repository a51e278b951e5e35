package bench

// SQL used by the benchmark itself (not by the engine). Tables are unqualified: every
// connection of a run has search_path set to the run's own schema.

// Result and outbox tables written by the fenced workload, the same on every side.
const sqlCreateFencedTables = `
CREATE TABLE bench_results (
    job_id  bigint PRIMARY KEY,
    value   text   NOT NULL,
    done_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench_outbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dedupe_key text   NOT NULL UNIQUE,
    payload    jsonb  NOT NULL);`

const sqlInsertResult = `INSERT INTO bench_results (job_id, value) VALUES ($1, $2)`

const sqlInsertOutbox = `INSERT INTO bench_outbox (dedupe_key, payload) VALUES ($1, $2)`

const sqlCountFenced = `
SELECT (SELECT count(*) FROM bench_results), (SELECT count(*) FROM bench_outbox)`

// Retained finished jobs, inserted server-side from generate_series: $1 the first, $2
// the last sequence number (stored negated, so the run's own jobs are told apart).
const sqlRetainFenceq = `
INSERT INTO fenceq_jobs_history (id, queue, kind, args, state, attempt, lease_gen, finished_at, run_at, created_at)
SELECT nextval(pg_get_serial_sequence('fenceq_jobs_hot', 'id')), 'default', 'bench_noop', jsonb_build_object('seq', -g),
       'completed', 1, 1,
       now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series($1::bigint, $2::bigint) g`

const sqlRetainRiver = `
INSERT INTO river_job (queue, kind, args, state, attempt, max_attempts, finalized_at, scheduled_at, created_at, attempted_at)
SELECT 'default', 'bench_noop', jsonb_build_object('seq', -g), 'completed', 1, 25,
       now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series($1::bigint, $2::bigint) g`

// Outcome of the jobs a run inserted (seq >= 0), for the exactly-once checks.
const sqlVerifyFenceq = `
SELECT count(*),
       count(*) FILTER (WHERE state = 'completed'),
       count(*) FILTER (WHERE state = 'completed' AND attempt = 1 AND lease_gen = 1)
FROM fenceq_jobs WHERE (args->>'seq')::bigint >= 0`

const sqlVerifyRiver = `
SELECT count(*),
       count(*) FILTER (WHERE state = 'completed'),
       count(*) FILTER (WHERE state = 'completed' AND attempt = 1)
FROM river_job WHERE (args->>'seq')::bigint >= 0`

// The bare-SQL ceiling runs on the index that suits claims from the start of the order:
// a full index on (state, queue, priority, run_at, id). fenceq's own migrations keep
// only the available jobs in its claim index, which pays off only with claims that
// start after a cursor; a claim from the start on that index walks the dead entries of
// every job claimed since the last VACUUM.
// sqlCeilingIndex replaces the claim index, one statement at a time (a Citus
// coordinator refuses several in one query).
var sqlCeilingIndex = []string{
	`DROP INDEX IF EXISTS fenceq_jobs_claim_idx`,
	`CREATE INDEX fenceq_jobs_claim_idx ON fenceq_jobs_hot (state, queue, priority, run_at, id)`,
}

// Bare-SQL ceiling: the reference claim, from the start of the claim order, returning
// only (id, lease_gen), and the batched fenced completion. $1 limit, $2 claimer id.
const sqlCeilingClaim = `
WITH next AS (
    SELECT id FROM fenceq_jobs_hot
    WHERE state = 'available' AND queue = 'default' AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
UPDATE fenceq_jobs_hot j
SET state = 'running', attempt = attempt + 1, lease_gen = lease_gen + 1,
    leased_by = $2, heartbeat_at = now(), lease_expires_at = now() + interval '1 minute'
FROM next WHERE j.id = next.id
RETURNING j.id, j.lease_gen`

const sqlCeilingComplete = `
UPDATE fenceq_jobs_hot j SET state = 'completed', finished_at = now(), lease_expires_at = NULL
FROM unnest($1::bigint[], $2::bigint[]) AS l(id, gen)
WHERE j.id = l.id AND j.lease_gen = l.gen AND j.state = 'running'`

// The fenced ceiling's lock and single completion, the engine's fenced transaction's
// statements: the running state is compared to a subquery, so that the row is found by
// its primary key (see lockedGuard in package queue). $1 id, $2 lease generation.
const sqlCeilingLock = `
SELECT state FROM fenceq_jobs_hot WHERE id = $1 AND lease_gen = $2 AND state = (SELECT 'running'::text) FOR UPDATE`

const sqlCeilingCompleteOne = `
UPDATE fenceq_jobs_hot SET state = 'completed', finished_at = now(), lease_expires_at = NULL
WHERE id = $1 AND lease_gen = $2 AND state = (SELECT 'running'::text)`

// Statistics. pg_stat_user_tables by the table's oid in the run's schema.
const sqlStatsTable = `
SELECT COALESCE(n_tup_upd, 0), COALESCE(n_tup_hot_upd, 0), COALESCE(n_dead_tup, 0)
FROM pg_stat_user_tables WHERE relid = to_regclass($1)`

const sqlStatsDatabase = `
SELECT pg_current_wal_lsn()::text, xact_commit
FROM pg_stat_database WHERE datname = current_database()`

const sqlWALDiff = `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`

const sqlClearSnapshot = `SELECT pg_stat_clear_snapshot()`

const sqlForceFlush = `SELECT pg_stat_force_next_flush()`

const sqlServerVersion = `SELECT current_setting('server_version'), current_setting('autovacuum'),
    current_setting('synchronous_commit'), current_setting('shared_buffers')`

const sqlCheckpoint = `CHECKPOINT`

// The server's connection limit, the connections reserved for superusers and those in
// use now (this one included).
const sqlConnectionLimits = `SELECT current_setting('max_connections')::int,
    current_setting('superuser_reserved_connections')::int, (SELECT count(*) FROM pg_stat_activity)::int`

// Transactions of the database named $1, committed and rolled back.
const sqlDatabaseXacts = `
SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`
