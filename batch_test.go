package fenceq_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

type batchDoneArgs struct {
	Order string `json:"order"`
}

func (batchDoneArgs) Kind() string { return "batch_done" }

// The last two jobs of a batch finish at the same instant in two transactions, one
// completed and one discarded, many times over: each time the callback is released
// exactly once, with the right counts.
func TestBatchCallbackOnceUnderRace(t *testing.T) {
	t.Parallel()
	b := setupFlow(t)
	for i := range 40 {
		batch := fenceq.NewBatch("race", batchDoneArgs{Order: "o"}, &fenceq.InsertOpts{Queue: "callbacks"})
		batch.Add(taskArgs{Name: "a"}, nil).Add(taskArgs{Name: "b"}, nil)
		res, err := batch.Enqueue(b.ctx, b.db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		cb, err := fenceq.GetJob(b.ctx, b.db.Pool, res.CallbackID)
		if err != nil || cb.State != queue.StatePending {
			t.Fatalf("callback after enqueue: %v %v, want pending", cb, err)
		}
		leases := claimAll(t, b.testBundle, 2)
		leases[1].JobID = -leases[1].JobID // discarded
		completeAtOnce(t, b.testBundle, leases)
		cb, err = fenceq.GetJob(b.ctx, b.db.Pool, res.CallbackID)
		if err != nil {
			t.Fatal(err)
		}
		counts, ok := fenceq.BatchOutcome(cb)
		if cb.State != queue.StateAvailable || !ok {
			t.Fatalf("iteration %d: callback %s with metadata %s, want available with the batch's counts", i, cb.State, cb.Metadata)
		}
		if counts != (queue.BatchCounts{ID: res.ID, Completed: 1, Discarded: 1}) {
			t.Fatalf("iteration %d: counts = %+v, want one completed and one discarded of batch %d", i, counts, res.ID)
		}
		var left int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT deps_left FROM fenceq_flow_jobs WHERE job_id = $1`, res.CallbackID).Scan(&left); err != nil || left != 0 {
			t.Fatalf("iteration %d: callback's deps_left = %d %v, want 0", i, left, err)
		}
	}
}

// A batch worked by two workers: the callback runs once, after every member finished,
// and reads the counts.
func TestBatchWithWorkers(t *testing.T) {
	t.Parallel()
	b := setupFlow(t)
	var calls atomic.Int64
	got := make(chan queue.BatchCounts, 2)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[batchDoneArgs]) error {
		calls.Add(1)
		c, _ := fenceq.BatchOutcome(job.JobRow)
		got <- c
		return nil
	}, nil)
	batch := fenceq.NewBatch("nightly", batchDoneArgs{}, nil)
	for i := range 20 {
		batch.Add(taskArgs{Name: "m", Fail: i%5 == 0}, nil)
	}
	res, err := batch.Enqueue(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	cfg := b.fastConfig(5 * time.Second)
	b.startWorker(t, cfg)
	b.startWorker(t, cfg)
	cb := fenceqtest.WaitState(t, b.db.Pool, res.CallbackID, queue.StateCompleted, 30*time.Second)
	c := recv(t, got, 5*time.Second, "the callback's counts")
	if c != (queue.BatchCounts{ID: res.ID, Completed: 16, Discarded: 4}) {
		t.Fatalf("counts = %+v, want 16 completed and 4 discarded", c)
	}
	for _, id := range res.JobIDs {
		j, err := fenceq.GetJob(b.ctx, b.db.Pool, id)
		if err != nil || !j.State.Final() || !cb.AttemptedAt.After(*j.FinishedAt) {
			t.Fatalf("member %d: %v %v; the callback started at %s", id, j, err, cb.AttemptedAt)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("callback ran %d times, want once", n)
	}
	w, err := fenceq.GetWorkflow(b.ctx, b.db.Pool, res.ID)
	if err != nil || w.Kind != queue.WorkflowKindBatch || len(w.Tasks) != 21 {
		t.Fatalf("batch as a workflow: %+v %v", w, err)
	}
}

// A batch member's holder pauses past its lease; the member is revoked, run again and
// completed by someone else; the stale holder's completion is rejected, and the
// callback is released once.
func TestBatchPausedHolderCannotReleaseTwice(t *testing.T) {
	t.Parallel()
	b := setupFlow(t)
	res, err := fenceq.NewBatch("one", batchDoneArgs{}, &fenceq.InsertOpts{Queue: "callbacks"}).
		Add(taskArgs{Name: "m"}, nil).Enqueue(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	stale := claimAll(t, b.testBundle, 1)[0]
	// The holder pauses; an operator (or the reaper) revokes its lease.
	if _, err := fenceq.RequeueJob(b.ctx, b.db.Pool, stale.JobID); err != nil {
		t.Fatal(err)
	}
	fresh := claimAll(t, b.testBundle, 1)[0]
	if err := store.Complete(b.ctx, b.db.Pool, fresh); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(b.ctx, b.db.Pool, stale); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("stale holder's completion: %v, want ErrLeaseLost", err)
	}
	if _, err := store.Fail(b.ctx, b.db.Pool, stale, store.FailParams{Err: "x", Discard: true}); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("stale holder's discard: %v, want ErrLeaseLost", err)
	}
	cb, err := fenceq.GetJob(b.ctx, b.db.Pool, res.CallbackID)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := fenceq.BatchOutcome(cb); cb.State != queue.StateAvailable || c.Completed != 1 || c.Discarded != 0 {
		t.Fatalf("callback %s with counts %+v (%v), want available with one completed", cb.State, c, ok)
	}
}
