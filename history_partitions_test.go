package fenceq_test

import (
	"context"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

// historyCovered returns the first id that history's range partitions do not hold.
func historyCovered(t *testing.T, b *testBundle) int64 {
	t.Helper()
	var to int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT max(to_id) FROM fenceq_history_partitions()`).Scan(&to); err != nil {
		t.Fatal(err)
	}
	return to
}

// partitionOf names the partition of history that holds job id.
func partitionOf(t *testing.T, b *testBundle, id int64) string {
	t.Helper()
	var name string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT tableoid::regclass::text FROM fenceq_jobs_history WHERE id = $1`, id).Scan(&name); err != nil {
		t.Fatalf("job %d in history: %v", id, err)
	}
	return name
}

// A worker makes history's partitions ahead of the jobs it runs: once a job it started
// comes within reach of the first id they do not hold, its next maintenance pass makes
// more, so that the jobs after it finish into a partition of their own range, not into
// the default partition.
func TestWorkerMakesHistoryPartitionsAhead(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "a Citus distributed schema keeps one history table (docs/citus.md)")
	b := setup(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[echoArgs]) error { return nil }, nil)
	covered := historyCovered(t, b)
	// The next job takes an id a thousand below the first one not held.
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT setval(pg_get_serial_sequence('fenceq_jobs_hot', 'id'), $1)`, covered-1001); err != nil {
		t.Fatal(err)
	}
	b.startWorker(t, b.fastConfig(2*time.Second))
	first, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{Value: "near the end"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitState(t, b.db.Pool, first.Job.ID, queue.StateCompleted, 10*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for historyCovered(t, b) == covered {
		if time.Now().After(deadline) {
			t.Fatalf("history's partitions still end at %d after the worker ran job %d", covered, first.Job.ID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := historyCovered(t, b); got < first.Job.ID+2_000_000 {
		t.Fatalf("partitions made to %d, want at least two million ids past job %d", got, first.Job.ID)
	}
	if p := partitionOf(t, b, first.Job.ID); p == "fenceq_jobs_history_default" {
		t.Fatalf("job %d finished into %s", first.Job.ID, p)
	}
	// A job past the old end finishes into the partition made for it.
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT setval(pg_get_serial_sequence('fenceq_jobs_hot', 'id'), $1)`, covered+10); err != nil {
		t.Fatal(err)
	}
	next, err := fenceq.Enqueue(b.ctx, b.db.Pool, echoArgs{Value: "past the old end"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitState(t, b.db.Pool, next.Job.ID, queue.StateCompleted, 10*time.Second)
	var from, to int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT p.from_id, p.to_id FROM fenceq_history_partitions() p
		WHERE p.name = $1`, partitionOf(t, b, next.Job.ID)).Scan(&from, &to); err != nil {
		t.Fatalf("job %d is not in a range partition: %v", next.Job.ID, err)
	}
	if next.Job.ID < from || next.Job.ID >= to {
		t.Fatalf("job %d in the partition of ids %d–%d", next.Job.ID, from, to)
	}
}
