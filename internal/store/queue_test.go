package store_test

import (
	"context"
	"errors"
	"reflect"
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

func (b *testBundle) insert(t *testing.T, p store.InsertParams) *queue.JobRow {
	t.Helper()
	if p.Kind == "" {
		p.Kind = "test"
	}
	res, err := store.Insert(b.ctx, b.db.Pool, p)
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	return res.Job
}

func (b *testBundle) claim(t *testing.T, worker string, limit int, lease time.Duration) []*queue.JobRow {
	t.Helper()
	jobs, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "default", WorkerID: worker, Limit: limit, Lease: lease})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return jobs
}

func (b *testBundle) job(t *testing.T, id int64) *queue.JobRow {
	t.Helper()
	j, err := store.GetJob(b.ctx, b.db.Pool, id)
	if err != nil {
		t.Fatalf("get job %d: %v", id, err)
	}
	return j
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
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, id); err != nil {
		t.Fatalf("expire: %v", err)
	}
}

func TestClaimCompleteAndStaleWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.insert(t, store.InsertParams{Args: []byte(`{"n":1}`)})
	if j.State != queue.StateAvailable || j.LeaseGen != 0 {
		t.Fatalf("new job: state %s gen %d", j.State, j.LeaseGen)
	}
	claimed := b.claim(t, "A", 10, time.Minute)
	if len(claimed) != 1 || claimed[0].LeaseGen != 1 || claimed[0].Attempt != 1 || claimed[0].State != queue.StateRunning {
		t.Fatalf("claimed %+v", claimed)
	}
	leaseA := store.LeaseOf(claimed[0])
	if leaseA.Holder != "A" {
		t.Fatalf("holder %q", leaseA.Holder)
	}
	b.expire(t, j.ID)
	revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{HolderFresh: time.Minute})
	if err != nil || len(revs) != 1 || revs[0].Gen != 1 || revs[0].State != queue.StateAvailable {
		t.Fatalf("reap: %v %+v", err, revs)
	}
	if got := b.job(t, j.ID).LeaseGen; got != 2 {
		t.Fatalf("gen after revoke = %d, want 2", got)
	}
	claimedB := b.claim(t, "B", 10, time.Minute)
	if len(claimedB) != 1 || claimedB[0].LeaseGen != 3 {
		t.Fatalf("B claimed %+v", claimedB)
	}
	// A's writes are all rejected by the database.
	for name, write := range map[string]func() error{
		"complete": func() error { return store.Complete(b.ctx, b.db.Pool, leaseA) },
		"fail": func() error {
			_, err := store.Fail(b.ctx, b.db.Pool, leaseA, store.FailParams{Err: "x"})
			return err
		},
		"snooze":  func() error { return store.Snooze(b.ctx, b.db.Pool, leaseA, time.Second) },
		"cancel":  func() error { return store.Cancel(b.ctx, b.db.Pool, leaseA, "x") },
		"release": func() error { return store.Release(b.ctx, b.db.Pool, leaseA) },
		"fenced":  func() error { return store.WithLease(b.ctx, b.db.Pool, leaseA, store.LeaseTx{Complete: true}, nil) },
	} {
		if err := write(); !errors.Is(err, queue.ErrLeaseLost) {
			t.Errorf("%s with stale lease: got %v, want ErrLeaseLost", name, err)
		}
	}
	if n := b.events(t, queue.EventStaleWriteRejected); n != 6 {
		t.Errorf("stale_write_rejected events = %d, want 6", n)
	}
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(claimedB[0])); err != nil {
		t.Fatalf("B complete: %v", err)
	}
	if got := b.job(t, j.ID); got.State != queue.StateCompleted || got.FinishedAt == nil {
		t.Fatalf("final %+v", got)
	}
}

// A claim returns only the columns it did not set itself and fills in the rest: the
// claimed rows must equal the rows as stored, whatever the job carries (a unique key,
// errors of earlier attempts, another queue, several kinds).
func TestClaimedRowsEqualStoredRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failed := b.insert(t, store.InsertParams{Queue: "other", Kind: "first", UniqueKey: "k1", Args: []byte(`{"n": 1}`)})
	first := b.claimQueue(t, "other", "w1", 1)
	if len(first) != 1 || first[0].ID != failed.ID {
		t.Fatalf("claimed %v, want job %d", first, failed.ID)
	}
	if _, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(first[0]), store.FailParams{Err: "boom"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_jobs SET run_at = now(), state = 'available' WHERE id = $1`, failed.ID); err != nil {
		t.Fatal(err)
	}
	b.insert(t, store.InsertParams{Queue: "other", Kind: "second", Args: []byte(`{"n": 2}`), Metadata: []byte(`{"origin": "test"}`)})
	b.insert(t, store.InsertParams{Queue: "other", Kind: "first", Args: []byte(`{"n": 3}`)})

	claimed := b.claimQueue(t, "other", "w2", 10)
	if len(claimed) != 3 {
		t.Fatalf("claimed %d jobs, want 3", len(claimed))
	}
	sawErrors, sawMetadata := false, false
	for _, c := range claimed {
		stored := b.job(t, c.ID)
		if !reflect.DeepEqual(c, stored) {
			t.Errorf("claimed row differs from the stored one:\nclaimed %+v\nstored  %+v", *c, *stored)
		}
		sawErrors = sawErrors || len(c.Errors) == 1
		sawMetadata = sawMetadata || string(c.Metadata) == `{"origin": "test"}`
	}
	if !sawErrors || !sawMetadata {
		t.Fatalf("claimed rows: earlier error carried %v, metadata carried %v; want both", sawErrors, sawMetadata)
	}
}

func (b *testBundle) claimQueue(t *testing.T, q, worker string, limit int) []*queue.JobRow {
	t.Helper()
	jobs, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: q, WorkerID: worker, Limit: limit, Lease: time.Minute})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return jobs
}

// The worker's statements on fenceq_jobs are not prepared by name: PostgreSQL would
// switch a named statement to a generic plan after five runs and keep it, and one
// planned while the table was small kept sequential scans as it grew. They must be
// planned per execution (see customPlan), so none may show up in the session's
// pg_prepared_statements, however often they run; an ordinary query does.
func TestWorkerStatementsAreNotPreparedByName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, err := pgx.Connect(b.ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	for i := 0; i < 7; i++ {
		b.insert(t, store.InsertParams{})
		jobs, err := store.Claim(b.ctx, conn, store.ClaimParams{Queue: "default", WorkerID: "w", Limit: 1, Lease: time.Minute})
		if err != nil || len(jobs) != 1 {
			t.Fatalf("claim: %d jobs, %v", len(jobs), err)
		}
		l := store.LeaseOf(jobs[0])
		if _, err := store.Heartbeat(b.ctx, conn, "w", []queue.Lease{l}, time.Minute); err != nil {
			t.Fatal(err)
		}
		if lost, err := store.CompleteMany(b.ctx, conn, "w", []queue.Lease{l}); err != nil || len(lost) != 0 {
			t.Fatalf("complete: lost %v, %v", lost, err)
		}
		if _, err := store.GetJob(b.ctx, conn, l.JobID); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := conn.Query(b.ctx, `SELECT statement FROM pg_prepared_statements`)
	if err != nil {
		t.Fatal(err)
	}
	stmts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	sawOrdinary := false
	for _, s := range stmts {
		if strings.Contains(s, "SKIP LOCKED") || strings.Contains(s, "lease_gen = l.lgen") {
			t.Errorf("a worker statement is prepared by name:\n%s", s)
		}
		sawOrdinary = sawOrdinary || strings.Contains(s, "FROM fenceq_jobs WHERE id = $1")
	}
	if !sawOrdinary {
		t.Fatalf("GetJob's statement is not among the prepared ones either (%d statements): the check sees nothing", len(stmts))
	}
}
