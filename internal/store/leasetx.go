package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// withLeasePipelined is WithLease on one connection. Nothing is sent before the
// function's first statement: BEGIN and the checked lock travel with it (leaseTx.open),
// and the completion travels with COMMIT, so the transaction adds one round trip to the
// function's own statements. A function that sends nothing leaves the whole transaction
// to one pipeline (withLeaseWritesPipelined without writes).
func withLeasePipelined(ctx context.Context, conn *pgx.Conn, l queue.Lease, how LeaseTx, op string, fn TxFunc) error {
	t := &leaseTx{ctx: ctx, conn: conn, l: l, op: op}
	var fnErr error
	if fn != nil {
		fnErr = fn(ctx, t)
	}
	pendingErr := t.closePending()
	t.ended = true
	tx := t.tx
	if tx == nil {
		// Nothing of the function's reached the server.
		switch {
		case fnErr != nil:
			return fnErr
		case t.rolledBack:
			return t.rolledBackErr()
		}
		return withLeaseWritesPipelined(ctx, conn, l, how, op, nil)
	}
	finished := false // the transaction ended: nothing left to roll back
	defer func() {
		if !finished {
			_ = tx.Rollback(ctx)
		}
	}()
	if t.lost != nil {
		// The lock raised: the server skipped the statement behind it and left the
		// transaction aborted. Whatever the function returned, nothing was written.
		finished = true
		lost := t.lost
		switch {
		case errors.Is(fnErr, queue.ErrLeaseLost):
			lost = fnErr // the function passed on the error of its statement
		case fnErr != nil:
			lost = errors.Join(lost, fnErr)
		}
		if !t.rolledBack {
			if err := tx.Rollback(ctx); err != nil {
				return errors.Join(lost, fmt.Errorf("roll back: %w", err))
			}
		}
		if err := RecordStaleWrite(ctx, conn, l, op); err != nil {
			return errors.Join(lost, err)
		}
		return lost
	}
	switch {
	case fnErr != nil:
		return fnErr
	case t.rolledBack:
		finished = true
		return t.rolledBackErr()
	case pendingErr != nil:
		return pendingErr
	}
	if !how.Complete {
		finished = true // Commit ends the transaction whatever it returns
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("%s of job %d: commit: %w", op, l.JobID, err)
		}
		return nil
	}
	var output []byte
	if how.Output != nil {
		output = how.Output()
	}
	if err := queue.ValidateOutput(output); err != nil {
		return fmt.Errorf("complete job %d: %w", l.JobID, err)
	}
	dist, err := selfNotify(ctx, conn)
	if err != nil {
		return fmt.Errorf("complete job %d: %w", l.JobID, err)
	}
	cb := &pgx.Batch{}
	cb.Queue(completeLockedSQL(true, dist, how.MovesOut), l.JobID, l.Gen, output)
	cb.Queue("COMMIT")
	cr := conn.SendBatch(ctx, cb)
	_, completeErr := cr.Exec()
	tag, commitErr := cr.Exec()
	closeErr := cr.Close()
	if completeErr != nil {
		return completeLockedErr(l, completeErr)
	}
	if commitErr == nil {
		commitErr = closeErr
	}
	if commitErr != nil {
		// The outcome is unknown when the reply was lost: the caller looks (Landed).
		return fmt.Errorf("%s of job %d: commit: %w", op, l.JobID, commitErr)
	}
	finished = true
	if tag.String() == "ROLLBACK" {
		return fmt.Errorf("%s of job %d: commit: %w", op, l.JobID, pgx.ErrTxCommitRollback)
	}
	return nil
}

// leaseTx is the pgx.Tx a fenced transaction hands to its function. The transaction
// commits when the function returns, so Commit is refused; Rollback ends it and fails
// WithLease; nothing may use it after the function returned, when its connection may
// already be back in the pool.
//
// On a pipelined connection (conn set) the transaction begins with the function's first
// statement: an Exec with arguments or a QueryRow is sent in one round trip behind BEGIN
// and the checked lock; any other first call sends BEGIN and the lock on their own
// first. The lock raises when the lease is gone, so the server skips what is queued
// behind it and leaves the transaction aborted until the function returns: every
// statement of the function runs after the lock returned the job's row, or not at all.
// Without conn, tx was begun and locked before the function was called.
type leaseTx struct {
	ctx  context.Context // WithLease's, for the BEGIN that Conn and LargeObjects send
	conn *pgx.Conn
	l    queue.Lease
	op   string
	// tx is the transaction once BEGIN was sent; nil before.
	tx pgx.Tx
	// pending is the row of a QueryRow that began the transaction, while its batch is
	// open: it is closed before anything else is sent.
	pending *pendingRow
	// lost is the error of a lock that found the lease gone.
	lost       error
	ended      bool // the function returned
	rolledBack bool
}

// errLeaseTxCommit is returned by Commit inside a fenced transaction's function.
var errLeaseTxCommit = errors.New("commit inside a fenced transaction: it commits when its function returns")

// usable reports pgx.ErrTxClosed once the function returned or rolled back.
func (t *leaseTx) usable() error {
	if t.ended || t.rolledBack {
		return pgx.ErrTxClosed
	}
	return nil
}

// ready is usable for a call that sends something: it also reads the rest of a pending
// QueryRow's batch, and refuses once the lease was found lost.
func (t *leaseTx) ready() error {
	if err := t.usable(); err != nil {
		return err
	}
	if err := t.closePending(); err != nil {
		return err
	}
	return t.lost
}

// rolledBackErr is WithLease's error when the function rolled the transaction back.
func (t *leaseTx) rolledBackErr() error {
	return fmt.Errorf("%s of job %d: the function rolled the transaction back: nothing was written", t.op, t.l.JobID)
}

// open begins the transaction: BEGIN, the checked lock and first (when not nil) go in
// one batch, one round trip. It returns the batch with first's result unread. When
// the lock finds the lease gone it returns an error matching ErrLeaseLost and records it
// in lost; the server skipped first.
func (t *leaseTx) open(ctx context.Context, first *queuedWrite) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(sqlLockLeaseChecked, t.l.JobID, t.l.Gen)
	if first != nil {
		b.Queue(first.sql, first.args...)
	}
	br := t.conn.SendBatch(ctx, b)
	t.tx = br.Tx()
	_, beginErr := br.Exec()
	_, lockErr := br.Exec()
	if beginErr == nil && lockErr == nil {
		return br, nil
	}
	_ = br.Close()
	switch {
	case beginErr != nil:
		// BEGIN failed, or the batch failed before it was sent (a statement that
		// could not be prepared, an argument that could not be encoded): when the
		// connection is outside a transaction, the next statement begins again.
		if t.conn.PgConn().TxStatus() == 'I' {
			t.tx = nil
		}
		return nil, fmt.Errorf("begin the fenced transaction of job %d: %w", t.l.JobID, beginErr)
	case isMissed(lockErr, lockMissed):
		t.lost = fmt.Errorf("lock job %d at lease generation %d: %w", t.l.JobID, t.l.Gen, queue.ErrLeaseLost)
		return nil, t.lost
	}
	return nil, fmt.Errorf("lock job %d: %w", t.l.JobID, lockErr)
}

// begin sends BEGIN and the lock on their own, unless the transaction began already.
func (t *leaseTx) begin(ctx context.Context) error {
	if t.tx != nil {
		return nil
	}
	br, err := t.open(ctx, nil)
	if err != nil {
		return err
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("begin the fenced transaction of job %d: %w", t.l.JobID, err)
	}
	return nil
}

// closePending reads the rest of a pending QueryRow's batch (the row, when Scan was not
// called), freeing the connection. Its error is that of the QueryRow's statement.
func (t *leaseTx) closePending() error {
	r := t.pending
	if r == nil {
		return nil
	}
	t.pending = nil
	if err := r.br.Close(); err != nil {
		return fmt.Errorf("fenced transaction of job %d: a statement whose row was not scanned: %w", t.l.JobID, err)
	}
	return nil
}

// lazy reports whether a statement can travel behind BEGIN and the lock: the
// transaction has not begun, and the statement is one a batch sends as Exec and
// QueryRow would. An Exec without arguments uses the simple protocol, which allows
// several statements in one string, and options (an exec mode, result formats) are not
// taken by a batch: those begin the transaction first.
func (t *leaseTx) lazy(sql string, args []any, exec bool) bool {
	if t.tx != nil || sql == "" || (exec && len(args) == 0) {
		return false
	}
	if len(args) > 0 {
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID, pgx.QueryRewriter:
			return false
		}
	}
	return true
}

func (t *leaseTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.ready(); err != nil {
		return pgconn.CommandTag{}, err
	}
	if t.lazy(sql, args, true) {
		br, err := t.open(ctx, &queuedWrite{sql: sql, args: args})
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		tag, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return tag, err
	}
	if err := t.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.tx.Exec(ctx, sql, args...)
}

func (t *leaseTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.ready(); err != nil {
		return errRow{err}
	}
	if t.lazy(sql, args, false) {
		br, err := t.open(ctx, &queuedWrite{sql: sql, args: args})
		if err != nil {
			return errRow{err}
		}
		t.pending = &pendingRow{t: t, br: br}
		return t.pending
	}
	if err := t.begin(ctx); err != nil {
		return errRow{err}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

func (t *leaseTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ready(); err != nil {
		// Rows that carry the error, as pgx's own: code that reads the error from the
		// rows (pgx.CollectRows) gets it there.
		return errRows{err}, err
	}
	if err := t.begin(ctx); err != nil {
		return errRows{err}, err
	}
	return t.tx.Query(ctx, sql, args...)
}

func (t *leaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.ready(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if err := t.begin(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.tx.SendBatch(ctx, b)
}

func (t *leaseTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ready(); err != nil {
		return 0, err
	}
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

func (t *leaseTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.ready(); err != nil {
		return nil, err
	}
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// Begin starts a savepoint inside the fenced transaction.
func (t *leaseTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ready(); err != nil {
		return nil, err
	}
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

// LargeObjects begins the transaction if it has not begun. When it cannot (the lease
// is gone), every call of the large objects it returns fails.
func (t *leaseTx) LargeObjects() pgx.LargeObjects {
	if t.ready() != nil || t.begin(t.ctx) != nil {
		return closedTx().LargeObjects()
	}
	return t.tx.LargeObjects()
}

// Conn returns the transaction's connection, beginning the transaction if it has not
// begun, so that what is sent on it runs behind the lock; when the lock found the lease
// gone the transaction is left aborted and every statement sent on the connection fails
// until the function returns. It returns nil once the transaction ended or when it
// could not begin: the connection would then run statements outside the fence.
func (t *leaseTx) Conn() *pgx.Conn {
	if t.usable() != nil {
		return nil
	}
	_ = t.closePending() // a failed statement left the transaction aborted: still fenced
	if t.conn == nil {
		return t.tx.Conn()
	}
	if t.lost == nil && t.begin(t.ctx) != nil {
		return nil
	}
	return t.conn
}

func (t *leaseTx) Commit(context.Context) error {
	if err := t.usable(); err != nil {
		return err
	}
	return errLeaseTxCommit
}

// Rollback ends the transaction; WithLease then fails and writes nothing. Before
// anything was sent there is nothing to roll back.
func (t *leaseTx) Rollback(ctx context.Context) error {
	if err := t.usable(); err != nil {
		return err
	}
	t.rolledBack = true
	_ = t.closePending() // its statement is rolled back with the rest
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// pendingRow is the row of a QueryRow that began the fenced transaction: Scan reads it
// from the batch that carried BEGIN and the lock, then closes the batch.
type pendingRow struct {
	t  *leaseTx
	br pgx.BatchResults
}

// errRowGone is Scan's error for a row whose batch was closed before Scan was called.
var errRowGone = errors.New("scan of a fenced transaction's row after the transaction's next call: scan a row before using the transaction again")

func (r *pendingRow) Scan(dest ...any) error {
	if r.t.pending != r {
		if r.t.ended || r.t.rolledBack {
			return pgx.ErrTxClosed
		}
		return errRowGone
	}
	r.t.pending = nil
	err := r.br.QueryRow().Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// closedTx returns a pgx.Tx every method of which fails with pgx.ErrTxClosed.
func closedTx() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}

// errRow is a pgx.Row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errRows are pgx.Rows that hold no row and report err.
type errRows struct{ err error }

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return nil }

// runLeaseFn runs a fenced transaction's function on tx, begun and locked already,
// through the leaseTx that refuses Commit and ends with the function. rolledBack
// reports that the function rolled the transaction back itself: nothing was written,
// and err says so.
func runLeaseFn(ctx context.Context, tx pgx.Tx, l queue.Lease, op string, fn TxFunc) (rolledBack bool, err error) {
	if fn == nil {
		return false, nil
	}
	t := &leaseTx{ctx: ctx, tx: tx, l: l, op: op}
	err = fn(ctx, t)
	t.ended = true
	if err != nil {
		return t.rolledBack, err
	}
	if t.rolledBack {
		return true, t.rolledBackErr()
	}
	return false, nil
}
