package fenceq_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

type testBundle struct {
	db  *fenceqtest.DB
	ctx context.Context
	hs  *fenceq.Handlers
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	db := fenceqtest.New(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE results (job_id bigint NOT NULL, lease_gen bigint NOT NULL, value text NOT NULL, UNIQUE (job_id))`); err != nil {
		t.Fatal(err)
	}
	return &testBundle{db: db, ctx: ctx, hs: fenceq.NewHandlers()}
}

// fastConfig is a worker config with a short lease, for tests.
// tracedPool is a pool of maxConns connections to the test's schema whose statements
// are reported to tracer.
func (b *testBundle) tracedPool(t *testing.T, tracer pgx.QueryTracer, maxConns int32) *pgxpool.Pool {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.Tracer = tracer
	pcfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(b.ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (b *testBundle) fastConfig(lease time.Duration) fenceq.Config {
	return fenceq.Config{
		Handlers:       b.hs,
		LeaseDuration:  lease,
		ReaperInterval: lease / 4,
		PollInterval:   50 * time.Millisecond,
		Logger:         fenceqtest.QuietLogger(),
	}
}

func (b *testBundle) startWorker(t *testing.T, cfg fenceq.Config) *fenceq.Worker {
	t.Helper()
	return fenceqtest.StartWorker(b.ctx, t, b.db.Pool, cfg)
}

type echoArgs struct {
	Value string `json:"value"`
}

func (echoArgs) Kind() string { return "echo" }

func TestWorkerRunsJobsWithFencedCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ran atomic.Int64
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error {
		ran.Add(1)
		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO results (job_id, lease_gen, value) VALUES ($1, $2, $3)`,
				job.ID, job.Lease().Gen, job.Args.Value)
			return err
		})
	}, nil)
	b.startWorker(t, b.fastConfig(2*time.Second))
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{Value: "hello"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, 10*time.Second)
	var v string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT value FROM results WHERE job_id = $1`, res.Job.ID).Scan(&v); err != nil || v != "hello" {
		t.Fatalf("result row: %q %v", v, err)
	}
	if ran.Load() != 1 {
		t.Fatalf("handler ran %d times", ran.Load())
	}
}

// CommitWrites commits the queued statements, the recorded output and the completion
// together; a statement that fails writes nothing and fails the attempt with its error.
func TestWorkerRunsJobsWithCommitWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error {
		if err := fenceq.RecordOutput(ctx, map[string]string{"echo": job.Args.Value}); err != nil {
			return err
		}
		w := &fenceq.Writes{}
		w.Exec(`INSERT INTO results (job_id, lease_gen, value) VALUES ($1, $2, $3)`, job.ID, job.Lease().Gen, job.Args.Value)
		return job.CommitWrites(ctx, w)
	}, nil)
	ok, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{Value: "hello"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	clash, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{Value: "clash"}, &fenceq.InsertOpts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	// A result row of the second job exists already: its write violates UNIQUE (job_id).
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO results (job_id, lease_gen, value) VALUES ($1, 0, 'before')`, clash.Job.ID); err != nil {
		t.Fatal(err)
	}
	b.startWorker(t, b.fastConfig(2*time.Second))
	got := fenceqtest.WaitState(t, b.db.Pool, ok.Job.ID, queue.StateCompleted, 10*time.Second)
	if string(got.Output) != `{"echo": "hello"}` {
		t.Fatalf("output %s", got.Output)
	}
	var v string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT value FROM results WHERE job_id = $1`, ok.Job.ID).Scan(&v); err != nil || v != "hello" {
		t.Fatalf("result row: %q %v", v, err)
	}
	failed := fenceqtest.WaitState(t, b.db.Pool, clash.Job.ID, queue.StateDiscarded, 10*time.Second)
	if len(failed.Errors) != 1 || !strings.Contains(failed.Errors[0].Error, "write 1") || failed.Output != nil {
		t.Fatalf("failed job: errors %+v, output %s", failed.Errors, failed.Output)
	}
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT value FROM results WHERE job_id = $1`, clash.Job.ID).Scan(&v); err != nil || v != "before" {
		t.Fatalf("the failed commit changed the result row: %q %v", v, err)
	}
}

// A queue whose slots are all taken waits for one to free; the job that frees it wakes
// the claim loop, so the backlog is worked without waiting for the next poll (an hour
// here) or a notification (off).
func TestFreedSlotWakesClaimLoopWaitingForOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil)
	const n = 5
	ids := make([]int64, n)
	for i := range ids {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{Value: "x"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = res.Job.ID
	}
	cfg := b.fastConfig(5 * time.Second)
	cfg.PollInterval = time.Hour
	cfg.DisableListen = true
	cfg.Queues = map[string]fenceq.QueueConfig{"default": {MaxWorkers: 1}}
	b.startWorker(t, cfg)
	for _, id := range ids {
		fenceqtest.WaitState(t, b.db.Pool, id, queue.StateCompleted, 10*time.Second)
	}
}
