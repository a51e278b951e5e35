package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

func TestListJobsPageKeyset(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ids []int64
	for i := range 10 {
		kind := "common"
		if i == 1 {
			kind = "rare"
		}
		ids = append(ids, b.insert(t, store.InsertParams{Kind: kind, Args: []byte(`{"who": "Ada Lovelace"}`)}).ID)
	}
	// Keyset pages, newest first, Next continuing below the last id.
	var seen []int64
	var before int64
	for range 5 {
		pg, err := store.ListJobsPage(b.ctx, b.db.Pool, queue.ListParams{Limit: 4, BeforeID: before})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range pg.Jobs {
			seen = append(seen, j.ID)
		}
		if pg.Next == 0 {
			break
		}
		before = pg.Next
	}
	if len(seen) != 10 || seen[0] != ids[9] || seen[9] != ids[0] {
		t.Fatalf("pages: %v", seen)
	}
	// A filter pages by keyset too, however far apart its matches are.
	pg, err := store.ListJobsPage(b.ctx, b.db.Pool, queue.ListParams{JobFilter: queue.JobFilter{Kind: "rare"}, Limit: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(pg.Jobs) != 1 || pg.Jobs[0].ID != ids[1] || pg.Next != 0 {
		t.Fatalf("rare kind: %d jobs, next %d", len(pg.Jobs), pg.Next)
	}
	// Args containment.
	got, err := store.ListJobs(b.ctx, b.db.Pool, queue.ListParams{JobFilter: queue.JobFilter{Args: []byte(`{"who": "Ada Lovelace"}`)}, Limit: 100})
	if err != nil || len(got) != 10 {
		t.Fatalf("args search: %d jobs, %v", len(got), err)
	}
	for _, p := range []queue.ListParams{{BeforeID: -1}, {JobFilter: queue.JobFilter{Args: []byte(`"ada"`)}}, {JobFilter: queue.JobFilter{Error: "a\x00b"}}} {
		if _, err := store.ListJobsPage(b.ctx, b.db.Pool, p); !errors.Is(err, queue.ErrInvalid) {
			t.Errorf("ListJobsPage(%+v): %v; want ErrInvalid", p, err)
		}
	}
}

func TestCountQueuesAndThroughput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 3 {
		b.insert(t, store.InsertParams{})
	}
	b.insert(t, store.InsertParams{RunIn: time.Hour})
	b.insert(t, store.InsertParams{Queue: "billing"})
	if err := store.SetQueuePaused(b.ctx, b.db.Pool, "quiet", true); err != nil {
		t.Fatal(err)
	}
	js := b.claim(t, "w", 2, time.Minute)
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(js[0])); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(js[1]), store.FailParams{Err: "x", Backoff: time.Hour}); err != nil {
		t.Fatal(err)
	}
	b.rollUpToNow(t)
	c, err := store.CountQueues(b.ctx, b.db.Pool, queue.CountParams{})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]queue.QueueCount{}
	for _, q := range c.Queues {
		byName[q.Name] = q
	}
	d := byName["default"]
	if d.Unfinished[queue.StateAvailable] != 1 || d.Unfinished[queue.StateScheduled] != 1 ||
		d.Unfinished[queue.StateRetryable] != 1 || d.Finished[queue.StateCompleted] != 1 {
		t.Errorf("default: %+v", d)
	}
	if byName["billing"].Unfinished[queue.StateAvailable] != 1 || !byName["quiet"].Paused || len(c.Queues) != 3 {
		t.Errorf("queues: %+v", c.Queues)
	}
	// With a cap of 1, the groups that hold more stop there and say so.
	c, err = store.CountQueues(b.ctx, b.db.Pool, queue.CountParams{Cap: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Capped) == 0 {
		t.Errorf("cap 1: nothing reported capped: %+v", c)
	}

	tp, err := store.ReadThroughput(b.ctx, b.db.Pool, queue.CountParams{Window: time.Hour}, 60)
	if err != nil {
		t.Fatal(err)
	}
	var completed, failed int64
	for _, bk := range tp.Buckets {
		completed += bk.Completed
		failed += bk.Failed
	}
	last := tp.Buckets[59]
	if completed != 1 || failed != 1 || last.Completed != 1 || last.Failed != 1 {
		t.Errorf("throughput: %d completed, %d failed, last bucket %+v", completed, failed, last)
	}
	if !last.Start.Before(tp.Now) || tp.Now.Sub(last.Start) > time.Minute || tp.Bucket != time.Minute {
		t.Errorf("last bucket starts %s, now %s", last.Start, tp.Now)
	}
	for _, w := range []time.Duration{time.Second, 90 * time.Minute} {
		if _, err := store.ReadThroughput(b.ctx, b.db.Pool, queue.CountParams{Window: w}, 60); !errors.Is(err, queue.ErrInvalid) {
			t.Errorf("window %s in 60 buckets (not whole minutes): %v", w, err)
		}
	}
	if _, err := store.CountQueues(b.ctx, b.db.Pool, queue.CountParams{Window: -time.Second}); !errors.Is(err, queue.ErrInvalid) {
		t.Errorf("negative window: %v", err)
	}
}

func TestReadActivitySeesAnOpenTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, err := tx.Exec(b.ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	var started time.Time
	if err := tx.QueryRow(b.ctx, `SELECT now()`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	a, err := store.ReadActivity(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if a.OldestTransactionAge <= 0 || a.IdleInTransaction < 1 {
		t.Fatalf("activity %+v with a transaction idle since %s", a, started)
	}
}
