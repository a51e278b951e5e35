package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

type testBundle struct {
	db  *fenceqtest.DB
	ctx context.Context
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &testBundle{db: fenceqtest.New(t, nil), ctx: ctx}
}

func (b *testBundle) events(t *testing.T, kind queue.LeaseEventKind) int64 {
	t.Helper()
	var n int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_lease_events WHERE kind = $1`, string(kind)).Scan(&n); err != nil {
		t.Fatalf("count events: %v", err)
	}
	return n
}

// expire moves a lease's expiry into the past by the database's clock.
func (b *testBundle) expire(t *testing.T, id int64) {
	t.Helper()
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_jobs_hot SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, id); err != nil {
		t.Fatalf("expire: %v", err)
	}
}

// insertOutbox writes one outbox row and its delivery job, committed.
func (b *testBundle) insertOutbox(t *testing.T, key string, maxAttempts int) *InsertResult {
	t.Helper()
	var res *InsertResult
	err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = Insert(b.ctx, tx, Message{
			Topic: "email", DedupeKey: key, Payload: []byte(`{"to":["a@example.com"]}`), MaxAttempts: maxAttempts})
		return err
	})
	if err != nil {
		t.Fatalf("insert outbox row: %v", err)
	}
	return res
}

func (b *testBundle) claimOutbox(t *testing.T, worker string, lease time.Duration) *queue.JobRow {
	t.Helper()
	jobs, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: Queue, WorkerID: worker, Limit: 1, Lease: lease})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claim delivery job: %v (%d jobs)", err, len(jobs))
	}
	return jobs[0]
}

func (b *testBundle) outbox(t *testing.T, id int64) *Row {
	t.Helper()
	o, err := Get(b.ctx, b.db.Pool, id)
	if err != nil {
		t.Fatalf("get outbox row: %v", err)
	}
	return o
}

func TestOutboxRelayWritesAreFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.insertOutbox(t, "invoice-email:1", 0)
	if res.Existing || res.DeliveryJobID == 0 {
		t.Fatalf("insert: %+v", res)
	}
	jobA := b.claimOutbox(t, "A", time.Minute)
	if jobA.ID != res.DeliveryJobID {
		t.Fatalf("claimed job %d, want delivery job %d", jobA.ID, res.DeliveryJobID)
	}
	leaseA := store.LeaseOf(jobA)
	attempt, err := beginAttempt(b.ctx, b.db.Pool, res.ID, leaseA)
	if err != nil || attempt != 1 {
		t.Fatalf("A begins attempt: %d %v", attempt, err)
	}
	if o := b.outbox(t, res.ID); o.LeaseGen != leaseA.Gen || o.LeasedBy == nil || *o.LeasedBy != "A" ||
		o.LeaseExpiresAt == nil || o.DeliveryJobState != queue.StateRunning {
		t.Fatalf("row during A's attempt: %+v", o)
	}

	// A pauses past its lease; the reaper revokes it and B claims a newer generation.
	b.expire(t, jobA.ID)
	if revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{HolderFresh: time.Minute}); err != nil || len(revs) != 1 {
		t.Fatalf("reap: %v %+v", err, revs)
	}
	jobB := b.claimOutbox(t, "B", time.Minute)
	leaseB := store.LeaseOf(jobB)
	if jobB.ID != jobA.ID || leaseB.Gen <= leaseA.Gen {
		t.Fatalf("B claimed %d gen %d after A's gen %d", jobB.ID, leaseB.Gen, leaseA.Gen)
	}
	staleBefore := b.events(t, queue.EventStaleWriteRejected)
	for name, write := range map[string]func() error{
		"begin":     func() error { _, err := beginAttempt(b.ctx, b.db.Pool, res.ID, leaseA); return err },
		"delivered": func() error { return markDelivered(b.ctx, b.db.Pool, res.ID, leaseA) },
		"failed":    func() error { return markFailed(b.ctx, b.db.Pool, res.ID, leaseA, "x") },
		"attempt":   func() error { return recordAttempt(b.ctx, b.db.Pool, res.ID, leaseA, "x") },
	} {
		if err := write(); !errors.Is(err, queue.ErrLeaseLost) {
			t.Errorf("%s with A's stale lease: got %v, want ErrLeaseLost", name, err)
		}
	}
	if n := b.events(t, queue.EventStaleWriteRejected) - staleBefore; n != 4 {
		t.Errorf("stale_write_rejected events for A's outbox writes = %d, want 4", n)
	}

	if _, err := beginAttempt(b.ctx, b.db.Pool, res.ID, leaseB); err != nil {
		t.Fatalf("B begins attempt: %v", err)
	}
	err = store.WithLease(b.ctx, b.db.Pool, leaseB, store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
		return markDelivered(ctx, tx, res.ID, leaseB)
	})
	if err != nil {
		t.Fatalf("B marks delivered: %v", err)
	}
	o := b.outbox(t, res.ID)
	if o.State != StateDelivered || o.DeliveredAt == nil || o.Attempt != 2 || o.LeaseGen != leaseB.Gen ||
		o.LeasedBy == nil || *o.LeasedBy != "B" || o.LeaseExpiresAt != nil || o.DeliveryJobState != queue.StateCompleted {
		t.Fatalf("delivered row: %+v", o)
	}
	// A delivered row is final: a second mark under a live lease is a wrong state, not
	// a second delivery.
	if _, err := store.RequeueJob(b.ctx, b.db.Pool, jobA.ID); err != nil {
		t.Fatal(err)
	}
	jobC := b.claimOutbox(t, "C", time.Minute)
	if err := markDelivered(b.ctx, b.db.Pool, res.ID, store.LeaseOf(jobC)); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("mark a delivered row again: %v, want queue.ErrWrongState", err)
	}
}

func TestOutboxOrphanFailRetryAndStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// One attempt only; its holder "crashes": the reaper discards the delivery job
	// without any handler having marked the row.
	res := b.insertOutbox(t, "order-email:7", 1)
	healthy := b.insertOutbox(t, "order-email:8", 0)
	job := b.claimOutbox(t, "crashed", time.Minute)
	if job.ID != res.DeliveryJobID {
		t.Fatalf("claimed %d, want %d", job.ID, res.DeliveryJobID)
	}
	b.expire(t, job.ID)
	revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{HolderFresh: time.Minute})
	if err != nil || len(revs) != 1 || revs[0].State != queue.StateDiscarded {
		t.Fatalf("reap: %v %+v", err, revs)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_outbox SET available_at = now() - interval '90 seconds' WHERE id = $1`, healthy.ID); err != nil {
		t.Fatal(err)
	}
	st, err := Stats(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 2 || st.Orphaned != 1 || st.Failed != 0 || st.OldestPendingAge < 90*time.Second {
		t.Fatalf("stats before sweep: %+v", st)
	}

	ids, err := FailOrphaned(b.ctx, b.db.Pool, 100)
	if err != nil || len(ids) != 1 || ids[0] != res.ID {
		t.Fatalf("fail orphans: %v %v, want [%d]", ids, err, res.ID)
	}
	o := b.outbox(t, res.ID)
	if o.State != StateFailed || o.LastError == nil || !strings.Contains(*o.LastError, "discarded") {
		t.Fatalf("orphan after sweep: %+v", o)
	}
	if again, err := FailOrphaned(b.ctx, b.db.Pool, 100); err != nil || len(again) != 0 {
		t.Fatalf("second sweep: %v %v", again, err)
	}
	if st, _ := Stats(b.ctx, b.db.Pool); st.Pending != 1 || st.Failed != 1 || st.Orphaned != 0 {
		t.Fatalf("stats after sweep: %+v", st)
	}
	failed, err := List(b.ctx, b.db.Pool, ListParams{State: StateFailed})
	if err != nil || len(failed) != 1 || failed[0].ID != res.ID {
		t.Fatalf("list failed: %v %+v", err, failed)
	}
	if all, err := List(b.ctx, b.db.Pool, ListParams{Topic: "email"}); err != nil || len(all) != 2 || all[0].ID != healthy.ID {
		t.Fatalf("list all (newest first): %v %+v", err, all)
	}
	if _, err := List(b.ctx, b.db.Pool, ListParams{State: "lost"}); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("list with a bad state: %v", err)
	}

	// An operator retries it: pending again, with a new delivery job.
	r, err := Retry(b.ctx, b.db.Pool, res.ID)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if r.State != StatePending || r.DeliveryJobID == nil || *r.DeliveryJobID == res.DeliveryJobID ||
		r.DeliveryJobState != queue.StateAvailable || r.DedupeKey != "order-email:7" {
		t.Fatalf("retried row: %+v", r)
	}
	if _, err := Retry(b.ctx, b.db.Pool, res.ID); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("retry a pending row with a live job: %v, want queue.ErrWrongState", err)
	}
	if _, err := Retry(b.ctx, b.db.Pool, 987654); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("retry unknown row: %v, want ErrNotFound", err)
	}

	// The new job's holder rejects it permanently: failed, with the reason, under its lease.
	var newJob *queue.JobRow
	for _, j := range []*queue.JobRow{b.claimOutbox(t, "D", time.Minute), b.claimOutbox(t, "D", time.Minute)} {
		if j.ID == *r.DeliveryJobID {
			newJob = j
		}
	}
	if newJob == nil {
		t.Fatalf("new delivery job %d was not claimed", *r.DeliveryJobID)
	}
	err = store.WithLease(b.ctx, b.db.Pool, store.LeaseOf(newJob), store.LeaseTx{}, func(ctx context.Context, tx pgx.Tx) error {
		return markFailed(ctx, tx, res.ID, store.LeaseOf(newJob), "550 no such user")
	})
	if err != nil {
		t.Fatalf("mark failed: %v", err)
	}
	o = b.outbox(t, res.ID)
	if o.State != StateFailed || o.LastError == nil || *o.LastError != "550 no such user" || o.LeaseGen != newJob.LeaseGen {
		t.Fatalf("failed row: %+v", o)
	}

	// Between marking the row failed and ending its job, the failed row still has an
	// unfinished delivery job: a retry now would link the row back to that job, which
	// delivers nothing. It is refused and changes nothing.
	if _, err := Retry(b.ctx, b.db.Pool, res.ID); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("retry while the last delivery job still runs: %v, want queue.ErrWrongState", err)
	}
	if o := b.outbox(t, res.ID); o.State != StateFailed || o.DeliveryJobID == nil || *o.DeliveryJobID != newJob.ID {
		t.Fatalf("row after the refused retry: %+v", o)
	}
	if _, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(newJob), store.FailParams{Err: "550", Discard: true}); err != nil {
		t.Fatal(err)
	}
	r, err = Retry(b.ctx, b.db.Pool, res.ID)
	if err != nil || r.State != StatePending || r.DeliveryJobID == nil || *r.DeliveryJobID == newJob.ID {
		t.Fatalf("retry once the job ended: %+v %v; want pending with a new delivery job", r, err)
	}
}

// The outbox row reports the lease expiry of the delivery job that is delivering it,
// renewed by heartbeats like the job's own; once the job no longer runs, none.
func TestOutboxRowReportsTheLiveLeaseExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.insertOutbox(t, "live-lease", 3)
	job := b.claimOutbox(t, "R", 2*time.Second)
	if _, err := beginAttempt(b.ctx, b.db.Pool, res.ID, store.LeaseOf(job)); err != nil {
		t.Fatal(err)
	}
	first := b.outbox(t, res.ID).LeaseExpiresAt
	if first == nil {
		t.Fatal("no lease expiry on a row being delivered")
	}
	hb, err := store.Heartbeat(b.ctx, b.db.Pool, "R", []queue.Lease{store.LeaseOf(job)}, time.Hour)
	if err != nil || len(hb.Renewed) != 1 {
		t.Fatalf("heartbeat: %+v %v", hb, err)
	}
	renewed := b.outbox(t, res.ID).LeaseExpiresAt
	if renewed == nil || !renewed.After(first.Add(30*time.Minute)) {
		t.Fatalf("lease expiry after a one-hour renewal: %v (was %v)", renewed, first)
	}
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(job)); err != nil {
		t.Fatal(err)
	}
	if got := b.outbox(t, res.ID).LeaseExpiresAt; got != nil {
		t.Fatalf("lease expiry %v after the delivery job ended, want none", got)
	}
}
