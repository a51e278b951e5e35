package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Citus support. On a Citus coordinator whose schemas are distributed (schema-based
// sharding), fenceq_jobs has no notify trigger (Citus allows none on distributed
// tables, and a worker node's NOTIFY would never reach the coordinator's listeners), so
// the writes that make jobs available notify on the coordinator themselves, in the same
// transaction. Whether a connection is such a one is read once per physical connection
// and kept with it; on plain PostgreSQL nothing else is sent.

// citusKey keys the answer in a connection's pgconn.CustomData.
const citusKey = "fenceq.self_notify"

// sqlSelfNotify tells whether the database runs Citus and the schema's fenceq_jobs has no
// notify trigger (migration 000001 leaves it out on a distributed table).
const sqlSelfNotify = `
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                   WHERE tgrelid = to_regclass('fenceq_jobs_hot') AND tgname = 'fenceq_jobs_notify_insert')`

// sqlSelfNotifyQueues announces the queues in $1 on the schema's channel. On Citus it
// touches no distributed table, so it runs on the coordinator, where workers LISTEN.
var sqlSelfNotifyQueues = `SELECT count(pg_notify(` + sqlLit(ChannelPrefix) + ` || current_schema(), q))
FROM (SELECT DISTINCT unnest($1::text[]) AS q) x`

// pgConnOf returns the physical connection behind db, or nil when db is a pool or a
// type this package does not know.
func pgConnOf(db queue.DBTX) *pgconn.PgConn {
	switch c := db.(type) {
	case pgx.Tx:
		if conn := c.Conn(); conn != nil {
			return conn.PgConn()
		}
	case *pgx.Conn:
		return c.PgConn()
	case *pgxpool.Conn:
		return c.Conn().PgConn()
	}
	return nil
}

// selfNotify reports whether writes through db must announce the jobs they make
// available themselves (a Citus distributed fenceq_jobs), reading it once per
// connection. A db whose connection is unknown (not a pgx transaction or connection)
// is taken to have the trigger.
func selfNotify(ctx context.Context, db queue.DBTX) (bool, error) {
	pc := pgConnOf(db)
	if pc == nil {
		return false, nil
	}
	data := pc.CustomData()
	if v, ok := data[citusKey].(bool); ok {
		return v, nil
	}
	var v bool
	if err := db.QueryRow(ctx, sqlSelfNotify).Scan(&v); err != nil {
		return false, fmt.Errorf("read whether fenceq_jobs is distributed: %w", err)
	}
	data[citusKey] = v
	return v, nil
}

// withConn runs fn on one connection of db: a pool's is acquired for the call (so that
// selfNotify can keep its answer with the connection), anything else is used as given.
func withConn(ctx context.Context, db queue.DBTX, fn func(db queue.DBTX) error) error {
	pool, ok := db.(*pgxpool.Pool)
	if !ok {
		return fn(db)
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	defer c.Release()
	return fn(c)
}

// notifyQueues announces queues on the schema's channel when db's fenceq_jobs has no
// notify trigger (Citus); otherwise it sends nothing.
func notifyQueues(ctx context.Context, db queue.DBTX, queues []string) error {
	if len(queues) == 0 {
		return nil
	}
	self, err := selfNotify(ctx, db)
	if err != nil || !self {
		return err
	}
	if _, err := db.Exec(ctx, sqlSelfNotifyQueues, queues); err != nil {
		return fmt.Errorf("notify queues %v: %w", queues, err)
	}
	return nil
}

// Distributed reports whether db reaches fenceq's tables through a Citus coordinator, as
// distributed tables (the database runs Citus and fenceq_jobs has no notify trigger).
// fenceq's writes then announce the jobs they make available themselves, and settings
// meant for the node holding the rows are sent with SET LOCAL. The answer is read once
// per connection.
func Distributed(ctx context.Context, db queue.DBTX) (bool, error) {
	var v bool
	err := onConn(ctx, db, func(_ queue.DBTX, dist bool) error {
		v = dist
		return nil
	})
	return v, err
}

// onConn runs fn on one connection of db (see withConn), telling it whether that
// connection reaches fenceq's tables as Citus distributed tables: the statements whose
// single-statement form Citus would commit in two phases pick their routed form then.
func onConn(ctx context.Context, db queue.DBTX, fn func(db queue.DBTX, dist bool) error) error {
	return withConn(ctx, db, func(db queue.DBTX) error {
		dist, err := selfNotify(ctx, db)
		if err != nil {
			return err
		}
		return fn(db, dist)
	})
}

// eventRow is one fenceq_lease_events row to insert.
type eventRow struct {
	jobID, gen int64
	worker     *string // NULL when nil
	kind       queue.LeaseEventKind
	detail     string
}

// maxEventRowsPerInsert bounds the rows of one INSERT (five parameters each, far under
// the protocol's 65,535).
const maxEventRowsPerInsert = 1000

// insertEvents records events with multi-row INSERT … VALUES statements: the form of
// insert a Citus coordinator sends whole to the node holding the schema, where an
// INSERT … SELECT (over unnest or a CTE) is run on the coordinator and committed in two
// phases. The statement's text depends on the number of rows, so it is sent unnamed and
// not cached.
func insertEvents(ctx context.Context, db queue.DBTX, evs []eventRow) error {
	for len(evs) > 0 {
		n := min(len(evs), maxEventRowsPerInsert)
		var b strings.Builder
		b.WriteString("INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail) VALUES ")
		args := make([]any, 1, 1+5*n)
		args[0] = pgx.QueryExecModeExec
		for i, e := range evs[:n] {
			if i > 0 {
				b.WriteString(", ")
			}
			k := 5 * i
			fmt.Fprintf(&b, "($%d::bigint, $%d::bigint, $%d::text, $%d::text, $%d::text)", k+1, k+2, k+3, k+4, k+5)
			args = append(args, e.jobID, e.gen, e.worker, string(e.kind), e.detail)
		}
		if _, err := db.Exec(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("record %d lease events: %w", n, err)
		}
		evs = evs[n:]
	}
	return nil
}

// inTx runs fn in one transaction: db's own when db is a transaction, a new one when db
// is a connection, and on db as it is otherwise.
func inTx(ctx context.Context, db queue.DBTX, fn func(queue.DBTX) error) error {
	if _, ok := db.(pgx.Tx); ok {
		return fn(db)
	}
	if b, ok := db.(interface {
		Begin(context.Context) (pgx.Tx, error)
	}); ok {
		return pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error { return fn(tx) })
	}
	return fn(db)
}
