package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// claimFlow claims up to n jobs under flow limits from the default queue.
func (b *testBundle) claimFlow(t *testing.T, n int) []*queue.JobRow {
	t.Helper()
	jobs, _, err := store.ClaimFlow(b.ctx, b.db.Pool, store.ClaimFlowParams{WorkerID: "w", Lease: time.Minute,
		Queues: []store.QueueClaim{{Name: "default", Limit: n}}, Max: n})
	if err != nil {
		t.Fatalf("claim flow: %v", err)
	}
	return jobs
}

func countByKey(jobs []*queue.JobRow) map[string]int {
	out := map[string]int{}
	for _, j := range jobs {
		out[*j.FlowKey]++
	}
	return out
}

func (b *testBundle) running(t *testing.T, key string) int {
	t.Helper()
	p, err := store.FlowPartition(b.ctx, b.db.Pool, key)
	if err != nil {
		t.Fatal(err)
	}
	return p.Running
}

// A concurrency limit holds per partition across claims; the ordinary claim never takes
// a job under a limit; a completion, a failure and a revocation each free the slot in
// their own transaction; a job whose limit is not set is refused.
func TestFlowConcurrencyLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := store.Insert(b.ctx, b.db.Pool, store.InsertParams{Kind: "tax", FlowKey: "tax:a"}); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("insert under a limit not set: %v, want ErrInvalid", err)
	}
	if err := store.SetFlowLimit(b.ctx, b.db.Pool, queue.FlowLimit{Name: "tax", MaxRunning: 2}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		b.insert(t, store.InsertParams{Kind: "tax", FlowKey: "tax:a"})
		b.insert(t, store.InsertParams{Kind: "tax", FlowKey: "tax:b"})
	}
	plain := b.insert(t, store.InsertParams{Kind: "plain"})
	if got := b.claim(t, "w", 100, time.Minute); len(got) != 1 || got[0].ID != plain.ID {
		t.Fatalf("ordinary claim took %d jobs, want only the job under no limit", len(got))
	}
	first := b.claimFlow(t, 100)
	if c := countByKey(first); len(first) != 4 || c["tax:a"] != 2 || c["tax:b"] != 2 {
		t.Fatalf("first flow claim: %v, want 2 per partition", c)
	}
	if got := b.claimFlow(t, 100); len(got) != 0 {
		t.Fatalf("claimed %d jobs past the limit", len(got))
	}
	var a []*queue.JobRow
	for _, j := range first {
		if *j.FlowKey == "tax:a" {
			a = append(a, j)
		}
	}
	// A completion frees one slot.
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(a[0])); err != nil {
		t.Fatal(err)
	}
	if n := b.running(t, "tax:a"); n != 1 {
		t.Fatalf("running after a completion: %d, want 1", n)
	}
	second := b.claimFlow(t, 100)
	if c := countByKey(second); len(second) != 1 || c["tax:a"] != 1 {
		t.Fatalf("after a completion: %v, want one more of tax:a", c)
	}
	// A revocation (an operator's requeue of the running job) frees the slot at once;
	// the stale holder's completion is then rejected and frees nothing twice.
	if _, err := store.RequeueJob(b.ctx, b.db.Pool, a[1].ID); err != nil {
		t.Fatal(err)
	}
	if n := b.running(t, "tax:a"); n != 1 {
		t.Fatalf("running after a revocation: %d, want 1", n)
	}
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(a[1])); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("stale completion: %v, want ErrLeaseLost", err)
	}
	if n := b.running(t, "tax:a"); n != 1 {
		t.Fatalf("running after the stale completion: %d, want 1", n)
	}
	third := b.claimFlow(t, 100)
	if c := countByKey(third); len(third) != 1 || c["tax:a"] != 1 {
		t.Fatalf("after a revocation: %v, want one more of tax:a", c)
	}
	// A failure with attempts left frees the slot too.
	if _, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(third[0]), store.FailParams{Err: "boom", Backoff: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if n := b.running(t, "tax:a"); n != 1 {
		t.Fatalf("running after a failure: %d, want 1", n)
	}
	// Raising the limit applies to the next claim.
	if err := store.SetFlowLimit(b.ctx, b.db.Pool, queue.FlowLimit{Name: "tax", MaxRunning: 3}); err != nil {
		t.Fatal(err)
	}
	if c := countByKey(b.claimFlow(t, 100)); c["tax:a"] != 2 || c["tax:b"] != 1 {
		t.Fatalf("after raising the limit to 3: %v, want 2 more of tax:a and 1 of tax:b", c)
	}
	if err := store.DeleteFlowLimit(b.ctx, b.db.Pool, "tax"); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("delete a limit in use: %v, want ErrWrongState", err)
	}
}

// A sequence runs its jobs one at a time in enqueue order; its head holds it through a
// retry; a discarded head lets the next go on, or holds it with HoldOnDiscard.
func TestFlowSequence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, l := range []queue.FlowLimit{{Name: "seq", Sequence: true}, {Name: "hold", Sequence: true, HoldOnDiscard: true}} {
		if err := store.SetFlowLimit(b.ctx, b.db.Pool, l); err != nil {
			t.Fatal(err)
		}
	}
	var ids []int64
	for range 3 {
		ids = append(ids, b.insert(t, store.InsertParams{Kind: "s", FlowKey: "seq:x", MaxAttempts: 2}).ID)
	}
	got := b.claimFlow(t, 10)
	if len(got) != 1 || got[0].ID != ids[0] {
		t.Fatalf("first claim of the sequence: %v, want only job %d", got, ids[0])
	}
	if _, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(got[0]), store.FailParams{Err: "once"}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.PromoteDue(b.ctx, b.db.Pool, 100); err != nil {
		t.Fatal(err)
	}
	// The head failed and is available again: it, not the next job, runs.
	got = b.claimFlow(t, 10)
	if len(got) != 1 || got[0].ID != ids[0] {
		t.Fatalf("after the head's failure: %v, want job %d again", got, ids[0])
	}
	// Discarded past its attempts: the next goes on.
	if st, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(got[0]), store.FailParams{Err: "twice"}); err != nil || st != queue.StateDiscarded {
		t.Fatalf("second failure: %s %v, want discarded", st, err)
	}
	got = b.claimFlow(t, 10)
	if len(got) != 1 || got[0].ID != ids[1] {
		t.Fatalf("after the head was discarded: %v, want job %d", got, ids[1])
	}

	// HoldOnDiscard: the jobs after a discarded one wait until it is retried.
	h1 := b.insert(t, store.InsertParams{Kind: "s", FlowKey: "hold:y", MaxAttempts: 1})
	h2 := b.insert(t, store.InsertParams{Kind: "s", FlowKey: "hold:y"})
	got = b.claimFlow(t, 10)
	if len(got) != 1 || got[0].ID != h1.ID {
		t.Fatalf("hold: first claim %v, want job %d", got, h1.ID)
	}
	if st, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(got[0]), store.FailParams{Err: "x"}); err != nil || st != queue.StateDiscarded {
		t.Fatalf("hold: failure %s %v", st, err)
	}
	if got = b.claimFlow(t, 10); len(got) != 0 {
		t.Fatalf("hold: claimed %v behind a discarded head", got)
	}
	if _, err := store.RetryJob(b.ctx, b.db.Pool, h1.ID); err != nil {
		t.Fatal(err)
	}
	got = b.claimFlow(t, 10)
	if len(got) != 1 || got[0].ID != h1.ID {
		t.Fatalf("hold: after retry %v, want job %d", got, h1.ID)
	}
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(got[0])); err != nil {
		t.Fatal(err)
	}
	if got = b.claimFlow(t, 10); len(got) != 1 || got[0].ID != h2.ID {
		t.Fatalf("hold: after completion %v, want job %d", got, h2.ID)
	}
}

// rateLimited sets the limit api to rate starts an hour and enqueues 5 jobs under its
// one partition, api:.
func (b *testBundle) rateLimited(t *testing.T, rate int) {
	t.Helper()
	if err := store.SetFlowLimit(b.ctx, b.db.Pool, queue.FlowLimit{Name: "api", Rate: rate, Per: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		b.insert(t, store.InsertParams{Kind: "call", FlowKey: "api:"})
	}
}

// A rate limit allows its starts per period, and the next start shows when the period
// is full.
func TestFlowRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.rateLimited(t, 3)
	got := b.claimFlow(t, 10)
	if len(got) != 3 {
		t.Fatalf("claimed %d, want the 3 the rate allows", len(got))
	}
	for _, j := range got {
		if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(j)); err != nil {
			t.Fatal(err)
		}
	}
	if again := b.claimFlow(t, 10); len(again) != 0 {
		t.Fatalf("claimed %d past the rate", len(again))
	}
	p, err := store.FlowPartition(b.ctx, b.db.Pool, "api:")
	if err != nil {
		t.Fatal(err)
	}
	if p.StartsInPeriod != 3 || p.NextStart == nil || p.NextStart.Sub(*got[0].AttemptedAt) < time.Hour-time.Second || p.Waiting != 2 {
		t.Fatalf("partition %+v: want 3 starts, the next an hour after the first, 2 waiting", p)
	}
}

// A claim whose transaction time is before the key's latest recorded start takes nothing
// under the rate: the claim that recorded that start, by its later clock, may have
// dropped from the ledger starts still within this claim's period. A later claim, by a
// clock at or after the latest start, counts its period as before.
func TestFlowRateLedgerInTimeOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.rateLimited(t, 4)
	// The ledger as a claim whose transaction began a minute after this one's leaves it.
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_flow_keys SET starts = ARRAY[now() + interval '1 minute'] WHERE key = 'api:'`); err != nil {
		t.Fatal(err)
	}
	if got := b.claimFlow(t, 10); len(got) != 0 {
		t.Fatalf("claimed %d with a start recorded after this claim's time; want none", len(got))
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_flow_keys SET starts = ARRAY[now() - interval '1 minute'] WHERE key = 'api:'`); err != nil {
		t.Fatal(err)
	}
	if got := b.claimFlow(t, 10); len(got) != 3 {
		t.Fatalf("claimed %d with one start in the period; want the 3 left of 4", len(got))
	}
}

// The flow claim's walk starts after its cursor and wraps around to it: every key with
// room is reached whatever the cursor, and the next cursor is the last key taken in the
// walk's order.
func TestFlowClaimCursorWraps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := store.SetFlowLimit(b.ctx, b.db.Pool, queue.FlowLimit{Name: "w", MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"w:a", "w:b", "w:c", "w:d"} {
		b.insert(t, store.InsertParams{Kind: "k", FlowKey: k})
	}
	claim := func(after *store.FlowCursor, n int) ([]*queue.JobRow, *store.FlowCursor) {
		jobs, next, err := store.ClaimFlow(b.ctx, b.db.Pool, store.ClaimFlowParams{WorkerID: "w", Lease: time.Minute,
			Queues: []store.QueueClaim{{Name: "default", Limit: n}}, Max: n, After: after})
		if err != nil {
			t.Fatal(err)
		}
		return jobs, next
	}
	got, next := claim(&store.FlowCursor{Queue: "default", Key: "w:b"}, 2)
	if c := countByKey(got); len(got) != 2 || c["w:c"] != 1 || c["w:d"] != 1 || *next != (store.FlowCursor{Queue: "default", Key: "w:d"}) {
		t.Fatalf("after w:b: %v, next %+v; want w:c and w:d first, next w:d", c, next)
	}
	got, next = claim(next, 10)
	if c := countByKey(got); len(got) != 2 || c["w:a"] != 1 || c["w:b"] != 1 || *next != (store.FlowCursor{Queue: "default", Key: "w:b"}) {
		t.Fatalf("after w:d: %v, next %+v; want the walk to wrap to w:a and w:b, next w:b", c, next)
	}
	if got, again := claim(next, 10); len(got) != 0 || *again != *next {
		t.Fatalf("nothing left: %d jobs, cursor %+v; want none and the cursor kept", len(got), again)
	}
}

// A batch insert under limits creates each partition's row once, and one job under a
// limit that is not set fails the whole batch, naming that limit.
func TestFlowInsertMany(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := store.SetFlowLimit(b.ctx, b.db.Pool, queue.FlowLimit{Name: "m", MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	ps := []store.InsertParams{{Kind: "k", FlowKey: "m:1"}, {Kind: "k", FlowKey: "m:1"}, {Kind: "k", FlowKey: "m:2"}, {Kind: "k"}}
	if n, err := store.InsertMany(b.ctx, b.db.Pool, ps); err != nil || n != 4 {
		t.Fatalf("insert many: %d, %v", n, err)
	}
	parts, err := store.FlowPartitions(b.ctx, b.db.Pool, "m", 10)
	if err != nil || len(parts) != 2 || parts[0].Waiting+parts[1].Waiting != 3 {
		t.Fatalf("partitions %+v, %v: want m:1 and m:2 with 3 jobs waiting", parts, err)
	}
	bad := append(ps, store.InsertParams{Kind: "k", FlowKey: "nolimit:x"})
	_, err = store.InsertMany(b.ctx, b.db.Pool, bad)
	var ve *queue.ValidationError
	if !errors.As(err, &ve) || !strings.Contains(ve.Reason, `"nolimit"`) {
		t.Fatalf("batch with a job under a limit not set: %v, want a validation error naming it", err)
	}
	var jobs int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&jobs); err != nil || jobs != 4 {
		t.Fatalf("jobs after the refused batch: %d, %v; want the 4 of the first batch only", jobs, err)
	}
}
