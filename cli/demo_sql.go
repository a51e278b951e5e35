package cli

// SQL of the demo: progress and the report read the demo's own schema.

const sqlDemoCreateSchema = `CREATE SCHEMA %s`

const sqlDemoDropSchema = `DROP SCHEMA IF EXISTS %s CASCADE`

// sqlDemoProgress counts what the run produced so far.
const sqlDemoProgress = `
SELECT (SELECT count(*) FROM invoices),
       (SELECT count(*) FROM fenceq_jobs WHERE kind = 'invoice'
            AND state NOT IN ('completed', 'discarded', 'cancelled')),
       (SELECT count(*) FROM orders),
       (SELECT count(*) FROM fenceq_outbox WHERE state = 'delivered'),
       (SELECT count(*) FROM fenceq_outbox WHERE state = 'pending'),
       (SELECT count(*) FROM fenceq_lease_events WHERE kind = 'revoked'),
       (SELECT count(*) FROM fenceq_lease_events WHERE kind = 'stale_write_rejected'),
       (SELECT count(*) FROM fenceq_lease_events WHERE kind = 'expired_holder_alive')`

// sqlDemoEmails counts delivered emails by kind of dedupe key.
const sqlDemoEmails = `
SELECT count(*) FILTER (WHERE dedupe_key LIKE 'invoice-email:%' AND state = 'delivered'),
       count(*) FILTER (WHERE dedupe_key LIKE 'order-email:%' AND state = 'delivered')
FROM fenceq_outbox`

// sqlDemoJobIDs lists the jobs of a kind: the ones the billing run enqueued.
const sqlDemoJobIDs = `SELECT id FROM fenceq_jobs WHERE kind = $1 ORDER BY id`

// sqlDemoJobHolder says who holds the job with a unique key now.
const sqlDemoJobHolder = `
SELECT id, state, COALESCE(leased_by, ''), lease_gen FROM fenceq_jobs WHERE unique_key = $1 AND kind = $2`

// sqlDemoHolderNoticed reports whether a worker recorded that it lost a job's lease.
const sqlDemoHolderNoticed = `
SELECT EXISTS (SELECT 1 FROM fenceq_lease_events WHERE job_id = $1 AND worker_id = $2 AND kind = 'heartbeat_lost')`

// sqlDemoInvoiceWriter names the worker whose fenced commit wrote a customer's invoice.
const sqlDemoInvoiceWriter = `SELECT leased_by FROM invoices WHERE customer_id = $1 AND period = $2`

// sqlDemoStaleWritesOf counts the rejected writes of one lease.
const sqlDemoStaleWritesOf = `
SELECT count(*) FROM fenceq_lease_events WHERE job_id = $1 AND lease_gen = $2 AND kind = 'stale_write_rejected'`
