package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
)

// listener LISTENs on the schema's channel on a connection of its own.
func (b *testBundle) listener(t *testing.T) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(b.ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	if _, err := c.Exec(b.ctx, "LISTEN "+pgx.Identifier{store.ChannelPrefix + b.db.Schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return c
}

// expectWake waits for a notification naming queue q; a wake-up that never comes fails
// after a bound far above any delivery time, so the test asserts delivery, not speed.
func (b *testBundle) expectWake(t *testing.T, c *pgx.Conn, q, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	for {
		n, err := c.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("%s: no wake-up for queue %q: %v", what, q, err)
		}
		if n.Payload == q {
			return
		}
	}
}

// Every write that makes jobs available wakes their queue on the schema's channel: the
// insert (the trigger on PostgreSQL, the insert path itself on Citus, where fenceq_jobs
// has no trigger), a batch insert, the scheduler's promotion and the reaper's
// revocation. The listener is connected as a worker's is, to the database the writers
// use (the coordinator on Citus).
func TestWritesWakeTheirQueues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.listener(t)

	b.insert(t, store.InsertParams{Queue: "ins"})
	b.expectWake(t, c, "ins", "insert")

	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Insert(b.ctx, tx, store.InsertParams{Kind: "test", Queue: "tx"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.expectWake(t, c, "tx", "insert in a transaction")

	n, err := store.InsertMany(b.ctx, b.db.Pool, []store.InsertParams{{Kind: "test", Queue: "many"}, {Kind: "test", Queue: "many"}})
	if err != nil || n != 2 {
		t.Fatalf("batch insert: %d %v", n, err)
	}
	b.expectWake(t, c, "many", "batch insert")

	b.insert(t, store.InsertParams{Queue: "due", RunIn: time.Millisecond})
	fenceqtest.WaitFor(t, "the job's promotion", 10*time.Second, func() bool {
		n, err := store.PromoteDue(b.ctx, b.db.Pool, 10)
		if err != nil {
			t.Fatalf("promote: %v", err)
		}
		return n == 1
	})
	b.expectWake(t, c, "due", "promotion")

	b.insert(t, store.InsertParams{Queue: "reap"})
	b.expectWake(t, c, "reap", "insert before the claim")
	jobs, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "reap", WorkerID: "w", Limit: 1, Lease: time.Millisecond})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claim: %v %v", jobs, err)
	}
	fenceqtest.WaitFor(t, "the lease's revocation", 10*time.Second, func() bool {
		revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{})
		if err != nil {
			t.Fatalf("reap: %v", err)
		}
		return len(revs) == 1
	})
	b.expectWake(t, c, "reap", "revocation")
}
