package fenceqtest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// Work enqueues args as one job (opts as for fenceq.Enqueue, nil for none) and runs it
// at once, on the calling goroutine, as a worker with cfg would: see WorkJob. It returns
// the job's row once its outcome is written, and the handler's error.
//
// The job must be due now: a RunAt or RunIn in the future, or a unique key that matches
// an unfinished job, fails the test.
func Work(ctx context.Context, t testing.TB, pool *pgxpool.Pool, cfg fenceq.Config, args fenceq.JobArgs,
	opts *fenceq.InsertOpts) (*queue.JobRow, error) {
	t.Helper()
	if args == nil {
		t.Fatal("fenceqtest: Work: args is nil")
	}
	requireHandler(t, "Work", cfg, args.Kind())
	w := newWorker(t, "Work", pool, cfg)
	res, err := fenceq.Enqueue(ctx, pool, args, opts)
	if err != nil {
		t.Fatalf("fenceqtest: Work: %v", err)
	}
	if res.Existing {
		t.Fatalf("fenceqtest: Work: the unique key %q matched job %d, %s already: use WorkJob to run an existing job",
			*res.Job.UniqueKey, res.Job.ID, res.Job.State)
	}
	return workJob(ctx, t, "Work", pool, w, res.Job.ID)
}

// WorkJob runs one enqueued, available job at once, on the calling goroutine, the way
// a worker with cfg runs it (fenceq.Worker.RunJob): it claims the job with the worker's
// own claim (a real lease: the generation grows, leased_by is the worker's ID), runs the
// handler cfg.Handlers
// registers for its kind under that lease (Job.Commit and Job.WithLease are fenced, the
// lease is heartbeated while the handler runs, its context is cancelled as a worker's
// would be), and writes the outcome with the worker's own fenced writes: completion
// (unless the handler's Commit completed it), failure with the configured backoff
// (discarded after the last attempt), snooze, cancel or discard. cfg.Hooks and
// cfg.Logger receive what they would from a worker; cfg.Queues is not consulted.
//
// It returns the job's row after the outcome was written, and the error the handler
// returned (nil on success; a *fenceq.PanicError when it panicked). The test fails,
// before anything runs, when the job does not exist, is not available (scheduled,
// running, finished: make one available with fenceq.RetryJob), its queue is paused, or
// cfg registers no handler for its kind.
func WorkJob(ctx context.Context, t testing.TB, pool *pgxpool.Pool, cfg fenceq.Config, jobID int64) (*queue.JobRow, error) {
	t.Helper()
	if cfg.Handlers == nil {
		t.Fatalf("fenceqtest: WorkJob: cfg.Handlers is nil: register the job's handler with fenceq.AddHandler")
	}
	return workJob(ctx, t, "WorkJob", pool, newWorker(t, "WorkJob", pool, cfg), jobID)
}

// newWorker returns the worker whose execution machinery runs the job: never started,
// it claims nothing by itself and runs only what it is handed.
func newWorker(t testing.TB, fn string, pool *pgxpool.Pool, cfg fenceq.Config) *fenceq.Worker {
	t.Helper()
	w, err := fenceq.NewWorker(pool, cfg)
	if err != nil {
		t.Fatalf("fenceqtest: %s: %v", fn, err)
	}
	return w
}

func workJob(ctx context.Context, t testing.TB, fn string, pool *pgxpool.Pool, w *fenceq.Worker, jobID int64) (*queue.JobRow, error) {
	t.Helper()
	job, err := fenceq.GetJob(ctx, pool, jobID)
	if err != nil {
		t.Fatalf("fenceqtest: %s: %v", fn, err)
	}
	requireHandler(t, fn, w.Config(), job.Kind)
	if job.State != queue.StateAvailable {
		t.Fatalf("fenceqtest: %s: job %d (%s) is %s, not available (run at %s): only a job that is due now "+
			"can be worked; fenceq.RetryJob makes one available", fn, job.ID, job.Kind, job.State, job.RunAt.Format(time.RFC3339Nano))
	}
	res, err := w.RunJob(ctx, jobID)
	if err != nil {
		t.Fatalf("fenceqtest: %s: %v", fn, err)
	}
	return res.Job, res.HandlerErr
}

// requireHandler fails the test unless cfg registers a handler for kind.
func requireHandler(t testing.TB, fn string, cfg fenceq.Config, kind string) {
	t.Helper()
	if cfg.Handlers == nil {
		t.Fatalf("fenceqtest: %s: cfg.Handlers is nil: register the handler of %q with fenceq.AddHandler", fn, kind)
	}
	kinds := cfg.Handlers.Kinds()
	if !slices.Contains(kinds, kind) {
		slices.Sort(kinds)
		t.Fatalf("fenceqtest: %s: no handler for kind %q in cfg.Handlers (registered: %v)", fn, kind, kinds)
	}
}
