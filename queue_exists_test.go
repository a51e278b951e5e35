package fenceq_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// QueueExists knows a queue by its settings, a job in the hot set, a worker serving it,
// or a job finished within the window, and nothing else; asking writes nothing.
func TestQueueExists(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := b.db.Pool
	exists := func(name string, within time.Duration) bool {
		t.Helper()
		ok, err := fenceq.QueueExists(b.ctx, db, name, within)
		if err != nil {
			t.Fatalf("QueueExists(%q): %v", name, err)
		}
		return ok
	}
	if exists("nobody", time.Hour) {
		t.Fatal("a queue nothing uses exists")
	}
	var rows int
	if err := db.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_queues`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("asking wrote %d settings rows (%v)", rows, err)
	}
	if err := fenceq.AddQueue(b.ctx, db, "settings"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Insert(b.ctx, db, store.InsertParams{Kind: "noop", Queue: "waiting"}); err != nil {
		t.Fatal(err)
	}
	if err := store.RegisterWorker(b.ctx, db, "w1", "host", 1, []string{"served"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Insert(b.ctx, db, store.InsertParams{Kind: "noop", Queue: "done"}); err != nil {
		t.Fatal(err)
	}
	js, err := store.Claim(b.ctx, db, store.ClaimParams{Queue: "done", WorkerID: "w1", Limit: 1, Lease: time.Minute})
	if err != nil || len(js) != 1 {
		t.Fatalf("claim: %v, %d jobs", err, len(js))
	}
	if err := store.Complete(b.ctx, db, store.LeaseOf(js[0])); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"settings", "waiting", "served", "done"} {
		if !exists(q, time.Hour) {
			t.Errorf("queue %s does not exist", q)
		}
	}
	// Finished jobs count only within the window; 0 does not look at them.
	if exists("done", 0) {
		t.Error("a queue with only finished jobs exists with no window")
	}
	// On Citus the finished job is still in the hot set (finished in place until moved).
	for _, table := range []string{"fenceq_jobs_history", "fenceq_jobs_hot"} {
		if _, err := db.Exec(b.ctx, `UPDATE `+table+` SET finished_at = now() - interval '2 hours' WHERE queue = 'done' AND finished_at IS NOT NULL`); err != nil {
			t.Fatal(err)
		}
	}
	if exists("done", time.Hour) || !exists("done", 3*time.Hour) {
		t.Error("the window does not bound the finished jobs looked at")
	}
	if _, err := fenceq.QueueExists(b.ctx, db, "bad name", time.Hour); !errors.Is(err, queue.ErrInvalid) {
		t.Errorf("an invalid name: %v; want ErrInvalid", err)
	}
	if _, err := fenceq.QueueExists(b.ctx, db, "done", -time.Second); !errors.Is(err, queue.ErrInvalid) {
		t.Errorf("a negative window: %v; want ErrInvalid", err)
	}
}
