package store_test

import (
	"sync"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// A queue's limit holds across concurrent claimers: the ordinary claim leaves the queue
// out, the claims under its lock never run more than the limit together, a completion
// and a revocation each make room at once, and removing the limit gives the queue back
// to the ordinary claim.
func TestQueueLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 20 {
		b.insert(t, store.InsertParams{Kind: "k", Queue: "lim"})
	}
	if err := store.SetQueueLimit(b.ctx, b.db.Pool, "lim", 3); err != nil {
		t.Fatal(err)
	}
	if err := store.SetQueueLimit(b.ctx, b.db.Pool, "lim", -1); err == nil {
		t.Fatal("a negative limit was accepted")
	}
	if jobs, err := store.ClaimMany(b.ctx, b.db.Pool, store.ClaimManyParams{WorkerID: "w", Lease: time.Minute,
		Queues: []store.QueueClaim{{Name: "lim", Limit: 10}}}); err != nil || len(jobs) != 0 {
		t.Fatalf("the ordinary claim of a limited queue: %d jobs, %v; want none", len(jobs), err)
	}
	claim := func(n int) []*queue.JobRow {
		jobs, err := store.ClaimInQueueLimit(b.ctx, b.db.Pool, store.ClaimInQueueLimitParams{Queue: "lim", WorkerID: "w",
			Lease: time.Minute, Limit: n})
		if err != nil {
			t.Error(err)
		}
		return jobs
	}
	// Eight claimers at once, each wanting two: three jobs in all.
	var mu sync.Mutex
	var held []*queue.JobRow
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := claim(2)
			mu.Lock()
			held = append(held, got...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(held) != 3 {
		t.Fatalf("concurrent claims under a limit of 3 took %d jobs", len(held))
	}
	if got := claim(5); len(got) != 0 {
		t.Fatalf("a full queue gave %d more", len(got))
	}
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(held[0])); err != nil {
		t.Fatal(err)
	}
	if _, err := store.RequeueJob(b.ctx, b.db.Pool, held[1].ID); err != nil {
		t.Fatal(err)
	}
	if got := claim(5); len(got) != 2 {
		t.Fatalf("after a completion and a revocation: %d jobs, want 2", len(got))
	}
	if err := store.SetQueueLimit(b.ctx, b.db.Pool, "lim", 0); err != nil {
		t.Fatal(err)
	}
	if jobs, err := store.ClaimMany(b.ctx, b.db.Pool, store.ClaimManyParams{WorkerID: "w", Lease: time.Minute,
		Queues: []store.QueueClaim{{Name: "lim", Limit: 4}}}); err != nil || len(jobs) != 4 {
		t.Fatalf("the ordinary claim once the limit is gone: %d jobs, %v; want 4", len(jobs), err)
	}
}
