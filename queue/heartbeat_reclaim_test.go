package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/dbtest"
	"github.com/fenceq/fenceq/queue"
)

// TestHeartbeatOldAndNewLeaseOfOneJob: a worker whose lease was revoked (operator
// requeue, or expiry during a pause) can claim the same job again while the old
// attempt still runs. One heartbeat then carries both leases; the old one must come
// back lost (so its attempt is cancelled), the new one renewed.
func TestHeartbeatOldAndNewLeaseOfOneJob(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := dbtest.New(t)
	if _, err := queue.Insert(ctx, db.Pool, queue.InsertParams{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	claim := func() queue.Lease {
		t.Helper()
		rows, err := queue.Claim(ctx, db.Pool, queue.ClaimParams{Queue: "default", WorkerID: "w", Limit: 1, Lease: time.Minute})
		if err != nil || len(rows) != 1 {
			t.Fatalf("claim: %v %v", rows, err)
		}
		return rows[0].Lease()
	}
	old := claim()
	if _, err := queue.RequeueJob(ctx, db.Pool, old.JobID); err != nil {
		t.Fatal(err)
	}
	cur := claim()
	if cur.Gen <= old.Gen {
		t.Fatalf("new generation %d not above old %d", cur.Gen, old.Gen)
	}
	for _, order := range [][]queue.Lease{{old, cur}, {cur, old}} {
		res, err := queue.Heartbeat(ctx, db.Pool, "w", order, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Lost) != 1 || res.Lost[0] != old || len(res.Renewed) != 1 || res.Renewed[0] != cur {
			t.Fatalf("heartbeat of %v: renewed %v lost %v; want renewed %v lost %v", order, res.Renewed, res.Lost, cur, old)
		}
	}
}
