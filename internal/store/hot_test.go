package store_test

import (
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// tableOf says which table holds job id: "hot" or "history".
func (b *testBundle) tableOf(t *testing.T, id int64) string {
	t.Helper()
	var hot, hist bool
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM fenceq_jobs_hot WHERE id = $1),
		EXISTS (SELECT 1 FROM fenceq_jobs_history WHERE id = $1)`, id).Scan(&hot, &hist); err != nil {
		t.Fatal(err)
	}
	switch {
	case hot && hist:
		t.Fatalf("job %d is in both tables", id)
	case hot:
		return "hot"
	case hist:
		return "history"
	}
	return "none"
}

// Every finishing write moves its job to history, fenced; a job that holds its unique
// key in its final state stays hot, where the unique index is; retry brings a job back.
func TestFinishedJobsMoveToHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	kept := b.insert(t, store.InsertParams{UniqueKey: "kept", Unique: queue.UniqueOpts{ByState: queue.JobStates()[:]}})
	for range 3 {
		b.insert(t, store.InsertParams{})
	}
	jobs := b.claim(t, "w", 4, time.Minute)
	if len(jobs) != 4 {
		t.Fatalf("claimed %d", len(jobs))
	}
	byID := map[int64]queue.Lease{}
	for _, j := range jobs {
		byID[j.ID] = store.LeaseOf(j)
	}
	var others []queue.Lease
	for id, l := range byID {
		if id != kept.ID {
			others = append(others, l)
		}
	}
	if err := store.Complete(b.ctx, b.db.Pool, byID[kept.ID]); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(b.ctx, b.db.Pool, others[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Fail(b.ctx, b.db.Pool, others[1], store.FailParams{Err: "boom", Discard: true}); err != nil {
		t.Fatal(err)
	}
	if err := store.Cancel(b.ctx, b.db.Pool, others[2], "no"); err != nil {
		t.Fatal(err)
	}
	if got := b.tableOf(t, kept.ID); got != "hot" {
		t.Fatalf("completed job holding its key in completed is in %s, want hot", got)
	}
	for _, l := range others {
		if got := b.tableOf(t, l.JobID); got != "history" {
			t.Fatalf("finished job %d is in %s, want history (state %s)", l.JobID, got, b.job(t, l.JobID).State)
		}
	}
	// The key is still held: a second job with it is not inserted.
	res, err := store.Insert(b.ctx, b.db.Pool, store.InsertParams{Kind: "test", UniqueKey: "kept", Unique: queue.UniqueOpts{ByState: queue.JobStates()[:]}})
	if err != nil || !res.Existing || res.Job.ID != kept.ID {
		t.Fatalf("insert with the key held by a completed job: %+v %v", res, err)
	}
	// A stale completion of a moved job is rejected, not applied again.
	if err := store.Complete(b.ctx, b.db.Pool, queue.Lease{JobID: others[2].JobID, Gen: others[2].Gen, Holder: "w"}); err == nil {
		t.Fatal("completion of a cancelled job's lease succeeded")
	}
	// Retry moves a job in history back to the hot set.
	if _, err := store.RetryJob(b.ctx, b.db.Pool, others[1].JobID); err != nil {
		t.Fatal(err)
	}
	if got := b.tableOf(t, others[1].JobID); got != "hot" || b.job(t, others[1].JobID).State != queue.StateAvailable {
		t.Fatalf("retried job in %s", got)
	}
}

// MoveFinished moves the finished jobs left in the hot set (Citus finishes in place) to
// history, except those that hold their unique key.
func TestMoveFinished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.db.Pool.Exec(b.ctx, `
INSERT INTO fenceq_jobs_hot (kind, state, finished_at, unique_key, unique_states) VALUES
    ('k', 'completed', now(), NULL, NULL), ('k', 'discarded', now(), NULL, NULL),
    ('k', 'cancelled', now(), 'freed', 15), ('k', 'completed', now(), 'kept', 16),
    ('k', 'available', NULL, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	n, err := store.MoveFinished(b.ctx, b.db.Pool, 2)
	if err != nil || n != 2 {
		t.Fatalf("first batch moved %d: %v, want 2 (the limit)", n, err)
	}
	if n, err = store.MoveFinished(b.ctx, b.db.Pool, 10); err != nil || n != 1 {
		t.Fatalf("second batch moved %d: %v, want 1", n, err)
	}
	var hot, hist int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM fenceq_jobs_hot), (SELECT count(*) FROM fenceq_jobs_history)`).Scan(&hot, &hist); err != nil {
		t.Fatal(err)
	}
	if hot != 2 || hist != 3 {
		t.Fatalf("hot %d, history %d; want 2 (the available job and the one keeping its key) and 3", hot, hist)
	}
}
