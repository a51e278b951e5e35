package fenceq_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

type gateArgs struct {
	N int `json:"n"`
}

func (gateArgs) Kind() string { return "gate" }

// gates lets a test hold jobs in their handlers and count how many run at once.
type gates struct {
	mu      sync.Mutex
	running map[int]chan struct{}
	max     int
}

func (g *gates) handler(ctx context.Context, job *fenceq.Job[gateArgs]) error {
	release := make(chan struct{})
	g.mu.Lock()
	g.running[job.Args.N] = release
	g.max = max(g.max, len(g.running))
	g.mu.Unlock()
	select {
	case <-release:
	case <-ctx.Done():
	}
	g.mu.Lock()
	delete(g.running, job.Args.N)
	g.mu.Unlock()
	return ctx.Err()
}

func (g *gates) count() (running, maxRunning int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.running), g.max
}

func (g *gates) release(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.running[n])
}

func workerQueues(t *testing.T, b *testBundle, id string) []string {
	t.Helper()
	var qs []string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT queues FROM fenceq_workers WHERE id = $1`, id).Scan(&qs); err != nil {
		t.Fatal(err)
	}
	return qs
}

// Queues are added, resized and removed on a running worker. A removed queue is no
// longer claimed from, while its running job keeps its lease (heartbeated) and
// completes; fenceq_workers.queues follows every change. The package's goleak check
// proves no claim loop outlives Stop.
func TestQueuesAtRuntime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := &gates{running: map[int]chan struct{}{}}
	fenceq.AddHandler(b.hs, g.handler, nil)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil)
	cfg := b.fastConfig(2 * time.Second)
	cfg.ID = "rt"
	cfg.Queues = map[string]fenceq.QueueConfig{"a": {MaxWorkers: 1}}
	w := b.startWorker(t, cfg)
	enqueue := func(args fenceq.JobArgs, q string) int64 {
		t.Helper()
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, args, &fenceq.InsertOpts{Queue: q})
		if err != nil {
			t.Fatal(err)
		}
		return res.Job.ID
	}

	// Added: worked at once, and listed.
	if err := w.AddQueue(b.ctx, "b", fenceq.QueueConfig{MaxWorkers: 2}); err != nil {
		t.Fatal(err)
	}
	if qs := workerQueues(t, b, "rt"); !slices.Equal(qs, []string{"a", "b"}) {
		t.Fatalf("queues after add: %v", qs)
	}
	if got := w.Config().Queues["b"].MaxWorkers; got != 2 {
		t.Fatalf("Config().Queues[b] = %d", got)
	}
	gated := []int64{enqueue(gateArgs{N: 1}, "b"), enqueue(gateArgs{N: 2}, "b"), enqueue(gateArgs{N: 3}, "b")}
	fenceqtest.WaitFor(t, "two gated jobs running in b", 10*time.Second, func() bool { n, _ := g.count(); return n == 2 })
	if j, _ := store.GetJob(b.ctx, b.db.Pool, gated[2]); j.State != queue.StateAvailable {
		t.Fatalf("third job of b is %s with 2 slots taken", j.State)
	}
	// Resized: the third starts without any job finishing.
	if err := w.SetQueueConcurrency("b", 3); err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitFor(t, "three gated jobs running in b", 10*time.Second, func() bool { n, _ := g.count(); return n == 3 })
	g.release(2)
	g.release(3)
	fenceqtest.WaitState(t, b.db.Pool, gated[1], queue.StateCompleted, 10*time.Second)
	fenceqtest.WaitState(t, b.db.Pool, gated[2], queue.StateCompleted, 10*time.Second)

	// Removed while job 1 runs: RemoveQueue returns, the job keeps being heartbeated.
	if err := w.RemoveQueue(b.ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if qs := workerQueues(t, b, "rt"); !slices.Equal(qs, []string{"a"}) || !slices.Equal(w.Queues(), []string{"a"}) {
		t.Fatalf("queues after remove: row %v, worker %v", qs, w.Queues())
	}
	var hb0 time.Time
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT heartbeat_at FROM fenceq_jobs WHERE id = $1`, gated[0]).Scan(&hb0); err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitFor(t, "a heartbeat of the removed queue's running job", 10*time.Second, func() bool {
		var hb time.Time
		err := b.db.Pool.QueryRow(b.ctx, `SELECT heartbeat_at FROM fenceq_jobs WHERE id = $1`, gated[0]).Scan(&hb)
		return err == nil && hb.After(hb0)
	})
	// Still nothing claimed from b: a job of b waits while a job of a, enqueued after
	// it, is worked.
	later := enqueue(echoArgs{Value: "b"}, "b")
	fenceqtest.WaitState(t, b.db.Pool, enqueue(echoArgs{Value: "a"}, "a"), queue.StateCompleted, 10*time.Second)
	g.release(1)
	if j := fenceqtest.WaitState(t, b.db.Pool, gated[0], queue.StateCompleted, 10*time.Second); j.LeaseGen != 1 {
		t.Fatalf("the removed queue's job completed at generation %d, want 1 (never revoked)", j.LeaseGen)
	}
	if j, _ := store.GetJob(b.ctx, b.db.Pool, later); j.State != queue.StateAvailable || j.Attempt != 0 {
		t.Fatalf("job of the removed queue: %s attempt %d", j.State, j.Attempt)
	}

	// Added again: the waiting job runs.
	if err := w.AddQueue(b.ctx, "b", fenceq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitState(t, b.db.Pool, later, queue.StateCompleted, 10*time.Second)

	if err := w.AddQueue(b.ctx, "b", fenceq.QueueConfig{}); err == nil {
		t.Fatal("adding a served queue twice succeeded")
	}
	if err := w.AddQueue(b.ctx, "bad name", fenceq.QueueConfig{}); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("add of an invalid name: %v", err)
	}
	if err := w.RemoveQueue(b.ctx, "nope"); !errors.Is(err, fenceq.ErrUnknownQueue) {
		t.Fatalf("remove of an unknown queue: %v", err)
	}
	if err := w.SetQueueConcurrency("b", 0); err == nil {
		t.Fatal("concurrency 0 accepted")
	}
	if err := w.SetQueueConcurrency("nope", 1); !errors.Is(err, fenceq.ErrUnknownQueue) {
		t.Fatalf("resize of an unknown queue: %v", err)
	}
	if _, m := g.count(); m != 3 {
		t.Fatalf("at most %d gated jobs ran at once, want 3", m)
	}
}

// Before Start, the changes shape what Start serves; after Stop they are refused.
func TestQueuesBeforeStartAndAfterStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil)
	cfg := b.fastConfig(2 * time.Second)
	cfg.ID = "pre"
	w, err := fenceq.NewWorker(b.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddQueue(b.ctx, "x", fenceq.QueueConfig{MaxWorkers: 3}); err != nil {
		t.Fatal(err)
	}
	if err := w.RemoveQueue(b.ctx, "default"); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	if qs := workerQueues(t, b, "pre"); !slices.Equal(qs, []string{"x"}) {
		t.Fatalf("registered queues %v, want [x]", qs)
	}
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{}, &fenceq.InsertOpts{Queue: "x"})
	if err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, 10*time.Second)
	if err := w.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.AddQueue(b.ctx, "y", fenceq.QueueConfig{}); err == nil {
		t.Fatal("AddQueue after Stop succeeded")
	}
	if err := w.RemoveQueue(b.ctx, "x"); err == nil {
		t.Fatal("RemoveQueue after Stop succeeded")
	}
}
