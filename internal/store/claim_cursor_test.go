package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// A claim after a cursor takes only jobs after it in claim order (priority, run_at, id),
// in that order; a released job behind the cursor is invisible to it and claimed again by
// a claim without a cursor. CompleteMany completes the batch fenced by each generation.
func TestClaimAfterCursor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ids []int64
	for range 6 {
		ids = append(ids, b.insert(t, store.InsertParams{}).ID)
	}
	first := b.claim(t, "A", 2, time.Minute)
	slices.SortFunc(first, func(a, b *queue.JobRow) int { return int(a.ID - b.ID) })
	if len(first) != 2 || first[0].ID != ids[0] || first[1].ID != ids[1] {
		t.Fatalf("first claim: %v, want jobs %d and %d", jobIDs(first), ids[0], ids[1])
	}
	cur := store.CursorAfter(first)
	if cur == nil || cur.ID != ids[1] {
		t.Fatalf("cursor after the first claim: %+v, want job %d", cur, ids[1])
	}
	// Job 0 goes back to available behind the cursor.
	if err := store.Release(b.ctx, b.db.Pool, store.LeaseOf(first[0])); err != nil {
		t.Fatalf("release: %v", err)
	}
	after, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "default", WorkerID: "A", Limit: 10,
		Lease: time.Minute, After: cur})
	if err != nil {
		t.Fatalf("claim after cursor: %v", err)
	}
	if got := jobIDs(after); len(got) != 4 || got[0] != ids[2] || got[3] != ids[5] {
		t.Fatalf("claim after cursor: %v, want jobs %v (not the released %d behind it)", got, ids[2:], ids[0])
	}
	if next := store.CursorAfter(after); next == nil || next.ID != ids[5] || !cur.Less(*next) {
		t.Fatalf("cursor after the second claim: %+v", next)
	}
	behind := b.claim(t, "A", 10, time.Minute)
	if len(behind) != 1 || behind[0].ID != ids[0] || behind[0].LeaseGen != 2 {
		t.Fatalf("claim without cursor: %v, want the released job %d at generation 2", jobIDs(behind), ids[0])
	}

	// Completing the batch with one stale lease completes the rest and rejects it.
	leases := []queue.Lease{store.LeaseOf(first[1]), store.LeaseOf(first[0])} // job 0's first lease is stale
	for _, j := range after {
		leases = append(leases, store.LeaseOf(j))
	}
	lost, err := store.CompleteMany(b.ctx, b.db.Pool, "A", leases)
	if err != nil {
		t.Fatalf("complete many: %v", err)
	}
	if len(lost) != 1 || lost[0].JobID != ids[0] || lost[0].Gen != 1 {
		t.Fatalf("lost %+v, want job %d's stale generation 1", lost, ids[0])
	}
	if j := b.job(t, ids[0]); j.State != queue.StateRunning || j.LeaseGen != 2 {
		t.Fatalf("job %d after a stale completion: %s at gen %d, want running at gen 2", ids[0], j.State, j.LeaseGen)
	}
	for _, id := range append([]int64{ids[1]}, ids[2:]...) {
		if j := b.job(t, id); j.State != queue.StateCompleted {
			t.Fatalf("job %d: %s, want completed", id, j.State)
		}
	}
}

// Claim order puts priority first: a more urgent job inserted after the cursor's
// position in time is still behind a cursor of a less urgent priority.
func TestClaimCursorOrder(t *testing.T) {
	t.Parallel()
	now := time.Now()
	c := store.ClaimCursor{Priority: 1, RunAt: now, ID: 10}
	for _, tc := range []struct {
		d    store.ClaimCursor
		less bool
	}{
		{store.ClaimCursor{Priority: 2, RunAt: now.Add(-time.Hour), ID: 1}, true},
		{store.ClaimCursor{Priority: 0, RunAt: now.Add(time.Hour), ID: 99}, false},
		{store.ClaimCursor{Priority: 1, RunAt: now.Add(time.Microsecond), ID: 1}, true},
		{store.ClaimCursor{Priority: 1, RunAt: now, ID: 11}, true},
		{store.ClaimCursor{Priority: 1, RunAt: now, ID: 10}, false},
	} {
		if got := c.Less(tc.d); got != tc.less {
			t.Errorf("%+v.Less(%+v) = %v, want %v", c, tc.d, got, tc.less)
		}
	}
	if store.CursorAfter(nil) != nil {
		t.Errorf("cursor after no jobs is not nil")
	}
}

func jobIDs(js []*queue.JobRow) []int64 {
	out := make([]int64, len(js))
	for i, j := range js {
		out[i] = j.ID
	}
	slices.Sort(out) // RETURNING of an UPDATE has no order
	return out
}
