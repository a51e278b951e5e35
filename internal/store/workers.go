package store

import (
	"context"
	"fmt"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// RegisterWorker records a live worker process in fenceq_workers, with the queues it
// serves and the kinds it has handlers for, or updates its row.
func RegisterWorker(ctx context.Context, db queue.DBTX, id, host string, pid int, queues, kinds []string) error {
	if queues == nil {
		queues = []string{}
	}
	if kinds == nil {
		kinds = []string{}
	}
	if _, err := db.Exec(ctx, sqlRegisterWorker, id, host, pid, queues, kinds); err != nil {
		return fmt.Errorf("register worker %s: %w", id, err)
	}
	return nil
}

// DeregisterWorker removes a worker's row on shutdown.
func DeregisterWorker(ctx context.Context, db queue.DBTX, id string) error {
	if _, err := db.Exec(ctx, sqlDeregisterWorker, id); err != nil {
		return fmt.Errorf("deregister worker %s: %w", id, err)
	}
	return nil
}

// DeleteStaleWorkers removes rows of workers that have not heartbeated for age and hold
// no running job.
func DeleteStaleWorkers(ctx context.Context, db queue.DBTX, age time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, sqlDeleteStaleWorkers, micros(age))
	if err != nil {
		return 0, fmt.Errorf("delete stale workers: %w", err)
	}
	return tag.RowsAffected(), nil
}

// ListWorkers returns every registered worker process.
func ListWorkers(ctx context.Context, db queue.DBTX) ([]queue.WorkerInfo, error) {
	rows, err := db.Query(ctx, sqlListWorkers)
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	defer rows.Close()
	var out []queue.WorkerInfo
	for rows.Next() {
		var w queue.WorkerInfo
		var age float64
		if err := rows.Scan(&w.ID, &w.Host, &w.PID, &w.Queues, &w.Kinds, &w.StartedAt, &w.HeartbeatAt, &age, &w.RunningJobs); err != nil {
			return nil, fmt.Errorf("list workers: %w", err)
		}
		w.HeartbeatAge = time.Duration(age * float64(time.Second))
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	return out, nil
}

// SchemaVersion is the core schema version whose tables this engine writes: the hot set
// and history of migration 000014 and the job counters of migration 000019.
const SchemaVersion = 19

// CheckSchema returns an error naming the step to take when the schema on db's
// search_path has no fenceq_jobs_hot or no fenceq_job_counts: fenceq's tables there
// predate SchemaVersion (or are not installed), and statements of this engine would fail
// on them.
func CheckSchema(ctx context.Context, db queue.DBTX) error {
	var missing *string
	err := db.QueryRow(ctx, `SELECT CASE WHEN to_regclass('fenceq_jobs_hot') IS NULL THEN 'fenceq_jobs_hot'
		WHEN to_regclass('fenceq_job_counts') IS NULL THEN 'fenceq_job_counts' END`).Scan(&missing)
	if err != nil {
		return fmt.Errorf("check fenceq's schema: %w", err)
	}
	if missing != nil {
		return fmt.Errorf("fenceq's tables on this search_path are missing or predate core schema version %d "+
			"(no %s): run `fenceq migrate up` or migrations.Up first", SchemaVersion, *missing)
	}
	return nil
}
