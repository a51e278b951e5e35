package chaos

// SQL of the harness: its own instrumentation in the run's schema (the lease log), the
// naive baseline's schema changes and statements, and the report's queries.

// sqlInstallLeaseLog records every claim, revocation, release and state change of a job
// (any update that changes its state, attempt or lease generation; not heartbeats) with
// the database's time, so the report
// can measure how long a revoked job waited before it ran again. It is the harness's
// instrumentation, in the run's own schema; the queue never reads it.
const sqlInstallLeaseLog = `
CREATE TABLE IF NOT EXISTS chaos_lease_log (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id    bigint      NOT NULL,
    lease_gen bigint      NOT NULL,
    attempt   integer     NOT NULL,
    state     text        NOT NULL,
    leased_by text,
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS chaos_lease_log_job_idx ON chaos_lease_log (job_id, at);
CREATE OR REPLACE FUNCTION chaos_lease_log_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_lease_log (job_id, lease_gen, attempt, state, leased_by)
    SELECT n.id, n.lease_gen, n.attempt, n.state, n.leased_by
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.lease_gen <> o.lease_gen OR n.attempt <> o.attempt OR n.state <> o.state;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS chaos_lease_log_update ON fenceq_jobs_hot;
CREATE TRIGGER chaos_lease_log_update
    AFTER UPDATE ON fenceq_jobs_hot
    REFERENCING NEW TABLE AS new_rows OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION chaos_lease_log_record();`

// sqlDropUniqueConstraints turns a migrated schema into the naive baseline's: no
// business unique constraint is left as a last line of defence.
const sqlDropUniqueConstraints = `
ALTER TABLE invoices DROP CONSTRAINT IF EXISTS invoices_customer_period_key;
ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_idempotency_key_key;`

const sqlTerminateApp = `
SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity
WHERE application_name = $1 AND pid <> pg_backend_pid()`

const sqlPostmasterStart = `SELECT pg_postmaster_start_time()`

// sqlUnfinishedJobs counts the jobs the run waits for before it stops the workers: every
// job not final, except a job of the kinds $1 (periodic ones) that is not due yet. A
// periodic job that is due or running is waited for like any other, so that one whose
// lease was revoked has run again before the report looks for revoked leases never run
// again (sqlRevokedWaits).
const sqlUnfinishedJobs = `
SELECT count(*) FROM fenceq_jobs
WHERE state NOT IN ('completed', 'discarded', 'cancelled')
  AND NOT (kind = ANY($1::text[]) AND state IN ('scheduled', 'retryable') AND run_at > now())`

// sqlHeldLeases counts the running jobs a worker holds.
const sqlHeldLeases = `SELECT count(*) FROM fenceq_jobs WHERE state = 'running' AND leased_by = $1`

// sqlHeldLeaseList lists the (job, generation) leases a worker holds.
const sqlHeldLeaseList = `SELECT id, lease_gen FROM fenceq_jobs WHERE state = 'running' AND leased_by = $1`

// sqlHeldSleeping counts the sleep jobs a worker holds: jobs that run longer than the
// lease, so a pause of their holder outlasts the lease.
const sqlHeldSleeping = `SELECT count(*) FROM fenceq_jobs WHERE state = 'running' AND leased_by = $1 AND kind = 'sleep'`

// sqlHeldStubborn counts the sleep jobs ignoring cancellation that a worker holds.
const sqlHeldStubborn = `
SELECT count(*) FROM fenceq_jobs
WHERE state = 'running' AND leased_by = $1 AND kind = 'sleep' AND (args->>'ignore_cancel')::boolean`

// sqlWorkerLeaseEvents lists the lease events a worker recorded for leases ($2 jobs,
// $3 generations) other than revocations: what the holder itself found out.
const sqlWorkerLeaseEvents = `
SELECT e.kind, e.job_id, e.lease_gen FROM fenceq_lease_events e
JOIN unnest($2::bigint[], $3::bigint[]) AS l(id, gen) ON l.id = e.job_id AND l.gen = e.lease_gen
WHERE e.worker_id = $1 AND e.kind <> 'revoked'
ORDER BY e.id`

// Failover checks, on the promoted standby. Each returns the ids of $1 that are missing.

const sqlMissingJobs = `
SELECT id FROM unnest($1::bigint[], $2::text[]) AS a(id, tag)
WHERE NOT EXISTS (SELECT 1 FROM fenceq_jobs j WHERE j.id = a.id AND j.metadata->>'chaos_ack' = a.tag)`

const sqlMissingCompleted = `
SELECT id FROM unnest($1::bigint[], $2::text[]) AS a(id, tag)
WHERE NOT EXISTS (SELECT 1 FROM fenceq_jobs j
                  WHERE j.id = a.id AND j.metadata->>'chaos_ack' = a.tag AND j.state = 'completed')`

// sqlMissingInvoiceIDs: $1 invoice ids, $2 and $3 the job and lease generation that
// wrote each.
const sqlMissingInvoiceIDs = `
SELECT id FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS a(id, job, gen)
WHERE NOT EXISTS (SELECT 1 FROM invoices i WHERE i.id = a.id AND i.job_id = a.job AND i.lease_gen = a.gen)`

const sqlMissingOrderIDs = `
SELECT id FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS a(id, job, gen)
WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = a.id AND o.job_id = a.job AND o.lease_gen = a.gen)`

// sqlMissingDelivered: $1 outbox ids, $2 their dedupe keys.
const sqlMissingDelivered = `
SELECT id FROM unnest($1::bigint[], $2::text[]) AS a(id, key)
WHERE NOT EXISTS (SELECT 1 FROM fenceq_outbox o WHERE o.id = a.id AND o.dedupe_key = a.key AND o.state = 'delivered')`

// sqlRepeatedWrites counts the stale writes rejected under the generation a job was
// completed with: a holder writing again after its own commit had landed.
const sqlRepeatedWrites = `
SELECT count(*) FROM fenceq_lease_events e JOIN fenceq_jobs j ON j.id = e.job_id AND j.lease_gen = e.lease_gen
WHERE e.job_id = $1 AND e.kind = 'stale_write_rejected'`

// sqlReplicaLag is how many bytes of WAL the standby has not replayed, on the primary.
const sqlReplicaLag = `
SELECT COALESCE((SELECT pg_current_wal_lsn() - replay_lsn FROM pg_stat_replication LIMIT 1), 0)::bigint`

// sqlWorkerBeatSince counts a worker's fenceq_workers row if it heartbeated after $2.
const sqlWorkerBeatSince = `SELECT count(*) FROM fenceq_workers WHERE id = $1 AND heartbeat_at > $2`

const sqlPendingOutbox = `SELECT count(*) FROM fenceq_outbox WHERE state = 'pending'`

const sqlWorkerRegistered = `SELECT count(*) FROM fenceq_workers WHERE id = $1`

// Report queries.

const sqlJobsByKindState = `SELECT kind, state, count(*) FROM fenceq_jobs GROUP BY kind, state`

const sqlLeaseEventCounts = `SELECT kind, count(*) FROM fenceq_lease_events GROUP BY kind`

// claimedAfterRevocation is the lease log's claims of the job of revocation r (a lease
// event with job_id, lease_gen and at): state running, at a higher generation, from
// the revocation on.
const claimedAfterRevocation = `chaos_lease_log l
    WHERE l.job_id = r.job_id AND l.state = 'running' AND l.at >= r.at AND l.lease_gen > r.lease_gen`

// sqlRevokedWaits: for every revocation, the time until the job was next claimed (a
// lease log row in state running with a higher generation or attempt), or until now
// when it was not claimed again and is not final.
const sqlRevokedWaits = `
WITH rev AS (
    SELECT e.job_id, e.lease_gen, e.at FROM fenceq_lease_events e WHERE e.kind = 'revoked'),
nxt AS (
    SELECT r.job_id, r.at,
           (SELECT min(l.at) FROM ` + claimedAfterRevocation + `) AS claimed_at
    FROM rev r)
SELECT count(*) FILTER (WHERE claimed_at IS NOT NULL),
       COALESCE(extract(epoch FROM max(claimed_at - at)), 0)::float8,
       count(*) FILTER (WHERE claimed_at IS NULL
           AND (SELECT state FROM fenceq_jobs j WHERE j.id = nxt.job_id)
               NOT IN ('completed', 'discarded', 'cancelled'))
FROM nxt`

// sqlTakeovers counts claims of a job that was still running under another worker's
// claim: for the naive baseline, which takes expired leases without revoking them (and
// so records no revocation), these are its takeovers. From the lease log.
const sqlTakeovers = `
SELECT count(*) FROM (
    SELECT l.job_id, l.leased_by, l.state,
           lag(l.leased_by) OVER (PARTITION BY l.job_id ORDER BY l.id) AS prev_by,
           lag(l.state) OVER (PARTITION BY l.job_id ORDER BY l.id) AS prev_state
    FROM chaos_lease_log l) x
WHERE x.state = 'running' AND x.prev_state = 'running' AND x.prev_by IS DISTINCT FROM x.leased_by`

const sqlClaimCount = `SELECT count(*) FROM chaos_lease_log WHERE state = 'running'`

const sqlInvoiceCounts = `SELECT count(*), count(DISTINCT (customer_id, period)) FROM invoices`

const sqlOrderCounts = `SELECT count(*), count(DISTINCT idempotency_key) FROM orders`

// missingInvoices is the (customer, period) pairs billed by the workload, of periods $1,
// without an invoice.
const missingInvoices = `customers c CROSS JOIN unnest($1::text[]) AS p(period)
WHERE NOT EXISTS (SELECT 1 FROM invoices i WHERE i.customer_id = c.id AND i.period = p.period)`

// sqlMissingInvoices counts missingInvoices.
const sqlMissingInvoices = `SELECT count(*) FROM ` + missingInvoices

// missingOrders is the workload's idempotency keys, $1, without an order.
const missingOrders = `unnest($1::text[]) AS k(key)
WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.idempotency_key = k.key)`

// sqlMissingOrders counts missingOrders.
const sqlMissingOrders = `SELECT count(*) FROM ` + missingOrders

const sqlOutboxCounts = `
SELECT count(*), count(*) FILTER (WHERE state = 'delivered'), count(*) FILTER (WHERE state = 'failed')
FROM fenceq_outbox`

const sqlDeliveredKeys = `SELECT dedupe_key FROM fenceq_outbox WHERE state = 'delivered'`

// sqlSleepFirstAttempt: sleep jobs that completed on their first attempt, i.e. kept
// their lease past its duration by heartbeating.
const sqlSleepFirstAttempt = `
SELECT count(*) FILTER (WHERE state = 'completed'),
       count(*) FILTER (WHERE state = 'completed' AND attempt = 1)
FROM fenceq_jobs WHERE kind = 'sleep'`

// Naive baseline statements: no generation anywhere.

// sqlNaiveClaim takes one job of any queue that is available (or due) or whose lease
// expired (like SET NX PX: whoever comes after the expiry gets it), without bumping any
// generation. $1 worker id, $2 lease (µs), $3 the flow keys (from the args) this process
// has no room for.
const sqlNaiveClaim = `
UPDATE fenceq_jobs_hot SET state = 'running', leased_by = $1, attempt = attempt + 1,
    attempted_at = now(), heartbeat_at = now(),
    lease_expires_at = now() + $2::bigint * interval '1 microsecond'
WHERE id = (
    SELECT id FROM fenceq_jobs_hot
    WHERE run_at <= now()
      AND (state IN ('available', 'scheduled', 'retryable') OR (state = 'running' AND lease_expires_at < now()))
      AND NOT (COALESCE(args ->> 'flow_key', '') = ANY($3::text[]))
    ORDER BY priority, run_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED)
RETURNING id, kind, args, attempt`

// sqlNaiveHeartbeat renews the leases by id alone: no holder, no generation.
const sqlNaiveHeartbeat = `
UPDATE fenceq_jobs_hot SET heartbeat_at = now(), lease_expires_at = now() + $2::bigint * interval '1 microsecond'
WHERE id = ANY($1::bigint[])`

const sqlNaiveWorkerBeat = `
INSERT INTO fenceq_workers (id, host, pid, queues) VALUES ($1, $2, $3, $4)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()`

const sqlNaiveWorkerGone = `DELETE FROM fenceq_workers WHERE id = $1`

// sqlNaiveComplete and sqlNaiveRelease are unconditional: whoever holds the job now,
// the naive worker's write wins.
const sqlNaiveComplete = `
UPDATE fenceq_jobs_hot SET state = 'completed', finished_at = now(), lease_expires_at = NULL WHERE id = $1`

const sqlNaiveRetry = `
UPDATE fenceq_jobs_hot SET state = 'retryable', run_at = now() + interval '1 second',
    lease_expires_at = NULL, leased_by = NULL,
    errors = errors || jsonb_build_array(jsonb_build_object('at', now(), 'error', $2::text))
WHERE id = $1`

const sqlNaiveRelease = `
UPDATE fenceq_jobs_hot SET state = 'available', leased_by = NULL, lease_expires_at = NULL WHERE id = $1`

// sqlNaiveFindInvoice is the naive idempotency check: look, then (later) insert.
const sqlNaiveFindInvoice = `SELECT id FROM invoices WHERE customer_id = $1 AND period = $2 LIMIT 1`

const sqlNaiveUsage = `
SELECT sku, description, quantity, unit_price_cents FROM usage_records
WHERE customer_id = $1 AND period = $2 ORDER BY id`

const sqlNaiveCustomer = `SELECT currency, country FROM customers WHERE id = $1`

const sqlNaiveInsertInvoice = `
INSERT INTO invoices (customer_id, period, currency, subtotal_cents, tax_rate_micros, tax_cents,
    total_cents, tax_reference, job_id, lease_gen, leased_by)
VALUES ($1, $2, $3, $4::bigint, $5, $6::bigint, $4::bigint + $6::bigint, $7, $8, 0, $9)
RETURNING id`

const sqlNaiveInsertLine = `
INSERT INTO invoice_lines (invoice_id, line_no, sku, description, quantity, unit_price_cents, amount_cents)
VALUES ($1, $2, $3, $4, $5::bigint, $6::bigint, $5::bigint * $6::bigint)`

const sqlNaiveFindOrder = `SELECT id FROM orders WHERE idempotency_key = $1 LIMIT 1`

const sqlNaiveInsertOrder = `
INSERT INTO orders (idempotency_key, request_hash, customer_email, currency, total_cents, job_id, lease_gen)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id`

const sqlNaiveInsertOrderItem = `
INSERT INTO order_items (order_id, line, sku, quantity, unit_price_cents) VALUES ($1, $2, $3, $4, $5)`

const sqlNaiveOutboxRow = `SELECT topic, dedupe_key, payload FROM fenceq_outbox WHERE id = $1`

const sqlNaiveMarkDelivered = `
UPDATE fenceq_outbox SET state = 'delivered', delivered_at = now(), attempt = attempt + 1 WHERE id = $1`

// sqlUnfinishedDetail describes up to $2 jobs that are not final (except kinds $1), for
// a report whose work did not settle: state, attempts, when it may run next, last error.
const sqlUnfinishedDetail = `
SELECT format('job %s (%s) %s, attempt %s/%s, lease_gen %s, held by %s, run_at in %s, last error: %s',
              id, kind, state, attempt, max_attempts, lease_gen, COALESCE(leased_by, 'nobody'),
              date_trunc('second', run_at - now()),
              COALESCE(left(errors -> -1 ->> 'error', 200), 'none'))
FROM fenceq_jobs
WHERE state NOT IN ('completed', 'discarded', 'cancelled') AND NOT (kind = ANY($1::text[]))
ORDER BY id LIMIT $2`

// sqlNeverRerunDetail describes up to $1 jobs whose lease was revoked and that were
// not claimed again and are not final (the rows behind sqlRevokedWaits's third count).
const sqlNeverRerunDetail = `
SELECT format('job %s (%s) %s: lease generation %s revoked at %s, not claimed again', j.id, j.kind, j.state,
              r.lease_gen, r.at)
FROM fenceq_lease_events r JOIN fenceq_jobs j ON j.id = r.job_id
WHERE r.kind = 'revoked' AND j.state NOT IN ('completed', 'discarded', 'cancelled')
  AND NOT EXISTS (SELECT 1 FROM ` + claimedAfterRevocation + `)
ORDER BY r.job_id LIMIT $1`

// sqlMissingInvoicesDetail names up to $2 of missingInvoices.
const sqlMissingInvoicesDetail = `
SELECT format('customer %s: no invoice for %s', c.id, p.period) FROM ` + missingInvoices + `
ORDER BY c.id LIMIT $2`

// sqlMissingOrdersDetail names up to $2 of missingOrders.
const sqlMissingOrdersDetail = `
SELECT format('idempotency key %s: no order', k.key) FROM ` + missingOrders + `
ORDER BY k.key LIMIT $2`

// sqlUndeliveredDetail describes up to $1 outbox rows that are pending or failed.
const sqlUndeliveredDetail = `
SELECT format('outbox row %s (%s) %s after %s attempts, delivery job %s: %s', id, dedupe_key, state, attempt,
              COALESCE(delivery_job_id::text, 'none'), COALESCE(left(last_error, 200), 'no error recorded'))
FROM fenceq_outbox WHERE state IN ('pending', 'failed') ORDER BY id LIMIT $1`

// sqlDiscardedDetail describes up to $1 discarded or cancelled jobs.
const sqlDiscardedDetail = `
SELECT format('job %s (%s) %s after %s attempts: %s', id, kind, state, attempt,
              COALESCE(left(errors -> -1 ->> 'error', 200), 'no error recorded'))
FROM fenceq_jobs WHERE state IN ('discarded', 'cancelled') ORDER BY id LIMIT $1`
