package demo

// SQL of the demo: progress and the report read the demo's own schema.

const sqlCreateSchema = `CREATE SCHEMA %s`

const sqlDropSchema = `DROP SCHEMA IF EXISTS %s CASCADE`

// sqlProgress counts what the run produced so far.
const sqlProgress = `
SELECT (SELECT count(*) FROM invoices),
       (SELECT count(*) FROM fenceq_jobs WHERE kind = 'invoice'
            AND state NOT IN ('completed', 'discarded', 'cancelled')),
       (SELECT count(*) FROM orders),
       (SELECT count(*) FROM fenceq_outbox WHERE state = 'delivered'),
       (SELECT count(*) FROM fenceq_outbox WHERE state = 'pending'),
       (SELECT count(*) FROM fenceq_lease_events WHERE kind = 'revoked'),
       (SELECT count(*) FROM fenceq_lease_events WHERE kind = 'stale_write_rejected'),
       (SELECT count(*) FROM fenceq_lease_events WHERE kind = 'expired_holder_alive')`

// sqlEmails counts delivered emails by kind of dedupe key.
const sqlEmails = `
SELECT count(*) FILTER (WHERE dedupe_key LIKE 'invoice-email:%' AND state = 'delivered'),
       count(*) FILTER (WHERE dedupe_key LIKE 'order-email:%' AND state = 'delivered')
FROM fenceq_outbox`

// sqlJobIDs lists the jobs of a kind: the ones the billing run enqueued.
const sqlJobIDs = `SELECT id FROM fenceq_jobs WHERE kind = $1 ORDER BY id`

// sqlJobHolder says who holds the job with a unique key now.
const sqlJobHolder = `
SELECT id, state, COALESCE(leased_by, ''), lease_gen FROM fenceq_jobs WHERE unique_key = $1 AND kind = $2`

// sqlHolderNoticed reports whether a worker recorded that it lost a job's lease.
const sqlHolderNoticed = `
SELECT EXISTS (SELECT 1 FROM fenceq_lease_events WHERE job_id = $1 AND worker_id = $2 AND kind = 'heartbeat_lost')`

// sqlInvoiceWriter names the worker whose fenced commit wrote a customer's invoice.
const sqlInvoiceWriter = `SELECT leased_by FROM invoices WHERE customer_id = $1 AND period = $2`

// sqlStaleWritesOf counts the rejected writes of one lease.
const sqlStaleWritesOf = `
SELECT count(*) FROM fenceq_lease_events WHERE job_id = $1 AND lease_gen = $2 AND kind = 'stale_write_rejected'`
