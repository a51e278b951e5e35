package fenceq_test

import (
	"context"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

type backlogArgs struct {
	N int `json:"n"`
}

func (backlogArgs) Kind() string { return "backlog" }

// Under a continuous backlog the worker claims after the position where its last claim
// ended (the claim cursor). A job that becomes available behind that position — here a
// more urgent one — must still be claimed within about PollInterval, not only once the
// backlog is gone; and every job must run exactly once.
func TestWorkerClaimsBehindItsCursorUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const backlog = 400
	seen := make(chan int, backlog+1)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[backlogArgs]) error {
		seen <- job.Args.N
		time.Sleep(5 * time.Millisecond)
		return nil
	}, nil)
	items := make([]fenceq.EnqueueItem, backlog)
	for i := range items {
		items[i] = fenceq.EnqueueItem{Args: backlogArgs{N: i + 1}}
	}
	if n, err := fenceq.EnqueueMany(b.ctx, b.db.Pool, items); err != nil || n != backlog {
		t.Fatalf("enqueue backlog: %d %v", n, err)
	}
	cfg := b.fastConfig(5 * time.Second)
	cfg.Queues = map[string]fenceq.QueueConfig{"default": {MaxWorkers: 4}}
	b.startWorker(t, cfg)

	// Wait until the worker is well into the backlog (its cursor is past the start).
	for got := 0; got < 40; got++ {
		select {
		case <-seen:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d backlog jobs ran", got)
		}
	}
	// Priority 0 sorts before every backlog job, i.e. behind the worker's cursor.
	urgent, err := fenceq.Enqueue(b.ctx, b.db.Pool, backlogArgs{N: 0}, &fenceq.InsertOpts{Priority: new(0)})
	if err != nil {
		t.Fatal(err)
	}
	if urgent.Job.Priority != 0 {
		t.Fatalf("urgent job enqueued at priority %d, want 0", urgent.Job.Priority)
	}
	done := fenceqtest.WaitState(t, b.db.Pool, urgent.Job.ID, queue.StateCompleted, 10*time.Second)
	var left int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE state = 'available' AND finished_at IS NULL AND created_at <= $1`,
		done.FinishedAt).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left == 0 {
		t.Fatalf("the urgent job behind the cursor completed only after the whole backlog")
	}
	// Every job runs exactly once.
	for i := 0; i < backlog-40+1; i++ {
		select {
		case <-seen:
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d of the remaining jobs ran", i)
		}
	}
	var once, total int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var completed int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE state = 'completed'),
			count(*) FILTER (WHERE state = 'completed' AND attempt = 1 AND lease_gen = 1), count(*) FROM fenceq_jobs`).
			Scan(&completed, &once, &total); err != nil {
			t.Fatal(err)
		}
		if completed == total || time.Now().After(deadline) {
			break
		}
	}
	if once != backlog+1 || total != backlog+1 {
		t.Fatalf("%d of %d jobs completed at their first and only claim, want %d", once, total, backlog+1)
	}
}
