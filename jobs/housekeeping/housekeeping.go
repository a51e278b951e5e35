// Package housekeeping runs periodic maintenance as a fenceq job: deleting expired
// idempotency keys in batches, and marking orphaned outbox rows (pending, but their
// delivery job was discarded without delivering) failed so they are counted and
// retryable instead of silently stuck.
//
// The job (kind IdempotencyKind) is an ordinary periodic job: Periodic returns its
// schedule, which a worker puts in fenceq.Config.Periodic. Each slot enqueues one job,
// which cleans up and completes; a run that fails is retried a few times, and the next
// slot comes anyway.
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

// Defaults of Config, and of the interval of Periodic.
const (
	DefaultInterval   = time.Minute
	DefaultBatchSize  = 1000
	DefaultMaxBatches = 100
)

// PeriodicName names the housekeeping schedule in fenceq_periodic.
const PeriodicName = IdempotencyKind

// maxAttempts of one run: the next slot retries anyway.
const maxAttempts = 3

// IdempotencyArgs are the (empty) args of the cleanup job.
type IdempotencyArgs struct{}

// Kind implements fenceq.JobArgs.
func (IdempotencyArgs) Kind() string { return IdempotencyKind }

// Periodic returns the housekeeping schedule: one IdempotencyKind job every interval
// (0 means DefaultInterval; a whole number of seconds, at least 1s), slots aligned to
// the Unix epoch. Slots missed while every worker was down are skipped: the next slot
// cleans up everything that expired meanwhile. It also runs once whenever workers start
// after every one was down.
func Periodic(interval time.Duration) (*fenceq.PeriodicJob, error) {
	if interval == 0 {
		interval = DefaultInterval
	}
	spec := "@every " + everyString(interval)
	if _, err := fenceq.ParseSchedule(spec, ""); err != nil {
		return nil, fmt.Errorf("housekeeping interval %s: %w", interval, err)
	}
	return fenceq.NewPeriodicJob(PeriodicName, spec, IdempotencyArgs{},
		&fenceq.PeriodicOpts{MaxAttempts: maxAttempts, Missed: queue.MissedSkip, RunOnStart: true}), nil
}

// everyString writes d as "@every" reads it, in its largest whole unit: 1m, 90s, 2h.
func everyString(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	default:
		return d.String()
	}
}

// Config configures the housekeeping handlers.
type Config struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
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
		return nil
	}, nil)
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
