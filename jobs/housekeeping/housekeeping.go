// Package housekeeping runs periodic maintenance as a fenceq job: deleting expired
// idempotency keys in batches, and marking orphaned outbox rows (pending, but their
// delivery job was discarded without delivering) failed so they are counted and
// retryable instead of silently stuck.
//
// The job (kind IdempotencyKind) is one recurring row: each run cleans up, then snoozes
// itself for Config.Interval (fenceq.JobSnooze), so it keeps its unique key and there is
// never more than one pending. Schedule enqueues it idempotently; call it whenever a
// worker starts. A run that fails is retried with backoff like any job; the row allows
// queue.MaxMaxAttempts attempts, and Schedule enqueues a new one if it was discarded.
package housekeeping

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// IdempotencyKind is the job kind that deletes expired idempotency keys.
const IdempotencyKind = "housekeeping.idempotency"

// Defaults of Config.
const (
	DefaultInterval   = time.Minute
	DefaultBatchSize  = 1000
	DefaultMaxBatches = 100
)

// IdempotencyArgs are the (empty) args of the cleanup job.
type IdempotencyArgs struct{}

// Kind implements fenceq.JobArgs.
func (IdempotencyArgs) Kind() string { return IdempotencyKind }

// InsertOpts makes the job unique while unfinished and long-lived.
func (IdempotencyArgs) InsertOpts() fenceq.InsertOpts {
	return fenceq.InsertOpts{UniqueKey: IdempotencyKind, MaxAttempts: queue.MaxMaxAttempts}
}

// Config configures the housekeeping handlers.
type Config struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Interval between runs. Defaults to 1m.
	Interval time.Duration
	// BatchSize is the most keys deleted per statement (one short transaction each).
	// Defaults to 1000.
	BatchSize int
	// MaxBatches bounds one run; the rest waits for the next run. Defaults to 100.
	MaxBatches int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	out := *c
	if out.Pool == nil {
		return out, errors.New("housekeeping config: Pool is required")
	}
	if out.Interval == 0 {
		out.Interval = DefaultInterval
	}
	if out.Interval < 0 {
		return out, fmt.Errorf("housekeeping config: Interval %s is negative", out.Interval)
	}
	if out.BatchSize == 0 {
		out.BatchSize = DefaultBatchSize
	}
	if out.BatchSize < 0 {
		return out, fmt.Errorf("housekeeping config: BatchSize %d is negative", out.BatchSize)
	}
	if out.MaxBatches == 0 {
		out.MaxBatches = DefaultMaxBatches
	}
	if out.MaxBatches < 0 {
		return out, fmt.Errorf("housekeeping config: MaxBatches %d is negative", out.MaxBatches)
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}

// Register adds the housekeeping handlers to hs.
func Register(hs *fenceq.Handlers, cfg Config) error {
	c, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	log := c.Logger.With("component", "housekeeping")
	return fenceq.AddHandlerSafely(hs, func(ctx context.Context, job *fenceq.Job[IdempotencyArgs]) error {
		n, err := CleanupIdempotencyKeys(ctx, c.Pool, c.BatchSize, c.MaxBatches)
		if err != nil {
			return err
		}
		if n > 0 {
			log.Info("deleted expired idempotency keys", "deleted", n, "job_id", job.ID)
		}
		orphans, err := outbox.FailOrphaned(ctx, c.Pool, c.BatchSize)
		if err != nil {
			return err
		}
		for _, id := range orphans {
			log.Error("outbox row orphaned: its delivery job was discarded; marked failed (fenceq outbox retry ID)",
				"outbox_id", id)
		}
		return fenceq.JobSnooze(c.Interval)
	}, nil)
}

// Schedule enqueues the cleanup job to run now, unless one is already pending (then
// the result has Existing set). Pass a pgx.Tx to make it part of a transaction.
func Schedule(ctx context.Context, db fenceq.DBTX) (*fenceq.InsertResult, error) {
	res, err := fenceq.Enqueue(ctx, db, IdempotencyArgs{}, nil)
	if err != nil {
		return nil, fmt.Errorf("schedule %s: %w", IdempotencyKind, err)
	}
	return res, nil
}

// CleanupIdempotencyKeys deletes expired, finished idempotency keys, batchSize per
// statement, until a batch comes back short or maxBatches ran (0 means no limit). It
// returns how many keys it deleted. In-flight keys are never deleted.
func CleanupIdempotencyKeys(ctx context.Context, db queue.DBTX, batchSize, maxBatches int) (int64, error) {
	if batchSize <= 0 {
		batchSize = DefaultBatchSize
	}
	var total int64
	for i := 0; maxBatches <= 0 || i < maxBatches; i++ {
		n, err := idempotency.DeleteExpired(ctx, db, batchSize)
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(batchSize) {
			break
		}
	}
	return total, nil
}
