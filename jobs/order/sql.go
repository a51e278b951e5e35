package order

// SQL for orders and order_items.

// sqlInsertOrder relies on UNIQUE (idempotency_key): with the idempotency record owned
// by this transaction it only conflicts when the record expired and the order exists.
const sqlInsertOrder = `
INSERT INTO orders (idempotency_key, request_hash, customer_email, currency, total_cents, job_id, lease_gen)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, status, created_at`

const sqlInsertItems = `
INSERT INTO order_items (order_id, line, sku, quantity, unit_price_cents)
SELECT $1, l.line, l.sku, l.quantity, l.price
FROM unnest($2::int[], $3::text[], $4::int[], $5::bigint[]) AS l(line, sku, quantity, price)`

const orderColumns = `id, idempotency_key, customer_email, currency, total_cents, status, created_at, job_id, lease_gen`

const sqlGetOrder = `SELECT ` + orderColumns + ` FROM orders WHERE id = $1`

const sqlGetOrderByKey = `SELECT ` + orderColumns + `, request_hash FROM orders WHERE idempotency_key = $1`

const sqlGetItems = `
SELECT sku, quantity, unit_price_cents FROM order_items WHERE order_id = $1 ORDER BY line`
