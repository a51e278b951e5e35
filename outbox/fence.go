package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// maxErrorLen bounds the error text stored on a row.
const maxErrorLen = 4 << 10

// write runs one fenced relay write (see fence in sql.go) and explains a miss:
// queue.ErrLeaseLost when the delivery job is no longer running under the lease,
// queue.ErrWrongState when the row is not pending or belongs to another delivery job.
func write(ctx context.Context, db queue.DBTX, op string, id int64, l queue.Lease, sql string, args ...any) (int, error) {
	all := append([]any{id, l.JobID, l.Gen, l.Holder, queue.StateRunning}, args...)
	var attempt int
	err := db.QueryRow(ctx, sql, all...).Scan(&attempt)
	if err == nil {
		return attempt, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%s outbox row %d: %w", op, id, err)
	}
	var held bool
	if err := db.QueryRow(ctx, sqlHasFence, l.JobID, l.Gen, queue.StateRunning).Scan(&held); err != nil {
		return 0, fmt.Errorf("%s outbox row %d: check lease: %w", op, id, err)
	}
	if !held {
		lost := fmt.Errorf("%s outbox row %d under job %d at lease generation %d: %w",
			op, id, l.JobID, l.Gen, queue.ErrLeaseLost)
		// Recorded with db: kept when db is a pool; a caller's transaction that rolls
		// back loses it, but there the fence of the job's fenced transaction has
		// recorded it already.
		if rerr := store.RecordStaleWrite(ctx, db, l, op+" outbox row"); rerr != nil {
			return 0, errors.Join(lost, rerr)
		}
		return 0, lost
	}
	return 0, fmt.Errorf("%s outbox row %d: it is not pending with delivery job %d: %w", op, id, l.JobID, queue.ErrWrongState)
}

// beginAttempt records, under the delivery job's lease, that the holder is about to
// deliver the row: the row's attempt count grows by one and its lease columns name the
// lease. It returns the row's new attempt count. It runs before the external call, so
// a holder whose lease was revoked is stopped here (queue.ErrLeaseLost) instead of
// delivering.
func beginAttempt(ctx context.Context, db queue.DBTX, id int64, l queue.Lease) (int, error) {
	return write(ctx, db, "begin delivery of", id, l, sqlBeginAttempt)
}

// markDelivered marks the row delivered under the delivery job's lease, in the job's
// fenced commit, so the row and the job's completion commit together.
func markDelivered(ctx context.Context, db queue.DBTX, id int64, l queue.Lease) error {
	_, err := write(ctx, db, "mark delivered", id, l, sqlMarkDelivered)
	return err
}

// markFailed marks the row failed with a reason, under the delivery job's lease: a
// permanent rejection or the last attempt. The row is kept for Retry.
func markFailed(ctx context.Context, db queue.DBTX, id int64, l queue.Lease, reason string) error {
	_, err := write(ctx, db, "mark failed", id, l, sqlMarkFailed, queue.StorableText(reason, maxErrorLen))
	return err
}

// recordAttempt records the error of a failed attempt that will be retried, under the
// delivery job's lease.
func recordAttempt(ctx context.Context, db queue.DBTX, id int64, l queue.Lease, errText string) error {
	_, err := write(ctx, db, "record attempt of", id, l, sqlRecordAttempt, queue.StorableText(errText, maxErrorLen))
	return err
}
