package invoice

// SQL of the billing tables (migrations/000003_create_billing.up.sql).

// sqlLockBillingRun serializes billing runs of one period in one schema, so two runs
// started together cannot both see a customer as unbilled.
const sqlLockBillingRun = `
SELECT pg_advisory_xact_lock(hashtextextended('fenceq.billing:' || current_schema() || ':' || $1, 0))`

// sqlCustomersToBill lists the customers a billing run must enqueue for period $1: no
// invoice yet, and no invoice job for the period that is unfinished or completed. Both
// conditions are read in one snapshot, so a job that completes (writing its invoice)
// while the run reads cannot slip through; a discarded or cancelled job without an
// invoice is enqueued again.
const sqlCustomersToBill = `
SELECT c.id FROM customers c
WHERE NOT EXISTS (SELECT 1 FROM invoices i WHERE i.customer_id = c.id AND i.period = $1)
  AND NOT EXISTS (
      SELECT 1 FROM fenceq_jobs j
      WHERE j.kind = 'invoice' AND j.unique_key = 'invoice:' || c.id || ':' || $1
        AND j.state IN ('available', 'scheduled', 'running', 'retryable', 'completed'))
ORDER BY c.id`

const sqlGetCustomer = `SELECT id, name, email, country, currency FROM customers WHERE id = $1`

// sqlLoadUsage sums a customer's usage per SKU and price for a period.
const sqlLoadUsage = `
SELECT sku, description, unit_price_cents, sum(quantity)::bigint
FROM usage_records
WHERE customer_id = $1 AND period = $2
GROUP BY sku, description, unit_price_cents
ORDER BY sku, unit_price_cents, description`

const sqlInvoiceIDFor = `SELECT id FROM invoices WHERE customer_id = $1 AND period = $2`

// sqlInsertInvoice relies on UNIQUE (customer_id, period): when an invoice exists
// already, nothing is written and no row is returned.
const sqlInsertInvoice = `
INSERT INTO invoices (customer_id, period, currency, subtotal_cents, tax_rate_micros, tax_cents,
    total_cents, tax_reference, job_id, lease_gen, leased_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (customer_id, period) DO NOTHING
RETURNING id`

const sqlInsertInvoiceLines = `
INSERT INTO invoice_lines (invoice_id, line_no, sku, description, quantity, unit_price_cents, amount_cents)
SELECT $1, l.no, l.sku, l.description, l.quantity, l.unit_price_cents, l.amount_cents
FROM unnest($2::int[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[])
    AS l(no, sku, description, quantity, unit_price_cents, amount_cents)`

// sqlSeedCustomers creates $1 customers with ids taken from the identity sequence, so
// names and addresses can carry them.
const sqlSeedCustomers = `
WITH ids AS (
    SELECT nextval(pg_get_serial_sequence('customers', 'id')) AS id FROM generate_series(1, $1))
INSERT INTO customers (id, name, email, country)
SELECT id, 'Customer ' || id, 'customer-' || id || '@example.com', ($2::text[])[1 + id % array_length($2::text[], 1)]
FROM ids
RETURNING id`
