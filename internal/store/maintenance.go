package store

import (
	"context"
	"fmt"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// ReapParams tunes one pass of the reaper.
type ReapParams struct {
	// Limit is the most leases revoked in one statement.
	Limit int
	// HolderFresh is how recent a holder's fenceq_workers heartbeat must be for the holder
	// to count as alive.
	HolderFresh time.Duration
}

// Reap revokes leases that expired by the database's clock. Each revocation is a
// compare-and-set on the generation the reaper read: it bumps lease_gen, makes the job
// available again (or discarded past max attempts) and records a revoked lease event,
// plus expired_holder_alive when the holder process still heartbeats. Rows locked by an
// open fenced commit are skipped: that commit wins or loses atomically.
func Reap(ctx context.Context, db queue.DBTX, p ReapParams) ([]queue.Revocation, error) {
	if p.Limit <= 0 {
		p.Limit = 1000
	}
	var out []queue.Revocation
	err := onConn(ctx, db, func(db queue.DBTX, dist bool) error {
		var err error
		if !dist {
			out, err = reap(ctx, db, sqlReap, p)
			return err
		}
		// On Citus the revocations, their events and the wake-ups of their queues are
		// statements of one transaction, each routed to the schema's node or run on
		// the coordinator (see fencedSQL).
		return inTx(ctx, db, func(tx queue.DBTX) error {
			if out, err = reap(ctx, tx, sqlReapRouted, p); err != nil {
				return err
			}
			evs := make([]eventRow, 0, len(out))
			var queues []string
			for _, r := range out {
				var holder *string
				if r.Holder != "" {
					holder = &r.Holder
				}
				evs = append(evs, eventRow{jobID: r.JobID, gen: r.Gen, worker: holder, kind: queue.EventRevoked,
					detail: detailExpired + "; now " + string(r.State)})
				if r.HolderAlive {
					evs = append(evs, eventRow{jobID: r.JobID, gen: r.Gen, worker: holder, kind: queue.EventExpiredHolderAlive,
						detail: detailHolderAlive})
				}
				if r.State == queue.StateAvailable {
					queues = append(queues, r.Queue)
				}
			}
			if err := insertEvents(ctx, tx, evs); err != nil {
				return fmt.Errorf("reap expired leases: %w", err)
			}
			return notifyQueues(ctx, tx, queues)
		})
	})
	if err != nil {
		return nil, err // a failed transaction revoked nothing
	}
	return out, nil
}

func reap(ctx context.Context, db queue.DBTX, sql string, p ReapParams) ([]queue.Revocation, error) {
	rows, err := db.Query(ctx, sql, customPlan, p.Limit, micros(p.HolderFresh))
	if err != nil {
		return nil, fmt.Errorf("reap expired leases: %w", err)
	}
	defer rows.Close()
	var out []queue.Revocation
	for rows.Next() {
		var r queue.Revocation
		var state string
		if err := rows.Scan(&r.JobID, &r.Gen, &r.Holder, &state, &r.Queue, &r.Kind, &r.HolderAlive); err != nil {
			return nil, fmt.Errorf("reap expired leases: %w", err)
		}
		r.State = queue.State(state)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reap expired leases: %w", err)
	}
	return out, nil
}

// PromoteDue makes up to limit scheduled and retryable jobs whose run_at has passed
// available, and wakes their queues. It returns how many it promoted.
func PromoteDue(ctx context.Context, db queue.DBTX, limit int) (int64, error) {
	var n, woke int64
	err := withConn(ctx, db, func(db queue.DBTX) error {
		var queues []string
		if err := db.QueryRow(ctx, sqlPromoteDue, customPlan, limit).Scan(&n, &woke, &queues); err != nil {
			return fmt.Errorf("promote due jobs: %w", err)
		}
		return notifyQueues(ctx, db, queues)
	})
	return n, err
}

// PruneFinished deletes finished jobs whose finished_at is older than age: up to limit of
// them from history, and up to limit from the hot set (finished jobs holding their unique
// key). It returns how many it deleted.
func PruneFinished(ctx context.Context, db queue.DBTX, age time.Duration, limit int) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, sqlPruneFinished, customPlan, micros(age), limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("prune finished jobs older than %s: %w", age, err)
	}
	return n, nil
}

// MoveFinished moves up to limit finished jobs that hold no unique key from the hot set
// to history, and returns how many it moved. On plain PostgreSQL the statement that
// finishes a job moves it (and so does a write through the fenceq_jobs view), so there
// is nothing to move but what direct writes to fenceq_jobs_hot left there; on a Citus
// distributed schema jobs are finished in place (one routed statement, committed in one
// phase) and this moves them in batches.
func MoveFinished(ctx context.Context, db queue.DBTX, limit int) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, sqlMoveFinished, customPlan, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("move finished jobs to history: %w", err)
	}
	return n, nil
}

// PruneLeaseEvents deletes up to limit lease events older than age.
func PruneLeaseEvents(ctx context.Context, db queue.DBTX, age time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, sqlPruneLeaseEvents, micros(age), limit)
	if err != nil {
		return 0, fmt.Errorf("prune lease events older than %s: %w", age, err)
	}
	return tag.RowsAffected(), nil
}

// ExtendHistory makes history's partitions (fenceq_history_extend) until they hold every
// job id up to ahead past the last one taken, and returns the first id they do not hold.
// partitioned is false where history is one table (a Citus distributed schema): then
// there is nothing to make, ever.
func ExtendHistory(ctx context.Context, db queue.DBTX, ahead int64) (to int64, partitioned bool, err error) {
	var covered *int64
	if err := db.QueryRow(ctx, `SELECT fenceq_history_extend($1)`, ahead).Scan(&covered); err != nil {
		return 0, false, fmt.Errorf("make history partitions %d ids ahead: %w", ahead, err)
	}
	if covered == nil {
		return 0, false, nil
	}
	return *covered, true, nil
}

// DropEmptiedHistory drops the partitions of history that retention has emptied and that
// no unfinished job can land in (fenceq_history_drop_emptied), and returns how many.
func DropEmptiedHistory(ctx context.Context, db queue.DBTX) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT fenceq_history_drop_emptied()`).Scan(&n); err != nil {
		return 0, fmt.Errorf("drop emptied history partitions: %w", err)
	}
	return n, nil
}
