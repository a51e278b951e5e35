package verify

// Each check is one statement returning (violations, example) rows: the first column is
// the total number of violations (a window over every offending row), the second a
// human-readable example; LIMIT bounds the examples, not the count.

const sqlTableExists = `SELECT to_regclass($1) IS NOT NULL`

// sqlDuplicateInvoices: more than one invoice for one (customer, period). Counts the
// surplus invoices.
const sqlDuplicateInvoices = `
SELECT sum(n - 1) OVER ()::bigint,
       format('customer %s, period %s: %s invoices (ids %s)', customer_id, period, n, ids)
FROM (SELECT customer_id, period, count(*) AS n, string_agg(id::text, ', ' ORDER BY id) AS ids
      FROM invoices GROUP BY customer_id, period HAVING count(*) > 1) d
ORDER BY customer_id, period LIMIT $1`

// sqlDuplicateOrders: more than one order for one idempotency key.
const sqlDuplicateOrders = `
SELECT sum(n - 1) OVER ()::bigint,
       format('idempotency key %s: %s orders (ids %s)', idempotency_key, n, ids)
FROM (SELECT idempotency_key, count(*) AS n, string_agg(id::text, ', ' ORDER BY id) AS ids
      FROM orders GROUP BY idempotency_key HAVING count(*) > 1) d
ORDER BY idempotency_key LIMIT $1`

// sqlOutboxPerInvoice and sqlOutboxPerOrder: business rows without exactly one outbox
// row whose dedupe_key is the prefix $2 followed by the row's id.
const sqlOutboxPerInvoice = `
SELECT count(*) OVER ()::bigint, format('invoice %s: %s outbox rows with dedupe_key %L', i.id, count(o.id), $2::text || i.id)
FROM invoices i LEFT JOIN fenceq_outbox o ON o.dedupe_key = $2::text || i.id
GROUP BY i.id HAVING count(o.id) <> 1
ORDER BY i.id LIMIT $1`

const sqlOutboxPerOrder = `
SELECT count(*) OVER ()::bigint, format('order %s: %s outbox rows with dedupe_key %L', r.id, count(o.id), $2::text || r.id)
FROM orders r LEFT JOIN fenceq_outbox o ON o.dedupe_key = $2::text || r.id
GROUP BY r.id HAVING count(o.id) <> 1
ORDER BY r.id LIMIT $1`

// sqlDuplicateOutboxKeys: the outbox's own uniqueness (one delivery stream per key).
const sqlDuplicateOutboxKeys = `
SELECT sum(n - 1) OVER ()::bigint, format('dedupe_key %L: %s outbox rows', dedupe_key, n)
FROM (SELECT dedupe_key, count(*) AS n FROM fenceq_outbox GROUP BY dedupe_key HAVING count(*) > 1) d
ORDER BY dedupe_key LIMIT $1`

// sqlExpiredLeases: running jobs whose lease expired more than the reaper interval ($2
// microseconds) ago by the database's clock: the reaper should have revoked them.
const sqlExpiredLeases = `
SELECT count(*) OVER ()::bigint,
       format('job %s (%s) held by %s at generation %s: lease expired %s ago', id, kind,
              COALESCE(leased_by, '?'), lease_gen, date_trunc('second', now() - lease_expires_at))
FROM fenceq_jobs
WHERE state = 'running' AND lease_expires_at < now() - $2::bigint * interval '1 microsecond'
ORDER BY lease_expires_at LIMIT $1`

// sqlBrokenJobs: jobs no worker will ever pick up: an unknown state, or running with no
// lease expiry (the schema's checks forbid both; this proves they still hold).
const sqlBrokenJobs = `
SELECT count(*) OVER ()::bigint, format('job %s (%s): state %s, lease_expires_at %s', id, kind, state,
       COALESCE(lease_expires_at::text, 'NULL'))
FROM fenceq_jobs
WHERE state NOT IN ('available', 'scheduled', 'running', 'retryable', 'completed', 'discarded', 'cancelled')
   OR (state = 'running' AND lease_expires_at IS NULL)
ORDER BY id LIMIT $1`

// sqlExpectedJobs: of the expected job ids ($2), those missing from fenceq_jobs, and
// when $3 those not in a final state.
const sqlExpectedJobs = `
SELECT count(*) OVER ()::bigint,
       CASE WHEN j.id IS NULL THEN format('job %s: missing', e.id)
            ELSE format('job %s (%s): still %s', e.id, j.kind, j.state) END
FROM unnest($2::bigint[]) AS e(id)
LEFT JOIN fenceq_jobs j ON j.id = e.id
WHERE j.id IS NULL OR ($3 AND j.state NOT IN ('completed', 'discarded', 'cancelled'))
ORDER BY e.id LIMIT $1`

// sqlUnfinishedJobs: every job not in a final state (when all work must be done).
const sqlUnfinishedJobs = `
SELECT count(*) OVER ()::bigint, format('job %s (%s, queue %s): still %s', id, kind, queue, state)
FROM fenceq_jobs
WHERE state NOT IN ('completed', 'discarded', 'cancelled') AND NOT (kind = ANY($2::text[]))
ORDER BY id LIMIT $1`

// sqlStrandedOutbox: pending outbox rows that nothing will deliver: their delivery job
// is missing or already finished.
const sqlStrandedOutbox = `
SELECT count(*) OVER ()::bigint,
       format('outbox row %s (%s): pending, delivery job %s %s', o.id, o.dedupe_key,
              COALESCE(o.delivery_job_id::text, 'none'), COALESCE(j.state, 'missing'))
FROM fenceq_outbox o
LEFT JOIN fenceq_jobs j ON j.id = o.delivery_job_id
WHERE o.state = 'pending'
  AND (j.id IS NULL OR j.state IN ('completed', 'discarded', 'cancelled'))
ORDER BY o.id LIMIT $1`
