package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/queue"
)

// Queue limits (migration 000021): at most fenceq_queues.max_running jobs of a queue
// running at once across every worker process. The ordinary claim and the flow claim
// leave a limited queue out; ClaimInQueueLimit claims from it under the queue's lock.

// SetQueueLimit sets a queue's limit (max above 0), or removes it (0); it creates the
// queue's settings row if needed. A lower limit lets the jobs already running finish.
func SetQueueLimit(ctx context.Context, db queue.DBTX, name string, max int) error {
	if err := queue.ValidateQueue(name); err != nil {
		return err
	}
	if max < 0 {
		return invalid("max_running", "%d is negative (0 removes the limit)", max)
	}
	if _, err := db.Exec(ctx, `
INSERT INTO fenceq_queues (name, paused, max_running, updated_at) VALUES ($1, false, NULLIF($2, 0), now())
ON CONFLICT (name) DO UPDATE SET max_running = EXCLUDED.max_running, updated_at = now()`, name, max); err != nil {
		return fmt.Errorf("set the limit of queue %q: %w", name, err)
	}
	return nil
}

// LimitedQueues returns the limits of those of names that have one.
func LimitedQueues(ctx context.Context, db queue.DBTX, names []string) (map[string]int, error) {
	rows, err := db.Query(ctx, `SELECT name, max_running FROM fenceq_queues WHERE name = ANY($1) AND max_running IS NOT NULL`, names)
	if err != nil {
		return nil, fmt.Errorf("read queue limits: %w", err)
	}
	out := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read queue limits: %w", err)
		}
		out[name] = n
	}
	return out, rows.Err()
}

// ClaimInQueueLimitParams describes a claim from one queue with a limit.
type ClaimInQueueLimitParams struct {
	Queue    string
	WorkerID string
	Lease    time.Duration
	Kinds    []string
	// Limit is the most jobs to take (the worker's free slots); the queue's room may
	// allow fewer.
	Limit int
	// Flow also claims jobs under flow limits into what room is left.
	Flow bool
}

// ClaimInQueueLimit claims from a queue with a limit: in one transaction it takes the
// queue's advisory lock (every such claim of the queue waits for the one before it to
// commit), then reads the limit and counts the queue's running jobs in statements of
// their own, whose snapshots are taken after the lock and so see every claim made under
// it, and claims at most the room left: ordinary jobs first, then jobs under flow limits.
// A lease ends without the lock (a completion, a revocation), which only makes room. A
// queue whose limit was removed meanwhile is claimed up to p.Limit.
func ClaimInQueueLimit(ctx context.Context, db queue.Beginner, p ClaimInQueueLimitParams) ([]*queue.JobRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	var jobs []*queue.JobRow
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('fenceq.queue.' || current_schema() || '.' || $1, 0))`,
			p.Queue); err != nil {
			return err
		}
		var max *int
		var paused bool
		err := tx.QueryRow(ctx, `SELECT max_running, paused FROM fenceq_queues WHERE name = $1`, p.Queue).Scan(&max, &paused)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if paused {
			return nil
		}
		room := p.Limit
		if max != nil {
			var running int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM fenceq_jobs_hot WHERE queue = $1 AND state = `+sqlRunning,
				p.Queue).Scan(&running); err != nil {
				return err
			}
			room = min(room, *max-running)
		}
		if room <= 0 {
			return nil
		}
		sql, args := sqlClaimInLimit, []any{customPlan, p.Queue, room, p.WorkerID, micros(p.Lease)}
		if p.Kinds != nil {
			sql, args = sqlClaimKindsInLimit, append(args, p.Kinds)
		}
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		if jobs, err = collectClaimed(rows, p.Queue, p.WorkerID, room); err != nil {
			return err
		}
		if left := room - len(jobs); p.Flow && left > 0 {
			more, _, err := ClaimFlow(ctx, tx, ClaimFlowParams{WorkerID: p.WorkerID, Lease: p.Lease, Kinds: p.Kinds,
				Queues: []QueueClaim{{Name: p.Queue, Limit: left}}, Max: left, InQueueLimit: true})
			if err != nil {
				return err
			}
			jobs = append(jobs, more...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim jobs in limited queue %q: %w", p.Queue, err)
	}
	return jobs, nil
}
