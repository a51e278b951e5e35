package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Writes are the statements of a fenced transaction known before it starts, for
// WithLeaseWrites: a job's result rows, computed from its arguments and from what the
// handler did before committing. They are sent in the transaction's own pipeline and
// their results are not read, so a statement cannot depend on another's result; a
// statement that fails (a unique violation, a check) aborts the transaction.
type Writes struct {
	stmts []queuedWrite
}

type queuedWrite struct {
	sql  string
	args []any
}

// Exec queues one statement with its arguments.
func (w *Writes) Exec(sql string, args ...any) {
	w.stmts = append(w.stmts, queuedWrite{sql: sql, args: args})
}

// Len is the number of statements queued.
func (w *Writes) Len() int {
	if w == nil {
		return 0
	}
	return len(w.stmts)
}

// WithLeaseWrites is WithLease with its statements given in advance: on a
// *pgxpool.Pool or a *pgx.Conn the whole fenced transaction is one pipeline, one round
// trip:
//
//	BEGIN; lock the job row (checked: raises when the lease is gone); w's statements;
//	[the checked completion;] COMMIT
//
// The lock is taken before any of w's statements runs and is held until COMMIT, as in
// WithLease. When the lease is gone, the lock raises an error, the server skips
// everything behind it, nothing is written, and the error matches ErrLeaseLost (a
// stale_write_rejected event is recorded). When one of w's statements fails, the same
// happens and its error is returned, naming the statement's position. A lost reply to
// the pipeline leaves the outcome unknown, as a lost reply to COMMIT does: Landed
// settles it. Any other db runs the statements one by one inside WithLease.
func WithLeaseWrites(ctx context.Context, db queue.Beginner, l queue.Lease, how LeaseTx, w *Writes) error {
	op := leaseOp(how)
	if w == nil {
		w = &Writes{}
	}
	conn, release, err := pipelineConn(ctx, db)
	if err != nil {
		return fmt.Errorf("%s of job %d: %w", op, l.JobID, err)
	}
	if conn == nil {
		return WithLease(ctx, db, l, how, func(ctx context.Context, tx pgx.Tx) error {
			for i, s := range w.stmts {
				if _, err := tx.Exec(ctx, s.sql, s.args...); err != nil {
					return fmt.Errorf("%s of job %d: write %d: %w", op, l.JobID, i+1, err)
				}
			}
			return nil
		})
	}
	defer release()
	return withLeaseWritesPipelined(ctx, conn, l, how, op, w)
}

// withLeaseWritesPipelined is WithLeaseWrites on one connection: the whole fenced
// transaction in one pipeline. w may be nil: BEGIN, the lock, [the completion,] COMMIT.
func withLeaseWritesPipelined(ctx context.Context, conn *pgx.Conn, l queue.Lease, how LeaseTx, op string, w *Writes) error {
	if w == nil {
		w = &Writes{}
	}
	var output []byte
	if how.Complete && how.Output != nil {
		output = how.Output()
	}
	if err := queue.ValidateOutput(output); err != nil {
		return fmt.Errorf("complete job %d: %w", l.JobID, err)
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(sqlLockLeaseChecked, l.JobID, l.Gen)
	for _, s := range w.stmts {
		b.Queue(s.sql, s.args...)
	}
	if how.Complete {
		dist, err := selfNotify(ctx, conn)
		if err != nil {
			return fmt.Errorf("%s of job %d: %w", op, l.JobID, err)
		}
		b.Queue(completeLockedSQL(true, dist, how.MovesOut), l.JobID, l.Gen, output)
	}
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	// The first error is the one that aborted the transaction; the results behind it
	// report only that they were skipped.
	var first error
	at := 0
	var tag pgconn.CommandTag
	for i := range b.Len() {
		t, err := br.Exec()
		if err != nil && first == nil {
			first, at = err, i
		}
		tag = t
	}
	closeErr := br.Close()
	if first == nil && closeErr == nil {
		if tag.String() == "ROLLBACK" {
			return fmt.Errorf("%s of job %d: commit: %w", op, l.JobID, pgx.ErrTxCommitRollback)
		}
		return nil
	}
	if first == nil {
		first, at = closeErr, b.Len()-1
	}
	// A transaction left aborted (or, after a lost reply, in an unknown state) is
	// rolled back; after a COMMIT that did run, ROLLBACK only draws a warning.
	rbErr := tx.Rollback(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(first, &pgErr) {
		// Not the server's answer (a connection lost, a context ended): any part of
		// the pipeline may have run, COMMIT included. The caller looks (Landed).
		return fmt.Errorf("%s of job %d: outcome unknown: %w", op, l.JobID, first)
	}
	switch {
	case at == 0:
		// BEGIN, or the preparation of a statement the connection had not described
		// yet (a syntax error): nothing ran.
		return fmt.Errorf("%s of job %d: %w", op, l.JobID, first)
	case at == 1 && isMissed(first, lockMissed):
		lost := fmt.Errorf("lock job %d at lease generation %d: %w", l.JobID, l.Gen, queue.ErrLeaseLost)
		if rbErr != nil {
			return errors.Join(lost, fmt.Errorf("roll back: %w", rbErr))
		}
		if err := RecordStaleWrite(ctx, conn, l, op); err != nil {
			return errors.Join(lost, err)
		}
		return lost
	case at == 1:
		return fmt.Errorf("lock job %d: %w", l.JobID, first)
	case at < 2+len(w.stmts):
		return fmt.Errorf("%s of job %d: write %d: %w", op, l.JobID, at-1, first)
	case how.Complete && at == 2+len(w.stmts):
		return completeLockedErr(l, first)
	}
	return fmt.Errorf("%s of job %d: commit: %w", op, l.JobID, first)
}
