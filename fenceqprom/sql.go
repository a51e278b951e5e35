package fenceqprom

import (
	"strings"

	"github.com/fenceq/fenceq/outbox"
)

// SQL read at scrape time. Every statement is cheap: the depth count reads unfinished
// jobs only, the outbox one the partial index of pending rows.

// sqlTablesExist reports which of the tables the snapshot reads exist on the
// search_path (before migrations, or before the outbox migration, some do not). The
// queue names need both fenceq_queues and fenceq_workers.
const sqlTablesExist = `
SELECT to_regclass('fenceq_jobs') IS NOT NULL,
       to_regclass('fenceq_queues') IS NOT NULL AND to_regclass('fenceq_workers') IS NOT NULL,
       to_regclass('fenceq_outbox') IS NOT NULL, to_regclass('fenceq_periodic') IS NOT NULL`

// sqlQueueDepth counts unfinished jobs ($1 the unfinished states) by queue and state.
const sqlQueueDepth = `
SELECT queue, state, count(*) FROM fenceq_jobs
WHERE state = ANY($1)
GROUP BY queue, state`

// sqlQueueNames lists the queues the database knows besides those with unfinished jobs:
// the queues with settings (fenceq_queues) and the queues served by the workers with a
// row in fenceq_workers. They have no row in the depth count when they have no
// unfinished job, and get zeros instead, so that their series do not vanish when they
// empty.
const sqlQueueNames = `
SELECT name FROM fenceq_queues
UNION SELECT unnest(queues) FROM fenceq_workers`

// sqlOutboxPending counts pending outbox rows and how long the oldest has been pending
// (since available_at: a row retried by an operator counts from its retry, as in
// outbox.Stats), by the database's clock. The state is a literal, rendered from
// outbox.StatePending, so that the planner matches the partial index of pending rows.
var sqlOutboxPending = `
SELECT count(*), COALESCE(extract(epoch FROM now() - min(available_at)), 0)::float8
FROM fenceq_outbox WHERE state = ` + sqlLit(string(outbox.StatePending))

// sqlLit renders a word as an SQL string literal.
func sqlLit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
