package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
// and history of migration 000014, the pending state of 000015, the flow tables and
// triggers of 000016 (dependencies, workflows, batches, signals and waits), the debounce
// key and the periodic columns of 000017, the job counters of 000019, the flow limits of
// 000020, the queue limits of 000021 and history's partitions of 000023 (the worker
// makes them ahead of its jobs).
const SchemaVersion = 23

// CheckSchema returns an error naming the step to take when the core schema on db's
// search_path is older than SchemaVersion (or not installed, or left dirty by a failed
// migration): statements of this engine would fail on it, or write states it forbids.
// It reads the version fenceq's migrations record in fenceq_schema_migrations.
func CheckSchema(ctx context.Context, db queue.DBTX) error {
	var version int64
	var dirty, found bool
	err := db.QueryRow(ctx, `
SELECT v.version, v.dirty, true FROM fenceq_schema_migrations v
WHERE to_regclass('fenceq_schema_migrations') IS NOT NULL`).Scan(&version, &dirty, &found)
	switch {
	case err == nil:
	case errors.Is(err, pgx.ErrNoRows):
	case IsUndefinedTable(err):
	default:
		return fmt.Errorf("check fenceq's schema: %w", err)
	}
	if !found {
		// No version recorded where this connection looks (a schema set up without
		// fenceq's migration runner, or a coordinator that does not show it): check that
		// the objects of the current version are there instead, the newest by the
		// function its migration added (000023; it leaves a Citus schema's tables as they
		// were).
		var ok bool
		if err := db.QueryRow(ctx, `SELECT to_regclass('fenceq_jobs_hot') IS NOT NULL AND to_regclass('fenceq_job_counts') IS NOT NULL
    AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass('fenceq_queues')
                AND attname = 'max_running' AND NOT attisdropped)
    AND to_regprocedure('fenceq_history_extend(bigint, interval)') IS NOT NULL`).Scan(&ok); err != nil {
			return fmt.Errorf("check fenceq's schema: %w", err)
		}
		if !ok {
			return fmt.Errorf("fenceq's tables on this search_path are missing or predate core schema version %d: "+
				"run `fenceq migrate up` or migrations.Up first", SchemaVersion)
		}
		return nil
	}
	if dirty {
		return fmt.Errorf("fenceq's core schema is dirty at version %d (a migration failed half-way): "+
			"repair the schema by hand, then clear the dirty flag in fenceq_schema_migrations and run `fenceq migrate up`", version)
	}
	if version < SchemaVersion {
		return fmt.Errorf("fenceq's core schema on this search_path is at version %d, this engine needs %d: "+
			"run `fenceq migrate up` or migrations.Up first", version, SchemaVersion)
	}
	return nil
}
