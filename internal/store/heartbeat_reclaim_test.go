package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// oldAndNewLease claims a job, revokes that lease (an operator's requeue) and claims
// the job again, as one worker can while its old attempt still runs.
func oldAndNewLease(ctx context.Context, t *testing.T, db *fenceqtest.DB) (old, cur queue.Lease) {
	t.Helper()
	if _, err := store.Insert(ctx, db.Pool, store.InsertParams{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	claim := func() queue.Lease {
		t.Helper()
		rows, err := store.Claim(ctx, db.Pool, store.ClaimParams{Queue: "default", WorkerID: "w", Limit: 1, Lease: time.Minute})
		if err != nil || len(rows) != 1 {
			t.Fatalf("claim: %v %v", rows, err)
		}
		return store.LeaseOf(rows[0])
	}
	old = claim()
	if _, err := store.RequeueJob(ctx, db.Pool, old.JobID); err != nil {
		t.Fatal(err)
	}
	return old, claim()
}

// TestHeartbeatOldAndNewLeaseOfOneJob: a worker whose lease was revoked (operator
// requeue, or expiry during a pause) can claim the same job again while the old
// attempt still runs. One heartbeat then carries both leases; the old one must come
// back lost (so its attempt is cancelled), the new one renewed.
func TestHeartbeatOldAndNewLeaseOfOneJob(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	old, cur := oldAndNewLease(ctx, t, db)
	if cur.Gen <= old.Gen {
		t.Fatalf("new generation %d not above old %d", cur.Gen, old.Gen)
	}
	for _, order := range [][]queue.Lease{{old, cur}, {cur, old}} {
		res, err := store.Heartbeat(ctx, db.Pool, "w", order, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Lost) != 1 || res.Lost[0] != old || len(res.Renewed) != 1 || res.Renewed[0] != cur {
			t.Fatalf("heartbeat of %v: renewed %v lost %v; want renewed %v lost %v", order, res.Renewed, res.Lost, cur, old)
		}
	}
}

// TestHeartbeatAfterOwnWriteLanded: a worker's snapshot of its leases can include a job
// whose own completion (or failure, snooze, release) lands just before the heartbeat
// runs. That lease ended by the holder's write: it must come back finished, not lost
// (lost would cancel the handler and record a false heartbeat_lost event), while a lease
// revoked by someone else in the same heartbeat still comes back lost.
func TestHeartbeatAfterOwnWriteLanded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	for range 3 {
		if _, err := store.Insert(ctx, db.Pool, store.InsertParams{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := store.Claim(ctx, db.Pool, store.ClaimParams{Queue: "default", WorkerID: "w", Limit: 3, Lease: time.Minute})
	if err != nil || len(rows) != 3 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	done, revoked, running := store.LeaseOf(rows[0]), store.LeaseOf(rows[1]), store.LeaseOf(rows[2])
	if err := store.Complete(ctx, db.Pool, done); err != nil {
		t.Fatal(err)
	}
	if _, err := store.RequeueJob(ctx, db.Pool, revoked.JobID); err != nil {
		t.Fatal(err)
	}
	res, err := store.Heartbeat(ctx, db.Pool, "w", []queue.Lease{done, revoked, running}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Finished) != 1 || res.Finished[0] != done {
		t.Errorf("finished %v, want %v", res.Finished, done)
	}
	if len(res.Lost) != 1 || res.Lost[0] != revoked {
		t.Errorf("lost %v, want %v", res.Lost, revoked)
	}
	if len(res.Renewed) != 1 || res.Renewed[0] != running {
		t.Errorf("renewed %v, want %v", res.Renewed, running)
	}
}

// TestCompleteManyOldAndNewLeaseOfOneJob: one completion batch can carry a revoked
// lease of a job and the lease claimed after it. The old one must be rejected and
// recorded as a stale write; the new one completes the job.
func TestCompleteManyOldAndNewLeaseOfOneJob(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	old, cur := oldAndNewLease(ctx, t, db)
	lost, err := store.CompleteMany(ctx, db.Pool, "w", []queue.Lease{old, cur})
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) != 1 || lost[0] != old {
		t.Fatalf("lost %v, want only the old lease %v", lost, old)
	}
	var rejectedGen int64
	if err := db.Pool.QueryRow(ctx, `SELECT lease_gen FROM fenceq_lease_events
		WHERE job_id = $1 AND kind = 'stale_write_rejected'`, old.JobID).Scan(&rejectedGen); err != nil {
		t.Fatalf("stale write event of the old lease: %v", err)
	}
	if rejectedGen != old.Gen {
		t.Fatalf("stale write recorded for generation %d, want %d", rejectedGen, old.Gen)
	}
	j, err := store.GetJob(ctx, db.Pool, cur.JobID)
	if err != nil || j.State != queue.StateCompleted || j.LeaseGen != cur.Gen {
		t.Fatalf("job after the batch: %+v, %v; want completed at generation %d", j, err, cur.Gen)
	}
}

// TestCompletionFindsItsOwnCompletion: an attempt's completion can land first from a
// transaction of the application's own under the lease (an endpoint calling the SQL
// function fenceq_complete). The worker's completion that follows, single or batched,
// finds the job completed under the same generation: it counts as completed, records
// no stale write and leaves the row (its output) as that transaction wrote it. A
// completion under an older generation is still rejected and recorded.
func TestCompletionFindsItsOwnCompletion(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	for range 3 {
		if _, err := store.Insert(ctx, db.Pool, store.InsertParams{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := store.Claim(ctx, db.Pool, store.ClaimParams{Queue: "default", WorkerID: "w", Limit: 3, Lease: time.Minute})
	if err != nil || len(rows) != 3 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	single, batched, running := store.LeaseOf(rows[0]), store.LeaseOf(rows[1]), store.LeaseOf(rows[2])
	// What fenceq_complete does, under the lease, in the application's transaction.
	for _, l := range []queue.Lease{single, batched} {
		tag, err := db.Pool.Exec(ctx, `UPDATE fenceq_jobs SET state = 'completed', finished_at = now(),
			lease_expires_at = NULL, output = '"by the endpoint"' WHERE id = $1 AND lease_gen = $2 AND state = 'running'`, l.JobID, l.Gen)
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("complete job %d in SQL: %v %v", l.JobID, tag, err)
		}
	}
	stale := func() int64 {
		t.Helper()
		var n int64
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_lease_events WHERE kind = 'stale_write_rejected'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := store.CompleteWithOutput(ctx, db.Pool, single, []byte(`"by the worker"`)); err != nil {
		t.Fatalf("single completion after its own: %v", err)
	}
	lost, err := store.CompleteManyWithOutputs(ctx, db.Pool, "w", []queue.Lease{batched, running},
		[][]byte{[]byte(`"by the worker"`), []byte(`"by the worker"`)})
	if err != nil || len(lost) != 0 {
		t.Fatalf("batched completion after its own: lost %v, %v", lost, err)
	}
	if n := stale(); n != 0 {
		t.Fatalf("%d stale_write_rejected events, want none", n)
	}
	for l, want := range map[queue.Lease]string{single: `"by the endpoint"`, batched: `"by the endpoint"`, running: `"by the worker"`} {
		j, err := store.GetJob(ctx, db.Pool, l.JobID)
		if err != nil || j.State != queue.StateCompleted || j.LeaseGen != l.Gen || string(j.Output) != want {
			t.Fatalf("job %d: %+v %v; want completed at generation %d with output %s", l.JobID, j, err, l.Gen, want)
		}
	}

	// A revoked lease whose job was then completed under the next lease is still lost.
	old, cur := oldAndNewLease(ctx, t, db)
	if err := store.Complete(ctx, db.Pool, cur); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, db.Pool, old); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("single completion under the revoked lease: %v, want ErrLeaseLost", err)
	}
	if lost, err := store.CompleteMany(ctx, db.Pool, "w", []queue.Lease{old}); err != nil || len(lost) != 1 {
		t.Fatalf("batched completion under the revoked lease: lost %v, %v; want it lost", lost, err)
	}
	if n := stale(); n != 2 {
		t.Fatalf("%d stale_write_rejected events, want 2 (the revoked lease's two completions)", n)
	}
}
