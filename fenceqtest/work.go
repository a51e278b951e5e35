package fenceqtest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/testhooks"
	"github.com/fenceq/fenceq/queue"
)

// Work enqueues args as one job (opts as for fenceq.Enqueue, nil for none) and runs it
// at once, on the calling goroutine, as a worker with cfg would: see WorkJob. It returns
// the job's row once its outcome is written, and the handler's error.
//
// The job must be due now: a RunAt or RunIn in the future, or a unique key that matches
// an unfinished job, fails the test.
func Work(ctx context.Context, t testing.TB, pool *pgxpool.Pool, cfg fenceq.Config, args fenceq.JobArgs,
	opts *fenceq.InsertOpts) (*fenceq.JobRow, error) {
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
// a worker with cfg runs it: it claims the job with queue.Claim (a real lease: the
// generation grows, leased_by is the worker's ID), runs the handler cfg.Handlers
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
// running, finished: make one available with queue.RetryJob), its queue is paused, or
// cfg registers no handler for its kind.
func WorkJob(ctx context.Context, t testing.TB, pool *pgxpool.Pool, cfg fenceq.Config, jobID int64) (*fenceq.JobRow, error) {
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

func workJob(ctx context.Context, t testing.TB, fn string, pool *pgxpool.Pool, w *fenceq.Worker, jobID int64) (*fenceq.JobRow, error) {
	t.Helper()
	job, err := queue.GetJob(ctx, pool, jobID)
	if err != nil {
		t.Fatalf("fenceqtest: %s: %v", fn, err)
	}
	requireHandler(t, fn, w.Config(), job.Kind)
	if job.State != fenceq.StateAvailable {
		t.Fatalf("fenceqtest: %s: job %d (%s) is %s, not available (run at %s): only a job that is due now "+
			"can be worked; queue.RetryJob makes one available", fn, job.ID, job.Kind, job.State, job.RunAt.Format(time.RFC3339Nano))
	}
	claimed, sent := claimOne(ctx, t, pool, w, job)
	handlerErr, err := testhooks.RunClaimed(ctx, w, claimed, sent)
	if err != nil {
		t.Fatalf("fenceqtest: %s: %v", fn, err)
	}
	after, err := queue.GetJob(ctx, pool, jobID)
	if err != nil {
		t.Fatalf("fenceqtest: %s: read the job after its attempt: %v", fn, err)
	}
	return after, handlerErr
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

// claimOne claims job, and only it, with the worker's own claim: from the job's queue,
// one job, starting just before the job's position in claim order (priority, run_at,
// id), so that no job of the queue ahead of it is taken instead. The claim runs in a
// transaction that commits only if it took this job. It returns the claimed row and the
// monotonic time the claim was sent, from which the worker's local lease deadline runs.
func claimOne(ctx context.Context, t testing.TB, pool *pgxpool.Pool, w *fenceq.Worker, job *fenceq.JobRow) (*fenceq.JobRow, time.Time) {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("fenceqtest: claim job %d: %v", job.ID, err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	sent := time.Now()
	rows, err := queue.Claim(ctx, tx, queue.ClaimParams{Queue: job.Queue, WorkerID: w.ID(), Limit: 1,
		Lease: w.Config().LeaseDuration,
		After: &queue.ClaimCursor{Priority: job.Priority, RunAt: job.RunAt, ID: job.ID - 1}})
	if err != nil {
		t.Fatalf("fenceqtest: claim job %d: %v", job.ID, err)
	}
	if len(rows) != 1 || rows[0].ID != job.ID {
		t.Fatalf("fenceqtest: claim job %d (%s): not claimable: its queue %q may be paused, or another worker "+
			"holds it", job.ID, job.Kind, job.Queue)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("fenceqtest: claim job %d: commit: %v", job.ID, err)
	}
	return rows[0], sent
}
